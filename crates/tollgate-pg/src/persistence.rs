//! Every SQL statement of the PostgreSQL store, and the one transaction
//! wrapper they run in.
//!
//! # What is stored, and why
//!
//! * `tollgate_accounts`: one row per account with its four balances
//!   (`deposited = available + held + consumed`, enforced again by CHECK
//!   constraints as a last line of defence). The row is the lock that
//!   serializes every balance change of the account.
//! * `tollgate_leases`: one row per grant, kept after settlement as history.
//!   The expiry is an *instant pair* `(expiry_floor_us, expiry_submicro_ns)`
//!   (exactly `1000 * floor_us + submicro_ns` ns since the epoch, CHECKed to
//!   the jiff timestamp domain) plus `expiry_is_upper_bound` (true only for
//!   rows written before migration 0017). `fence` comes from the database
//!   sequence `tollgate_fence_seq`, so fences strictly increase across every
//!   grant and renewal of all processes. A partial index on the pair `WHERE
//!   state = 'active'` serves reclaim, so its cost does not grow with
//!   settled history.
//! * `tollgate_ledger`: one row per state change with balances before and
//!   after, the lease's fence and expiry and the supplied time (both as
//!   pairs); it alone suffices to recompute every account (the audit).
//! * `tollgate_idempotency`: per account and key, the request (units, exact
//!   TTL) and a snapshot of the grant it produced, so a retry returns the
//!   original grant unchanged.
//! * `tollgate_account_keys`: SHA-256 digests of account API keys.
//! * `tollgate_store`: the store's random 128-bit identity, written once by
//!   migration 0005; capabilities are derived from it and the configured
//!   key, so they survive restarts and upgrades and never verify in another
//!   store.
//! * `tollgate_policy` and `tollgate_policy_changes`: the grant policy every
//!   process sharing this database must apply, and who recorded or changed
//!   it.
//!
//! No statement decides anything about time: instants are bound as pairs
//! computed in Rust ([`InstantPair::encode`]); no SQL `now()` and no
//! duration arithmetic appear here.
//!
//! # Transactions
//!
//! Every store operation is one transaction run by `transact`, at READ
//! COMMITTED with explicit row locks taken in one fixed order: accounts by
//! ascending id, then leases by ascending id. A lease is only ever locked
//! while its account is locked, so operations on one account serialize on
//! the account row and cannot deadlock with each other. Serialization
//! failures (40001) and deadlocks (40P01) that can still occur are retried
//! up to [`TX_ATTEMPTS_MAX`] times; every write checks the number of rows it
//! changed, and any mismatch aborts the transaction.

use jiff::{SignedDuration, Timestamp};
use pgkit::{OpCounters, OpMetrics, TxFailure};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use tollgate::model::{Actor, LedgerKind};
use tollgate::{
    Account, AccountId, AllocatorError, Balances, Fence, GrantPolicy, IdempotencyRecord,
    InstantPair, Issued, Lease, LeaseId, LeaseState, LedgerEntry, NewLedgerEntry, StorageError,
    StoreId,
};

use crate::error::{TxError, map_sqlx_error};

/// How many times one operation's transaction is attempted before it fails
/// with [`StorageError::RetryExhausted`]: pgkit's bound, with its doubling
/// back-off (at most about a quarter of a second in all).
pub use pgkit::TX_ATTEMPTS_MAX;

/// How many policy change rows [`crate::policy_changes`] returns at most.
pub const POLICY_CHANGES_MAX: i64 = 1_000;

/// A store operation, the label of its transaction statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `create_account`.
    CreateAccount,
    /// `account`, `account_key_digest`, `accounts`.
    ReadAccount,
    /// `deposit`.
    Deposit,
    /// `acquire`.
    Acquire,
    /// `lease`.
    ReadLease,
    /// `renew`.
    Renew,
    /// `release`.
    Release,
    /// `consolidate`.
    Consolidate,
    /// `reclaim`.
    Reclaim,
    /// `ledger`.
    ReadLedger,
    /// Startup checks and policy commands.
    Admin,
}

impl Op {
    /// Every operation, in declaration order.
    pub const ALL: [Op; 11] = [
        Op::CreateAccount,
        Op::ReadAccount,
        Op::Deposit,
        Op::Acquire,
        Op::ReadLease,
        Op::Renew,
        Op::Release,
        Op::Consolidate,
        Op::Reclaim,
        Op::ReadLedger,
        Op::Admin,
    ];

    /// Stable lower-case name, for metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Op::CreateAccount => "create_account",
            Op::ReadAccount => "read_account",
            Op::Deposit => "deposit",
            Op::Acquire => "acquire",
            Op::ReadLease => "read_lease",
            Op::Renew => "renew",
            Op::Release => "release",
            Op::Consolidate => "consolidate",
            Op::Reclaim => "reclaim",
            Op::ReadLedger => "read_ledger",
            Op::Admin => "admin",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl pgkit::OpLabel for Op {
    fn as_str(&self) -> &'static str {
        Op::as_str(self)
    }
}

/// Counters of one operation's transactions since the store was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpStats {
    /// Transactions that committed.
    pub committed: u64,
    /// Attempts that failed with a serialization failure or deadlock and
    /// were retried.
    pub retried: u64,
    /// Operations that ended in an error (including
    /// [`StorageError::RetryExhausted`] and rule errors such as
    /// insufficient balance, after which nothing was written).
    pub failed: u64,
}

impl From<OpMetrics> for OpStats {
    fn from(m: OpMetrics) -> OpStats {
        OpStats {
            committed: m.committed,
            retried: m.retried,
            failed: m.failed,
        }
    }
}

/// Per-operation transaction counters (pgkit's, labelled by
/// [`Op::as_str`]).
#[derive(Debug)]
pub(crate) struct TxStats {
    ops: [OpCounters; Op::ALL.len()],
}

impl Default for TxStats {
    fn default() -> TxStats {
        TxStats {
            ops: Op::ALL.map(OpCounters::of),
        }
    }
}

impl TxStats {
    pub(crate) fn snapshot(&self, op: Op) -> OpStats {
        OpStats::from(self.metrics(op))
    }

    /// Every counter of `op`, latency included.
    pub(crate) fn metrics(&self, op: Op) -> OpMetrics {
        self.ops[op.index()].snapshot()
    }
}

/// The future a transaction body returns.
pub(crate) type TxFuture<'c, T> = pgkit::TxFuture<'c, T, TxError>;

/// Runs `body` in one transaction with [`pgkit::transact`], retrying
/// serialization failures and deadlocks up to [`TX_ATTEMPTS_MAX`] attempts
/// in all, counted in `stats` under `op`.
///
/// `body` gets the transaction's connection and `args`; it must not keep
/// state across attempts (each attempt starts from scratch). A
/// [`TxError::Rule`] or [`TxError::Storage`] from the body rolls back and is
/// returned as is; database errors are mapped by [`map_sqlx_error`].
pub(crate) async fn transact<A, T, F>(
    pool: &PgPool,
    stats: &TxStats,
    op: Op,
    args: &A,
    body: F,
) -> Result<T, AllocatorError>
where
    A: Sync + ?Sized,
    F: for<'c> Fn(&'c mut PgConnection, &'c A) -> TxFuture<'c, T>,
{
    pgkit::transact(pool, &stats.ops[op.index()], args, body)
        .await
        .map_err(|failure| match failure {
            TxFailure::Failed(TxError::Rule(e)) => e.into(),
            TxFailure::Failed(TxError::Storage(e)) => e.into(),
            TxFailure::Failed(TxError::Db(e)) => map_sqlx_error(e).into(),
            TxFailure::RetryExhausted { attempts, .. } => {
                StorageError::RetryExhausted { attempts }.into()
            }
        })
}

/// Checks that a write changed exactly `expected` rows.
fn expect_rows(what: &str, changed: u64, expected: usize) -> Result<(), TxError> {
    if changed != expected as u64 {
        return Err(TxError::Storage(StorageError::Failure {
            message: format!("{what} changed {changed} rows, expected {expected}"),
        }));
    }
    Ok(())
}

/// A row limit as the `BIGINT` a `LIMIT` binds.
///
/// # Panics
/// Above `i64::MAX`: every limit is checked against a bound of at most
/// [`tollgate::RECLAIM_BATCH_MAX`] before it reaches SQL.
fn to_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or_else(|_| panic!("row limit {limit} was never checked"))
}

// ---------------------------------------------------------------------------
// Encodings.

/// A duration as `(secs, nanos)`, both of the duration's sign.
pub(crate) fn duration_parts(d: SignedDuration) -> (i64, i32) {
    (d.as_secs(), d.subsec_nanos())
}

/// Decodes `(secs, nanos)`; refuses parts that do not come from
/// [`duration_parts`] (which would make `SignedDuration::new` normalize or
/// overflow).
pub(crate) fn duration_from_parts(
    what: &str,
    secs: i64,
    nanos: i32,
) -> Result<SignedDuration, StorageError> {
    let same_sign = (secs >= 0 && nanos >= 0) || (secs <= 0 && nanos <= 0);
    if !same_sign || nanos.unsigned_abs() > 999_999_999 {
        return Err(StorageError::Failure {
            message: format!("stored {what} ({secs} s, {nanos} ns) is not a valid duration"),
        });
    }
    Ok(SignedDuration::new(secs, nanos))
}

fn pair_of(t: Timestamp) -> (i64, i16) {
    let p = InstantPair::encode(t);
    (p.floor_us, p.submicro_ns)
}

fn decode_pair(floor_us: i64, submicro_ns: i16) -> Result<Timestamp, StorageError> {
    Ok(InstantPair {
        floor_us,
        submicro_ns,
    }
    .decode()?)
}

fn decode_state(s: &str) -> Result<LeaseState, StorageError> {
    LeaseState::parse(s).ok_or_else(|| StorageError::Failure {
        message: format!("stored lease state {s:?} is unknown"),
    })
}

const ACCOUNT_COLUMNS: &str = "account_id, name, deposited, available, held, consumed";

fn account_from_row(row: &PgRow) -> Result<Account, TxError> {
    Ok(Account {
        account_id: AccountId(row.try_get("account_id")?),
        name: row.try_get("name")?,
        balances: Balances {
            deposited: row.try_get("deposited")?,
            available: row.try_get("available")?,
            held: row.try_get("held")?,
            consumed: row.try_get("consumed")?,
        },
    })
}

const LEASE_COLUMNS: &str = "lease_id, account_id, units, fence, expiry_floor_us, \
     expiry_submicro_ns, expiry_is_upper_bound, state, consumed";

fn lease_from_row(row: &PgRow) -> Result<Lease, TxError> {
    let state: String = row.try_get("state")?;
    Ok(Lease {
        lease_id: LeaseId(row.try_get("lease_id")?),
        account_id: AccountId(row.try_get("account_id")?),
        units: row.try_get("units")?,
        fence: Fence(row.try_get("fence")?),
        expiry: decode_pair(
            row.try_get("expiry_floor_us")?,
            row.try_get("expiry_submicro_ns")?,
        )?,
        expiry_is_upper_bound: row.try_get("expiry_is_upper_bound")?,
        state: decode_state(&state)?,
        consumed: row.try_get("consumed")?,
    })
}

// ---------------------------------------------------------------------------
// Accounts.

pub(crate) async fn insert_account(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Account, TxError> {
    let row = sqlx::query(&format!(
        "INSERT INTO tollgate_accounts (name) VALUES ($1) RETURNING {ACCOUNT_COLUMNS}"
    ))
    .bind(name)
    .fetch_one(&mut *conn)
    .await?;
    account_from_row(&row)
}

pub(crate) async fn insert_account_key(
    conn: &mut PgConnection,
    account_id: AccountId,
    digest: &[u8; 32],
) -> Result<(), TxError> {
    let done =
        sqlx::query("INSERT INTO tollgate_account_keys (account_id, key_sha256) VALUES ($1, $2)")
            .bind(account_id.0)
            .bind(&digest[..])
            .execute(&mut *conn)
            .await?;
    expect_rows("inserting an account key", done.rows_affected(), 1)
}

pub(crate) async fn read_account_key(
    conn: &mut PgConnection,
    account_id: AccountId,
) -> Result<Option<[u8; 32]>, TxError> {
    let digest: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT key_sha256 FROM tollgate_account_keys WHERE account_id = $1")
            .bind(account_id.0)
            .fetch_optional(&mut *conn)
            .await?;
    match digest {
        None => Ok(None),
        Some(d) => <[u8; 32]>::try_from(d.as_slice()).map(Some).map_err(|_| {
            TxError::Storage(StorageError::Failure {
                message: format!("stored key digest of account {account_id} is not 32 bytes"),
            })
        }),
    }
}

/// Reads an account without locking it.
pub(crate) async fn read_account(
    conn: &mut PgConnection,
    account_id: AccountId,
) -> Result<Option<Account>, TxError> {
    let row = sqlx::query(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM tollgate_accounts WHERE account_id = $1"
    ))
    .bind(account_id.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(account_from_row).transpose()
}

/// Locks an account row (`FOR UPDATE`) and reads it.
pub(crate) async fn lock_account(
    conn: &mut PgConnection,
    account_id: AccountId,
) -> Result<Option<Account>, TxError> {
    let row = sqlx::query(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM tollgate_accounts WHERE account_id = $1 FOR UPDATE"
    ))
    .bind(account_id.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(account_from_row).transpose()
}

/// Locks those of `ids` (ascending) that no other transaction holds, in
/// ascending order, and reads them. Reclaim uses it so that several workers
/// (and holders) never wait on each other's accounts.
pub(crate) async fn lock_accounts_skip_locked(
    conn: &mut PgConnection,
    ids: &[i64],
) -> Result<Vec<Account>, TxError> {
    let rows = sqlx::query(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM tollgate_accounts WHERE account_id = ANY($1) \
         ORDER BY account_id FOR UPDATE SKIP LOCKED"
    ))
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(account_from_row).collect()
}

pub(crate) async fn list_accounts(
    conn: &mut PgConnection,
    after: Option<AccountId>,
    limit: usize,
) -> Result<Vec<Account>, TxError> {
    let rows = sqlx::query(&format!(
        "SELECT {ACCOUNT_COLUMNS} FROM tollgate_accounts \
         WHERE ($1::bigint IS NULL OR account_id > $1) ORDER BY account_id LIMIT $2"
    ))
    .bind(after.map(|a| a.0))
    .bind(to_i64(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(account_from_row).collect()
}

/// Writes balances of accounts the transaction has locked.
pub(crate) async fn write_balances(
    conn: &mut PgConnection,
    updates: &[(AccountId, Balances)],
) -> Result<(), TxError> {
    if updates.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = updates.iter().map(|(a, _)| a.0).collect();
    let deposited: Vec<i64> = updates.iter().map(|(_, b)| b.deposited).collect();
    let available: Vec<i64> = updates.iter().map(|(_, b)| b.available).collect();
    let held: Vec<i64> = updates.iter().map(|(_, b)| b.held).collect();
    let consumed: Vec<i64> = updates.iter().map(|(_, b)| b.consumed).collect();
    let done = sqlx::query(
        "UPDATE tollgate_accounts a \
            SET deposited = u.deposited, available = u.available, held = u.held, \
                consumed = u.consumed \
           FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) \
                AS u(account_id, deposited, available, held, consumed) \
          WHERE a.account_id = u.account_id",
    )
    .bind(&ids)
    .bind(&deposited)
    .bind(&available)
    .bind(&held)
    .bind(&consumed)
    .execute(&mut *conn)
    .await?;
    expect_rows("updating balances", done.rows_affected(), updates.len())
}

// ---------------------------------------------------------------------------
// Leases.

/// Reads a lease without locking it.
pub(crate) async fn read_lease(
    conn: &mut PgConnection,
    lease_id: LeaseId,
) -> Result<Option<Lease>, TxError> {
    let row = sqlx::query(&format!(
        "SELECT {LEASE_COLUMNS} FROM tollgate_leases WHERE lease_id = $1"
    ))
    .bind(lease_id.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(lease_from_row).transpose()
}

/// Locks the leases among `ids` that belong to `account_id` (whose row the
/// transaction must already hold), ascending, and reads them.
pub(crate) async fn lock_account_leases(
    conn: &mut PgConnection,
    account_id: AccountId,
    ids: &[i64],
) -> Result<Vec<Lease>, TxError> {
    let rows = sqlx::query(&format!(
        "SELECT {LEASE_COLUMNS} FROM tollgate_leases \
         WHERE lease_id = ANY($1) AND account_id = $2 ORDER BY lease_id FOR UPDATE"
    ))
    .bind(ids)
    .bind(account_id.0)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(lease_from_row).collect()
}

/// Reads, without locking, the leases among `ids` that belong to another
/// account than `account_id` (a lease's account never changes, so this is
/// stable).
pub(crate) async fn read_foreign_leases(
    conn: &mut PgConnection,
    account_id: AccountId,
    ids: &[i64],
) -> Result<Vec<Lease>, TxError> {
    let rows = sqlx::query(&format!(
        "SELECT {LEASE_COLUMNS} FROM tollgate_leases \
         WHERE lease_id = ANY($1) AND account_id <> $2 ORDER BY lease_id"
    ))
    .bind(ids)
    .bind(account_id.0)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(lease_from_row).collect()
}

/// Inserts an active, exact lease (`expiry_is_upper_bound = false`) with a
/// fresh fence from the database sequence.
pub(crate) async fn insert_lease(
    conn: &mut PgConnection,
    account_id: AccountId,
    units: i64,
    expiry: Timestamp,
) -> Result<Issued, TxError> {
    let (floor_us, submicro_ns) = pair_of(expiry);
    let row = sqlx::query(
        "INSERT INTO tollgate_leases \
             (account_id, units, fence, expiry_floor_us, expiry_submicro_ns, \
              expiry_is_upper_bound, state, consumed) \
         VALUES ($1, $2, nextval('tollgate_fence_seq'), $3, $4, false, 'active', NULL) \
         RETURNING lease_id, fence",
    )
    .bind(account_id.0)
    .bind(units)
    .bind(floor_us)
    .bind(submicro_ns)
    .fetch_one(&mut *conn)
    .await?;
    Ok(Issued {
        lease_id: LeaseId(row.try_get("lease_id")?),
        fence: Fence(row.try_get("fence")?),
    })
}

/// Sets a locked active lease's expiry and gives it a fresh fence.
pub(crate) async fn renew_lease(
    conn: &mut PgConnection,
    lease_id: LeaseId,
    expiry: Timestamp,
    expiry_is_upper_bound: bool,
) -> Result<Fence, TxError> {
    let (floor_us, submicro_ns) = pair_of(expiry);
    let fence: Option<i64> = sqlx::query_scalar(
        "UPDATE tollgate_leases \
            SET fence = nextval('tollgate_fence_seq'), expiry_floor_us = $2, \
                expiry_submicro_ns = $3, expiry_is_upper_bound = $4 \
          WHERE lease_id = $1 AND state = 'active' \
         RETURNING fence",
    )
    .bind(lease_id.0)
    .bind(floor_us)
    .bind(submicro_ns)
    .bind(expiry_is_upper_bound)
    .fetch_optional(&mut *conn)
    .await?;
    fence.map(Fence).ok_or_else(|| {
        TxError::Storage(StorageError::Failure {
            message: "renewing a lease changed 0 rows, expected 1".into(),
        })
    })
}

/// Settles locked active leases: `state`, and `consumed[i]` for `ids[i]`.
pub(crate) async fn settle_leases(
    conn: &mut PgConnection,
    ids: &[i64],
    state: LeaseState,
    consumed: &[i64],
) -> Result<(), TxError> {
    if ids.is_empty() {
        return Ok(());
    }
    let done = sqlx::query(
        "UPDATE tollgate_leases l SET state = $3, consumed = u.consumed \
           FROM unnest($1::bigint[], $2::bigint[]) AS u(lease_id, consumed) \
          WHERE l.lease_id = u.lease_id AND l.state = 'active'",
    )
    .bind(ids)
    .bind(consumed)
    .bind(state.as_str())
    .execute(&mut *conn)
    .await?;
    expect_rows("settling leases", done.rows_affected(), ids.len())
}

/// The reclaim candidate query: active leases whose expiry pair is at or
/// before the exact cutoff pair (`$1` = floor_us BIGINT, `$2` = submicro_ns
/// SMALLINT), first `$3` in (account, lease) order. Served by the partial
/// index `tollgate_leases_active_expiry (expiry_floor_us,
/// expiry_submicro_ns) WHERE state = 'active'`, so its cost depends on the
/// active leases that are due, not on settled history. Reads without
/// locks; reclaim then locks accounts and leases in the fixed order and
/// re-checks every row with `tollgate::rules::plan_reclaim`.
pub const RECLAIM_CANDIDATES_SQL: &str = "SELECT account_id, lease_id FROM tollgate_leases \
     WHERE state = 'active' \
       AND (expiry_floor_us, expiry_submicro_ns) <= ($1::bigint, $2::smallint) \
     ORDER BY account_id, lease_id \
     LIMIT $3";

pub(crate) async fn reclaim_candidates(
    conn: &mut PgConnection,
    cutoff: InstantPair,
    limit: usize,
) -> Result<Vec<(AccountId, LeaseId)>, TxError> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(RECLAIM_CANDIDATES_SQL)
        .bind(cutoff.floor_us)
        .bind(cutoff.submicro_ns)
        .bind(to_i64(limit))
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(a, l)| (AccountId(a), LeaseId(l)))
        .collect())
}

/// Locks those of `ids` no other transaction holds, ascending, and reads
/// them. Called by reclaim only with leases of accounts it has locked.
pub(crate) async fn lock_leases_skip_locked(
    conn: &mut PgConnection,
    ids: &[i64],
) -> Result<Vec<Lease>, TxError> {
    let rows = sqlx::query(&format!(
        "SELECT {LEASE_COLUMNS} FROM tollgate_leases WHERE lease_id = ANY($1) \
         ORDER BY lease_id FOR UPDATE SKIP LOCKED"
    ))
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(lease_from_row).collect()
}

// ---------------------------------------------------------------------------
// Ledger.

/// Appends entries; their sequence numbers increase in slice order.
pub(crate) async fn insert_ledger(
    conn: &mut PgConnection,
    entries: &[NewLedgerEntry],
) -> Result<(), TxError> {
    if entries.is_empty() {
        return Ok(());
    }
    let n = entries.len();
    let mut account_id = Vec::with_capacity(n);
    let mut lease_id = Vec::with_capacity(n);
    let mut kind = Vec::with_capacity(n);
    let mut actor = Vec::with_capacity(n);
    let mut units = Vec::with_capacity(n);
    let mut consumed = Vec::with_capacity(n);
    let mut before: [Vec<i64>; 4] = Default::default();
    let mut after: [Vec<i64>; 4] = Default::default();
    let mut fence = Vec::with_capacity(n);
    let mut expiry_floor = Vec::with_capacity(n);
    let mut expiry_sub = Vec::with_capacity(n);
    let mut expiry_bound = Vec::with_capacity(n);
    let mut at_floor = Vec::with_capacity(n);
    let mut at_sub = Vec::with_capacity(n);
    for e in entries {
        account_id.push(e.account_id.0);
        lease_id.push(e.lease_id.map(|l| l.0));
        kind.push(e.kind.as_str());
        actor.push(e.actor.as_str());
        units.push(e.units);
        consumed.push(e.consumed);
        for (cols, b) in [(&mut before, e.before), (&mut after, e.after)] {
            cols[0].push(b.deposited);
            cols[1].push(b.available);
            cols[2].push(b.held);
            cols[3].push(b.consumed);
        }
        fence.push(e.fence.map(|f| f.0));
        let pair = e.expiry.map(pair_of);
        expiry_floor.push(pair.map(|p| p.0));
        expiry_sub.push(pair.map(|p| p.1));
        expiry_bound.push(e.expiry.map(|_| e.expiry_is_upper_bound));
        let (af, asub) = pair_of(e.at);
        at_floor.push(af);
        at_sub.push(asub);
    }
    let [bd, ba, bh, bc] = before;
    let [ad, aa, ah, ac] = after;
    let done = sqlx::query(
        "INSERT INTO tollgate_ledger \
             (account_id, lease_id, kind, actor, units, consumed, \
              before_deposited, before_available, before_held, before_consumed, \
              after_deposited, after_available, after_held, after_consumed, \
              fence, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound, \
              at_floor_us, at_submicro_ns, at_is_upper_bound) \
         SELECT account_id, lease_id, kind, actor, units, consumed, \
                bd, ba, bh, bc, ad, aa, ah, ac, \
                fence, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound, \
                at_floor_us, at_submicro_ns, false \
           FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], \
                       $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], \
                       $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], \
                       $15::bigint[], $16::bigint[], $17::smallint[], $18::boolean[], \
                       $19::bigint[], $20::smallint[]) \
                WITH ORDINALITY AS u(account_id, lease_id, kind, actor, units, consumed, \
                                     bd, ba, bh, bc, ad, aa, ah, ac, \
                                     fence, expiry_floor_us, expiry_submicro_ns, \
                                     expiry_is_upper_bound, at_floor_us, at_submicro_ns, ord) \
          ORDER BY ord",
    )
    .bind(&account_id)
    .bind(&lease_id)
    .bind(&kind)
    .bind(&actor)
    .bind(&units)
    .bind(&consumed)
    .bind(&bd)
    .bind(&ba)
    .bind(&bh)
    .bind(&bc)
    .bind(&ad)
    .bind(&aa)
    .bind(&ah)
    .bind(&ac)
    .bind(&fence)
    .bind(&expiry_floor)
    .bind(&expiry_sub)
    .bind(&expiry_bound)
    .bind(&at_floor)
    .bind(&at_sub)
    .execute(&mut *conn)
    .await?;
    expect_rows("appending ledger entries", done.rows_affected(), n)
}

pub(crate) async fn read_ledger(
    conn: &mut PgConnection,
    after_seq: i64,
    limit: usize,
) -> Result<Vec<LedgerEntry>, TxError> {
    let rows = sqlx::query(
        "SELECT seq, account_id, lease_id, kind, actor, units, consumed, \
                before_deposited, before_available, before_held, before_consumed, \
                after_deposited, after_available, after_held, after_consumed, \
                fence, expiry_floor_us, expiry_submicro_ns, at_floor_us, at_submicro_ns \
           FROM tollgate_ledger WHERE seq > $1 ORDER BY seq LIMIT $2",
    )
    .bind(after_seq)
    .bind(to_i64(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(ledger_from_row).collect()
}

fn ledger_from_row(row: &PgRow) -> Result<LedgerEntry, TxError> {
    let kind: String = row.try_get("kind")?;
    let actor: String = row.try_get("actor")?;
    let balances = |prefix: &str| -> Result<Balances, sqlx::Error> {
        Ok(Balances {
            deposited: row.try_get(format!("{prefix}_deposited").as_str())?,
            available: row.try_get(format!("{prefix}_available").as_str())?,
            held: row.try_get(format!("{prefix}_held").as_str())?,
            consumed: row.try_get(format!("{prefix}_consumed").as_str())?,
        })
    };
    let expiry_floor: Option<i64> = row.try_get("expiry_floor_us")?;
    let expiry_sub: Option<i16> = row.try_get("expiry_submicro_ns")?;
    let expiry = match (expiry_floor, expiry_sub) {
        (Some(f), Some(s)) => Some(decode_pair(f, s)?),
        (None, None) => None,
        _ => {
            return Err(TxError::Storage(StorageError::Failure {
                message: "stored ledger expiry pair is incomplete".into(),
            }));
        }
    };
    Ok(LedgerEntry {
        seq: row.try_get("seq")?,
        account_id: AccountId(row.try_get("account_id")?),
        lease_id: row.try_get::<Option<i64>, _>("lease_id")?.map(LeaseId),
        kind: LedgerKind::parse(&kind).ok_or_else(|| StorageError::Failure {
            message: format!("stored ledger kind {kind:?} is unknown"),
        })?,
        actor: Actor::parse(&actor).ok_or_else(|| StorageError::Failure {
            message: format!("stored ledger actor {actor:?} is unknown"),
        })?,
        units: row.try_get("units")?,
        consumed: row.try_get("consumed")?,
        before: balances("before")?,
        after: balances("after")?,
        fence: row.try_get::<Option<i64>, _>("fence")?.map(Fence),
        expiry,
        at: decode_pair(row.try_get("at_floor_us")?, row.try_get("at_submicro_ns")?)?,
    })
}

// ---------------------------------------------------------------------------
// Idempotency.

pub(crate) async fn read_idempotency(
    conn: &mut PgConnection,
    account_id: AccountId,
    key: &str,
) -> Result<Option<IdempotencyRecord>, TxError> {
    let row = sqlx::query(
        "SELECT units, request_ttl_secs, request_ttl_nanos, request_ttl_is_truncated, \
                lease_id, fence, expiry_floor_us, expiry_submicro_ns, \
                granted_ttl_secs, granted_ttl_nanos \
           FROM tollgate_idempotency WHERE account_id = $1 AND idem_key = $2",
    )
    .bind(account_id.0)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(IdempotencyRecord {
        units: row.try_get("units")?,
        request_ttl: duration_from_parts(
            "request ttl",
            row.try_get("request_ttl_secs")?,
            row.try_get("request_ttl_nanos")?,
        )?,
        request_ttl_is_truncated: row.try_get("request_ttl_is_truncated")?,
        lease_id: LeaseId(row.try_get("lease_id")?),
        fence: Fence(row.try_get("fence")?),
        expiry: decode_pair(
            row.try_get("expiry_floor_us")?,
            row.try_get("expiry_submicro_ns")?,
        )?,
        granted_ttl: duration_from_parts(
            "granted ttl",
            row.try_get("granted_ttl_secs")?,
            row.try_get("granted_ttl_nanos")?,
        )?,
    }))
}

pub(crate) async fn insert_idempotency(
    conn: &mut PgConnection,
    account_id: AccountId,
    key: &str,
    record: &IdempotencyRecord,
) -> Result<(), TxError> {
    let (req_secs, req_nanos) = duration_parts(record.request_ttl);
    let (granted_secs, granted_nanos) = duration_parts(record.granted_ttl);
    let (floor_us, submicro_ns) = pair_of(record.expiry);
    let done = sqlx::query(
        "INSERT INTO tollgate_idempotency \
             (account_id, idem_key, units, request_ttl_secs, request_ttl_nanos, \
              request_ttl_is_truncated, lease_id, fence, expiry_floor_us, expiry_submicro_ns, \
              expiry_is_upper_bound, granted_ttl_secs, granted_ttl_nanos) \
         VALUES ($1, $2, $3, $4, $5, false, $6, $7, $8, $9, false, $10, $11)",
    )
    .bind(account_id.0)
    .bind(key)
    .bind(record.units)
    .bind(req_secs)
    .bind(req_nanos)
    .bind(record.lease_id.0)
    .bind(record.fence.0)
    .bind(floor_us)
    .bind(submicro_ns)
    .bind(granted_secs)
    .bind(granted_nanos)
    .execute(&mut *conn)
    .await?;
    expect_rows("recording an idempotency key", done.rows_affected(), 1)
}

// ---------------------------------------------------------------------------
// Store identity and policy.

pub(crate) async fn read_store_id(conn: &mut PgConnection) -> Result<StoreId, TxError> {
    let id: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT store_id FROM tollgate_store WHERE singleton")
            .fetch_optional(&mut *conn)
            .await?;
    let id = id.ok_or_else(|| StorageError::Failure {
        message: "the store identity row (tollgate_store) is missing".into(),
    })?;
    let bytes = <[u8; 16]>::try_from(id.as_slice()).map_err(|_| StorageError::Failure {
        message: "the stored store identity is not 16 bytes".into(),
    })?;
    Ok(StoreId(bytes))
}

fn policy_from_parts(prefix: &str, row: &PgRow) -> Result<Option<GrantPolicy>, TxError> {
    let col = |name: &str| format!("{prefix}{name}");
    let ttl_secs: Option<i64> = row.try_get(col("max_ttl_secs").as_str())?;
    let ttl_nanos: Option<i32> = row.try_get(col("max_ttl_nanos").as_str())?;
    let grace_secs: Option<i64> = row.try_get(col("reclaim_grace_secs").as_str())?;
    let grace_nanos: Option<i32> = row.try_get(col("reclaim_grace_nanos").as_str())?;
    let (Some(ts), Some(tn), Some(gs), Some(gn)) = (ttl_secs, ttl_nanos, grace_secs, grace_nanos)
    else {
        return Ok(None);
    };
    let max_ttl = duration_from_parts("max_ttl", ts, tn)?;
    let grace = duration_from_parts("reclaim_grace", gs, gn)?;
    GrantPolicy::new(max_ttl, grace).map(Some).map_err(|e| {
        TxError::Storage(StorageError::Failure {
            message: format!("the recorded policy is invalid: {e}"),
        })
    })
}

/// Reads the recorded policy; with `lock`, takes `FOR SHARE` on it so that a
/// concurrent policy change waits for this transaction.
pub(crate) async fn read_policy(
    conn: &mut PgConnection,
    lock: PolicyLock,
) -> Result<Option<GrantPolicy>, TxError> {
    let suffix = match lock {
        PolicyLock::None => "",
        PolicyLock::Share => " FOR SHARE",
        PolicyLock::Update => " FOR UPDATE",
    };
    let row = sqlx::query(&format!(
        "SELECT max_ttl_secs, max_ttl_nanos, reclaim_grace_secs, reclaim_grace_nanos \
           FROM tollgate_policy WHERE singleton{suffix}"
    ))
    .fetch_optional(&mut *conn)
    .await?;
    match row {
        None => Ok(None),
        Some(row) => policy_from_parts("", &row),
    }
}

/// Takes `EXCLUSIVE` on the policy table before a policy change: waits for
/// every transaction that has written a lease (migration 0019's lease
/// trigger holds `ROW SHARE` on the table until it ends) and keeps new
/// lease writes waiting until this transaction ends. Readers never wait.
pub(crate) async fn lock_policy_for_change(conn: &mut PgConnection) -> Result<(), TxError> {
    sqlx::query("LOCK TABLE tollgate_policy IN EXCLUSIVE MODE")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// How [`read_policy`] locks the policy row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyLock {
    None,
    Share,
    Update,
}

/// Records `policy` if none is recorded; returns whether it inserted.
pub(crate) async fn insert_policy_if_absent(
    conn: &mut PgConnection,
    policy: GrantPolicy,
) -> Result<bool, TxError> {
    let (ts, tn) = duration_parts(policy.max_ttl());
    let (gs, gn) = duration_parts(policy.reclaim_grace());
    let done = sqlx::query(
        "INSERT INTO tollgate_policy \
             (singleton, max_ttl_secs, max_ttl_nanos, reclaim_grace_secs, reclaim_grace_nanos) \
         VALUES (true, $1, $2, $3, $4) ON CONFLICT (singleton) DO NOTHING",
    )
    .bind(ts)
    .bind(tn)
    .bind(gs)
    .bind(gn)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Overwrites the recorded policy (whose row the transaction has locked).
pub(crate) async fn update_policy(
    conn: &mut PgConnection,
    policy: GrantPolicy,
) -> Result<(), TxError> {
    let (ts, tn) = duration_parts(policy.max_ttl());
    let (gs, gn) = duration_parts(policy.reclaim_grace());
    let done = sqlx::query(
        "UPDATE tollgate_policy SET max_ttl_secs = $1, max_ttl_nanos = $2, \
                reclaim_grace_secs = $3, reclaim_grace_nanos = $4 WHERE singleton",
    )
    .bind(ts)
    .bind(tn)
    .bind(gs)
    .bind(gn)
    .execute(&mut *conn)
    .await?;
    expect_rows("updating the policy", done.rows_affected(), 1)
}

/// One recorded policy: the first start that recorded it, or an operator
/// change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyChange {
    /// Database-assigned, increasing.
    pub change_id: i64,
    /// Who recorded it (operator name, or `first start` for the process that
    /// found no recorded policy).
    pub changed_by: String,
    /// The database's transaction time of the change (kept for operators;
    /// no rule reads it).
    pub recorded_at: Timestamp,
    /// The policy before (`None` for the first record).
    pub old: Option<GrantPolicy>,
    /// The policy after.
    pub new: GrantPolicy,
}

pub(crate) async fn insert_policy_change(
    conn: &mut PgConnection,
    changed_by: &str,
    old: Option<GrantPolicy>,
    new: GrantPolicy,
) -> Result<PolicyChange, TxError> {
    let old_parts = old.map(|p| {
        (
            duration_parts(p.max_ttl()),
            duration_parts(p.reclaim_grace()),
        )
    });
    let (nts, ntn) = duration_parts(new.max_ttl());
    let (ngs, ngn) = duration_parts(new.reclaim_grace());
    let row = sqlx::query(&format!(
        "INSERT INTO tollgate_policy_changes \
             (changed_by, old_max_ttl_secs, old_max_ttl_nanos, old_reclaim_grace_secs, \
              old_reclaim_grace_nanos, new_max_ttl_secs, new_max_ttl_nanos, \
              new_reclaim_grace_secs, new_reclaim_grace_nanos) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {POLICY_CHANGE_COLUMNS}"
    ))
    .bind(changed_by)
    .bind(old_parts.map(|p| p.0.0))
    .bind(old_parts.map(|p| p.0.1))
    .bind(old_parts.map(|p| p.1.0))
    .bind(old_parts.map(|p| p.1.1))
    .bind(nts)
    .bind(ntn)
    .bind(ngs)
    .bind(ngn)
    .fetch_one(&mut *conn)
    .await?;
    policy_change_from_row(&row)
}

const POLICY_CHANGE_COLUMNS: &str = "change_id, changed_by, \
     (extract(epoch from recorded_at) * 1000000)::bigint AS recorded_at_us, \
     old_max_ttl_secs, old_max_ttl_nanos, old_reclaim_grace_secs, old_reclaim_grace_nanos, \
     new_max_ttl_secs, new_max_ttl_nanos, new_reclaim_grace_secs, new_reclaim_grace_nanos";

fn policy_change_from_row(row: &PgRow) -> Result<PolicyChange, TxError> {
    let recorded_at_us: i64 = row.try_get("recorded_at_us")?;
    let new = policy_from_parts("new_", row)?.ok_or_else(|| StorageError::Failure {
        message: "a policy change row has no new policy".into(),
    })?;
    Ok(PolicyChange {
        change_id: row.try_get("change_id")?,
        changed_by: row.try_get("changed_by")?,
        recorded_at: Timestamp::from_microsecond(recorded_at_us).map_err(|_| {
            StorageError::Failure {
                message: "a policy change time is out of range".into(),
            }
        })?,
        old: policy_from_parts("old_", row)?,
        new,
    })
}

/// The most recent [`POLICY_CHANGES_MAX`] policy records, oldest first.
pub(crate) async fn policy_changes(conn: &mut PgConnection) -> Result<Vec<PolicyChange>, TxError> {
    let rows = sqlx::query(&format!(
        "SELECT * FROM (SELECT {POLICY_CHANGE_COLUMNS} FROM tollgate_policy_changes \
                         ORDER BY change_id DESC LIMIT $1) recent ORDER BY change_id"
    ))
    .bind(POLICY_CHANGES_MAX)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(policy_change_from_row).collect()
}

// ---------------------------------------------------------------------------
// Operator queries.

/// One row of the operators' legacy-bound count (docs/upgrade-0017.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseCount {
    /// The leases' state.
    pub state: LeaseState,
    /// Whether their expiry is a legacy upper bound (written before 0017).
    pub expiry_is_upper_bound: bool,
    /// How many leases.
    pub count: i64,
}

/// The runbook's count query, verbatim. At most 8 rows (4 states x 2).
pub const LEASE_COUNTS_SQL: &str = "SELECT state, expiry_is_upper_bound, count(*)
FROM tollgate_leases
GROUP BY state, expiry_is_upper_bound;";

pub(crate) async fn lease_counts(conn: &mut PgConnection) -> Result<Vec<LeaseCount>, TxError> {
    let rows: Vec<(String, bool, i64)> = sqlx::query_as(LEASE_COUNTS_SQL)
        .fetch_all(&mut *conn)
        .await?;
    let mut counts = rows
        .into_iter()
        .map(|(state, expiry_is_upper_bound, count)| {
            Ok(LeaseCount {
                state: decode_state(&state)?,
                expiry_is_upper_bound,
                count,
            })
        })
        .collect::<Result<Vec<_>, StorageError>>()?;
    counts.sort_by_key(|c| (c.state.as_str(), c.expiry_is_upper_bound));
    Ok(counts)
}

/// Whether a migration session (application name
/// [`crate::MIGRATE_APPLICATION_NAME`]) is connected to this database.
pub(crate) async fn migration_in_progress(conn: &mut PgConnection) -> Result<bool, TxError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
          WHERE datname = current_database() AND application_name = $1)",
    )
    .bind(crate::MIGRATE_APPLICATION_NAME)
    .fetch_one(&mut *conn)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_trip_exactly_through_their_parts() {
        for d in [
            SignedDuration::ZERO,
            SignedDuration::new(0, 1),
            SignedDuration::new(30, 1),
            SignedDuration::new(-5, -7),
            SignedDuration::MAX,
            SignedDuration::MIN,
        ] {
            let (secs, nanos) = duration_parts(d);
            assert_eq!(duration_from_parts("d", secs, nanos).unwrap(), d);
        }
    }

    #[test]
    fn malformed_duration_parts_are_errors_not_panics() {
        for (secs, nanos) in [
            (1, -1),
            (-1, 1),
            (0, 1_000_000_000),
            (i64::MAX, 1_000_000_000),
            (i64::MIN, -1_000_000_000),
        ] {
            assert_eq!(
                duration_from_parts("max_ttl", secs, nanos).unwrap_err(),
                StorageError::Failure {
                    message: format!(
                        "stored max_ttl ({secs} s, {nanos} ns) is not a valid duration"
                    )
                }
            );
        }
    }

    #[test]
    fn row_count_mismatches_are_errors() {
        assert!(expect_rows("x", 1, 1).is_ok());
        match expect_rows("settling leases", 2, 3) {
            Err(TxError::Storage(e)) => assert_eq!(
                e,
                StorageError::Failure {
                    message: "settling leases changed 2 rows, expected 3".into()
                }
            ),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn op_names_are_stable_and_indexes_dense() {
        let names: Vec<&str> = Op::ALL.iter().map(Op::as_str).collect();
        assert_eq!(
            names,
            [
                "create_account",
                "read_account",
                "deposit",
                "acquire",
                "read_lease",
                "renew",
                "release",
                "consolidate",
                "reclaim",
                "read_ledger",
                "admin"
            ]
        );
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(op.index(), i);
        }
    }
}
