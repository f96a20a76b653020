//! Exact lease timing: the grant policy, expiry computation and the reclaim
//! predicate.
//!
//! # Design
//!
//! Every instant is a [`jiff::Timestamp`] and every duration a
//! [`jiff::SignedDuration`]; nothing is rounded, truncated or converted to a
//! float. The rules (seed 000, "Lease timing"):
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

/// The smallest instant of the domain, in nanoseconds since the Unix epoch
/// (`Timestamp::MIN`, -009999-01-02T01:59:59Z). Equal to `ts_min_ns` in the
/// Coq model.
pub const TIMESTAMP_MIN_NS: i128 = -377_705_023_201_000_000_000;

/// The largest instant of the domain, in nanoseconds since the Unix epoch
/// (`Timestamp::MAX`, 9999-12-30T22:00:00.999999999Z). Equal to `ts_max_ns` in
/// the Coq model.
pub const TIMESTAMP_MAX_NS: i128 = 253_402_207_200_999_999_999;

/// Errors of policy construction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `max_ttl` was zero or negative.
    #[error("max_ttl must be positive, got {max_ttl:?}")]
    NonPositiveMaxTtl {
        /// The rejected value.
        max_ttl: SignedDuration,
    },
    /// `reclaim_grace` was negative.
    #[error("reclaim_grace must be nonnegative, got {reclaim_grace:?}")]
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
    #[error("requested ttl must be positive, got {ttl:?}")]
    InvalidTtl {
        /// The rejected TTL.
        ttl: SignedDuration,
    },
    /// `now + ttl` lies outside the timestamp domain.
    #[error("expiry {now} + {ttl:?} is not representable as a timestamp")]
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
}
