//! Hibernation and resume: the records the store keeps and the pure rules
//! that decide each step.
//!
//! # Rules
//!
//! * **Seal** ([`plan_hibernation`], [`idle_due`], [`deadline_due`]): a
//!   hibernation of (exec, attempt, generation) is recorded only on a
//!   certain cut, of an exec `running` with an `active` Lease, at most one
//!   per generation. Idleness is `at.cut >= last_activity + idle_ttl`
//!   exactly; nothing is due on an uncertain cut.
//! * **Quiescence** ([`check_quiescence`]): the provider's signed
//!   statement names exactly the Lease, generation and workspace, its head
//!   is the SHA-256 of the manifest bytes committed, those bytes are a
//!   canonical [`crate::snapshot::Manifest`] of the exec's workspace, and
//!   the manifest's parent is the workspace's current head (a stale chain
//!   is refused).
//! * **Resume request** ([`resume_request_sha256`]): its digest is the
//!   SHA-256 of the canonical JSON (JCS) of `{"exec_id", "head"}`, the
//!   head `null` when the request names none; the operation key must
//!   carry exactly it ([`check_request_digest`]: a recorded request names
//!   its head or none).
//! * **Commit of a resume** ([`check_resume`]): the attempt is parked, the
//!   intent's digest and head match, the attachment is of exactly the
//!   prepared generation, live, and names the parked head; no other right
//!   of the exec is unreleased.
//!
//! No function here reads a clock or does I/O.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::evidence::Statement;
use crate::model::{
    AttemptNo, AttemptState, CutReading, Digest, ExecId, ExecState, Generation, HibernationReason,
    HibernationStep, LeaseState, SandboxLeaseId, WorkspaceId,
};
use crate::rules::is_expired;
use crate::snapshot::Manifest;

/// The longest idle TTL, in milliseconds (as the exec timeout's bound).
pub const IDLE_TTL_MS_MAX: u64 = crate::rules::TIMEOUT_MS_MAX;

/// One recorded hibernation of an exec's attempt generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HibernationRecord {
    /// The exec.
    pub exec_id: ExecId,
    /// The attempt.
    pub attempt: AttemptNo,
    /// The generation that hibernates.
    pub generation: Generation,
    /// That generation's sandbox Lease.
    pub lease_id: SandboxLeaseId,
    /// Why.
    pub reason: HibernationReason,
    /// The certain cut it was sealed at.
    pub sealed_cut: Timestamp,
    /// Where it stands.
    pub step: HibernationStep,
    /// The snapshot committed by its quiescence (once `quiesced`).
    pub head: Option<Digest>,
    /// The provider's refusal to snapshot (once `refused`).
    pub refusal: Option<QuiescenceRefusal>,
}

/// Why a provider refused to snapshot a stopped generation's workspace
/// (its `snapshot_refused` answer to `quiesce`), as recorded on the
/// hibernation. Retrying does not help: the tree itself breaks a snapshot
/// rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuiescenceRefusal {
    /// The provider's stable reason code (`special_file`,
    /// `path_not_utf8`, `too_many_entries`, `manifest_too_large`, ...).
    pub reason: String,
    /// The workspace entry concerned, relative to its root (empty when
    /// not about one); at most [`REFUSAL_PATH_BYTES_MAX`] bytes.
    pub path: String,
    /// The provider's message; at most [`REFUSAL_MESSAGE_BYTES_MAX`]
    /// bytes.
    pub message: String,
}

/// The longest refusal path kept on a hibernation, in bytes (a longer one
/// is cut at a character boundary).
pub const REFUSAL_PATH_BYTES_MAX: usize = 1024;

/// `text` cut to at most `max` bytes at a character boundary.
pub fn clip_text(text: &str, max: usize) -> String {
    text[..text.floor_char_boundary(max)].to_owned()
}

/// Checks a provider's refusal to snapshot and cuts its path and message
/// to their bounds.
///
/// # Errors
/// [`LcError::InvalidInput`] when `reason` is not a stable code
/// (`[a-z][a-z0-9_]{0,63}`).
pub fn check_quiescence_refusal(r: &QuiescenceRefusal) -> Result<QuiescenceRefusal, LcError> {
    let code_ok = r.reason.len() <= 64
        && r.reason
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase())
        && r.reason
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !code_ok {
        return Err(LcError::InvalidInput {
            reason: format!(
                "a snapshot refusal's reason is a stable code ([a-z][a-z0-9_]{{0,63}}), not {:?}",
                clip_text(&r.reason, 80)
            ),
        });
    }
    Ok(QuiescenceRefusal {
        reason: r.reason.clone(),
        path: clip_text(&r.path, REFUSAL_PATH_BYTES_MAX),
        message: clip_text(&r.message, REFUSAL_MESSAGE_BYTES_MAX),
    })
}

/// What a refused quiescence of a sealed hibernation does: `None` when it
/// is recorded already (a replay: nothing changes), else the exec's
/// terminal reason (`cancelled` after a cancel request, else
/// `snapshot_refused`).
///
/// # Errors
/// [`LcError::IllegalTransition`] unless the hibernation is `sealed` (or
/// `refused`, the replay), its Lease `active` and the generation's stopped
/// page acknowledged (the command is stopped and its pages are all moved).
pub fn plan_quiescence_refusal(
    step: HibernationStep,
    lease_state: LeaseState,
    stopped_acked: bool,
    cancel_requested: bool,
) -> Result<Option<crate::model::TerminalReason>, LcError> {
    use crate::model::TerminalReason;
    match step {
        HibernationStep::Refused => Ok(None),
        HibernationStep::Sealed if lease_state == LeaseState::Active && stopped_acked => {
            Ok(Some(if cancel_requested {
                TerminalReason::Cancelled
            } else {
                TerminalReason::SnapshotRefused
            }))
        }
        HibernationStep::Sealed => Err(LcError::IllegalTransition {
            what: if lease_state == LeaseState::Active {
                "hibernation (a refused snapshot needs the stopped page acknowledged)"
            } else {
                "hibernation (a refused snapshot needs an active Lease)"
            },
            from: step.as_str(),
            to: HibernationStep::Refused.as_str(),
        }),
        HibernationStep::Quiesced | HibernationStep::Parked => Err(LcError::IllegalTransition {
            what: "hibernation (its quiescence is committed)",
            from: step.as_str(),
            to: HibernationStep::Refused.as_str(),
        }),
    }
}

/// A tenant's request to resume a parked exec, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeIntent {
    /// The exec.
    pub exec_id: ExecId,
    /// The request's operation key (tenant scope).
    pub op_key: String,
    /// [`resume_request_sha256`] of (`exec_id`, `head`), or of (`exec_id`,
    /// none) for a request that named no head.
    pub request_sha256: Digest,
    /// The parked head it resumes.
    pub head: Digest,
    /// The parked attempt.
    pub attempt: AttemptNo,
    /// The parked generation.
    pub from_generation: Generation,
    /// The cut it was recorded at.
    pub recorded_cut: Timestamp,
    /// The provider's refusal of this resume's restore (its prepared Lease
    /// was released without an attachment): the exec stays parked, this
    /// intent is never prepared again, and a new request (another
    /// operation key) may retry. `None` while the intent may still be
    /// prepared or committed.
    pub refused: Option<ResumeRefusal>,
}

/// Why a provider refused to restore a resume's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeRefusal {
    /// The provider's stable code (`restore_failed`, `snapshot_refused`).
    pub code: String,
    /// Its message, naming the path and blob digest it refused.
    pub message: String,
}

/// The longest refusal message kept on an intent, in bytes (a longer one
/// is cut at a character boundary).
pub const REFUSAL_MESSAGE_BYTES_MAX: usize = 2048;

/// The immutable receipt of a committed resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeReceipt {
    /// The exec.
    pub exec_id: ExecId,
    /// The resume's operation key.
    pub op_key: String,
    /// The resumed attempt.
    pub attempt: AttemptNo,
    /// The parked generation.
    pub from_generation: Generation,
    /// The new generation, now runnable.
    pub to_generation: Generation,
    /// Its sandbox Lease.
    pub lease_id: SandboxLeaseId,
    /// The workspace head it restored.
    pub head: Digest,
    /// The intent's request digest.
    pub request_sha256: Digest,
    /// SHA-256 of the owner token that committed it.
    pub token_sha256: Digest,
    /// The owner's generation.
    pub owner_generation: i64,
    /// The owner's fence.
    pub owner_fence: i64,
    /// The certain cut it committed at.
    pub committed_cut: Timestamp,
}

/// An exec's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRecord {
    /// The workspace.
    pub workspace_id: WorkspaceId,
    /// Its exec.
    pub exec_id: ExecId,
    /// The newest snapshot's digest; `None` before the first.
    pub head: Option<Digest>,
    /// How many snapshots its chain holds.
    pub snapshots: i64,
}

/// One snapshot of a workspace, without its manifest bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// The workspace.
    pub workspace_id: WorkspaceId,
    /// Its place in the chain, from 1.
    pub seq: i64,
    /// SHA-256 of the manifest's canonical bytes.
    pub digest: Digest,
    /// The previous head; `None` for the first.
    pub parent: Option<Digest>,
    /// Bytes of the manifest.
    pub manifest_bytes: i64,
    /// The Lease whose quiescence committed it.
    pub lease_id: SandboxLeaseId,
    /// That Lease's generation.
    pub generation: Generation,
    /// The certain cut it committed at.
    pub committed_cut: Timestamp,
}

/// The resume request digest: SHA-256 of the JCS of
/// `{"exec_id": <int>, "head": "<64 hex>"}`, or with `"head": null` for a
/// request that names no head (it resumes the workspace's head, which the
/// store resolves once, when it records the request; a replay of the same
/// request then returns that record whatever the head is by then).
pub fn resume_request_sha256(exec_id: ExecId, head: Option<Digest>) -> Digest {
    let body = serde_json::json!({"exec_id": exec_id.0, "head": head.map(|h| h.to_hex())});
    // Integers, a hex string or null: JCS cannot fail on it.
    Digest::of(&serde_jcs::to_vec(&body).unwrap_or_default())
}

/// Checks that `found`, a recorded resume request's digest, is one of the
/// two a request resuming `head` of exec `exec_id` may carry: naming the
/// head, or naming none (`resume_request_sha256(exec_id, None)`).
///
/// # Errors
/// [`LcError::RequestDigestMismatch`] otherwise, expecting the digest that
/// names the head.
pub fn check_request_digest(exec_id: ExecId, head: Digest, found: Digest) -> Result<(), LcError> {
    let named = resume_request_sha256(exec_id, Some(head));
    if found == named || found == resume_request_sha256(exec_id, None) {
        Ok(())
    } else {
        Err(LcError::RequestDigestMismatch {
            expected: named,
            found,
        })
    }
}

/// Checks an idle TTL in milliseconds.
///
/// # Errors
/// [`LcError::InvalidTimeout`] outside `1..=`[`IDLE_TTL_MS_MAX`].
pub fn check_idle_ttl_ms(ms: u64) -> Result<SignedDuration, LcError> {
    if (1..=IDLE_TTL_MS_MAX).contains(&ms) {
        Ok(SignedDuration::from_millis(ms as i64))
    } else {
        Err(LcError::InvalidTimeout {
            reason: format!("an idle ttl is 1..={IDLE_TTL_MS_MAX} ms, not {ms}"),
        })
    }
}

/// Whether an exec last active at `last_activity` is idle past `idle_ttl`
/// at `at`: a certain cut at or after `last_activity + idle_ttl`.
pub fn idle_due(last_activity: Timestamp, idle_ttl: SignedDuration, at: CutReading) -> bool {
    match last_activity.checked_add(idle_ttl) {
        Ok(due) => is_expired(due, at),
        Err(_) => false,
    }
}

/// Whether an exec with `on_timeout = hibernate` hibernates for its
/// deadline at `at`: a certain cut at or after the deadline, with no
/// activity since it (a resumed exec's activity starts after its
/// deadline, so the deadline hibernates it once).
pub fn deadline_due(deadline: Timestamp, last_activity: Timestamp, at: CutReading) -> bool {
    last_activity < deadline && is_expired(deadline, at)
}

/// What [`plan_hibernation`] decides from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HibernationView {
    /// The exec.
    pub exec_id: ExecId,
    /// Its state.
    pub exec_state: ExecState,
    /// Its current attempt's state.
    pub attempt_state: AttemptState,
    /// Its current Lease's state.
    pub lease_state: LeaseState,
    /// Whether the tenant asked to cancel it.
    pub cancel_requested: bool,
    /// The hibernation of the current generation, if one is recorded.
    pub existing: Option<HibernationStep>,
}

/// Whether a hibernation may be sealed at `at`.
///
/// # Errors
/// [`LcError::TimeUncertain`] on an uncertain cut;
/// [`LcError::ExecTerminal`] for a terminal exec;
/// [`LcError::HibernationInProgress`] when the current generation has one;
/// [`LcError::ExecNotHibernatable`] unless the exec runs with an active
/// Lease and no cancel request.
pub fn plan_hibernation(v: HibernationView, at: CutReading) -> Result<(), LcError> {
    crate::rules::require_certain(at)?;
    if v.exec_state == ExecState::Terminal {
        return Err(LcError::ExecTerminal { exec_id: v.exec_id });
    }
    if v.exec_state == ExecState::Hibernated {
        return Err(LcError::ExecNotHibernatable {
            exec_id: v.exec_id,
            reason: format!(
                "exec {} is hibernated already: resume it (lc exec resume {})",
                v.exec_id, v.exec_id
            ),
        });
    }
    if let Some(step) = v.existing {
        return Err(LcError::HibernationInProgress {
            exec_id: v.exec_id,
            step: step.as_str(),
        });
    }
    if v.exec_state != ExecState::Running
        || v.attempt_state != AttemptState::Running
        || v.lease_state != LeaseState::Active
        || v.cancel_requested
    {
        return Err(LcError::ExecNotHibernatable {
            exec_id: v.exec_id,
            reason: format!(
                "exec {} attempt {} lease {}{}: only a running exec with an active Lease hibernates",
                v.exec_state,
                v.attempt_state,
                v.lease_state,
                if v.cancel_requested {
                    " (cancel requested)"
                } else {
                    ""
                }
            ),
        });
    }
    Ok(())
}

/// What a quiescence must name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuiescenceExpected<'a> {
    /// The Lease's provider.
    pub provider_id: &'a str,
    /// The Lease.
    pub lease_id: SandboxLeaseId,
    /// Its generation.
    pub generation: Generation,
    /// The exec's workspace.
    pub workspace_id: WorkspaceId,
    /// The workspace's current head.
    pub current_head: Option<Digest>,
}

/// Checks a verified quiescence statement against the Lease, the manifest
/// bytes and the chain: returns the new head and the parsed manifest (its
/// parent is the snapshot's parent).
///
/// # Errors
/// [`LcError::EvidenceRejected`] for another statement kind or subject
/// (provider, lease, generation, workspace); [`LcError::InvalidInput`] for
/// bytes that are not a canonical manifest
/// ([`crate::snapshot::Manifest::from_canonical`]: over
/// [`crate::snapshot::SNAPSHOT_MANIFEST_BYTES_MAX`], malformed, a broken
/// rule, not canonical; the reason starts with the snapshot error's code);
/// [`LcError::WorkspaceHeadMismatch`] when `head` is not `sha256(manifest)`
/// or the statement's head, when the manifest is of another workspace, or
/// when its parent is not the current head.
pub fn check_quiescence(
    statement: &Statement,
    expected: QuiescenceExpected<'_>,
    manifest: &[u8],
    head: Digest,
) -> Result<(Digest, Manifest), LcError> {
    let Statement::Quiescence {
        provider_id,
        lease_id,
        generation,
        workspace_id,
        head: stated,
    } = statement
    else {
        return Err(LcError::EvidenceRejected {
            reason: format!("not_a_proof: a {} is not a quiescence", statement.kind()),
        });
    };
    if provider_id != expected.provider_id
        || *lease_id != expected.lease_id.0
        || *generation != expected.generation.0
        || *workspace_id != expected.workspace_id.0
    {
        return Err(LcError::EvidenceRejected {
            reason: format!(
                "evidence_mismatch: quiescence of provider {provider_id:?} lease {lease_id} generation {generation} workspace {workspace_id}, not of lease {} generation {} workspace {}",
                expected.lease_id, expected.generation, expected.workspace_id
            ),
        });
    }
    let parsed = Manifest::from_canonical(manifest).map_err(|e| LcError::InvalidInput {
        reason: format!("{}: the quiescence's manifest is refused: {e}", e.code()),
    })?;
    let computed = Digest::of(manifest);
    if computed != head || stated.as_str() != head.to_hex() {
        return Err(LcError::WorkspaceHeadMismatch {
            workspace_id: expected.workspace_id,
            expected: Some(head),
            found: Some(computed),
            reason: format!(
                "the manifest's sha256 is {computed}, the statement's head {stated}, the head given {head}; all three must be equal"
            ),
        });
    }
    if parsed.workspace_id != expected.workspace_id {
        return Err(LcError::WorkspaceHeadMismatch {
            workspace_id: expected.workspace_id,
            expected: expected.current_head,
            found: Some(head),
            reason: format!(
                "the manifest is of workspace {}, not of the exec's workspace {}",
                parsed.workspace_id, expected.workspace_id
            ),
        });
    }
    if parsed.parent != expected.current_head {
        return Err(LcError::WorkspaceHeadMismatch {
            workspace_id: expected.workspace_id,
            expected: expected.current_head,
            found: parsed.parent,
            reason: "the manifest's parent is not the workspace's current head: snapshot again from the current head".into(),
        });
    }
    Ok((head, parsed))
}

/// What an attachment must name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachmentExpected<'a> {
    /// The Lease's provider.
    pub provider_id: &'a str,
    /// The Lease.
    pub lease_id: SandboxLeaseId,
    /// Its generation.
    pub generation: Generation,
    /// The exec's workspace.
    pub workspace_id: WorkspaceId,
    /// The head the Lease restores.
    pub restore_head: Digest,
}

/// Checks a verified attachment statement against the Lease it is recorded
/// on.
///
/// # Errors
/// [`LcError::EvidenceRejected`] for another statement kind or subject, or
/// a read-only attachment; [`LcError::WorkspaceHeadMismatch`] for another
/// head.
pub fn check_attachment(
    statement: &Statement,
    expected: AttachmentExpected<'_>,
) -> Result<(), LcError> {
    let Statement::Attachment {
        provider_id,
        lease_id,
        generation,
        workspace_id,
        head,
        writable,
    } = statement
    else {
        return Err(LcError::EvidenceRejected {
            reason: format!("not_a_proof: a {} is not an attachment", statement.kind()),
        });
    };
    if provider_id != expected.provider_id
        || *lease_id != expected.lease_id.0
        || *generation != expected.generation.0
        || *workspace_id != expected.workspace_id.0
        || !*writable
    {
        return Err(LcError::EvidenceRejected {
            reason: format!(
                "evidence_mismatch: attachment of provider {provider_id:?} lease {lease_id} generation {generation} workspace {workspace_id} (writable {writable}), not a writable attachment of lease {} generation {} workspace {}",
                expected.lease_id, expected.generation, expected.workspace_id
            ),
        });
    }
    if head.as_str() != expected.restore_head.to_hex() {
        return Err(LcError::WorkspaceHeadMismatch {
            workspace_id: expected.workspace_id,
            expected: Some(expected.restore_head),
            found: Digest::from_hex(head).ok(),
            reason: "the attachment names another head than the Lease restores".into(),
        });
    }
    Ok(())
}

/// What [`check_resume`] decides from, read under the locks of the
/// commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeView {
    /// The exec.
    pub exec_id: ExecId,
    /// Its state.
    pub exec_state: ExecState,
    /// The attempt's state.
    pub attempt_state: AttemptState,
    /// The exec's workspace.
    pub workspace_id: WorkspaceId,
    /// The workspace's head.
    pub workspace_head: Option<Digest>,
    /// The recorded intent.
    pub intent: ResumeIntent,
    /// The prepared Lease's generation (the attempt's current one).
    pub lease_generation: Generation,
    /// Its state.
    pub lease_state: LeaseState,
    /// Its expiry on the cut.
    pub lease_expiry: Timestamp,
    /// The head it restores.
    pub restore_head: Option<Digest>,
    /// The head and generation its recorded attachment names.
    pub attachment: Option<(Generation, Digest)>,
    /// Unreleased Leases of the exec other than the prepared one.
    pub other_live_leases: i64,
}

/// Checks a resume commit.
///
/// # Errors
/// [`LcError::TimeUncertain`]; [`LcError::ExecNotParked`];
/// [`LcError::RequestDigestMismatch`] when the intent's digest is not
/// [`resume_request_sha256`] of its exec and head, or of its exec and no
/// head ([`check_request_digest`]);
/// [`LcError::WorkspaceHeadMismatch`] when the intent, the workspace, the
/// Lease's restore head and the attachment do not all name one head;
/// [`LcError::CompetingRight`] when another Lease of the exec is
/// unreleased, the Lease is not the next generation, not live, or has no
/// attachment of exactly its generation.
pub fn check_resume(v: &ResumeView, at: CutReading) -> Result<(), LcError> {
    crate::rules::require_certain(at)?;
    if v.exec_state != ExecState::Hibernated || v.attempt_state != AttemptState::Parked {
        return Err(LcError::ExecNotParked {
            exec_id: v.exec_id,
            state: v.attempt_state.as_str(),
        });
    }
    check_request_digest(v.exec_id, v.intent.head, v.intent.request_sha256)?;
    let head = v.intent.head;
    if v.workspace_head != Some(head) || v.restore_head != Some(head) {
        return Err(LcError::WorkspaceHeadMismatch {
            workspace_id: v.workspace_id,
            expected: Some(head),
            found: v.workspace_head,
            reason: format!(
                "the resume names head {head}; the workspace's head is {:?} and the Lease restores {:?}",
                v.workspace_head.map(|d| d.to_hex()),
                v.restore_head.map(|d| d.to_hex())
            ),
        });
    }
    if v.other_live_leases > 0 {
        return Err(LcError::CompetingRight {
            exec_id: v.exec_id,
            reason: format!(
                "{} other unreleased Lease(s) of the exec",
                v.other_live_leases
            ),
        });
    }
    let live = matches!(v.lease_state, LeaseState::Allocating | LeaseState::Active)
        && !is_expired(v.lease_expiry, at);
    if v.lease_generation.0 != v.intent.from_generation.0 + 1 || !live {
        return Err(LcError::CompetingRight {
            exec_id: v.exec_id,
            reason: format!(
                "the prepared Lease is generation {} ({}), not a live generation {}",
                v.lease_generation,
                v.lease_state,
                v.intent.from_generation.0 + 1
            ),
        });
    }
    match v.attachment {
        Some((g, h)) if g == v.lease_generation && h == head => Ok(()),
        Some((g, h)) if g == v.lease_generation => Err(LcError::WorkspaceHeadMismatch {
            workspace_id: v.workspace_id,
            expected: Some(head),
            found: Some(h),
            reason: "the attachment names another head".into(),
        }),
        other => Err(LcError::CompetingRight {
            exec_id: v.exec_id,
            reason: format!(
                "no attachment of generation {} is recorded (found {:?}): allocate with restore first",
                v.lease_generation,
                other.map(|(g, _)| g.0)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::Statement;

    fn ts(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    #[test]
    fn idle_boundary_is_exact_and_never_on_an_uncertain_cut() {
        let last = ts(1_000_000_000_000_000_123);
        let ttl = SignedDuration::from_millis(1500);
        let due = ts(1_000_000_001_500_000_123);
        assert!(!idle_due(
            last,
            ttl,
            CutReading::certain(ts(1_000_000_001_500_000_122))
        ));
        assert!(idle_due(last, ttl, CutReading::certain(due)));
        assert!(!idle_due(last, ttl, CutReading::uncertain(due, 1)));
        assert!(!idle_due(Timestamp::MAX, ttl, CutReading::certain(due)));
    }

    #[test]
    fn deadline_hibernates_once() {
        let d = ts(2_000);
        assert!(deadline_due(d, ts(1_000), CutReading::certain(d)));
        assert!(!deadline_due(d, ts(1_000), CutReading::certain(ts(1_999))));
        assert!(!deadline_due(d, ts(1_000), CutReading::uncertain(d, 1)));
        assert!(!deadline_due(d, d, CutReading::certain(ts(3_000))));
    }

    fn refusal(reason: &str, path: &str, message: &str) -> QuiescenceRefusal {
        QuiescenceRefusal {
            reason: reason.into(),
            path: path.into(),
            message: message.into(),
        }
    }

    #[test]
    fn a_refusal_plan_needs_a_sealed_hibernation_an_active_lease_and_the_stopped_page() {
        use crate::model::TerminalReason;
        use HibernationStep::{Parked, Quiesced, Refused, Sealed};
        const STATES: [LeaseState; 4] = [
            LeaseState::Allocating,
            LeaseState::Active,
            LeaseState::ReleasePending,
            LeaseState::Released,
        ];
        // A recorded refusal is a replay whatever the rest reads.
        for lease in STATES {
            for stopped in [false, true] {
                for cancel in [false, true] {
                    assert_eq!(
                        plan_quiescence_refusal(Refused, lease, stopped, cancel),
                        Ok(None),
                        "{lease} {stopped} {cancel}"
                    );
                }
            }
        }
        // Sealed, active, stopped page acknowledged: the exec ends, as
        // cancelled when the tenant asked for it.
        assert_eq!(
            plan_quiescence_refusal(Sealed, LeaseState::Active, true, false),
            Ok(Some(TerminalReason::SnapshotRefused))
        );
        assert_eq!(
            plan_quiescence_refusal(Sealed, LeaseState::Active, true, true),
            Ok(Some(TerminalReason::Cancelled))
        );
        // Sealed and active, the stopped page not acknowledged.
        for cancel in [false, true] {
            assert_eq!(
                plan_quiescence_refusal(Sealed, LeaseState::Active, false, cancel),
                Err(LcError::IllegalTransition {
                    what: "hibernation (a refused snapshot needs the stopped page acknowledged)",
                    from: "sealed",
                    to: "refused",
                })
            );
        }
        // Sealed, its Lease not active (stopped page or not).
        for lease in [
            LeaseState::Allocating,
            LeaseState::ReleasePending,
            LeaseState::Released,
        ] {
            for stopped in [false, true] {
                for cancel in [false, true] {
                    assert_eq!(
                        plan_quiescence_refusal(Sealed, lease, stopped, cancel),
                        Err(LcError::IllegalTransition {
                            what: "hibernation (a refused snapshot needs an active Lease)",
                            from: "sealed",
                            to: "refused",
                        }),
                        "{lease} {stopped} {cancel}"
                    );
                }
            }
        }
        // A committed quiescence is never refused afterwards.
        for (step, from) in [(Quiesced, "quiesced"), (Parked, "parked")] {
            for lease in STATES {
                for stopped in [false, true] {
                    for cancel in [false, true] {
                        let e = plan_quiescence_refusal(step, lease, stopped, cancel).unwrap_err();
                        assert_eq!(
                            e,
                            LcError::IllegalTransition {
                                what: "hibernation (its quiescence is committed)",
                                from,
                                to: "refused",
                            }
                        );
                        assert_eq!(e.code(), "illegal_transition");
                    }
                }
            }
        }
    }

    #[test]
    fn a_refusal_reason_is_a_stable_code() {
        let long = "a".repeat(64);
        for ok in ["a", "special_file", "a1", "a_", "z9_0", long.as_str()] {
            assert_eq!(
                check_quiescence_refusal(&refusal(ok, "pipe", "a fifo")),
                Ok(refusal(ok, "pipe", "a fifo")),
                "{ok:?}"
            );
        }
        let over = "a".repeat(65);
        for bad in [
            "",
            over.as_str(),
            "1abc",
            "_abc",
            "ab-c",
            "Abc",
            "aBc",
            "ab c",
            "a\u{e9}",
        ] {
            assert_eq!(
                check_quiescence_refusal(&refusal(bad, "", "")),
                Err(LcError::InvalidInput {
                    reason: format!(
                        "a snapshot refusal's reason is a stable code ([a-z][a-z0-9_]{{0,63}}), not {bad:?}"
                    ),
                }),
                "{bad:?}"
            );
        }
        // The refused code is quoted cut to 80 bytes.
        let e = check_quiescence_refusal(&refusal(&"X".repeat(200), "", "")).unwrap_err();
        assert_eq!(e.code(), "invalid_input");
        assert_eq!(
            e,
            LcError::InvalidInput {
                reason: format!(
                    "a snapshot refusal's reason is a stable code ([a-z][a-z0-9_]{{0,63}}), not {:?}",
                    "X".repeat(80)
                ),
            }
        );
    }

    #[test]
    fn a_refusal_s_path_and_message_are_cut_to_their_bounds() {
        assert_eq!(
            (REFUSAL_PATH_BYTES_MAX, REFUSAL_MESSAGE_BYTES_MAX),
            (1024, 2048)
        );
        // At the bounds: kept whole.
        let path = "p".repeat(1024);
        let message = "m".repeat(2048);
        assert_eq!(
            check_quiescence_refusal(&refusal("special_file", &path, &message)),
            Ok(refusal("special_file", &path, &message))
        );
        // Over them: cut to exactly the bound.
        let got = check_quiescence_refusal(&refusal(
            "special_file",
            &"a".repeat(2000),
            &"b".repeat(5000),
        ))
        .unwrap();
        assert_eq!(
            got,
            refusal("special_file", &"a".repeat(1024), &"b".repeat(2048))
        );
        // A two-byte character across a bound is left out whole: byte 1024
        // of "x" + "é"... and byte 2048 of "y" + "é"... are inside one.
        let path = format!("x{}", "\u{e9}".repeat(1000));
        let message = format!("y{}", "\u{e9}".repeat(2500));
        let got = check_quiescence_refusal(&refusal("special_file", &path, &message)).unwrap();
        assert_eq!((got.path.len(), got.message.len()), (1023, 2047));
        assert_eq!(
            got,
            refusal(
                "special_file",
                &format!("x{}", "\u{e9}".repeat(511)),
                &format!("y{}", "\u{e9}".repeat(1023))
            )
        );
        // Where the bound falls on a boundary, nothing more is cut.
        let path = "\u{e9}".repeat(1000);
        let got = check_quiescence_refusal(&refusal("r", &path, "")).unwrap();
        assert_eq!(got.path, "\u{e9}".repeat(512));
    }

    #[test]
    fn clip_text_cuts_at_a_character_boundary() {
        assert_eq!(clip_text("abc", 10), "abc");
        assert_eq!(clip_text("abc", 3), "abc");
        assert_eq!(clip_text("abc", 2), "ab");
        assert_eq!(clip_text("abc", 0), "");
        assert_eq!(clip_text("", 5), "");
        // Two, three and four bytes a character.
        let s = "a\u{e9}\u{20ac}\u{1f600}b"; // 1 + 2 + 3 + 4 + 1 bytes
        assert_eq!(s.len(), 11);
        for (max, want) in [
            (0, ""),
            (1, "a"),
            (2, "a"),
            (3, "a\u{e9}"),
            (4, "a\u{e9}"),
            (5, "a\u{e9}"),
            (6, "a\u{e9}\u{20ac}"),
            (7, "a\u{e9}\u{20ac}"),
            (8, "a\u{e9}\u{20ac}"),
            (9, "a\u{e9}\u{20ac}"),
            (10, "a\u{e9}\u{20ac}\u{1f600}"),
            (11, s),
            (12, s),
        ] {
            assert_eq!(clip_text(s, max), want, "{max}");
        }
    }

    #[test]
    fn the_request_digest_is_of_the_jcs_body() {
        let head = Digest([0xab; 32]);
        let body = format!(r#"{{"exec_id":7,"head":"{}"}}"#, "ab".repeat(32));
        assert_eq!(
            resume_request_sha256(ExecId(7), Some(head)),
            Digest::of(body.as_bytes())
        );
        assert_eq!(
            resume_request_sha256(ExecId(7), None),
            Digest::of(br#"{"exec_id":7,"head":null}"#)
        );
        assert_ne!(
            resume_request_sha256(ExecId(8), Some(head)),
            resume_request_sha256(ExecId(7), Some(head))
        );
    }

    #[test]
    fn a_recorded_request_names_its_head_or_none() {
        let head = Digest([0xab; 32]);
        let named = resume_request_sha256(ExecId(7), Some(head));
        assert_eq!(check_request_digest(ExecId(7), head, named), Ok(()));
        assert_eq!(
            check_request_digest(ExecId(7), head, resume_request_sha256(ExecId(7), None)),
            Ok(())
        );
        for found in [
            resume_request_sha256(ExecId(7), Some(Digest([1; 32]))),
            resume_request_sha256(ExecId(8), None),
            resume_request_sha256(ExecId(8), Some(head)),
            Digest([0; 32]),
        ] {
            assert_eq!(
                check_request_digest(ExecId(7), head, found),
                Err(LcError::RequestDigestMismatch {
                    expected: named,
                    found
                })
            );
        }
    }

    #[test]
    fn idle_ttl_bounds() {
        assert_eq!(
            check_idle_ttl_ms(1).unwrap(),
            SignedDuration::from_millis(1)
        );
        assert_eq!(
            check_idle_ttl_ms(IDLE_TTL_MS_MAX).unwrap(),
            SignedDuration::from_millis(IDLE_TTL_MS_MAX as i64)
        );
        for bad in [0, IDLE_TTL_MS_MAX + 1] {
            assert_eq!(
                check_idle_ttl_ms(bad).unwrap_err().code(),
                "invalid_timeout"
            );
        }
    }

    fn view() -> HibernationView {
        HibernationView {
            exec_id: ExecId(3),
            exec_state: ExecState::Running,
            attempt_state: AttemptState::Running,
            lease_state: LeaseState::Active,
            cancel_requested: false,
            existing: None,
        }
    }

    #[test]
    fn hibernation_plan_refusals() {
        let at = CutReading::certain(ts(5));
        assert_eq!(plan_hibernation(view(), at), Ok(()));
        assert_eq!(
            plan_hibernation(view(), CutReading::uncertain(ts(5), 3)),
            Err(LcError::TimeUncertain { retry_after_s: 3 })
        );
        let v = HibernationView {
            existing: Some(HibernationStep::Sealed),
            ..view()
        };
        assert_eq!(
            plan_hibernation(v, at),
            Err(LcError::HibernationInProgress {
                exec_id: ExecId(3),
                step: "sealed"
            })
        );
        for v in [
            HibernationView {
                lease_state: LeaseState::Allocating,
                ..view()
            },
            HibernationView {
                exec_state: ExecState::Admitted,
                ..view()
            },
            HibernationView {
                cancel_requested: true,
                ..view()
            },
            HibernationView {
                exec_state: ExecState::Hibernated,
                ..view()
            },
        ] {
            assert_eq!(
                plan_hibernation(v, at).unwrap_err().code(),
                "exec_not_hibernatable"
            );
        }
        let v = HibernationView {
            attempt_state: AttemptState::Parked,
            ..view()
        };
        assert_eq!(
            plan_hibernation(v, at).unwrap_err().code(),
            "exec_not_hibernatable"
        );
        // A parked exec names its next step, whatever its record says.
        let v = HibernationView {
            exec_state: ExecState::Hibernated,
            attempt_state: AttemptState::Parked,
            lease_state: LeaseState::Released,
            existing: Some(HibernationStep::Parked),
            ..view()
        };
        assert_eq!(
            plan_hibernation(v, at),
            Err(LcError::ExecNotHibernatable {
                exec_id: ExecId(3),
                reason: "exec 3 is hibernated already: resume it (lc exec resume 3)".into()
            })
        );
        let v = HibernationView {
            exec_state: ExecState::Terminal,
            ..view()
        };
        assert_eq!(plan_hibernation(v, at).unwrap_err().code(), "exec_terminal");
    }

    fn quiescence(head: &str) -> Statement {
        Statement::Quiescence {
            provider_id: "p1".into(),
            lease_id: 4,
            generation: 2,
            workspace_id: 9,
            head: head.into(),
        }
    }

    fn q_expected(current: Option<Digest>) -> QuiescenceExpected<'static> {
        QuiescenceExpected {
            provider_id: "p1",
            lease_id: SandboxLeaseId(4),
            generation: Generation(2),
            workspace_id: WorkspaceId(9),
            current_head: current,
        }
    }

    /// A real manifest of workspace 9 after `parent`: a dir, a file and a
    /// symlink.
    fn manifest(parent: Option<Digest>) -> Vec<u8> {
        use crate::snapshot::{Entry, Manifest};
        Manifest::new(
            WorkspaceId(9),
            parent,
            vec![
                Entry::dir("src", 0o755),
                Entry::file("src/a.txt", 0o640, 6, Digest::of(b"hello\n")),
                Entry::symlink("link", "src/a.txt"),
            ],
        )
        .unwrap()
        .canonical_bytes()
    }

    #[test]
    fn quiescence_checks_subject_head_and_parent() {
        let parent = Some(Digest([1; 32]));
        let bytes = manifest(parent);
        let head = Digest::of(&bytes);
        let s = quiescence(&head.to_hex());
        let (got, parsed) = check_quiescence(&s, q_expected(parent), &bytes, head).unwrap();
        assert_eq!(
            (
                got,
                parsed.parent,
                parsed.workspace_id,
                parsed.entries.len()
            ),
            (head, parent, WorkspaceId(9), 3)
        );
        // A stale parent: the manifest follows another head than the
        // workspace's.
        let e = check_quiescence(&s, q_expected(None), &bytes, head).unwrap_err();
        assert_eq!(e.code(), "workspace_head_mismatch");
        assert!(
            e.to_string().contains("the manifest's parent is not"),
            "{e}"
        );
        // The first snapshot has no parent.
        let first = manifest(None);
        let first_head = Digest::of(&first);
        assert_eq!(
            check_quiescence(
                &quiescence(&first_head.to_hex()),
                q_expected(None),
                &first,
                first_head
            )
            .map(|(h, m)| (h, m.parent)),
            Ok((first_head, None))
        );
        // Bytes that are not the head.
        let other_bytes = manifest(None);
        assert_eq!(
            check_quiescence(&s, q_expected(parent), &other_bytes, head)
                .unwrap_err()
                .code(),
            "workspace_head_mismatch"
        );
        // A statement naming another head.
        let other = quiescence(&Digest([2; 32]).to_hex());
        assert_eq!(
            check_quiescence(&other, q_expected(parent), &bytes, head)
                .unwrap_err()
                .code(),
            "workspace_head_mismatch"
        );
        // A manifest of another workspace, though the statement names this one.
        let foreign = crate::snapshot::Manifest::new(WorkspaceId(10), parent, vec![])
            .unwrap()
            .canonical_bytes();
        let foreign_head = Digest::of(&foreign);
        let e = check_quiescence(
            &quiescence(&foreign_head.to_hex()),
            q_expected(parent),
            &foreign,
            foreign_head,
        )
        .unwrap_err();
        assert_eq!(e.code(), "workspace_head_mismatch");
        assert!(e.to_string().contains("workspace 10, not"), "{e}");
        // Bytes that are not a canonical manifest.
        for (junk, code) in [
            (&b"{\"manifest\":1}"[..], "manifest_malformed"),
            (&b"not json"[..], "manifest_malformed"),
        ] {
            let h = Digest::of(junk);
            let e = check_quiescence(&quiescence(&h.to_hex()), q_expected(parent), junk, h)
                .unwrap_err();
            assert_eq!(e.code(), "invalid_input");
            assert!(e.to_string().contains(code), "{e}");
        }
        let mut spaced = bytes.clone();
        spaced.push(b' ');
        let h = Digest::of(&spaced);
        let e =
            check_quiescence(&quiescence(&h.to_hex()), q_expected(parent), &spaced, h).unwrap_err();
        assert_eq!(e.code(), "invalid_input");
        // The size bound is the snapshot's: one byte over is refused
        // before it is parsed.
        let big = vec![b' '; crate::snapshot::SNAPSHOT_MANIFEST_BYTES_MAX + 1];
        let big_head = Digest::of(&big);
        let e = check_quiescence(
            &quiescence(&big_head.to_hex()),
            q_expected(parent),
            &big,
            big_head,
        )
        .unwrap_err();
        assert_eq!(e.code(), "invalid_input");
        assert!(e.to_string().contains("manifest_too_large"), "{e}");
        // Another workspace, or another kind.
        let mut wrong = quiescence(&head.to_hex());
        if let Statement::Quiescence { workspace_id, .. } = &mut wrong {
            *workspace_id = 10;
        }
        assert_eq!(
            check_quiescence(&wrong, q_expected(parent), &bytes, head)
                .unwrap_err()
                .code(),
            "evidence_rejected"
        );
        for (lease, generation, provider) in [(5, 2, "p1"), (4, 3, "p1"), (4, 2, "p2")] {
            let s = Statement::Quiescence {
                provider_id: provider.into(),
                lease_id: lease,
                generation,
                workspace_id: 9,
                head: head.to_hex(),
            };
            assert_eq!(
                check_quiescence(&s, q_expected(parent), &bytes, head)
                    .unwrap_err()
                    .code(),
                "evidence_rejected"
            );
        }
        let absence = Statement::Absence {
            provider_id: "p1".into(),
            lease_id: 4,
            generation: 2,
        };
        assert_eq!(
            check_quiescence(&absence, q_expected(parent), &bytes, head)
                .unwrap_err()
                .code(),
            "evidence_rejected"
        );
    }

    #[test]
    fn attachment_checks_subject_head_and_writable() {
        let head = Digest([5; 32]);
        let exp = AttachmentExpected {
            provider_id: "p1",
            lease_id: SandboxLeaseId(4),
            generation: Generation(2),
            workspace_id: WorkspaceId(9),
            restore_head: head,
        };
        let ok = Statement::Attachment {
            provider_id: "p1".into(),
            lease_id: 4,
            generation: 2,
            workspace_id: 9,
            head: head.to_hex(),
            writable: true,
        };
        assert_eq!(check_attachment(&ok, exp), Ok(()));
        let ro = Statement::Attachment {
            provider_id: "p1".into(),
            lease_id: 4,
            generation: 2,
            workspace_id: 9,
            head: head.to_hex(),
            writable: false,
        };
        assert_eq!(
            check_attachment(&ro, exp).unwrap_err().code(),
            "evidence_rejected"
        );
        let g3 = Statement::Attachment {
            provider_id: "p1".into(),
            lease_id: 4,
            generation: 3,
            workspace_id: 9,
            head: head.to_hex(),
            writable: true,
        };
        assert_eq!(
            check_attachment(&g3, exp).unwrap_err().code(),
            "evidence_rejected"
        );
        for (lease, ws, provider) in [(5, 9, "p1"), (4, 10, "p1"), (4, 9, "p2")] {
            let s = Statement::Attachment {
                provider_id: provider.into(),
                lease_id: lease,
                generation: 2,
                workspace_id: ws,
                head: head.to_hex(),
                writable: true,
            };
            assert_eq!(
                check_attachment(&s, exp).unwrap_err().code(),
                "evidence_rejected"
            );
        }
        let absence = Statement::Absence {
            provider_id: "p1".into(),
            lease_id: 4,
            generation: 2,
        };
        assert_eq!(
            check_attachment(&absence, exp).unwrap_err().code(),
            "evidence_rejected"
        );
        let other_head = Statement::Attachment {
            provider_id: "p1".into(),
            lease_id: 4,
            generation: 2,
            workspace_id: 9,
            head: Digest([6; 32]).to_hex(),
            writable: true,
        };
        assert_eq!(
            check_attachment(&other_head, exp).unwrap_err().code(),
            "workspace_head_mismatch"
        );
    }

    fn resume_view() -> ResumeView {
        let head = Digest([7; 32]);
        ResumeView {
            exec_id: ExecId(3),
            exec_state: ExecState::Hibernated,
            attempt_state: AttemptState::Parked,
            workspace_id: WorkspaceId(9),
            workspace_head: Some(head),
            intent: ResumeIntent {
                exec_id: ExecId(3),
                op_key: "r1".into(),
                request_sha256: resume_request_sha256(ExecId(3), Some(head)),
                head,
                attempt: AttemptNo(1),
                from_generation: Generation(1),
                recorded_cut: ts(1),
                refused: None,
            },
            lease_generation: Generation(2),
            lease_state: LeaseState::Allocating,
            lease_expiry: ts(100),
            restore_head: Some(head),
            attachment: Some((Generation(2), head)),
            other_live_leases: 0,
        }
    }

    #[test]
    fn resume_checks_each_refusal() {
        let at = CutReading::certain(ts(50));
        assert_eq!(check_resume(&resume_view(), at), Ok(()));
        let code = |v: ResumeView, at| check_resume(&v, at).unwrap_err().code();
        assert_eq!(
            code(resume_view(), CutReading::uncertain(ts(50), 1)),
            "time_uncertain"
        );
        let mut v = resume_view();
        v.attempt_state = AttemptState::Runnable;
        assert_eq!(code(v, at), "exec_not_parked");
        let mut v = resume_view();
        v.intent.request_sha256 = Digest([0; 32]);
        assert_eq!(code(v, at), "request_digest_mismatch");
        // A request that named no head resumes the one recorded.
        let mut v = resume_view();
        v.intent.request_sha256 = resume_request_sha256(v.exec_id, None);
        assert_eq!(check_resume(&v, CutReading::certain(ts(99))), Ok(()));
        let mut v = resume_view();
        v.workspace_head = Some(Digest([8; 32]));
        assert_eq!(code(v, at), "workspace_head_mismatch");
        let mut v = resume_view();
        v.other_live_leases = 1;
        assert_eq!(code(v, at), "competing_right");
        // Expired exactly at its expiry on a certain cut.
        assert_eq!(
            code(resume_view(), CutReading::certain(ts(100))),
            "competing_right"
        );
        assert_eq!(
            check_resume(&resume_view(), CutReading::certain(ts(99))),
            Ok(())
        );
        let mut v = resume_view();
        v.attachment = None;
        assert_eq!(code(v, at), "competing_right");
        let mut v = resume_view();
        v.attachment = Some((Generation(1), Digest([7; 32])));
        assert_eq!(code(v, at), "competing_right");
        let mut v = resume_view();
        v.attachment = Some((Generation(2), Digest([9; 32])));
        assert_eq!(code(v, at), "workspace_head_mismatch");
        let mut v = resume_view();
        v.lease_state = LeaseState::ReleasePending;
        assert_eq!(code(v, at), "competing_right");
        let mut v = resume_view();
        v.lease_state = LeaseState::Active;
        assert_eq!(check_resume(&v, at), Ok(()));
        let mut v = resume_view();
        v.exec_state = ExecState::Running;
        assert_eq!(code(v, at), "exec_not_parked");
        let mut v = resume_view();
        v.restore_head = Some(Digest([8; 32]));
        assert_eq!(code(v, at), "workspace_head_mismatch");
        let mut v = resume_view();
        v.lease_generation = Generation(3);
        v.attachment = Some((Generation(3), Digest([7; 32])));
        assert_eq!(code(v, at), "competing_right");
    }
}
