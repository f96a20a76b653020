//! Rate-limited logging: a burst of the same event is one log line.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest time between two log lines of one kind of connection
/// event: a flood of refusals or timeouts is visible within seconds, yet
/// costs at most one line per kind per interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Counts one kind of event and says when a log line is due: the first
/// event, then the first one at least [`LOG_INTERVAL`] after the last line.
/// The events in between are counted into the next line (so the count of
/// a burst's tail shows with the next event, not on its own).
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
    /// Records one event at `now`. `Some(n)`: write a line now, covering
    /// `n` events (this one and those suppressed since the last line);
    /// `None`: a line was written less than [`LOG_INTERVAL`] ago.
    pub(crate) fn hit(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let due = s
            .last_line
            .is_none_or(|last| now.saturating_duration_since(last) >= LOG_INTERVAL);
        if due {
            s.last_line = Some(now);
            Some(std::mem::take(&mut s.suppressed) + 1)
        } else {
            s.suppressed += 1;
            None
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
        assert_eq!(t.hit(t0), Some(1));
        assert_eq!(t.hit(ms(1)), None);
        assert_eq!(t.hit(ms(interval_ms - 1)), None);
        assert_eq!(t.hit(ms(interval_ms)), Some(3));
        assert_eq!(t.hit(ms(interval_ms + 1)), None);
        assert_eq!(t.hit(ms(3 * interval_ms)), Some(2));
        assert_eq!(t.hit(ms(5 * interval_ms)), Some(1));
    }
}
