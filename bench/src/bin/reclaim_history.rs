//! Reclaim cost against settled history: the time of one bounded reclaim
//! batch (`PostgresStore::reclaim`, `--batch` due leases) when the leases
//! table also keeps 10^4 or 10^6 settled leases as history.
//!
//! For each history size: a fresh database at the current schema; accounts
//! created and funded through the store; the history bulk-inserted with
//! `generate_series` in the store's schema (released, reclaimed and
//! consolidated leases with expiries long past, fences from the real
//! sequence), then `VACUUM ANALYZE`; then `--batches` rounds of: acquire
//! `--batch` leases through the store (TTL 1 s, at a fixed instant T0),
//! and time one `reclaim(T0 + TTL + grace, --batch)`, which must settle
//! exactly those leases. Finally the candidate query
//! ([`tollgate_pg::RECLAIM_CANDIDATES_SQL`]) is shown with `EXPLAIN
//! (ANALYZE, BUFFERS)` over one more batch of due leases: it reads the
//! partial index `tollgate_leases_active_expiry ... WHERE state =
//! 'active'`, which holds no settled row, so the cost should not grow with
//! history.
//!
//! ```sh
//! cargo run --release -p tollgate-bench --bin reclaim_history
//! ```

use std::time::Instant;

use clap::Parser;
use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgConnection, Row};
use tollgate::{
    AccountId, AcquireRequest, Allocator, CapabilityKey, GrantPolicy, InstantPair, NewAccount,
};
use tollgate_bench::{BenchServer, LatencySummary, micros, server_settings};
use tollgate_pg::{PostgresStore, StoreOptions};

/// Units deposited per account: far more than any run holds.
const DEPOSIT_UNITS: i64 = 1_000_000_000_000;

/// TTL of the leases that are reclaimed.
const LEASE_TTL: SignedDuration = SignedDuration::from_secs(1);

/// Reclaim grace of the benchmark's policy (the service's default).
const GRACE: SignedDuration = SignedDuration::from_secs(30);

/// Pool size of the store: acquires of a round run on this many tasks.
const POOL_CONNECTIONS: u32 = 4;

#[derive(Debug, Parser)]
#[command(about = "Reclaim batch time against settled lease history")]
struct Args {
    /// PostgreSQL server to use; default: a dedicated throwaway harness
    /// server.
    #[arg(long)]
    database_url: Option<String>,
    /// History sizes (settled leases), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10000,1000000")]
    history: Vec<i64>,
    /// Due leases per reclaim batch (the reclaim limit).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Timed batches per history size.
    #[arg(long, default_value_t = 10)]
    batches: usize,
    /// Accounts the leases are spread over.
    #[arg(long, default_value_t = 100)]
    accounts: u32,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("reclaim_history: {e}");
        std::process::exit(1);
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

struct Figures {
    history: i64,
    batch: LatencySummary,
    mean_us: f64,
    leases_mb: f64,
    index_kb: f64,
}

async fn run(args: &Args) -> Result<(), String> {
    let server = BenchServer::start(args.database_url.as_deref())?;
    let mut rows = Vec::new();
    let mut printed_settings = false;
    for &history in &args.history {
        let db = format!("tollgate_bench_reclaim_{history}");
        let url = server.fresh_database(&db).await?;
        tollgate_pg::migrate(&url).await.map_err(err)?;
        let mut conn = PgConnection::connect(&url).await.map_err(err)?;
        if !printed_settings {
            println!("# Reclaim batch time against settled history");
            println!("date: {}", Timestamp::now());
            for (name, value) in server_settings(&mut conn).await.map_err(err)? {
                println!("  {name} = {value}");
            }
            printed_settings = true;
        }
        let policy = GrantPolicy::new(SignedDuration::from_secs(3600), GRACE).map_err(err)?;
        let key = CapabilityKey::new(&[9; 32]).map_err(err)?;
        let store = std::sync::Arc::new(
            PostgresStore::connect_with(
                &url,
                policy,
                key,
                StoreOptions {
                    max_connections: POOL_CONNECTIONS,
                    ..StoreOptions::default()
                },
            )
            .await
            .map_err(err)?,
        );
        let t0 = Timestamp::now();
        let mut accounts = Vec::new();
        for i in 0..args.accounts.max(1) {
            let a = store
                .create_account(NewAccount {
                    name: format!("reclaim-{i}"),
                    api_key_sha256: None,
                })
                .await
                .map_err(err)?;
            store
                .deposit(a.account_id, DEPOSIT_UNITS, t0)
                .await
                .map_err(err)?;
            accounts.push(a.account_id);
        }

        eprintln!("history {history}: inserting settled leases ...");
        let fill = Instant::now();
        // Lease writers declare the recorded grant policy (migration 0019).
        tollgate_pg::declare_session(&mut conn, &policy, false)
            .await
            .map_err(err)?;
        let past_us = (t0 - SignedDuration::from_hours(24)).as_microsecond();
        sqlx::query(
            "INSERT INTO tollgate_leases (account_id, units, fence, expiry_floor_us, \
                 expiry_submicro_ns, expiry_is_upper_bound, state, consumed) \
             SELECT $1 + g % $2, 1 + g % 10, nextval('tollgate_fence_seq'), $3 + g, \
                    (g % 1000)::smallint, false, \
                    (ARRAY['released', 'reclaimed', 'consolidated'])[1 + g % 3], \
                    CASE g % 3 WHEN 1 THEN 1 + g % 10 ELSE 0 END \
               FROM generate_series(1, $4::bigint) g",
        )
        .bind(accounts[0].0)
        .bind(i64::from(args.accounts.max(1)))
        .bind(past_us)
        .bind(history)
        .execute(&mut conn)
        .await
        .map_err(err)?;
        sqlx::raw_sql("VACUUM ANALYZE tollgate_leases")
            .execute(&mut conn)
            .await
            .map_err(err)?;
        eprintln!(
            "history {history}: inserted in {:.1}s; timing {} batches of {}",
            fill.elapsed().as_secs_f64(),
            args.batches,
            args.batch
        );

        let reclaim_at = t0 + LEASE_TTL + GRACE + SignedDuration::from_secs(1);
        let mut samples = Vec::new();
        for _ in 0..args.batches {
            acquire_due(&store, &accounts, args.batch, t0).await?;
            let start = Instant::now();
            let report = store.reclaim(reclaim_at, args.batch).await.map_err(err)?;
            samples.push(micros(start.elapsed()));
            if report.reclaimed.len() != args.batch {
                return Err(format!(
                    "a batch reclaimed {} leases, expected {}",
                    report.reclaimed.len(),
                    args.batch
                ));
            }
        }
        // One more batch of due leases for the plan.
        acquire_due(&store, &accounts, args.batch, t0).await?;
        let cutoff = InstantPair::encode(policy.reclaim_cutoff(reclaim_at).ok_or("no cutoff")?);
        let sql = tollgate_pg::RECLAIM_CANDIDATES_SQL
            .replace("$1", &cutoff.floor_us.to_string())
            .replace("$2", &cutoff.submicro_ns.to_string())
            .replace("$3", &args.batch.to_string());
        let plan: Vec<String> = sqlx::query(&format!("EXPLAIN (ANALYZE, BUFFERS) {sql}"))
            .fetch_all(&mut conn)
            .await
            .map_err(err)?
            .iter()
            .map(|r| r.get::<String, _>(0))
            .collect();
        let (leases_bytes, index_bytes): (i64, i64) = sqlx::query_as(
            "SELECT pg_relation_size('tollgate_leases'), \
                    pg_relation_size('tollgate_leases_active_expiry')",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(err)?;
        println!();
        println!(
            "## candidate query plan, history {history}, {} due",
            args.batch
        );
        println!("```");
        for l in &plan {
            println!("{l}");
        }
        println!("```");
        store.close().await;
        let mean_us = samples.iter().sum::<u64>() as f64 / samples.len().max(1) as f64;
        rows.push(Figures {
            history,
            batch: LatencySummary::of(&mut samples),
            mean_us,
            leases_mb: leases_bytes as f64 / 1e6,
            index_kb: index_bytes as f64 / 1e3,
        });
    }
    println!();
    println!(
        "| settled history | leases table MB | active-expiry index kB | batch | batches | mean ms | p50 ms | max ms | µs per reclaimed lease |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.1} | {:.0} | {} | {} | {:.2} | {:.2} | {:.2} | {:.1} |",
            r.history,
            r.leases_mb,
            r.index_kb,
            args.batch,
            r.batch.count,
            r.mean_us / 1000.0,
            r.batch.p50_us as f64 / 1000.0,
            r.batch.max_us as f64 / 1000.0,
            r.mean_us / args.batch.max(1) as f64,
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() > 1
    {
        println!();
        println!(
            "ratio of mean batch time, history {} / {}: {:.2}",
            last.history,
            first.history,
            last.mean_us / first.mean_us
        );
    }
    Ok(())
}

/// Acquires `n` leases at `t0` (due for reclaim after TTL + grace), spread
/// over `accounts`, on [`POOL_CONNECTIONS`] tasks.
async fn acquire_due(
    store: &std::sync::Arc<PostgresStore>,
    accounts: &[AccountId],
    n: usize,
    t0: Timestamp,
) -> Result<(), String> {
    let tasks = POOL_CONNECTIONS as usize;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = store.clone();
        let accounts = accounts.to_vec();
        handles.push(tokio::spawn(async move {
            let mut i = t;
            while i < n {
                store
                    .acquire(
                        AcquireRequest {
                            account_id: accounts[i % accounts.len()],
                            units: 1,
                            ttl: LEASE_TTL,
                            idempotency_key: None,
                        },
                        t0.into(),
                    )
                    .await
                    .map_err(err)?;
                i += tasks;
            }
            Ok::<(), String>(())
        }));
    }
    for h in handles {
        h.await.map_err(err)??;
    }
    Ok(())
}
