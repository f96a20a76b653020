//! The safe-time sampler: one leader per database publishes the safe expiry
//! cut; any number of standbys wait (issue 6; seed 003, "Recovery and safe
//! time").
//!
//! * **Leadership** is the session-level advisory lock
//!   ([`LOCK_KEY_CLASS`](crate::safe_time::LOCK_KEY_CLASS),
//!   [`LOCK_KEY_OBJ`](crate::safe_time::LOCK_KEY_OBJ)) on one dedicated,
//!   pinned [`PgConnection`] (never a pool). A standby polls
//!   `pg_try_advisory_lock` every [`SamplerOptions::standby_poll`]; it never
//!   takes the lock from a session that holds it. Losing the connection
//!   releases leadership (PostgreSQL drops session locks with the session)
//!   when the sampler connects directly or through session pooling; behind
//!   a transaction-pooling proxy the server session, and its lock, can
//!   outlive the client connection (one more reason that mode is
//!   unsupported; the epoch fence keeps it safe).
//! * **Epoch**: a new leader loads the newest sealed horizon policy
//!   (digest verified) and claims the next durable epoch before publishing.
//! * **Every sample** is one statement that returns database time, topology,
//!   its backend PID and whether that backend holds exactly the lock. The
//!   leader compares the PID with the one it recorded when it won and
//!   requires the lock; on any mismatch (for example a PgBouncer in
//!   transaction or statement pooling mode routing the statement to another
//!   backend, which is unsupported) it drops the connection, destroying
//!   leadership, and must win a new epoch before publishing again.
//! * The host monotonic clock ([`std::time::Instant`]) is read just before
//!   and just after that statement; [`CutTracker`] turns the observation
//!   into a proposal and the database function caps and persists it. Any
//!   refusal (stale epoch, lost lock, quarantine refused) or connection
//!   error ends the leadership.
//!
//! Every loop is bounded: sleeps are interruptible by the shutdown signal,
//! reconnects back off exponentially up to [`SamplerOptions::reconnect_max`],
//! each observation and publish must answer within the gap bound, and the
//! server ends a leader session idle for twice the gap bound
//! (`idle_session_timeout`), so a frozen leader releases the lock to a
//! standby.

use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::watch;
use tollgate::safe_time::{CutTracker, Observation, SafeTimeConfig, UncertainReason};

use crate::safe_time::{self, Published, SafeTimeError};

/// `application_name` of the sampler's connection (visible in
/// `pg_stat_activity`).
pub const SAMPLER_APPLICATION_NAME: &str = "tollgate-safetime";

/// Default interval between a standby's lock attempts.
pub const DEFAULT_STANDBY_POLL: Duration = Duration::from_millis(500);

/// Default ceiling of the reconnect back-off.
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How long one connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sampler settings.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// The safe-time rules' tuning (interval, drift, bounds).
    pub config: SafeTimeConfig,
    /// Interval between a standby's lock attempts.
    pub standby_poll: Duration,
    /// Ceiling of the exponential reconnect back-off (starting at 100 ms).
    pub reconnect_max: Duration,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            config: SafeTimeConfig::default(),
            standby_poll: DEFAULT_STANDBY_POLL,
            reconnect_max: DEFAULT_RECONNECT_MAX,
        }
    }
}

/// What a sampler is doing, published on a [`watch`] channel for logs,
/// tests and status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SamplerStatus {
    /// The epoch this sampler leads, `None` while it is a standby or
    /// disconnected.
    pub epoch: Option<i64>,
    /// Epochs this process has won so far.
    pub epochs_won: u64,
    /// The last publish the database accepted in the current epoch.
    pub last_published: Option<Published>,
    /// Why leadership last ended (`None` if it never did).
    pub last_loss: Option<String>,
}

/// Why a leadership term ended.
#[derive(Debug)]
enum TermEnd {
    Shutdown,
    Lost(String),
}

/// A sampler for one database; see the module docs.
#[derive(Debug)]
pub struct Sampler {
    connect: PgConnectOptions,
    options: SamplerOptions,
    origin: Instant,
    status: watch::Sender<SamplerStatus>,
}

impl Sampler {
    /// A sampler for the database at `url`.
    ///
    /// # Errors
    /// [`SafeTimeError::Backend`] if `url` does not parse (the message does
    /// not repeat the URL).
    pub fn new(url: &str, options: SamplerOptions) -> Result<Sampler, SafeTimeError> {
        let connect: PgConnectOptions = url.parse().map_err(|e: sqlx::Error| {
            SafeTimeError::Backend(format!("invalid database URL: {}", redact(&e)))
        })?;
        let connect = connect.application_name(SAMPLER_APPLICATION_NAME);
        Ok(Sampler {
            connect,
            options,
            origin: Instant::now(),
            status: watch::channel(SamplerStatus::default()).0,
        })
    }

    /// A receiver of this sampler's status.
    pub fn status(&self) -> watch::Receiver<SamplerStatus> {
        self.status.subscribe()
    }

    /// The longest wait for one statement of a leadership term: the gap
    /// bound (a slower answer would be a gap anyway).
    fn call_max(&self) -> Duration {
        Duration::try_from(self.options.config.gap_max()).unwrap_or(Duration::from_secs(5))
    }

    fn mono_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Runs until `shutdown` turns `true` (or its sender goes away): connect,
    /// wait for the lock as a standby, lead until leadership is lost, and
    /// start over. Returns on shutdown; leadership ends with the
    /// connection, so a successor can take over at once.
    pub async fn run(&self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let conn =
                tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&self.connect))
                    .await;
            let mut conn = match conn {
                Ok(Ok(mut c)) => {
                    backoff = Duration::from_millis(100);
                    // A frozen leader (stopped process, dead host) must not
                    // hold the lock forever: the server ends a session idle
                    // for twice the gap bound, which releases the lock to a
                    // standby; a healthy leader is never idle longer than
                    // one interval. Set as a statement, not a startup
                    // parameter, which proxies such as PgBouncer refuse.
                    let idle_ms = self
                        .options
                        .config
                        .gap_max()
                        .as_millis()
                        .saturating_mul(2)
                        .clamp(1, i128::from(i32::MAX));
                    // Simple protocol (no prepared statement): the value
                    // is an integer computed here.
                    let sql = format!("SET idle_session_timeout = '{idle_ms}ms'");
                    // Unnamed statement: it takes no name from the
                    // prepared-statement cache, so a proxy's statement
                    // routing is not disturbed.
                    let set = sqlx::query(&sql).persistent(false).execute(&mut c).await;
                    if let Err(e) = set {
                        tracing::warn!(error = %redact(&e), "cannot set idle_session_timeout; retrying");
                        drop(c);
                        if sleep_or_shutdown(backoff, &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                    c
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %redact(&e), ?backoff, "sampler cannot connect; retrying");
                    if sleep_or_shutdown(backoff, &mut shutdown).await {
                        return;
                    }
                    backoff = (backoff * 2).min(self.options.reconnect_max);
                    continue;
                }
                Err(_) => {
                    tracing::warn!(
                        ?CONNECT_TIMEOUT,
                        "sampler connection attempt timed out; retrying"
                    );
                    continue;
                }
            };
            match self.standby(&mut conn, &mut shutdown).await {
                Ok(true) => {}
                Ok(false) => {
                    let _ = conn.close().await;
                    return;
                }
                Err(e) => {
                    tracing::warn!(code = e.code(), error = %e, "sampler standby connection failed");
                    drop(conn);
                    if sleep_or_shutdown(backoff, &mut shutdown).await {
                        return;
                    }
                    backoff = (backoff * 2).min(self.options.reconnect_max);
                    continue;
                }
            }
            let end = self.lead(&mut conn, &mut shutdown).await;
            self.status.send_modify(|s| {
                s.epoch = None;
                s.last_published = None;
                if let TermEnd::Lost(why) = &end {
                    s.last_loss = Some(why.clone());
                }
            });
            // Dropping the connection (not closing it politely, which could
            // block on a broken socket) destroys the session and its lock.
            drop(conn);
            match end {
                TermEnd::Shutdown => return,
                TermEnd::Lost(why) => {
                    tracing::error!(reason = %why, "safe-time leadership lost; connection dropped");
                    // Yield one standby poll before competing again, so a
                    // healthy waiting standby takes over first.
                    if sleep_or_shutdown(self.options.standby_poll, &mut shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits as a standby until this connection holds the lock
    /// (`Ok(true)`) or shutdown (`Ok(false)`).
    async fn standby(
        &self,
        conn: &mut PgConnection,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<bool, SafeTimeError> {
        let mut logged = false;
        loop {
            if *shutdown.borrow() {
                return Ok(false);
            }
            if safe_time::try_lock(conn).await? {
                return Ok(true);
            }
            if !logged {
                tracing::info!("another sampler leads; waiting as a standby");
                logged = true;
            }
            if sleep_or_shutdown(self.options.standby_poll, shutdown).await {
                return Ok(false);
            }
        }
    }

    /// One leadership term on a connection that holds the lock.
    async fn lead(&self, conn: &mut PgConnection, shutdown: &mut watch::Receiver<bool>) -> TermEnd {
        let pid: i32 = match sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
        {
            Ok(p) => p,
            Err(e) => return TermEnd::Lost(format!("reading the backend pid: {}", redact(&e))),
        };
        let policy = match safe_time::load_policy(&mut *conn).await {
            Ok(p) => p,
            Err(e) => return TermEnd::Lost(format!("loading the horizon policy: {e}")),
        };
        let claim = match safe_time::claim(conn, &policy).await {
            Ok(c) => c,
            Err(e) => return TermEnd::Lost(format!("claiming an epoch: {e}")),
        };
        tracing::info!(
            epoch = claim.epoch,
            backend_pid = pid,
            cut = %claim.cut,
            quarantined = claim.quarantined,
            policy_version = policy.version(),
            horizon_ms = policy.horizon_ms(),
            "safe-time leadership won"
        );
        self.status.send_modify(|s| {
            s.epoch = Some(claim.epoch);
            s.epochs_won += 1;
        });
        let mut tracker = CutTracker::new(
            self.options.config,
            claim.cut,
            claim.quarantined,
            policy.horizon(),
        );
        if let Some(reason) = claim.uncertain.filter(|r| r.is_anomaly()) {
            tracker = tracker.with_start_reason(reason);
        }
        let interval =
            Duration::try_from(self.options.config.interval()).unwrap_or(Duration::from_secs(1));
        let mut last_reason: Option<UncertainReason> = claim.uncertain;
        loop {
            if *shutdown.borrow() {
                return TermEnd::Shutdown;
            }
            let before = self.mono_ns();
            let obs = tokio::time::timeout(self.call_max(), safe_time::observe(conn)).await;
            let after = self.mono_ns();
            let obs = match obs {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => return TermEnd::Lost(format!("observation failed: {e}")),
                Err(_) => {
                    return TermEnd::Lost(format!(
                        "observation failed: no answer within {:?}",
                        self.call_max()
                    ));
                }
            };
            if obs.backend_pid != pid || !obs.lock_held {
                return TermEnd::Lost(format!(
                    "leadership check failed: backend pid {} (won as {pid}), lock held: {} \
                     (is the connection going through a transaction-pooling proxy?)",
                    obs.backend_pid, obs.lock_held
                ));
            }
            let verdict = tracker.observe(Observation {
                db_now: obs.db_now,
                topology: obs.topology,
                mono_before_ns: before,
                mono_after_ns: after,
            });
            if verdict.publishable {
                let published = tokio::time::timeout(
                    self.call_max(),
                    safe_time::publish(conn, claim.epoch, &verdict),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(SafeTimeError::Backend(format!(
                        "no answer within {:?}",
                        self.call_max()
                    )))
                });
                match published {
                    Ok(p) => {
                        tracker.accepted(p.cut);
                        if p.quarantined && !tracker.quarantined() {
                            // The database saw an anomaly this sample did
                            // not: the proof restarts with a new epoch.
                            return TermEnd::Lost(
                                "the database kept the quarantine the sampler proved cleared"
                                    .to_owned(),
                            );
                        }
                        if p.uncertain != last_reason {
                            match p.uncertain {
                                None => {
                                    tracing::info!(epoch = claim.epoch, cut = %p.cut, "safe cut is certain")
                                }
                                Some(r) => {
                                    tracing::warn!(epoch = claim.epoch, cut = %p.cut, reason = %r, "safe cut is uncertain")
                                }
                            }
                            last_reason = p.uncertain;
                        }
                        self.status.send_modify(|s| s.last_published = Some(p));
                    }
                    Err(e) => return TermEnd::Lost(format!("publish refused: {e} ({})", e.code())),
                }
            } else if last_reason != verdict.uncertain {
                tracing::warn!(reason = ?verdict.uncertain, "connected to a server in recovery; not publishing");
                last_reason = verdict.uncertain;
            }
            if sleep_or_shutdown(interval, shutdown).await {
                return TermEnd::Shutdown;
            }
        }
    }
}

/// Sleeps `d` unless shutdown comes first; `true` means shut down.
async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
        r = shutdown.changed() => r.is_err() || *shutdown.borrow(),
    }
}

/// An sqlx error's text; configuration errors (which may quote the URL)
/// are replaced by a fixed text.
fn redact(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Configuration(_) => "bad connection settings".to_owned(),
        other => other.to_string(),
    }
}
