//! # tollgate-server
//!
//! Tollgate's HTTP service, command line, reclaim worker, readiness and
//! conservation audit: the binary `tollgate`.
//!
//! The service maps HTTP to the [`tollgate::Allocator`] API and back; it
//! never decides an accounting or timing rule (those live in the core). The
//! parts:
//!
//! * [`api`]: the axum router and handlers, and the OpenAPI document
//!   generated from the same route registrations;
//! * [`auth`]: credentials and the authorization rule (401/403/404 without
//!   revealing existence);
//! * [`error`]: the one error type and its RFC 9457 mapping;
//! * [`dto`]: the JSON shapes (RFC 3339 instants and ISO 8601 durations,
//!   exact to the nanosecond);
//! * [`clock`]: the time source (system, test, the safe cut) and its
//!   readings' certainty; [`safe_cut`]: the clock on the safe expiry cut;
//! * [`worker`]: the reclaim worker, a loop around one `step()`;
//! * [`storage`]: what the service needs beyond the allocator (readiness,
//!   counts), with the memory implementation; [`pg`]: the PostgreSQL seam;
//! * [`config`], [`cli`], [`client`], [`serve`]: configuration, the command
//!   line, its HTTP client, and the process wiring with graceful shutdown;
//! * [`metrics`]: counters, safe-time gauges and the late-expiry histogram
//!   in the Prometheus text format.
//!
//! Only this crate knows HTTP; the core does no I/O and reads no clock.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// The time sources, moved to the crate `clock`; re-exported here under
/// the old path until every user imports `clock` directly.
pub mod clock {
    pub use ::clock::*;
}

/// The safe-cut clock, moved to `clock::safe_cut`; re-exported here under
/// the old path until every user imports `clock` directly.
pub mod safe_cut {
    pub use ::clock::safe_cut::*;
}

/// The library half, moved to the crate `tollgate-api`; re-exported here
/// under the old paths until every user imports `tollgate_api` directly.
pub use tollgate_api::{api, auth, dto, error, metrics, worker};

/// The storage seam, moved to `tollgate_api::storage`; re-exported here
/// under the old path, with `Backend` the old name of
/// [`tollgate_api::storage::ServiceStore`], until every user imports
/// `tollgate_api` directly.
pub mod storage {
    pub use tollgate_api::storage::ServiceStore as Backend;
    pub use tollgate_api::storage::*;
}

pub mod cli;
pub mod client;
pub mod config;
pub mod output;
pub mod pg;
pub mod serve;
