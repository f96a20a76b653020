//! Little Compute's provider: one per host, it runs sandbox instances and
//! signs what it knows about them.
//!
//! * [`Provider`]: the trait the worker (and later the gateway) calls:
//!   allocate (fresh, or restoring a workspace snapshot), generation-scoped
//!   destroy, the proof that a generation's command was never sent,
//!   observe, the page relay (pages, ack, cancel, send, stop, each
//!   carrying the caller's owner fence, which the instance's supervisor
//!   checks against the highest it was shown), and quiesce (the
//!   workspace of a stopped instance walked into a signed snapshot).
//! * [`BwrapProvider`] ([`bwrap`]): instances under bubblewrap, limited by
//!   cgroups ([`cgroup`], v1 and v2) and rlimits, each with the
//!   `lc-supervisor` as its first process, each run as the unprivileged
//!   host account of [`account`] (`lc-sandbox` by default), never as root.
//! * [`identity`]: the Ed25519 key that signs evidence, persisted `0600`.
//! * [`fence`]: the persisted fences (a restarted provider still refuses a
//!   fenced generation).
//! * [`runtime`]: the content-addressed runtime store and its importer.
//! * [`http`]: the provider's loopback HTTP service ([`http::provider_router`])
//!   and [`HttpProvider`], a client implementing [`Provider`].
//!
//! The provider's clock decides nothing: it signs statements about what
//! exists, never about when.

#![warn(missing_docs)]

use async_trait::async_trait;
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use lc_core::evidence::{Envelope, InstanceState};
use lc_core::owner::OwnerFence;
use lc_core::page::{Page, SpoolStatus, StopOutcome};
use lc_core::{
    AttemptNo, Command, Digest, ExecId, Generation, ProviderId, SandboxLeaseId, Shape, WorkspaceId,
};

pub mod account;
pub mod bwrap;
pub mod cgroup;
pub mod fence;
pub mod http;
pub mod identity;
pub mod runtime;
pub mod slirp;
mod socket;

pub use bwrap::{BwrapConfig, BwrapProvider};
pub use http::{HttpProvider, provider_router, provider_router_with_token};

/// What to start: the instance of lease `lease_id` generation `generation`
/// running `command` of exec `exec_id` attempt `attempt` in runtime
/// `runtime` with `shape`'s limits and workspace `workspace_id` at
/// `/workspace` (restored from a snapshot first when `restore` is given),
/// its pages numbered from `first_seq` and its inputs from
/// `first_input_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateRequest {
    /// The sandbox lease.
    pub lease_id: SandboxLeaseId,
    /// Its generation (>= 1).
    pub generation: Generation,
    /// The exec the instance runs.
    pub exec_id: ExecId,
    /// The attempt of that exec.
    pub attempt: AttemptNo,
    /// The runtime digest (a manifest digest in the provider's store, or
    /// the built-in `base`).
    pub runtime: Digest,
    /// The resources.
    pub shape: Shape,
    /// The command, run by the supervisor.
    pub command: Command,
    /// The workspace bound read-write at `/workspace`.
    pub workspace_id: WorkspaceId,
    /// Whether the command's stdin is a pipe [`Provider::send`] writes to;
    /// `false` puts it on `/dev/null`.
    pub stdin_open: bool,
    /// The seq of the instance's first page, `1..=`[`lc_core::page::FIRST_SEQ_MAX`]:
    /// 1 for an attempt's first generation, the seq after the last stored
    /// page for a resumed one.
    pub first_seq: i64,
    /// The seq of the first input [`Provider::send`] writes,
    /// `1..=`[`lc_core::page::FIRST_SEQ_MAX`]: 1 for an attempt's first
    /// generation, the input seq after the last accepted one for a resumed
    /// one.
    pub first_input_seq: i64,
    /// The snapshot the workspace is restored from before the command
    /// starts; `None` keeps the workspace directory as it is (created
    /// empty when missing).
    pub restore: Option<Restore>,
}

/// The largest manifest a snapshot may have, in canonical bytes: 16 MiB
/// (some 80 000 entries of ordinary path lengths), so every snapshot a
/// quiesce signs fits an allocate request ([`http::BODY_MAX_BYTES`]). A
/// workspace whose manifest would be larger is refused at quiesce
/// (`snapshot_refused`, reason `manifest_too_large`).
pub const MANIFEST_BYTES_MAX: usize = 16 << 20;

/// A workspace snapshot to restore: its manifest in canonical bytes
/// (`lc_core::snapshot::Manifest::canonical_bytes`), whose SHA-256 is the
/// head restored. Every blob it names must be in the provider's blob store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restore {
    /// The manifest's canonical JSON bytes.
    pub manifest: Vec<u8>,
}

/// A quiesced instance's workspace: the snapshot's manifest (canonical
/// bytes; its SHA-256 is the head) and the signed
/// `lc_core::evidence::Statement::Quiescence` naming that head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quiesced {
    /// The manifest's canonical JSON bytes.
    pub manifest: Vec<u8>,
    /// The signed quiescence statement.
    pub evidence: Envelope,
}

/// An allocated instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The sandbox lease.
    pub lease_id: SandboxLeaseId,
    /// Its generation.
    pub generation: Generation,
    /// `running` or `exited` at the moment of the answer.
    pub state: InstanceState,
    /// `false` when the instance already existed (an idempotent replay).
    pub created: bool,
    /// For a request with a restore: the signed
    /// `lc_core::evidence::Statement::Attachment` (the restored head,
    /// writable); `None` for a fresh workspace.
    #[serde(default)]
    pub attachment: Option<Envelope>,
}

/// One instance in a provider's inventory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceSummary {
    /// The sandbox lease.
    pub lease_id: SandboxLeaseId,
    /// Its generation.
    pub generation: Generation,
    /// The exec it runs.
    pub exec_id: ExecId,
    /// `running` or `exited`.
    pub state: InstanceState,
}

/// A provider's refusal or failure. Codes are stable; [`ProviderError::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum ProviderError {
    /// The generation is fenced on this provider: it was destroyed (or a
    /// later one was). Code `fenced`.
    #[error(
        "lease {lease_id} generation {generation} is fenced (through generation {fenced_through})"
    )]
    Fenced {
        /// The lease.
        lease_id: i64,
        /// The generation asked for.
        generation: i64,
        /// The highest fenced generation.
        fenced_through: i64,
    },
    /// The same lease generation was allocated with another request. Code
    /// `allocation_conflict`.
    #[error("lease {lease_id} generation {generation} exists with another request")]
    AllocationConflict {
        /// The lease.
        lease_id: i64,
        /// The generation.
        generation: i64,
    },
    /// No such instance on this provider. Code `no_instance`.
    #[error("no instance of lease {lease_id} generation {generation}")]
    NoInstance {
        /// The lease.
        lease_id: i64,
        /// The generation.
        generation: i64,
    },
    /// The instance's processes are gone while its supervisor still held
    /// unacknowledged pages (the provider or the instance was killed): those
    /// pages are lost; destroy the generation. Code `instance_lost`.
    #[error(
        "lease {lease_id} generation {generation}: the instance ended before its pages were acknowledged"
    )]
    InstanceLost {
        /// The lease.
        lease_id: i64,
        /// The generation.
        generation: i64,
    },
    /// The runtime digest is not in the store. Code `unknown_runtime`.
    #[error("runtime {digest} is not in this provider's store")]
    UnknownRuntime {
        /// The digest asked for.
        digest: String,
    },
    /// A request the provider refuses (a bad id, shape or argument). Code
    /// `invalid_request`.
    #[error("invalid request: {detail}")]
    InvalidRequest {
        /// What is wrong.
        detail: String,
    },
    /// The instance could not be started. Code `start_failed`.
    #[error("instance start failed: {detail}")]
    StartFailed {
        /// What bubblewrap or the supervisor said.
        detail: String,
    },
    /// The instance's processes could not all be killed or its cgroups
    /// removed within the bound. Code `destroy_incomplete`; retry.
    #[error("destroy incomplete: {detail}")]
    DestroyIncomplete {
        /// What is left.
        detail: String,
    },
    /// The supervisor's socket refused or failed. Code `supervisor_unavailable`.
    #[error("supervisor unavailable: {detail}")]
    SupervisorUnavailable {
        /// What failed.
        detail: String,
    },
    /// A runtime import refused (code of [`runtime::ImportError`]). Code
    /// `runtime_refused`.
    #[error("runtime refused ({reason}): {detail}")]
    RuntimeRefused {
        /// The import error's stable code (`absolute_path`, `symlink_escape`, ...).
        reason: String,
        /// What is wrong.
        detail: String,
    },
    /// The provider's state directory failed. Code `provider_io`.
    #[error("provider state: {detail}")]
    Io {
        /// What failed.
        detail: String,
    },
    /// The owner fence presented is below the highest the instance's
    /// supervisor was shown: a newer owner serves this exec, and the
    /// request changed nothing. Stop touching the exec. Code `stale_fence`.
    #[error("owner fence {presented} is stale: the supervisor was shown fence {highest}")]
    StaleFence {
        /// The fence the request carried.
        presented: i64,
        /// The highest fence the supervisor was shown.
        highest: i64,
    },
    /// The instance's supervisor refused an input: `reason` is its code,
    /// `input_gap` (an input seq skipped: send the missing ones first),
    /// `input_closed` (stdin was not opened, is past its eof input, or the
    /// command ended), `input_busy` (its input queue is full: retry later),
    /// `bad_input_seq` (a seq below 1). Code `input_refused`.
    #[error("input refused ({reason}): {detail}")]
    InputRefused {
        /// The supervisor's code.
        reason: String,
        /// What to do next.
        detail: String,
    },
    /// The provider handed the command of this lease generation to a
    /// supervisor (or was about to when it stopped), so it cannot prove the
    /// command never ran: destroy the generation and read its output
    /// instead. Code `command_sent`.
    #[error(
        "lease {lease_id} generation {generation}: its command was handed to a supervisor; destroy the generation and read its output instead of proving it was never sent"
    )]
    CommandSent {
        /// The lease.
        lease_id: i64,
        /// The generation.
        generation: i64,
    },
    /// Quiesce of an instance whose command has not ended, or whose last
    /// page is not acknowledged yet: stop it (or wait for its terminal
    /// page), acknowledge every page, then quiesce again. Nothing changed.
    /// Code `command_running`.
    #[error("lease {lease_id} generation {generation}: {detail}")]
    CommandRunning {
        /// The lease.
        lease_id: i64,
        /// The generation.
        generation: i64,
        /// What to do next.
        detail: String,
    },
    /// A workspace snapshot could not be restored: `reason` is the stable
    /// code of the failure (`blob_missing`, `blob_corrupt`,
    /// `manifest_malformed`, ...), `path` the entry and `digest` the blob
    /// concerned (empty when not about one). No instance was started and
    /// no workspace directory was left. Put the blob again from its source
    /// (or restore another snapshot). Code `restore_failed`.
    #[error("restore failed ({reason}) at {path:?} blob {digest}: {detail}")]
    RestoreFailed {
        /// The entry's path in the snapshot (empty when not about one).
        path: String,
        /// The blob's SHA-256, 64 hex (empty when not about one).
        digest: String,
        /// The failure's stable code.
        reason: String,
        /// What is wrong.
        detail: String,
    },
    /// A quiesce found a workspace it cannot snapshot: `reason` is the
    /// stable code (`special_file` for a device, fifo or socket,
    /// `path_not_utf8`, `too_many_entries`, `too_many_bytes`,
    /// `manifest_too_large`, ...), `path` the entry concerned (empty when
    /// not about one). Retrying does not help; nothing was signed. Code
    /// `snapshot_refused`.
    #[error("snapshot refused ({reason}) at {path:?}: {detail}")]
    SnapshotRefused {
        /// The entry's path in the workspace (empty when not about one).
        path: String,
        /// The failure's stable code.
        reason: String,
        /// What is wrong.
        detail: String,
    },
    /// The provider API refused the request's credential (HTTP only). Code
    /// `unauthorized`.
    #[error("the provider refused the credential")]
    Unauthorized,
    /// The provider could not be reached or answered something that is not
    /// a provider answer (HTTP client only). Code `provider_unreachable`.
    #[error("provider unreachable: {detail}")]
    Unreachable {
        /// What failed.
        detail: String,
    },
}

impl ProviderError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            ProviderError::Fenced { .. } => "fenced",
            ProviderError::AllocationConflict { .. } => "allocation_conflict",
            ProviderError::NoInstance { .. } => "no_instance",
            ProviderError::UnknownRuntime { .. } => "unknown_runtime",
            ProviderError::InvalidRequest { .. } => "invalid_request",
            ProviderError::StartFailed { .. } => "start_failed",
            ProviderError::DestroyIncomplete { .. } => "destroy_incomplete",
            ProviderError::SupervisorUnavailable { .. } => "supervisor_unavailable",
            ProviderError::InstanceLost { .. } => "instance_lost",
            ProviderError::RuntimeRefused { .. } => "runtime_refused",
            ProviderError::Io { .. } => "provider_io",
            ProviderError::StaleFence { .. } => "stale_fence",
            ProviderError::InputRefused { .. } => "input_refused",
            ProviderError::CommandSent { .. } => "command_sent",
            ProviderError::CommandRunning { .. } => "command_running",
            ProviderError::RestoreFailed { .. } => "restore_failed",
            ProviderError::SnapshotRefused { .. } => "snapshot_refused",
            ProviderError::Unauthorized => "unauthorized",
            ProviderError::Unreachable { .. } => "provider_unreachable",
        }
    }

    /// Whether retrying the same call later can succeed.
    pub fn is_transient(&self) -> bool {
        if let ProviderError::InputRefused { reason, .. } = self {
            return reason == "input_busy";
        }
        matches!(
            self,
            ProviderError::DestroyIncomplete { .. }
                | ProviderError::SupervisorUnavailable { .. }
                | ProviderError::Io { .. }
                | ProviderError::Unreachable { .. }
        )
    }

    pub(crate) fn io(what: impl std::fmt::Display, e: impl std::fmt::Display) -> ProviderError {
        ProviderError::Io {
            detail: format!("{what}: {e}"),
        }
    }
}

/// A host that runs sandbox instances; see the crate docs. Every method is
/// idempotent; evidence envelopes are signed by [`Provider::public_key`]
/// and verify with [`lc_core::evidence::verify`].
#[async_trait]
pub trait Provider: Send + Sync {
    /// The provider's id.
    fn id(&self) -> &ProviderId;

    /// The key its evidence is signed with.
    fn public_key(&self) -> VerifyingKey;

    /// Starts the instance of `(req.lease_id, req.generation)`, or returns
    /// the existing one for the same request. Before the command can reach
    /// a supervisor the provider records the hand-off durably; from then on
    /// [`Provider::prove_not_sent`] of that generation is refused, also
    /// when the start then fails. A call abandoned by its caller (a
    /// timeout) leaves at most the one instance: a repeated allocate of
    /// the generation answers with it once its command was handed over,
    /// and starts it afresh otherwise, so a caller may retry any allocate
    /// that did not answer.
    ///
    /// With `req.restore` the workspace is first replaced by the
    /// snapshot's tree (every blob verified) and the answer carries the
    /// signed attachment naming the restored head.
    ///
    /// # Errors
    /// [`ProviderError::Fenced`] for a fenced generation,
    /// [`ProviderError::AllocationConflict`] for another request with the
    /// same lease generation, [`ProviderError::InvalidRequest`] for ids or
    /// first seqs out of range or a restore manifest of another workspace,
    /// [`ProviderError::RestoreFailed`] (a missing or corrupt blob, a
    /// malformed manifest: no instance and no workspace directory is
    /// left), [`ProviderError::UnknownRuntime`],
    /// [`ProviderError::StartFailed`], [`ProviderError::Io`].
    async fn allocate(&self, req: AllocateRequest) -> Result<Allocation, ProviderError>;

    /// Fences generation `generation` of `lease_id` (and every earlier one),
    /// kills every process of their instances, removes their cgroups and
    /// returns signed evidence: a fence when an instance existed, an
    /// absence when none did. Idempotent.
    ///
    /// # Errors
    /// [`ProviderError::DestroyIncomplete`] (retry), [`ProviderError::Io`].
    async fn destroy(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError>;

    /// Fences generation `generation` of `lease_id` (and every earlier
    /// one, durably, as [`Provider::destroy`] does, so no later allocate of
    /// it starts anything), then signs a `not_sent` statement
    /// ([`lc_core::evidence::Statement::NotSent`]) when the provider never
    /// handed that generation's command to a supervisor: the command never
    /// ran and has no output. Kills nothing and removes nothing; the
    /// generation is destroyed as usual afterwards. Idempotent. The
    /// default refuses: a provider that keeps no record of what it handed
    /// to supervisors can prove nothing.
    ///
    /// # Errors
    /// [`ProviderError::CommandSent`] when the command was (or may have
    /// been) handed over: destroy and wait for output instead (the fence
    /// stays raised), [`ProviderError::InvalidRequest`] for ids below 1 or
    /// a provider without that record, [`ProviderError::Io`] (retry).
    async fn prove_not_sent(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        let _ = (lease_id, generation);
        Err(ProviderError::InvalidRequest {
            detail: "this provider keeps no record of the commands it handed to supervisors".into(),
        })
    }

    /// A signed observation of the instance: `running` while any of its
    /// processes lives, `exited` when none does, `absent` when there is no
    /// instance.
    ///
    /// # Errors
    /// [`ProviderError::Io`].
    async fn observe(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError>;

    /// A signed measurement of the instance so far
    /// ([`lc_core::evidence::Statement::Measurement`]): its cost from the
    /// kernel's accounting of everything that ran in its cgroups (the
    /// sandbox, its supervisor and the command; CPU time in whole
    /// milliseconds and peak charged memory), omitted when that accounting
    /// cannot be read; its externality as the sandbox proves it (all
    /// `false` for a shape without network, nothing observed with it).
    /// Read-only and unfenced. Measure before destroy: destroy removes the
    /// accounting with the cgroups. The default refuses: a provider that
    /// measures nothing can sign nothing.
    ///
    /// # Errors
    /// [`ProviderError::NoInstance`] (never allocated, or destroyed),
    /// [`ProviderError::InvalidRequest`] for ids below 1 or a provider
    /// without measurements, [`ProviderError::Io`].
    async fn measure(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        let _ = (lease_id, generation);
        Err(ProviderError::InvalidRequest {
            detail: "this provider measures nothing".into(),
        })
    }

    /// The instance's spooled pages with `seq > after_seq`, in order, at most
    /// `max` (capped at [`lc_core::page::PAGES_PER_REQUEST_MAX`]); empty when
    /// none is spooled yet or the supervisor has finished. Read-only, but
    /// fenced like every spool request: `fence` (the caller's owner fence,
    /// >= 1) becomes the supervisor's highest when it is above it.
    ///
    /// # Errors
    /// [`ProviderError::StaleFence`] for a fence below the highest shown,
    /// [`ProviderError::InvalidRequest`] for a fence below 1,
    /// [`ProviderError::NoInstance`], [`ProviderError::SupervisorUnavailable`]
    /// (retry), [`ProviderError::InstanceLost`] (the instance died with
    /// unacknowledged pages: destroy it).
    async fn pages(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<Page>, ProviderError>;

    /// Every instance the provider holds (allocated and not destroyed),
    /// ordered by lease and generation, at most
    /// [`bwrap::INSTANCES_SCANNED_MAX`]. The default answers
    /// [`ProviderError::InvalidRequest`]: a provider without an inventory.
    ///
    /// # Errors
    /// [`ProviderError::Io`].
    async fn inventory(&self) -> Result<Vec<InstanceSummary>, ProviderError> {
        Err(ProviderError::InvalidRequest {
            detail: "this provider keeps no inventory".into(),
        })
    }

    /// Lets the supervisor drop every page with `seq <= through_seq`, for
    /// the owner holding `fence` (>= 1). Idempotent; a no-op once the
    /// supervisor has finished.
    ///
    /// # Errors
    /// [`ProviderError::StaleFence`] (nothing was dropped),
    /// [`ProviderError::NoInstance`], [`ProviderError::InvalidRequest`] for
    /// an ack beyond what was spooled or a fence below 1,
    /// [`ProviderError::SupervisorUnavailable`], [`ProviderError::InstanceLost`].
    async fn ack(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        through_seq: i64,
    ) -> Result<(), ProviderError>;

    /// Kills every process of the instance's command (`SIGKILL`), for the
    /// owner holding `fence` (>= 1); the terminal page (signal 9, unless the
    /// command had already ended) follows in the spool once its pipes are
    /// drained, after every page written before it. Idempotent: a second
    /// cancel, or one after the command ended, is a no-op that answers ok.
    ///
    /// # Errors
    /// [`ProviderError::StaleFence`] (nothing was killed),
    /// [`ProviderError::InvalidRequest`] for a fence below 1,
    /// [`ProviderError::NoInstance`], [`ProviderError::SupervisorUnavailable`]
    /// (retry), [`ProviderError::InstanceLost`].
    async fn cancel(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<(), ProviderError>;

    /// Writes `bytes` (at most [`lc_core::page::INPUT_BYTES_MAX`]) to the
    /// command's stdin as input `input_seq` (the first is 1), then closes
    /// stdin when `eof`, for the owner holding `fence` (>= 1). Exactly once
    /// per input seq, in order: a repeated seq answers ok without writing
    /// again. Returns the highest input seq accepted.
    ///
    /// # Errors
    /// [`ProviderError::InputRefused`] (`input_gap`, `input_closed`,
    /// `input_busy`: retry), [`ProviderError::StaleFence`] (nothing was
    /// written), [`ProviderError::InvalidRequest`] for a fence below 1 or
    /// too many bytes, [`ProviderError::NoInstance`],
    /// [`ProviderError::SupervisorUnavailable`], [`ProviderError::InstanceLost`].
    async fn send(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        input_seq: i64,
        bytes: Vec<u8>,
        eof: bool,
    ) -> Result<i64, ProviderError>;

    /// Stops the instance's command for hibernation, for the owner holding
    /// `fence` (>= 1): kills every process of it exactly as
    /// [`Provider::cancel`] does, and the stream ends with the stopped page
    /// (`lc_core::page::PageKind::Stopped`, the status the command ended
    /// with) instead of the terminal page, after every page written before
    /// it. Idempotent. Answers [`StopOutcome::Killed`] when this call
    /// killed the command, [`StopOutcome::AlreadyStopped`] after an earlier
    /// stop, [`StopOutcome::Ended`] when the command had ended (or was
    /// cancelled) first, whose terminal page stays its last page; `None`
    /// once the supervisor has finished (its last page was acknowledged:
    /// the stored pages say which it was). The default refuses: a provider
    /// without stop.
    ///
    /// # Errors
    /// [`ProviderError::StaleFence`] (nothing was killed),
    /// [`ProviderError::InvalidRequest`] for a fence below 1,
    /// [`ProviderError::NoInstance`], [`ProviderError::SupervisorUnavailable`]
    /// (retry), [`ProviderError::InstanceLost`].
    async fn stop(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<Option<StopOutcome>, ProviderError> {
        let _ = (lease_id, generation, fence);
        Err(ProviderError::InvalidRequest {
            detail: "this provider cannot stop an instance for hibernation".into(),
        })
    }

    /// Quiesces the instance of a generation whose command has ended
    /// (stopped or exited) and whose last page is acknowledged: kills
    /// whatever of the instance is left (its workspace stays), walks the
    /// workspace into a snapshot whose blobs are all put in the provider's
    /// blob store, and signs `lc_core::evidence::Statement::Quiescence`
    /// naming its head (parent: the head the generation was restored from,
    /// if any). The result is persisted in the instance's state: a
    /// repeated quiesce (also by a stale owner, which learns nothing new)
    /// answers byte-identical manifest and evidence. `fence` is checked
    /// against the supervisor while it still runs. The default refuses.
    ///
    /// # Errors
    /// [`ProviderError::CommandRunning`] (nothing changed: stop, ack, retry),
    /// [`ProviderError::StaleFence`], [`ProviderError::InvalidRequest`],
    /// [`ProviderError::NoInstance`], [`ProviderError::InstanceLost`] (the
    /// instance died with unacknowledged pages), [`ProviderError::DestroyIncomplete`]
    /// (retry), [`ProviderError::Io`] (a workspace that cannot be walked,
    /// for example a device file in it, or a blob store that fails).
    async fn quiesce(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<Quiesced, ProviderError> {
        let _ = (lease_id, generation, fence);
        Err(ProviderError::InvalidRequest {
            detail: "this provider cannot quiesce an instance".into(),
        })
    }

    /// The instance's spool occupancy (pages and bytes against their
    /// bounds) and its command's progress; `None` once the supervisor has
    /// finished. Read-only and unfenced.
    ///
    /// # Errors
    /// [`ProviderError::NoInstance`], [`ProviderError::SupervisorUnavailable`]
    /// (retry), [`ProviderError::InstanceLost`].
    async fn spool_status(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Option<SpoolStatus>, ProviderError>;
}
