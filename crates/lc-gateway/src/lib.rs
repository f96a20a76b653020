//! Little Compute's exec gateway: owns running execs, moves their output
//! from the supervisor's spool into the sink exactly once, cancels and
//! releases them, hibernates them and resumes them.
//!
//! * [`gateway`]: [`Gateway::step`], one bounded pass over the owned execs
//!   (heartbeat, claim, pending pages, new pages, cancel, release,
//!   hibernation and resume), and the loop that repeats it.
//! * [`spool`]: the fenced calls to the exec's provider, and
//!   [`ProviderConnector`] ([`HttpConnector`]: the provider's HTTP client).
//! * [`crash`]: the fault-injection switch (`LC_GATEWAY_CRASH_AT`) naming a
//!   point of the page protocol, of input delivery, hibernation or resume
//!   where the process kills itself.
//! * [`metrics`]: counters and gauges in the Prometheus text format.
//!
//! The gateway reaches the database only through
//! [`lc_core::store::GatewayStore`], whose every write is fenced by the
//! owner credential; the sink through [`lc_blob::BlobStore`]; time only
//! through a [`clock::Clock`] (the safe-time cut in production).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod crash;
pub mod gateway;
pub mod metrics;
pub mod spool;

pub use crash::{CRASH_AT_ENV, CrashPoint, FaultHook, UnknownCrashPoint};
pub use gateway::{
    ExecFailure, Gateway, GatewayError, GatewayOptions, INPUTS_PER_STEP, KEEPER_CHECKS_PER_RENEWAL,
    OWNED_EXECS_DEFAULT, OWNED_EXECS_MAX, PAGES_PER_ROUND, PAGES_PER_STEP_DEFAULT,
    PAGES_PER_STEP_MAX, PROVIDER_CALL_TIMEOUT_DEFAULT, PROVIDER_CALL_TIMEOUT_MIN,
    QUIESCE_TIMEOUT_DEFAULT, QUIESCE_TIMEOUT_MAX, SERVE_CONCURRENCY_DEFAULT, SERVE_CONCURRENCY_MAX,
    StepReport, new_owner_token,
};
pub use metrics::{GatewayMetrics, MetricsSnapshot};
pub use spool::{HttpConnector, ProviderConnector};
