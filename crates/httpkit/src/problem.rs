//! RFC 9457 problem documents and the one mapping from a service error to
//! its response.

use std::fmt;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// The media type of every error response.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// What a service error tells [`problem_response`]: its status, stable
/// code and client-safe detail, and the two response members some codes
/// carry. `Display` is the full message, which is logged and, for a 4xx,
/// normally also the detail.
pub trait ProblemSource: fmt::Display {
    /// The prefix of every problem `type` URI of the service; a problem's
    /// type is this prefix followed by its code (`urn:tollgate:problem:`).
    const TYPE_PREFIX: &'static str;

    /// The `WWW-Authenticate` challenge sent with every 401 (`Bearer
    /// realm="tollgate"`). Visible ASCII; checked when a 401 is first sent.
    const WWW_AUTHENTICATE: &'static str;

    /// The HTTP status.
    fn status(&self) -> StatusCode;

    /// The stable machine-readable code (`insufficient_balance`).
    fn code(&self) -> &'static str;

    /// The detail sent to the client: for a 5xx a fixed sentence, never a
    /// backend's message (it may name hosts or SQL).
    fn client_detail(&self) -> String;

    /// The `reason` extension member (`time_uncertain` only); `None` omits
    /// it.
    fn reason(&self) -> Option<&'static str> {
        None
    }

    /// The `Retry-After` header in whole seconds; `None` omits it.
    fn retry_after_secs(&self) -> Option<u64> {
        None
    }

    /// The level [`problem_response`] logs this error at: by default
    /// `ERROR` for a 5xx (a fault) and `DEBUG` for anything else. A
    /// service lowers it for a 5xx that is an expected refusal by its
    /// rules rather than a fault.
    fn log_level(&self) -> tracing::Level {
        if self.status().is_server_error() {
            tracing::Level::ERROR
        } else {
            tracing::Level::DEBUG
        }
    }
}

/// An RFC 9457 problem document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    /// The service's problem type prefix followed by the code (each service
    /// documents its prefix: [`crate::openapi::document_problems`]).
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

impl Problem {
    /// The problem document of `error`: type `E::TYPE_PREFIX` + code, the
    /// title derived from the code ([`title_of`]), the client detail.
    pub fn of<E: ProblemSource>(error: &E) -> Problem {
        let code = error.code();
        Problem {
            problem_type: format!("{}{code}", E::TYPE_PREFIX),
            title: title_of(code),
            status: error.status().as_u16(),
            detail: error.client_detail(),
            code: code.to_string(),
            reason: error.reason().map(str::to_string),
        }
    }
}

/// A human title per code: the code with its first letter capitalised and
/// underscores as spaces (`lease_reclaimable` -> `Lease reclaimable`).
pub fn title_of(code: &str) -> String {
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

/// The response for `error`: its status, the problem document as
/// `application/problem+json`, [`ErrorCode`] as an extension, `Retry-After`
/// when the error gives one and the service's `WWW-Authenticate` challenge
/// on a 401. Logs `error` once, at [`ProblemSource::log_level`] (by
/// default a 5xx at `error`, anything else at `debug`).
///
/// # Panics
/// When `E::WWW_AUTHENTICATE` is not a valid header value (a programming
/// error in the service's constant), on the first 401.
pub fn problem_response<E: ProblemSource>(error: &E) -> Response {
    let problem = Problem::of(error);
    let status = error.status();
    match error.log_level() {
        tracing::Level::ERROR => {
            tracing::error!(code = error.code(), error = %error, "request failed");
        }
        tracing::Level::WARN => {
            tracing::warn!(code = error.code(), error = %error, "request refused");
        }
        tracing::Level::INFO => {
            tracing::info!(code = error.code(), error = %error, "request refused");
        }
        _ => tracing::debug!(code = error.code(), error = %error, "request refused"),
    }
    let body = serde_json::to_vec(&problem)
        .expect("a problem document (strings, an integer and an optional string) serializes");
    let mut resp = (status, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if let Some(secs) = error.retry_after_secs() {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(E::WWW_AUTHENTICATE),
        );
    }
    resp.extensions_mut().insert(ErrorCode(error.code()));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Slow;

    impl fmt::Display for Slow {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("backend at db.internal did not answer")
        }
    }

    impl ProblemSource for Slow {
        const TYPE_PREFIX: &'static str = "urn:test:problem:";
        const WWW_AUTHENTICATE: &'static str = "Bearer realm=\"test\"";
        fn status(&self) -> StatusCode {
            StatusCode::SERVICE_UNAVAILABLE
        }
        fn code(&self) -> &'static str {
            "time_uncertain"
        }
        fn client_detail(&self) -> String {
            "retry later".into()
        }
        fn reason(&self) -> Option<&'static str> {
            Some("stale")
        }
        fn retry_after_secs(&self) -> Option<u64> {
            Some(3)
        }
    }

    #[test]
    fn titles() {
        for (code, title) in [
            ("lease_reclaimable", "Lease reclaimable"),
            ("x", "X"),
            ("", ""),
        ] {
            assert_eq!(title_of(code), title, "{code}");
        }
    }

    #[tokio::test]
    async fn response_carries_every_member() {
        use http_body_util::BodyExt;
        let resp = problem_response(&Slow);
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
        assert!(resp.headers().get(header::WWW_AUTHENTICATE).is_none());
        assert_eq!(
            resp.extensions().get::<ErrorCode>(),
            Some(&ErrorCode("time_uncertain"))
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"urn:test:problem:time_uncertain","title":"Time uncertain","status":503,"detail":"retry later","code":"time_uncertain","reason":"stale"}"#
        );
    }
}
