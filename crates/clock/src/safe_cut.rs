//! The safe-cut clock: the service's time is the *safe expiry cut* that the
//! safe-time sampler persists in PostgreSQL (the row `tollgate_safetime`
//! of tollgate-pg's migration 0018).
//!
//! # Design
//!
//! The sampler (a separate process) publishes the cut: an instant before
//! which no authority may be treated as expired, never moving backward,
//! never past database time, fenced by a durable epoch, and flagged
//! *uncertain* after any anomaly. This clock does no timekeeping of its
//! own: every [`Clock::read`] is one `SELECT` of the cut row
//! (the cut reader's `read_cut`) on the service's pool, and the
//! reading's instant is the cut itself. The cut lags true time, so every
//! deadline computed from it is late, never early.
//!
//! A reading is *certain* only when all of these hold, checked in this
//! order (the first failing one names the [`UncertainReason`]):
//!
//! 1. a row exists, else [`UncertainReason::NoCut`]: no sampler has ever
//!    claimed an epoch (the reading's instant is then the Unix epoch, the
//!    same lower bound the database gives a quarantined installation);
//! 2. the cut is fresh, else [`UncertainReason::Stale`]. Two checks, either
//!    one suffices to call it stale:
//!    * this process has seen the same `(epoch, publish_seq)` for longer
//!      than the sampling-gap bound `gap_max`, measured on its monotonic
//!      clock from the first read that saw it (taken before that read's
//!      query, so the measurement errs towards stale);
//!    * the row's own age, `db_now - published_at`, exceeds `gap_max`. Both
//!      instants are the database's, so no host clock skew enters; it
//!      catches a cut that was already old when this process first saw it.
//!
//!    Stale takes precedence over the publisher's reason: a frozen row's
//!    reason describes a past state that nobody is updating;
//! 3. the publisher declared the cut certain, else the row's reason.
//!
//! # Failure modes
//!
//! * The database does not answer, or the row does not decode: the read
//!   fails with [`ClockError::Unavailable`] (`503 clock_unavailable`); no
//!   operation runs at a guessed instant. Counted in
//!   [`SafeTimeStatus::read_errors_total`].
//! * The sampler stops, pauses, loses its connection or leadership without
//!   a successor: within `gap_max` readings turn stale. Admissions and
//!   reclaim pause; release and renewal go on at the frozen cut, which can
//!   only make expiries later.
//! * The database clock steps: the sampler marks the cut uncertain; a
//!   forward step also makes `db_now - published_at` jump, so readers see
//!   `stale` at once. The cut itself never follows a step.
//! * This host's wall clock is never read. Its monotonic clock only
//!   measures staleness; were it to stall, the database-age check still
//!   applies.
//! * Pool exhaustion makes a read wait for a connection (bounded by the
//!   pool's acquire timeout), then fail as unavailable.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use sqlx::PgPool;

use crate::{
    Clock, ClockError, ClockKind, ClockReading, CutRow, SafeTimeStatus, UncertainReason,
    judge_reading, read_cut,
};

/// The staleness memory of a reader: the `(epoch, publish_seq)` it saw
/// last and when it first saw it (rule 2 of the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Staleness {
    seen: Option<(i64, i64, Instant)>,
}

impl Staleness {
    /// Applies the certainty rule of the module docs to one read of `row`,
    /// whose query started at the monotonic instant `at`; returns why the
    /// reading is uncertain (`None`: certain). `gap_max` must be positive.
    pub fn judge(
        &mut self,
        row: Option<&CutRow>,
        at: Instant,
        gap_max: SignedDuration,
    ) -> Option<UncertainReason> {
        let Some(row) = row else {
            self.seen = None;
            return Some(UncertainReason::NoCut);
        };
        let key = (row.epoch, row.publish_seq);
        let first_seen = match self.seen {
            Some((epoch, seq, first)) if (epoch, seq) == key => first,
            _ => {
                self.seen = Some((key.0, key.1, at));
                at
            }
        };
        let unchanged_for = SignedDuration::try_from(at.saturating_duration_since(first_seen))
            .unwrap_or(SignedDuration::MAX);
        judge_reading(
            row.uncertain,
            row.db_now.duration_since(row.published_at),
            unchanged_for,
            gap_max,
        )
    }
}

#[derive(Debug, Default)]
struct ReaderState {
    staleness: Staleness,
    status: Option<SafeTimeStatus>,
    read_errors_total: u64,
}

/// The safe-cut clock; see the module docs.
pub struct SafeCutClock {
    pool: PgPool,
    gap_max: SignedDuration,
    state: Mutex<ReaderState>,
}

impl std::fmt::Debug for SafeCutClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeCutClock")
            .field("gap_max", &self.gap_max)
            .finish_non_exhaustive()
    }
}

impl SafeCutClock {
    /// A clock reading the cut on `pool`, calling a cut stale after
    /// `gap_max` (positive; the configuration validates it).
    pub fn new(pool: PgPool, gap_max: SignedDuration) -> SafeCutClock {
        SafeCutClock {
            pool,
            gap_max,
            state: Mutex::new(ReaderState::default()),
        }
    }

    /// The sampling-gap bound.
    pub fn gap_max(&self) -> SignedDuration {
        self.gap_max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReaderState> {
        // The state is plain data, whole even if a holder panicked.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts and records a read that failed (or was abandoned): the
    /// status keeps the last row and reason, flagged `read_error`.
    fn failed_read(&self, st: &mut ReaderState) {
        st.read_errors_total = st.read_errors_total.saturating_add(1);
        let next = SafeTimeStatus {
            read_error: true,
            read_errors_total: st.read_errors_total,
            gap_max: self.gap_max,
            ..st.status.clone().unwrap_or(SafeTimeStatus {
                uncertain: None,
                read_error: true,
                read_errors_total: 0,
                row: None,
                gap_max: self.gap_max,
            })
        };
        SafeCutClock::record(st, next);
    }

    /// Records `next` as the status and logs a change of certainty.
    fn record(st: &mut ReaderState, next: SafeTimeStatus) {
        let before = st.status.as_ref().map(|s| (s.read_error, s.uncertain));
        let after = (next.read_error, next.uncertain);
        if before != Some(after) {
            let row = next.row.as_ref();
            match after {
                (true, _) => tracing::warn!("safe time: the cut cannot be read"),
                (false, Some(reason)) => tracing::warn!(
                    reason = reason.code(),
                    cut = ?row.map(|r| r.cut.to_string()),
                    epoch = ?row.map(|r| r.epoch),
                    "safe time uncertain: acquire, consolidation and reclaim paused"
                ),
                (false, None) => tracing::info!(
                    cut = ?row.map(|r| r.cut.to_string()),
                    epoch = ?row.map(|r| r.epoch),
                    "safe time certain"
                ),
            }
        }
        st.status = Some(next);
    }
}

/// `ceil(d)` in whole seconds, at least 1.
pub fn retry_after_secs(d: SignedDuration) -> u64 {
    let ns = d.as_nanos().max(0);
    let secs = (ns + 999_999_999) / 1_000_000_000;
    u64::try_from(secs)
        .expect("the whole seconds of a SignedDuration, at most 2^63, fit in u64")
        .max(1)
}

#[async_trait]
impl Clock for SafeCutClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        let at = Instant::now();
        let result = read_cut(&self.pool).await;
        let mut st = self.lock();
        match result {
            Err(e) => {
                tracing::debug!(code = e.code(), error = %e, "safe time: reading the cut failed");
                self.failed_read(&mut st);
                Err(ClockError::Unavailable(
                    "the safe expiry cut could not be read".into(),
                ))
            }
            Ok(row) => {
                let uncertain = st.staleness.judge(row.as_ref(), at, self.gap_max);
                let now = row.as_ref().map_or(Timestamp::UNIX_EPOCH, |r| r.cut);
                let next = SafeTimeStatus {
                    uncertain,
                    read_error: false,
                    read_errors_total: st.read_errors_total,
                    row,
                    gap_max: self.gap_max,
                };
                SafeCutClock::record(&mut st, next);
                Ok(ClockReading { now, uncertain })
            }
        }
    }

    fn kind(&self) -> ClockKind {
        ClockKind::SafeCut
    }

    fn retry_after_secs(&self) -> u64 {
        retry_after_secs(self.gap_max)
    }

    fn safe_time(&self) -> Option<SafeTimeStatus> {
        self.lock().status.clone()
    }

    async fn refresh_safe_time(&self, bound: Duration) -> Option<SafeTimeStatus> {
        if tokio::time::timeout(bound, self.read()).await.is_err() {
            // The read was abandoned (the pool or the database is too slow):
            // report it as the failed read it is.
            let mut st = self.lock();
            self.failed_read(&mut st);
        }
        self.safe_time()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetime::HorizonPolicy;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn row(epoch: i64, seq: i64, published: &str, db_now: &str) -> CutRow {
        CutRow {
            epoch,
            cut: ts("2026-11-29T12:00:00Z"),
            uncertain: None,
            quarantined: false,
            publish_seq: seq,
            published_at: ts(published),
            db_now: ts(db_now),
            policy: HorizonPolicy::verified(1, 1_000, &HorizonPolicy::digest_of(1, 1_000)).unwrap(),
        }
    }

    const P: &str = "2026-11-29T12:00:00Z";

    #[test]
    fn judge_table() {
        let gap = SignedDuration::from_millis(200);
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut s = Staleness::default();
        // No row.
        assert_eq!(s.judge(None, t0, gap), Some(UncertainReason::NoCut));
        // Fresh and certain; database age exactly the bound is still fresh.
        let r = row(1, 5, P, "2026-11-29T12:00:00.2Z");
        assert_eq!(s.judge(Some(&r), t0, gap), None);
        // Unchanged for exactly the bound: fresh; one millisecond more: stale.
        let r = row(1, 5, P, P);
        assert_eq!(s.judge(Some(&r), ms(200), gap), None);
        assert_eq!(
            s.judge(Some(&r), ms(201), gap),
            Some(UncertainReason::Stale)
        );
        // A new publish resets the memory.
        let r6 = row(1, 6, P, P);
        assert_eq!(s.judge(Some(&r6), ms(300), gap), None);
        assert_eq!(s.judge(Some(&r6), ms(500), gap), None);
        // A new epoch with the same publish_seq is a change too.
        let r6e = row(2, 6, P, P);
        assert_eq!(s.judge(Some(&r6e), ms(600), gap), None);
        // First sight of a row already older than the bound (database time).
        let mut fresh = Staleness::default();
        let old = row(1, 1, P, "2026-11-29T12:00:00.200001Z");
        assert_eq!(
            fresh.judge(Some(&old), t0, gap),
            Some(UncertainReason::Stale)
        );
        // The publisher's reason, unless stale.
        let mut s = Staleness::default();
        let mut u = row(3, 1, P, P);
        u.uncertain = Some(UncertainReason::ClockStepForward);
        assert_eq!(
            s.judge(Some(&u), t0, gap),
            Some(UncertainReason::ClockStepForward)
        );
        assert_eq!(
            s.judge(Some(&u), ms(201), gap),
            Some(UncertainReason::Stale)
        );
        // The row disappearing forgets what was seen.
        assert_eq!(s.judge(None, ms(202), gap), Some(UncertainReason::NoCut));
        assert_eq!(
            s.judge(Some(&u), ms(203), gap),
            Some(UncertainReason::ClockStepForward)
        );
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        for (d, want) in [
            (SignedDuration::from_nanos(1), 1),
            (SignedDuration::from_millis(200), 1),
            (SignedDuration::from_secs(1), 1),
            (SignedDuration::new(1, 1), 2),
            (SignedDuration::from_secs(5), 5),
            (SignedDuration::ZERO, 1),
            (SignedDuration::MAX, 9_223_372_036_854_775_808),
        ] {
            assert_eq!(retry_after_secs(d), want, "{d}");
        }
    }
}
