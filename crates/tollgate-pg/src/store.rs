//! [`PostgresStore`]: the allocator on PostgreSQL.
//!
//! Each operation validates its inputs and the capability first (nothing
//! touches the database for a forged capability), then runs one transaction
//! through the retry wrapper: lock rows in the fixed order (account, then
//! leases ascending), read them, ask the core for a plan
//! (`tollgate::rules::plan_*`), and write exactly what the plan says. A rule
//! error rolls back before anything was written, so every `Err` leaves
//! accounts, leases and ledger as they were. The validation order equals
//! the [`tollgate::MemoryStore`]'s, so both stores return the same error for
//! the same request.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use tollgate::model::{Actor, LedgerKind};
use tollgate::{
    AUDIT_PAGE_MAX, Account, AccountId, AcquireRequest, Allocator, Balances, Capability,
    CapabilityKey, Fence, Grant, GrantPolicy, InstantPair, Lease, LeaseCapabilities, LeaseId,
    LeaseState, LedgerEntry, NewAccount, ReclaimReport, Renewal, Settlement, StorageError, StoreId,
    rules,
};

use crate::boxed;
use crate::error::{TxError, map_sqlx_error};
use crate::persistence::{
    self, IdempotencyRecord, LeaseCount, NewEntry, Op, OpStats, PolicyChange, PolicyLock, TxFuture,
    TxStats, transact,
};
use crate::schema::Schema;

/// The `changed_by` of the policy record written by the first process that
/// finds none.
pub const FIRST_START: &str = "first start";

/// The longest `changed_by` of a policy change, in characters (also a CHECK
/// constraint).
pub const CHANGED_BY_MAX_CHARS: usize = 200;

/// A reclaim batch size for workers that have no reason to choose another:
/// large enough that one transaction amortizes its round trips, small
/// enough that it holds its account locks for milliseconds (holders of
/// those accounts wait that long). At most [`tollgate::RECLAIM_BATCH_MAX`].
pub const RECLAIM_BATCH_DEFAULT: usize = 500;

/// Connection pool settings of a [`PostgresStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// The most connections the pool opens (default 10). Each operation
    /// holds one for the length of its transaction.
    pub max_connections: u32,
    /// How long an operation waits for a free connection (or for a new one
    /// to open) before failing with [`StorageError::Unavailable`]
    /// (default 10 s).
    pub acquire_timeout: Duration,
    /// This process takes its time from the safe expiry cut (`--clock
    /// safe-cut`): every connection declares it (`SET tollgate.clock =
    /// 'safe-cut'`). Once a safe-time sampler has claimed an epoch, the
    /// database refuses lease writes from any session that does not
    /// (SQLSTATE TGS10, [`StorageError::Unavailable`]), so a process on
    /// another clock, even one started before the first claim, can never
    /// reclaim, grant or renew by its own clock (default `false`).
    pub on_safe_cut: bool,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            on_safe_cut: false,
        }
    }
}

/// The PostgreSQL allocator. Cheap to share behind an `Arc`; all methods
/// take `&self`; any number of processes may share one database as long as
/// they apply the same [`GrantPolicy`] and capability key.
#[derive(Debug)]
pub struct PostgresStore {
    pool: PgPool,
    policy: GrantPolicy,
    caps: LeaseCapabilities,
    stats: TxStats,
}

impl PostgresStore {
    /// Connects to the database at `url` with [`StoreOptions::default`]; see
    /// [`PostgresStore::from_pool`] for the startup checks.
    ///
    /// # Errors
    /// As [`PostgresStore::connect_with`].
    pub async fn connect(
        url: &str,
        policy: GrantPolicy,
        key: CapabilityKey,
    ) -> Result<PostgresStore, StorageError> {
        PostgresStore::connect_with(url, policy, key, StoreOptions::default()).await
    }

    /// Connects to the database at `url` with a pool shaped by `options`;
    /// see [`PostgresStore::from_pool`] for the startup checks.
    ///
    /// # Errors
    /// [`StorageError::Backend`] for an unparsable URL (the message does not
    /// repeat it); [`StorageError::Unavailable`] if the database cannot be
    /// reached; the errors of [`PostgresStore::from_pool`].
    pub async fn connect_with(
        url: &str,
        policy: GrantPolicy,
        key: CapabilityKey,
        options: StoreOptions,
    ) -> Result<PostgresStore, StorageError> {
        boxed(PostgresStore::open(url, policy, key, options)).await
    }

    async fn open(
        url: &str,
        policy: GrantPolicy,
        key: CapabilityKey,
        options: StoreOptions,
    ) -> Result<PostgresStore, StorageError> {
        let connect = pgkit::DatabaseUrl::parse(url)
            .map_err(|_| StorageError::Backend {
                message: "invalid database url".into(),
            })?
            .into_connect_options();
        let on_safe_cut = options.on_safe_cut;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if on_safe_cut {
                        // Unnamed simple statement; the value is a literal.
                        sqlx::query("SET tollgate.clock = 'safe-cut'")
                            .persistent(false)
                            .execute(conn)
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect)
            .await
            .map_err(map_sqlx_error)?;
        PostgresStore::start(pool, policy, key).await
    }

    /// Builds a store on an existing pool after the startup checks:
    ///
    /// 1. the schema fence ([`Schema::check`] with [`Schema::current`]): the
    ///    database has applied exactly this binary's migrations;
    /// 2. the store identity (written by migration 0005) is read;
    /// 3. the policy: if none is recorded, `policy` is recorded (with a
    ///    change row by [`FIRST_START`]); otherwise it must equal `policy`
    ///    exactly.
    ///
    /// # Errors
    /// [`StorageError::Backend`] naming an unknown migration version, or the
    /// pending ones; [`StorageError::PolicyMismatch`] naming the recorded and
    /// the configured `max_ttl` and `reclaim_grace`;
    /// [`StorageError::Unavailable`] and [`StorageError::Backend`] on
    /// database failures.
    pub async fn from_pool(
        pool: PgPool,
        policy: GrantPolicy,
        key: CapabilityKey,
    ) -> Result<PostgresStore, StorageError> {
        boxed(PostgresStore::start(pool, policy, key)).await
    }

    async fn start(
        pool: PgPool,
        policy: GrantPolicy,
        key: CapabilityKey,
    ) -> Result<PostgresStore, StorageError> {
        Schema::current().check(&pool).await?;
        let stats = TxStats::default();
        let store_id = transact(&pool, &stats, Op::Admin, &(), |c, _| {
            Box::pin(async move { persistence::read_store_id(c).await })
        })
        .await?;
        transact(&pool, &stats, Op::Admin, &policy, |c, p| {
            Box::pin(record_or_check_policy(c, *p))
        })
        .await?;
        Ok(PostgresStore {
            pool,
            policy,
            caps: LeaseCapabilities::new(key, store_id),
            stats,
        })
    }

    /// The connection pool (for readiness probes and operator queries).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The store's identity, mixed into every capability.
    pub fn store_id(&self) -> StoreId {
        self.caps.store_id()
    }

    /// Transaction counters of `op` since this store was built.
    pub fn op_stats(&self, op: Op) -> OpStats {
        self.stats.snapshot(op)
    }

    /// Every transaction counter of `op` since this store was built:
    /// attempts, commits, retries, failures and latency.
    pub fn op_metrics(&self, op: Op) -> pgkit::OpMetrics {
        self.stats.metrics(op)
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn run<A, T, F>(&self, op: Op, args: &A, body: F) -> Result<T, StorageError>
    where
        A: Sync + ?Sized,
        F: for<'c> Fn(&'c mut PgConnection, &'c A) -> TxFuture<'c, T>,
    {
        transact(&self.pool, &self.stats, op, args, body).await
    }
}

// ---------------------------------------------------------------------------
// Policy commands.

fn policy_mismatch(recorded: GrantPolicy, configured: GrantPolicy) -> StorageError {
    StorageError::PolicyMismatch(format!(
        "the database records max_ttl {} and reclaim_grace {}, but this process is \
         configured with max_ttl {} and reclaim_grace {}; every process sharing these \
         grants must apply the same policy: change the recorded one only with the explicit \
         policy command",
        recorded.max_ttl(),
        recorded.reclaim_grace(),
        configured.max_ttl(),
        configured.reclaim_grace(),
    ))
}

async fn record_or_check_policy(
    conn: &mut PgConnection,
    policy: GrantPolicy,
) -> Result<(), TxError> {
    if persistence::insert_policy_if_absent(conn, policy).await? {
        persistence::insert_policy_change(conn, FIRST_START, None, policy).await?;
        return Ok(());
    }
    let recorded = persistence::read_policy(conn, PolicyLock::None)
        .await?
        .ok_or_else(|| StorageError::Backend {
            message: "the policy record vanished during startup".into(),
        })?;
    if recorded != policy {
        return Err(policy_mismatch(recorded, policy).into());
    }
    Ok(())
}

/// The policy recorded in the database, `None` if no process has started
/// against it yet.
///
/// # Errors
/// [`StorageError::Unavailable`] and [`StorageError::Backend`] on database
/// failures.
pub async fn recorded_policy(pool: &PgPool) -> Result<Option<GrantPolicy>, StorageError> {
    boxed(transact(
        pool,
        &TxStats::default(),
        Op::Admin,
        &(),
        |c, _| Box::pin(async move { persistence::read_policy(c, PolicyLock::None).await }),
    ))
    .await
}

/// The operator command that changes the recorded policy to `policy` and
/// records who did it (`changed_by`, 1..=[`CHANGED_BY_MAX_CHARS`]
/// characters, no control characters) with the old and new values.
///
/// Processes already running keep the policy they started with; restart
/// them with the new configuration (a process whose configuration differs
/// refuses to start, and running reclaim batches refuse to settle anything
/// once the recorded grace differs from theirs). Quiesce reclaim workers
/// before changing `reclaim_grace`.
///
/// # Errors
/// [`StorageError::Backend`] for an invalid `changed_by`; database errors.
pub async fn set_policy(
    pool: &PgPool,
    policy: GrantPolicy,
    changed_by: &str,
) -> Result<PolicyChange, StorageError> {
    let valid = !changed_by.trim().is_empty()
        && changed_by.chars().count() <= CHANGED_BY_MAX_CHARS
        && !changed_by.chars().any(char::is_control);
    if !valid {
        return Err(StorageError::Backend {
            message: format!(
                "changed_by must be 1..={CHANGED_BY_MAX_CHARS} characters without control \
                 characters"
            ),
        });
    }
    let args = (policy, changed_by);
    boxed(transact(
        pool,
        &TxStats::default(),
        Op::Admin,
        &args,
        |c, a| Box::pin(set_policy_tx(c, a.0, a.1)),
    ))
    .await
}

async fn set_policy_tx(
    conn: &mut PgConnection,
    policy: GrantPolicy,
    changed_by: &str,
) -> Result<PolicyChange, TxError> {
    let old = persistence::read_policy(conn, PolicyLock::Update).await?;
    if old.is_some() {
        persistence::update_policy(conn, policy).await?;
    } else if !persistence::insert_policy_if_absent(conn, policy).await? {
        return Err(StorageError::Backend {
            message: "the policy was recorded concurrently; retry the command".into(),
        }
        .into());
    }
    persistence::insert_policy_change(conn, changed_by, old, policy).await
}

/// The most recent policy records (at most
/// [`persistence::POLICY_CHANGES_MAX`]), oldest first.
///
/// # Errors
/// Database errors.
pub async fn policy_changes(pool: &PgPool) -> Result<Vec<PolicyChange>, StorageError> {
    boxed(transact(
        pool,
        &TxStats::default(),
        Op::Admin,
        &(),
        |c, _| Box::pin(async move { persistence::policy_changes(c).await }),
    ))
    .await
}

/// The operators' legacy-bound count ([`persistence::LEASE_COUNTS_SQL`],
/// verbatim from docs/upgrade-0017.md), sorted by state name then flag.
/// After the upgrade has drained, no row has state `active` with
/// `expiry_is_upper_bound = true`.
///
/// # Errors
/// Database errors.
pub async fn lease_counts(pool: &PgPool) -> Result<Vec<LeaseCount>, StorageError> {
    boxed(transact(
        pool,
        &TxStats::default(),
        Op::Admin,
        &(),
        |c, _| Box::pin(async move { persistence::lease_counts(c).await }),
    ))
    .await
}

/// Whether a migration is running against this database (its dedicated
/// connection, [`crate::MIGRATE_APPLICATION_NAME`], is connected): the
/// maintenance part of readiness.
///
/// # Errors
/// Database errors.
pub async fn migration_in_progress(pool: &PgPool) -> Result<bool, StorageError> {
    boxed(transact(
        pool,
        &TxStats::default(),
        Op::Admin,
        &(),
        |c, _| Box::pin(async move { persistence::migration_in_progress(c).await }),
    ))
    .await
}

// ---------------------------------------------------------------------------
// Transaction bodies.

fn not_found(account_id: AccountId) -> TxError {
    StorageError::AccountNotFound { account_id }.into()
}

async fn create_account_tx(conn: &mut PgConnection, new: &NewAccount) -> Result<Account, TxError> {
    let account = persistence::insert_account(conn, &new.name).await?;
    if let Some(d) = &new.api_key_sha256 {
        persistence::insert_account_key(conn, account.account_id, d).await?;
    }
    Ok(account)
}

async fn deposit_tx(
    conn: &mut PgConnection,
    account_id: AccountId,
    units: i64,
    now: Timestamp,
) -> Result<Account, TxError> {
    let account = persistence::lock_account(conn, account_id)
        .await?
        .ok_or_else(|| not_found(account_id))?;
    let before = account.balances;
    let after = rules::deposit(account_id, before, units)?;
    persistence::write_balances(conn, &[(account_id, after)]).await?;
    persistence::insert_ledger(
        conn,
        &[NewEntry {
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
            at: now,
        }],
    )
    .await?;
    Ok(Account {
        balances: after,
        ..account
    })
}

/// `ttl` truncated toward zero to whole microseconds, as writers before
/// migration 0017 stored requested TTLs.
fn truncate_to_micros(ttl: SignedDuration) -> SignedDuration {
    SignedDuration::new(ttl.as_secs(), ttl.subsec_nanos() / 1_000 * 1_000)
}

/// Whether a retried request is the one an idempotency record was written
/// for: same units and same TTL. A record written before migration 0017
/// holds the TTL truncated to microseconds, so the retry's TTL is compared
/// after the same truncation.
fn same_request(record: &IdempotencyRecord, req: &AcquireRequest) -> bool {
    let ttl = if record.request_ttl_is_truncated {
        truncate_to_micros(req.ttl)
    } else {
        req.ttl
    };
    record.units == req.units && record.request_ttl == ttl
}

enum Acquired {
    Replayed(IdempotencyRecord),
    New {
        lease_id: LeaseId,
        fence: Fence,
        expiry: Timestamp,
        granted_ttl: SignedDuration,
    },
}

async fn acquire_tx(
    conn: &mut PgConnection,
    req: &AcquireRequest,
    policy: GrantPolicy,
    now: Timestamp,
) -> Result<Acquired, TxError> {
    let account = persistence::lock_account(conn, req.account_id)
        .await?
        .ok_or_else(|| not_found(req.account_id))?;
    if let Some(k) = &req.idempotency_key
        && let Some(record) = persistence::read_idempotency(conn, req.account_id, k).await?
    {
        if !same_request(&record, req) {
            return Err(StorageError::IdempotencyConflict.into());
        }
        return Ok(Acquired::Replayed(record));
    }
    let before = account.balances;
    let plan = rules::plan_acquire(&policy, req.account_id, before, req.units, req.ttl, now)?;
    let (lease_id, fence) =
        persistence::insert_lease(conn, req.account_id, req.units, plan.expiry).await?;
    persistence::write_balances(conn, &[(req.account_id, plan.after)]).await?;
    persistence::insert_ledger(
        conn,
        &[NewEntry {
            account_id: req.account_id,
            lease_id: Some(lease_id),
            kind: LedgerKind::Acquire,
            actor: Actor::Holder,
            units: req.units,
            consumed: 0,
            before,
            after: plan.after,
            fence: Some(fence),
            expiry: Some((plan.expiry, false)),
            at: now,
        }],
    )
    .await?;
    if let Some(k) = &req.idempotency_key {
        let record = IdempotencyRecord {
            units: req.units,
            request_ttl: req.ttl,
            request_ttl_is_truncated: false,
            lease_id,
            fence,
            expiry: plan.expiry,
            granted_ttl: plan.granted_ttl,
        };
        persistence::insert_idempotency(conn, req.account_id, k, &record).await?;
    }
    Ok(Acquired::New {
        lease_id,
        fence,
        expiry: plan.expiry,
        granted_ttl: plan.granted_ttl,
    })
}

/// Locks the account of `lease_id` and then the lease, and returns both as
/// read under the locks.
async fn lock_lease_and_account(
    conn: &mut PgConnection,
    lease_id: LeaseId,
) -> Result<(Account, Lease), TxError> {
    let unlocked = persistence::read_lease(conn, lease_id)
        .await?
        .ok_or(StorageError::LeaseNotFound { lease_id })?;
    // A lease's account never changes, so the unlocked read names the right
    // account to lock first.
    let account = persistence::lock_account(conn, unlocked.account_id)
        .await?
        .ok_or_else(|| not_found(unlocked.account_id))?;
    let lease = persistence::lock_account_leases(conn, account.account_id, &[lease_id.0])
        .await?
        .pop()
        .ok_or(StorageError::LeaseNotFound { lease_id })?;
    Ok((account, lease))
}

async fn renew_tx(
    conn: &mut PgConnection,
    lease_id: LeaseId,
    ttl: SignedDuration,
    policy: GrantPolicy,
    now: Timestamp,
) -> Result<Renewal, TxError> {
    let (account, lease) = lock_lease_and_account(conn, lease_id).await?;
    let (expiry, granted_ttl) = rules::plan_renew(&policy, &lease, ttl, now)?;
    // The expiry stays a legacy upper bound only if the renewal kept it.
    let expiry_is_upper_bound = lease.expiry_is_upper_bound && expiry == lease.expiry;
    let fence = persistence::renew_lease(conn, lease_id, expiry, expiry_is_upper_bound).await?;
    persistence::insert_ledger(
        conn,
        &[NewEntry {
            account_id: lease.account_id,
            lease_id: Some(lease_id),
            kind: LedgerKind::Renew,
            actor: Actor::Holder,
            units: lease.units,
            consumed: 0,
            before: account.balances,
            after: account.balances,
            fence: Some(fence),
            expiry: Some((expiry, expiry_is_upper_bound)),
            at: now,
        }],
    )
    .await?;
    Ok(Renewal {
        lease: Lease {
            fence,
            expiry,
            expiry_is_upper_bound,
            ..lease
        },
        granted_ttl,
    })
}

async fn release_tx(
    conn: &mut PgConnection,
    lease_id: LeaseId,
    consumed: Option<i64>,
    policy: GrantPolicy,
    now: Timestamp,
) -> Result<Settlement, TxError> {
    let (account, lease) = lock_lease_and_account(conn, lease_id).await?;
    let before = account.balances;
    let plan = rules::plan_release(&policy, &lease, before, now, consumed)?;
    persistence::settle_leases(conn, &[lease_id.0], LeaseState::Released, &[plan.consumed]).await?;
    persistence::write_balances(conn, &[(lease.account_id, plan.after)]).await?;
    persistence::insert_ledger(
        conn,
        &[NewEntry {
            account_id: lease.account_id,
            lease_id: Some(lease_id),
            kind: LedgerKind::Release,
            actor: Actor::Holder,
            units: lease.units,
            consumed: plan.consumed,
            before,
            after: plan.after,
            fence: Some(lease.fence),
            expiry: Some((lease.expiry, lease.expiry_is_upper_bound)),
            at: now,
        }],
    )
    .await?;
    Ok(Settlement {
        lease_id,
        account_id: lease.account_id,
        state: LeaseState::Released,
        units: lease.units,
        consumed: plan.consumed,
        returned: plan.returned,
        settled_at: now,
        balances: plan.after,
    })
}

struct ConsolidateArgs {
    account_id: AccountId,
    ids: Vec<LeaseId>,
    ttl: SignedDuration,
    policy: GrantPolicy,
    now: Timestamp,
}

async fn consolidate_tx(
    conn: &mut PgConnection,
    a: &ConsolidateArgs,
) -> Result<(LeaseId, Fence, rules::ConsolidationPlan), TxError> {
    let account = persistence::lock_account(conn, a.account_id)
        .await?
        .ok_or_else(|| not_found(a.account_id))?;
    let raw: Vec<i64> = a.ids.iter().map(|l| l.0).collect();
    // Leases of this account are locked (after the account, ascending);
    // leases of other accounts are only read: the plan refuses them before
    // it looks at their state, and their account never changes.
    let mut found: BTreeMap<LeaseId, Lease> = BTreeMap::new();
    for l in persistence::lock_account_leases(conn, a.account_id, &raw).await? {
        found.insert(l.lease_id, l);
    }
    if found.len() < a.ids.len() {
        for l in persistence::read_foreign_leases(conn, a.account_id, &raw).await? {
            found.insert(l.lease_id, l);
        }
    }
    let mut loaded = Vec::with_capacity(a.ids.len());
    for id in &a.ids {
        let lease = found
            .get(id)
            .cloned()
            .ok_or(StorageError::LeaseNotFound { lease_id: *id })?;
        loaded.push(lease);
    }
    let plan = rules::plan_consolidate(&a.policy, a.account_id, &loaded, a.ttl, a.now)?;
    let balances = account.balances;
    loaded.sort_by_key(|l| l.lease_id);
    let settled: Vec<i64> = loaded.iter().map(|l| l.lease_id.0).collect();
    let zeros = vec![0; settled.len()];
    persistence::settle_leases(conn, &settled, LeaseState::Consolidated, &zeros).await?;
    let mut entries: Vec<NewEntry> = loaded
        .iter()
        .map(|old| NewEntry {
            account_id: a.account_id,
            lease_id: Some(old.lease_id),
            kind: LedgerKind::Consolidate,
            actor: Actor::Holder,
            units: old.units,
            consumed: 0,
            before: balances,
            after: balances,
            fence: Some(old.fence),
            expiry: Some((old.expiry, old.expiry_is_upper_bound)),
            at: a.now,
        })
        .collect();
    persistence::insert_ledger(conn, &entries).await?;
    let (lease_id, fence) =
        persistence::insert_lease(conn, a.account_id, plan.units, plan.expiry).await?;
    entries.clear();
    entries.push(NewEntry {
        account_id: a.account_id,
        lease_id: Some(lease_id),
        kind: LedgerKind::ConsolidatedGrant,
        actor: Actor::Holder,
        units: plan.units,
        consumed: 0,
        before: balances,
        after: balances,
        fence: Some(fence),
        expiry: Some((plan.expiry, false)),
        at: a.now,
    });
    persistence::insert_ledger(conn, &entries).await?;
    Ok((lease_id, fence, plan))
}

async fn reclaim_tx(
    conn: &mut PgConnection,
    policy: GrantPolicy,
    cutoff: InstantPair,
    limit: usize,
    now: Timestamp,
) -> Result<Vec<(LeaseId, i64, SignedDuration)>, TxError> {
    // A worker whose grace differs from the recorded one must not settle
    // anything: a smaller grace would reclaim early. FOR SHARE makes a
    // concurrent policy change wait for this batch.
    let recorded = persistence::read_policy(conn, PolicyLock::Share).await?;
    if let Some(recorded) = recorded
        && recorded != policy
    {
        return Err(policy_mismatch(recorded, policy).into());
    }
    let candidates = persistence::reclaim_candidates(conn, cutoff, limit).await?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let mut account_ids: Vec<i64> = candidates.iter().map(|(a, _)| a.0).collect();
    account_ids.dedup(); // candidates are ordered by account
    let mut balances: BTreeMap<AccountId, Balances> =
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
    let leases: BTreeMap<LeaseId, Lease> = persistence::lock_leases_skip_locked(conn, &lease_ids)
        .await?
        .into_iter()
        .map(|l| (l.lease_id, l))
        .collect();
    // Re-check each locked row with the core rule, in (account, lease)
    // order, against the balances as they evolve within the batch.
    let mut entries = Vec::new();
    let mut settled = Vec::new();
    for (account_id, lease_id) in &candidates {
        let (Some(lease), Some(before)) = (leases.get(lease_id), balances.get(account_id).copied())
        else {
            continue;
        };
        let Some(plan) = rules::plan_reclaim(&policy, lease, before, now)? else {
            continue;
        };
        let (plan, late_by) = (plan.settle, plan.late_by);
        balances.insert(*account_id, plan.after);
        settled.push((*lease_id, plan.consumed, late_by));
        entries.push(NewEntry {
            account_id: *account_id,
            lease_id: Some(*lease_id),
            kind: LedgerKind::Reclaim,
            actor: Actor::Reclaimer,
            units: lease.units,
            consumed: plan.consumed,
            before,
            after: plan.after,
            fence: Some(lease.fence),
            expiry: Some((lease.expiry, lease.expiry_is_upper_bound)),
            at: now,
        });
    }
    if settled.is_empty() {
        return Ok(settled);
    }
    let ids: Vec<i64> = settled.iter().map(|(l, _, _)| l.0).collect();
    let consumed: Vec<i64> = settled.iter().map(|(_, c, _)| *c).collect();
    persistence::settle_leases(conn, &ids, LeaseState::Reclaimed, &consumed).await?;
    let touched: Vec<(AccountId, Balances)> = entries
        .iter()
        .map(|e| e.account_id)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|a| balances.get(&a).map(|b| (a, *b)))
        .collect();
    persistence::write_balances(conn, &touched).await?;
    persistence::insert_ledger(conn, &entries).await?;
    Ok(settled)
}

// ---------------------------------------------------------------------------
// The allocator.

#[async_trait]
impl Allocator for PostgresStore {
    fn policy(&self) -> GrantPolicy {
        self.policy
    }

    async fn create_account(&self, new: NewAccount) -> Result<Account, StorageError> {
        rules::check_account_name(&new.name)?;
        self.run(Op::CreateAccount, &new, |c, n| {
            Box::pin(create_account_tx(c, n))
        })
        .await
    }

    async fn account(&self, account_id: AccountId) -> Result<Account, StorageError> {
        self.run(Op::ReadAccount, &account_id, |c, id| {
            Box::pin(async move {
                persistence::read_account(c, *id)
                    .await?
                    .ok_or_else(|| not_found(*id))
            })
        })
        .await
    }

    async fn account_key_digest(
        &self,
        account_id: AccountId,
    ) -> Result<Option<[u8; 32]>, StorageError> {
        self.run(Op::ReadAccount, &account_id, |c, id| {
            Box::pin(async move {
                persistence::read_account(c, *id)
                    .await?
                    .ok_or_else(|| not_found(*id))?;
                persistence::read_account_key(c, *id).await
            })
        })
        .await
    }

    async fn accounts(
        &self,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Vec<Account>, StorageError> {
        let limit = rules::check_limit(limit, AUDIT_PAGE_MAX)?;
        self.run(Op::ReadAccount, &(after, limit), |c, a| {
            Box::pin(persistence::list_accounts(c, a.0, a.1))
        })
        .await
    }

    async fn deposit(
        &self,
        account_id: AccountId,
        units: i64,
        now: Timestamp,
    ) -> Result<Account, StorageError> {
        rules::check_units(units)?;
        self.run(Op::Deposit, &(account_id, units, now), |c, a| {
            Box::pin(deposit_tx(c, a.0, a.1, a.2))
        })
        .await
    }

    async fn acquire(&self, req: AcquireRequest, now: Timestamp) -> Result<Grant, StorageError> {
        rules::check_units(req.units)?;
        self.policy.clamp_ttl(req.ttl)?;
        if let Some(k) = &req.idempotency_key {
            rules::check_idempotency_key(k)?;
        }
        let args = (req, self.policy, now);
        let acquired = self
            .run(Op::Acquire, &args, |c, a| {
                Box::pin(acquire_tx(c, &a.0, a.1, a.2))
            })
            .await?;
        Ok(match acquired {
            Acquired::Replayed(r) => {
                self.caps
                    .grant(r.lease_id, r.fence, r.units, r.expiry, r.granted_ttl)
            }
            Acquired::New {
                lease_id,
                fence,
                expiry,
                granted_ttl,
            } => self
                .caps
                .grant(lease_id, fence, args.0.units, expiry, granted_ttl),
        })
    }

    async fn lease(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
    ) -> Result<Lease, StorageError> {
        self.caps.check(lease_id, capability)?;
        self.run(Op::ReadLease, &lease_id, |c, id| {
            Box::pin(async move {
                Ok(persistence::read_lease(c, *id)
                    .await?
                    .ok_or(StorageError::LeaseNotFound { lease_id: *id })?)
            })
        })
        .await
    }

    async fn renew(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Renewal, StorageError> {
        self.caps.check(lease_id, capability)?;
        self.run(Op::Renew, &(lease_id, ttl, self.policy, now), |c, a| {
            Box::pin(renew_tx(c, a.0, a.1, a.2, a.3))
        })
        .await
    }

    async fn release(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        now: Timestamp,
        consumed: Option<i64>,
    ) -> Result<Settlement, StorageError> {
        self.caps.check(lease_id, capability)?;
        self.run(
            Op::Release,
            &(lease_id, consumed, self.policy, now),
            |c, a| Box::pin(release_tx(c, a.0, a.1, a.2, a.3)),
        )
        .await
    }

    async fn consolidate(
        &self,
        account_id: AccountId,
        leases: &[(LeaseId, Capability)],
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Grant, StorageError> {
        let ids = self
            .caps
            .check_consolidation(&self.policy, leases, ttl, now)?;
        let args = ConsolidateArgs {
            account_id,
            ids,
            ttl,
            policy: self.policy,
            now,
        };
        let (lease_id, fence, plan) = self
            .run(Op::Consolidate, &args, |c, a| {
                Box::pin(consolidate_tx(c, a))
            })
            .await?;
        Ok(self
            .caps
            .grant(lease_id, fence, plan.units, plan.expiry, plan.granted_ttl))
    }

    async fn reclaim(&self, now: Timestamp, limit: usize) -> Result<ReclaimReport, StorageError> {
        let limit = rules::check_limit(limit, rules::RECLAIM_BATCH_MAX)?;
        let cutoff = self.policy.reclaim_cutoff(now);
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
        let pair = InstantPair::encode(cutoff);
        let settled = self
            .run(Op::Reclaim, &(self.policy, pair, limit, now), |c, a| {
                Box::pin(reclaim_tx(c, a.0, a.1, a.2, a.3))
            })
            .await?;
        for (lease_id, consumed, late_by) in settled {
            report.reclaimed.push(lease_id);
            report.units_charged += i128::from(consumed);
            report.late_by.push(late_by);
        }
        Ok(report)
    }

    async fn ledger(&self, after_seq: i64, limit: usize) -> Result<Vec<LedgerEntry>, StorageError> {
        let limit = rules::check_limit(limit, AUDIT_PAGE_MAX)?;
        self.run(Op::ReadLedger, &(after_seq, limit), |c, a| {
            Box::pin(persistence::read_ledger(c, a.0, a.1))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(units: i64, ttl: SignedDuration, truncated: bool) -> IdempotencyRecord {
        IdempotencyRecord {
            units,
            request_ttl: ttl,
            request_ttl_is_truncated: truncated,
            lease_id: LeaseId(1),
            fence: Fence(1),
            expiry: Timestamp::UNIX_EPOCH,
            granted_ttl: ttl,
        }
    }

    fn request(units: i64, ttl: SignedDuration) -> AcquireRequest {
        AcquireRequest {
            account_id: AccountId(1),
            units,
            ttl,
            idempotency_key: Some("k".into()),
        }
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
    fn idempotent_retries_match_exactly_or_after_legacy_truncation() {
        let exact = record(5, SignedDuration::new(30, 1_999), false);
        assert!(same_request(
            &exact,
            &request(5, SignedDuration::new(30, 1_999))
        ));
        assert!(!same_request(
            &exact,
            &request(5, SignedDuration::new(30, 1_998))
        ));
        assert!(!same_request(
            &exact,
            &request(6, SignedDuration::new(30, 1_999))
        ));
        let legacy = record(5, SignedDuration::new(30, 1_000), true);
        assert!(same_request(
            &legacy,
            &request(5, SignedDuration::new(30, 1_000))
        ));
        assert!(same_request(
            &legacy,
            &request(5, SignedDuration::new(30, 1_999))
        ));
        assert!(!same_request(
            &legacy,
            &request(5, SignedDuration::new(30, 2_000))
        ));
        assert!(!same_request(
            &legacy,
            &request(5, SignedDuration::new(30, 999))
        ));
    }

    #[test]
    fn policy_mismatch_names_both_policies_exactly() {
        let recorded =
            GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::MAX).unwrap();
        let configured = GrantPolicy::new(SignedDuration::new(0, 1), SignedDuration::ZERO).unwrap();
        assert_eq!(
            policy_mismatch(recorded, configured).to_string(),
            "the database records max_ttl PT1M and reclaim_grace \
             PT2562047788015215H30M7.999999999S, but this process is configured with max_ttl \
             PT0.000000001S and reclaim_grace PT0S; every process sharing these grants must \
             apply the same policy: change the recorded one only with the explicit policy \
             command"
        );
    }
}
