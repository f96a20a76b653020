//! # tollgate-api
//!
//! Tollgate's HTTP API as a library: what `tollgate serve` runs, and what
//! tests drive with `oneshot` on the real router.
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
//!   exact to the nanosecond, each with a lossless `_ns` companion of
//!   integer nanoseconds in a decimal string);
//! * [`worker`]: the reclaim worker, a loop around one `step()`;
//! * [`storage`]: what the service needs beyond the allocator (readiness,
//!   counts), with the memory implementation;
//! * [`metrics`]: counters, safe-time gauges and the late-expiry histogram
//!   in the Prometheus text format.
//!
//! With the `testkit` feature it also exports the HTTP test kit: a harness
//! around the real router and the HTTP cases every store must pass.
//!
//! The time source is the crate `clock`; the stores are reached only
//! through [`tollgate::Allocator`] and [`storage::StoreOps`] (the PostgreSQL
//! implementation of the latter lives with the binary, `tollgate-server`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod auth;
pub mod dto;
pub mod error;
pub mod metrics;
mod state;
pub mod storage;
pub mod worker;

#[cfg(feature = "testkit")]
pub mod testkit;
