//! One connection: its [`Phase`], the deadline each phase sets, the I/O
//! wrapper that reports bytes moving (and replaces the HTTP parser's
//! bodiless error answers), the service wrapper that reports a request's
//! handler and response, and the task that runs the connection against
//! its deadline.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64};
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tower::ServiceExt as _;

use super::Shared;
use super::canned::STATUS_PREFIX_LEN;
use crate::server::ConnectionLimits;

/// Where a connection is in its request cycle. Only [`Phase::Head`] and
/// [`Phase::Idle`] may be closed to make room ([`Conn::evict`]): no
/// handler runs and no response is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Phase {
    /// Waiting for, or receiving, a request head: since the connection was
    /// accepted, or since the first byte after an idle spell.
    Head = 0,
    /// A handler runs (it reads the body): from the parsed head until the
    /// response exists. The router bounds this time.
    Busy = 1,
    /// The response is being written, until it is flushed whole.
    Responding = 2,
    /// Between requests: the last response flushed, no byte of the next.
    Idle = 3,
    /// Chosen to be closed to make room; final.
    Evicted = 4,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Head,
            1 => Phase::Busy,
            2 => Phase::Responding,
            3 => Phase::Idle,
            _ => Phase::Evicted,
        }
    }

    /// Whether the connection may be closed to make room.
    pub(crate) fn is_waiting(self) -> bool {
        matches!(self, Phase::Head | Phase::Idle)
    }
}

/// Why a connection task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The HTTP connection finished (the client closed, an error, or a
    /// graceful shutdown completed).
    Finished,
    /// The request head did not arrive within the header-read timeout.
    HeaderReadTimeout,
    /// Nothing moved for the idle timeout between requests, or while a
    /// response waited for the client to read it.
    IdleTimeout,
    /// Closed to make room for a new connection.
    Evicted,
}

/// The deadline, in nanoseconds after the server's epoch, of a connection
/// in `phase` since `since_ns` whose bytes last moved at `activity_ns`:
/// the head by `since + header_read_timeout`; an idle connection, or a
/// response the client does not read, by `activity + idle_timeout`; a
/// running handler none (the router bounds it). Saturates at `u64::MAX`
/// (no deadline in practice).
pub(crate) fn deadline_ns(
    phase: Phase,
    since_ns: u64,
    activity_ns: u64,
    limits: &ConnectionLimits,
) -> Option<u64> {
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    match phase {
        Phase::Head => Some(since_ns.saturating_add(ns(limits.header_read_timeout))),
        Phase::Responding | Phase::Idle => {
            Some(activity_ns.saturating_add(ns(limits.idle_timeout)))
        }
        // An evicted connection closes at once, without a deadline.
        Phase::Busy | Phase::Evicted => None,
    }
}

/// The state one connection shares between its I/O wrapper, its service
/// wrapper, its task and the registry that may evict it. Times are
/// nanoseconds after the server's epoch. Only the connection's own task
/// changes the phase, except the registry's one move to
/// [`Phase::Evicted`], which is final.
#[derive(Debug)]
pub(crate) struct Conn {
    epoch: Instant,
    phase: AtomicU8,
    since_ns: AtomicU64,
    activity_ns: AtomicU64,
    /// The response's body was dropped by the HTTP layer (written whole or
    /// abandoned); the next completed flush ends [`Phase::Responding`].
    body_done: AtomicBool,
    /// Wakes the task when its deadline may have moved earlier or it was
    /// evicted.
    wake: Notify,
}

impl Conn {
    /// A connection accepted now: [`Phase::Head`].
    pub(crate) fn new(epoch: Instant) -> Conn {
        let c = Conn {
            epoch,
            phase: AtomicU8::new(Phase::Head as u8),
            since_ns: AtomicU64::new(0),
            activity_ns: AtomicU64::new(0),
            body_done: AtomicBool::new(false),
            wake: Notify::new(),
        };
        let now = c.now_ns();
        c.since_ns.store(now, Relaxed);
        c.activity_ns.store(now, Relaxed);
        c
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Relaxed))
    }

    /// When the current phase began.
    pub(crate) fn since_ns(&self) -> u64 {
        self.since_ns.load(Relaxed)
    }

    /// Moves from `from` (any phase but [`Phase::Evicted`] when `None`) to
    /// `to`; whether it moved.
    fn enter(&self, from: Option<Phase>, to: Phase, now: u64) -> bool {
        let moved = self
            .phase
            .fetch_update(Relaxed, Relaxed, |v| {
                let cur = Phase::from_u8(v);
                let allowed = match from {
                    Some(f) => cur == f,
                    None => cur != Phase::Evicted,
                };
                allowed.then_some(to as u8)
            })
            .is_ok();
        if moved {
            self.since_ns.store(now, Relaxed);
        }
        moved
    }

    /// Bytes arrived: after an idle spell they start the next head.
    pub(super) fn on_read(&self) {
        let now = self.now_ns();
        self.activity_ns.store(now, Relaxed);
        if self.enter(Some(Phase::Idle), Phase::Head, now) {
            self.wake.notify_one();
        }
    }

    /// Bytes left.
    pub(super) fn on_write(&self) {
        self.activity_ns.store(self.now_ns(), Relaxed);
    }

    /// A head was parsed and its handler starts.
    pub(super) fn on_dispatch(&self) {
        self.body_done.store(false, Relaxed);
        self.enter(None, Phase::Busy, self.now_ns());
    }

    /// The handler returned its response.
    pub(super) fn on_response(&self) {
        let now = self.now_ns();
        self.activity_ns.store(now, Relaxed);
        if self.enter(Some(Phase::Busy), Phase::Responding, now) {
            self.wake.notify_one();
        }
    }

    /// The response body was dropped by the HTTP layer.
    pub(super) fn on_body_dropped(&self) {
        self.body_done.store(true, Relaxed);
    }

    /// A flush completed: with the body done, the response is out.
    pub(super) fn on_flushed(&self) {
        if self.phase() == Phase::Responding && self.body_done.swap(false, Relaxed) {
            let now = self.now_ns();
            self.activity_ns.store(now, Relaxed);
            self.enter(Some(Phase::Responding), Phase::Idle, now);
        }
    }

    /// Chooses this connection to be closed if it is still waiting
    /// ([`Phase::is_waiting`]); whether it was.
    pub(crate) fn evict(&self) -> bool {
        let now = self.now_ns();
        let evicted = self.enter(Some(Phase::Head), Phase::Evicted, now)
            || self.enter(Some(Phase::Idle), Phase::Evicted, now);
        if evicted {
            self.wake.notify_one();
        }
        evicted
    }

    /// The current deadline as an instant; `None`: none.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        let ns = deadline_ns(
            self.phase(),
            self.since_ns(),
            self.activity_ns.load(Relaxed),
            limits,
        )?;
        self.epoch.checked_add(Duration::from_nanos(ns))
    }
}

/// What to do with the bytes the HTTP layer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteMode {
    /// Pass them on, but hold back a write made while waiting for a head
    /// ([`Phase::is_waiting`]): no request was dispatched and the last
    /// response is out, so it is the parser's own error answer.
    Watch,
    /// Holding back the parser's answer until its status is known.
    Capturing,
    /// The parser's answer was replaced: drop the rest of it.
    Swallow,
    /// The parser's answer was not one to replace: pass everything on.
    Passthrough,
}

/// The connection's socket, reporting every byte moved to its [`Conn`]
/// and replacing the HTTP parser's bodiless error answers (400, 414, 431)
/// with the service's problem documents ([`super::canned::Canned`]).
struct TrackedIo {
    stream: TcpStream,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    mode: WriteMode,
    captured: Vec<u8>,
    pending: Vec<u8>,
    pending_sent: usize,
}

impl TrackedIo {
    /// Holds back `buf` of the parser's answer; decides once the status
    /// line is in.
    fn capture(&mut self, buf: &[u8]) {
        self.captured.extend_from_slice(buf);
        if self.captured.len() >= STATUS_PREFIX_LEN {
            self.decide();
        }
    }

    /// Replaces the held-back answer with the service's, or releases it
    /// as written.
    fn decide(&mut self) {
        match self.shared.canned.replacing(&self.captured) {
            Some(prepared) => {
                self.pending = prepared.bytes(SystemTime::now());
                self.mode = WriteMode::Swallow;
                self.shared.count_refusal(prepared.status, prepared.code);
                tracing::debug!(
                    status = prepared.status.as_u16(),
                    code = prepared.code,
                    "request head refused by the HTTP parser"
                );
            }
            None => {
                self.pending = std::mem::take(&mut self.captured);
                self.mode = WriteMode::Passthrough;
            }
        }
        self.captured = Vec::new();
    }

    /// Writes out what is pending (a replacement or a released answer).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pending_sent < self.pending.len() {
            let n = ready!(
                Pin::new(&mut self.stream).poll_write(cx, &self.pending[self.pending_sent..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending_sent += n;
            self.conn.on_write();
        }
        self.pending.clear();
        self.pending_sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Whether a write now is the parser's answer to hold back.
    fn holds_back(&mut self) -> bool {
        if self.mode == WriteMode::Watch && self.conn.phase().is_waiting() {
            self.mode = WriteMode::Capturing;
        }
        matches!(self.mode, WriteMode::Capturing | WriteMode::Swallow)
    }
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.conn.on_read();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        if this.holds_back() {
            if this.mode == WriteMode::Capturing {
                this.capture(buf);
            }
            return Poll::Ready(Ok(buf.len()));
        }
        let n = ready!(Pin::new(&mut this.stream).poll_write(cx, buf))?;
        if n > 0 {
            this.conn.on_write();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        if this.holds_back() {
            let mut n = 0;
            for buf in bufs {
                if this.mode == WriteMode::Capturing {
                    this.capture(buf);
                }
                n += buf.len();
            }
            return Poll::Ready(Ok(n));
        }
        let n = ready!(Pin::new(&mut this.stream).poll_write_vectored(cx, bufs))?;
        if n > 0 {
            this.conn.on_write();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.mode == WriteMode::Capturing {
            this.decide();
        }
        ready!(this.poll_drain(cx))?;
        ready!(Pin::new(&mut this.stream).poll_flush(cx))?;
        this.conn.on_flushed();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.mode == WriteMode::Capturing {
            this.decide();
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}

/// The router as the HTTP layer's service, reporting each request's
/// dispatch and response to the connection.
#[derive(Clone)]
struct ConnService {
    router: Router,
    conn: Arc<Conn>,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<TrackedBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, req: Request<Incoming>) -> ResponseFuture {
        self.conn.on_dispatch();
        let conn = self.conn.clone();
        let handled = self.router.clone().oneshot(req.map(Body::new));
        Box::pin(async move {
            let resp = handled.await.unwrap_or_else(|e| match e {});
            conn.on_response();
            Ok(resp.map(|body| TrackedBody { body, conn }))
        })
    }
}

/// A response body that tells the connection when the HTTP layer drops
/// it (written whole, or abandoned).
struct TrackedBody {
    body: Body,
    conn: Arc<Conn>,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        self.conn.on_body_dropped();
    }
}

/// Serves `stream` until the HTTP connection ends, its deadline passes
/// ([`deadline_ns`]) or it is evicted; on `stop`, shuts it down
/// gracefully (an idle connection closes, a request in progress finishes
/// first) while still holding it to its deadlines. Dropping the returned
/// future closes the socket.
pub(crate) async fn run(
    stream: TcpStream,
    conn: Arc<Conn>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Ended {
    let io = TrackedIo {
        stream,
        conn: conn.clone(),
        shared: shared.clone(),
        mode: WriteMode::Watch,
        captured: Vec::new(),
        pending: Vec::new(),
        pending_sent: 0,
    };
    let service = ConnService {
        router: shared.router.clone(),
        conn: conn.clone(),
    };
    let http = shared.http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(http);
    let sleep = tokio::time::sleep_until(Instant::now());
    tokio::pin!(sleep);
    let mut stopping = *stop.borrow_and_update();
    if stopping {
        http.as_mut().graceful_shutdown();
    }
    loop {
        if conn.phase() == Phase::Evicted {
            return Ended::Evicted;
        }
        let deadline = conn.deadline(&shared.limits);
        if let Some(d) = deadline {
            sleep.as_mut().reset(d);
        }
        tokio::select! {
            biased;
            r = http.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return Ended::Finished;
            }
            () = conn.wake.notified() => {}
            () = &mut sleep, if deadline.is_some() => {
                // The deadline may have moved since it was set: check anew.
                if conn.deadline(&shared.limits).is_some_and(|d| d <= Instant::now()) {
                    return match conn.phase() {
                        Phase::Head => Ended::HeaderReadTimeout,
                        _ => Ended::IdleTimeout,
                    };
                }
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                http.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            connections_max: 4,
            header_read_timeout: Duration::from_nanos(10),
            idle_timeout: Duration::from_nanos(100),
        }
    }

    #[test]
    fn deadlines() {
        let l = limits();
        for (phase, since, activity, expected) in [
            (Phase::Head, 5, 50, Some(15)),
            (Phase::Busy, 5, 50, None),
            (Phase::Responding, 5, 50, Some(150)),
            (Phase::Idle, 5, 50, Some(150)),
            (Phase::Evicted, 5, 50, None),
            (Phase::Head, u64::MAX - 1, 0, Some(u64::MAX)),
            (Phase::Idle, 0, u64::MAX - 1, Some(u64::MAX)),
        ] {
            assert_eq!(
                deadline_ns(phase, since, activity, &l),
                expected,
                "{phase:?}"
            );
        }
        let huge = ConnectionLimits {
            header_read_timeout: Duration::MAX,
            idle_timeout: Duration::MAX,
            ..l
        };
        assert_eq!(deadline_ns(Phase::Head, 1, 1, &huge), Some(u64::MAX));
        assert_eq!(deadline_ns(Phase::Idle, 1, 1, &huge), Some(u64::MAX));
    }

    #[test]
    fn phase_round_trip() {
        for p in [
            Phase::Head,
            Phase::Busy,
            Phase::Responding,
            Phase::Idle,
            Phase::Evicted,
        ] {
            assert_eq!(Phase::from_u8(p as u8), p);
        }
    }

    /// The cycle of one request, and eviction only while waiting, final.
    #[tokio::test]
    async fn request_cycle() {
        let c = Conn::new(Instant::now());
        assert_eq!(c.phase(), Phase::Head);
        c.on_dispatch();
        assert_eq!(c.phase(), Phase::Busy);
        assert!(!c.evict(), "a running handler is never evicted");
        c.on_flushed();
        assert_eq!(c.phase(), Phase::Busy, "a flush before the response");
        c.on_response();
        assert_eq!(c.phase(), Phase::Responding);
        assert!(!c.evict(), "a response owed is never evicted");
        c.on_flushed();
        assert_eq!(c.phase(), Phase::Responding, "the body is not done");
        c.on_body_dropped();
        c.on_read();
        assert_eq!(c.phase(), Phase::Responding, "reads while responding");
        c.on_flushed();
        assert_eq!(c.phase(), Phase::Idle);
        c.on_read();
        assert_eq!(c.phase(), Phase::Head);
        c.on_dispatch();
        c.on_response();
        c.on_body_dropped();
        c.on_flushed();
        assert_eq!(c.phase(), Phase::Idle);
        assert!(c.evict());
        assert_eq!(c.phase(), Phase::Evicted);
        assert!(!c.evict(), "once");
        c.on_read();
        c.on_dispatch();
        c.on_response();
        assert_eq!(c.phase(), Phase::Evicted, "final");
        assert!(Conn::new(Instant::now()).evict(), "a fresh connection");
    }
}
