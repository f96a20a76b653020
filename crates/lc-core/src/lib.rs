//! Little Compute's domain: the pure rules every Little Compute process
//! applies. No I/O, no clock, no runtime, no database, no HTTP.
//!
//! * [`model`]: ids, states, [`CutReading`] and the records stores return.
//! * [`shape`]: the named resource sets and their units.
//! * [`command`]: the checked argv.
//! * [`rules`]: expiry, admission and renewal on the cut; the state
//!   machines; the reconciler's plan for a lease.
//! * [`rate`]: a tenant's admission rate on the cut.
//! * [`opkey`]: operation keys and their floor, receipt and GC rules.
//! * [`owner`]: exec ownership by gateways, fenced writes, transition
//!   receipts and their replay, the release rule for terminal execs.
//! * [`claim`]: workers' claims on work items: takes only on a certain
//!   cut past expiry + grace, renewals that never shorten, fenced writes.
//! * [`input`]: input for a command's stdin: its order, its queue bound,
//!   its delivery by the exec's owner.
//! * [`hibernate`]: hibernation and resume: the records and the checks of
//!   each step (seal, quiescence, attachment, resume).
//! * [`token`]: scoped tokens: operations, scopes, their deadline on
//!   the cut.
//! * [`deletion`]: deletion grace (delete, undelete, purge) and the
//!   retention of terminal execs' records, on the cut.
//! * [`approval`]: tenants' approval policies, approvals on the cut and
//!   the start gate of an approved exec.
//! * [`error`]: [`LcError`] with stable codes.
//! * [`store`]: the [`ControlStore`], [`ReconcileStore`] and
//!   [`GatewayStore`] traits.
//! * [`page`], [`evidence`], [`manifest`]: output pages, signed provider
//!   evidence, runtime manifests.
//! * [`snapshot`]: file snapshots of a workspace, their canonical manifest
//!   and digest.
//! * [`observation`]: optional cost and externality observations, trusted
//!   captures, the re-execution rule on a milestone, retry receipts (v2,
//!   and v1 parse-only).
//!
//! Invariants, stated as absences: nothing here reads a clock (every rule
//! takes a [`CutReading`]); nothing panics on input; no instant is rounded.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod approval;
pub mod claim;
pub mod command;
pub mod deletion;
pub mod error;
pub mod evidence;
pub mod hibernate;
pub mod input;
pub mod manifest;
pub mod model;
pub mod observation;
pub mod opkey;
pub mod owner;
pub mod page;
pub mod rate;
pub mod rules;
pub mod shape;
pub mod snapshot;
pub mod store;
pub mod token;

pub use command::Command;
pub use error::LcError;
pub use hibernate::{
    HibernationRecord, ResumeIntent, ResumeReceipt, SnapshotMeta, WorkspaceRecord,
};
pub use model::{
    AppendReport, AttemptNo, AttemptState, CanonicalIdentity, CutReading, Digest, ExecId,
    ExecRecord, ExecRequest, ExecState, ExpiryCause, Generation, HibernationReason,
    HibernationStep, LeaseAction, LeaseState, LeaseWork, OnTimeout, OpScope, OperationRecord,
    OutputPage, PageExit, PageKind, Provider, ProviderId, ReleaseOutcome, ReservationState,
    Runtime, SandboxLeaseId, Tenant, TenantId, TerminalReason, WorkspaceId,
};
pub use opkey::OperationKey;
pub use shape::Shape;
pub use snapshot::SnapshotError;
pub use store::{ControlStore, GatewayStore, ReconcileStore};
