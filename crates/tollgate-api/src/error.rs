//! The service's error type and its single mapping to HTTP.
//!
//! Every failure a handler can produce is an [`ApiError`]; its one
//! [`IntoResponse`] implementation decides the status, the stable `code` and
//! the client-safe `detail`, and logs the original error once at
//! [`ApiError::log_level`] (storage and time-source faults at `error`,
//! refusals by the rules at `info` or `warn`, 4xx at `debug`). Responses are RFC 9457 problem details
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
//! The service adds its own codes ([`SERVICE_CODES`]; the request-level
//! ones, from `unauthenticated` to `body_timeout` and the connection
//! layer's four, are every router's and come from [`httpkit::Rejection`]):
//! `unauthenticated`
//! 401, `forbidden` 403, `invalid_json` 400 (not JSON at all),
//! `invalid_body` 422 (JSON of the wrong shape: unknown or missing fields,
//! wrong types, integers out of range, unparseable instants or durations),
//! `unsupported_media_type` 415, `payload_too_large` 413, `invalid_path` 400,
//! `invalid_header` 400, `not_found` 404 (no such route),
//! `method_not_allowed` 405, `test_clock_disabled` 409, `body_timeout` 408
//! (the client did not send its announced body in time), `not_ready` 503
//! (only `/readyz`), `clock_unavailable` 503 (the clock could not be read
//! at all: the safe-cut clock found no readable cut, e.g. the safe-time
//! tables are missing; a database that does not answer is
//! `storage_unavailable`, on every route and clock alike), `time_uncertain` 503
//! and `request_timeout` 503. The connection layer ([`httpkit::server`])
//! writes four more outside any route: `too_many_connections` 503 (with
//! `Retry-After`: every connection the service may hold is busy),
//! `malformed_request` 400, `uri_too_long` 414 and
//! `header_fields_too_large` 431 (a request head the HTTP parser refused).
//! Any route answers `internal_failure` 500 when its handler panicked (a
//! bug, answered and logged rather than a dropped connection).
//!
//! `time_uncertain` (only with `--clock safe-cut`): the safe expiry cut is
//! uncertain, so acquire, consolidation and `POST /v1/admin/reclaim` are
//! refused and change nothing (release and renewal still work, at the cut).
//! The response carries `Retry-After` (whole seconds: the sampling-gap
//! bound rounded up, at least 1) and one extension member, `reason`: the
//! stable code of [`safetime::UncertainReason`] (`no_cut`,
//! `stale`, `new_epoch`, `clock_step_forward`, ...):
//!
//! ```json
//! {"type": "urn:tollgate:problem:time_uncertain", "title": "Time uncertain", "status": 503,
//!  "detail": "the safe expiry cut is uncertain (stale): nothing that admits or expires a deadline runs until it is certain again; retry later",
//!  "code": "time_uncertain", "reason": "stale"}
//! ```
//!
//! With reason `initial_quarantine` ([`ApiError::Quarantined`]) the detail
//! instead says how much uninterrupted trusted time the quarantine still
//! needs (the sealed horizon plus the samplers' drift allowance, less the
//! database time since the proof began) and how to shorten it safely:
//! stop every sampler, seal a shorter horizon, start the samplers again.
//!
//! The only 5xx responses are failures of the backend (storage, the time
//! source, or a request that exceeded its time bound because the backend
//! was slow) and the lease-write guard's refusals above; bad input of any
//! kind is a 4xx. Backend details are logged, never sent: every other 5xx
//! `detail` is a fixed sentence.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use clock::{ClockError, UncertainReason};
pub use httpkit::{ErrorCode, PROBLEM_JSON, Problem};
use httpkit::{ProblemSource, Rejection};
use tollgate::{AllocatorError, RuleError, StorageError};

/// Every failure a request can end in; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// An allocator error, mapped by its stable code.
    #[error(transparent)]
    Storage(#[from] AllocatorError),
    /// A request refused before its domain call (no credential, a malformed
    /// body, path id or header, no such route or method, a time bound), with
    /// the code every router gives it.
    #[error(transparent)]
    Request(#[from] Rejection),
    /// A credential that may not perform this operation (only for operations
    /// whose refusal reveals nothing about any object).
    #[error("this credential may not perform this operation")]
    Forbidden,
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
    /// [`ApiError::TimeUncertain`] for the initial quarantine (reason
    /// `initial_quarantine`), whose detail also says how much trusted time
    /// the quarantine still needs and how to shorten it safely.
    #[error(
        "the safe expiry cut is uncertain (initial_quarantine): nothing that admits or expires a deadline runs until it is certain again; {progress}"
    )]
    Quarantined {
        /// The quarantine's progress and what to do, one sentence.
        progress: String,
        /// The `Retry-After` to send, whole seconds.
        retry_after_secs: u64,
    },
    /// `/readyz`: the service is not ready.
    #[error("{0}")]
    NotReady(String),
}

/// The service's own codes and their statuses (allocator codes are in
/// [`AllocatorError::CODES`] and mapped by [`storage_status`]); those of
/// [`Rejection::CODES`] among them.
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
    ("too_many_connections", 503),
    ("malformed_request", 400),
    ("uri_too_long", 414),
    ("header_fields_too_large", 431),
    ("internal_failure", 500),
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
        // Transient: the cut is too stale for the horizon to hold the new
        // deadline; a retry once it is fresh again succeeds.
        E::DeadlineBeyondHorizon { .. } => StatusCode::SERVICE_UNAVAILABLE,
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
            ApiError::Request(r) => r.code(),
            ApiError::Forbidden => "forbidden",
            ApiError::TestClockDisabled => "test_clock_disabled",
            ApiError::Clock(ClockError::StorageUnavailable(_)) => "storage_unavailable",
            ApiError::Clock(_) => "clock_unavailable",
            ApiError::TimeUncertain { .. } | ApiError::Quarantined { .. } => "time_uncertain",
            ApiError::NotReady(_) => "not_ready",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Storage(e) => storage_status(e),
            ApiError::Request(r) => r.status(),
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::TestClockDisabled => StatusCode::CONFLICT,
            ApiError::Clock(_)
            | ApiError::TimeUncertain { .. }
            | ApiError::Quarantined { .. }
            | ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The detail sent to the client: the error's message for 4xx and for
    /// the lease-write guard's refusals (`policy_mismatch`,
    /// `horizon_exceeded`: the message says what to do), a fixed sentence
    /// for every other 5xx (backend messages may name hosts or SQL).
    pub fn client_detail(&self) -> String {
        match self {
            ApiError::Storage(AllocatorError::Storage(StorageError::Unavailable { .. }))
            | ApiError::Clock(ClockError::StorageUnavailable(_)) => {
                "the storage backend is unavailable; retry later".into()
            }
            ApiError::Storage(AllocatorError::Storage(
                StorageError::Failure { .. } | StorageError::InvalidStoredInstant(_),
            ))
            | ApiError::Storage(AllocatorError::Rule(RuleError::CorruptHolding { .. })) => {
                "the storage backend failed; the operation changed nothing".into()
            }
            ApiError::Request(r @ Rejection::InvalidBody(_)) => {
                without_position(&r.to_string()).to_string()
            }
            other => other.to_string(),
        }
    }

    /// The level the response logs this error at: refusals by the rules
    /// are not faults, so every `time_uncertain` (the cut is uncertain, in
    /// the initial quarantine or after: expected while a sampler proves or
    /// recovers) at `INFO`; the lease-write guard's
    /// refusals and a deadline beyond the horizon (`policy_mismatch`,
    /// `horizon_exceeded`, `deadline_beyond_horizon`: an operator must act)
    /// and `not_ready` at `WARN`; every other 5xx (storage, the time
    /// source, a request over its time bound) at `ERROR`; 4xx at `DEBUG`.
    pub fn log_level(&self) -> tracing::Level {
        use tracing::Level;
        match self {
            ApiError::TimeUncertain { .. } | ApiError::Quarantined { .. } => Level::INFO,
            ApiError::NotReady(_)
            | ApiError::Storage(AllocatorError::Storage(
                StorageError::PolicyMismatch(_) | StorageError::HorizonExceeded { .. },
            ))
            | ApiError::Storage(AllocatorError::Rule(RuleError::DeadlineBeyondHorizon {
                ..
            })) => Level::WARN,
            other if other.status().is_server_error() => Level::ERROR,
            _ => Level::DEBUG,
        }
    }

    /// The problem document of this error.
    pub fn problem(&self) -> Problem {
        Problem::of(self)
    }
}

impl ProblemSource for ApiError {
    const TYPE_PREFIX: &'static str = "urn:tollgate:problem:";
    const WWW_AUTHENTICATE: &'static str = "Bearer realm=\"tollgate\"";

    fn status(&self) -> StatusCode {
        ApiError::status(self)
    }

    fn code(&self) -> &'static str {
        ApiError::code(self)
    }

    fn client_detail(&self) -> String {
        ApiError::client_detail(self)
    }

    fn reason(&self) -> Option<&'static str> {
        match self {
            ApiError::TimeUncertain { reason, .. } => Some(reason.code()),
            ApiError::Quarantined { .. } => Some(UncertainReason::InitialQuarantine.code()),
            _ => None,
        }
    }

    fn log_level(&self) -> tracing::Level {
        ApiError::log_level(self)
    }

    fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ApiError::TimeUncertain {
                retry_after_secs, ..
            }
            | ApiError::Quarantined {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            ApiError::Request(r) => r.retry_after_secs(),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        httpkit::problem_response(&self)
    }
}

/// `detail` without the JSON parser's trailing position (` at line 1
/// column 34`): a body field's error names the field, and the client may
/// never have seen the body as text.
fn without_position(detail: &str) -> &str {
    let Some((head, tail)) = detail.rsplit_once(" at line ") else {
        return detail;
    };
    match tail.split_once(" column ") {
        Some((line, column))
            if !line.is_empty()
                && !column.is_empty()
                && line.bytes().all(|b| b.is_ascii_digit())
                && column.bytes().all(|b| b.is_ascii_digit()) =>
        {
            head
        }
        _ => detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request-level codes are the service's too, at the same status.
    #[test]
    fn service_codes_include_every_rejection() {
        for (code, status) in Rejection::CODES {
            assert_eq!(
                SERVICE_CODES.iter().find(|(c, _)| c == code),
                Some(&(*code, *status)),
                "{code}"
            );
        }
    }

    /// Every service variant's code is in the table, at its status.
    #[test]
    fn service_variants_match_the_table() {
        let errors = [
            ApiError::Forbidden,
            ApiError::TestClockDisabled,
            ApiError::Clock(ClockError::Unavailable("down".into())),
            ApiError::TimeUncertain {
                reason: UncertainReason::Stale,
                retry_after_secs: 2,
            },
            ApiError::Quarantined {
                progress: "it needs an hour more".into(),
                retry_after_secs: 2,
            },
            ApiError::NotReady("not ready".into()),
            ApiError::Request(Rejection::NotFound),
        ];
        for e in errors {
            assert!(
                SERVICE_CODES.contains(&(e.code(), e.status().as_u16())),
                "{e:?}"
            );
        }
        assert_eq!(
            ApiError::TimeUncertain {
                reason: UncertainReason::Stale,
                retry_after_secs: 2,
            }
            .problem()
            .reason
            .as_deref(),
            Some("stale")
        );
    }

    /// A safe-cut clock whose database does not answer is answered like
    /// the store's own outage: the same code, status and detail.
    #[test]
    fn an_unanswering_clock_database_is_storage_unavailable() {
        let clock = ApiError::Clock(ClockError::StorageUnavailable("down".into())).problem();
        let store = ApiError::from(StorageError::Unavailable {
            message: "down".into(),
        })
        .problem();
        assert_eq!(
            (clock.code.as_str(), clock.status, clock.detail.as_str()),
            (
                "storage_unavailable",
                503,
                "the storage backend is unavailable; retry later"
            )
        );
        assert_eq!(clock, store);
    }

    /// Refusals by the rules are logged below `ERROR`; faults at `ERROR`.
    #[test]
    fn body_details_leave_out_the_parser_position() {
        assert_eq!(
            without_position("ttl: \"x\" is not a duration at line 1 column 10"),
            "ttl: \"x\" is not a duration"
        );
        assert_eq!(without_position("units: at line 1"), "units: at line 1");
        assert_eq!(
            without_position("name: at line x column 3"),
            "name: at line x column 3"
        );
        let detail = ApiError::Request(Rejection::InvalidBody(
            "missing field `units` at line 1 column 2".into(),
        ))
        .client_detail();
        assert_eq!(detail, "missing field `units`");
    }

    #[test]
    fn refusals_are_not_logged_as_faults() {
        use tracing::Level;
        let uncertain = ApiError::TimeUncertain {
            reason: UncertainReason::InitialQuarantine,
            retry_after_secs: 5,
        };
        assert_eq!(uncertain.log_level(), Level::INFO);
        let quarantined = ApiError::Quarantined {
            progress: "needs PT1H more trusted time".into(),
            retry_after_secs: 5,
        };
        assert_eq!(quarantined.log_level(), Level::INFO);
        let mismatch = ApiError::from(StorageError::PolicyMismatch("old policy".into()));
        assert_eq!(mismatch.log_level(), Level::WARN);
        let down = ApiError::from(StorageError::Unavailable {
            message: "down".into(),
        });
        assert_eq!(down.log_level(), Level::ERROR);
        assert_eq!(
            ApiError::Clock(ClockError::Unavailable("x".into())).log_level(),
            Level::ERROR
        );
        assert_eq!(ApiError::Forbidden.log_level(), Level::DEBUG);
    }
}
