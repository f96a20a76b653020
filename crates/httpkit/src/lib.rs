//! # httpkit
//!
//! What every HTTP router of the system shares, so that each service's
//! handlers only map a request to one domain call and back:
//!
//! * [`Problem`]: the RFC 9457 problem document (`application/problem+json`)
//!   and [`problem_response`], the one place a service error becomes a
//!   response: status, stable `code`, client-safe `detail`, the original
//!   error logged once. A service error describes itself through
//!   [`ProblemSource`].
//! * [`Rejection`]: the request-level refusals every router shares (no
//!   credential, malformed JSON, wrong content type, body too large, bad
//!   path id or header, no such route or method, a body or a handler too
//!   slow), each with its stable code and status.
//! * [`extract`]: typed extractors. [`JsonBody`] and [`OptionalJsonBody`]
//!   enforce the content type and the body limit and report parse errors
//!   as problems; [`Bearer`] is the `Authorization: Bearer` credential;
//!   [`IdPath`] a path id, a positive integer in canonical decimal;
//!   [`IdempotencyKey`] the optional `Idempotency-Key` header. No handler
//!   parses a body or a header by hand.
//! * [`middleware`]: the request timeout (body and handling bounded
//!   separately) and request tracking (counted by matched route, status and
//!   problem code, logged once), assembled around a service's routes by
//!   [`service_router`].
//! * [`openapi`]: the problem responses and the `Problem` schema added to a
//!   service's OpenAPI document.
//! * [`server`]: the connection layer a service is served by ([`serve`]):
//!   a bound on connections (the longest-waiting idle one closed to make
//!   room, else 503 `too_many_connections`), a header-read and an idle
//!   timeout, problem documents for request heads the HTTP parser
//!   refuses, graceful shutdown, and the open-file check
//!   ([`server::fit_descriptor_limit`]).
//!
//! Everything is generic over the router's state through [`ServiceState`]:
//! the state names the service's error type, into which every
//! [`Rejection`] converts, so a rejected request answers with the service's
//! own problem type, codes and metrics.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::time::Duration;

use axum::response::IntoResponse;

pub mod extract;
pub mod middleware;
pub mod openapi;
mod problem;
mod rejection;
pub mod server;

pub use extract::{
    Bearer, IDEMPOTENCY_KEY_HEADER, IdPath, IdempotencyKey, JsonBody, OptionalJsonBody, bearer,
};
pub use middleware::{RequestMetrics, service_router};
pub use problem::{ErrorCode, PROBLEM_JSON, Problem, ProblemSource, problem_response, title_of};
pub use rejection::Rejection;
pub use server::{ConnectionLimits, serve};

/// The state of a service's router: the service's error type and the
/// bounds every request of the service is held to.
pub trait ServiceState: Clone + Send + Sync + 'static {
    /// The service's error. Every [`Rejection`] converts into it, and its
    /// `IntoResponse` is the service's problem response (normally
    /// [`problem_response`]).
    type Error: From<Rejection> + IntoResponse + Send + 'static;

    /// The largest request body accepted, in bytes; a larger one is
    /// [`Rejection::PayloadTooLarge`].
    fn body_max_bytes(&self) -> usize;

    /// The bound on receiving a request's body and, separately, on handling
    /// it ([`middleware::timeout`]).
    fn request_timeout(&self) -> Duration;
}
