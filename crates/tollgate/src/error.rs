//! The allocator boundary's error types, with stable codes.
//!
//! An allocator operation fails for one of two reasons, and its error type,
//! [`AllocatorError`], says which:
//!
//! * [`RuleError`]: the rules refuse the request (bad input, not enough
//!   units, a lease that is no longer live, a capability that does not
//!   verify) or find the loaded state inconsistent. Every `rules::plan_*`
//!   and capability check returns this type.
//! * [`StorageError`]: the storage itself failed (unreachable, retries
//!   exhausted, corrupt or unexpected stored data, a policy that differs
//!   from this process's).
//!
//! Every variant of both has a stable machine-readable code
//! ([`AllocatorError::code`]) that the HTTP service exposes unchanged. An
//! operation that returns an error has changed nothing.

use jiff::{SignedDuration, Timestamp};

use crate::instant_pair::PairError;
use crate::model::{AccountId, LeaseId, LeaseState};
use crate::timing::TimingError;

/// A request the rules refuse, or state they find inconsistent: what
/// [`crate::rules`] and capability checks return. Each variant has a stable
/// machine-readable [`code`](RuleError::code). An operation that returns one
/// has changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// A unit amount was zero, negative or otherwise outside what the
    /// operation accepts.
    #[error("units must be in 1..={max}, got {units}")]
    InvalidUnits {
        /// The rejected amount.
        units: i64,
        /// The largest accepted amount.
        max: i64,
    },
    /// A requested TTL was zero or negative.
    #[error("requested ttl must be positive, got {ttl}")]
    InvalidTtl {
        /// The rejected TTL.
        ttl: SignedDuration,
    },
    /// `now + granted_ttl` is not representable as a timestamp.
    #[error("expiry {now} + {ttl} is not representable as a timestamp")]
    UnrepresentableExpiry {
        /// The supplied time.
        now: Timestamp,
        /// The granted (clamped) TTL.
        ttl: SignedDuration,
    },
    /// The new deadline, `grant_base + granted_ttl + reclaim_grace`, lies
    /// beyond the latest the time source admits (on the safe expiry cut:
    /// `cut + horizon`). Only a reading whose staleness bound is larger
    /// than the horizon leaves room for gets this (a renewal on a cut that
    /// has not been republished for that long); nothing changed, and a
    /// retry once the cut is fresh again succeeds.
    #[error(
        "the deadline {grant_base} + {ttl} + reclaim grace lies beyond {limit}, the end of the safe-time horizon: the safe expiry cut is too stale to grant it; retry later"
    )]
    DeadlineBeyondHorizon {
        /// The instant the TTL was added to (the cut plus its staleness
        /// bound).
        grant_base: Timestamp,
        /// The granted (clamped) TTL.
        ttl: SignedDuration,
        /// The latest admissible deadline.
        limit: Timestamp,
    },
    /// The account's available balance is below the request.
    #[error("account {account_id} has {available} units available, {requested} requested")]
    InsufficientBalance {
        /// The account.
        account_id: AccountId,
        /// Units requested.
        requested: i64,
        /// Units available.
        available: i64,
    },
    /// A balance would exceed `i64::MAX`.
    #[error("balance of account {account_id} would overflow")]
    UnitsOverflow {
        /// The account.
        account_id: AccountId,
    },
    /// No such account.
    #[error("account {account_id} not found")]
    AccountNotFound {
        /// The account asked for.
        account_id: AccountId,
    },
    /// The capability was valid for this lease id but the store holds no such
    /// lease (only a holder of a valid capability can observe this).
    #[error("lease {lease_id} not found")]
    LeaseNotFound {
        /// The lease asked for.
        lease_id: LeaseId,
    },
    /// The capability does not authorize this lease. Returned whether or not
    /// the lease exists, so it reveals nothing about existence.
    #[error("capability does not authorize this lease")]
    CapabilityMismatch,
    /// The lease has already settled.
    #[error("lease {lease_id} is {state}, not active")]
    LeaseNotActive {
        /// The lease.
        lease_id: LeaseId,
        /// Its terminal state.
        state: LeaseState,
    },
    /// The lease is active but reclaimable at the supplied time
    /// (`expiry + reclaim_grace <= now`): only reclaim may settle it.
    #[error("lease {lease_id} expired at {expiry} and is reclaimable at {now}")]
    LeaseReclaimable {
        /// The lease.
        lease_id: LeaseId,
        /// Its expiry.
        expiry: Timestamp,
        /// The supplied time.
        now: Timestamp,
    },
    /// A release reported more consumption than the lease holds.
    #[error("consumed {consumed} must be in 0..={units}")]
    InvalidConsumed {
        /// The reported consumption.
        consumed: i64,
        /// The lease's units.
        units: i64,
    },
    /// The idempotency key was used before with a different request.
    #[error("idempotency key was used with a different request")]
    IdempotencyConflict,
    /// The idempotency key is empty, too long or not visible ASCII.
    #[error("idempotency key must be 1..={max_len} visible ASCII characters")]
    InvalidIdempotencyKey {
        /// The longest accepted key, in bytes.
        max_len: usize,
    },
    /// The account name is empty, too long or has control characters.
    #[error("account name must be 1..={max_len} characters without control characters")]
    InvalidAccountName {
        /// The longest accepted name, in characters.
        max_len: usize,
    },
    /// A consolidation named the same lease twice.
    #[error("lease {lease_id} named twice")]
    DuplicateLease {
        /// The repeated lease.
        lease_id: LeaseId,
    },
    /// A consolidation named a lease of another account.
    #[error("lease {lease_id} does not belong to account {account_id}")]
    LeaseAccountMismatch {
        /// The lease.
        lease_id: LeaseId,
        /// The account of the request.
        account_id: AccountId,
    },
    /// A consolidation named no lease, or more than the bound.
    #[error("a consolidation takes 1..={max} leases, got {count}")]
    InvalidLeaseCount {
        /// Leases named.
        count: usize,
        /// The bound ([`crate::CONSOLIDATE_LEASES_MAX`]).
        max: usize,
    },
    /// A batch limit was zero or above the bound.
    #[error("limit must be in 1..={max}, got {limit}")]
    InvalidLimit {
        /// The rejected limit.
        limit: usize,
        /// The bound.
        max: usize,
    },
    /// The account holds fewer units than a lease that is settling: the
    /// invariant `held >= sum of the units of its active leases` is broken
    /// (corrupt stored state, not a refusal of the request). Its code is
    /// `storage_failure`, the code of [`StorageError::Failure`].
    #[error("account holds {held} units but a lease of {units} is settling")]
    CorruptHolding {
        /// The account's `held`.
        held: i64,
        /// The settling lease's units.
        units: i64,
    },
}

impl RuleError {
    /// The stable machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            RuleError::InvalidUnits { .. } => "invalid_units",
            RuleError::InvalidTtl { .. } => "invalid_ttl",
            RuleError::UnrepresentableExpiry { .. } => "unrepresentable_expiry",
            RuleError::DeadlineBeyondHorizon { .. } => "deadline_beyond_horizon",
            RuleError::InsufficientBalance { .. } => "insufficient_balance",
            RuleError::UnitsOverflow { .. } => "units_overflow",
            RuleError::AccountNotFound { .. } => "account_not_found",
            RuleError::LeaseNotFound { .. } => "lease_not_found",
            RuleError::CapabilityMismatch => "capability_mismatch",
            RuleError::LeaseNotActive { .. } => "lease_not_active",
            RuleError::LeaseReclaimable { .. } => "lease_reclaimable",
            RuleError::InvalidConsumed { .. } => "invalid_consumed",
            RuleError::IdempotencyConflict => "idempotency_conflict",
            RuleError::InvalidIdempotencyKey { .. } => "invalid_idempotency_key",
            RuleError::InvalidAccountName { .. } => "invalid_account_name",
            RuleError::DuplicateLease { .. } => "duplicate_lease",
            RuleError::LeaseAccountMismatch { .. } => "lease_account_mismatch",
            RuleError::InvalidLeaseCount { .. } => "invalid_lease_count",
            RuleError::InvalidLimit { .. } => "invalid_limit",
            RuleError::CorruptHolding { .. } => "storage_failure",
        }
    }
}

impl From<TimingError> for RuleError {
    fn from(e: TimingError) -> RuleError {
        match e {
            TimingError::InvalidTtl { ttl } => RuleError::InvalidTtl { ttl },
            TimingError::UnrepresentableExpiry { now, ttl } => {
                RuleError::UnrepresentableExpiry { now, ttl }
            }
            TimingError::DeadlineBeyondLimit {
                grant_base,
                ttl,
                limit,
            } => RuleError::DeadlineBeyondHorizon {
                grant_base,
                ttl,
                limit,
            },
        }
    }
}

/// A failure of the storage itself, not of the request: what a store
/// returns when it cannot do what the rules planned. Each variant has a
/// stable machine-readable [`code`](StorageError::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// Stored data does not decode (a corrupt instant pair).
    #[error("stored instant is invalid: {0}")]
    InvalidStoredInstant(#[from] PairError),
    /// The store's recorded policy differs from this process's policy: at
    /// start-up, or on a write by a process started before the recorded
    /// policy changed (the message names both policies and what to do).
    #[error("{0}")]
    PolicyMismatch(String),
    /// The store refused a lease whose expiry plus the reclaim grace lies
    /// beyond the latest deadline it admits (on PostgreSQL: the safe
    /// expiry cut plus the sealed horizon); the message names the exact
    /// instants and durations and what to do. Nothing was written.
    #[error("{message}")]
    HorizonExceeded {
        /// What was refused, exactly (no secrets).
        message: String,
    },
    /// The storage could not be reached.
    #[error("storage unavailable: {message}")]
    Unavailable {
        /// What failed (no secrets).
        message: String,
    },
    /// A transaction kept failing with serialization failures or deadlocks.
    #[error("transaction retried {attempts} times without success")]
    RetryExhausted {
        /// Attempts made.
        attempts: u32,
    },
    /// Any other failure of the storage: a database error, stored data the
    /// store does not understand, a write that changed an unexpected number
    /// of rows, an invalid operator input to a storage command.
    #[error("storage failure: {message}")]
    Failure {
        /// What failed (no secrets).
        message: String,
    },
}

impl StorageError {
    /// The stable machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            StorageError::InvalidStoredInstant(_) => "invalid_stored_instant",
            StorageError::PolicyMismatch(_) => "policy_mismatch",
            StorageError::HorizonExceeded { .. } => "horizon_exceeded",
            StorageError::Unavailable { .. } => "storage_unavailable",
            StorageError::RetryExhausted { .. } => "retry_exhausted",
            StorageError::Failure { .. } => "storage_failure",
        }
    }
}

/// Every error an allocator operation can return: a refusal by the rules
/// or a failure of the storage. Displays as the error it carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocatorError {
    /// The rules refused the request (or found the loaded state
    /// inconsistent).
    #[error(transparent)]
    Rule(#[from] RuleError),
    /// The storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl AllocatorError {
    /// The stable machine-readable code of this error: its rule's or its
    /// storage failure's.
    pub fn code(&self) -> &'static str {
        match self {
            AllocatorError::Rule(e) => e.code(),
            AllocatorError::Storage(e) => e.code(),
        }
    }

    /// Every code, once each, for documentation and for the HTTP layer's
    /// tests.
    pub const CODES: &'static [&'static str] = &[
        "invalid_units",
        "invalid_ttl",
        "unrepresentable_expiry",
        "deadline_beyond_horizon",
        "insufficient_balance",
        "units_overflow",
        "account_not_found",
        "lease_not_found",
        "capability_mismatch",
        "lease_not_active",
        "lease_reclaimable",
        "invalid_consumed",
        "idempotency_conflict",
        "invalid_idempotency_key",
        "invalid_account_name",
        "duplicate_lease",
        "lease_account_mismatch",
        "invalid_lease_count",
        "invalid_limit",
        "invalid_stored_instant",
        "policy_mismatch",
        "horizon_exceeded",
        "storage_unavailable",
        "retry_exhausted",
        "storage_failure",
    ];
}

impl From<TimingError> for AllocatorError {
    fn from(e: TimingError) -> AllocatorError {
        AllocatorError::Rule(e.into())
    }
}

impl From<PairError> for AllocatorError {
    fn from(e: PairError) -> AllocatorError {
        AllocatorError::Storage(e.into())
    }
}

/// Compares with a rule error, so a test can write
/// `assert_eq!(err, RuleError::IdempotencyConflict)`.
impl PartialEq<RuleError> for AllocatorError {
    fn eq(&self, other: &RuleError) -> bool {
        matches!(self, AllocatorError::Rule(e) if e == other)
    }
}

/// Compares with a storage error, like `PartialEq<RuleError>`.
impl PartialEq<StorageError> for AllocatorError {
    fn eq(&self, other: &StorageError) -> bool {
        matches!(self, AllocatorError::Storage(e) if e == other)
    }
}

/// A `changed_by` (who changes a recorded policy) that
/// [`crate::rules::check_changed_by`] refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("changed_by must be 1..={max_len} characters without control characters")]
pub struct InvalidChangedBy {
    /// The longest accepted name, in characters
    /// ([`crate::rules::CHANGED_BY_MAX_CHARS`]).
    pub max_len: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_listed_once_each() {
        let mut sorted = AllocatorError::CODES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), AllocatorError::CODES.len());
        let beyond = RuleError::DeadlineBeyondHorizon {
            grant_base: Timestamp::UNIX_EPOCH,
            ttl: SignedDuration::from_secs(3),
            limit: Timestamp::UNIX_EPOCH,
        };
        assert_eq!(beyond.code(), "deadline_beyond_horizon");
        assert!(AllocatorError::CODES.contains(&beyond.code()));
        assert_eq!(
            RuleError::from(TimingError::DeadlineBeyondLimit {
                grant_base: Timestamp::UNIX_EPOCH,
                ttl: SignedDuration::from_secs(3),
                limit: Timestamp::UNIX_EPOCH,
            }),
            beyond
        );
        let corrupt = RuleError::CorruptHolding { held: 1, units: 2 };
        assert_eq!(corrupt.code(), "storage_failure");
        assert_eq!(
            corrupt.to_string(),
            "account holds 1 units but a lease of 2 is settling"
        );
        let failure = StorageError::Failure {
            message: "x".into(),
        };
        assert_eq!(
            AllocatorError::from(failure.clone()).code(),
            "storage_failure"
        );
        assert_eq!(AllocatorError::from(failure.clone()), failure);
        assert_ne!(AllocatorError::from(failure), RuleError::CapabilityMismatch);
    }
}
