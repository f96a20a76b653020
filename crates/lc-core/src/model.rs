//! Ids, states and the records the store reads and writes.
//!
//! Every id is a newtype over the integer the database stores. A
//! [`TenantId`] is the Tollgate `AccountId` of the tenant's account: one
//! number, one meaning. Instants are `jiff::Timestamp`s on the safe expiry
//! cut (serialized as RFC 3339 with nanoseconds), never host-clock times.

use std::fmt;
use std::str::FromStr;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::error::LcError;

macro_rules! int_id {
    ($(#[$doc:meta])* $name:ident($int:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $int);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

int_id!(
    /// A tenant: the Tollgate `AccountId` of its account (`>= 1`).
    TenantId(i64)
);
int_id!(
    /// An exec, from a database sequence (`>= 1`).
    ExecId(i64)
);
int_id!(
    /// An attempt of an exec, numbered from 1 within the exec.
    AttemptNo(i32)
);
int_id!(
    /// A Reservation or Lease generation within an attempt, from 1.
    Generation(i64)
);
int_id!(
    /// A sandbox Lease, from a database sequence (`>= 1`). Generation 1's
    /// id is part of the exec's canonical identity.
    SandboxLeaseId(i64)
);
int_id!(
    /// A workspace, from a database sequence (`>= 1`).
    WorkspaceId(i64)
);

/// The longest provider id, in bytes.
pub const PROVIDER_ID_BYTES_MAX: usize = 63;

/// A provider's id: 1 to [`PROVIDER_ID_BYTES_MAX`] characters of
/// `[a-z0-9-]`. The field is private so every value is valid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ProviderId(String);

impl ProviderId {
    /// Checks and wraps `s`.
    ///
    /// # Errors
    /// [`LcError::InvalidProviderId`] for an empty or longer string or one
    /// with a character outside `[a-z0-9-]`.
    pub fn new(s: impl Into<String>) -> Result<ProviderId, LcError> {
        let s = s.into();
        let ok = !s.is_empty()
            && s.len() <= PROVIDER_ID_BYTES_MAX
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok {
            Ok(ProviderId(s))
        } else {
            Err(LcError::InvalidProviderId {
                reason: format!(
                    "a provider id is 1 to {PROVIDER_ID_BYTES_MAX} characters of [a-z0-9-]"
                ),
            })
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ProviderId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ProviderId::new(s).map_err(serde::de::Error::custom)
    }
}

/// A SHA-256 digest; shown, parsed and serialized as 64 lower-case hex
/// digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(sha2::Sha256::digest(bytes).into())
    }

    /// 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses exactly 64 hex digits (lower- or upper-case).
    ///
    /// # Errors
    /// [`LcError::InvalidDigest`] for anything else.
    pub fn from_hex(s: &str) -> Result<Digest, LcError> {
        let mut out = [0u8; 32];
        if s.len() != 64 || hex::decode_to_slice(s, &mut out).is_err() {
            return Err(LcError::InvalidDigest {
                reason: "a digest is 64 hex digits".into(),
            });
        }
        Ok(Digest(out))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for Digest {
    type Err = LcError;
    fn from_str(s: &str) -> Result<Digest, LcError> {
        Digest::from_hex(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

/// What a caller read from the safe-cut clock, handed to every store
/// method that decides anything by time.
///
/// `cut` is the persisted safe expiry cut as read (a lower bound on true
/// time); `certain` whether the clock vouched for it; `retry_after_s` how
/// long a refused client should wait (the `Retry-After` of a
/// `time_uncertain` answer). The store refuses a reading whose `cut` is
/// later than the persisted cut ([`LcError::InvalidCutReading`]), so no
/// caller can invent time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CutReading {
    /// The cut as read.
    pub cut: Timestamp,
    /// Whether the reading is certain (expiry and admission allowed).
    pub certain: bool,
    /// Seconds a refused client should wait before retrying (`>= 1` is
    /// sensible; 0 means "now").
    pub retry_after_s: u64,
}

impl CutReading {
    /// A certain reading at `cut`.
    pub fn certain(cut: Timestamp) -> CutReading {
        CutReading {
            cut,
            certain: true,
            retry_after_s: 0,
        }
    }

    /// An uncertain reading at `cut`, to be retried after `retry_after_s`.
    pub fn uncertain(cut: Timestamp, retry_after_s: u64) -> CutReading {
        CutReading {
            cut,
            certain: false,
            retry_after_s,
        }
    }
}

macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// The stable snake_case name (as stored and shown).
            pub fn as_str(&self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Parses [`as_str`](Self::as_str)'s text.
            pub fn parse(s: &str) -> Option<$name> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(
    /// The life of an exec.
    ExecState {
        /// Waiting for an approver under its tenant's approval policy
        /// ([`crate::approval::ApprovalPolicy`]): attempt 1 exists, but no
        /// Reservation and no Lease, so it holds no capacity.
        AwaitingApproval = "awaiting_approval",
        /// Admitted: attempt 1 and its Lease exist, no instance runs yet.
        Admitted = "admitted",
        /// An instance of the current attempt is running.
        Running = "running",
        /// Its attempt is parked on a saved workspace head: no instance
        /// runs and its Reservation is returned; a resume continues it.
        Hibernated = "hibernated",
        /// Finished; see [`TerminalReason`].
        Terminal = "terminal",
    }
);

text_enum!(
    /// Why an exec ended [`TerminalReason::Expired`]
    /// ([`crate::rules::expiry_cause`]).
    ExpiryCause {
        /// Its timeout passed on a certain cut (named when both passed).
        Timeout = "timeout",
        /// Its sandbox Lease's expiry passed unrenewed: the instance was
        /// lost or stopped answering, or no worker renewed it.
        Lease = "lease",
    }
);

text_enum!(
    /// What happens when an exec's timeout passes on a certain cut.
    OnTimeout {
        /// The exec is released and becomes terminal (`expired`).
        Terminate = "terminate",
        /// The exec hibernates (reason `deadline`) and may be resumed.
        Hibernate = "hibernate",
    }
);

#[allow(clippy::derivable_impls)] // the enum is written by a macro
impl Default for OnTimeout {
    fn default() -> OnTimeout {
        OnTimeout::Terminate
    }
}

text_enum!(
    /// Why an exec's attempt generation hibernates.
    HibernationReason {
        /// The tenant asked for it.
        Requested = "requested",
        /// No activity for the exec's idle TTL on a certain cut.
        Idle = "idle",
        /// Its timeout passed on a certain cut with `on_timeout = hibernate`.
        Deadline = "deadline",
    }
);

text_enum!(
    /// Where a hibernation stands: `sealed -> quiesced -> parked`.
    HibernationStep {
        /// Recorded with its sealed cut; the owner stops the command.
        Sealed = "sealed",
        /// The provider's quiescence is committed: the snapshot is the
        /// workspace head and the Lease is `release_pending`.
        Quiesced = "quiesced",
        /// The destroy is proven: the Reservation is returned and the
        /// attempt parked.
        Parked = "parked",
        /// The provider refused to snapshot the stopped generation's
        /// workspace (a device, fifo or socket in it, a name that is not
        /// UTF-8, a tree over the bounds): the refusal is recorded, the
        /// exec ends `snapshot_refused` (or `cancelled` after a cancel) and
        /// its Lease is released; the workspace head stays where it was.
        Refused = "refused",
    }
);

text_enum!(
    /// Why an exec became terminal.
    TerminalReason {
        /// The command exited (its exit code is recorded).
        Exited = "exited",
        /// Cancelled by the tenant.
        Cancelled = "cancelled",
        /// Its Lease's deadline passed on a certain cut (or its timeout).
        Expired = "expired",
        /// The provider could not start the instance.
        StartFailed = "start_failed",
        /// Its hibernation stopped the command, then the provider refused
        /// to snapshot the workspace (see [`HibernationStep::Refused`]):
        /// what the command wrote after the workspace head is not kept.
        SnapshotRefused = "snapshot_refused",
        /// An approver denied it while it awaited approval: it never held
        /// capacity.
        Denied = "denied",
        /// Its approval's `valid_until` passed on a certain cut before its
        /// first Lease was allocated: it never started, and its Reservation
        /// is returned through the release path.
        ApprovalExpired = "approval_expired",
    }
);

text_enum!(
    /// The life of an attempt.
    AttemptState {
        /// Waiting for an instance.
        Runnable = "runnable",
        /// An instance runs it.
        Running = "running",
        /// Hibernated on a saved workspace head.
        Parked = "parked",
        /// Finished.
        Terminal = "terminal",
    }
);

text_enum!(
    /// The life of a sandbox Lease:
    /// `allocating -> active -> release_pending -> released`, and
    /// `allocating -> release_pending`.
    LeaseState {
        /// Created at admission; the provider has not confirmed an instance.
        Allocating = "allocating",
        /// The provider runs the instance.
        Active = "active",
        /// The instance must be destroyed; the destroy is retried until its
        /// evidence validates.
        ReleasePending = "release_pending",
        /// Destroy proven and committed on a certain cut; capacity returned.
        Released = "released",
    }
);

text_enum!(
    /// The life of a Reservation (a Tollgate grant of the shape's units).
    ReservationState {
        /// The grant is active.
        Held = "held",
        /// Released with consumed 0: the units are back, exactly once.
        Returned = "returned",
    }
);

/// The exec's canonical identity, fixed at admission and never rewritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanonicalIdentity {
    /// The exec.
    pub exec_id: ExecId,
    /// Generation 1's sandbox Lease.
    pub lease_id: SandboxLeaseId,
    /// The provider chosen at admission.
    pub provider_id: ProviderId,
    /// The runtime's digest.
    pub runtime: Digest,
    /// The exec's workspace.
    pub workspace_id: WorkspaceId,
}

/// A request to admit an exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// A runtime name, or its digest as 64 hex digits.
    pub runtime: String,
    /// A shape name ([`crate::shape::Shape::by_name`]).
    pub shape: String,
    /// The argv ([`crate::command::Command::new`] checks it).
    pub command: Vec<String>,
    /// How long the command may run, in milliseconds (`1..=`
    /// [`crate::rules::TIMEOUT_MS_MAX`]), counted from admission and again
    /// from each committed resume (each run of the exec gets the whole
    /// timeout); `None`: until cancelled, while the Lease is renewed.
    pub timeout_ms: Option<u64>,
    /// Whether the command's stdin stays open for input the tenant sends
    /// ([`crate::ControlStore::send_input`]) until an `eof` input; `false`
    /// (the default): the command's stdin is empty.
    #[serde(default)]
    pub stdin_open: bool,
    /// How long the exec may go without activity (an output page staged
    /// or an input sent) before it hibernates, in milliseconds
    /// (`1..=`[`crate::rules::TIMEOUT_MS_MAX`]); `None` (the default):
    /// never for idleness.
    #[serde(default)]
    pub idle_ttl_ms: Option<u64>,
    /// What its timeout does ([`OnTimeout::Terminate`] by default).
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

/// An exec as the store reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRecord {
    /// The exec.
    pub exec_id: ExecId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Its state.
    pub state: ExecState,
    /// Why it is terminal (`None` before).
    pub terminal_reason: Option<TerminalReason>,
    /// Why it expired, when its reason is [`TerminalReason::Expired`]
    /// (`None` otherwise, and for execs that expired before the cause was
    /// recorded).
    #[serde(default)]
    pub expired_by: Option<ExpiryCause>,
    /// The command's exit code, when it exited with one.
    pub exit_code: Option<i32>,
    /// Fixed at admission.
    pub canonical: CanonicalIdentity,
    /// The current attempt (1 until resume exists).
    pub attempt: AttemptNo,
    /// The shape's name.
    pub shape: String,
    /// Units the Reservation holds (the shape's).
    pub units: i64,
    /// The current generation's sandbox Lease state; `None` while the
    /// exec awaits approval (and after a denial or a cancel there), when
    /// no Lease exists.
    #[serde(default)]
    pub lease_state: Option<LeaseState>,
    /// The argv.
    pub command: Vec<String>,
    /// The timeout the request asked for, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// `admitted_cut + timeout`, or after a resume its receipt's committed
    /// cut + timeout, on the cut; `None` without a timeout.
    pub timeout_deadline: Option<Timestamp>,
    /// The certain cut the exec was admitted at.
    pub admitted_cut: Timestamp,
    /// Whether the tenant asked to cancel it.
    pub cancel_requested: bool,
    /// Whether its command's stdin takes input
    /// ([`ExecRequest::stdin_open`]).
    #[serde(default)]
    pub stdin_open: bool,
    /// Its idle TTL in milliseconds ([`ExecRequest::idle_ttl_ms`]).
    #[serde(default)]
    pub idle_ttl_ms: Option<u64>,
    /// What its timeout does ([`ExecRequest::on_timeout`]).
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Its workspace's head: the newest snapshot's digest; `None` before
    /// the first hibernation committed one.
    #[serde(default)]
    pub workspace_head: Option<Digest>,
    /// The newest hibernation of its current attempt (the highest
    /// generation); `None` when none was sealed.
    #[serde(default)]
    pub hibernation: Option<crate::hibernate::HibernationRecord>,
    /// The receipt of its newest committed resume (the highest attempt and
    /// generation); `None` when it was never resumed.
    #[serde(default)]
    pub resume: Option<crate::hibernate::ResumeReceipt>,
    /// The decision on its approval (approved or denied); `None` for an
    /// exec that needed none or still awaits one.
    #[serde(default)]
    pub approval: Option<crate::approval::ApprovalRecord>,
    /// What the provider measured of the instances of its current
    /// attempt, every generation of it, verified against the provider's
    /// registered key and combined
    /// ([`crate::observation::AttemptObservation::of_generations`]);
    /// `None` unless every generation was measured (a provider that died
    /// or never answered before a destroy, a generation still running),
    /// which is never read as zero cost or no side effects.
    #[serde(default)]
    pub observation: Option<crate::observation::AttemptObservation>,
}

/// A tenant with its Tollgate balances (units).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// The tenant (= its Tollgate account).
    pub tenant_id: TenantId,
    /// Its name (1 to [`crate::rules::NAME_BYTES_MAX`] bytes).
    pub name: String,
    /// Units ever deposited.
    pub deposited: i64,
    /// Units free to reserve.
    pub available: i64,
    /// Units held by Reservations.
    pub held: i64,
    /// Units charged (Little Compute returns Reservations with consumed
    /// 0, so this stays 0 unless Tollgate reclaimed a lapsed grant).
    pub consumed: i64,
    /// Which of its execs need an approval before they hold capacity
    /// (`off` by default).
    #[serde(default)]
    pub approval_policy: crate::approval::ApprovalPolicy,
}

/// A registered runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runtime {
    /// Its name (unique).
    pub name: String,
    /// SHA-256 of its canonical manifest.
    pub digest: Digest,
    /// Its manifest (JSON).
    pub manifest: serde_json::Value,
}

/// A registered provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provider {
    /// Its id.
    pub provider_id: ProviderId,
    /// Where the worker reaches it (`http://127.0.0.1:P`).
    pub url: String,
    /// Its Ed25519 public key (32 bytes), hex in JSON.
    #[serde(with = "hex_32")]
    pub public_key: [u8; 32],
}

mod hex_32 {
    pub fn serialize<S: serde::Serializer>(b: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(b))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(&s, &mut out).map_err(serde::de::Error::custom)?;
        Ok(out)
    }
}

/// The stream of an output page (the page module's type).
pub use crate::page::PageKind;

/// How the command ended, carried by the terminal page (the page module's
/// [`ExitStatus`](crate::page::ExitStatus)).
pub type PageExit = crate::page::ExitStatus;

/// An output page as stored: one seq space per (exec, attempt), from 1,
/// no gaps; `bytes.len() <= `[`crate::rules::PAGE_BYTES_MAX`];
/// `sha256 = SHA-256(bytes)`; the terminal page is the last, with empty
/// bytes and an `exit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputPage {
    /// The exec.
    pub exec_id: ExecId,
    /// The attempt.
    pub attempt: AttemptNo,
    /// `1..`, consecutive.
    pub seq: i64,
    /// Its stream.
    pub kind: PageKind,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// SHA-256 of `bytes`.
    pub sha256: Digest,
    /// The exit status (terminal page only).
    pub exit: Option<PageExit>,
}

impl OutputPage {
    /// The stored form of `page`, a page of `exec_id`'s attempt `attempt`.
    pub fn from_page(exec_id: ExecId, attempt: AttemptNo, page: &crate::page::Page) -> OutputPage {
        OutputPage {
            exec_id,
            attempt,
            seq: page.seq(),
            kind: page.kind(),
            bytes: page.bytes().to_vec(),
            sha256: Digest(page.sha256()),
            exit: page.exit(),
        }
    }

    /// The page this record holds, every invariant re-checked.
    ///
    /// # Errors
    /// [`LcError::InvalidPage`] naming the broken invariant.
    pub fn to_page(&self) -> Result<crate::page::Page, LcError> {
        crate::page::Page::from_parts(
            self.seq,
            self.kind,
            self.bytes.clone(),
            self.sha256.0,
            self.exit,
        )
        .map_err(|e| LcError::InvalidPage {
            reason: e.to_string(),
        })
    }
}

/// What the reconciler should do with a lease now (computed by
/// [`crate::rules::plan_lease_action`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseAction {
    /// Allocate the instance on the provider, then `mark_active`.
    Allocate,
    /// Running: collect pages, renew, observe.
    Maintain,
    /// Move to `release_pending` with this reason (cancel, timeout or
    /// expiry on a certain cut).
    BeginRelease(TerminalReason),
    /// Destroy on the provider and `commit_release` with the evidence.
    Destroy,
}

/// One lease that needs the reconciler, with everything it needs to act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseWork {
    /// The lease.
    pub lease_id: SandboxLeaseId,
    /// Its generation.
    pub generation: Generation,
    /// Its state.
    pub state: LeaseState,
    /// Its expiry on the cut.
    pub expiry: Timestamp,
    /// The expiry of its Reservation's Tollgate grant, on the cut. Renewed
    /// also while the Lease's destroy is being proven, so the grant never
    /// reaches its reclaim boundary before its units return.
    pub reservation_expiry: Timestamp,
    /// What to do now.
    pub action: LeaseAction,
    /// The exec.
    pub exec_id: ExecId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The attempt.
    pub attempt: AttemptNo,
    /// The provider.
    pub provider_id: ProviderId,
    /// The provider's URL.
    pub provider_url: String,
    /// The runtime digest.
    pub runtime: Digest,
    /// The shape name.
    pub shape: String,
    /// The argv.
    pub command: Vec<String>,
    /// The workspace.
    pub workspace_id: WorkspaceId,
    /// The highest page seq stored for (exec, attempt), 0 if none.
    pub last_seq: i64,
    /// Why the exec is going terminal, once `release_pending`.
    pub terminal_reason: Option<TerminalReason>,
    /// Whether the command's stdin stays open for input
    /// ([`ExecRequest::stdin_open`]): what the provider's allocation asks.
    #[serde(default)]
    pub stdin_open: bool,
    /// The workspace head this generation restores (a resumed
    /// generation); `None` for a fresh workspace.
    #[serde(default)]
    pub restore_head: Option<Digest>,
    /// The first output page seq this generation's supervisor numbers
    /// from: the attempt's last stored page seq + 1 (1 for a fresh
    /// attempt). The manifest of `restore_head` is read with
    /// [`crate::ControlStore::snapshot_manifest`] or
    /// [`crate::ReconcileStore::restore_manifest`].
    #[serde(default = "first_seq_default")]
    pub first_seq: i64,
    /// Whether the provider's attachment is recorded on this Lease.
    #[serde(default)]
    pub attached: bool,
    /// The seq of the first input this generation's supervisor takes: the
    /// exec's highest input seq recorded `sent` + 1 (1 when none was), so
    /// the queued inputs continue after the ones an earlier generation
    /// received.
    #[serde(default = "first_seq_default")]
    pub first_input_seq: i64,
    /// Whether the Lease's attempt is `parked`: a resume's Lease whose
    /// resume is not committed yet, which is allocated and attached but
    /// not marked active until its attempt is `runnable` again.
    #[serde(default)]
    pub attempt_parked: bool,
}

fn first_seq_default() -> i64 {
    1
}

/// What a `commit_release` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseOutcome {
    /// The lease.
    pub lease_id: SandboxLeaseId,
    /// Its generation.
    pub generation: Generation,
    /// The exec, now terminal (or hibernated, see `parked`).
    pub exec_id: ExecId,
    /// Units returned to the tenant by this release (the same number on a
    /// replay, which returns nothing again).
    pub units_returned: i64,
    /// The certain cut the release committed at.
    pub released_cut: Timestamp,
    /// `true` when this call found the release already committed and
    /// changed nothing.
    pub replay: bool,
    /// `true` when the release parked the attempt (a quiesced
    /// hibernation of this generation) instead of ending the exec.
    #[serde(default)]
    pub parked: bool,
}

/// What an `append_pages` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AppendReport {
    /// Pages newly stored.
    pub appended: usize,
    /// Pages already stored with the same sha256 (no-ops).
    pub duplicates: usize,
    /// The highest stored seq afterwards.
    pub last_seq: i64,
}

/// Who an operation key belongs to: the administrator (tenant creation,
/// runtime registration) or one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpScope {
    /// Administrator operations.
    Admin,
    /// One tenant's operations.
    Tenant(TenantId),
}

/// A stored operation key and its recorded result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationRecord {
    /// Whose key.
    pub scope: OpScope,
    /// The key.
    pub key: String,
    /// SHA-256 of the request it was first used with.
    pub request_sha256: Digest,
    /// The operation's name (`admit_exec`, `deposit`, ...).
    pub kind: String,
    /// The recorded result (what a replay returns).
    pub result: serde_json::Value,
    /// The cut the key was created at.
    pub created_cut: Timestamp,
    /// The cut captured at the terminal transition (certain or not).
    pub floor: Timestamp,
    /// Its declared TTL, in nanoseconds.
    pub ttl_ns: i64,
    /// Whether a certain cut has passed the floor (the terminal receipt).
    pub receipt_attached: bool,
    /// The earliest cut at which GC may delete it:
    /// `max(created_cut + ttl, floor + ttl)`.
    pub gc_at: Timestamp,
}
