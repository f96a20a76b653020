//! The reconciler: a loop around one [`Reconciler::step`].
//!
//! A step reads the clock once (in production the persisted safe-time cut,
//! with its certainty) and asks the store for at most `batch` leases that
//! need action at that reading, each with the action the core planned
//! ([`lc_core::rules::plan_lease_action`]), and claims them for this
//! activation in the same call ([`ReconcileStore::claim_due_work`], one
//! compare-and-set statement for the batch; [`lc_core::claim`]): its own
//! claims are renewed (on any cut, never shortening), free Leases and
//! Leases whose claim a certain cut passed by expiry + grace are taken,
//! and a Lease another worker holds is not returned. So several workers on
//! one database never act on the same Lease at once, and a killed
//! worker's Leases are taken only after expiry + grace on a certain cut;
//! while the cut is uncertain a worker keeps its own Leases and claims
//! unclaimed ones, but takes none from another worker. Every store write on a Lease goes through its claim's view
//! ([`ReconcileStore::claimed`]) and is refused `claim_stale`, changing
//! nothing, once another worker took the Lease (the failure is that
//! lease's, in the report). The `allocate` ones run at most
//! `allocate_concurrency` at a time, beside the others, which run one
//! after another; every provider call is bounded by
//! `provider_call_timeout`. So an instance slow to start (or a provider
//! slow to answer for one lease) holds up neither the other allocations
//! nor the renewals of the step: a call that did not answer in time is the
//! lease's failure `provider_timeout`, retried at the next step, where the
//! provider answers a repeated allocate of the same generation with the
//! instance it already started (or starts it, when the earlier call never
//! handed its command over), never a second one. Then, lease by lease:
//!
//! * `allocate`: the provider allocates the instance and starts the
//!   command, numbering its pages from the Lease's `first_seq` and its
//!   inputs from `first_input_seq` (both continue an earlier generation of
//!   the attempt). A Lease with a `restore_head` (a resume's generation)
//!   passes that snapshot's manifest ([`ReconcileStore::restore_manifest`])
//!   as the allocation's [`lc_provider::Restore`], and the attachment the
//!   provider signs for it is recorded
//!   ([`ReconcileStore::record_attachment`], signature verified by the
//!   store) before anything else; an allocation without the attachment it
//!   owes is a failure (`attachment_missing`), retried. Then the store marks
//!   the lease `active` — except while its attempt is still `parked` (the
//!   owner has not committed the resume yet): that Lease waits, attached
//!   and renewed like a maintained one, and the first step after the
//!   commit marks it active without allocating again. A refusal (the
//!   instance cannot start: an unknown runtime, a failed start, a fenced
//!   generation, a shape or command the provider cannot take, a snapshot
//!   the provider cannot restore: `restore_failed`, `snapshot_refused`)
//!   moves the lease to `release_pending` with `start_failed` on the
//!   provider's proof that the command was never sent, and its code goes
//!   into the report ([`StepReport::start_refusals`]); a resume's Lease
//!   released so leaves its attempt parked on its head, so a bad snapshot
//!   is tried once per resume, never again by itself. An error retrying
//!   can cure ([`ProviderError::is_transient`]: the provider unreachable,
//!   its state or the supervisor failing) and a refused credential (this
//!   worker's configuration, not the instance's fault) are retried at the
//!   next step instead ([`retried`]).
//! * `maintain`: the Lease and its Reservation are renewed when their
//!   expiry is within `renew_ahead` of the cut (on any reading: a renewal
//!   never shortens, `max(current, cut + ttl)`), once the provider
//!   confirms that the instance still exists (a lost instance's Lease is
//!   left to expire). Output is not the
//!   reconciler's: the exec's owning gateway (`lc-gateway`) moves the pages
//!   from the spool into the sink and the store, and releases the Lease
//!   once the terminal page is acknowledged.
//! * `begin_release`: cancel, timeout or expiry (the last two only on a
//!   certain cut, which the plan already checked) move the lease to
//!   `release_pending`. An exec whose terminal page is acknowledged
//!   (`exited`) is left to its gateway's release, the only one that knows
//!   the page is in the sink, and so is the cancel of an exec whose Lease
//!   is `active` (its gateway commits the cancel, kills the command and
//!   releases once the signal's terminal page is acked); until then their
//!   Lease is maintained like any other. A cancel before the Lease is
//!   active is released here.
//! * `destroy`: the Reservation is renewed first when its expiry is
//!   within `renew_ahead` of the cut (so the grant never reaches its
//!   reclaim boundary while the proof waits); the provider first measures
//!   the instance from its own accounting (cost and side effects, signed)
//!   and the store records the measurement, which never stops the destroy:
//!   a provider that cannot measure leaves the observation absent, never
//!   zero (`unmeasured`); then the provider destroys the
//!   generation's instance and returns signed evidence; it is retried
//!   every step, also while the cut is uncertain. Only on a certain reading,
//!   taken after the destroy returned (not the step's own), does the store
//!   commit the release with that evidence (verifying its signature), which returns
//!   the Reservation's units exactly once; while uncertain the step counts
//!   it as deferred and nothing is released. A release of a generation
//!   whose hibernation is quiesced (or of a resume's Lease whose resume
//!   never committed) parks the attempt instead of ending the exec: the
//!   units return all the same, and the step counts it as `parked`, apart
//!   from the terminal `released`.
//!
//! Finally, on a certain reading only: the store seals the hibernations
//! due at that cut (an exec idle past its `idle_ttl_ms`, or past its
//! timeout with `on_timeout = hibernate`), at most `hibernations_batch` per
//! step ([`ReconcileStore::due_hibernations`]; the owning gateway stops,
//! quiesces and commits them, and the `destroy` above parks them); a
//! bounded batch of operation keys gets its terminal receipt and a bounded
//! batch of due keys is deleted, and at most `purge_batch` items are
//! purged ([`ReconcileStore::purge_due`]: deleted workspaces and outputs
//! whose grace a certain cut passed, terminal execs whose retention it
//! passed). Nothing is sealed or purged on an uncertain cut.
//!
//! Providers are [`lc_provider::Provider`]s, called directly (the
//! bubblewrap provider in process, `lc_provider::HttpProvider` over
//! loopback): the reconciler turns the store's [`LeaseWork`] into an
//! [`AllocateRequest`] itself.
//!
//! A failure on one lease is recorded in the report and does not stop the
//! others: the next step retries from what the store says. Every store
//! method is replay-safe, so a worker killed at any point and restarted (or
//! several workers at once) neither loses nor doubles anything.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clock::Clock;
use jiff::SignedDuration;
use lc_core::claim::{CLAIM_HOLDER_BYTES, ClaimHolder, ClaimedWork};
use lc_core::rules::{FailureCounts, LIST_LIMIT_MAX};
use lc_core::store::ReconcileStore;
use lc_core::{
    Command, CutReading, Generation, HibernationReason, HibernationStep, LcError, LeaseAction,
    LeaseState, LeaseWork, ProviderId, SandboxLeaseId, Shape, TerminalReason,
};
use lc_provider::{AllocateRequest, Provider, ProviderError, Restore};
use tokio::sync::watch;

/// The default batch: leases handled per step, the store's listing bound.
/// Every live lease is due at every step (renewal), so the batch
/// bounds the live leases one worker serves.
pub const BATCH_DEFAULT: usize = LIST_LIMIT_MAX;

/// Operation keys given their receipt per step.
pub const RECEIPTS_BATCH_DEFAULT: usize = 500;

/// Operation keys deleted per step.
pub const GC_BATCH_DEFAULT: usize = 500;

/// Hibernations sealed (and unfinished ones listed) per step.
pub const HIBERNATIONS_BATCH_DEFAULT: usize = 100;

/// Renew when the expiry is this close to the cut: half of the default
/// Lease TTL (60 s), so one missed step still leaves half a TTL.
pub const RENEW_AHEAD_DEFAULT: SignedDuration = SignedDuration::from_secs(30);

/// Allocations run at once within a step by default: enough that a few
/// instances slow to start leave the others' starts unaffected, few enough
/// that one step does not start a burst of sandboxes on a small host.
pub const ALLOCATE_CONCURRENCY_DEFAULT: usize = 8;

/// The largest accepted [`ReconcilerOptions::allocate_concurrency`]: each
/// allocation in flight is a sandbox being built on the provider's host.
pub const ALLOCATE_CONCURRENCY_MAX: usize = 64;

/// The default bound on each provider call of the reconciler: above the
/// bubblewrap provider's start wait (10 s) with room for a restore, and
/// at most the default renew-ahead, so a Lease renewed in a step whose
/// allocations all time out still has time left.
pub const PROVIDER_CALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// The smallest accepted [`ReconcilerOptions::provider_call_timeout`]:
/// below it a healthy provider's answer could not arrive in time.
pub const PROVIDER_CALL_TIMEOUT_MIN: Duration = Duration::from_millis(10);

/// The largest accepted [`ReconcilerOptions::provider_call_timeout`]: a
/// step waits that long at most for a provider, ten minutes.
pub const PROVIDER_CALL_TIMEOUT_MAX: Duration = Duration::from_secs(600);

/// The most Lease generations whose failures in a row a reconciler
/// counts at once: four steps' worth of the largest batch.
pub const FAILURE_COUNTS_MAX: usize = 4 * LIST_LIMIT_MAX;

/// The reconciler's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcilerOptions {
    /// Leases per step, `1..=`[`LIST_LIMIT_MAX`].
    pub batch: usize,
    /// Items purged per step (deletions past their grace, execs past
    /// their retention), `1..=`[`LIST_LIMIT_MAX`]; default
    /// [`lc_core::deletion::PURGE_BATCH_DEFAULT`].
    pub purge_batch: usize,
    /// Renew when `expiry - cut <= renew_ahead`.
    pub renew_ahead: SignedDuration,
    /// Receipts per step, `1..=`[`LIST_LIMIT_MAX`].
    pub receipts_batch: usize,
    /// Operation keys deleted per step, `1..=`[`LIST_LIMIT_MAX`].
    pub gc_batch: usize,
    /// Hibernations sealed per step (and unfinished ones listed),
    /// `1..=`[`LIST_LIMIT_MAX`].
    pub hibernations_batch: usize,
    /// Allocations in flight at once within a step,
    /// `1..=`[`ALLOCATE_CONCURRENCY_MAX`] (see [`ALLOCATE_CONCURRENCY_DEFAULT`]).
    pub allocate_concurrency: usize,
    /// The bound on each provider call (allocate, prove not sent, spool
    /// status, destroy), from [`PROVIDER_CALL_TIMEOUT_MIN`] to
    /// [`PROVIDER_CALL_TIMEOUT_MAX`] (see [`PROVIDER_CALL_TIMEOUT_DEFAULT`]).
    /// It must exceed the provider's own start wait, or every start times
    /// out and is retried.
    pub provider_call_timeout: Duration,
}

impl Default for ReconcilerOptions {
    fn default() -> Self {
        ReconcilerOptions {
            batch: BATCH_DEFAULT,
            purge_batch: lc_core::deletion::PURGE_BATCH_DEFAULT,
            renew_ahead: RENEW_AHEAD_DEFAULT,
            receipts_batch: RECEIPTS_BATCH_DEFAULT,
            gc_batch: GC_BATCH_DEFAULT,
            hibernations_batch: HIBERNATIONS_BATCH_DEFAULT,
            allocate_concurrency: ALLOCATE_CONCURRENCY_DEFAULT,
            provider_call_timeout: PROVIDER_CALL_TIMEOUT_DEFAULT,
        }
    }
}

/// One lease (or housekeeping call) that failed in a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseFailure {
    /// The lease, `None` for receipts and GC.
    pub lease_id: Option<SandboxLeaseId>,
    /// What was being done (`allocate`, `maintain`, `begin_release`,
    /// `destroy`, `receipts`, `gc`, `hibernations`; in
    /// [`StepReport::start_refusals`]: `allocate` or `restore`).
    pub action: &'static str,
    /// The stable code (the store's or the provider's, or
    /// `provider_timeout` for a provider call that did not answer within
    /// [`ReconcilerOptions::provider_call_timeout`]).
    pub code: String,
    /// A message for the log.
    pub message: String,
}

/// What one step did. Counts are of this step only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepReport {
    /// The reading the step acted on.
    pub at: CutReading,
    /// Leases the store returned as due.
    pub leases_seen: usize,
    /// Instances allocated and marked active (a resume's Lease counts when
    /// it is marked active, also when it was allocated at an earlier step).
    pub allocated: usize,
    /// Provider attachments of restored workspaces recorded on their Lease.
    pub attached: usize,
    /// Resume Leases allocated and attached whose attempt is still parked
    /// (the owner has not committed the resume): not marked active yet.
    pub awaiting_resume: usize,
    /// Leases moved to `release_pending` because their instance could not start.
    pub start_failed: usize,
    /// Of `start_failed`, the resume Leases whose snapshot the provider
    /// could not restore (`restore_failed`, `snapshot_refused`).
    pub restore_failed: usize,
    /// Why each `start_failed` Lease could not start: action `restore`
    /// for a snapshot the provider refused, else `allocate`, with the
    /// refusal's code and message.
    pub start_refusals: Vec<LeaseFailure>,
    /// Leases renewed.
    pub renewed: usize,
    /// Leases moved to `release_pending` (cancelled, expired; not start failures).
    pub releases_begun: usize,
    /// Leases whose exec exited, left to its gateway's release (renewed
    /// like any maintained Lease meanwhile).
    pub exited_left_to_gateway: usize,
    /// Active Leases whose exec a client cancelled, left to its gateway's
    /// cancel and release (renewed meanwhile).
    pub cancels_left_to_gateway: usize,
    /// Terminal measurements taken before a destroy and recorded (the
    /// store keeps an earlier one that this one would lose values of).
    pub measured: usize,
    /// Destroys that went ahead without a recorded measurement: the
    /// provider could not measure (it died, or the instance is gone), or
    /// the store refused the measurement. The observation stays absent.
    pub unmeasured: usize,
    /// Destroys the providers confirmed with evidence.
    pub destroyed: usize,
    /// Releases committed now that ended their exec (capacity returned).
    pub released: usize,
    /// Releases committed now that parked their attempt (a hibernated
    /// generation, or a resume that never committed; capacity returned).
    pub parked: usize,
    /// Releases the store found already committed (replays).
    pub released_replay: usize,
    /// Units returned to tenants by this step's releases.
    pub units_returned: i64,
    /// Destroys proven while the cut was uncertain: not released yet.
    pub release_deferred: usize,
    /// Operation keys given their terminal receipt.
    pub receipts_attached: usize,
    /// Operation keys deleted.
    pub operations_deleted: usize,
    /// What the purge did.
    pub purged: lc_core::deletion::PurgeReport,
    /// Hibernations (reason `idle` or `deadline`) the store sealed at this
    /// step's cut. Two steps on the same cut count the same seals.
    pub hibernations_sealed: usize,
    /// Hibernations sealed or quiesced and not yet parked, as listed at
    /// this step (at most `hibernations_batch`): their owners' work.
    pub hibernations_unfinished: usize,
    /// What failed (at most one per lease, plus receipts and GC).
    pub failures: Vec<LeaseFailure>,
}

impl StepReport {
    fn new(at: CutReading) -> StepReport {
        StepReport {
            at,
            leases_seen: 0,
            allocated: 0,
            attached: 0,
            awaiting_resume: 0,
            start_failed: 0,
            restore_failed: 0,
            start_refusals: Vec::new(),
            renewed: 0,
            releases_begun: 0,
            exited_left_to_gateway: 0,
            cancels_left_to_gateway: 0,
            measured: 0,
            unmeasured: 0,
            destroyed: 0,
            released: 0,
            parked: 0,
            released_replay: 0,
            units_returned: 0,
            release_deferred: 0,
            receipts_attached: 0,
            operations_deleted: 0,
            purged: lc_core::deletion::PurgeReport::default(),
            hibernations_sealed: 0,
            hibernations_unfinished: 0,
            failures: Vec::new(),
        }
    }
}

impl StepReport {
    /// Adds the counts and lists of `other` (a report of the same reading)
    /// to this one.
    fn absorb(&mut self, other: StepReport) {
        let StepReport {
            at: _,
            leases_seen,
            allocated,
            attached,
            awaiting_resume,
            start_failed,
            restore_failed,
            start_refusals,
            renewed,
            releases_begun,
            exited_left_to_gateway,
            cancels_left_to_gateway,
            measured,
            unmeasured,
            destroyed,
            released,
            parked,
            released_replay,
            units_returned,
            release_deferred,
            receipts_attached,
            operations_deleted,
            purged,
            hibernations_sealed,
            hibernations_unfinished,
            failures,
        } = other;
        self.leases_seen += leases_seen;
        self.allocated += allocated;
        self.attached += attached;
        self.awaiting_resume += awaiting_resume;
        self.start_failed += start_failed;
        self.restore_failed += restore_failed;
        self.start_refusals.extend(start_refusals);
        self.renewed += renewed;
        self.releases_begun += releases_begun;
        self.exited_left_to_gateway += exited_left_to_gateway;
        self.cancels_left_to_gateway += cancels_left_to_gateway;
        self.measured += measured;
        self.unmeasured += unmeasured;
        self.destroyed += destroyed;
        self.released += released;
        self.parked += parked;
        self.released_replay += released_replay;
        self.units_returned += units_returned;
        self.release_deferred += release_deferred;
        self.receipts_attached += receipts_attached;
        self.operations_deleted += operations_deleted;
        self.purged.workspaces_purged += purged.workspaces_purged;
        self.purged.outputs_purged += purged.outputs_purged;
        self.purged.rows_purged += purged.rows_purged;
        self.purged.execs_purged += purged.execs_purged;
        self.hibernations_sealed += hibernations_sealed;
        self.hibernations_unfinished += hibernations_unfinished;
        self.failures.extend(failures);
    }
}

/// Why a whole step failed (nothing was done).
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The clock could not be read.
    #[error("clock: {0}")]
    Clock(#[from] clock::ClockError),
    /// The store could not list due work.
    #[error("store: {0}")]
    Store(#[from] LcError),
}

impl StepError {
    /// A stable code.
    pub fn code(&self) -> &str {
        match self {
            StepError::Clock(_) => "clock_unavailable",
            StepError::Store(e) => e.code(),
        }
    }
}

/// Why one lease's handling stopped.
enum Fail {
    Store(LcError),
    Provider(ProviderError),
    UnknownProvider(ProviderId),
    /// The provider's evidence envelope did not serialize as JSON.
    Evidence(serde_json::Error),
    /// A restoring allocation came back without its signed attachment.
    AttachmentMissing,
    /// A provider call did not answer within the bound.
    Timeout {
        /// The call (`allocate`, `prove_not_sent`, `spool_status`, `measure`,
        /// `destroy`).
        call: &'static str,
        /// The bound it did not answer within.
        after: Duration,
    },
}

impl Fail {
    /// The stable code and the message of a failure.
    fn code_and_message(self) -> (String, String) {
        match self {
            Fail::Store(e) => (e.code().to_owned(), e.to_string()),
            Fail::Provider(e) => (e.code().to_owned(), e.to_string()),
            Fail::Evidence(e) => ("invalid_evidence".to_owned(), e.to_string()),
            Fail::AttachmentMissing => (
                "attachment_missing".to_owned(),
                "the provider allocated a restored workspace without signing its attachment; retried at the next step".to_owned(),
            ),
            Fail::UnknownProvider(id) => (
                "provider_unknown".to_owned(),
                format!("this worker has no provider {id}"),
            ),
            Fail::Timeout { call, after } => (
                "provider_timeout".to_owned(),
                format!(
                    "the provider's {call} call did not answer within {after:?}; the lease is handled again at the next step"
                ),
            ),
    }
    }
}

/// `fut`, a provider call named `call`, bounded by `after`.
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

/// Whether an allocate that failed with `e` is retried at the next step
/// rather than taken as the instance's start failure: an error retrying
/// can cure ([`ProviderError::is_transient`]), or a refused credential,
/// which is this worker's configuration and not the instance's fault.
pub fn retried(e: &ProviderError) -> bool {
    e.is_transient() || matches!(e, ProviderError::Unauthorized)
}

/// The provider's request for `w` (restoring `restore`, the canonical
/// manifest of `w.restore_head`, when given), or why the store's record of
/// it is not one a provider can start (a shape or command that no longer
/// parses).
fn allocate_request(w: &LeaseWork, restore: Option<Vec<u8>>) -> Result<AllocateRequest, LcError> {
    Ok(AllocateRequest {
        lease_id: w.lease_id,
        generation: w.generation,
        exec_id: w.exec_id,
        attempt: w.attempt,
        runtime: w.runtime,
        shape: Shape::by_name(&w.shape)?,
        command: Command::new(w.command.clone())?,
        workspace_id: w.workspace_id,
        stdin_open: w.stdin_open,
        first_seq: w.first_seq,
        first_input_seq: w.first_input_seq,
        restore: restore.map(|manifest| Restore { manifest }),
    })
}

/// The reconciler; see the module docs.
#[derive(Clone)]
pub struct Reconciler {
    store: Arc<dyn ReconcileStore>,
    /// The steps of each Lease generation that failed in a row (a success
    /// removes it): every failure is reported, but logged at warning level
    /// only at [`lc_core::rules::logs_failure`]'s counts. At most
    /// [`FAILURE_COUNTS_MAX`] entries (then it starts afresh: a count
    /// lost only logs a warning again).
    failures_in_a_row: Arc<std::sync::Mutex<FailureCounts<(SandboxLeaseId, Generation)>>>,
    /// This activation's claim holder id, drawn at [`Reconciler::new`].
    holder: ClaimHolder,
    providers: BTreeMap<ProviderId, Arc<dyn Provider>>,
    clock: Arc<dyn Clock>,
    options: ReconcilerOptions,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Reconciler {
    /// A reconciler over `store`, driving `providers` (by their ids), on
    /// `clock`, as a new worker activation: its claim holder id is 16
    /// bytes from the operating system's random source (logged as
    /// `holder_sha256`, the digest `GET /v1/claims` shows).
    ///
    /// # Errors
    /// [`LcError::StorageFailure`] when the random source fails;
    /// [`LcError::InvalidLimit`] when a batch is outside `1..=`[`LIST_LIMIT_MAX`]
    /// or the allocate concurrency outside `1..=`[`ALLOCATE_CONCURRENCY_MAX`];
    /// [`LcError::InvalidTimeout`] when the provider call timeout is outside
    /// [`PROVIDER_CALL_TIMEOUT_MIN`]`..=`[`PROVIDER_CALL_TIMEOUT_MAX`].
    pub fn new(
        store: Arc<dyn ReconcileStore>,
        providers: Vec<Arc<dyn Provider>>,
        clock: Arc<dyn Clock>,
        options: ReconcilerOptions,
    ) -> Result<Reconciler, LcError> {
        for (n, max) in [
            (options.batch, LIST_LIMIT_MAX),
            (options.purge_batch, LIST_LIMIT_MAX),
            (options.receipts_batch, LIST_LIMIT_MAX),
            (options.gc_batch, LIST_LIMIT_MAX),
            (options.hibernations_batch, LIST_LIMIT_MAX),
            (options.allocate_concurrency, ALLOCATE_CONCURRENCY_MAX),
        ] {
            if !(1..=max).contains(&n) {
                return Err(LcError::InvalidLimit { limit: n, max });
            }
        }
        if !(PROVIDER_CALL_TIMEOUT_MIN..=PROVIDER_CALL_TIMEOUT_MAX)
            .contains(&options.provider_call_timeout)
        {
            return Err(LcError::InvalidTimeout {
                reason: format!(
                    "the provider call timeout {:?} must be in {PROVIDER_CALL_TIMEOUT_MIN:?}..={PROVIDER_CALL_TIMEOUT_MAX:?}; above the provider's start wait",
                    options.provider_call_timeout
                ),
            });
        }
        let providers = providers.into_iter().map(|p| (p.id().clone(), p)).collect();
        let mut bytes = [0u8; CLAIM_HOLDER_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| LcError::StorageFailure {
            message: format!("the operating system's random source failed: {e}"),
        })?;
        let holder = ClaimHolder::from_bytes(bytes);
        tracing::info!(holder_sha256 = %holder.sha256().to_hex(), "reconciler activation");
        Ok(Reconciler {
            store,
            failures_in_a_row: Arc::new(std::sync::Mutex::new(FailureCounts::new(
                FAILURE_COUNTS_MAX,
            ))),
            holder,
            providers,
            clock,
            options,
        })
    }

    /// The bounds.
    pub fn options(&self) -> ReconcilerOptions {
        self.options
    }

    /// This activation's claim holder id: every Lease a step acts on is
    /// claimed under it, and every store write on that Lease presents it.
    pub fn holder(&self) -> ClaimHolder {
        self.holder
    }

    /// The same reconciler acting as the activation `holder` (one worker
    /// process's reconcilers that share its claims, e.g. over stores with
    /// other settings).
    pub fn with_holder(self, holder: ClaimHolder) -> Reconciler {
        Reconciler { holder, ..self }
    }

    /// Reads the clock once as a [`CutReading`].
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

    /// One step; see the module docs.
    ///
    /// # Errors
    /// [`StepError`] when the clock or the due-work query fails (nothing
    /// was done); failures of single leases are in the report.
    pub async fn step(&self) -> Result<StepReport, StepError> {
        let at = self.reading().await?;
        let work = self
            .store
            .claim_due_work(&self.holder, at, self.options.batch)
            .await?;
        let mut report = StepReport::new(at);
        report.leases_seen = work.len();
        let (allocations, others): (Vec<&ClaimedWork>, Vec<&ClaimedWork>) = work
            .iter()
            .partition(|c| matches!(c.work.action, LeaseAction::Allocate));
        // Allocations in flight at once, bounded, in their listed order;
        // the other actions one after another beside them.
        let allocating = async {
            use futures_util::StreamExt as _;
            // Made first (none runs before it is polled), so the stream
            // holds futures, not a closure over borrowed work.
            let calls: Vec<_> = allocations
                .into_iter()
                .map(|w| self.handle_one(w, at))
                .collect();
            futures_util::stream::iter(calls)
                .buffered(self.options.allocate_concurrency)
                .collect::<Vec<StepReport>>()
                .await
        };
        let rest = async {
            let mut rest = StepReport::new(at);
            for w in others {
                rest.absorb(self.handle_one(w, at).await);
            }
            rest
        };
        let (allocated, rest) = tokio::join!(allocating, rest);
        for r in allocated {
            report.absorb(r);
        }
        report.absorb(rest);
        if at.certain {
            match self
                .store
                .due_hibernations(at, self.options.hibernations_batch)
                .await
            {
                Ok(hs) => {
                    report.hibernations_unfinished = hs.len();
                    report.hibernations_sealed = hs
                        .iter()
                        .filter(|h| {
                            h.step == HibernationStep::Sealed
                                && h.sealed_cut == at.cut
                                && h.reason != HibernationReason::Requested
                        })
                        .count();
                }
                Err(e) => report
                    .failures
                    .push(housekeeping_failure("hibernations", &e)),
            }
            match self
                .store
                .attach_receipts(at, self.options.receipts_batch)
                .await
            {
                Ok(n) => report.receipts_attached = n,
                Err(e) => report.failures.push(housekeeping_failure("receipts", &e)),
            }
            match self.store.gc_operations(at, self.options.gc_batch).await {
                Ok(n) => report.operations_deleted = n,
                Err(e) => report.failures.push(housekeeping_failure("gc", &e)),
            }
            match self.store.purge_due(at, self.options.purge_batch).await {
                Ok(p) => report.purged = p,
                Err(e) => report.failures.push(housekeeping_failure("purge", &e)),
            }
        }
        log_report(&report);
        Ok(report)
    }

    /// Handles one lease; what it did (a failure included) as a report of
    /// its own, with no lease counted as seen.
    /// Every store write goes through the claim's view, so it is refused
    /// (`claim_stale`, nothing changed) once another worker took the Lease.
    async fn handle_one(&self, claimed: &ClaimedWork, at: CutReading) -> StepReport {
        let mut report = StepReport::new(at);
        let w = &claimed.work;
        let store = self.store.claimed(claimed.claim);
        let action = action_name(w.action);
        let outcome = self.handle(&*store, w, at, &mut report).await;
        let consecutive = self.count_failure(w, outcome.is_err());
        if let Err(f) = outcome {
            let (code, message) = f.code_and_message();
            if lc_core::rules::logs_failure(consecutive) {
                tracing::warn!(
                    lease = w.lease_id.0,
                    generation = w.generation.0,
                    action,
                    %code,
                    %message,
                    consecutive,
                    "lease step failed (logged again at twice as many failures in a row)"
                );
            } else {
                tracing::debug!(lease = w.lease_id.0, generation = w.generation.0, action, %code, %message, consecutive, "lease step failed");
            }
            report.failures.push(LeaseFailure {
                lease_id: Some(w.lease_id),
                action,
                code,
                message,
            });
        }
        report
    }

    /// Records whether the step of `w`'s generation `failed`; returns its
    /// failures in a row (0 after a success).
    fn count_failure(&self, w: &LeaseWork, failed: bool) -> u32 {
        self.failures_in_a_row
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record((w.lease_id, w.generation), failed)
    }

    fn provider(&self, w: &LeaseWork) -> Result<&Arc<dyn Provider>, Fail> {
        self.providers
            .get(&w.provider_id)
            .ok_or_else(|| Fail::UnknownProvider(w.provider_id.clone()))
    }

    async fn handle(
        &self,
        store: &dyn ReconcileStore,
        w: &LeaseWork,
        at: CutReading,
        report: &mut StepReport,
    ) -> Result<(), Fail> {
        match w.action {
            LeaseAction::Allocate => self.allocate(store, w, at, report).await?,
            LeaseAction::Maintain => self.maintain(store, w, at, report).await?,
            LeaseAction::BeginRelease(TerminalReason::Exited) => {
                // The gateway releases it once the terminal page is in the
                // sink; until then the Lease must not run out.
                report.exited_left_to_gateway += 1;
                self.maintain(store, w, at, report).await?;
            }
            LeaseAction::BeginRelease(TerminalReason::Cancelled)
                if w.state == LeaseState::Active =>
            {
                // The owning gateway commits the cancel receipt, stops the
                // command and releases once its terminal page is acked.
                report.cancels_left_to_gateway += 1;
                self.maintain(store, w, at, report).await?;
            }
            LeaseAction::BeginRelease(reason) => {
                store
                    .begin_release(w.lease_id, w.generation, reason, at)
                    .await?;
                report.releases_begun += 1;
            }
            LeaseAction::Destroy => {
                // The Reservation stays renewed while the destroy is being
                // proven (on any cut, never shortening), so its grant cannot
                // reach its reclaim boundary before the units return.
                if w.reservation_expiry.duration_since(at.cut) <= self.options.renew_ahead {
                    store.renew(w.lease_id, w.generation, at).await?;
                    report.renewed += 1;
                }
                let provider = self.provider(w)?;
                self.measure(store, w, at, provider, report).await;
                let envelope = bounded(
                    "destroy",
                    self.options.provider_call_timeout,
                    provider.destroy(w.lease_id, w.generation),
                )
                .await?;
                let evidence = serde_json::to_value(&envelope).map_err(Fail::Evidence)?;
                report.destroyed += 1;
                // The release is judged on a reading taken after the
                // instance is gone, never on the step's: a step paused
                // between its reading and this point (a stopped worker)
                // would otherwise commit on a cut that was certain long
                // before the destroy. A clock that cannot be read defers
                // like an uncertain one.
                let proven = match self.reading().await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(lease = w.lease_id.0, error = %e, "no reading after the destroy; the release waits for the next step");
                        report.release_deferred += 1;
                        return Ok(());
                    }
                };
                if !proven.certain {
                    report.release_deferred += 1;
                    return Ok(());
                }
                let outcome = store
                    .commit_release(w.lease_id, w.generation, &evidence, proven)
                    .await?;
                if outcome.replay {
                    report.released_replay += 1;
                } else {
                    if outcome.parked {
                        report.parked += 1;
                    } else {
                        report.released += 1;
                    }
                    report.units_returned += outcome.units_returned;
                }
            }
        }
        Ok(())
    }

    /// The terminal measurement of `w`'s instance, taken before its
    /// destroy while its accounting still exists, and recorded. Nothing
    /// here stops the destroy: a provider that cannot measure (dead, or
    /// the instance already gone) or a refused measurement leaves the
    /// observation absent, never zero, and is counted as `unmeasured`.
    async fn measure(
        &self,
        store: &dyn ReconcileStore,
        w: &LeaseWork,
        at: CutReading,
        provider: &Arc<dyn Provider>,
        report: &mut StepReport,
    ) {
        let measured = async {
            let envelope = bounded(
                "measure",
                self.options.provider_call_timeout,
                provider.measure(w.lease_id, w.generation),
            )
            .await?;
            let evidence = serde_json::to_value(&envelope).map_err(Fail::Evidence)?;
            store
                .record_measurement(w.lease_id, w.generation, &evidence, at)
                .await?;
            Ok::<(), Fail>(())
        }
        .await;
        match measured {
            Ok(()) => report.measured += 1,
            Err(f) => {
                let (code, message) = f.code_and_message();
                tracing::warn!(lease = w.lease_id.0, generation = w.generation.0, %code, %message, "no terminal measurement; the observation stays absent");
                report.unmeasured += 1;
            }
        }
    }

    /// The `allocate` action; see the module docs.
    async fn allocate(
        &self,
        store: &dyn ReconcileStore,
        w: &LeaseWork,
        at: CutReading,
        report: &mut StepReport,
    ) -> Result<(), Fail> {
        let provider = self.provider(w)?;
        if w.attached {
            // Allocated and attached at an earlier step (the provider
            // signs an attachment only for a started instance).
            return self.activate(store, w, at, report).await;
        }
        let restore = match w.restore_head {
            Some(_) => Some(store.restore_manifest(w.lease_id, w.generation).await?),
            None => None,
        };
        // Why the instance cannot start, if it cannot.
        let refusal = match allocate_request(w, restore) {
            Err(e) => Err((e.code().to_owned(), e.to_string())),
            Ok(req) => match bounded(
                "allocate",
                self.options.provider_call_timeout,
                provider.allocate(req),
            )
            .await
            {
                Ok(allocation) => Ok(allocation),
                Err(Fail::Provider(e)) if !retried(&e) => Err((e.code().to_owned(), e.to_string())),
                // Unanswered or curable: retried at the next step, where
                // the provider answers with what this call started.
                Err(f) => return Err(f),
            },
        };
        match refusal {
            Ok(allocation) => {
                match allocation.attachment {
                    Some(envelope) => {
                        let evidence = serde_json::to_value(&envelope).map_err(Fail::Evidence)?;
                        store
                            .record_attachment(w.lease_id, w.generation, &evidence, at)
                            .await?;
                        report.attached += 1;
                    }
                    None if w.restore_head.is_some() => return Err(Fail::AttachmentMissing),
                    None => {}
                }
                self.activate(store, w, at, report).await
            }
            Err((code, message)) => {
                // The snapshot, not the instance, is what the provider refused.
                let restore_refused = w.restore_head.is_some()
                    && matches!(code.as_str(), "restore_failed" | "snapshot_refused");
                tracing::warn!(lease = w.lease_id.0, generation = w.generation.0, restore_refused, %code, %message, "instance could not start");
                // Released only on the provider's proof that the command
                // never reached a supervisor (which also fences the
                // generation); `command_sent` leaves the lease to its
                // expiry, destroy and proof. A resume's Lease released so
                // leaves its attempt parked.
                let proof = bounded(
                    "prove_not_sent",
                    self.options.provider_call_timeout,
                    provider.prove_not_sent(w.lease_id, w.generation),
                )
                .await?;
                let evidence = serde_json::to_value(&proof).map_err(Fail::Evidence)?;
                if restore_refused {
                    let refusal = lc_core::hibernate::ResumeRefusal {
                        code: code.clone(),
                        message: message.clone(),
                    };
                    store
                        .refuse_restore(w.lease_id, w.generation, &evidence, at, &refusal)
                        .await?;
                } else {
                    store
                        .begin_release_not_sent(w.lease_id, w.generation, &evidence, at)
                        .await?;
                }
                report.start_failed += 1;
                if restore_refused {
                    report.restore_failed += 1;
                }
                report.start_refusals.push(LeaseFailure {
                    lease_id: Some(w.lease_id),
                    action: if restore_refused {
                        "restore"
                    } else {
                        "allocate"
                    },
                    code,
                    message,
                });
                Ok(())
            }
        }
    }

    /// Marks an allocated Lease `active`, unless its attempt is still
    /// parked (a resume not committed yet): then it is maintained and
    /// waits for the next step.
    async fn activate(
        &self,
        store: &dyn ReconcileStore,
        w: &LeaseWork,
        at: CutReading,
        report: &mut StepReport,
    ) -> Result<(), Fail> {
        if w.attempt_parked {
            report.awaiting_resume += 1;
            return self.maintain(store, w, at, report).await;
        }
        store.mark_active(w.lease_id, w.generation, at).await?;
        report.allocated += 1;
        Ok(())
    }

    /// Renews the Lease and its Reservation when the Lease's expiry is
    /// within `renew_ahead` of the cut, once the provider confirms that the
    /// instance's supervisor still holds its spool: a lost instance
    /// (`no_instance`, `instance_lost`) or an unreachable provider is not
    /// renewed, so its Lease expires on a certain cut and is released.
    async fn maintain(
        &self,
        store: &dyn ReconcileStore,
        w: &LeaseWork,
        at: CutReading,
        report: &mut StepReport,
    ) -> Result<(), Fail> {
        if w.expiry.duration_since(at.cut) <= self.options.renew_ahead {
            bounded(
                "spool_status",
                self.options.provider_call_timeout,
                self.provider(w)?.spool_status(w.lease_id, w.generation),
            )
            .await?;
            store.renew(w.lease_id, w.generation, at).await?;
            report.renewed += 1;
        }
        Ok(())
    }

    /// Steps every `interval` until `shutdown` turns `true` (or its sender
    /// goes away); returns after the step in progress. One step per tick:
    /// the due leases include every live one (each needs renewal), so
    /// stepping again at once would only repeat the batch.
    pub async fn run(&self, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(
            batch = self.options.batch,
            allocate_concurrency = self.options.allocate_concurrency,
            provider_call_timeout = ?self.options.provider_call_timeout,
            ?interval,
            "reconciler started"
        );
        loop {
            if *shutdown.borrow() {
                break;
            }
            if let Err(e) = self.step().await {
                tracing::warn!(code = e.code(), error = %e, "reconciler step failed");
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
        tracing::info!("reconciler stopped");
    }
}

fn action_name(a: LeaseAction) -> &'static str {
    match a {
        LeaseAction::Allocate => "allocate",
        LeaseAction::Maintain => "maintain",
        LeaseAction::BeginRelease(_) => "begin_release",
        LeaseAction::Destroy => "destroy",
    }
}

fn housekeeping_failure(action: &'static str, e: &LcError) -> LeaseFailure {
    tracing::warn!(action, code = e.code(), error = %e, "reconciler housekeeping failed");
    LeaseFailure {
        lease_id: None,
        action,
        code: e.code().to_owned(),
        message: e.to_string(),
    }
}

fn log_report(r: &StepReport) {
    let busy = r.allocated
        + r.attached
        + r.start_failed
        + r.releases_begun
        + r.destroyed
        + r.released
        + r.parked
        + r.hibernations_sealed
        + r.purged.workspaces_purged
        + r.purged.outputs_purged
        + r.purged.execs_purged;
    if busy == 0 {
        tracing::debug!(cut = %r.at.cut, certain = r.at.certain, leases = r.leases_seen, "reconciler step");
    } else {
        tracing::info!(
            cut = %r.at.cut,
            certain = r.at.certain,
            leases = r.leases_seen,
            allocated = r.allocated,
            attached = r.attached,
            awaiting_resume = r.awaiting_resume,
            start_failed = r.start_failed,
            restore_failed = r.restore_failed,
            releases_begun = r.releases_begun,
            measured = r.measured,
            unmeasured = r.unmeasured,
            destroyed = r.destroyed,
            released = r.released,
            parked = r.parked,
            hibernations_sealed = r.hibernations_sealed,
            hibernations_unfinished = r.hibernations_unfinished,
            workspaces_purged = r.purged.workspaces_purged,
            outputs_purged = r.purged.outputs_purged,
            execs_purged = r.purged.execs_purged,
            units_returned = r.units_returned,
            deferred = r.release_deferred,
            "reconciler step"
        );
    }
}

/// The lease and generation of a work item, for logs and tests.
pub fn lease_key(w: &LeaseWork) -> (SandboxLeaseId, Generation) {
    (w.lease_id, w.generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_instance_faults_are_start_failures() {
        let retried_errors = [
            ProviderError::Unauthorized,
            ProviderError::Unreachable { detail: "x".into() },
            ProviderError::DestroyIncomplete { detail: "x".into() },
            ProviderError::SupervisorUnavailable { detail: "x".into() },
            ProviderError::Io { detail: "x".into() },
        ];
        for e in &retried_errors {
            assert!(retried(e), "{e:?}");
        }
        let refusals = [
            ProviderError::StartFailed {
                detail: "no sh".into(),
            },
            ProviderError::UnknownRuntime {
                digest: "00".into(),
            },
            ProviderError::Fenced {
                lease_id: 1,
                generation: 1,
                fenced_through: 1,
            },
            ProviderError::AllocationConflict {
                lease_id: 1,
                generation: 1,
            },
            ProviderError::InvalidRequest { detail: "x".into() },
        ];
        for e in &refusals {
            assert!(!retried(e), "{e:?}");
        }
    }
}
