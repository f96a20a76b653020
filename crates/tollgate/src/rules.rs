//! The accounting and life-cycle rules every store applies.
//!
//! Stores load rows, call one `plan_*` function, and write exactly what the
//! plan says (ARCHITECTURE.md: rules live in the core, stores call it): the
//! balances after, the lease change, and the ledger entries
//! ([`NewLedgerEntry`]), complete but for what the store's sequences assign
//! (a new lease's id and a new fence, passed back as [`Issued`]). Each
//! function validates everything before returning a plan, so a store that
//! gets an `Err` writes nothing. Validation order is part of the contract and
//! the same for every store: inputs (units, TTL) first, then expiry
//! arithmetic, then state, then balances.
//!
//! Invariants are asserted at both ends of every plan: the balances it
//! starts from and the balances it ends with conserve
//! (`deposited = available + held + consumed`, every term `>= 0`). A store
//! only ever loads conserving balances (PostgreSQL also CHECKs them), so a
//! failed assertion is a bug in a store or in these rules and panics; every
//! refusal of a request is a [`RuleError`].

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use crate::error::{InvalidChangedBy, RuleError};
use crate::model::{
    AccountId, Actor, Balances, Fence, IdempotencyRecord, Issued, Lease, LeaseId, LeaseState,
    LedgerKind, NewLedgerEntry, Settlement,
};
use crate::timing::{GrantPolicy, SuppliedTime};

/// The most leases one consolidation may name. A bound on the rows one
/// transaction locks; 1,000 leaves room for large fan-in while keeping the
/// transaction short.
pub const CONSOLIDATE_LEASES_MAX: usize = 1_000;

/// The largest batch one reclaim call settles. Bounds transaction length and
/// lock footprint; callers loop for more.
pub const RECLAIM_BATCH_MAX: usize = 10_000;

/// The reclaim batch size for workers that have no reason to choose
/// another (the service's `--reclaim-batch` default): large enough that one
/// transaction amortizes its round trips, small enough that it holds its
/// account locks for milliseconds (holders of those accounts wait that
/// long). At most [`RECLAIM_BATCH_MAX`].
pub const RECLAIM_BATCH_DEFAULT: usize = 1_000;

/// The longest idempotency key, in bytes.
pub const IDEMPOTENCY_KEY_MAX_BYTES: usize = 255;

/// The longest account name, in characters.
pub const ACCOUNT_NAME_MAX_CHARS: usize = 200;

/// The longest `changed_by` of a policy change (the operator who made it),
/// in characters. PostgreSQL CHECKs it too.
pub const CHANGED_BY_MAX_CHARS: usize = 200;

/// Checks a unit amount for deposit or acquire: `1..=i64::MAX`.
///
/// # Errors
/// [`RuleError::InvalidUnits`] for zero or negative amounts.
pub fn check_units(units: i64) -> Result<i64, RuleError> {
    if units <= 0 {
        return Err(RuleError::InvalidUnits {
            units,
            max: i64::MAX,
        });
    }
    Ok(units)
}

/// Checks a batch limit: `1..=max`.
///
/// # Errors
/// [`RuleError::InvalidLimit`] outside that range.
pub fn check_limit(limit: usize, max: usize) -> Result<usize, RuleError> {
    if limit == 0 || limit > max {
        return Err(RuleError::InvalidLimit { limit, max });
    }
    Ok(limit)
}

/// Checks an idempotency key: 1..=[`IDEMPOTENCY_KEY_MAX_BYTES`] visible ASCII
/// bytes (`!`..=`~`).
///
/// # Errors
/// [`RuleError::InvalidIdempotencyKey`].
pub fn check_idempotency_key(key: &str) -> Result<&str, RuleError> {
    let ok = !key.is_empty()
        && key.len() <= IDEMPOTENCY_KEY_MAX_BYTES
        && key.bytes().all(|b| b.is_ascii_graphic());
    if !ok {
        return Err(RuleError::InvalidIdempotencyKey {
            max_len: IDEMPOTENCY_KEY_MAX_BYTES,
        });
    }
    Ok(key)
}

/// The checks of an acquire request that need no stored state, in the
/// contract's order: units, then TTL, then the idempotency key (if any).
/// Stores make them before they touch storage.
///
/// # Errors
/// [`RuleError::InvalidUnits`], [`RuleError::InvalidTtl`],
/// [`RuleError::InvalidIdempotencyKey`].
pub fn check_acquire(
    policy: &GrantPolicy,
    units: i64,
    ttl: SignedDuration,
    idempotency_key: Option<&str>,
) -> Result<(), RuleError> {
    check_units(units)?;
    policy.clamp_ttl(ttl)?;
    if let Some(key) = idempotency_key {
        check_idempotency_key(key)?;
    }
    Ok(())
}

/// The rule for names people type: 1..=`max_chars` characters, none of
/// them control characters, not only whitespace.
fn is_valid_name(name: &str, max_chars: usize) -> bool {
    !name.trim().is_empty()
        && name.chars().count() <= max_chars
        && !name.chars().any(char::is_control)
}

/// Checks an account name: 1..=[`ACCOUNT_NAME_MAX_CHARS`] characters, none
/// of them control characters, not only whitespace.
///
/// # Errors
/// [`RuleError::InvalidAccountName`].
pub fn check_account_name(name: &str) -> Result<&str, RuleError> {
    if !is_valid_name(name, ACCOUNT_NAME_MAX_CHARS) {
        return Err(RuleError::InvalidAccountName {
            max_len: ACCOUNT_NAME_MAX_CHARS,
        });
    }
    Ok(name)
}

/// Checks the `changed_by` of a policy change: 1..=[`CHANGED_BY_MAX_CHARS`]
/// characters, none of them control characters, not only whitespace (the
/// account-name rule with its own bound).
///
/// # Errors
/// [`InvalidChangedBy`].
pub fn check_changed_by(changed_by: &str) -> Result<&str, InvalidChangedBy> {
    if !is_valid_name(changed_by, CHANGED_BY_MAX_CHARS) {
        return Err(InvalidChangedBy {
            max_len: CHANGED_BY_MAX_CHARS,
        });
    }
    Ok(changed_by)
}

/// Balances after depositing `units` (already checked positive).
///
/// # Errors
/// [`RuleError::UnitsOverflow`] if `deposited` or `available` would
/// exceed `i64::MAX`.
pub fn deposit(account_id: AccountId, before: Balances, units: i64) -> Result<Balances, RuleError> {
    let units = check_units(units)?;
    let overflow = RuleError::UnitsOverflow { account_id };
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
/// [`RuleError::InvalidUnits`] for zero or negative `units` (which would
/// move units from `held` back to `available`);
/// [`RuleError::InsufficientBalance`] when `available < units`.
pub fn hold(account_id: AccountId, before: Balances, units: i64) -> Result<Balances, RuleError> {
    let units = check_units(units)?;
    if before.available < units {
        return Err(RuleError::InsufficientBalance {
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
/// [`RuleError::InvalidConsumed`] outside `0..=units`;
/// [`RuleError::CorruptHolding`] if the account holds fewer than `units` (a
/// corrupted store: the invariant `held >= sum of active lease units` broke).
pub fn settle(before: Balances, units: i64, consumed: i64) -> Result<Balances, RuleError> {
    if !(0..=units).contains(&consumed) {
        return Err(RuleError::InvalidConsumed { consumed, units });
    }
    if before.held < units {
        return Err(RuleError::CorruptHolding {
            held: before.held,
            units,
        });
    }
    Ok(Balances {
        held: before.held - units,
        consumed: before.consumed + consumed,
        available: before.available + (units - consumed),
        ..before
    })
}

/// Asserts that a plan of `kind` starts from and ends with conserving
/// balances (see the module docs).
///
/// # Panics
/// When either breaks conservation: a bug in a store or in these rules.
fn assert_conserved(kind: LedgerKind, before: Balances, after: Balances) {
    assert!(
        before.is_conserved(),
        "{} planned from balances that break conservation: {before:?}",
        kind.as_str()
    );
    assert!(
        after.is_conserved(),
        "{} planned balances that break conservation: {after:?}",
        kind.as_str()
    );
}

/// Checks that `lease` may still be used by its holder at `now`: active and
/// not reclaimable (`now < expiry + reclaim_grace`).
///
/// # Errors
/// [`RuleError::LeaseNotActive`] or [`RuleError::LeaseReclaimable`].
pub fn check_live(policy: &GrantPolicy, lease: &Lease, now: Timestamp) -> Result<(), RuleError> {
    if lease.state != LeaseState::Active {
        return Err(RuleError::LeaseNotActive {
            lease_id: lease.lease_id,
            state: lease.state,
        });
    }
    if policy.is_reclaimable(lease.expiry, now) {
        return Err(RuleError::LeaseReclaimable {
            lease_id: lease.lease_id,
            expiry: lease.expiry,
            now,
        });
    }
    Ok(())
}

/// `ttl` truncated toward zero to whole microseconds, as writers before
/// migration 0017 stored requested TTLs.
pub fn truncate_to_micros(ttl: SignedDuration) -> SignedDuration {
    SignedDuration::new(ttl.as_secs(), ttl.subsec_nanos() / 1_000 * 1_000)
}

/// Decides a retried acquire that names an idempotency key already
/// recorded: `Ok` when it is the recorded request (same units and same
/// TTL), and the store then returns the recorded grant unchanged. A record
/// written before migration 0017 holds the TTL truncated to microseconds,
/// so the retry's TTL is compared after the same truncation.
///
/// # Errors
/// [`RuleError::IdempotencyConflict`] when the key was used with another
/// request.
pub fn check_replay(
    record: &IdempotencyRecord,
    units: i64,
    ttl: SignedDuration,
) -> Result<(), RuleError> {
    let ttl = if record.request_ttl_is_truncated {
        truncate_to_micros(ttl)
    } else {
        ttl
    };
    if record.units != units || record.request_ttl != ttl {
        return Err(RuleError::IdempotencyConflict);
    }
    Ok(())
}

/// What a deposit writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DepositPlan {
    /// The account's balances afterwards.
    pub after: Balances,
    /// The deposit's ledger entry.
    pub entry: NewLedgerEntry,
}

/// Plans a deposit of `units` at `now` on an account with `before`
/// balances.
///
/// # Errors
/// [`RuleError::InvalidUnits`], [`RuleError::UnitsOverflow`].
///
/// # Panics
/// When `before` breaks conservation (see the module docs).
pub fn plan_deposit(
    account_id: AccountId,
    before: Balances,
    units: i64,
    now: Timestamp,
) -> Result<DepositPlan, RuleError> {
    let units = check_units(units)?;
    let after = deposit(account_id, before, units)?;
    assert_conserved(LedgerKind::Deposit, before, after);
    Ok(DepositPlan {
        after,
        entry: NewLedgerEntry {
            account_id,
            lease_id: None,
            kind: LedgerKind::Deposit,
            actor: Actor::Operator,
            units,
            consumed: 0,
            before,
            after,
            fence: None,
            expiry: None,
            expiry_is_upper_bound: false,
            at: now,
        },
    })
}

/// What an acquire writes: a new active lease of `units` on `account_id`
/// until `expiry`, the balances after, and (once the store has issued the
/// lease's id and fence) its ledger entry and idempotency record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquirePlan {
    /// The account debited.
    pub account_id: AccountId,
    /// Units the new lease holds.
    pub units: i64,
    /// `grant_base + granted_ttl`, exact.
    pub expiry: Timestamp,
    /// The TTL requested (kept in the idempotency record).
    pub request_ttl: SignedDuration,
    /// The clamped TTL.
    pub granted_ttl: SignedDuration,
    /// The account's balances before.
    pub before: Balances,
    /// The account's balances afterwards.
    pub after: Balances,
    /// The supplied time's judging instant ([`SuppliedTime::now`]), which
    /// the ledger records.
    pub at: Timestamp,
}

impl AcquirePlan {
    /// The ledger entry of the grant the store issued as `issued`.
    pub fn entry(&self, issued: Issued) -> NewLedgerEntry {
        NewLedgerEntry {
            account_id: self.account_id,
            lease_id: Some(issued.lease_id),
            kind: LedgerKind::Acquire,
            actor: Actor::Holder,
            units: self.units,
            consumed: 0,
            before: self.before,
            after: self.after,
            fence: Some(issued.fence),
            expiry: Some(self.expiry),
            expiry_is_upper_bound: false,
            at: self.at,
        }
    }

    /// The idempotency record of the grant the store issued as `issued`
    /// (written only when the request named a key).
    pub fn idempotency_record(&self, issued: Issued) -> IdempotencyRecord {
        IdempotencyRecord {
            units: self.units,
            request_ttl: self.request_ttl,
            request_ttl_is_truncated: false,
            lease_id: issued.lease_id,
            fence: issued.fence,
            expiry: self.expiry,
            granted_ttl: self.granted_ttl,
        }
    }
}

/// Plans an acquire of `units` for `ttl` at supplied time `at` on an
/// account with `before` balances: the expiry is counted from
/// `at.grant_base()` ([`GrantPolicy::grant_expiry`]).
///
/// # Errors
/// In this order: [`RuleError::InvalidUnits`], [`RuleError::InvalidTtl`],
/// [`RuleError::UnrepresentableExpiry`], [`RuleError::DeadlineBeyondHorizon`],
/// [`RuleError::InsufficientBalance`].
///
/// # Panics
/// When `before` breaks conservation (see the module docs).
pub fn plan_acquire(
    policy: &GrantPolicy,
    account_id: AccountId,
    before: Balances,
    units: i64,
    ttl: SignedDuration,
    at: SuppliedTime,
) -> Result<AcquirePlan, RuleError> {
    let units = check_units(units)?;
    let (expiry, granted_ttl) = policy.grant_expiry(at, ttl)?;
    let after = hold(account_id, before, units)?;
    assert_conserved(LedgerKind::Acquire, before, after);
    Ok(AcquirePlan {
        account_id,
        units,
        expiry,
        request_ttl: ttl,
        granted_ttl,
        before,
        after,
        at: at.now(),
    })
}

/// What a release or a reclaim writes: the lease settles in `state`
/// charging `consumed`, the account's balances become `after`, and `entry`
/// is appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettlePlan {
    /// The settling lease.
    pub lease_id: LeaseId,
    /// Its terminal state ([`LeaseState::Released`] or
    /// [`LeaseState::Reclaimed`]).
    pub state: LeaseState,
    /// Units charged.
    pub consumed: i64,
    /// Units returned to `available`.
    pub returned: i64,
    /// The account's balances afterwards.
    pub after: Balances,
    /// The settlement's ledger entry.
    pub entry: NewLedgerEntry,
}

impl SettlePlan {
    /// What the settlement returns to its caller.
    pub fn settlement(&self) -> Settlement {
        Settlement {
            lease_id: self.lease_id,
            account_id: self.entry.account_id,
            state: self.state,
            units: self.entry.units,
            consumed: self.consumed,
            returned: self.returned,
            settled_at: self.entry.at,
            balances: self.after,
        }
    }
}

/// The settlement of `lease` (already checked) in `state` by `actor`,
/// charging `consumed` of its units.
fn plan_settle(
    lease: &Lease,
    before: Balances,
    state: LeaseState,
    actor: Actor,
    consumed: i64,
    now: Timestamp,
) -> Result<SettlePlan, RuleError> {
    let after = settle(before, lease.units, consumed)?;
    let kind = if state == LeaseState::Reclaimed {
        LedgerKind::Reclaim
    } else {
        LedgerKind::Release
    };
    assert_conserved(kind, before, after);
    Ok(SettlePlan {
        lease_id: lease.lease_id,
        state,
        consumed,
        returned: lease.units - consumed,
        after,
        entry: NewLedgerEntry {
            account_id: lease.account_id,
            lease_id: Some(lease.lease_id),
            kind,
            actor,
            units: lease.units,
            consumed,
            before,
            after,
            fence: Some(lease.fence),
            expiry: Some(lease.expiry),
            expiry_is_upper_bound: lease.expiry_is_upper_bound,
            at: now,
        },
    })
}

/// Plans the release of `lease` at `now`, charging `consumed` (default: all
/// of its units).
///
/// # Errors
/// [`RuleError::LeaseNotActive`], [`RuleError::LeaseReclaimable`]
/// (`expiry + grace <= now`), [`RuleError::InvalidConsumed`],
/// [`RuleError::CorruptHolding`].
///
/// # Panics
/// When `before` breaks conservation (see the module docs).
pub fn plan_release(
    policy: &GrantPolicy,
    lease: &Lease,
    before: Balances,
    now: Timestamp,
    consumed: Option<i64>,
) -> Result<SettlePlan, RuleError> {
    check_live(policy, lease, now)?;
    let consumed = consumed.unwrap_or(lease.units);
    plan_settle(
        lease,
        before,
        LeaseState::Released,
        Actor::Holder,
        consumed,
        now,
    )
}

/// What a reclaim writes, and how late it comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
/// [`RuleError::CorruptHolding`] on a corrupted account (see [`settle`]).
///
/// # Panics
/// When `before` breaks conservation (see the module docs).
pub fn plan_reclaim(
    policy: &GrantPolicy,
    lease: &Lease,
    before: Balances,
    now: Timestamp,
) -> Result<Option<ReclaimPlan>, RuleError> {
    if lease.state != LeaseState::Active {
        return Ok(None);
    }
    let Some(late_by) = policy.reclaim_late_by(lease.expiry, now) else {
        return Ok(None);
    };
    let settle = plan_settle(
        lease,
        before,
        LeaseState::Reclaimed,
        Actor::Reclaimer,
        lease.units,
        now,
    )?;
    Ok(Some(ReclaimPlan { settle, late_by }))
}

/// What one reclaim batch writes (by default: nothing).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReclaimBatchPlan {
    /// The leases that settle, in the candidates' order; their entries are
    /// appended in this order.
    pub settled: Vec<ReclaimPlan>,
    /// The final balances of every account a settlement touched, by
    /// ascending account id.
    pub balances: Vec<(AccountId, Balances)>,
}

/// Plans a reclaim batch at `now`: each of `candidates` (in the store's
/// order, (account, lease) ascending) is planned with [`plan_reclaim`]
/// against its account's balances as the batch has left them. A candidate
/// whose account is not in `balances` (one the store could not lock) or
/// that is not reclaimable is skipped.
///
/// # Errors
/// [`RuleError::CorruptHolding`] on a corrupted account; then nothing of
/// the batch may be written.
///
/// # Panics
/// When balances break conservation (see the module docs).
pub fn plan_reclaim_batch(
    policy: &GrantPolicy,
    candidates: &[Lease],
    balances: &BTreeMap<AccountId, Balances>,
    now: Timestamp,
) -> Result<ReclaimBatchPlan, RuleError> {
    let mut current = balances.clone();
    let mut touched: BTreeMap<AccountId, Balances> = BTreeMap::new();
    let mut settled = Vec::new();
    for lease in candidates {
        let Some(before) = current.get(&lease.account_id).copied() else {
            continue;
        };
        let Some(plan) = plan_reclaim(policy, lease, before, now)? else {
            continue;
        };
        current.insert(lease.account_id, plan.settle.after);
        touched.insert(lease.account_id, plan.settle.after);
        settled.push(plan);
    }
    Ok(ReclaimBatchPlan {
        settled,
        balances: touched.into_iter().collect(),
    })
}

/// What a renewal writes: the lease's new expiry (never earlier) and a new
/// fence, and its ledger entry (balances unchanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RenewPlan {
    /// The lease renewed.
    pub lease_id: LeaseId,
    /// Its new expiry: `max(expiry, grant_base + granted_ttl)`.
    pub expiry: Timestamp,
    /// Whether the new expiry is later than the lease's before the
    /// renewal (`false`: `grant_base + granted_ttl` did not pass it, so the
    /// expiry is unchanged; a renewal never shortens a lease).
    pub extended: bool,
    /// Whether the new expiry is still a legacy upper bound: only if the
    /// lease's was one and the renewal kept it.
    pub expiry_is_upper_bound: bool,
    /// The clamped TTL.
    pub granted_ttl: SignedDuration,
    /// The account of the lease.
    pub account_id: AccountId,
    /// The lease's units.
    pub units: i64,
    /// The account's balances (unchanged).
    pub balances: Balances,
    /// The supplied time's judging instant, which the ledger records.
    pub at: Timestamp,
}

impl RenewPlan {
    /// The ledger entry of the renewal, with the fence the store issued.
    pub fn entry(&self, fence: Fence) -> NewLedgerEntry {
        NewLedgerEntry {
            account_id: self.account_id,
            lease_id: Some(self.lease_id),
            kind: LedgerKind::Renew,
            actor: Actor::Holder,
            units: self.units,
            consumed: 0,
            before: self.balances,
            after: self.balances,
            fence: Some(fence),
            expiry: Some(self.expiry),
            expiry_is_upper_bound: self.expiry_is_upper_bound,
            at: self.at,
        }
    }

    /// `lease` (the one planned) after the renewal, with the fence the
    /// store issued.
    pub fn renewed(&self, lease: &Lease, fence: Fence) -> Lease {
        Lease {
            fence,
            expiry: self.expiry,
            expiry_is_upper_bound: self.expiry_is_upper_bound,
            ..lease.clone()
        }
    }
}

/// Plans a renewal of `lease` at supplied time `at` on an account with
/// `balances`: the lease must be live at `at.now()` ([`check_live`]), and
/// the new expiry is the later of the current expiry and
/// `at.grant_base() + clamped ttl`, so a renewal never shortens a lease.
///
/// # Errors
/// In this order: [`RuleError::InvalidTtl`],
/// [`RuleError::UnrepresentableExpiry`], [`RuleError::DeadlineBeyondHorizon`],
/// [`RuleError::LeaseNotActive`], [`RuleError::LeaseReclaimable`].
///
/// # Panics
/// When `balances` break conservation (see the module docs).
pub fn plan_renew(
    policy: &GrantPolicy,
    lease: &Lease,
    balances: Balances,
    ttl: SignedDuration,
    at: SuppliedTime,
) -> Result<RenewPlan, RuleError> {
    let (candidate, granted_ttl) = policy.grant_expiry(at, ttl)?;
    check_live(policy, lease, at.now())?;
    assert_conserved(LedgerKind::Renew, balances, balances);
    let expiry = candidate.max(lease.expiry);
    Ok(RenewPlan {
        lease_id: lease.lease_id,
        expiry,
        extended: expiry > lease.expiry,
        expiry_is_upper_bound: lease.expiry_is_upper_bound && expiry == lease.expiry,
        granted_ttl,
        account_id: lease.account_id,
        units: lease.units,
        balances,
        at: at.now(),
    })
}

/// What a consolidation writes: the named leases settle as consolidated
/// (charging nothing, balances unchanged), then one new lease of their
/// summed units is granted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsolidationPlan {
    /// The account of every lease.
    pub account_id: AccountId,
    /// The leases that settle, ascending.
    pub settled_ids: Vec<LeaseId>,
    /// Their ledger entries, in the same order, appended before the
    /// grant's.
    pub settled: Vec<NewLedgerEntry>,
    /// Units of the new lease: the sum of the old ones.
    pub units: i64,
    /// Exact expiry of the new lease.
    pub expiry: Timestamp,
    /// The clamped TTL.
    pub granted_ttl: SignedDuration,
    /// The account's balances (unchanged).
    pub balances: Balances,
    /// The supplied time's judging instant, which the ledger records.
    pub at: Timestamp,
}

impl ConsolidationPlan {
    /// The ledger entry of the new lease the store issued as `issued`.
    pub fn grant_entry(&self, issued: Issued) -> NewLedgerEntry {
        NewLedgerEntry {
            account_id: self.account_id,
            lease_id: Some(issued.lease_id),
            kind: LedgerKind::ConsolidatedGrant,
            actor: Actor::Holder,
            units: self.units,
            consumed: 0,
            before: self.balances,
            after: self.balances,
            fence: Some(issued.fence),
            expiry: Some(self.expiry),
            expiry_is_upper_bound: false,
            at: self.at,
        }
    }
}

/// Checks the shape of a consolidation request before anything is loaded:
/// 1..=[`CONSOLIDATE_LEASES_MAX`] distinct leases.
///
/// # Errors
/// [`RuleError::InvalidLeaseCount`], [`RuleError::DuplicateLease`].
pub fn check_consolidation_ids(ids: &[LeaseId]) -> Result<(), RuleError> {
    if ids.is_empty() || ids.len() > CONSOLIDATE_LEASES_MAX {
        return Err(RuleError::InvalidLeaseCount {
            count: ids.len(),
            max: CONSOLIDATE_LEASES_MAX,
        });
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(RuleError::DuplicateLease { lease_id: w[0] });
    }
    Ok(())
}

/// Plans a consolidation of `leases` (already loaded, in any order) into one
/// new lease of `account_id` at supplied time `at`, on an account with
/// `balances`. The old leases must be live at `at.now()` and settle as
/// consolidated, charging nothing; balances do not change; the new expiry
/// is counted from `at.grant_base()`.
///
/// # Errors
/// In this order: the errors of [`check_consolidation_ids`],
/// [`RuleError::InvalidTtl`], [`RuleError::UnrepresentableExpiry`],
/// [`RuleError::DeadlineBeyondHorizon`],
/// then per lease [`RuleError::LeaseAccountMismatch`],
/// [`RuleError::LeaseNotActive`], [`RuleError::LeaseReclaimable`], and
/// [`RuleError::UnitsOverflow`] if the sum exceeds `i64::MAX`.
///
/// # Panics
/// When `balances` break conservation (see the module docs).
pub fn plan_consolidate(
    policy: &GrantPolicy,
    account_id: AccountId,
    balances: Balances,
    leases: &[Lease],
    ttl: SignedDuration,
    at: SuppliedTime,
) -> Result<ConsolidationPlan, RuleError> {
    let now = at.now();
    let ids: Vec<LeaseId> = leases.iter().map(|l| l.lease_id).collect();
    check_consolidation_ids(&ids)?;
    let (expiry, granted_ttl) = policy.grant_expiry(at, ttl)?;
    let mut units: i64 = 0;
    for lease in leases {
        if lease.account_id != account_id {
            return Err(RuleError::LeaseAccountMismatch {
                lease_id: lease.lease_id,
                account_id,
            });
        }
        check_live(policy, lease, now)?;
        units = units
            .checked_add(lease.units)
            .ok_or(RuleError::UnitsOverflow { account_id })?;
    }
    assert_conserved(LedgerKind::Consolidate, balances, balances);
    let mut sorted: Vec<&Lease> = leases.iter().collect();
    sorted.sort_by_key(|l| l.lease_id);
    let settled = sorted
        .iter()
        .map(|old| NewLedgerEntry {
            account_id,
            lease_id: Some(old.lease_id),
            kind: LedgerKind::Consolidate,
            actor: Actor::Holder,
            units: old.units,
            consumed: 0,
            before: balances,
            after: balances,
            fence: Some(old.fence),
            expiry: Some(old.expiry),
            expiry_is_upper_bound: old.expiry_is_upper_bound,
            at: now,
        })
        .collect();
    Ok(ConsolidationPlan {
        account_id,
        settled_ids: sorted.iter().map(|l| l.lease_id).collect(),
        settled,
        units,
        expiry,
        granted_ttl,
        balances,
        at: now,
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

    fn check_hold(before: Balances, units: i64, expected: Result<Balances, RuleError>) {
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
            Err(RuleError::InsufficientBalance {
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
                Err(RuleError::InvalidUnits {
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
                Err(RuleError::InvalidUnits {
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
                Err(RuleError::InvalidLimit { limit, max: 10 })
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
                Err(RuleError::InvalidIdempotencyKey { max_len: 255 }),
                "{key:?}"
            );
        }
    }

    #[test]
    fn check_acquire_order() {
        let p = policy();
        let check = |units: i64, ttl: i128, key: Option<&str>, want: Result<(), RuleError>| {
            assert_eq!(
                check_acquire(&p, units, d(ttl), key),
                want,
                "{units} {ttl} {key:?}"
            );
        };
        check(1, 1, None, Ok(()));
        check(1, 1_000, Some("k"), Ok(()));
        let bad_key = Err(RuleError::InvalidIdempotencyKey {
            max_len: IDEMPOTENCY_KEY_MAX_BYTES,
        });
        check(1, 1, Some(""), bad_key.clone());
        check(1, 0, Some(""), Err(RuleError::InvalidTtl { ttl: d(0) }));
        check(
            0,
            0,
            Some(""),
            Err(RuleError::InvalidUnits {
                units: 0,
                max: i64::MAX,
            }),
        );
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
                Err(RuleError::InvalidAccountName { max_len: 200 }),
                "{name:?}"
            );
        }
    }

    #[test]
    fn deposit_table() {
        let check = |before: Balances, units: i64, want: Result<Balances, RuleError>| {
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
        let overflow = Err(RuleError::UnitsOverflow {
            account_id: ACCOUNT,
        });
        check(bal(i64::MAX, 0, 0, i64::MAX), 1, overflow.clone());
        // `available` alone overflowing is refused too (a corrupt row).
        check(bal(0, i64::MAX, 0, 0), 1, overflow);
        for units in [0, -1, i64::MIN] {
            check(
                bal(1, 1, 0, 0),
                units,
                Err(RuleError::InvalidUnits {
                    units,
                    max: i64::MAX,
                }),
            );
        }
    }

    #[test]
    fn settle_table() {
        let check =
            |before: Balances, units: i64, consumed: i64, want: Result<Balances, RuleError>| {
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
                Err(RuleError::InvalidConsumed { consumed, units: 4 }),
            );
        }
        check(
            b,
            11,
            0,
            Err(RuleError::CorruptHolding {
                held: 10,
                units: 11,
            }),
        );
        // Consumption is checked before the holding.
        check(
            b,
            11,
            12,
            Err(RuleError::InvalidConsumed {
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
                Err(RuleError::LeaseReclaimable {
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
                    Err(RuleError::LeaseNotActive {
                        lease_id: LeaseId(2),
                        state,
                    })
                );
            }
        }
    }

    /// The entry a plan is expected to carry (never a legacy upper bound;
    /// tests that need one set it with struct update syntax).
    #[allow(clippy::too_many_arguments)]
    fn entry(
        kind: LedgerKind,
        actor: Actor,
        lease_id: Option<i64>,
        (units, consumed): (i64, i64),
        before: Balances,
        after: Balances,
        lease: Option<(i64, i128)>,
        at_ns: i128,
    ) -> NewLedgerEntry {
        NewLedgerEntry {
            account_id: ACCOUNT,
            lease_id: lease_id.map(LeaseId),
            kind,
            actor,
            units,
            consumed,
            before,
            after,
            fence: lease.map(|(f, _)| Fence(f)),
            expiry: lease.map(|(_, e)| at(e)),
            expiry_is_upper_bound: false,
            at: at(at_ns),
        }
    }

    #[test]
    fn plan_deposit_table() {
        let before = bal(10, 4, 3, 3);
        let after = bal(12, 6, 3, 3);
        assert_eq!(
            plan_deposit(ACCOUNT, before, 2, at(5)),
            Ok(DepositPlan {
                after,
                entry: entry(
                    LedgerKind::Deposit,
                    Actor::Operator,
                    None,
                    (2, 0),
                    before,
                    after,
                    None,
                    5
                ),
            })
        );
        assert_eq!(
            plan_deposit(ACCOUNT, before, 0, at(5)),
            Err(RuleError::InvalidUnits {
                units: 0,
                max: i64::MAX
            })
        );
        assert_eq!(
            plan_deposit(ACCOUNT, bal(i64::MAX, 0, 0, i64::MAX), 1, at(5)),
            Err(RuleError::UnitsOverflow {
                account_id: ACCOUNT
            })
        );
    }

    #[test]
    #[should_panic(expected = "acquire planned from balances that break conservation")]
    fn a_plan_from_unconserved_balances_panics() {
        let _ = plan_acquire(&policy(), ACCOUNT, bal(10, 5, 0, 0), 1, d(1), at(0).into());
    }

    #[test]
    #[should_panic(expected = "renew planned from balances that break conservation")]
    fn a_balance_neutral_plan_from_unconserved_balances_panics() {
        let l = lease(1, 1, 1_000, LeaseState::Active);
        let _ = plan_renew(&policy(), &l, bal(0, 0, 1, 0), d(1), at(0).into());
    }

    #[test]
    fn plan_acquire_table_and_error_order() {
        let p = policy();
        let b = bal(50, 30, 20, 0);
        let issued = Issued {
            lease_id: LeaseId(8),
            fence: Fence(12),
        };
        let plan = plan_acquire(&p, ACCOUNT, b, 30, d(7), SuppliedTime::from(at(-20))).unwrap();
        assert_eq!(
            plan,
            AcquirePlan {
                account_id: ACCOUNT,
                units: 30,
                expiry: at(-13),
                request_ttl: d(7),
                granted_ttl: d(7),
                before: b,
                after: bal(50, 0, 50, 0),
                at: at(-20),
            }
        );
        assert_eq!(
            plan.entry(issued),
            entry(
                LedgerKind::Acquire,
                Actor::Holder,
                Some(8),
                (30, 0),
                b,
                bal(50, 0, 50, 0),
                Some((12, -13)),
                -20
            )
        );
        let clamped = plan_acquire(&p, ACCOUNT, b, 1, d(101), at(0).into()).unwrap();
        assert_eq!(
            clamped,
            AcquirePlan {
                account_id: ACCOUNT,
                units: 1,
                expiry: at(100),
                request_ttl: d(101),
                granted_ttl: d(100),
                before: b,
                after: bal(50, 29, 21, 0),
                at: at(0),
            }
        );
        // The record keeps the request's TTL, not the granted one.
        assert_eq!(
            clamped.idempotency_record(issued),
            IdempotencyRecord {
                units: 1,
                request_ttl: d(101),
                request_ttl_is_truncated: false,
                lease_id: LeaseId(8),
                fence: Fence(12),
                expiry: at(100),
                granted_ttl: d(100),
            }
        );
        // Units, then TTL, then expiry, then balance.
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 0, d(0), Timestamp::MAX.into()),
            Err(RuleError::InvalidUnits {
                units: 0,
                max: i64::MAX
            })
        );
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 31, d(-1), Timestamp::MAX.into()),
            Err(RuleError::InvalidTtl { ttl: d(-1) })
        );
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 31, d(1), Timestamp::MAX.into()),
            Err(RuleError::UnrepresentableExpiry {
                now: Timestamp::MAX,
                ttl: d(1),
            })
        );
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 31, d(1), at(0).into()),
            Err(RuleError::InsufficientBalance {
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
        let plan = plan_release(&p, &l, b, at(1_009), Some(2)).unwrap();
        assert_eq!(
            plan,
            SettlePlan {
                lease_id: LeaseId(4),
                state: LeaseState::Released,
                consumed: 2,
                returned: 4,
                after: bal(20, 8, 4, 8),
                entry: entry(
                    LedgerKind::Release,
                    Actor::Holder,
                    Some(4),
                    (6, 2),
                    b,
                    bal(20, 8, 4, 8),
                    Some((4, 1_000)),
                    1_009
                ),
            }
        );
        assert_eq!(
            plan.settlement(),
            Settlement {
                lease_id: LeaseId(4),
                account_id: ACCOUNT,
                state: LeaseState::Released,
                units: 6,
                consumed: 2,
                returned: 4,
                settled_at: at(1_009),
                balances: bal(20, 8, 4, 8),
            }
        );
        // The default charge is all units.
        assert_eq!(
            plan_release(&p, &l, b, at(0), None),
            Ok(SettlePlan {
                lease_id: LeaseId(4),
                state: LeaseState::Released,
                consumed: 6,
                returned: 0,
                after: bal(20, 4, 4, 12),
                entry: entry(
                    LedgerKind::Release,
                    Actor::Holder,
                    Some(4),
                    (6, 6),
                    b,
                    bal(20, 4, 4, 12),
                    Some((4, 1_000)),
                    0
                ),
            })
        );
        // A legacy upper bound stays one in the settlement's entry.
        let legacy = Lease {
            expiry_is_upper_bound: true,
            ..l.clone()
        };
        let settled = plan_release(&p, &legacy, b, at(0), Some(0)).unwrap();
        assert!(settled.entry.expiry_is_upper_bound);
        assert_eq!(
            plan_release(&p, &l, b, at(1_010), Some(2)),
            Err(RuleError::LeaseReclaimable {
                lease_id: LeaseId(4),
                expiry: at(1_000),
                now: at(1_010),
            })
        );
        assert_eq!(
            plan_release(&p, &l, b, at(0), Some(7)),
            Err(RuleError::InvalidConsumed {
                consumed: 7,
                units: 6
            })
        );
        let released = lease(4, 6, 1_000, LeaseState::Released);
        assert_eq!(
            plan_release(&p, &released, b, at(0), Some(7)),
            Err(RuleError::LeaseNotActive {
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
            let plan = plan_reclaim(&p, &l, b, at(now)).unwrap().unwrap();
            assert_eq!(
                plan,
                ReclaimPlan {
                    settle: SettlePlan {
                        lease_id: LeaseId(5),
                        state: LeaseState::Reclaimed,
                        consumed: 6,
                        returned: 0,
                        after: bal(20, 4, 4, 12),
                        entry: entry(
                            LedgerKind::Reclaim,
                            Actor::Reclaimer,
                            Some(5),
                            (6, 6),
                            b,
                            bal(20, 4, 4, 12),
                            Some((5, 1_000)),
                            now
                        ),
                    },
                    late_by: SignedDuration::from_nanos(late),
                }
            );
            assert_eq!(plan.settle.settlement().state, LeaseState::Reclaimed);
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
            Err(RuleError::CorruptHolding { held: 5, units: 6 })
        );
    }

    #[test]
    fn plan_reclaim_batch_table() {
        let p = policy();
        let other = AccountId(5);
        let unlocked = AccountId(4);
        let l1 = lease(1, 3, 1_000, LeaseState::Active);
        let l2 = lease(2, 2, 1_000, LeaseState::Active);
        let not_due = lease(3, 4, 5_000, LeaseState::Active);
        let of_unlocked = Lease {
            account_id: unlocked,
            ..lease(4, 1, 900, LeaseState::Active)
        };
        let l5 = Lease {
            account_id: other,
            ..lease(5, 2, 0, LeaseState::Active)
        };
        let start = BTreeMap::from([(ACCOUNT, bal(20, 5, 9, 6)), (other, bal(2, 0, 2, 0))]);
        let now = at(1_010);
        let candidates = [l5.clone(), l1.clone(), l2.clone(), not_due, of_unlocked];
        let batch = plan_reclaim_batch(&p, &candidates, &start, now).unwrap();
        // Each lease is planned against the balances the batch left.
        let want = vec![
            plan_reclaim(&p, &l5, bal(2, 0, 2, 0), now)
                .unwrap()
                .unwrap(),
            plan_reclaim(&p, &l1, bal(20, 5, 9, 6), now)
                .unwrap()
                .unwrap(),
            plan_reclaim(&p, &l2, bal(20, 5, 6, 9), now)
                .unwrap()
                .unwrap(),
        ];
        assert_eq!(
            batch,
            ReclaimBatchPlan {
                settled: want,
                balances: vec![(ACCOUNT, bal(20, 5, 4, 11)), (other, bal(2, 0, 0, 2))],
            }
        );
        assert_eq!(
            batch.settled.iter().map(|r| r.late_by).collect::<Vec<_>>(),
            [d(1_000), d(0), d(0)]
        );
        // Before 1,010 ns only l5 is due; before any expiry, nothing is.
        assert_eq!(
            plan_reclaim_batch(&p, &candidates, &start, at(1_009)),
            Ok(ReclaimBatchPlan {
                settled: vec![l5_plan(&p, &l5, at(1_009))],
                balances: vec![(other, bal(2, 0, 0, 2))],
            })
        );
        assert_eq!(
            plan_reclaim_batch(&p, &candidates[1..3], &start, at(0)),
            Ok(ReclaimBatchPlan {
                settled: vec![],
                balances: vec![],
            })
        );
        // A corrupt account fails the whole batch.
        let corrupt = BTreeMap::from([(ACCOUNT, bal(20, 18, 2, 0))]);
        assert_eq!(
            plan_reclaim_batch(&p, &candidates[1..3], &corrupt, now),
            Err(RuleError::CorruptHolding { held: 2, units: 3 })
        );
    }

    fn l5_plan(p: &GrantPolicy, l5: &Lease, now: Timestamp) -> ReclaimPlan {
        plan_reclaim(p, l5, bal(2, 0, 2, 0), now).unwrap().unwrap()
    }

    #[test]
    fn plan_renew_table() {
        let p = policy();
        let b = bal(9, 6, 3, 0);
        let l = lease(6, 3, 1_000, LeaseState::Active);
        let legacy = Lease {
            expiry_is_upper_bound: true,
            ..l.clone()
        };
        let check =
            |lease: &Lease, ttl: i128, now: i128, want: Result<(i128, i128, bool), RuleError>| {
                assert_eq!(
                    plan_renew(&p, lease, b, d(ttl), at(now).into()).map(|r| (
                        r.expiry,
                        r.granted_ttl,
                        r.expiry_is_upper_bound
                    )),
                    want.map(|(e, g, u)| (at(e), d(g), u)),
                    "renew {ttl} at {now}"
                );
            };
        // Extends when now + ttl is later.
        check(&l, 50, 990, Ok((1_040, 50, false)));
        check(&l, 500, 1_009, Ok((1_109, 100, false)));
        // Never shortens.
        check(&l, 1, -7, Ok((1_000, 1, false)));
        check(&l, 10, 990, Ok((1_000, 10, false)));
        // A legacy upper bound stays one only while the renewal keeps it.
        check(&legacy, 10, 990, Ok((1_000, 10, true)));
        check(&legacy, 11, 990, Ok((1_001, 11, false)));
        check(
            &l,
            1,
            1_010,
            Err(RuleError::LeaseReclaimable {
                lease_id: LeaseId(6),
                expiry: at(1_000),
                now: at(1_010),
            }),
        );
        // TTL and expiry are checked before the lease's state.
        let released = lease(6, 3, 1_000, LeaseState::Released);
        check(&released, 0, 0, Err(RuleError::InvalidTtl { ttl: d(0) }));
        assert_eq!(
            plan_renew(&p, &released, b, d(1), Timestamp::MAX.into()),
            Err(RuleError::UnrepresentableExpiry {
                now: Timestamp::MAX,
                ttl: d(1),
            })
        );
        check(
            &released,
            1,
            0,
            Err(RuleError::LeaseNotActive {
                lease_id: LeaseId(6),
                state: LeaseState::Released,
            }),
        );
    }

    /// On a stale reading (grant base after the judging instant) every plan
    /// that makes a deadline counts it from the base, judges liveness at
    /// `now`, records `now` in the ledger, and refuses a deadline beyond
    /// the limit before looking at state or balances. Staleness zero is
    /// the exact reading of the other tables.
    #[test]
    fn plans_count_from_the_grant_base_and_judge_at_now() {
        let p = policy();
        let b = bal(9, 6, 3, 0);
        let stale = |now: i128, base: i128| SuppliedTime::new(at(now), at(base));
        // Acquire: expiry = base + ttl, recorded at now.
        for (now, base) in [(100, 100), (100, 101), (100, 130)] {
            let plan = plan_acquire(&p, ACCOUNT, b, 2, d(7), stale(now, base)).unwrap();
            assert_eq!(
                (
                    plan.expiry,
                    plan.granted_ttl,
                    plan.at,
                    plan.entry(Issued {
                        lease_id: LeaseId(1),
                        fence: crate::model::Fence(1),
                    })
                    .at
                ),
                (at(base + 7), d(7), at(now), at(now)),
                "acquire at {now} from {base}"
            );
        }
        // The deadline base + ttl + grace = 130 + 7 + 10 = 147 must fit.
        let limited = |limit: i128| stale(100, 130).with_deadline_limit(at(limit));
        assert!(plan_acquire(&p, ACCOUNT, b, 2, d(7), limited(147)).is_ok());
        let beyond = RuleError::DeadlineBeyondHorizon {
            grant_base: at(130),
            ttl: d(7),
            limit: at(146),
        };
        assert_eq!(
            plan_acquire(&p, ACCOUNT, b, 2, d(7), limited(146)),
            Err(beyond.clone())
        );
        // ... before the balance: an empty account gets the horizon refusal.
        assert_eq!(
            plan_acquire(&p, ACCOUNT, bal(0, 0, 0, 0), 2, d(7), limited(146)),
            Err(beyond.clone())
        );
        // Renew: live when now < expiry + grace, whatever the base; the new
        // expiry is max(expiry, base + ttl).
        let l = lease(6, 3, 1_000, LeaseState::Active);
        let renew = |now: i128, base: i128, ttl: i128| {
            plan_renew(&p, &l, b, d(ttl), stale(now, base)).map(|r| (r.expiry, r.at))
        };
        assert_eq!(renew(1_009, 1_009, 50), Ok((at(1_059), at(1_009))));
        assert_eq!(renew(1_009, 1_030, 50), Ok((at(1_080), at(1_009))));
        assert_eq!(renew(990, 1_030, 5), Ok((at(1_035), at(990))));
        assert_eq!(renew(990, 995, 1), Ok((at(1_000), at(990))));
        assert_eq!(
            renew(1_010, 1_030, 50),
            Err(RuleError::LeaseReclaimable {
                lease_id: LeaseId(6),
                expiry: at(1_000),
                now: at(1_010),
            })
        );
        assert_eq!(
            plan_renew(
                &p,
                &l,
                b,
                d(50),
                stale(1_009, 1_030).with_deadline_limit(at(1_089))
            ),
            Err(RuleError::DeadlineBeyondHorizon {
                grant_base: at(1_030),
                ttl: d(50),
                limit: at(1_089),
            })
        );
        assert!(
            plan_renew(
                &p,
                &l,
                b,
                d(50),
                stale(1_009, 1_030).with_deadline_limit(at(1_090))
            )
            .is_ok()
        );
        // Consolidate: likewise.
        let l1 = lease(1, 2, 1_000, LeaseState::Active);
        let l2 = lease(2, 1, 2_000, LeaseState::Active);
        let c = plan_consolidate(
            &p,
            ACCOUNT,
            b,
            &[l1.clone(), l2.clone()],
            d(20),
            stale(1_009, 1_050),
        )
        .unwrap();
        assert_eq!(
            (
                c.expiry,
                c.at,
                c.settled[0].at,
                c.grant_entry(Issued {
                    lease_id: LeaseId(3),
                    fence: crate::model::Fence(3),
                })
                .at
            ),
            (at(1_070), at(1_009), at(1_009), at(1_009))
        );
        assert_eq!(
            plan_consolidate(
                &p,
                ACCOUNT,
                b,
                &[l1.clone(), l2.clone()],
                d(20),
                stale(1_010, 1_010)
            ),
            Err(RuleError::LeaseReclaimable {
                lease_id: LeaseId(1),
                expiry: at(1_000),
                now: at(1_010),
            })
        );
        assert_eq!(
            plan_consolidate(
                &p,
                ACCOUNT,
                b,
                &[l1, l2],
                d(20),
                stale(1_010, 1_050).with_deadline_limit(at(1_079))
            ),
            Err(RuleError::DeadlineBeyondHorizon {
                grant_base: at(1_050),
                ttl: d(20),
                limit: at(1_079),
            })
        );
    }

    #[test]
    fn plan_renew_writes_exact_entry_and_lease() {
        let p = policy();
        let b = bal(9, 6, 3, 0);
        let l = lease(6, 3, 1_000, LeaseState::Active);
        let legacy = Lease {
            expiry_is_upper_bound: true,
            ..l.clone()
        };
        let plan = plan_renew(&p, &l, b, d(50), at(990).into()).unwrap();
        assert_eq!(
            plan,
            RenewPlan {
                lease_id: LeaseId(6),
                expiry: at(1_040),
                extended: true,
                expiry_is_upper_bound: false,
                granted_ttl: d(50),
                account_id: ACCOUNT,
                units: 3,
                balances: b,
                at: at(990),
            }
        );
        assert_eq!(
            plan.entry(Fence(77)),
            entry(
                LedgerKind::Renew,
                Actor::Holder,
                Some(6),
                (3, 0),
                b,
                b,
                Some((77, 1_040)),
                990
            )
        );
        let kept = plan_renew(&p, &legacy, b, d(1), at(0).into()).unwrap();
        assert!(kept.entry(Fence(78)).expiry_is_upper_bound);
        // 0 + 1 does not pass the expiry 1_000: kept, not extended.
        assert_eq!((kept.expiry, kept.extended), (at(1_000), false));
        // A candidate equal to the expiry does not extend it either.
        let equal = plan_renew(&p, &l, b, d(10), at(990).into()).unwrap();
        assert_eq!((equal.expiry, equal.extended), (at(1_000), false));
        let one_more = plan_renew(&p, &l, b, d(11), at(990).into()).unwrap();
        assert_eq!((one_more.expiry, one_more.extended), (at(1_001), true));
        assert_eq!(
            plan.renewed(&legacy, Fence(77)),
            Lease {
                fence: Fence(77),
                expiry: at(1_040),
                expiry_is_upper_bound: false,
                ..l.clone()
            }
        );
        assert_eq!(
            kept.renewed(&legacy, Fence(78)),
            Lease {
                fence: Fence(78),
                ..legacy.clone()
            }
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
            Err(RuleError::InvalidLeaseCount {
                count: 1_001,
                max: 1_000
            })
        );
        assert_eq!(
            check_consolidation_ids(&[]),
            Err(RuleError::InvalidLeaseCount {
                count: 0,
                max: 1_000
            })
        );
        assert_eq!(
            check_consolidation_ids(&ids(&[4, 2, 9, 2])),
            Err(RuleError::DuplicateLease {
                lease_id: LeaseId(2)
            })
        );
        assert_eq!(
            check_consolidation_ids(&ids(&[7, 7])),
            Err(RuleError::DuplicateLease {
                lease_id: LeaseId(7)
            })
        );
    }

    /// Balances and two leases of `ACCOUNT` to consolidate: `a` (2 units,
    /// expiry 1,000 ns) and `b` (5 units, expiry 900 ns, a legacy bound).
    fn consolidation_case() -> (Balances, Lease, Lease) {
        let a = lease(1, 2, 1_000, LeaseState::Active);
        let b = Lease {
            expiry_is_upper_bound: true,
            ..lease(2, 5, 900, LeaseState::Active)
        };
        (bal(9, 2, 7, 0), a, b)
    }

    #[test]
    fn plan_consolidate_writes_exact_entries() {
        let p = policy();
        let (bs, a, b) = consolidation_case();
        // Named in any order; settled and recorded ascending.
        let plan = plan_consolidate(
            &p,
            ACCOUNT,
            bs,
            &[b.clone(), a.clone()],
            d(30),
            at(899).into(),
        )
        .unwrap();
        assert_eq!(
            plan,
            ConsolidationPlan {
                account_id: ACCOUNT,
                settled_ids: vec![LeaseId(1), LeaseId(2)],
                settled: vec![
                    entry(
                        LedgerKind::Consolidate,
                        Actor::Holder,
                        Some(1),
                        (2, 0),
                        bs,
                        bs,
                        Some((1, 1_000)),
                        899
                    ),
                    NewLedgerEntry {
                        expiry_is_upper_bound: true,
                        ..entry(
                            LedgerKind::Consolidate,
                            Actor::Holder,
                            Some(2),
                            (5, 0),
                            bs,
                            bs,
                            Some((2, 900)),
                            899
                        )
                    },
                ],
                units: 7,
                expiry: at(929),
                granted_ttl: d(30),
                balances: bs,
                at: at(899),
            }
        );
        assert_eq!(
            plan.grant_entry(Issued {
                lease_id: LeaseId(9),
                fence: Fence(13)
            }),
            entry(
                LedgerKind::ConsolidatedGrant,
                Actor::Holder,
                Some(9),
                (7, 0),
                bs,
                bs,
                Some((13, 929)),
                899
            )
        );
    }

    #[test]
    fn plan_consolidate_table_and_error_order() {
        let p = policy();
        let (bs, a, b) = consolidation_case();
        let short = |leases: &[Lease], ttl: i128, now: Timestamp| {
            plan_consolidate(&p, ACCOUNT, bs, leases, d(ttl), now.into())
                .map(|c| (c.units, c.expiry, c.granted_ttl))
        };
        assert_eq!(
            short(std::slice::from_ref(&b), 1_000, at(-50)),
            Ok((5, at(50), d(100)))
        );
        // b is reclaimable from 910 ns.
        assert_eq!(
            short(&[a.clone(), b.clone()], 30, at(910)),
            Err(RuleError::LeaseReclaimable {
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
            short(&[a.clone(), other], 30, at(0)),
            Err(RuleError::LeaseAccountMismatch {
                lease_id: LeaseId(2),
                account_id: ACCOUNT,
            })
        );
        let big = Lease {
            units: i64::MAX,
            ..b.clone()
        };
        assert_eq!(
            short(&[a.clone(), big], 30, at(0)),
            Err(RuleError::UnitsOverflow {
                account_id: ACCOUNT
            })
        );
        // Shape, then TTL, then expiry, then the leases.
        assert_eq!(
            short(&[a.clone(), a.clone()], 0, at(0)),
            Err(RuleError::DuplicateLease {
                lease_id: LeaseId(1)
            })
        );
        let settled = lease(3, 1, 0, LeaseState::Released);
        assert_eq!(
            short(std::slice::from_ref(&settled), 0, at(0)),
            Err(RuleError::InvalidTtl { ttl: d(0) })
        );
        assert_eq!(
            short(std::slice::from_ref(&settled), 1, Timestamp::MAX),
            Err(RuleError::UnrepresentableExpiry {
                now: Timestamp::MAX,
                ttl: d(1),
            })
        );
        assert_eq!(
            short(&[a, settled], 1, at(0)),
            Err(RuleError::LeaseNotActive {
                lease_id: LeaseId(3),
                state: LeaseState::Released,
            })
        );
    }

    #[test]
    fn truncation_to_micros_goes_toward_zero() {
        let check = |(s, n): (i64, i32), (es, en): (i64, i32)| {
            assert_eq!(
                truncate_to_micros(SignedDuration::new(s, n)),
                SignedDuration::new(es, en),
                "{s} s {n} ns"
            );
        };
        check((30, 1_999), (30, 1_000));
        check((0, 999), (0, 0));
        check((0, 1_000), (0, 1_000));
        check((-1, -1_999), (-1, -1_000));
        check((i64::MAX, 999_999_999), (i64::MAX, 999_999_000));
    }

    #[test]
    fn replays_match_exactly_or_after_legacy_truncation() {
        let record = |units: i64, ttl: SignedDuration, truncated: bool| IdempotencyRecord {
            units,
            request_ttl: ttl,
            request_ttl_is_truncated: truncated,
            lease_id: LeaseId(1),
            fence: Fence(1),
            expiry: Timestamp::UNIX_EPOCH,
            granted_ttl: ttl,
        };
        let check = |r: &IdempotencyRecord, units: i64, ttl: SignedDuration, matches: bool| {
            let want = if matches {
                Ok(())
            } else {
                Err(RuleError::IdempotencyConflict)
            };
            assert_eq!(
                check_replay(r, units, ttl),
                want,
                "{units} {ttl:?} on {r:?}"
            );
        };
        let exact = record(5, SignedDuration::new(30, 1_999), false);
        check(&exact, 5, SignedDuration::new(30, 1_999), true);
        check(&exact, 5, SignedDuration::new(30, 1_998), false);
        check(&exact, 5, SignedDuration::new(30, 1_000), false);
        check(&exact, 6, SignedDuration::new(30, 1_999), false);
        let legacy = record(5, SignedDuration::new(30, 1_000), true);
        check(&legacy, 5, SignedDuration::new(30, 1_000), true);
        check(&legacy, 5, SignedDuration::new(30, 1_999), true);
        check(&legacy, 5, SignedDuration::new(30, 2_000), false);
        check(&legacy, 5, SignedDuration::new(30, 999), false);
        check(&legacy, 4, SignedDuration::new(30, 1_000), false);
    }

    #[test]
    fn check_changed_by_table() {
        let longest = "é".repeat(CHANGED_BY_MAX_CHARS);
        for name in ["a", " ops team ", "first start", longest.as_str()] {
            assert_eq!(check_changed_by(name), Ok(name));
        }
        let too_long = "a".repeat(CHANGED_BY_MAX_CHARS + 1);
        for name in ["", "  ", "a\nb", "\u{7f}", too_long.as_str()] {
            assert_eq!(
                check_changed_by(name),
                Err(InvalidChangedBy { max_len: 200 }),
                "{name:?}"
            );
        }
        assert_eq!(
            InvalidChangedBy { max_len: 200 }.to_string(),
            "changed_by must be 1..=200 characters without control characters"
        );
    }
}
