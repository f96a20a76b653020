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

/// What a reclaim writes, and how late it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReclaimPlan {
    /// The settlement: all units charged.
    pub settle: SettlePlan,
    /// `now - (expiry + reclaim_grace)`, exactly: how long after the first
    /// instant the rule allowed the reclaim happens (never negative).
    pub late_by: SignedDuration,
}

/// Plans the reclaim of `lease` at `now`: it must be active and reclaimable,
/// and is charged all of its units (a missing usage report is never zero
/// usage). The plan also says how late the reclaim is
/// ([`GrantPolicy::reclaim_late_by`]).
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
) -> Result<Option<ReclaimPlan>, StorageError> {
    if lease.state != LeaseState::Active {
        return Ok(None);
    }
    let Some(late_by) = policy.reclaim_late_by(lease.expiry, now) else {
        return Ok(None);
    };
    let after = settle(before, lease.units, lease.units)?;
    Ok(Some(ReclaimPlan {
        settle: SettlePlan {
            consumed: lease.units,
            returned: 0,
            after,
        },
        late_by,
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

    #[test]
    fn check_units_table() {
        for units in [1, 2, i64::MAX] {
            assert_eq!(check_units(units), Ok(units));
        }
        for units in [0, -1, i64::MIN] {
            assert_eq!(
                check_units(units),
                Err(StorageError::InvalidUnits {
                    units,
                    max: i64::MAX
                })
            );
        }
    }

    #[test]
    fn check_limit_table() {
        assert_eq!(check_limit(1, 10), Ok(1));
        assert_eq!(check_limit(7, 10), Ok(7));
        assert_eq!(check_limit(10, 10), Ok(10));
        for limit in [0, 11, usize::MAX] {
            assert_eq!(
                check_limit(limit, 10),
                Err(StorageError::InvalidLimit { limit, max: 10 })
            );
        }
    }

    #[test]
    fn check_idempotency_key_table() {
        let longest = "k".repeat(IDEMPOTENCY_KEY_MAX_BYTES);
        for key in ["a", "retry-7", "!~", longest.as_str()] {
            assert_eq!(check_idempotency_key(key), Ok(key));
        }
        let too_long = "k".repeat(IDEMPOTENCY_KEY_MAX_BYTES + 1);
        for key in ["", "a b", " ", "tab\t", "\u{7f}", "é", too_long.as_str()] {
            assert_eq!(
                check_idempotency_key(key),
                Err(StorageError::InvalidIdempotencyKey { max_len: 255 }),
                "{key:?}"
            );
        }
    }

    #[test]
    fn check_account_name_table() {
        // Limits count characters, not bytes: 200 two-byte characters pass.
        let longest = "é".repeat(ACCOUNT_NAME_MAX_CHARS);
        for name in ["a", " team a ", "Zürich ops", longest.as_str()] {
            assert_eq!(check_account_name(name), Ok(name));
        }
        let too_long = "é".repeat(ACCOUNT_NAME_MAX_CHARS + 1);
        for name in [
            "",
            " ",
            " \t ",
            "a\nb",
            "\u{0}",
            "x\u{7f}",
            too_long.as_str(),
        ] {
            assert_eq!(
                check_account_name(name),
                Err(StorageError::InvalidAccountName { max_len: 200 }),
                "{name:?}"
            );
        }
    }

    #[test]
    fn deposit_table() {
        let check = |before: Balances, units: i64, want: Result<Balances, StorageError>| {
            assert_eq!(
                deposit(ACCOUNT, before, units),
                want,
                "{units} on {before:?}"
            );
        };
        check(bal(0, 0, 0, 0), 5, Ok(bal(5, 5, 0, 0)));
        check(bal(10, 4, 3, 3), 2, Ok(bal(12, 6, 3, 3)));
        check(bal(0, 0, 0, 0), i64::MAX, Ok(bal(i64::MAX, i64::MAX, 0, 0)));
        check(
            bal(i64::MAX - 1, 0, 0, i64::MAX - 1),
            1,
            Ok(bal(i64::MAX, 1, 0, i64::MAX - 1)),
        );
        let overflow = Err(StorageError::UnitsOverflow {
            account_id: ACCOUNT,
        });
        check(bal(i64::MAX, 0, 0, i64::MAX), 1, overflow.clone());
        // `available` alone overflowing is refused too (a corrupt row).
        check(bal(0, i64::MAX, 0, 0), 1, overflow);
        for units in [0, -1, i64::MIN] {
            check(
                bal(1, 1, 0, 0),
                units,
                Err(StorageError::InvalidUnits {
                    units,
                    max: i64::MAX,
                }),
            );
        }
    }

    #[test]
    fn settle_table() {
        let check =
            |before: Balances, units: i64, consumed: i64, want: Result<Balances, StorageError>| {
                assert_eq!(
                    settle(before, units, consumed),
                    want,
                    "{units}/{consumed} on {before:?}"
                );
            };
        let b = bal(20, 5, 10, 5);
        check(b, 4, 0, Ok(bal(20, 9, 6, 5)));
        check(b, 4, 1, Ok(bal(20, 8, 6, 6)));
        check(b, 4, 4, Ok(bal(20, 5, 6, 9)));
        check(b, 10, 3, Ok(bal(20, 12, 0, 8)));
        for consumed in [-1, 5, i64::MIN, i64::MAX] {
            check(
                b,
                4,
                consumed,
                Err(StorageError::InvalidConsumed { consumed, units: 4 }),
            );
        }
        check(
            b,
            11,
            0,
            Err(StorageError::Backend {
                message: "account holds 10 units but a lease of 11 is settling".into(),
            }),
        );
        // Consumption is checked before the holding.
        check(
            b,
            11,
            12,
            Err(StorageError::InvalidConsumed {
                consumed: 12,
                units: 11,
            }),
        );
    }

    fn at(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    fn d(ns: i128) -> SignedDuration {
        SignedDuration::from_nanos_i128(ns)
    }

    /// max_ttl 100 ns, grace 10 ns.
    fn policy() -> GrantPolicy {
        GrantPolicy::new(d(100), d(10)).unwrap()
    }

    fn lease(id: i64, units: i64, expiry_ns: i128, state: LeaseState) -> Lease {
        Lease {
            lease_id: LeaseId(id),
            account_id: ACCOUNT,
            units,
            fence: crate::model::Fence(id),
            expiry: at(expiry_ns),
            expiry_is_upper_bound: false,
            state,
            consumed: None,
        }
    }

    #[test]
    fn check_live_table() {
        let p = policy();
        let active = lease(1, 4, 1_000, LeaseState::Active);
        // Live until expiry + grace = 1,010 ns, exclusive.
        assert_eq!(check_live(&p, &active, at(-5)), Ok(()));
        assert_eq!(check_live(&p, &active, at(1_009)), Ok(()));
        for now in [1_010, 1_011] {
            assert_eq!(
                check_live(&p, &active, at(now)),
                Err(StorageError::LeaseReclaimable {
                    lease_id: LeaseId(1),
                    expiry: at(1_000),
                    now: at(now),
                })
            );
        }
        for state in [
            LeaseState::Released,
            LeaseState::Reclaimed,
            LeaseState::Consolidated,
        ] {
            let settled = lease(2, 4, 1_000, state);
            // Not active is reported first, live or not.
            for now in [0, 2_000] {
                assert_eq!(
                    check_live(&p, &settled, at(now)),
                    Err(StorageError::LeaseNotActive {
                        lease_id: LeaseId(2),
                        state,
                    })
                );
            }
        }
    }

    #[test]
    fn plan_acquire_table_and_error_order() {
        let p = policy();
        let b = bal(50, 30, 20, 0);
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 30, d(7), at(-20)),
            Ok(AcquirePlan {
                expiry: at(-13),
                granted_ttl: d(7),
                after: bal(50, 0, 50, 0),
            })
        );
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 1, d(101), at(0)),
            Ok(AcquirePlan {
                expiry: at(100),
                granted_ttl: d(100),
                after: bal(50, 29, 21, 0),
            })
        );
        // Units, then TTL, then expiry, then balance.
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 0, d(0), Timestamp::MAX),
            Err(StorageError::InvalidUnits {
                units: 0,
                max: i64::MAX
            })
        );
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 31, d(-1), Timestamp::MAX),
            Err(StorageError::InvalidTtl { ttl: d(-1) })
        );
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 31, d(1), Timestamp::MAX),
            Err(StorageError::UnrepresentableExpiry {
                now: Timestamp::MAX,
                ttl: d(1),
            })
        );
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 31, d(1), at(0)),
            Err(StorageError::InsufficientBalance {
                account_id: ACCOUNT,
                requested: 31,
                available: 30,
            })
        );
    }

    #[test]
    fn plan_release_table() {
        let p = policy();
        let l = lease(4, 6, 1_000, LeaseState::Active);
        let b = bal(20, 4, 10, 6);
        assert_eq!(
            plan_release(&p, &l, b, at(1_009), Some(2)),
            Ok(SettlePlan {
                consumed: 2,
                returned: 4,
                after: bal(20, 8, 4, 8),
            })
        );
        // The default charge is all units.
        assert_eq!(
            plan_release(&p, &l, b, at(0), None),
            Ok(SettlePlan {
                consumed: 6,
                returned: 0,
                after: bal(20, 4, 4, 12),
            })
        );
        assert_eq!(
            plan_release(&p, &l, b, at(1_010), Some(2)),
            Err(StorageError::LeaseReclaimable {
                lease_id: LeaseId(4),
                expiry: at(1_000),
                now: at(1_010),
            })
        );
        assert_eq!(
            plan_release(&p, &l, b, at(0), Some(7)),
            Err(StorageError::InvalidConsumed {
                consumed: 7,
                units: 6
            })
        );
        let released = lease(4, 6, 1_000, LeaseState::Released);
        assert_eq!(
            plan_release(&p, &released, b, at(0), Some(7)),
            Err(StorageError::LeaseNotActive {
                lease_id: LeaseId(4),
                state: LeaseState::Released,
            })
        );
    }

    #[test]
    fn plan_reclaim_table() {
        let p = policy();
        let b = bal(20, 4, 10, 6);
        let l = lease(5, 6, 1_000, LeaseState::Active);
        // Not yet reclaimable: skipped.
        assert_eq!(plan_reclaim(&p, &l, b, at(1_009)), Ok(None));
        for (now, late) in [(1_010, 0), (1_011, 1), (5_000, 3_990)] {
            assert_eq!(
                plan_reclaim(&p, &l, b, at(now)),
                Ok(Some(ReclaimPlan {
                    settle: SettlePlan {
                        consumed: 6,
                        returned: 0,
                        after: bal(20, 4, 4, 12),
                    },
                    late_by: SignedDuration::from_nanos(late),
                }))
            );
        }
        // Settled leases are skipped on either side of the boundary.
        for state in [
            LeaseState::Released,
            LeaseState::Reclaimed,
            LeaseState::Consolidated,
        ] {
            let settled = lease(5, 6, 1_000, state);
            assert_eq!(plan_reclaim(&p, &settled, b, at(1_009)), Ok(None));
            assert_eq!(plan_reclaim(&p, &settled, b, at(1_010)), Ok(None));
        }
        // A corrupt account (holding less than the lease) is an error.
        assert_eq!(
            plan_reclaim(&p, &l, bal(5, 0, 5, 0), at(1_010)),
            Err(StorageError::Backend {
                message: "account holds 5 units but a lease of 6 is settling".into(),
            })
        );
    }

    #[test]
    fn plan_renew_table() {
        let p = policy();
        let l = lease(6, 3, 1_000, LeaseState::Active);
        // Extends when now + ttl is later.
        assert_eq!(plan_renew(&p, &l, d(50), at(990)), Ok((at(1_040), d(50))));
        assert_eq!(
            plan_renew(&p, &l, d(500), at(1_009)),
            Ok((at(1_109), d(100)))
        );
        // Never shortens.
        assert_eq!(plan_renew(&p, &l, d(1), at(-7)), Ok((at(1_000), d(1))));
        assert_eq!(plan_renew(&p, &l, d(10), at(990)), Ok((at(1_000), d(10))));
        assert_eq!(
            plan_renew(&p, &l, d(1), at(1_010)),
            Err(StorageError::LeaseReclaimable {
                lease_id: LeaseId(6),
                expiry: at(1_000),
                now: at(1_010),
            })
        );
        // TTL and expiry are checked before the lease's state.
        let released = lease(6, 3, 1_000, LeaseState::Released);
        assert_eq!(
            plan_renew(&p, &released, d(0), at(0)),
            Err(StorageError::InvalidTtl { ttl: d(0) })
        );
        assert_eq!(
            plan_renew(&p, &released, d(1), Timestamp::MAX),
            Err(StorageError::UnrepresentableExpiry {
                now: Timestamp::MAX,
                ttl: d(1),
            })
        );
        assert_eq!(
            plan_renew(&p, &released, d(1), at(0)),
            Err(StorageError::LeaseNotActive {
                lease_id: LeaseId(6),
                state: LeaseState::Released,
            })
        );
    }

    #[test]
    fn check_consolidation_ids_table() {
        let ids = |v: &[i64]| v.iter().copied().map(LeaseId).collect::<Vec<_>>();
        assert_eq!(check_consolidation_ids(&ids(&[1])), Ok(()));
        assert_eq!(check_consolidation_ids(&ids(&[9, 1, 5])), Ok(()));
        let most: Vec<i64> = (1..=CONSOLIDATE_LEASES_MAX as i64).collect();
        assert_eq!(check_consolidation_ids(&ids(&most)), Ok(()));
        let too_many: Vec<i64> = (1..=CONSOLIDATE_LEASES_MAX as i64 + 1).collect();
        assert_eq!(
            check_consolidation_ids(&ids(&too_many)),
            Err(StorageError::InvalidLeaseCount {
                count: 1_001,
                max: 1_000
            })
        );
        assert_eq!(
            check_consolidation_ids(&[]),
            Err(StorageError::InvalidLeaseCount {
                count: 0,
                max: 1_000
            })
        );
        assert_eq!(
            check_consolidation_ids(&ids(&[4, 2, 9, 2])),
            Err(StorageError::DuplicateLease {
                lease_id: LeaseId(2)
            })
        );
        assert_eq!(
            check_consolidation_ids(&ids(&[7, 7])),
            Err(StorageError::DuplicateLease {
                lease_id: LeaseId(7)
            })
        );
    }

    #[test]
    fn plan_consolidate_table() {
        let p = policy();
        let a = lease(1, 2, 1_000, LeaseState::Active);
        let b = lease(2, 5, 900, LeaseState::Active);
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, &[a.clone(), b.clone()], d(30), at(899)),
            Ok(ConsolidationPlan {
                units: 7,
                expiry: at(929),
                granted_ttl: d(30),
            })
        );
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, std::slice::from_ref(&b), d(1_000), at(-50)),
            Ok(ConsolidationPlan {
                units: 5,
                expiry: at(50),
                granted_ttl: d(100),
            })
        );
        // b is reclaimable from 910 ns.
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, &[a.clone(), b.clone()], d(30), at(910)),
            Err(StorageError::LeaseReclaimable {
                lease_id: LeaseId(2),
                expiry: at(900),
                now: at(910),
            })
        );
        let other = Lease {
            account_id: AccountId(4),
            ..b.clone()
        };
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, &[a.clone(), other], d(30), at(0)),
            Err(StorageError::LeaseAccountMismatch {
                lease_id: LeaseId(2),
                account_id: ACCOUNT,
            })
        );
        let big = Lease {
            units: i64::MAX,
            ..b.clone()
        };
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, &[a.clone(), big], d(30), at(0)),
            Err(StorageError::UnitsOverflow {
                account_id: ACCOUNT
            })
        );
        // Shape, then TTL, then expiry, then the leases.
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, &[a.clone(), a.clone()], d(0), at(0)),
            Err(StorageError::DuplicateLease {
                lease_id: LeaseId(1)
            })
        );
        let settled = lease(3, 1, 0, LeaseState::Released);
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, std::slice::from_ref(&settled), d(0), at(0)),
            Err(StorageError::InvalidTtl { ttl: d(0) })
        );
        assert_eq!(
            plan_consolidate(
                &p,
                ACCOUNT,
                std::slice::from_ref(&settled),
                d(1),
                Timestamp::MAX
            ),
            Err(StorageError::UnrepresentableExpiry {
                now: Timestamp::MAX,
                ttl: d(1),
            })
        );
        assert_eq!(
            plan_consolidate(&p, ACCOUNT, &[a, settled], d(1), at(0)),
            Err(StorageError::LeaseNotActive {
                lease_id: LeaseId(3),
                state: LeaseState::Released,
            })
        );
    }
}
