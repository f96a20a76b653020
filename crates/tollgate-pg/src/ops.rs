//! The allocator's writing operations as steps of a caller's transaction.
//!
//! Each function here runs one operation of the [`PostgresStore`]
//! (create account, deposit, acquire, renew, release, consolidate, reclaim) on a connection
//! **inside an open transaction the caller owns**, so that a caller can
//! write its own rows and the allocator's in one all-or-nothing unit: an
//! admission that inserts its own record and acquires its reservation
//! commits both or neither. The [`Allocator`](tollgate::Allocator) methods
//! of [`PostgresStore`] are exactly these functions, each run in a
//! transaction of its own by the store's retrying wrapper.
//!
//! ```no_run
//! # async fn demo(store: &tollgate_pg::PostgresStore, req: tollgate::AcquireRequest,
//! #     now: tollgate::SuppliedTime) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = store.pool().begin().await?;
//! // ... the caller's own statements on &mut *tx ...
//! match tollgate_pg::ops::acquire(&mut tx, store, &req, now).await {
//!     Ok(grant) => { tx.commit().await?; let _ = grant; }
//!     Err(e) => { tx.rollback().await?; return Err(e.into_allocator_error().into()); }
//! }
//! # Ok(()) }
//! ```
//!
//! # The contract
//!
//! * `conn` must be in an open transaction (`BEGIN` at READ COMMITTED, the
//!   store's isolation; for instance from `store.pool().begin()`). Outside
//!   one, each statement would commit on its own and a failure would leave
//!   a half-written operation. The connection must have declared the
//!   store's grant policy and, on a database whose lease writes are fenced
//!   to the safe expiry cut, the cut, like the store's own
//!   ([`crate::declare_session`]); the store's pool has. Otherwise every
//!   lease write fails with [`tollgate::StorageError::PolicyMismatch`].
//! * Once a sampler has claimed an epoch, the database refuses an active
//!   lease whose expiry plus the recorded reclaim grace lies beyond the
//!   safe expiry cut plus the sealed horizon
//!   ([`tollgate::StorageError::HorizonExceeded`]): a `now` ahead of the
//!   cut can grant at most `cut + horizon - max_ttl - reclaim_grace`
//!   ahead.
//! * Rows are locked in the store's fixed order (the account, then its
//!   leases by ascending id). A caller that also locks allocator rows must
//!   take them in the same order, or risk deadlocks.
//! * No function commits, rolls back or retries. On `Err` the operation
//!   may have written part of its rows: **the caller must roll its
//!   transaction back** (and may run the whole transaction again when
//!   [`TxError::is_retryable`] says so: a serialization failure or a
//!   deadlock). After a rollback nothing of the operation remains: no
//!   balance, lease, ledger entry or idempotency record. Fences and lease
//!   ids come from database sequences, which a rollback does not rewind:
//!   the numbers an aborted grant drew are skipped, never reused.
//! * Every check the rules make comes first, so a refusal
//!   ([`TxError::Rule`]) normally comes before any write.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use sqlx::PgConnection;
use tollgate::{
    Account, AccountId, AcquireRequest, AllocatorError, Balances, Capability, Grant, InstantPair,
    Lease, LeaseId, LeaseState, NewAccount, ReclaimReport, Renewal, RuleError, Settlement,
    SuppliedTime, rules,
};

pub use crate::error::TxError;
use crate::error::{is_retryable, map_sqlx_error};
use crate::persistence::{self, PolicyLock};
use crate::store::{PostgresStore, running_policy_mismatch};

impl TxError {
    /// Whether the transaction that failed with this error may simply be
    /// run again from its start (a serialization failure or a deadlock).
    pub fn is_retryable(&self) -> bool {
        matches!(self, TxError::Db(e) if is_retryable(e))
    }

    /// The allocator error this stands for, as the store's own methods
    /// return it: rule refusals and storage failures as they are, database
    /// errors mapped to [`tollgate::StorageError`] (connection failures to
    /// `Unavailable`, everything else to `Failure`; messages without the
    /// URL or credentials).
    pub fn into_allocator_error(self) -> AllocatorError {
        match self {
            TxError::Rule(e) => e.into(),
            TxError::Storage(e) => e.into(),
            TxError::Db(e) => map_sqlx_error(e).into(),
        }
    }
}

fn not_found(account_id: AccountId) -> TxError {
    RuleError::AccountNotFound { account_id }.into()
}

/// Creates the account `new` (name checked by
/// [`rules::check_account_name`]) with zero balances and, when given, its
/// API key digest. Returns the account as inserted.
///
/// # Errors
/// [`RuleError::InvalidAccountName`]; database and storage errors. The
/// caller's transaction must then roll back (see the module docs).
pub async fn create_account(conn: &mut PgConnection, new: &NewAccount) -> Result<Account, TxError> {
    rules::check_account_name(&new.name)?;
    let account = persistence::insert_account(conn, &new.name).await?;
    if let Some(d) = &new.api_key_sha256 {
        persistence::insert_account_key(conn, account.account_id, d).await?;
    }
    Ok(account)
}

/// Deposits `units` (`1..=i64::MAX`) into `account_id` at `now`: locks the
/// account, writes its balances and the deposit's ledger entry. Returns the
/// account afterwards.
///
/// # Errors
/// [`RuleError::InvalidUnits`], [`RuleError::AccountNotFound`],
/// [`RuleError::UnitsOverflow`]; database and storage errors. The caller's
/// transaction must then roll back (see the module docs).
pub async fn deposit(
    conn: &mut PgConnection,
    account_id: AccountId,
    units: i64,
    now: Timestamp,
) -> Result<Account, TxError> {
    rules::check_units(units)?;
    let account = persistence::lock_account(conn, account_id)
        .await?
        .ok_or_else(|| not_found(account_id))?;
    let plan = rules::plan_deposit(account_id, account.balances, units, now)?;
    persistence::write_balances(conn, &[(account_id, plan.after)]).await?;
    persistence::insert_ledger(conn, &[plan.entry]).await?;
    Ok(Account {
        balances: plan.after,
        ..account
    })
}

/// Grants a lease of `req.units` on `req.account_id` until
/// `at.grant_base() + clamp(req.ttl)` with `store`'s policy and capabilities: locks the
/// account, inserts the lease (drawing a lease id and a fence), writes the
/// balances, the ledger entry and, with an idempotency key, the record.
/// A retry of a recorded request (same account, key, units and TTL)
/// returns the recorded grant and writes nothing.
///
/// # Errors
/// [`RuleError::InvalidUnits`], [`RuleError::InvalidTtl`],
/// [`RuleError::InvalidIdempotencyKey`],
/// [`RuleError::UnrepresentableExpiry`], [`RuleError::AccountNotFound`],
/// [`RuleError::IdempotencyConflict`], [`RuleError::DeadlineBeyondHorizon`],
/// [`RuleError::InsufficientBalance`];
/// [`tollgate::StorageError::PolicyMismatch`] (the connection does not
/// declare the recorded policy) and [`tollgate::StorageError::HorizonExceeded`]
/// (see the module docs); other database and storage errors. The caller's
/// transaction must then roll back (see the module docs).
pub async fn acquire(
    conn: &mut PgConnection,
    store: &PostgresStore,
    req: &AcquireRequest,
    at: SuppliedTime,
) -> Result<Grant, TxError> {
    let policy = store.policy_ref();
    rules::check_acquire(policy, req.units, req.ttl, req.idempotency_key.as_deref())?;
    let account = persistence::lock_account(conn, req.account_id)
        .await?
        .ok_or_else(|| not_found(req.account_id))?;
    if let Some(k) = &req.idempotency_key
        && let Some(r) = persistence::read_idempotency(conn, req.account_id, k).await?
    {
        rules::check_replay(&r, req.units, req.ttl)?;
        return Ok(store
            .caps()
            .grant(r.lease_id, r.fence, r.units, r.expiry, r.granted_ttl));
    }
    let plan = rules::plan_acquire(
        policy,
        req.account_id,
        account.balances,
        req.units,
        req.ttl,
        at,
    )?;
    let issued = persistence::insert_lease(conn, plan.account_id, plan.units, plan.expiry).await?;
    persistence::write_balances(conn, &[(plan.account_id, plan.after)]).await?;
    persistence::insert_ledger(conn, &[plan.entry(issued)]).await?;
    if let Some(k) = &req.idempotency_key {
        let record = plan.idempotency_record(issued);
        persistence::insert_idempotency(conn, req.account_id, k, &record).await?;
    }
    Ok(store.caps().grant(
        issued.lease_id,
        issued.fence,
        plan.units,
        plan.expiry,
        plan.granted_ttl,
    ))
}

/// Locks the account of `lease_id` and then the lease, and returns both as
/// read under the locks.
async fn lock_lease_and_account(
    conn: &mut PgConnection,
    lease_id: LeaseId,
) -> Result<(Account, Lease), TxError> {
    let unlocked = persistence::read_lease(conn, lease_id)
        .await?
        .ok_or(RuleError::LeaseNotFound { lease_id })?;
    // A lease's account never changes, so the unlocked read names the right
    // account to lock first.
    let account = persistence::lock_account(conn, unlocked.account_id)
        .await?
        .ok_or_else(|| not_found(unlocked.account_id))?;
    let lease = persistence::lock_account_leases(conn, account.account_id, &[lease_id.0])
        .await?
        .pop()
        .ok_or(RuleError::LeaseNotFound { lease_id })?;
    Ok((account, lease))
}

/// Extends the active, not yet reclaimable lease `lease_id` (authorized by
/// `capability`) to `max(expiry, at.grant_base() + clamp(ttl))` and issues
/// it a new fence: locks its account and the lease, updates the lease and appends
/// the ledger entry.
///
/// # Errors
/// [`RuleError::CapabilityMismatch`] (before any statement),
/// [`RuleError::LeaseNotFound`], [`RuleError::InvalidTtl`],
/// [`RuleError::UnrepresentableExpiry`], [`RuleError::DeadlineBeyondHorizon`],
/// [`RuleError::LeaseNotActive`], [`RuleError::LeaseReclaimable`] (judged
/// at `at.now()`); database and storage errors. The caller's transaction
/// must then roll back (see the module docs).
pub async fn renew(
    conn: &mut PgConnection,
    store: &PostgresStore,
    lease_id: LeaseId,
    capability: &Capability,
    ttl: SignedDuration,
    at: SuppliedTime,
) -> Result<Renewal, TxError> {
    store.caps().check(lease_id, capability)?;
    let (account, lease) = lock_lease_and_account(conn, lease_id).await?;
    let plan = rules::plan_renew(store.policy_ref(), &lease, account.balances, ttl, at)?;
    let fence =
        persistence::renew_lease(conn, lease_id, plan.expiry, plan.expiry_is_upper_bound).await?;
    persistence::insert_ledger(conn, &[plan.entry(fence)]).await?;
    Ok(Renewal {
        lease: plan.renewed(&lease, fence),
        granted_ttl: plan.granted_ttl,
        extended: plan.extended,
    })
}

/// Settles the active lease `lease_id` (authorized by `capability`) before
/// its reclaim boundary, charging `consumed` (default: all units) and
/// returning the rest: locks its account and the lease, settles the lease,
/// writes the balances and appends the ledger entry.
///
/// # Errors
/// [`RuleError::CapabilityMismatch`] (before any statement),
/// [`RuleError::LeaseNotFound`], [`RuleError::LeaseNotActive`],
/// [`RuleError::LeaseReclaimable`], [`RuleError::InvalidConsumed`];
/// database and storage errors. The caller's transaction must then roll
/// back (see the module docs).
pub async fn release(
    conn: &mut PgConnection,
    store: &PostgresStore,
    lease_id: LeaseId,
    capability: &Capability,
    now: Timestamp,
    consumed: Option<i64>,
) -> Result<Settlement, TxError> {
    store.caps().check(lease_id, capability)?;
    let (account, lease) = lock_lease_and_account(conn, lease_id).await?;
    let plan = rules::plan_release(store.policy_ref(), &lease, account.balances, now, consumed)?;
    persistence::settle_leases(conn, &[lease_id.0], plan.state, &[plan.consumed]).await?;
    persistence::write_balances(conn, &[(plan.entry.account_id, plan.after)]).await?;
    persistence::insert_ledger(conn, &[plan.entry]).await?;
    Ok(plan.settlement())
}

/// Loads the leases `ids` for a consolidation into `account_id`, whose row
/// the transaction holds: leases of this account are locked (ascending);
/// leases of other accounts are only read (the plan refuses them before it
/// looks at their state, and a lease's account never changes). Returns
/// them in `ids` order.
async fn load_consolidated(
    conn: &mut PgConnection,
    account_id: AccountId,
    ids: &[LeaseId],
) -> Result<Vec<Lease>, TxError> {
    let raw: Vec<i64> = ids.iter().map(|l| l.0).collect();
    let mut found: BTreeMap<LeaseId, Lease> = BTreeMap::new();
    for l in persistence::lock_account_leases(conn, account_id, &raw).await? {
        found.insert(l.lease_id, l);
    }
    if found.len() < ids.len() {
        for l in persistence::read_foreign_leases(conn, account_id, &raw).await? {
            found.insert(l.lease_id, l);
        }
    }
    let mut loaded = Vec::with_capacity(ids.len());
    for id in ids {
        let lease = found
            .remove(id)
            .ok_or(RuleError::LeaseNotFound { lease_id: *id })?;
        loaded.push(lease);
    }
    Ok(loaded)
}

/// Settles the named leases of `account_id` (each authorized by its
/// capability) as consolidated and grants one new lease of their summed
/// units until `at.grant_base() + clamp(ttl)`: locks the account and its named leases,
/// settles them, appends their entries, inserts the new lease (drawing a
/// lease id and a fence) and appends its entry.
///
/// # Errors
/// Before any statement: [`RuleError::InvalidLeaseCount`],
/// [`RuleError::DuplicateLease`], [`RuleError::InvalidTtl`],
/// [`RuleError::UnrepresentableExpiry`], [`RuleError::DeadlineBeyondHorizon`],
/// [`RuleError::CapabilityMismatch`]; then [`RuleError::AccountNotFound`], [`RuleError::LeaseNotFound`],
/// [`RuleError::LeaseAccountMismatch`], [`RuleError::LeaseNotActive`],
/// [`RuleError::LeaseReclaimable`], [`RuleError::UnitsOverflow`]; database
/// and storage errors. The caller's transaction must then roll back (see
/// the module docs).
pub async fn consolidate(
    conn: &mut PgConnection,
    store: &PostgresStore,
    account_id: AccountId,
    leases: &[(LeaseId, Capability)],
    ttl: SignedDuration,
    at: SuppliedTime,
) -> Result<Grant, TxError> {
    let policy = store.policy_ref();
    let ids = store.caps().check_consolidation(policy, leases, ttl, at)?;
    let account = persistence::lock_account(conn, account_id)
        .await?
        .ok_or_else(|| not_found(account_id))?;
    let loaded = load_consolidated(conn, account_id, &ids).await?;
    let plan = rules::plan_consolidate(policy, account_id, account.balances, &loaded, ttl, at)?;
    let settled: Vec<i64> = plan.settled_ids.iter().map(|l| l.0).collect();
    let zeros = vec![0; settled.len()];
    persistence::settle_leases(conn, &settled, LeaseState::Consolidated, &zeros).await?;
    persistence::insert_ledger(conn, &plan.settled).await?;
    let issued = persistence::insert_lease(conn, account_id, plan.units, plan.expiry).await?;
    persistence::insert_ledger(conn, &[plan.grant_entry(issued)]).await?;
    Ok(store.caps().grant(
        issued.lease_id,
        issued.fence,
        plan.units,
        plan.expiry,
        plan.granted_ttl,
    ))
}

/// Settles up to `limit` (`1..=`[`tollgate::RECLAIM_BATCH_MAX`]) active
/// leases reclaimable at `now`, in (account, lease) order, charging all of
/// their units. Accounts and leases another transaction holds are skipped
/// (`SKIP LOCKED`), so several workers never wait on each other; a skipped
/// lease is reclaimed by a later batch. Refuses to settle anything when the
/// recorded policy differs from `store`'s (a smaller grace would reclaim
/// early); `FOR SHARE` on the policy row makes a concurrent policy change
/// wait for the batch.
///
/// # Errors
/// [`RuleError::InvalidLimit`], [`tollgate::StorageError::PolicyMismatch`],
/// [`RuleError::CorruptHolding`]; database and storage errors. The caller's
/// transaction must then roll back (see the module docs).
pub async fn reclaim(
    conn: &mut PgConnection,
    store: &PostgresStore,
    now: Timestamp,
    limit: usize,
) -> Result<ReclaimReport, TxError> {
    let policy = store.policy_ref();
    let limit = rules::check_limit(limit, rules::RECLAIM_BATCH_MAX)?;
    let cutoff = policy.reclaim_cutoff(now);
    let mut report = ReclaimReport {
        cutoff,
        reclaimed: Vec::new(),
        units_charged: 0,
        late_by: Vec::new(),
    };
    // Underflow: no representable expiry is due, so there is nothing to
    // ask the database.
    let Some(cutoff) = cutoff else {
        return Ok(report);
    };
    let recorded = persistence::read_policy(conn, PolicyLock::Share).await?;
    if let Some(recorded) = recorded
        && recorded != *policy
    {
        return Err(TxError::Storage(running_policy_mismatch(recorded, *policy)));
    }
    let (candidates, balances) =
        lock_reclaim_candidates(conn, InstantPair::encode(cutoff), limit).await?;
    let plan = rules::plan_reclaim_batch(policy, &candidates, &balances, now)?;
    if plan.settled.is_empty() {
        return Ok(report);
    }
    let ids: Vec<i64> = plan.settled.iter().map(|r| r.settle.lease_id.0).collect();
    let consumed: Vec<i64> = plan.settled.iter().map(|r| r.settle.consumed).collect();
    persistence::settle_leases(conn, &ids, LeaseState::Reclaimed, &consumed).await?;
    persistence::write_balances(conn, &plan.balances).await?;
    let entries: Vec<_> = plan.settled.iter().map(|r| r.settle.entry).collect();
    persistence::insert_ledger(conn, &entries).await?;
    for r in &plan.settled {
        report.reclaimed.push(r.settle.lease_id);
        report.units_charged += i128::from(r.settle.consumed);
        report.late_by.push(r.late_by);
    }
    Ok(report)
}

/// The reclaim candidates due at `cutoff` that this transaction could lock
/// (their accounts first, then the leases, both `SKIP LOCKED` and
/// ascending), in (account, lease) order, with the balances of the locked
/// accounts.
async fn lock_reclaim_candidates(
    conn: &mut PgConnection,
    cutoff: InstantPair,
    limit: usize,
) -> Result<(Vec<Lease>, BTreeMap<AccountId, Balances>), TxError> {
    let candidates = persistence::reclaim_candidates(conn, cutoff, limit).await?;
    if candidates.is_empty() {
        return Ok((Vec::new(), BTreeMap::new()));
    }
    let mut account_ids: Vec<i64> = candidates.iter().map(|(a, _)| a.0).collect();
    account_ids.dedup(); // candidates are ordered by account
    let balances: BTreeMap<AccountId, Balances> =
        persistence::lock_accounts_skip_locked(conn, &account_ids)
            .await?
            .into_iter()
            .map(|a| (a.account_id, a.balances))
            .collect();
    let lease_ids: Vec<i64> = candidates
        .iter()
        .filter(|(a, _)| balances.contains_key(a))
        .map(|(_, l)| l.0)
        .collect();
    let mut locked: BTreeMap<LeaseId, Lease> =
        persistence::lock_leases_skip_locked(conn, &lease_ids)
            .await?
            .into_iter()
            .map(|l| (l.lease_id, l))
            .collect();
    // Leases another transaction holds are not in `locked`: skipped.
    let leases = candidates
        .iter()
        .filter_map(|(_, lease_id)| locked.remove(lease_id))
        .collect();
    Ok((leases, balances))
}
