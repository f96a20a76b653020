//! The service's error type and its single mapping to HTTP.
//!
//! Every failure a handler can produce is an [`ApiError`]; its one
//! [`IntoResponse`] implementation decides the status, the stable `code` and
//! the client-safe `detail`, and logs the original error once (5xx at
//! `error`, 4xx at `debug`). Responses are RFC 9457 problem details
//! (`application/problem+json`):
//!
//! ```json
//! {"type": "urn:tollgate:problem:insufficient_balance", "title": "Insufficient balance",
//!  "status": 409, "detail": "account 1 has 5 units available, 10 requested",
//!  "code": "insufficient_balance"}
//! ```
//!
//! # Status mapping
//!
//! Allocator errors keep the core's code ([`AllocatorError::code`]):
//!
//! | code | status |
//! |---|---|
//! | `invalid_units`, `invalid_ttl`, `unrepresentable_expiry`, `invalid_consumed`, `invalid_account_name`, `duplicate_lease`, `lease_account_mismatch`, `invalid_lease_count`, `invalid_limit` | 422 |
//! | `invalid_idempotency_key` | 400 (it is a header) |
//! | `account_not_found`, `lease_not_found` | 404 |
//! | `capability_mismatch` | 403 (the presented credential does not authorize the lease; see [`crate::auth`]) |
//! | `insufficient_balance`, `units_overflow`, `lease_not_active`, `lease_reclaimable`, `idempotency_conflict` | 409 |
//! | `storage_unavailable`, `retry_exhausted` | 503 |
//! | `policy_mismatch`, `horizon_exceeded` | 503 (the detail is the store's message, with what to do) |
//! | `storage_failure`, `invalid_stored_instant` | 500 |
//!
//! `policy_mismatch` (this process's grant policy is no longer the recorded
//! one: it started before a `tollgate policy set`) and `horizon_exceeded`
//! (a lease whose expiry plus grace would pass the safe expiry cut plus the
//! sealed horizon) are refusals of the database's lease-write guard: the
//! request changed nothing and may succeed on a process started with the
//! recorded policy. Their detail is the store's message, which names the
//! policies or the exact instants and durations and tells the operator
//! what to do (it holds no host, SQL or credential).
//!
//! The service adds its own codes ([`SERVICE_CODES`]): `unauthenticated`
//! 401, `forbidden` 403, `invalid_json` 400 (not JSON at all),
//! `invalid_body` 422 (JSON of the wrong shape: unknown or missing fields,
//! wrong types, integers out of range, unparseable instants or durations),
//! `unsupported_media_type` 415, `payload_too_large` 413, `invalid_path` 400,
//! `invalid_header` 400, `not_found` 404 (no such route),
//! `method_not_allowed` 405, `test_clock_disabled` 409, `body_timeout` 408
//! (the client did not send its announced body in time), `not_ready` 503
//! (only `/readyz`), `clock_unavailable` 503 (the clock could not be read
//! at all: the safe-cut clock's database read failed), `time_uncertain` 503
//! and `request_timeout` 503.
//!
//! `time_uncertain` (only with `--clock safe-cut`): the safe expiry cut is
//! uncertain, so acquire, consolidation and `POST /v1/admin/reclaim` are
//! refused and change nothing (release and renewal still work, at the cut).
//! The response carries `Retry-After` (whole seconds: the sampling-gap
//! bound rounded up, at least 1) and one extension member, `reason`: the
//! stable code of [`tollgate::safe_time::UncertainReason`] (`no_cut`,
//! `stale`, `new_epoch`, `clock_step_forward`, ...):
//!
//! ```json
//! {"type": "urn:tollgate:problem:time_uncertain", "title": "Time uncertain", "status": 503,
//!  "detail": "the safe expiry cut is uncertain (stale): nothing that admits or expires a deadline runs until it is certain again; retry later",
//!  "code": "time_uncertain", "reason": "stale"}
//! ```
//!
//! The only 5xx responses are failures of the backend (storage, the time
//! source, or a request that exceeded its time bound because the backend
//! was slow) and the lease-write guard's refusals above; bad input of any
//! kind is a 4xx. Backend details are logged, never sent: every other 5xx
//! `detail` is a fixed sentence.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tollgate::safe_time::UncertainReason;
use tollgate::{AllocatorError, RuleError, StorageError};

use crate::clock::ClockError;

/// The media type of every error response.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Every failure a request can end in; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// An allocator error, mapped by its stable code.
    #[error(transparent)]
    Storage(#[from] AllocatorError),
    /// No usable `Authorization: Bearer` credential.
    #[error("a bearer credential is required")]
    Unauthenticated,
    /// A credential that may not perform this operation (only for operations
    /// whose refusal reveals nothing about any object).
    #[error("this credential may not perform this operation")]
    Forbidden,
    /// The body is not JSON.
    #[error("{0}")]
    InvalidJson(String),
    /// The body is JSON of the wrong shape.
    #[error("{0}")]
    InvalidBody(String),
    /// A body was sent with a content type other than JSON.
    #[error("request bodies must be application/json")]
    UnsupportedMediaType,
    /// The body exceeded the limit.
    #[error("request body exceeds {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// A path parameter is not a valid id.
    #[error("{0}")]
    InvalidPath(String),
    /// A header is malformed.
    #[error("{0}")]
    InvalidHeader(String),
    /// No route matches.
    #[error("no such resource")]
    NotFound,
    /// The route exists but not with this method.
    #[error("method not allowed on this resource")]
    MethodNotAllowed,
    /// `PUT /v1/admin/test-clock` on a server not started with `--clock test`.
    #[error("the test clock is disabled; start the server with --clock test")]
    TestClockDisabled,
    /// The time source could not be read at all.
    #[error(transparent)]
    Clock(#[from] ClockError),
    /// The clock's reading is uncertain and the operation admits new
    /// deadline-bearing work (or reclaims): refused, nothing written.
    #[error(
        "the safe expiry cut is uncertain ({reason}): nothing that admits or expires a deadline runs until it is certain again; retry later"
    )]
    TimeUncertain {
        /// Why the cut is uncertain.
        reason: UncertainReason,
        /// The `Retry-After` to send, whole seconds.
        retry_after_secs: u64,
    },
    /// The request did not finish within its time bound.
    #[error("request did not finish within {0:?}")]
    Timeout(std::time::Duration),
    /// The client did not send its announced body within the time bound.
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// `/readyz`: the service is not ready.
    #[error("{0}")]
    NotReady(String),
}

/// The service's own codes and their statuses (allocator codes are in
/// [`AllocatorError::CODES`] and mapped by [`storage_status`]).
pub const SERVICE_CODES: &[(&str, u16)] = &[
    ("unauthenticated", 401),
    ("forbidden", 403),
    ("invalid_json", 400),
    ("invalid_body", 422),
    ("unsupported_media_type", 415),
    ("payload_too_large", 413),
    ("invalid_path", 400),
    ("invalid_header", 400),
    ("not_found", 404),
    ("method_not_allowed", 405),
    ("test_clock_disabled", 409),
    ("clock_unavailable", 503),
    ("time_uncertain", 503),
    ("request_timeout", 503),
    ("body_timeout", 408),
    ("not_ready", 503),
];

/// The HTTP status of an allocator error (see the module table).
pub fn storage_status(e: &AllocatorError) -> StatusCode {
    use RuleError as E;
    use StorageError as S;
    let e = match e {
        AllocatorError::Rule(e) => e,
        AllocatorError::Storage(
            S::Unavailable { .. }
            | S::RetryExhausted { .. }
            | S::PolicyMismatch(_)
            | S::HorizonExceeded { .. },
        ) => {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        AllocatorError::Storage(S::Failure { .. } | S::InvalidStoredInstant(_)) => {
            return StatusCode::INTERNAL_SERVER_ERROR;
        }
    };
    match e {
        E::InvalidUnits { .. }
        | E::InvalidTtl { .. }
        | E::UnrepresentableExpiry { .. }
        | E::InvalidConsumed { .. }
        | E::InvalidAccountName { .. }
        | E::DuplicateLease { .. }
        | E::LeaseAccountMismatch { .. }
        | E::InvalidLeaseCount { .. }
        | E::InvalidLimit { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        E::InvalidIdempotencyKey { .. } => StatusCode::BAD_REQUEST,
        E::AccountNotFound { .. } | E::LeaseNotFound { .. } => StatusCode::NOT_FOUND,
        E::CapabilityMismatch => StatusCode::FORBIDDEN,
        E::InsufficientBalance { .. }
        | E::UnitsOverflow { .. }
        | E::LeaseNotActive { .. }
        | E::LeaseReclaimable { .. }
        | E::IdempotencyConflict => StatusCode::CONFLICT,
        E::CorruptHolding { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> ApiError {
        ApiError::Storage(e.into())
    }
}

impl ApiError {
    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Storage(e) => e.code(),
            ApiError::Unauthenticated => "unauthenticated",
            ApiError::Forbidden => "forbidden",
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::InvalidBody(_) => "invalid_body",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::InvalidPath(_) => "invalid_path",
            ApiError::InvalidHeader(_) => "invalid_header",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::TestClockDisabled => "test_clock_disabled",
            ApiError::Clock(_) => "clock_unavailable",
            ApiError::TimeUncertain { .. } => "time_uncertain",
            ApiError::Timeout(_) => "request_timeout",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::NotReady(_) => "not_ready",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Storage(e) => storage_status(e),
            ApiError::Unauthenticated => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::InvalidJson(_) | ApiError::InvalidPath(_) | ApiError::InvalidHeader(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::InvalidBody(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TestClockDisabled => StatusCode::CONFLICT,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Clock(_)
            | ApiError::TimeUncertain { .. }
            | ApiError::Timeout(_)
            | ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The detail sent to the client: the error's message for 4xx and for
    /// the lease-write guard's refusals (`policy_mismatch`,
    /// `horizon_exceeded`: the message says what to do), a fixed sentence
    /// for every other 5xx (backend messages may name hosts or SQL).
    pub fn client_detail(&self) -> String {
        match self {
            ApiError::Storage(AllocatorError::Storage(StorageError::Unavailable { .. })) => {
                "the storage backend is unavailable; retry later".into()
            }
            ApiError::Storage(AllocatorError::Storage(
                StorageError::Failure { .. } | StorageError::InvalidStoredInstant(_),
            ))
            | ApiError::Storage(AllocatorError::Rule(RuleError::CorruptHolding { .. })) => {
                "the storage backend failed; the operation changed nothing".into()
            }
            other => other.to_string(),
        }
    }

    /// The problem document of this error.
    pub fn problem(&self) -> Problem {
        let status = self.status();
        let code = self.code();
        Problem {
            problem_type: format!("urn:tollgate:problem:{code}"),
            title: title_of(code),
            status: status.as_u16(),
            detail: self.client_detail(),
            code: code.to_string(),
            reason: match self {
                ApiError::TimeUncertain { reason, .. } => Some(reason.code().to_string()),
                _ => None,
            },
        }
    }
}

/// A human title per code: the code with its first letter capitalised and
/// underscores as spaces (`lease_reclaimable` -> `Lease reclaimable`).
fn title_of(code: &str) -> String {
    let mut t = code.replace('_', " ");
    if let Some(first) = t.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    t
}

/// The problem code of an error response, carried as a response extension
/// so request tracking can count errors by code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub &'static str);

/// An RFC 9457 problem document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    /// `urn:tollgate:problem:<code>`.
    #[serde(rename = "type")]
    pub problem_type: String,
    /// A short human summary of the code.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened, for humans.
    pub detail: String,
    /// The stable machine-readable code.
    pub code: String,
    /// Only with `time_uncertain`: why the safe expiry cut is uncertain
    /// (`no_cut`, `stale`, `new_epoch`, `primary_change`, `in_recovery`,
    /// `clock_step_forward`, `clock_step_backward`,
    /// `implausible_observation`, `sampling_gap`, `recovering`,
    /// `initial_quarantine`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(code = problem.code, error = %self, "request failed");
        } else {
            tracing::debug!(code = problem.code, error = %self, "request refused");
        }
        let body = match serde_json::to_vec(&problem) {
            Ok(b) => b,
            // A struct of strings and an integer always serializes.
            Err(_) => b"{}".to_vec(),
        };
        let mut resp = (status, body).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        resp.extensions_mut().insert(ErrorCode(self.code()));
        if let ApiError::TimeUncertain {
            retry_after_secs, ..
        } = &self
            && let Ok(v) = HeaderValue::from_str(&retry_after_secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tollgate\""),
            );
        }
        resp
    }
}
