//! PostgresStore acquire+release pairs against `pgbench` running the same
//! SQL, at the same client counts, on the same server, in the same run.
//!
//! One *pair* is the store's `acquire` (units 1, TTL 60 s) followed by
//! `release` of that lease (consumed 1) on a random account. The pgbench
//! script ([`pgbench_script`]) replays exactly the statements the store
//! issues for that pair, copied from `tollgate-pg`'s `persistence.rs` and
//! `store.rs`, in the same two transactions:
//!
//! * acquire: `BEGIN`; lock the account (`SELECT .. FOR UPDATE`); insert
//!   the lease (fence from `nextval`, `RETURNING`); write the balances
//!   (`UPDATE .. FROM unnest(..)`); append the ledger entry (`INSERT ..
//!   SELECT .. FROM unnest(..) WITH ORDINALITY`); `COMMIT`.
//! * release: `BEGIN`; read the lease unlocked; lock its account; lock the
//!   lease (`= ANY(..) AND account_id = .. FOR UPDATE`); settle it
//!   (`UPDATE .. FROM unnest(..)`); write the balances; append the ledger
//!   entry; `COMMIT`.
//!
//! pgbench runs with `-M prepared` (the extended protocol with named
//! prepared statements, as sqlx's statement cache), one pair per pgbench
//! transaction, `-c` = the store's pool size = the number of store tasks.
//! Differences that remain, and are part of what the ratio measures: the
//! store binds arrays and text as parameters where the script writes
//! `ARRAY[$n::bigint]` and string literals, the store's pool pings each
//! connection it hands out (sqlx `test_before_acquire`, one extra round
//! trip per transaction), and the store computes balances, capabilities
//! and instants in Rust.
//!
//! A third side is PostgreSQL's practical per-request limit for the same
//! work: pgbench running one statement per operation
//! ([`one_statement_script`]): a data-modifying CTE per acquire and one
//! per release, writing exactly the rows the store writes (the account's
//! balances, the lease, one ledger entry each), in autocommit, so each
//! operation is one round trip and one commit. Tollgate's audit checks the
//! database after all three sides: every side kept the ledger exact.
//!
//! ```sh
//! cargo run --release -p tollgate-bench --bin pg_store_vs_pgbench -- --duration-secs 10
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgConnection};
use tollgate::{AccountId, AcquireRequest, Allocator, CapabilityKey, GrantPolicy, NewAccount};
use tollgate_bench::{BenchServer, LatencySummary, Rng, micros, server_settings};
use tollgate_pg::{PostgresStore, StoreOptions};

/// The database the benchmark (re)creates on the server.
const DB_NAME: &str = "tollgate_bench_pairs";

/// Units deposited per account: enough that no run exhausts an account
/// (each pair consumes 1 unit).
const DEPOSIT_UNITS: i64 = 1_000_000_000_000;

/// The TTL of every acquired lease; far longer than a pair takes, so
/// nothing expires during a run.
const LEASE_TTL: SignedDuration = SignedDuration::from_secs(60);

/// Statement logs of one pair longer than this are cut (the profile needs
/// a dozen lines).
const PROFILE_LOG_LINES_MAX: usize = 64;

#[derive(Debug, Parser)]
#[command(about = "PostgresStore acquire+release pairs against pgbench with the same SQL")]
struct Args {
    /// PostgreSQL server to use (its database is only used to create
    /// `tollgate_bench_pairs`); default: a dedicated throwaway harness
    /// server.
    #[arg(long)]
    database_url: Option<String>,
    /// Client counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    clients: Vec<u32>,
    /// Measured seconds per side and client count.
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Unmeasured warm-up seconds before each measured run.
    #[arg(long, default_value_t = 2)]
    warmup_secs: u64,
    /// Accounts the pairs are spread over.
    #[arg(long, default_value_t = 1000)]
    accounts: u32,
    /// The pgbench binary.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin/pgbench")]
    pgbench: PathBuf,
    /// Threads of the store's tokio runtime and the most pgbench threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1) as usize)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("pg_store_vs_pgbench: {e}");
        std::process::exit(1);
    }
}

/// One side's figures at one client count.
#[derive(Debug, Clone, Copy)]
struct Side {
    pairs_per_s: f64,
    latency: LatencySummary,
}

async fn run(args: &Args) -> Result<(), String> {
    let server = BenchServer::start(args.database_url.as_deref())?;
    let url = server.fresh_database(DB_NAME).await?;
    tollgate_pg::migrate(&url)
        .await
        .map_err(|e| e.to_string())?;
    let policy = GrantPolicy::new(
        SignedDuration::from_secs(3600),
        SignedDuration::from_secs(30),
    )
    .map_err(|e| e.to_string())?;
    let key = CapabilityKey::new(&[7; 32]).map_err(|e| e.to_string())?;

    let mut conn = PgConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    println!("# PostgresStore vs pgbench, same SQL per acquire+release pair");
    println!("date: {}", Timestamp::now());
    println!(
        "server: {}",
        if server.is_harness() {
            "dedicated tollgate-pg-harness server"
        } else {
            "--database-url"
        }
    );
    for (name, value) in server_settings(&mut conn)
        .await
        .map_err(|e| e.to_string())?
    {
        println!("  {name} = {value}");
    }

    let setup = connect_store(&url, policy, key.clone(), 4).await?;
    let mut ids = Vec::with_capacity(args.accounts as usize);
    for i in 0..args.accounts {
        let a = setup
            .create_account(NewAccount {
                name: format!("bench-{i}"),
                api_key_sha256: None,
            })
            .await
            .map_err(|e| e.to_string())?;
        setup
            .deposit(a.account_id, DEPOSIT_UNITS, Timestamp::now())
            .await
            .map_err(|e| e.to_string())?;
        ids.push(a.account_id.0);
    }
    let (amin, amax) = (ids[0], ids[ids.len() - 1]);
    if amax - amin + 1 != i64::from(args.accounts) {
        return Err(format!("account ids {amin}..={amax} are not contiguous"));
    }
    setup.close().await;

    let workdir = std::env::temp_dir().join(format!("tollgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&workdir).map_err(|e| e.to_string())?;
    let script = workdir.join("pair.sql");
    std::fs::write(&script, pgbench_script()).map_err(|e| e.to_string())?;
    let one_script = workdir.join("pair-one-statement.sql");
    std::fs::write(&one_script, one_statement_script()).map_err(|e| e.to_string())?;

    if server.is_harness() {
        profile_one_pair(&url, &mut conn, policy, key.clone(), amin).await?;
    }

    let mut rows = Vec::new();
    for &clients in &args.clients {
        let clients = clients.max(1);
        eprintln!("clients {clients}: store ...");
        run_store(
            &url,
            policy,
            key.clone(),
            clients,
            (amin, amax),
            args.warmup_secs,
        )
        .await?;
        let store = run_store(
            &url,
            policy,
            key.clone(),
            clients,
            (amin, amax),
            args.duration_secs,
        )
        .await?;
        // A pgbench side: its unmeasured warm-up, then the measured run
        // (with the per-transaction log its latency comes from).
        let pgbench_side = |script: &Path| -> Result<Side, String> {
            run_pgbench(
                args,
                &url,
                policy,
                script,
                &workdir,
                clients,
                (amin, amax),
                args.warmup_secs,
                false,
            )?;
            run_pgbench(
                args,
                &url,
                policy,
                script,
                &workdir,
                clients,
                (amin, amax),
                args.duration_secs,
                true,
            )
        };
        eprintln!("clients {clients}: pgbench ...");
        let pgb = pgbench_side(&script)?;
        eprintln!("clients {clients}: pgbench, one statement per operation ...");
        let one = pgbench_side(&one_script)?;
        rows.push((clients, store, pgb, one));
    }
    let _ = std::fs::remove_dir_all(&workdir);

    let (leases, ledger): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tollgate_leases), (SELECT count(*) FROM tollgate_ledger)",
    )
    .fetch_one(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    // Every side wrote through the same tables: the audit must be clean.
    let audit = connect_store(&url, policy, key.clone(), 1).await?;
    let report = audit.audit().await.map_err(|e| e.to_string())?;
    audit.close().await;
    if !report.is_clean() {
        return Err(format!(
            "the audit after the run is not clean: {:?}",
            report.violations
        ));
    }
    println!();
    println!(
        "| clients | store pairs/s | pgbench (store's SQL) pairs/s | one statement per op pairs/s | ratio store/pgbench | **ratio store/one statement** | store p50 / p99 (ms) | pgbench p50 / p99 (ms) | one statement p50 / p99 (ms) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (clients, s, p, o) in &rows {
        println!(
            "| {clients} | {:.0} | {:.0} | {:.0} | {:.2} | **{:.2}** | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
            s.pairs_per_s,
            p.pairs_per_s,
            o.pairs_per_s,
            s.pairs_per_s / p.pairs_per_s,
            s.pairs_per_s / o.pairs_per_s,
            ms(s.latency.p50_us),
            ms(s.latency.p99_us),
            ms(p.latency.p50_us),
            ms(p.latency.p99_us),
            ms(o.latency.p50_us),
            ms(o.latency.p99_us),
        );
    }
    println!();
    println!(
        "audit after all sides: clean ({} deposited, {} held, {} consumed)",
        report.total_deposited, report.total_held, report.total_consumed
    );
    println!();
    println!(
        "{} accounts; {}s measured per side (after {}s warm-up); rows at the end: {leases} leases, {ledger} ledger entries",
        args.accounts, args.duration_secs, args.warmup_secs
    );
    Ok(())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

async fn connect_store(
    url: &str,
    policy: GrantPolicy,
    key: CapabilityKey,
    max_connections: u32,
) -> Result<PostgresStore, String> {
    PostgresStore::connect_with(
        url,
        policy,
        key,
        StoreOptions {
            max_connections,
            ..StoreOptions::default()
        },
    )
    .await
    .map_err(|e| e.to_string())
}

/// Runs `clients` tasks doing pairs for `secs` seconds on a store whose
/// pool has `clients` connections.
async fn run_store(
    url: &str,
    policy: GrantPolicy,
    key: CapabilityKey,
    clients: u32,
    accounts: (i64, i64),
    secs: u64,
) -> Result<Side, String> {
    let store = Arc::new(connect_store(url, policy, key, clients).await?);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let store = store.clone();
        tasks.push(tokio::spawn(store_client(
            store,
            accounts,
            deadline,
            u64::from(c) + 1,
        )));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.map_err(|e| e.to_string())??);
    }
    let elapsed = start.elapsed();
    store.close().await;
    Ok(Side {
        pairs_per_s: samples.len() as f64 / elapsed.as_secs_f64(),
        latency: LatencySummary::of(&mut samples),
    })
}

async fn store_client(
    store: Arc<PostgresStore>,
    (amin, amax): (i64, i64),
    deadline: Instant,
    seed: u64,
) -> Result<Vec<u64>, String> {
    let mut rng = Rng::new(seed);
    let span = u64::try_from(amax - amin + 1).unwrap_or(1);
    let mut samples = Vec::new();
    while Instant::now() < deadline {
        let account_id = AccountId(amin + i64::try_from(rng.below(span)).unwrap_or(0));
        let t0 = Instant::now();
        let g = store
            .acquire(
                AcquireRequest {
                    account_id,
                    units: 1,
                    ttl: LEASE_TTL,
                    idempotency_key: None,
                },
                Timestamp::now().into(),
            )
            .await
            .map_err(|e| format!("acquire: {e}"))?;
        store
            .release(g.lease_id, &g.capability, Timestamp::now(), Some(1))
            .await
            .map_err(|e| format!("release: {e}"))?;
        samples.push(micros(t0.elapsed()));
    }
    Ok(samples)
}

/// Runs pgbench with the pair script; with `log`, reads its
/// per-transaction log for the latency percentiles. Its sessions declare
/// `policy` as the store's do (the database refuses lease writes from a
/// session that does not), through `PGOPTIONS`, so no statement is added.
#[allow(clippy::too_many_arguments)]
fn run_pgbench(
    args: &Args,
    url: &str,
    policy: GrantPolicy,
    script: &Path,
    workdir: &Path,
    clients: u32,
    (amin, amax): (i64, i64),
    secs: u64,
    log: bool,
) -> Result<Side, String> {
    let now_us = Timestamp::now().as_microsecond();
    let expiry_us = now_us + LEASE_TTL.as_micros() as i64;
    let prefix = workdir.join(format!("pgbench-c{clients}"));
    let mut cmd = Command::new(&args.pgbench);
    cmd.env(
        "PGOPTIONS",
        format!(
            "-c {}={}",
            tollgate_pg::GRANT_POLICY_SETTING,
            tollgate_pg::grant_policy_declaration(&policy)
        ),
    );
    cmd.arg("-n")
        .arg("-M")
        .arg("prepared")
        .arg("-c")
        .arg(clients.to_string())
        .arg("-j")
        .arg(clients.min(args.threads.max(1)).to_string())
        .arg("-T")
        .arg(secs.max(1).to_string())
        .arg("-f")
        .arg(script)
        .arg("-D")
        .arg(format!("amin={amin}"))
        .arg("-D")
        .arg(format!("amax={amax}"))
        .arg("-D")
        .arg(format!("exp_floor={expiry_us}"))
        .arg("-D")
        .arg("exp_sub=123")
        .arg("-D")
        .arg(format!("at_floor={now_us}"))
        .arg("-D")
        .arg("at_sub=456")
        // The release's cut: 30 s ago, so no lease of the run has expired
        // on it (the one-statement release checks expiry > cut).
        .arg("-D")
        .arg(format!("cut_floor={}", now_us - 30_000_000))
        .arg("-D")
        .arg("cut_sub=789");
    if log {
        cmd.arg("-l")
            .arg(format!("--log-prefix={}", prefix.display()));
    }
    cmd.arg(url);
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", args.pgbench.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "pgbench failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let tps = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no tps line in pgbench output:\n{stdout}"))?;
    if let Some(failed) = stdout
        .lines()
        .find(|l| l.starts_with("number of failed transactions") && !l.contains(": 0 "))
    {
        return Err(format!("pgbench: {failed}"));
    }
    let mut samples = Vec::new();
    if log {
        for entry in std::fs::read_dir(workdir).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.starts_with(&format!("pgbench-c{clients}.")) {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
            // client_id transaction_no time_us script_no epoch epoch_us
            samples.extend(
                text.lines()
                    .filter_map(|l| l.split_whitespace().nth(2))
                    .filter_map(|v| v.parse::<u64>().ok()),
            );
            let _ = std::fs::remove_file(&path);
        }
    }
    Ok(Side {
        pairs_per_s: tps,
        latency: LatencySummary::of(&mut samples),
    })
}

/// Logs every statement of one store pair (harness server only: the
/// server log is readable) and prints them, with the counts of statements
/// and commits, as the profile of the PostgreSQL path.
async fn profile_one_pair(
    url: &str,
    conn: &mut PgConnection,
    policy: GrantPolicy,
    key: CapabilityKey,
    account: i64,
) -> Result<(), String> {
    sqlx::raw_sql(&format!(
        "ALTER DATABASE {DB_NAME} SET log_statement = 'all'"
    ))
    .execute(&mut *conn)
    .await
    .map_err(|e| e.to_string())?;
    // New connections (the marker's and the store's) log every statement.
    let mut marker_conn = PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let store = connect_store(url, policy, key, 1).await?;
    let marker = format!("tollgate-bench-profile-{}", std::process::id());
    sqlx::raw_sql(&format!("SELECT '{marker}-start'"))
        .execute(&mut marker_conn)
        .await
        .map_err(|e| e.to_string())?;
    let g = store
        .acquire(
            AcquireRequest {
                account_id: AccountId(account),
                units: 1,
                ttl: LEASE_TTL,
                idempotency_key: None,
            },
            Timestamp::now().into(),
        )
        .await
        .map_err(|e| e.to_string())?;
    store
        .release(g.lease_id, &g.capability, Timestamp::now(), Some(1))
        .await
        .map_err(|e| e.to_string())?;
    sqlx::raw_sql(&format!("SELECT '{marker}-end'"))
        .execute(&mut marker_conn)
        .await
        .map_err(|e| e.to_string())?;
    store.close().await;
    let _ = marker_conn.close().await;
    sqlx::raw_sql(&format!("ALTER DATABASE {DB_NAME} RESET log_statement"))
        .execute(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    let log_path: String =
        sqlx::query_scalar("SELECT current_setting('data_directory') || '/../server.log'")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| e.to_string())?;
    println!();
    println!("## statements of one store pair (log_statement = all)");
    let text = match std::fs::read_to_string(&log_path) {
        Ok(text) => text,
        Err(e) => {
            println!("(server log {log_path} unreadable: {e})");
            return Ok(());
        }
    };
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.contains(&format!("{marker}-start")))
        .ok_or("profile marker not found in the server log")?;
    let statements: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| !l.contains(&format!("{marker}-end")))
        .filter(|l| l.contains("LOG:  statement:") || l.contains("LOG:  execute"))
        .map(|l| l.split_once("LOG:  ").map(|(_, t)| t).unwrap_or(l))
        .take(PROFILE_LOG_LINES_MAX)
        .collect();
    for (i, text) in statements.iter().enumerate() {
        let short: String = text.chars().take(140).collect();
        println!("{:2}. {short}", i + 1);
    }
    let commits = statements.iter().filter(|s| s.ends_with("COMMIT")).count();
    let begins = statements.iter().filter(|s| s.ends_with("BEGIN")).count();
    println!(
        "{} statements sent ({} data statements, {begins} BEGIN, {commits} COMMIT), each one \
         round trip; plus one pool ping (a protocol Sync, not logged) per transaction",
        statements.len(),
        statements.len() - commits - begins
    );
    Ok(())
}

/// The pgbench script of one pair: the store's statements, in its order,
/// with its transactions. Variables: `amin`, `amax` (account id range),
/// `exp_floor`, `exp_sub` (the lease expiry pair), `at_floor`, `at_sub`
/// (the operation time pair).
fn pgbench_script() -> String {
    const ACCOUNT_COLUMNS: &str = "account_id, name, deposited, available, held, consumed";
    const LEASE_COLUMNS: &str = "lease_id, account_id, units, fence, expiry_floor_us, \
         expiry_submicro_ns, expiry_is_upper_bound, state, consumed";
    let write_balances = |p: &str, av: &str, held: &str, cons: &str| {
        format!(
            "UPDATE tollgate_accounts a SET deposited = u.deposited, available = u.available, \
             held = u.held, consumed = u.consumed FROM unnest(ARRAY[:{p}account_id::bigint], \
             ARRAY[:{p}deposited::bigint], ARRAY[:{av}::bigint], ARRAY[:{held}::bigint], \
             ARRAY[:{cons}::bigint]) AS u(account_id, deposited, available, held, consumed) \
             WHERE a.account_id = u.account_id;"
        )
    };
    #[allow(clippy::too_many_arguments)]
    let insert_ledger = |p: &str,
                         kind: &str,
                         consumed: &str,
                         av: &str,
                         held: &str,
                         cons: &str,
                         fence: &str,
                         exp_floor: &str,
                         exp_sub: &str,
                         exp_bound: &str| {
        format!(
            "INSERT INTO tollgate_ledger (account_id, lease_id, kind, actor, units, consumed, \
             before_deposited, before_available, before_held, before_consumed, \
             after_deposited, after_available, after_held, after_consumed, \
             fence, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound, \
             at_floor_us, at_submicro_ns, at_is_upper_bound) \
             SELECT account_id, lease_id, kind, actor, units, consumed, \
             bd, ba, bh, bc, ad, aa, ah, ac, \
             fence, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound, \
             at_floor_us, at_submicro_ns, false \
             FROM unnest(ARRAY[:{p}account_id::bigint], ARRAY[:lease_id::bigint], \
             ARRAY['{kind}']::text[], ARRAY['holder']::text[], ARRAY[1::bigint], \
             ARRAY[{consumed}::bigint], ARRAY[:{p}deposited::bigint], \
             ARRAY[:{p}available::bigint], ARRAY[:{p}held::bigint], \
             ARRAY[:{p}consumed::bigint], ARRAY[:{p}deposited::bigint], ARRAY[:{av}::bigint], \
             ARRAY[:{held}::bigint], ARRAY[:{cons}::bigint], ARRAY[:{fence}::bigint], \
             ARRAY[:{exp_floor}::bigint], ARRAY[:{exp_sub}::smallint], \
             ARRAY[{exp_bound}::boolean], ARRAY[:at_floor::bigint], ARRAY[:at_sub::smallint]) \
             WITH ORDINALITY AS u(account_id, lease_id, kind, actor, units, consumed, \
             bd, ba, bh, bc, ad, aa, ah, ac, \
             fence, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound, \
             at_floor_us, at_submicro_ns, ord) ORDER BY ord;"
        )
    };
    let lines = [
        "\\set aid random(:amin, :amax)".to_owned(),
        // acquire
        "BEGIN;".to_owned(),
        format!(
            "SELECT {ACCOUNT_COLUMNS} FROM tollgate_accounts WHERE account_id = :aid FOR UPDATE \\gset a_"
        ),
        "\\set a_av :a_available - 1".to_owned(),
        "\\set a_hd :a_held + 1".to_owned(),
        "INSERT INTO tollgate_leases (account_id, units, fence, expiry_floor_us, \
         expiry_submicro_ns, expiry_is_upper_bound, state, consumed) VALUES (:aid, 1, \
         nextval('tollgate_fence_seq'), :exp_floor, :exp_sub, false, 'active', NULL) \
         RETURNING lease_id, fence \\gset"
            .to_owned(),
        write_balances("a_", "a_av", "a_hd", "a_consumed"),
        insert_ledger(
            "a_",
            "acquire",
            "0",
            "a_av",
            "a_hd",
            "a_consumed",
            "fence",
            "exp_floor",
            "exp_sub",
            "false",
        ),
        "COMMIT;".to_owned(),
        // release
        "BEGIN;".to_owned(),
        format!("SELECT {LEASE_COLUMNS} FROM tollgate_leases WHERE lease_id = :lease_id \\gset r_"),
        format!(
            "SELECT {ACCOUNT_COLUMNS} FROM tollgate_accounts WHERE account_id = :r_account_id \
             FOR UPDATE \\gset b_"
        ),
        format!(
            "SELECT {LEASE_COLUMNS} FROM tollgate_leases WHERE lease_id = ANY(ARRAY[:lease_id::bigint]) \
             AND account_id = :b_account_id ORDER BY lease_id FOR UPDATE \\gset m_"
        ),
        "\\set b_hd :b_held - 1".to_owned(),
        "\\set b_cn :b_consumed + 1".to_owned(),
        "UPDATE tollgate_leases l SET state = 'released', consumed = u.consumed FROM \
         unnest(ARRAY[:lease_id::bigint], ARRAY[1::bigint]) AS u(lease_id, consumed) \
         WHERE l.lease_id = u.lease_id AND l.state = 'active';"
            .to_owned(),
        write_balances("b_", "b_available", "b_hd", "b_cn"),
        insert_ledger(
            "b_",
            "release",
            "1",
            "b_available",
            "b_hd",
            "b_cn",
            "m_fence",
            "m_expiry_floor_us",
            "m_expiry_submicro_ns",
            ":m_expiry_is_upper_bound",
        ),
        "COMMIT;".to_owned(),
    ];
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// The same pair as [`pgbench_script`], written as PostgreSQL's practical
/// limit for it: one statement per operation, in autocommit (one round
/// trip and one commit each), writing exactly the rows the store writes.
///
/// * acquire: one CTE takes a unit from the account (`available >= 1`),
///   inserts the lease (fence from `nextval`) and appends the `acquire`
///   ledger entry with the balances before and after; `\gset` keeps the
///   lease id.
/// * release: one CTE locks the lease's account, settles the lease
///   (`active`, unexpired on the cut `cut_floor`/`cut_sub`, consumed 1),
///   writes the balances and appends the `release` ledger entry.
///
/// Variables as [`pgbench_script`]'s, plus `cut_floor`, `cut_sub` (the
/// release's cut).
fn one_statement_script() -> String {
    const LEDGER_COLUMNS: &str = "account_id, lease_id, kind, actor, units, consumed, \
         before_deposited, before_available, before_held, before_consumed, \
         after_deposited, after_available, after_held, after_consumed, fence, \
         expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound, \
         at_floor_us, at_submicro_ns, at_is_upper_bound";
    let lines = [
        "\\set aid random(:amin, :amax)".to_owned(),
        format!(
            "WITH a AS (UPDATE tollgate_accounts SET available = available - 1, held = held + 1 \
             WHERE account_id = :aid::bigint AND available >= 1 \
             RETURNING account_id, deposited, available, held, consumed), \
             l AS (INSERT INTO tollgate_leases (account_id, units, fence, expiry_floor_us, \
             expiry_submicro_ns, expiry_is_upper_bound, state, consumed) \
             SELECT a.account_id, 1, nextval('tollgate_fence_seq'), :exp_floor::bigint, \
             :exp_sub::smallint, false, 'active', NULL::bigint FROM a \
             RETURNING lease_id, account_id, fence) \
             INSERT INTO tollgate_ledger ({LEDGER_COLUMNS}) \
             SELECT a.account_id, l.lease_id, 'acquire', 'holder', 1, 0, \
             a.deposited, a.available + 1, a.held - 1, a.consumed, \
             a.deposited, a.available, a.held, a.consumed, l.fence, \
             :exp_floor::bigint, :exp_sub::smallint, false, \
             :at_floor::bigint, :at_sub::smallint, false \
             FROM a JOIN l ON l.account_id = a.account_id RETURNING lease_id \\gset"
        ),
        format!(
            "WITH acct AS (SELECT account_id FROM tollgate_accounts WHERE account_id = \
             (SELECT account_id FROM tollgate_leases WHERE lease_id = :lease_id::bigint) \
             FOR UPDATE), \
             s AS (UPDATE tollgate_leases l SET state = 'released', consumed = 1 FROM acct \
             WHERE l.lease_id = :lease_id::bigint AND l.account_id = acct.account_id \
             AND l.state = 'active' AND l.units >= 1 \
             AND (l.expiry_floor_us, l.expiry_submicro_ns) > (:cut_floor::bigint, :cut_sub::smallint) \
             RETURNING l.lease_id, l.account_id, l.units, l.fence, l.expiry_floor_us, \
             l.expiry_submicro_ns, l.expiry_is_upper_bound), \
             b AS (UPDATE tollgate_accounts t SET available = t.available + (s.units - 1), \
             held = t.held - s.units, consumed = t.consumed + 1 FROM s \
             WHERE t.account_id = s.account_id \
             RETURNING t.account_id, t.deposited, t.available, t.held, t.consumed) \
             INSERT INTO tollgate_ledger ({LEDGER_COLUMNS}) \
             SELECT s.account_id, s.lease_id, 'release', 'holder', s.units, 1, \
             b.deposited, b.available - (s.units - 1), b.held + s.units, b.consumed - 1, \
             b.deposited, b.available, b.held, b.consumed, s.fence, s.expiry_floor_us, \
             s.expiry_submicro_ns, s.expiry_is_upper_bound, \
             :at_floor::bigint, :at_sub::smallint, false \
             FROM s JOIN b ON b.account_id = s.account_id RETURNING seq \\gset r_"
        ),
    ];
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_statement_script_is_one_statement_per_operation() {
        let s = one_statement_script();
        let sql: Vec<&str> = s.lines().filter(|l| !l.starts_with('\\')).collect();
        // Two statements, one line each (pgbench's \gset needs it), no
        // transaction block: autocommit, one commit per operation.
        assert_eq!(sql.len(), 2, "{s}");
        assert!(!s.contains("BEGIN") && !s.contains("COMMIT"), "{s}");
        // Each writes the account, the lease and one ledger entry.
        for (stmt, kind) in sql.iter().zip(["'acquire'", "'release'"]) {
            assert!(stmt.starts_with("WITH "), "{stmt}");
            assert_eq!(
                stmt.matches("INSERT INTO tollgate_ledger").count(),
                1,
                "{stmt}"
            );
            assert_eq!(
                stmt.matches("UPDATE tollgate_accounts").count(),
                1,
                "{stmt}"
            );
            assert!(stmt.contains(kind), "{stmt}");
        }
        assert!(sql[0].contains("INSERT INTO tollgate_leases") && sql[0].ends_with("\\gset"));
        assert!(sql[1].contains("UPDATE tollgate_leases") && sql[1].ends_with("\\gset r_"));
    }

    #[test]
    fn script_has_two_transactions_and_store_statements() {
        let s = pgbench_script();
        assert_eq!(s.matches("BEGIN;").count(), 2);
        assert_eq!(s.matches("COMMIT;").count(), 2);
        assert_eq!(s.matches("INSERT INTO tollgate_ledger").count(), 2);
        assert_eq!(s.matches("FOR UPDATE").count(), 3);
        // every SQL command is one line, as pgbench's \gset needs
        assert!(
            s.lines()
                .all(|l| l.starts_with('\\') || l.ends_with(';') || l.contains("\\gset"))
        );
    }
}
