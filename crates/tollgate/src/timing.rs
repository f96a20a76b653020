//! Exact lease timing: the grant policy, expiry computation and the reclaim
//! predicate.
//!
//! # Design
//!
//! Every instant is a [`jiff::Timestamp`] and every duration a
//! [`jiff::SignedDuration`]; nothing is rounded, truncated or converted to a
//! float. The rules:
//!
//! * A requested TTL must be positive and is clamped to `max_ttl` and to
//!   nothing else.
//! * `expiry = now + granted_ttl`, checked. An expiry outside the timestamp
//!   domain is an error *before* any balance moves
//!   ([`TimingError::UnrepresentableExpiry`]).
//! * A lease with expiry `e` is reclaimable at supplied time `n` exactly when
//!   `e + reclaim_grace <= n`. The sum may lie beyond [`Timestamp::MAX`]
//!   (grace may be as large as [`SignedDuration::MAX`]); such a deadline has
//!   not elapsed even at `Timestamp::MAX`. It is never saturated.
//! * [`GrantPolicy::reclaim_cutoff`] is `n - reclaim_grace`, checked; `None`
//!   (underflow) means no representable expiry is due. `e <= cutoff(n)` is the
//!   same predicate as `e + grace <= n` (proved in `formal/Tollgate/LeaseTiming.v`,
//!   theorem `cutoff_equivalence`, and property-tested against an i128 oracle).
//!
//! Failure modes this module exists to prevent: a lease that expires early
//! because a sum saturated, a TTL silently truncated to microseconds, or a
//! grace converted to a coarser unit.

use jiff::{SignedDuration, Timestamp};

pub use safetime::timestamp::{TIMESTAMP_MAX_NS, TIMESTAMP_MIN_NS};
use safetime::{DeadlineBound, DeadlineKind};

/// The deadline kind of a lease grant: a lease's authority ends at
/// `expiry + reclaim_grace`, at most `max_ttl + reclaim_grace` after the
/// grant (a renewal is a new grant from its own instant).
pub const LEASE_GRANT_DEADLINE: DeadlineKind = DeadlineKind::named("tollgate.lease_grant");

/// Errors of policy construction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `max_ttl` was zero or negative.
    #[error("max_ttl must be positive, got {max_ttl}")]
    NonPositiveMaxTtl {
        /// The rejected value.
        max_ttl: SignedDuration,
    },
    /// `reclaim_grace` was negative.
    #[error("reclaim_grace must be nonnegative, got {reclaim_grace}")]
    NegativeReclaimGrace {
        /// The rejected value.
        reclaim_grace: SignedDuration,
    },
}

impl PolicyError {
    /// The stable machine-readable code: always `invalid_policy`.
    pub fn code(&self) -> &'static str {
        "invalid_policy"
    }
}

/// Errors of timing arithmetic on a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The requested TTL was zero or negative.
    #[error("requested ttl must be positive, got {ttl}")]
    InvalidTtl {
        /// The rejected TTL.
        ttl: SignedDuration,
    },
    /// `now + ttl` lies outside the timestamp domain.
    #[error("expiry {now} + {ttl} is not representable as a timestamp")]
    UnrepresentableExpiry {
        /// The supplied time.
        now: Timestamp,
        /// The granted (clamped) TTL.
        ttl: SignedDuration,
    },
}

/// The lease timing policy: `max_ttl` (positive) and `reclaim_grace`
/// (nonnegative, up to [`SignedDuration::MAX`]).
///
/// Fields are private so that every value has passed [`GrantPolicy::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrantPolicy {
    max_ttl: SignedDuration,
    reclaim_grace: SignedDuration,
}

impl GrantPolicy {
    /// Builds a policy.
    ///
    /// # Errors
    /// [`PolicyError::NonPositiveMaxTtl`] if `max_ttl <= 0`,
    /// [`PolicyError::NegativeReclaimGrace`] if `reclaim_grace < 0`. Zero grace
    /// and grace larger than the whole timestamp range are valid.
    ///
    /// # Panics
    /// Never.
    ///
    /// ```
    /// use jiff::SignedDuration;
    /// use tollgate::GrantPolicy;
    /// let p = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::MAX).unwrap();
    /// assert_eq!(p.reclaim_grace(), SignedDuration::MAX);
    /// assert!(GrantPolicy::new(SignedDuration::ZERO, SignedDuration::ZERO).is_err());
    /// ```
    pub fn new(
        max_ttl: SignedDuration,
        reclaim_grace: SignedDuration,
    ) -> Result<GrantPolicy, PolicyError> {
        if !max_ttl.is_positive() {
            return Err(PolicyError::NonPositiveMaxTtl { max_ttl });
        }
        if reclaim_grace.is_negative() {
            return Err(PolicyError::NegativeReclaimGrace { reclaim_grace });
        }
        Ok(GrantPolicy {
            max_ttl,
            reclaim_grace,
        })
    }

    /// The longest TTL a grant receives.
    pub fn max_ttl(&self) -> SignedDuration {
        self.max_ttl
    }

    /// How long after its expiry a lease stays releasable before it becomes
    /// reclaimable.
    pub fn reclaim_grace(&self) -> SignedDuration {
        self.reclaim_grace
    }

    /// The longest deadline this policy admits, for the sealed horizon's
    /// check ([`safetime::HorizonPolicy::covers`]): kind
    /// [`LEASE_GRANT_DEADLINE`], `max_ttl + reclaim_grace` exactly, or
    /// unbounded when that sum exceeds [`SignedDuration::MAX`] (grace may be
    /// as large as `SignedDuration::MAX`).
    ///
    /// # Panics
    /// Never.
    ///
    /// ```
    /// use jiff::SignedDuration;
    /// use tollgate::{GrantPolicy, LEASE_GRANT_DEADLINE};
    /// let p = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap();
    /// let b = p.deadline_bound();
    /// assert_eq!((b.kind(), b.longest()), (LEASE_GRANT_DEADLINE, Some(SignedDuration::from_secs(65))));
    /// ```
    pub fn deadline_bound(&self) -> DeadlineBound {
        DeadlineBound::sum(LEASE_GRANT_DEADLINE, self.max_ttl, self.reclaim_grace)
    }

    /// Clamps a requested TTL to `max_ttl` (and to nothing else).
    ///
    /// # Errors
    /// [`TimingError::InvalidTtl`] when `requested <= 0`.
    ///
    /// ```
    /// use jiff::SignedDuration;
    /// use tollgate::GrantPolicy;
    /// let p = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::ZERO).unwrap();
    /// assert_eq!(p.clamp_ttl(SignedDuration::from_nanos(1)).unwrap(), SignedDuration::from_nanos(1));
    /// assert_eq!(p.clamp_ttl(SignedDuration::from_secs(61)).unwrap(), SignedDuration::from_secs(60));
    /// ```
    pub fn clamp_ttl(&self, requested: SignedDuration) -> Result<SignedDuration, TimingError> {
        if !requested.is_positive() {
            return Err(TimingError::InvalidTtl { ttl: requested });
        }
        Ok(requested.min(self.max_ttl))
    }

    /// Clamps `requested` and computes `now + granted_ttl`, exactly.
    ///
    /// Returns `(expiry, granted_ttl)`.
    ///
    /// # Errors
    /// [`TimingError::InvalidTtl`] for a non-positive request,
    /// [`TimingError::UnrepresentableExpiry`] when the sum leaves the
    /// timestamp domain.
    pub fn expiry(
        &self,
        now: Timestamp,
        requested: SignedDuration,
    ) -> Result<(Timestamp, SignedDuration), TimingError> {
        let ttl = self.clamp_ttl(requested)?;
        let expiry = now
            .checked_add(ttl)
            .map_err(|_| TimingError::UnrepresentableExpiry { now, ttl })?;
        Ok((expiry, ttl))
    }

    /// `n - reclaim_grace`, checked. `None` on underflow: no representable
    /// expiry is due at `n`.
    ///
    /// ```
    /// use jiff::{SignedDuration, Timestamp};
    /// use tollgate::GrantPolicy;
    /// let p = GrantPolicy::new(SignedDuration::from_secs(1), SignedDuration::MAX).unwrap();
    /// assert_eq!(p.reclaim_cutoff(Timestamp::MAX), None);
    /// ```
    pub fn reclaim_cutoff(&self, n: Timestamp) -> Option<Timestamp> {
        n.checked_sub(self.reclaim_grace).ok()
    }

    /// Whether a lease with expiry `expiry` is reclaimable at supplied time
    /// `n`: exactly when `expiry + reclaim_grace <= n`.
    ///
    /// Evaluated in i128 nanoseconds, which hold every sum of an instant and a
    /// duration exactly, so a deadline beyond [`Timestamp::MAX`] is never
    /// reported as elapsed.
    pub fn is_reclaimable(&self, expiry: Timestamp, n: Timestamp) -> bool {
        // |expiry| < 2^69 ns and |grace| < 2^94 ns: the sum cannot overflow i128.
        expiry.as_nanosecond() + self.reclaim_grace.as_nanos() <= n.as_nanosecond()
    }

    /// How late a reclaim at supplied time `n` is for a lease with expiry
    /// `expiry`: `n - (expiry + reclaim_grace)`, exactly, when the lease is
    /// reclaimable at `n` ([`GrantPolicy::is_reclaimable`]); `None` when it
    /// is not. Zero means reclaimed at the first instant the rule allowed.
    ///
    /// ```
    /// use jiff::{SignedDuration, Timestamp};
    /// use tollgate::GrantPolicy;
    /// let p = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap();
    /// let e: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
    /// let n: Timestamp = "2026-11-29T12:00:07.000000001Z".parse().unwrap();
    /// assert_eq!(p.reclaim_late_by(e, n), Some(SignedDuration::new(2, 1)));
    /// assert_eq!(p.reclaim_late_by(n, n), None);
    /// ```
    ///
    /// # Panics
    /// Never.
    pub fn reclaim_late_by(&self, expiry: Timestamp, n: Timestamp) -> Option<SignedDuration> {
        if !self.is_reclaimable(expiry, n) {
            return None;
        }
        // 0 <= late <= n - expiry < 2^69 ns: exact in i128 and within
        // SignedDuration's range (about 2^93 ns).
        let late = n.as_nanosecond() - expiry.as_nanosecond() - self.reclaim_grace.as_nanos();
        SignedDuration::try_from_nanos_i128(late)
    }
}

#[cfg(test)]
mod tests {
    //! Exact-value tables at the boundaries (MIN, MAX, ±1, zero); the i128
    //! oracle comparison lives in `tests/oracle.rs`.

    use super::*;

    /// Durations in messages are ISO 8601, the format the API takes and
    /// returns (jiff's `Debug` would print `30s ago` for a negative one).
    #[test]
    fn messages_print_durations_as_iso_8601() {
        let ttl = SignedDuration::from_secs(-30);
        assert_eq!(
            TimingError::InvalidTtl { ttl }.to_string(),
            "requested ttl must be positive, got -PT30S"
        );
        assert_eq!(
            crate::RuleError::InvalidTtl { ttl }.to_string(),
            "requested ttl must be positive, got -PT30S"
        );
        assert_eq!(
            PolicyError::NonPositiveMaxTtl {
                max_ttl: SignedDuration::ZERO
            }
            .to_string(),
            "max_ttl must be positive, got PT0S"
        );
    }

    fn ns(v: i128) -> SignedDuration {
        SignedDuration::from_nanos_i128(v)
    }

    fn at(v: i128) -> Timestamp {
        Timestamp::from_nanosecond(v).unwrap()
    }

    fn policy(max_ttl_ns: i128, grace_ns: i128) -> GrantPolicy {
        GrantPolicy::new(ns(max_ttl_ns), ns(grace_ns)).unwrap()
    }

    #[test]
    fn new_validates_and_keeps_exact_values() {
        let check = |max: SignedDuration, grace: SignedDuration, want: Result<(), PolicyError>| {
            let got = GrantPolicy::new(max, grace);
            match want {
                Ok(()) => {
                    let p = got.unwrap();
                    assert_eq!((p.max_ttl(), p.reclaim_grace()), (max, grace));
                }
                Err(e) => assert_eq!(got, Err(e)),
            }
        };
        check(ns(1), ns(0), Ok(()));
        check(ns(1), SignedDuration::MAX, Ok(()));
        check(SignedDuration::MAX, ns(1), Ok(()));
        check(ns(7), ns(5), Ok(()));
        check(
            ns(0),
            ns(0),
            Err(PolicyError::NonPositiveMaxTtl { max_ttl: ns(0) }),
        );
        check(
            ns(-1),
            ns(-1),
            Err(PolicyError::NonPositiveMaxTtl { max_ttl: ns(-1) }),
        );
        check(
            SignedDuration::MIN,
            ns(0),
            Err(PolicyError::NonPositiveMaxTtl {
                max_ttl: SignedDuration::MIN,
            }),
        );
        check(
            ns(1),
            ns(-1),
            Err(PolicyError::NegativeReclaimGrace {
                reclaim_grace: ns(-1),
            }),
        );
        check(
            ns(1),
            SignedDuration::MIN,
            Err(PolicyError::NegativeReclaimGrace {
                reclaim_grace: SignedDuration::MIN,
            }),
        );
    }

    #[test]
    fn policy_error_code_is_stable() {
        let e = PolicyError::NegativeReclaimGrace {
            reclaim_grace: ns(-1),
        };
        assert_eq!(e.code(), "invalid_policy");
        assert_eq!(
            PolicyError::NonPositiveMaxTtl { max_ttl: ns(0) }.code(),
            "invalid_policy"
        );
    }

    #[test]
    fn clamp_ttl_table() {
        let p = policy(1_000, 0);
        let check = |req: i128, want: Result<i128, ()>| {
            let got = p.clamp_ttl(ns(req));
            match want {
                Ok(v) => assert_eq!(got, Ok(ns(v)), "req {req}"),
                Err(()) => assert_eq!(got, Err(TimingError::InvalidTtl { ttl: ns(req) })),
            }
        };
        check(1, Ok(1));
        check(2, Ok(2));
        check(999, Ok(999));
        check(1_000, Ok(1_000));
        check(1_001, Ok(1_000));
        check(SignedDuration::MAX.as_nanos(), Ok(1_000));
        check(0, Err(()));
        check(-1, Err(()));
        check(SignedDuration::MIN.as_nanos(), Err(()));
    }

    #[test]
    fn expiry_table() {
        let max = TIMESTAMP_MAX_NS;
        let min = TIMESTAMP_MIN_NS;
        let p = policy(SignedDuration::MAX.as_nanos(), 0);
        let check = |now: i128, req: i128, want: Result<(i128, i128), TimingError>| {
            let got = p
                .expiry(at(now), ns(req))
                .map(|(e, t)| (e.as_nanosecond(), t.as_nanos()));
            assert_eq!(got, want, "now {now} req {req}");
        };
        check(0, 1, Ok((1, 1)));
        check(-5, 3, Ok((-2, 3)));
        check(min, 1, Ok((min + 1, 1)));
        check(max - 1, 1, Ok((max, 1)));
        check(min, max - min, Ok((max, max - min)));
        check(
            max,
            1,
            Err(TimingError::UnrepresentableExpiry {
                now: at(max),
                ttl: ns(1),
            }),
        );
        check(
            max - 1,
            2,
            Err(TimingError::UnrepresentableExpiry {
                now: at(max - 1),
                ttl: ns(2),
            }),
        );
        check(0, 0, Err(TimingError::InvalidTtl { ttl: ns(0) }));
        check(max, -1, Err(TimingError::InvalidTtl { ttl: ns(-1) }));
        // The clamped TTL, not the requested one, is added and reported.
        let short = policy(10, 0);
        assert_eq!(
            short.expiry(at(max - 10), SignedDuration::MAX),
            Ok((at(max), ns(10)))
        );
        assert_eq!(
            short.expiry(at(max - 9), SignedDuration::MAX),
            Err(TimingError::UnrepresentableExpiry {
                now: at(max - 9),
                ttl: ns(10),
            })
        );
    }

    #[test]
    fn reclaim_cutoff_table() {
        let min = TIMESTAMP_MIN_NS;
        let max = TIMESTAMP_MAX_NS;
        let check = |grace: i128, n: i128, want: Option<i128>| {
            let got = policy(1, grace).reclaim_cutoff(at(n));
            assert_eq!(got.map(|c| c.as_nanosecond()), want, "grace {grace} n {n}");
        };
        check(0, 0, Some(0));
        check(0, min, Some(min));
        check(0, max, Some(max));
        check(1, 0, Some(-1));
        check(7, -3, Some(-10));
        check(1, min + 1, Some(min));
        check(1, min, None);
        check(2, min + 1, None);
        check(max - min, max, Some(min));
        check(max - min + 1, max, None);
        check(SignedDuration::MAX.as_nanos(), max, None);
    }

    #[test]
    fn is_reclaimable_table() {
        let min = TIMESTAMP_MIN_NS;
        let max = TIMESTAMP_MAX_NS;
        let check = |grace: i128, expiry: i128, n: i128, want: bool| {
            let got = policy(1, grace).is_reclaimable(at(expiry), at(n));
            assert_eq!(got, want, "grace {grace} expiry {expiry} n {n}");
        };
        // e + g <= n, at the boundary and one nanosecond either side.
        check(5, 10, 14, false);
        check(5, 10, 15, true);
        check(5, 10, 16, true);
        check(0, -3, -4, false);
        check(0, -3, -3, true);
        check(0, -3, -2, true);
        check(3, -10, -8, false);
        check(3, -10, -7, true);
        // Both domain ends.
        check(0, max, max, true);
        check(1, max, max, false);
        check(0, min, min, true);
        check(max - min, min, max, true);
        check(max - min + 1, min, max, false);
        // A grace beyond the whole range never elapses.
        check(SignedDuration::MAX.as_nanos(), min, max, false);
    }

    #[test]
    fn reclaim_late_by_table() {
        let min = TIMESTAMP_MIN_NS;
        let max = TIMESTAMP_MAX_NS;
        let check = |grace: i128, expiry: i128, n: i128, want: Option<i128>| {
            let got = policy(1, grace).reclaim_late_by(at(expiry), at(n));
            assert_eq!(got, want.map(ns), "grace {grace} expiry {expiry} n {n}");
        };
        // n - (e + g) at the boundary and one nanosecond either side.
        check(5, 10, 14, None);
        check(5, 10, 15, Some(0));
        check(5, 10, 16, Some(1));
        check(0, -3, -4, None);
        check(0, -3, -3, Some(0));
        check(3, -10, 100, Some(107));
        // Both domain ends: the widest lateness is the whole range.
        check(0, min, max, Some(max - min));
        check(1, min, max, Some(max - min - 1));
        check(max - min, min, max, Some(0));
        check(max - min + 1, min, max, None);
        check(0, max, max, Some(0));
        check(SignedDuration::MAX.as_nanos(), min, max, None);
    }

    /// The grant policy's deadline bound at its ends, and the sealed
    /// horizon's verdict on it: equal fits, one nanosecond over does not, a
    /// sum beyond `SignedDuration::MAX` never fits.
    #[test]
    fn deadline_bound_table() {
        use safetime::{HorizonPolicy, HorizonShortfall};
        let max = SignedDuration::MAX;
        let cases = [
            (ns(1), ns(0), Some(ns(1))),
            (
                ns(9_000_000_000),
                ns(1_000_000_000),
                Some(ns(10_000_000_000)),
            ),
            (
                ns(9_000_000_000),
                ns(1_000_000_001),
                Some(ns(10_000_000_001)),
            ),
            (max, ns(0), Some(max)),
            (max - ns(1), ns(1), Some(max)),
            (max, ns(1), None),
            (ns(1), max, None),
            (max, max, None),
        ];
        for (max_ttl, grace, longest) in cases {
            let b = GrantPolicy::new(max_ttl, grace).unwrap().deadline_bound();
            assert_eq!(
                (b.kind(), b.longest()),
                (LEASE_GRANT_DEADLINE, longest),
                "{max_ttl} + {grace}"
            );
        }
        assert_eq!(LEASE_GRANT_DEADLINE.name(), "tollgate.lease_grant");

        let sealed = |ms| HorizonPolicy::verified(2, ms, &HorizonPolicy::digest_of(2, ms)).unwrap();
        let ten = sealed(10_000);
        let covers = |p: &HorizonPolicy, max_ttl, grace| {
            p.covers(&[GrantPolicy::new(max_ttl, grace).unwrap().deadline_bound()])
        };
        let short = |longest| {
            Err(HorizonShortfall {
                kind: LEASE_GRANT_DEADLINE,
                longest,
                version: 2,
                horizon: ns(10_000_000_000),
            })
        };
        assert_eq!(covers(&ten, ns(9_000_000_000), ns(1_000_000_000)), Ok(()));
        assert_eq!(
            covers(&ten, ns(9_000_000_000), ns(1_000_000_001)),
            short(Some(ns(10_000_000_001)))
        );
        assert_eq!(covers(&ten, ns(1), max), short(None));
        // The grant policy (9 s, 1 s) fits 10,000 ms, not 9,999 ms.
        assert!(covers(&sealed(9_999), ns(9_000_000_000), ns(1_000_000_000)).is_err());
    }
}
