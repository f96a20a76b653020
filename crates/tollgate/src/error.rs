//! The allocator boundary's error type, [`StorageError`], with stable codes.

use jiff::{SignedDuration, Timestamp};

use crate::instant_pair::PairError;
use crate::model::{AccountId, LeaseId, LeaseState};
use crate::timing::TimingError;

/// Every error an allocator operation can return. Each variant has a stable
/// machine-readable [`code`](StorageError::code) that the HTTP service exposes
/// unchanged. An operation that returns an error has changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
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
    /// Stored data does not decode (a corrupt instant pair).
    #[error("stored instant is invalid: {0}")]
    InvalidStoredInstant(#[from] PairError),
    /// The store's recorded policy differs from this process's policy.
    #[error("{0}")]
    PolicyMismatch(String),
    /// The storage backend could not be reached.
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
    /// Any other backend failure.
    #[error("storage failure: {message}")]
    Backend {
        /// What failed (no secrets).
        message: String,
    },
}

impl StorageError {
    /// The stable machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            StorageError::InvalidUnits { .. } => "invalid_units",
            StorageError::InvalidTtl { .. } => "invalid_ttl",
            StorageError::UnrepresentableExpiry { .. } => "unrepresentable_expiry",
            StorageError::InsufficientBalance { .. } => "insufficient_balance",
            StorageError::UnitsOverflow { .. } => "units_overflow",
            StorageError::AccountNotFound { .. } => "account_not_found",
            StorageError::LeaseNotFound { .. } => "lease_not_found",
            StorageError::CapabilityMismatch => "capability_mismatch",
            StorageError::LeaseNotActive { .. } => "lease_not_active",
            StorageError::LeaseReclaimable { .. } => "lease_reclaimable",
            StorageError::InvalidConsumed { .. } => "invalid_consumed",
            StorageError::IdempotencyConflict => "idempotency_conflict",
            StorageError::InvalidIdempotencyKey { .. } => "invalid_idempotency_key",
            StorageError::InvalidAccountName { .. } => "invalid_account_name",
            StorageError::DuplicateLease { .. } => "duplicate_lease",
            StorageError::LeaseAccountMismatch { .. } => "lease_account_mismatch",
            StorageError::InvalidLeaseCount { .. } => "invalid_lease_count",
            StorageError::InvalidLimit { .. } => "invalid_limit",
            StorageError::InvalidStoredInstant(_) => "invalid_stored_instant",
            StorageError::PolicyMismatch(_) => "policy_mismatch",
            StorageError::Unavailable { .. } => "storage_unavailable",
            StorageError::RetryExhausted { .. } => "retry_exhausted",
            StorageError::Backend { .. } => "storage_failure",
        }
    }

    /// Every code, for documentation and for the HTTP layer's tests.
    pub const CODES: &'static [&'static str] = &[
        "invalid_units",
        "invalid_ttl",
        "unrepresentable_expiry",
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
        "storage_unavailable",
        "retry_exhausted",
        "storage_failure",
    ];
}

impl From<TimingError> for StorageError {
    fn from(e: TimingError) -> StorageError {
        match e {
            TimingError::InvalidTtl { ttl } => StorageError::InvalidTtl { ttl },
            TimingError::UnrepresentableExpiry { now, ttl } => {
                StorageError::UnrepresentableExpiry { now, ttl }
            }
        }
    }
}
