//! The service over real loopback sockets, served by the connection layer
//! (`httpkit::serve`) with small bounds: the connection bound (waiting
//! connections closed to make room, 503 when every connection is busy),
//! the header-read and idle timeouts, a `Content-Length` over the body
//! limit, the problem documents for heads the HTTP parser refuses, and
//! graceful shutdown. Time bounds in assertions are upper bounds on a
//! wait, not benchmarks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use httpkit::ConnectionLimits;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate::CapabilityKey;
use tollgate_api::api;
use tollgate_api::storage::ServiceStore;
use tollgate_api::testkit::*;

/// How long any single expected event may take before a test fails: far
/// above what each takes, so a loaded machine does not fail the tests.
const EVENT_MAX: Duration = Duration::from_secs(5);

/// A long bound, for the limits a test does not exercise.
const LONG: Duration = Duration::from_secs(30);

/// A service on a loopback port.
struct Service {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<()>,
}

impl Service {
    /// The memory-store service under `limits`, with `request_timeout`.
    async fn start(limits: ConnectionLimits, request_timeout: Duration) -> Service {
        let store = ServiceStore::memory(default_policy(), CapabilityKey::generate().expect("key"))
            .expect("memory store");
        let state = state(
            store,
            Arc::new(clock::TestClock::new(ts(T0))),
            request_timeout,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = oneshot::channel::<()>();
        let served = tokio::spawn(httpkit::serve(
            listener,
            api::router(state.clone()),
            state,
            limits,
            async move {
                let _ = rx.await;
            },
        ));
        Service {
            addr,
            stop: Some(tx),
            served,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.expect("connect")
    }

    /// Sends `head` + `body` on a new connection and reads the answer.
    async fn exchange(&self, raw: &[u8]) -> (Answer, TcpStream) {
        let mut s = self.connect().await;
        s.write_all(raw).await.expect("write");
        let a = read_answer(&mut s).await;
        (a, s)
    }

    /// `GET path` on a new connection, closed after the answer.
    async fn get(&self, path: &str) -> Answer {
        self.exchange(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .0
    }
}

/// An answer read off a socket.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// Asserts a problem document: status, the exact body, the media type.
    #[track_caller]
    fn problem(&self, status: u16, body: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.body, body, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(
            self.header("content-length"),
            Some(self.body.len().to_string().as_str())
        );
    }
}

/// Reads one answer (head and `Content-Length` body) within [`EVENT_MAX`].
async fn read_answer(s: &mut TcpStream) -> Answer {
    tokio::time::timeout(EVENT_MAX, async {
        let mut buf = Vec::new();
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.expect("read");
            assert!(
                n > 0,
                "closed before an answer: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8(buf[..head_end].to_vec()).expect("utf-8 head");
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .expect("status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_string()))
            .collect();
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse().expect("length"));
        let mut body = buf[head_end..].to_vec();
        while body.len() < len {
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).await.expect("read body");
            assert!(n > 0, "closed in the body");
            body.extend_from_slice(&chunk[..n]);
        }
        Answer {
            status,
            headers,
            body: String::from_utf8(body).expect("utf-8 body"),
        }
    })
    .await
    .expect("an answer in time")
}

/// Waits (at most `bound`) until the server closes `s`, discarding what it
/// sends; the time it took.
async fn closed_within(s: &mut TcpStream, bound: Duration) -> Duration {
    let started = Instant::now();
    tokio::time::timeout(bound, async {
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) => return,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
                Err(e) => panic!("{e}"),
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("still open after {bound:?}"));
    started.elapsed()
}

/// Whether `s` is still open after `wait` (nothing arrives, no close).
async fn still_open(s: &mut TcpStream, wait: Duration) -> bool {
    let mut chunk = [0u8; 1];
    tokio::time::timeout(wait, s.read(&mut chunk))
        .await
        .is_err()
}

const HEALTHZ: &str = r#"{"status":"ok"}"#;

fn limits(connections_max: usize, header_read: Duration, idle: Duration) -> ConnectionLimits {
    ConnectionLimits {
        connections_max,
        header_read_timeout: header_read,
        idle_timeout: idle,
    }
}

/// A connection whose handler runs, waiting for `body`: the head of a
/// `POST /v1/accounts` announcing it with `Expect: 100-continue`, sent
/// and answered with `100 Continue`, which the server sends only once the
/// handler reads the body.
async fn busy_connection(svc: &Service, body: &str) -> TcpStream {
    let mut s = svc.connect().await;
    s.write_all(
        format!(
            "POST /v1/accounts HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {ADMIN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\
             Expect: 100-continue\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut got = Vec::new();
    tokio::time::timeout(EVENT_MAX, async {
        while !got.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            assert_eq!(s.read(&mut byte).await.expect("read"), 1, "closed");
            got.push(byte[0]);
        }
    })
    .await
    .expect("100 Continue in time");
    assert_eq!(got, b"HTTP/1.1 100 Continue\r\n\r\n");
    s
}

/// Five times more silent connections than the bound: each new one closes
/// the one that has waited longest, so a client connecting afterwards is
/// served at once, the oldest silent ones are closed, and exactly the
/// newest stay (the bound holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_beyond_the_bound_do_not_lock_clients_out() {
    let bound = 8;
    let svc = Service::start(limits(bound, LONG, LONG), LONG).await;
    let mut silent = Vec::new();
    for _ in 0..5 * bound {
        silent.push(svc.connect().await);
        // Accepted in order: the server sees them oldest first.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    let health = svc.get("/healthz").await;
    assert!(started.elapsed() < EVENT_MAX);
    assert_eq!((health.status, health.body.as_str()), (200, HEALTHZ));
    assert_eq!(health.header("content-type"), Some("application/json"));
    // The client took the place of the oldest of the `bound` still held.
    let kept = bound - 1;
    let closed = silent.len() - kept;
    for s in &mut silent[..closed] {
        closed_within(s, EVENT_MAX).await;
    }
    for s in &mut silent[closed..] {
        assert!(still_open(s, Duration::from_millis(200)).await);
    }
    // They are served too.
    let s = &mut silent[closed];
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    let a = read_answer(s).await;
    assert_eq!((a.status, a.body.as_str()), (200, HEALTHZ));
}

/// At the bound with every connection running a handler: a new
/// connection gets the documented refusal (503 `too_many_connections`,
/// `Retry-After: 1`, `Connection: close`, then closed), the busy ones
/// finish and are answered, and once they are idle a new client is
/// served again; the refusal is counted by code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_bound_with_every_connection_busy_is_503() {
    let bound = 3;
    let svc = Service::start(limits(bound, LONG, LONG), LONG).await;
    let mut busy = Vec::new();
    for i in 0..bound {
        let body = format!(r#"{{"name":"busy-{i}"}}"#);
        busy.push((busy_connection(&svc, &body).await, body));
    }
    let (refused, mut s) = svc
        .exchange(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    refused.problem(
        503,
        r#"{"type":"urn:tollgate:problem:too_many_connections","title":"Too many connections","status":503,"detail":"the service is at its connection bound with every connection busy; retry in 1 s","code":"too_many_connections"}"#,
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("connection"), Some("close"));
    assert!(refused.header("date").is_some());
    closed_within(&mut s, EVENT_MAX).await;
    for (s, body) in &mut busy {
        s.write_all(body.as_bytes()).await.expect("write body");
        let a = read_answer(s).await;
        assert_eq!(a.status, 201, "{a:?}");
        assert_eq!(a.json()["name"], json!(body[9..body.len() - 2]));
    }
    let health = svc.get("/healthz").await;
    assert_eq!((health.status, health.body.as_str()), (200, HEALTHZ));
    let metrics = svc.get("/metrics").await;
    assert!(
        metrics
            .body
            .contains("tollgate_errors_total{code=\"too_many_connections\"} 1\n"),
        "{}",
        metrics.body
    );
}

/// A client that sends its head one byte every 100 ms, never finishing
/// it, is closed after the header-read timeout (not the much longer idle
/// timeout); so is one that sends nothing, and one whose second request's
/// head stalls, counted from that head's first byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_are_closed_after_the_header_read_timeout() {
    let header_read = Duration::from_millis(600);
    let svc = Service::start(limits(16, header_read, LONG), LONG).await;
    let head = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    let drip = |mut w: tokio::net::tcp::OwnedWriteHalf| async move {
        for b in head {
            if w.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    let started = Instant::now();
    let (mut r, w) = svc.connect().await.into_split();
    let dripping = tokio::spawn(drip(w));
    let mut chunk = [0u8; 64];
    let closed = tokio::time::timeout(EVENT_MAX, async {
        if let Ok(n @ 1..) = r.read(&mut chunk).await {
            panic!("answered a head never finished: {:?}", &chunk[..n]);
        }
    })
    .await;
    assert!(closed.is_ok(), "slowloris still open after {EVENT_MAX:?}");
    let took = started.elapsed();
    assert!(took >= header_read, "closed after {took:?}");
    dripping.abort();

    let mut silent = svc.connect().await;
    let took = closed_within(&mut silent, EVENT_MAX).await;
    assert!(took >= header_read - Duration::from_millis(50), "{took:?}");

    let mut kept = svc.connect().await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_answer(&mut kept).await.body, HEALTHZ);
    // Idle for longer than the header-read timeout: the idle timeout
    // applies between requests.
    tokio::time::sleep(header_read * 2).await;
    kept.write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .expect("write");
    let took = closed_within(&mut kept, EVENT_MAX).await;
    assert!(took >= header_read - Duration::from_millis(50), "{took:?}");
}

/// A kept-alive connection on which nothing moves is closed after the
/// idle timeout; one that keeps sending requests more often stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let idle = Duration::from_millis(600);
    let svc = Service::start(limits(16, LONG, idle), LONG).await;
    let request = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";

    let (first, mut quiet) = svc.exchange(request).await;
    assert_eq!((first.status, first.body.as_str()), (200, HEALTHZ));
    let took = closed_within(&mut quiet, EVENT_MAX).await;
    assert!(
        took >= idle - Duration::from_millis(50),
        "closed after {took:?}"
    );

    let (_, mut busy) = svc.exchange(request).await;
    for _ in 0..6 {
        tokio::time::sleep(idle / 3).await;
        busy.write_all(request).await.expect("write");
        let a = read_answer(&mut busy).await;
        assert_eq!((a.status, a.body.as_str()), (200, HEALTHZ));
    }
    closed_within(&mut busy, EVENT_MAX).await;
}

/// A `Content-Length` far above the body limit is refused with 413 at
/// once (the request timeout is 30 s), before any body byte, with
/// `Connection: close`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_over_the_limit_is_413_at_once() {
    let svc = Service::start(limits(16, LONG, LONG), LONG).await;
    for len in ["52428800", "9223372036854775808", "65537"] {
        let started = Instant::now();
        let (a, mut s) = svc
            .exchange(
                format!(
                    "POST /v1/accounts HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {ADMIN}\r\n\
                     Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
                )
                .as_bytes(),
            )
            .await;
        assert!(started.elapsed() < EVENT_MAX, "{len}");
        a.problem(
            413,
            r#"{"type":"urn:tollgate:problem:payload_too_large","title":"Payload too large","status":413,"detail":"request body exceeds 65536 bytes","code":"payload_too_large"}"#,
        );
        assert_eq!(a.header("connection"), Some("close"), "{len}");
        closed_within(&mut s, EVENT_MAX).await;
    }
}

/// Heads the HTTP parser refuses get problem documents with stable codes
/// instead of empty bodies: a request target over 65,534 bytes (414), more
/// than 100 header fields or a head filling the read buffer (431), a
/// malformed header (400); each is counted by code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parser_refusals_are_problem_documents() {
    let svc = Service::start(limits(16, LONG, LONG), LONG).await;

    let long_target = format!(
        "GET /healthz?q={} HTTP/1.1\r\nHost: t\r\n\r\n",
        "a".repeat(70_000)
    );
    let (a, mut s) = svc.exchange(long_target.as_bytes()).await;
    a.problem(
        414,
        r#"{"type":"urn:tollgate:problem:uri_too_long","title":"Uri too long","status":414,"detail":"the request target is longer than 65534 bytes","code":"uri_too_long"}"#,
    );
    assert_eq!(a.header("connection"), Some("close"));
    closed_within(&mut s, EVENT_MAX).await;

    let too_large = r#"{"type":"urn:tollgate:problem:header_fields_too_large","title":"Header fields too large","status":431,"detail":"the request head has more than 100 header fields or more than 417792 bytes","code":"header_fields_too_large"}"#;
    let mut many = String::from("GET /healthz HTTP/1.1\r\nHost: t\r\n");
    for i in 0..100 {
        many.push_str(&format!("X-Field-{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let (a, mut s) = svc.exchange(many.as_bytes()).await;
    a.problem(431, too_large);
    closed_within(&mut s, EVENT_MAX).await;

    // Exactly a full read buffer of an unfinished head.
    let mut big = String::from("GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ");
    big.push_str(&"a".repeat(httpkit::server::READ_BUFFER_MAX_BYTES - big.len()));
    let (a, mut s) = svc.exchange(big.as_bytes()).await;
    a.problem(431, too_large);
    closed_within(&mut s, EVENT_MAX).await;

    let (a, mut s) = svc
        .exchange(b"GET /healthz HTTP/1.1\r\nHost: t\r\nNo colon here\r\n\r\n")
        .await;
    a.problem(
        400,
        r#"{"type":"urn:tollgate:problem:malformed_request","title":"Malformed request","status":400,"detail":"the request head is malformed","code":"malformed_request"}"#,
    );
    closed_within(&mut s, EVENT_MAX).await;

    // After a served request, on the same connection.
    let mut s = svc.connect().await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(read_answer(&mut s).await.body, HEALTHZ);
    s.write_all(long_target.as_bytes()).await.expect("write");
    assert_eq!(read_answer(&mut s).await.status, 414);

    let metrics = svc.get("/metrics").await.body;
    for (code, n) in [
        ("uri_too_long", 2),
        ("header_fields_too_large", 2),
        ("malformed_request", 1),
    ] {
        assert!(
            metrics.contains(&format!("tollgate_errors_total{{code=\"{code}\"}} {n}\n")),
            "{code}: {metrics}"
        );
    }
}

/// On shutdown: no new connections, an idle connection closed at once, a
/// request in progress finished and answered, then the server returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_requests_in_progress() {
    let mut svc = Service::start(limits(16, LONG, LONG), LONG).await;
    let (_, mut idle) = svc
        .exchange(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    let body = r#"{"name":"late"}"#;
    let mut busy = busy_connection(&svc, body).await;

    let _ = svc.stop.take().expect("running").send(());
    closed_within(&mut idle, EVENT_MAX).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        TcpStream::connect(svc.addr).await.is_err(),
        "no longer accepting"
    );
    assert!(!svc.served.is_finished(), "a request is in progress");
    busy.write_all(body.as_bytes()).await.expect("write");
    let a = read_answer(&mut busy).await;
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(a.json()["name"], json!("late"));
    closed_within(&mut busy, EVENT_MAX).await;
    tokio::time::timeout(EVENT_MAX, &mut svc.served)
        .await
        .expect("the server returns")
        .expect("no panic");
}
