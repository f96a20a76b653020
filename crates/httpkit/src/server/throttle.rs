//! Rate-limited logging: a burst of one kind of connection event is one
//! log line, and what a burst left uncounted is written within one
//! interval after it.

use std::io;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest time between two log lines of one kind of connection
/// event: a flood of refusals or timeouts is visible within seconds, yet
/// costs at most one line per kind per interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// How often the server writes the lines that have come due for the tail
/// of a burst ([`Logs::flush`]): a tenth of [`LOG_INTERVAL`], so a tail is
/// written at most a second late, for four uncontended locks a second.
pub const LOG_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Counts one kind of event and says when a log line is due: at the first
/// event, then at the first event at least [`LOG_INTERVAL`] after the last
/// line, each line counting the events since the one before;
/// [`Throttle::flush`] writes the count of a burst that ended in between.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last_line: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one event at `now`. `Some(n)`: write a line now, covering
    /// `n` events (this one and those not yet written); `None`: a line was
    /// written less than [`LOG_INTERVAL`] ago.
    pub(crate) fn hit(&self, now: Instant) -> Option<u64> {
        let mut s = self.lock();
        s.suppressed += 1;
        take_if_due(&mut s, now)
    }

    /// `Some(n)`: write a line now for the `n` events not yet written, the
    /// last line being at least [`LOG_INTERVAL`] old (or whatever its age,
    /// when `last`: the server stops); `None`: none to write, or not yet.
    pub(crate) fn flush(&self, now: Instant, last: bool) -> Option<u64> {
        let mut s = self.lock();
        if s.suppressed == 0 {
            return None;
        }
        if last {
            return Some(std::mem::take(&mut s.suppressed));
        }
        take_if_due(&mut s, now)
    }
}

fn take_if_due(s: &mut State, now: Instant) -> Option<u64> {
    let due = s
        .last_line
        .is_none_or(|last| now.saturating_duration_since(last) >= LOG_INTERVAL);
    if !due {
        return None;
    }
    s.last_line = Some(now);
    Some(std::mem::take(&mut s.suppressed))
}

/// The log target of the server's lines: its module, not this one.
const TARGET: &str = "httpkit::server";

/// The connection events logged through a [`Throttle`] each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A waiting connection was closed to make room at the bound.
    Evicted,
    /// A connection was refused at the bound with every connection busy.
    Refused,
    /// A connection's request head did not arrive in time.
    HeaderReadTimeout,
    /// Accepting failed for a reason other than the one connection.
    AcceptFailed,
}

const EVENTS: [Event; 4] = [
    Event::Evicted,
    Event::Refused,
    Event::HeaderReadTimeout,
    Event::AcceptFailed,
];

/// The server's throttled log lines.
#[derive(Debug)]
pub(crate) struct Logs {
    throttles: [Throttle; 4],
    connections_max: usize,
    header_read_timeout: Duration,
}

impl Logs {
    /// Logs for a server with these bounds (named in the lines).
    pub(crate) fn new(connections_max: usize, header_read_timeout: Duration) -> Logs {
        Logs {
            throttles: Default::default(),
            connections_max,
            header_read_timeout,
        }
    }

    /// Records `event` (an accept failure with its `error`), writing a line
    /// when one is due.
    pub(crate) fn record(&self, event: Event, error: Option<&io::Error>) {
        if let Some(n) = self.throttles[event as usize].hit(Instant::now()) {
            self.write(event, n, error);
        }
    }

    /// Writes the lines due for events not yet written (all of them, when
    /// `last`: the server stops).
    pub(crate) fn flush(&self, last: bool) {
        let now = Instant::now();
        for event in EVENTS {
            if let Some(n) = self.throttles[event as usize].flush(now, last) {
                self.write(event, n, None);
            }
        }
    }

    /// Writes the line of `n` events of `event`, under the server's log
    /// target (`httpkit::server`).
    fn write(&self, event: Event, n: u64, error: Option<&io::Error>) {
        let connections_max = self.connections_max;
        match event {
            Event::Evicted => tracing::warn!(
                target: TARGET,
                connections_max,
                closed = n,
                "at the connection bound: closed the connections waiting longest for a request \
                 to serve new ones"
            ),
            Event::Refused => tracing::warn!(
                target: TARGET,
                connections_max,
                refused = n,
                code = "too_many_connections",
                "at the connection bound with every connection busy: refused new connections"
            ),
            Event::HeaderReadTimeout => tracing::info!(
                target: TARGET,
                closed = n,
                header_read_timeout = ?self.header_read_timeout,
                "closed connections whose request head did not arrive in time"
            ),
            Event::AcceptFailed => match error {
                Some(e) => tracing::error!(
                    target: TARGET,
                    error = %e, errors = n, pause = ?super::ACCEPT_ERROR_PAUSE,
                    "cannot accept connections; retrying (served connections continue)"
                ),
                None => tracing::error!(
                    target: TARGET,
                    errors = n,
                    "cannot accept connections; retrying (served connections continue)"
                ),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counting_the_rest() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let interval_ms = u64::try_from(LOG_INTERVAL.as_millis()).expect("fits");
        assert_eq!(t.flush(t0, false), None, "nothing to write");
        assert_eq!(t.hit(t0), Some(1));
        assert_eq!(t.flush(ms(1), false), None, "nothing to write");
        assert_eq!(t.hit(ms(1)), None);
        assert_eq!(t.hit(ms(interval_ms - 1)), None);
        assert_eq!(t.flush(ms(interval_ms - 1), false), None, "not yet");
        assert_eq!(t.hit(ms(interval_ms)), Some(3));
        assert_eq!(t.hit(ms(interval_ms + 1)), None);
        assert_eq!(t.hit(ms(interval_ms + 2)), None);
        // The burst ended: its tail is written one interval after the line.
        assert_eq!(t.flush(ms(2 * interval_ms - 1), false), None);
        assert_eq!(t.flush(ms(2 * interval_ms), false), Some(2));
        assert_eq!(t.flush(ms(3 * interval_ms), false), None);
        assert_eq!(t.hit(ms(3 * interval_ms)), Some(1));
        assert_eq!(t.hit(ms(5 * interval_ms)), Some(1));
        // When the server stops, the rest is written at once.
        assert_eq!(t.hit(ms(5 * interval_ms + 1)), None);
        assert_eq!(t.flush(ms(5 * interval_ms + 2), true), Some(1));
        assert_eq!(t.flush(ms(5 * interval_ms + 3), true), None);
    }
}
