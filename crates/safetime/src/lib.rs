//! # safetime
//!
//! The time authority's rules, pure (no I/O, no clock read, no runtime):
//! how the persisted *safe expiry cut* moves, when it is certain, and which
//! deadlines it may be trusted with. Every subsystem that judges a deadline
//! (Tollgate's leases, Little Compute's) judges it against the cut, and
//! stores it as an exact [`InstantPair`].
//!
//! * [`tracker`]: the cut tracker ([`CutTracker`]) that turns observations
//!   of database time, bracketed by a monotonic clock, into proposals;
//!   its module docs state the design and its failure modes.
//! * [`carry`]: the cut a sampler process carries across a new epoch
//!   ([`CarriedCut`], from its [`CutReading`]s) and the lower bound on true
//!   time it vouches for, so that lag grows only by time no sampler
//!   observed.
//! * [`reason`]: why the cut is uncertain ([`UncertainReason`]) and how a
//!   reader judges a reading of it ([`judge_reading`]).
//! * [`config`]: the sampler's tuning ([`SafeTimeConfig`]) and its bounds.
//! * [`quarantine`]: how far the initial quarantine's proof has come
//!   ([`QuarantineProgress`]) and the run it needs in all.
//! * [`horizon`]: the owner-sealed maximum-deadline horizon
//!   ([`HorizonPolicy`], digest verified) and the check that it covers the
//!   longest deadline of every kind ([`HorizonPolicy::covers`] over
//!   [`DeadlineBound`]s).
//! * [`inventory`]: every kind of deadline the control plane admits
//!   ([`DeadlineInventory`], a field per deadline-bearing setting) and the
//!   one check that the sealed horizon covers them all
//!   ([`DeadlineInventory::check`]).
//! * [`instant_pair`]: the exact PostgreSQL encoding of an instant;
//!   [`timestamp`]: the ends of the timestamp domain.
//!
//! The database side (reading the cut, the sampler's leadership loop) is
//! the `safetime-pg` crate.
//!
//! Invariants, stated as absences: nothing here reads a clock (every
//! instant and monotonic reading is an argument); no instant or duration
//! is rounded or saturated (a value out of range is an error or, for an
//! impossible state, a panic naming the broken invariant).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod carry;
pub mod config;
pub mod horizon;
pub mod instant_pair;
pub mod inventory;
pub mod quarantine;
pub mod reason;
pub mod timestamp;
pub mod tracker;

pub use carry::{CarriedCut, CutReading};
pub use config::{
    DEFAULT_DRIFT_PPM, DEFAULT_GAP_MAX, DEFAULT_RECOVERY_GRACE, DEFAULT_ROUND_TRIP_MAX,
    DEFAULT_SAMPLE_INTERVAL, DEFAULT_STABLE_OBSERVATIONS_MIN, DRIFT_PPM_MAX, GAP_MAX_MAX,
    RECOVERY_GRACE_MAX, STABLE_OBSERVATIONS_MAX, SafeTimeConfig, SafeTimeConfigError,
};
pub use horizon::{
    DEFAULT_HORIZON_MS, DeadlineBound, DeadlineKind, HorizonPolicy, HorizonPolicyError,
    HorizonShortfall,
};
pub use instant_pair::{InstantPair, PairError};
pub use inventory::DeadlineInventory;
pub use quarantine::QuarantineProgress;
pub use reason::{UncertainReason, judge_reading};
pub use timestamp::{TIMESTAMP_MAX_NS, TIMESTAMP_MIN_NS};
pub use tracker::{CutTracker, Observation, Topology, Verdict};
