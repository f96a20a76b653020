//! `little-compute worker`: the reconciler ([`lc_worker::Reconciler`]) in a
//! loop, on the safe-time cut.
//!
//! Start-up, in order: the server secret (`--secret-file`: the same file as
//! the control plane's, since it is Tollgate's capability key and every
//! renewal and release of a Reservation needs it); the grant policy recorded
//! in the database; the store, waited for within [`DATABASE_WAIT_MAX`];
//! each `--provider-url`'s identity (`GET /v1/identity`, waited for within
//! [`PROVIDER_WAIT_MAX`]) registered in the store; then a step every
//! `--interval-ms` until SIGINT or SIGTERM, which ends the loop after the
//! step in progress (bounded by [`SHUTDOWN_MAX`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use lc_core::store::ReconcileStore;
use lc_provider::Provider;
use lc_worker::{Reconciler, ReconcilerOptions};
use sqlx::postgres::PgConnectOptions;

/// How long start-up waits for the database.
pub const DATABASE_WAIT_MAX: Duration = Duration::from_secs(30);
/// How long start-up waits for each provider's identity.
pub const PROVIDER_WAIT_MAX: Duration = Duration::from_secs(30);
/// Pause between attempts while waiting.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// How long the step in progress may take after a shutdown signal.
pub const SHUTDOWN_MAX: Duration = Duration::from_secs(30);
/// The largest credential file read, in bytes.
const CREDENTIAL_FILE_BYTES_MAX: u64 = 4096;
/// The fewest bytes a server secret has.
pub(crate) const SECRET_BYTES_MIN: usize = 32;
/// Bounds of `--interval-ms`: a step at least every minute keeps 60 s
/// Leases renewed; faster than 10 ms only burns the database.
const INTERVAL_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=60_000;
/// Bounds of `--lease-ttl-ms`: at least a second (several steps), at
/// most an hour (well inside any sealed horizon).
const LEASE_TTL_MS_RANGE: std::ops::RangeInclusive<i64> = 1_000..=3_600_000;
/// Bounds of `--providers`: one provider per host.
const PROVIDERS_MAX: usize = 64;

/// `little-compute worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// PostgreSQL URL of the installation's database.
    #[arg(
        long,
        env = "LC_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: String,
    /// The control plane's server secret file (Tollgate's capability key).
    #[arg(long, value_name = "PATH")]
    pub secret_file: PathBuf,
    /// A provider's base URL (`http://127.0.0.1:PORT`); repeat for several.
    #[arg(long = "provider-url", value_name = "URL", required = true)]
    pub provider_urls: Vec<String>,
    /// A file holding the bearer token of the providers' API, if they require one.
    #[arg(long, value_name = "PATH")]
    pub provider_token_file: Option<PathBuf>,
    /// Milliseconds between steps (10..=60000).
    #[arg(long, default_value_t = 250)]
    pub interval_ms: u64,
    /// Leases per step (1..=1000).
    #[arg(long, default_value_t = lc_worker::BATCH_DEFAULT)]
    pub batch: usize,
    /// Hibernations (idle or past a timeout with `on_timeout = hibernate`)
    /// sealed per step on a certain cut (1..=1000).
    #[arg(long, default_value_t = lc_worker::HIBERNATIONS_BATCH_DEFAULT)]
    pub hibernations_batch: usize,
    /// Items purged per step on a certain cut (1..=1000): deleted
    /// workspaces and outputs past their grace, terminal execs past their
    /// retention, each in its own transaction.
    #[arg(long, default_value_t = lc_core::deletion::PURGE_BATCH_DEFAULT)]
    pub purge_batch: usize,
    /// How long a terminal exec's records are retained after its terminal
    /// cut, seconds (1..=315360000, 3,650 days; default 30 days). The
    /// exec's end is committed by a worker (a release) or the control
    /// plane (a cancel while parked): give both the same value.
    #[arg(long, default_value_t = lc_core::deletion::RETENTION_DEFAULT.as_secs())]
    pub retention_s: i64,
    /// Allocations (instance starts) in flight at once within a step
    /// (1..=64): an instance slow to start delays no other.
    #[arg(long, default_value_t = lc_worker::ALLOCATE_CONCURRENCY_DEFAULT)]
    pub allocate_concurrency: usize,
    /// The bound on each provider call of a step, milliseconds
    /// (10..=600000; above the provider's start wait): a call that does not
    /// answer in time is that lease's `provider_timeout`, retried at the
    /// next step.
    #[arg(long, default_value_t = 30_000)]
    pub provider_call_timeout_ms: u64,
    /// A reading of the cut older than this is stale (uncertain), milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub safetime_gap_max_ms: u64,
    /// The sandbox Lease TTL a renewal extends to (`max(current, cut +
    /// ttl)`), milliseconds (1000..=3600000); the control plane admits with
    /// the store's default, 60 s.
    #[arg(long, default_value_t = 60_000)]
    pub lease_ttl_ms: u64,
    /// This worker's claim TTL, milliseconds (1000..=600000): each step
    /// claims the Leases it acts on and renews its claims to `max(current,
    /// cut + ttl)`; a killed worker's Leases are taken by another once a
    /// certain cut passes expiry + grace.
    #[arg(long, default_value_t = crate::serve::claim_ms(lc_core::claim::CLAIM_TTL_DEFAULT))]
    pub claim_ttl_ms: u64,
    /// How long past its expiry a claim stays its holder's before another
    /// worker may take it, milliseconds (0..=600000).
    #[arg(long, default_value_t = crate::serve::claim_ms(lc_core::claim::CLAIM_GRACE_DEFAULT))]
    pub claim_grace_ms: u64,
}

/// Why a worker or gateway start-up failed: bad arguments (exit 2) or
/// anything else (exit 1).
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkerError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
}

pub(crate) fn read_credential(path: &std::path::Path, what: &str) -> Result<Vec<u8>, WorkerError> {
    use std::io::Read as _;
    let bad = |why: String| WorkerError::Usage(format!("{what} {}: {why}", path.display()));
    let f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut bytes = Vec::new();
    f.take(CREDENTIAL_FILE_BYTES_MAX)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(e.to_string()))?;
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    bytes.truncate(end);
    Ok(bytes)
}

/// Runs the worker until SIGINT/SIGTERM: exit 0 after a clean stop, 2 for
/// bad arguments, 1 for any other failure.
pub async fn run(args: WorkerArgs) -> ExitCode {
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(WorkerError::Usage(m)) => {
            eprintln!("little-compute worker: {m}");
            ExitCode::from(2)
        }
        Err(WorkerError::Failed(m)) => {
            eprintln!("little-compute worker: {m}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) async fn recorded_policy(url: &str) -> Result<tollgate::GrantPolicy, WorkerError> {
    let options: PgConnectOptions = pgkit::DatabaseUrl::parse(url)
        .map(pgkit::DatabaseUrl::into_connect_options)
        .map_err(|e| WorkerError::Usage(format!("--database-url: {e}")))?;
    let deadline = tokio::time::Instant::now() + DATABASE_WAIT_MAX;
    let read = crate::retry::until(
        deadline,
        RETRY_PAUSE,
        "the database",
        |_| true,
        || async {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy_with(options.clone());
            let read = tollgate_pg::recorded_policy(&pool).await;
            pool.close().await;
            read
        },
    )
    .await;
    match read {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err(WorkerError::Failed(
            "the database records no grant policy (the appliance records one at its first start)"
                .into(),
        )),
        Err(e) => Err(WorkerError::Failed(format!(
            "reading the grant policy: {e}"
        ))),
    }
}

async fn serve(args: WorkerArgs) -> Result<(), WorkerError> {
    if !INTERVAL_MS_RANGE.contains(&args.interval_ms) {
        return Err(WorkerError::Usage(format!(
            "--interval-ms must be in {INTERVAL_MS_RANGE:?}, got {}",
            args.interval_ms
        )));
    }
    for (flag, n) in [
        ("--batch", args.batch),
        ("--hibernations-batch", args.hibernations_batch),
        ("--purge-batch", args.purge_batch),
    ] {
        if !(1..=lc_core::rules::LIST_LIMIT_MAX).contains(&n) {
            return Err(WorkerError::Usage(format!(
                "{flag} must be in 1..={}, got {n}",
                lc_core::rules::LIST_LIMIT_MAX
            )));
        }
    }
    if !(1..=lc_worker::ALLOCATE_CONCURRENCY_MAX).contains(&args.allocate_concurrency) {
        return Err(WorkerError::Usage(format!(
            "--allocate-concurrency must be in 1..={}, got {}",
            lc_worker::ALLOCATE_CONCURRENCY_MAX,
            args.allocate_concurrency
        )));
    }
    let call_ms = lc_worker::PROVIDER_CALL_TIMEOUT_MIN.as_millis()
        ..=lc_worker::PROVIDER_CALL_TIMEOUT_MAX.as_millis();
    if !call_ms.contains(&u128::from(args.provider_call_timeout_ms)) {
        return Err(WorkerError::Usage(format!(
            "--provider-call-timeout-ms must be in {call_ms:?}, got {}",
            args.provider_call_timeout_ms
        )));
    }
    if args.provider_urls.len() > PROVIDERS_MAX {
        return Err(WorkerError::Usage(format!(
            "at most {PROVIDERS_MAX} --provider-url"
        )));
    }
    let gap_ms = i64::try_from(args.safetime_gap_max_ms)
        .ok()
        .filter(|ms| (1..=3_600_000).contains(ms))
        .ok_or_else(|| WorkerError::Usage("--safetime-gap-max-ms must be in 1..=3600000".into()))?;
    let lease_ttl_ms = i64::try_from(args.lease_ttl_ms)
        .ok()
        .filter(|ms| LEASE_TTL_MS_RANGE.contains(ms))
        .ok_or_else(|| {
            WorkerError::Usage(format!(
                "--lease-ttl-ms must be in {LEASE_TTL_MS_RANGE:?}, got {}",
                args.lease_ttl_ms
            ))
        })?;
    let retention =
        lc_core::deletion::check_retention(jiff::SignedDuration::from_secs(args.retention_s))
            .map_err(|e| WorkerError::Usage(format!("--retention-s: {e}")))?;
    let secret = read_credential(&args.secret_file, "--secret-file")?;
    if secret.len() < SECRET_BYTES_MIN {
        return Err(WorkerError::Usage(format!(
            "--secret-file: at least {SECRET_BYTES_MIN} bytes, got {}",
            secret.len()
        )));
    }
    let token = match &args.provider_token_file {
        Some(p) => Some(
            String::from_utf8(read_credential(p, "--provider-token-file")?)
                .map_err(|_| WorkerError::Usage("--provider-token-file: not UTF-8".into()))?,
        ),
        None => None,
    };
    let key = tollgate::CapabilityKey::new(&secret)
        .map_err(|e| WorkerError::Usage(format!("--secret-file: {e}")))?;
    let shutdown = shutdown_signal()?;
    let policy = recorded_policy(&args.database_url).await?;
    let deadline = tokio::time::Instant::now() + DATABASE_WAIT_MAX;
    let (claim_ttl, claim_grace) =
        crate::serve::claim_settings(args.claim_ttl_ms, args.claim_grace_ms)
            .map_err(WorkerError::Usage)?;
    let config = lc_pg::LcConfig {
        max_connections: 4,
        lease_ttl: jiff::SignedDuration::from_millis(lease_ttl_ms),
        claim_ttl,
        claim_grace,
        retention,
        ..lc_pg::LcConfig::default()
    };
    let store = crate::retry::until(
        deadline,
        RETRY_PAUSE,
        "the database",
        lc_core::LcError::is_transient,
        || lc_pg::LcStore::connect(&args.database_url, policy, key.clone(), config),
    )
    .await
    .map_err(|e| WorkerError::Failed(format!("opening the store: {e}")))?;
    // The deadlines this worker issues: Lease and Reservation renewals, its
    // claims, and the retention it sets when it ends an exec.
    {
        use safetime::inventory as k;
        store
            .check_horizon(&[
                k::LEASE_GRANT,
                k::RESERVATION,
                k::SANDBOX_LEASE,
                k::CLAIM,
                k::RETENTION,
            ])
            .await
            .map_err(|e| WorkerError::Usage(format!("the sealed safe-time horizon: {e}")))?;
    }
    let clock: Arc<dyn Clock> = Arc::new(SafeCutClock::new(
        store.pool().clone(),
        jiff::SignedDuration::from_millis(gap_ms),
    ));
    let store = Arc::new(store);
    let mut providers: Vec<Arc<dyn Provider>> = Vec::new();
    for url in &args.provider_urls {
        let deadline = tokio::time::Instant::now() + PROVIDER_WAIT_MAX;
        let provider = crate::retry::until(
            deadline,
            RETRY_PAUSE,
            &format!("the provider {url}"),
            |_| true,
            || lc_provider::HttpProvider::connect(url),
        )
        .await
        .map_err(|e| WorkerError::Failed(format!("provider {url}: {e}")))?;
        let provider = match &token {
            Some(t) => provider.with_token(t.clone()),
            None => provider,
        };
        store
            .register_provider(provider.id(), url, provider.public_key().to_bytes())
            .await
            .map_err(|e| WorkerError::Failed(format!("registering provider {url}: {e}")))?;
        tracing::info!(provider = %provider.id(), %url, "provider registered");
        providers.push(Arc::new(provider));
    }
    let reconciler = Reconciler::new(
        store,
        providers,
        clock,
        ReconcilerOptions {
            batch: args.batch,
            // Half a TTL: one missed step still leaves half of it.
            renew_ahead: jiff::SignedDuration::from_millis(lease_ttl_ms / 2),
            hibernations_batch: args.hibernations_batch,
            purge_batch: args.purge_batch,
            allocate_concurrency: args.allocate_concurrency,
            provider_call_timeout: Duration::from_millis(args.provider_call_timeout_ms),
            ..ReconcilerOptions::default()
        },
    )
    .map_err(|e| WorkerError::Usage(format!("the reconciler's options: {e}")))?;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let interval = Duration::from_millis(args.interval_ms);
    let mut task = tokio::spawn(async move { reconciler.run(interval, rx).await });
    tokio::select! {
        () = shutdown => {}
        r = &mut task => {
            return r.map_err(|e| WorkerError::Failed(format!("the reconciler task failed: {e}")));
        }
    }
    let _ = stop.send(true);
    if tokio::time::timeout(SHUTDOWN_MAX, &mut task).await.is_err() {
        tracing::warn!("the step in progress did not finish in time; stopping anyway");
        task.abort();
    }
    Ok(())
}

pub(crate) fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, WorkerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| WorkerError::Failed(format!("cannot listen for SIGTERM: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| WorkerError::Failed(format!("cannot listen for SIGINT: {e}")))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received: stopping"),
            _ = int.recv() => tracing::info!("SIGINT received: stopping"),
        }
    })
}
