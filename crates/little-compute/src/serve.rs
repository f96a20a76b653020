//! `little-compute serve`: the control plane's process wiring.
//!
//! Start-up, in order: the admin token file (at least 16 bytes of visible
//! ASCII; only its SHA-256 is kept) and the server secret file (at least 32
//! bytes; tenant API keys are derived from it and it is Tollgate's
//! capability key, so it must stay the same across restarts and across
//! every control plane and worker on one database); the database (already
//! migrated), waited for within [`DATABASE_WAIT_MAX`]; the safe-cut clock on
//! the store's pool (one first reading is logged: certain or why not); the
//! open-file limit checked against the connection bound; the listener
//! (loopback by default), served by [`httpkit::serve`]; the line
//! `little-compute listening on http://ADDR` on stdout for scripts.
//!
//! Shutdown on SIGTERM or SIGINT: stop accepting, give in-flight requests
//! `--shutdown-timeout-ms` to finish, then drop them.
//!
//! The process is stateless: PostgreSQL is the authority, and several
//! control planes may serve one database.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use httpkit::ConnectionLimits;
use lc_api::auth::{AdminDigest, ServerSecret, trim_credential};
use lc_api::{ServiceOptions, build};
use tokio::net::TcpListener;

/// The default listen address: loopback only; exposing the control plane
/// beyond the host is an explicit choice. Its port is the one `lc` and the
/// appliance use by default.
pub const LISTEN_DEFAULT: &str = crate::ports::DEFAULT_CONTROL_PLANE_LISTEN;

/// The `serve` argument that passes instance id `id`: one `--instance-id=ID`
/// argument, so an id that begins with `-` (a random base64url one may) is
/// read as the value, never as another flag.
pub(crate) fn instance_id_arg(id: &str) -> String {
    format!("--instance-id={id}")
}

/// The response header carrying `--instance-id`.
pub const INSTANCE_HEADER: &str = "lc-instance";

/// How long start-up waits for the database to accept connections.
pub const DATABASE_WAIT_MAX: Duration = Duration::from_secs(30);

/// The pause between two connection attempts while waiting.
pub const DATABASE_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The largest credential file read, in bytes.
pub const CREDENTIAL_FILE_BYTES_MAX: u64 = 4096;

/// `little-compute serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// PostgreSQL URL of the installation (Tollgate and Little Compute
    /// migrated).
    #[arg(long, env = "LC_DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Address to listen on.
    #[arg(long, default_value = LISTEN_DEFAULT)]
    pub listen: SocketAddr,
    /// File holding the admin token (trailing whitespace ignored).
    #[arg(long, value_name = "PATH")]
    pub admin_token_file: PathBuf,
    /// File holding the server secret tenant API keys are derived from: text
    /// such as 64 hex digits, at least 32 bytes once trailing whitespace is
    /// removed (as Tollgate reads its secret file); keep it stable.
    #[arg(long, value_name = "PATH")]
    pub secret_file: PathBuf,
    /// The runtime directory shared with the provider on this host; without
    /// it, runtime import is refused.
    #[arg(long, value_name = "DIR")]
    pub runtime_dir: Option<PathBuf>,
    /// The sink the gateways write output pages to (their `--blob-dir`):
    /// `GET /v1/execs/{id}/output` reads each page's bytes from it by
    /// SHA-256 and verifies them. Without it only pages whose bytes the
    /// database holds are served (others answer `sink_unavailable`).
    #[arg(long, value_name = "DIR")]
    pub blob_dir: Option<PathBuf>,
    /// A reading of the cut older than this is stale (uncertain),
    /// milliseconds (1..=3600000).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=DURATION_MS_MAX))]
    pub safetime_gap_max_ms: u64,
    /// Bound on receiving a request's body and, separately, on handling it,
    /// milliseconds (1..=3600000).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=DURATION_MS_MAX))]
    pub request_timeout_ms: u64,
    /// How long in-flight requests may finish after SIGTERM/SIGINT,
    /// milliseconds (0..=3600000).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=DURATION_MS_MAX))]
    pub shutdown_timeout_ms: u64,
    /// Connections served at once.
    #[arg(long, default_value_t = httpkit::server::CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,
    /// Tollgate's grant policy for Reservations: the longest grant,
    /// milliseconds. Default: the policy recorded in the database (every
    /// process on one database writes grants under the recorded policy;
    /// given, it must equal it, or is recorded when none is).
    #[arg(long, requires = "reclaim_grace_ms")]
    pub grant_max_ttl_ms: Option<i64>,
    /// Tollgate's grant policy: the reclaim grace, milliseconds (with
    /// `--grant-max-ttl-ms`).
    #[arg(long, requires = "grant_max_ttl_ms")]
    pub reclaim_grace_ms: Option<i64>,
    /// Each tenant's most exec admissions per window (`429 rate_limited`
    /// beyond it, with `Retry-After`).
    #[arg(long, default_value_t = lc_core::rate::DEFAULT.admissions_max())]
    pub admission_rate_max: u32,

    /// Sent back as the `Lc-Instance` header of every response (visible
    /// ASCII), so the process that started this one can tell its answers
    /// from another process's on the same port (the appliance passes a
    /// fresh random one at each start).
    #[arg(long, value_name = "TEXT")]
    pub instance_id: Option<String>,

    /// The admission-rate window, in milliseconds on the cut (at most one
    /// day).
    #[arg(long, default_value_t = 60_000)]
    pub admission_rate_window_ms: u64,

    /// The longest TTL a scoped token may be minted with, in milliseconds
    /// on the cut (default 30 days, at most 365 days; a mint's deadline
    /// must also fit the sealed horizon).
    #[arg(long, default_value_t = TOKEN_TTL_MAX_MS_DEFAULT)]
    pub token_ttl_max_ms: u64,
    /// Workers' claim TTL, milliseconds (1000..=600000): the store's
    /// setting, the same on every process of one database; `GET
    /// /v1/claims` judges claims with it and the grace.
    #[arg(long, default_value_t = claim_ms(lc_core::claim::CLAIM_TTL_DEFAULT))]
    pub claim_ttl_ms: u64,
    /// How long past its expiry a worker's claim stays its holder's before
    /// another worker may take it on a certain cut, milliseconds
    /// (0..=600000).
    #[arg(long, default_value_t = claim_ms(lc_core::claim::CLAIM_GRACE_DEFAULT))]
    pub claim_grace_ms: u64,

    /// The grace between deleting an exec's workspace or output and its
    /// purge, seconds on the cut (1..=31536000, 365 days; default 7 days):
    /// until then `lc workspace undelete` / `lc exec output --undelete`
    /// restores it.
    #[arg(long, default_value_t = lc_core::deletion::DELETION_GRACE_DEFAULT.as_secs())]
    pub deletion_grace_s: i64,

    /// How long a terminal exec's records are retained after its terminal
    /// cut, seconds (1..=315360000, 3,650 days; default 30 days); give the
    /// workers the same value.
    #[arg(long, default_value_t = lc_core::deletion::RETENTION_DEFAULT.as_secs())]
    pub retention_s: i64,

    /// The validity of an approval whose approver names none, in
    /// milliseconds on the cut (1 to 3600000; default 15 min).
    #[arg(long, default_value_t = 900_000)]
    pub approval_validity_ms: u64,
}

/// `d` in whole milliseconds, for a flag's default (the claim consts are
/// whole seconds, at most ten minutes).
pub(crate) const fn claim_ms(d: jiff::SignedDuration) -> u64 {
    d.as_millis() as u64
}

/// The claim TTL and grace of `--claim-ttl-ms` and `--claim-grace-ms`.
///
/// # Errors
/// A message naming the flag and its bounds.
pub(crate) fn claim_settings(
    ttl_ms: u64,
    grace_ms: u64,
) -> Result<(jiff::SignedDuration, jiff::SignedDuration), String> {
    let ms = |v: u64| i64::try_from(v).ok().map(jiff::SignedDuration::from_millis);
    let ttl = ms(ttl_ms)
        .and_then(|d| lc_core::claim::check_claim_ttl(d).ok())
        .ok_or_else(|| {
            format!(
                "--claim-ttl-ms must be in {}..={}, got {ttl_ms}",
                claim_ms(lc_core::claim::CLAIM_TTL_MIN),
                claim_ms(lc_core::claim::CLAIM_TTL_MAX)
            )
        })?;
    let grace = ms(grace_ms)
        .and_then(|d| lc_core::claim::check_claim_grace(d).ok())
        .ok_or_else(|| {
            format!(
                "--claim-grace-ms must be in 0..={}, got {grace_ms}",
                claim_ms(lc_core::claim::CLAIM_GRACE_MAX)
            )
        })?;
    Ok((ttl, grace))
}

/// The default `--token-ttl-max-ms`:
/// [`lc_core::token::TOKEN_TTL_MAX_DEFAULT`] in milliseconds.
pub const TOKEN_TTL_MAX_MS_DEFAULT: u64 = 30 * 24 * 3_600_000;

/// The largest `--safetime-gap-max-ms`, `--request-timeout-ms` and
/// `--shutdown-timeout-ms`: an hour (the worker's bound on its gap too). A
/// gap, a request or a shutdown that long is already a broken
/// installation, and the bound keeps every deadline computed from them
/// representable.
pub const DURATION_MS_MAX: u64 = 3_600_000;

/// How long reading the recorded grant policy may take.
pub const POLICY_READ_MAX: Duration = Duration::from_secs(10);

/// The grant policy of `args`: the flags' when given, else the one recorded
/// in the database at `url`.
///
/// # Errors
/// [`ServeError::Config`] for an unusable policy or none recorded,
/// [`ServeError::Database`] when the database cannot be read.
pub async fn grant_policy(args: &ServeArgs) -> Result<tollgate::GrantPolicy, ServeError> {
    if let (Some(ttl), Some(grace)) = (args.grant_max_ttl_ms, args.reclaim_grace_ms) {
        return tollgate::GrantPolicy::new(
            jiff::SignedDuration::from_millis(ttl),
            jiff::SignedDuration::from_millis(grace),
        )
        .map_err(|e| ServeError::Config(format!("grant policy: {e}")));
    }
    let url = pgkit::DatabaseUrl::parse(&args.database_url)
        .map_err(|e| ServeError::Config(format!("--database-url: {e}")))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(POLICY_READ_MAX)
        .connect_with(url.into_connect_options())
        .await
        .map_err(|e| ServeError::Database(pgkit::classify(&e).text().to_string()))?;
    let recorded = tokio::time::timeout(POLICY_READ_MAX, tollgate_pg::recorded_policy(&pool)).await;
    pool.close().await;
    match recorded {
        Ok(Ok(Some(policy))) => Ok(policy),
        Ok(Ok(None)) => Err(ServeError::Config(
            "the database records no grant policy: record one (the appliance does at its first start) \
             or pass --grant-max-ttl-ms and --reclaim-grace-ms"
                .into(),
        )),
        Ok(Err(e)) => Err(ServeError::Database(format!("reading the grant policy: {e}"))),
        Err(_) => Err(ServeError::Database(format!(
            "reading the grant policy took longer than {POLICY_READ_MAX:?}"
        ))),
    }
}

/// The store's pooled connections (its descriptors count against the
/// open-file limit next to the HTTP connections).
pub const POOL_CONNECTIONS_MAX: u32 = 10;

/// The store of `args`: Tollgate's with the grant policy of `args`
/// ([`grant_policy`]) and the server secret as its capability key, on the
/// cut; waits for the database within `wait_max` (while it is
/// unavailable), any other refusal at once.
///
/// # Errors
/// [`ServeError::Config`] for an unusable policy or key,
/// [`ServeError::Database`] otherwise.
pub async fn connect_store(
    args: &ServeArgs,
    secret: &[u8],
    wait_max: Duration,
) -> Result<lc_pg::LcStore, ServeError> {
    let deadline = tokio::time::Instant::now() + wait_max;
    let policy = crate::retry::until(
        deadline,
        DATABASE_RETRY_PAUSE,
        "the database",
        |e| matches!(e, ServeError::Database(_)),
        || grant_policy(args),
    )
    .await?;
    let key = tollgate::CapabilityKey::new(secret)
        .map_err(|e| ServeError::Config(format!("secret file: {e}")))?;
    let window_ms = i64::try_from(args.admission_rate_window_ms)
        .map_err(|_| ServeError::Config("--admission-rate-window-ms is too large".into()))?;
    let admission_rate = lc_core::rate::AdmissionRate::new(
        args.admission_rate_max,
        jiff::SignedDuration::from_millis(window_ms),
    )
    .map_err(|e| {
        ServeError::Config(format!(
            "--admission-rate-max/--admission-rate-window-ms: {e}"
        ))
    })?;
    let token_ttl_max = i64::try_from(args.token_ttl_max_ms)
        .ok()
        .map(jiff::SignedDuration::from_millis)
        .ok_or_else(|| ServeError::Config("--token-ttl-max-ms is too large".into()))
        .and_then(|t| {
            lc_core::token::check_ttl_max(t)
                .map_err(|e| ServeError::Config(format!("--token-ttl-max-ms: {e}")))
        })?;
    let (claim_ttl, claim_grace) =
        claim_settings(args.claim_ttl_ms, args.claim_grace_ms).map_err(ServeError::Config)?;
    let deletion_grace =
        lc_core::deletion::check_grace(jiff::SignedDuration::from_secs(args.deletion_grace_s))
            .map_err(|e| ServeError::Config(format!("--deletion-grace-s: {e}")))?;
    let retention =
        lc_core::deletion::check_retention(jiff::SignedDuration::from_secs(args.retention_s))
            .map_err(|e| ServeError::Config(format!("--retention-s: {e}")))?;
    let approval_validity = lc_core::approval::check_validity(
        Some(args.approval_validity_ms),
        lc_core::approval::APPROVAL_VALIDITY_DEFAULT,
    )
    .map_err(|e| ServeError::Config(format!("--approval-validity-ms: {e}")))?;
    let config = lc_pg::LcConfig {
        max_connections: POOL_CONNECTIONS_MAX,
        admission_rate,
        claim_ttl,
        claim_grace,
        token_ttl_max,
        deletion_grace,
        retention,
        approval_validity,
        ..lc_pg::LcConfig::default()
    };
    crate::retry::until(
        deadline,
        DATABASE_RETRY_PAUSE,
        "the database",
        |e| matches!(e, lc_core::LcError::StorageUnavailable { .. }),
        || lc_pg::LcStore::connect(&args.database_url, policy, key.clone(), config),
    )
    .await
    .map_err(|e| ServeError::Database(e.to_string()))
}

/// Why the control plane could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting or credential file is unusable.
    #[error("{0}")]
    Config(String),
    /// The database could not be reached or refused.
    #[error("database: {0}")]
    Database(String),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(String),
}

/// Reads a credential file: at most [`CREDENTIAL_FILE_BYTES_MAX`] bytes,
/// trailing whitespace removed.
fn read_credential(path: &Path, what: &str) -> Result<Vec<u8>, ServeError> {
    let fail = |e: String| ServeError::Config(format!("{what} {}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if meta.len() > CREDENTIAL_FILE_BYTES_MAX {
        return Err(fail(format!(
            "larger than {CREDENTIAL_FILE_BYTES_MAX} bytes"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    Ok(trim_credential(&bytes).to_vec())
}

/// The admin token's digest, the server secret and its bytes (also the
/// capability key of Tollgate's store, so the worker, reading the same
/// file, renews and releases the grants the API made).
///
/// # Errors
/// [`ServeError::Config`] for an unreadable or too short file.
pub fn credentials(args: &ServeArgs) -> Result<(AdminDigest, ServerSecret, Vec<u8>), ServeError> {
    let token = read_credential(&args.admin_token_file, "admin token file")?;
    let token = String::from_utf8(token)
        .map_err(|_| ServeError::Config("admin token file: not UTF-8".into()))?;
    let admin = AdminDigest::of_token(&token)
        .map_err(|e| ServeError::Config(format!("admin token file: {e}")))?;
    let bytes = read_credential(&args.secret_file, "secret file")?;
    let secret =
        ServerSecret::new(&bytes).map_err(|e| ServeError::Config(format!("secret file: {e}")))?;
    Ok((admin, secret, bytes))
}

/// Resolves on the first SIGTERM or SIGINT; listening starts at once.
fn listen_for_shutdown() -> Result<impl Future<Output = ()> + Send + 'static, ServeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let listen = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| ServeError::Io(format!("cannot listen for {name}: {e}")))
    };
    let mut term = listen(SignalKind::terminate(), "SIGTERM")?;
    let mut int = listen(SignalKind::interrupt(), "SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => tracing::info!("SIGINT received: shutting down"),
            _ = term.recv() => tracing::info!("SIGTERM received: shutting down"),
        }
    })
}

/// Runs the control plane until SIGTERM/SIGINT.
///
/// # Errors
/// Start-up failures (settings, credentials, the database, the listener);
/// a server that stops on its own.
pub async fn run(args: ServeArgs) -> Result<(), ServeError> {
    let (admin, secret, secret_bytes) = credentials(&args)?;
    let gap_max = jiff::SignedDuration::from_millis(
        i64::try_from(args.safetime_gap_max_ms)
            .map_err(|_| ServeError::Config("--safetime-gap-max-ms is too large".into()))?,
    );
    if args.safetime_gap_max_ms == 0 {
        return Err(ServeError::Config(
            "--safetime-gap-max-ms must be positive".into(),
        ));
    }
    let store = Arc::new(connect_store(&args, &secret_bytes, DATABASE_WAIT_MAX).await?);
    // Every deadline this control plane can admit must fit the sealed
    // horizon; refuse to serve rather than admit one that cannot.
    store
        .check_horizon(&safetime::DeadlineInventory::KINDS)
        .await
        .map_err(|e| ServeError::Config(format!("the sealed safe-time horizon: {e}")))?;
    let clock: Arc<dyn Clock> = Arc::new(SafeCutClock::new(store.pool().clone(), gap_max));
    match clock.read().await {
        Ok(r) => tracing::info!(cut = %r.now, certain = r.is_certain(), "safe time: first reading"),
        Err(e) => tracing::warn!(error = %e, "safe time: first reading of the cut failed"),
    }
    let fit = httpkit::server::fit_descriptor_limit(
        args.connections_max,
        usize::try_from(POOL_CONNECTIONS_MAX).unwrap_or(usize::MAX),
    )
    .map_err(|e| ServeError::Config(e.to_string()))?;
    if let Some(from) = fit.raised_from {
        tracing::info!(
            from,
            needed = fit.needed,
            "raised the soft limit on open files"
        );
    }
    let limits = ConnectionLimits {
        connections_max: args.connections_max,
        header_read_timeout: httpkit::server::HEADER_READ_TIMEOUT_DEFAULT,
        idle_timeout: httpkit::server::IDLE_TIMEOUT_DEFAULT,
    };
    let sink: Option<Arc<dyn lc_blob::BlobStore>> = match &args.blob_dir {
        Some(dir) => Some(Arc::new(lc_blob::LocalBlobStore::open(dir).map_err(
            |e| ServeError::Config(format!("--blob-dir {}: {e}", dir.display())),
        )?)),
        None => None,
    };
    let (router, state) = build(
        store,
        clock,
        admin,
        secret,
        ServiceOptions {
            runtime_dir: args.runtime_dir.clone(),
            request_timeout: Duration::from_millis(args.request_timeout_ms),
            sink,
        },
    );
    let router = match &args.instance_id {
        None => router,
        Some(id) => {
            let value = axum::http::HeaderValue::from_str(id)
                .ok()
                .filter(|_| !id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| ServeError::Config("--instance-id must be visible ASCII".into()))?;
            router.layer(axum::middleware::map_response(
                move |mut r: axum::response::Response| {
                    let value = value.clone();
                    async move {
                        r.headers_mut().insert(INSTANCE_HEADER, value);
                        r
                    }
                },
            ))
        }
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| ServeError::Io(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Io(e.to_string()))?;
    let shutdown = listen_for_shutdown()?;
    tracing::info!(%addr, "little-compute listening");
    {
        use std::io::Write as _;
        // For scripts that wait for the line; the log says the same, so a
        // closed stdout is not an error.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "little-compute listening on http://{addr}");
        let _ = out.flush();
    }
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut server = tokio::spawn(httpkit::serve(
        listener,
        router,
        state,
        limits,
        async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
        },
    ));
    tokio::select! {
        () = shutdown => {}
        r = &mut server => {
            return match r {
                Ok(()) => Ok(()),
                Err(e) => Err(ServeError::Io(format!("server task failed: {e}"))),
            };
        }
    }
    let _ = stop_tx.send(true);
    let bound = Duration::from_millis(args.shutdown_timeout_ms);
    match tokio::time::timeout(bound, &mut server).await {
        Ok(_) => tracing::info!("in-flight requests finished"),
        Err(_) => {
            tracing::warn!(
                ?bound,
                "in-flight requests did not finish in time; dropping them"
            );
            server.abort();
        }
    }
    tracing::info!("little-compute stopped");
    Ok(())
}

/// [`run`] as a subcommand's exit status: 0 after a clean shutdown; 1
/// after printing the error on stderr (`little-compute serve: ...`).
pub async fn command(args: ServeArgs) -> std::process::ExitCode {
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "little-compute serve: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args_with(dir: &Path, token: &[u8], secret: &[u8]) -> ServeArgs {
        std::fs::write(dir.join("admin.token"), token).unwrap();
        std::fs::write(dir.join("secret"), secret).unwrap();
        Cli::try_parse_from([
            "serve",
            "--database-url",
            "postgres://u@127.0.0.1:1/db",
            "--admin-token-file",
            dir.join("admin.token").to_str().unwrap(),
            "--secret-file",
            dir.join("secret").to_str().unwrap(),
        ])
        .expect("arguments")
        .serve
    }

    #[test]
    fn claim_flags_default_to_the_core_s_consts_and_are_bounded() {
        let dir = std::env::temp_dir().join(format!("lc-serve-claims-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = args_with(&dir, b"t", &[7; 32]);
        assert_eq!((a.claim_ttl_ms, a.claim_grace_ms), (10_000, 2_000));
        assert_eq!(
            claim_settings(1_000, 0),
            Ok((
                jiff::SignedDuration::from_secs(1),
                jiff::SignedDuration::ZERO
            ))
        );
        assert_eq!(
            claim_settings(600_000, 600_000),
            Ok((
                jiff::SignedDuration::from_mins(10),
                jiff::SignedDuration::from_mins(10)
            ))
        );
        assert_eq!(
            claim_settings(999, 0),
            Err("--claim-ttl-ms must be in 1000..=600000, got 999".to_owned())
        );
        assert_eq!(
            claim_settings(1_000, 600_001),
            Err("--claim-grace-ms must be in 0..=600000, got 600001".to_owned())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_instance_id_beginning_with_a_dash_is_read_as_the_value() {
        let base = [
            "serve",
            "--database-url",
            "postgres://u@127.0.0.1:1/db",
            "--admin-token-file",
            "/a",
            "--secret-file",
            "/s",
        ];
        // Two arguments: clap takes "-LdX" for a flag and refuses it.
        let split = Cli::try_parse_from(base.iter().copied().chain(["--instance-id", "-LdX"]));
        assert_eq!(
            split.unwrap_err().kind(),
            clap::error::ErrorKind::UnknownArgument
        );
        let arg = instance_id_arg("-LdX");
        assert_eq!(arg, "--instance-id=-LdX");
        let one = Cli::try_parse_from(base.iter().copied().chain([arg.as_str()])).expect("parses");
        assert_eq!(one.serve.instance_id.as_deref(), Some("-LdX"));
    }

    #[test]
    fn defaults_and_credentials() {
        let dir = std::env::temp_dir().join(format!("lc-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hex64 = b"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
        let a = args_with(&dir, b"lcadm-0123456789abcdef\n", hex64);
        assert_eq!(a.listen.to_string(), LISTEN_DEFAULT);
        assert_eq!(
            (a.safetime_gap_max_ms, a.request_timeout_ms, a.runtime_dir),
            (5_000, 30_000, None)
        );
        let (admin, secret, bytes) =
            credentials(&args_with(&dir, b"lcadm-0123456789abcdef\n", hex64)).expect("credentials");
        assert!(admin.matches("lcadm-0123456789abcdef"));
        // The trailing newline is not part of the secret.
        assert_eq!(bytes, hex64[..64]);
        assert_eq!(
            secret.tenant_api_key(lc_core::TenantId(1)),
            ServerSecret::new(&hex64[..64])
                .unwrap()
                .tenant_api_key(lc_core::TenantId(1))
        );
        for (token, secret, message) in [
            (
                b"short\n".as_slice(),
                hex64.as_slice(),
                "admin token file: the admin token must be at least 16 bytes of visible ASCII, got 5 bytes",
            ),
            (
                b"lcadm-0123456789abcdef",
                b"0123456789abcdef0123456789abcde \n".as_slice(),
                "secret file: the server secret must be at least 32 bytes, got 31",
            ),
        ] {
            let err = credentials(&args_with(&dir, token, secret)).unwrap_err();
            assert_eq!(err.to_string(), message);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The whole process wiring on a fresh migrated database with a sampler:
    /// it listens, answers `/readyz` once the cut is certain, serves the
    /// API with the admin token from its file, and stops on SIGTERM.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_until_sigterm() {
        let db = tollgate_pg_harness::shared().await.fresh_database().await;
        lc_pg::migrate(db.url()).await.expect("migrate");
        let options = safetime_pg::sampler::SamplerOptions {
            config: safetime::SafeTimeConfig::new(
                50,
                jiff::SignedDuration::from_millis(50),
                jiff::SignedDuration::from_secs(2),
                jiff::SignedDuration::from_millis(500),
                3,
                jiff::SignedDuration::from_millis(200),
            )
            .expect("sampler config"),
            standby_poll: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(500),
        };
        let sampler = safetime_pg::sampler::Sampler::new(db.url(), options).expect("sampler");
        let (stop, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move { sampler.run(rx).await });
        let dir = std::env::temp_dir().join(format!("lc-serve-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hex64 = b"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
        let mut args = args_with(&dir, b"lcadm-0123456789abcdef\n", hex64);
        args.database_url = db.url().to_string();
        args.safetime_gap_max_ms = 2_000;
        // Nothing recorded and no flags: refused, naming what to do.
        let refused = grant_policy(&args).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .starts_with("the database records no grant policy"),
            "{refused}"
        );
        // Recorded (as the appliance does), it is the default.
        let recorded = tollgate::GrantPolicy::new(
            jiff::SignedDuration::from_mins(15),
            jiff::SignedDuration::from_hours(1),
        )
        .unwrap();
        let pool = sqlx::PgPool::connect(db.url()).await.expect("pool");
        tollgate_pg::set_policy(&pool, recorded, "test")
            .await
            .expect("record the policy");
        pool.close().await;
        assert_eq!(grant_policy(&args).await.expect("policy"), recorded);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        args.listen = SocketAddr::from(([127, 0, 0, 1], port));
        args.instance_id = Some("start-7f3a".into());
        let server = tokio::spawn(run(args));
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let mut ready = None;
        for _ in 0..400 {
            if let Ok(r) = http.get(format!("{base}/readyz")).send().await
                && r.status() == 200
            {
                // Every answer names the instance it came from.
                assert_eq!(
                    r.headers()
                        .get(INSTANCE_HEADER)
                        .and_then(|v| v.to_str().ok()),
                    Some("start-7f3a")
                );
                ready = Some(r.json::<serde_json::Value>().await.expect("json"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ready = ready.expect("ready within 20 s");
        assert_eq!(
            (ready["ready"].clone(), ready["database_reachable"].clone()),
            (serde_json::json!(true), serde_json::json!(true))
        );
        let created = http
            .post(format!("{base}/v1/tenants"))
            .bearer_auth("lcadm-0123456789abcdef")
            .header("Idempotency-Key", "t-1")
            .json(&serde_json::json!({"name": "blue", "units": 1}))
            .send()
            .await
            .expect("create");
        assert_eq!(created.status(), 201);
        let body: serde_json::Value = created.json().await.expect("json");
        let want = ServerSecret::new(&hex64[..64])
            .unwrap()
            .tenant_api_key(lc_core::TenantId(body["tenant_id"].as_i64().unwrap()));
        assert_eq!(body["api_key"], serde_json::json!(want));
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        let ended = tokio::time::timeout(Duration::from_secs(20), server)
            .await
            .expect("run returns after SIGTERM")
            .expect("join");
        assert!(ended.is_ok(), "{ended:?}");
        let _ = stop.send(true);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
