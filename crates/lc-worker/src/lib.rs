//! Little Compute's workers: the reconciler (allocate, renew, destroy,
//! prove, release) as a loop around one [`Reconciler::step`]. Output and
//! the release of an exited exec are the gateway's (`lc-gateway`).
//!
//! * [`reconciler`]: one step over a bounded batch of due leases, and the
//!   loop that repeats it until shutdown. It drives any
//!   [`lc_provider::Provider`] (the bubblewrap provider in process, or
//!   `lc_provider::HttpProvider` over loopback).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod reconciler;

pub use reconciler::{
    BATCH_DEFAULT, LeaseFailure, Reconciler, ReconcilerOptions, StepError, StepReport,
};
