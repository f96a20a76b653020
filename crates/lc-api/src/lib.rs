//! # lc-api
//!
//! Little Compute's control-plane HTTP API as a library: what
//! `little-compute serve` runs, and what tests drive with `oneshot` on the
//! real router.
//!
//! The service maps HTTP to the [`lc_core::store::ControlStore`] trait and
//! back; it never decides a rule of the exec, lease or quota life cycle
//! (the core and the store do). The parts:
//!
//! * [`api`]: the axum router and handlers, and the OpenAPI document
//!   generated from the same route registrations ([`api::build`] is the
//!   one function a process calls);
//! * [`auth`]: the admin token, derived tenant API keys and the
//!   authorization rule (401/403/404 without revealing existence);
//! * [`error`]: the one error type and its RFC 9457 mapping;
//! * [`dto`]: the JSON shapes;
//! * [`metrics`]: counters and the cut's certainty in the Prometheus text
//!   format;
//! * [`runtime`]: runtime import into the runtime store shared with the
//!   provider.
//!
//! Time comes from a [`clock::Clock`] (in production the safe-cut clock);
//! the API converts each reading into the store's
//! [`lc_core::model::CutReading`]. No code here reads a host clock to
//! decide anything.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod auth;
pub mod dto;
pub mod error;
pub mod metrics;
pub mod runtime;
mod state;

pub use api::{build, router};
pub use state::{AppState, Reading, ServiceOptions};
