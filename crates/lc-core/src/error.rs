//! The one error type of Little Compute's rules and stores, with stable
//! snake_case codes ([`LcError::code`]) that the HTTP layer maps to
//! problem documents and the CLI prints.

use jiff::Timestamp;

use crate::claim::ClaimGeneration;
use crate::deletion::DeletedItem;
use crate::model::{Digest, ExecId, Generation, SandboxLeaseId, TenantId, WorkspaceId};
use crate::owner::OwnerGeneration;

/// A refusal by the rules, or a storage fault. Every variant has a stable
/// [`code`](LcError::code); messages never contain credentials or URLs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LcError {
    /// A command line the rules refuse (`invalid_command`).
    #[error("invalid command: {reason}")]
    InvalidCommand {
        /// What is wrong.
        reason: String,
    },
    /// No shape of this name (`invalid_shape`).
    #[error("invalid shape {name:?}: known shapes are small, medium, small-net")]
    InvalidShape {
        /// The name asked for.
        name: String,
    },
    /// A runtime reference, name or manifest the rules refuse
    /// (`invalid_runtime`).
    #[error("invalid runtime: {reason}")]
    InvalidRuntime {
        /// What is wrong.
        reason: String,
    },
    /// A timeout outside the accepted range (`invalid_timeout`).
    #[error("invalid timeout: {reason}")]
    InvalidTimeout {
        /// What is wrong.
        reason: String,
    },
    /// A unit count outside `1..=i64::MAX` (`invalid_units`).
    #[error("invalid units {units}: must be at least 1")]
    InvalidUnits {
        /// The units asked for.
        units: i64,
    },
    /// A deposit that would carry the tenant's balance past `i64::MAX`
    /// units (`units_overflow`, Tollgate's code for it): nothing is
    /// written; at most `i64::MAX - deposited` units are accepted now.
    #[error(
        "a deposit of {units} units into tenant {tenant_id} would carry its balance past the limit of {} units: it holds {deposited} deposited units, so the largest deposit it accepts now is {}",
        i64::MAX,
        i64::MAX - .deposited
    )]
    UnitsOverflow {
        /// The tenant.
        tenant_id: TenantId,
        /// The units asked for.
        units: i64,
        /// The units it holds deposited (at most `i64::MAX`; its
        /// available units are at most this).
        deposited: i64,
    },
    /// A tenant or runtime name the rules refuse (`invalid_name`).
    #[error("invalid name: {reason}")]
    InvalidName {
        /// What is wrong.
        reason: String,
    },
    /// An idempotency key the rules refuse (`invalid_operation_key`).
    #[error("invalid operation key: {reason}")]
    InvalidOperationKey {
        /// What is wrong.
        reason: String,
    },
    /// A page limit or batch size outside its bound (`invalid_limit`).
    #[error("invalid limit {limit}: must be in 1..={max}")]
    InvalidLimit {
        /// The limit asked for.
        limit: usize,
        /// The bound.
        max: usize,
    },
    /// A provider id the rules refuse (`invalid_provider_id`).
    #[error("invalid provider id: {reason}")]
    InvalidProviderId {
        /// What is wrong.
        reason: String,
    },
    /// A provider URL or public key the rules refuse (`invalid_provider`).
    #[error("invalid provider: {reason}")]
    InvalidProvider {
        /// What is wrong.
        reason: String,
    },
    /// A digest that is not 64 hex digits (`invalid_digest`).
    #[error("invalid digest: {reason}")]
    InvalidDigest {
        /// What is wrong.
        reason: String,
    },
    /// An output page the rules refuse: size, checksum, kind, seq order
    /// (`invalid_page`).
    #[error("invalid page: {reason}")]
    InvalidPage {
        /// What is wrong.
        reason: String,
    },
    /// A cut reading ahead of the persisted cut: no caller may invent time
    /// (`invalid_cut_reading`).
    #[error("invalid cut reading: {cut} is later than the persisted cut {persisted:?}")]
    InvalidCutReading {
        /// The reading's cut.
        cut: Timestamp,
        /// The persisted cut (`None`: no sampler has claimed yet).
        persisted: Option<Timestamp>,
    },
    /// Not enough available units for the shape (`insufficient_capacity`).
    #[error("insufficient capacity: {requested} units requested, {available} available")]
    InsufficientCapacity {
        /// Units the shape reserves.
        requested: i64,
        /// Units available on the tenant's account.
        available: i64,
    },
    /// The cut is uncertain: no deadline-bearing work is admitted and
    /// nothing expires or is released (`time_uncertain`, HTTP 503 with
    /// `Retry-After`).
    #[error("the safe expiry cut is uncertain; retry after {retry_after_s} s")]
    TimeUncertain {
        /// Seconds to wait before retrying.
        retry_after_s: u64,
    },
    /// The tenant already made `admissions_max` admissions in the current
    /// window (`rate_limited`, HTTP 429 with `Retry-After`).
    #[error(
        "rate limited: at most {admissions_max} admissions per {window:#}; retry after {retry_after_s} s"
    )]
    RateLimited {
        /// The most admissions per window.
        admissions_max: u32,
        /// The window.
        window: jiff::SignedDuration,
        /// Whole seconds until the oldest counted admission leaves the
        /// window.
        retry_after_s: u64,
    },
    /// An admission rate outside its bounds (`invalid_rate`).
    #[error("invalid admission rate: {reason}")]
    InvalidRate {
        /// Which bound failed.
        reason: String,
    },
    /// The operation key was used with another request
    /// (`idempotency_conflict`).
    #[error("idempotency key {key:?} was already used with a different request")]
    IdempotencyConflict {
        /// The key.
        key: String,
    },
    /// No such record visible to the caller (`not_found`).
    #[error("{what} {id} not found")]
    NotFound {
        /// What was looked for (`tenant`, `exec`, `runtime`, ...).
        what: &'static str,
        /// Its id as text.
        id: String,
    },
    /// A name is taken by another record (`already_exists`).
    #[error("{what} {name:?} already exists")]
    AlreadyExists {
        /// What kind of record.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A stale generation: the lease or attempt has moved on (`fenced`).
    #[error("lease {lease_id} generation {generation} is fenced: {reason}")]
    Fenced {
        /// The lease.
        lease_id: SandboxLeaseId,
        /// The stale generation.
        generation: Generation,
        /// Why.
        reason: String,
    },
    /// A deadline beyond `cut + horizon` (`deadline_beyond_horizon`).
    #[error("deadline {deadline} lies beyond cut + horizon = {bound}")]
    DeadlineBeyondHorizon {
        /// The deadline asked for.
        deadline: Timestamp,
        /// `cut + horizon`.
        bound: Timestamp,
    },
    /// A state transition the state machine does not have
    /// (`illegal_transition`).
    #[error("illegal {what} transition from {from} to {to}")]
    IllegalTransition {
        /// Which state machine (`lease`, `attempt`, `exec`).
        what: &'static str,
        /// The current state.
        from: &'static str,
        /// The state asked for.
        to: &'static str,
    },
    /// The exec is terminal: nothing more happens to it (`exec_terminal`).
    #[error("exec {exec_id} is terminal")]
    ExecTerminal {
        /// The exec.
        exec_id: ExecId,
    },
    /// Provider evidence that does not verify against the registered key
    /// or does not name this lease and generation (`evidence_rejected`).
    #[error("evidence rejected: {reason}")]
    EvidenceRejected {
        /// Why.
        reason: String,
    },
    /// A page with a stored seq but another sha256 (`page_conflict`).
    #[error("page {seq} of exec {exec_id} is stored with another sha256")]
    PageConflict {
        /// The exec.
        exec_id: ExecId,
        /// The seq.
        seq: i64,
    },
    /// No provider is registered to run the exec (`no_provider`).
    #[error("no provider is registered")]
    NoProvider,
    /// The exec has a live owner: neither released nor expired on a certain
    /// cut (`owner_live`). Another gateway may not take it over.
    #[error(
        "exec {exec_id} is owned (generation {generation}) until {heartbeat_expiry} on the cut"
    )]
    OwnerLive {
        /// The exec.
        exec_id: ExecId,
        /// The live owner's generation.
        generation: OwnerGeneration,
        /// Its heartbeat expiry on the cut.
        heartbeat_expiry: Timestamp,
    },
    /// The caller is not the exec's current owner: a takeover replaced it,
    /// or it released the exec (`owner_stale`). Stop acting for the exec.
    #[error(
        "exec {exec_id}: owner generation {presented} is stale (current generation {current}); stop acting for this exec"
    )]
    OwnerStale {
        /// The exec.
        exec_id: ExecId,
        /// The generation the caller presented.
        presented: OwnerGeneration,
        /// The current generation.
        current: OwnerGeneration,
    },
    /// Another worker holds a live claim on the item (`claim_live`): its
    /// expiry plus the grace has not passed on a certain cut.
    #[error("{item} is claimed (generation {generation}) until {expiry} on the cut")]
    ClaimLive {
        /// The item (`lease 7`).
        item: String,
        /// The live claim's generation.
        generation: ClaimGeneration,
        /// Its expiry on the cut.
        expiry: Timestamp,
    },
    /// The caller's claim on the item is not the current one
    /// (`claim_stale`): another worker took it (or it was never claimed).
    /// Nothing was written; stop acting on the item.
    #[error(
        "{item}: claim generation {presented} is stale (current generation {}); stop acting on it",
        current.map_or_else(|| "none".to_owned(), |g| g.to_string())
    )]
    ClaimStale {
        /// The item (`lease 7`).
        item: String,
        /// The generation the caller presented.
        presented: ClaimGeneration,
        /// The current generation, `None` when the item has no claim.
        current: Option<ClaimGeneration>,
    },
    /// A certain cut reached the owner's heartbeat expiry (`owner_expired`):
    /// the ownership may be taken over; stop acting for the exec.
    #[error(
        "exec {exec_id}: owner generation {generation} expired at {heartbeat_expiry} on the cut"
    )]
    OwnerExpired {
        /// The exec.
        exec_id: ExecId,
        /// The expired generation.
        generation: OwnerGeneration,
        /// Its heartbeat expiry.
        heartbeat_expiry: Timestamp,
    },
    /// A replay of a committed transition whose receipt does not belong to
    /// the current, unexpired owner presenting it
    /// (`transition_replay_refused`). Nothing changed.
    #[error(
        "exec {exec_id}: transition {transition_id:?} was committed by owner generation {receipt_generation}; it replays only for that owner while it is current and unexpired (current generation {current_generation})"
    )]
    TransitionReplayRefused {
        /// The exec.
        exec_id: ExecId,
        /// The transition id.
        transition_id: String,
        /// The generation that committed the receipt.
        receipt_generation: OwnerGeneration,
        /// The current generation.
        current_generation: OwnerGeneration,
    },
    /// A transition id the rules refuse (`invalid_transition_id`).
    #[error("invalid transition id: {reason}")]
    InvalidTransitionId {
        /// What is wrong.
        reason: String,
    },
    /// A terminal exec's Lease cannot be released yet: its terminal page is
    /// not sink-bound and acknowledged, and no proven-not-sent receipt
    /// exists (`release_not_proven`).
    #[error(
        "exec {exec_id}: its terminal output page is not acknowledged and no proven-not-sent receipt exists; a terminal process state alone does not release"
    )]
    ReleaseNotProven {
        /// The exec.
        exec_id: ExecId,
    },
    /// Input for a command's stdin that the rules refuse: too many bytes,
    /// no bytes without `eof`, or a seq the owner may not record as sent
    /// (`invalid_input`).
    #[error("invalid input: {reason}")]
    InvalidInput {
        /// What is wrong.
        reason: String,
    },
    /// The exec was admitted without `stdin_open`, so its command reads no
    /// input (`stdin_not_open`). Admit it with `stdin_open: true`.
    #[error("exec {exec_id} was admitted without stdin_open: its command reads no input")]
    StdinNotOpen {
        /// The exec.
        exec_id: ExecId,
    },
    /// The exec's stdin is closed: an `eof` input is already queued or sent
    /// (`input_closed`). Nothing more is accepted.
    #[error("exec {exec_id}: stdin was closed by input {eof_seq}; nothing more is accepted")]
    InputClosed {
        /// The exec.
        exec_id: ExecId,
        /// The seq of the `eof` input.
        eof_seq: i64,
    },
    /// The exec's input queue is at its bound (`input_queue_full`): retry
    /// once its owner has delivered some of it.
    #[error(
        "exec {exec_id}: the input queue holds {queued_inputs} inputs of {queued_bytes} bytes (at most {inputs_max} inputs and {bytes_max} bytes); retry once some are delivered"
    )]
    InputQueueFull {
        /// The exec.
        exec_id: ExecId,
        /// Inputs queued now.
        queued_inputs: u32,
        /// Bytes queued now.
        queued_bytes: u64,
        /// [`crate::input::INPUT_QUEUE_INPUTS_MAX`].
        inputs_max: u32,
        /// [`crate::input::INPUT_QUEUE_BYTES_MAX`].
        bytes_max: u64,
    },
    /// A snapshot or resume that names another head than the workspace
    /// holds, or a snapshot whose bytes are not its digest
    /// (`workspace_head_mismatch`). Read the workspace's head and start
    /// from it.
    #[error(
        "workspace {workspace_id}: its head is {}, the request names {}: {reason}",
        head_text(expected),
        head_text(found)
    )]
    WorkspaceHeadMismatch {
        /// The workspace.
        workspace_id: WorkspaceId,
        /// The head that had to be named.
        expected: Option<Digest>,
        /// The head that was named.
        found: Option<Digest>,
        /// Which check failed.
        reason: String,
    },
    /// A resume request whose digest is not the SHA-256 of the JCS of
    /// `{exec_id, head}` (`request_digest_mismatch`). Send the digest of
    /// exactly the request.
    #[error("request digest {found} is not the request's digest {expected}")]
    RequestDigestMismatch {
        /// The digest of the request.
        expected: Digest,
        /// The digest presented or recorded.
        found: Digest,
    },
    /// Another live right of the exec exists (an unreleased Lease of
    /// another generation, or no live attachment of the prepared one), so
    /// the resume may not proceed (`competing_right`). Wait for the other
    /// right to be released.
    #[error("exec {exec_id}: a competing right exists: {reason}")]
    CompetingRight {
        /// The exec.
        exec_id: ExecId,
        /// Which right.
        reason: String,
    },
    /// The exec's attempt is not parked, so it cannot be resumed
    /// (`exec_not_parked`).
    #[error(
        "exec {exec_id} is not parked (its attempt is {state}); only a hibernated exec resumes"
    )]
    ExecNotParked {
        /// The exec.
        exec_id: ExecId,
        /// The attempt's state.
        state: &'static str,
    },
    /// An approval decision (approve or deny) on an exec that is not
    /// awaiting approval (`exec_not_awaiting_approval`): it needed none, or
    /// was decided, cancelled or ended already. Nothing is written.
    #[error(
        "exec {exec_id} is {state}, not awaiting_approval; only an exec awaiting approval is approved or denied"
    )]
    ExecNotAwaitingApproval {
        /// The exec.
        exec_id: ExecId,
        /// Its state.
        state: &'static str,
    },
    /// An approval validity outside `1..=`
    /// [`crate::approval::APPROVAL_VALIDITY_MAX`] (`invalid_validity`).
    #[error("invalid approval validity: {reason}")]
    InvalidValidity {
        /// What is wrong.
        reason: String,
    },
    /// An approval policy the rules refuse (`invalid_approval_policy`).
    #[error("invalid approval policy: {reason}")]
    InvalidApprovalPolicy {
        /// What is wrong.
        reason: String,
    },
    /// The provider refused to restore this resume's workspace; the exec
    /// stays parked and this request is never prepared again
    /// (`resume_refused`).
    #[error(
        "the resume {op_key:?} of exec {exec_id} was refused by the provider ({code}: {message}); repair the snapshot's blobs and request the resume again under a new operation key"
    )]
    ResumeRefused {
        /// The exec.
        exec_id: ExecId,
        /// The resume's operation key.
        op_key: String,
        /// The provider's code.
        code: String,
        /// The provider's message.
        message: String,
    },
    /// The exec cannot hibernate now: it does not run with an active Lease
    /// (`exec_not_hibernatable`).
    #[error("exec {exec_id} cannot hibernate: {reason}")]
    ExecNotHibernatable {
        /// The exec.
        exec_id: ExecId,
        /// Why.
        reason: String,
    },
    /// A hibernation of the exec's current generation is already recorded
    /// (`hibernation_in_progress`): it proceeds on its own.
    #[error("exec {exec_id}: a hibernation is in progress (step {step})")]
    HibernationInProgress {
        /// The exec.
        exec_id: ExecId,
        /// Its step.
        step: &'static str,
    },
    /// A resume of the exec is recorded and not yet committed or refused
    /// (`resume_in_progress`): it proceeds on its own; a replay of its
    /// key shows where it stands, and a new request is taken once it
    /// committed (and the exec hibernated again) or was refused.
    #[error(
        "exec {exec_id}: a resume is in progress under the operation key {op_key:?}: wait for it (a replay of that key shows where it stands)"
    )]
    ResumeInProgress {
        /// The exec.
        exec_id: ExecId,
        /// The pending request's operation key.
        op_key: String,
    },
    /// A scoped token's scope the rules refuse at mint: no operation, an
    /// unknown or repeated one, or `exec.create` on a token bound to an
    /// exec (`invalid_token_scope`).
    #[error("invalid token scope: {reason}")]
    InvalidTokenScope {
        /// What is wrong.
        reason: String,
    },
    /// A scoped token asked for an operation outside its scope, or for
    /// another exec than the one it is bound to (`forbidden`, HTTP 403).
    #[error("{reason}")]
    TokenScope {
        /// Which operation or exec is missing from the scope.
        reason: String,
    },
    /// A certain cut reached the scoped token's deadline (`token_expired`,
    /// HTTP 401): mint a new one.
    #[error(
        "token {token_id} expired at {deadline} on the cut; mint a new one (POST /v1/tokens, lc token mint)"
    )]
    TokenExpired {
        /// The token.
        token_id: crate::token::TokenId,
        /// Its deadline.
        deadline: Timestamp,
    },
    /// The scoped token was revoked (`token_revoked`, HTTP 401): mint a
    /// new one.
    #[error("token {token_id} was revoked; mint a new one (POST /v1/tokens, lc token mint)")]
    TokenRevoked {
        /// The token.
        token_id: crate::token::TokenId,
    },
    /// A deletion of a workspace or output of an exec that is not terminal
    /// (`exec_not_terminal`): nothing is written.
    #[error(
        "exec {exec_id} is {state}: only a terminal exec's {item} can be deleted; cancel it (lc exec cancel {exec_id}) and delete its {item} once it has ended"
    )]
    ExecNotTerminal {
        /// The exec.
        exec_id: ExecId,
        /// Its state.
        state: &'static str,
        /// What was deleted.
        item: DeletedItem,
    },
    /// The exec's workspace or output is deleted and not yet purged
    /// (`workspace_deleted`, `output_deleted`): it is restorable until a
    /// certain cut reaches `purge_after`.
    #[error(
        "the {item} of exec {exec_id} is deleted and is purged once a certain cut reaches {purge_after}; until then `{undelete}` restores it"
    )]
    ItemDeleted {
        /// The exec.
        exec_id: ExecId,
        /// What was deleted.
        item: DeletedItem,
        /// The earliest cut of its purge.
        purge_after: Timestamp,
        /// The `lc` command that restores it.
        undelete: String,
    },
    /// The exec's workspace or output was purged after its deletion grace
    /// (`workspace_purged`, `output_purged`): it is gone for good.
    #[error(
        "the {item} of exec {exec_id} was deleted and purged{}: nothing restores it",
        .purged_at.map(|t| format!(" at cut {t}")).unwrap_or_default()
    )]
    ItemPurged {
        /// The exec.
        exec_id: ExecId,
        /// What was deleted.
        item: DeletedItem,
        /// The cut of the purge.
        purged_at: Option<Timestamp>,
    },
    /// An undelete of a workspace or output that is not deleted
    /// (`not_deleted`): nothing to restore.
    #[error("the {item} of exec {exec_id} is not deleted: there is nothing to undelete")]
    NotDeleted {
        /// The exec.
        exec_id: ExecId,
        /// What was deleted.
        item: DeletedItem,
    },
    /// The database could not be reached (`storage_unavailable`, HTTP
    /// 503).
    #[error("storage unavailable: {message}")]
    StorageUnavailable {
        /// What failed (never a URL or credential).
        message: String,
    },
    /// Any other storage fault, including stored data that does not decode
    /// (`storage_failure`).
    #[error("storage failure: {message}")]
    StorageFailure {
        /// What failed (never a URL or credential).
        message: String,
    },
}

impl LcError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            LcError::InvalidCommand { .. } => "invalid_command",
            LcError::InvalidShape { .. } => "invalid_shape",
            LcError::InvalidRuntime { .. } => "invalid_runtime",
            LcError::InvalidTimeout { .. } => "invalid_timeout",
            LcError::InvalidUnits { .. } => "invalid_units",
            LcError::UnitsOverflow { .. } => "units_overflow",
            LcError::InvalidName { .. } => "invalid_name",
            LcError::InvalidOperationKey { .. } => "invalid_operation_key",
            LcError::InvalidLimit { .. } => "invalid_limit",
            LcError::InvalidProviderId { .. } => "invalid_provider_id",
            LcError::InvalidProvider { .. } => "invalid_provider",
            LcError::InvalidDigest { .. } => "invalid_digest",
            LcError::InvalidPage { .. } => "invalid_page",
            LcError::InvalidCutReading { .. } => "invalid_cut_reading",
            LcError::InsufficientCapacity { .. } => "insufficient_capacity",
            LcError::TimeUncertain { .. } => "time_uncertain",
            LcError::RateLimited { .. } => "rate_limited",
            LcError::InvalidRate { .. } => "invalid_rate",
            LcError::IdempotencyConflict { .. } => "idempotency_conflict",
            LcError::NotFound { .. } => "not_found",
            LcError::AlreadyExists { .. } => "already_exists",
            LcError::Fenced { .. } => "fenced",
            LcError::DeadlineBeyondHorizon { .. } => "deadline_beyond_horizon",
            LcError::IllegalTransition { .. } => "illegal_transition",
            LcError::ExecTerminal { .. } => "exec_terminal",
            LcError::EvidenceRejected { .. } => "evidence_rejected",
            LcError::PageConflict { .. } => "page_conflict",
            LcError::NoProvider => "no_provider",
            LcError::OwnerLive { .. } => "owner_live",
            LcError::OwnerStale { .. } => "owner_stale",
            LcError::OwnerExpired { .. } => "owner_expired",
            LcError::ClaimLive { .. } => "claim_live",
            LcError::ClaimStale { .. } => "claim_stale",
            LcError::TransitionReplayRefused { .. } => "transition_replay_refused",
            LcError::InvalidTransitionId { .. } => "invalid_transition_id",
            LcError::ReleaseNotProven { .. } => "release_not_proven",
            LcError::InvalidInput { .. } => "invalid_input",
            LcError::StdinNotOpen { .. } => "stdin_not_open",
            LcError::InputClosed { .. } => "input_closed",
            LcError::InputQueueFull { .. } => "input_queue_full",
            LcError::WorkspaceHeadMismatch { .. } => "workspace_head_mismatch",
            LcError::RequestDigestMismatch { .. } => "request_digest_mismatch",
            LcError::CompetingRight { .. } => "competing_right",
            LcError::ExecNotParked { .. } => "exec_not_parked",
            LcError::ExecNotAwaitingApproval { .. } => "exec_not_awaiting_approval",
            LcError::InvalidValidity { .. } => "invalid_validity",
            LcError::InvalidApprovalPolicy { .. } => "invalid_approval_policy",
            LcError::ResumeRefused { .. } => "resume_refused",
            LcError::ExecNotHibernatable { .. } => "exec_not_hibernatable",
            LcError::HibernationInProgress { .. } => "hibernation_in_progress",
            LcError::ResumeInProgress { .. } => "resume_in_progress",
            LcError::InvalidTokenScope { .. } => "invalid_token_scope",
            LcError::TokenScope { .. } => "forbidden",
            LcError::TokenExpired { .. } => "token_expired",
            LcError::TokenRevoked { .. } => "token_revoked",
            LcError::ExecNotTerminal { .. } => "exec_not_terminal",
            LcError::ItemDeleted { item, .. } => match item {
                DeletedItem::Workspace => "workspace_deleted",
                DeletedItem::Output => "output_deleted",
            },
            LcError::ItemPurged { item, .. } => match item {
                DeletedItem::Workspace => "workspace_purged",
                DeletedItem::Output => "output_purged",
            },
            LcError::NotDeleted { .. } => "not_deleted",
            LcError::StorageUnavailable { .. } => "storage_unavailable",
            LcError::StorageFailure { .. } => "storage_failure",
        }
    }

    /// Whether the caller may simply retry later without changing the
    /// request: `time_uncertain`, `rate_limited` and `storage_unavailable`.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LcError::TimeUncertain { .. }
                | LcError::RateLimited { .. }
                | LcError::StorageUnavailable { .. }
        )
    }

    /// Shorthand for [`LcError::NotFound`].
    pub fn not_found(what: &'static str, id: impl ToString) -> LcError {
        LcError::NotFound {
            what,
            id: id.to_string(),
        }
    }
}

/// A workspace head as an error message shows it: 64 hex digits, or
/// `none` for a workspace with no snapshot yet.
fn head_text(head: &Option<Digest>) -> String {
    head.map_or_else(|| "none".to_owned(), |d| d.to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_mismatch_names_the_workspace_head_then_the_requested_one_in_hex() {
        let e = LcError::WorkspaceHeadMismatch {
            workspace_id: WorkspaceId(2),
            expected: Some(Digest([0xd4; 32])),
            found: None,
            reason: "read the head".into(),
        };
        assert_eq!(
            e.to_string(),
            format!(
                "workspace 2: its head is {}, the request names none: read the head",
                "d4".repeat(32)
            )
        );
    }

    #[test]
    fn codes_are_stable_snake_case() {
        let samples = [
            LcError::InsufficientCapacity {
                requested: 2,
                available: 1,
            },
            LcError::TimeUncertain { retry_after_s: 1 },
            LcError::IdempotencyConflict { key: "k".into() },
            LcError::not_found("exec", 7),
            LcError::NoProvider,
        ];
        let codes: Vec<&str> = samples.iter().map(LcError::code).collect();
        assert_eq!(
            codes,
            [
                "insufficient_capacity",
                "time_uncertain",
                "idempotency_conflict",
                "not_found",
                "no_provider"
            ]
        );
        assert_eq!(samples[3].to_string(), "exec 7 not found");
        assert!(samples[1].is_transient());
        assert!(!samples[0].is_transient());
    }
}
