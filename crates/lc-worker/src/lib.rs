//! Little Compute's workers: the reconciler (allocate, renew, pump output,
//! destroy, prove, release) as a loop around one [`Reconciler::step`].
//!
//! * [`reconciler`]: one step over a bounded batch of due leases, and the
//!   loop that repeats it until shutdown. It drives any
//!   [`lc_provider::Provider`] (the bubblewrap provider in process, or
//!   `lc_provider::HttpProvider` over loopback).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod reconciler;

pub use reconciler::{
    BATCH_DEFAULT, LeaseFailure, PUMP_ROUNDS_MAX, Reconciler, ReconcilerOptions, StepError,
    StepReport,
};
