//! How far the initial quarantine's proof has come ([`QuarantineProgress`]),
//! as a reader of the persisted cut sees it, and what the proof needs in
//! all ([`SafeTimeConfig::quarantine_run`], the tracker's own rule).
//!
//! The proof clears only after one uninterrupted run, within one epoch,
//! of trusted monotonic time (less the drift allowance) covering the
//! sealed horizon, and never before the recovery grace (see
//! [`crate::tracker`]); the database also refuses the clearing before a
//! full horizon of its own time has passed since the proof began. A reader
//! has the database's side: `proof_started_at` (the database time of the
//! last anomaly, which restarted the proof) and the database time of its
//! read. So what is still needed is the run the tracker needs minus the
//! database time observed since the proof began.

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use crate::config::SafeTimeConfig;

impl SafeTimeConfig {
    /// The shortest uninterrupted run of monotonic time that clears an
    /// initial quarantine of `horizon`: the least `t` whose trusted part,
    /// `t * (1 - drift)` rounded down, covers `horizon`, and at least the
    /// recovery grace. A negative horizon counts as zero.
    pub fn quarantine_run(&self, horizon: SignedDuration) -> SignedDuration {
        let horizon_ns = horizon.as_nanos().max(0);
        let kept = i128::from(1_000_000 - self.drift_ppm());
        // trusted(t) = floor(t * kept / 10^6) >= h  <=>  t * kept >= h * 10^6.
        let run_ns = (horizon_ns * 1_000_000 + kept - 1) / kept;
        let run_ns = run_ns.max(self.recovery_grace().as_nanos());
        // At most horizon / 0.9 (drift is at most 10%) of a SignedDuration
        // horizon, so the run of any horizon a policy can seal (a bigint of
        // milliseconds) is representable; a longer one saturates.
        SignedDuration::try_from_nanos_i128(run_ns).unwrap_or(SignedDuration::MAX)
    }
}

/// The initial quarantine's proof as one reading of the cut shows it. Every
/// duration is exact to the nanosecond and never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantineProgress {
    /// The sealed horizon of the current epoch.
    pub horizon: SignedDuration,
    /// The drift allowance the run is computed with, parts per million.
    pub drift_ppm: u32,
    /// The whole uninterrupted run the proof needs
    /// ([`SafeTimeConfig::quarantine_run`] of `horizon`).
    pub required: SignedDuration,
    /// Database time since the proof began (`db_now - proof_started_at`,
    /// zero if the database clock went back).
    pub observed: SignedDuration,
    /// `required - observed`, zero once the proof has run long enough (it
    /// then clears with the sampler's next consistent observation).
    pub remaining: SignedDuration,
}

impl QuarantineProgress {
    /// The progress of a proof that began at database time
    /// `proof_started_at`, read at database time `db_now`, for the sealed
    /// `horizon`, with the samplers' `config` (its drift allowance and
    /// recovery grace).
    pub fn new(
        config: &SafeTimeConfig,
        horizon: SignedDuration,
        proof_started_at: Timestamp,
        db_now: Timestamp,
    ) -> QuarantineProgress {
        let required = config.quarantine_run(horizon);
        let observed = db_now
            .duration_since(proof_started_at)
            .max(SignedDuration::ZERO);
        let remaining = required
            .checked_sub(observed)
            .unwrap_or(SignedDuration::ZERO)
            .max(SignedDuration::ZERO);
        QuarantineProgress {
            horizon,
            drift_ppm: config.drift_ppm(),
            required,
            observed,
            remaining,
        }
    }
}

/// One sentence: what is left, what the proof needs in all and why, and
/// what restarts it. Durations in ISO 8601.
impl fmt::Display for QuarantineProgress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the initial quarantine needs {} more of uninterrupted trusted time \
             (a proof of {} in all: the sealed horizon {} plus the {} ppm drift allowance; \
             {} observed since it began; an anomaly, a sampler restart or a takeover restarts it)",
            self.remaining, self.required, self.horizon, self.drift_ppm, self.observed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(drift_ppm: u32, recovery_grace: SignedDuration) -> SafeTimeConfig {
        SafeTimeConfig::new(
            drift_ppm,
            SignedDuration::from_secs(1),
            SignedDuration::from_secs(5),
            SignedDuration::from_millis(500),
            3,
            recovery_grace,
        )
        .unwrap()
    }

    /// The run is the least one whose trusted part covers the horizon:
    /// exactly, one nanosecond less does not.
    #[test]
    fn quarantine_run_is_the_least_covering_run() {
        let grace = SignedDuration::from_secs(5);
        let day = SignedDuration::from_hours(24);
        // 10 s at 50 ppm: 10 s / 0.99995 = 10.000500025001250...s, rounded up.
        let c = cfg(50, grace);
        assert_eq!(
            c.quarantine_run(SignedDuration::from_secs(10)),
            SignedDuration::new(10, 500_026)
        );
        // The default 3,650 days: 15,768.788439... s more than the horizon.
        assert_eq!(
            SafeTimeConfig::default().quarantine_run(day * 3_650),
            SignedDuration::new(315_375_768, 788_439_422)
        );
        for (drift, horizon) in [
            (50, SignedDuration::from_secs(10)),
            (100_000, day),
            (0, day),
        ] {
            let c = cfg(drift, SignedDuration::ZERO);
            let run = c.quarantine_run(horizon).as_nanos();
            assert!(c.trusted(run) >= horizon.as_nanos(), "{drift} {horizon}");
            assert!(c.trusted(run - 1) < horizon.as_nanos(), "{drift} {horizon}");
        }
        // Zero drift: the horizon itself; never below the recovery grace.
        assert_eq!(cfg(0, grace).quarantine_run(day), day);
        assert_eq!(
            cfg(50, grace).quarantine_run(SignedDuration::from_secs(1)),
            grace
        );
    }

    #[test]
    fn progress_is_exact_and_never_negative() {
        let c = cfg(50, SignedDuration::from_secs(5));
        let start: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
        let at = |s: &str| -> Timestamp { s.parse().unwrap() };
        let p = QuarantineProgress::new(
            &c,
            SignedDuration::from_secs(10),
            start,
            at("2026-11-29T12:00:04.25Z"),
        );
        assert_eq!(
            p,
            QuarantineProgress {
                horizon: SignedDuration::from_secs(10),
                drift_ppm: 50,
                required: SignedDuration::new(10, 500_026),
                observed: SignedDuration::from_millis(4_250),
                remaining: SignedDuration::new(5, 750_500_026),
            }
        );
        assert_eq!(
            p.to_string(),
            "the initial quarantine needs PT5.750500026S more of uninterrupted trusted time \
             (a proof of PT10.000500026S in all: the sealed horizon PT10S plus the 50 ppm \
             drift allowance; PT4.25S observed since it began; an anomaly, a sampler restart \
             or a takeover restarts it)"
        );
        // Past the run: nothing left. A clock gone back: nothing observed.
        let done = QuarantineProgress::new(
            &c,
            SignedDuration::from_secs(10),
            start,
            at("2026-11-29T12:01:00Z"),
        );
        assert_eq!(
            (done.observed, done.remaining),
            (SignedDuration::from_secs(60), SignedDuration::ZERO)
        );
        let back = QuarantineProgress::new(
            &c,
            SignedDuration::from_secs(10),
            start,
            at("2026-11-29T11:59:00Z"),
        );
        assert_eq!(
            (back.observed, back.remaining),
            (SignedDuration::ZERO, SignedDuration::new(10, 500_026))
        );
    }
}
