//! The store traits: what the control plane ([`ControlStore`], used by the
//! HTTP API), the reconciler ([`ReconcileStore`], used by the workers) and
//! the exec gateways ([`GatewayStore`]) ask of Little Compute's store.
//! `lc-pg` implements all three on PostgreSQL.
//!
//! # Contract
//!
//! * Every mutating client-facing method takes `op` (the request's
//!   operation key) and `at` (the caller's reading of the safe-cut clock).
//!   A replay (same scope, key and request digest) returns the recorded
//!   result and changes nothing; the same key with another digest is
//!   [`LcError::IdempotencyConflict`].
//! * The store refuses a reading whose cut is later than the persisted cut
//!   ([`LcError::InvalidCutReading`]).
//! * A method that fails changes nothing.
//! * Lists are bounded by their `limit` (`1..=`[`crate::rules::LIST_LIMIT_MAX`]).

use async_trait::async_trait;

use crate::approval::{ApprovalPolicy, ApprovalsPage, ApproverKind};
use crate::claim::{ClaimCredential, ClaimHolder, ClaimItem, ClaimRecord, ClaimedWork};
use crate::deletion::{DeletedItem, DeletionRecord};
use crate::error::LcError;
use crate::hibernate::{
    HibernationRecord, ResumeIntent, ResumeReceipt, SnapshotMeta, WorkspaceRecord,
};
use crate::input::InputRecord;
use crate::model::{
    AppendReport, CutReading, Digest, ExecId, ExecRecord, ExecRequest, Generation, LeaseWork,
    OpScope, OperationRecord, OutputPage, Provider, ProviderId, ReleaseOutcome, Runtime,
    SandboxLeaseId, Tenant, TenantId, TerminalReason,
};
use crate::opkey::OperationKey;
use crate::owner::{
    OwnedExec, OwnerCredential, OwnerToken, PageMeta, StageReport, StoredPage, TransitionReceipt,
};

/// What the control-plane API needs.
#[async_trait]
pub trait ControlStore: Send + Sync {
    /// Creates a tenant: a Tollgate account named `name`, with `units`
    /// deposited when given, and the SHA-256 of its API key, which
    /// `api_key_sha256` computes from the new tenant's id (the API derives
    /// the key from a server secret and the id, so a replay re-derives the
    /// same key and nothing secret is stored). Admin scope.
    ///
    /// # Errors
    /// `invalid_name`, `invalid_units`, `already_exists` (another tenant
    /// has the name), `idempotency_conflict`, `invalid_cut_reading`,
    /// storage errors.
    async fn create_tenant(
        &self,
        op: &OperationKey,
        at: CutReading,
        name: &str,
        units: Option<i64>,
        api_key_sha256: &(dyn Fn(TenantId) -> Digest + Send + Sync),
    ) -> Result<Tenant, LcError>;

    /// Deposits `units` into `tenant`'s account. Tenant scope.
    ///
    /// # Errors
    /// `invalid_units`, `not_found`, `idempotency_conflict`,
    /// `invalid_cut_reading`, storage errors.
    async fn deposit(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        units: i64,
    ) -> Result<Tenant, LcError>;

    /// The tenant with its Tollgate balances.
    ///
    /// # Errors
    /// `not_found`, storage errors.
    async fn tenant(&self, tenant: TenantId) -> Result<Tenant, LcError>;

    /// The tenant whose API key has this SHA-256, if any.
    ///
    /// # Errors
    /// Storage errors.
    async fn tenant_by_key(&self, api_key_sha256: Digest) -> Result<Option<TenantId>, LcError>;

    /// Registers runtime `name` with `digest` and its manifest. Admin
    /// scope. Registering the same name and digest again returns the
    /// record; another digest under a taken name is `already_exists`.
    ///
    /// # Errors
    /// `invalid_name`, `already_exists`, `idempotency_conflict`,
    /// `invalid_cut_reading`, storage errors.
    async fn register_runtime(
        &self,
        op: &OperationKey,
        at: CutReading,
        name: &str,
        digest: Digest,
        manifest: serde_json::Value,
    ) -> Result<Runtime, LcError>;

    /// Every runtime, by name (at most [`crate::rules::LIST_LIMIT_MAX`]).
    ///
    /// # Errors
    /// Storage errors.
    async fn runtimes(&self) -> Result<Vec<Runtime>, LcError>;

    /// Admits an exec in one transaction: validates the request, checks the
    /// key, needs a certain cut not ahead of the persisted one and every
    /// deadline within `cut + horizon`, then creates the exec (canonical
    /// identity), attempt 1, Reservation generation 1 (a Tollgate grant of
    /// the shape's units on the tenant's account) and Lease generation 1
    /// `allocating` with its expiry on the cut. Tenant scope.
    ///
    /// # Errors
    /// `invalid_command`, `invalid_shape`, `invalid_timeout`,
    /// `invalid_runtime`, `not_found` (tenant or runtime),
    /// `time_uncertain`, `invalid_cut_reading`, `deadline_beyond_horizon`,
    /// `insufficient_capacity`, `no_provider`, `idempotency_conflict`,
    /// storage errors. Nothing is written on any of them.
    ///
    /// An exec whose shape the tenant's approval policy gates is admitted
    /// `awaiting_approval` instead (the same checks, the rate and the
    /// horizon included, but no capacity): exec and attempt 1 only, no
    /// Reservation and no Lease, until [`ControlStore::approve`].
    async fn admit_exec(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        req: &ExecRequest,
    ) -> Result<ExecRecord, LcError>;

    /// Sets `tenant`'s approval policy (checked by
    /// [`crate::approval::ApprovalPolicy::new`]). Admin scope. It decides
    /// later admissions; an exec already awaiting approval keeps waiting.
    ///
    /// # Errors
    /// `not_found`, `idempotency_conflict`, `invalid_cut_reading`,
    /// `time_uncertain` (no cut yet), storage errors.
    async fn set_approval_policy(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        policy: &ApprovalPolicy,
    ) -> Result<Tenant, LcError>;

    /// Approves `tenant`'s exec awaiting approval at a certain `at`, doing
    /// the rest of its admission in one transaction: records the approval
    /// (`approver`, decided cut `at.cut`, `valid_until = at.cut +
    /// validity`, validity `validity_ms` or the store's default, at most
    /// [`crate::approval::APPROVAL_VALIDITY_MAX`]), grants the Reservation
    /// and inserts Lease generation 1 `allocating` (its canonical lease
    /// id), its timeout counted from here, and moves the exec to
    /// `admitted`. Tenant scope: a replay of `op` returns the recorded
    /// exec.
    ///
    /// # Errors
    /// `time_uncertain`, `invalid_validity`, `not_found` (also another
    /// tenant's exec), `exec_not_awaiting_approval`,
    /// `deadline_beyond_horizon`, `insufficient_capacity` (the exec keeps
    /// awaiting), `idempotency_conflict`, `invalid_cut_reading`, storage
    /// errors. Nothing is written on any of them.
    async fn approve(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        approver: ApproverKind,
        validity_ms: Option<u64>,
    ) -> Result<ExecRecord, LcError>;

    /// Denies `tenant`'s exec awaiting approval: records the denial and
    /// ends the exec `denied` (it never held capacity). Tenant scope: a
    /// replay of `op` returns the recorded exec.
    ///
    /// # Errors
    /// `invalid_name` (a reason over its bound), `not_found`,
    /// `exec_not_awaiting_approval`, `idempotency_conflict`,
    /// `invalid_cut_reading`, `time_uncertain` (no cut yet), storage
    /// errors. Nothing is written on any of them.
    async fn deny(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        approver: ApproverKind,
        reason: Option<&str>,
    ) -> Result<ExecRecord, LcError>;

    /// `tenant`'s execs awaiting approval (oldest first) and its newest
    /// decisions, at most `limit` of each.
    ///
    /// # Errors
    /// `invalid_limit`, storage errors.
    async fn approvals(&self, tenant: TenantId, limit: usize) -> Result<ApprovalsPage, LcError>;

    /// One exec of `tenant`.
    ///
    /// # Errors
    /// `not_found` (also for another tenant's exec), storage errors.
    async fn exec(&self, tenant: TenantId, exec_id: ExecId) -> Result<ExecRecord, LcError>;

    /// `tenant`'s execs with id `> after` (all when `None`), ascending, at
    /// most `limit`.
    ///
    /// # Errors
    /// `invalid_limit`, storage errors.
    async fn execs(
        &self,
        tenant: TenantId,
        after: Option<ExecId>,
        limit: usize,
    ) -> Result<Vec<ExecRecord>, LcError>;

    /// The current attempt's acknowledged pages with seq `> after_seq`,
    /// ascending, at most `limit` (`1..=`[`crate::rules::LIST_LIMIT_MAX`]):
    /// metadata, with the bytes only for pages the store holds the bytes
    /// of (the rest are in the sink under their digest). A page whose
    /// metadata is committed but not yet acknowledged is not returned, nor
    /// any page after it.
    ///
    /// # Errors
    /// `not_found`, `invalid_limit`, storage errors.
    async fn output(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<StoredPage>, LcError>;

    /// Asks to cancel an exec: records the request. The exec's owning
    /// gateway then commits the cancel, stops the command and releases the
    /// Lease once the terminal page is acked; a Lease that is not active yet
    /// is released by the reconciler. A hibernated exec with no unreleased
    /// Lease becomes terminal (`cancelled`) at once, and so does an exec
    /// awaiting approval (it holds nothing to return). A terminal exec is
    /// returned as it is.
    /// Tenant scope.
    ///
    /// # Errors
    /// `not_found`, `idempotency_conflict`, `invalid_cut_reading`, storage
    /// errors.
    async fn cancel(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
    ) -> Result<ExecRecord, LcError>;

    /// Queues input for the command's stdin: `bytes`
    /// (`0..=`[`crate::input::INPUT_BYTES_MAX`]; none only with `eof`),
    /// then, with `eof`, stdin closes. The input gets the exec's next input
    /// seq (`1, 2, ...` without gaps) and state `queued`; the exec's owner
    /// delivers it ([`GatewayStore::queued_inputs`],
    /// [`GatewayStore::record_send`]). Tenant scope: a replay of `op`
    /// returns the recorded input as it is now (queued or sent); the same
    /// key with other bytes or another `eof` is `idempotency_conflict`.
    ///
    /// # Errors
    /// `not_found` (also another tenant's exec), `exec_terminal`,
    /// `stdin_not_open`, `invalid_input`, `input_closed`,
    /// `input_queue_full` (at most [`crate::input::INPUT_QUEUE_INPUTS_MAX`]
    /// inputs and [`crate::input::INPUT_QUEUE_BYTES_MAX`] bytes queued),
    /// `idempotency_conflict`, `invalid_cut_reading`, `time_uncertain` (no
    /// cut yet), storage errors. Nothing is written on any of them.
    async fn send_input(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        bytes: &[u8],
        eof: bool,
    ) -> Result<InputRecord, LcError>;

    /// Workers' claims with item `> after` (all when `None`), by item
    /// (kind, then id), at most `limit`, each judged at `at` with the
    /// store's claim grace (expired, takeable). Admin scope.
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_cut_reading`, `time_uncertain` (no cut
    /// yet), storage errors.
    async fn claims(
        &self,
        at: CutReading,
        after: Option<ClaimItem>,
        limit: usize,
    ) -> Result<Vec<ClaimRecord>, LcError>;

    /// An operation key and its recorded result.
    ///
    /// # Errors
    /// `not_found`, storage errors.
    async fn operation(&self, scope: OpScope, key: &str) -> Result<OperationRecord, LcError>;

    /// Seals a hibernation of the exec's current attempt generation
    /// (reason `requested`) at a certain `at`: the exec runs with an
    /// `active` Lease and no hibernation of that generation exists. The
    /// sealed cut is `at.cut`. Tenant scope: a replay of `op` returns the
    /// recorded hibernation as it is now.
    ///
    /// # Errors
    /// `time_uncertain`, `not_found` (also another tenant's exec),
    /// `exec_terminal`, `exec_not_hibernatable`, `hibernation_in_progress`,
    /// `idempotency_conflict`, `invalid_cut_reading`, storage errors.
    /// Nothing is written on any of them.
    async fn request_hibernation(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
    ) -> Result<HibernationRecord, LcError>;

    /// Records a request to resume the parked exec from `head` (`None`:
    /// the workspace's head, resolved when it is recorded); the attempt
    /// stays parked until its owner commits the resume
    /// ([`GatewayStore::prepare_resume`], [`GatewayStore::commit_resume`]).
    /// `op`'s request digest must be
    /// [`crate::hibernate::resume_request_sha256`]`(exec_id, head)`. Tenant
    /// scope: a replay of `op` returns the recorded intent (for a request
    /// without a head, whatever the workspace's head is by then). A
    /// request is refused while the tenant's available units are fewer
    /// than the exec's: the resume would wait for capacity unseen.
    ///
    /// # Errors
    /// `request_digest_mismatch`, `not_found`, `exec_terminal` (the exec
    /// ended, e.g. its command exited before a sealed hibernation stopped
    /// it), `exec_not_parked`,
    /// `workspace_head_mismatch` (`head` is not the workspace's head),
    /// `idempotency_conflict` (also an operation key whose record was
    /// collected but whose intent on this exec is kept: use a new key),
    /// `resume_in_progress` (another request of the exec is recorded and
    /// neither committed nor refused: one resume at a time),
    /// `insufficient_capacity` (the tenant's available units are fewer
    /// than the exec's), `invalid_cut_reading`, `time_uncertain` (no cut
    /// yet), storage errors. Nothing is written on any of them.
    async fn request_resume(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        head: Option<Digest>,
    ) -> Result<ResumeIntent, LcError>;

    /// The exec's workspace: its head and how many snapshots it holds.
    ///
    /// # Errors
    /// `not_found`, storage errors.
    async fn workspace(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
    ) -> Result<WorkspaceRecord, LcError>;

    /// The exec's snapshots with chain seq `> after_seq`, ascending, at most
    /// `limit` (`1..=`[`crate::rules::LIST_LIMIT_MAX`]), without their
    /// manifest bytes.
    ///
    /// # Errors
    /// `not_found`, `invalid_limit`, storage errors.
    async fn snapshots(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<SnapshotMeta>, LcError>;

    /// The exec's milestones with seq `> after_seq`, ascending, at most
    /// `limit` (`1..=`[`crate::rules::LIST_LIMIT_MAX`]), of every attempt.
    ///
    /// # Errors
    /// `not_found` (also for another tenant's exec), `invalid_limit`,
    /// storage errors.
    async fn milestones(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        after_seq: u32,
        limit: usize,
    ) -> Result<Vec<crate::observation::MilestoneRecord>, LcError>;

    /// The canonical manifest bytes of the exec's snapshot `digest`
    /// (`sha256(bytes) == digest`).
    ///
    /// # Errors
    /// `not_found` (exec or snapshot), storage errors.
    async fn snapshot_manifest(
        &self,
        tenant: TenantId,
        exec_id: ExecId,
        digest: Digest,
    ) -> Result<Vec<u8>, LcError>;

    /// Mints a scoped token of `tenant` with `scope`, whose secret hashes
    /// to `secret_sha256` (the API draws the secret; only its digest is
    /// stored): needs a certain `at` (`time_uncertain` otherwise) and
    /// `ttl_ms` within the store's longest token TTL; its deadline is
    /// `at.cut + ttl`, which must fit `cut + horizon`. A bound exec must be
    /// the tenant's (`not_found` otherwise, also for another tenant's).
    /// Tenant scope: a replay of `op` returns the recorded token with
    /// `replay: true` and writes nothing.
    ///
    /// # Errors
    /// `invalid_timeout` (ttl), `not_found` (tenant or exec),
    /// `time_uncertain`, `deadline_beyond_horizon`, `idempotency_conflict`,
    /// `invalid_cut_reading`, storage errors. Nothing is written on any of
    /// them.
    async fn mint_token(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        scope: crate::token::TokenScope,
        ttl_ms: u64,
        secret_sha256: Digest,
    ) -> Result<crate::token::MintedToken, LcError>;

    /// The token whose secret hashes to `secret_sha256`, judged at `at`
    /// ([`crate::token::check_accepted`]); `None` when no token has that
    /// digest. Writes nothing.
    ///
    /// # Errors
    /// `token_revoked`, `time_uncertain`, `token_expired`,
    /// `invalid_cut_reading`, storage errors.
    async fn accept_token(
        &self,
        secret_sha256: Digest,
        at: CutReading,
    ) -> Result<Option<crate::token::TokenRecord>, LcError>;

    /// `tenant`'s tokens with id `> after` (all when `None`), ascending,
    /// at most `limit`, revoked and expired ones included.
    ///
    /// # Errors
    /// `invalid_limit`, storage errors.
    async fn tokens(
        &self,
        tenant: TenantId,
        after: Option<crate::token::TokenId>,
        limit: usize,
    ) -> Result<Vec<crate::token::TokenRecord>, LcError>;

    /// Revokes `tenant`'s token `token_id` on any cut (revoking only takes
    /// authority away), recording the cut read. Idempotent: a revoked
    /// token is returned as it is, its revocation cut unchanged.
    ///
    /// # Errors
    /// `not_found` (also another tenant's token), `invalid_cut_reading`,
    /// `time_uncertain` (no cut yet), storage errors.
    async fn revoke_token(
        &self,
        at: CutReading,
        tenant: TenantId,
        token_id: crate::token::TokenId,
    ) -> Result<crate::token::TokenRecord, LcError>;

    /// Deletes `item` (workspace or output) of the tenant's terminal exec
    /// at a certain `at`: records the deletion with `purge_after = at.cut +
    /// grace` ([`crate::deletion::plan_delete`]); the rows stay until the
    /// purge. A deletion already recorded is returned unchanged. A replay
    /// of `op` returns the recorded deletion.
    ///
    /// # Errors
    /// `exec_not_terminal`, `time_uncertain`, `deadline_beyond_horizon`,
    /// `workspace_purged` / `output_purged`, `not_found`,
    /// `idempotency_conflict`, storage errors; nothing is written.
    async fn delete_item(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        item: DeletedItem,
    ) -> Result<DeletionRecord, LcError>;

    /// Undoes the deletion of `item` of the tenant's exec before its purge
    /// (any reading: it admits no deadline): the item reads as before,
    /// bytes unchanged. Returns the undone deletion (state `restored`).
    ///
    /// # Errors
    /// `not_deleted`, `workspace_purged` / `output_purged`, `not_found`,
    /// `idempotency_conflict`, storage errors; nothing is written.
    async fn undelete_item(
        &self,
        op: &OperationKey,
        at: CutReading,
        tenant: TenantId,
        exec_id: ExecId,
        item: DeletedItem,
    ) -> Result<DeletionRecord, LcError>;
}

/// What the reconciler needs.
#[async_trait]
pub trait ReconcileStore: Send + Sync {
    /// Registers (or updates the URL of) provider `id` with its Ed25519
    /// public key. A different key for a registered id is
    /// `already_exists`.
    ///
    /// # Errors
    /// `invalid_provider`, `already_exists`, storage errors.
    async fn register_provider(
        &self,
        id: &ProviderId,
        url: &str,
        public_key: [u8; 32],
    ) -> Result<Provider, LcError>;

    /// Up to `limit` leases that need the reconciler at `at` (not
    /// released), soonest expiry first (a renewal moves a lease back, so a
    /// bounded batch reaches every lease in turn), each with its planned
    /// action ([`crate::rules::plan_lease_action`]).
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_cut_reading`, storage errors.
    async fn due_work(&self, at: CutReading, limit: usize) -> Result<Vec<LeaseWork>, LcError>;

    /// Claims up to `limit` due Leases for the worker activation `holder`
    /// at `at` and returns them as [`ReconcileStore::due_work`] would, in
    /// its order, each with the claim its writes present: the holder's own
    /// claims are renewed to `max(current, cut + claim ttl)` (on any cut),
    /// unclaimed Leases are claimed (generation 1, expiry `cut + claim
    /// ttl`, on any cut), and Leases whose claim a certain cut has passed
    /// by its expiry + the claim grace are taken (certain cut only: the
    /// next generation). A Lease another worker holds is left out, and so
    /// is one another worker claims at the same moment
    /// ([`crate::claim::plan_claim`]; the store re-checks each claim as it
    /// writes, in one statement for the batch). While `at` is uncertain
    /// nothing is taken from another worker.
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_cut_reading`, `time_uncertain` (no cut
    /// yet), `invalid_timeout` (the store's claim TTL or grace),
    /// `deadline_beyond_horizon` (`cut + claim ttl` beyond the horizon),
    /// storage errors. Nothing is written on any of them.
    async fn claim_due_work(
        &self,
        holder: &ClaimHolder,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<ClaimedWork>, LcError>;

    /// This store as the holder of `claim` sees it: every write on the
    /// claimed Lease ([`ReconcileStore::mark_active`],
    /// [`ReconcileStore::renew`], [`ReconcileStore::append_pages`],
    /// [`ReconcileStore::begin_release`],
    /// [`ReconcileStore::begin_release_not_sent`],
    /// [`ReconcileStore::refuse_restore`],
    /// [`ReconcileStore::commit_release`],
    /// [`ReconcileStore::record_attachment`]) first locks the Lease's claim
    /// and checks `claim` against it ([`crate::claim::check_claim`]) in the
    /// same transaction, and is refused `claim_stale` with nothing changed
    /// once another worker took the Lease (a write on another Lease is
    /// refused the same way). Every other method is this store's.
    fn claimed(&self, claim: ClaimCredential) -> Box<dyn ReconcileStore + '_>;

    /// Marks an `allocating` lease `active` (the provider confirmed the
    /// instance), the attempt and the exec `running`. Idempotent.
    ///
    /// # Errors
    /// `not_found`, `fenced` (another generation), `illegal_transition`,
    /// storage errors.
    async fn mark_active(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError>;

    /// Renews the Lease and its Reservation together to
    /// `max(current, cut + ttl)`, on any cut (never shortening). Returns
    /// the lease afterwards. A `release_pending` lease keeps its expiry
    /// but its Reservation is renewed, so the grant never lapses while the
    /// destroy is being proven: call it for `Destroy` work that cannot
    /// commit yet.
    ///
    /// # Errors
    /// `not_found`, `fenced`, `illegal_transition` (a released lease),
    /// `invalid_cut_reading`, storage errors.
    async fn renew(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError>;

    /// Stores pages of the lease's attempt, bytes included, as
    /// acknowledged (readable at once): a stored seq with the same
    /// sha256 is a no-op, with another sha256 `page_conflict`; seqs must
    /// continue the stored ones without gaps; nothing after the terminal
    /// page. At most [`crate::rules::APPEND_PAGES_MAX`] pages.
    ///
    /// # Errors
    /// `invalid_page`, `page_conflict`, `not_found`, `fenced`,
    /// `invalid_limit`, storage errors.
    async fn append_pages(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        pages: &[OutputPage],
    ) -> Result<AppendReport, LcError>;

    /// Moves the lease to `release_pending` for `reason` (recorded on the
    /// exec; `expired` needs a certain cut past the deadline; `exited`
    /// needs the attempt's terminal page acknowledged, since a terminal
    /// process state alone never releases; `start_failed` needs the same,
    /// or else the provider's proof that the command was never sent,
    /// through [`ReconcileStore::begin_release_not_sent`]) and renews its
    /// Reservation, giving the destroy a full Reservation TTL to be proven.
    /// Idempotent: a lease already `release_pending` is returned as it is.
    ///
    /// # Errors
    /// `not_found`, `fenced`, `illegal_transition`, `time_uncertain`,
    /// `release_not_proven`, storage errors.
    async fn begin_release(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        reason: TerminalReason,
        at: CutReading,
    ) -> Result<LeaseWork, LcError>;

    /// Moves the lease to `release_pending` with reason `start_failed`,
    /// proven by `evidence`: a DSSE envelope (JSON) of a `not_sent`
    /// statement ([`crate::evidence::Statement::NotSent`]) signed by the
    /// registered key of the lease's provider, naming exactly this lease
    /// and generation (the command never reached a supervisor and never
    /// will). Renews the Reservation as [`ReconcileStore::begin_release`].
    /// Idempotent: a lease already `release_pending` is returned as it is
    /// (the evidence is still verified). A refusal changes nothing.
    ///
    /// # Errors
    /// `evidence_rejected` (malformed, another key, another provider, lease
    /// or generation, or a statement that is not `not_sent`), `not_found`,
    /// `fenced`, `illegal_transition` (a released lease), storage errors.
    async fn begin_release_not_sent(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<LeaseWork, LcError>;

    /// [`ReconcileStore::begin_release_not_sent`] for a resume's Lease
    /// whose restore the provider refused (`code` `restore_failed` or
    /// `snapshot_refused`, `message` naming the path and blob digest), in
    /// the same transaction: the refusal is recorded on the resume intent
    /// that prepared the Lease (message cut to
    /// [`crate::hibernate::REFUSAL_MESSAGE_BYTES_MAX`] bytes), so the
    /// attempt stays parked, the intent shows it refused and is never
    /// prepared again. Idempotent: a refusal already recorded is kept.
    ///
    /// # Errors
    /// Those of [`ReconcileStore::begin_release_not_sent`];
    /// `illegal_transition` for a Lease without a restore head.
    async fn refuse_restore(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
        refusal: &crate::hibernate::ResumeRefusal,
    ) -> Result<LeaseWork, LcError>;

    /// Verifies `evidence` (a provider's signed absence or fence envelope,
    /// JSON) with the registered key of the lease's provider, needs a
    /// certain cut, then in one transaction: the lease `released`, the
    /// Reservation returned through Tollgate release with consumed 0, the
    /// attempt and the exec terminal. A second call is a replay that
    /// returns the same outcome (`replay: true`) and changes nothing.
    ///
    /// # Errors
    /// `evidence_rejected`, `time_uncertain`, `not_found`, `fenced`,
    /// `illegal_transition` (not `release_pending`), `invalid_cut_reading`,
    /// storage errors.
    async fn commit_release(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<ReleaseOutcome, LcError>;

    /// Attaches the terminal receipt of up to `limit` operation keys whose
    /// floor a certain `at` has passed; returns how many. Nothing while
    /// uncertain.
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_cut_reading`, storage errors.
    async fn attach_receipts(&self, at: CutReading, limit: usize) -> Result<usize, LcError>;

    /// Deletes up to `limit` operation keys due at a certain `at`
    /// ([`crate::opkey::gc_due`]); returns how many. Nothing while
    /// uncertain.
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_cut_reading`, storage errors.
    async fn gc_operations(&self, at: CutReading, limit: usize) -> Result<usize, LcError>;

    /// Purges up to `limit` items due at a certain `at`, soonest first,
    /// each in its own transaction: deleted workspaces and outputs whose
    /// `purge_after` the cut reached ([`crate::deletion::plan_purge`]),
    /// and terminal execs whose retention passed with no deletion waiting
    /// ([`crate::deletion::plan_exec_purge`]). Nothing while uncertain.
    /// The blobs the purged rows named stay in the sink: they are
    /// content-addressed and may be shared with other snapshots and
    /// pages, and the worker does not reach the sink; reclaiming them
    /// needs a sweep of the sink against every remaining manifest and
    /// page, which this step does not do.
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_cut_reading`, storage errors (the items
    /// purged before it stay purged).
    async fn purge_due(
        &self,
        at: CutReading,
        limit: usize,
    ) -> Result<crate::deletion::PurgeReport, LcError>;

    /// Seals the hibernations due at a certain `at` and returns up to
    /// `limit` unfinished ones (`sealed` or `quiesced`), by exec id: an
    /// exec running with an `active` Lease and no hibernation of its
    /// generation is due when idle (`at.cut >= last_activity + idle_ttl`,
    /// reason `idle`) or past its timeout with `on_timeout = hibernate` and
    /// no activity since (reason `deadline`). At most `limit` are sealed
    /// per call. Nothing is sealed on an uncertain `at` (the unfinished
    /// ones are still returned).
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_cut_reading`, storage errors.
    async fn due_hibernations(
        &self,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<HibernationRecord>, LcError>;

    /// Records the provider's attachment on a restoring Lease (one with a
    /// restore head): `evidence` is a DSSE envelope (JSON) of an
    /// `attachment` statement signed by the registered key of the Lease's
    /// provider naming exactly this Lease, generation, the exec's
    /// workspace and the Lease's restore head, writable. Idempotent for the
    /// same envelope.
    ///
    /// # Errors
    /// `evidence_rejected` (signature, key, subject, kind, not writable, or
    /// another attachment already recorded), `workspace_head_mismatch`,
    /// `not_found`, `fenced`, `illegal_transition` (not a restoring Lease,
    /// or not `allocating`/`active`), `invalid_cut_reading`, storage
    /// errors.
    async fn record_attachment(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<LeaseWork, LcError>;

    /// Records what the Lease's provider measured of this generation's
    /// instance: `evidence` is a DSSE envelope (JSON) of a `measurement`
    /// statement signed by the registered key of the Lease's provider
    /// naming exactly this Lease and generation. A later measurement
    /// replaces the stored one only when it loses nothing measured
    /// ([`crate::observation::AttemptObservation::supersedes`]); otherwise
    /// the stored one stays. Returns the measurement now stored. Taken on
    /// any reading (a measurement decides no expiry); its cut is recorded.
    ///
    /// # Errors
    /// `evidence_rejected` (signature, key, subject, or not a
    /// measurement), `not_found`, `fenced`, `illegal_transition` (a
    /// released Lease: its instance is gone), `invalid_cut_reading`,
    /// storage errors.
    async fn record_measurement(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<crate::observation::AttemptObservation, LcError>;

    /// The canonical manifest bytes a restoring Lease restores (its
    /// restore head's snapshot).
    ///
    /// # Errors
    /// `not_found` (lease, or a Lease without a restore head), `fenced`,
    /// storage errors.
    async fn restore_manifest(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Vec<u8>, LcError>;
}

/// What an exec gateway needs. Every method but [`GatewayStore::claim`]
/// and [`GatewayStore::take_over`] is fenced: it checks the caller's
/// [`OwnerCredential`] against the exec's current ownership
/// ([`crate::owner::check_owner`]) in the same transaction as its write,
/// and refuses a stale (`owner_stale`) or expired (`owner_expired`) owner
/// with nothing changed. Transitions (`record_send`, `ack_pages`, `cancel`,
/// `release`)
/// commit an immutable [`TransitionReceipt`] under their transition id; a
/// replay follows [`crate::owner::plan_transition`]; so does `record_send`'s.
#[async_trait]
pub trait GatewayStore: Send + Sync {
    /// Takes ownership of up to `limit` execs that have an `active` Lease
    /// (or are hibernated with a resume request its owner acts on: see
    /// [`crate::owner::OwnedExec::resume_op_key`]), are
    /// not terminal, and have no owner, a released owner, or an owner
    /// whose heartbeat expiry a certain `at` reached; skips rows another
    /// gateway is claiming at the same moment. Each gets generation + 1, a
    /// new fence and the heartbeat expiry `at.cut + ttl` (which must fit
    /// `cut + horizon`). Nothing while `at` is uncertain (an empty list).
    ///
    /// # Errors
    /// `invalid_limit`, `invalid_timeout` (ttl), `invalid_cut_reading`,
    /// `deadline_beyond_horizon`, storage errors.
    async fn claim(
        &self,
        token: &OwnerToken,
        at: CutReading,
        ttl: jiff::SignedDuration,
        limit: usize,
    ) -> Result<Vec<OwnedExec>, LcError>;

    /// Takes over one exec, serialized on its (tenant, exec) row: exactly
    /// one of several racing callers wins, the others get a typed refusal
    /// and change nothing. Needs a certain `at` and the exec's current
    /// Lease `active` (or the exec hibernated: its owner resumes it); the new ownership has generation + 1 (1 when
    /// unowned), a new fence and the heartbeat expiry `at.cut + ttl`. The
    /// exec's canonical identity is untouched.
    ///
    /// # Errors
    /// `owner_live`, `time_uncertain`, `not_found` (also another tenant's
    /// exec), `exec_terminal`, `illegal_transition` (the Lease is not
    /// `active`: still allocating, or released by its owner),
    /// `invalid_timeout`, `invalid_cut_reading`, `deadline_beyond_horizon`,
    /// storage errors.
    async fn take_over(
        &self,
        token: &OwnerToken,
        tenant: TenantId,
        exec_id: ExecId,
        at: CutReading,
        ttl: jiff::SignedDuration,
    ) -> Result<OwnedExec, LcError>;

    /// Renews the owner's heartbeat to `max(current, at.cut + ttl)` (any
    /// cut) and returns the exec as the owner sees it now.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `not_found` (the exec has no owner),
    /// `invalid_timeout`,
    /// `invalid_cut_reading`, `deadline_beyond_horizon`, storage errors.
    async fn heartbeat(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        ttl: jiff::SignedDuration,
    ) -> Result<OwnedExec, LcError>;

    /// Commits the metadata and ACK intent of `pages` (state `pending`) for
    /// the exec's current attempt: seqs continue the committed ones without
    /// gaps; a committed seq with equal metadata is a no-op, with other
    /// metadata `page_conflict`; nothing after the terminal page. At most
    /// [`crate::rules::APPEND_PAGES_MAX`] pages.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `invalid_page`, `page_conflict`,
    /// `invalid_limit`, `not_found`, `invalid_cut_reading`, storage errors.
    async fn stage_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        pages: &[PageMeta],
    ) -> Result<StageReport, LcError>;

    /// The exec's `pending` pages (metadata committed, not yet acked), by
    /// seq, at most `limit`: what a successor finishes first.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `invalid_limit`, `not_found`,
    /// `invalid_cut_reading`, storage errors.
    async fn pending_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<PageMeta>, LcError>;

    /// The ACK result: marks every pending page with `seq <= through_seq`
    /// `acked` (the caller wrote their bytes to the sink, durably, first)
    /// and commits the `ack` receipt under `transition_id`.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `transition_replay_refused`,
    /// `idempotency_conflict`, `invalid_transition_id`, `invalid_page`
    /// (`through_seq` beyond the committed metadata), `not_found`,
    /// `invalid_cut_reading`, storage errors.
    async fn ack_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        through_seq: i64,
    ) -> Result<TransitionReceipt, LcError>;

    /// Commits the `cancel` receipt: the owner is about to stop the
    /// command (it then tells the supervisor, and the command's terminal
    /// page follows).
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `transition_replay_refused`,
    /// `idempotency_conflict`, `invalid_transition_id`, `not_found`,
    /// `invalid_cut_reading`, storage errors.
    async fn cancel(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError>;

    /// Releases the Lease of a terminal exec: needs its terminal page
    /// acknowledged ([`crate::owner::check_release`]); moves the Lease to
    /// `release_pending` (reason `exited`, or `cancelled` after a cancel
    /// receipt) and renews its Reservation for the reconciler to destroy
    /// and prove (the units return only with that proof), releases the
    /// ownership, and commits the `release` receipt. Its replay returns
    /// the receipt while the released ownership is still current and
    /// unexpired.
    ///
    /// # Errors
    /// `release_not_proven`, `owner_stale`, `owner_expired`,
    /// `transition_replay_refused`, `idempotency_conflict`,
    /// `invalid_transition_id`, `not_found`, `invalid_cut_reading`,
    /// storage errors.
    async fn release(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError>;

    /// The exec's `queued` inputs (accepted, not yet recorded sent),
    /// ascending by input seq, at most `limit`
    /// (`1..=`[`crate::rules::LIST_LIMIT_MAX`]): what the owner delivers to
    /// the supervisor next, in this order.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `invalid_limit`, `not_found`,
    /// `invalid_cut_reading`, storage errors.
    async fn queued_inputs(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<InputRecord>, LcError>;

    /// The send result: after the supervisor accepted input `input_seq`
    /// (it writes each input seq to stdin once, so delivering a seq again
    /// before this commits is harmless), marks the input `sent` and commits
    /// the `send` receipt under `transition_id`, its request digest over
    /// (`input_seq`, the bytes' SHA-256, `eof`). Inputs are recorded in seq
    /// order: `input_seq` must be the lowest queued one. A replay follows
    /// [`crate::owner::plan_transition`]: the same owner gets the same
    /// receipt and nothing is written.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `transition_replay_refused`,
    /// `idempotency_conflict`, `invalid_transition_id`, `invalid_input` (no
    /// such input, already sent, or an earlier one still queued),
    /// `not_found`, `invalid_cut_reading`, storage errors.
    async fn record_send(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        input_seq: i64,
    ) -> Result<TransitionReceipt, LcError>;

    /// Commits the provider's quiescence of the sealed hibernation of
    /// `generation`: verifies `evidence` (a DSSE envelope, JSON, of a
    /// `quiescence` statement) with the registered key of the Lease's
    /// provider, its subject exactly (provider, Lease, `generation`, the
    /// exec's workspace) and its head `== head == sha256(manifest)`, and
    /// `manifest` is a canonical [`crate::snapshot::Manifest`] of the
    /// exec's workspace whose parent is the workspace's current head
    /// ([`crate::hibernate::check_quiescence`]); then inserts the
    /// immutable snapshot, moves the workspace head to `head`, moves the
    /// Lease `active -> release_pending` (no terminal reason) renewing its
    /// Reservation, the hibernation to `quiesced`, and releases the
    /// ownership (the owner has nothing left to do for that generation;
    /// once the reconciler parks the attempt, a resume request makes the
    /// exec claimable again). It also records the attempt's milestone at
    /// that head (source `hibernation`): `measurement`, when given, is
    /// the provider's signed measurement of the generation taken after
    /// the quiescence, verified and recorded as
    /// [`ReconcileStore::record_measurement`] does, and the milestone
    /// carries the attempt's observation up to this generation
    /// ([`crate::observation::AttemptObservation::of_generations`]), or
    /// none when any generation of it is unmeasured (`measurement`
    /// `None`: the provider could not measure). A replay with the same
    /// head by the same owner (its released ownership still current and
    /// unexpired) returns the record and changes nothing.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `not_found` (no hibernation of that
    /// generation), `evidence_rejected`, `workspace_head_mismatch`,
    /// `invalid_input` (not a canonical manifest: over
    /// [`crate::snapshot::SNAPSHOT_MANIFEST_BYTES_MAX`], malformed, a
    /// broken rule), `fenced`, `illegal_transition`, `invalid_cut_reading`,
    /// storage errors.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<HibernationRecord, LcError>;

    /// Records the provider's refusal to snapshot the stopped workspace of
    /// the sealed hibernation of `generation` (its `snapshot_refused`
    /// answer to `quiesce`; [`crate::hibernate::check_quiescence_refusal`]
    /// cuts its path and message), in one transaction: the hibernation
    /// `refused` with the refusal, the exec's terminal reason
    /// `snapshot_refused` (`cancelled` after a cancel request), the Lease
    /// `active -> release_pending` renewing its Reservation for the
    /// reconciler to destroy and prove (the units return once, with that
    /// proof, and the exec becomes terminal), and the ownership released.
    /// The workspace head does not move. Needs the generation's stopped
    /// page acknowledged ([`crate::hibernate::plan_quiescence_refusal`]). A
    /// replay by the same owner (its released ownership still current and
    /// unexpired) returns the record and changes nothing.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `time_uncertain`, `not_found` (no
    /// hibernation of that generation), `invalid_input` (a reason that is
    /// not a stable code), `illegal_transition` (not sealed, its Lease not
    /// active, its stopped page not acknowledged, or its quiescence
    /// committed), `invalid_cut_reading`, storage errors. Nothing is
    /// written on any of them.
    async fn refuse_quiescence(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        generation: Generation,
        refusal: &crate::hibernate::QuiescenceRefusal,
    ) -> Result<HibernationRecord, LcError>;

    /// Prepares the resume recorded under the tenant's operation key
    /// `op_key` on a certain `at`: a new Tollgate grant (Reservation g+1,
    /// the shape's units) and Lease g+1 `allocating` restoring the parked
    /// head, the attempt's generation g+1 (still parked). Refused while any
    /// Lease of the exec is unreleased (`competing_right`), and for an
    /// intent whose restore the provider refused (`resume_refused`: a new
    /// request, another operation key, retries). A replay of the same
    /// intent returns the prepared Lease.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `time_uncertain`, `not_found` (no
    /// such intent), `resume_refused`, `exec_not_parked`, `request_digest_mismatch`,
    /// `workspace_head_mismatch`, `competing_right`,
    /// `insufficient_capacity`, `deadline_beyond_horizon`,
    /// `invalid_cut_reading`, storage errors. Nothing is written on any of
    /// them.
    async fn prepare_resume(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        op_key: &str,
    ) -> Result<LeaseWork, LcError>;

    /// Commits the resume recorded under `op_key` on a certain `at`, in one
    /// transaction: the checks of [`crate::hibernate::check_resume`], then
    /// the immutable [`ResumeReceipt`] and the attempt `parked ->
    /// runnable`; the exec's last activity becomes `at.cut`, and its
    /// timeout (if it has one) restarts: its deadline becomes `at.cut +
    /// timeout`, which must fit `cut + horizon`. A replay of `op_key`
    /// returns the one receipt and changes nothing.
    ///
    /// # Errors
    /// `owner_stale`, `owner_expired`, `time_uncertain`, `not_found`,
    /// `exec_not_parked`, `request_digest_mismatch`,
    /// `workspace_head_mismatch`, `competing_right`,
    /// `deadline_beyond_horizon` (the restarted timeout),
    /// `invalid_cut_reading`, storage errors. Nothing is written on any of
    /// them.
    async fn commit_resume(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        op_key: &str,
    ) -> Result<ResumeReceipt, LcError>;
}
