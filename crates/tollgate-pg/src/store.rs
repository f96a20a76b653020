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

use std::time::Duration;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use tollgate::{
    AUDIT_PAGE_MAX, Account, AccountId, AcquireRequest, Allocator, AllocatorError, Capability,
    CapabilityKey, Grant, GrantPolicy, Lease, LeaseCapabilities, LeaseId, LedgerEntry, NewAccount,
    ReclaimReport, Renewal, RuleError, Settlement, StorageError, StoreId, SuppliedTime, rules,
};

use crate::boxed;
use crate::error::{TxError, map_sqlx_error};
use crate::ops;
use crate::persistence::{
    self, LeaseCount, Op, OpStats, PolicyChange, PolicyLock, TxFuture, TxStats, transact,
};
use crate::schema::Schema;

/// The `changed_by` of the policy record written by the first process that
/// finds none.
pub const FIRST_START: &str = "first start";

pub use tollgate::{CHANGED_BY_MAX_CHARS, RECLAIM_BATCH_DEFAULT};

/// The longest a connection of a store's pool may sit idle inside an open
/// transaction before the server ends its session: 10 s. No transaction of
/// a store waits on its client for more than a round trip, so only a
/// process that was paused (SIGSTOP), swapped out or cut off mid-transaction
/// reaches it; the server then rolls the transaction back and frees its row
/// locks, so one stalled process cannot keep another from an account, a
/// lease or an exec's ownership (a claim skips locked rows) for longer.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

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
    ///
    /// Whatever this says, every connection also declares the store's
    /// grant policy ([`declare_session`]): the database refuses every lease
    /// write from a session whose declared policy differs from the recorded
    /// one, or that declares none (SQLSTATE TGS11,
    /// [`StorageError::PolicyMismatch`]), so a process started before a
    /// `tollgate policy set` can never grant, renew or reclaim by its old
    /// policy.
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
/// they apply the same [`GrantPolicy`] and capability key. The database
/// holds them to it (migration 0019): every connection of the store's pool
/// declares its policy ([`declare_session`]), and once the recorded policy
/// differs, every lease write of the store fails with
/// [`StorageError::PolicyMismatch`] and changes nothing.
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
    /// [`StorageError::Failure`] for an unparsable URL (the message does not
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
        let connect = crate::schema::parse_url(url)?.into_connect_options();
        let on_safe_cut = options.on_safe_cut;
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    declare(conn, &policy, on_safe_cut).await?;
                    sqlx::query(&format!(
                        "SET idle_in_transaction_session_timeout = {}",
                        IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
                    ))
                    .persistent(false)
                    .execute(&mut *conn)
                    .await?;
                    Ok(())
                })
            })
            .connect_with(connect)
            .await
            .map_err(map_sqlx_error)?;
        PostgresStore::start(pool, policy, key).await
    }

    /// Builds a store on an existing pool after the startup checks below.
    /// The pool's connections must declare `policy` (and, on the safe
    /// expiry cut, the cut) like [`PostgresStore::connect_with`]'s do, in
    /// the pool's `after_connect`: `SET` [`GRANT_POLICY_SETTING`] to
    /// [`grant_policy_declaration`] (what [`declare_session`] sends), or
    /// every lease write fails with [`StorageError::PolicyMismatch`].
    ///
    /// 1. the schema fence ([`Schema::check`] with [`Schema::current`]): the
    ///    database has applied exactly this binary's migrations;
    /// 2. the store identity (written by migration 0005) is read;
    /// 3. the policy: if none is recorded, `policy` is recorded (with a
    ///    change row by [`FIRST_START`]); otherwise it must equal `policy`
    ///    exactly.
    ///
    /// # Errors
    /// [`StorageError::Failure`] naming an unknown migration version, or the
    /// pending ones; [`StorageError::PolicyMismatch`] naming the recorded and
    /// the configured `max_ttl` and `reclaim_grace`;
    /// [`StorageError::Unavailable`] and [`StorageError::Failure`] on
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
        .await
        .map_err(storage_only)?;
        transact(&pool, &stats, Op::Admin, &policy, |c, p| {
            Box::pin(record_or_check_policy(c, *p))
        })
        .await
        .map_err(storage_only)?;
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

    /// The policy, for [`crate::ops`].
    pub(crate) fn policy_ref(&self) -> &GrantPolicy {
        &self.policy
    }

    /// The capabilities, for [`crate::ops`].
    pub(crate) fn caps(&self) -> &LeaseCapabilities {
        &self.caps
    }

    async fn run<A, T, F>(&self, op: Op, args: &A, body: F) -> Result<T, AllocatorError>
    where
        A: Sync + ?Sized,
        F: for<'c> Fn(&'c mut PgConnection, &'c A) -> TxFuture<'c, T>,
    {
        transact(&self.pool, &self.stats, op, args, body).await
    }
}

/// The error of an operator transaction. Their bodies (startup checks,
/// policy commands, operator queries) apply no allocator rule, so they fail
/// only with storage errors.
///
/// # Panics
/// On a rule error: a bug in such a body.
fn storage_only(e: AllocatorError) -> StorageError {
    match e {
        AllocatorError::Storage(e) => e,
        AllocatorError::Rule(e) => {
            panic!("an operator transaction returned the rule error {e:?}; it applies no rule")
        }
    }
}

// ---------------------------------------------------------------------------
// Session declarations.

/// The session setting through which a connection declares the grant policy
/// it applies; migration 0019's lease trigger compares it with the recorded
/// policy on every lease write.
pub const GRANT_POLICY_SETTING: &str = "tollgate.grant_policy";

/// `policy` as a connection declares it in [`GRANT_POLICY_SETTING`]:
/// `"<max_ttl_ns>/<reclaim_grace_ns>"`, both exact nanoseconds in decimal
/// without leading zeros (`"60000000000/5000000000"` for one minute and 5
/// s); the database renders the recorded policy the same way
/// (`tollgate_grant_policy_declaration()`). Never fails.
pub fn grant_policy_declaration(policy: &GrantPolicy) -> String {
    format!(
        "{}/{}",
        policy.max_ttl().as_nanos(),
        policy.reclaim_grace().as_nanos()
    )
}

/// Declares on `conn` what a lease writer must (migrations 0018 and 0019):
/// the grant policy it applies ([`GRANT_POLICY_SETTING`]) and, with
/// `on_safe_cut`, that it takes its time from the safe expiry cut
/// (`tollgate.clock = 'safe-cut'`). Session settings: they last as long as
/// the connection. [`PostgresStore::connect_with`] runs this on every
/// connection it opens; a caller that builds its own pool
/// ([`PostgresStore::from_pool`]) or writes leases on its own connection
/// runs it once per connection.
///
/// # Errors
/// [`StorageError::Unavailable`] or [`StorageError::Failure`] if the
/// statements fail.
pub async fn declare_session(
    conn: &mut PgConnection,
    policy: &GrantPolicy,
    on_safe_cut: bool,
) -> Result<(), StorageError> {
    declare(conn, policy, on_safe_cut)
        .await
        .map_err(map_sqlx_error)
}

async fn declare(
    conn: &mut PgConnection,
    policy: &GrantPolicy,
    on_safe_cut: bool,
) -> Result<(), sqlx::Error> {
    // Unnamed statements; the values are literals of digits and '/'.
    sqlx::query(&format!(
        "SET {GRANT_POLICY_SETTING} = '{}'",
        grant_policy_declaration(policy)
    ))
    .persistent(false)
    .execute(&mut *conn)
    .await?;
    if on_safe_cut {
        sqlx::query("SET tollgate.clock = 'safe-cut'")
            .persistent(false)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Policy commands.

/// The refusal of a process whose policy differs from the recorded one.
pub(crate) fn policy_mismatch(recorded: GrantPolicy, configured: GrantPolicy) -> StorageError {
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

/// The refusal of a running process whose policy no longer equals the
/// recorded one (it was changed after the process started): what to do is
/// to restart it. Migration 0019's lease trigger says the same.
pub(crate) fn running_policy_mismatch(
    recorded: GrantPolicy,
    configured: GrantPolicy,
) -> StorageError {
    StorageError::PolicyMismatch(format!(
        "the database records max_ttl {} and reclaim_grace {}, but this process is \
         configured with max_ttl {} and reclaim_grace {}; every process sharing these \
         grants must apply the recorded policy: restart this process with the recorded \
         grant policy (`tollgate policy show`)",
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
        .ok_or_else(|| StorageError::Failure {
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
/// [`StorageError::Unavailable`] and [`StorageError::Failure`] on database
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
    .map_err(storage_only)
}

/// The operator command that changes the recorded policy to `policy` and
/// records who did it (`changed_by`, checked by
/// [`tollgate::rules::check_changed_by`]: 1..=[`CHANGED_BY_MAX_CHARS`]
/// characters, no control characters) with the old and new values.
///
/// Processes already running keep the policy they started with, and from
/// the moment this commits the database refuses every lease write of
/// theirs ([`StorageError::PolicyMismatch`], SQLSTATE TGS11, migration
/// 0019): restart them with the new configuration (a process whose
/// configuration differs refuses to start). The change first waits for
/// every transaction that is writing leases to end, and lease writes that
/// start meanwhile wait for it (`EXCLUSIVE` on `tollgate_policy`), so no
/// lease is written under the old policy after it returns.
///
/// # Errors
/// [`StorageError::Failure`] for an invalid `changed_by`; database errors.
pub async fn set_policy(
    pool: &PgPool,
    policy: GrantPolicy,
    changed_by: &str,
) -> Result<PolicyChange, StorageError> {
    rules::check_changed_by(changed_by).map_err(|e| StorageError::Failure {
        message: e.to_string(),
    })?;
    let args = (policy, changed_by);
    boxed(transact(
        pool,
        &TxStats::default(),
        Op::Admin,
        &args,
        |c, a| Box::pin(set_policy_tx(c, a.0, a.1)),
    ))
    .await
    .map_err(storage_only)
}

async fn set_policy_tx(
    conn: &mut PgConnection,
    policy: GrantPolicy,
    changed_by: &str,
) -> Result<PolicyChange, TxError> {
    persistence::lock_policy_for_change(conn).await?;
    let old = persistence::read_policy(conn, PolicyLock::Update).await?;
    if old.is_some() {
        persistence::update_policy(conn, policy).await?;
    } else if !persistence::insert_policy_if_absent(conn, policy).await? {
        return Err(StorageError::Failure {
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
    .map_err(storage_only)
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
    .map_err(storage_only)
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
    .map_err(storage_only)
}

// ---------------------------------------------------------------------------
// Transaction bodies: the writing operations are in [`crate::ops`].

async fn read_account_tx(
    conn: &mut PgConnection,
    account_id: AccountId,
) -> Result<Account, TxError> {
    persistence::read_account(conn, account_id)
        .await?
        .ok_or_else(|| RuleError::AccountNotFound { account_id }.into())
}

// ---------------------------------------------------------------------------
// The allocator: each method checks what it can without the database, then
// runs the matching [`crate::ops`] function in one transaction of its own.

#[async_trait]
impl Allocator for PostgresStore {
    fn policy(&self) -> GrantPolicy {
        self.policy
    }

    async fn create_account(&self, new: NewAccount) -> Result<Account, AllocatorError> {
        rules::check_account_name(&new.name)?;
        self.run(Op::CreateAccount, &new, |c, n| {
            Box::pin(crate::ops::create_account(c, n))
        })
        .await
    }

    async fn account(&self, account_id: AccountId) -> Result<Account, AllocatorError> {
        self.run(Op::ReadAccount, &account_id, |c, id| {
            Box::pin(read_account_tx(c, *id))
        })
        .await
    }

    async fn account_key_digest(
        &self,
        account_id: AccountId,
    ) -> Result<Option<[u8; 32]>, AllocatorError> {
        self.run(Op::ReadAccount, &account_id, |c, id| {
            Box::pin(async move {
                read_account_tx(c, *id).await?;
                persistence::read_account_key(c, *id).await
            })
        })
        .await
    }

    async fn accounts(
        &self,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Vec<Account>, AllocatorError> {
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
    ) -> Result<Account, AllocatorError> {
        rules::check_units(units)?;
        self.run(Op::Deposit, &(account_id, units, now), |c, a| {
            Box::pin(ops::deposit(c, a.0, a.1, a.2))
        })
        .await
    }

    async fn acquire(
        &self,
        req: AcquireRequest,
        at: SuppliedTime,
    ) -> Result<Grant, AllocatorError> {
        rules::check_acquire(
            &self.policy,
            req.units,
            req.ttl,
            req.idempotency_key.as_deref(),
        )?;
        self.run(Op::Acquire, &(self, req, at), |c, a| {
            Box::pin(ops::acquire(c, a.0, &a.1, a.2))
        })
        .await
    }

    async fn lease(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
    ) -> Result<Lease, AllocatorError> {
        self.caps.check(lease_id, capability)?;
        self.run(Op::ReadLease, &lease_id, |c, id| {
            Box::pin(async move {
                Ok(persistence::read_lease(c, *id)
                    .await?
                    .ok_or(RuleError::LeaseNotFound { lease_id: *id })?)
            })
        })
        .await
    }

    async fn renew(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        ttl: SignedDuration,
        at: SuppliedTime,
    ) -> Result<Renewal, AllocatorError> {
        // Checked here too, so a forged capability never reaches the
        // database.
        self.caps.check(lease_id, capability)?;
        self.run(Op::Renew, &(self, lease_id, capability, ttl, at), |c, a| {
            Box::pin(ops::renew(c, a.0, a.1, a.2, a.3, a.4))
        })
        .await
    }

    async fn release(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        now: Timestamp,
        consumed: Option<i64>,
    ) -> Result<Settlement, AllocatorError> {
        self.caps.check(lease_id, capability)?;
        self.run(
            Op::Release,
            &(self, lease_id, capability, now, consumed),
            |c, a| Box::pin(ops::release(c, a.0, a.1, a.2, a.3, a.4)),
        )
        .await
    }

    async fn consolidate(
        &self,
        account_id: AccountId,
        leases: &[(LeaseId, Capability)],
        ttl: SignedDuration,
        at: SuppliedTime,
    ) -> Result<Grant, AllocatorError> {
        self.caps
            .check_consolidation(&self.policy, leases, ttl, at)?;
        self.run(
            Op::Consolidate,
            &(self, account_id, leases, ttl, at),
            |c, a| Box::pin(ops::consolidate(c, a.0, a.1, a.2, a.3, a.4)),
        )
        .await
    }

    async fn reclaim(&self, now: Timestamp, limit: usize) -> Result<ReclaimReport, AllocatorError> {
        rules::check_limit(limit, rules::RECLAIM_BATCH_MAX)?;
        if self.policy.reclaim_cutoff(now).is_none() {
            // Underflow: no representable expiry is due, so there is
            // nothing to ask the database.
            return Ok(ReclaimReport {
                cutoff: None,
                reclaimed: Vec::new(),
                units_charged: 0,
                late_by: Vec::new(),
            });
        }
        self.run(Op::Reclaim, &(self, now, limit), |c, a| {
            Box::pin(ops::reclaim(c, a.0, a.1, a.2))
        })
        .await
    }

    async fn ledger(
        &self,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<LedgerEntry>, AllocatorError> {
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

    #[test]
    fn running_policy_mismatch_names_both_policies_and_the_restart() {
        let recorded =
            GrantPolicy::new(SignedDuration::from_secs(20), SignedDuration::from_secs(5)).unwrap();
        let configured =
            GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::new(30, 1)).unwrap();
        assert_eq!(
            running_policy_mismatch(recorded, configured),
            StorageError::PolicyMismatch(
                "the database records max_ttl PT20S and reclaim_grace PT5S, but this process is \
                 configured with max_ttl PT1H and reclaim_grace PT30.000000001S; every process \
                 sharing these grants must apply the recorded policy: restart this process \
                 with the recorded grant policy (`tollgate policy show`)"
                    .into()
            )
        );
    }

    #[test]
    fn declarations_are_exact_nanoseconds() {
        for (max_ttl, grace, declared) in [
            (
                SignedDuration::from_secs(60),
                SignedDuration::from_secs(5),
                "60000000000/5000000000",
            ),
            (SignedDuration::new(0, 1), SignedDuration::ZERO, "1/0"),
            (
                SignedDuration::from_hours(1),
                SignedDuration::MAX,
                "3600000000000/9223372036854775807999999999",
            ),
        ] {
            let policy = GrantPolicy::new(max_ttl, grace).unwrap();
            assert_eq!(grant_policy_declaration(&policy), declared);
        }
    }

    #[test]
    fn operator_transactions_pass_storage_errors_through() {
        let e = StorageError::RetryExhausted { attempts: 8 };
        assert_eq!(storage_only(e.clone().into()), e);
    }

    #[test]
    #[should_panic(expected = "an operator transaction returned the rule error")]
    fn operator_transactions_never_return_rule_errors() {
        storage_only(RuleError::CapabilityMismatch.into());
    }
}
