//! Little Compute's workers: the reconciler (allocate and restore, renew,
//! destroy, prove, release or park, seal due hibernations) as a loop
//! around one [`Reconciler::step`]. Output, the release of an exited exec
//! and a hibernation's stop and quiescence are the gateway's
//! (`lc-gateway`).
//!
//! * [`reconciler`]: one step over a bounded batch of due leases, and the
//!   loop that repeats it until shutdown. It drives any
//!   [`lc_provider::Provider`] (the bubblewrap provider in process, or
//!   `lc_provider::HttpProvider` over loopback).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod reconciler;

pub use reconciler::{
    ALLOCATE_CONCURRENCY_DEFAULT, ALLOCATE_CONCURRENCY_MAX, BATCH_DEFAULT,
    HIBERNATIONS_BATCH_DEFAULT, LeaseFailure, PROVIDER_CALL_TIMEOUT_DEFAULT,
    PROVIDER_CALL_TIMEOUT_MAX, PROVIDER_CALL_TIMEOUT_MIN, Reconciler, ReconcilerOptions, StepError,
    StepReport,
};
