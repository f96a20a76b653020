//! `little-compute gateway`: the exec gateway ([`lc_gateway::Gateway`]) in
//! a loop, on the safe-time cut. Any number may run, on any host: each
//! activation draws its own owner token, and the database decides which
//! one owns an exec.
//!
//! Start-up, in order: the fault-injection switch
//! (`LC_GATEWAY_CRASH_AT`, see [`lc_gateway::crash`]: unset in production;
//! an unknown value is refused); the server secret (`--secret-file`, the
//! store's constructor needs Tollgate's capability key); the grant policy
//! recorded in the database; the sink (`--blob-dir`); the store, waited for
//! within [`crate::worker::DATABASE_WAIT_MAX`]; the metrics listener
//! (`--metrics-listen`, loopback only) if asked for; then a step every
//! `--interval-ms` until SIGINT or SIGTERM, which ends the loop after the
//! step in progress (bounded by [`crate::worker::SHUTDOWN_MAX`]).
//!
//! Providers are reached at the URL the store recorded for each exec,
//! over HTTP with the bearer token of `--provider-token-file`, as the
//! worker does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use lc_gateway::{CrashPoint, FaultHook, Gateway, GatewayMetrics, GatewayOptions, HttpConnector};

use crate::worker::{
    DATABASE_WAIT_MAX, RETRY_PAUSE, SECRET_BYTES_MIN, SHUTDOWN_MAX, WorkerError, read_credential,
    recorded_policy, shutdown_signal,
};

/// Bounds of `--interval-ms`: several steps per heartbeat TTL (at least
/// 1 s), and no faster than 10 ms.
const INTERVAL_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=1_000;

/// The default of `--provider-call-timeout-ms` (unless a third of the TTL
/// is smaller): the library's [`lc_gateway::PROVIDER_CALL_TIMEOUT_DEFAULT`].
const PROVIDER_CALL_TIMEOUT_MS_DEFAULT: u64 =
    lc_gateway::PROVIDER_CALL_TIMEOUT_DEFAULT.as_millis() as u64;

/// `little-compute gateway`.
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// PostgreSQL URL of the installation's database.
    #[arg(
        long,
        env = "LC_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: String,
    /// The control plane's server secret file (the store's capability key).
    #[arg(long, value_name = "PATH")]
    pub secret_file: PathBuf,
    /// The sink: the directory of the content-addressed blob store the
    /// output pages are written to (`DIR/sha256/..`), shared with `serve`.
    #[arg(long, value_name = "DIR")]
    pub blob_dir: PathBuf,
    /// A file holding the bearer token of the providers' API, if they require one.
    #[arg(long, value_name = "PATH")]
    pub provider_token_file: Option<PathBuf>,
    /// The ownership heartbeat TTL, milliseconds (1000..=600000): a
    /// successor may take an exec over once a certain cut passes the last
    /// heartbeat plus this.
    #[arg(long, default_value_t = 5_000)]
    pub heartbeat_ttl_ms: u64,
    /// The bound on each call the gateway makes to a provider, milliseconds
    /// (10 up to a third of `--heartbeat-ttl-ms`): a call that does not
    /// answer within it counts as a failure `provider_timeout` of its exec
    /// only, retried at the next step, so a supervisor that stops answering
    /// delays the other execs by at most this per step. Default: 1000 or a
    /// third of `--heartbeat-ttl-ms`, whichever is smaller.
    #[arg(long, value_name = "MS")]
    pub provider_call_timeout_ms: Option<u64>,
    /// The bound on one quiesce of a hibernating exec's workspace,
    /// milliseconds (from `--provider-call-timeout-ms` to 3600000): the
    /// provider walks, hashes and stores the whole workspace while the
    /// heartbeat is renewed beside it.
    #[arg(long, value_name = "MS", default_value_t = lc_gateway::QUIESCE_TIMEOUT_DEFAULT.as_millis() as u64)]
    pub quiesce_timeout_ms: u64,
    /// Milliseconds between steps (10..=1000).
    #[arg(long, default_value_t = 200)]
    pub interval_ms: u64,
    /// Execs owned at once (1..=1000).
    #[arg(long, default_value_t = lc_gateway::OWNED_EXECS_DEFAULT)]
    pub owned_max: usize,
    /// A reading of the cut older than this is stale (uncertain), milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub safetime_gap_max_ms: u64,
    /// Serve `GET /metrics` (Prometheus text) on this loopback address.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

/// Kills this process with `SIGKILL` at the configured crash point.
struct KillSelf;

impl FaultHook for KillSelf {
    fn reached(&self, point: CrashPoint) {
        eprintln!("little-compute gateway: fault injection: SIGKILL at {point}");
        // SAFETY: raise(2) with a valid signal number has no memory-safety
        // preconditions.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// Runs the gateway until SIGINT/SIGTERM: exit 0 after a clean stop, 2 for
/// bad arguments, 1 for any other failure.
pub async fn run(args: GatewayArgs) -> ExitCode {
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(WorkerError::Usage(m)) => {
            eprintln!("little-compute gateway: {m}");
            ExitCode::from(2)
        }
        Err(WorkerError::Failed(m)) => {
            eprintln!("little-compute gateway: {m}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: GatewayArgs) -> Result<(), WorkerError> {
    let crash_at = CrashPoint::from_env().map_err(|e| WorkerError::Usage(e.to_string()))?;
    if !INTERVAL_MS_RANGE.contains(&args.interval_ms) {
        return Err(WorkerError::Usage(format!(
            "--interval-ms must be in {INTERVAL_MS_RANGE:?}, got {}",
            args.interval_ms
        )));
    }
    let ttl = i64::try_from(args.heartbeat_ttl_ms)
        .ok()
        .map(jiff::SignedDuration::from_millis)
        .and_then(|t| lc_core::owner::check_heartbeat_ttl(t).ok())
        .ok_or_else(|| {
            WorkerError::Usage(format!(
                "--heartbeat-ttl-ms must be in 1000..=600000, got {}",
                args.heartbeat_ttl_ms
            ))
        })?;
    let call_ms_max =
        args.heartbeat_ttl_ms / u64::from(lc_gateway::gateway::RENEW_EVERY_TTL_FRACTION);
    let call_ms_min = lc_gateway::PROVIDER_CALL_TIMEOUT_MIN.as_millis() as u64;
    let call_ms = args
        .provider_call_timeout_ms
        .unwrap_or(PROVIDER_CALL_TIMEOUT_MS_DEFAULT.min(call_ms_max));
    if !(call_ms_min..=call_ms_max).contains(&call_ms) {
        return Err(WorkerError::Usage(format!(
            "--provider-call-timeout-ms must be in {call_ms_min}..={call_ms_max} (at most a third of --heartbeat-ttl-ms), got {call_ms}"
        )));
    }
    let gap_ms = i64::try_from(args.safetime_gap_max_ms)
        .ok()
        .filter(|ms| (1..=3_600_000).contains(ms))
        .ok_or_else(|| WorkerError::Usage("--safetime-gap-max-ms must be in 1..=3600000".into()))?;
    if let Some(addr) = args.metrics_listen
        && !addr.ip().is_loopback()
    {
        return Err(WorkerError::Usage(format!(
            "--metrics-listen must be a loopback address, got {addr}"
        )));
    }
    let secret = read_credential(&args.secret_file, "--secret-file")?;
    if secret.len() < SECRET_BYTES_MIN {
        return Err(WorkerError::Usage(format!(
            "--secret-file: at least {SECRET_BYTES_MIN} bytes, got {}",
            secret.len()
        )));
    }
    let key = tollgate::CapabilityKey::new(&secret)
        .map_err(|e| WorkerError::Usage(format!("--secret-file: {e}")))?;
    let token = match &args.provider_token_file {
        Some(p) => Some(
            String::from_utf8(read_credential(p, "--provider-token-file")?)
                .map_err(|_| WorkerError::Usage("--provider-token-file: not UTF-8".into()))?,
        ),
        None => None,
    };
    let sink = lc_blob::LocalBlobStore::open(&args.blob_dir)
        .map_err(|e| WorkerError::Failed(format!("--blob-dir {}: {e}", args.blob_dir.display())))?;
    let shutdown = shutdown_signal()?;
    let policy = recorded_policy(&args.database_url).await?;
    let deadline = tokio::time::Instant::now() + DATABASE_WAIT_MAX;
    let config = lc_pg::LcConfig {
        max_connections: 4,
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
    // The one deadline a gateway issues: its owners' heartbeat expiry.
    let heartbeat = [safetime::DeadlineBound::new(
        safetime::inventory::OWNER_HEARTBEAT,
        ttl,
    )];
    safetime_pg::check_bounds(store.pool(), &heartbeat)
        .await
        .map_err(|e| WorkerError::Usage(format!("the sealed safe-time horizon: {e}")))?;
    let clock: Arc<dyn Clock> = Arc::new(SafeCutClock::new(
        store.pool().clone(),
        jiff::SignedDuration::from_millis(gap_ms),
    ));
    let gateway = Gateway::new(
        Arc::new(store),
        Arc::new(HttpConnector::new(token)),
        Arc::new(sink),
        clock,
        GatewayOptions {
            heartbeat_ttl: ttl,
            owned_max: args.owned_max,
            provider_call_timeout: Duration::from_millis(call_ms),
            quiesce_timeout: Duration::from_millis(args.quiesce_timeout_ms),
            ..GatewayOptions::default()
        },
    )
    .map_err(|e| WorkerError::Usage(format!("the gateway's options: {e}")))?
    .with_crash_point(crash_at, Arc::new(KillSelf));
    if let Some(p) = crash_at {
        tracing::warn!(
            point = p.as_str(),
            "fault injection armed: this gateway kills itself there"
        );
    }
    if let Some(addr) = args.metrics_listen {
        serve_metrics(addr, gateway.metrics()).await?;
    }
    let gateway = Arc::new(gateway);
    let (stop, rx) = tokio::sync::watch::channel(false);
    let interval = Duration::from_millis(args.interval_ms);
    let g = Arc::clone(&gateway);
    let mut task = tokio::spawn(async move { g.run(interval, rx).await });
    tokio::select! {
        () = shutdown => {}
        r = &mut task => {
            return r.map_err(|e| WorkerError::Failed(format!("the gateway task failed: {e}")));
        }
    }
    let _ = stop.send(true);
    if tokio::time::timeout(SHUTDOWN_MAX, &mut task).await.is_err() {
        tracing::warn!("the step in progress did not finish in time; stopping anyway");
        task.abort();
    }
    Ok(())
}

/// Binds `addr` and serves `GET /metrics` from `metrics` in the background.
async fn serve_metrics(addr: SocketAddr, metrics: Arc<GatewayMetrics>) -> Result<(), WorkerError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| WorkerError::Failed(format!("--metrics-listen {addr}: {e}")))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let m = Arc::clone(&metrics);
            async move { httpkit::middleware::metrics_response(m.render()) }
        }),
    );
    tracing::info!(%addr, "gateway metrics listening");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}
