//! The accounting and life-cycle rules every store applies.
//!
//! Stores load rows, call one `plan_*` function, and write exactly what the
//! plan says (ARCHITECTURE.md: rules live in the core, stores call it). Each
//! function validates everything before returning a plan, so a store that
//! gets an `Err` writes nothing. Validation order is part of the contract and
//! the same for every store: inputs (units, TTL) first, then expiry
//! arithmetic, then state, then balances.

use jiff::{SignedDuration, Timestamp};

use crate::error::StorageError;
use crate::model::{AccountId, Balances, Lease, LeaseId, LeaseState};
use crate::timing::GrantPolicy;

/// The most leases one consolidation may name. A bound on the rows one
/// transaction locks; 1,000 leaves room for large fan-in while keeping the
/// transaction short.
pub const CONSOLIDATE_LEASES_MAX: usize = 1_000;

/// The largest batch one reclaim call settles. Bounds transaction length and
/// lock footprint; callers loop for more.
pub const RECLAIM_BATCH_MAX: usize = 10_000;

/// The longest idempotency key, in bytes.
pub const IDEMPOTENCY_KEY_MAX_BYTES: usize = 255;

/// The longest account name, in characters.
pub const ACCOUNT_NAME_MAX_CHARS: usize = 200;

/// Checks a unit amount for deposit or acquire: `1..=i64::MAX`.
///
/// # Errors
/// [`StorageError::InvalidUnits`] for zero or negative amounts.
pub fn check_units(units: i64) -> Result<i64, StorageError> {
    if units <= 0 {
        return Err(StorageError::InvalidUnits {
            units,
            max: i64::MAX,
        });
    }
    Ok(units)
}

/// Checks a batch limit: `1..=max`.
///
/// # Errors
/// [`StorageError::InvalidLimit`] outside that range.
pub fn check_limit(limit: usize, max: usize) -> Result<usize, StorageError> {
    if limit == 0 || limit > max {
        return Err(StorageError::InvalidLimit { limit, max });
    }
    Ok(limit)
}

/// Checks an idempotency key: 1..=[`IDEMPOTENCY_KEY_MAX_BYTES`] visible ASCII
/// bytes (`!`..=`~`).
///
/// # Errors
/// [`StorageError::InvalidIdempotencyKey`].
pub fn check_idempotency_key(key: &str) -> Result<&str, StorageError> {
    let ok = !key.is_empty()
        && key.len() <= IDEMPOTENCY_KEY_MAX_BYTES
        && key.bytes().all(|b| b.is_ascii_graphic());
    if !ok {
        return Err(StorageError::InvalidIdempotencyKey {
            max_len: IDEMPOTENCY_KEY_MAX_BYTES,
        });
    }
    Ok(key)
}

/// Checks an account name: 1..=[`ACCOUNT_NAME_MAX_CHARS`] characters, none
/// of them control characters, not only whitespace.
///
/// # Errors
/// [`StorageError::InvalidAccountName`].
pub fn check_account_name(name: &str) -> Result<&str, StorageError> {
    let ok = !name.trim().is_empty()
        && name.chars().count() <= ACCOUNT_NAME_MAX_CHARS
        && !name.chars().any(char::is_control);
    if !ok {
        return Err(StorageError::InvalidAccountName {
            max_len: ACCOUNT_NAME_MAX_CHARS,
        });
    }
    Ok(name)
}

/// Balances after depositing `units` (already checked positive).
///
/// # Errors
/// [`StorageError::UnitsOverflow`] if `deposited` or `available` would
/// exceed `i64::MAX`.
pub fn deposit(
    account_id: AccountId,
    before: Balances,
    units: i64,
) -> Result<Balances, StorageError> {
    let units = check_units(units)?;
    let overflow = StorageError::UnitsOverflow { account_id };
    Ok(Balances {
        deposited: before
            .deposited
            .checked_add(units)
            .ok_or(overflow.clone())?,
        available: before.available.checked_add(units).ok_or(overflow)?,
        ..before
    })
}

/// Balances after moving `units` from `available` to `held`.
///
/// # Errors
/// [`StorageError::InvalidUnits`] for zero or negative `units` (which would
/// move units from `held` back to `available`);
/// [`StorageError::InsufficientBalance`] when `available < units`.
pub fn hold(account_id: AccountId, before: Balances, units: i64) -> Result<Balances, StorageError> {
    let units = check_units(units)?;
    if before.available < units {
        return Err(StorageError::InsufficientBalance {
            account_id,
            requested: units,
            available: before.available,
        });
    }
    Ok(Balances {
        available: before.available - units,
        held: before.held + units,
        ..before
    })
}

/// Balances after settling a lease of `units` that consumed `consumed`
/// (`0 <= consumed <= units <= held`): `held -= units`,
/// `consumed += consumed`, `available += units - consumed`.
///
/// # Errors
/// [`StorageError::InvalidConsumed`] outside `0..=units`;
/// [`StorageError::Backend`] if the account holds fewer than `units` (a
/// corrupted store: the invariant `held >= sum of active lease units` broke).
pub fn settle(before: Balances, units: i64, consumed: i64) -> Result<Balances, StorageError> {
    if !(0..=units).contains(&consumed) {
        return Err(StorageError::InvalidConsumed { consumed, units });
    }
    if before.held < units {
        return Err(StorageError::Backend {
            message: format!(
                "account holds {} units but a lease of {units} is settling",
                before.held
            ),
        });
    }
    Ok(Balances {
        held: before.held - units,
        consumed: before.consumed + consumed,
        available: before.available + (units - consumed),
        ..before
    })
}

/// Checks that `lease` may still be used by its holder at `now`: active and
/// not reclaimable (`now < expiry + reclaim_grace`).
///
/// # Errors
/// [`StorageError::LeaseNotActive`] or [`StorageError::LeaseReclaimable`].
pub fn check_live(policy: &GrantPolicy, lease: &Lease, now: Timestamp) -> Result<(), StorageError> {
    if lease.state != LeaseState::Active {
        return Err(StorageError::LeaseNotActive {
            lease_id: lease.lease_id,
            state: lease.state,
        });
    }
    if policy.is_reclaimable(lease.expiry, now) {
        return Err(StorageError::LeaseReclaimable {
            lease_id: lease.lease_id,
            expiry: lease.expiry,
            now,
        });
    }
    Ok(())
}

/// What an acquire writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquirePlan {
    /// `now + granted_ttl`, exact.
    pub expiry: Timestamp,
    /// The clamped TTL.
    pub granted_ttl: SignedDuration,
    /// The account's balances afterwards.
    pub after: Balances,
}

/// Plans an acquire of `units` for `ttl` at `now` on an account with
/// `before` balances.
///
/// # Errors
/// In this order: [`StorageError::InvalidUnits`], [`StorageError::InvalidTtl`],
/// [`StorageError::UnrepresentableExpiry`], [`StorageError::InsufficientBalance`].
pub fn plan_acquire(
    policy: &GrantPolicy,
    account_id: AccountId,
    before: Balances,
    units: i64,
    ttl: SignedDuration,
    now: Timestamp,
) -> Result<AcquirePlan, StorageError> {
    let units = check_units(units)?;
    let (expiry, granted_ttl) = policy.expiry(now, ttl)?;
    let after = hold(account_id, before, units)?;
    Ok(AcquirePlan {
        expiry,
        granted_ttl,
        after,
    })
}

/// What a release writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettlePlan {
    /// Units charged.
    pub consumed: i64,
    /// Units returned to `available`.
    pub returned: i64,
    /// The account's balances afterwards.
    pub after: Balances,
}

/// Plans the release of `lease` at `now`, charging `consumed` (default: all
/// of its units).
///
/// # Errors
/// [`StorageError::LeaseNotActive`], [`StorageError::LeaseReclaimable`]
/// (`expiry + grace <= now`), [`StorageError::InvalidConsumed`].
pub fn plan_release(
    policy: &GrantPolicy,
    lease: &Lease,
    before: Balances,
    now: Timestamp,
    consumed: Option<i64>,
) -> Result<SettlePlan, StorageError> {
    check_live(policy, lease, now)?;
    let consumed = consumed.unwrap_or(lease.units);
    let after = settle(before, lease.units, consumed)?;
    Ok(SettlePlan {
        consumed,
        returned: lease.units - consumed,
        after,
    })
}

/// Plans the reclaim of `lease` at `now`: it must be active and reclaimable,
/// and is charged all of its units (a missing usage report is never zero
/// usage).
///
/// Returns `Ok(None)` when the lease is not (or no longer) reclaimable, so a
/// store that re-reads a row under lock skips it instead of failing.
///
/// # Errors
/// [`StorageError::Backend`] on a corrupted account (see [`settle`]).
pub fn plan_reclaim(
    policy: &GrantPolicy,
    lease: &Lease,
    before: Balances,
    now: Timestamp,
) -> Result<Option<SettlePlan>, StorageError> {
    if lease.state != LeaseState::Active || !policy.is_reclaimable(lease.expiry, now) {
        return Ok(None);
    }
    let after = settle(before, lease.units, lease.units)?;
    Ok(Some(SettlePlan {
        consumed: lease.units,
        returned: 0,
        after,
    }))
}

/// Plans a renewal of `lease` at `now`: the new expiry is the later of the
/// current expiry and `now + clamped ttl`, so a renewal never shortens a
/// lease. Returns `(new_expiry, granted_ttl)`.
///
/// # Errors
/// [`StorageError::InvalidTtl`], [`StorageError::UnrepresentableExpiry`],
/// [`StorageError::LeaseNotActive`], [`StorageError::LeaseReclaimable`].
pub fn plan_renew(
    policy: &GrantPolicy,
    lease: &Lease,
    ttl: SignedDuration,
    now: Timestamp,
) -> Result<(Timestamp, SignedDuration), StorageError> {
    let (candidate, granted_ttl) = policy.expiry(now, ttl)?;
    check_live(policy, lease, now)?;
    Ok((candidate.max(lease.expiry), granted_ttl))
}

/// What a consolidation writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsolidationPlan {
    /// Units of the new lease: the sum of the old ones.
    pub units: i64,
    /// Exact expiry of the new lease.
    pub expiry: Timestamp,
    /// The clamped TTL.
    pub granted_ttl: SignedDuration,
}

/// Checks the shape of a consolidation request before anything is loaded:
/// 1..=[`CONSOLIDATE_LEASES_MAX`] distinct leases.
///
/// # Errors
/// [`StorageError::InvalidLeaseCount`], [`StorageError::DuplicateLease`].
pub fn check_consolidation_ids(ids: &[LeaseId]) -> Result<(), StorageError> {
    if ids.is_empty() || ids.len() > CONSOLIDATE_LEASES_MAX {
        return Err(StorageError::InvalidLeaseCount {
            count: ids.len(),
            max: CONSOLIDATE_LEASES_MAX,
        });
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(StorageError::DuplicateLease { lease_id: w[0] });
    }
    Ok(())
}

/// Plans a consolidation of `leases` (already loaded, in any order) into one
/// new lease of `account_id` at `now`. The old leases settle as consolidated,
/// charging nothing; balances do not change.
///
/// # Errors
/// In this order: the errors of [`check_consolidation_ids`],
/// [`StorageError::InvalidTtl`], [`StorageError::UnrepresentableExpiry`],
/// then per lease [`StorageError::LeaseAccountMismatch`],
/// [`StorageError::LeaseNotActive`], [`StorageError::LeaseReclaimable`], and
/// [`StorageError::UnitsOverflow`] if the sum exceeds `i64::MAX`.
pub fn plan_consolidate(
    policy: &GrantPolicy,
    account_id: AccountId,
    leases: &[Lease],
    ttl: SignedDuration,
    now: Timestamp,
) -> Result<ConsolidationPlan, StorageError> {
    let ids: Vec<LeaseId> = leases.iter().map(|l| l.lease_id).collect();
    check_consolidation_ids(&ids)?;
    let (expiry, granted_ttl) = policy.expiry(now, ttl)?;
    let mut units: i64 = 0;
    for lease in leases {
        if lease.account_id != account_id {
            return Err(StorageError::LeaseAccountMismatch {
                lease_id: lease.lease_id,
                account_id,
            });
        }
        check_live(policy, lease, now)?;
        units = units
            .checked_add(lease.units)
            .ok_or(StorageError::UnitsOverflow { account_id })?;
    }
    Ok(ConsolidationPlan {
        units,
        expiry,
        granted_ttl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACCOUNT: AccountId = AccountId(3);

    fn bal(deposited: i64, available: i64, held: i64, consumed: i64) -> Balances {
        Balances {
            deposited,
            available,
            held,
            consumed,
        }
    }

    fn check_hold(before: Balances, units: i64, expected: Result<Balances, StorageError>) {
        assert_eq!(
            hold(ACCOUNT, before, units),
            expected,
            "hold {units} on {before:?}"
        );
    }

    #[test]
    fn hold_moves_exactly_and_refuses_non_positive_units() {
        let b = bal(10, 7, 3, 0);
        check_hold(b, 7, Ok(bal(10, 0, 10, 0)));
        check_hold(b, 1, Ok(bal(10, 6, 4, 0)));
        check_hold(
            b,
            8,
            Err(StorageError::InsufficientBalance {
                account_id: ACCOUNT,
                requested: 8,
                available: 7,
            }),
        );
        // A non-positive hold would move units from `held` back to
        // `available` (and drive `held` negative): refused like a deposit.
        for units in [0, -1, -3, i64::MIN] {
            check_hold(
                b,
                units,
                Err(StorageError::InvalidUnits {
                    units,
                    max: i64::MAX,
                }),
            );
        }
    }
}
