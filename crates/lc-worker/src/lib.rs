//! Little Compute's workers: the reconciler (allocate, renew, pump output,
//! destroy, prove, release) as a loop around one [`Reconciler::step`].
//!
//! * [`port`]: what the reconciler asks of a provider ([`ProviderPort`]),
//!   so it can drive any provider implementation (over HTTP, in process).
//! * [`adapter`]: [`ProviderPort`] over any `lc_provider::Provider`.
//! * [`reconciler`]: one step over a bounded batch of due leases, and the
//!   loop that repeats it until shutdown.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adapter;
pub mod port;
pub mod reconciler;

pub use adapter::ProviderAdapter;
pub use port::{PortError, ProviderPort};
pub use reconciler::{
    BATCH_DEFAULT, LeaseFailure, PUMP_ROUNDS_MAX, Reconciler, ReconcilerOptions, StepError,
    StepReport,
};
