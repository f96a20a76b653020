//! `tollgate serve`: the only place that wires I/O together.
//!
//! Start-up, in order: the validated [`Config`]; the open-file limit
//! checked against the connection bound ([`connection_limits`]); the admin
//! token (PostgreSQL requires a configured `--admin-token`; the memory
//! store without one generates one); the listener, bound before anything
//! else starts, so a busy port fails at once; the store (PostgreSQL when
//! a database URL is configured, which requires a stable `--secret-file`;
//! otherwise a fresh memory store with a random capability key); the clock (`safe-cut`: after the store, on its
//! pool, once the horizon check in [`crate::pg::connect`] passed; one first
//! reading is logged); a generated admin token printed once on stdout (only
//! now: a service that cannot start never shows one); the listener served
//! by [`httpkit::serve`] under the connection bounds (`connections_max`,
//! `header_read_timeout`, `idle_timeout`); the reclaim worker.
//!
//! Shutdown on SIGTERM or SIGINT: stop accepting, give in-flight requests
//! `shutdown_timeout` to finish (then drop them), and stop the worker after
//! its current pass (bounded by the same timeout).

use std::sync::Arc;

use httpkit::ConnectionLimits;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate::{CapabilityKey, StorageError};

use crate::config::{self, Config, ConfigError};
use crate::pg::{self, PgError};
use clock::safe_cut::SafeCutClock;
use clock::{Clock, ClockKind, SystemClock, TestClock};
use tollgate_api::api::{self, AppState, ServiceOptions};
use tollgate_api::auth;
use tollgate_api::metrics::Metrics;
use tollgate_api::storage::ServiceStore;

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The PostgreSQL store.
    #[error(transparent)]
    Pg(#[from] PgError),
    /// The store refused.
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// Binding or serving failed.
    #[error("{0}")]
    Io(String),
}

/// The capability key `cfg` names: the `--secret-file`'s, or (memory
/// store only) a fresh random one.
///
/// # Errors
/// Configuration errors: PostgreSQL without `--secret-file`, an unreadable
/// or short key file.
pub fn capability_key(cfg: &Config) -> Result<CapabilityKey, ServeError> {
    match &cfg.secret_file {
        Some(path) => {
            let key = config::read_secret_file(path)?;
            config::warn_if_secret_in_work_tree(path);
            Ok(key)
        }
        None if cfg.is_postgres() => Err(ConfigError(
            "the PostgreSQL store needs a stable capability key: set --secret-file (at least 32 bytes)"
                .into(),
        )
        .into()),
        None => Ok(CapabilityKey::generate().map_err(|e| ConfigError(e.to_string()))?),
    }
}

/// The store named by `cfg`, with the capability key `key`
/// ([`capability_key`]).
///
/// # Errors
/// Store errors.
pub async fn build_store(cfg: &Config, key: CapabilityKey) -> Result<ServiceStore, ServeError> {
    if cfg.is_postgres() {
        return Ok(pg::connect(cfg, key).await?);
    }
    Ok(ServiceStore::memory(cfg.policy, key)?)
}

/// The clock named by `cfg.clock` over `backend`; a test clock starts at
/// the current system time; the safe-cut clock reads the cut on the
/// backend's PostgreSQL pool with `cfg.safetime_gap_max`.
///
/// # Errors
/// The safe-cut clock over a store without a PostgreSQL pool.
pub fn build_clock(cfg: &Config, backend: &ServiceStore) -> Result<Arc<dyn Clock>, ServeError> {
    Ok(match cfg.clock {
        ClockKind::System => Arc::new(SystemClock),
        ClockKind::Test => Arc::new(TestClock::new(jiff::Timestamp::now())),
        ClockKind::SafeCut => {
            let pool = backend.ops.pg_pool().ok_or_else(|| {
                ConfigError("clock safe-cut needs the PostgreSQL store (--database-url)".into())
            })?;
            Arc::new(SafeCutClock::new(pool.clone(), cfg.safetime_gap_max))
        }
    })
}

/// The admin token of a starting service: configured, or (memory store
/// only) generated, to be shown once the service listens
/// ([`AdminToken::show`]).
#[derive(Clone)]
pub struct AdminToken {
    token: String,
    generated: bool,
}

impl AdminToken {
    /// The token.
    pub fn expose(&self) -> &str {
        &self.token
    }

    /// Prints a generated token once on stdout (never logged); a
    /// configured one is not printed. Called once the listener is bound,
    /// so a service that cannot start never shows a token.
    ///
    /// # Errors
    /// [`ServeError::Config`] when stdout cannot take it (a closed pipe, a
    /// full disk): a token nobody can see is useless.
    pub fn show(&self) -> Result<(), ServeError> {
        if !self.generated {
            return Ok(());
        }
        crate::output::line(format_args!(
            "admin token (generated, shown only now): {}",
            self.token
        ))
        .map_err(|e| cannot_show(&e))
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("generated", &self.generated)
            .finish_non_exhaustive()
    }
}

fn cannot_show(e: &dyn std::fmt::Display) -> ServeError {
    ConfigError(format!(
        "cannot show the generated admin token on standard output ({e}); \
         configure one with --admin-token (or TOLLGATE_ADMIN_TOKEN)"
    ))
    .into()
}

/// The admin token: configured, or (memory store only) generated; a
/// generated one is shown later by [`AdminToken::show`].
///
/// # Errors
/// PostgreSQL without a configured token; a generated token whose
/// standard output goes to `/dev/null` (or was closed at start, which the
/// runtime turns into `/dev/null`), checked before anything starts.
pub fn admin_token(cfg: &Config) -> Result<AdminToken, ServeError> {
    if let Some(t) = &cfg.admin_token {
        return Ok(AdminToken {
            token: t.clone(),
            generated: false,
        });
    }
    if cfg.is_postgres() {
        return Err(ConfigError(
            "the PostgreSQL store needs a configured --admin-token (or TOLLGATE_ADMIN_TOKEN)"
                .into(),
        )
        .into());
    }
    if crate::output::discarded() {
        return Err(cannot_show(&"it goes to /dev/null or was closed"));
    }
    let token = auth::random_token(auth::ADMIN_TOKEN_PREFIX)
        .map_err(|e| ConfigError(format!("random source: {e}")))?;
    Ok(AdminToken {
        token,
        generated: true,
    })
}

/// Starts listening for SIGTERM and SIGINT at once (not on first poll, as
/// an `async fn` would) and resolves on the first received. `serve` calls
/// it before announcing that it listens, so a supervisor's SIGTERM sent
/// right after that line still shuts it down gracefully instead of killing
/// it with the default action.
///
/// # Errors
/// [`ServeError::Io`] when a handler cannot be installed (the signal would
/// then keep its default action and end the process at once).
pub fn listen_for_shutdown()
-> Result<impl std::future::Future<Output = ()> + Send + 'static, ServeError> {
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

/// The service's state: the admin token `token`, the store, the clock (announced: the test clock with a
/// warning, the safe-cut clock with a first reading, so that its certainty
/// is logged and `/metrics` has the safe-time gauges from the start) and
/// fresh metrics.
///
/// # Errors
/// As [`build_store`] and [`build_clock`].
async fn app_state(
    cfg: &Config,
    token: &AdminToken,
    key: CapabilityKey,
) -> Result<AppState, ServeError> {
    let backend = build_store(cfg, key).await?;
    let clock = build_clock(cfg, &backend)?;
    match cfg.clock {
        ClockKind::Test => {
            tracing::warn!("test clock enabled: time is whatever PUT /v1/admin/test-clock says")
        }
        ClockKind::SafeCut => {
            if let Err(e) = clock.read().await {
                tracing::warn!(error = %e, "safe time: first reading of the cut failed");
            }
        }
        ClockKind::System => {}
    }
    Ok(AppState::new(
        backend,
        clock,
        Arc::new(Metrics::new()),
        ServiceOptions {
            admin_token: token.expose().to_string(),
            reclaim_batch: cfg.reclaim_batch,
            request_timeout: Config::std(cfg.request_timeout),
        },
    ))
}

/// The connection bounds of `cfg`, once the open-file limit was made to
/// fit `connections_max` with the store's pool
/// ([`httpkit::server::fit_descriptor_limit`]: the soft limit is raised
/// when the hard one allows, which is logged).
///
/// # Errors
/// [`ServeError::Config`] when even the hard limit is too low (naming the
/// largest `connections_max` that fits) or the soft limit cannot be
/// raised.
pub fn connection_limits(cfg: &Config) -> Result<ConnectionLimits, ServeError> {
    // The store's pool is the service's only other lasting descriptors;
    // the safe-cut clock reads on the same pool.
    let pool = if cfg.is_postgres() {
        usize::try_from(tollgate_pg::StoreOptions::default().max_connections).unwrap_or(usize::MAX)
    } else {
        0
    };
    let fit = httpkit::server::fit_descriptor_limit(cfg.connections_max, pool)
        .map_err(|e| ConfigError(e.to_string()))?;
    if let Some(from) = fit.raised_from {
        tracing::info!(
            from,
            to = ?fit.soft_limit,
            needed = fit.needed,
            connections_max = cfg.connections_max,
            "raised the soft limit on open files to fit the connection bound"
        );
    }
    Ok(ConnectionLimits {
        connections_max: cfg.connections_max,
        header_read_timeout: Config::std(cfg.header_read_timeout),
        idle_timeout: Config::std(cfg.idle_timeout),
    })
}

/// Runs the service until SIGTERM/SIGINT.
///
/// # Errors
/// Start-up failures; a server that stops on its own.
pub async fn serve(cfg: Config) -> Result<(), ServeError> {
    let limits = connection_limits(&cfg)?;
    // The token and the key first (a configuration error is refused, exit
    // 2, before the port or the database is touched), the listener next (a
    // busy port fails at once, before the database is waited for), and a
    // generated token is shown only once both the listener and the store
    // are up.
    let token = admin_token(&cfg)?;
    let key = capability_key(&cfg)?;
    let listener = TcpListener::bind(cfg.listen).await.map_err(|e| {
        ServeError::Io(format!(
            "cannot listen on {}: {e}; stop what holds the port or give another --listen \
             (or TOLLGATE_LISTEN)",
            cfg.listen
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Io(e.to_string()))?;
    let state = app_state(&cfg, &token, key).await?;
    let shutdown = listen_for_shutdown()?;
    token.show()?;
    tracing::info!(%addr, store = state.store().ops.kind(), clock = %cfg.clock, "tollgate listening");
    // For scripts that wait for the line; the log above says the same, so
    // a closed stdout (`tollgate serve | head -1`) is not an error.
    let _ = crate::output::line(format_args!("tollgate listening on http://{addr}"));

    let (stop_tx, stop_rx) = watch::channel(false);
    let worker = cfg.reclaim_worker.then(|| {
        let w = state.worker().clone();
        let interval = Config::std(cfg.reclaim_interval);
        let rx = stop_rx.clone();
        tokio::spawn(async move { w.run(interval, rx).await })
    });

    let app = api::router(state.clone());
    let mut server_rx = stop_rx.clone();
    let server = httpkit::serve(listener, app, state, limits, async move {
        let _ = server_rx.wait_for(|stop| *stop).await;
    });
    let mut server_task = tokio::spawn(server);

    tokio::select! {
        _ = shutdown => {}
        r = &mut server_task => {
            let _ = stop_tx.send(true);
            return match r {
                Ok(()) => Ok(()),
                Err(e) => Err(ServeError::Io(format!("server task failed: {e}"))),
            };
        }
    }
    let _ = stop_tx.send(true);
    drain(server_task, worker, Config::std(cfg.shutdown_timeout)).await;
    tracing::info!("tollgate stopped");
    Ok(())
}

/// After the stop was sent: gives in-flight requests, then the worker's
/// current pass, `bound` each to finish, and drops what is left (aborting
/// the server closes every connection it still holds).
async fn drain(
    mut server: JoinHandle<()>,
    worker: Option<JoinHandle<()>>,
    bound: std::time::Duration,
) {
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
    if let Some(mut w) = worker
        && tokio::time::timeout(bound, &mut w).await.is_err()
    {
        tracing::warn!("reclaim worker did not stop in time; aborting it");
        w.abort();
    }
}
