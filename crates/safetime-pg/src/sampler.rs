//! The safe-time sampler: one leader per database publishes the safe expiry
//! cut; any number of standbys wait to take over.
//!
//! * **Leadership** is the session-level advisory lock
//!   ([`LOCK_KEY_CLASS`](crate::cut::LOCK_KEY_CLASS),
//!   [`LOCK_KEY_OBJ`](crate::cut::LOCK_KEY_OBJ)) on one dedicated,
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
//! * **The carried cut** ([`safetime::carry`]): a standby (and a sampler
//!   waiting out the back-off of a term that never won, such as one on a
//!   server in recovery until its promotion) reads the published cut every
//!   interval ([`cut::read_sighting`]: read-only, no
//!   lock, on a connection of its own named
//!   [`STANDBY_READER_APPLICATION_NAME`], each read bounded by the gap
//!   bound, a failure logged and retried at the next interval, never in
//!   the way of the lock attempts), and a leader keeps each publish the
//!   database accepted. Whichever this process wins next (a takeover, or
//!   its own next term after a PostgreSQL restart or a lost lock), its
//!   first observation may advance the cut by the monotonic time since
//!   that reading, less the drift allowance: the new epoch still starts
//!   uncertain, and a clock step in between is still reported as one.
//!   Only an outage of every sampler process adds lag.
//! * **A term that never won** is not a lost leadership: when loading the
//!   policy or the claim fails after the lock was taken (typically a
//!   misconfiguration: the database is not migrated, `schema_missing`, or
//!   the role lacks the grants of `tollgate_sampler`, `permission_denied`),
//!   the sampler logs "cannot take safe-time leadership" with the code and
//!   a hint, drops the connection (and the lock, so a correctly configured
//!   standby can lead), and retries with exponential back-off rather than
//!   every standby poll.
//!
//! Every loop is bounded: sleeps are interruptible by the shutdown signal,
//! reconnects and terms that never won back off exponentially from
//! [`RETRY_BACKOFF_START`] up to [`SamplerOptions::reconnect_max`],
//! each observation and publish must answer within the gap bound, and the
//! server ends a leader session idle for twice the gap bound
//! (`idle_session_timeout`), so a frozen leader releases the lock to a
//! standby.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use jiff::SignedDuration;
use safetime::{
    CarriedCut, CutReading, CutTracker, Observation, SafeTimeConfig, UncertainReason, Verdict,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::watch;

use crate::cut::{self, Published, SafeTimeError};

/// `application_name` of the sampler's connection (visible in
/// `pg_stat_activity`).
pub const SAMPLER_APPLICATION_NAME: &str = "tollgate-safetime";

/// `application_name` of a standby's reader connection, on which it reads
/// the published cut every interval (visible in `pg_stat_activity`; it
/// never takes the lock).
pub const STANDBY_READER_APPLICATION_NAME: &str = "tollgate-safetime-standby";

/// Default interval between a standby's lock attempts.
pub const DEFAULT_STANDBY_POLL: Duration = Duration::from_millis(500);

/// Default ceiling of the reconnect back-off.
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(5);

/// First delay of the exponential back-off (reconnects, and terms that
/// never won), doubled after each failure up to
/// [`SamplerOptions::reconnect_max`]: short enough that a blip costs a
/// tenth of a second; with the 5 s default ceiling the seventh consecutive
/// failure sleeps 5 s (100 ms × 2⁶ > 5 s), so a misconfigured sampler
/// settles at one attempt every 5 s.
pub const RETRY_BACKOFF_START: Duration = Duration::from_millis(100);

/// How long one connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sampler settings.
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// The safe-time rules' tuning (interval, drift, bounds).
    pub config: SafeTimeConfig,
    /// Interval between a standby's lock attempts.
    pub standby_poll: Duration,
    /// Ceiling of the exponential back-off of reconnects and of terms that
    /// never won (starting at [`RETRY_BACKOFF_START`]).
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
    /// Why the last attempt to take leadership failed before its claim
    /// succeeded (`None` if none did); not a loss.
    pub last_not_won: Option<SafeTimeError>,
}

/// Why a leadership term ended.
#[derive(Debug)]
enum TermEnd {
    Shutdown,
    /// The term failed before its claim succeeded, at `step`: it never led.
    NeverWon {
        step: &'static str,
        error: SafeTimeError,
    },
    /// Leadership won by a claim ended.
    Lost(String),
}

/// A sampler for one database; see the module docs.
#[derive(Debug)]
pub struct Sampler {
    connect: PgConnectOptions,
    /// The standby reader's connection settings (its own
    /// `application_name`).
    reader_connect: PgConnectOptions,
    options: SamplerOptions,
    origin: Instant,
    status: watch::Sender<SamplerStatus>,
    /// What this process carries across its next epoch: a standby's
    /// readings of the published cut, or the leader's last accepted
    /// publish. `None` until the first of them.
    carried: Mutex<Option<CarriedCut>>,
    /// Whether this sampler stands by (another leads, or it waits out the
    /// back-off of a term that never won): the standby reader reads only
    /// then.
    standing_by: watch::Sender<bool>,
}

impl Sampler {
    /// A sampler for the database at `url`.
    ///
    /// # Errors
    /// [`SafeTimeError::InvalidUrl`] if `url` is not a PostgreSQL URL or
    /// does not parse ([`cut::connect_options`]; the message does
    /// not repeat the URL).
    pub fn new(url: &str, options: SamplerOptions) -> Result<Sampler, SafeTimeError> {
        let parsed = cut::connect_options(url)?;
        Ok(Sampler {
            connect: parsed.clone().application_name(SAMPLER_APPLICATION_NAME),
            reader_connect: parsed.application_name(STANDBY_READER_APPLICATION_NAME),
            options,
            origin: Instant::now(),
            status: watch::channel(SamplerStatus::default()).0,
            carried: Mutex::new(None),
            standing_by: watch::channel(false).0,
        })
    }

    /// A receiver of this sampler's status.
    pub fn status(&self) -> watch::Receiver<SamplerStatus> {
        self.status.subscribe()
    }

    /// The longest wait for one statement of a leadership term: the gap
    /// bound (a slower answer would be a gap anyway).
    fn call_max(&self) -> Duration {
        Duration::try_from(self.options.config.gap_max())
            .expect("gap_max is positive and at most an hour (SafeTimeConfig::validate)")
    }

    /// The pause between two samples of a leadership term.
    fn interval(&self) -> Duration {
        Duration::try_from(self.options.config.interval())
            .expect("the sample interval is positive and below gap_max (SafeTimeConfig::validate)")
    }

    /// Nanoseconds of this sampler's monotonic clock since it was built.
    fn mono_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos())
            .expect("a sampler runs for less than 584 years (u64 nanoseconds)")
    }

    /// Runs until `shutdown` turns `true` (or its sender goes away): connect,
    /// wait for the lock as a standby (reading the published cut meanwhile,
    /// on a connection of its own), lead until leadership is lost, and
    /// start over. Returns on shutdown; leadership ends with the
    /// connection, so a successor can take over at once.
    pub async fn run(&self, shutdown: watch::Receiver<bool>) {
        tokio::join!(
            self.compete(shutdown.clone()),
            self.read_while_standing_by(shutdown)
        );
    }

    /// The leadership loop of [`Sampler::run`]: connect, stand by, lead,
    /// and start over, until shutdown.
    async fn compete(&self, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = RETRY_BACKOFF_START;
        // Its own back-off, for failures after a successful connect (a
        // claim that fails, a standby whose lock query fails): a
        // misconfigured database accepts every connection (which resets
        // `backoff`) and fails every claim. Reset only by a won claim.
        let mut not_won_backoff = RETRY_BACKOFF_START;
        loop {
            if *shutdown.borrow() {
                return;
            }
            let conn =
                tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&self.connect))
                    .await;
            let mut conn = match conn {
                Ok(Ok(mut c)) => {
                    backoff = RETRY_BACKOFF_START;
                    // A frozen leader must not hold the lock forever: the
                    // server ends a session idle for twice the gap bound.
                    let set = set_idle_session_timeout(&mut c, self.options.config.gap_max()).await;
                    if let Err(e) = set {
                        tracing::warn!(error = %pgkit::classify(&e), "cannot set idle_session_timeout; retrying");
                        drop(c);
                        if sleep_or_shutdown(backoff, &mut shutdown).await {
                            return;
                        }
                        continue;
                    }
                    c
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %pgkit::classify(&e), ?backoff, "sampler cannot connect; retrying");
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
                    // The not-won back-off, not the reconnect one: the
                    // connect before this succeeded and reset that.
                    tracing::warn!(code = e.code(), error = %e, backoff = ?not_won_backoff, "sampler standby connection failed");
                    drop(conn);
                    if sleep_or_shutdown(not_won_backoff, &mut shutdown).await {
                        return;
                    }
                    not_won_backoff = (not_won_backoff * 2).min(self.options.reconnect_max);
                    continue;
                }
            }
            let end = self.lead(&mut conn, &mut shutdown).await;
            self.status.send_modify(|s| {
                s.epoch = None;
                s.last_published = None;
                match &end {
                    TermEnd::Shutdown => {}
                    TermEnd::NeverWon { error, .. } => s.last_not_won = Some(error.clone()),
                    TermEnd::Lost(why) => s.last_loss = Some(why.clone()),
                }
            });
            // Dropping the connection (not closing it politely, which could
            // block on a broken socket) destroys the session and its lock.
            drop(conn);
            match end {
                TermEnd::Shutdown => return,
                TermEnd::NeverWon { step, error } => {
                    // Not a loss: this term never led. Retrying at the
                    // standby poll would log a failure twice a second for
                    // as long as the misconfiguration lasts. The hint is
                    // its own field, so the error is logged without it.
                    tracing::error!(
                        code = error.code(),
                        step,
                        error = %error.without_hint(),
                        hint = never_won_hint(&error),
                        backoff = ?not_won_backoff,
                        "cannot take safe-time leadership; connection dropped, retrying"
                    );
                    // Waiting to lead (typically on a server in recovery,
                    // until it is promoted): read the cut meanwhile, so the
                    // term that finally wins carries it.
                    self.set_standing_by(true);
                    if sleep_or_shutdown(not_won_backoff, &mut shutdown).await {
                        return;
                    }
                    not_won_backoff = (not_won_backoff * 2).min(self.options.reconnect_max);
                }
                TermEnd::Lost(why) => {
                    not_won_backoff = RETRY_BACKOFF_START;
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
            if cut::try_lock(conn).await? {
                self.set_standing_by(false);
                return Ok(true);
            }
            self.set_standing_by(true);
            if !logged {
                tracing::info!("another sampler leads; waiting as a standby");
                logged = true;
            }
            if sleep_or_shutdown(self.options.standby_poll, shutdown).await {
                return Ok(false);
            }
        }
    }

    /// One leadership term on a connection that holds the lock: win it
    /// ([`Sampler::win`]), then sample ([`Sampler::sample`]) every
    /// interval until shutdown or until leadership is lost. Until the claim
    /// succeeds a failure is [`TermEnd::NeverWon`], after it
    /// [`TermEnd::Lost`].
    async fn lead(&self, conn: &mut PgConnection, shutdown: &mut watch::Receiver<bool>) -> TermEnd {
        let mut term = match self.win(conn).await {
            Ok(term) => term,
            Err(end) => return end,
        };
        let interval = self.interval();
        loop {
            if *shutdown.borrow() {
                return TermEnd::Shutdown;
            }
            if let Err(end) = self.sample(conn, &mut term).await {
                return end;
            }
            if sleep_or_shutdown(interval, shutdown).await {
                return TermEnd::Shutdown;
            }
        }
    }

    /// Takes leadership on a connection that holds the lock: records the
    /// backend's pid, loads the newest sealed horizon policy (digest
    /// verified) and claims the next epoch; the epoch's tracker starts from
    /// the claimed cut.
    ///
    /// # Errors
    /// [`TermEnd::NeverWon`] naming the step that failed.
    async fn win(&self, conn: &mut PgConnection) -> Result<Term, TermEnd> {
        let never_won =
            |step: &'static str| move |error: SafeTimeError| TermEnd::NeverWon { step, error };
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .map_err(SafeTimeError::from)
            .map_err(never_won("reading the backend pid"))?;
        let policy = cut::load_policy(&mut *conn)
            .await
            .map_err(never_won("loading the horizon policy"))?;
        let claim = cut::claim(conn, &policy)
            .await
            .map_err(never_won("claiming an epoch"))?;
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
        // Taken after the claim and before the first observation, so every
        // reading in it answered before that observation was sent.
        let carried = *self.carried.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = carried {
            let anchor = c.anchor();
            let age_ns = self
                .mono_ns()
                .saturating_sub(anchor.observation.mono_after_ns);
            tracing::info!(
                epoch = claim.epoch,
                carried_cut = %anchor.cut,
                carried_epoch = anchor.epoch,
                carried_publish_seq = anchor.publish_seq,
                carried_age_ms = age_ns / 1_000_000,
                pending_step = ?c.pending_step(),
                ignored = claim.quarantined,
                "carrying the safe cut into the new epoch"
            );
            tracker = tracker.with_carry(c);
        }
        let carried_system = carried
            .filter(|_| !claim.quarantined)
            .map(|c| c.last().observation.topology.system_identifier);
        Ok(Term {
            pid,
            epoch: claim.epoch,
            tracker,
            last_reason: claim.uncertain,
            carried_system,
        })
    }

    /// One sample of a won term: an observation from the backend that won
    /// ([`Sampler::observe`]), the tracker's verdict on it, and its publish
    /// ([`Sampler::publish`]) unless the server is in recovery.
    ///
    /// # Errors
    /// [`TermEnd::Lost`]: the observation or publish failed or was refused,
    /// or the leadership check failed.
    async fn sample(&self, conn: &mut PgConnection, term: &mut Term) -> Result<(), TermEnd> {
        let obs = self.observe(conn, term.pid).await?;
        if let Some(system) = term.carried_system.take()
            && system != obs.topology.system_identifier
        {
            tracing::warn!(
                epoch = term.epoch,
                carried_system_identifier = system,
                system_identifier = obs.topology.system_identifier,
                "the carried safe cut was read on another database system; nothing is carried"
            );
        }
        let verdict = term.tracker.observe(obs);
        if verdict.publishable {
            self.publish(conn, term, &obs, &verdict).await
        } else {
            if term.last_reason != verdict.uncertain {
                tracing::warn!(reason = ?verdict.uncertain, "connected to a server in recovery; not publishing");
                term.last_reason = verdict.uncertain;
            }
            Ok(())
        }
    }

    /// One observation, bracketed by this sampler's monotonic clock, after
    /// checking that the backend that answered is the one that won (`pid`)
    /// and holds exactly the lock.
    ///
    /// # Errors
    /// [`TermEnd::Lost`]: no answer within [`Sampler::call_max`], a
    /// database error, or another backend (or no lock) answering.
    async fn observe(&self, conn: &mut PgConnection, pid: i32) -> Result<Observation, TermEnd> {
        let before = self.mono_ns();
        let obs = tokio::time::timeout(self.call_max(), cut::observe(conn)).await;
        let after = self.mono_ns();
        let obs = match obs {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(TermEnd::Lost(format!("observation failed: {e}"))),
            Err(_) => {
                return Err(TermEnd::Lost(format!(
                    "observation failed: no answer within {:?}",
                    self.call_max()
                )));
            }
        };
        if obs.backend_pid != pid || !obs.lock_held {
            return Err(TermEnd::Lost(format!(
                "leadership check failed: backend pid {} (won as {pid}), lock held: {} \
                 (is the connection going through a transaction-pooling proxy?)",
                obs.backend_pid, obs.lock_held
            )));
        }
        Ok(Observation {
            db_now: obs.db_now,
            topology: obs.topology,
            mono_before_ns: before,
            mono_after_ns: after,
        })
    }

    /// Publishes `verdict` (on `obs`) for the term's epoch, feeds the cut
    /// the database accepted back to the tracker and keeps it as what this
    /// process carries (a reading: `obs`'s database time, answered when
    /// the publish answered); logs each change of certainty once.
    ///
    /// # Errors
    /// [`TermEnd::Lost`]: the publish was refused, failed or did not
    /// answer within [`Sampler::call_max`], or the database kept the
    /// quarantine the tracker proved cleared (it saw an anomaly this
    /// sample did not; the proof restarts with a new epoch).
    async fn publish(
        &self,
        conn: &mut PgConnection,
        term: &mut Term,
        obs: &Observation,
        verdict: &Verdict,
    ) -> Result<(), TermEnd> {
        let published =
            tokio::time::timeout(self.call_max(), cut::publish(conn, term.epoch, verdict))
                .await
                .unwrap_or_else(|_| {
                    Err(SafeTimeError::Backend(format!(
                        "no answer within {:?}",
                        self.call_max()
                    )))
                });
        let answered_ns = self.mono_ns();
        let p =
            published.map_err(|e| TermEnd::Lost(format!("publish refused: {e} ({})", e.code())))?;
        term.tracker.accepted(p.cut);
        *self.carried.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(CarriedCut::new(CutReading {
                cut: p.cut,
                epoch: term.epoch,
                publish_seq: p.publish_seq,
                observation: Observation {
                    mono_after_ns: answered_ns,
                    ..*obs
                },
            }));
        if p.quarantined && !term.tracker.quarantined() {
            return Err(TermEnd::Lost(
                "the database kept the quarantine the sampler proved cleared".to_owned(),
            ));
        }
        if p.uncertain != term.last_reason {
            match p.uncertain {
                None => tracing::info!(epoch = term.epoch, cut = %p.cut, "safe cut is certain"),
                Some(r) => {
                    tracing::warn!(epoch = term.epoch, cut = %p.cut, reason = %r, "safe cut is uncertain")
                }
            }
            term.last_reason = p.uncertain;
        }
        self.status.send_modify(|s| s.last_published = Some(p));
        Ok(())
    }
}

impl Sampler {
    /// The standby reader of [`Sampler::run`]: while this sampler stands by
    /// (another leads, or it waits to try again after a term that never
    /// won), reads the published cut every interval on a
    /// connection of its own and adds each reading to what this process
    /// carries; while it does not, holds no connection. Never touches the
    /// lock, so it cannot delay a lock attempt; each read (and connect) is
    /// bounded by [`Sampler::call_max`], and a failure is logged (the first
    /// of a run at `warn`) and retried at the next interval on a new
    /// connection. Returns on shutdown.
    async fn read_while_standing_by(&self, mut shutdown: watch::Receiver<bool>) {
        let mut standing_by = self.standing_by.subscribe();
        let mut failing = false;
        loop {
            if !*standing_by.borrow_and_update() {
                tokio::select! {
                    _ = standing_by.changed() => {}
                    () = until_shutdown(&mut shutdown) => return,
                }
                continue;
            }
            // One read per interval on a fixed schedule (the first at
            // once), so a read's own duration does not stretch the time
            // between a publish and its first sighting; a late tick is
            // delayed, never doubled.
            let mut ticks = tokio::time::interval(self.interval());
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut conn: Option<PgConnection> = None;
            while *standing_by.borrow_and_update() {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = standing_by.changed() => continue,
                    () = until_shutdown(&mut shutdown) => return,
                }
                let read = tokio::select! {
                    read = self.read_once(&mut conn) => read,
                    () = until_shutdown(&mut shutdown) => return,
                };
                match read {
                    Ok(reading) => {
                        if failing {
                            tracing::info!("the standby reads the safe cut again");
                            failing = false;
                        }
                        if let Some(reading) = reading {
                            self.carry_reading(reading);
                        }
                    }
                    Err(e) => {
                        conn = None;
                        if failing {
                            tracing::debug!(code = e.code(), error = %e, "standby reading of the safe cut failed again");
                        } else {
                            tracing::warn!(
                                code = e.code(),
                                error = %e,
                                "the standby cannot read the safe cut; a takeover now would carry \
                                 only what it read before (retrying every interval)"
                            );
                            failing = true;
                        }
                    }
                }
            }
        }
    }

    /// Records whether this sampler stands by; the standby reader hears of
    /// changes only.
    fn set_standing_by(&self, standing_by: bool) {
        self.standing_by.send_if_modified(|was| {
            let changed = *was != standing_by;
            *was = standing_by;
            changed
        });
    }

    /// One standby reading on the reader connection `conn` (connected, with
    /// its idle timeout, when there is none), bracketed by this sampler's
    /// monotonic clock; `Ok(None)` before any claim.
    ///
    /// # Errors
    /// The connection or the read failed, or did not answer within
    /// [`Sampler::call_max`].
    async fn read_once(
        &self,
        conn: &mut Option<PgConnection>,
    ) -> Result<Option<CutReading>, SafeTimeError> {
        let no_answer =
            || SafeTimeError::Backend(format!("no answer within {:?}", self.call_max()));
        let c = match conn {
            Some(c) => c,
            None => {
                let connect = async {
                    let mut c = PgConnection::connect_with(&self.reader_connect).await?;
                    set_idle_session_timeout(&mut c, self.options.config.gap_max()).await?;
                    Ok::<_, sqlx::Error>(c)
                };
                let c = tokio::time::timeout(self.call_max(), connect)
                    .await
                    .map_err(|_| no_answer())??;
                conn.insert(c)
            }
        };
        let before = self.mono_ns();
        let sighting = tokio::time::timeout(self.call_max(), cut::read_sighting(c))
            .await
            .map_err(|_| no_answer())??;
        let after = self.mono_ns();
        Ok(sighting.map(|s| CutReading {
            cut: s.cut,
            epoch: s.epoch,
            publish_seq: s.publish_seq,
            observation: Observation {
                db_now: s.db_now,
                topology: s.topology,
                mono_before_ns: before,
                mono_after_ns: after,
            },
        }))
    }

    /// Adds a standby's `reading` to what this process carries; logs a
    /// clock step it reveals between two readings.
    fn carry_reading(&self, reading: CutReading) {
        let mut carried = self.carried.lock().unwrap_or_else(PoisonError::into_inner);
        let before = carried.as_ref().and_then(CarriedCut::pending_step);
        let next = match carried.as_ref() {
            Some(c) => c.read(&self.options.config, reading),
            None => CarriedCut::new(reading),
        };
        if let Some(step) = next.pending_step()
            && before != Some(step)
        {
            tracing::warn!(
                reason = %step,
                epoch = reading.epoch,
                publish_seq = reading.publish_seq,
                db_now = %reading.observation.db_now,
                "the database clock stepped between two standby readings of the safe cut"
            );
        }
        *carried = Some(next);
    }
}

/// Returns once `shutdown` is `true` or its sender is gone.
async fn until_shutdown(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// A won leadership term.
#[derive(Debug)]
struct Term {
    /// `pg_backend_pid()` of the backend that won: every observation must
    /// come from it.
    pid: i32,
    /// The claimed epoch.
    epoch: i64,
    /// The epoch's cut tracker.
    tracker: CutTracker,
    /// The uncertainty last logged (initially the claim's), so that each
    /// change is logged once.
    last_reason: Option<UncertainReason>,
    /// Until the term's first observation: the database system of the
    /// carried cut's last reading, if a cut was carried (a first
    /// observation of another system carries nothing, which is logged).
    carried_system: Option<i64>,
}

/// `idle_session_timeout` of a leader session, in milliseconds: twice the
/// gap bound, so a frozen leader (stopped process, dead host) releases the
/// lock to a standby while a healthy one, never idle longer than one
/// interval, keeps it. At least 1 (0 would disable the timeout); at most
/// 7,200,000 (`gap_max` is at most an hour), well inside the setting's
/// `i32` range.
fn idle_session_timeout_ms(gap_max: SignedDuration) -> i128 {
    (gap_max.as_millis() * 2).max(1)
}

/// Sets [`idle_session_timeout_ms`] on a new session: as a statement, not
/// a startup parameter, which proxies such as PgBouncer refuse; in the
/// simple protocol (the value is an integer computed here) and unnamed, so
/// it takes no name from the prepared-statement cache and a proxy's
/// statement routing is not disturbed.
async fn set_idle_session_timeout(
    conn: &mut PgConnection,
    gap_max: SignedDuration,
) -> Result<(), sqlx::Error> {
    let sql = format!(
        "SET idle_session_timeout = '{}ms'",
        idle_session_timeout_ms(gap_max)
    );
    sqlx::query(&sql).persistent(false).execute(conn).await?;
    Ok(())
}

/// What an operator can do about a term that never won, by its code: the
/// error's own [`SafeTimeError::hint`] where it has one.
fn never_won_hint(e: &SafeTimeError) -> &'static str {
    match e {
        SafeTimeError::SchemaMissing(_) | SafeTimeError::PermissionDenied(_) => {
            e.hint().unwrap_or("see the error; retrying with back-off")
        }
        SafeTimeError::NotLeader(_) => {
            "the lock was gone at the claim: connect directly or through session pooling, not transaction pooling"
        }
        SafeTimeError::HorizonPolicyMismatch(_) => {
            "a new horizon policy was sealed after it was loaded; the next attempt loads it"
        }
        SafeTimeError::Policy(_) | SafeTimeError::Corrupt(_) => {
            "a stored safe-time row fails verification; inspect `tollgate-safetime policy show` and the evidence"
        }
        SafeTimeError::StaleEpoch(_)
        | SafeTimeError::SamplerRunning(_)
        | SafeTimeError::InvalidProposal(_)
        | SafeTimeError::QuarantineRefused(_)
        | SafeTimeError::HorizonBelowPolicy(_)
        | SafeTimeError::NoClaim(_)
        | SafeTimeError::InvalidUrl(_)
        | SafeTimeError::Backend(_) => "see the error; retrying with back-off",
    }
}

/// Sleeps `d` unless shutdown comes first; `true` means shut down.
async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
        r = shutdown.changed() => r.is_err() || *shutdown.borrow(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_session_timeout_is_twice_the_gap_bound_and_never_zero() {
        let cases = [
            (SignedDuration::from_secs(5), 10_000),
            (SignedDuration::from_hours(1), 7_200_000),
            (SignedDuration::from_millis(1), 2),
            (SignedDuration::from_micros(1_500), 2),
            (SignedDuration::from_micros(999), 1),
            (SignedDuration::from_nanos(1), 1),
        ];
        for (gap_max, ms) in cases {
            assert_eq!(idle_session_timeout_ms(gap_max), ms, "{gap_max}");
        }
    }
}
