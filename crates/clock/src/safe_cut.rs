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
//! reading's instant is the cut itself.
//!
//! # The staleness bound
//!
//! The cut a read returns was published some time before the read, and the
//! cut never advances faster than real time: at a later real instant `t`,
//! `cut(t) - c <= t - O`, `O` being the instant of the observation that
//! produced `c`. A deadline `c + ttl` judged later at a fresher cut would
//! therefore end up to `R - O` early in real time, `R` being the request.
//! So every reading carries a *staleness bound* `S >= R - O`
//! ([`ClockReading::staleness`]), and a deadline is counted from
//! `c + S` ([`ClockReading::grant_base`]) while expiry is still judged at
//! `c`. With `k` the first read of this process that saw the row's
//! `(epoch, publish_seq)` and `j` the current one:
//!
//! `S = row_age_k + (at_j - at_k)`
//!
//! where `row_age = db_now - published_at` (database time, floored at zero)
//! and `at` is the monotonic instant taken just before a read's query:
//! database time only for the age at first sight, this host's monotonic
//! clock for the time since, so a database clock that stalls, steps back or
//! steps forward after first sight neither shrinks nor inflates it. The
//! request arrived before `at_j`, and `db_now` was read after `at`, so
//! neither the read's own duration nor the wait for a pooled connection
//! needs adding. The row is dated (`published_at`) by the database time
//! of the sampler's observation the cut came from, not by its publish, so
//! the time between the two (a round trip, or a sampler paused between
//! them) is in `row_age` too.
//!
//! The same bound decides staleness: rule 2 below calls a reading stale
//! when `S`, or the row's age now, exceeds `gap_max`, so a certain reading
//! has `S <= gap_max`.
//!
//! A reading is *certain* only when all of these hold, checked in this
//! order (the first failing one names the [`UncertainReason`]):
//!
//! 1. a row exists, else [`UncertainReason::NoCut`]: no sampler has ever
//!    claimed an epoch (the reading's instant is then the Unix epoch, the
//!    same lower bound the database gives a quarantined installation);
//! 2. the cut is fresh, else [`UncertainReason::Stale`]: the staleness
//!    bound `S` above is at most the sampling-gap bound `gap_max`. `S`
//!    exceeds it when
//!    * this process has seen the same `(epoch, publish_seq)` for longer
//!      than `gap_max` less the row's age at first sight, measured on its
//!      monotonic clock from the first read that saw it (taken before that
//!      read's query, so the measurement errs towards stale), or
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
//! * The database does not answer: the read fails with
//!   [`ClockError::StorageUnavailable`] (`503 storage_unavailable`, as every
//!   store operation then answers); the row does not decode or the tables
//!   are missing: [`ClockError::Unavailable`] (`503 clock_unavailable`); no
//!   operation runs at a guessed instant. Counted in
//!   [`SafeTimeStatus::read_errors_total`].
//! * The sampler stops, pauses, loses its connection or leadership without
//!   a successor: within `gap_max` readings turn stale. Admissions and
//!   reclaim pause; release and renewal go on at the frozen cut, and a
//!   renewal's new expiry is counted from the frozen cut plus the growing
//!   staleness bound, so a cut that later vouches for the frozen period
//!   (the sampler resuming, a standby carrying the cut over) cannot cut the
//!   holder short.
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
/// last, when it first saw it and how old the row was then (rule 2 and the
/// staleness bound of the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Staleness {
    seen: Option<Seen>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    epoch: i64,
    publish_seq: i64,
    first_at: Instant,
    first_age: SignedDuration,
}

/// What [`Staleness::judge`] found for one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    /// Why the reading is uncertain (`None`: certain).
    pub uncertain: Option<UncertainReason>,
    /// The reading's staleness bound `S` (module docs); zero without a row.
    /// Never negative; at most `gap_max` when certain.
    pub staleness: SignedDuration,
}

impl Staleness {
    /// Applies the certainty rule and the staleness bound of the module
    /// docs to one read of `row`, whose query started at the monotonic
    /// instant `at`. `gap_max` must be positive.
    pub fn judge(
        &mut self,
        row: Option<&CutRow>,
        at: Instant,
        gap_max: SignedDuration,
    ) -> Judgement {
        let Some(row) = row else {
            self.seen = None;
            return Judgement {
                uncertain: Some(UncertainReason::NoCut),
                staleness: SignedDuration::ZERO,
            };
        };
        let row_age = row
            .db_now
            .duration_since(row.published_at)
            .max(SignedDuration::ZERO);
        let seen = match self.seen {
            Some(s) if (s.epoch, s.publish_seq) == (row.epoch, row.publish_seq) => s,
            _ => {
                let s = Seen {
                    epoch: row.epoch,
                    publish_seq: row.publish_seq,
                    first_at: at,
                    first_age: row_age,
                };
                self.seen = Some(s);
                s
            }
        };
        let unchanged_for = SignedDuration::try_from(at.saturating_duration_since(seen.first_at))
            .unwrap_or(SignedDuration::MAX);
        let staleness = seen.first_age.saturating_add(unchanged_for);
        Judgement {
            uncertain: judge_reading(
                row.uncertain,
                row_age.max(staleness),
                unchanged_for,
                gap_max,
            ),
            staleness,
        }
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
                Err(match e {
                    safetime_pg::SafeTimeError::Backend(_) => ClockError::StorageUnavailable(
                        "the database holding the safe expiry cut did not answer".into(),
                    ),
                    _ => ClockError::Unavailable("the safe expiry cut could not be read".into()),
                })
            }
            Ok(row) => {
                let Judgement {
                    uncertain,
                    staleness,
                } = st.staleness.judge(row.as_ref(), at, self.gap_max);
                let now = row.as_ref().map_or(Timestamp::UNIX_EPOCH, |r| r.cut);
                let deadline_limit = row
                    .as_ref()
                    .and_then(|r| r.cut.checked_add(r.policy.horizon()).ok());
                let next = SafeTimeStatus {
                    uncertain,
                    read_error: false,
                    read_errors_total: st.read_errors_total,
                    row,
                    gap_max: self.gap_max,
                };
                SafeCutClock::record(&mut st, next);
                Ok(ClockReading {
                    now,
                    uncertain,
                    staleness,
                    deadline_limit,
                })
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
            proof_started_at: ts(published),
            db_now: ts(db_now),
            policy: HorizonPolicy::verified(1, 1_000, &HorizonPolicy::digest_of(1, 1_000)).unwrap(),
        }
    }

    const P: &str = "2026-11-29T12:00:00Z";

    fn j(uncertain: Option<UncertainReason>, staleness_ms: i64) -> Judgement {
        Judgement {
            uncertain,
            staleness: SignedDuration::from_millis(staleness_ms),
        }
    }

    #[test]
    fn judge_table() {
        let gap = SignedDuration::from_millis(200);
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut s = Staleness::default();
        // No row: no staleness to bound.
        assert_eq!(s.judge(None, t0, gap), j(Some(UncertainReason::NoCut), 0));
        // Fresh and certain; a database age of exactly the bound is fresh.
        let r = row(1, 5, P, "2026-11-29T12:00:00.2Z");
        assert_eq!(s.judge(Some(&r), t0, gap), j(None, 200));
        // The age at first sight counts: the same row 1 ms later is past
        // the bound, whatever database time now says.
        let r = row(1, 5, P, P);
        assert_eq!(
            s.judge(Some(&r), ms(1), gap),
            j(Some(UncertainReason::Stale), 201)
        );
        // A new publish resets the memory. Unchanged for exactly the bound:
        // fresh; one millisecond more: stale.
        let r6 = row(1, 6, P, P);
        assert_eq!(s.judge(Some(&r6), ms(300), gap), j(None, 0));
        assert_eq!(s.judge(Some(&r6), ms(500), gap), j(None, 200));
        assert_eq!(
            s.judge(Some(&r6), ms(501), gap),
            j(Some(UncertainReason::Stale), 201)
        );
        // A new epoch with the same publish_seq is a change too.
        let r6e = row(2, 6, P, P);
        assert_eq!(s.judge(Some(&r6e), ms(600), gap), j(None, 0));
        // A database age above the monotonic estimate (the database clock
        // ran ahead since first sight) does not inflate the bound, but past
        // the gap bound it makes the reading stale.
        let r6e_ahead = row(2, 6, P, "2026-11-29T12:00:00.15Z");
        assert_eq!(s.judge(Some(&r6e_ahead), ms(650), gap), j(None, 50));
        let r6e_step = row(2, 6, P, "2026-11-29T13:00:00Z");
        assert_eq!(
            s.judge(Some(&r6e_step), ms(660), gap),
            j(Some(UncertainReason::Stale), 60)
        );
        // First sight of a row already older than the bound (database time).
        let mut fresh = Staleness::default();
        let old = row(1, 1, P, "2026-11-29T12:00:00.200001Z");
        assert_eq!(
            fresh.judge(Some(&old), t0, gap),
            Judgement {
                uncertain: Some(UncertainReason::Stale),
                staleness: SignedDuration::from_micros(200_001),
            }
        );
        // A row "from the future" (database time behind `published_at`):
        // its age is floored at zero, the monotonic estimate still grows.
        let mut back = Staleness::default();
        let ahead = row(1, 1, "2026-11-29T12:00:01Z", P);
        assert_eq!(back.judge(Some(&ahead), t0, gap), j(None, 0));
        assert_eq!(back.judge(Some(&ahead), ms(150), gap), j(None, 150));
        // The publisher's reason, unless stale.
        let mut s = Staleness::default();
        let mut u = row(3, 1, P, P);
        u.uncertain = Some(UncertainReason::ClockStepForward);
        assert_eq!(
            s.judge(Some(&u), t0, gap),
            j(Some(UncertainReason::ClockStepForward), 0)
        );
        assert_eq!(
            s.judge(Some(&u), ms(201), gap),
            j(Some(UncertainReason::Stale), 201)
        );
        // The row disappearing forgets what was seen.
        assert_eq!(
            s.judge(None, ms(202), gap),
            j(Some(UncertainReason::NoCut), 0)
        );
        assert_eq!(
            s.judge(Some(&u), ms(203), gap),
            j(Some(UncertainReason::ClockStepForward), 0)
        );
    }

    /// The staleness bound at its boundaries, to the nanosecond: zero,
    /// exactly the gap bound (certain, and the bound is the whole gap), one
    /// nanosecond over (stale), split between the age at first sight and
    /// the monotonic time since.
    #[test]
    fn staleness_bound_boundaries() {
        let gap = SignedDuration::from_secs(5);
        let t0 = Instant::now();
        let ns = |n: u64| t0 + Duration::from_nanos(n);
        let at = |age_ns: i64| {
            (Timestamp::from_nanosecond(1_795_953_600_000_000_000 + i128::from(age_ns)))
                .unwrap()
                .to_string()
        };
        let cases: [(i64, u64, Option<UncertainReason>, i64); 6] = [
            (0, 0, None, 0),
            (5_000_000_000, 0, None, 5_000_000_000),
            (
                5_000_000_001,
                0,
                Some(UncertainReason::Stale),
                5_000_000_001,
            ),
            (0, 5_000_000_000, None, 5_000_000_000),
            (
                0,
                5_000_000_001,
                Some(UncertainReason::Stale),
                5_000_000_001,
            ),
            (
                2_000_000_000,
                3_000_000_001,
                Some(UncertainReason::Stale),
                5_000_000_001,
            ),
        ];
        for (first_age_ns, since_ns, want, bound_ns) in cases {
            let mut s = Staleness::default();
            let r = row(1, 1, P, &at(first_age_ns));
            s.judge(Some(&r), t0, gap);
            let got = s.judge(Some(&r), ns(since_ns), gap);
            assert_eq!(
                got,
                Judgement {
                    uncertain: want,
                    staleness: SignedDuration::from_nanos(bound_ns),
                },
                "first age {first_age_ns} ns, then {since_ns} ns"
            );
        }
    }

    /// A reading carries its staleness bound, and its grant base is the cut
    /// plus that bound: equal to the cut at zero staleness (and for the
    /// system and test clocks), never past `Timestamp::MAX`.
    #[test]
    fn grant_base_is_the_cut_plus_the_staleness_bound() {
        let cut = ts("2026-11-29T12:00:00Z");
        let exact = ClockReading::certain(cut);
        assert_eq!(
            (exact.grant_base(), exact.staleness, exact.deadline_limit),
            (cut, SignedDuration::ZERO, None)
        );
        for ns in [0, 1, 5_000_000_000, 5_000_000_001] {
            let r = ClockReading {
                staleness: SignedDuration::from_nanos(ns),
                ..ClockReading::certain(cut)
            };
            assert_eq!(
                r.grant_base(),
                cut + SignedDuration::from_nanos(ns),
                "{ns} ns"
            );
        }
        let r = ClockReading {
            staleness: SignedDuration::from_nanos(1),
            ..ClockReading::certain(Timestamp::MAX)
        };
        assert_eq!(r.grant_base(), Timestamp::MAX);
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
