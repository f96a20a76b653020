//! The layers around every service's routes: the request timeout, the body
//! limit and request tracking, assembled by [`service_router`].

use std::time::Instant;

use axum::Router;
use axum::body::{Body, HttpBody as _};
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use tower_http::catch_panic::CatchPanicLayer;

use crate::{ErrorCode, Rejection, ServiceState};

/// Where request tracking counts each finished request.
pub trait RequestMetrics {
    /// Counts one request: its method, `route` (the matched route template,
    /// or `unmatched`), response status and, for a problem response, its
    /// code ([`ErrorCode`]).
    fn count_request(
        &self,
        method: &Method,
        route: &str,
        status: StatusCode,
        error_code: Option<&'static str>,
    );

    /// Counts one answer the connection layer wrote itself, outside any
    /// route ([`crate::server`]): the refusal over the connection bound or
    /// the problem for a request head the HTTP parser refused, with its
    /// status and code. Default: not counted.
    fn count_refusal(&self, status: StatusCode, error_code: &'static str) {
        let _ = (status, error_code);
    }
}

/// Counts ([`RequestMetrics`]) and logs every request, labelled by the
/// matched route template; the log line is at `info`, with the elapsed
/// time in microseconds.
pub async fn track<S: RequestMetrics + Clone + Send + Sync + 'static>(
    State(s): State<S>,
    req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    let status = resp.status();
    let error_code = resp.extensions().get::<ErrorCode>().map(|c| c.0);
    s.count_request(&method, &route, status, error_code);
    tracing::info!(
        %method, route = %route, status = status.as_u16(),
        elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "request"
    );
    resp
}

/// Bounds each request's time: first the client's part, receiving the body
/// (at most [`ServiceState::request_timeout`], else 408
/// [`Rejection::BodyTimeout`]: a slow or truncated body is the client's
/// fault, never a 5xx), then the service's part, handling it (at most the
/// same bound again, else 503 [`Rejection::Timeout`]). The body is buffered
/// here, within [`ServiceState::body_max_bytes`] (else 413
/// [`Rejection::PayloadTooLarge`]), and handed on whole.
///
/// A body announced larger than the limit (a `Content-Length` above it,
/// or any body whose size hint's lower bound is) is refused with 413 at
/// once, before a byte of it is read, with `Connection: close` (the unread
/// body cannot be skipped on a kept-alive connection).
pub async fn timeout<S: ServiceState>(State(s): State<S>, req: Request, next: Next) -> Response {
    let bound = s.request_timeout();
    let limit_bytes = s.body_max_bytes();
    let refuse = |r: Rejection| S::Error::from(r).into_response();
    let (parts, body) = req.into_parts();
    if body.size_hint().lower() > u64::try_from(limit_bytes).unwrap_or(u64::MAX) {
        let mut resp = refuse(Rejection::PayloadTooLarge { limit_bytes });
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    let bytes = match tokio::time::timeout(bound, axum::body::to_bytes(body, limit_bytes)).await {
        Err(_) => return refuse(Rejection::BodyTimeout(bound)),
        // `to_bytes` fails on a body over the limit or a broken stream; both
        // are the client's.
        Ok(Err(_)) => return refuse(Rejection::PayloadTooLarge { limit_bytes }),
        Ok(Ok(bytes)) => bytes,
    };
    let req = Request::from_parts(parts, Body::from(bytes));
    match tokio::time::timeout(bound, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => refuse(Rejection::Timeout(bound)),
    }
}

/// The media type of the Prometheus text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A `/metrics` response: `text`, already in the Prometheus text format,
/// as [`PROMETHEUS_TEXT`].
pub fn metrics_response(text: String) -> Response {
    let mut resp = text.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(PROMETHEUS_TEXT),
    );
    resp
}

/// The answer to a handler's panic: logged once, here, then a 500
/// problem ([`Rejection::Panicked`]) of the service's error type.
fn panicked<S: ServiceState>(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    tracing::error!(panic = %message, "a handler panicked; answered 500 internal_failure");
    S::Error::from(Rejection::Panicked).into_response()
}

async fn not_found<S: ServiceState>() -> S::Error {
    Rejection::NotFound.into()
}

async fn method_not_allowed<S: ServiceState>() -> S::Error {
    Rejection::MethodNotAllowed.into()
}

/// A service's routes made whole: problem responses for unknown routes
/// (404 [`Rejection::NotFound`]) and methods (405
/// [`Rejection::MethodNotAllowed`], with `Allow`), then, from the inside
/// out, a handler's panic answered as 500 `internal_failure` (never a
/// dropped connection), the [`timeout`], the body limit and request tracking ([`track`],
/// outermost, so it sees every response, the timeout's included).
pub fn service_router<S: ServiceState + RequestMetrics>(routes: Router<S>, state: S) -> Router {
    routes
        .fallback(not_found::<S>)
        .method_not_allowed_fallback(method_not_allowed::<S>)
        .layer(CatchPanicLayer::custom(panicked::<S>))
        .layer(middleware::from_fn_with_state(state.clone(), timeout::<S>))
        .layer(DefaultBodyLimit::max(state.body_max_bytes()))
        .layer(middleware::from_fn_with_state(state.clone(), track::<S>))
        .with_state(state)
}
