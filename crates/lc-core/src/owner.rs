//! Exec ownership: which gateway activation may act for an exec, until when,
//! and what a historical transition replay may return.
//!
//! # Rules
//!
//! * **Owner.** One gateway activation owns an exec at a time. It holds a
//!   random [`OwnerToken`] (256 bits; the store keeps only its SHA-256), and
//!   the database gives each ownership an [`OwnerGeneration`] (one more than
//!   the previous owner's) and an [`OwnerFence`] (from one sequence, so it
//!   strictly increases across every ownership of the store). The
//!   ownership's heartbeat expiry is on the cut.
//! * **Heartbeat** ([`heartbeat_expiry`]): the owner renews to
//!   `max(current, cut + ttl)` on any cut: a heartbeat never shortens, and
//!   an uncertain cut still keeps the owner serving.
//! * **Takeover** ([`plan_takeover`]): only on a certain cut, and only of an
//!   exec with no owner, a released owner, or an owner whose heartbeat
//!   expiry the certain cut has reached. While the cut is uncertain no
//!   ownership expires and nothing is taken over.
//! * **Fenced writes** ([`check_owner`]): a write for an exec is accepted
//!   only from the current owner (token digest, generation and fence all
//!   equal) that is neither released nor expired on a certain cut.
//! * **Replay** ([`plan_transition`]): a transition id already committed
//!   returns its stored receipt only while that receipt's owner is the
//!   current, unexpired owner and the caller is that owner; for an expired or
//!   replaced owner it is refused and changes nothing.
//! * **Release of a terminal resource** ([`check_release`]): needs the
//!   terminal page acknowledged (sink-bound and its ACK result committed),
//!   or a proven-not-sent receipt; a terminal process state alone is not
//!   enough.
//!
//! No function here reads a clock or does I/O.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::model::{AttemptNo, CutReading, Digest, ExecId, PageExit, PageKind};
use crate::rules::{is_expired, renewed_expiry};

/// Bytes of an owner token: 32 random bytes (256 bits).
pub const OWNER_TOKEN_BYTES: usize = 32;

/// The heartbeat TTL a gateway uses when given none: 5 s. Short, so a dead
/// gateway's execs are taken over within seconds of a certain cut passing
/// its expiry; long enough for a few missed heartbeats at one per second.
pub const HEARTBEAT_TTL_DEFAULT: SignedDuration = SignedDuration::from_secs(5);

/// The shortest heartbeat TTL accepted: 1 s (the cut advances in steps of
/// the sampler's interval; a shorter TTL would expire between samples).
pub const HEARTBEAT_TTL_MIN: SignedDuration = SignedDuration::from_secs(1);

/// The longest heartbeat TTL accepted: 10 minutes. It must also fit the
/// sealed horizon, which the store checks.
pub const HEARTBEAT_TTL_MAX: SignedDuration = SignedDuration::from_secs(600);

/// The longest transition id, in bytes.
pub const TRANSITION_ID_BYTES_MAX: usize = 128;

/// A gateway activation's secret: [`OWNER_TOKEN_BYTES`] random bytes. Shown
/// only as "owner token" (never its bytes) by `Debug`; the store keeps only
/// [`OwnerToken::sha256`].
#[derive(Clone, PartialEq, Eq)]
pub struct OwnerToken([u8; OWNER_TOKEN_BYTES]);

impl OwnerToken {
    /// Wraps `bytes`, which the caller drew from a cryptographic random
    /// source.
    pub fn from_bytes(bytes: [u8; OWNER_TOKEN_BYTES]) -> OwnerToken {
        OwnerToken(bytes)
    }

    /// The token's bytes.
    pub fn as_bytes(&self) -> &[u8; OWNER_TOKEN_BYTES] {
        &self.0
    }

    /// SHA-256 of the token's bytes: what the store keeps and compares.
    pub fn sha256(&self) -> Digest {
        Digest::of(&self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(..)")
    }
}

/// The generation of an exec's ownership: 1 for the first owner, one more
/// for each takeover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OwnerGeneration(pub i64);

/// The fence of an ownership, from one database sequence: strictly
/// increasing across every ownership of the store, so a supervisor or
/// provider that has seen fence `F` refuses every fence below `F`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OwnerFence(pub i64);

impl fmt::Display for OwnerGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for OwnerFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a gateway presents with every write: its token and the generation
/// and fence its ownership of the exec was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerCredential {
    /// The activation's token.
    pub token: OwnerToken,
    /// The ownership's generation.
    pub generation: OwnerGeneration,
    /// The ownership's fence.
    pub fence: OwnerFence,
}

/// An exec's ownership as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    /// The exec.
    pub exec_id: ExecId,
    /// SHA-256 of the owner's token.
    pub token_sha256: Digest,
    /// Its generation.
    pub generation: OwnerGeneration,
    /// Its fence.
    pub fence: OwnerFence,
    /// Its heartbeat expiry on the cut.
    pub heartbeat_expiry: Timestamp,
    /// Whether the owner gave the exec up (a released owner can be taken
    /// over at once, on a certain cut).
    pub released: bool,
}

impl Ownership {
    /// Whether `cred` names exactly this ownership (token digest,
    /// generation and fence).
    pub fn is_held_by(&self, cred: &OwnerCredential) -> bool {
        self.token_sha256 == cred.token.sha256()
            && self.generation == cred.generation
            && self.fence == cred.fence
    }
}

/// On what ground a takeover is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TakeoverBasis {
    /// No gateway ever owned the exec.
    Unowned,
    /// The previous owner released it.
    Released,
    /// A certain cut reached the previous owner's heartbeat expiry.
    Expired,
}

impl TakeoverBasis {
    /// The basis's wire name: `unowned`, `released` or `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            TakeoverBasis::Unowned => "unowned",
            TakeoverBasis::Released => "released",
            TakeoverBasis::Expired => "expired",
        }
    }
}

/// Checks a heartbeat TTL against its bounds.
///
/// # Errors
/// [`LcError::InvalidTimeout`] outside
/// [`HEARTBEAT_TTL_MIN`]`..=`[`HEARTBEAT_TTL_MAX`].
pub fn check_heartbeat_ttl(ttl: SignedDuration) -> Result<SignedDuration, LcError> {
    if (HEARTBEAT_TTL_MIN..=HEARTBEAT_TTL_MAX).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(LcError::InvalidTimeout {
            reason: format!(
                "heartbeat TTL {ttl:#} must be in {HEARTBEAT_TTL_MIN:#}..={HEARTBEAT_TTL_MAX:#}"
            ),
        })
    }
}

/// Whether a new owner may take the exec whose ownership is `current` at
/// `at`, and on what basis. The store then writes generation
/// `current.generation + 1` (1 when unowned), a new fence, and the
/// heartbeat expiry `at.cut + ttl`.
///
/// # Errors
/// [`LcError::TimeUncertain`] when `at` is uncertain (nothing is taken
/// over, whatever the owner's state); [`LcError::OwnerLive`] when the
/// owner is neither released nor expired at `at`.
pub fn plan_takeover(
    current: Option<&Ownership>,
    at: CutReading,
) -> Result<TakeoverBasis, LcError> {
    if !at.certain {
        return Err(LcError::TimeUncertain {
            retry_after_s: at.retry_after_s.max(1),
        });
    }
    match current {
        None => Ok(TakeoverBasis::Unowned),
        Some(o) if o.released => Ok(TakeoverBasis::Released),
        Some(o) if is_expired(o.heartbeat_expiry, at) => Ok(TakeoverBasis::Expired),
        Some(o) => Err(LcError::OwnerLive {
            exec_id: o.exec_id,
            generation: o.generation,
            heartbeat_expiry: o.heartbeat_expiry,
        }),
    }
}

/// Checks that `cred` may write for the exec whose ownership is `current`
/// at `at`.
///
/// # Errors
/// [`LcError::OwnerStale`] when `cred` is not the current ownership (a
/// takeover replaced it) or the owner released the exec;
/// [`LcError::OwnerExpired`] when a certain `at` reached the heartbeat
/// expiry (an uncertain cut never expires an owner).
pub fn check_owner(
    current: &Ownership,
    cred: &OwnerCredential,
    at: CutReading,
) -> Result<(), LcError> {
    if !current.is_held_by(cred) || current.released {
        return Err(LcError::OwnerStale {
            exec_id: current.exec_id,
            presented: cred.generation,
            current: current.generation,
        });
    }
    if is_expired(current.heartbeat_expiry, at) {
        return Err(LcError::OwnerExpired {
            exec_id: current.exec_id,
            generation: current.generation,
            heartbeat_expiry: current.heartbeat_expiry,
        });
    }
    Ok(())
}

/// The heartbeat expiry after `cred` renews `current` at `at` with `ttl`:
/// `max(current expiry, cut + ttl)` on any cut.
///
/// # Errors
/// Those of [`check_owner`]; [`LcError::InvalidTimeout`] for a TTL outside
/// its bounds.
pub fn heartbeat_expiry(
    current: &Ownership,
    cred: &OwnerCredential,
    at: CutReading,
    ttl: SignedDuration,
) -> Result<Timestamp, LcError> {
    check_owner(current, cred, at)?;
    renewed_expiry(current.heartbeat_expiry, at, check_heartbeat_ttl(ttl)?)
}

/// An authority-bearing step of an exec's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    /// Input delivered to the supervisor.
    Send,
    /// Output pages through a seq committed as sink-bound and acknowledged.
    Ack,
    /// The command asked to stop.
    Cancel,
    /// The Lease of a terminal exec given up for destruction.
    Release,
}

impl TransitionKind {
    /// The kind's wire name: `send`, `ack`, `cancel` or `release`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransitionKind::Send => "send",
            TransitionKind::Ack => "ack",
            TransitionKind::Cancel => "cancel",
            TransitionKind::Release => "release",
        }
    }

    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<TransitionKind> {
        match s {
            "send" => Some(TransitionKind::Send),
            "ack" => Some(TransitionKind::Ack),
            "cancel" => Some(TransitionKind::Cancel),
            "release" => Some(TransitionKind::Release),
            _ => None,
        }
    }
}

/// Checks a transition id: 1 to [`TRANSITION_ID_BYTES_MAX`] printable
/// ASCII bytes (`!`..=`~`).
///
/// # Errors
/// [`LcError::InvalidTransitionId`] naming what is wrong.
pub fn check_transition_id(id: &str) -> Result<&str, LcError> {
    if id.is_empty() || id.len() > TRANSITION_ID_BYTES_MAX {
        return Err(LcError::InvalidTransitionId {
            reason: format!(
                "must be 1..={TRANSITION_ID_BYTES_MAX} bytes, got {}",
                id.len()
            ),
        });
    }
    if !id.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
        return Err(LcError::InvalidTransitionId {
            reason: "must be printable ASCII without spaces".into(),
        });
    }
    Ok(id)
}

/// SHA-256 of a transition request: its kind, its exec and its arguments
/// in their canonical text (`args`, e.g. `attempt=1 through_seq=12`), one
/// per line. Equal requests have equal digests; a transition id committed
/// with one request refuses every other.
pub fn transition_request_sha256(kind: TransitionKind, exec_id: ExecId, args: &str) -> Digest {
    Digest::of(format!("{}\n{}\n{args}", kind.as_str(), exec_id.0).as_bytes())
}

/// The immutable record of one committed transition, bound to the
/// ownership that committed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionReceipt {
    /// The exec.
    pub exec_id: ExecId,
    /// The transition id (client-supplied or gateway-generated).
    pub transition_id: String,
    /// What it did.
    pub kind: TransitionKind,
    /// SHA-256 of the owner token that committed it.
    pub token_sha256: Digest,
    /// That ownership's generation.
    pub owner_generation: OwnerGeneration,
    /// That ownership's fence.
    pub owner_fence: OwnerFence,
    /// SHA-256 of the transition's request (kind and arguments), so the
    /// same id with other arguments is refused.
    pub request_sha256: Digest,
    /// The cut it committed at.
    pub committed_cut: Timestamp,
    /// What it did, kind by kind (`{"through_seq": 12}` for an ACK, ...).
    pub detail: serde_json::Value,
}

/// What the store does with a transition request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransitionPlan {
    /// Commit it: no receipt has this id yet and the caller is the current,
    /// unexpired owner.
    Commit,
    /// Return this stored receipt and change nothing.
    Replay(TransitionReceipt),
}

/// Decides a transition request `(id, kind, request_sha256)` by `cred` on
/// the exec whose ownership is `current`, given the receipt already stored
/// under `id` (if any).
///
/// A `release` receipt released the ownership that committed it, so its
/// replay asks that ownership to be current and unexpired but not
/// unreleased; every other receipt needs an owner that may still write
/// ([`check_owner`]).
///
/// # Errors
/// A stored receipt: [`LcError::TransitionReplayRefused`] unless it belongs
/// to `cred`, `cred` is the current ownership and it is unexpired at `at`;
/// then [`LcError::IdempotencyConflict`] for another kind or request. No
/// stored receipt: those of [`check_owner`]. Every refusal changes nothing.
pub fn plan_transition(
    stored: Option<&TransitionReceipt>,
    kind: TransitionKind,
    request_sha256: Digest,
    current: &Ownership,
    cred: &OwnerCredential,
    at: CutReading,
) -> Result<TransitionPlan, LcError> {
    match stored {
        None => {
            check_owner(current, cred, at)?;
            Ok(TransitionPlan::Commit)
        }
        Some(r) => {
            let bound_to_caller = r.token_sha256 == cred.token.sha256()
                && r.owner_generation == cred.generation
                && r.owner_fence == cred.fence;
            // A release receipt released its own ownership: it replays for
            // that ownership while it is still current (not taken over)
            // and unexpired, released or not.
            let current_owner_ok = if r.kind == TransitionKind::Release && current.released {
                current.is_held_by(cred) && !is_expired(current.heartbeat_expiry, at)
            } else {
                check_owner(current, cred, at).is_ok()
            };
            if !bound_to_caller || !current_owner_ok {
                return Err(LcError::TransitionReplayRefused {
                    exec_id: r.exec_id,
                    transition_id: r.transition_id.clone(),
                    receipt_generation: r.owner_generation,
                    current_generation: current.generation,
                });
            }
            if r.kind != kind || r.request_sha256 != request_sha256 {
                return Err(LcError::IdempotencyConflict {
                    key: r.transition_id.clone(),
                });
            }
            Ok(TransitionPlan::Replay(r.clone()))
        }
    }
}

/// The page metadata the gateway commits before it writes a page's bytes
/// to the sink: the page's identity and digest, and (terminal page only)
/// the exit status. Committing it records the page's ACK intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageMeta {
    /// The exec.
    pub exec_id: ExecId,
    /// The attempt.
    pub attempt: AttemptNo,
    /// `1..`, consecutive within the attempt.
    pub seq: i64,
    /// Its stream, or the terminal page.
    pub kind: PageKind,
    /// Bytes of data, `0..=`[`crate::page::PAGE_BYTES_MAX`] (0 for the
    /// terminal page).
    pub length: u32,
    /// SHA-256 of the bytes: the key of the bytes in the sink.
    pub sha256: Digest,
    /// The exit status (terminal page only).
    pub exit: Option<PageExit>,
}

impl PageMeta {
    /// The metadata of `page`, a page of `exec_id`'s attempt `attempt`.
    pub fn of_page(exec_id: ExecId, attempt: AttemptNo, page: &crate::page::Page) -> PageMeta {
        PageMeta {
            exec_id,
            attempt,
            seq: page.seq(),
            kind: page.kind(),
            // A page holds at most PAGE_BYTES_MAX (64 KiB) bytes.
            length: u32::try_from(page.bytes().len()).unwrap_or(u32::MAX),
            sha256: Digest(page.sha256()),
            exit: page.exit(),
        }
    }

    /// Checks the metadata's own invariants: seq `>= 1`; length at most
    /// [`crate::page::PAGE_BYTES_MAX`]; a page of length 0 has the digest
    /// of no bytes; the terminal and the stopped page have length 0 and an
    /// exit status with exactly one of code and signal; a data page has no
    /// exit status.
    ///
    /// # Errors
    /// [`LcError::InvalidPage`] naming the broken invariant.
    pub fn check(&self) -> Result<&PageMeta, LcError> {
        let bad = |reason: String| {
            Err(LcError::InvalidPage {
                reason: format!("page {} of exec {}: {reason}", self.seq, self.exec_id),
            })
        };
        if self.seq < 1 {
            return bad("seq must be at least 1".into());
        }
        if usize::try_from(self.length).map_or(true, |l| l > crate::page::PAGE_BYTES_MAX) {
            return bad(format!(
                "length {} is more than {} bytes",
                self.length,
                crate::page::PAGE_BYTES_MAX
            ));
        }
        if self.length == 0 && self.sha256 != Digest::of(b"") {
            return bad("a page of no bytes has the SHA-256 of no bytes".into());
        }
        match (self.kind, self.exit) {
            (k, Some(e)) if k.is_last() && self.length == 0 => {
                if e.code.is_some() == e.signal.is_some() {
                    return bad("an exit status has exactly one of code and signal".into());
                }
            }
            (k, _) if k.is_last() => {
                return bad("the terminal or stopped page has no bytes and an exit status".into());
            }
            (_, Some(_)) => {
                return bad("only the terminal or stopped page has an exit status".into());
            }
            (_, None) => {}
        }
        Ok(self)
    }

    /// Whether `page` is the page this metadata describes (seq, kind,
    /// length, digest and exit status all equal): what a successor checks
    /// when it re-reads a pending page from the spool.
    pub fn matches(&self, page: &crate::page::Page) -> bool {
        self.seq == page.seq()
            && self.kind == page.kind()
            && usize::try_from(self.length).ok() == Some(page.bytes().len())
            && self.sha256.0 == page.sha256()
            && self.exit == page.exit()
    }
}

/// An acknowledged output page as the store returns it to readers: its
/// metadata, and its bytes only when the store holds them (pages written
/// before the sink existed). Every other page's bytes are in the sink
/// under `meta.sha256`; a reader fetches them there and checks the digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPage {
    /// The page's metadata.
    pub meta: PageMeta,
    /// The page's bytes (`meta.length` of them, SHA-256 `meta.sha256`)
    /// when the store holds them; `None` when they are in the sink.
    pub bytes: Option<Vec<u8>>,
}

/// A page's place in the output protocol as the store records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageState {
    /// Metadata and ACK intent committed; the bytes may not be in the sink
    /// yet, and the supervisor still holds them.
    Pending,
    /// The bytes are durable in the sink and the ACK result is committed:
    /// clients may read the page, and the supervisor may drop it.
    Acked,
}

impl PageState {
    /// The state's wire name: `pending` or `acked`.
    pub fn as_str(self) -> &'static str {
        match self {
            PageState::Pending => "pending",
            PageState::Acked => "acked",
        }
    }
}

/// On what ground a terminal exec's Lease may be released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "basis")]
pub enum ReleaseBasis {
    /// The terminal page (seq `seq`) is sink-bound and acknowledged.
    TerminalPageAcked {
        /// The terminal page's seq.
        seq: i64,
    },
    /// The provider proved that the command never reached the supervisor.
    ProvenNotSent,
}

/// Whether a terminal exec's Lease may be released, given the seq of its
/// acknowledged terminal page (if any) and whether a proven-not-sent
/// receipt was verified.
///
/// # Errors
/// [`LcError::ReleaseNotProven`] when neither holds: a terminal process
/// state alone never releases.
pub fn check_release(
    exec_id: ExecId,
    acked_terminal_seq: Option<i64>,
    proven_not_sent: bool,
) -> Result<ReleaseBasis, LcError> {
    match (acked_terminal_seq, proven_not_sent) {
        (Some(seq), _) => Ok(ReleaseBasis::TerminalPageAcked { seq }),
        (None, true) => Ok(ReleaseBasis::ProvenNotSent),
        (None, false) => Err(LcError::ReleaseNotProven { exec_id }),
    }
}

/// An exec as its owner sees it: the ownership, the canonical identity, the
/// current attempt and Lease, and where the output protocol stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedExec {
    /// The ownership (generation, fence, heartbeat expiry).
    pub ownership: Ownership,
    /// On what ground this ownership began.
    pub basis: TakeoverBasis,
    /// The exec's tenant.
    pub tenant_id: crate::model::TenantId,
    /// The canonical identity, exactly as admitted.
    pub identity: crate::model::CanonicalIdentity,
    /// The current attempt.
    pub attempt: AttemptNo,
    /// The current sandbox Lease.
    pub lease_id: crate::model::SandboxLeaseId,
    /// Its generation.
    pub lease_generation: crate::model::Generation,
    /// Its state.
    pub lease_state: crate::model::LeaseState,
    /// Its provider's URL.
    pub provider_url: String,
    /// The highest seq whose metadata is committed (pending or acked), 0
    /// if none.
    pub staged_through: i64,
    /// The highest seq acknowledged (every page up to it is acked), 0 if
    /// none.
    pub acked_through: i64,
    /// The acknowledged terminal page's seq, once it is acked.
    pub terminal_acked_seq: Option<i64>,
    /// Whether a client asked to cancel the exec.
    pub cancel_requested: bool,
    /// Where the hibernation of the current generation stands (`None`
    /// when none is sealed): `sealed` tells the owner to stop the command,
    /// move its pages through the stopped page, quiesce and commit the
    /// quiescence.
    pub hibernation_step: Option<crate::model::HibernationStep>,
    /// Whether the current attempt is `parked` (hibernated, its resume not
    /// committed).
    pub attempt_parked: bool,
    /// The operation key of the resume request the owner acts on: recorded
    /// for the current parked generation (or prepared as the current
    /// Lease), with no receipt and not refused; the oldest first.
    pub resume_op_key: Option<String>,
    /// Whether the provider's attachment is recorded on the current Lease
    /// (a resume's Lease: `record_attachment` done).
    pub lease_attached: bool,
    /// The acknowledged stopped page of the current generation, once it
    /// is acked: like a terminal page it ends the generation's pages, but
    /// nothing is released as terminal.
    pub stopped_acked_seq: Option<i64>,
}

/// What a `stage_pages` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StageReport {
    /// Pages whose metadata was newly committed.
    pub staged: usize,
    /// Pages already committed with the same metadata (no-ops).
    pub duplicates: usize,
    /// The highest committed seq afterwards.
    pub staged_through: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn token(b: u8) -> OwnerToken {
        OwnerToken::from_bytes([b; OWNER_TOKEN_BYTES])
    }

    fn cred(b: u8, generation: i64, fence: i64) -> OwnerCredential {
        OwnerCredential {
            token: token(b),
            generation: OwnerGeneration(generation),
            fence: OwnerFence(fence),
        }
    }

    fn owned(b: u8, generation: i64, fence: i64, expiry_s: i64) -> Ownership {
        Ownership {
            exec_id: ExecId(7),
            token_sha256: token(b).sha256(),
            generation: OwnerGeneration(generation),
            fence: OwnerFence(fence),
            heartbeat_expiry: ts(expiry_s),
            released: false,
        }
    }

    fn receipt(b: u8, generation: i64, fence: i64, kind: TransitionKind) -> TransitionReceipt {
        TransitionReceipt {
            exec_id: ExecId(7),
            transition_id: "t-1".into(),
            kind,
            token_sha256: token(b).sha256(),
            owner_generation: OwnerGeneration(generation),
            owner_fence: OwnerFence(fence),
            request_sha256: Digest::of(b"req"),
            committed_cut: ts(100),
            detail: serde_json::json!({"through_seq": 3}),
        }
    }

    #[test]
    fn token_debug_hides_the_secret_and_digest_is_sha256() {
        assert_eq!(format!("{:?}", token(0xab)), "OwnerToken(..)");
        assert_eq!(token(1).sha256(), Digest::of(&[1u8; 32]));
        assert_ne!(token(1).sha256(), token(2).sha256());
    }

    #[test]
    fn takeover_needs_a_certain_cut_and_a_released_or_expired_owner() {
        let c = CutReading::certain(ts(100));
        assert_eq!(plan_takeover(None, c), Ok(TakeoverBasis::Unowned));
        let mut o = owned(1, 3, 40, 101);
        assert_eq!(
            plan_takeover(Some(&o), c),
            Err(LcError::OwnerLive {
                exec_id: ExecId(7),
                generation: OwnerGeneration(3),
                heartbeat_expiry: ts(101)
            })
        );
        // At the expiry itself the owner has expired (the same boundary as
        // every deadline on the cut).
        o.heartbeat_expiry = ts(100);
        assert_eq!(plan_takeover(Some(&o), c), Ok(TakeoverBasis::Expired));
        o.heartbeat_expiry = ts(101);
        o.released = true;
        assert_eq!(plan_takeover(Some(&o), c), Ok(TakeoverBasis::Released));
        // While uncertain: nothing, not even a released or unowned exec.
        let u = CutReading::uncertain(ts(10_000), 0);
        assert_eq!(
            plan_takeover(Some(&o), u),
            Err(LcError::TimeUncertain { retry_after_s: 1 })
        );
        assert_eq!(
            plan_takeover(None, CutReading::uncertain(ts(1), 4)),
            Err(LcError::TimeUncertain { retry_after_s: 4 })
        );
        o.released = false;
        o.heartbeat_expiry = ts(50);
        assert_eq!(
            plan_takeover(Some(&o), u),
            Err(LcError::TimeUncertain { retry_after_s: 1 })
        );
    }

    #[test]
    fn only_the_exact_current_unexpired_owner_may_write() {
        let o = owned(1, 3, 40, 100);
        let c = CutReading::certain(ts(99));
        assert_eq!(check_owner(&o, &cred(1, 3, 40), c), Ok(()));
        let stale = |p: i64| {
            Err(LcError::OwnerStale {
                exec_id: ExecId(7),
                presented: OwnerGeneration(p),
                current: OwnerGeneration(3),
            })
        };
        assert_eq!(check_owner(&o, &cred(2, 3, 40), c), stale(3));
        assert_eq!(check_owner(&o, &cred(1, 2, 40), c), stale(2));
        assert_eq!(check_owner(&o, &cred(1, 3, 39), c), stale(3));
        let mut released = o.clone();
        released.released = true;
        assert_eq!(check_owner(&released, &cred(1, 3, 40), c), stale(3));
        let expired = Err(LcError::OwnerExpired {
            exec_id: ExecId(7),
            generation: OwnerGeneration(3),
            heartbeat_expiry: ts(100),
        });
        assert_eq!(
            check_owner(&o, &cred(1, 3, 40), CutReading::certain(ts(100))),
            expired
        );
        // An uncertain cut never expires the owner.
        assert_eq!(
            check_owner(&o, &cred(1, 3, 40), CutReading::uncertain(ts(500), 1)),
            Ok(())
        );
    }

    #[test]
    fn heartbeat_never_shortens_and_works_while_uncertain() {
        let o = owned(1, 1, 5, 120);
        let ttl = SignedDuration::from_secs(5);
        assert_eq!(
            heartbeat_expiry(&o, &cred(1, 1, 5), CutReading::certain(ts(100)), ttl),
            Ok(ts(120))
        );
        assert_eq!(
            heartbeat_expiry(&o, &cred(1, 1, 5), CutReading::certain(ts(118)), ttl),
            Ok(ts(123))
        );
        assert_eq!(
            heartbeat_expiry(&o, &cred(1, 1, 5), CutReading::uncertain(ts(119), 1), ttl),
            Ok(ts(124))
        );
        assert_eq!(
            heartbeat_expiry(
                &o,
                &cred(1, 1, 5),
                CutReading::certain(ts(100)),
                SignedDuration::from_millis(999)
            )
            .map_err(|e| e.code()),
            Err("invalid_timeout")
        );
        assert_eq!(
            heartbeat_expiry(&o, &cred(1, 1, 5), CutReading::certain(ts(120)), ttl)
                .map_err(|e| e.code()),
            Err("owner_expired")
        );
    }

    #[test]
    fn heartbeat_ttl_bounds_are_inclusive() {
        assert!(check_heartbeat_ttl(HEARTBEAT_TTL_MIN).is_ok());
        assert!(check_heartbeat_ttl(HEARTBEAT_TTL_MAX).is_ok());
        assert!(check_heartbeat_ttl(HEARTBEAT_TTL_MAX + SignedDuration::from_nanos(1)).is_err());
        assert!(check_heartbeat_ttl(HEARTBEAT_TTL_MIN - SignedDuration::from_nanos(1)).is_err());
        assert_eq!(
            check_heartbeat_ttl(HEARTBEAT_TTL_DEFAULT),
            Ok(SignedDuration::from_secs(5))
        );
    }

    #[test]
    fn replay_returns_the_receipt_only_to_its_current_unexpired_owner() {
        let cur = owned(1, 3, 40, 100);
        let c = CutReading::certain(ts(99));
        let r = receipt(1, 3, 40, TransitionKind::Ack);
        let req = Digest::of(b"req");
        for kind in [
            TransitionKind::Send,
            TransitionKind::Ack,
            TransitionKind::Cancel,
            TransitionKind::Release,
        ] {
            let r = receipt(1, 3, 40, kind);
            // Same owner: the same receipt.
            assert_eq!(
                plan_transition(Some(&r), kind, req, &cur, &cred(1, 3, 40), c),
                Ok(TransitionPlan::Replay(r.clone()))
            );
            // Replaced owner (the receipt's owner, no longer current).
            let replaced = owned(2, 4, 41, 100);
            assert_eq!(
                plan_transition(Some(&r), kind, req, &replaced, &cred(1, 3, 40), c)
                    .map_err(|e| e.code()),
                Err("transition_replay_refused")
            );
            // The new owner may not replay the old owner's receipt either.
            assert_eq!(
                plan_transition(Some(&r), kind, req, &replaced, &cred(2, 4, 41), c)
                    .map_err(|e| e.code()),
                Err("transition_replay_refused")
            );
            // Expired owner.
            assert_eq!(
                plan_transition(
                    Some(&r),
                    kind,
                    req,
                    &cur,
                    &cred(1, 3, 40),
                    CutReading::certain(ts(100))
                ),
                Err(LcError::TransitionReplayRefused {
                    exec_id: ExecId(7),
                    transition_id: "t-1".into(),
                    receipt_generation: OwnerGeneration(3),
                    current_generation: OwnerGeneration(3),
                })
            );
        }
        // Same id, other request: a conflict, not a replay.
        assert_eq!(
            plan_transition(
                Some(&r),
                TransitionKind::Ack,
                Digest::of(b"other"),
                &cur,
                &cred(1, 3, 40),
                c
            ),
            Err(LcError::IdempotencyConflict { key: "t-1".into() })
        );
        assert_eq!(
            plan_transition(
                Some(&r),
                TransitionKind::Cancel,
                req,
                &cur,
                &cred(1, 3, 40),
                c
            )
            .map_err(|e| e.code()),
            Err("idempotency_conflict")
        );
        // No receipt: commit for the owner, refuse anyone else.
        assert_eq!(
            plan_transition(None, TransitionKind::Ack, req, &cur, &cred(1, 3, 40), c),
            Ok(TransitionPlan::Commit)
        );
        assert_eq!(
            plan_transition(None, TransitionKind::Ack, req, &cur, &cred(9, 3, 40), c)
                .map_err(|e| e.code()),
            Err("owner_stale")
        );
    }

    #[test]
    fn a_release_receipt_replays_for_its_released_ownership_until_expiry_or_takeover() {
        let mut cur = owned(1, 3, 40, 100);
        cur.released = true;
        let c = CutReading::certain(ts(99));
        let req = Digest::of(b"req");
        let r = receipt(1, 3, 40, TransitionKind::Release);
        assert_eq!(
            plan_transition(
                Some(&r),
                TransitionKind::Release,
                req,
                &cur,
                &cred(1, 3, 40),
                c
            ),
            Ok(TransitionPlan::Replay(r.clone()))
        );
        // Uncertain: the owner never expires.
        assert_eq!(
            plan_transition(
                Some(&r),
                TransitionKind::Release,
                req,
                &cur,
                &cred(1, 3, 40),
                CutReading::uncertain(ts(500), 1)
            ),
            Ok(TransitionPlan::Replay(r.clone()))
        );
        for (cur, c) in [
            (cur.clone(), CutReading::certain(ts(100))),
            (owned(2, 4, 41, 100), c),
        ] {
            assert_eq!(
                plan_transition(
                    Some(&r),
                    TransitionKind::Release,
                    req,
                    &cur,
                    &cred(1, 3, 40),
                    c
                )
                .map_err(|e| e.code()),
                Err("transition_replay_refused")
            );
        }
        // Any other receipt of a released owner is refused.
        let a = receipt(1, 3, 40, TransitionKind::Ack);
        assert_eq!(
            plan_transition(Some(&a), TransitionKind::Ack, req, &cur, &cred(1, 3, 40), c)
                .map_err(|e| e.code()),
            Err("transition_replay_refused")
        );
        // And no new transition commits for it.
        assert_eq!(
            plan_transition(None, TransitionKind::Cancel, req, &cur, &cred(1, 3, 40), c)
                .map_err(|e| e.code()),
            Err("owner_stale")
        );
    }

    #[test]
    fn transition_ids_are_bounded_printable_ascii() {
        assert_eq!(check_transition_id("ack-1-12"), Ok("ack-1-12"));
        let max = "x".repeat(TRANSITION_ID_BYTES_MAX);
        assert!(check_transition_id(&max).is_ok());
        for bad in [
            String::new(),
            format!("{max}x"),
            "a b".into(),
            "é".into(),
            "a\n".into(),
        ] {
            assert_eq!(
                check_transition_id(&bad).map_err(|e| e.code()),
                Err("invalid_transition_id"),
                "{bad:?}"
            );
        }
        for k in ["send", "ack", "cancel", "release"] {
            assert_eq!(
                TransitionKind::parse(k).map(TransitionKind::as_str),
                Some(k)
            );
        }
        assert_eq!(TransitionKind::parse("drop"), None);
    }

    #[test]
    fn release_needs_an_acked_terminal_page_or_proof_of_not_sent() {
        assert_eq!(
            check_release(ExecId(7), Some(12), false),
            Ok(ReleaseBasis::TerminalPageAcked { seq: 12 })
        );
        assert_eq!(
            check_release(ExecId(7), Some(12), true),
            Ok(ReleaseBasis::TerminalPageAcked { seq: 12 })
        );
        assert_eq!(
            check_release(ExecId(7), None, true),
            Ok(ReleaseBasis::ProvenNotSent)
        );
        assert_eq!(
            check_release(ExecId(7), None, false),
            Err(LcError::ReleaseNotProven { exec_id: ExecId(7) })
        );
    }

    #[test]
    fn page_meta_checks_its_own_invariants() {
        use crate::page::{ExitStatus, Page};
        let d = PageMeta::of_page(
            ExecId(7),
            AttemptNo(1),
            &Page::data(1, PageKind::Stdout, b"x".to_vec()).unwrap(),
        );
        let t = PageMeta::of_page(
            ExecId(7),
            AttemptNo(1),
            &Page::terminal(2, ExitStatus::signaled(9)).unwrap(),
        );
        let empty = PageMeta::of_page(
            ExecId(7),
            AttemptNo(1),
            &Page::data(3, PageKind::Stderr, Vec::new()).unwrap(),
        );
        for ok in [&d, &t, &empty] {
            assert_eq!(ok.check(), Ok(ok));
        }
        let full = PageMeta {
            length: 65_536,
            ..d.clone()
        };
        assert!(full.check().is_ok());
        let bad = [
            PageMeta {
                seq: 0,
                ..d.clone()
            },
            PageMeta {
                length: 65_537,
                ..d.clone()
            },
            PageMeta {
                sha256: Digest::of(b"x"),
                ..empty.clone()
            },
            PageMeta {
                exit: Some(ExitStatus::exited(0)),
                ..d.clone()
            },
            PageMeta {
                exit: None,
                ..t.clone()
            },
            PageMeta {
                length: 1,
                ..t.clone()
            },
            PageMeta {
                exit: Some(ExitStatus {
                    code: Some(0),
                    signal: Some(9),
                }),
                ..t.clone()
            },
        ];
        for m in &bad {
            assert_eq!(
                m.check().map_err(|e| e.code()),
                Err("invalid_page"),
                "{m:?}"
            );
        }
        assert_eq!(
            bad[0].check(),
            Err(LcError::InvalidPage {
                reason: "page 0 of exec 7: seq must be at least 1".into()
            })
        );
    }

    #[test]
    fn transition_requests_digest_their_kind_exec_and_arguments() {
        let a =
            transition_request_sha256(TransitionKind::Ack, ExecId(7), "attempt=1 through_seq=3");
        assert_eq!(a, Digest::of(b"ack\n7\nattempt=1 through_seq=3"));
        assert_ne!(
            a,
            transition_request_sha256(TransitionKind::Ack, ExecId(7), "attempt=1 through_seq=4")
        );
        assert_ne!(
            a,
            transition_request_sha256(TransitionKind::Ack, ExecId(8), "attempt=1 through_seq=3")
        );
        assert_ne!(
            a,
            transition_request_sha256(TransitionKind::Cancel, ExecId(7), "attempt=1 through_seq=3")
        );
    }

    #[test]
    fn page_meta_matches_only_the_same_page() {
        use crate::page::{ExitStatus, Page};
        let p = Page::data(3, PageKind::Stdout, b"hello".to_vec()).unwrap();
        let m = PageMeta::of_page(ExecId(7), AttemptNo(1), &p);
        assert_eq!(m.length, 5);
        assert_eq!(m.sha256, Digest::of(b"hello"));
        assert!(m.matches(&p));
        let other = Page::data(3, PageKind::Stdout, b"hellO".to_vec()).unwrap();
        assert!(!m.matches(&other));
        let stderr = Page::data(3, PageKind::Stderr, b"hello".to_vec()).unwrap();
        assert!(!m.matches(&stderr));
        let t = Page::terminal(4, ExitStatus::exited(0)).unwrap();
        let tm = PageMeta::of_page(ExecId(7), AttemptNo(1), &t);
        assert_eq!((tm.length, tm.exit), (0, Some(ExitStatus::exited(0))));
        assert!(!tm.matches(&Page::terminal(4, ExitStatus::exited(1)).unwrap()));
    }

    #[test]
    fn a_receipt_differing_from_the_caller_in_any_one_part_is_refused() {
        let req = Digest::of(b"req");
        let c = CutReading::certain(ts(99));
        // The caller is the current, unexpired owner (token 1, generation 3,
        // fence 40); each receipt matches it in all parts but one.
        let cur = owned(1, 3, 40, 100);
        for (token, generation, fence) in [(2, 3, 40), (1, 2, 40), (1, 3, 39)] {
            let r = receipt(token, generation, fence, TransitionKind::Ack);
            assert_eq!(
                plan_transition(Some(&r), TransitionKind::Ack, req, &cur, &cred(1, 3, 40), c)
                    .map_err(|e| e.code()),
                Err("transition_replay_refused"),
                "receipt of ({token}, {generation}, {fence})"
            );
        }
    }

    #[test]
    fn names_and_accessors_are_exact() {
        let b = [9u8; OWNER_TOKEN_BYTES];
        assert_eq!(OwnerToken::from_bytes(b).as_bytes(), &b);
        assert_eq!(OwnerGeneration(12).to_string(), "12");
        assert_eq!(OwnerFence(-3).to_string(), "-3");
        assert_eq!(
            [
                TakeoverBasis::Unowned,
                TakeoverBasis::Released,
                TakeoverBasis::Expired
            ]
            .map(TakeoverBasis::as_str),
            ["unowned", "released", "expired"]
        );
        assert_eq!(
            [PageState::Pending, PageState::Acked].map(PageState::as_str),
            ["pending", "acked"]
        );
    }
}
