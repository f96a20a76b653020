//! [`LcStore`]: Little Compute's store on PostgreSQL, implementing
//! [`ControlStore`], [`ReconcileStore`] and [`GatewayStore`].
//!
//! # Design
//!
//! Every method is one transaction through [`pgkit::transact`] (bounded
//! retry of serialization failures and deadlocks) on the pool of a Tollgate
//! [`PostgresStore`], so a Reservation is a Tollgate grant written by
//! `tollgate_pg::ops` in the same transaction as the exec, attempt and
//! Lease rows: no grant exists without its attempt or the reverse. The
//! pool runs on the safe expiry cut (`tollgate.clock = 'safe-cut'`) and
//! declares the recorded grant policy, as Tollgate's guards demand.
//!
//! Time comes only from the caller's [`CutReading`]. Each mutating
//! transaction first reads the persisted cut and refuses a reading ahead
//! of it (`invalid_cut_reading`) or, with no cut at all, any mutation
//! (`time_uncertain`); the rules of `lc_core::rules` and `lc_core::opkey`
//! then decide, and this module applies their result. Tollgate
//! capabilities are derived from the key and the grant's id whenever a
//! renewal or release needs one, never stored.
//!
//! Operation keys: the key row is inserted first (`ON CONFLICT DO
//! NOTHING`, so a concurrent first use waits for the other to commit and
//! then replays it); the operation's result is written in the same
//! transaction, which is its terminal transition: the floor is the
//! reading's cut.
//!
//! Exec ownership ([`GatewayStore`]): a takeover locks the exact exec row
//! (`FOR UPDATE`, so of racing takeovers one wins and the others then find
//! its ownership live); a claim skips exec rows another claimer holds
//! (`SKIP LOCKED`) and re-decides each by the rule once it holds the
//! ownership row. Every fenced write locks the ownership row and checks
//! the caller in the same transaction as the write; transitions insert an
//! immutable receipt under their id, and a replay is decided by
//! `lc_core::owner::plan_transition` against the stored receipt.
//!
//! Input for a command's stdin (`lc_core::input`): `send_input` locks the
//! exec row, so each input's seq and the queue bound are decided one at a
//! time; `record_send` locks the ownership row like every fenced write and
//! marks the lowest queued input sent with its `send` receipt.
//!
//! Failure modes: a refusal or a database error rolls the whole
//! transaction back, Tollgate's part included, so a failed operation
//! changes nothing; sequence numbers it drew are skipped.

use std::time::Duration;

use async_trait::async_trait;
use ed25519_dalek::VerifyingKey;
use jiff::{SignedDuration, Timestamp};
use lc_core::approval::{
    self, ApprovalDecision, ApprovalPolicy, ApprovalStart, ApprovalsPage, ApproverKind,
};
use lc_core::claim::{
    self, ClaimCredential, ClaimHolder, ClaimItem, ClaimKind, ClaimPlan, ClaimRecord, ClaimedWork,
};
use lc_core::deletion::{self, DeletePlan, DeletedItem, DeletionRecord, PurgeReport};
use lc_core::evidence::{self, Envelope, Expected};
use lc_core::hibernate::{
    self, AttachmentExpected, HibernationRecord, HibernationView, QuiescenceExpected,
    QuiescenceRefusal, ResumeIntent, ResumeReceipt, ResumeRefusal, ResumeView, SnapshotMeta,
    WorkspaceRecord,
};
use lc_core::input::{self, InputRecord};
use lc_core::observation::{AttemptObservation, Milestone, MilestoneRecord, MilestoneSource};
use lc_core::owner::{
    self, OwnedExec, OwnerCredential, OwnerGeneration, OwnerToken, Ownership, PageMeta,
    StageReport, StoredPage, TakeoverBasis, TransitionKind, TransitionPlan, TransitionReceipt,
};
use lc_core::rate::AdmissionRate;
use lc_core::rules::{self, LeaseView, Step};
use lc_core::token::{MintedToken, TokenId, TokenRecord, TokenScope};
use lc_core::{
    AppendReport, AttemptNo, AttemptState, Command, ControlStore, CutReading, Digest, ExecId,
    ExecRecord, ExecRequest, ExecState, ExpiryCause, GatewayStore, Generation, HibernationReason,
    HibernationStep, LcError, LeaseAction, LeaseState, LeaseWork, OnTimeout, OpScope, OperationKey,
    OperationRecord, OutputPage, PageKind, Provider, ProviderId, ReconcileStore, ReleaseOutcome,
    ReservationState, Runtime, SandboxLeaseId, Shape, Tenant, TenantId, TerminalReason, opkey,
};
use pgkit::{OpCounters, TxFuture};
use safetime::DeadlineInventory;
use sqlx::{PgConnection, PgPool};
use tollgate::{
    AccountId, AcquireRequest, Allocator, CapabilityKey, GrantPolicy, LeaseId, SuppliedTime,
};
use tollgate_pg::{PostgresStore, StoreOptions};

use crate::error::{Fail, from_failure, from_storage};
use crate::persistence::{self as db, CutState, LeaseRow, NewExec, NewOperation};

/// The settings of an [`LcStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LcConfig {
    /// A sandbox Lease's TTL, renewed by the reconciler (default 60 s).
    pub lease_ttl: SignedDuration,
    /// The TTL asked for a Reservation's Tollgate grant at admission and
    /// each renewal (clamped by Tollgate to the grant policy's `max_ttl`;
    /// default 10 min). Longer than the Lease's, so a Reservation outlives
    /// a Lease whose destroy is still being proven.
    pub reservation_ttl: SignedDuration,
    /// The declared TTL of operation keys (default 24 h; at most the
    /// horizon).
    pub operation_ttl: SignedDuration,
    /// The grace between a deletion of a workspace or output and its
    /// purge (default [`deletion::DELETION_GRACE_DEFAULT`], 7 days; at
    /// most [`deletion::DELETION_GRACE_MAX`] and the horizon).
    pub deletion_grace: SignedDuration,
    /// How long a terminal exec's records are retained after its terminal
    /// cut (default [`deletion::RETENTION_DEFAULT`], 30 days; at most
    /// [`deletion::RETENTION_MAX`] and the horizon).
    pub retention: SignedDuration,
    /// Each tenant's admission rate (default
    /// [`lc_core::rate::DEFAULT`]: 600 per minute).
    pub admission_rate: AdmissionRate,
    /// The most pooled connections (default 10).
    pub max_connections: u32,
    /// How long to wait for a pooled connection (default 10 s).
    pub acquire_timeout: Duration,
    /// The longest TTL a scoped token may be minted with (default
    /// [`lc_core::token::TOKEN_TTL_MAX_DEFAULT`], 30 days; at most
    /// [`lc_core::token::TOKEN_TTL_MAX_CEILING`]); every mint's deadline
    /// must also fit `cut + horizon`.
    pub token_ttl_max: SignedDuration,
    /// A worker's claim TTL: a take or renewal sets the claim's expiry to
    /// `cut + claim_ttl` (renewals never shorten it); default
    /// [`claim::CLAIM_TTL_DEFAULT`], within
    /// [`claim::CLAIM_TTL_MIN`]`..=`[`claim::CLAIM_TTL_MAX`] and the horizon.
    pub claim_ttl: SignedDuration,
    /// How long past its expiry a claim stays its holder's before another
    /// worker may take it on a certain cut; default
    /// [`claim::CLAIM_GRACE_DEFAULT`], at most [`claim::CLAIM_GRACE_MAX`].
    pub claim_grace: SignedDuration,
    /// The validity of an approval whose approver names none (default
    /// [`lc_core::approval::APPROVAL_VALIDITY_DEFAULT`]: 15 min; at most
    /// [`lc_core::approval::APPROVAL_VALIDITY_MAX`]).
    pub approval_validity: SignedDuration,
}

impl Default for LcConfig {
    fn default() -> LcConfig {
        LcConfig {
            lease_ttl: rules::LEASE_TTL_DEFAULT,
            reservation_ttl: SignedDuration::from_mins(10),
            operation_ttl: opkey::OPERATION_TTL_DEFAULT,
            deletion_grace: deletion::DELETION_GRACE_DEFAULT,
            retention: deletion::RETENTION_DEFAULT,
            admission_rate: lc_core::rate::DEFAULT,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            token_ttl_max: lc_core::token::TOKEN_TTL_MAX_DEFAULT,
            claim_ttl: claim::CLAIM_TTL_DEFAULT,
            claim_grace: claim::CLAIM_GRACE_DEFAULT,
            approval_validity: approval::APPROVAL_VALIDITY_DEFAULT,
        }
    }
}

impl LcConfig {
    /// The longest deadline of every kind this configuration lets the
    /// control plane admit, with Tollgate's grant `policy` (the
    /// Reservations' grants): the settings this store is configured with
    /// (Lease, Reservation, claim and operation-key TTLs, the claim and
    /// deletion graces, the retention, the rate window, the token TTL's
    /// maximum), and for what a request or another process chooses up to
    /// a fixed maximum (an owner's heartbeat TTL, an approval's validity,
    /// an exec's timeout and idle TTL) that maximum.
    pub fn deadline_inventory(&self, policy: &GrantPolicy) -> DeadlineInventory {
        let ms = |v: u64| SignedDuration::from_millis(i64::try_from(v).unwrap_or(i64::MAX));
        DeadlineInventory {
            grant_ttl_max: policy.max_ttl(),
            reclaim_grace: policy.reclaim_grace(),
            reservation_ttl: self.reservation_ttl.min(policy.max_ttl()),
            sandbox_lease_ttl: self.lease_ttl,
            owner_heartbeat_ttl_max: lc_core::owner::HEARTBEAT_TTL_MAX,
            claim_ttl_max: self.claim_ttl,
            claim_grace: self.claim_grace,
            approval_validity_max: lc_core::approval::APPROVAL_VALIDITY_MAX,
            token_ttl_max: self.token_ttl_max,
            rate_window_max: self.admission_rate.window(),
            deletion_grace: self.deletion_grace,
            retention: self.retention,
            operation_key_ttl_max: self.operation_ttl,
            exec_timeout_max: ms(rules::TIMEOUT_MS_MAX),
            idle_ttl_max: ms(lc_core::hibernate::IDLE_TTL_MS_MAX),
        }
    }
}

/// The longest provider URL, in bytes.
pub const PROVIDER_URL_BYTES_MAX: usize = 2048;

/// The store's operations, each with its transaction counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Op {
    /// `create_tenant`.
    CreateTenant,
    /// `deposit`.
    Deposit,
    /// Reads (tenant, exec, output, operation, runtimes).
    Read,
    /// `register_runtime`.
    RegisterRuntime,
    /// `admit_exec`.
    Admit,
    /// `cancel`.
    Cancel,
    /// `register_provider`.
    RegisterProvider,
    /// `due_work`.
    DueWork,
    /// `mark_active`, `begin_release`.
    Transition,
    /// `renew`.
    Renew,
    /// `append_pages`.
    AppendPages,
    /// `commit_release`.
    CommitRelease,
    /// `attach_receipts`, `gc_operations`.
    OperationKeys,
    /// `claim`, `take_over`.
    Claim,
    /// `heartbeat`.
    Heartbeat,
    /// `stage_pages`, `pending_pages`.
    StagePages,
    /// The owner's transitions: `ack_pages`, `cancel` (gateway),
    /// `release`.
    OwnerTransition,
    /// Input for a command's stdin: `send_input`, `queued_inputs`,
    /// `record_send`.
    Input,
    /// Hibernation and resume: `request_hibernation`, `due_hibernations`,
    /// `commit_quiescence`, `request_resume`, `prepare_resume`,
    /// `record_attachment`, `commit_resume`, and the workspace reads.
    Hibernation,
    /// Scoped tokens: `mint_token`, `revoke_token` (their reads are
    /// [`Op::Read`]).
    Token,
    /// Deletion grace and retention: `delete_item`, `undelete_item`,
    /// `purge_due`.
    Deletion,
    /// Approvals: `set_approval_policy`, `approve`, `deny`, `approvals`.
    Approval,
    /// `record_measurement`.
    Measurement,
}

const OPS: [Op; 23] = [
    Op::CreateTenant,
    Op::Deposit,
    Op::Read,
    Op::RegisterRuntime,
    Op::Admit,
    Op::Cancel,
    Op::RegisterProvider,
    Op::DueWork,
    Op::Transition,
    Op::Renew,
    Op::AppendPages,
    Op::CommitRelease,
    Op::OperationKeys,
    Op::Claim,
    Op::Heartbeat,
    Op::StagePages,
    Op::OwnerTransition,
    Op::Input,
    Op::Hibernation,
    Op::Token,
    Op::Deletion,
    Op::Approval,
    Op::Measurement,
];

impl pgkit::OpLabel for Op {
    fn as_str(&self) -> &'static str {
        match self {
            Op::CreateTenant => "create_tenant",
            Op::Deposit => "deposit",
            Op::Read => "read",
            Op::RegisterRuntime => "register_runtime",
            Op::Admit => "admit_exec",
            Op::Cancel => "cancel",
            Op::RegisterProvider => "register_provider",
            Op::DueWork => "due_work",
            Op::Transition => "transition",
            Op::Renew => "renew",
            Op::AppendPages => "append_pages",
            Op::CommitRelease => "commit_release",
            Op::OperationKeys => "operation_keys",
            Op::Claim => "claim",
            Op::Heartbeat => "heartbeat",
            Op::StagePages => "stage_pages",
            Op::OwnerTransition => "owner_transition",
            Op::Input => "input",
            Op::Hibernation => "hibernation",
            Op::Token => "token",
            Op::Deletion => "deletion",
            Op::Approval => "approval",
            Op::Measurement => "measurement",
        }
    }
}

/// Little Compute's PostgreSQL store; see the module docs.
pub struct LcStore {
    tollgate: PostgresStore,
    key: CapabilityKey,
    store_id: tollgate::StoreId,
    policy: GrantPolicy,
    config: LcConfig,
    counters: Vec<OpCounters>,
}

impl std::fmt::Debug for LcStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LcStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LcStore {
    /// The release of a Lease whose command was never sent, with the
    /// provider's `refusal` of a resume's restore recorded on its request
    /// when given (see `begin_release_not_sent` and `refuse_restore`).
    async fn release_not_sent(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
        refusal: Option<&ResumeRefusal>,
    ) -> Result<LeaseWork, LcError> {
        let args = BeginReleaseNotSentArgs {
            claim,
            lease,
            generation,
            evidence,
            at,
            store: self,
            refusal,
        };
        self.run(Op::Transition, &args, |c, a| {
            Box::pin(begin_release_not_sent_tx(c, a))
        })
        .await
    }

    /// Connects to the migrated database at `url` ([`crate::migrate`]
    /// first): a Tollgate store with grant policy `policy` and capability
    /// key `key` on the safe expiry cut, then Little Compute's checks.
    ///
    /// # Errors
    /// `storage_unavailable` when the database cannot be reached;
    /// `storage_failure` for an unparsable URL, pending or unknown
    /// migrations in any line, a recorded grant policy other than
    /// `policy`, or a configuration whose operation TTL is not positive or
    /// whose deletion grace or retention is outside its bounds.
    pub async fn connect(
        url: &str,
        policy: GrantPolicy,
        key: CapabilityKey,
        config: LcConfig,
    ) -> Result<LcStore, LcError> {
        let options = StoreOptions {
            max_connections: config.max_connections,
            acquire_timeout: config.acquire_timeout,
            on_safe_cut: true,
        };
        let tollgate = PostgresStore::connect_with(url, policy, key.clone(), options)
            .await
            .map_err(from_storage)?;
        LcStore::from_tollgate(tollgate, key, config).await
    }

    /// Builds the store on an open Tollgate store whose capability key is
    /// `key` (the same key, or every renewal and release is refused) and
    /// whose pool runs on the cut. Checks every migration line of
    /// [`crate::schema`].
    ///
    /// # Errors
    /// As [`LcStore::connect`].
    pub async fn from_tollgate(
        tollgate: PostgresStore,
        key: CapabilityKey,
        config: LcConfig,
    ) -> Result<LcStore, LcError> {
        crate::schema()
            .check(tollgate.pool())
            .await
            .map_err(from_storage)?;
        if config.operation_ttl <= SignedDuration::ZERO
            || config.lease_ttl <= SignedDuration::ZERO
            || config.reservation_ttl <= SignedDuration::ZERO
        {
            return Err(LcError::StorageFailure {
                message: "the store's TTLs must be positive".into(),
            });
        }
        lc_core::token::check_ttl_max(config.token_ttl_max).map_err(|e| {
            LcError::StorageFailure {
                message: format!("the store's token_ttl_max: {e}"),
            }
        })?;
        claim::check_claim_ttl(config.claim_ttl)?;
        claim::check_claim_grace(config.claim_grace)?;
        for checked in [
            deletion::check_grace(config.deletion_grace),
            deletion::check_retention(config.retention),
        ] {
            checked.map_err(|e| LcError::StorageFailure {
                message: e.to_string(),
            })?;
        }
        if let Err(e) = approval::check_default_validity(config.approval_validity) {
            return Err(LcError::StorageFailure {
                message: e.to_string(),
            });
        }
        let store_id = tollgate.store_id();
        let policy = tollgate.policy();
        Ok(LcStore {
            tollgate,
            key,
            store_id,
            policy,
            config,
            counters: OPS.iter().map(|op| OpCounters::of(*op)).collect(),
        })
    }

    /// Checks, before a process admits deadlines, that the longest
    /// deadline of each of `kinds` this store's settings allow
    /// ([`LcConfig::deadline_inventory`]) fits the horizon in force and the
    /// newest sealed one ([`safetime_pg::check_bounds`]). The control plane
    /// passes every kind ([`DeadlineInventory::KINDS`]); a gateway or a
    /// worker the kinds it issues itself. Returns the policy in force.
    ///
    /// # Errors
    /// [`safetime_pg::HorizonCheckError::TooShort`] naming the first kind
    /// that does not fit and the policy; `Read` when the safe-time tables
    /// cannot be read.
    pub async fn check_horizon(
        &self,
        kinds: &[safetime::DeadlineKind],
    ) -> Result<safetime::HorizonPolicy, safetime_pg::HorizonCheckError> {
        let bounds: Vec<safetime::DeadlineBound> = self
            .config
            .deadline_inventory(&self.policy)
            .bounds()
            .into_iter()
            .filter(|b| kinds.contains(&b.kind()))
            .collect();
        safetime_pg::check_bounds(self.pool(), &bounds).await
    }

    /// The Tollgate store underneath (for audits and operator queries).
    pub fn tollgate(&self) -> &PostgresStore {
        &self.tollgate
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        self.tollgate.pool()
    }

    /// The settings.
    pub fn config(&self) -> &LcConfig {
        &self.config
    }

    /// The transaction counters of `op`.
    pub fn op_metrics(&self, op: Op) -> pgkit::OpMetrics {
        self.counters[op as usize].snapshot()
    }

    async fn run<A, T, F>(&self, op: Op, args: &A, body: F) -> Result<T, LcError>
    where
        A: Sync + ?Sized,
        F: for<'c> Fn(&'c mut PgConnection, &'c A) -> TxFuture<'c, T, Fail>,
    {
        pgkit::transact(self.pool(), &self.counters[op as usize], args, body)
            .await
            .map_err(from_failure)
    }

    /// The capability of this store's Tollgate grant `tollgate_lease_id`,
    /// derived as Tollgate derives it (never stored).
    fn capability(&self, tollgate_lease_id: i64) -> tollgate::Capability {
        self.key.derive(self.store_id, LeaseId(tollgate_lease_id))
    }
}

// ---------------------------------------------------------------------------
// Shared steps.

/// Reads the persisted cut and checks `at` against it: a cut must exist
/// (else `time_uncertain`) and `at.cut` must not be later
/// (`invalid_cut_reading`).
async fn check_reading(conn: &mut PgConnection, at: CutReading) -> Result<CutState, Fail> {
    let Some(state) = db::read_cut_state(conn).await? else {
        return Err(LcError::TimeUncertain {
            retry_after_s: at.retry_after_s.max(1),
        }
        .into());
    };
    if at.cut > state.cut {
        return Err(LcError::InvalidCutReading {
            cut: at.cut,
            persisted: Some(state.cut),
        }
        .into());
    }
    Ok(state)
}

fn horizon(state: &CutState) -> SignedDuration {
    SignedDuration::from_millis(state.horizon_ms)
}

/// What the first step of an operation found.
enum Begun<T> {
    /// A fresh key: the operation runs.
    Fresh,
    /// A replay: the recorded result.
    Replay(T),
}

/// Inserts the operation key (or finds it): a replay with the same digest
/// returns the recorded result, another digest is `idempotency_conflict`.
async fn begin_op<T: serde::de::DeserializeOwned>(
    conn: &mut PgConnection,
    store: &LcStore,
    scope: OpScope,
    op: &OperationKey,
    kind: &str,
    at: CutReading,
    cut: &CutState,
) -> Result<Begun<T>, Fail> {
    let ttl = opkey::check_ttl(store.config.operation_ttl, horizon(cut))?;
    let floor = opkey::terminal_floor(at);
    let gc = opkey::gc_at(at.cut, floor, ttl).ok_or_else(|| LcError::InvalidTimeout {
        reason: "the operation key's GC instant is not representable".into(),
    })?;
    let ttl_ns = i64::try_from(ttl.as_nanos()).map_err(|_| LcError::InvalidTimeout {
        reason: "the operation key's ttl does not fit in i64 nanoseconds".into(),
    })?;
    let inserted = db::insert_operation(
        conn,
        &NewOperation {
            scope,
            key: op.key(),
            kind,
            request_sha256: op.request_sha256(),
            created: at.cut,
            floor,
            ttl_ns,
            gc,
        },
    )
    .await?;
    if inserted {
        return Ok(Begun::Fresh);
    }
    let rec = db::read_operation(conn, scope, op.key())
        .await?
        .ok_or_else(|| crate::error::corrupt("an operation key vanished while read"))?;
    if rec.request_sha256 != op.request_sha256() || rec.kind != kind {
        return Err(LcError::IdempotencyConflict {
            key: op.key().to_owned(),
        }
        .into());
    }
    let result = serde_json::from_value(rec.result)
        .map_err(|e| crate::error::corrupt(format!("recorded result of {kind}: {e}")))?;
    Ok(Begun::Replay(result))
}

/// Records the operation's result: its terminal transition.
async fn finish_op<T: serde::Serialize>(
    conn: &mut PgConnection,
    scope: OpScope,
    op: &OperationKey,
    result: &T,
) -> Result<(), Fail> {
    let value = serde_json::to_value(result)
        .map_err(|e| crate::error::corrupt(format!("result does not serialize: {e}")))?;
    db::set_operation_result(conn, scope, op.key(), &value).await
}

fn fenced(lease: &LeaseRow, generation: Generation) -> Fail {
    LcError::Fenced {
        lease_id: lease.lease_id,
        generation,
        reason: format!("the lease's generation is {}", lease.generation),
    }
    .into()
}

/// Locks the lease and checks the generation.
async fn lock_generation(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    generation: Generation,
) -> Result<LeaseRow, Fail> {
    let row = db::lock_lease(conn, lease)
        .await?
        .ok_or_else(|| LcError::not_found("lease", lease))?;
    if row.generation != generation {
        return Err(fenced(&row, generation));
    }
    Ok(row)
}

/// The reconciler's view of a locked lease, as [`LeaseWork`].
async fn work_of(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    at: CutReading,
) -> Result<LeaseWork, Fail> {
    let row = db::due_lease(conn, lease)
        .await?
        .ok_or_else(|| LcError::not_found("lease", lease))?;
    Ok(to_work(row, at))
}

/// Whether the due Lease `d` is an approved exec's unstarted first Lease
/// (attempt 1, generation 1, `allocating`, nothing attached): the one the
/// start gate decides. Its approval's `valid_until` then.
fn gated_start(d: &db::DueRow) -> Option<Timestamp> {
    let unstarted = d.lease.state == LeaseState::Allocating
        && d.lease.attachment.is_none()
        && d.lease.attempt == AttemptNo(1)
        && d.lease.generation == Generation(1);
    d.approval_valid_until.filter(|_| unstarted)
}

/// The reconciler's action for the due Lease `d` at `at`: the plan of
/// [`rules::plan_lease_action`], then the start gate of an approved exec
/// ([`approval::plan_gated_start`]). `None`: nothing to do now (a released
/// Lease, or an unstarted gated one while the cut is uncertain).
fn plan_due(d: &db::DueRow, at: CutReading) -> Option<LeaseAction> {
    // An exec whose timeout hibernates it is not released for its
    // timeout: `due_hibernations` seals its hibernation instead.
    let timeout_deadline = match d.lease.on_timeout {
        OnTimeout::Terminate => d.lease.timeout_deadline,
        OnTimeout::Hibernate => None,
    };
    let view = LeaseView {
        state: d.lease.state,
        expiry: d.lease.expiry,
        cancel_requested: d.lease.cancel_requested,
        timeout_deadline,
        terminal_page: d.terminal_page,
    };
    let planned = rules::plan_lease_action(view, at)?;
    match gated_start(d) {
        Some(valid_until) => approval::plan_gated_start(planned, valid_until, at),
        None => Some(planned),
    }
}

fn to_work(d: db::DueRow, at: CutReading) -> LeaseWork {
    // A released lease is never due; its work record says so by Destroy's
    // absence: Maintain is what a caller may still do (nothing).
    let action = plan_due(&d, at).unwrap_or(LeaseAction::Maintain);
    LeaseWork {
        lease_id: d.lease.lease_id,
        generation: d.lease.generation,
        state: d.lease.state,
        expiry: d.lease.expiry,
        reservation_expiry: d.reservation_expiry,
        action,
        exec_id: d.lease.exec_id,
        tenant_id: d.lease.tenant_id,
        attempt: d.lease.attempt,
        provider_id: d.lease.provider_id,
        provider_url: d.provider_url,
        runtime: d.runtime,
        shape: d.shape,
        command: d.command,
        workspace_id: d.workspace_id,
        last_seq: d.last_seq,
        terminal_reason: d.lease.terminal_reason,
        stdin_open: d.stdin_open,
        restore_head: d.lease.restore_head,
        first_seq: d.last_seq + 1,
        attached: d.lease.attachment.is_some(),
        first_input_seq: d.last_sent_input_seq + 1,
        attempt_parked: d.lease.attempt_state == AttemptState::Parked,
    }
}

fn evidence_rejected(reason: impl Into<String>) -> LcError {
    LcError::EvidenceRejected {
        reason: reason.into(),
    }
}

/// The statement `evidence` (a DSSE envelope as JSON) makes, once verified
/// with `provider`'s key as signed by it about exactly this lease and
/// generation.
fn verified_statement(
    evidence: &serde_json::Value,
    provider: &Provider,
    lease: &LeaseRow,
) -> Result<evidence::Statement, LcError> {
    let envelope: Envelope = serde_json::from_value(evidence.clone())
        .map_err(|_| evidence_rejected("malformed_evidence: not a DSSE envelope"))?;
    let key = VerifyingKey::from_bytes(&provider.public_key)
        .map_err(|_| evidence_rejected("the registered provider key is not an Ed25519 key"))?;
    evidence::verify(
        &envelope,
        &key,
        Expected {
            provider_id: lease.provider_id.as_str(),
            lease_id: lease.lease_id.0,
            generation: lease.generation.0,
        },
    )
    .map_err(|e| evidence_rejected(format!("{}: {e}", e.code())))
}

/// Verifies `evidence` ([`verified_statement`]) proving the instance gone
/// (absence of the generation, or a fence covering it).
fn verify_evidence(
    evidence: &serde_json::Value,
    provider: &Provider,
    lease: &LeaseRow,
) -> Result<(), LcError> {
    let statement = verified_statement(evidence, provider, lease)?;
    if !statement.proves_gone(lease.generation.0) {
        return Err(evidence_rejected(format!(
            "not_a_proof: an {} does not prove the instance destroyed",
            statement.kind()
        )));
    }
    Ok(())
}

/// Verifies `evidence` ([`verified_statement`]) as a `not_sent` statement
/// of exactly this generation (the command never reached a supervisor and
/// never will).
fn verify_not_sent(
    evidence: &serde_json::Value,
    provider: &Provider,
    lease: &LeaseRow,
) -> Result<(), LcError> {
    let statement = verified_statement(evidence, provider, lease)?;
    if !statement.proves_not_sent(lease.generation.0) {
        return Err(evidence_rejected(format!(
            "not_a_proof: the statement is {}, not not_sent: only the provider's not_sent proves the command never reached a supervisor",
            statement.kind()
        )));
    }
    Ok(())
}

/// Locks the claim of `lease` and checks that `claim` (a claimed view's
/// credential; `None`: the store's own unclaimed call, nothing checked)
/// is its current one ([`claim::check_claim`]). First in every
/// transaction that writes a claimed Lease, so a take and the write
/// serialize on the claim row.
async fn fence_claim(
    conn: &mut PgConnection,
    claim: Option<&ClaimCredential>,
    lease: SandboxLeaseId,
) -> Result<(), Fail> {
    let Some(cred) = claim else { return Ok(()) };
    let item = ClaimItem {
        kind: ClaimKind::Lease,
        id: lease.0,
    };
    if cred.item != item {
        // A credential for another item proves nothing about this one.
        return Err(LcError::ClaimStale {
            item: item.to_string(),
            presented: cred.generation,
            current: db::lock_claim(conn, item).await?.map(|c| c.generation),
        }
        .into());
    }
    let current = db::lock_claim(conn, item).await?;
    claim::check_claim(current.as_ref(), cred)?;
    Ok(())
}

struct ClaimDueArgs<'a> {
    store: &'a LcStore,
    holder: &'a ClaimHolder,
    at: CutReading,
    limit: usize,
}

/// Claims due Leases for the holder (see
/// [`ReconcileStore::claim_due_work`]): one read of the candidates, the
/// rule for each, one compare-and-set write for the batch, one read of the
/// Leases won.
async fn claim_due_work_tx(
    conn: &mut PgConnection,
    a: &ClaimDueArgs<'_>,
) -> Result<Vec<ClaimedWork>, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let ttl = claim::check_claim_ttl(a.store.config.claim_ttl)?;
    let grace = claim::check_claim_grace(a.store.config.claim_grace)?;
    // A claim's expiry is a deadline like every other: `cut + ttl` must
    // fit the horizon (a renewal's max never exceeds an earlier such one).
    owner_expiry(a.at, ttl, &cut)?;
    let me = a.holder.sha256();
    let cutoff = claim::take_cutoff(grace, a.at);
    let candidates = db::lease_claim_candidates(conn, me, cutoff, a.limit).await?;
    let mut plans = Vec::with_capacity(candidates.len());
    for (lease, current) in candidates {
        let plan = match claim::plan_claim(current.as_ref(), me, a.at, ttl, grace) {
            Ok(p) => p,
            // Another worker's live claim, or a take from another holder
            // while uncertain: not this worker's this step.
            Err(LcError::ClaimLive { .. } | LcError::TimeUncertain { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        plans.push(db::ClaimWrite {
            lease,
            generation: plan.generation(),
            expiry: plan.expiry(),
            basis: match plan {
                ClaimPlan::Take { basis, .. } => basis,
                ClaimPlan::Renew { .. } => current.map_or(TakeoverBasis::Unowned, |c| c.basis),
            },
        });
    }
    let won = db::write_claims(conn, me, cutoff, &plans).await?;
    let ids: Vec<i64> = won.keys().map(|l| l.0).collect();
    let rows = db::due_leases_by_id(conn, &ids).await?;
    // As in `due_work`: an unstarted gated Lease waits out an uncertain
    // cut (claimed, but nothing to do yet).
    rows.into_iter()
        .filter(|r| plan_due(r, a.at).is_some())
        .map(|r| {
            let (generation, expiry) = *won
                .get(&r.lease.lease_id)
                .ok_or_else(|| crate::error::corrupt("a claimed lease read back unclaimed"))?;
            Ok(ClaimedWork {
                claim: ClaimCredential {
                    item: ClaimItem {
                        kind: ClaimKind::Lease,
                        id: r.lease.lease_id.0,
                    },
                    holder: *a.holder,
                    generation,
                },
                expiry,
                work: to_work(r, a.at),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Transaction bodies.

struct CreateTenantArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    name: &'a str,
    units: Option<i64>,
    key_for: &'a (dyn Fn(TenantId) -> Digest + Send + Sync),
}

async fn create_tenant_tx(
    conn: &mut PgConnection,
    a: &CreateTenantArgs<'_>,
) -> Result<Tenant, Fail> {
    let cut = check_reading(conn, a.at).await?;
    if let Begun::Replay(t) = begin_op(
        conn,
        a.store,
        OpScope::Admin,
        a.op,
        "create_tenant",
        a.at,
        &cut,
    )
    .await?
    {
        return Ok(t);
    }
    if db::tenant_name_taken(conn, a.name).await? {
        return Err(LcError::AlreadyExists {
            what: "tenant",
            name: a.name.to_owned(),
        }
        .into());
    }
    let new = tollgate::NewAccount {
        name: a.name.to_owned(),
        api_key_sha256: None,
    };
    let tenant = TenantId(
        tollgate_pg::ops::create_account(conn, &new)
            .await?
            .account_id
            .0,
    );
    db::insert_tenant(conn, tenant, a.name, (a.key_for)(tenant)).await?;
    if let Some(units) = a.units {
        tollgate_pg::ops::deposit(conn, AccountId(tenant.0), units, a.at.cut).await?;
    }
    let t = db::read_tenant(conn, tenant)
        .await?
        .ok_or_else(|| crate::error::corrupt("a tenant vanished while created"))?;
    finish_op(conn, OpScope::Admin, a.op, &t).await?;
    Ok(t)
}

struct DepositArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    units: i64,
}

async fn deposit_tx(conn: &mut PgConnection, a: &DepositArgs<'_>) -> Result<Tenant, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    if let Begun::Replay(t) = begin_op(conn, a.store, scope, a.op, "deposit", a.at, &cut).await? {
        return Ok(t);
    }
    let Some(before) = db::read_tenant(conn, a.tenant).await? else {
        return Err(LcError::not_found("tenant", a.tenant).into());
    };
    // A deposit that would carry the balance past i64::MAX is refused with
    // the balance it would overflow (read under the same transaction), and
    // nothing is written.
    tollgate_pg::ops::deposit(conn, AccountId(a.tenant.0), a.units, a.at.cut)
        .await
        .map_err(|e| match e {
            tollgate_pg::ops::TxError::Rule(tollgate::RuleError::UnitsOverflow { .. }) => {
                Fail::Lc(LcError::UnitsOverflow {
                    tenant_id: a.tenant,
                    units: a.units,
                    deposited: before.deposited,
                })
            }
            other => Fail::from(other),
        })?;
    let t = db::read_tenant(conn, a.tenant)
        .await?
        .ok_or_else(|| LcError::not_found("tenant", a.tenant))?;
    finish_op(conn, scope, a.op, &t).await?;
    Ok(t)
}

struct RuntimeArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    runtime: Runtime,
}

async fn register_runtime_tx(
    conn: &mut PgConnection,
    a: &RuntimeArgs<'_>,
) -> Result<Runtime, Fail> {
    let cut = check_reading(conn, a.at).await?;
    if let Begun::Replay(r) = begin_op(
        conn,
        a.store,
        OpScope::Admin,
        a.op,
        "register_runtime",
        a.at,
        &cut,
    )
    .await?
    {
        return Ok(r);
    }
    let existing = match db::runtime_by_name(conn, &a.runtime.name).await? {
        Some(r) => Some(r),
        None if db::insert_runtime(conn, &a.runtime).await? => None,
        None => db::runtime_by_name(conn, &a.runtime.name).await?,
    };
    let rt = match existing {
        Some(r) if r.digest != a.runtime.digest => {
            return Err(LcError::AlreadyExists {
                what: "runtime",
                name: a.runtime.name.clone(),
            }
            .into());
        }
        Some(r) => r,
        None => a.runtime.clone(),
    };
    finish_op(conn, OpScope::Admin, a.op, &rt).await?;
    Ok(rt)
}

/// An admission request after the checks that need no database.
struct AdmitArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    runtime: &'a str,
    shape: Shape,
    command: Command,
    timeout: Option<(u64, SignedDuration)>,
    stdin_open: bool,
    idle_ttl_ms: Option<u64>,
    on_timeout: OnTimeout,
}

async fn admit_tx(conn: &mut PgConnection, a: &AdmitArgs<'_>) -> Result<ExecRecord, Fail> {
    let store = a.store;
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    if let Begun::Replay(r) = begin_op(conn, store, scope, a.op, "admit_exec", a.at, &cut).await? {
        return Ok(r);
    }
    // Every deadline this admission makes, all on the cut.
    let (lease_expiry, reservation_deadline, reservation_ttl) = capacity_deadlines(store, a.at)?;
    let timeout_deadline = a
        .timeout
        .map(|(_, d)| rules::deadline_after(a.at, d))
        .transpose()?;
    let op_gc =
        opkey::gc_at(a.at.cut, a.at.cut, store.config.operation_ttl).unwrap_or(Timestamp::MAX);
    let rate = store.config.admission_rate;
    let mut deadlines = vec![
        lease_expiry,
        reservation_deadline,
        op_gc,
        rate.window_end(a.at)?,
    ];
    deadlines.extend(timeout_deadline);
    rules::check_admission(a.at, horizon(&cut), &deadlines)?;

    if !db::lock_tenant(conn, a.tenant).await? {
        return Err(LcError::not_found("tenant", a.tenant).into());
    }
    let recent = db::recent_admissions(
        conn,
        a.tenant,
        rate.window_start(a.at),
        rate.admissions_max(),
    )
    .await?;
    rate.check(a.at, &recent)?;
    let gated = db::approval_policy(conn, a.tenant)
        .await?
        .requires(&a.shape);
    let runtime = match Digest::from_hex(a.runtime) {
        Ok(d) => db::runtime_by_digest(conn, d).await?,
        Err(_) => db::runtime_by_name(conn, a.runtime).await?,
    }
    .ok_or_else(|| LcError::not_found("runtime", a.runtime))?;
    let provider = db::pick_provider(conn).await?.ok_or(LcError::NoProvider)?;
    let (lease_id, workspace_id) = db::next_ids(conn).await?;
    let exec_id = db::insert_exec(
        conn,
        &NewExec {
            tenant: a.tenant,
            lease_id,
            provider_id: &provider,
            runtime: runtime.digest,
            workspace_id,
            shape: a.shape.name,
            units: a.shape.units,
            command: a.command.argv(),
            timeout_ms: a.timeout.map(|(ms, _)| ms as i64),
            timeout_deadline: timeout_deadline.filter(|_| !gated),
            admitted: a.at.cut,
            stdin_open: a.stdin_open,
            idle_ttl_ms: a.idle_ttl_ms.map(|ms| ms as i64),
            on_timeout: a.on_timeout,
            state: if gated {
                ExecState::AwaitingApproval
            } else {
                ExecState::Admitted
            },
        },
    )
    .await?;
    let attempt = AttemptNo(1);
    let generation = Generation(1);
    db::insert_attempt(conn, exec_id, attempt, generation).await?;
    if !gated {
        grant_first_lease(
            conn,
            &FirstLease {
                store,
                at: a.at,
                cut: &cut,
                tenant: a.tenant,
                exec_id,
                lease_id,
                provider: &provider,
                units: a.shape.units,
                lease_expiry,
                reservation_ttl,
            },
        )
        .await?;
    }
    let rec = db::read_exec(conn, a.tenant, exec_id)
        .await?
        .ok_or_else(|| crate::error::corrupt("an exec vanished while admitted"))?;
    finish_op(conn, scope, a.op, &rec).await?;
    Ok(rec)
}

/// What [`grant_first_lease`] writes for an exec.
struct FirstLease<'a> {
    store: &'a LcStore,
    at: CutReading,
    cut: &'a CutState,
    tenant: TenantId,
    exec_id: ExecId,
    /// Its canonical lease id.
    lease_id: SandboxLeaseId,
    /// Its canonical provider.
    provider: &'a ProviderId,
    units: i64,
    lease_expiry: Timestamp,
    reservation_ttl: SignedDuration,
}

/// Grants the exec's Reservation generation 1 (a Tollgate grant of its
/// units: `insufficient_capacity` when the tenant's available units are
/// fewer) and inserts its Lease generation 1 `allocating`; the caller
/// checked every deadline against the horizon.
async fn grant_first_lease(conn: &mut PgConnection, f: &FirstLease<'_>) -> Result<(), Fail> {
    let store = f.store;
    let attempt = AttemptNo(1);
    let generation = Generation(1);
    let exec_id = f.exec_id;
    let mut supplied = SuppliedTime::exact(f.at.cut);
    if let Some(bound) = rules::deadline_bound(f.at, horizon(f.cut)) {
        supplied = supplied.with_deadline_limit(bound);
    }
    let grant = tollgate_pg::ops::acquire(
        conn,
        &store.tollgate,
        &AcquireRequest {
            account_id: AccountId(f.tenant.0),
            units: f.units,
            ttl: f.reservation_ttl,
            idempotency_key: None,
        },
        supplied,
    )
    .await?;
    db::insert_reservation(
        conn,
        exec_id,
        attempt,
        generation,
        grant.lease_id.0,
        grant.units,
        grant.expiry,
    )
    .await?;
    db::insert_lease(
        conn,
        &db::NewLease {
            lease: f.lease_id,
            exec: exec_id,
            attempt,
            generation,
            provider: f.provider,
            expiry: f.lease_expiry,
            restore_head: None,
        },
    )
    .await
}

/// The deadlines of the capacity an admission or an approval at `at`
/// grants: the Lease's expiry, the Reservation's reclaim boundary and its
/// TTL, all on the cut.
fn capacity_deadlines(
    store: &LcStore,
    at: CutReading,
) -> Result<(Timestamp, Timestamp, SignedDuration), LcError> {
    let lease_expiry = rules::deadline_after(at, store.config.lease_ttl)?;
    let reservation_ttl = store.config.reservation_ttl.min(store.policy.max_ttl());
    let reservation_deadline = rules::deadline_after(at, reservation_ttl)?
        .checked_add(store.policy.reclaim_grace())
        .unwrap_or(Timestamp::MAX);
    Ok((lease_expiry, reservation_deadline, reservation_ttl))
}

struct PolicyArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    policy: &'a ApprovalPolicy,
}

async fn set_approval_policy_tx(
    conn: &mut PgConnection,
    a: &PolicyArgs<'_>,
) -> Result<Tenant, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Admin;
    let kind = "set_approval_policy";
    if let Begun::Replay(r) = begin_op(conn, a.store, scope, a.op, kind, a.at, &cut).await? {
        return Ok(r);
    }
    if !db::lock_tenant(conn, a.tenant).await? {
        return Err(LcError::not_found("tenant", a.tenant).into());
    }
    db::set_approval_policy(conn, a.tenant, a.policy).await?;
    let t = db::read_tenant(conn, a.tenant)
        .await?
        .ok_or_else(|| LcError::not_found("tenant", a.tenant))?;
    finish_op(conn, scope, a.op, &t).await?;
    Ok(t)
}

/// An approval's or a denial's request.
struct DecideArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    exec_id: ExecId,
    approver: ApproverKind,
    /// `Some` (the validity asked for, `None` inside for the default) to
    /// approve; `None` to deny.
    approve: Option<Option<u64>>,
    reason: Option<&'a str>,
}

/// Locks `tenant`'s exec `exec_id` and reads it: it must await approval.
async fn lock_awaiting(
    conn: &mut PgConnection,
    tenant: TenantId,
    exec_id: ExecId,
) -> Result<ExecRecord, Fail> {
    if !db::lock_exec(conn, tenant, exec_id).await? {
        return Err(LcError::not_found("exec", exec_id).into());
    }
    let rec = db::read_exec(conn, tenant, exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", exec_id))?;
    if rec.state != ExecState::AwaitingApproval {
        return Err(LcError::ExecNotAwaitingApproval {
            exec_id,
            state: rec.state.as_str(),
        }
        .into());
    }
    Ok(rec)
}

/// Approves (the rest of the admission, on a certain cut) or denies an
/// exec awaiting approval.
async fn decide_tx(conn: &mut PgConnection, a: &DecideArgs<'_>) -> Result<ExecRecord, Fail> {
    let store = a.store;
    let cut = check_reading(conn, a.at).await?;
    let validity = a
        .approve
        .map(|ms| approval::check_validity(ms, store.config.approval_validity))
        .transpose()?;
    let reason = approval::check_deny_reason(a.reason)?;
    let scope = OpScope::Tenant(a.tenant);
    let kind = if a.approve.is_some() {
        "approve_exec"
    } else {
        "deny_exec"
    };
    if let Begun::Replay(r) = begin_op(conn, store, scope, a.op, kind, a.at, &cut).await? {
        return Ok(r);
    }
    // A decision is made on a certain cut: what an approval allows is
    // measured from it.
    rules::require_certain(a.at)?;
    let rec = lock_awaiting(conn, a.tenant, a.exec_id).await?;
    let exec = a.exec_id;
    match validity {
        Some(validity) => {
            let (lease_expiry, reservation_deadline, reservation_ttl) =
                capacity_deadlines(store, a.at)?;
            let valid_until = rules::deadline_after(a.at, validity)?;
            let timeout = rec
                .timeout_ms
                .map(|ms| rules::check_timeout_ms(ms).and_then(|d| rules::deadline_after(a.at, d)))
                .transpose()?;
            let op_gc = opkey::gc_at(a.at.cut, a.at.cut, store.config.operation_ttl)
                .unwrap_or(Timestamp::MAX);
            let mut deadlines = vec![lease_expiry, reservation_deadline, valid_until, op_gc];
            deadlines.extend(timeout);
            rules::check_admission(a.at, horizon(&cut), &deadlines)?;
            db::insert_approval(
                conn,
                &db::NewApproval {
                    exec,
                    tenant: a.tenant,
                    decision: ApprovalDecision::Approved,
                    approver: a.approver,
                    decided: a.at.cut,
                    validity_ms: Some(validity.as_millis() as i64),
                    valid_until: Some(valid_until),
                    reason: None,
                },
            )
            .await?;
            grant_first_lease(
                conn,
                &FirstLease {
                    store,
                    at: a.at,
                    cut: &cut,
                    tenant: a.tenant,
                    exec_id: exec,
                    lease_id: rec.canonical.lease_id,
                    provider: &rec.canonical.provider_id,
                    units: rec.units,
                    lease_expiry,
                    reservation_ttl,
                },
            )
            .await?;
            // Its timeout and idleness count from here, where it holds
            // capacity.
            if let Some(deadline) = timeout {
                db::set_timeout_deadline(conn, exec, deadline).await?;
            }
            db::touch_activity(conn, exec, a.at.cut).await?;
            rules::plan_exec_transition(rec.state, ExecState::Admitted)?;
            db::set_exec_state(conn, exec, ExecState::Admitted, None).await?;
        }
        None => {
            db::insert_approval(
                conn,
                &db::NewApproval {
                    exec,
                    tenant: a.tenant,
                    decision: ApprovalDecision::Denied,
                    approver: a.approver,
                    decided: a.at.cut,
                    validity_ms: None,
                    valid_until: None,
                    reason,
                },
            )
            .await?;
            end_awaiting(conn, exec, rec.attempt, TerminalReason::Denied).await?;
        }
    }
    let rec = db::read_exec(conn, a.tenant, exec)
        .await?
        .ok_or_else(|| crate::error::corrupt("an exec vanished while decided"))?;
    finish_op(conn, scope, a.op, &rec).await?;
    Ok(rec)
}

/// Ends the locked exec `exec` awaiting approval (attempt `attempt`) for
/// `reason`: it holds no Reservation and no Lease, so nothing returns.
async fn end_awaiting(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    reason: TerminalReason,
) -> Result<(), Fail> {
    rules::plan_attempt_transition(AttemptState::Runnable, AttemptState::Terminal)?;
    rules::plan_exec_transition(ExecState::AwaitingApproval, ExecState::Terminal)?;
    db::set_attempt_state(conn, exec, attempt, AttemptState::Terminal).await?;
    db::set_terminal_reason(conn, exec, reason, None).await?;
    db::set_exec_state(conn, exec, ExecState::Terminal, None).await
}

struct CancelArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    exec_id: ExecId,
}

async fn cancel_tx(conn: &mut PgConnection, a: &CancelArgs<'_>) -> Result<ExecRecord, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    if let Begun::Replay(r) = begin_op(conn, a.store, scope, a.op, "cancel", a.at, &cut).await? {
        return Ok(r);
    }
    if !db::lock_exec(conn, a.tenant, a.exec_id).await? {
        return Err(LcError::not_found("exec", a.exec_id).into());
    }
    let before = db::read_exec(conn, a.tenant, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    if before.state != ExecState::Terminal {
        db::set_cancel_requested(conn, a.exec_id).await?;
    }
    if before.state == ExecState::Hibernated {
        cancel_parked(conn, a.exec_id, a.at, a.store).await?;
    }
    if before.state == ExecState::AwaitingApproval {
        end_awaiting(conn, a.exec_id, before.attempt, TerminalReason::Cancelled).await?;
    }
    let rec = db::read_exec(conn, a.tenant, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    finish_op(conn, scope, a.op, &rec).await?;
    Ok(rec)
}

/// Ends the locked hibernated exec `exec` as cancelled when its attempt is
/// parked and none of its Leases is unreleased: nothing runs and no units
/// are held, so no destroy is left to prove. With a prepared resume's Lease
/// still unreleased, the reconciler releases it for the cancel and its
/// release ends the exec.
async fn cancel_parked(
    conn: &mut PgConnection,
    exec: ExecId,
    at: CutReading,
    store: &LcStore,
) -> Result<(), Fail> {
    let pv = db::parked_view(conn, exec)
        .await?
        .ok_or_else(|| LcError::not_found("exec", exec))?;
    if pv.attempt_state != AttemptState::Parked
        || db::other_live_leases(conn, exec, None).await? > 0
    {
        return Ok(());
    }
    rules::plan_attempt_transition(pv.attempt_state, AttemptState::Terminal)?;
    rules::plan_exec_transition(pv.exec_state, ExecState::Terminal)?;
    db::set_attempt_state(conn, exec, pv.attempt, AttemptState::Terminal).await?;
    db::set_terminal_reason(conn, exec, TerminalReason::Cancelled, None).await?;
    db::set_exec_state(conn, exec, ExecState::Terminal, None).await?;
    retain(conn, exec, at, store).await
}

/// Records the retain-until of `exec`, ending at `at`: its cut plus the
/// store's retention ([`deletion::plan_retain_until`], inside the
/// horizon in force).
async fn retain(
    conn: &mut PgConnection,
    exec: ExecId,
    at: CutReading,
    store: &LcStore,
) -> Result<(), Fail> {
    let cut = db::read_cut_state(conn)
        .await?
        .ok_or_else(|| crate::error::corrupt("the cut vanished in a transaction"))?;
    let until = deletion::plan_retain_until(at.cut, store.config.retention, horizon(&cut))?;
    db::set_retain_until(conn, exec, until).await
}

struct LeaseArgs<'a> {
    store: &'a LcStore,
    /// The claim a claimed view's write presents ([`fence_claim`]).
    claim: Option<&'a ClaimCredential>,
    lease: SandboxLeaseId,
    generation: Generation,
    at: CutReading,
}

async fn mark_active_tx(conn: &mut PgConnection, a: &LeaseArgs<'_>) -> Result<LeaseWork, Fail> {
    check_reading(conn, a.at).await?;
    fence_claim(conn, a.claim, a.lease).await?;
    let row = lock_generation(conn, a.lease, a.generation).await?;
    if rules::plan_lease_transition(row.state, LeaseState::Active)? == Step::Changed {
        db::set_lease_state(conn, a.lease, LeaseState::Active).await?;
        if rules::plan_attempt_transition(row.attempt_state, AttemptState::Running)?
            == Step::Changed
        {
            db::set_attempt_state(conn, row.exec_id, row.attempt, AttemptState::Running).await?;
        }
        if rules::plan_exec_transition(row.exec_state, ExecState::Running)? == Step::Changed {
            db::set_exec_state(conn, row.exec_id, ExecState::Running, None).await?;
        }
    }
    work_of(conn, a.lease, a.at).await
}

async fn renew_tx(conn: &mut PgConnection, a: &LeaseArgs<'_>) -> Result<LeaseWork, Fail> {
    let store = a.store;
    check_reading(conn, a.at).await?;
    fence_claim(conn, a.claim, a.lease).await?;
    let row = lock_generation(conn, a.lease, a.generation).await?;
    if row.state == LeaseState::Released {
        return Err(LcError::IllegalTransition {
            what: "lease",
            from: "released",
            to: "renewed",
        }
        .into());
    }
    // The Lease while it may run; the Reservation until the destroy is
    // proven, so its grant never lapses under a pending release.
    if row.state != LeaseState::ReleasePending {
        let expiry = rules::renewed_expiry(row.expiry, a.at, store.config.lease_ttl)?;
        if expiry != row.expiry {
            db::set_lease_expiry(conn, a.lease, expiry).await?;
        }
    }
    renew_reservation(conn, store, &row, a.at).await?;
    work_of(conn, a.lease, a.at).await
}

/// Renews the lease's Reservation, while held, to `max(current, cut +
/// reservation ttl)` (Tollgate's renewal never shortens). Locks it after
/// the lease, in the store's order.
async fn renew_reservation(
    conn: &mut PgConnection,
    store: &LcStore,
    row: &LeaseRow,
    at: CutReading,
) -> Result<(), Fail> {
    let res = db::lock_reservation(conn, row.exec_id, row.attempt, row.generation)
        .await?
        .ok_or_else(|| {
            crate::error::corrupt(format!("lease {} has no reservation", row.lease_id))
        })?;
    if res.state != ReservationState::Held {
        return Ok(());
    }
    let renewal = tollgate_pg::ops::renew(
        conn,
        &store.tollgate,
        LeaseId(res.tollgate_lease_id),
        &store.capability(res.tollgate_lease_id),
        store.config.reservation_ttl.min(store.policy.max_ttl()),
        SuppliedTime::exact(at.cut),
    )
    .await?;
    if renewal.lease.expiry != res.expiry {
        db::set_reservation_expiry(
            conn,
            row.exec_id,
            row.attempt,
            row.generation,
            renewal.lease.expiry,
        )
        .await?;
    }
    Ok(())
}

struct BeginReleaseArgs<'a> {
    claim: Option<&'a ClaimCredential>,
    lease: SandboxLeaseId,
    generation: Generation,
    reason: TerminalReason,
    at: CutReading,
    store: &'a LcStore,
}

async fn begin_release_tx(
    conn: &mut PgConnection,
    a: &BeginReleaseArgs<'_>,
) -> Result<LeaseWork, Fail> {
    check_reading(conn, a.at).await?;
    fence_claim(conn, a.claim, a.lease).await?;
    let row = lock_generation(conn, a.lease, a.generation).await?;
    begin_release_locked(conn, a.store, &row, a.reason, a.at).await?;
    work_of(conn, a.lease, a.at).await
}

struct BeginReleaseNotSentArgs<'a> {
    claim: Option<&'a ClaimCredential>,
    lease: SandboxLeaseId,
    generation: Generation,
    evidence: &'a serde_json::Value,
    at: CutReading,
    store: &'a LcStore,
    /// The provider's refusal of a resume's restore, recorded on the
    /// intent that prepared the Lease.
    refusal: Option<&'a ResumeRefusal>,
}

/// `start_failed` on the provider's proof: the evidence is verified under
/// the Lease's lock, before anything is written.
async fn begin_release_not_sent_tx(
    conn: &mut PgConnection,
    a: &BeginReleaseNotSentArgs<'_>,
) -> Result<LeaseWork, Fail> {
    check_reading(conn, a.at).await?;
    fence_claim(conn, a.claim, a.lease).await?;
    let row = lock_generation(conn, a.lease, a.generation).await?;
    let provider = db::read_provider(conn, row.provider_id.as_str())
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("provider {} is gone", row.provider_id)))?;
    verify_not_sent(a.evidence, &provider, &row)?;
    if a.refusal.is_some() && row.restore_head.is_none() {
        return Err(LcError::IllegalTransition {
            what: "lease (only a restoring Lease's restore is refused)",
            from: row.state.as_str(),
            to: "restore_refused",
        }
        .into());
    }
    let step = rules::plan_lease_transition(row.state, LeaseState::ReleasePending)?;
    if step == Step::Changed {
        owner::check_release(row.exec_id, None, true)?;
        enter_release_pending(conn, a.store, &row, TerminalReason::StartFailed, None, a.at).await?;
    }
    if let Some(r) = a.refusal {
        let refusal = ResumeRefusal {
            code: r.code.clone(),
            message: hibernate::clip_text(&r.message, hibernate::REFUSAL_MESSAGE_BYTES_MAX),
        };
        db::set_intent_refused(conn, row.lease_id, &refusal).await?;
    }
    work_of(conn, a.lease, a.at).await
}

/// Moves the locked Lease `row` to `release_pending` for `reason` unless it
/// is there already, renewing its Reservation: `expired` needs a certain
/// cut past a deadline, `exited` and `start_failed` the attempt's terminal
/// page acknowledged ([`owner::check_release`]: a terminal process state
/// alone never releases; a start failure without it is released only on
/// the provider's not-sent proof, [`begin_release_not_sent_tx`]).
async fn begin_release_locked(
    conn: &mut PgConnection,
    store: &LcStore,
    row: &LeaseRow,
    reason: TerminalReason,
    at: CutReading,
) -> Result<Step, Fail> {
    let step = rules::plan_lease_transition(row.state, LeaseState::ReleasePending)?;
    if step == Step::Changed {
        let mut cause = None;
        match reason {
            TerminalReason::Expired => {
                rules::require_certain(at)?;
                cause = rules::expiry_cause(row.timeout_deadline, row.expiry, at);
                if cause.is_none() {
                    return Err(LcError::IllegalTransition {
                        what: "lease (not expired on the cut)",
                        from: row.state.as_str(),
                        to: LeaseState::ReleasePending.as_str(),
                    }
                    .into());
                }
            }
            TerminalReason::Exited | TerminalReason::StartFailed => {
                let acked = db::acked_terminal_seq(conn, row.exec_id, row.attempt).await?;
                owner::check_release(row.exec_id, acked, false)?;
            }
            TerminalReason::Cancelled => {}
            TerminalReason::ApprovalExpired => {
                rules::require_certain(at)?;
                let unstarted = row.state == LeaseState::Allocating
                    && row.attachment.is_none()
                    && row.attempt == AttemptNo(1)
                    && row.generation == Generation(1);
                let expired = match db::approval_valid_until(conn, row.exec_id).await? {
                    Some(vu) => approval::check_approval_start(vu, at) == ApprovalStart::Expired,
                    None => false,
                };
                if !unstarted || !expired {
                    return Err(LcError::IllegalTransition {
                        what: "lease (only an unstarted Lease of an approval expired on the cut)",
                        from: row.state.as_str(),
                        to: LeaseState::ReleasePending.as_str(),
                    }
                    .into());
                }
            }
            // A denial ends an exec that never had a Lease.
            TerminalReason::Denied => {
                return Err(LcError::IllegalTransition {
                    what: "lease (a denied exec has none)",
                    from: row.state.as_str(),
                    to: LeaseState::ReleasePending.as_str(),
                }
                .into());
            }
            // Only a refused quiescence ends an exec so
            // (`refuse_quiescence_tx`), never a release request.
            TerminalReason::SnapshotRefused => {
                return Err(LcError::IllegalTransition {
                    what: "lease (a refused snapshot is released by its hibernation)",
                    from: row.state.as_str(),
                    to: LeaseState::ReleasePending.as_str(),
                }
                .into());
            }
        }
        enter_release_pending(conn, store, row, reason, cause, at).await?;
    }
    Ok(step)
}

/// Whether releasing the locked Lease `row` leaves its attempt parked: a
/// prepared resume's Lease whose resume never committed, without a cancel
/// request.
fn keeps_parked(row: &LeaseRow) -> bool {
    row.attempt_state == AttemptState::Parked && !row.cancel_requested
}

/// Writes the locked Lease `row` `release_pending` for `reason` and renews
/// its Reservation; the caller checked that the release is allowed.
async fn enter_release_pending(
    conn: &mut PgConnection,
    store: &LcStore,
    row: &LeaseRow,
    reason: TerminalReason,
    expired_by: Option<ExpiryCause>,
    at: CutReading,
) -> Result<(), Fail> {
    db::set_lease_state(conn, row.lease_id, LeaseState::ReleasePending).await?;
    // A resume's Lease released before its resume committed ends the
    // generation, not the exec (unless the tenant cancelled): the attempt
    // stays parked on its head.
    if !keeps_parked(row) {
        db::set_terminal_reason(conn, row.exec_id, reason, expired_by).await?;
    }
    // A full Reservation TTL from here for the destroy to be proven.
    renew_reservation(conn, store, row, at).await
}

struct AppendArgs<'a> {
    claim: Option<&'a ClaimCredential>,
    lease: SandboxLeaseId,
    generation: Generation,
    pages: &'a [OutputPage],
}

async fn append_tx(conn: &mut PgConnection, a: &AppendArgs<'_>) -> Result<AppendReport, Fail> {
    fence_claim(conn, a.claim, a.lease).await?;
    let row = lock_generation(conn, a.lease, a.generation).await?;
    let mut pages: Vec<&OutputPage> = a.pages.iter().collect();
    pages.sort_by_key(|p| p.seq);
    for p in &pages {
        if p.exec_id != row.exec_id || p.attempt != row.attempt {
            return Err(LcError::InvalidPage {
                reason: format!(
                    "page {} is of exec {} attempt {}, not of lease {}'s exec {} attempt {}",
                    p.seq, p.exec_id, p.attempt, row.lease_id, row.exec_id, row.attempt
                ),
            }
            .into());
        }
        p.to_page()?;
    }
    let seqs: Vec<i64> = pages.iter().map(|p| p.seq).collect();
    let stored = db::page_digests(conn, row.exec_id, row.attempt, &seqs).await?;
    let (mut last_seq, exit) = db::page_tail(conn, row.exec_id, row.attempt).await?;
    let mut terminal = exit.is_some();
    let mut report = AppendReport::default();
    for p in pages {
        if let Some(d) = stored.get(&p.seq) {
            if *d != p.sha256 {
                return Err(LcError::PageConflict {
                    exec_id: p.exec_id,
                    seq: p.seq,
                }
                .into());
            }
            report.duplicates += 1;
            continue;
        }
        if p.seq <= last_seq {
            // Stored earlier in this batch with the same seq.
            return Err(LcError::InvalidPage {
                reason: format!("page {} appears twice in one batch", p.seq),
            }
            .into());
        }
        if terminal {
            return Err(LcError::InvalidPage {
                reason: format!("page {} comes after the terminal page", p.seq),
            }
            .into());
        }
        if p.seq != last_seq + 1 {
            return Err(LcError::InvalidPage {
                reason: format!("page {} leaves a gap after page {last_seq}", p.seq),
            }
            .into());
        }
        db::insert_page(conn, p).await?;
        last_seq = p.seq;
        terminal = p.kind == PageKind::Terminal;
        report.appended += 1;
    }
    report.last_seq = last_seq;
    Ok(report)
}

struct CommitArgs<'a> {
    store: &'a LcStore,
    claim: Option<&'a ClaimCredential>,
    lease: SandboxLeaseId,
    generation: Generation,
    evidence: &'a serde_json::Value,
    at: CutReading,
}

async fn commit_release_tx(
    conn: &mut PgConnection,
    a: &CommitArgs<'_>,
) -> Result<ReleaseOutcome, Fail> {
    let store = a.store;
    rules::require_certain(a.at)?;
    check_reading(conn, a.at).await?;
    fence_claim(conn, a.claim, a.lease).await?;
    let row = lock_generation(conn, a.lease, a.generation).await?;
    let provider = db::read_provider(conn, row.provider_id.as_str())
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("provider {} is gone", row.provider_id)))?;
    verify_evidence(a.evidence, &provider, &row)?;
    let res = db::lock_reservation(conn, row.exec_id, row.attempt, row.generation)
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("lease {} has no reservation", a.lease)))?;
    let hib = db::hibernation(conn, row.exec_id, row.attempt, row.generation, true).await?;
    if row.state == LeaseState::Released {
        return Ok(ReleaseOutcome {
            lease_id: row.lease_id,
            generation: row.generation,
            exec_id: row.exec_id,
            units_returned: res.units,
            released_cut: row
                .released
                .ok_or_else(|| crate::error::corrupt("a released lease without its cut"))?,
            replay: true,
            parked: hib.is_some_and(|h| h.step == HibernationStep::Parked)
                || row.attempt_state == AttemptState::Parked,
        });
    }
    rules::plan_lease_transition(row.state, LeaseState::Released)?;
    let mut units_returned = 0;
    if res.state == ReservationState::Held {
        let settlement = tollgate_pg::ops::release(
            conn,
            &store.tollgate,
            LeaseId(res.tollgate_lease_id),
            &store.capability(res.tollgate_lease_id),
            a.at.cut,
            Some(0),
        )
        .await?;
        units_returned = settlement.returned;
        db::return_reservation(conn, row.exec_id, row.attempt, row.generation, a.at.cut).await?;
    }
    db::release_lease(conn, a.lease, a.evidence, a.at.cut).await?;
    if hib.is_some_and(|h| h.step == HibernationStep::Quiesced) {
        // A quiesced hibernation of this generation: the attempt parks on
        // the workspace head and the exec hibernates; nothing is terminal.
        rules::plan_attempt_transition(row.attempt_state, AttemptState::Parked)?;
        rules::plan_exec_transition(row.exec_state, ExecState::Hibernated)?;
        db::set_attempt_state(conn, row.exec_id, row.attempt, AttemptState::Parked).await?;
        db::set_exec_state(conn, row.exec_id, ExecState::Hibernated, None).await?;
        db::set_hibernation_parked(conn, row.exec_id, row.attempt, row.generation).await?;
        // A cancel requested after the stop (too late to cancel the
        // command instead): the parked exec ends as cancelled at once.
        if view_of(conn, row.exec_id).await?.cancel_requested {
            cancel_parked(conn, row.exec_id, a.at, store).await?;
        }
        return Ok(ReleaseOutcome {
            lease_id: row.lease_id,
            generation: row.generation,
            exec_id: row.exec_id,
            units_returned,
            released_cut: a.at.cut,
            replay: false,
            parked: true,
        });
    }
    if keeps_parked(&row) {
        return Ok(ReleaseOutcome {
            lease_id: row.lease_id,
            generation: row.generation,
            exec_id: row.exec_id,
            units_returned,
            released_cut: a.at.cut,
            replay: false,
            parked: true,
        });
    }
    if rules::plan_attempt_transition(row.attempt_state, AttemptState::Terminal)? == Step::Changed {
        db::set_attempt_state(conn, row.exec_id, row.attempt, AttemptState::Terminal).await?;
    }
    let (_, exit) = db::page_tail(conn, row.exec_id, row.attempt).await?;
    let reason = row.terminal_reason.unwrap_or(if exit.is_some() {
        TerminalReason::Exited
    } else {
        TerminalReason::Cancelled
    });
    db::set_terminal_reason(conn, row.exec_id, reason, None).await?;
    if rules::plan_exec_transition(row.exec_state, ExecState::Terminal)? == Step::Changed {
        let code = if reason == TerminalReason::Exited {
            exit.and_then(|e| e.code)
        } else {
            None
        };
        db::set_exec_state(conn, row.exec_id, ExecState::Terminal, code).await?;
        retain(conn, row.exec_id, a.at, store).await?;
    }
    Ok(ReleaseOutcome {
        lease_id: row.lease_id,
        generation: row.generation,
        exec_id: row.exec_id,
        units_returned,
        released_cut: a.at.cut,
        replay: false,
        parked: false,
    })
}

// ---------------------------------------------------------------------------
// The gateway's transaction bodies. Locks, in the store's order: the
// sandbox Lease (release only), the exec (takeover, claim and release),
// the ownership, then the Reservation and Tollgate's rows. Every fenced
// write locks the ownership row and checks the caller against it
// ([`owner::check_owner`]) before it writes anything.

/// `at.cut + ttl`, which must fit `cut + horizon`: an owner's heartbeat
/// expiry is a deadline like every other.
fn owner_expiry(at: CutReading, ttl: SignedDuration, cut: &CutState) -> Result<Timestamp, LcError> {
    let deadline = rules::deadline_after(at, ttl)?;
    match rules::deadline_bound(at, horizon(cut)) {
        Some(bound) if deadline > bound => Err(LcError::DeadlineBeyondHorizon { deadline, bound }),
        _ => Ok(deadline),
    }
}

fn owned_exec(ownership: Ownership, basis: TakeoverBasis, v: db::OwnedView) -> OwnedExec {
    OwnedExec {
        ownership,
        basis,
        tenant_id: v.tenant_id,
        identity: v.identity,
        attempt: v.attempt,
        lease_id: v.lease_id,
        lease_generation: v.lease_generation,
        lease_state: v.lease_state,
        provider_url: v.provider_url,
        staged_through: v.staged_through,
        acked_through: v.acked_through,
        terminal_acked_seq: v.terminal_acked_seq,
        cancel_requested: v.cancel_requested,
        hibernation_step: v.hibernation_step,
        attempt_parked: v.attempt_parked,
        resume_op_key: v.resume_op_key,
        lease_attached: v.lease_attached,
        stopped_acked_seq: v.stopped_acked_seq,
    }
}

async fn view_of(conn: &mut PgConnection, exec: ExecId) -> Result<db::OwnedView, Fail> {
    Ok(db::owned_view(conn, exec)
        .await?
        .ok_or_else(|| LcError::not_found("exec", exec))?)
}

/// Writes the next ownership of the locked exec of `view` (whose current
/// ownership, locked, is `current`) for the token with `token_sha256` on
/// `basis`.
async fn install_owner(
    conn: &mut PgConnection,
    current: Option<&db::OwnerRow>,
    basis: TakeoverBasis,
    token_sha256: Digest,
    expiry: Timestamp,
    view: db::OwnedView,
) -> Result<OwnedExec, Fail> {
    let exec = view.identity.exec_id;
    let generation = OwnerGeneration(current.map_or(1, |o| o.ownership.generation.0 + 1));
    let fence = db::write_owner(
        conn,
        exec,
        view.tenant_id,
        token_sha256,
        generation,
        expiry,
        basis,
    )
    .await?;
    let ownership = Ownership {
        exec_id: exec,
        token_sha256,
        generation,
        fence,
        heartbeat_expiry: expiry,
        released: false,
    };
    Ok(owned_exec(ownership, basis, view))
}

struct ClaimArgs {
    token_sha256: Digest,
    at: CutReading,
    ttl: SignedDuration,
    limit: usize,
}

async fn claim_tx(conn: &mut PgConnection, a: &ClaimArgs) -> Result<Vec<OwnedExec>, Fail> {
    let cut = check_reading(conn, a.at).await?;
    if !a.at.certain {
        return Ok(Vec::new());
    }
    let expiry = owner_expiry(a.at, a.ttl, &cut)?;
    let mut owned = Vec::new();
    for exec in db::claim_candidates(conn, a.at.cut, a.limit).await? {
        let current = db::lock_owner(conn, exec).await?;
        let basis = match owner::plan_takeover(current.as_ref().map(|o| &o.ownership), a.at) {
            Ok(b) => b,
            // Renewed after the candidates were read: not claimable.
            Err(LcError::OwnerLive { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let view = view_of(conn, exec).await?;
        let hibernated = view.exec_state == ExecState::Hibernated;
        if (view.lease_state != LeaseState::Active && !hibernated)
            || view.exec_state == ExecState::Terminal
        {
            continue;
        }
        owned.push(
            install_owner(conn, current.as_ref(), basis, a.token_sha256, expiry, view).await?,
        );
    }
    Ok(owned)
}

struct TakeOverArgs {
    token_sha256: Digest,
    tenant: TenantId,
    exec_id: ExecId,
    at: CutReading,
    ttl: SignedDuration,
}

async fn take_over_tx(conn: &mut PgConnection, a: &TakeOverArgs) -> Result<OwnedExec, Fail> {
    let cut = check_reading(conn, a.at).await?;
    rules::require_certain(a.at)?;
    // Serialize on the exact (tenant, exec) row: a racing takeover waits
    // here and then finds this one's ownership live.
    let state = db::lock_exec_state(conn, a.tenant, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    if state == ExecState::Terminal {
        return Err(LcError::ExecTerminal { exec_id: a.exec_id }.into());
    }
    let current = db::lock_owner(conn, a.exec_id).await?;
    let basis = owner::plan_takeover(current.as_ref().map(|o| &o.ownership), a.at)?;
    let view = view_of(conn, a.exec_id).await?;
    // A hibernated exec has no active Lease; its owner prepares and
    // commits its resume.
    if view.lease_state != LeaseState::Active && view.exec_state != ExecState::Hibernated {
        return Err(LcError::IllegalTransition {
            what: "exec ownership (the exec's Lease is not active)",
            from: view.lease_state.as_str(),
            to: "owned",
        }
        .into());
    }
    let expiry = owner_expiry(a.at, a.ttl, &cut)?;
    install_owner(conn, current.as_ref(), basis, a.token_sha256, expiry, view).await
}

/// Locks the exec's ownership; `not_found` when it has none.
async fn lock_owned(conn: &mut PgConnection, exec: ExecId) -> Result<db::OwnerRow, Fail> {
    Ok(db::lock_owner(conn, exec)
        .await?
        .ok_or_else(|| LcError::not_found("exec ownership", exec))?)
}

/// Locks the exec's ownership and checks that `cred` may write at `at`.
async fn fence(
    conn: &mut PgConnection,
    cred: &OwnerCredential,
    exec: ExecId,
    at: CutReading,
) -> Result<db::OwnerRow, Fail> {
    let row = lock_owned(conn, exec).await?;
    owner::check_owner(&row.ownership, cred, at)?;
    Ok(row)
}

struct HeartbeatArgs<'a> {
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    ttl: SignedDuration,
}

async fn heartbeat_tx(conn: &mut PgConnection, a: &HeartbeatArgs<'_>) -> Result<OwnedExec, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let row = lock_owned(conn, a.exec_id).await?;
    let expiry = owner::heartbeat_expiry(&row.ownership, a.cred, a.at, a.ttl)?;
    owner_expiry(a.at, a.ttl, &cut)?;
    if expiry != row.ownership.heartbeat_expiry {
        db::set_owner_heartbeat(conn, a.exec_id, expiry).await?;
    }
    let view = view_of(conn, a.exec_id).await?;
    let ownership = Ownership {
        heartbeat_expiry: expiry,
        ..row.ownership
    };
    Ok(owned_exec(ownership, row.basis, view))
}

struct StageArgs<'a> {
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    pages: &'a [PageMeta],
}

async fn stage_tx(conn: &mut PgConnection, a: &StageArgs<'_>) -> Result<StageReport, Fail> {
    check_reading(conn, a.at).await?;
    let owner_row = fence(conn, a.cred, a.exec_id, a.at).await?;
    let view = view_of(conn, a.exec_id).await?;
    let mut pages: Vec<&PageMeta> = a.pages.iter().collect();
    pages.sort_by_key(|p| p.seq);
    for p in &pages {
        if p.exec_id != a.exec_id || p.attempt != view.attempt {
            return Err(LcError::InvalidPage {
                reason: format!(
                    "page {} is of exec {} attempt {}, not of exec {} attempt {}",
                    p.seq, p.exec_id, p.attempt, a.exec_id, view.attempt
                ),
            }
            .into());
        }
        p.check()?;
    }
    let seqs: Vec<i64> = pages.iter().map(|p| p.seq).collect();
    let stored = db::page_metas(conn, a.exec_id, view.attempt, &seqs).await?;
    let (mut last_seq, exit) = db::page_tail(conn, a.exec_id, view.attempt).await?;
    let mut terminal = exit.is_some();
    let mut report = StageReport::default();
    for p in pages {
        if let Some(m) = stored.get(&p.seq) {
            if m != p {
                return Err(LcError::PageConflict {
                    exec_id: p.exec_id,
                    seq: p.seq,
                }
                .into());
            }
            report.duplicates += 1;
            continue;
        }
        if p.seq <= last_seq {
            return Err(LcError::InvalidPage {
                reason: format!("page {} appears twice in one batch", p.seq),
            }
            .into());
        }
        if terminal {
            return Err(LcError::InvalidPage {
                reason: format!("page {} comes after the terminal page", p.seq),
            }
            .into());
        }
        if p.seq != last_seq + 1 {
            return Err(LcError::InvalidPage {
                reason: format!("page {} leaves a gap after page {last_seq}", p.seq),
            }
            .into());
        }
        db::insert_page_meta(
            conn,
            p,
            owner_row.ownership.generation,
            owner_row.ownership.fence,
        )
        .await?;
        last_seq = p.seq;
        terminal = p.kind == PageKind::Terminal;
        report.staged += 1;
    }
    db::touch_activity(conn, a.exec_id, a.at.cut).await?;
    report.staged_through = last_seq;
    Ok(report)
}

struct PendingArgs<'a> {
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    limit: usize,
}

async fn pending_tx(conn: &mut PgConnection, a: &PendingArgs<'_>) -> Result<Vec<PageMeta>, Fail> {
    check_reading(conn, a.at).await?;
    fence(conn, a.cred, a.exec_id, a.at).await?;
    let view = view_of(conn, a.exec_id).await?;
    db::pending_pages(conn, a.exec_id, view.attempt, a.limit).await
}

/// One owner transition request.
struct TransitionArgs<'a> {
    store: &'a LcStore,
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    transition_id: &'a str,
    kind: TransitionKind,
    /// The ACK's `through_seq` (ACK only).
    through_seq: i64,
}

/// What a transition found once its ownership is locked.
enum Planned {
    Replay(TransitionReceipt),
    Commit(db::OwnerRow, db::OwnedView, Digest),
}

/// Locks the ownership, then decides the request by
/// [`owner::plan_transition`] against the receipt stored under its id.
/// The request digest covers the kind, the exec, the attempt and (ACK)
/// `through_seq`.
async fn plan_owner_transition(
    conn: &mut PgConnection,
    a: &TransitionArgs<'_>,
) -> Result<Planned, Fail> {
    let row = lock_owned(conn, a.exec_id).await?;
    let view = view_of(conn, a.exec_id).await?;
    let args = match a.kind {
        TransitionKind::Ack => format!("attempt={} through_seq={}", view.attempt, a.through_seq),
        _ => format!("attempt={}", view.attempt),
    };
    let request = owner::transition_request_sha256(a.kind, a.exec_id, &args);
    let stored = db::read_transition(conn, a.exec_id, a.transition_id).await?;
    match owner::plan_transition(
        stored.as_ref(),
        a.kind,
        request,
        &row.ownership,
        a.cred,
        a.at,
    )? {
        TransitionPlan::Replay(r) => Ok(Planned::Replay(r)),
        TransitionPlan::Commit => Ok(Planned::Commit(row, view, request)),
    }
}

/// Commits the receipt of a planned transition.
async fn commit_receipt(
    conn: &mut PgConnection,
    a: &TransitionArgs<'_>,
    row: &db::OwnerRow,
    request_sha256: Digest,
    detail: serde_json::Value,
) -> Result<TransitionReceipt, Fail> {
    let receipt = TransitionReceipt {
        exec_id: a.exec_id,
        transition_id: a.transition_id.to_owned(),
        kind: a.kind,
        token_sha256: row.ownership.token_sha256,
        owner_generation: row.ownership.generation,
        owner_fence: row.ownership.fence,
        request_sha256,
        committed_cut: a.at.cut,
        detail,
    };
    db::insert_transition(conn, &receipt).await?;
    Ok(receipt)
}

async fn ack_tx(
    conn: &mut PgConnection,
    a: &TransitionArgs<'_>,
) -> Result<TransitionReceipt, Fail> {
    check_reading(conn, a.at).await?;
    let (row, view, request) = match plan_owner_transition(conn, a).await? {
        Planned::Replay(r) => return Ok(r),
        Planned::Commit(row, view, request) => (row, view, request),
    };
    if a.through_seq < 1 || a.through_seq > view.staged_through {
        return Err(LcError::InvalidPage {
            reason: format!(
                "an ACK through page {} of exec {} attempt {}: its staged metadata ends at page {}",
                a.through_seq, a.exec_id, view.attempt, view.staged_through
            ),
        }
        .into());
    }
    let acked = db::ack_pages_through(conn, a.exec_id, view.attempt, a.through_seq).await?;
    // Pages are acked in seq order: exactly those after the acked prefix.
    let expected = u64::try_from(a.through_seq - view.acked_through).unwrap_or(0);
    if acked != expected {
        return Err(crate::error::corrupt(format!(
            "an ACK through page {} of exec {} acked {acked} pages, not {expected}",
            a.through_seq, a.exec_id
        ))
        .into());
    }
    let detail = serde_json::json!({
        "attempt": view.attempt,
        "through_seq": a.through_seq,
        "pages_acked": acked,
    });
    commit_receipt(conn, a, &row, request, detail).await
}

async fn owner_cancel_tx(
    conn: &mut PgConnection,
    a: &TransitionArgs<'_>,
) -> Result<TransitionReceipt, Fail> {
    check_reading(conn, a.at).await?;
    let (row, view, request) = match plan_owner_transition(conn, a).await? {
        Planned::Replay(r) => return Ok(r),
        Planned::Commit(row, view, request) => (row, view, request),
    };
    let detail = serde_json::json!({
        "attempt": view.attempt,
        "lease_id": view.lease_id,
        "lease_generation": view.lease_generation,
    });
    commit_receipt(conn, a, &row, request, detail).await
}

async fn release_tx(
    conn: &mut PgConnection,
    a: &TransitionArgs<'_>,
) -> Result<TransitionReceipt, Fail> {
    check_reading(conn, a.at).await?;
    // The store's lock order: the Lease, the exec, then the ownership.
    let before = view_of(conn, a.exec_id).await?;
    let lease = lock_generation(conn, before.lease_id, before.lease_generation).await?;
    db::lock_exec_state(conn, before.tenant_id, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    let (row, view, request) = match plan_owner_transition(conn, a).await? {
        Planned::Replay(r) => return Ok(r),
        Planned::Commit(row, view, request) => (row, view, request),
    };
    let basis = owner::check_release(a.exec_id, view.terminal_acked_seq, false)?;
    let reason = if db::has_transition_kind(conn, a.exec_id, TransitionKind::Cancel).await? {
        TerminalReason::Cancelled
    } else {
        TerminalReason::Exited
    };
    begin_release_locked(conn, a.store, &lease, reason, a.at).await?;
    db::release_owner(conn, a.exec_id).await?;
    let detail = serde_json::json!({
        "attempt": view.attempt,
        "lease_id": lease.lease_id,
        "lease_generation": lease.generation,
        "reason": reason.as_str(),
        "basis": basis,
    });
    commit_receipt(conn, a, &row, request, detail).await
}

// ---------------------------------------------------------------------------
// Input for a command's stdin: the tenant queues it (`send_input`, locked
// on the exec row, so seqs and the queue bound are decided one input at a
// time), the owner reads it (`queued_inputs`) and records its delivery
// (`record_send`, fenced on the ownership row, in seq order).

/// What a `send_input` records as its operation's result: the input it
/// queued, which a replay reads again (as it is now).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct QueuedInput {
    exec_id: ExecId,
    input_seq: i64,
}

struct SendInputArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    exec_id: ExecId,
    bytes: &'a [u8],
    eof: bool,
}

async fn read_queued(
    conn: &mut PgConnection,
    exec: ExecId,
    input_seq: i64,
) -> Result<(InputRecord, Digest), Fail> {
    Ok(db::read_input(conn, exec, input_seq, false)
        .await?
        .ok_or_else(|| {
            crate::error::corrupt(format!("input {input_seq} of exec {exec} vanished"))
        })?)
}

async fn send_input_tx(
    conn: &mut PgConnection,
    a: &SendInputArgs<'_>,
) -> Result<InputRecord, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    let sha256 = Digest::of(a.bytes);
    let request = input::input_request_sha256(sha256, a.eof);
    if let Begun::Replay(q) =
        begin_op::<QueuedInput>(conn, a.store, scope, a.op, "send_input", a.at, &cut).await?
    {
        let (rec, stored_request) = read_queued(conn, q.exec_id, q.input_seq).await?;
        // The key's digest is the caller's; the input's own digest covers
        // the bytes and eof whatever the caller hashed.
        if q.exec_id != a.exec_id || stored_request != request {
            return Err(LcError::IdempotencyConflict {
                key: a.op.key().to_owned(),
            }
            .into());
        }
        return Ok(rec);
    }
    if !db::lock_exec(conn, a.tenant, a.exec_id).await? {
        return Err(LcError::not_found("exec", a.exec_id).into());
    }
    let exec = db::read_exec(conn, a.tenant, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    let queue = db::input_queue(conn, a.exec_id).await?;
    let input_seq = input::plan_input(
        a.exec_id,
        exec.stdin_open,
        exec.state == ExecState::Terminal,
        &queue,
        a.bytes.len(),
        a.eof,
    )?;
    db::insert_input(
        conn,
        &db::NewInput {
            exec: a.exec_id,
            input_seq,
            bytes: a.bytes,
            sha256,
            eof: a.eof,
            op_key: a.op.key(),
            request_sha256: request,
            queued: a.at.cut,
        },
    )
    .await?;
    finish_op(
        conn,
        scope,
        a.op,
        &QueuedInput {
            exec_id: a.exec_id,
            input_seq,
        },
    )
    .await?;
    Ok(read_queued(conn, a.exec_id, input_seq).await?.0)
}

async fn queued_inputs_tx(
    conn: &mut PgConnection,
    a: &PendingArgs<'_>,
) -> Result<Vec<InputRecord>, Fail> {
    check_reading(conn, a.at).await?;
    fence(conn, a.cred, a.exec_id, a.at).await?;
    db::queued_inputs(conn, a.exec_id, a.limit).await
}

struct RecordSendArgs<'a> {
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    transition_id: &'a str,
    input_seq: i64,
}

async fn record_send_tx(
    conn: &mut PgConnection,
    a: &RecordSendArgs<'_>,
) -> Result<TransitionReceipt, Fail> {
    check_reading(conn, a.at).await?;
    let row = lock_owned(conn, a.exec_id).await?;
    let Some((input, _)) = db::read_input(conn, a.exec_id, a.input_seq, true).await? else {
        owner::check_owner(&row.ownership, a.cred, a.at)?;
        return Err(LcError::InvalidInput {
            reason: format!("exec {} has no input {}", a.exec_id, a.input_seq),
        }
        .into());
    };
    let request = owner::transition_request_sha256(
        TransitionKind::Send,
        a.exec_id,
        &input::send_args(&input),
    );
    let stored = db::read_transition(conn, a.exec_id, a.transition_id).await?;
    if let TransitionPlan::Replay(r) = owner::plan_transition(
        stored.as_ref(),
        TransitionKind::Send,
        request,
        &row.ownership,
        a.cred,
        a.at,
    )? {
        return Ok(r);
    }
    input::check_send(&input, db::sent_through(conn, a.exec_id).await?)?;
    let receipt = TransitionReceipt {
        exec_id: a.exec_id,
        transition_id: a.transition_id.to_owned(),
        kind: TransitionKind::Send,
        token_sha256: row.ownership.token_sha256,
        owner_generation: row.ownership.generation,
        owner_fence: row.ownership.fence,
        request_sha256: request,
        committed_cut: a.at.cut,
        detail: serde_json::json!({
            "input_seq": input.input_seq,
            "length": input.bytes.len(),
            "sha256": input.sha256.to_hex(),
            "eof": input.eof,
        }),
    };
    db::insert_transition(conn, &receipt).await?;
    db::touch_activity(conn, a.exec_id, a.at.cut).await?;
    if !db::mark_input_sent(conn, a.exec_id, a.input_seq, a.transition_id).await? {
        return Err(crate::error::corrupt(format!(
            "input {} of exec {} was queued and is not",
            a.input_seq, a.exec_id
        ))
        .into());
    }
    Ok(receipt)
}

// ---------------------------------------------------------------------------
// Hibernation and resume (`lc_core::hibernate`). Locks in the store's
// order: the sandbox Lease, the exec, the ownership, the workspace and
// hibernation rows, the Reservation, then Tollgate's rows.

/// What a `request_hibernation` records as its operation's result: the
/// hibernation it sealed, which a replay reads again (as it is now).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct SealedHibernation {
    exec_id: ExecId,
    attempt: AttemptNo,
    generation: Generation,
}

/// What a `request_resume` records as its operation's result.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct RecordedResume {
    exec_id: ExecId,
}

async fn read_hibernation(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
) -> Result<HibernationRecord, Fail> {
    Ok(db::hibernation(conn, exec, attempt, generation, false)
        .await?
        .ok_or_else(|| {
            crate::error::corrupt(format!(
                "the hibernation of exec {exec} attempt {attempt} generation {generation} vanished"
            ))
        })?)
}

struct RequestHibernationArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    exec_id: ExecId,
}

async fn request_hibernation_tx(
    conn: &mut PgConnection,
    a: &RequestHibernationArgs<'_>,
) -> Result<HibernationRecord, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    if let Begun::Replay(h) = begin_op::<SealedHibernation>(
        conn,
        a.store,
        scope,
        a.op,
        "request_hibernation",
        a.at,
        &cut,
    )
    .await?
    {
        if h.exec_id != a.exec_id {
            return Err(LcError::IdempotencyConflict {
                key: a.op.key().to_owned(),
            }
            .into());
        }
        return read_hibernation(conn, h.exec_id, h.attempt, h.generation).await;
    }
    rules::require_certain(a.at)?;
    if !db::lock_exec(conn, a.tenant, a.exec_id).await? {
        return Err(LcError::not_found("exec", a.exec_id).into());
    }
    let view = view_of(conn, a.exec_id).await?;
    let pv = db::parked_view(conn, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    let existing = db::hibernation(conn, a.exec_id, pv.attempt, pv.generation, true).await?;
    hibernate::plan_hibernation(
        HibernationView {
            exec_id: a.exec_id,
            exec_state: view.exec_state,
            attempt_state: pv.attempt_state,
            lease_state: view.lease_state,
            cancel_requested: view.cancel_requested,
            existing: existing.map(|h| h.step),
        },
        a.at,
    )?;
    let rec = HibernationRecord {
        exec_id: a.exec_id,
        attempt: pv.attempt,
        generation: pv.generation,
        lease_id: view.lease_id,
        reason: HibernationReason::Requested,
        sealed_cut: a.at.cut,
        step: HibernationStep::Sealed,
        head: None,
        refusal: None,
    };
    db::insert_hibernation(conn, &rec).await?;
    finish_op(
        conn,
        scope,
        a.op,
        &SealedHibernation {
            exec_id: rec.exec_id,
            attempt: rec.attempt,
            generation: rec.generation,
        },
    )
    .await?;
    Ok(rec)
}

async fn due_hibernations_tx(
    conn: &mut PgConnection,
    a: &(CutReading, usize),
) -> Result<Vec<HibernationRecord>, Fail> {
    let (at, limit) = *a;
    check_reading(conn, at).await?;
    if at.certain {
        for c in db::hibernation_candidates(conn, at.cut, limit).await? {
            let idle = c.idle_ttl_ms.is_some_and(|ms| {
                hibernate::idle_due(c.last_activity, SignedDuration::from_millis(ms), at)
            });
            let deadline = c.on_timeout == OnTimeout::Hibernate
                && c.timeout_deadline
                    .is_some_and(|d| hibernate::deadline_due(d, c.last_activity, at));
            let reason = if idle {
                HibernationReason::Idle
            } else if deadline {
                HibernationReason::Deadline
            } else {
                continue;
            };
            db::insert_hibernation(
                conn,
                &HibernationRecord {
                    exec_id: c.exec_id,
                    attempt: c.attempt,
                    generation: c.generation,
                    lease_id: c.lease_id,
                    reason,
                    sealed_cut: at.cut,
                    step: HibernationStep::Sealed,
                    head: None,
                    refusal: None,
                },
            )
            .await?;
        }
    }
    db::unfinished_hibernations(conn, limit).await
}

struct QuiescenceArgs<'a> {
    store: &'a LcStore,
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    generation: Generation,
    manifest: &'a [u8],
    head: Digest,
    evidence: &'a serde_json::Value,
    measurement: Option<&'a serde_json::Value>,
}

/// The verified statement of `evidence` (a DSSE envelope as JSON) signed
/// by `provider` about exactly `lease`'s id and generation.
async fn provider_statement(
    conn: &mut PgConnection,
    evidence: &serde_json::Value,
    lease: &LeaseRow,
) -> Result<evidence::Statement, Fail> {
    let provider = db::read_provider(conn, lease.provider_id.as_str())
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("provider {} is gone", lease.provider_id)))?;
    Ok(verified_statement(evidence, &provider, lease)?)
}

/// Locks, in the store's order, the Lease of `generation`, the exec and
/// its ownership, and the hibernation of that generation; checks that
/// `cred` owns the exec at `at`: live while the hibernation is `sealed`,
/// else (a replay of the step that ended it and released the ownership)
/// still this owner's and unexpired.
async fn lock_hibernation(
    conn: &mut PgConnection,
    cred: &OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    generation: Generation,
) -> Result<(LeaseRow, HibernationRecord), Fail> {
    let before = view_of(conn, exec_id).await?;
    let lease = lock_generation(conn, before.lease_id, generation).await?;
    db::lock_exec_state(conn, before.tenant_id, exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", exec_id))?;
    let owner_row = lock_owned(conn, exec_id).await?;
    let hib = db::hibernation(conn, exec_id, lease.attempt, lease.generation, true)
        .await?
        .ok_or_else(|| LcError::not_found("hibernation of generation", lease.generation))?;
    if hib.step == HibernationStep::Sealed {
        owner::check_owner(&owner_row.ownership, cred, at)?;
    } else {
        let held = Ownership {
            released: false,
            ..owner_row.ownership.clone()
        };
        owner::check_owner(&held, cred, at)?;
    }
    Ok((lease, hib))
}

async fn commit_quiescence_tx(
    conn: &mut PgConnection,
    a: &QuiescenceArgs<'_>,
) -> Result<HibernationRecord, Fail> {
    check_reading(conn, a.at).await?;
    let (lease, hib) = lock_hibernation(conn, a.cred, a.exec_id, a.at, a.generation).await?;
    if hib.step == HibernationStep::Refused {
        // The provider refused this generation's snapshot: nothing was
        // committed and nothing can be.
        return Err(LcError::IllegalTransition {
            what: "hibernation (its snapshot was refused)",
            from: hib.step.as_str(),
            to: HibernationStep::Quiesced.as_str(),
        }
        .into());
    }
    let statement = provider_statement(conn, a.evidence, &lease).await?;
    let ws = db::workspace_of(conn, a.exec_id, true)
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("exec {} has no workspace", a.exec_id)))?;
    if hib.step != HibernationStep::Sealed {
        // A replay: the same head is the committed record.
        if hib.head == Some(a.head) && ws.head == Some(a.head) {
            return Ok(hib);
        }
        return Err(LcError::WorkspaceHeadMismatch {
            workspace_id: ws.workspace_id,
            expected: hib.head,
            found: Some(a.head),
            reason: "this generation's quiescence is committed with another head".into(),
        }
        .into());
    }
    rules::plan_lease_transition(lease.state, LeaseState::ReleasePending)?;
    if lease.state != LeaseState::Active {
        return Err(LcError::IllegalTransition {
            what: "lease (quiescence needs an active Lease)",
            from: lease.state.as_str(),
            to: LeaseState::ReleasePending.as_str(),
        }
        .into());
    }
    let (head, manifest) = hibernate::check_quiescence(
        &statement,
        QuiescenceExpected {
            provider_id: lease.provider_id.as_str(),
            lease_id: lease.lease_id,
            generation: lease.generation,
            workspace_id: ws.workspace_id,
            current_head: ws.head,
        },
        a.manifest,
        a.head,
    )?;
    db::insert_snapshot(
        conn,
        &db::NewSnapshot {
            workspace_id: ws.workspace_id,
            digest: head,
            parent: manifest.parent,
            manifest: a.manifest,
            lease_id: lease.lease_id,
            generation: lease.generation,
            committed: a.at.cut,
        },
    )
    .await?;
    db::set_lease_state(conn, lease.lease_id, LeaseState::ReleasePending).await?;
    // A full Reservation TTL from here for the destroy to be proven.
    renew_reservation(conn, a.store, &lease, a.at).await?;
    db::set_hibernation_quiesced(conn, &hib, head, a.evidence).await?;
    if let Some(measurement) = a.measurement {
        keep_measurement(conn, &lease, measurement, a.at.cut).await?;
    }
    let observed =
        db::observation_through(conn, a.exec_id, lease.attempt, lease.generation).await?;
    db::insert_milestone(
        conn,
        &db::NewMilestone {
            exec_id: a.exec_id,
            attempt: lease.attempt,
            generation: lease.generation,
            lease_id: lease.lease_id,
            source: MilestoneSource::Hibernation,
            milestone: &Milestone::at(head, observed),
            recorded: a.at.cut,
        },
    )
    .await?;
    // The owner has nothing left to do for this generation.
    db::release_owner(conn, a.exec_id).await?;
    read_hibernation(conn, a.exec_id, lease.attempt, lease.generation).await
}

struct RefuseQuiescenceArgs<'a> {
    store: &'a LcStore,
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    generation: Generation,
    refusal: &'a QuiescenceRefusal,
}

async fn refuse_quiescence_tx(
    conn: &mut PgConnection,
    a: &RefuseQuiescenceArgs<'_>,
) -> Result<HibernationRecord, Fail> {
    rules::require_certain(a.at)?;
    check_reading(conn, a.at).await?;
    let refusal = hibernate::check_quiescence_refusal(a.refusal)?;
    let (lease, hib) = lock_hibernation(conn, a.cred, a.exec_id, a.at, a.generation).await?;
    // Read under the locks: the stopped page of this generation, acked.
    let view = view_of(conn, a.exec_id).await?;
    let stopped_acked =
        view.lease_generation == lease.generation && view.stopped_acked_seq.is_some();
    let Some(reason) = hibernate::plan_quiescence_refusal(
        hib.step,
        lease.state,
        stopped_acked,
        view.cancel_requested,
    )?
    else {
        return Ok(hib);
    };
    db::set_hibernation_refused(conn, &hib, &refusal).await?;
    enter_release_pending(conn, a.store, &lease, reason, None, a.at).await?;
    // The owner has nothing left to do for this generation.
    db::release_owner(conn, a.exec_id).await?;
    read_hibernation(conn, a.exec_id, lease.attempt, lease.generation).await
}

struct RequestResumeArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    exec_id: ExecId,
    head: Option<Digest>,
}

async fn request_resume_tx(
    conn: &mut PgConnection,
    a: &RequestResumeArgs<'_>,
) -> Result<ResumeIntent, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    if let Begun::Replay(r) =
        begin_op::<RecordedResume>(conn, a.store, scope, a.op, "request_resume", a.at, &cut).await?
    {
        let intent = db::resume_intent(conn, r.exec_id, a.op.key(), false).await?;
        return match intent {
            Some((i, _)) if i.exec_id == a.exec_id && a.head.is_none_or(|h| i.head == h) => Ok(i),
            _ => Err(LcError::IdempotencyConflict {
                key: a.op.key().to_owned(),
            }
            .into()),
        };
    }
    if !db::lock_exec(conn, a.tenant, a.exec_id).await? {
        return Err(LcError::not_found("exec", a.exec_id).into());
    }
    let pv = db::parked_view(conn, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    if pv.exec_state == ExecState::Terminal {
        return Err(LcError::ExecTerminal { exec_id: a.exec_id }.into());
    }
    if pv.exec_state != ExecState::Hibernated || pv.attempt_state != AttemptState::Parked {
        return Err(LcError::ExecNotParked {
            exec_id: a.exec_id,
            state: pv.attempt_state.as_str(),
        }
        .into());
    }
    // The key's operation record was collected, but the intent it
    // recorded on this exec is kept (a receipt refers to it): the key
    // cannot name a new request here.
    if db::resume_intent(conn, a.exec_id, a.op.key(), false)
        .await?
        .is_some()
    {
        return Err(LcError::IdempotencyConflict {
            key: a.op.key().to_owned(),
        }
        .into());
    }
    // One resume at a time: a second request while one is pending would
    // never be carried out (the first resumes the exec, and the second
    // names a generation that is no longer parked).
    if let Some(op_key) = db::actionable_intent(conn, a.exec_id).await? {
        return Err(LcError::ResumeInProgress {
            exec_id: a.exec_id,
            op_key,
        }
        .into());
    }
    let ws = db::workspace_of(conn, a.exec_id, false)
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("exec {} has no workspace", a.exec_id)))?;
    let head = match (a.head, ws.head) {
        (Some(named), Some(current)) if named == current => current,
        (None, Some(current)) => current,
        (named, current) => {
            return Err(LcError::WorkspaceHeadMismatch {
                workspace_id: ws.workspace_id,
                expected: current,
                found: named,
                reason: "a resume names the workspace's head: read it and resume from it".into(),
            }
            .into());
        }
    };
    // The resume takes the exec's units again: refused now, as an
    // admission is, rather than recorded to wait for capacity unseen.
    let tenant = db::read_tenant(conn, a.tenant)
        .await?
        .ok_or_else(|| LcError::not_found("tenant", a.tenant))?;
    if tenant.available < pv.units {
        return Err(LcError::InsufficientCapacity {
            requested: pv.units,
            available: tenant.available,
        }
        .into());
    }
    // The attempt's current generation: the parked one, or a prepared
    // resume's whose Lease was released without a commit.
    let from_generation = pv.generation;
    let intent = ResumeIntent {
        exec_id: a.exec_id,
        op_key: a.op.key().to_owned(),
        request_sha256: a.op.request_sha256(),
        head,
        attempt: pv.attempt,
        from_generation,
        recorded_cut: a.at.cut,
        refused: None,
    };
    db::insert_resume_intent(conn, &intent).await?;
    finish_op(conn, scope, a.op, &RecordedResume { exec_id: a.exec_id }).await?;
    Ok(intent)
}

struct ResumeArgs<'a> {
    store: &'a LcStore,
    cred: &'a OwnerCredential,
    exec_id: ExecId,
    at: CutReading,
    op_key: &'a str,
}

async fn prepare_resume_tx(conn: &mut PgConnection, a: &ResumeArgs<'_>) -> Result<LeaseWork, Fail> {
    let store = a.store;
    let cut = check_reading(conn, a.at).await?;
    let tenant = db::exec_tenant(conn, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    db::lock_exec_state(conn, tenant, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    fence(conn, a.cred, a.exec_id, a.at).await?;
    rules::require_certain(a.at)?;
    let (intent, prepared) = db::resume_intent(conn, a.exec_id, a.op_key, true)
        .await?
        .ok_or_else(|| LcError::not_found("resume request", a.op_key))?;
    if let Some(r) = intent.refused {
        return Err(LcError::ResumeRefused {
            exec_id: a.exec_id,
            op_key: a.op_key.to_owned(),
            code: r.code,
            message: r.message,
        }
        .into());
    }
    if let Some(lease) = prepared {
        return work_of(conn, lease, a.at).await;
    }
    let pv = db::parked_view(conn, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    if pv.exec_state != ExecState::Hibernated || pv.attempt_state != AttemptState::Parked {
        return Err(LcError::ExecNotParked {
            exec_id: a.exec_id,
            state: pv.attempt_state.as_str(),
        }
        .into());
    }
    hibernate::check_request_digest(a.exec_id, intent.head, intent.request_sha256)?;
    let ws = db::workspace_of(conn, a.exec_id, true)
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("exec {} has no workspace", a.exec_id)))?;
    if ws.head != Some(intent.head) {
        return Err(LcError::WorkspaceHeadMismatch {
            workspace_id: ws.workspace_id,
            expected: ws.head,
            found: Some(intent.head),
            reason: "the resume names another head than the workspace's".into(),
        }
        .into());
    }
    let live = db::other_live_leases(conn, a.exec_id, None).await?;
    if live > 0 || pv.generation != intent.from_generation {
        return Err(LcError::CompetingRight {
            exec_id: a.exec_id,
            reason: format!(
                "{live} unreleased Lease(s); the attempt is at generation {}, the resume parks generation {}",
                pv.generation, intent.from_generation
            ),
        }
        .into());
    }
    let lease_expiry = rules::deadline_after(a.at, store.config.lease_ttl)?;
    let reservation_ttl = store.config.reservation_ttl.min(store.policy.max_ttl());
    let reservation_deadline = rules::deadline_after(a.at, reservation_ttl)?
        .checked_add(store.policy.reclaim_grace())
        .unwrap_or(Timestamp::MAX);
    rules::check_admission(a.at, horizon(&cut), &[lease_expiry, reservation_deadline])?;
    let generation = Generation(intent.from_generation.0 + 1);
    let mut supplied = SuppliedTime::exact(a.at.cut);
    if let Some(bound) = rules::deadline_bound(a.at, horizon(&cut)) {
        supplied = supplied.with_deadline_limit(bound);
    }
    let grant = tollgate_pg::ops::acquire(
        conn,
        &store.tollgate,
        &AcquireRequest {
            account_id: AccountId(tenant.0),
            units: pv.units,
            ttl: reservation_ttl,
            idempotency_key: None,
        },
        supplied,
    )
    .await?;
    db::insert_reservation(
        conn,
        a.exec_id,
        pv.attempt,
        generation,
        grant.lease_id.0,
        grant.units,
        grant.expiry,
    )
    .await?;
    let lease_id = db::next_lease_id(conn).await?;
    db::insert_lease(
        conn,
        &db::NewLease {
            lease: lease_id,
            exec: a.exec_id,
            attempt: pv.attempt,
            generation,
            provider: &pv.provider_id,
            expiry: lease_expiry,
            restore_head: Some(intent.head),
        },
    )
    .await?;
    db::set_attempt_generation(conn, a.exec_id, pv.attempt, generation).await?;
    db::set_intent_prepared(conn, a.exec_id, a.op_key, lease_id).await?;
    work_of(conn, lease_id, a.at).await
}

async fn commit_resume_tx(
    conn: &mut PgConnection,
    a: &ResumeArgs<'_>,
) -> Result<ResumeReceipt, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let before = view_of(conn, a.exec_id).await?;
    let lease = lock_generation(conn, before.lease_id, before.lease_generation).await?;
    db::lock_exec_state(conn, before.tenant_id, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    let owner_row = fence(conn, a.cred, a.exec_id, a.at).await?;
    if let Some(r) = db::resume_receipt(conn, a.exec_id, a.op_key).await? {
        return Ok(r);
    }
    rules::require_certain(a.at)?;
    let (intent, prepared) = db::resume_intent(conn, a.exec_id, a.op_key, true)
        .await?
        .ok_or_else(|| LcError::not_found("resume request", a.op_key))?;
    let pv = db::parked_view(conn, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    let ws = db::workspace_of(conn, a.exec_id, true)
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("exec {} has no workspace", a.exec_id)))?;
    let attachment = match &lease.attachment {
        Some(ev) => match provider_statement(conn, ev, &lease).await? {
            evidence::Statement::Attachment {
                generation, head, ..
            } => Some((
                Generation(generation),
                Digest::from_hex(&head).map_err(|_| {
                    evidence_rejected("the recorded attachment's head is not a digest")
                })?,
            )),
            other => {
                return Err(evidence_rejected(format!(
                    "the recorded attachment is a {}",
                    other.kind()
                ))
                .into());
            }
        },
        None => None,
    };
    let other = db::other_live_leases(conn, a.exec_id, Some(lease.lease_id)).await?;
    let view = ResumeView {
        exec_id: a.exec_id,
        exec_state: pv.exec_state,
        attempt_state: pv.attempt_state,
        workspace_id: ws.workspace_id,
        workspace_head: ws.head,
        intent: intent.clone(),
        lease_generation: lease.generation,
        lease_state: lease.state,
        lease_expiry: lease.expiry,
        restore_head: lease.restore_head,
        attachment,
        other_live_leases: other,
    };
    hibernate::check_resume(&view, a.at)?;
    if prepared != Some(lease.lease_id) {
        return Err(LcError::CompetingRight {
            exec_id: a.exec_id,
            reason: format!(
                "Lease {} generation {} was prepared by another resume request",
                lease.lease_id, lease.generation
            ),
        }
        .into());
    }
    // The timeout bounds each run of the exec: the resumed run's starts
    // at this commit, inside the horizon like any new deadline.
    let timeout_deadline = match db::exec_timeout_ms(conn, a.exec_id).await? {
        Some(ms) => {
            let d = rules::deadline_after(a.at, SignedDuration::from_millis(ms))?;
            rules::check_admission(a.at, horizon(&cut), &[d])?;
            Some(d)
        }
        None => None,
    };
    let receipt = ResumeReceipt {
        exec_id: a.exec_id,
        op_key: a.op_key.to_owned(),
        attempt: pv.attempt,
        from_generation: intent.from_generation,
        to_generation: lease.generation,
        lease_id: lease.lease_id,
        head: intent.head,
        request_sha256: intent.request_sha256,
        token_sha256: owner_row.ownership.token_sha256,
        owner_generation: owner_row.ownership.generation.0,
        owner_fence: owner_row.ownership.fence.0,
        committed_cut: a.at.cut,
    };
    db::insert_resume_receipt(conn, &receipt).await?;
    db::set_attempt_state(conn, a.exec_id, pv.attempt, AttemptState::Runnable).await?;
    db::touch_activity(conn, a.exec_id, a.at.cut).await?;
    if let Some(d) = timeout_deadline {
        db::set_timeout_deadline(conn, a.exec_id, d).await?;
    }
    Ok(receipt)
}

struct AttachmentArgs<'a> {
    claim: Option<&'a ClaimCredential>,
    lease: SandboxLeaseId,
    generation: Generation,
    evidence: &'a serde_json::Value,
    at: CutReading,
}

async fn record_attachment_tx(
    conn: &mut PgConnection,
    a: &AttachmentArgs<'_>,
) -> Result<LeaseWork, Fail> {
    check_reading(conn, a.at).await?;
    fence_claim(conn, a.claim, a.lease).await?;
    let lease = lock_generation(conn, a.lease, a.generation).await?;
    let Some(restore_head) = lease.restore_head else {
        return Err(LcError::IllegalTransition {
            what: "lease (only a restoring Lease takes an attachment)",
            from: lease.state.as_str(),
            to: "attached",
        }
        .into());
    };
    if !matches!(lease.state, LeaseState::Allocating | LeaseState::Active) {
        return Err(LcError::IllegalTransition {
            what: "lease (an attachment is recorded while allocating or active)",
            from: lease.state.as_str(),
            to: "attached",
        }
        .into());
    }
    let statement = provider_statement(conn, a.evidence, &lease).await?;
    hibernate::check_attachment(
        &statement,
        AttachmentExpected {
            provider_id: lease.provider_id.as_str(),
            lease_id: lease.lease_id,
            generation: lease.generation,
            workspace_id: lease.workspace_id,
            restore_head,
        },
    )?;
    match &lease.attachment {
        Some(stored) if stored == a.evidence => {}
        Some(_) => {
            return Err(evidence_rejected(
                "another attachment is recorded on this Lease generation",
            )
            .into());
        }
        None => db::set_lease_attachment(conn, lease.lease_id, a.evidence).await?,
    }
    work_of(conn, a.lease, a.at).await
}

async fn record_measurement_tx(
    conn: &mut PgConnection,
    a: &AttachmentArgs<'_>,
) -> Result<AttemptObservation, Fail> {
    check_reading(conn, a.at).await?;
    fence_claim(conn, a.claim, a.lease).await?;
    let lease = lock_generation(conn, a.lease, a.generation).await?;
    if lease.state == LeaseState::Released {
        return Err(LcError::IllegalTransition {
            what: "lease (a released Lease's instance is gone: nothing is left to measure)",
            from: lease.state.as_str(),
            to: "measured",
        }
        .into());
    }
    keep_measurement(conn, &lease, a.evidence, a.at.cut).await
}

/// Verifies `evidence` as the provider's signed measurement of `lease`
/// and records it at `cut` unless the stored one is not superseded by it
/// ([`AttemptObservation::supersedes`]); returns the measurement kept.
async fn keep_measurement(
    conn: &mut PgConnection,
    lease: &LeaseRow,
    evidence: &serde_json::Value,
    cut: Timestamp,
) -> Result<AttemptObservation, Fail> {
    let statement = provider_statement(conn, evidence, lease).await?;
    let Some(measured) = statement.measured() else {
        return Err(evidence_rejected(format!(
            "not_a_measurement: the statement is {}, not measurement",
            statement.kind()
        ))
        .into());
    };
    match db::lock_measurement(conn, lease.lease_id).await? {
        Some(stored) if !measured.supersedes(&stored) => Ok(stored),
        _ => {
            db::write_measurement(
                conn,
                lease.lease_id,
                lease.exec_id,
                &measured,
                evidence,
                cut,
            )
            .await?;
            Ok(measured)
        }
    }
}

async fn tenant_workspace(
    conn: &mut PgConnection,
    tenant: TenantId,
    exec: ExecId,
) -> Result<WorkspaceRecord, Fail> {
    if db::exec_tenant(conn, exec).await? != Some(tenant) {
        return Err(LcError::not_found("exec", exec).into());
    }
    deletion::check_readable(
        db::deletion(conn, exec, DeletedItem::Workspace, false)
            .await?
            .as_ref(),
    )?;
    Ok(db::workspace_of(conn, exec, false)
        .await?
        .ok_or_else(|| crate::error::corrupt(format!("exec {exec} has no workspace")))?)
}

// ---------------------------------------------------------------------------
// Scoped tokens.

/// A mint after the checks that need no database.
struct MintArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    scope: TokenScope,
    ttl: SignedDuration,
    secret_sha256: Digest,
}

/// Mints a token: the key first (a replay returns the token as it is now,
/// revoked or not), then a certain cut with the deadline and the key's GC
/// instant inside `cut + horizon`, the tenant and the bound exec, then the
/// row.
async fn mint_token_tx(conn: &mut PgConnection, a: &MintArgs<'_>) -> Result<MintedToken, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    if let Begun::Replay(t) =
        begin_op::<TokenRecord>(conn, a.store, scope, a.op, "mint_token", a.at, &cut).await?
    {
        let now = db::lock_token(conn, a.tenant, t.token_id)
            .await?
            .ok_or_else(|| {
                crate::error::corrupt(format!("minted token {} vanished", t.token_id))
            })?;
        return Ok(MintedToken {
            token: now,
            replay: true,
        });
    }
    let deadline = rules::deadline_after(a.at, a.ttl)?;
    let op_gc =
        opkey::gc_at(a.at.cut, a.at.cut, a.store.config.operation_ttl).unwrap_or(Timestamp::MAX);
    rules::check_admission(a.at, horizon(&cut), &[deadline, op_gc])?;
    if db::read_tenant(conn, a.tenant).await?.is_none() {
        return Err(LcError::not_found("tenant", a.tenant).into());
    }
    if let Some(e) = a.scope.exec()
        && db::exec_tenant(conn, e).await? != Some(a.tenant)
    {
        return Err(LcError::not_found("exec", e).into());
    }
    let names = a.scope.operations().names();
    let token = db::insert_token(
        conn,
        &db::NewToken {
            tenant: a.tenant,
            secret_sha256: a.secret_sha256,
            exec: a.scope.exec(),
            operations: &names,
            minted: a.at.cut,
            deadline,
        },
    )
    .await?;
    finish_op(conn, scope, a.op, &token).await?;
    Ok(MintedToken {
        token,
        replay: false,
    })
}

/// Reads the token of a presented secret and judges it at `at` (a reading
/// not ahead of the persisted cut).
async fn accept_token_tx(
    conn: &mut PgConnection,
    a: &(Digest, CutReading),
) -> Result<Option<TokenRecord>, Fail> {
    let (digest, at) = *a;
    check_reading(conn, at).await?;
    let Some(t) = db::token_by_secret(conn, digest).await? else {
        return Ok(None);
    };
    lc_core::token::check_accepted(&t, at)?;
    Ok(Some(t))
}

/// Revokes a token once; a revoked one is returned as it is.
async fn revoke_token_tx(
    conn: &mut PgConnection,
    a: &(CutReading, TenantId, TokenId),
) -> Result<TokenRecord, Fail> {
    let (at, tenant, token) = *a;
    check_reading(conn, at).await?;
    let t = db::lock_token(conn, tenant, token)
        .await?
        .ok_or_else(|| LcError::not_found("token", token))?;
    if t.revoked_cut.is_some() {
        return Ok(t);
    }
    let revoked = db::revoke_token(conn, token, at.cut).await?;
    Ok(revoked)
}

// ---------------------------------------------------------------------------
// Deletion grace (lc_core::deletion): a delete records the deletion on a
// certain cut, an undelete removes it, the purge deletes the item's rows
// once a certain cut passed purge_after; the database re-checks the purge
// against the persisted cut (LCS90).

struct DeletionArgs<'a> {
    store: &'a LcStore,
    op: &'a OperationKey,
    at: CutReading,
    tenant: TenantId,
    exec_id: ExecId,
    item: DeletedItem,
}

fn deletion_kind(item: DeletedItem, undo: bool) -> &'static str {
    match (item, undo) {
        (DeletedItem::Workspace, false) => "delete_workspace",
        (DeletedItem::Workspace, true) => "undelete_workspace",
        (DeletedItem::Output, false) => "delete_output",
        (DeletedItem::Output, true) => "undelete_output",
    }
}

async fn delete_item_tx(
    conn: &mut PgConnection,
    a: &DeletionArgs<'_>,
) -> Result<DeletionRecord, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    let kind = deletion_kind(a.item, false);
    if let Begun::Replay(r) = begin_op(conn, a.store, scope, a.op, kind, a.at, &cut).await? {
        return Ok(r);
    }
    if !db::lock_exec(conn, a.tenant, a.exec_id).await? {
        return Err(LcError::not_found("exec", a.exec_id).into());
    }
    let exec = db::read_exec(conn, a.tenant, a.exec_id)
        .await?
        .ok_or_else(|| LcError::not_found("exec", a.exec_id))?;
    let current = db::deletion(conn, a.exec_id, a.item, true).await?;
    let rec = match deletion::plan_delete(
        a.exec_id,
        exec.state,
        a.item,
        current.as_ref(),
        a.at,
        a.store.config.deletion_grace,
        horizon(&cut),
    )? {
        DeletePlan::Record(d) => {
            db::insert_deletion(conn, &d).await?;
            d
        }
        DeletePlan::Already(d) => d,
    };
    finish_op(conn, scope, a.op, &rec).await?;
    Ok(rec)
}

async fn undelete_item_tx(
    conn: &mut PgConnection,
    a: &DeletionArgs<'_>,
) -> Result<DeletionRecord, Fail> {
    let cut = check_reading(conn, a.at).await?;
    let scope = OpScope::Tenant(a.tenant);
    let kind = deletion_kind(a.item, true);
    if let Begun::Replay(r) = begin_op(conn, a.store, scope, a.op, kind, a.at, &cut).await? {
        return Ok(r);
    }
    if !db::lock_exec(conn, a.tenant, a.exec_id).await? {
        return Err(LcError::not_found("exec", a.exec_id).into());
    }
    let current = db::deletion(conn, a.exec_id, a.item, true).await?;
    let rec = deletion::plan_undelete(a.exec_id, a.item, current.as_ref())?;
    db::remove_deletion(conn, a.exec_id, a.item).await?;
    finish_op(conn, scope, a.op, &rec).await?;
    Ok(rec)
}

/// Purges the records of the terminal exec whose retention passed
/// soonest at `at`, if any ([`deletion::plan_exec_purge`]), in one
/// transaction: how many rows went. `None` when none is due.
async fn purge_exec_tx(conn: &mut PgConnection, at: &CutReading) -> Result<Option<u64>, Fail> {
    check_reading(conn, *at).await?;
    let Some((exec, until)) = db::retention_candidate(conn, at.cut).await? else {
        return Ok(None);
    };
    let deletions = db::deletions_of(conn, exec).await?;
    if !deletion::plan_exec_purge(until, &deletions, *at) {
        return Ok(None);
    }
    Ok(Some(db::purge_exec_records(conn, exec).await?))
}

/// Purges the soonest due deletion, if any: its rows and its state, in
/// one transaction. `None` when nothing is due at `at`.
async fn purge_one_tx(
    conn: &mut PgConnection,
    at: &CutReading,
) -> Result<Option<(DeletionRecord, u64)>, Fail> {
    check_reading(conn, *at).await?;
    let candidates = db::purge_candidates(conn, at.cut, 1).await?;
    let Some(d) = deletion::plan_purge(&candidates, *at).into_iter().next() else {
        return Ok(None);
    };
    let rows = db::purge_item_rows(conn, d.exec_id, d.item).await?;
    db::set_deletion_purged(conn, &d, at.cut).await?;
    Ok(Some((d, rows)))
}

// ---------------------------------------------------------------------------
// The traits.

fn check_limit(limit: usize) -> Result<usize, LcError> {
    rules::check_limit(limit, rules::LIST_LIMIT_MAX)
}

#[async_trait]
impl ControlStore for LcStore {
    async fn create_tenant(
        &self,
        op: &OperationKey,
        at: CutReading,
        name: &str,
        units: Option<i64>,
        api_key_sha256: &(dyn Fn(TenantId) -> Digest + Send + Sync),
    ) -> Result<Tenant, LcError> {
        rules::check_tenant_name(name)?;
        tollgate::rules::check_account_name(name).map_err(crate::error::from_rule)?;
        if let Some(u) = units {
            rules::check_units(u)?;
        }
        let args = CreateTenantArgs {
            store: self,
            op,
            at,
            name,
            units,
            key_for: api_key_sha256,
        };
        self.run(Op::CreateTenant, &args, |c, a| {
            Box::pin(create_tenant_tx(c, a))
        })
        .await
    }

    async fn deposit(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        units: i64,
    ) -> Result<Tenant, LcError> {
        rules::check_units(units)?;
        let args = DepositArgs {
            store: self,
            op,
            at,
            tenant,
            units,
        };
        self.run(Op::Deposit, &args, |c, a| Box::pin(deposit_tx(c, a)))
            .await
    }

    async fn tenant(&self, tenant: TenantId) -> Result<Tenant, LcError> {
        self.run(Op::Read, &tenant, |c, t| {
            Box::pin(async move {
                db::read_tenant(c, *t)
                    .await?
                    .ok_or_else(|| LcError::not_found("tenant", *t).into())
            })
        })
        .await
    }

    async fn tenant_by_key(&self, api_key_sha256: Digest) -> Result<Option<TenantId>, LcError> {
        self.run(Op::Read, &api_key_sha256, |c, d| {
            Box::pin(db::tenant_by_key(c, *d))
        })
        .await
    }

    async fn register_runtime(
        &self,
        op: &OperationKey,
        at: CutReading,
        name: &str,
        digest: Digest,
        manifest: serde_json::Value,
    ) -> Result<Runtime, LcError> {
        rules::check_runtime_name(name)?;
        let args = RuntimeArgs {
            store: self,
            op,
            at,
            runtime: Runtime {
                name: name.to_owned(),
                digest,
                manifest,
            },
        };
        self.run(Op::RegisterRuntime, &args, |c, a| {
            Box::pin(register_runtime_tx(c, a))
        })
        .await
    }

    async fn runtimes(&self) -> Result<Vec<Runtime>, LcError> {
        self.run(Op::Read, &(), |c, _| {
            Box::pin(db::list_runtimes(c, rules::LIST_LIMIT_MAX))
        })
        .await
    }

    async fn admit_exec(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        req: &ExecRequest,
    ) -> Result<ExecRecord, LcError> {
        let command = Command::new(req.command.clone())?;
        let shape = Shape::by_name(&req.shape)?;
        let timeout = req
            .timeout_ms
            .map(|ms| rules::check_timeout_ms(ms).map(|d| (ms, d)))
            .transpose()?;
        if let Some(ms) = req.idle_ttl_ms {
            hibernate::check_idle_ttl_ms(ms)?;
        }
        if Digest::from_hex(&req.runtime).is_err() {
            rules::check_runtime_name(&req.runtime).map_err(|_| LcError::InvalidRuntime {
                reason: "a runtime is a name ([a-z0-9._-], 1 to 63) or a 64-hex-digit digest"
                    .into(),
            })?;
        }
        let args = AdmitArgs {
            store: self,
            op,
            at,
            tenant,
            runtime: &req.runtime,
            shape,
            command,
            timeout,
            stdin_open: req.stdin_open,
            idle_ttl_ms: req.idle_ttl_ms,
            on_timeout: req.on_timeout,
        };
        self.run(Op::Admit, &args, |c, a| Box::pin(admit_tx(c, a)))
            .await
    }

    async fn set_approval_policy(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        policy: &ApprovalPolicy,
    ) -> Result<Tenant, LcError> {
        let args = PolicyArgs {
            store: self,
            op,
            at,
            tenant,
            policy,
        };
        self.run(Op::Approval, &args, |c, a| {
            Box::pin(set_approval_policy_tx(c, a))
        })
        .await
    }

    async fn approve(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        approver: ApproverKind,
        validity_ms: Option<u64>,
    ) -> Result<ExecRecord, LcError> {
        let args = DecideArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
            approver,
            approve: Some(validity_ms),
            reason: None,
        };
        self.run(Op::Approval, &args, |c, a| Box::pin(decide_tx(c, a)))
            .await
    }

    async fn deny(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        approver: ApproverKind,
        reason: Option<&str>,
    ) -> Result<ExecRecord, LcError> {
        let args = DecideArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
            approver,
            approve: None,
            reason,
        };
        self.run(Op::Approval, &args, |c, a| Box::pin(decide_tx(c, a)))
            .await
    }

    async fn approvals(&self, tenant: TenantId, limit: usize) -> Result<ApprovalsPage, LcError> {
        let limit = check_limit(limit)?;
        self.run(Op::Read, &(tenant, limit), |c, (t, l)| {
            Box::pin(async move {
                Ok(ApprovalsPage {
                    awaiting: db::awaiting_execs(c, *t, *l).await?,
                    decisions: db::recent_approvals(c, *t, *l).await?,
                })
            })
        })
        .await
    }

    async fn exec(&self, tenant: TenantId, exec_id: ExecId) -> Result<ExecRecord, LcError> {
        self.run(Op::Read, &(tenant, exec_id), |c, (t, e)| {
            Box::pin(async move {
                db::read_exec(c, *t, *e)
                    .await?
                    .ok_or_else(|| LcError::not_found("exec", *e).into())
            })
        })
        .await
    }

    async fn execs(
        &self,
        tenant: TenantId,
        after: Option<ExecId>,
        limit: usize,
    ) -> Result<Vec<ExecRecord>, LcError> {
        let limit = check_limit(limit)?;
        self.run(Op::Read, &(tenant, after, limit), |c, (t, a, l)| {
            Box::pin(db::list_execs(c, *t, *a, *l))
        })
        .await
    }

    async fn output(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<StoredPage>, LcError> {
        let limit = check_limit(limit)?;
        self.run(
            Op::Read,
            &(tenant, exec_id, after_seq, limit),
            |c, (t, e, s, l)| {
                Box::pin(async move {
                    let rec = db::read_exec(c, *t, *e)
                        .await?
                        .ok_or_else(|| LcError::not_found("exec", *e))?;
                    deletion::check_readable(
                        db::deletion(c, *e, DeletedItem::Output, false)
                            .await?
                            .as_ref(),
                    )?;
                    db::read_pages(c, *e, rec.attempt, (*s).max(0), *l).await
                })
            },
        )
        .await
    }

    async fn cancel(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
    ) -> Result<ExecRecord, LcError> {
        let args = CancelArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
        };
        self.run(Op::Cancel, &args, |c, a| Box::pin(cancel_tx(c, a)))
            .await
    }

    async fn send_input(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        bytes: &[u8],
        eof: bool,
    ) -> Result<InputRecord, LcError> {
        let args = SendInputArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
            bytes,
            eof,
        };
        self.run(Op::Input, &args, |c, a| Box::pin(send_input_tx(c, a)))
            .await
    }

    async fn claims(
        &self,
        at: CutReading,
        after: Option<ClaimItem>,
        limit: usize,
    ) -> Result<Vec<ClaimRecord>, LcError> {
        let limit = check_limit(limit)?;
        let grace = claim::check_claim_grace(self.config.claim_grace)?;
        self.run(Op::Read, &(at, after, limit), |c, (at, after, l)| {
            Box::pin(async move {
                check_reading(c, *at).await?;
                let rows = db::claims_page(c, *after, *l).await?;
                Ok(rows
                    .into_iter()
                    .map(|claim| ClaimRecord::judge(claim, grace, *at))
                    .collect())
            })
        })
        .await
    }

    async fn operation(&self, scope: OpScope, key: &str) -> Result<OperationRecord, LcError> {
        self.run(Op::Read, &(scope, key), |c, (s, k)| {
            Box::pin(async move {
                db::read_operation(c, *s, k)
                    .await?
                    .ok_or_else(|| LcError::not_found("operation", *k).into())
            })
        })
        .await
    }

    async fn request_hibernation(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
    ) -> Result<HibernationRecord, LcError> {
        let args = RequestHibernationArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
        };
        self.run(Op::Hibernation, &args, |c, a| {
            Box::pin(request_hibernation_tx(c, a))
        })
        .await
    }

    async fn request_resume(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        head: Option<Digest>,
    ) -> Result<ResumeIntent, LcError> {
        let want = hibernate::resume_request_sha256(exec_id, head);
        if op.request_sha256() != want {
            return Err(LcError::RequestDigestMismatch {
                expected: want,
                found: op.request_sha256(),
            });
        }
        let args = RequestResumeArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
            head,
        };
        self.run(Op::Hibernation, &args, |c, a| {
            Box::pin(request_resume_tx(c, a))
        })
        .await
    }

    async fn workspace(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
    ) -> Result<WorkspaceRecord, LcError> {
        self.run(Op::Read, &(tenant, exec_id), |c, (t, e)| {
            Box::pin(tenant_workspace(c, *t, *e))
        })
        .await
    }

    async fn snapshots(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<SnapshotMeta>, LcError> {
        let limit = check_limit(limit)?;
        self.run(
            Op::Read,
            &(tenant, exec_id, after_seq, limit),
            |c, (t, e, s, l)| {
                Box::pin(async move {
                    let ws = tenant_workspace(c, *t, *e).await?;
                    db::list_snapshots(c, ws.workspace_id, (*s).max(0), *l).await
                })
            },
        )
        .await
    }

    async fn milestones(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        after_seq: u32,
        limit: usize,
    ) -> Result<Vec<MilestoneRecord>, LcError> {
        let limit = check_limit(limit)?;
        self.run(
            Op::Read,
            &(tenant, exec_id, after_seq, limit),
            |c, (t, e, s, l)| {
                Box::pin(async move {
                    if db::exec_tenant(c, *e).await? != Some(*t) {
                        return Err(LcError::not_found("exec", *e).into());
                    }
                    db::list_milestones(c, *e, *s, *l).await
                })
            },
        )
        .await
    }

    async fn snapshot_manifest(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        digest: Digest,
    ) -> Result<Vec<u8>, LcError> {
        self.run(Op::Read, &(tenant, exec_id, digest), |c, (t, e, d)| {
            Box::pin(async move {
                let ws = tenant_workspace(c, *t, *e).await?;
                db::snapshot_manifest(c, ws.workspace_id, *d)
                    .await?
                    .ok_or_else(|| LcError::not_found("snapshot", *d).into())
            })
        })
        .await
    }

    async fn mint_token(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        scope: TokenScope,
        ttl_ms: u64,
        secret_sha256: Digest,
    ) -> Result<MintedToken, LcError> {
        let ttl = lc_core::token::check_ttl_ms(ttl_ms, self.config.token_ttl_max)?;
        let args = MintArgs {
            store: self,
            op,
            at,
            tenant,
            scope,
            ttl,
            secret_sha256,
        };
        self.run(Op::Token, &args, |c, a| Box::pin(mint_token_tx(c, a)))
            .await
    }

    async fn accept_token(
        &self,
        secret_sha256: Digest,
        at: CutReading,
    ) -> Result<Option<TokenRecord>, LcError> {
        self.run(Op::Read, &(secret_sha256, at), |c, a| {
            Box::pin(accept_token_tx(c, a))
        })
        .await
    }

    async fn tokens(
        &self,
        tenant: TenantId,
        after: Option<TokenId>,
        limit: usize,
    ) -> Result<Vec<TokenRecord>, LcError> {
        let limit = check_limit(limit)?;
        self.run(Op::Read, &(tenant, after, limit), |c, (t, a, l)| {
            Box::pin(db::list_tokens(c, *t, *a, *l))
        })
        .await
    }

    async fn revoke_token(
        &self,
        at: CutReading,
        tenant: TenantId,
        token_id: TokenId,
    ) -> Result<TokenRecord, LcError> {
        self.run(Op::Token, &(at, tenant, token_id), |c, a| {
            Box::pin(revoke_token_tx(c, a))
        })
        .await
    }

    async fn delete_item(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        item: DeletedItem,
    ) -> Result<DeletionRecord, LcError> {
        let args = DeletionArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
            item,
        };
        self.run(Op::Deletion, &args, |c, a| Box::pin(delete_item_tx(c, a)))
            .await
    }

    async fn undelete_item(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        item: DeletedItem,
    ) -> Result<DeletionRecord, LcError> {
        let args = DeletionArgs {
            store: self,
            op,
            at,
            tenant,
            exec_id,
            item,
        };
        self.run(Op::Deletion, &args, |c, a| Box::pin(undelete_item_tx(c, a)))
            .await
    }
}

fn check_provider_url(url: &str) -> Result<(), LcError> {
    let ok = url.len() <= PROVIDER_URL_BYTES_MAX
        && (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() > "https://".len()
        && !url.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(LcError::InvalidProvider {
            reason: format!(
                "a provider url is http:// or https://, at most {PROVIDER_URL_BYTES_MAX} bytes, \
                 without spaces"
            ),
        })
    }
}

/// The reconciler's writes, each with the claim a claimed view presents
/// (`None` for the store's own, unclaimed calls).
impl LcStore {
    async fn mark_active_as(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        let args = LeaseArgs {
            store: self,
            claim,
            lease,
            generation,
            at,
        };
        self.run(Op::Transition, &args, |c, a| Box::pin(mark_active_tx(c, a)))
            .await
    }

    async fn renew_as(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        let args = LeaseArgs {
            store: self,
            claim,
            lease,
            generation,
            at,
        };
        self.run(Op::Renew, &args, |c, a| Box::pin(renew_tx(c, a)))
            .await
    }

    async fn append_pages_as(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        pages: &[OutputPage],
    ) -> Result<AppendReport, LcError> {
        rules::check_limit(pages.len(), rules::APPEND_PAGES_MAX)?;
        let args = AppendArgs {
            claim,
            lease,
            generation,
            pages,
        };
        self.run(Op::AppendPages, &args, |c, a| Box::pin(append_tx(c, a)))
            .await
    }

    async fn begin_release_as(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        reason: TerminalReason,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        let args = BeginReleaseArgs {
            claim,
            lease,
            generation,
            reason,
            at,
            store: self,
        };
        self.run(Op::Transition, &args, |c, a| {
            Box::pin(begin_release_tx(c, a))
        })
        .await
    }

    async fn commit_release_as(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<ReleaseOutcome, LcError> {
        rules::require_certain(at)?;
        let args = CommitArgs {
            store: self,
            claim,
            lease,
            generation,
            evidence,
            at,
        };
        self.run(Op::CommitRelease, &args, |c, a| {
            Box::pin(commit_release_tx(c, a))
        })
        .await
    }

    async fn record_measurement_as(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<AttemptObservation, LcError> {
        let args = AttachmentArgs {
            claim,
            lease,
            generation,
            evidence,
            at,
        };
        self.run(Op::Measurement, &args, |c, a| {
            Box::pin(record_measurement_tx(c, a))
        })
        .await
    }

    async fn record_attachment_as(
        &self,
        claim: Option<&ClaimCredential>,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        let args = AttachmentArgs {
            claim,
            lease,
            generation,
            evidence,
            at,
        };
        self.run(Op::Hibernation, &args, |c, a| {
            Box::pin(record_attachment_tx(c, a))
        })
        .await
    }
}

#[async_trait]
impl ReconcileStore for LcStore {
    async fn register_provider(
        &self,
        id: &ProviderId,
        url: &str,
        public_key: [u8; 32],
    ) -> Result<Provider, LcError> {
        check_provider_url(url)?;
        VerifyingKey::from_bytes(&public_key).map_err(|_| LcError::InvalidProvider {
            reason: "the public key is not an Ed25519 public key".into(),
        })?;
        self.run(
            Op::RegisterProvider,
            &(id, url, public_key),
            |c, (i, u, k)| {
                Box::pin(async move {
                    db::upsert_provider(c, i, u, k).await?.ok_or_else(|| {
                        LcError::AlreadyExists {
                            what: "provider (with another public key)",
                            name: i.to_string(),
                        }
                        .into()
                    })
                })
            },
        )
        .await
    }

    async fn due_work(&self, at: CutReading, limit: usize) -> Result<Vec<LeaseWork>, LcError> {
        let limit = check_limit(limit)?;
        self.run(Op::DueWork, &(at, limit), |c, (at, l)| {
            Box::pin(async move {
                check_reading(c, *at).await?;
                let rows = db::due_leases(c, *l).await?;
                // An unstarted gated Lease waits out an uncertain cut here.
                Ok(rows
                    .into_iter()
                    .filter(|r| plan_due(r, *at).is_some())
                    .map(|r| to_work(r, *at))
                    .collect())
            })
        })
        .await
    }

    async fn claim_due_work(
        &self,
        holder: &ClaimHolder,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<ClaimedWork>, LcError> {
        let limit = check_limit(limit)?;
        let args = ClaimDueArgs {
            store: self,
            holder,
            at,
            limit,
        };
        self.run(Op::DueWork, &args, |c, a| Box::pin(claim_due_work_tx(c, a)))
            .await
    }

    fn claimed(&self, claim: ClaimCredential) -> Box<dyn ReconcileStore + '_> {
        Box::new(ClaimedStore { store: self, claim })
    }

    async fn mark_active(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.mark_active_as(None, lease, generation, at).await
    }

    async fn renew(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.renew_as(None, lease, generation, at).await
    }

    async fn append_pages(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        pages: &[OutputPage],
    ) -> Result<AppendReport, LcError> {
        self.append_pages_as(None, lease, generation, pages).await
    }

    async fn begin_release(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        reason: TerminalReason,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.begin_release_as(None, lease, generation, reason, at)
            .await
    }

    async fn begin_release_not_sent(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.release_not_sent(None, lease, generation, evidence, at, None)
            .await
    }

    async fn refuse_restore(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
        refusal: &ResumeRefusal,
    ) -> Result<LeaseWork, LcError> {
        self.release_not_sent(None, lease, generation, evidence, at, Some(refusal))
            .await
    }

    async fn commit_release(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<ReleaseOutcome, LcError> {
        self.commit_release_as(None, lease, generation, evidence, at)
            .await
    }

    async fn attach_receipts(&self, at: CutReading, limit: usize) -> Result<usize, LcError> {
        let limit = check_limit(limit)?;
        if !at.certain {
            return Ok(0);
        }
        self.run(Op::OperationKeys, &(at, limit), |c, (at, l)| {
            Box::pin(async move {
                check_reading(c, *at).await?;
                let mut n = 0;
                for rec in db::receipt_candidates(c, at.cut, *l).await? {
                    if opkey::receipt_attachable(rec.floor, *at) {
                        db::attach_receipt(c, rec.scope, &rec.key).await?;
                        n += 1;
                    }
                }
                Ok(n)
            })
        })
        .await
    }

    async fn gc_operations(&self, at: CutReading, limit: usize) -> Result<usize, LcError> {
        let limit = check_limit(limit)?;
        if !at.certain {
            return Ok(0);
        }
        self.run(Op::OperationKeys, &(at, limit), |c, (at, l)| {
            Box::pin(async move {
                check_reading(c, *at).await?;
                let mut n = 0;
                for rec in db::gc_candidates(c, at.cut, *l).await? {
                    let ttl = SignedDuration::from_nanos(rec.ttl_ns);
                    if opkey::gc_due(rec.created_cut, rec.floor, ttl, rec.receipt_attached, *at) {
                        db::delete_operation(c, rec.scope, &rec.key).await?;
                        n += 1;
                    }
                }
                Ok(n)
            })
        })
        .await
    }

    async fn purge_due(&self, at: CutReading, limit: usize) -> Result<PurgeReport, LcError> {
        let limit = check_limit(limit)?;
        let mut report = PurgeReport::default();
        if !at.certain {
            return Ok(report);
        }
        // One transaction per purged item, so a step's transactions stay
        // small whatever an item holds; at most `limit` of them.
        for _ in 0..limit {
            let Some((d, rows)) = self
                .run(Op::Deletion, &at, |c, at| Box::pin(purge_one_tx(c, at)))
                .await?
            else {
                break;
            };
            match d.item {
                DeletedItem::Workspace => report.workspaces_purged += 1,
                DeletedItem::Output => report.outputs_purged += 1,
            }
            report.rows_purged += rows;
        }
        // Then the execs past their retention, in what is left of the
        // batch (a deletion purged above may have made its exec due).
        let left = limit - (report.workspaces_purged + report.outputs_purged);
        for _ in 0..left {
            let Some(rows) = self
                .run(Op::Deletion, &at, |c, at| Box::pin(purge_exec_tx(c, at)))
                .await?
            else {
                break;
            };
            report.execs_purged += 1;
            report.rows_purged += rows;
        }
        Ok(report)
    }

    async fn due_hibernations(
        &self,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<HibernationRecord>, LcError> {
        let limit = check_limit(limit)?;
        self.run(Op::Hibernation, &(at, limit), |c, a| {
            Box::pin(due_hibernations_tx(c, a))
        })
        .await
    }

    async fn record_attachment(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.record_attachment_as(None, lease, generation, evidence, at)
            .await
    }

    async fn record_measurement(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<AttemptObservation, LcError> {
        self.record_measurement_as(None, lease, generation, evidence, at)
            .await
    }

    async fn restore_manifest(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Vec<u8>, LcError> {
        self.run(Op::Read, &(lease, generation), |c, (l, g)| {
            Box::pin(async move {
                let d = db::due_lease(c, *l)
                    .await?
                    .ok_or_else(|| LcError::not_found("lease", *l))?;
                if d.lease.generation != *g {
                    return Err(fenced(&d.lease, *g));
                }
                let head = d
                    .lease
                    .restore_head
                    .ok_or_else(|| LcError::not_found("restore head of lease", *l))?;
                db::snapshot_manifest(c, d.workspace_id, head)
                    .await?
                    .ok_or_else(|| LcError::not_found("snapshot", head).into())
            })
        })
        .await
    }
}

/// [`LcStore`] as the holder of one claim sees it
/// ([`ReconcileStore::claimed`]): its writes on the claimed Lease are
/// fenced by the claim in their own transaction; everything else is the
/// store's.
struct ClaimedStore<'a> {
    store: &'a LcStore,
    claim: ClaimCredential,
}

#[async_trait]
impl ReconcileStore for ClaimedStore<'_> {
    async fn register_provider(
        &self,
        id: &ProviderId,
        url: &str,
        public_key: [u8; 32],
    ) -> Result<Provider, LcError> {
        self.store.register_provider(id, url, public_key).await
    }

    async fn due_work(&self, at: CutReading, limit: usize) -> Result<Vec<LeaseWork>, LcError> {
        self.store.due_work(at, limit).await
    }

    async fn claim_due_work(
        &self,
        holder: &ClaimHolder,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<ClaimedWork>, LcError> {
        self.store.claim_due_work(holder, at, limit).await
    }

    fn claimed(&self, claim: ClaimCredential) -> Box<dyn ReconcileStore + '_> {
        self.store.claimed(claim)
    }

    async fn purge_due(&self, at: CutReading, limit: usize) -> Result<PurgeReport, LcError> {
        self.store.purge_due(at, limit).await
    }

    async fn mark_active(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.store
            .mark_active_as(Some(&self.claim), lease, generation, at)
            .await
    }

    async fn renew(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.store
            .renew_as(Some(&self.claim), lease, generation, at)
            .await
    }

    async fn append_pages(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        pages: &[OutputPage],
    ) -> Result<AppendReport, LcError> {
        self.store
            .append_pages_as(Some(&self.claim), lease, generation, pages)
            .await
    }

    async fn begin_release(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        reason: TerminalReason,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.store
            .begin_release_as(Some(&self.claim), lease, generation, reason, at)
            .await
    }

    async fn begin_release_not_sent(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.store
            .release_not_sent(Some(&self.claim), lease, generation, evidence, at, None)
            .await
    }

    async fn refuse_restore(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
        refusal: &ResumeRefusal,
    ) -> Result<LeaseWork, LcError> {
        self.store
            .release_not_sent(
                Some(&self.claim),
                lease,
                generation,
                evidence,
                at,
                Some(refusal),
            )
            .await
    }

    async fn commit_release(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<ReleaseOutcome, LcError> {
        self.store
            .commit_release_as(Some(&self.claim), lease, generation, evidence, at)
            .await
    }

    async fn attach_receipts(&self, at: CutReading, limit: usize) -> Result<usize, LcError> {
        self.store.attach_receipts(at, limit).await
    }

    async fn gc_operations(&self, at: CutReading, limit: usize) -> Result<usize, LcError> {
        self.store.gc_operations(at, limit).await
    }

    async fn due_hibernations(
        &self,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<HibernationRecord>, LcError> {
        self.store.due_hibernations(at, limit).await
    }

    async fn record_attachment(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        self.store
            .record_attachment_as(Some(&self.claim), lease, generation, evidence, at)
            .await
    }

    async fn record_measurement(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<AttemptObservation, LcError> {
        self.store
            .record_measurement_as(Some(&self.claim), lease, generation, evidence, at)
            .await
    }

    async fn restore_manifest(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Vec<u8>, LcError> {
        self.store.restore_manifest(lease, generation).await
    }
}

#[async_trait]
impl GatewayStore for LcStore {
    async fn claim(
        &self,
        token: &OwnerToken,
        at: CutReading,
        ttl: SignedDuration,
        limit: usize,
    ) -> Result<Vec<OwnedExec>, LcError> {
        let limit = check_limit(limit)?;
        owner::check_heartbeat_ttl(ttl)?;
        let args = ClaimArgs {
            token_sha256: token.sha256(),
            at,
            ttl,
            limit,
        };
        self.run(Op::Claim, &args, |c, a| Box::pin(claim_tx(c, a)))
            .await
    }

    async fn take_over(
        &self,
        token: &OwnerToken,
        tenant: TenantId,
        exec_id: ExecId,
        at: CutReading,
        ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        owner::check_heartbeat_ttl(ttl)?;
        let args = TakeOverArgs {
            token_sha256: token.sha256(),
            tenant,
            exec_id,
            at,
            ttl,
        };
        self.run(Op::Claim, &args, |c, a| Box::pin(take_over_tx(c, a)))
            .await
    }

    async fn heartbeat(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        owner::check_heartbeat_ttl(ttl)?;
        let args = HeartbeatArgs {
            cred,
            exec_id,
            at,
            ttl,
        };
        self.run(Op::Heartbeat, &args, |c, a| Box::pin(heartbeat_tx(c, a)))
            .await
    }

    async fn stage_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        pages: &[PageMeta],
    ) -> Result<StageReport, LcError> {
        rules::check_limit(pages.len(), rules::APPEND_PAGES_MAX)?;
        let args = StageArgs {
            cred,
            exec_id,
            at,
            pages,
        };
        self.run(Op::StagePages, &args, |c, a| Box::pin(stage_tx(c, a)))
            .await
    }

    async fn pending_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<PageMeta>, LcError> {
        let limit = check_limit(limit)?;
        let args = PendingArgs {
            cred,
            exec_id,
            at,
            limit,
        };
        self.run(Op::StagePages, &args, |c, a| Box::pin(pending_tx(c, a)))
            .await
    }

    async fn ack_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        through_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        owner::check_transition_id(transition_id)?;
        let args = TransitionArgs {
            store: self,
            cred,
            exec_id,
            at,
            transition_id,
            kind: TransitionKind::Ack,
            through_seq,
        };
        self.run(Op::OwnerTransition, &args, |c, a| Box::pin(ack_tx(c, a)))
            .await
    }

    async fn cancel(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        owner::check_transition_id(transition_id)?;
        let args = TransitionArgs {
            store: self,
            cred,
            exec_id,
            at,
            transition_id,
            kind: TransitionKind::Cancel,
            through_seq: 0,
        };
        self.run(Op::OwnerTransition, &args, |c, a| {
            Box::pin(owner_cancel_tx(c, a))
        })
        .await
    }

    async fn release(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        owner::check_transition_id(transition_id)?;
        let args = TransitionArgs {
            store: self,
            cred,
            exec_id,
            at,
            transition_id,
            kind: TransitionKind::Release,
            through_seq: 0,
        };
        self.run(Op::OwnerTransition, &args, |c, a| {
            Box::pin(release_tx(c, a))
        })
        .await
    }

    async fn queued_inputs(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<InputRecord>, LcError> {
        let limit = check_limit(limit)?;
        let args = PendingArgs {
            cred,
            exec_id,
            at,
            limit,
        };
        self.run(Op::Input, &args, |c, a| Box::pin(queued_inputs_tx(c, a)))
            .await
    }

    async fn record_send(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        input_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        owner::check_transition_id(transition_id)?;
        let args = RecordSendArgs {
            cred,
            exec_id,
            at,
            transition_id,
            input_seq,
        };
        self.run(Op::Input, &args, |c, a| Box::pin(record_send_tx(c, a)))
            .await
    }

    async fn commit_quiescence(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        generation: Generation,
        manifest: &[u8],
        head: Digest,
        evidence: &serde_json::Value,
        measurement: Option<&serde_json::Value>,
    ) -> Result<HibernationRecord, LcError> {
        let args = QuiescenceArgs {
            store: self,
            cred,
            exec_id,
            at,
            generation,
            manifest,
            head,
            evidence,
            measurement,
        };
        self.run(Op::Hibernation, &args, |c, a| {
            Box::pin(commit_quiescence_tx(c, a))
        })
        .await
    }

    async fn refuse_quiescence(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        generation: Generation,
        refusal: &QuiescenceRefusal,
    ) -> Result<HibernationRecord, LcError> {
        let args = RefuseQuiescenceArgs {
            store: self,
            cred,
            exec_id,
            at,
            generation,
            refusal,
        };
        self.run(Op::Hibernation, &args, |c, a| {
            Box::pin(refuse_quiescence_tx(c, a))
        })
        .await
    }

    async fn prepare_resume(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        op_key: &str,
    ) -> Result<LeaseWork, LcError> {
        let args = ResumeArgs {
            store: self,
            cred,
            exec_id,
            at,
            op_key,
        };
        self.run(Op::Hibernation, &args, |c, a| {
            Box::pin(prepare_resume_tx(c, a))
        })
        .await
    }

    async fn commit_resume(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        op_key: &str,
    ) -> Result<ResumeReceipt, LcError> {
        let args = ResumeArgs {
            store: self,
            cred,
            exec_id,
            at,
            op_key,
        };
        self.run(Op::Hibernation, &args, |c, a| {
            Box::pin(commit_resume_tx(c, a))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_urls() {
        check_provider_url("http://127.0.0.1:7001").unwrap();
        check_provider_url("https://p.example").unwrap();
        for bad in [
            "",
            "ftp://x",
            "http://",
            "http://a b",
            &format!("http://{}", "a".repeat(2048)),
        ] {
            assert_eq!(
                check_provider_url(bad).unwrap_err().code(),
                "invalid_provider"
            );
        }
    }
}
