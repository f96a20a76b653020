//! The service's error type and its single mapping to HTTP.
//!
//! Every failure a handler can produce is an [`ApiError`]; its one
//! [`IntoResponse`] implementation ([`httpkit::problem_response`]) decides
//! the status, the stable `code` and the client-safe `detail`. Responses
//! are RFC 9457 problem documents (`application/problem+json`) whose `type`
//! is `urn:little-compute:problem:<code>`.
//!
//! # Status mapping
//!
//! Store and rule refusals keep the core's code ([`LcError::code`]):
//!
//! | code | status |
//! |---|---|
//! | `invalid_command`, `invalid_shape`, `invalid_runtime`, `invalid_timeout`, `invalid_units`, `invalid_name`, `invalid_limit`, `invalid_digest`, `invalid_provider_id`, `invalid_provider`, `invalid_page`, `invalid_transition_id`, `invalid_input`, `request_digest_mismatch`, `invalid_validity`, `invalid_approval_policy` | 422 |
//! | `invalid_operation_key` | 400 (it is a header) |
//! | `token_expired`, `token_revoked` | 401 (a scoped token a certain cut has passed the deadline of, or a revoked one: mint a new one) |
//! | `forbidden` (a scoped token's missing operation or bound exec) | 403 |
//! | `not_found` | 404 (also for another tenant's exec: existence never leaks) |
//! | `insufficient_capacity`, `units_overflow`, `idempotency_conflict`, `already_exists`, `exec_terminal`, `illegal_transition`, `fenced`, `page_conflict`, `owner_live`, `owner_stale`, `owner_expired`, `claim_live`, `claim_stale`, `transition_replay_refused`, `release_not_proven`, `stdin_not_open`, `input_closed`, `workspace_head_mismatch`, `competing_right`, `exec_not_parked`, `resume_refused`, `exec_not_hibernatable`, `hibernation_in_progress`, `resume_in_progress`, `exec_not_terminal`, `not_deleted`, `exec_not_awaiting_approval` | 409 |
//! | `workspace_deleted`, `output_deleted` (restorable: the detail names the undelete command and the purge instant), `workspace_purged`, `output_purged` | 410 |
//! | `rate_limited` | 429 with `Retry-After` (the tenant's admission rate on the cut) |
//! | `input_queue_full` | 429 with `Retry-After` [`INPUT_QUEUE_RETRY_AFTER_SECS`] (the exec's owner drains its input queue at its next step) |
//! | `time_uncertain` | 503 with `Retry-After` (and `reason` when the service read it) |
//! | `storage_unavailable`, `deadline_beyond_horizon`, `no_provider` | 503 (retry later; nothing was written) |
//! | `storage_failure`, `invalid_cut_reading`, `evidence_rejected`, `invalid_rate` | 500 (the service's fault, never the client's) |
//!
//! The service's own codes ([`SERVICE_CODES`], the request-level ones from
//! [`httpkit::Rejection`] among them): `unauthenticated` 401, `forbidden`
//! 403, `tenant_required` 400 (the admin token on a tenant route without
//! `Lc-Tenant`), `idempotency_key_required` 400 (a POST or DELETE without
//! `Idempotency-Key`), `invalid_query` 400, `invalid_tarball` 422 (a
//! runtime tarball the runtime store refused: absolute paths, `..`,
//! symlinks out of the tree, device files, too large),
//! `runtime_import_disabled` 409 (no runtime directory configured),
//! `entry_not_file` 409 (a snapshot's directory or symlink asked for as a
//! file), `blob_corrupt` 500 and `blob_missing` 500 (an output page's or
//! a snapshot file's blob that does not verify or is gone: never served),
//! `sink_unavailable` 503 (no blob directory, or it failed),
//! `clock_unavailable` 503, `not_ready` 503 (`/readyz` only), and the
//! request-level `invalid_json` 400, `invalid_body` 422,
//! `unsupported_media_type` 415, `payload_too_large` 413, `invalid_path`
//! 400, `invalid_header` 400, `not_found` 404 (no such route),
//! `method_not_allowed` 405, `request_timeout` 503, `body_timeout` 408 and
//! the connection layer's `too_many_connections` 503,
//! `malformed_request` 400, `uri_too_long` 414, `header_fields_too_large`
//! 431, and `internal_failure` 500 (also a handler's panic, answered and
//! logged).
//!
//! Backend details are logged, never sent: every 5xx `detail` is a fixed
//! sentence, except `time_uncertain`, `deadline_beyond_horizon` and
//! `no_provider`, whose message says what to wait for.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use clock::{ClockError, UncertainReason};
pub use httpkit::{ErrorCode, PROBLEM_JSON, Problem};
use httpkit::{ProblemSource, Rejection};
use lc_core::error::LcError;

/// The `Retry-After` of `input_queue_full`, whole seconds: a live gateway
/// steps about once a second and delivers a full queue in one step.
pub const INPUT_QUEUE_RETRY_AFTER_SECS: u64 = 1;

/// Every failure a request can end in; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A refusal of the rules or the store, mapped by its stable code.
    #[error(transparent)]
    Store(#[from] LcError),
    /// A request refused before its domain call, with the code every
    /// router gives it.
    #[error(transparent)]
    Request(#[from] Rejection),
    /// A bearer credential was sent but is neither the admin token nor a
    /// tenant API key the store knows (`unauthenticated`, 401, like a
    /// missing one, with a detail saying it was refused and what to
    /// check).
    #[error(
        "the bearer credential was not accepted: it is neither this service's admin token nor a tenant API key or scoped token it issued; check the token sent (lc takes it from --token, LC_TOKEN or the admin token file of --data-dir) and that it belongs to this control plane"
    )]
    CredentialRefused,
    /// The credential may not perform this operation (or act for this
    /// tenant).
    #[error("this credential may not perform this operation")]
    Forbidden,
    /// The admin token on a tenant route without `Lc-Tenant: N`.
    #[error("the admin token acts for a tenant named by the header Lc-Tenant: N")]
    TenantRequired,
    /// A POST or DELETE without `Idempotency-Key`.
    #[error(
        "every POST and DELETE needs an Idempotency-Key header (1 to 255 printable ASCII characters)"
    )]
    IdempotencyKeyRequired,
    /// A query string of the wrong shape.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// A runtime tarball the runtime store refused.
    #[error("invalid tarball: {0}")]
    InvalidTarball(String),
    /// A runtime tarball sent with another content type.
    #[error("a runtime is imported as an application/x-tar body")]
    TarRequired,
    /// The service has no runtime directory.
    #[error("runtime import is disabled: the service was started without --runtime-dir")]
    RuntimeImportDisabled,
    /// The time source could not be read at all.
    #[error(transparent)]
    Clock(#[from] ClockError),
    /// The cut is uncertain and the operation admits deadline-bearing work:
    /// refused, nothing written.
    #[error(
        "the safe expiry cut is uncertain{}: nothing that admits a deadline runs until it is certain again; retry in {retry_after_secs} s",
        .reason.map(|r| format!(" ({})", r.code())).unwrap_or_default()
    )]
    TimeUncertain {
        /// Why, when the service read it itself.
        reason: Option<UncertainReason>,
        /// The `Retry-After` to send, whole seconds (at least 1).
        retry_after_secs: u64,
    },
    /// `/readyz`: not ready.
    #[error("{0}")]
    NotReady(String),
    /// A fault of the service itself (a random source, a file system).
    #[error("internal failure: {0}")]
    Internal(String),
    /// An acknowledged page's bytes in the sink could not be served: the
    /// sink is not configured or failed (`sink_unavailable`, 503), the blob
    /// is missing (`blob_missing`, 500) or its bytes do not hash to its
    /// digest (`blob_corrupt`, 500). Nothing is served in place of them.
    #[error("output page {seq}: {message}")]
    Sink {
        /// The stable code.
        code: &'static str,
        /// The page.
        seq: i64,
        /// What failed.
        message: String,
    },
    /// A snapshot file's bytes could not be served: the blob store is not
    /// configured or failed (`sink_unavailable`, 503), the blob is missing
    /// (`blob_missing`, 500) or its bytes do not hash to the manifest's
    /// digest (`blob_corrupt`, 500). Nothing is served in place of them.
    #[error("snapshot file {path:?} (blob {digest}) cannot be served ({code})")]
    SnapshotFile {
        /// The stable code.
        code: &'static str,
        /// The file's path in the snapshot.
        path: String,
        /// The file's SHA-256 (its blob's name).
        digest: lc_core::Digest,
    },
    /// A snapshot entry asked for as a file that is a directory or a
    /// symlink (`entry_not_file`, 409).
    #[error(
        "{path:?} is a {kind} in snapshot {digest}, not a file; read the snapshot's tree (GET /v1/execs/{{id}}/snapshots/{digest}/tree) for its entries and a symlink's target"
    )]
    EntryNotFile {
        /// The entry's path.
        path: String,
        /// `directory` or `symlink`.
        kind: &'static str,
        /// The snapshot.
        digest: lc_core::Digest,
    },
}

/// The service's own codes and their statuses (store codes are mapped by
/// [`store_status`]); those of [`Rejection::CODES`] among them.
pub const SERVICE_CODES: &[(&str, u16)] = &[
    ("unauthenticated", 401),
    ("forbidden", 403),
    ("tenant_required", 400),
    ("idempotency_key_required", 400),
    ("invalid_query", 400),
    ("invalid_tarball", 422),
    ("runtime_import_disabled", 409),
    ("clock_unavailable", 503),
    ("time_uncertain", 503),
    ("not_ready", 503),
    ("internal_failure", 500),
    ("sink_unavailable", 503),
    ("blob_missing", 500),
    ("blob_corrupt", 500),
    ("entry_not_file", 409),
    ("invalid_json", 400),
    ("invalid_body", 422),
    ("unsupported_media_type", 415),
    ("payload_too_large", 413),
    ("invalid_path", 400),
    ("invalid_header", 400),
    ("not_found", 404),
    ("method_not_allowed", 405),
    ("request_timeout", 503),
    ("body_timeout", 408),
    ("too_many_connections", 503),
    ("malformed_request", 400),
    ("uri_too_long", 414),
    ("header_fields_too_large", 431),
];

/// The HTTP status of a store or rule refusal (see the module table).
pub fn store_status(e: &LcError) -> StatusCode {
    use LcError as E;
    match e {
        E::InvalidCommand { .. }
        | E::InvalidShape { .. }
        | E::InvalidRuntime { .. }
        | E::InvalidTimeout { .. }
        | E::InvalidUnits { .. }
        | E::InvalidName { .. }
        | E::InvalidLimit { .. }
        | E::InvalidProviderId { .. }
        | E::InvalidProvider { .. }
        | E::InvalidDigest { .. }
        | E::InvalidPage { .. }
        | E::InvalidTransitionId { .. }
        | E::InvalidInput { .. }
        | E::RequestDigestMismatch { .. }
        | E::InvalidTokenScope { .. }
        | E::InvalidValidity { .. }
        | E::InvalidApprovalPolicy { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        E::TokenExpired { .. } | E::TokenRevoked { .. } => StatusCode::UNAUTHORIZED,
        E::TokenScope { .. } => StatusCode::FORBIDDEN,
        E::InvalidOperationKey { .. } => StatusCode::BAD_REQUEST,
        E::NotFound { .. } => StatusCode::NOT_FOUND,
        E::InsufficientCapacity { .. }
        | E::UnitsOverflow { .. }
        | E::IdempotencyConflict { .. }
        | E::AlreadyExists { .. }
        | E::ExecTerminal { .. }
        | E::IllegalTransition { .. }
        | E::Fenced { .. }
        | E::PageConflict { .. }
        | E::OwnerLive { .. }
        | E::OwnerStale { .. }
        | E::OwnerExpired { .. }
        | E::ClaimLive { .. }
        | E::ClaimStale { .. }
        | E::TransitionReplayRefused { .. }
        | E::ReleaseNotProven { .. }
        | E::StdinNotOpen { .. }
        | E::InputClosed { .. }
        | E::WorkspaceHeadMismatch { .. }
        | E::CompetingRight { .. }
        | E::ExecNotParked { .. }
        | E::ResumeRefused { .. }
        | E::ExecNotHibernatable { .. }
        | E::HibernationInProgress { .. }
        | E::ResumeInProgress { .. }
        | E::ExecNotTerminal { .. }
        | E::NotDeleted { .. }
        | E::ExecNotAwaitingApproval { .. } => StatusCode::CONFLICT,
        E::ItemDeleted { .. } | E::ItemPurged { .. } => StatusCode::GONE,
        E::RateLimited { .. } | E::InputQueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
        E::TimeUncertain { .. }
        | E::StorageUnavailable { .. }
        | E::DeadlineBeyondHorizon { .. }
        | E::NoProvider => StatusCode::SERVICE_UNAVAILABLE,
        E::StorageFailure { .. }
        | E::InvalidCutReading { .. }
        | E::EvidenceRejected { .. }
        | E::InvalidRate { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ApiError {
    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Store(e) => e.code(),
            ApiError::Request(r) => r.code(),
            ApiError::CredentialRefused => "unauthenticated",
            ApiError::Forbidden => "forbidden",
            ApiError::TenantRequired => "tenant_required",
            ApiError::IdempotencyKeyRequired => "idempotency_key_required",
            ApiError::InvalidQuery(_) => "invalid_query",
            ApiError::InvalidTarball(_) => "invalid_tarball",
            ApiError::TarRequired => "unsupported_media_type",
            ApiError::RuntimeImportDisabled => "runtime_import_disabled",
            ApiError::Clock(_) => "clock_unavailable",
            ApiError::TimeUncertain { .. } => "time_uncertain",
            ApiError::NotReady(_) => "not_ready",
            ApiError::Internal(_) => "internal_failure",
            ApiError::Sink { code, .. } | ApiError::SnapshotFile { code, .. } => code,
            ApiError::EntryNotFile { .. } => "entry_not_file",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Store(e) => store_status(e),
            ApiError::Request(r) => r.status(),
            ApiError::CredentialRefused => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::TenantRequired
            | ApiError::IdempotencyKeyRequired
            | ApiError::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            ApiError::InvalidTarball(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::TarRequired => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RuntimeImportDisabled => StatusCode::CONFLICT,
            ApiError::Clock(_) | ApiError::TimeUncertain { .. } | ApiError::NotReady(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Sink { code, .. } if *code == "sink_unavailable" => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Sink { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::SnapshotFile { code, .. } if *code == "sink_unavailable" => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::SnapshotFile { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::EntryNotFile { .. } => StatusCode::CONFLICT,
        }
    }

    /// The detail sent to the client: the message for every 4xx and for
    /// the 503s that say what to wait for (`insufficient_capacity` and
    /// `idempotency_conflict` with the next step); a fixed sentence for
    /// the other 5xx (backend messages may name hosts or SQL). At most
    /// [`DETAIL_BYTES_MAX`] bytes ([`bounded_detail`]), so a refusal never
    /// echoes kilobytes of the request back.
    pub fn client_detail(&self) -> String {
        bounded_detail(self.full_detail())
    }

    fn full_detail(&self) -> String {
        match self {
            ApiError::Store(e @ LcError::InsufficientCapacity { .. }) => format!(
                "{e}; wait for the tenant's running execs to end (their units return) or cancel one, or have the admin deposit more units"
            ),
            ApiError::Store(e @ LcError::IdempotencyConflict { .. }) => format!(
                "{e}; send this request under a new Idempotency-Key, or repeat the original request to read its answer"
            ),
            ApiError::Store(LcError::StorageUnavailable { .. }) | ApiError::Clock(_) => {
                "the database is unavailable; retry later".into()
            }
            ApiError::Store(
                LcError::StorageFailure { .. }
                | LcError::InvalidCutReading { .. }
                | LcError::EvidenceRejected { .. },
            )
            | ApiError::Internal(_) => "the service failed; the operation changed nothing".into(),
            ApiError::Sink { code, seq, .. } => format!(
                "the bytes of output page {seq} cannot be served ({code}); retry later, or ask the operator to check the blob directory"
            ),
            ApiError::SnapshotFile {
                code: "blob_corrupt",
                path,
                digest,
            } => format!(
                "snapshot file {path:?} (blob {digest}) is corrupt: its stored bytes do not hash to the manifest's digest, so none are served; ask the operator to restore the blob from its source"
            ),
            ApiError::SnapshotFile { code, path, digest } => format!(
                "snapshot file {path:?} (blob {digest}) cannot be served ({code}); retry later, or ask the operator to check the blob directory"
            ),
            other => other.to_string(),
        }
    }

    /// The problem document of this error.
    pub fn problem(&self) -> Problem {
        Problem::of(self)
    }
}

/// The longest `detail` sent, in bytes. Details quote what was wrong
/// (a path id, a tarball entry's name, a query), and those parts of a
/// request may be kilobytes long.
pub const DETAIL_BYTES_MAX: usize = 1024;

/// Bytes kept from the start of a detail longer than [`DETAIL_BYTES_MAX`]
/// (what was refused, and how its quoted part begins).
pub const DETAIL_HEAD_BYTES: usize = 384;

/// Bytes kept from the end of such a detail (how the quoted part ends,
/// and the rule it broke).
pub const DETAIL_TAIL_BYTES: usize = 512;

/// `detail` within [`DETAIL_BYTES_MAX`]: unchanged when it fits, else its
/// first [`DETAIL_HEAD_BYTES`] and last [`DETAIL_TAIL_BYTES`] (each shrunk
/// to a character boundary) around `…[N bytes left out]…`.
pub fn bounded_detail(detail: String) -> String {
    if detail.len() <= DETAIL_BYTES_MAX {
        return detail;
    }
    let mut head = DETAIL_HEAD_BYTES;
    while !detail.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = detail.len() - DETAIL_TAIL_BYTES;
    while !detail.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}…[{} bytes left out]…{}",
        &detail[..head],
        tail - head,
        &detail[tail..]
    )
}

impl ProblemSource for ApiError {
    const TYPE_PREFIX: &'static str = "urn:little-compute:problem:";
    const WWW_AUTHENTICATE: &'static str = "Bearer realm=\"little-compute\"";

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
            ApiError::TimeUncertain { reason, .. } => reason.map(|r| r.code()),
            _ => None,
        }
    }

    fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ApiError::TimeUncertain {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            ApiError::Store(
                LcError::TimeUncertain { retry_after_s }
                | LcError::RateLimited { retry_after_s, .. },
            ) => Some((*retry_after_s).max(1)),
            ApiError::Store(LcError::InputQueueFull { .. }) => Some(INPUT_QUEUE_RETRY_AFTER_SECS),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_details_keep_their_start_and_end_within_the_bound() {
        let short = "x".repeat(DETAIL_BYTES_MAX);
        assert_eq!(bounded_detail(short.clone()), short);
        let long = format!("{}{}", "a".repeat(1000), "é".repeat(500));
        let b = bounded_detail(long.clone());
        assert_eq!(
            b,
            format!(
                "{}…[1104 bytes left out]…{}",
                "a".repeat(384),
                "é".repeat(256)
            )
        );
        assert!(b.len() <= DETAIL_BYTES_MAX);
        // A head that ends inside a character shrinks to its boundary.
        let split = format!("{}é{}", "a".repeat(383), "z".repeat(2000));
        assert!(bounded_detail(split).starts_with(&format!("{}…[", "a".repeat(383))));
    }

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

    #[test]
    fn service_variants_match_the_table() {
        let errors = [
            ApiError::CredentialRefused,
            ApiError::Forbidden,
            ApiError::TenantRequired,
            ApiError::IdempotencyKeyRequired,
            ApiError::InvalidQuery("x".into()),
            ApiError::InvalidTarball("x".into()),
            ApiError::TarRequired,
            ApiError::RuntimeImportDisabled,
            ApiError::Clock(ClockError::Unavailable("down".into())),
            ApiError::TimeUncertain {
                reason: Some(UncertainReason::Stale),
                retry_after_secs: 2,
            },
            ApiError::NotReady("x".into()),
            ApiError::Internal("x".into()),
        ];
        for e in errors {
            assert!(
                SERVICE_CODES.contains(&(e.code(), e.status().as_u16())),
                "{e:?}"
            );
        }
    }

    #[test]
    fn store_refusals_keep_their_codes() {
        for (e, code, status, retry) in [
            (
                LcError::InsufficientCapacity {
                    requested: 2,
                    available: 1,
                },
                "insufficient_capacity",
                409,
                None,
            ),
            (
                LcError::TimeUncertain { retry_after_s: 3 },
                "time_uncertain",
                503,
                Some(3),
            ),
            (
                LcError::RateLimited {
                    admissions_max: 600,
                    window: jiff::SignedDuration::from_secs(60),
                    retry_after_s: 7,
                },
                "rate_limited",
                429,
                Some(7),
            ),
            (
                LcError::IdempotencyConflict { key: "k".into() },
                "idempotency_conflict",
                409,
                None,
            ),
            (LcError::not_found("exec", 7), "not_found", 404, None),
            (
                LcError::InputQueueFull {
                    exec_id: lc_core::ExecId(3),
                    queued_inputs: 16,
                    queued_bytes: 32,
                    inputs_max: 16,
                    bytes_max: 262_144,
                },
                "input_queue_full",
                429,
                Some(1),
            ),
            (
                LcError::InputClosed {
                    exec_id: lc_core::ExecId(3),
                    eof_seq: 2,
                },
                "input_closed",
                409,
                None,
            ),
            (
                LcError::StdinNotOpen {
                    exec_id: lc_core::ExecId(3),
                },
                "stdin_not_open",
                409,
                None,
            ),
            (
                LcError::StorageFailure {
                    message: "host db.internal".into(),
                },
                "storage_failure",
                500,
                None,
            ),
        ] {
            let a = ApiError::Store(e);
            assert_eq!(
                (
                    a.code(),
                    a.status().as_u16(),
                    ProblemSource::retry_after_secs(&a)
                ),
                (code, status, retry)
            );
        }
        let hidden = ApiError::Store(LcError::StorageFailure {
            message: "host db.internal".into(),
        });
        assert_eq!(
            hidden.client_detail(),
            "the service failed; the operation changed nothing"
        );
    }
}
