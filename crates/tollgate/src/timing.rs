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
//! * Time is supplied as a [`SuppliedTime`]: the instant expiry is *judged*
//!   at (`now`) and the instant a new deadline is *counted from*
//!   (`grant_base`, never earlier than `now`). On a clock whose reading is
//!   exact (the system and test clocks) they are the same instant. On the
//!   safe expiry cut, `now` is the cut as read (a lower bound on the cut at
//!   the request) and `grant_base` is the cut plus the reading's staleness
//!   bound (an upper bound): a deadline counted from a lower bound and
//!   judged later at a fresher cut would end up to the staleness early in
//!   real time.
//! * `expiry = grant_base + granted_ttl`, checked. An expiry outside the
//!   timestamp domain is an error *before* any balance moves
//!   ([`TimingError::UnrepresentableExpiry`]); so is a deadline
//!   `expiry + reclaim_grace` beyond the supplied time's deadline limit
//!   ([`TimingError::DeadlineBeyondLimit`]; on the cut, `cut + horizon`).
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
pub const LEASE_GRANT_DEADLINE: DeadlineKind = safetime::inventory::LEASE_GRANT;

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
        /// The instant the TTL was added to: the supplied time's
        /// [`SuppliedTime::grant_base`].
        now: Timestamp,
        /// The granted (clamped) TTL.
        ttl: SignedDuration,
    },
    /// `grant_base + ttl + reclaim_grace` lies beyond the supplied time's
    /// [`SuppliedTime::deadline_limit`].
    #[error(
        "the deadline {grant_base} + {ttl} + reclaim grace lies beyond {limit}, the latest the time source admits"
    )]
    DeadlineBeyondLimit {
        /// The instant the TTL was added to.
        grant_base: Timestamp,
        /// The granted (clamped) TTL.
        ttl: SignedDuration,
        /// The latest admissible deadline.
        limit: Timestamp,
    },
}

/// The supplied time of one request: the instant its expiry checks are
/// judged at ([`SuppliedTime::now`]), the instant every deadline it makes is
/// counted from ([`SuppliedTime::grant_base`], never earlier than `now`),
/// and optionally the latest deadline it may make
/// ([`SuppliedTime::deadline_limit`]). See the module docs.
///
/// Fields are private so that every value keeps `grant_base >= now`.
///
/// ```
/// use jiff::{SignedDuration, Timestamp};
/// use tollgate::SuppliedTime;
/// let now: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
/// let at = SuppliedTime::exact(now);
/// assert_eq!((at.now(), at.grant_base(), at.staleness()), (now, now, SignedDuration::ZERO));
/// let base = now + SignedDuration::from_millis(300);
/// let stale = SuppliedTime::new(now, base);
/// assert_eq!(stale.staleness(), SignedDuration::from_millis(300));
/// assert_eq!(stale.remaining(now + SignedDuration::from_secs(3)), SignedDuration::from_millis(2_700));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SuppliedTime {
    now: Timestamp,
    grant_base: Timestamp,
    deadline_limit: Option<Timestamp>,
}

impl SuppliedTime {
    /// An exact reading: expiry is judged at `now` and deadlines are counted
    /// from `now` (the system and test clocks). No deadline limit.
    pub fn exact(now: Timestamp) -> SuppliedTime {
        SuppliedTime {
            now,
            grant_base: now,
            deadline_limit: None,
        }
    }

    /// A reading judged at `now` whose deadlines are counted from
    /// `grant_base`. No deadline limit.
    ///
    /// # Panics
    /// When `grant_base < now`: a base earlier than the judging instant
    /// would let a deadline end early, so it is a bug in the time source.
    pub fn new(now: Timestamp, grant_base: Timestamp) -> SuppliedTime {
        assert!(
            grant_base >= now,
            "a grant base {grant_base} earlier than the judging instant {now}"
        );
        SuppliedTime {
            now,
            grant_base,
            deadline_limit: None,
        }
    }

    /// This reading, admitting no deadline (`expiry + reclaim_grace`) later
    /// than `limit`.
    pub fn with_deadline_limit(self, limit: Timestamp) -> SuppliedTime {
        SuppliedTime {
            deadline_limit: Some(limit),
            ..self
        }
    }

    /// The instant expiry is judged at (reclaim, and the
    /// `lease_reclaimable` refusal).
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// The instant every new deadline is counted from; `>= now`.
    pub fn grant_base(&self) -> Timestamp {
        self.grant_base
    }

    /// The latest deadline a grant may make (`None`: no limit).
    pub fn deadline_limit(&self) -> Option<Timestamp> {
        self.deadline_limit
    }

    /// `grant_base - now`, exactly: how stale the reading may be. Never
    /// negative.
    pub fn staleness(&self) -> SignedDuration {
        self.grant_base.duration_since(self.now)
    }

    /// The time a lease with expiry `expiry` is guaranteed from this
    /// request, before the grace: `expiry - grant_base`, exactly, or zero
    /// when that is negative (nothing is guaranteed any more).
    pub fn remaining(&self, expiry: Timestamp) -> SignedDuration {
        expiry
            .duration_since(self.grant_base)
            .max(SignedDuration::ZERO)
    }
}

impl From<Timestamp> for SuppliedTime {
    /// [`SuppliedTime::exact`].
    fn from(now: Timestamp) -> SuppliedTime {
        SuppliedTime::exact(now)
    }
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

    /// The longest deadline this policy admits on a time source whose
    /// readings may be up to `staleness` stale (the grant base lies up to
    /// `staleness` after the judging instant): kind [`LEASE_GRANT_DEADLINE`],
    /// `max_ttl + reclaim_grace + staleness` exactly, or unbounded when that
    /// sum exceeds [`SignedDuration::MAX`]. With zero staleness it is
    /// [`GrantPolicy::deadline_bound`].
    ///
    /// # Panics
    /// When `staleness` is negative.
    ///
    /// ```
    /// use jiff::SignedDuration;
    /// use tollgate::GrantPolicy;
    /// let p = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap();
    /// let b = p.deadline_bound_after(SignedDuration::from_secs(5));
    /// assert_eq!(b.longest(), Some(SignedDuration::from_secs(70)));
    /// ```
    pub fn deadline_bound_after(&self, staleness: SignedDuration) -> DeadlineBound {
        assert!(
            !staleness.is_negative(),
            "a staleness bound is never negative: {staleness}"
        );
        match self.reclaim_grace.checked_add(staleness) {
            Some(tail) => DeadlineBound::sum(LEASE_GRANT_DEADLINE, self.max_ttl, tail),
            None => DeadlineBound::sum(
                LEASE_GRANT_DEADLINE,
                SignedDuration::MAX,
                SignedDuration::MAX,
            ),
        }
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

    /// The expiry of a grant at supplied time `at`: clamps `requested` and
    /// computes `at.grant_base() + granted_ttl` ([`GrantPolicy::expiry`]),
    /// then checks that the deadline `expiry + reclaim_grace` is at most
    /// `at.deadline_limit()` (exactly; equal fits).
    ///
    /// Returns `(expiry, granted_ttl)`.
    ///
    /// # Errors
    /// As [`GrantPolicy::expiry`], then [`TimingError::DeadlineBeyondLimit`].
    pub fn grant_expiry(
        &self,
        at: SuppliedTime,
        requested: SignedDuration,
    ) -> Result<(Timestamp, SignedDuration), TimingError> {
        let (expiry, ttl) = self.expiry(at.grant_base, requested)?;
        // |expiry| < 2^69 ns and |grace| < 2^94 ns: exact in i128.
        let deadline_ns = expiry.as_nanosecond() + self.reclaim_grace.as_nanos();
        let beyond = at
            .deadline_limit
            .filter(|limit| deadline_ns > limit.as_nanosecond());
        if let Some(limit) = beyond {
            return Err(TimingError::DeadlineBeyondLimit {
                grant_base: at.grant_base,
                ttl,
                limit,
            });
        }
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

    /// The supplied time of a request at its boundaries: an exact reading
    /// (the system and test clocks) counts deadlines from `now`; a stale one
    /// from `now + staleness`, for staleness zero, exactly the gap bound
    /// (5 s here) and one nanosecond over; the remaining time is
    /// `expiry - grant_base`, floored at zero.
    #[test]
    fn supplied_time_table() {
        let now = at(1_000_000_000_000);
        let exact = SuppliedTime::exact(now);
        assert_eq!(SuppliedTime::from(now), exact);
        assert_eq!(
            (
                exact.now(),
                exact.grant_base(),
                exact.staleness(),
                exact.deadline_limit()
            ),
            (now, now, ns(0), None)
        );
        assert_eq!(SuppliedTime::new(now, now), exact);
        let gap = 5_000_000_000;
        for staleness in [0, 1, gap, gap + 1] {
            let base = at(1_000_000_000_000 + staleness);
            let t = SuppliedTime::new(now, base);
            assert_eq!(
                (t.now(), t.grant_base(), t.staleness(), t.deadline_limit()),
                (now, base, ns(staleness), None),
                "staleness {staleness}"
            );
            // The deadline counts from the base, the judging stays at now.
            let p = policy(10_000_000_000, 0);
            let (expiry, ttl) = p.grant_expiry(t, ns(3_000_000_000)).unwrap();
            assert_eq!(
                (expiry, ttl),
                (at(1_003_000_000_000 + staleness), ns(3_000_000_000))
            );
            assert_eq!(t.remaining(expiry), ns(3_000_000_000));
            assert!(!p.is_reclaimable(expiry, at(1_003_000_000_000 + staleness - 1)));
        }
        let t = SuppliedTime::new(now, at(1_000_000_000_010));
        assert_eq!(t.remaining(at(1_000_000_000_011)), ns(1));
        assert_eq!(t.remaining(at(1_000_000_000_010)), ns(0));
        assert_eq!(t.remaining(at(1_000_000_000_009)), ns(0));
        assert_eq!(t.remaining(at(TIMESTAMP_MIN_NS)), ns(0));
        let limited = t.with_deadline_limit(at(7));
        assert_eq!(
            (
                limited.now(),
                limited.grant_base(),
                limited.deadline_limit()
            ),
            (now, at(1_000_000_000_010), Some(at(7)))
        );
    }

    #[test]
    #[should_panic(expected = "earlier than the judging instant")]
    fn a_grant_base_before_now_panics() {
        let _ = SuppliedTime::new(at(10), at(9));
    }

    /// `grant_expiry`: the expiry from the base, and the deadline
    /// `expiry + grace` against the limit, equal fitting and one
    /// nanosecond over refused; errors of `expiry` come first.
    #[test]
    fn grant_expiry_table() {
        let p = policy(100, 5);
        let t = |now: i128, base: i128, limit: Option<i128>| {
            let s = SuppliedTime::new(at(now), at(base));
            match limit {
                Some(l) => s.with_deadline_limit(at(l)),
                None => s,
            }
        };
        let check = |s: SuppliedTime, req: i128, want: Result<(i128, i128), TimingError>| {
            let got = p
                .grant_expiry(s, ns(req))
                .map(|(e, ttl)| (e.as_nanosecond(), ttl.as_nanos()));
            assert_eq!(got, want, "{s:?} req {req}");
        };
        check(t(0, 0, None), 10, Ok((10, 10)));
        check(t(0, 7, None), 10, Ok((17, 10)));
        check(t(0, 7, None), 1_000, Ok((107, 100)));
        // Deadline 7 + 10 + 5 = 22: a limit of 22 fits, 21 does not.
        check(t(0, 7, Some(22)), 10, Ok((17, 10)));
        check(t(0, 7, Some(23)), 10, Ok((17, 10)));
        check(
            t(0, 7, Some(21)),
            10,
            Err(TimingError::DeadlineBeyondLimit {
                grant_base: at(7),
                ttl: ns(10),
                limit: at(21),
            }),
        );
        // The clamped TTL is the one checked and reported.
        check(t(0, 0, Some(105)), 1_000, Ok((100, 100)));
        check(
            t(0, 0, Some(104)),
            1_000,
            Err(TimingError::DeadlineBeyondLimit {
                grant_base: at(0),
                ttl: ns(100),
                limit: at(104),
            }),
        );
        // Invalid TTL and an unrepresentable expiry come first.
        check(
            t(0, 0, Some(0)),
            0,
            Err(TimingError::InvalidTtl { ttl: ns(0) }),
        );
        let max = TIMESTAMP_MAX_NS;
        check(
            t(max - 1, max, Some(max)),
            1,
            Err(TimingError::UnrepresentableExpiry {
                now: at(max),
                ttl: ns(1),
            }),
        );
        // A grace beyond every limit: nothing fits any representable limit.
        let huge = GrantPolicy::new(ns(1), SignedDuration::MAX).unwrap();
        assert_eq!(
            huge.grant_expiry(t(0, 0, Some(max)), ns(1)),
            Err(TimingError::DeadlineBeyondLimit {
                grant_base: at(0),
                ttl: ns(1),
                limit: at(max),
            })
        );
        assert_eq!(huge.grant_expiry(t(0, 0, None), ns(1)), Ok((at(1), ns(1))));
    }

    /// The deadline bound on a time source `staleness` stale: the policy's
    /// bound plus the staleness, exactly, unbounded past
    /// `SignedDuration::MAX` (whether the overflow is in the grace part or
    /// in the whole sum); zero staleness gives `deadline_bound`.
    #[test]
    fn deadline_bound_after_table() {
        let max = SignedDuration::MAX;
        let cases = [
            (ns(9), ns(1), ns(0), Some(ns(10))),
            (ns(9), ns(1), ns(5), Some(ns(15))),
            (ns(9), ns(0), ns(1), Some(ns(10))),
            (max - ns(2), ns(1), ns(1), Some(max)),
            (max - ns(2), ns(1), ns(2), None),
            (ns(1), max - ns(1), ns(1), None),
            (ns(1), ns(1), max, None),
        ];
        for (max_ttl, grace, staleness, longest) in cases {
            let p = GrantPolicy::new(max_ttl, grace).unwrap();
            let b = p.deadline_bound_after(staleness);
            assert_eq!(
                (b.kind(), b.longest()),
                (LEASE_GRANT_DEADLINE, longest),
                "{max_ttl} + {grace} + {staleness}"
            );
            if staleness.is_zero() {
                assert_eq!(b, p.deadline_bound());
            }
        }
    }

    #[test]
    #[should_panic(expected = "a staleness bound is never negative")]
    fn a_negative_staleness_bound_panics() {
        let _ = policy(1, 0).deadline_bound_after(ns(-1));
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
