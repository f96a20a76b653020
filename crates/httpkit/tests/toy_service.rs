//! httpkit around a service that is not Tollgate: its own problem type
//! prefix, 401 challenge, body limit and time bound, driven with `oneshot`
//! on the router `service_router` builds, and over a loopback socket by
//! the connection layer (`httpkit::serve`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use httpkit::{
    Bearer, IdPath, JsonBody, OptionalJsonBody, ProblemSource, Rejection, RequestMetrics,
    ServiceState,
};
use serde_json::{Value, json};
use tower::ServiceExt;

#[derive(Debug, thiserror::Error)]
enum ToyError {
    #[error(transparent)]
    Request(#[from] Rejection),
}

impl ProblemSource for ToyError {
    const TYPE_PREFIX: &'static str = "urn:toy:problem:";
    const WWW_AUTHENTICATE: &'static str = "Bearer realm=\"toy\"";
    fn status(&self) -> StatusCode {
        let ToyError::Request(r) = self;
        r.status()
    }
    fn code(&self) -> &'static str {
        let ToyError::Request(r) = self;
        r.code()
    }
    fn client_detail(&self) -> String {
        self.to_string()
    }
}

impl IntoResponse for ToyError {
    fn into_response(self) -> Response {
        httpkit::problem_response(&self)
    }
}

/// (method, route, status, code) of every request.
type Counted = Arc<Mutex<Vec<(String, String, u16, Option<&'static str>)>>>;

#[derive(Clone, Default)]
struct Toy {
    counted: Counted,
    /// The request bound; `None`: 50 ms.
    bound: Option<Duration>,
}

impl ServiceState for Toy {
    type Error = ToyError;
    fn body_max_bytes(&self) -> usize {
        32
    }
    fn request_timeout(&self) -> Duration {
        self.bound.unwrap_or(Duration::from_millis(50))
    }
}

impl RequestMetrics for Toy {
    fn count_request(
        &self,
        method: &Method,
        route: &str,
        status: StatusCode,
        error_code: Option<&'static str>,
    ) {
        self.counted.lock().unwrap().push((
            method.to_string(),
            route.to_string(),
            status.as_u16(),
            error_code,
        ));
    }

    fn count_refusal(&self, status: StatusCode, error_code: &'static str) {
        self.counted.lock().unwrap().push((
            String::new(),
            "connection".into(),
            status.as_u16(),
            Some(error_code),
        ));
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Item {
    n: i64,
}

async fn put_item(
    State(_): State<Toy>,
    IdPath(id): IdPath,
    Bearer(token): Bearer,
    JsonBody(item): JsonBody<Item>,
) -> (StatusCode, Json<Value>) {
    (
        StatusCode::CREATED,
        Json(json!({"id": id, "n": item.n, "token": token})),
    )
}

async fn note(OptionalJsonBody(item): OptionalJsonBody<Item>) -> Json<Value> {
    Json(json!({"n": item.map(|i| i.n)}))
}

async fn panics() -> &'static str {
    panic!("a bug in a handler")
}

async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_secs(5)).await;
    "late"
}

fn router(toy: Toy) -> Router {
    let routes = Router::new()
        .route("/items/{id}", post(put_item))
        .route("/notes", post(note))
        .route("/slow", get(slow))
        .route("/panics", get(panics));
    httpkit::service_router(routes, toy)
}

async fn send(
    router: &Router,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<(&str, &str)>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let body = match body {
        Some((ct, text)) => {
            b = b.header(header::CONTENT_TYPE, ct);
            Body::from(text.to_string())
        }
        None => Body::empty(),
    };
    let resp = router.clone().oneshot(b.body(body).unwrap()).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, headers, value)
}

const JSON: &str = "application/json";

#[tokio::test]
async fn a_handler_panic_is_a_500_problem_not_a_dropped_connection() {
    let r = router(Toy::default());
    let (s, h, v) = send(&r, Method::GET, "/panics", None, None).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(
        v,
        json!({"type": "urn:toy:problem:internal_failure", "title": "Internal failure",
               "status": 500, "detail": "the service failed while handling this request",
               "code": "internal_failure"})
    );
    // The service goes on answering.
    let (s, _, _) = send(&r, Method::POST, "/notes", None, None).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn refusals_are_the_services_problems_in_extractor_order() {
    let toy = Toy::default();
    let r = router(toy.clone());
    let post = Method::POST;
    let (s, _, v) = send(
        &r,
        post.clone(),
        "/items/7",
        Some("t"),
        Some((JSON, r#"{"n":1}"#)),
    )
    .await;
    assert_eq!(
        (s, v),
        (StatusCode::CREATED, json!({"id": 7, "n": 1, "token": "t"}))
    );
    // The path id is checked before the credential, the credential before
    // the body.
    let (s, _, v) = send(&r, post.clone(), "/items/x", None, Some((JSON, "{"))).await;
    assert_eq!(
        (s, v["code"].clone()),
        (StatusCode::BAD_REQUEST, json!("invalid_path"))
    );
    let (s, h, v) = send(&r, post.clone(), "/items/7", None, Some((JSON, "{"))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer realm=\"toy\"");
    assert_eq!(h[header::CONTENT_TYPE], "application/problem+json");
    assert_eq!(
        v,
        json!({"type": "urn:toy:problem:unauthenticated", "title": "Unauthenticated",
               "status": 401, "detail": "a bearer credential is required",
               "code": "unauthenticated"})
    );
    for (body, status, code) in [
        (None, 400, "invalid_json"),
        (Some((JSON, "{")), 400, "invalid_json"),
        (
            Some(("text/plain", r#"{"n":1}"#)),
            415,
            "unsupported_media_type",
        ),
        (Some((JSON, r#"{"n":"1"}"#)), 422, "invalid_body"),
        (
            Some((JSON, r#"{"n":1,"pad":"xxxxxxxxxxxxxxxxxxxx"}"#)),
            413,
            "payload_too_large",
        ),
    ] {
        let (s, _, v) = send(&r, post.clone(), "/items/7", Some("t"), body).await;
        assert_eq!(
            (s.as_u16(), v["code"].clone()),
            (status, json!(code)),
            "{body:?}"
        );
    }
    // An optional body may be empty or null.
    for body in [None, Some((JSON, "null"))] {
        let (s, _, v) = send(&r, post.clone(), "/notes", None, body).await;
        assert_eq!((s, v), (StatusCode::OK, json!({"n": null})), "{body:?}");
    }
    let (s, _, v) = send(&r, Method::GET, "/nope", None, None).await;
    assert_eq!(
        (s, v["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    let (s, h, v) = send(&r, Method::GET, "/items/7", None, None).await;
    assert_eq!(
        (s, v["code"].clone()),
        (StatusCode::METHOD_NOT_ALLOWED, json!("method_not_allowed"))
    );
    assert_eq!(h[header::ALLOW], "POST");
    let (s, _, v) = send(&r, Method::GET, "/slow", None, None).await;
    assert_eq!(
        (s, v["detail"].clone()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!("request did not finish within 50ms")
        )
    );
    let counted = toy.counted.lock().unwrap().clone();
    assert_eq!(counted.len(), 13);
    assert_eq!(counted[0], ("POST".into(), "/items/{id}".into(), 201, None));
    assert_eq!(
        counted[2],
        (
            "POST".into(),
            "/items/{id}".into(),
            401,
            Some("unauthenticated")
        )
    );
    assert_eq!(
        counted[10],
        ("GET".into(), "unmatched".into(), 404, Some("not_found"))
    );
    assert_eq!(
        counted[12],
        ("GET".into(), "/slow".into(), 503, Some("request_timeout"))
    );
}

/// Served over a socket by the connection layer, a service that is not
/// Tollgate gets the same answers in its own problem type: at the bound
/// with every connection busy, 503 `too_many_connections` with
/// `Retry-After` (which its error type does not give: the connection layer
/// adds it), while the busy connection is still served; a head with too
/// many fields, 431 `header_fields_too_large`; both counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_layer_answers_in_the_services_problem_type() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    let toy = Toy {
        bound: Some(Duration::from_secs(30)),
        ..Toy::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = httpkit::ConnectionLimits {
        connections_max: 1,
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
    };
    let served = tokio::spawn(httpkit::serve(
        listener,
        router(toy.clone()),
        toy.clone(),
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    let answer = |mut s: TcpStream| async move {
        let mut text = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut text))
            .await
            .expect("answered and closed in time")
            .expect("read");
        text
    };
    // The one connection is busy: its handler reads the body (the server
    // sends `100 Continue` only then) and waits for it.
    let mut busy = TcpStream::connect(addr).await.unwrap();
    busy.write_all(
        b"POST /notes HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
          Content-Type: application/json\r\nContent-Length: 7\r\n\
          Expect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut continued = [0u8; 25];
    tokio::time::timeout(Duration::from_secs(5), busy.read_exact(&mut continued))
        .await
        .expect("100 Continue in time")
        .unwrap();
    assert_eq!(&continued, b"HTTP/1.1 100 Continue\r\n\r\n");
    let refused = answer(TcpStream::connect(addr).await.unwrap()).await;
    let body = r#"{"type":"urn:toy:problem:too_many_connections","title":"Too many connections","status":503,"detail":"the service is at its connection bound with every connection busy; retry in 1 s","code":"too_many_connections"}"#;
    assert!(
        refused.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{refused}"
    );
    for line in [
        "content-type: application/problem+json",
        "retry-after: 1",
        "connection: close",
        &format!("content-length: {}", body.len()),
    ] {
        assert!(
            refused.contains(&format!("\r\n{line}\r\n")),
            "{line}: {refused}"
        );
    }
    assert!(refused.ends_with(&format!("\r\n\r\n{body}")), "{refused}");
    busy.write_all(br#"{"n":1}"#).await.unwrap();
    let done = answer(busy).await;
    assert!(done.starts_with("HTTP/1.1 200 OK\r\n"), "{done}");
    assert!(done.ends_with(r#"{"n":1}"#), "{done}");

    let mut many = TcpStream::connect(addr).await.unwrap();
    let mut head = String::from("GET /notes HTTP/1.1\r\nHost: t\r\n");
    for i in 0..=httpkit::server::HEADER_FIELDS_MAX {
        head.push_str(&format!("X-{i}: v\r\n"));
    }
    head.push_str("\r\n");
    many.write_all(head.as_bytes()).await.unwrap();
    let too_large = answer(many).await;
    assert!(
        too_large.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{too_large}"
    );
    assert!(
        too_large.ends_with(
            r#"{"type":"urn:toy:problem:header_fields_too_large","title":"Header fields too large","status":431,"detail":"the request head has more than 100 header fields or more than 417792 bytes","code":"header_fields_too_large"}"#
        ),
        "{too_large}"
    );
    let refusals: Vec<_> = toy
        .counted
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.1 == "connection")
        .map(|c| (c.2, c.3))
        .collect();
    assert_eq!(
        refusals,
        [
            (503, Some("too_many_connections")),
            (431, Some("header_fields_too_large"))
        ]
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("the server returns")
        .unwrap();
}
