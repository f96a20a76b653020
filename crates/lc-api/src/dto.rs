//! The JSON shapes of the API. Instants are RFC 3339 UTC strings, exact to
//! the nanosecond; digests 64 lowercase hex digits; ids integers; page
//! bytes standard base64. Request bodies refuse unknown fields.

use base64::Engine as _;
use jiff::Timestamp;
use lc_core::approval::{ApprovalPolicy, ApprovalRecord, ApprovalsPage};
use lc_core::hibernate::{
    HibernationRecord, ResumeIntent, ResumeReceipt, SnapshotMeta, WorkspaceRecord,
};
use lc_core::input::InputRecord;
use lc_core::model::{
    CanonicalIdentity, ExecRecord, OpScope, OperationRecord, OutputPage, Runtime, Tenant,
};
use lc_core::observation::{
    AttemptObservation, Eligibility, MilestoneRecord, attempt_reexecution_eligibility,
    reexecution_eligibility,
};
use lc_core::snapshot::{Entry, EntryKind};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/tenants`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantBody {
    /// The tenant's name (unique).
    pub name: String,
    /// Units to deposit at creation (at least 1 when given).
    #[serde(default)]
    pub units: Option<i64>,
}

/// A created tenant and its API key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedTenant {
    /// The tenant (= its Tollgate account).
    pub tenant_id: i64,
    /// Its name.
    pub name: String,
    /// Its API key (`lc_` + 43 base64url characters). Derived from the
    /// server secret: a replay of the creation returns the same key.
    pub api_key: String,
}

/// `POST /v1/tenants/{id}/deposits`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DepositBody {
    /// Units to deposit (at least 1).
    pub units: i64,
}

/// A tenant and its exact Tollgate balances, in units:
/// `deposited = available + held + consumed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    /// The tenant.
    pub tenant_id: i64,
    /// Its name.
    pub name: String,
    /// Units ever deposited.
    pub deposited: i64,
    /// Units free to reserve.
    pub available: i64,
    /// Units held by Reservations of live execs.
    pub held: i64,
    /// Units charged.
    pub consumed: i64,
    /// Which of its execs need an approval.
    pub approval_policy: ApprovalPolicyView,
}

/// A tenant's approval policy: `require` is `off` (no exec needs an
/// approval), `network` (shapes whose network is on), `all`, or `shapes`
/// (the shapes named in `shapes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalPolicyView {
    /// `off`, `network`, `all` or `shapes`.
    pub require: String,
    /// The shape names, with `require = shapes` (else empty).
    #[serde(default)]
    pub shapes: Vec<String>,
}

impl From<ApprovalPolicy> for ApprovalPolicyView {
    fn from(p: ApprovalPolicy) -> ApprovalPolicyView {
        ApprovalPolicyView {
            require: p.require.as_str().to_string(),
            shapes: p.shapes,
        }
    }
}

/// `POST /v1/execs/{id}/approve` (optional).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveBody {
    /// How long the approval is valid, in milliseconds on the cut
    /// (`1..=3600000`; the service's default, 15 min unless configured,
    /// when absent).
    #[serde(default)]
    pub validity_ms: Option<u64>,
}

/// `POST /v1/execs/{id}/deny` (optional).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DenyBody {
    /// Why (at most 512 bytes, no control characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// A decision on an exec that awaited approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalView {
    /// The exec.
    pub exec_id: i64,
    /// `approved` or `denied`.
    pub decision: String,
    /// Who decided: `admin` or `tenant`.
    pub approver: String,
    /// The certain cut of the decision.
    #[schema(value_type = String)]
    pub decided_cut: Timestamp,
    /// The validity, milliseconds (approved only).
    pub validity_ms: Option<u64>,
    /// `decided_cut + validity` on the cut (approved only): the exec starts
    /// only while a certain cut is below it, else it ends
    /// `approval_expired`.
    #[schema(value_type = Option<String>)]
    pub valid_until: Option<Timestamp>,
    /// The denial's reason (denied only).
    pub reason: Option<String>,
}

impl From<ApprovalRecord> for ApprovalView {
    fn from(a: ApprovalRecord) -> ApprovalView {
        ApprovalView {
            exec_id: a.exec_id.0,
            decision: a.decision.as_str().to_string(),
            approver: a.approver.as_str().to_string(),
            decided_cut: a.decided_cut,
            validity_ms: a.validity_ms,
            valid_until: a.valid_until,
            reason: a.reason,
        }
    }
}

/// `GET /v1/approvals`: the acting tenant's execs awaiting approval
/// (oldest first) and its newest decisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalList {
    /// Execs awaiting approval.
    pub awaiting: Vec<ExecView>,
    /// Decisions, newest first.
    pub decisions: Vec<ApprovalView>,
}

impl From<ApprovalsPage> for ApprovalList {
    fn from(p: ApprovalsPage) -> ApprovalList {
        ApprovalList {
            awaiting: p.awaiting.into_iter().map(Into::into).collect(),
            decisions: p.decisions.into_iter().map(Into::into).collect(),
        }
    }
}

/// `GET /v1/approvals?limit=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ApprovalListQuery {
    /// The most of each list (`1..=1000`, default 100).
    pub limit: Option<usize>,
}

impl From<Tenant> for TenantView {
    fn from(t: Tenant) -> TenantView {
        TenantView {
            tenant_id: t.tenant_id.0,
            name: t.name,
            deposited: t.deposited,
            available: t.available,
            held: t.held,
            consumed: t.consumed,
            approval_policy: t.approval_policy.into(),
        }
    }
}

/// `POST /v1/runtimes?name=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RuntimeQuery {
    /// The runtime's name.
    pub name: String,
}

/// A registered runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeView {
    /// Its name.
    pub name: String,
    /// SHA-256 of its canonical manifest, 64 hex digits: the runtime's
    /// identity.
    pub digest: String,
    /// Its manifest.
    #[schema(value_type = Object)]
    pub manifest: serde_json::Value,
}

impl From<Runtime> for RuntimeView {
    fn from(r: Runtime) -> RuntimeView {
        RuntimeView {
            name: r.name,
            digest: r.digest.to_hex(),
            manifest: r.manifest,
        }
    }
}

/// `GET /v1/runtimes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeList {
    /// Every runtime, by name.
    pub runtimes: Vec<RuntimeView>,
}

/// `POST /v1/execs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExecBody {
    /// A runtime name, or its digest (64 hex digits).
    pub runtime: String,
    /// A shape: `small`, `medium` or `small-net`.
    pub shape: String,
    /// The argv: 1 to 256 strings, the first non-empty, no NUL, each at
    /// most 4096 bytes, at most 64 KiB together.
    pub command: Vec<String>,
    /// How long the command may run, milliseconds (at most one day).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Whether the command's stdin stays open for input
    /// (`POST /v1/execs/{id}/input`) until an `eof` input; default `false`:
    /// stdin is empty. Left out of the canonical request when `false`, so
    /// a request without it keeps its idempotency digest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_open: bool,
    /// How long the exec may go without activity (an output page or an
    /// input) before it hibernates, milliseconds (1 to 86400000); absent:
    /// never for idleness. Left out of the canonical request when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ttl_ms: Option<u64>,
    /// What the timeout does: `terminate` (the default: the exec ends
    /// `expired`) or `hibernate` (it hibernates and may be resumed). Left
    /// out of the canonical request when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<String>,
}

/// The canonical identity of an exec, fixed at admission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CanonicalView {
    /// The exec.
    pub exec_id: i64,
    /// Generation 1's sandbox Lease.
    pub lease_id: i64,
    /// The provider.
    pub provider_id: String,
    /// The runtime's digest.
    pub runtime: String,
    /// The workspace.
    pub workspace_id: i64,
}

impl From<CanonicalIdentity> for CanonicalView {
    fn from(c: CanonicalIdentity) -> CanonicalView {
        CanonicalView {
            exec_id: c.exec_id.0,
            lease_id: c.lease_id.0,
            provider_id: c.provider_id.as_str().to_string(),
            runtime: c.runtime.to_hex(),
            workspace_id: c.workspace_id.0,
        }
    }
}

/// An exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecView {
    /// The exec.
    pub exec_id: i64,
    /// Its tenant.
    pub tenant_id: i64,
    /// `awaiting_approval` (its tenant's approval policy gates its shape:
    /// it holds no units until approved), `admitted`, `running`,
    /// `hibernated` (its workspace snapshotted, its units returned; `POST
    /// /v1/execs/{id}/resume` runs it again) or `terminal`.
    pub state: String,
    /// `exited`, `cancelled`, `expired`, `start_failed`,
    /// `snapshot_refused` (its hibernation stopped the command, then the
    /// provider refused to snapshot the workspace: see `hibernation`),
    /// `denied` (an approver denied it) or `approval_expired` (its
    /// approval's `valid_until` passed on the cut before it started) once
    /// terminal.
    pub terminal_reason: Option<String>,
    /// Why it ended `expired`: `timeout` (its `timeout_ms` passed on a
    /// certain cut; named when its Lease's expiry passed too) or `lease`
    /// (its sandbox Lease's expiry passed unrenewed: the instance was
    /// lost or stopped answering, or no worker renewed it). Absent for
    /// every other reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_by: Option<String>,
    /// The command's exit code, when it exited with one.
    pub exit_code: Option<i32>,
    /// The canonical identity.
    pub canonical: CanonicalView,
    /// The current attempt (from 1).
    pub attempt: i32,
    /// The shape.
    pub shape: String,
    /// The argv.
    pub command: Vec<String>,
    /// The requested timeout, milliseconds.
    pub timeout_ms: Option<u64>,
    /// When the timeout ends, on the cut.
    #[schema(value_type = Option<String>)]
    pub timeout_deadline: Option<Timestamp>,
    /// The certain cut the exec was admitted at.
    #[schema(value_type = String)]
    pub admitted_cut: Timestamp,
    /// Whether a cancel was asked for.
    pub cancel_requested: bool,
    /// The idle TTL, milliseconds (`null`: never hibernates for
    /// idleness).
    pub idle_ttl_ms: Option<u64>,
    /// What the timeout does: `terminate` or `hibernate`.
    pub on_timeout: String,
    /// The workspace's head: the newest snapshot's SHA-256, 64 hex digits
    /// (`null` before the first hibernation committed one).
    pub workspace_head: Option<String>,
    /// The newest hibernation of the current attempt.
    pub hibernation: Option<HibernationView>,
    /// The newest committed resume.
    pub resume: Option<ResumeReceiptView>,
    /// The decision on its approval, when it awaited one.
    pub approval: Option<ApprovalView>,
    /// What the provider measured of the current attempt's instances
    /// (verified against its registered key), each taken just before that
    /// generation's instance is destroyed, combined over every generation
    /// of the attempt (CPU time summed, the largest peak, a side effect
    /// seen in any generation); absent unless every generation was
    /// measured (the provider died or never answered, a generation is
    /// still running), which means unknown, never zero cost or no side
    /// effects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<ObservationView>,
    /// Whether re-executing the current attempt from its start would be
    /// safe, judged only on `observation`.
    pub reexecution: ReexecutionView,
}

/// A trusted measurement of one Lease generation. Every value the
/// provider could not measure is absent, never `0` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservationView {
    /// The cost from the instance's own accounting; absent when it was
    /// not readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostView>,
    /// The side effects observed.
    pub externality: ExternalityView,
}

/// A measured cost: whole milliseconds of CPU time and the peak memory in
/// bytes. A measured `0` is a real value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostView {
    /// CPU time, milliseconds.
    pub cpu_time_ms: u64,
    /// Peak memory, bytes.
    pub peak_memory_bytes: u64,
}

/// Side effects: each flag present only when observed (`false`: observed
/// not to happen); absent: unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalityView {
    /// Writes to the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_writes: Option<bool>,
    /// Commits to a database outside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_commits: Option<bool>,
    /// Calls to external APIs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_api_calls: Option<bool>,
}

/// The re-execution verdict: `eligible` only when the observation is
/// complete and every flag is `false`; otherwise `reason` says why not:
/// `externality_unobserved` (nothing measured), `externality_incomplete`
/// (a flag unknown, none observed true) or `externality_observed` (a side
/// effect happened).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReexecutionView {
    /// Whether re-execution would be safe.
    pub eligible: bool,
    /// Why not (absent when eligible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<AttemptObservation> for ObservationView {
    fn from(o: AttemptObservation) -> ObservationView {
        ObservationView {
            cost: o.cost.map(|c| CostView {
                cpu_time_ms: c.cpu_time_ms,
                peak_memory_bytes: c.peak_memory_bytes,
            }),
            externality: ExternalityView {
                network_writes: o.externality.network_writes,
                database_commits: o.externality.database_commits,
                external_api_calls: o.externality.external_api_calls,
            },
        }
    }
}

impl From<Eligibility> for ReexecutionView {
    fn from(e: Eligibility) -> ReexecutionView {
        match e {
            Eligibility::Eligible => ReexecutionView {
                eligible: true,
                reason: None,
            },
            Eligibility::Ineligible(r) => ReexecutionView {
                eligible: false,
                reason: Some(r.code().to_string()),
            },
        }
    }
}

impl From<ExecRecord> for ExecView {
    fn from(e: ExecRecord) -> ExecView {
        ExecView {
            exec_id: e.exec_id.0,
            tenant_id: e.tenant_id.0,
            state: e.state.as_str().to_string(),
            terminal_reason: e.terminal_reason.map(|r| r.as_str().to_string()),
            expired_by: e.expired_by.map(|c| c.as_str().to_string()),
            exit_code: e.exit_code,
            canonical: e.canonical.into(),
            attempt: e.attempt.0,
            shape: e.shape,
            command: e.command,
            timeout_ms: e.timeout_ms,
            timeout_deadline: e.timeout_deadline,
            admitted_cut: e.admitted_cut,
            cancel_requested: e.cancel_requested,
            idle_ttl_ms: e.idle_ttl_ms,
            on_timeout: e.on_timeout.as_str().to_string(),
            workspace_head: e.workspace_head.map(|d| d.to_hex()),
            hibernation: e.hibernation.map(Into::into),
            resume: e.resume.map(Into::into),
            approval: e.approval.map(Into::into),
            reexecution: attempt_reexecution_eligibility(e.observation.as_ref()).into(),
            observation: e.observation.map(Into::into),
        }
    }
}

/// A hibernation of one attempt generation: sealed at a certain cut,
/// then `quiesced` (its snapshot committed as the workspace head), then
/// `parked` (its sandbox destroyed, its units returned); or, from
/// `sealed`, `refused` (the provider could not snapshot the stopped
/// workspace: the exec ended `snapshot_refused`, its units are returned
/// once its sandbox is destroyed, the head did not move).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HibernationView {
    /// The exec.
    pub exec_id: i64,
    /// The attempt.
    pub attempt: i32,
    /// The generation that hibernates.
    pub generation: i64,
    /// That generation's sandbox Lease.
    pub lease_id: i64,
    /// `requested`, `idle` or `deadline`.
    pub reason: String,
    /// The certain cut it was sealed at.
    #[schema(value_type = String)]
    pub sealed_cut: Timestamp,
    /// `sealed`, `quiesced`, `parked` or `refused`.
    pub step: String,
    /// The snapshot its quiescence committed, 64 hex digits (once
    /// `quiesced`).
    pub head: Option<String>,
    /// Why the provider refused to snapshot the workspace (once
    /// `refused`).
    pub refusal: Option<SnapshotRefusalView>,
}

/// The provider's refusal to snapshot a stopped workspace (code
/// `snapshot_refused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotRefusalView {
    /// The stable reason: `special_file` (a device, fifo or socket),
    /// `path_not_utf8`, `too_many_entries`, `too_many_bytes`,
    /// `manifest_too_large`, ...
    pub reason: String,
    /// The workspace entry concerned, relative to its root (empty when
    /// not about one).
    pub path: String,
    /// The provider's message: what is wrong and what to do.
    pub message: String,
}

impl From<HibernationRecord> for HibernationView {
    fn from(h: HibernationRecord) -> HibernationView {
        HibernationView {
            exec_id: h.exec_id.0,
            attempt: h.attempt.0,
            generation: h.generation.0,
            lease_id: h.lease_id.0,
            reason: h.reason.as_str().to_string(),
            sealed_cut: h.sealed_cut,
            step: h.step.as_str().to_string(),
            head: h.head.map(|d| d.to_hex()),
            refusal: h.refusal.map(|r| SnapshotRefusalView {
                reason: r.reason,
                path: r.path,
                message: r.message,
            }),
        }
    }
}

/// `POST /v1/execs/{id}/resume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBody {
    /// The workspace head to resume from, 64 hex digits; absent: the
    /// workspace's current head.
    #[serde(default)]
    pub head: Option<String>,
}

/// A recorded resume request: the parked exec resumes once its gateway
/// commits it (the exec's `resume` then shows the receipt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResumeIntentView {
    /// The exec.
    pub exec_id: i64,
    /// The request's idempotency key.
    pub op_key: String,
    /// SHA-256 of the canonical request `{"exec_id", "head"}`, 64 hex
    /// digits.
    pub request_sha256: String,
    /// The parked head it resumes, 64 hex digits.
    pub head: String,
    /// The parked attempt.
    pub attempt: i32,
    /// The parked generation.
    pub from_generation: i64,
    /// The cut it was recorded at.
    #[schema(value_type = String)]
    pub recorded_cut: Timestamp,
    /// Set once the provider refused to restore the head for this request
    /// (a blob missing or not matching its digest): the request is never
    /// carried out, the exec stays hibernated, and a request under a new
    /// key retries. `null` while it may still be carried out.
    pub refused: Option<ResumeRefusalView>,
}

/// Why the provider refused to restore a resume's head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResumeRefusalView {
    /// The provider's stable code: `restore_failed` or `snapshot_refused`.
    pub code: String,
    /// Its message, naming the path and the blob's digest.
    pub message: String,
}

impl From<ResumeIntent> for ResumeIntentView {
    fn from(i: ResumeIntent) -> ResumeIntentView {
        ResumeIntentView {
            exec_id: i.exec_id.0,
            op_key: i.op_key,
            request_sha256: i.request_sha256.to_hex(),
            head: i.head.to_hex(),
            attempt: i.attempt.0,
            from_generation: i.from_generation.0,
            recorded_cut: i.recorded_cut,
            refused: i.refused.map(|r| ResumeRefusalView {
                code: r.code,
                message: r.message,
            }),
        }
    }
}

/// The immutable receipt of a committed resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResumeReceiptView {
    /// The resume's idempotency key.
    pub op_key: String,
    /// The resumed attempt.
    pub attempt: i32,
    /// The parked generation.
    pub from_generation: i64,
    /// The new generation.
    pub to_generation: i64,
    /// Its sandbox Lease.
    pub lease_id: i64,
    /// The workspace head it restored, 64 hex digits.
    pub head: String,
    /// The certain cut it committed at.
    #[schema(value_type = String)]
    pub committed_cut: Timestamp,
}

impl From<ResumeReceipt> for ResumeReceiptView {
    fn from(r: ResumeReceipt) -> ResumeReceiptView {
        ResumeReceiptView {
            op_key: r.op_key,
            attempt: r.attempt.0,
            from_generation: r.from_generation.0,
            to_generation: r.to_generation.0,
            lease_id: r.lease_id.0,
            head: r.head.to_hex(),
            committed_cut: r.committed_cut,
        }
    }
}

/// An exec's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceView {
    /// The workspace.
    pub workspace_id: i64,
    /// Its exec.
    pub exec_id: i64,
    /// The newest snapshot's digest, 64 hex digits (`null` before the
    /// first).
    pub head: Option<String>,
    /// How many snapshots its chain holds.
    pub snapshots: i64,
}

impl From<WorkspaceRecord> for WorkspaceView {
    fn from(w: WorkspaceRecord) -> WorkspaceView {
        WorkspaceView {
            workspace_id: w.workspace_id.0,
            exec_id: w.exec_id.0,
            head: w.head.map(|d| d.to_hex()),
            snapshots: w.snapshots,
        }
    }
}

/// `GET /v1/execs/{id}/snapshots?after_seq=&limit=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SnapshotsQuery {
    /// Only snapshots with a larger chain seq (default 0: from the first).
    #[serde(default)]
    pub after_seq: Option<i64>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One snapshot of a workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotView {
    /// Its place in the chain, from 1.
    pub seq: i64,
    /// SHA-256 of its canonical manifest, 64 hex digits.
    pub digest: String,
    /// The previous head (`null` for the first).
    pub parent: Option<String>,
    /// Bytes of the manifest.
    pub manifest_bytes: i64,
    /// The Lease whose quiescence committed it.
    pub lease_id: i64,
    /// That Lease's generation.
    pub generation: i64,
    /// The certain cut it committed at.
    #[schema(value_type = String)]
    pub committed_cut: Timestamp,
}

impl From<SnapshotMeta> for SnapshotView {
    fn from(m: SnapshotMeta) -> SnapshotView {
        SnapshotView {
            seq: m.seq,
            digest: m.digest.to_hex(),
            parent: m.parent.map(|d| d.to_hex()),
            manifest_bytes: m.manifest_bytes,
            lease_id: m.lease_id.0,
            generation: m.generation.0,
            committed_cut: m.committed_cut,
        }
    }
}

/// A page of an exec's snapshots, ascending by seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    /// The snapshots.
    pub snapshots: Vec<SnapshotView>,
    /// The `after_seq` of the next page, when this one was full.
    pub next_after_seq: Option<i64>,
}

/// `GET /v1/execs/{id}/milestones?after_seq=&limit=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MilestonesQuery {
    /// Only milestones with a larger seq (default 0: from the first).
    #[serde(default)]
    pub after_seq: Option<u32>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One milestone of an exec: a saved point of an attempt that recovery
/// can restart from, with what the trusted provider had observed of the
/// attempt up to it. Every value not observed is absent, never `0` or
/// `false`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MilestoneView {
    /// Its number among the exec's milestones, from 1 in recording order.
    pub seq: u32,
    /// The attempt it belongs to.
    pub attempt: i32,
    /// The Lease generation whose workspace it saved.
    pub generation: i64,
    /// What recorded it: `hibernation`.
    pub source: String,
    /// The file snapshot head it saved: SHA-256 of its manifest, 64 hex
    /// digits.
    pub head: String,
    /// The attempt's measured cost up to the milestone (CPU time summed
    /// over its generations, the largest peak); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostView>,
    /// The side effects observed up to the milestone; absent when none
    /// was observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub externality: Option<ExternalityView>,
    /// Whether re-executing from this milestone would be safe: only with
    /// a complete externality observation whose three flags are `false`.
    pub reexecution: ReexecutionView,
    /// The certain cut it was recorded at (RFC 3339, nanoseconds).
    #[schema(value_type = String)]
    pub recorded_cut: Timestamp,
}

/// A page of an exec's milestones, ascending by seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MilestoneList {
    /// The milestones.
    pub milestones: Vec<MilestoneView>,
    /// The `after_seq` of the next page, when this one was full.
    pub next_after_seq: Option<u32>,
}

impl From<MilestoneRecord> for MilestoneView {
    fn from(m: MilestoneRecord) -> MilestoneView {
        MilestoneView {
            seq: m.seq,
            attempt: m.attempt.0,
            generation: m.generation.0,
            source: m.source.as_str().to_string(),
            reexecution: reexecution_eligibility(Some(&m.milestone)).into(),
            head: m.milestone.head,
            cost: m.milestone.cost.map(|c| CostView {
                cpu_time_ms: c.cpu_time_ms,
                peak_memory_bytes: c.peak_memory_bytes,
            }),
            externality: m.milestone.externality.map(|x| ExternalityView {
                network_writes: x.network_writes,
                database_commits: x.database_commits,
                external_api_calls: x.external_api_calls,
            }),
            recorded_cut: m.recorded_cut,
        }
    }
}

/// One entry of a snapshot's tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TreeEntryView {
    /// Relative, `/`-separated path.
    pub path: String,
    /// `dir`, `file` or `symlink`.
    pub kind: String,
    /// Permission bits (0 to 0o7777; 0o777 for a symlink).
    pub mode: u32,
    /// A file's length in bytes.
    pub size: Option<u64>,
    /// A file's SHA-256, 64 hex digits.
    pub sha256: Option<String>,
    /// A symlink's target, as the link holds it.
    pub target: Option<String>,
}

impl From<&Entry> for TreeEntryView {
    fn from(e: &Entry) -> TreeEntryView {
        let (kind, size, sha256, target) = match &e.kind {
            EntryKind::Dir => ("dir", None, None, None),
            EntryKind::File { size, sha256 } => ("file", Some(*size), Some(sha256.to_hex()), None),
            EntryKind::Symlink { target } => ("symlink", None, None, Some(target.clone())),
        };
        TreeEntryView {
            path: e.path.clone(),
            kind: kind.to_string(),
            mode: e.mode,
            size,
            sha256,
            target,
        }
    }
}

/// A snapshot's tree: every entry, sorted by the bytes of its path (a
/// directory before what it holds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TreeView {
    /// The snapshot's digest, 64 hex digits.
    pub digest: String,
    /// The workspace.
    pub workspace_id: i64,
    /// The previous snapshot's digest (`null` for the first).
    pub parent: Option<String>,
    /// The entries.
    pub entries: Vec<TreeEntryView>,
}

/// `POST /v1/execs/{id}/input`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendInputBody {
    /// The bytes for the command's stdin, standard base64: at most 65536
    /// bytes decoded; empty only with `eof`.
    pub data_b64: String,
    /// Whether stdin closes after these bytes (default `false`); nothing
    /// is accepted after it.
    #[serde(default)]
    pub eof: bool,
}

/// One input of an exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InputView {
    /// The exec.
    pub exec_id: i64,
    /// From 1, no gaps: the order the command reads the inputs in.
    pub input_seq: i64,
    /// Bytes in the input.
    pub length: u64,
    /// SHA-256 of the bytes, 64 hex digits.
    pub sha256: String,
    /// Whether stdin closes after it.
    pub eof: bool,
    /// `queued` (accepted, not yet delivered) or `sent` (delivered to the
    /// command's supervisor, which writes it to stdin once).
    pub state: String,
}

impl From<InputRecord> for InputView {
    fn from(i: InputRecord) -> InputView {
        InputView {
            exec_id: i.exec_id.0,
            input_seq: i.input_seq,
            length: i.bytes.len() as u64,
            sha256: i.sha256.to_hex(),
            eof: i.eof,
            state: i.state.as_str().to_string(),
        }
    }
}

/// `GET /v1/execs?after=&limit=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExecListQuery {
    /// Only execs with a larger id.
    #[serde(default)]
    pub after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// A page of the acting tenant's execs, ascending by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecList {
    /// The execs.
    pub execs: Vec<ExecView>,
    /// The `after` of the next page, when this one was full.
    pub next_after: Option<i64>,
}

/// `GET /v1/execs/{id}/output?after_seq=&limit=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// Only pages with a larger seq (default 0: from the first; at most
    /// 9223372036854775806, so the answer's `next_seq` is an i64).
    #[serde(default)]
    pub after_seq: Option<i64>,
    /// At most this many pages (default and maximum 64).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// How the command ended (the terminal page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExitView {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
}

/// One output page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PageView {
    /// From 1, no gaps.
    pub seq: i64,
    /// `stdout`, `stderr`, `terminal` (the exec's last page) or `stopped`
    /// (the last page of a generation that hibernated: the exec goes on
    /// when it is resumed, its pages numbered after this one).
    pub kind: String,
    /// The bytes (at most 65536), standard base64.
    pub data_b64: String,
    /// SHA-256 of the bytes, 64 hex digits.
    pub sha256: String,
    /// The exit status (terminal and stopped pages only; a stopped page's
    /// is the signal that stopped the command).
    pub exit: Option<ExitView>,
}

impl From<OutputPage> for PageView {
    fn from(p: OutputPage) -> PageView {
        PageView {
            seq: p.seq,
            kind: p.kind.as_str().to_string(),
            data_b64: base64::engine::general_purpose::STANDARD.encode(&p.bytes),
            sha256: p.sha256.to_hex(),
            exit: p.exit.map(|e| ExitView {
                code: e.code,
                signal: e.signal,
            }),
        }
    }
}

/// Output pages of the exec's current attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutputView {
    /// The pages, ascending by seq.
    pub pages: Vec<PageView>,
    /// Whether no page follows `pages`, ever: the terminal page is among
    /// them, or the exec is terminal and no stored page is left after the
    /// last one returned (an exec whose instance was lost before its
    /// terminal page, or that ended while hibernated, ends this way). An
    /// answer cut short by `limit` is the end only at the terminal page.
    pub terminal: bool,
    /// Whether the exec is hibernated and `pages` end at its stopped page
    /// (or none is left after it): its generation ended, and further pages
    /// come only after a resume.
    pub stopped: bool,
    /// The seq of the next page not returned (the last returned plus one,
    /// or `after_seq + 1` when none was): ask `after_seq = next_seq - 1`
    /// next.
    pub next_seq: i64,
}

/// An operation key and its recorded result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OperationView {
    /// The key.
    pub key: String,
    /// `admin` or `tenant`.
    pub scope: String,
    /// The tenant, for a tenant key.
    pub tenant_id: Option<i64>,
    /// The operation (`admit_exec`, `deposit`, ...).
    pub kind: String,
    /// SHA-256 of the canonical request, 64 hex digits.
    pub request_sha256: String,
    /// The recorded result (what a replay returns).
    #[schema(value_type = Object)]
    pub result: serde_json::Value,
    /// The cut the key was created at.
    #[schema(value_type = String)]
    pub created_cut: Timestamp,
    /// The cut captured at the terminal transition.
    #[schema(value_type = String)]
    pub floor: Timestamp,
    /// Its declared TTL, nanoseconds.
    pub ttl_ns: i64,
    /// Whether a certain cut has passed the floor.
    pub receipt_attached: bool,
    /// The earliest cut at which GC may delete it.
    #[schema(value_type = String)]
    pub gc_at: Timestamp,
}

impl From<OperationRecord> for OperationView {
    fn from(o: OperationRecord) -> OperationView {
        let (scope, tenant_id) = match o.scope {
            OpScope::Admin => ("admin", None),
            OpScope::Tenant(t) => ("tenant", Some(t.0)),
        };
        OperationView {
            key: o.key,
            scope: scope.to_string(),
            tenant_id,
            kind: o.kind,
            request_sha256: o.request_sha256.to_hex(),
            result: o.result,
            created_cut: o.created_cut,
            floor: o.floor,
            ttl_ns: o.ttl_ns,
            receipt_attached: o.receipt_attached,
            gc_at: o.gc_at,
        }
    }
}

/// `/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthView {
    /// Always `ok`.
    pub status: String,
}

/// `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadyView {
    /// Database reachable and the cut certain.
    pub ready: bool,
    /// Whether a read of the store succeeded.
    pub database_reachable: bool,
    /// The cut as read (`null` when the clock could not be read).
    #[schema(value_type = Option<String>)]
    pub cut: Option<Timestamp>,
    /// Whether the cut is certain (admissions allowed).
    pub cut_certain: bool,
    /// Why it is uncertain, when it is.
    pub uncertain_reason: Option<String>,
}

/// `POST /v1/tokens`: a scoped token of the acting tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MintTokenBody {
    /// The exec the token is bound to: it then acts only on that exec's
    /// routes (never create or list). Absent: any of the tenant's execs.
    #[serde(default)]
    pub exec_id: Option<i64>,
    /// The operations it may perform, each once, of `exec.create`,
    /// `exec.read` (one exec, the list, output, operation keys),
    /// `exec.input`, `exec.cancel`, `exec.hibernate`, `exec.resume`,
    /// `workspace.read`, `approval.decide`.
    pub operations: Vec<String>,
    /// How long it is accepted, in milliseconds on the cut from the
    /// certain cut it is minted at (1 to the service's longest token TTL,
    /// 30 days by default).
    pub ttl_ms: u64,
}

/// A scoped token (never its secret, except once in [`MintedTokenView`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    /// The token.
    pub token_id: i64,
    /// Its tenant.
    pub tenant_id: i64,
    /// The exec it is bound to, if any.
    pub exec_id: Option<i64>,
    /// Its operations, in the vocabulary's order.
    pub operations: Vec<String>,
    /// The certain cut it was minted at.
    #[schema(value_type = String)]
    pub minted_cut: Timestamp,
    /// Its Scope deadline: accepted while a certain cut is below it.
    #[schema(value_type = String)]
    pub deadline: Timestamp,
    /// Whether it was revoked.
    pub revoked: bool,
    /// The cut read when it was revoked.
    #[schema(value_type = Option<String>)]
    pub revoked_cut: Option<Timestamp>,
}

impl From<lc_core::token::TokenRecord> for TokenView {
    fn from(t: lc_core::token::TokenRecord) -> TokenView {
        TokenView {
            token_id: t.token_id.0,
            tenant_id: t.tenant_id.0,
            exec_id: t.exec_id.map(|e| e.0),
            operations: t.operations,
            minted_cut: t.minted_cut,
            deadline: t.deadline,
            revoked: t.revoked_cut.is_some(),
            revoked_cut: t.revoked_cut,
        }
    }
}

/// A minted token: its record and, in the answer that minted it, its
/// secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MintedTokenView {
    /// The token's record.
    #[serde(flatten)]
    pub record: TokenView,
    /// The secret (`lct_` + 43 base64url characters), present only in the
    /// answer that minted it: only its SHA-256 is stored, so a replay of
    /// the Idempotency-Key answers the record without it (mint another and
    /// revoke this one if it was lost).
    pub token: Option<String>,
    /// `true` when this answer is a replay of the Idempotency-Key.
    pub replay: bool,
}

/// `GET /v1/tokens?after=&limit=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TokenListQuery {
    /// Only tokens with a larger id.
    #[serde(default)]
    pub after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `GET /v1/claims?after_lease=&limit=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ClaimListQuery {
    /// Only claims on Leases with a larger id.
    #[serde(default)]
    pub after_lease: Option<i64>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// A page of the acting tenant's tokens, ascending by id (revoked and
/// expired ones included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    /// The tokens.
    pub tokens: Vec<TokenView>,
    /// The `after` of the next page, when this one is full.
    pub next_after: Option<i64>,
}

/// A worker's claim on a work item, judged at the answer's cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClaimView {
    /// The item's kind: `lease` (a sandbox Lease).
    pub item_kind: String,
    /// The item's id (the Lease id).
    pub item_id: i64,
    /// SHA-256 of the holding worker activation's id, 64 hex digits (the
    /// worker logs it at start as `holder_sha256`).
    pub holder_sha256: String,
    /// The claim's generation: 1 for the item's first holder, one more
    /// for every take by another worker.
    pub generation: i64,
    /// The claim's expiry on the cut.
    #[schema(value_type = String)]
    pub expiry: Timestamp,
    /// Why the holder could take it: `unowned` (never claimed before) or
    /// `expired` (the previous holder's claim was past expiry + grace).
    pub basis: String,
    /// Whether the answer's cut is certain and at or past the expiry.
    pub expired: bool,
    /// Whether another worker may take it now: a certain cut at or past
    /// expiry + the claim grace.
    pub takeable: bool,
}

impl From<lc_core::claim::ClaimRecord> for ClaimView {
    fn from(r: lc_core::claim::ClaimRecord) -> ClaimView {
        ClaimView {
            item_kind: r.claim.item.kind.as_str().to_owned(),
            item_id: r.claim.item.id,
            holder_sha256: r.claim.holder_sha256.to_hex(),
            generation: r.claim.generation.0,
            expiry: r.claim.expiry,
            basis: r.claim.basis.as_str().to_owned(),
            expired: r.expired,
            takeable: r.takeable,
        }
    }
}

/// A page of claims, by item, judged at one reading of the cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClaimList {
    /// The cut the answer was judged at.
    #[schema(value_type = String)]
    pub cut: Timestamp,
    /// Whether that cut was certain (nothing is expired or takeable on an
    /// uncertain one).
    pub certain: bool,
    /// The claims.
    pub claims: Vec<ClaimView>,
    /// The `after_lease` of the next page, when this one was full.
    pub next_after_lease: Option<i64>,
}

/// A deletion of an exec's workspace or output (`DELETE
/// /v1/execs/{id}/workspace`, `DELETE /v1/execs/{id}/output`, and their
/// `undelete`). Instants are cuts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeletionView {
    /// The exec.
    pub exec_id: i64,
    /// `workspace` or `output`.
    pub item: String,
    /// `deleted` (restorable until the purge), `restored` (an undelete's
    /// answer) or `purged`.
    pub state: String,
    /// The certain cut of the deletion.
    #[schema(value_type = String)]
    pub deleted_at: Timestamp,
    /// The earliest cut of the purge: `deleted_at` + the grace.
    #[schema(value_type = String)]
    pub purge_after: Timestamp,
    /// The cut of the purge, once purged.
    #[schema(value_type = Option<String>)]
    pub purged_at: Option<Timestamp>,
    /// The `lc` command that restores it before the purge; `null` once it
    /// is restored or purged (nothing is left to undelete).
    pub undelete: Option<String>,
}

impl From<lc_core::deletion::DeletionRecord> for DeletionView {
    fn from(d: lc_core::deletion::DeletionRecord) -> DeletionView {
        DeletionView {
            exec_id: d.exec_id.0,
            item: d.item.as_str().to_owned(),
            state: d.state.as_str().to_owned(),
            deleted_at: d.deleted_at,
            purge_after: d.purge_after,
            purged_at: d.purged_at,
            undelete: (d.state == lc_core::deletion::DeletionState::Deleted)
                .then(|| d.item.undelete_command(d.exec_id)),
        }
    }
}
