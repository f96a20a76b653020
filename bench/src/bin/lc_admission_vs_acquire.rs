//! Little Compute's exec admission (`LcStore::admit_exec`) against
//! Tollgate's bare acquire on the same pool, database and accounts, in the
//! same run.
//!
//! One database, migrated with `lc_pg::migrate` (Tollgate's, safe time's
//! and Little Compute's lines); an in-process sampler publishes the cut
//! (100 ms samples) and the benchmark waits until it is certain; a
//! provider, the runtime `base` and `--tenants` tenants with 10^7 units
//! each. Then, per client count `C`, `--rounds` times in turn, each side
//! runs `C` tokio tasks for `--duration-secs` (after `--warmup-secs`
//! unmeasured) on one `LcStore` whose pool has `C` connections:
//!
//! * admission: `admit_exec` of `small` (1 unit) running `true`, a fresh
//!   operation key per call, on a random tenant. One transaction: the
//!   operation key, the checks, the Tollgate grant of the Reservation
//!   (`tollgate_pg::ops`), the exec, attempt, Reservation and Lease rows,
//!   the operation's result.
//! * acquire: `store.tollgate().acquire` of 1 unit for the Reservation TTL
//!   (10 min) on a random tenant's account, no idempotency key, at the
//!   same cut: what a Reservation costs Tollgate alone.
//!
//! Neither side releases, so both hold more units as the run goes on. Both
//! take their instant from one shared reading of the safe-cut clock,
//! refreshed every 100 ms by a background task: the clock read an HTTP
//! request makes first is left out of both. A refused call (for instance
//! `time_uncertain` if the sampler falls behind) is counted, not timed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::{SignedDuration, Timestamp};
use lc_core::ReconcileStore;
use lc_core::{ControlStore, CutReading, Digest, ExecRequest, OperationKey, ProviderId, TenantId};
use lc_pg::{LcConfig, LcStore};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use sqlx::{Connection, PgConnection};
use tokio::sync::watch;
use tollgate::{AccountId, AcquireRequest, Allocator, CapabilityKey, GrantPolicy, SuppliedTime};
use tollgate_bench::{BenchServer, LatencySummary, Rng, micros, server_settings};

/// The database the benchmark drops and recreates.
const DB_NAME: &str = "tollgate_bench_lc_admission";

/// Units each tenant starts with: far more than a run holds.
const DEPOSIT_UNITS: i64 = 10_000_000;

/// The Reservation TTL of Little Compute's default configuration, asked
/// of the bare acquire too.
const RESERVATION_TTL: SignedDuration = SignedDuration::from_mins(10);

/// How often the shared reading is refreshed.
const READING_REFRESH: Duration = Duration::from_millis(100);

/// The longest wait for a certain cut at start.
const CERTAIN_WAIT_MAX: Duration = Duration::from_secs(60);

/// The most logged statements printed per profiled call.
const PROFILE_LOG_LINES_MAX: usize = 64;

#[derive(Parser, Debug)]
#[command(about = "Little Compute's exec admission against Tollgate's bare acquire, same run")]
struct Args {
    /// Use this server (its database is where `CREATE DATABASE` runs)
    /// instead of a dedicated harness server.
    #[arg(long)]
    database_url: Option<String>,
    /// Measured seconds per side and round.
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Unmeasured seconds before each measured run.
    #[arg(long, default_value_t = 2)]
    warmup_secs: u64,
    /// Client counts (tasks and pool connections).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    clients: Vec<u32>,
    /// Tenants (Tollgate accounts) the load is spread over.
    #[arg(long, default_value_t = 100)]
    tenants: u32,
    /// Admission and acquire alternate this many times per client count.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Tokio worker threads.
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
        eprintln!("lc_admission_vs_acquire: {e}");
        std::process::exit(1);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Admission,
    Acquire,
}

/// One side's figures for one measured run.
#[derive(Debug, Clone, Copy)]
struct Side {
    per_s: f64,
    latency: LatencySummary,
    refused: u64,
}

fn policy() -> Result<GrantPolicy, String> {
    GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(30))
        .map_err(|e| e.to_string())
}

fn key() -> Result<CapabilityKey, String> {
    CapabilityKey::new(&[7; 32]).map_err(|e| e.to_string())
}

fn sampler_options() -> Result<SamplerOptions, String> {
    Ok(SamplerOptions {
        config: SafeTimeConfig::new(
            50,
            SignedDuration::from_millis(100),
            SignedDuration::from_secs(2),
            SignedDuration::from_secs(1),
            3,
            SignedDuration::from_millis(500),
        )
        .map_err(|e| e.to_string())?,
        standby_poll: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(500),
    })
}

async fn connect(url: &str, max_connections: u32) -> Result<LcStore, String> {
    LcStore::connect(
        url,
        policy()?,
        key()?,
        LcConfig {
            max_connections,
            ..LcConfig::default()
        },
    )
    .await
    .map_err(|e| e.to_string())
}

fn reading_of(r: &clock::ClockReading, retry_after_s: u64) -> CutReading {
    CutReading {
        cut: r.now,
        certain: r.uncertain.is_none(),
        retry_after_s,
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let server = BenchServer::start(args.database_url.as_deref())?;
    let url = server.fresh_database(DB_NAME).await?;
    lc_pg::migrate(&url).await.map_err(|e| e.to_string())?;

    let mut conn = PgConnection::connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    println!("# Little Compute exec admission vs Tollgate bare acquire");
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

    let sampler = Sampler::new(&url, sampler_options()?).map_err(|e| e.to_string())?;
    let (stop_sampler, stop_rx) = watch::channel(false);
    let sampler_task = tokio::spawn(async move { sampler.run(stop_rx).await });

    let setup = connect(&url, 2).await?;
    let clock = Arc::new(SafeCutClock::new(
        setup.pool().clone(),
        SignedDuration::from_secs(2),
    ));
    let started = Instant::now();
    let at = loop {
        let r = clock.read().await.map_err(|e| e.to_string())?;
        if r.uncertain.is_none() {
            break reading_of(&r, clock.retry_after_secs());
        }
        if started.elapsed() > CERTAIN_WAIT_MAX {
            return Err(format!("no certain cut within {CERTAIN_WAIT_MAX:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let provider_key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
    setup
        .register_provider(
            &ProviderId::new("bench").map_err(|e| e.to_string())?,
            "http://127.0.0.1:9",
            provider_key.verifying_key().to_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let op = |k: &str| OperationKey::new(k, Digest::of(k.as_bytes())).map_err(|e| e.to_string());
    setup
        .register_runtime(
            &op("setup-runtime")?,
            at,
            "base",
            Digest::of(b"bench base"),
            serde_json::json!({"kind": "host-usr", "name": "base"}),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut tenants = Vec::with_capacity(args.tenants as usize);
    for i in 0..args.tenants {
        let t = setup
            .create_tenant(
                &op(&format!("setup-tenant-{i}"))?,
                at,
                &format!("bench-{i}"),
                Some(DEPOSIT_UNITS),
                &|t: TenantId| Digest::of(format!("bench-key-{}", t.0).as_bytes()),
            )
            .await
            .map_err(|e| e.to_string())?;
        tenants.push(t.tenant_id);
    }
    if server.is_harness() {
        profile(&url, &mut conn, tenants[0], at).await?;
    }
    let tenants = Arc::new(tenants);

    // The shared reading, refreshed in the background.
    let (reading_tx, reading) = watch::channel(at);
    let refresher = {
        let clock = clock.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(READING_REFRESH).await;
                if let Ok(r) = clock.read().await
                    && reading_tx
                        .send(reading_of(&r, clock.retry_after_secs()))
                        .is_err()
                {
                    return;
                }
            }
        })
    };

    let keys = Arc::new(AtomicU64::new(0));
    let mut rows = Vec::new();
    for &clients in &args.clients {
        let clients = clients.max(1);
        let store = Arc::new(connect(&url, clients).await?);
        for round in 1..=args.rounds.max(1) {
            let mut pair = Vec::new();
            let mut population = (0, 0);
            for kind in [Kind::Admission, Kind::Acquire] {
                eprintln!("clients {clients} round {round}: {kind:?} ...");
                let load = Load {
                    store: store.clone(),
                    tenants: tenants.clone(),
                    reading: reading.clone(),
                    keys: keys.clone(),
                    kind,
                    clients,
                };
                let _ = load.run(args.warmup_secs).await?;
                let before = unreleased_leases(&mut conn).await?;
                pair.push(load.run(args.duration_secs).await?);
                if kind == Kind::Admission {
                    population = (before, unreleased_leases(&mut conn).await?);
                }
            }
            rows.push((clients, round, pair[0], pair[1], population));
        }
        store.pool().close().await;
    }
    refresher.abort();

    let (execs, leases, last): (i64, i64, CutReading) = {
        let (e, l): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM lc_execs), (SELECT count(*) FROM tollgate_leases)",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
        (e, l, *reading.borrow())
    };
    println!();
    println!(
        "| clients | round | admissions/s | bare acquires/s | **ratio admission/acquire** | admission p50 / p99 (ms) | acquire p50 / p99 (ms) | refused (adm/acq) | unreleased Leases during the admission run |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (clients, round, a, q, (p0, p1)) in &rows {
        println!(
            "| {clients} | {round} | {:.0} | {:.0} | **{:.2}** | {:.2} / {:.2} | {:.2} / {:.2} | {} / {} | {p0} → {p1} |",
            a.per_s,
            q.per_s,
            a.per_s / q.per_s,
            ms(a.latency.p50_us),
            ms(a.latency.p99_us),
            ms(q.latency.p50_us),
            ms(q.latency.p99_us),
            a.refused,
            q.refused,
        );
    }
    println!();
    println!(
        "{} tenants; {}s measured per side and round (after {}s warm-up); rows at the end: {execs} execs, {leases} Tollgate leases; last reading certain: {}",
        args.tenants, args.duration_secs, args.warmup_secs, last.certain
    );
    // The provider choice of every admission counts the unreleased Leases
    // per provider (the query of `lc_pg`'s persistence, repeated here).
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (ANALYZE, BUFFERS) SELECT p.provider_id FROM lc_providers p \
          ORDER BY (SELECT count(*) FROM lc_sandbox_leases l \
                     WHERE l.provider_id = p.provider_id AND l.state <> 'released'), \
                   p.provider_id \
          LIMIT 1",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    println!();
    println!(
        "## the provider choice at the end ({} unreleased Leases)",
        unreleased_leases(&mut conn).await?
    );
    println!("```");
    for line in plan.iter().take(PROFILE_LOG_LINES_MAX) {
        println!("{line}");
    }
    println!("```");
    let audit = setup.tollgate().audit().await.map_err(|e| e.to_string())?;
    println!("Tollgate audit clean: {}", audit.is_clean());
    setup.pool().close().await;
    let _ = stop_sampler.send(true);
    let _ = sampler_task.await;
    Ok(())
}

/// Sandbox Leases not yet released.
async fn unreleased_leases(conn: &mut PgConnection) -> Result<i64, String> {
    sqlx::query_scalar("SELECT count(*) FROM lc_sandbox_leases WHERE state <> 'released'")
        .fetch_one(conn)
        .await
        .map_err(|e| e.to_string())
}

/// Logs every statement of one admission and of one bare acquire
/// (`log_statement = all` on the database, for new sessions) and prints
/// them from the harness server's log.
async fn profile(
    url: &str,
    conn: &mut PgConnection,
    tenant: TenantId,
    at: CutReading,
) -> Result<(), String> {
    sqlx::raw_sql(&format!(
        "ALTER DATABASE {DB_NAME} SET log_statement = 'all'"
    ))
    .execute(&mut *conn)
    .await
    .map_err(|e| e.to_string())?;
    let mut marker_conn = PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let store = connect(url, 1).await?;
    let marker = format!("lc-bench-profile-{}", std::process::id());
    let mark = |what: &str| format!("SELECT '{marker}-{what}'");
    let req = ExecRequest {
        runtime: "base".into(),
        shape: "small".into(),
        command: vec!["true".into()],
        timeout_ms: None,
        stdin_open: false,
        idle_ttl_ms: None,
        on_timeout: lc_core::OnTimeout::Terminate,
    };
    let op = OperationKey::new("profile", Digest::of(b"profile")).map_err(|e| e.to_string())?;
    sqlx::raw_sql(&mark("admission"))
        .execute(&mut marker_conn)
        .await
        .map_err(|e| e.to_string())?;
    store
        .admit_exec(&op, at, tenant, &req)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::raw_sql(&mark("acquire"))
        .execute(&mut marker_conn)
        .await
        .map_err(|e| e.to_string())?;
    store
        .tollgate()
        .acquire(
            AcquireRequest {
                account_id: AccountId(tenant.0),
                units: 1,
                ttl: RESERVATION_TTL,
                idempotency_key: None,
            },
            SuppliedTime::exact(at.cut),
        )
        .await
        .map_err(|e| e.to_string())?;
    sqlx::raw_sql(&mark("end"))
        .execute(&mut marker_conn)
        .await
        .map_err(|e| e.to_string())?;
    store.pool().close().await;
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
    let text =
        std::fs::read_to_string(&log_path).map_err(|e| format!("server log {log_path}: {e}"))?;
    let lines: Vec<&str> = text.lines().collect();
    for (what, from, to) in [
        ("one admission", "admission", "acquire"),
        ("one bare acquire", "acquire", "end"),
    ] {
        let start = lines
            .iter()
            .rposition(|l| l.contains(&format!("{marker}-{from}")))
            .ok_or("profile marker not found in the server log")?;
        let statements: Vec<&str> = lines[start + 1..]
            .iter()
            .take_while(|l| !l.contains(&format!("{marker}-{to}")))
            .filter(|l| l.contains("LOG:  statement:") || l.contains("LOG:  execute"))
            .map(|l| l.split_once("LOG:  ").map(|(_, t)| t).unwrap_or(l))
            .take(PROFILE_LOG_LINES_MAX)
            .collect();
        println!();
        println!("## statements of {what} (log_statement = all)");
        for (i, text) in statements.iter().enumerate() {
            let short: String = text.chars().take(140).collect();
            println!("{:2}. {short}", i + 1);
        }
        let control = statements
            .iter()
            .filter(|s| s.ends_with("BEGIN") || s.ends_with("COMMIT"))
            .count();
        println!(
            "{} statements sent ({} data statements, {control} BEGIN/COMMIT)",
            statements.len(),
            statements.len() - control
        );
    }
    Ok(())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// One side's load at one client count.
struct Load {
    store: Arc<LcStore>,
    tenants: Arc<Vec<TenantId>>,
    reading: watch::Receiver<CutReading>,
    keys: Arc<AtomicU64>,
    kind: Kind,
    clients: u32,
}

impl Load {
    async fn run(&self, secs: u64) -> Result<Side, String> {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for c in 0..self.clients {
            let (store, tenants, reading, keys, kind) = (
                self.store.clone(),
                self.tenants.clone(),
                self.reading.clone(),
                self.keys.clone(),
                self.kind,
            );
            let seed = u64::from(c) + 1 + keys.load(Ordering::Relaxed);
            tasks.push(tokio::spawn(async move {
                client(store, tenants, reading, keys, kind, deadline, seed).await
            }));
        }
        let mut samples = Vec::new();
        let mut refused = 0;
        for t in tasks {
            let (s, r) = t.await.map_err(|e| e.to_string())??;
            samples.extend(s);
            refused += r;
        }
        let elapsed = start.elapsed();
        Ok(Side {
            per_s: samples.len() as f64 / elapsed.as_secs_f64(),
            latency: LatencySummary::of(&mut samples),
            refused,
        })
    }
}

/// Calls until `deadline`; returns the latencies (µs) of the calls that
/// succeeded and how many were refused.
async fn client(
    store: Arc<LcStore>,
    tenants: Arc<Vec<TenantId>>,
    reading: watch::Receiver<CutReading>,
    keys: Arc<AtomicU64>,
    kind: Kind,
    deadline: Instant,
    seed: u64,
) -> Result<(Vec<u64>, u64), String> {
    let mut rng = Rng::new(seed);
    let req = ExecRequest {
        runtime: "base".into(),
        shape: "small".into(),
        command: vec!["true".into()],
        timeout_ms: None,
        stdin_open: false,
        idle_ttl_ms: None,
        on_timeout: lc_core::OnTimeout::Terminate,
    };
    let mut samples = Vec::new();
    let mut refused = 0_u64;
    while Instant::now() < deadline {
        let tenant = tenants[rng.below(tenants.len() as u64) as usize];
        let at = *reading.borrow();
        match kind {
            Kind::Admission => {
                let k = format!("bench-{}", keys.fetch_add(1, Ordering::Relaxed));
                let op =
                    OperationKey::new(&k, Digest::of(k.as_bytes())).map_err(|e| e.to_string())?;
                let t0 = Instant::now();
                match store.admit_exec(&op, at, tenant, &req).await {
                    Ok(_) => samples.push(micros(t0.elapsed())),
                    Err(e) if e.code() == "time_uncertain" => refused += 1,
                    Err(e) => return Err(format!("admit_exec: {e}")),
                }
            }
            Kind::Acquire => {
                let t0 = Instant::now();
                store
                    .tollgate()
                    .acquire(
                        AcquireRequest {
                            account_id: AccountId(tenant.0),
                            units: 1,
                            ttl: RESERVATION_TTL,
                            idempotency_key: None,
                        },
                        SuppliedTime::exact(at.cut),
                    )
                    .await
                    .map_err(|e| format!("acquire: {e}"))?;
                samples.push(micros(t0.elapsed()));
            }
        }
    }
    Ok((samples, refused))
}
