//! The gateway: a loop around one bounded [`Gateway::step`].
//!
//! A step, in order:
//!
//! 1. **Heartbeat** every owned exec (`max(current, cut + ttl)`, on any
//!    cut). An exec whose heartbeat the store refuses `owner_stale` or
//!    `owner_expired` is forgotten at once (counted `stale_refused`): this
//!    activation never touches it again; so is one whose Lease is neither
//!    `active` nor `allocating` (a resume's) and that has no resume to
//!    act on (counted `dropped`).
//! 2. **Claim** new execs (active Lease, or parked with a resume request,
//!    and no live owner) up to
//!    [`GatewayOptions::owned_max`], only on a certain cut.
//! 3. For each owned exec, at most [`GatewayOptions::serve_concurrency`]
//!    at once, started in id order (while the **heartbeat keeper** runs
//!    beside them, below), **inputs** first: at most [`INPUTS_PER_STEP`]
//!    of its queued stdin inputs, in input seq order, each delivered to the
//!    supervisor (`send`, which writes an input seq to stdin once)
//!    \[`after_send`\] and then recorded sent (the `send` receipt, its
//!    transition id `send-{attempt}-{seq}-g{generation}`, so a successor
//!    that delivers again an input its dead predecessor delivered but did
//!    not record commits its own receipt instead of being refused as the
//!    predecessor's replay). A supervisor that cannot take more input yet
//!    (`input_busy`) ends the exec's inputs for this step; one whose
//!    command's stdin is closed (`input_closed`: it ended or closed it)
//!    ends them for this activation, the inputs left queued; any other
//!    non-stale failure is recorded and retried at the next step. In every
//!    case the pages still move, so a command that stopped reading stdin is
//!    still finished and released. Then at
//!    most [`GatewayOptions::pages_per_step`] pages, renewing the heartbeat
//!    again before each round, while its sink writes run and before its
//!    ACK, once a third of the TTL has passed since the last renewal
//!    ([`RENEW_EVERY_TTL_FRACTION`]), so a long step never outlives its own
//!    ownership:
//!    * **pending pages first** (metadata committed by a previous owner or
//!      a step that died): each is re-read from the spool, checked against
//!      its committed metadata ([`PageMeta::matches`]), written to the sink,
//!      its ACK result committed, and the supervisor told;
//!    * pages acked in the store but not yet acked to the supervisor are
//!      acked to it again (idempotent);
//!    * **new pages**: read from the spool after the committed seq; their
//!      metadata and ACK intent committed (`pending`)
//!      \[`after_metadata`\]; their bytes made durable in the sink
//!      \[`after_sink`\]; their ACK result committed (`acked`)
//!      \[`after_ack_result`\] \[`before_supervisor_ack`\]; the supervisor
//!      told to drop them. Each of these is a separate commit, so a crash
//!      between any two leaves a state the next owner finishes;
//!    * **cancel** when a client asked: the `cancel` receipt committed,
//!      then the supervisor told (it kills the command, whose terminal page
//!      follows);
//!    * **release** once the terminal page is acked (store and
//!      supervisor) and the cut is certain: the Lease moves to
//!      `release_pending` for the worker to destroy and prove, and the
//!      ownership ends.
//!
//! **Hibernation.** When the store's view shows the current generation's
//! hibernation `sealed` (its Lease active, no cancel asked before the
//! stop, no terminal page acked), the exec is told no new input; the
//! supervisor is told to `stop` (a bounded call) \[`after_stop`\]; the
//! pages move exactly as above until the **stopped page**, which ends the
//! generation's pages like a terminal page but releases nothing, is acked
//! in the store and at the supervisor \[`after_stopped_ack`\]; then the
//! provider **quiesces** the workspace under its own bound
//! ([`GatewayOptions::quiesce_timeout`]), the heartbeat renewed beside it
//! \[`after_quiesce`\]; then, on a certain cut, the quiescence is committed,
//! which moves the Lease to `release_pending` and ends the ownership in
//! the same transaction ([`StepReport::hibernated`]); the reconciler
//! destroys the generation and parks the attempt. A command that ended
//! before the stop (`ended`) or a cancel asked before it ends the exec as
//! usual (the terminal page, the release); the hibernation stays `sealed`
//! and is never acted on. A cancel asked after the stop is too late to
//! kill the command: the generation is quiesced and the store ends the
//! exec `cancelled` as it parks. A successor finishes each step: its stop finds
//! the command stopped, its quiesce answers the same head, the commit
//! replays.
//!
//! **Resume.** A parked exec with a resume request (recorded for its
//! parked generation, no receipt, not refused) is claimable. Its owner
//! makes no provider call for it: on a certain cut it **prepares** the
//! resume (Reservation and Lease g+1 `allocating`, restoring the parked
//! head; [`StepReport::resumes_prepared`]) \[`after_prepare_resume`\]; it
//! keeps the ownership, heartbeating, while the reconciler allocates the
//! Lease with the restore and records the provider's attachment; once the
//! view shows the Lease attached it **commits** the resume on a certain
//! cut \[`before_commit_resume`\] (the receipt and `parked -> runnable`;
//! [`StepReport::resumes_committed`]); the reconciler then marks the
//! Lease active and the exec is served as any other, its pages continuing
//! after the stopped page. A resume whose Lease the reconciler released
//! unattached because the provider refused the restore carries the
//! refusal on its request, which is never prepared again; the exec stays
//! parked and is forgotten ([`StepReport::resumes_refused`]) until a new
//! request (another operation key).
//!
//! **Bounded provider calls and the keeper.** Every provider call (connect,
//! pages, ack, send, cancel, spool status) is bounded by
//! [`GatewayOptions::provider_call_timeout`] (at most a third of the TTL,
//! [`PROVIDER_CALL_TIMEOUT_DEFAULT`]). A call that hits it ends its exec's
//! work for the step as a failure `provider_timeout` of that exec only
//! (counted in [`StepReport::provider_timeouts`] and the metrics), retried
//! at the next step from what the store says; so a supervisor that stopped
//! answering costs its exec one bound per step and delays no other exec
//! unless [`GatewayOptions::serve_concurrency`] such execs fill every place
//! at once (then by one bound per step for each `serve_concurrency` of
//! them). While step 3 serves, a keeper in the same step renews, every
//! [`KEEPER_CHECKS_PER_RENEWAL`]th of the renewal interval, the heartbeat
//! of every owned exec that is not being served and was last renewed a
//! [`RENEW_EVERY_TTL_FRACTION`] of the TTL ago
//! ([`StepReport::renewals_kept`]); it makes no provider call, so no exec's
//! heartbeat waits on another exec's supervisor. Each exec is held by one
//! server or the keeper at a time; an exec whose renewal the keeper sees
//! refused is forgotten at once and not served.
//!
//! Every store write is fenced by the owner credential and judged at a
//! reading of the cut taken just before it. Every provider call carries the
//! ownership's fence, so a supervisor that has seen a newer owner refuses a
//! stale one (`stale_fence`, also counted `stale_refused`). A failure of one
//! exec is recorded in the report and retried at the next step from what
//! the store says.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clock::Clock;
use jiff::SignedDuration;
use lc_blob::{BlobError, BlobStore, PutOutcome};
use lc_core::hibernate::QuiescenceRefusal;
use lc_core::owner::{
    OWNER_TOKEN_BYTES, OwnedExec, OwnerCredential, OwnerToken, PageMeta, TakeoverBasis,
    check_heartbeat_ttl,
};
use lc_core::page::StopOutcome;
use lc_core::page::{PAGES_PER_REQUEST_MAX, Page};
use lc_core::rules::APPEND_PAGES_MAX;
use lc_core::store::GatewayStore;
use lc_core::{CutReading, ExecId, Generation, HibernationStep, LcError, LeaseState, PageKind};
use lc_provider::{Provider, ProviderError};
use tokio::sync::{Mutex, watch};

use crate::crash::{CrashPoint, FaultHook};
use crate::metrics::GatewayMetrics;
use crate::spool::{self, ProviderConnector};

/// The default bound on execs one gateway owns (and so serves per step):
/// each costs a heartbeat and a spool read per step.
pub const OWNED_EXECS_DEFAULT: usize = 64;

/// The largest accepted [`GatewayOptions::owned_max`].
pub const OWNED_EXECS_MAX: usize = 1000;

/// Pages read from a spool per round: what one provider request returns
/// and one `stage_pages` commits, whichever is smaller.
pub const PAGES_PER_ROUND: usize = if APPEND_PAGES_MAX < PAGES_PER_REQUEST_MAX as usize {
    APPEND_PAGES_MAX
} else {
    PAGES_PER_REQUEST_MAX as usize
};

/// The default bound on pages moved per exec and step: four rounds, up to
/// 16 MiB of 64 KiB pages, twice the supervisor's default spool, without
/// starving the other execs of the step.
pub const PAGES_PER_STEP_DEFAULT: usize = 4 * PAGES_PER_ROUND;

/// The largest accepted [`GatewayOptions::pages_per_step`].
pub const PAGES_PER_STEP_MAX: usize = 64 * PAGES_PER_ROUND;

/// Inputs delivered per exec and step: the most an exec may have queued
/// ([`lc_core::input::INPUT_QUEUE_INPUTS_MAX`]), so a full queue drains in
/// one step.
pub const INPUTS_PER_STEP: usize = lc_core::input::INPUT_QUEUE_INPUTS_MAX as usize;

/// Distinct provider URLs whose clients are kept (one provider per host).
pub const PROVIDERS_MAX: usize = 64;

/// How often the spool occupancy of the owned execs is sampled for the
/// metrics (one unfenced status request per exec).
pub const SPOOL_SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The default bound on one provider call of the gateway: a supervisor
/// answers a request on its local socket within milliseconds and a
/// provider serves one round of pages (at most [`PAGES_PER_ROUND`] pages)
/// well within it, while a supervisor that stopped answering (stopped,
/// wedged, or its socket replaced by a listener that never answers) costs
/// its exec this much per step instead of the provider's own socket
/// timeout. It is a fifth of the default heartbeat TTL, so an exec being
/// served still renews its heartbeat between two of its calls.
pub const PROVIDER_CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);

/// The default bound on execs served at once within a step: each holds at
/// most one provider call, one store connection or one sink write at a
/// time, so this many supervisors that stop answering together cost the
/// others one bound per step, and fewer cost them nothing.
pub const SERVE_CONCURRENCY_DEFAULT: usize = 16;

/// The largest accepted [`GatewayOptions::serve_concurrency`].
pub const SERVE_CONCURRENCY_MAX: usize = 256;

/// The default bound on one `quiesce` call: the provider walks and hashes
/// the whole workspace and stores its blobs (a 100 MB tree of small files
/// takes far longer than any other provider call), while the heartbeat is
/// renewed beside it.
pub const QUIESCE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(600);

/// The longest accepted [`GatewayOptions::quiesce_timeout`] (one hour).
pub const QUIESCE_TIMEOUT_MAX: Duration = Duration::from_secs(3600);

/// The wait before the first retry of a `quiesce` that failed in a way a
/// retry may mend (the provider unreachable or failing, the call past its
/// bound); each further failure of the same generation doubles it, up to
/// [`QUIESCE_RETRY_MAX`]. A quiesce walks the whole workspace, so it is
/// not retried at every step.
pub const QUIESCE_RETRY_MIN: Duration = Duration::from_secs(1);

/// The longest wait between two `quiesce` attempts of one generation.
pub const QUIESCE_RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait before the next `quiesce` of a generation whose last
/// `failures` (at least 1) attempts failed and may be retried:
/// [`QUIESCE_RETRY_MIN`] doubled per further failure, at most
/// [`QUIESCE_RETRY_MAX`].
pub fn quiesce_retry_after(failures: u32) -> Duration {
    lc_core::rules::doubling_backoff(failures, QUIESCE_RETRY_MIN, QUIESCE_RETRY_MAX)
}

/// The smallest accepted [`GatewayOptions::provider_call_timeout`]: below
/// it a healthy provider's answer could not arrive in time.
pub const PROVIDER_CALL_TIMEOUT_MIN: Duration = Duration::from_millis(10);

/// How many times per renewal interval (a [`RENEW_EVERY_TTL_FRACTION`] of
/// the TTL) the heartbeat keeper looks for owned execs due for renewal
/// while a step serves: an exec waiting for its turn is renewed at most a
/// quarter of that interval late.
pub const KEEPER_CHECKS_PER_RENEWAL: u32 = 4;

/// The gateway's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatewayOptions {
    /// The heartbeat TTL: a heartbeat renews the ownership to
    /// `max(current, cut + ttl)`; within
    /// [`lc_core::owner::HEARTBEAT_TTL_MIN`]`..=`[`lc_core::owner::HEARTBEAT_TTL_MAX`].
    pub heartbeat_ttl: SignedDuration,
    /// Execs owned at once, `1..=`[`OWNED_EXECS_MAX`].
    pub owned_max: usize,
    /// Pages moved per exec and step, `1..=`[`PAGES_PER_STEP_MAX`].
    pub pages_per_step: usize,
    /// Execs served at once within a step,
    /// `1..=`[`SERVE_CONCURRENCY_MAX`] (see [`SERVE_CONCURRENCY_DEFAULT`]).
    pub serve_concurrency: usize,
    /// The bound on each provider call of the gateway (connect, pages,
    /// ack, send, cancel, spool status), from
    /// [`PROVIDER_CALL_TIMEOUT_MIN`] to a third of
    /// [`GatewayOptions::heartbeat_ttl`] (see
    /// [`PROVIDER_CALL_TIMEOUT_DEFAULT`]).
    pub provider_call_timeout: Duration,
    /// The bound on one `quiesce` call of a hibernation, from
    /// [`GatewayOptions::provider_call_timeout`] to [`QUIESCE_TIMEOUT_MAX`]
    /// (see [`QUIESCE_TIMEOUT_DEFAULT`]); the heartbeat is renewed while it
    /// runs.
    pub quiesce_timeout: Duration,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            heartbeat_ttl: lc_core::owner::HEARTBEAT_TTL_DEFAULT,
            owned_max: OWNED_EXECS_DEFAULT,
            pages_per_step: PAGES_PER_STEP_DEFAULT,
            provider_call_timeout: PROVIDER_CALL_TIMEOUT_DEFAULT,
            serve_concurrency: SERVE_CONCURRENCY_DEFAULT,
            quiesce_timeout: QUIESCE_TIMEOUT_DEFAULT,
        }
    }
}

/// One exec (or the step itself) that failed in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecFailure {
    /// The exec, `None` for the step itself (clock, claim).
    pub exec_id: Option<ExecId>,
    /// The stable code (the store's, the provider's, the sink's, or
    /// `page_mismatch`, `page_missing`, `provider_mismatch`,
    /// `providers_full`, `provider_timeout`, `clock_unavailable`).
    pub code: String,
    /// A message for the log.
    pub message: String,
}

/// What one step did. Counts are of this step only.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepReport {
    /// The first reading of the step (`None` when the clock failed).
    pub at: Option<CutReading>,
    /// Execs owned after the step.
    pub owned: usize,
    /// Heartbeats the store accepted at the start of the step.
    pub heartbeats: usize,
    /// Heartbeats renewed again within the step, while it worked off a
    /// backlog ([`RENEW_EVERY_TTL_FRACTION`]).
    pub renewals_mid_step: usize,
    /// Heartbeats the keeper renewed within the step for owned execs that
    /// were not being served at that moment (waiting for their turn, or
    /// served already), so no exec's heartbeat waits on another exec's
    /// provider calls.
    pub renewals_kept: usize,
    /// Provider calls that did not answer within
    /// [`GatewayOptions::provider_call_timeout`] (each also a failure
    /// `provider_timeout` of its exec, which is served again at the next
    /// step).
    pub provider_timeouts: usize,
    /// Execs newly owned that no gateway owned before.
    pub claimed: usize,
    /// Execs newly owned from an expired or released owner.
    pub taken_over: usize,
    /// Writes refused because this gateway no longer owns the exec (each
    /// such exec is forgotten).
    pub stale_refused: usize,
    /// Pending pages of earlier owners (or steps) finished.
    pub pending_finished: usize,
    /// Pages whose metadata was newly committed.
    pub pages_staged: usize,
    /// Pages whose ACK result was committed.
    pub pages_acked: usize,
    /// Bytes of those pages.
    pub bytes_acked: u64,
    /// Acks sent to supervisors.
    pub supervisor_acks: usize,
    /// Inputs delivered to supervisors and recorded sent.
    pub inputs_sent: usize,
    /// Cancels told to supervisors.
    pub cancels: usize,
    /// Leases released (terminal page acked).
    pub released: usize,
    /// Commands of sealed hibernations told to stop (`stop` answered
    /// `killed`).
    pub stops: usize,
    /// Hibernations whose quiescence was committed (the generation's
    /// Lease moves to `release_pending`, the ownership ends).
    pub hibernated: usize,
    /// Hibernations whose snapshot the provider refused (`snapshot_refused`:
    /// the refusal is recorded, the exec ends and its Lease moves to
    /// `release_pending`, the ownership ends).
    pub hibernations_refused: usize,
    /// Resumes prepared (Reservation and Lease g+1 allocating).
    pub resumes_prepared: usize,
    /// Resumes committed (the receipt, the attempt runnable).
    pub resumes_committed: usize,
    /// Resumes in progress on an exec this gateway owned whose Lease was
    /// released unattached (the provider refused the restore; the refusal
    /// is on the request and the exec stays parked).
    pub resumes_refused: usize,
    /// Execs forgotten because their Lease is no longer active (and no
    /// resume of theirs is in progress), or parked with nothing to resume.
    pub dropped: usize,
    /// The crash point reached (a test's fault hook returned).
    pub crashed: Option<CrashPoint>,
    /// What failed.
    pub failures: Vec<ExecFailure>,
}

impl StepReport {
    /// Adds the counts and failures of `part` (a part of this step: one
    /// exec's serve, or the keeper's) to this report.
    fn absorb(&mut self, part: StepReport) {
        self.heartbeats += part.heartbeats;
        self.renewals_mid_step += part.renewals_mid_step;
        self.renewals_kept += part.renewals_kept;
        self.provider_timeouts += part.provider_timeouts;
        self.claimed += part.claimed;
        self.taken_over += part.taken_over;
        self.stale_refused += part.stale_refused;
        self.pending_finished += part.pending_finished;
        self.pages_staged += part.pages_staged;
        self.pages_acked += part.pages_acked;
        self.bytes_acked += part.bytes_acked;
        self.supervisor_acks += part.supervisor_acks;
        self.inputs_sent += part.inputs_sent;
        self.cancels += part.cancels;
        self.released += part.released;
        self.stops += part.stops;
        self.hibernated += part.hibernated;
        self.hibernations_refused += part.hibernations_refused;
        self.resumes_prepared += part.resumes_prepared;
        self.resumes_committed += part.resumes_committed;
        self.resumes_refused += part.resumes_refused;
        self.dropped += part.dropped;
        self.crashed = self.crashed.or(part.crashed);
        self.failures.extend(part.failures);
    }
}

/// Why a gateway could not be built.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// An option outside its bounds (code `invalid_limit` or
    /// `invalid_timeout`).
    #[error("{0}")]
    Options(LcError),
    /// The operating system's random source failed (code `random_unavailable`).
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

impl GatewayError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::Options(e) => e.code(),
            GatewayError::Random(_) => "random_unavailable",
        }
    }
}

/// Why one exec's handling stopped.
enum Fail {
    Store(LcError),
    Provider(ProviderError),
    Sink(BlobError),
    Clock(clock::ClockError),
    /// A pending page re-read from the spool differs from its metadata.
    Mismatch(i64),
    /// A pending page is no longer in the spool.
    Missing(i64),
    ProviderMismatch {
        expected: String,
        actual: String,
    },
    ProvidersFull,
    /// A provider call (named) did not answer within the bound.
    Timeout {
        call: &'static str,
        after: Duration,
    },
    Crashed(CrashPoint),
    Join(String),
    /// A provider's signed statement that does not serialize as JSON.
    Evidence(String),
}

impl From<LcError> for Fail {
    fn from(e: LcError) -> Self {
        Fail::Store(e)
    }
}

impl From<ProviderError> for Fail {
    fn from(e: ProviderError) -> Self {
        Fail::Provider(e)
    }
}

impl From<clock::ClockError> for Fail {
    fn from(e: clock::ClockError) -> Self {
        Fail::Clock(e)
    }
}

impl Fail {
    /// Whether a failed quiesce (or its commit) waits before it is tried
    /// again: every failure but a lost ownership and a test's crash point.
    fn retries_quiesce(&self) -> bool {
        !self.is_stale() && !matches!(self, Fail::Crashed(_))
    }

    /// Whether the failure says this gateway no longer owns the exec.
    fn is_stale(&self) -> bool {
        match self {
            Fail::Store(e) => matches!(e.code(), "owner_stale" | "owner_expired"),
            Fail::Provider(e) => spool::is_stale_fence(e),
            _ => false,
        }
    }

    fn code_message(&self) -> (String, String) {
        match self {
            Fail::Store(e) => (e.code().into(), e.to_string()),
            Fail::Provider(e) => (e.code().into(), e.to_string()),
            Fail::Sink(e) => (e.code().into(), e.to_string()),
            Fail::Clock(e) => ("clock_unavailable".into(), e.to_string()),
            Fail::Mismatch(seq) => (
                "page_mismatch".into(),
                format!("spooled page {seq} differs from its committed metadata; it is not acked"),
            ),
            Fail::Missing(seq) => (
                "page_missing".into(),
                format!("pending page {seq} is not in the spool"),
            ),
            Fail::ProviderMismatch { expected, actual } => (
                "provider_mismatch".into(),
                format!("the exec's provider is {expected} but its URL answers as {actual}"),
            ),
            Fail::ProvidersFull => (
                "providers_full".into(),
                format!("this gateway keeps clients for at most {PROVIDERS_MAX} providers"),
            ),
            Fail::Timeout { call, after } => (
                "provider_timeout".into(),
                format!(
                    "the provider's {call} call did not answer within {after:?}; the exec is served again at the next step"
                ),
            ),
            Fail::Crashed(p) => ("crashed".into(), format!("fault injection at {p}")),
            Fail::Join(m) => ("sink_task_failed".into(), m.clone()),
            Fail::Evidence(m) => ("evidence_unserializable".into(), m.clone()),
        }
    }
}

/// An owned exec as this activation holds it.
struct Held {
    cred: OwnerCredential,
    view: OwnedExec,
    /// The highest seq the supervisor was told to drop by this activation.
    supervisor_acked: i64,
    /// Whether this activation told the supervisor to cancel.
    cancel_sent: bool,
    /// Whether this activation told the supervisor to stop the command of
    /// the sealed hibernation.
    stop_sent: bool,
    /// The Lease generation the per-generation fields above are of: a
    /// resumed generation starts them afresh.
    generation: Generation,
    /// The resume this activation prepared and has not seen committed.
    prepared_resume: Option<String>,
    /// Whether this activation recorded the exec's `eof` input sent, or the
    /// supervisor answered `input_closed` (the command ended or closed its
    /// stdin): no input can be written after either, so the queue is not
    /// read again.
    input_closed: bool,
    /// When this activation last renewed the ownership's heartbeat, on the
    /// process's monotonic clock: it schedules renewals within a long step
    /// ([`RENEW_EVERY_TTL_FRACTION`]); the expiry itself is decided by the
    /// store on the cut.
    renewed_at: Instant,
    /// Whether this activation is done with the exec (released, refused
    /// as stale, or its Lease no longer active): nothing touches it again
    /// and the step forgets it.
    ended: bool,
    /// Whether the exec's last serve ended at a provider call that hit
    /// its bound: its spool is not sampled until a serve succeeds.
    unresponsive: bool,
    /// The `quiesce` attempts of this generation that failed in a way a
    /// retry may mend, and the monotonic instant before which it is not
    /// tried again ([`quiesce_retry_after`]).
    quiesce_failures: u32,
    quiesce_not_before: Option<Instant>,
    /// The serves of this exec that failed in a row (a success resets it):
    /// each failure is counted and reported, but logged at warning level
    /// only at [`lc_core::rules::logs_failure`]'s counts.
    serve_failures: u32,
}

/// Runs a provider call under the bound `after`, naming it `call` in the
/// failure.
async fn bounded<T>(
    call: &'static str,
    after: Duration,
    fut: impl std::future::Future<Output = Result<T, ProviderError>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r.map_err(Fail::Provider),
        Err(_) => Err(Fail::Timeout { call, after }),
    }
}

/// Within one step the gateway renews an exec's heartbeat again once this
/// fraction of the TTL (one third) has passed since the last renewal, before
/// each round of pages and between a round's sink writes and its ACK: a step
/// that works off a backlog of hundreds of fsynced pages can take longer
/// than the TTL, and an owner that renewed only at the start of its step
/// would expire while still serving and be taken over by the next step.
pub const RENEW_EVERY_TTL_FRACTION: u32 = 3;

/// The gateway; see the module docs.
pub struct Gateway {
    store: Arc<dyn GatewayStore>,
    connector: Arc<dyn ProviderConnector>,
    providers: Mutex<BTreeMap<String, Arc<dyn Provider>>>,
    sink: Arc<dyn BlobStore>,
    clock: Arc<dyn Clock>,
    token: OwnerToken,
    options: GatewayOptions,
    crash: Option<(CrashPoint, Arc<dyn FaultHook>)>,
    metrics: Arc<GatewayMetrics>,
    held: Mutex<BTreeMap<ExecId, Held>>,
    /// When the spools were last sampled (monotonic; telemetry only).
    spool_sampled: std::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("options", &self.options)
            .field("crash", &self.crash.as_ref().map(|(p, _)| *p))
            .finish_non_exhaustive()
    }
}

/// A fresh owner token: [`OWNER_TOKEN_BYTES`] bytes from the operating
/// system's random source.
///
/// # Errors
/// [`GatewayError::Random`] when the source fails.
pub fn new_owner_token() -> Result<OwnerToken, GatewayError> {
    let mut bytes = [0u8; OWNER_TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| GatewayError::Random(e.to_string()))?;
    Ok(OwnerToken::from_bytes(bytes))
}

impl Gateway {
    /// A gateway over `store`, reaching providers through `connector`,
    /// writing to `sink`, on `clock`, with a fresh owner token
    /// ([`new_owner_token`]).
    ///
    /// # Errors
    /// [`GatewayError::Options`] for an option outside its bounds,
    /// [`GatewayError::Random`].
    pub fn new(
        store: Arc<dyn GatewayStore>,
        connector: Arc<dyn ProviderConnector>,
        sink: Arc<dyn BlobStore>,
        clock: Arc<dyn Clock>,
        options: GatewayOptions,
    ) -> Result<Gateway, GatewayError> {
        check_heartbeat_ttl(options.heartbeat_ttl).map_err(GatewayError::Options)?;
        for (n, max) in [
            (options.owned_max, OWNED_EXECS_MAX),
            (options.pages_per_step, PAGES_PER_STEP_MAX),
            (options.serve_concurrency, SERVE_CONCURRENCY_MAX),
        ] {
            if !(1..=max).contains(&n) {
                return Err(GatewayError::Options(LcError::InvalidLimit {
                    limit: n,
                    max,
                }));
            }
        }
        let call_max = options.heartbeat_ttl.unsigned_abs() / RENEW_EVERY_TTL_FRACTION;
        if !(PROVIDER_CALL_TIMEOUT_MIN..=call_max).contains(&options.provider_call_timeout) {
            return Err(GatewayError::Options(LcError::InvalidTimeout {
                reason: format!(
                    "the provider call timeout {:?} must be in {PROVIDER_CALL_TIMEOUT_MIN:?}..={call_max:?} (a third of the heartbeat TTL); lower it or raise the TTL",
                    options.provider_call_timeout
                ),
            }));
        }
        if !(options.provider_call_timeout..=QUIESCE_TIMEOUT_MAX).contains(&options.quiesce_timeout)
        {
            return Err(GatewayError::Options(LcError::InvalidTimeout {
                reason: format!(
                    "the quiesce timeout {:?} must be in {:?}..={QUIESCE_TIMEOUT_MAX:?} (from the provider call timeout); raise or lower it",
                    options.quiesce_timeout, options.provider_call_timeout
                ),
            }));
        }
        Ok(Gateway {
            store,
            connector,
            providers: Mutex::new(BTreeMap::new()),
            sink,
            clock,
            token: new_owner_token()?,
            options,
            crash: None,
            metrics: Arc::new(GatewayMetrics::default()),
            held: Mutex::new(BTreeMap::new()),
            spool_sampled: std::sync::Mutex::new(None),
        })
    }

    /// The same gateway calling `hook` when it reaches `point` (see
    /// [`crate::crash`]); `None` disables fault injection.
    pub fn with_crash_point(
        mut self,
        point: Option<CrashPoint>,
        hook: Arc<dyn FaultHook>,
    ) -> Gateway {
        self.crash = point.map(|p| (p, hook));
        self
    }

    /// The gateway's metrics.
    pub fn metrics(&self) -> Arc<GatewayMetrics> {
        Arc::clone(&self.metrics)
    }

    /// The bounds.
    pub fn options(&self) -> GatewayOptions {
        self.options
    }

    /// The execs owned now, by id.
    pub async fn owned(&self) -> Vec<ExecId> {
        self.held.lock().await.keys().copied().collect()
    }

    /// Reads the clock once as a [`CutReading`] (the same conversion the
    /// worker uses).
    ///
    /// # Errors
    /// The clock's error.
    pub async fn reading(&self) -> Result<CutReading, clock::ClockError> {
        let r = self.clock.read().await?;
        Ok(CutReading {
            cut: r.now,
            certain: r.uncertain.is_none(),
            retry_after_s: self.clock.retry_after_secs(),
        })
    }

    fn crash_point(&self, point: CrashPoint) -> Result<(), Fail> {
        match &self.crash {
            Some((p, hook)) if *p == point => {
                tracing::warn!(
                    point = point.as_str(),
                    "fault injection: crash point reached"
                );
                hook.reached(point);
                Err(Fail::Crashed(point))
            }
            _ => Ok(()),
        }
    }

    /// One step; see the module docs. Holds the gateway's state for its
    /// whole duration, so steps never overlap.
    pub async fn step(&self) -> StepReport {
        let mut held = self.held.lock().await;
        let mut report = StepReport::default();
        let at = match self.reading().await {
            Ok(at) => at,
            Err(e) => {
                self.fail(&mut report, None, &Fail::Clock(e));
                report.owned = held.len();
                return report;
            }
        };
        report.at = Some(at);
        self.metrics.step(at.certain);
        self.heartbeat_all(&mut held, at, &mut report).await;
        if at.certain && held.len() < self.options.owned_max {
            let limit = self.options.owned_max - held.len();
            match self
                .store
                .claim(&self.token, at, self.options.heartbeat_ttl, limit)
                .await
            {
                Ok(claimed) => {
                    for view in claimed {
                        self.adopt(&mut held, view, &mut report);
                    }
                }
                Err(e) => self.fail(&mut report, None, &Fail::Store(e)),
            }
        }
        // Serve the execs (a bounded number at once) while the keeper
        // renews the heartbeats of those not being served; each exec sits
        // in its own lock, held by whichever works on it.
        let slots: Vec<(ExecId, Mutex<Held>)> = std::mem::take(&mut *held)
            .into_iter()
            .map(|(id, h)| (id, Mutex::new(h)))
            .collect();
        let (done, done_rx) = watch::channel(false);
        let serving = async {
            self.serve_all(&slots, &mut report).await;
            let _ = done.send(true);
        };
        let ((), kept) = tokio::join!(serving, self.keep_alive(&slots, done_rx));
        report.absorb(kept);
        for (id, slot) in slots {
            let h = slot.into_inner();
            if !h.ended {
                held.insert(id, h);
            }
        }
        report.owned = held.len();
        self.sample_spools(&held).await;
        self.metrics.set_owned(held.len());
        self.metrics.set_pending(
            held.values()
                .map(|h| u64::try_from(h.view.staged_through - h.view.acked_through).unwrap_or(0))
                .sum(),
        );
        log_report(&report);
        report
    }

    /// Serves the owned execs, at most
    /// [`GatewayOptions::serve_concurrency`] at once, started in id order
    /// (see the module docs); an exec the keeper ended meanwhile is
    /// skipped, and none is started once one reached a crash point. Each
    /// exec's counts are added to `report` in id order.
    async fn serve_all(&self, slots: &[(ExecId, Mutex<Held>)], report: &mut StepReport) {
        use futures_util::StreamExt as _;
        let crashed = std::sync::atomic::AtomicBool::new(false);
        let parts = std::sync::Mutex::new(Vec::with_capacity(slots.len()));
        futures_util::stream::iter(slots)
            .for_each_concurrent(self.options.serve_concurrency, |(id, slot)| {
                let (crashed, parts) = (&crashed, &parts);
                async move {
                    if crashed.load(std::sync::atomic::Ordering::SeqCst) {
                        return;
                    }
                    let mut part = StepReport::default();
                    self.serve_one(*id, slot, &mut part).await;
                    if part.crashed.is_some() {
                        crashed.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    parts
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((*id, part));
                }
            })
            .await;
        let mut parts = parts.into_inner().unwrap_or_else(|p| p.into_inner());
        parts.sort_by_key(|(id, _)| *id);
        for (_, part) in parts {
            report.absorb(part);
        }
    }

    /// Serves one exec unless it ended; records the outcome in `report`.
    async fn serve_one(&self, id: ExecId, slot: &Mutex<Held>, report: &mut StepReport) {
        let mut h = slot.lock().await;
        if h.ended {
            return;
        }
        match self.serve(&mut h, report).await {
            Ok(Served::Keep) => {
                h.unresponsive = false;
                h.serve_failures = 0;
            }
            Ok(Served::Released) => h.ended = true,
            Err(Fail::Crashed(p)) => report.crashed = Some(p),
            Err(f) if f.is_stale() => {
                h.ended = true;
                self.stale(report, id, &f);
            }
            Err(f) => {
                if matches!(f, Fail::Timeout { .. }) {
                    h.unresponsive = true;
                    report.provider_timeouts += 1;
                    self.metrics.provider_timeout();
                }
                h.serve_failures = h.serve_failures.saturating_add(1);
                self.fail_in_a_row(report, id, &f, h.serve_failures);
            }
        }
    }

    /// The heartbeat keeper of a step: until `done` turns `true`, every
    /// [`KEEPER_CHECKS_PER_RENEWAL`]th of the renewal interval, renews the
    /// heartbeat of each owned exec that is not being served (its lock is
    /// free), not ended, and last renewed a [`RENEW_EVERY_TTL_FRACTION`]
    /// of the TTL ago. It makes no provider call, so no exec's heartbeat
    /// waits on any exec's provider; the exec being served renews its own
    /// between its calls, each bounded well below the TTL. Each renewal is
    /// a fenced store write judged at a reading taken just before it, and
    /// an exec whose renewal is refused is ended at once, as at the start
    /// of a step. Returns its counts (renewals, refusals, drops, failures).
    async fn keep_alive(
        &self,
        slots: &[(ExecId, Mutex<Held>)],
        mut done: watch::Receiver<bool>,
    ) -> StepReport {
        let mut report = StepReport::default();
        let every = self.renew_every();
        let tick = every / KEEPER_CHECKS_PER_RENEWAL;
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                changed = done.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
            if *done.borrow() {
                break;
            }
            for (id, slot) in slots {
                let Ok(mut h) = slot.try_lock() else { continue };
                if h.ended || h.renewed_at.elapsed() < every {
                    continue;
                }
                self.keep(*id, &mut h, &mut report).await;
            }
        }
        report
    }

    /// One renewal by the keeper; see [`Gateway::keep_alive`].
    async fn keep(&self, id: ExecId, h: &mut Held, report: &mut StepReport) {
        let at = match self.reading().await {
            Ok(at) => at,
            Err(e) => return self.fail(report, Some(id), &Fail::Clock(e)),
        };
        match self
            .store
            .heartbeat(&h.cred, id, at, self.options.heartbeat_ttl)
            .await
        {
            Ok(view) => {
                report.renewals_kept += 1;
                h.view = view;
                h.renewed_at = Instant::now();
                if !keeps(&h.view) {
                    self.forget(id, h, report);
                    h.ended = true;
                }
            }
            Err(e) if matches!(e.code(), "owner_stale" | "owner_expired") => {
                h.ended = true;
                self.stale(report, id, &Fail::Store(e));
            }
            Err(e) if e.code() == "not_found" => {
                h.ended = true;
                report.dropped += 1;
            }
            Err(e) => self.fail(report, Some(id), &Fail::Store(e)),
        }
    }

    /// A [`RENEW_EVERY_TTL_FRACTION`] of the heartbeat TTL.
    fn renew_every(&self) -> Duration {
        self.options.heartbeat_ttl.unsigned_abs() / RENEW_EVERY_TTL_FRACTION
    }

    /// Sums the owned execs' spool occupancy into the metrics, at most every
    /// [`SPOOL_SAMPLE_EVERY`]; a failed or timed-out status request counts
    /// nothing, and an exec whose last serve timed out is not asked.
    async fn sample_spools(&self, held: &BTreeMap<ExecId, Held>) {
        {
            let mut last = self.spool_sampled.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < SPOOL_SAMPLE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let (mut pages, mut bytes) = (0u64, 0u64);
        let after = self.options.provider_call_timeout;
        for h in held.values().filter(|h| !h.unresponsive) {
            let Ok(p) = self.provider(&h.view).await else {
                continue;
            };
            let status = p.spool_status(h.view.lease_id, h.view.lease_generation);
            if let Ok(Some(s)) = bounded("spool_status", after, status).await {
                pages = pages.saturating_add(s.pages);
                bytes = bytes.saturating_add(s.bytes);
            }
        }
        self.metrics.set_spool(pages, bytes);
    }

    fn adopt(&self, held: &mut BTreeMap<ExecId, Held>, view: OwnedExec, report: &mut StepReport) {
        let id = view.ownership.exec_id;
        match view.basis {
            TakeoverBasis::Unowned => {
                report.claimed += 1;
                self.metrics.claim();
            }
            TakeoverBasis::Released | TakeoverBasis::Expired => {
                report.taken_over += 1;
                self.metrics.takeover();
            }
        }
        tracing::info!(
            exec = id.0,
            generation = view.ownership.generation.0,
            fence = view.ownership.fence.0,
            basis = view.basis.as_str(),
            staged_through = view.staged_through,
            acked_through = view.acked_through,
            "exec owned"
        );
        let cred = OwnerCredential {
            token: self.token.clone(),
            generation: view.ownership.generation,
            fence: view.ownership.fence,
        };
        let generation = view.lease_generation;
        held.insert(
            id,
            Held {
                cred,
                view,
                supervisor_acked: 0,
                cancel_sent: false,
                stop_sent: false,
                generation,
                prepared_resume: None,
                input_closed: false,
                renewed_at: Instant::now(),
                ended: false,
                unresponsive: false,
                quiesce_failures: 0,
                serve_failures: 0,
                quiesce_not_before: None,
            },
        );
    }

    async fn heartbeat_all(
        &self,
        held: &mut BTreeMap<ExecId, Held>,
        at: CutReading,
        report: &mut StepReport,
    ) {
        let ids: Vec<ExecId> = held.keys().copied().collect();
        for id in ids {
            let Some(h) = held.get_mut(&id) else { continue };
            match self
                .store
                .heartbeat(&h.cred, id, at, self.options.heartbeat_ttl)
                .await
            {
                Ok(view) => {
                    report.heartbeats += 1;
                    h.view = view;
                    h.renewed_at = Instant::now();
                    if !keeps(&h.view) {
                        self.forget(id, h, report);
                        held.remove(&id);
                    }
                }
                Err(e) if matches!(e.code(), "owner_stale" | "owner_expired") => {
                    held.remove(&id);
                    self.stale(report, id, &Fail::Store(e));
                }
                Err(e) if e.code() == "not_found" => {
                    held.remove(&id);
                    report.dropped += 1;
                }
                Err(e) => self.fail(report, Some(id), &Fail::Store(e)),
            }
        }
    }

    /// Counts and logs an exec this activation stops serving because its
    /// Lease is no longer active and no resume of it is in progress: a
    /// resume in progress whose request vanished was refused (the
    /// provider refused the restore; the refusal is on the intent).
    fn forget(&self, id: ExecId, h: &mut Held, report: &mut StepReport) {
        if let Some(key) = h.prepared_resume.take()
            && h.view.attempt_parked
        {
            report.resumes_refused += 1;
            self.metrics.resume_refused();
            tracing::warn!(exec = id.0, op_key = %key, "the resume's Lease was released unattached (the provider refused the restore); the exec stays parked");
        }
        tracing::info!(exec = id.0, lease_state = %h.view.lease_state, parked = h.view.attempt_parked, "exec's Lease is no longer active and no resume of it is in progress; forgotten");
        report.dropped += 1;
    }

    fn stale(&self, report: &mut StepReport, id: ExecId, f: &Fail) {
        let (code, message) = f.code_message();
        tracing::warn!(exec = id.0, %code, %message, "stale_refused: this gateway no longer owns the exec; forgotten");
        report.stale_refused += 1;
        self.metrics.stale_refused();
    }

    fn fail(&self, report: &mut StepReport, id: Option<ExecId>, f: &Fail) {
        let (code, message) = f.code_message();
        tracing::warn!(exec = id.map(|i| i.0), %code, %message, "gateway step failed");
        self.record_failure(report, id, code, message);
    }

    /// [`Gateway::fail`] for the `consecutive`th failed serve of exec `id`
    /// in a row: counted and reported as every failure is, logged at
    /// warning level only when [`lc_core::rules::logs_failure`] says so
    /// (else at debug level), so an exec failing at every step (its
    /// instance lost, until its Lease expires) cannot flood the log.
    fn fail_in_a_row(&self, report: &mut StepReport, id: ExecId, f: &Fail, consecutive: u32) {
        let (code, message) = f.code_message();
        if lc_core::rules::logs_failure(consecutive) {
            tracing::warn!(
                exec = id.0,
                %code,
                %message,
                consecutive,
                "gateway step failed (logged again at twice as many failures in a row)"
            );
        } else {
            tracing::debug!(exec = id.0, %code, %message, consecutive, "gateway step failed");
        }
        self.record_failure(report, Some(id), code, message);
    }

    /// Counts a failure and reports it in the step's report.
    fn record_failure(
        &self,
        report: &mut StepReport,
        id: Option<ExecId>,
        code: String,
        message: String,
    ) {
        self.metrics.failure();
        report.failures.push(ExecFailure {
            exec_id: id,
            code,
            message,
        });
    }

    async fn provider(&self, view: &OwnedExec) -> Result<Arc<dyn Provider>, Fail> {
        let mut providers = self.providers.lock().await;
        let p = match providers.get(&view.provider_url) {
            Some(p) => Arc::clone(p),
            None => {
                if providers.len() >= PROVIDERS_MAX {
                    return Err(Fail::ProvidersFull);
                }
                let p = bounded(
                    "connect",
                    self.options.provider_call_timeout,
                    self.connector.connect(&view.provider_url),
                )
                .await?;
                providers.insert(view.provider_url.clone(), Arc::clone(&p));
                p
            }
        };
        if *p.id() != view.identity.provider_id {
            return Err(Fail::ProviderMismatch {
                expected: view.identity.provider_id.to_string(),
                actual: p.id().to_string(),
            });
        }
        Ok(p)
    }

    /// Renews `h`'s heartbeat when a [`RENEW_EVERY_TTL_FRACTION`] of the
    /// TTL has passed since its last renewal (on any cut: renewal never
    /// shortens), and takes the store's view of the exec.
    ///
    /// # Errors
    /// The store's refusal: `owner_stale` or `owner_expired` (the caller
    /// forgets the exec), or a storage or clock failure.
    async fn renew_if_due(&self, h: &mut Held, report: &mut StepReport) -> Result<(), Fail> {
        if h.renewed_at.elapsed() < self.renew_every() {
            return Ok(());
        }
        let id = h.view.ownership.exec_id;
        let view = self
            .store
            .heartbeat(
                &h.cred,
                id,
                self.reading().await?,
                self.options.heartbeat_ttl,
            )
            .await?;
        h.view = view;
        h.renewed_at = Instant::now();
        report.renewals_mid_step += 1;
        Ok(())
    }

    async fn serve(&self, h: &mut Held, report: &mut StepReport) -> Result<Served, Fail> {
        // An exec that waited for its turn may be due (the keeper renews
        // it up to a quarter of the interval late).
        self.renew_if_due(h, report).await?;
        if h.generation != h.view.lease_generation {
            // A resumed generation: a new supervisor, nothing told to it.
            h.generation = h.view.lease_generation;
            h.stop_sent = false;
            h.cancel_sent = false;
            h.input_closed = false;
            h.quiesce_failures = 0;
            h.quiesce_not_before = None;
        }
        if h.view.attempt_parked || h.view.lease_state != LeaseState::Active {
            return self.resume(h, report).await;
        }
        let p = self.provider(&h.view).await?;
        let p = p.as_ref();
        let id = h.view.ownership.exec_id;
        let (lease, generation, fence) = (h.view.lease_id, h.view.lease_generation, h.cred.fence);
        let mut budget = self.options.pages_per_step;
        let after = self.options.provider_call_timeout;
        // A sealed hibernation of this generation is acted on unless a
        // cancel came first or the command's terminal page is acked (it
        // ended first: the hibernation stays sealed, never acted on).
        let sealed = h.view.hibernation_step == Some(HibernationStep::Sealed);
        let hibernating = sealed
            && h.view.terminal_acked_seq.is_none()
            && (h.stop_sent || !h.view.cancel_requested);

        // Inputs: a failure here other than a lost ownership, a crash
        // point or a call past its bound is recorded and the pages still
        // move; a call past its bound ends the exec's step, so a
        // supervisor that does not answer costs the step one bound. A
        // hibernating command is told no new input.
        if !hibernating && !h.input_closed && generation_end(&h.view).is_none() {
            match self.deliver_inputs(h, p, report).await {
                Ok(()) => {}
                Err(f @ (Fail::Crashed(_) | Fail::Timeout { .. })) => return Err(f),
                Err(f) if f.is_stale() => return Err(f),
                Err(f) => self.fail(report, Some(id), &f),
            }
        }

        // Stop: the supervisor kills the command and writes the stopped
        // page, which the pages below move like any other.
        if hibernating && !h.stop_sent && h.view.stopped_acked_seq.is_none() {
            let outcome = bounded("stop", after, p.stop(lease, generation, fence)).await?;
            h.stop_sent = true;
            match outcome {
                Some(StopOutcome::Killed) => {
                    report.stops += 1;
                    tracing::info!(
                        exec = id.0,
                        generation = generation.0,
                        "command stopped for hibernation"
                    );
                }
                Some(StopOutcome::AlreadyStopped) | None => {
                    tracing::info!(
                        exec = id.0,
                        generation = generation.0,
                        "command stopped already"
                    );
                }
                Some(StopOutcome::Ended) => {
                    tracing::info!(
                        exec = id.0,
                        generation = generation.0,
                        "the command ended before the stop: its terminal page follows and the hibernation is not acted on"
                    );
                }
            }
            self.crash_point(CrashPoint::AfterStop)?;
        }

        // Pending pages first, re-read from the spool and checked: at most
        // one spool request's worth per step. New pages wait until none is
        // pending, since an ACK result acknowledges every pending page
        // through its seq.
        let limit = budget.min(PAGES_PER_ROUND);
        self.renew_if_due(h, report).await?;
        let pending = self
            .store
            .pending_pages(&h.cred, id, self.reading().await?, limit)
            .await?;
        let more_pending = pending.len() >= limit;
        if let Some(first) = pending.first() {
            let fetched_at = Instant::now();
            let read = spool::pages(p, lease, generation, fence, first.seq - 1, pending.len());
            let spooled = bounded("pages", after, read).await?;
            let mut pages = Vec::with_capacity(pending.len());
            for meta in &pending {
                let page = spooled
                    .iter()
                    .find(|pg| pg.seq() == meta.seq)
                    .ok_or(Fail::Missing(meta.seq))?;
                if !meta.matches(page) {
                    tracing::error!(
                        exec = id.0,
                        seq = meta.seq,
                        "spooled page differs from its committed metadata"
                    );
                    return Err(Fail::Mismatch(meta.seq));
                }
                pages.push(page.clone());
            }
            budget = budget.saturating_sub(pages.len());
            report.pending_finished += pages.len();
            self.complete(h, p, pages, fetched_at, report).await?;
        }

        // Acked in the store, still in the spool (a crash before the
        // supervisor's ack): ack again.
        if h.view.acked_through > h.supervisor_acked {
            let ack = spool::ack(p, lease, generation, fence, h.view.acked_through);
            bounded("ack", after, ack).await?;
            h.supervisor_acked = h.view.acked_through;
            report.supervisor_acks += 1;
        }
        if more_pending {
            return Ok(Served::Keep);
        }

        // New pages, until the page that ends the generation.
        while budget > 0 && generation_end(&h.view).is_none() {
            self.renew_if_due(h, report).await?;
            let max = budget.min(PAGES_PER_ROUND);
            let read = spool::pages(p, lease, generation, fence, h.view.staged_through, max);
            let pages = bounded("pages", after, read).await?;
            if pages.is_empty() {
                break;
            }
            let fetched_at = Instant::now();
            let n = pages.len();
            let metas: Vec<PageMeta> = pages
                .iter()
                .map(|pg| PageMeta::of_page(id, h.view.attempt, pg))
                .collect();
            let staged = self
                .store
                .stage_pages(&h.cred, id, self.reading().await?, &metas)
                .await?;
            report.pages_staged += staged.staged;
            h.view.staged_through = staged.staged_through;
            self.crash_point(CrashPoint::AfterMetadata)?;
            self.complete(h, p, pages, fetched_at, report).await?;
            budget = budget.saturating_sub(n);
            if n < max {
                break;
            }
        }

        // Cancel: the receipt first, then the supervisor.
        if h.view.cancel_requested && !h.cancel_sent && generation_end(&h.view).is_none() {
            let tid = format!("cancel-{}-g{}", h.view.attempt.0, h.cred.generation.0);
            self.store
                .cancel(&h.cred, id, self.reading().await?, &tid)
                .await?;
            bounded("cancel", after, spool::cancel(p, lease, generation, fence)).await?;
            h.cancel_sent = true;
            report.cancels += 1;
            tracing::info!(exec = id.0, "cancel told to the supervisor");
        }

        // Release once the terminal page is acked everywhere.
        if let Some(seq) = h.view.terminal_acked_seq
            && h.supervisor_acked >= seq
        {
            let at = self.reading().await?;
            if !at.certain {
                return Ok(Served::Keep);
            }
            let tid = format!("release-{}", h.view.attempt.0);
            self.store.release(&h.cred, id, at, &tid).await?;
            report.released += 1;
            self.metrics.release();
            tracing::info!(
                exec = id.0,
                terminal_seq = seq,
                "Lease released after its terminal page was acked"
            );
            return Ok(Served::Released);
        }

        // Quiesce once the stopped page is acked everywhere, then commit.
        if let Some(seq) = h.view.stopped_acked_seq
            && sealed
            && h.view.terminal_acked_seq.is_none()
            && h.supervisor_acked >= seq
        {
            self.crash_point(CrashPoint::AfterStoppedAck)?;
            if h.quiesce_not_before.is_some_and(|t| Instant::now() < t) {
                return Ok(Served::Keep);
            }
            let served = self.quiesce(h, p, seq, report).await;
            if let Err(f) = &served
                && f.retries_quiesce()
            {
                h.quiesce_failures = h.quiesce_failures.saturating_add(1);
                let wait = quiesce_retry_after(h.quiesce_failures);
                h.quiesce_not_before = Some(Instant::now() + wait);
                tracing::warn!(
                    exec = id.0,
                    generation = generation.0,
                    failures = h.quiesce_failures,
                    retry_after_ms = wait.as_millis() as u64,
                    "quiesce failed; retried after a wait"
                );
            }
            return served;
        }
        Ok(Served::Keep)
    }

    /// Quiesces the stopped generation (bounded by
    /// [`GatewayOptions::quiesce_timeout`], the heartbeat renewed beside
    /// it) and commits the quiescence on a certain cut; the commit ends
    /// the ownership.
    async fn quiesce(
        &self,
        h: &mut Held,
        p: &dyn Provider,
        stopped_seq: i64,
        report: &mut StepReport,
    ) -> Result<Served, Fail> {
        let id = h.view.ownership.exec_id;
        let (lease, generation, fence) = (h.view.lease_id, h.view.lease_generation, h.cred.fence);
        let bound = self.options.quiesce_timeout;
        let call = tokio::time::timeout(bound, p.quiesce(lease, generation, fence));
        tokio::pin!(call);
        let tick = self.renew_every() / KEEPER_CHECKS_PER_RENEWAL;
        let quiesced = loop {
            tokio::select! {
                r = &mut call => break r,
                () = tokio::time::sleep(tick) => self.renew_if_due(h, report).await?,
            }
        };
        let quiesced = match quiesced {
            Ok(Ok(q)) => q,
            Ok(Err(ProviderError::SnapshotRefused {
                path,
                reason,
                detail,
            })) => {
                let refusal = QuiescenceRefusal {
                    reason,
                    path,
                    message: detail,
                };
                return self.refuse(h, generation, refusal, report).await;
            }
            Ok(Err(e)) => return Err(Fail::Provider(e)),
            Err(_) => {
                return Err(Fail::Timeout {
                    call: "quiesce",
                    after: bound,
                });
            }
        };
        self.crash_point(CrashPoint::AfterQuiesce)?;
        let head = lc_core::Digest::of(&quiesced.manifest);
        let evidence = serde_json::to_value(&quiesced.evidence).map_err(|e| {
            Fail::Evidence(format!("the quiescence evidence does not serialize: {e}"))
        })?;
        let measurement = self.measure(p, lease, generation).await;
        self.renew_if_due(h, report).await?;
        let at = self.reading().await?;
        if !at.certain {
            return Ok(Served::Keep);
        }
        let committed = self
            .store
            .commit_quiescence(
                &h.cred,
                id,
                at,
                generation,
                &quiesced.manifest,
                head,
                &evidence,
                measurement.as_ref(),
            )
            .await;
        match committed {
            Err(e) if measurement.is_some() && e.code() == "evidence_rejected" => {
                // The quiescence may be sound while the measurement is not:
                // the milestone is recorded without it (unknown, never zero).
                tracing::warn!(exec = id.0, generation = generation.0, error = %e, "the measurement was refused; the milestone records no observation");
                self.store
                    .commit_quiescence(
                        &h.cred,
                        id,
                        at,
                        generation,
                        &quiesced.manifest,
                        head,
                        &evidence,
                        None,
                    )
                    .await?;
            }
            other => {
                other?;
            }
        }
        report.hibernated += 1;
        self.metrics.hibernated();
        tracing::info!(
            exec = id.0,
            generation = generation.0,
            stopped_seq,
            head = %head,
            "hibernated: quiescence committed; the reconciler destroys the generation and parks it"
        );
        Ok(Served::Released)
    }

    /// The provider's signed measurement of the quiesced generation (its
    /// accounting kept by the quiescence) for the hibernation's
    /// milestone, bounded by [`GatewayOptions::provider_call_timeout`];
    /// `None` (the milestone's observation stays unknown) when the
    /// provider cannot measure.
    async fn measure(
        &self,
        p: &dyn Provider,
        lease: lc_core::SandboxLeaseId,
        generation: Generation,
    ) -> Option<serde_json::Value> {
        let bound = self.options.provider_call_timeout;
        let measured = match tokio::time::timeout(bound, p.measure(lease, generation)).await {
            Ok(Ok(envelope)) => serde_json::to_value(&envelope).map_err(|e| e.to_string()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {bound:?}")),
        };
        match measured {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(lease = lease.0, generation = generation.0, error = %e, "no measurement of the quiesced generation; its milestone's observation stays unknown");
                None
            }
        }
    }

    /// Records the provider's refusal to snapshot the stopped generation
    /// on a certain cut: the exec ends and its Lease moves to
    /// `release_pending`; the record ends the ownership.
    async fn refuse(
        &self,
        h: &mut Held,
        generation: Generation,
        refusal: QuiescenceRefusal,
        report: &mut StepReport,
    ) -> Result<Served, Fail> {
        let id = h.view.ownership.exec_id;
        self.renew_if_due(h, report).await?;
        let at = self.reading().await?;
        if !at.certain {
            return Ok(Served::Keep);
        }
        self.store
            .refuse_quiescence(&h.cred, id, at, generation, &refusal)
            .await?;
        report.hibernations_refused += 1;
        self.metrics.hibernation_refused();
        tracing::warn!(
            exec = id.0,
            generation = generation.0,
            reason = %refusal.reason,
            path = %refusal.path,
            message = %refusal.message,
            "hibernation refused: the provider cannot snapshot the workspace; the exec ends snapshot_refused and its Lease is released"
        );
        Ok(Served::Released)
    }

    /// The resume of a parked exec (or one whose resume's Lease is not
    /// active yet): prepare the recorded request on a certain cut, wait for
    /// the reconciler's allocation and the attachment, commit. Makes no
    /// provider call.
    async fn resume(&self, h: &mut Held, report: &mut StepReport) -> Result<Served, Fail> {
        let id = h.view.ownership.exec_id;
        if !h.view.attempt_parked {
            // Committed: the reconciler marks the Lease active next.
            h.prepared_resume = None;
            return Ok(if keeps(&h.view) {
                Served::Keep
            } else {
                report.dropped += 1;
                Served::Released
            });
        }
        let Some(key) = h.view.resume_op_key.clone() else {
            self.forget(id, h, report);
            return Ok(Served::Released);
        };
        match h.view.lease_state {
            LeaseState::Released => {
                let at = self.reading().await?;
                if !at.certain {
                    return Ok(Served::Keep);
                }
                let w = self.store.prepare_resume(&h.cred, id, at, &key).await?;
                report.resumes_prepared += 1;
                self.metrics.resume_prepared();
                tracing::info!(exec = id.0, op_key = %key, generation = w.generation.0, lease = w.lease_id.0, "resume prepared");
                h.view.lease_id = w.lease_id;
                h.view.lease_generation = w.generation;
                h.view.lease_state = w.state;
                h.view.lease_attached = w.attached;
                h.prepared_resume = Some(key);
                self.crash_point(CrashPoint::AfterPrepareResume)?;
            }
            LeaseState::Allocating if h.view.lease_attached => {
                self.crash_point(CrashPoint::BeforeCommitResume)?;
                let at = self.reading().await?;
                if !at.certain {
                    return Ok(Served::Keep);
                }
                let r = self.store.commit_resume(&h.cred, id, at, &key).await?;
                report.resumes_committed += 1;
                self.metrics.resume_committed();
                tracing::info!(exec = id.0, op_key = %key, from = r.from_generation.0, to = r.to_generation.0, "resume committed");
                h.view.attempt_parked = false;
                h.prepared_resume = None;
            }
            // Allocating without the attachment yet, or being released.
            _ => {
                if h.prepared_resume.is_none() {
                    h.prepared_resume = Some(key);
                }
            }
        }
        Ok(Served::Keep)
    }

    /// Delivers up to [`INPUTS_PER_STEP`] queued inputs of the exec in seq
    /// order: `send` to the supervisor, then the `send` receipt. Stops at
    /// the first input the supervisor cannot take yet (`input_busy`).
    async fn deliver_inputs(
        &self,
        h: &mut Held,
        p: &dyn Provider,
        report: &mut StepReport,
    ) -> Result<(), Fail> {
        let id = h.view.ownership.exec_id;
        let (lease, generation, fence) = (h.view.lease_id, h.view.lease_generation, h.cred.fence);
        let inputs = self
            .store
            .queued_inputs(&h.cred, id, self.reading().await?, INPUTS_PER_STEP)
            .await?;
        let after = self.options.provider_call_timeout;
        for input in inputs {
            let seq = input.input_seq;
            let len = input.bytes.len() as u64;
            self.renew_if_due(h, report).await?;
            let send = spool::send(p, lease, generation, fence, seq, input.bytes, input.eof);
            let Ok(sent) = tokio::time::timeout(after, send).await else {
                return Err(Fail::Timeout {
                    call: "send",
                    after,
                });
            };
            match sent {
                Ok(_) => {}
                Err(ProviderError::InputRefused { reason, detail }) if reason == "input_closed" => {
                    // Permanent: the command ended or closed its stdin, so
                    // no later input can be written either. The inputs
                    // stay queued; this activation stops offering them.
                    tracing::warn!(exec = id.0, input_seq = seq, %detail, "input_closed: the command's stdin is closed; its queued inputs are not delivered");
                    h.input_closed = true;
                    return Ok(());
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(
                        exec = id.0,
                        input_seq = seq,
                        code = e.code(),
                        "input not taken yet; retried at the next step"
                    );
                    return Ok(());
                }
                Err(e) => return Err(Fail::Provider(e)),
            }
            self.crash_point(CrashPoint::AfterSend)?;
            let tid = format!("send-{}-{seq}-g{}", h.view.attempt.0, h.cred.generation.0);
            self.store
                .record_send(&h.cred, id, self.reading().await?, &tid, seq)
                .await?;
            report.inputs_sent += 1;
            self.metrics.input_sent(len);
            tracing::info!(
                exec = id.0,
                input_seq = seq,
                bytes = len,
                eof = input.eof,
                "input delivered"
            );
            if input.eof {
                h.input_closed = true;
                break;
            }
        }
        Ok(())
    }

    /// Steps 3 to 5 of the page protocol for `pages` (their metadata is
    /// committed): sink, ACK result, supervisor ack.
    async fn complete(
        &self,
        h: &mut Held,
        p: &dyn Provider,
        pages: Vec<Page>,
        fetched_at: Instant,
        report: &mut StepReport,
    ) -> Result<(), Fail> {
        let Some(last) = pages.last() else {
            return Ok(());
        };
        let through = last.seq();
        let terminal = pages
            .iter()
            .find(|pg| pg.kind() == PageKind::Terminal)
            .map(Page::seq);
        let stopped = pages
            .iter()
            .find(|pg| pg.kind() == PageKind::Stopped)
            .map(Page::seq);
        let n = pages.len();
        let bytes: u64 = pages.iter().map(|pg| pg.bytes().len() as u64).sum();
        let sink = Arc::clone(&self.sink);
        let mut writes = tokio::task::spawn_blocking(move || -> Result<usize, BlobError> {
            let mut replaced = 0;
            for pg in &pages {
                let digest = lc_core::Digest(pg.sha256());
                if sink.put(&digest, pg.bytes())? == PutOutcome::Replaced {
                    replaced += 1;
                }
            }
            Ok(replaced)
        });
        // A round of fsynced writes can outlast the TTL on a loaded host:
        // the heartbeat is renewed while they run, as the keeper would.
        // An exec refused meanwhile is abandoned at once; the writes left
        // running only put content-addressed blobs a successor puts again.
        let tick = self.renew_every() / KEEPER_CHECKS_PER_RENEWAL;
        let written = loop {
            tokio::select! {
                r = &mut writes => break r,
                () = tokio::time::sleep(tick) => self.renew_if_due(h, report).await?,
            }
        };
        let replaced = written
            .map_err(|e| Fail::Join(e.to_string()))?
            .map_err(Fail::Sink)?;
        for _ in 0..replaced {
            self.metrics.sink_replaced();
        }
        self.crash_point(CrashPoint::AfterSink)?;
        self.renew_if_due(h, report).await?;
        let id = h.view.ownership.exec_id;
        let tid = format!("ack-{}-{through}", h.view.attempt.0);
        self.store
            .ack_pages(&h.cred, id, self.reading().await?, &tid, through)
            .await?;
        h.view.acked_through = h.view.acked_through.max(through);
        if terminal.is_some() {
            h.view.terminal_acked_seq = terminal;
        }
        if stopped.is_some() {
            h.view.stopped_acked_seq = stopped;
        }
        report.pages_acked += n;
        report.bytes_acked += bytes;
        self.metrics.acked(n as u64, bytes);
        self.crash_point(CrashPoint::AfterAckResult)?;
        self.crash_point(CrashPoint::BeforeSupervisorAck)?;
        let (lease, generation, fence) = (h.view.lease_id, h.view.lease_generation, h.cred.fence);
        let ack = spool::ack(p, lease, generation, fence, through);
        bounded("ack", self.options.provider_call_timeout, ack).await?;
        h.supervisor_acked = h.supervisor_acked.max(through);
        report.supervisor_acks += 1;
        self.metrics.ack_latency(fetched_at.elapsed());
        Ok(())
    }

    /// Steps every `interval` until `shutdown` turns `true` (or its sender
    /// goes away); returns after the step in progress.
    pub async fn run(&self, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(
            owned_max = self.options.owned_max,
            heartbeat_ttl = %self.options.heartbeat_ttl,
            ?interval,
            "gateway started"
        );
        loop {
            if *shutdown.borrow() {
                break;
            }
            let r = self.step().await;
            if let Some(p) = r.crashed {
                tracing::error!(
                    point = p.as_str(),
                    "fault hook returned; stopping the gateway"
                );
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
        tracing::info!("gateway stopped");
    }
}

enum Served {
    Keep,
    /// Done with the exec: its Lease released, its quiescence committed,
    /// or parked with nothing to resume.
    Released,
}

/// Whether an owner keeps serving the exec it sees as `v`: its Lease
/// `active`, or `allocating` (a resume's Lease, before or after the resume
/// commits), or the attempt parked with a resume request to act on.
fn keeps(v: &OwnedExec) -> bool {
    matches!(v.lease_state, LeaseState::Active | LeaseState::Allocating)
        || (v.attempt_parked && v.resume_op_key.is_some())
}

/// The seq of the page that ended the current generation, once acked in
/// the store: its terminal page, or the stopped page of its hibernation.
fn generation_end(v: &OwnedExec) -> Option<i64> {
    v.terminal_acked_seq.or(v.stopped_acked_seq)
}

fn log_report(r: &StepReport) {
    let busy = r.claimed
        + r.taken_over
        + r.stale_refused
        + r.pages_acked
        + r.inputs_sent
        + r.cancels
        + r.released
        + r.dropped
        + r.provider_timeouts
        + r.stops
        + r.hibernated
        + r.hibernations_refused
        + r.resumes_prepared
        + r.resumes_committed
        + r.resumes_refused;
    if busy == 0 {
        tracing::debug!(owned = r.owned, heartbeats = r.heartbeats, "gateway step");
    } else {
        tracing::info!(
            owned = r.owned,
            claimed = r.claimed,
            taken_over = r.taken_over,
            stale_refused = r.stale_refused,
            pending_finished = r.pending_finished,
            pages_acked = r.pages_acked,
            bytes_acked = r.bytes_acked,
            inputs_sent = r.inputs_sent,
            cancels = r.cancels,
            released = r.released,
            provider_timeouts = r.provider_timeouts,
            renewals_kept = r.renewals_kept,
            stops = r.stops,
            hibernated = r.hibernated,
            hibernations_refused = r.hibernations_refused,
            resumes_prepared = r.resumes_prepared,
            resumes_committed = r.resumes_committed,
            resumes_refused = r.resumes_refused,
            "gateway step"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiesce_retries_wait_one_second_doubling_to_a_minute() {
        let waits: Vec<u64> = [0, 1, 2, 3, 4, 5, 6, 7, 8, 17, 18, u32::MAX]
            .iter()
            .map(|&n| quiesce_retry_after(n).as_secs())
            .collect();
        assert_eq!(waits, vec![1, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60]);
    }
}
