//! Test support: requests through the real router with `oneshot` (no
//! sockets) and responses with their JSON.

#![allow(dead_code)]

pub mod pg;
pub mod ws;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use jiff::Timestamp;
use serde_json::{Value, json};
use tower::ServiceExt;

/// The admin token of every test service.
pub const ADMIN: &str = "lcadm-test-admin-token-0123456789";

/// The server secret of every test service.
pub const SECRET: [u8; 32] = [0x5a; 32];

/// A response: status, headers, body as JSON (or a JSON string).
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Resp {
    /// Asserts a problem response with `status` and `code`: the exact
    /// members, type and media type.
    #[track_caller]
    pub fn problem(&self, status: u16, code: &str) -> &Resp {
        assert_eq!(
            (self.status.as_u16(), self.body["code"].as_str()),
            (status, Some(code)),
            "body: {}",
            self.text
        );
        assert_eq!(
            self.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
        assert_eq!(self.body["status"], json!(status));
        assert_eq!(
            self.body["type"],
            json!(format!("urn:little-compute:problem:{code}"))
        );
        assert!(self.body["title"].is_string() && self.body["detail"].is_string());
        let members = if self.body.get("reason").is_some() {
            6
        } else {
            5
        };
        assert_eq!(
            self.body.as_object().map(|o| o.len()),
            Some(members),
            "{}",
            self.text
        );
        self
    }

    /// Asserts the detail.
    #[track_caller]
    pub fn detail(&self, detail: &str) -> &Resp {
        assert_eq!(self.body["detail"], json!(detail), "{}", self.text);
        self
    }

    /// Asserts `503 time_uncertain` with `reason` and `Retry-After`.
    #[track_caller]
    pub fn uncertain(&self, reason: &str, retry_after: &str) -> &Resp {
        self.problem(503, "time_uncertain");
        assert_eq!(self.body["reason"], json!(reason), "{}", self.text);
        assert_eq!(
            self.headers
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some(retry_after)
        );
        self
    }

    /// Asserts `status` and returns the body.
    #[track_caller]
    pub fn ok(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text);
        &self.body
    }
}

/// A request to send.
pub struct Req {
    method: Method,
    path: String,
    token: Option<String>,
    body: Option<Vec<u8>>,
    content_type: Option<String>,
    headers: Vec<(String, String)>,
}

impl Req {
    pub fn new(method: Method, path: impl Into<String>) -> Req {
        Req {
            method,
            path: path.into(),
            token: None,
            body: None,
            content_type: None,
            headers: Vec::new(),
        }
    }
    pub fn get(path: impl Into<String>) -> Req {
        Req::new(Method::GET, path)
    }
    pub fn post(path: impl Into<String>) -> Req {
        Req::new(Method::POST, path)
    }
    /// With `Authorization: Bearer <t>`.
    pub fn token(mut self, t: &str) -> Req {
        self.token = Some(t.to_string());
        self
    }
    /// With `Idempotency-Key: k`.
    pub fn key(self, k: &str) -> Req {
        self.header("Idempotency-Key", k)
    }
    /// With `Lc-Tenant: n`.
    pub fn tenant(self, n: i64) -> Req {
        self.header("Lc-Tenant", &n.to_string())
    }
    /// With `v` as an `application/json` body.
    pub fn json(mut self, v: Value) -> Req {
        self.body = Some(serde_json::to_vec(&v).expect("json"));
        self.content_type = Some("application/json".into());
        self
    }
    /// With `body` as is, sent with `content_type`.
    pub fn raw(mut self, body: impl Into<Vec<u8>>, content_type: Option<&str>) -> Req {
        self.body = Some(body.into());
        self.content_type = content_type.map(str::to_string);
        self
    }
    /// With the header `k: v` (appended).
    pub fn header(mut self, k: &str, v: &str) -> Req {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }
}

/// Sends `req` through `router` with `oneshot`.
pub async fn send(router: &axum::Router, req: Req) -> Resp {
    let mut b = Request::builder().method(req.method).uri(req.path);
    if let Some(t) = req.token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if let Some(ct) = req.content_type {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    for (k, v) in req.headers {
        b = b.header(k, v);
    }
    let request = b
        .body(req.body.map(Body::from).unwrap_or_else(Body::empty))
        .expect("request");
    let resp = router.clone().oneshot(request).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(text.clone()));
    Resp {
        status,
        headers,
        body,
        text,
    }
}

/// Parses an instant.
pub fn ts(s: &str) -> Timestamp {
    s.parse().expect("instant")
}
