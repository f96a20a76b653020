//! The connection layer every service is served by: [`serve`] accepts TCP
//! connections and serves a router on each over HTTP/1.1 (and 1.0; not
//! HTTP/2), holding every connection to bounds a client cannot outwait.
//!
//! # Design
//!
//! Each connection is in one phase: waiting for (or receiving) a request
//! head, running a handler, writing a response, or idle between requests.
//! The phase decides its deadline, checked by the connection's own task:
//!
//! * **Header-read timeout** ([`ConnectionLimits::header_read_timeout`]):
//!   a request head (request line and header fields) must arrive whole
//!   within it, counted from the accept for a connection's first request
//!   and from the first byte of each later one. A client that sends
//!   nothing, or one byte at a time (slowloris), is closed when it ends.
//! * **Idle timeout** ([`ConnectionLimits::idle_timeout`]): a kept-alive
//!   connection on which nothing moves for this long between requests is
//!   closed; so is one whose client stops reading its response.
//! * A running handler has no deadline here: the router bounds it (the
//!   request timeout of [`crate::service_router`], which also bounds the
//!   body's arrival).
//!
//! **Connection bound** ([`ConnectionLimits::connections_max`]): at the
//! bound, a new connection is served in place of the connection that has
//! waited longest without a request in progress (an idle kept-alive
//! connection or one whose head is incomplete), which is closed: a client
//! of an idle connection owes nothing and loses nothing, and silent
//! connections cannot crowd out clients that send requests. Only when
//! every connection runs a handler or writes a response is the new one
//! refused: the service's 503 `too_many_connections` problem document with
//! `Retry-After: 1` and `Connection: close`, written at once, then the
//! connection is closed after reading (briefly) what the client sent, so
//! that the close does not reset the connection before the client read
//! the answer. Existing connections are served throughout.
//!
//! **The parser's own answers**: a request head the HTTP parser refuses
//! (malformed; a request target over [`REQUEST_TARGET_MAX_BYTES`]; more
//! than [`HEADER_FIELDS_MAX`] header fields or a head over
//! [`READ_BUFFER_MAX_BYTES`]) gets the service's problem document
//! (`malformed_request` 400, `uri_too_long` 414, `header_fields_too_large`
//! 431) instead of the parser's empty answer, then the connection closes.
//!
//! **Open files**: each connection is a file descriptor; a service checks
//! with [`fit_descriptor_limit`] at start-up that its bound fits under
//! `RLIMIT_NOFILE` (raising the soft limit when the hard one allows).
//!
//! **Logging**: closing connections at the bound, refusing them, closing
//! connections whose head timed out and failing to accept are each logged
//! at most once per [`LOG_INTERVAL`], with the count since the last line
//! (the count of a burst's tail is written one interval after the burst's
//! line, and when the server stops); idle closes (normal) at `debug`.
//!
//! **Graceful shutdown**: when `shutdown` resolves, [`serve`] stops
//! accepting (the listener is closed), asks each connection to finish (an
//! idle one closes at once, a request in progress completes, still under
//! the deadlines) and returns when all have closed. Dropping its future
//! closes every connection at once.
//!
//! # Failure modes
//!
//! * A request that starts on a connection in the instant it is chosen
//!   for closing at the bound sees the connection close without an
//!   answer, as with any kept-alive connection a server closes; clients
//!   retry such requests on a new connection.
//! * An incomplete head pipelined behind a response is held to the idle
//!   timeout until its next byte arrives, then to the header-read timeout:
//!   bounded by their sum.
//! * The refusal is written without waiting: a connection whose socket
//!   cannot take the few hundred bytes at once is closed without it.

mod canned;
mod connection;
mod descriptors;
mod throttle;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::http::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use self::canned::Canned;
use self::connection::{Conn, Ended};
pub use self::descriptors::{
    DESCRIPTOR_RESERVE, DescriptorError, DescriptorFit, descriptors_needed, fit_descriptor_limit,
};
use self::throttle::{Event, Logs};
pub use self::throttle::{LOG_FLUSH_INTERVAL, LOG_INTERVAL};
use crate::{RequestMetrics, ServiceState};

/// Default [`ConnectionLimits::connections_max`]: far more connections
/// than the clients of one service hold at once (each client process keeps
/// a small pool), yet with the service's own descriptors
/// ([`descriptors_needed`]) well under 1,024, the most common soft limit on
/// open files, so the default fits without raising any limit.
pub const CONNECTIONS_MAX_DEFAULT: usize = 512;

/// The largest [`ConnectionLimits::connections_max`] a service accepts:
/// 1,048,576 is Linux's default ceiling on one process's open files
/// (`fs.nr_open`), so no larger bound could be served.
pub const CONNECTIONS_MAX_MAX: usize = 1 << 20;

/// Default [`ConnectionLimits::header_read_timeout`]: a client sends its
/// head in one write right after connecting or after its previous
/// response; 10 s also covers the retransmissions of a lossy link (1 s, 2
/// s, 4 s), while a connection that never sends a head holds its place
/// for at most 10 s.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Default [`ConnectionLimits::idle_timeout`]: long enough that a client
/// sending a request every few seconds keeps its connection (and its TCP
/// handshake) between them, short enough that an abandoned connection
/// frees its descriptor within a minute. At the bound, idle connections
/// are closed sooner, to make room.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// `Retry-After` of the refusal over the bound, in seconds: the bound is
/// reached only while every connection runs a handler or writes a
/// response, which the request timeout ends, and most handlers end in
/// milliseconds; a second is a short wait that still spreads retries.
pub const REFUSAL_RETRY_AFTER_SECS: u64 = 1;

/// Refused connections being closed at once (reading what their client
/// sent): 32 absorbs a burst while bounding the descriptors refusals hold
/// (counted in [`descriptors_needed`]); beyond it a refused connection is
/// closed as soon as its answer is written.
pub const REFUSALS_LINGERING_MAX: usize = 32;

/// How long a refused connection is kept, reading what its client sent,
/// before it is closed: a client reads the answer within a round trip;
/// a second covers a slow one.
pub const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// The most a refused connection reads before it is closed: a request
/// head and a small body; a client sending more is not reading the
/// answer.
pub const REFUSAL_LINGER_READ_MAX_BYTES: usize = 64 * 1024;

/// The pause after accepting failed for a reason other than the one
/// connection (out of descriptors or memory): long enough not to spin on
/// an error that persists, short enough to resume promptly once
/// connections close. Served connections continue meanwhile.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The longest request target (path and query) the HTTP parser takes
/// (else 414): its fixed limit, `u16::MAX - 1`, not configurable; a
/// service's targets are a few dozen bytes.
pub const REQUEST_TARGET_MAX_BYTES: usize = 65_534;

/// The most header fields a request head may have (else 431): a client's
/// request carries a dozen; 100 (the HTTP parser's own default) leaves
/// room for what proxies add while bounding the parser's work.
pub const HEADER_FIELDS_MAX: usize = 100;

/// The most bytes buffered while reading a request head (else 431), and
/// the bound on buffered response bytes: the HTTP parser's own default
/// (8 KiB plus 4 KiB per header field), enough for any legitimate head.
pub const READ_BUFFER_MAX_BYTES: usize = 8192 + 4096 * HEADER_FIELDS_MAX;

/// The bounds of [`serve`]'s connections; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once (at least 1; 0 counts as 1).
    pub connections_max: usize,
    /// The bound on receiving a request head, from the accept (first
    /// request) or its first byte (later requests).
    pub header_read_timeout: Duration,
    /// The bound on a connection on which nothing moves while no handler
    /// runs: between requests, or while a response waits to be read.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            header_read_timeout: HEADER_READ_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
        }
    }
}

/// What every connection task of one server shares.
struct Shared {
    router: Router,
    limits: ConnectionLimits,
    http: hyper::server::conn::http1::Builder,
    canned: Canned,
    count: Box<dyn Fn(StatusCode, &'static str) + Send + Sync>,
    epoch: Instant,
    logs: Logs,
}

impl Shared {
    /// Counts one answer the connection layer wrote itself.
    fn count_refusal(&self, status: StatusCode, code: &'static str) {
        (self.count)(status, code);
    }
}

/// The connections being served, by id, so that one may be closed to
/// make room.
#[derive(Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

/// The registry's answer to a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    /// Served under `id`; `evicted`: another connection was closed for it.
    Admitted { id: u64, evicted: bool },
    /// At the bound with no connection waiting: refuse it.
    Full,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `conn` under `connections_max`: below the bound at once; at
    /// it in place of the connection waiting longest without a request in
    /// progress, which is evicted; else [`Admission::Full`]. O(n log n) in
    /// the connections served, only at the bound.
    fn admit(&self, conn: Arc<Conn>, connections_max: usize) -> Admission {
        let mut conns = self.lock();
        let mut evicted = false;
        if conns.len() >= connections_max.max(1) {
            let mut waiting: Vec<(u64, u64)> = conns
                .iter()
                .filter(|(_, c)| c.phase().is_waiting())
                .map(|(id, c)| (c.since_ns(), *id))
                .collect();
            waiting.sort_unstable();
            // A candidate may have started a request since it was listed.
            let victim = waiting
                .into_iter()
                .map(|(_, id)| id)
                .find(|id| conns.get(id).is_some_and(|c| c.evict()));
            let Some(victim) = victim else {
                return Admission::Full;
            };
            conns.remove(&victim);
            evicted = true;
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        conns.insert(id, conn);
        Admission::Admitted { id, evicted }
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }
}

/// Removes a connection from the registry when its task ends, however it
/// ends (a panic included), so that its place is never lost.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// Counts a refused connection being closed while it lives.
struct Lingering(Arc<AtomicUsize>);

impl Drop for Lingering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Serves `router` on every connection `listener` accepts, under
/// `limits`, until `shutdown` resolves; then stops accepting, lets every
/// connection finish (idle ones close at once) and returns when all have
/// closed. See the module docs for the bounds, the refusal over the
/// connection bound and the problem documents written here; `state`'s
/// service error ([`ServiceState::Error`]) writes those, and its
/// [`RequestMetrics::count_refusal`] counts them.
///
/// Never fails: an error accepting one connection is skipped, any other
/// (out of descriptors) is logged and retried after [`ACCEPT_ERROR_PAUSE`].
pub async fn serve<S: ServiceState + RequestMetrics>(
    listener: TcpListener,
    router: Router,
    state: S,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(true)
        // The connection's own deadlines bound the head ([`connection`]).
        .header_read_timeout(None)
        .max_headers(HEADER_FIELDS_MAX)
        .max_buf_size(READ_BUFFER_MAX_BYTES);
    let shared = Arc::new(Shared {
        router,
        limits,
        http,
        canned: Canned::of::<S>(REFUSAL_RETRY_AFTER_SECS).await,
        count: Box::new(move |status, code| state.count_refusal(status, code)),
        epoch: Instant::now(),
        logs: Logs::new(limits.connections_max, limits.header_read_timeout),
    });
    let registry = Arc::new(Registry::default());
    let lingering = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut log_flush = tokio::time::interval(LOG_FLUSH_INTERVAL);
    log_flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => report_panic(joined),
            _ = log_flush.tick() => shared.logs.flush(false),
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let conn = Arc::new(Conn::new(shared.epoch));
                    match registry.admit(conn.clone(), limits.connections_max) {
                        Admission::Admitted { id, evicted } => {
                            if evicted {
                                shared.logs.record(Event::Evicted, None);
                            }
                            let registered = Registered { registry: registry.clone(), id };
                            tasks.spawn(serve_one(stream, conn, shared.clone(), stop_rx.clone(), registered));
                        }
                        Admission::Full => refuse(stream, &shared, &lingering, &mut tasks),
                    }
                }
                Err(e) if is_per_connection(&e) => {
                    tracing::debug!(error = %e, "a connection failed before it was accepted");
                }
                Err(e) => {
                    shared.logs.record(Event::AcceptFailed, Some(&e));
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                        () = &mut shutdown => break,
                    }
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while let Some(joined) = tasks.join_next().await {
        report_panic(joined);
    }
    shared.logs.flush(true);
}

/// One connection's task: serves it, then logs how it ended.
async fn serve_one(
    stream: TcpStream,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    registered: Registered,
) {
    let ended = connection::run(stream, conn, shared.clone(), stop).await;
    drop(registered);
    match ended {
        Ended::HeaderReadTimeout => shared.logs.record(Event::HeaderReadTimeout, None),
        Ended::IdleTimeout => tracing::debug!(
            idle_timeout = ?shared.limits.idle_timeout,
            "closed an idle connection"
        ),
        Ended::Evicted => tracing::debug!("closed a waiting connection to make room"),
        Ended::Finished => {}
    }
}

/// Refuses `stream` over the bound: the service's 503, written without
/// waiting, then a brief read of what the client sent before closing
/// ([`REFUSAL_LINGER`], at most [`REFUSALS_LINGERING_MAX`] at once; beyond
/// that, closed at once).
fn refuse(
    stream: TcpStream,
    shared: &Shared,
    lingering: &Arc<AtomicUsize>,
    tasks: &mut JoinSet<()>,
) {
    let refusal = &shared.canned.too_many_connections;
    // An accepted stream is taken as writable at once (tokio), and a new
    // connection's send buffer takes the few hundred bytes whole.
    let _ = stream.try_write(&refusal.bytes(SystemTime::now()));
    shared.count_refusal(refusal.status, refusal.code);
    shared.logs.record(Event::Refused, None);
    if lingering.fetch_add(1, Relaxed) >= REFUSALS_LINGERING_MAX {
        lingering.fetch_sub(1, Relaxed);
        return;
    }
    let guard = Lingering(lingering.clone());
    tasks.spawn(async move {
        let _guard = guard;
        linger(stream).await;
    });
}

/// Ends the answer with FIN, then reads what the client sent until it
/// closes, [`REFUSAL_LINGER`] passes or [`REFUSAL_LINGER_READ_MAX_BYTES`]
/// arrived: closing with unread bytes would reset the connection and
/// could discard the answer before the client read it.
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        let mut buf = [0u8; 4096];
        let mut read = 0;
        while read < REFUSAL_LINGER_READ_MAX_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    })
    .await;
}

/// Whether an accept error concerns only the one connection (the client
/// gave up before it was accepted), not the listener.
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

fn report_panic(joined: Result<(), tokio::task::JoinError>) {
    if let Err(e) = joined
        && e.is_panic()
    {
        tracing::error!(error = %e, "a connection task panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the bound: the longest-waiting connection without a request in
    /// progress makes room; a running handler or a response owed never
    /// does; with none waiting, the new connection is refused.
    #[tokio::test]
    async fn admission_at_the_bound() {
        let epoch = Instant::now();
        let registry = Registry::default();
        let conn = || Arc::new(Conn::new(epoch));
        let admitted = |a: Admission| match a {
            Admission::Admitted { evicted, .. } => evicted,
            Admission::Full => panic!("refused"),
        };
        let oldest = conn();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let busy = conn();
        busy.on_dispatch();
        let newer = conn();
        assert!(!admitted(registry.admit(oldest.clone(), 3)));
        assert!(!admitted(registry.admit(busy.clone(), 3)));
        assert!(!admitted(registry.admit(newer.clone(), 3)));
        assert!(admitted(registry.admit(conn(), 3)), "evicts one");
        assert_eq!(oldest.phase(), connection::Phase::Evicted);
        assert_eq!(busy.phase(), connection::Phase::Busy);
        assert_eq!(newer.phase(), connection::Phase::Head);
        assert_eq!(registry.lock().len(), 3);
        newer.on_dispatch();
        // The one just admitted is waiting: it goes next.
        assert!(admitted(registry.admit(conn(), 3)));
        assert_eq!(newer.phase(), connection::Phase::Busy);
        let all_busy = Registry::default();
        for _ in 0..2 {
            let c = conn();
            c.on_dispatch();
            admitted(all_busy.admit(c, 2));
        }
        assert_eq!(all_busy.admit(conn(), 2), Admission::Full);
        assert_eq!(all_busy.lock().len(), 2);
        // A bound of 0 counts as 1.
        let zero = Registry::default();
        assert!(!admitted(zero.admit(conn(), 0)));
        assert!(admitted(zero.admit(conn(), 0)));
    }
}
