//! The instant pair: the exact PostgreSQL encoding of a [`Timestamp`].
//!
//! An instant of `ns` nanoseconds since the Unix epoch is stored as
//! `(floor_us, submicro_ns)` with `floor_us = floor(ns / 1000)` (floor, also
//! before the epoch) and `submicro_ns = ns - 1000 * floor_us` in `0..=999`.
//! Lexicographic order on pairs equals instant order, so PostgreSQL can index
//! and compare `(expiry_floor_us, expiry_submicro_ns)` tuples directly:
//! `timestamptz` holds only whole microseconds, so every instant of every
//! subsystem (a deadline, the cut) is stored as such a pair, never rounded.
//! Proved in `formal/Tollgate/LeaseTiming.v`, theorems `pair_order_iff` and
//! the round trips.

use jiff::Timestamp;

use crate::timestamp::{TIMESTAMP_MAX_NS, TIMESTAMP_MIN_NS};

/// An instant as `(floor_us, submicro_ns)`; see the module docs.
///
/// The derived `Ord` is lexicographic and equals instant order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstantPair {
    /// `floor(ns / 1000)`: whole microseconds since the epoch, rounded down.
    pub floor_us: i64,
    /// The remaining nanoseconds, `0..=999`.
    pub submicro_ns: i16,
}

/// A pair that does not denote an instant of the timestamp domain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// `submicro_ns` was outside `0..=999`.
    #[error("submicro_ns must be in 0..=999, got {submicro_ns}")]
    SubmicroOutOfRange {
        /// The rejected remainder.
        submicro_ns: i16,
    },
    /// The pair denotes an instant outside `Timestamp::MIN..=Timestamp::MAX`.
    #[error("instant pair ({floor_us}, {submicro_ns}) is outside the timestamp domain")]
    OutOfDomain {
        /// The rejected microseconds.
        floor_us: i64,
        /// The rejected remainder.
        submicro_ns: i16,
    },
}

impl PairError {
    /// The stable machine-readable code: `invalid_instant_pair`.
    pub fn code(&self) -> &'static str {
        "invalid_instant_pair"
    }
}

impl InstantPair {
    /// The encoding of [`Timestamp::MIN`].
    pub const MIN: InstantPair = InstantPair::from_nanos_unchecked(TIMESTAMP_MIN_NS);
    /// The encoding of [`Timestamp::MAX`].
    pub const MAX: InstantPair = InstantPair::from_nanos_unchecked(TIMESTAMP_MAX_NS);

    const fn from_nanos_unchecked(ns: i128) -> InstantPair {
        // Within the domain |ns / 1000| < 2^59, so the casts are lossless.
        InstantPair {
            floor_us: ns.div_euclid(1000) as i64,
            submicro_ns: ns.rem_euclid(1000) as i16,
        }
    }

    /// Encodes an instant exactly. Never fails: every timestamp has a pair.
    ///
    /// ```
    /// use jiff::Timestamp;
    /// use safetime::InstantPair;
    /// let t = Timestamp::from_nanosecond(-1).unwrap();
    /// assert_eq!(InstantPair::encode(t), InstantPair { floor_us: -1, submicro_ns: 999 });
    /// ```
    pub fn encode(t: Timestamp) -> InstantPair {
        InstantPair::from_nanos_unchecked(t.as_nanosecond())
    }

    /// `1000 * floor_us + submicro_ns`: nanoseconds since the epoch.
    pub fn as_nanos(self) -> i128 {
        i128::from(self.floor_us) * 1000 + i128::from(self.submicro_ns)
    }

    /// Decodes a pair back to its instant.
    ///
    /// # Errors
    /// [`PairError::SubmicroOutOfRange`] unless `0 <= submicro_ns <= 999`;
    /// [`PairError::OutOfDomain`] if the instant is outside the timestamp
    /// domain.
    pub fn decode(self) -> Result<Timestamp, PairError> {
        if !(0..=999).contains(&self.submicro_ns) {
            return Err(PairError::SubmicroOutOfRange {
                submicro_ns: self.submicro_ns,
            });
        }
        let ns = self.as_nanos();
        if !(TIMESTAMP_MIN_NS..=TIMESTAMP_MAX_NS).contains(&ns) {
            return Err(PairError::OutOfDomain {
                floor_us: self.floor_us,
                submicro_ns: self.submicro_ns,
            });
        }
        Timestamp::from_nanosecond(ns).map_err(|_| PairError::OutOfDomain {
            floor_us: self.floor_us,
            submicro_ns: self.submicro_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Exact-value tables at the boundaries; the i128 oracle comparison and
    //! the order property live in the `tollgate` crate's `tests/oracle.rs`.

    use super::*;

    fn pair(floor_us: i64, submicro_ns: i16) -> InstantPair {
        InstantPair {
            floor_us,
            submicro_ns,
        }
    }

    #[test]
    fn domain_end_pairs() {
        assert_eq!(InstantPair::MIN, pair(-377_705_023_201_000_000, 0));
        assert_eq!(InstantPair::MAX, pair(253_402_207_200_999_999, 999));
        assert_eq!(InstantPair::encode(Timestamp::MIN), InstantPair::MIN);
        assert_eq!(InstantPair::encode(Timestamp::MAX), InstantPair::MAX);
    }

    #[test]
    fn encode_table() {
        let check = |ns: i128, want: InstantPair| {
            let t = Timestamp::from_nanosecond(ns).unwrap();
            assert_eq!(InstantPair::encode(t), want, "ns {ns}");
            assert_eq!(want.as_nanos(), ns, "as_nanos {want:?}");
            assert_eq!(want.decode(), Ok(t), "decode {want:?}");
        };
        check(0, pair(0, 0));
        check(1, pair(0, 1));
        check(999, pair(0, 999));
        check(1_000, pair(1, 0));
        check(1_001, pair(1, 1));
        check(-1, pair(-1, 999));
        check(-999, pair(-1, 1));
        check(-1_000, pair(-1, 0));
        check(-1_001, pair(-2, 999));
        check(123_456_789, pair(123_456, 789));
        check(-123_456_789, pair(-123_457, 211));
        check(TIMESTAMP_MIN_NS, InstantPair::MIN);
        check(TIMESTAMP_MAX_NS, InstantPair::MAX);
        check(TIMESTAMP_MIN_NS + 1, pair(-377_705_023_201_000_000, 1));
        check(TIMESTAMP_MAX_NS - 1, pair(253_402_207_200_999_999, 998));
    }

    #[test]
    fn decode_rejects_bad_pairs() {
        let check = |p: InstantPair, want: PairError| {
            assert_eq!(p.decode(), Err(want.clone()), "{p:?}");
            assert_eq!(want.code(), "invalid_instant_pair");
        };
        for submicro_ns in [-1, 1_000, i16::MIN, i16::MAX] {
            check(
                pair(0, submicro_ns),
                PairError::SubmicroOutOfRange { submicro_ns },
            );
        }
        let below = pair(InstantPair::MIN.floor_us - 1, 999);
        let above = pair(InstantPair::MAX.floor_us + 1, 0);
        for p in [below, above, pair(i64::MIN, 0), pair(i64::MAX, 999)] {
            check(
                p,
                PairError::OutOfDomain {
                    floor_us: p.floor_us,
                    submicro_ns: p.submicro_ns,
                },
            );
        }
        // The submicro check comes first, even out of the domain.
        check(
            pair(i64::MAX, -1),
            PairError::SubmicroOutOfRange { submicro_ns: -1 },
        );
        assert_eq!(
            PairError::SubmicroOutOfRange { submicro_ns: -1 }.code(),
            "invalid_instant_pair"
        );
    }

    #[test]
    fn as_nanos_at_i64_ends() {
        assert_eq!(
            pair(i64::MAX, 999).as_nanos(),
            9_223_372_036_854_775_807_999
        );
        assert_eq!(pair(i64::MIN, 0).as_nanos(), -9_223_372_036_854_775_808_000);
        assert_eq!(pair(-2, 3).as_nanos(), -1_997);
    }
}
