//! The request-level refusals every router shares.

use std::time::Duration;

use axum::http::StatusCode;

/// A request refused before (or instead of) reaching its handler's domain
/// call: the credential, body, path, a header, the route, a time bound, or
/// (written by the connection layer, [`crate::server`]) the request head
/// or the connection bound. Every variant is the client's doing except
/// [`Rejection::Timeout`] (the service was too slow) and
/// [`Rejection::TooManyConnections`] (the service is full). Messages are
/// the client-facing detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// No usable `Authorization: Bearer` credential.
    #[error("a bearer credential is required")]
    Unauthenticated,
    /// The body is not JSON (or is missing where one is required).
    #[error("{0}")]
    InvalidJson(String),
    /// The body is JSON of the wrong shape (unknown or missing fields, wrong
    /// types, integers out of range, unparseable values), naming the field
    /// path.
    #[error("{0}")]
    InvalidBody(String),
    /// A body was sent with a content type other than JSON, or JSON in a
    /// charset other than UTF-8.
    #[error("request bodies must be application/json in UTF-8")]
    UnsupportedMediaType,
    /// The body exceeded the service's limit (or its stream broke).
    #[error("request body exceeds {limit_bytes} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit_bytes: usize,
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
    /// Handling the request did not finish within the bound.
    #[error("request did not finish within {0:?}")]
    Timeout(Duration),
    /// The client did not send its announced body within the bound.
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    /// Every connection the service may hold is busy (running a handler or
    /// writing a response); the connection is closed after this answer.
    #[error(
        "the service is at its connection bound with every connection busy; retry in {retry_after_secs} s"
    )]
    TooManyConnections {
        /// The `Retry-After` to send, whole seconds.
        retry_after_secs: u64,
    },
    /// The request head is not HTTP/1.1 (a malformed request line or
    /// header field).
    #[error("the request head is malformed")]
    MalformedRequest,
    /// The request target is longer than the HTTP parser takes
    /// ([`crate::server::REQUEST_TARGET_MAX_BYTES`]).
    #[error("the request target is longer than {max} bytes", max = crate::server::REQUEST_TARGET_MAX_BYTES)]
    UriTooLong,
    /// The request head has too many header fields
    /// ([`crate::server::HEADER_FIELDS_MAX`]) or too many bytes
    /// ([`crate::server::READ_BUFFER_MAX_BYTES`]).
    #[error(
        "the request head has more than {fields} header fields or more than {bytes} bytes",
        fields = crate::server::HEADER_FIELDS_MAX,
        bytes = crate::server::READ_BUFFER_MAX_BYTES
    )]
    HeaderFieldsTooLarge,
    /// The handler panicked: a bug of the service, answered as a 500
    /// problem instead of a dropped connection. The panic is logged where
    /// it is caught ([`crate::middleware::service_router`]); the client
    /// gets a fixed sentence.
    #[error("the service failed while handling this request")]
    Panicked,
}

impl Rejection {
    /// Every code of this type and its status, in variant order.
    pub const CODES: &'static [(&'static str, u16)] = &[
        ("unauthenticated", 401),
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
        ("internal_failure", 500),
    ];

    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::Unauthenticated => "unauthenticated",
            Rejection::InvalidJson(_) => "invalid_json",
            Rejection::InvalidBody(_) => "invalid_body",
            Rejection::UnsupportedMediaType => "unsupported_media_type",
            Rejection::PayloadTooLarge { .. } => "payload_too_large",
            Rejection::InvalidPath(_) => "invalid_path",
            Rejection::InvalidHeader(_) => "invalid_header",
            Rejection::NotFound => "not_found",
            Rejection::MethodNotAllowed => "method_not_allowed",
            Rejection::Timeout(_) => "request_timeout",
            Rejection::BodyTimeout(_) => "body_timeout",
            Rejection::TooManyConnections { .. } => "too_many_connections",
            Rejection::MalformedRequest => "malformed_request",
            Rejection::UriTooLong => "uri_too_long",
            Rejection::HeaderFieldsTooLarge => "header_fields_too_large",
            Rejection::Panicked => "internal_failure",
        }
    }

    /// The HTTP status: 4xx for everything the client did, 503 for a
    /// handler that outlasted its bound and for a service at its
    /// connection bound.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Unauthenticated => StatusCode::UNAUTHORIZED,
            Rejection::InvalidJson(_)
            | Rejection::InvalidPath(_)
            | Rejection::InvalidHeader(_)
            | Rejection::MalformedRequest => StatusCode::BAD_REQUEST,
            Rejection::InvalidBody(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Rejection::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Rejection::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::NotFound => StatusCode::NOT_FOUND,
            Rejection::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Rejection::Timeout(_) | Rejection::TooManyConnections { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Rejection::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Rejection::UriTooLong => StatusCode::URI_TOO_LONG,
            Rejection::HeaderFieldsTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Rejection::Panicked => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `Retry-After` to send, in whole seconds: only with
    /// [`Rejection::TooManyConnections`].
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Rejection::TooManyConnections { retry_after_secs } => Some(*retry_after_secs),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One rejection per variant, in variant order.
    fn every_rejection() -> Vec<Rejection> {
        let d = Duration::from_millis(50);
        vec![
            Rejection::Unauthenticated,
            Rejection::InvalidJson("x".into()),
            Rejection::InvalidBody("x".into()),
            Rejection::UnsupportedMediaType,
            Rejection::PayloadTooLarge { limit_bytes: 65536 },
            Rejection::InvalidPath("x".into()),
            Rejection::InvalidHeader("x".into()),
            Rejection::NotFound,
            Rejection::MethodNotAllowed,
            Rejection::Timeout(d),
            Rejection::BodyTimeout(d),
            Rejection::TooManyConnections {
                retry_after_secs: 1,
            },
            Rejection::MalformedRequest,
            Rejection::UriTooLong,
            Rejection::HeaderFieldsTooLarge,
            Rejection::Panicked,
        ]
    }

    #[test]
    fn codes_table_matches_every_variant() {
        let table: Vec<(&str, u16)> = every_rejection()
            .iter()
            .map(|r| (r.code(), r.status().as_u16()))
            .collect();
        assert_eq!(table, Rejection::CODES);
    }

    #[test]
    fn messages() {
        let d = Duration::from_millis(50);
        for (r, message) in [
            (
                Rejection::Unauthenticated,
                "a bearer credential is required",
            ),
            (
                Rejection::UnsupportedMediaType,
                "request bodies must be application/json in UTF-8",
            ),
            (
                Rejection::PayloadTooLarge { limit_bytes: 65536 },
                "request body exceeds 65536 bytes",
            ),
            (Rejection::NotFound, "no such resource"),
            (
                Rejection::MethodNotAllowed,
                "method not allowed on this resource",
            ),
            (Rejection::Timeout(d), "request did not finish within 50ms"),
            (
                Rejection::BodyTimeout(d),
                "the request body did not arrive within 50ms",
            ),
            (
                Rejection::TooManyConnections {
                    retry_after_secs: 1,
                },
                "the service is at its connection bound with every connection busy; retry in 1 s",
            ),
            (Rejection::MalformedRequest, "the request head is malformed"),
            (
                Rejection::UriTooLong,
                "the request target is longer than 65534 bytes",
            ),
            (
                Rejection::HeaderFieldsTooLarge,
                "the request head has more than 100 header fields or more than 417792 bytes",
            ),
        ] {
            assert_eq!(r.to_string(), message);
        }
    }

    #[test]
    fn retry_after_only_over_the_connection_bound() {
        for r in every_rejection() {
            let expected = matches!(r, Rejection::TooManyConnections { .. }).then_some(1);
            assert_eq!(r.retry_after_secs(), expected, "{r:?}");
        }
    }
}
