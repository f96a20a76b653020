//! The sampler's tuning ([`SafeTimeConfig`]): sample interval, drift
//! allowance, sampling-gap and round-trip bounds, and what recovery needs;
//! each with its default and its accepted range.

use jiff::SignedDuration;

/// Default drift allowance between the database and the sampler host's
/// monotonic clock, in parts per million: 50 ppm, 4.32 s a day.
pub const DEFAULT_DRIFT_PPM: u32 = 50;

/// Largest accepted drift allowance, in parts per million (10%): a larger
/// allowance would make the step detector meaningless.
pub const DRIFT_PPM_MAX: u32 = 100_000;

/// Default interval between samples.
pub const DEFAULT_SAMPLE_INTERVAL: SignedDuration = SignedDuration::from_secs(1);

/// Default sampling-gap bound: a longer gap between samples makes the cut
/// uncertain, and a published cut older than this is read as uncertain.
pub const DEFAULT_GAP_MAX: SignedDuration = SignedDuration::from_secs(5);

/// Largest accepted sampling-gap bound (one hour). The gap bound is also
/// how long a reader trusts a cut that is no longer republished: a larger
/// one would let a stopped sampler's cut read as certain (never `stale`)
/// for practically ever. An hour is far above any sane setting (the
/// default is 5 s) and still bounds that exposure.
pub const GAP_MAX_MAX: SignedDuration = SignedDuration::from_hours(1);

/// Default longest plausible round trip of one observation query.
pub const DEFAULT_ROUND_TRIP_MAX: SignedDuration = SignedDuration::from_secs(1);

/// Default number of consecutive consistent observations before recovery.
pub const DEFAULT_STABLE_OBSERVATIONS_MIN: u32 = 3;

/// Largest accepted number of consecutive consistent observations before
/// recovery (10,000: almost three hours at the default 1 s interval). A
/// larger count would keep the cut uncertain for so long that it is a
/// misconfiguration, not a policy.
pub const STABLE_OBSERVATIONS_MAX: u32 = 10_000;

/// Default grace period of monotonic time after the last anomaly before
/// recovery.
pub const DEFAULT_RECOVERY_GRACE: SignedDuration = SignedDuration::from_secs(5);

/// Largest accepted recovery grace (one hour): a longer grace would keep
/// the cut uncertain after every anomaly for longer than an outage is
/// worth, so it is read as a misconfiguration (the default is 5 s).
pub const RECOVERY_GRACE_MAX: SignedDuration = SignedDuration::from_hours(1);

/// A rejected [`SafeTimeConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SafeTimeConfigError {
    /// The drift allowance is above [`DRIFT_PPM_MAX`].
    #[error("drift allowance must be at most {max} ppm, got {got}")]
    DriftTooLarge {
        /// The value given.
        got: u32,
        /// [`DRIFT_PPM_MAX`].
        max: u32,
    },
    /// A duration that must be positive was zero or negative.
    #[error("{name} must be positive, got {got}")]
    NonPositive {
        /// Which setting.
        name: &'static str,
        /// The value given.
        got: SignedDuration,
    },
    /// A duration above its upper bound ([`GAP_MAX_MAX`] for `gap_max`,
    /// [`RECOVERY_GRACE_MAX`] for `recovery_grace`).
    #[error("{name} must be at most {max}, got {got}")]
    TooLong {
        /// Which setting.
        name: &'static str,
        /// The value given.
        got: SignedDuration,
        /// Its upper bound.
        max: SignedDuration,
    },
    /// More stable observations than [`STABLE_OBSERVATIONS_MAX`].
    #[error("stable_observations_min must be at most {max}, got {got}")]
    TooManyStableObservations {
        /// The value given.
        got: u32,
        /// [`STABLE_OBSERVATIONS_MAX`].
        max: u32,
    },
    /// The round-trip bound is not below the sampling-gap bound.
    #[error("round_trip_max ({round_trip_max}) must be below gap_max ({gap_max})")]
    RoundTripNotBelowGap {
        /// The round-trip bound.
        round_trip_max: SignedDuration,
        /// The sampling-gap bound.
        gap_max: SignedDuration,
    },
    /// The sample interval is not below the sampling-gap bound, so every
    /// sample would be a gap.
    #[error("sample interval ({interval}) must be below gap_max ({gap_max})")]
    IntervalNotBelowGap {
        /// The sample interval.
        interval: SignedDuration,
        /// The sampling-gap bound.
        gap_max: SignedDuration,
    },
    /// Zero stable observations would make recovery instant.
    #[error("stable_observations_min must be at least 1")]
    NoStableObservations,
}

/// The sampler's tuning. Build with [`SafeTimeConfig::new`]; every field is
/// validated there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SafeTimeConfig {
    drift_ppm: u32,
    interval: SignedDuration,
    gap_max: SignedDuration,
    round_trip_max: SignedDuration,
    stable_observations_min: u32,
    recovery_grace: SignedDuration,
}

impl Default for SafeTimeConfig {
    fn default() -> Self {
        SafeTimeConfig {
            drift_ppm: DEFAULT_DRIFT_PPM,
            interval: DEFAULT_SAMPLE_INTERVAL,
            gap_max: DEFAULT_GAP_MAX,
            round_trip_max: DEFAULT_ROUND_TRIP_MAX,
            stable_observations_min: DEFAULT_STABLE_OBSERVATIONS_MIN,
            recovery_grace: DEFAULT_RECOVERY_GRACE,
        }
    }
}

impl SafeTimeConfig {
    /// A validated configuration.
    ///
    /// # Errors
    /// [`SafeTimeConfigError`]: drift above [`DRIFT_PPM_MAX`], a
    /// non-positive duration (`recovery_grace` may be zero), a gap bound
    /// above [`GAP_MAX_MAX`] or a recovery grace above
    /// [`RECOVERY_GRACE_MAX`], a round-trip bound or interval not below the
    /// gap bound (so both are below [`GAP_MAX_MAX`] too), or stable
    /// observations outside `1..=`[`STABLE_OBSERVATIONS_MAX`].
    pub fn new(
        drift_ppm: u32,
        interval: SignedDuration,
        gap_max: SignedDuration,
        round_trip_max: SignedDuration,
        stable_observations_min: u32,
        recovery_grace: SignedDuration,
    ) -> Result<SafeTimeConfig, SafeTimeConfigError> {
        let config = SafeTimeConfig {
            drift_ppm,
            interval,
            gap_max,
            round_trip_max,
            stable_observations_min,
            recovery_grace,
        };
        config.validate()?;
        Ok(config)
    }

    /// The checks of [`SafeTimeConfig::new`], in order. Apart from `new`
    /// because cargo-mutants (27.1) does not look inside functions named
    /// `new`, and these bounds are under the mutation gate.
    fn validate(&self) -> Result<(), SafeTimeConfigError> {
        let SafeTimeConfig {
            drift_ppm,
            interval,
            gap_max,
            round_trip_max,
            stable_observations_min,
            recovery_grace,
        } = *self;
        if drift_ppm > DRIFT_PPM_MAX {
            return Err(SafeTimeConfigError::DriftTooLarge {
                got: drift_ppm,
                max: DRIFT_PPM_MAX,
            });
        }
        for (name, got) in [
            ("interval", interval),
            ("gap_max", gap_max),
            ("round_trip_max", round_trip_max),
        ] {
            if !got.is_positive() {
                return Err(SafeTimeConfigError::NonPositive { name, got });
            }
        }
        if recovery_grace.is_negative() {
            return Err(SafeTimeConfigError::NonPositive {
                name: "recovery_grace",
                got: recovery_grace,
            });
        }
        for (name, got, max) in [
            ("gap_max", gap_max, GAP_MAX_MAX),
            ("recovery_grace", recovery_grace, RECOVERY_GRACE_MAX),
        ] {
            if got > max {
                return Err(SafeTimeConfigError::TooLong { name, got, max });
            }
        }
        if round_trip_max >= gap_max {
            return Err(SafeTimeConfigError::RoundTripNotBelowGap {
                round_trip_max,
                gap_max,
            });
        }
        if interval >= gap_max {
            return Err(SafeTimeConfigError::IntervalNotBelowGap { interval, gap_max });
        }
        if stable_observations_min == 0 {
            return Err(SafeTimeConfigError::NoStableObservations);
        }
        if stable_observations_min > STABLE_OBSERVATIONS_MAX {
            return Err(SafeTimeConfigError::TooManyStableObservations {
                got: stable_observations_min,
                max: STABLE_OBSERVATIONS_MAX,
            });
        }
        Ok(())
    }

    /// Drift allowance, parts per million.
    pub fn drift_ppm(&self) -> u32 {
        self.drift_ppm
    }
    /// Interval between samples.
    pub fn interval(&self) -> SignedDuration {
        self.interval
    }
    /// Sampling-gap bound.
    pub fn gap_max(&self) -> SignedDuration {
        self.gap_max
    }
    /// Longest plausible observation round trip.
    pub fn round_trip_max(&self) -> SignedDuration {
        self.round_trip_max
    }
    /// Consecutive consistent observations needed to recover.
    pub fn stable_observations_min(&self) -> u32 {
        self.stable_observations_min
    }
    /// Monotonic time after the last anomaly needed to recover.
    pub fn recovery_grace(&self) -> SignedDuration {
        self.recovery_grace
    }

    /// `elapsed_ns * (1 - drift)`, rounded down; never negative.
    pub(crate) fn trusted(&self, elapsed_ns: i128) -> i128 {
        let e = elapsed_ns.max(0);
        e * i128::from(1_000_000 - self.drift_ppm) / 1_000_000
    }

    /// `elapsed_ns * drift`, rounded up.
    pub(crate) fn slack(&self, elapsed_ns: i128) -> i128 {
        let e = elapsed_ns.max(0);
        (e * i128::from(self.drift_ppm) + 999_999) / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_rejects_bad_values() {
        let one = SignedDuration::from_secs(1);
        assert_eq!(
            SafeTimeConfig::new(100_001, one, one * 5, one / 2, 1, one),
            Err(SafeTimeConfigError::DriftTooLarge {
                got: 100_001,
                max: DRIFT_PPM_MAX
            })
        );
        assert_eq!(
            SafeTimeConfig::new(50, one, one, one / 2, 1, one),
            Err(SafeTimeConfigError::IntervalNotBelowGap {
                interval: one,
                gap_max: one
            })
        );
        assert_eq!(
            SafeTimeConfig::new(50, one, one * 5, one / 2, 0, one),
            Err(SafeTimeConfigError::NoStableObservations)
        );
    }

    /// Every bound of `SafeTimeConfig::new`, exact: at a bound accepted,
    /// one nanosecond (one ppm, one observation) past it refused, with the
    /// value and the bound.
    #[test]
    fn config_boundaries_are_exact() {
        let one = SignedDuration::from_secs(1);
        let ns = SignedDuration::from_nanos(1);
        let zero = SignedDuration::ZERO;
        let hour = SignedDuration::from_hours(1);
        assert_eq!((GAP_MAX_MAX, RECOVERY_GRACE_MAX), (hour, hour));
        assert_eq!(STABLE_OBSERVATIONS_MAX, 10_000);
        type E = SafeTimeConfigError;
        let too_long = |name, got| {
            Err(E::TooLong {
                name,
                got,
                max: hour,
            })
        };
        let too_many = |got| {
            Err(E::TooManyStableObservations {
                got,
                max: STABLE_OBSERVATIONS_MAX,
            })
        };
        let non_positive = |name, got| Err(E::NonPositive { name, got });
        let huge = SignedDuration::from_secs(1_000_000_000_000);
        // (drift_ppm, interval, gap_max, round_trip_max, stable, recovery_grace, expected)
        let cases = [
            (DRIFT_PPM_MAX, one, one * 5, one / 2, 1, one, Ok(())),
            (
                DRIFT_PPM_MAX + 1,
                one,
                one * 5,
                one / 2,
                1,
                one,
                Err(E::DriftTooLarge {
                    got: DRIFT_PPM_MAX + 1,
                    max: DRIFT_PPM_MAX,
                }),
            ),
            (0, ns, ns * 3, ns, 1, zero, Ok(())),
            (
                0,
                zero,
                one * 5,
                one / 2,
                1,
                one,
                non_positive("interval", zero),
            ),
            (0, one, zero, one / 2, 1, one, non_positive("gap_max", zero)),
            (0, one, -one, one / 2, 1, one, non_positive("gap_max", -one)),
            (
                0,
                one,
                one * 5,
                zero,
                1,
                one,
                non_positive("round_trip_max", zero),
            ),
            (
                0,
                one,
                one * 5,
                one / 2,
                1,
                -ns,
                non_positive("recovery_grace", -ns),
            ),
            (0, one, hour, one / 2, 1, one, Ok(())),
            (
                0,
                one,
                hour + ns,
                one / 2,
                1,
                one,
                too_long("gap_max", hour + ns),
            ),
            (0, one, huge, one / 2, 1, one, too_long("gap_max", huge)),
            (0, one, one * 5, one / 2, 1, hour, Ok(())),
            (
                0,
                one,
                one * 5,
                one / 2,
                1,
                hour + ns,
                too_long("recovery_grace", hour + ns),
            ),
            (
                0,
                one,
                one * 5,
                one / 2,
                1,
                huge,
                too_long("recovery_grace", huge),
            ),
            (0, hour - ns, hour, hour - ns, 1, one, Ok(())),
            (
                0,
                one,
                hour,
                hour,
                1,
                one,
                Err(E::RoundTripNotBelowGap {
                    round_trip_max: hour,
                    gap_max: hour,
                }),
            ),
            (
                0,
                hour,
                hour,
                one,
                1,
                one,
                Err(E::IntervalNotBelowGap {
                    interval: hour,
                    gap_max: hour,
                }),
            ),
            (
                0,
                one,
                one * 5,
                one / 2,
                0,
                one,
                Err(E::NoStableObservations),
            ),
            (0, one, one * 5, one / 2, 10_000, one, Ok(())),
            (0, one, one * 5, one / 2, 10_001, one, too_many(10_001)),
            (0, one, one * 5, one / 2, u32::MAX, one, too_many(u32::MAX)),
        ];
        for (drift, interval, gap_max, round_trip_max, stable, grace, expected) in cases {
            assert_eq!(
                SafeTimeConfig::new(drift, interval, gap_max, round_trip_max, stable, grace)
                    .map(|_| ()),
                expected,
                "drift {drift} interval {interval} gap {gap_max} rtt {round_trip_max} \
                 stable {stable} grace {grace}"
            );
        }
        assert_eq!(
            too_long("gap_max", hour + ns).unwrap_err().to_string(),
            "gap_max must be at most PT1H, got PT1H0.000000001S"
        );
        assert_eq!(
            too_long("recovery_grace", huge).unwrap_err().to_string(),
            "recovery_grace must be at most PT1H, got PT277777777H46M40S"
        );
        assert_eq!(
            too_many(10_001).unwrap_err().to_string(),
            "stable_observations_min must be at most 10000, got 10001"
        );
    }
}
