//! `tollgate-load`: a load generator for a running `tollgate serve`, and a
//! capacity check operators can point at their own deployment.
//!
//! It is an ordinary client of the public HTTP API (`/v1`, see
//! `crates/tollgate-server/README.md`):
//!
//! 1. creates `--accounts` accounts with the admin token and deposits
//!    `--deposit-units` into each (not measured);
//! 2. runs `--concurrency` workers for `--duration`; each repeats a cycle
//!    on a random account: acquire (1..=10 units, TTL `--ttl`, with the
//!    account's key); then, for `--expire-percent` of the cycles, abandon
//!    the lease (acquired with the short TTL `--expire-ttl`) so that the
//!    server's reclaim worker must settle it; otherwise renew it in
//!    `--renew-percent` of the cycles and release it charging a random
//!    part of its units (with the lease's capability);
//! 3. prints a progress line per second on stderr, then ops/s and latency
//!    percentiles per operation on stdout;
//! 4. waits (at most `--drain-timeout`) until the server reports no active
//!    lease, i.e. its worker reclaimed the abandoned ones (skip with
//!    `--no-drain`, e.g. when other clients hold leases);
//! 5. asks `GET /v1/admin/audit` and fails if the ledger and accounts are
//!    not conserved.
//!
//! Exit status: 0 when every request succeeded, the leases drained and the
//! audit is clean; 1 otherwise (the reason on stderr); 2 for bad usage.
//!
//! ```sh
//! tollgate-load --server http://127.0.0.1:8080 --admin-token "$TOLLGATE_ADMIN_TOKEN" \
//!     --accounts 200 --duration 30s --concurrency 16
//! ```

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use jiff::SignedDuration;
use reqwest::Method;
use serde_json::{Value, json};
use tollgate_bench::{LatencySummary, Rng, micros};

/// Bound on one HTTP request, connection included; a request slower than
/// this counts as an error rather than stalling its worker.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Most units one lease holds; small against the deposit so no account
/// runs dry in any realistic run.
const LEASE_UNITS_MAX: u64 = 10;

/// Error messages kept (the first ones) for the report.
const ERROR_SAMPLES_MAX: usize = 5;

/// Interval between polls of the status while draining.
const DRAIN_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Parser)]
#[command(
    name = "tollgate-load",
    about = "Load generator and capacity check for a running tollgate service"
)]
struct Args {
    /// The service, `http://HOST:PORT`.
    #[arg(long, env = "TOLLGATE_SERVER", default_value = "http://127.0.0.1:8080")]
    server: String,
    /// The admin bearer token.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    /// Accounts to create and spread the load over.
    #[arg(long, default_value_t = 100)]
    accounts: u32,
    /// Length of the measured run (ISO 8601 or friendly, e.g. `30s`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    duration: SignedDuration,
    /// Concurrent workers (each has at most one request in flight).
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
    /// Units deposited into each account.
    #[arg(long, default_value_t = 1_000_000_000_000)]
    deposit_units: i64,
    /// TTL of the leases that are renewed or released.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: SignedDuration,
    /// Percent of cycles whose lease is abandoned to the reclaim worker.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=100))]
    expire_percent: u64,
    /// TTL of abandoned leases.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    expire_ttl: SignedDuration,
    /// Percent of kept leases renewed once before release.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=100))]
    renew_percent: u64,
    /// Longest wait for the server's worker to reclaim abandoned leases.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    drain_timeout: SignedDuration,
    /// Do not wait for active leases to drain (other clients hold some).
    #[arg(long)]
    no_drain: bool,
}

fn parse_duration(s: &str) -> Result<SignedDuration, String> {
    let d = SignedDuration::from_str(s).map_err(|e| format!("{s:?}: {e}"))?;
    if d.is_positive() {
        Ok(d)
    } else {
        Err(format!("{s:?}: must be positive"))
    }
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(args)) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("tollgate-load: {e}");
            std::process::exit(1);
        }
    }
}

/// The measured operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Acquire,
    Renew,
    Release,
}

impl OpKind {
    const ALL: [OpKind; 3] = [OpKind::Acquire, OpKind::Renew, OpKind::Release];

    fn name(self) -> &'static str {
        match self {
            OpKind::Acquire => "acquire",
            OpKind::Renew => "renew",
            OpKind::Release => "release",
        }
    }
}

/// Live counters for the progress display.
#[derive(Debug, Default)]
struct Counters {
    ops: [AtomicU64; 3],
    errors: AtomicU64,
    abandoned: AtomicU64,
}

/// What one worker measured.
#[derive(Debug, Default)]
struct WorkerResult {
    samples_us: [Vec<u64>; 3],
    errors: [u64; 3],
    error_samples: Vec<String>,
}

#[derive(Debug, Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| format!("{path}: {e}"))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| format!("{path}: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "{path}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("{path}: response is not JSON: {e}"))
    }
}

fn field_i64(v: &Value, name: &str) -> Result<i64, String> {
    v.get(name)
        .and_then(Value::as_i64)
        .ok_or_else(|| format!("response has no integer {name:?}: {v}"))
}

fn field_str<'v>(v: &'v Value, name: &str) -> Result<&'v str, String> {
    v.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("response has no string {name:?}: {v}"))
}

/// An account the load runs on: id and API key.
#[derive(Debug, Clone)]
struct LoadAccount {
    id: i64,
    key: String,
}

async fn run(args: Args) -> Result<(), String> {
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let api = Api {
        http,
        base: args.server.trim_end_matches('/').to_owned(),
    };
    let admin = args.admin_token.as_str();
    let run_id = jiff::Timestamp::now().as_second();

    eprintln!(
        "tollgate-load: creating {} accounts on {} ...",
        args.accounts, api.base
    );
    let mut accounts = Vec::with_capacity(args.accounts as usize);
    for i in 0..args.accounts.max(1) {
        let created = api
            .call(
                Method::POST,
                "/v1/accounts",
                admin,
                Some(json!({ "name": format!("load-{run_id}-{i}") })),
            )
            .await?;
        let id = field_i64(&created, "account_id")?;
        let key = field_str(&created, "api_key")?.to_owned();
        api.call(
            Method::POST,
            &format!("/v1/accounts/{id}/deposits"),
            admin,
            Some(json!({ "units": args.deposit_units })),
        )
        .await?;
        accounts.push(LoadAccount { id, key });
    }
    let accounts = Arc::new(accounts);

    let counters = Arc::new(Counters::default());
    let duration = Duration::try_from(args.duration).map_err(|e| e.to_string())?;
    eprintln!(
        "tollgate-load: {} workers for {:?} ({}% abandoned with TTL {}, {}% renewed)",
        args.concurrency, duration, args.expire_percent, args.expire_ttl, args.renew_percent
    );
    let start = Instant::now();
    let deadline = start + duration;
    let done = Arc::new(AtomicBool::new(false));
    let progress = tokio::spawn(progress(counters.clone(), done.clone(), start));
    let cfg = Arc::new(CycleConfig {
        ttl: args.ttl.to_string(),
        expire_ttl: args.expire_ttl.to_string(),
        expire_percent: args.expire_percent,
        renew_percent: args.renew_percent,
    });
    let mut workers = Vec::new();
    for w in 0..args.concurrency.max(1) {
        workers.push(tokio::spawn(worker(
            api.clone(),
            accounts.clone(),
            cfg.clone(),
            counters.clone(),
            deadline,
            u64::from(w) + 1,
        )));
    }
    let mut total = WorkerResult::default();
    for w in workers {
        let r = w.await.map_err(|e| e.to_string())?;
        for i in 0..3 {
            total.samples_us[i].extend_from_slice(&r.samples_us[i]);
            total.errors[i] += r.errors[i];
        }
        for e in r.error_samples {
            if total.error_samples.len() < ERROR_SAMPLES_MAX {
                total.error_samples.push(e);
            }
        }
    }
    let elapsed = start.elapsed();
    done.store(true, Ordering::Relaxed);
    let _ = progress.await;

    println!(
        "tollgate-load: {} accounts, concurrency {}, {:.1}s measured against {}",
        accounts.len(),
        args.concurrency,
        elapsed.as_secs_f64(),
        api.base
    );
    println!();
    println!("| operation | count | errors | ops/s | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut all = Vec::new();
    let mut failures = 0;
    for (i, op) in OpKind::ALL.iter().enumerate() {
        all.extend_from_slice(&total.samples_us[i]);
        failures += total.errors[i];
        print_row(
            op.name(),
            &mut total.samples_us[i],
            total.errors[i],
            elapsed,
        );
    }
    print_row("all", &mut all, failures, elapsed);
    let abandoned = counters.abandoned.load(Ordering::Relaxed);
    println!();
    println!("leases abandoned to the reclaim worker: {abandoned}");
    for e in &total.error_samples {
        eprintln!("error: {e}");
    }

    let mut problems = Vec::new();
    if failures > 0 {
        problems.push(format!("{failures} requests failed"));
    }
    if !args.no_drain {
        let drain = Duration::try_from(args.drain_timeout).map_err(|e| e.to_string())?;
        match drain_active(&api, admin, drain).await? {
            (0, waited) => println!(
                "active leases drained to 0 in {:.1}s after the run (reclaim worker)",
                waited.as_secs_f64()
            ),
            (n, waited) => problems.push(format!(
                "{n} leases still active {:.0}s after the run (is the reclaim worker running?)",
                waited.as_secs_f64()
            )),
        }
    }
    let audit = api
        .call(Method::GET, "/v1/admin/audit", admin, None)
        .await?;
    let clean = audit.get("clean").and_then(Value::as_bool) == Some(true);
    println!(
        "audit: clean = {clean}, accounts_checked = {}, entries_checked = {}",
        audit.get("accounts_checked").unwrap_or(&Value::Null),
        audit.get("entries_checked").unwrap_or(&Value::Null)
    );
    if !clean {
        problems.push(format!("the audit is not clean: {audit}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn print_row(name: &str, samples: &mut [u64], errors: u64, elapsed: Duration) {
    let l = LatencySummary::of(samples);
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "| {name} | {} | {errors} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
        l.count,
        l.count as f64 / elapsed.as_secs_f64(),
        ms(l.p50_us),
        ms(l.p90_us),
        ms(l.p99_us),
        ms(l.max_us)
    );
}

/// Polls the status until no lease is active or `timeout` passes; returns
/// the last count and the time waited.
async fn drain_active(
    api: &Api,
    admin: &str,
    timeout: Duration,
) -> Result<(u64, Duration), String> {
    let start = Instant::now();
    loop {
        let status = api
            .call(Method::GET, "/v1/admin/status", admin, None)
            .await?;
        let active = status
            .get("active_leases")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("status has no active_leases: {status}"))?;
        if active == 0 || start.elapsed() >= timeout {
            return Ok((active, start.elapsed()));
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

async fn progress(counters: Arc<Counters>, done: Arc<AtomicBool>, start: Instant) {
    let mut last = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    while !done.load(Ordering::Relaxed) {
        tick.tick().await;
        let per_op: Vec<u64> = counters
            .ops
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = per_op.iter().sum();
        eprintln!(
            "[{:>4.0}s] {total} ops ({}/s), acquire {} renew {} release {}, abandoned {}, errors {}",
            start.elapsed().as_secs_f64(),
            total - last,
            per_op[0],
            per_op[1],
            per_op[2],
            counters.abandoned.load(Ordering::Relaxed),
            counters.errors.load(Ordering::Relaxed),
        );
        last = total;
    }
}

#[derive(Debug)]
struct CycleConfig {
    ttl: String,
    expire_ttl: String,
    expire_percent: u64,
    renew_percent: u64,
}

async fn worker(
    api: Api,
    accounts: Arc<Vec<LoadAccount>>,
    cfg: Arc<CycleConfig>,
    counters: Arc<Counters>,
    deadline: Instant,
    seed: u64,
) -> WorkerResult {
    let mut rng = Rng::new(seed);
    let mut out = WorkerResult::default();
    while Instant::now() < deadline {
        let account = &accounts[rng.below(accounts.len() as u64) as usize];
        let units = 1 + rng.below(LEASE_UNITS_MAX);
        let abandon = rng.chance(cfg.expire_percent);
        let renew = rng.chance(cfg.renew_percent);
        let consumed = rng.below(units + 1);
        let ttl = if abandon { &cfg.expire_ttl } else { &cfg.ttl };
        let grant = timed(
            &mut out,
            &counters,
            OpKind::Acquire,
            api.call(
                Method::POST,
                &format!("/v1/accounts/{}/leases", account.id),
                &account.key,
                Some(json!({ "units": units, "ttl": ttl })),
            ),
        )
        .await;
        let Some(grant) = grant else { continue };
        let (Ok(lease_id), Ok(cap)) = (
            field_i64(&grant, "lease_id"),
            field_str(&grant, "capability"),
        ) else {
            record_error(
                &mut out,
                &counters,
                OpKind::Acquire,
                format!("bad grant {grant}"),
            );
            continue;
        };
        if abandon {
            counters.abandoned.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        if renew {
            let renewed = timed(
                &mut out,
                &counters,
                OpKind::Renew,
                api.call(
                    Method::POST,
                    &format!("/v1/leases/{lease_id}/renew"),
                    cap,
                    Some(json!({ "ttl": cfg.ttl })),
                ),
            )
            .await;
            if renewed.is_none() {
                continue;
            }
        }
        let _ = timed(
            &mut out,
            &counters,
            OpKind::Release,
            api.call(
                Method::POST,
                &format!("/v1/leases/{lease_id}/release"),
                cap,
                Some(json!({ "consumed": consumed })),
            ),
        )
        .await;
    }
    out
}

async fn timed(
    out: &mut WorkerResult,
    counters: &Counters,
    op: OpKind,
    call: impl std::future::Future<Output = Result<Value, String>>,
) -> Option<Value> {
    let i = op as usize;
    let t0 = Instant::now();
    match call.await {
        Ok(v) => {
            out.samples_us[i].push(micros(t0.elapsed()));
            counters.ops[i].fetch_add(1, Ordering::Relaxed);
            Some(v)
        }
        Err(e) => {
            record_error(out, counters, op, e);
            None
        }
    }
}

fn record_error(out: &mut WorkerResult, counters: &Counters, op: OpKind, e: String) {
    out.errors[op as usize] += 1;
    counters.errors.fetch_add(1, Ordering::Relaxed);
    if out.error_samples.len() < ERROR_SAMPLES_MAX {
        out.error_samples.push(format!("{}: {e}", op.name()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_friendly_and_iso() {
        assert_eq!(parse_duration("30s"), Ok(SignedDuration::from_secs(30)));
        assert_eq!(parse_duration("PT1S"), Ok(SignedDuration::from_secs(1)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("nonsense").is_err());
    }

    #[test]
    fn args_parse() {
        let a = Args::try_parse_from([
            "tollgate-load",
            "--admin-token",
            "t",
            "--duration",
            "2s",
            "--concurrency",
            "3",
        ])
        .expect("args");
        assert_eq!(a.duration, SignedDuration::from_secs(2));
        assert_eq!(a.concurrency, 3);
        assert!(
            Args::try_parse_from([
                "tollgate-load",
                "--admin-token",
                "t",
                "--expire-percent",
                "101"
            ])
            .is_err()
        );
    }
}
