//! Migration 0017 (exact instants) against legacy data: its duration and
//! how long it holds its `ACCESS EXCLUSIVE` lock, for `--rows` legacy
//! leases.
//!
//! For each size N: a fresh database migrated through version 16 with
//! `Schema::through(16)` (exactly what an older binary left behind); then,
//! with SQL `generate_series` in the version-16 schema, 1000 accounts, N
//! leases (90 % released, 10 % active, microsecond expiries), N ledger
//! entries (one `acquire` entry per lease) and N/10 idempotency records;
//! `VACUUM ANALYZE`; then `Schema::current().migrate(url)` is timed while
//! an observer connection polls `pg_locks` every [`LOCK_POLL`] for the
//! migration's granted `AccessExclusiveLock` on `tollgate_leases`: the
//! lock time is from the first poll that sees it to the first that no
//! longer does (resolution: one poll interval). Every other session that
//! touches leases, ledger or idempotency records waits that long.
//!
//! ```sh
//! cargo run --release -p tollgate-bench --bin migration_0017
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use jiff::Timestamp;
use sqlx::{Connection, PgConnection};
use tollgate_bench::{BenchServer, server_settings};
use tollgate_pg::Schema;

/// Interval between the observer's `pg_locks` polls.
const LOCK_POLL: Duration = Duration::from_millis(5);

#[derive(Debug, Parser)]
#[command(about = "Migration 0017 duration and lock time against legacy rows")]
struct Args {
    /// PostgreSQL server to use; default: a dedicated throwaway harness
    /// server.
    #[arg(long)]
    database_url: Option<String>,
    /// Legacy lease counts (ledger entries: as many; idempotency records:
    /// a tenth), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    rows: Vec<i64>,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("migration_0017: {e}");
        std::process::exit(1);
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The legacy fill, in the version-16 schema; `$1` is replaced by N and
/// `$2` by an instant in microseconds (both integers formatted by us).
const FILL: [&str; 4] = [
    "INSERT INTO tollgate_accounts (name, deposited, available, held, consumed) \
     SELECT 'legacy-' || a, 1000000000000, 1000000000000, 0, 0 \
       FROM generate_series(1, 1000) a",
    "INSERT INTO tollgate_leases (account_id, units, expires_at_us, state, fence, consumed) \
     SELECT 1 + g % 1000, 1 + g % 10, $2::bigint + g, \
            CASE WHEN g % 10 = 0 THEN 'active' ELSE 'released' END, \
            nextval('tollgate_fence_seq'), CASE WHEN g % 10 = 0 THEN NULL ELSE 0 END \
       FROM generate_series(1, $1::bigint) g",
    "INSERT INTO tollgate_ledger (account_id, lease_id, kind, actor, units, consumed, \
         before_deposited, before_available, before_held, before_consumed, \
         after_deposited, after_available, after_held, after_consumed, \
         at_us, fence, expiry_us) \
     SELECT l.account_id, l.lease_id, 'acquire', 'holder', l.units, 0, \
            1000000000000, 1000000000000, 0, 0, \
            1000000000000, 1000000000000 - l.units, l.units, 0, \
            $2::bigint, l.fence, l.expires_at_us \
       FROM tollgate_leases l WHERE $1::bigint > 0 ORDER BY l.lease_id",
    "INSERT INTO tollgate_idempotency (account_id, idem_key, units, request_ttl_us, lease_id, \
         fence, expires_at_us, granted_ttl_us) \
     SELECT l.account_id, 'key-' || l.lease_id, l.units, 30000000, l.lease_id, l.fence, \
            l.expires_at_us, 30000000 \
       FROM tollgate_leases l WHERE l.lease_id % 10 = 0 AND $1::bigint > 0",
];

struct Figures {
    rows: i64,
    fill_s: f64,
    migrate_s: f64,
    lock_s: f64,
    bytes_before: i64,
    bytes_after: i64,
}

async fn run(args: &Args) -> Result<(), String> {
    let server = BenchServer::start(args.database_url.as_deref())?;
    let mut figures = Vec::new();
    for (i, &rows) in args.rows.iter().enumerate() {
        let url = server
            .fresh_database(&format!("tollgate_bench_m17_{rows}"))
            .await?;
        Schema::through(16)
            .map_err(err)?
            .migrate(&url)
            .await
            .map_err(err)?;
        let mut conn = PgConnection::connect(&url).await.map_err(err)?;
        if i == 0 {
            println!("# Migration 0017 against legacy rows");
            println!("date: {}", Timestamp::now());
            for (name, value) in server_settings(&mut conn).await.map_err(err)? {
                println!("  {name} = {value}");
            }
        }
        eprintln!("{rows} legacy rows: filling ...");
        let fill = Instant::now();
        let now_us = Timestamp::now().as_microsecond();
        for sql in FILL {
            let sql = sql
                .replace("$1", &rows.to_string())
                .replace("$2", &now_us.to_string());
            sqlx::raw_sql(&sql)
                .execute(&mut conn)
                .await
                .map_err(|e| format!("{e}: {sql}"))?;
        }
        sqlx::raw_sql("VACUUM ANALYZE")
            .execute(&mut conn)
            .await
            .map_err(err)?;
        let fill_s = fill.elapsed().as_secs_f64();
        let bytes_before = table_bytes(&mut conn).await?;
        let leases_oid: i64 = sqlx::query_scalar("SELECT 'tollgate_leases'::regclass::oid::bigint")
            .fetch_one(&mut conn)
            .await
            .map_err(err)?;

        eprintln!("{rows} legacy rows: filled in {fill_s:.1}s; migrating ...");
        let done = Arc::new(AtomicBool::new(false));
        let observer = tokio::spawn(observe_lock(url.clone(), leases_oid, done.clone()));
        let start = Instant::now();
        let report = Schema::current().migrate(&url).await.map_err(err)?;
        let migrate_s = start.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        let lock = observer.await.map_err(err)??;
        if report.applied != [17] {
            return Err(format!(
                "expected to apply [17], applied {:?}",
                report.applied
            ));
        }
        let bytes_after = table_bytes(&mut conn).await?;
        figures.push(Figures {
            rows,
            fill_s,
            migrate_s,
            lock_s: lock.as_secs_f64(),
            bytes_before,
            bytes_after,
        });
    }
    println!();
    println!(
        "| legacy leases | + ledger entries | + idempotency records | fill s | migrate s | ACCESS EXCLUSIVE held s | migrate s per 10^5 leases | tables MB before → after |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for f in &figures {
        println!(
            "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.0} → {:.0} |",
            f.rows,
            f.rows,
            f.rows / 10,
            f.fill_s,
            f.migrate_s,
            f.lock_s,
            f.migrate_s / (f.rows as f64 / 1e5),
            f.bytes_before as f64 / 1e6,
            f.bytes_after as f64 / 1e6,
        );
    }
    println!();
    println!("lock time resolution: {LOCK_POLL:?} (observer poll of pg_locks)");
    Ok(())
}

/// Total size (with indexes and TOAST) of the three migrated tables.
async fn table_bytes(conn: &mut PgConnection) -> Result<i64, String> {
    sqlx::query_scalar(
        "SELECT pg_total_relation_size('tollgate_leases') \
              + pg_total_relation_size('tollgate_ledger') \
              + pg_total_relation_size('tollgate_idempotency')",
    )
    .fetch_one(conn)
    .await
    .map_err(err)
}

/// Polls `pg_locks` until `done` and returns how long a granted
/// `AccessExclusiveLock` on relation `oid` was seen.
async fn observe_lock(url: String, oid: i64, done: Arc<AtomicBool>) -> Result<Duration, String> {
    let mut conn = PgConnection::connect(&url).await.map_err(err)?;
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    loop {
        let finished = done.load(Ordering::Relaxed);
        let held: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'relation' \
                 AND relation = $1::bigint::oid AND mode = 'AccessExclusiveLock' AND granted)",
        )
        .bind(oid)
        .fetch_one(&mut conn)
        .await
        .map_err(err)?;
        let now = Instant::now();
        if held {
            first.get_or_insert(now);
            last = None;
        } else if first.is_some() && last.is_none() {
            last = Some(now);
        }
        if finished {
            break;
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    let _ = conn.close().await;
    Ok(match (first, last) {
        (Some(f), Some(l)) => l - f,
        _ => Duration::ZERO,
    })
}
