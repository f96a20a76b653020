//! A tenant's admission rate: at most `admissions_max` exec admissions in
//! any window of `window` on the cut.
//!
//! The window ending at cut `c` is the half-open interval
//! `(c - window, c]`: an admission made at cut `a` counts against every
//! admission at a cut `c` with `a > c - window`, and stops counting at
//! exactly `c = a + window`. The cut never goes backward, so no admission
//! is ever counted into a window it did not happen in; admission itself
//! needs a certain cut, so the window is never judged on an uncertain one.
//! The end of each admission's window (`a + window`) is a deadline like any
//! other: it must fit inside `cut + horizon`.

use jiff::{SignedDuration, Timestamp};

use crate::error::LcError;
use crate::model::CutReading;

/// The largest `admissions_max` (a store reads at most this many recent
/// admissions per check).
pub const ADMISSIONS_MAX_MAX: u32 = 100_000;

/// The longest window: one day (a longer one would only make the count a
/// quota, which Tollgate's units already are).
pub const WINDOW_MAX: SignedDuration = SignedDuration::from_hours(24);

/// The default rate: 600 admissions per minute per tenant, high enough for
/// an agent fleet, low enough that one runaway client cannot flood the
/// reconciler.
pub const DEFAULT: AdmissionRate = AdmissionRate {
    admissions_max: 600,
    window: SignedDuration::from_secs(60),
};

/// At most `admissions_max` admissions per `window` (checked by
/// [`AdmissionRate::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionRate {
    admissions_max: u32,
    window: SignedDuration,
}

impl AdmissionRate {
    /// A rate of `admissions_max` (`1..=`[`ADMISSIONS_MAX_MAX`]) per
    /// `window` (positive, at most [`WINDOW_MAX`]).
    ///
    /// # Errors
    /// [`LcError::InvalidRate`] naming the bound that failed.
    pub fn new(admissions_max: u32, window: SignedDuration) -> Result<AdmissionRate, LcError> {
        if admissions_max == 0 || admissions_max > ADMISSIONS_MAX_MAX {
            return Err(LcError::InvalidRate {
                reason: format!(
                    "admissions_max must be 1..={ADMISSIONS_MAX_MAX}, not {admissions_max}"
                ),
            });
        }
        if window <= SignedDuration::ZERO || window > WINDOW_MAX {
            return Err(LcError::InvalidRate {
                reason: format!(
                    "the window must be positive and at most {WINDOW_MAX:#}, not {window:#}"
                ),
            });
        }
        Ok(AdmissionRate {
            admissions_max,
            window,
        })
    }

    /// The most admissions per window.
    pub fn admissions_max(&self) -> u32 {
        self.admissions_max
    }

    /// The window.
    pub fn window(&self) -> SignedDuration {
        self.window
    }

    /// The exclusive start of the window ending at `at.cut`
    /// (`at.cut - window`; [`Timestamp::MIN`] when that is not
    /// representable, so every admission counts).
    pub fn window_start(&self, at: CutReading) -> Timestamp {
        at.cut.checked_sub(self.window).unwrap_or(Timestamp::MIN)
    }

    /// The deadline a new admission at `at` sets: the end of its window,
    /// `at.cut + window`.
    ///
    /// # Errors
    /// [`LcError::InvalidRate`] when that is not representable.
    pub fn window_end(&self, at: CutReading) -> Result<Timestamp, LcError> {
        at.cut
            .checked_add(self.window)
            .map_err(|_| LcError::InvalidRate {
                reason: format!("cut {} + {:#} is not representable", at.cut, self.window),
            })
    }

    /// Whether one more admission at `at` fits, given the cuts of the
    /// tenant's most recent admissions after [`AdmissionRate::window_start`],
    /// newest first, at most `admissions_max` of them (the store reads no
    /// more).
    ///
    /// # Errors
    /// [`LcError::RateLimited`] when `admissions_max` admissions are already
    /// in the window, with `retry_after_s`: whole seconds (at least 1,
    /// rounded up) until the oldest of them leaves it.
    pub fn check(&self, at: CutReading, recent_newest_first: &[Timestamp]) -> Result<(), LcError> {
        let start = self.window_start(at);
        let in_window = recent_newest_first
            .iter()
            .take(self.admissions_max as usize)
            .filter(|a| **a > start)
            .count();
        if in_window < self.admissions_max as usize {
            return Ok(());
        }
        // The oldest counted admission leaves the window at `a + window`.
        let oldest = recent_newest_first[in_window - 1];
        let leaves = oldest.checked_add(self.window).unwrap_or(Timestamp::MAX);
        let wait_ns = u128::try_from(leaves.duration_since(at.cut).as_nanos()).unwrap_or(0);
        let retry_after_s =
            u64::try_from(wait_ns.max(1).div_ceil(1_000_000_000)).unwrap_or(u64::MAX);
        Err(LcError::RateLimited {
            admissions_max: self.admissions_max,
            window: self.window,
            retry_after_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: i128 = 1_800_000_000_000_000_500;
    const W_NS: i128 = 10_000_000_000;

    fn t(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    fn rate(n: u32) -> AdmissionRate {
        AdmissionRate::new(n, SignedDuration::from_secs(10)).unwrap()
    }

    fn limited(retry_after_s: u64) -> LcError {
        LcError::RateLimited {
            admissions_max: 2,
            window: SignedDuration::from_secs(10),
            retry_after_s,
        }
    }

    #[test]
    fn bounds_of_the_rate() {
        let w = SignedDuration::from_secs(1);
        assert!(AdmissionRate::new(1, w).is_ok());
        assert!(AdmissionRate::new(ADMISSIONS_MAX_MAX, w).is_ok());
        for n in [0, ADMISSIONS_MAX_MAX + 1] {
            assert_eq!(AdmissionRate::new(n, w).unwrap_err().code(), "invalid_rate");
        }
        assert!(AdmissionRate::new(1, SignedDuration::from_nanos(1)).is_ok());
        assert!(AdmissionRate::new(1, WINDOW_MAX).is_ok());
        for w in [
            SignedDuration::ZERO,
            SignedDuration::from_nanos(-1),
            WINDOW_MAX + SignedDuration::from_nanos(1),
        ] {
            assert_eq!(AdmissionRate::new(1, w).unwrap_err().code(), "invalid_rate");
        }
        assert_eq!(rate(2).admissions_max(), 2);
        assert_eq!(rate(2).window(), SignedDuration::from_secs(10));
        assert_eq!(
            DEFAULT,
            AdmissionRate::new(600, SignedDuration::from_secs(60)).unwrap()
        );
    }

    #[test]
    fn an_admission_counts_until_exactly_window_after_it() {
        let r = rate(2);
        let recent = [t(BASE), t(BASE - 1)];
        // At BASE - 1 + W the older one has just left: (c - W, c] excludes it.
        let at = |ns| CutReading::certain(t(ns));
        r.check(at(BASE - 1 + W_NS), &recent).unwrap();
        // One nanosecond earlier both count; the older leaves in 1 ns -> 1 s.
        assert_eq!(
            r.check(at(BASE - 2 + W_NS), &recent).unwrap_err(),
            limited(1)
        );
        // Right after the newest: the older leaves in W - 1 ns -> 10 s.
        assert_eq!(r.check(at(BASE), &recent).unwrap_err(), limited(10));
        assert_eq!(
            r.check(at(BASE + 1), &recent).unwrap_err(),
            limited(10),
            "W - 2 ns rounds up to 10 s"
        );
        assert_eq!(
            r.check(at(BASE - 1 + W_NS - 1_000_000_000), &recent)
                .unwrap_err(),
            limited(1)
        );
        assert_eq!(
            r.check(at(BASE - 1 + W_NS - 1_000_000_001), &recent)
                .unwrap_err(),
            limited(2)
        );
    }

    #[test]
    fn fewer_than_the_most_fit_and_only_the_newest_count() {
        let r = rate(2);
        let at = CutReading::certain(t(BASE));
        r.check(at, &[]).unwrap();
        r.check(at, &[t(BASE)]).unwrap();
        // Older ones outside the window do not count.
        r.check(at, &[t(BASE), t(BASE - W_NS)]).unwrap();
        // More than admissions_max given: only the newest admissions_max count.
        assert_eq!(
            r.check(at, &[t(BASE), t(BASE - 5), t(BASE - 7)])
                .unwrap_err(),
            limited(10)
        );
        assert_eq!(r.window_start(at), t(BASE - W_NS));
        assert_eq!(r.window_end(at).unwrap(), t(BASE + W_NS));
        let min = CutReading::certain(Timestamp::MIN);
        assert_eq!(r.window_start(min), Timestamp::MIN);
        let max = CutReading::certain(Timestamp::MAX);
        assert_eq!(r.window_end(max).unwrap_err().code(), "invalid_rate");
    }
}
