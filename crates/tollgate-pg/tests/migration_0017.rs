//! Migration 0017 and its compatibility fences, on real PostgreSQL.
//!
//! Every test builds a database to version 16 with `Schema::through(16)` (the
//! binary before exact instants), fills it through the SQL an old writer
//! runs (`support::legacy`), and then migrates with this binary.

mod support;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgConnection, PgPool};
use support::{Db, legacy};
use tollgate::{
    AcquireRequest, Allocator, Balances, CapabilityKey, GrantPolicy, InstantPair, LeaseId,
    LeaseState, LedgerKind, RuleError, StorageError, StoreId,
};
use tollgate_pg::{MIGRATE_APPLICATION_NAME, PostgresStore, Schema, schema_version};

/// Bound on every wait for another session's state in these tests.
const WAIT_MAX: Duration = Duration::from_secs(20);

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap()
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn at_ns(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).unwrap()
}

async fn v16_db() -> Db {
    let db = support::fresh_db().await;
    let report = Schema::through(16)
        .unwrap()
        .migrate(db.url())
        .await
        .unwrap();
    assert_eq!(report.from_version, None);
    assert_eq!(report.to_version, Some(16));
    assert_eq!(report.applied, (1..=16).collect::<Vec<i64>>());
    db
}

async fn migrate_17(db: &Db) {
    let report = tollgate_pg::migrate(db.url()).await.unwrap();
    assert_eq!(
        (report.from_version, report.to_version, report.applied),
        (Some(16), Some(21), vec![17, 18, 19, 20, 21])
    );
}

async fn version(conn: &mut PgConnection) -> Option<i64> {
    sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(conn)
        .await
        .unwrap()
}

async fn columns(conn: &mut PgConnection, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(conn)
    .await
    .unwrap()
}

async fn lease_indexes(conn: &mut PgConnection) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes \
         WHERE tablename = 'tollgate_leases' ORDER BY indexname",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

type AccountRow = (i64, String, i64, i64, i64, i64);
/// Request TTL (s, ns, truncated), granted TTL (s, ns), expiry pair, bound.
type IdempotencyTimes = (i64, i32, bool, i64, i32, i64, i16, bool);
/// `(floor_us, submicro_ns, expiry_is_upper_bound, expected SQLSTATE)`.
type ConstraintCase = (i64, Option<i16>, Option<bool>, Option<&'static str>);
type LeaseRow = (i64, i64, i64, i64, String, Option<i64>);
/// The ledger columns migration 0017 must not change.
#[derive(Debug, PartialEq, Eq, sqlx::FromRow)]
struct LedgerRow {
    seq: i64,
    account_id: i64,
    lease_id: Option<i64>,
    kind: String,
    actor: String,
    units: i64,
    consumed: i64,
    before_deposited: i64,
    before_available: i64,
    before_held: i64,
    before_consumed: i64,
    after_deposited: i64,
    after_available: i64,
    after_held: i64,
    after_consumed: i64,
    fence: Option<i64>,
}

/// Every unit, fence, state and accounting field (the columns migration
/// 0017 must not change).
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    accounts: Vec<AccountRow>,
    leases: Vec<LeaseRow>,
    ledger: Vec<LedgerRow>,
    idempotency: Vec<(i64, String, i64, i64, i64)>,
    fence_last_value: i64,
}

async fn snapshot(conn: &mut PgConnection) -> Snapshot {
    Snapshot {
        accounts: sqlx::query_as(
            "SELECT account_id, name, deposited, available, held, consumed \
             FROM tollgate_accounts ORDER BY account_id",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
        leases: sqlx::query_as(
            "SELECT lease_id, account_id, units, fence, state, consumed \
             FROM tollgate_leases ORDER BY lease_id",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
        ledger: sqlx::query_as(
            "SELECT seq, account_id, lease_id, kind, actor, units, consumed, \
             before_deposited, before_available, before_held, before_consumed, \
             after_deposited, after_available, after_held, after_consumed, fence \
             FROM tollgate_ledger ORDER BY seq",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
        idempotency: sqlx::query_as(
            "SELECT account_id, idem_key, units, lease_id, fence FROM tollgate_idempotency \
             ORDER BY account_id, idem_key",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
        fence_last_value: sqlx::query_scalar("SELECT last_value FROM tollgate_fence_seq")
            .fetch_one(&mut *conn)
            .await
            .unwrap(),
    }
}

/// The operators' count query, exactly as the runbook prints it, sorted.
async fn legacy_bound_counts(conn: &mut PgConnection) -> Vec<(String, bool, i64)> {
    let mut rows: Vec<(String, bool, i64)> = sqlx::query_as(
        "SELECT state, expiry_is_upper_bound, count(*)
FROM tollgate_leases
GROUP BY state, expiry_is_upper_bound;",
    )
    .fetch_all(conn)
    .await
    .unwrap();
    rows.sort();
    rows
}

/// Polls `pg_stat_activity` until the migration session waits for a lock
/// (optionally in a statement containing `query_part`).
async fn wait_for_blocked_migration(observer: &mut PgConnection, query_part: &str) {
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = $1 AND wait_event_type = 'Lock' \
               AND position($2 in query) > 0",
        )
        .bind(MIGRATE_APPLICATION_NAME)
        .bind(query_part)
        .fetch_one(&mut *observer)
        .await
        .unwrap();
        if blocked == 1 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "migration never blocked on a lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn store(db: &Db, key: CapabilityKey) -> PostgresStore {
    support::store_on(db, policy(), key).await
}

/// Legacy rows at the interesting truncated microsecond values.
const POSITIVE_US: i64 = 1_795_953_600_123_456; // 2026-11-29T12:00:00.123456Z
const NEGATIVE_US: i64 = -1_000_000_123_456;
const MAX_US: i64 = 253_402_207_200_999_999; // floor of Timestamp::MAX
const MIN_US: i64 = -377_705_023_201_000_000; // Timestamp::MIN, whole microseconds
const AT_US: i64 = 1_795_953_000_000_001; // 2026-11-29T11:50:00.000001Z, truncated

#[tokio::test]
async fn backfill_gives_latest_consistent_instant_and_marks_it() {
    let db = v16_db().await;
    let mut conn = support::connect(&db).await;
    legacy::record_policy(&mut conn, policy()).await.unwrap();
    let a = legacy::create_account(&mut conn, "legacy").await.unwrap();
    legacy::deposit(&mut conn, a, 100, AT_US).await.unwrap();
    let cases = [POSITIVE_US, 1, 0, -1, NEGATIVE_US, MAX_US, MIN_US];
    let mut ids = Vec::new();
    for us in cases {
        ids.push(legacy::acquire(&mut conn, a, 1, us, AT_US).await.unwrap());
    }
    let (pos_id, pos_fence) = ids[0];
    legacy::idempotency(
        &mut conn,
        a,
        "k1",
        1,
        30_000_001,
        pos_id,
        pos_fence,
        POSITIVE_US,
        30_000_001,
    )
    .await
    .unwrap();
    let store_id = legacy::store_id(&mut conn).await;

    migrate_17(&db).await;

    let rows: Vec<(i64, i64, i16, bool)> = sqlx::query_as(
        "SELECT lease_id, expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound \
         FROM tollgate_leases ORDER BY lease_id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let ids: Vec<i64> = ids.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        rows,
        vec![
            (ids[0], POSITIVE_US, 999, true),
            (ids[1], 1, 999, true),
            (ids[2], 0, 999, true),
            (ids[3], -1, 0, true),
            (ids[4], NEGATIVE_US, 0, true),
            (ids[5], MAX_US, 999, true),
            (ids[6], MIN_US, 0, true),
        ]
    );
    assert_eq!(
        InstantPair {
            floor_us: MAX_US,
            submicro_ns: 999
        },
        InstantPair::MAX
    );
    assert_eq!(
        InstantPair {
            floor_us: MIN_US,
            submicro_ns: 0
        },
        InstantPair::MIN
    );

    // The new store decodes the same pairs to the exact nanoseconds.
    let key = support::test_key();
    let s = store(&db, key.clone()).await;
    assert_eq!(s.store_id(), store_id);
    let expected_ns: [i128; 7] = [
        1_795_953_600_123_456_999,
        1_999,
        999,
        -1_000,
        -1_000_000_123_456_000,
        253_402_207_200_999_999_999,
        -377_705_023_201_000_000_000,
    ];
    for (id, ns) in ids.iter().zip(expected_ns) {
        let lease = s
            .lease(LeaseId(*id), &key.derive(store_id, LeaseId(*id)))
            .await
            .unwrap();
        assert_eq!(lease.expiry, at_ns(ns), "lease {id}");
        assert!(lease.expiry_is_upper_bound);
        assert_eq!(lease.state, LeaseState::Active);
    }
    assert_eq!(
        s.lease(LeaseId(ids[5]), &key.derive(store_id, LeaseId(ids[5])))
            .await
            .unwrap()
            .expiry,
        Timestamp::MAX
    );
    assert_eq!(
        s.lease(LeaseId(ids[6]), &key.derive(store_id, LeaseId(ids[6])))
            .await
            .unwrap()
            .expiry,
        Timestamp::MIN
    );

    // Ledger instants got the same bound: expiry and supplied time.
    let ledger = s.ledger(0, 100).await.unwrap();
    assert_eq!(ledger.len(), 8);
    assert_eq!(ledger[0].kind, LedgerKind::Deposit);
    assert_eq!(ledger[0].expiry, None);
    for e in &ledger {
        assert_eq!(e.at, at_ns(1_795_953_000_000_001_999));
    }
    let acquires: Vec<Option<Timestamp>> = ledger[1..].iter().map(|e| e.expiry).collect();
    assert_eq!(
        acquires,
        expected_ns
            .iter()
            .map(|ns| Some(at_ns(*ns)))
            .collect::<Vec<_>>()
    );
    let flags: Vec<(Option<bool>, bool)> = sqlx::query_as(
        "SELECT expiry_is_upper_bound, at_is_upper_bound FROM tollgate_ledger ORDER BY seq",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut expected_flags = vec![(None, true)];
    expected_flags.extend([(Some(true), true); 7]);
    assert_eq!(flags, expected_flags);

    // The legacy idempotency record: TTLs exact from microseconds; a retry
    // whose TTL truncates to the same microseconds returns the original
    // grant, another TTL conflicts.
    let ttl_rows: Vec<IdempotencyTimes> = sqlx::query_as(
        "SELECT request_ttl_secs, request_ttl_nanos, request_ttl_is_truncated, \
         granted_ttl_secs, granted_ttl_nanos, expiry_floor_us, expiry_submicro_ns, \
         expiry_is_upper_bound FROM tollgate_idempotency",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        ttl_rows,
        vec![(30, 1_000, true, 30, 1_000, POSITIVE_US, 999, true)]
    );
    let retry = |ttl| AcquireRequest {
        account_id: tollgate::AccountId(a),
        units: 1,
        ttl,
        idempotency_key: Some("k1".into()),
    };
    let now = ts("2026-11-29T12:00:00Z");
    let g = s
        .acquire(retry(SignedDuration::new(30, 1_999)), now.into())
        .await
        .unwrap();
    assert_eq!(g.lease_id, LeaseId(pos_id));
    assert_eq!(g.fence.0, pos_fence);
    assert_eq!(g.expiry, at_ns(1_795_953_600_123_456_999));
    assert_eq!(g.granted_ttl, SignedDuration::new(30, 1_000));
    assert_eq!(g.capability, key.derive(store_id, LeaseId(pos_id)));
    assert_eq!(
        s.acquire(retry(SignedDuration::new(30, 2_000)), now.into())
            .await
            .unwrap_err(),
        RuleError::IdempotencyConflict
    );
}

/// A version-16 database with accounts, leases in every state, ledger and
/// idempotency records, all written by the old writer.
async fn filled_v16() -> (Db, Vec<i64>) {
    let db = v16_db().await;
    let mut c = support::connect(&db).await;
    legacy::record_policy(&mut c, policy()).await.unwrap();
    let t = AT_US;
    let a = legacy::create_account(&mut c, "alpha").await.unwrap();
    let b = legacy::create_account(&mut c, "beta").await.unwrap();
    legacy::deposit(&mut c, a, 1_000, t).await.unwrap();
    legacy::deposit(&mut c, b, 500, t).await.unwrap();
    let mut tx = c.begin().await.unwrap();
    let (l1, _) = legacy::acquire(&mut tx, a, 100, t + 30_000_000, t)
        .await
        .unwrap();
    let (l2, f2) = legacy::acquire(&mut tx, a, 50, t + 30_000_000, t)
        .await
        .unwrap();
    let (l3, _) = legacy::acquire(&mut tx, a, 70, t + 1_000_000, t)
        .await
        .unwrap();
    let (l4, _) = legacy::acquire(&mut tx, b, 200, t + 1_000_000, t)
        .await
        .unwrap();
    let (l5, _) = legacy::acquire(&mut tx, b, 20, t + 60_000_000, t)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    legacy::idempotency(
        &mut c,
        a,
        "retry-1",
        50,
        30_000_000,
        l2,
        f2,
        t + 30_000_000,
        30_000_000,
    )
    .await
    .unwrap();
    assert!(
        legacy::release(&mut c, l1, 40, 5_000_000, t + 1)
            .await
            .unwrap()
    );
    let reclaimed = legacy::reclaim(&mut c, t + 2_000_000, 10, t + 7_000_000)
        .await
        .unwrap();
    assert_eq!(reclaimed, vec![l3, l4]);
    let (l6, _) = legacy::consolidate(&mut c, b, &[l5], t + 90_000_000, t + 8_000_000)
        .await
        .unwrap();
    (db, vec![a, b, l1, l2, l3, l4, l5, l6])
}

#[tokio::test]
async fn migration_preserves_every_unit_fence_state_and_balance() {
    let (db, ids) = filled_v16().await;
    let mut c = support::connect(&db).await;
    let before = snapshot(&mut c).await;
    assert_eq!(
        before.accounts,
        vec![
            (ids[0], "alpha".to_string(), 1_000, 840, 50, 110),
            (ids[1], "beta".to_string(), 500, 280, 20, 200),
        ]
    );
    migrate_17(&db).await;
    let after = snapshot(&mut c).await;
    assert_eq!(before, after);

    // Every lease keeps its state; each pre-0017 row is a legacy bound.
    assert_eq!(
        legacy_bound_counts(&mut c).await,
        vec![
            ("active".into(), true, 2),
            ("consolidated".into(), true, 1),
            ("reclaimed".into(), true, 2),
            ("released".into(), true, 1),
        ]
    );

    // The new store's conservation audit agrees with the legacy ledger.
    let s = store(&db, support::test_key()).await;
    let audit = s.audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    assert_eq!(
        (
            audit.accounts_checked,
            audit.entries_checked,
            audit.total_deposited,
            audit.total_available,
            audit.total_held,
            audit.total_consumed
        ),
        (2, 12, 1_500, 1_120, 70, 310)
    );
}

#[tokio::test]
async fn out_of_domain_legacy_row_fails_rolls_back_and_retry_does_not_hang() {
    let db = v16_db().await;
    let mut c = support::connect(&db).await;
    let a = legacy::create_account(&mut c, "legacy").await.unwrap();
    legacy::deposit(&mut c, a, 100, AT_US).await.unwrap(); // seq 1
    legacy::acquire(&mut c, a, 1, MAX_US, AT_US).await.unwrap(); // lease 1, seq 2: ok
    legacy::acquire(&mut c, a, 1, MAX_US + 1, AT_US)
        .await
        .unwrap(); // lease 2, seq 3: beyond MAX
    legacy::acquire(&mut c, a, 1, MIN_US - 1, AT_US)
        .await
        .unwrap(); // lease 3, seq 4: before MIN
    let before = snapshot(&mut c).await;
    let expiries_before: Vec<(i64, i64)> =
        sqlx::query_as("SELECT lease_id, expires_at_us FROM tollgate_leases ORDER BY lease_id")
            .fetch_all(&mut c)
            .await
            .unwrap();
    let columns_before = columns(&mut c, "tollgate_leases").await;
    let indexes_before = lease_indexes(&mut c).await;

    let expected = StorageError::Failure {
        message: "migration 17 failed and was rolled back: migration 0017 refused: legacy \
                  instants outside the timestamp domain: 2 lease row(s) [lease_id: 2, 3], 2 \
                  ledger row(s) [seq: 3, 4], 0 idempotency record(s) [account_id/key: -]; \
                  nothing was changed, version 16 remains; inspect these rows and repair them \
                  only from authoritative evidence, then retry (SQLSTATE 23514)"
            .into(),
    };
    // The first failure, then a retry: both bounded, neither may hang on the
    // advisory lock the failed run took.
    for attempt in 0..2 {
        let result = tokio::time::timeout(WAIT_MAX, tollgate_pg::migrate(db.url()))
            .await
            .unwrap_or_else(|_| panic!("migration attempt {attempt} hung"));
        assert_eq!(result.unwrap_err(), expected);
        assert_eq!(version(&mut c).await, Some(16));
        assert_eq!(snapshot(&mut c).await, before);
        let expiries: Vec<(i64, i64)> =
            sqlx::query_as("SELECT lease_id, expires_at_us FROM tollgate_leases ORDER BY lease_id")
                .fetch_all(&mut c)
                .await
                .unwrap();
        assert_eq!(expiries, expiries_before);
        assert_eq!(columns(&mut c, "tollgate_leases").await, columns_before);
        assert_eq!(lease_indexes(&mut c).await, indexes_before);
    }
    // The migration connection is closed: no advisory lock is left behind
    // (the server ends the session asynchronously, so poll briefly).
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    loop {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(&mut c)
        .await
        .unwrap();
        if held == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "advisory lock left held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Repaired from (here: test) evidence, the retry succeeds.
    sqlx::query("UPDATE tollgate_leases SET expires_at_us = $1 WHERE lease_id IN (2, 3)")
        .bind(POSITIVE_US)
        .execute(&mut c)
        .await
        .unwrap();
    sqlx::query("UPDATE tollgate_ledger SET expiry_us = $1 WHERE seq IN (3, 4)")
        .bind(POSITIVE_US)
        .execute(&mut c)
        .await
        .unwrap();
    tokio::time::timeout(WAIT_MAX, migrate_17(&db))
        .await
        .expect("migration after repair hung");
    let pairs: Vec<(i64, i64, i16)> = sqlx::query_as(
        "SELECT lease_id, expiry_floor_us, expiry_submicro_ns FROM tollgate_leases ORDER BY lease_id",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(
        pairs,
        vec![
            (1, MAX_US, 999),
            (2, POSITIVE_US, 999),
            (3, POSITIVE_US, 999)
        ]
    );
}

#[tokio::test]
async fn retained_connection_old_acquire_fails_undefined_column_and_debit_rolls_back() {
    let db = v16_db().await;
    let mut setup = support::connect(&db).await;
    let a = legacy::create_account(&mut setup, "legacy").await.unwrap();
    legacy::deposit(&mut setup, a, 100, AT_US).await.unwrap();
    // An old process's connection, opened and used (its statements are
    // prepared and cached) before the migration.
    let mut old = support::connect(&db).await;
    legacy::acquire(&mut old, a, 10, POSITIVE_US, AT_US)
        .await
        .unwrap();

    migrate_17(&db).await;

    let before = snapshot(&mut setup).await;
    let mut tx = old.begin().await.unwrap();
    let (b, after) = legacy::debit(&mut tx, a, 20).await.unwrap();
    assert_eq!(
        (b, after),
        (
            Balances {
                deposited: 100,
                available: 90,
                held: 10,
                consumed: 0
            },
            Balances {
                deposited: 100,
                available: 70,
                held: 30,
                consumed: 0
            }
        )
    );
    let err = legacy::insert_lease(&mut tx, a, 20, POSITIVE_US)
        .await
        .unwrap_err();
    assert_eq!(legacy::sqlstate(&err).as_deref(), Some("42703"));
    assert!(
        err.to_string().contains("expires_at_us"),
        "unexpected error: {err}"
    );
    tx.rollback().await.unwrap();
    // The debit rolled back with it.
    assert_eq!(snapshot(&mut setup).await, before);
    assert_eq!(
        before.accounts,
        vec![(a, "legacy".to_string(), 100, 90, 10, 0)]
    );
    // An old acquire on a connection opened after the migration fails the
    // same way.
    let mut late = support::connect(&db).await;
    let mut tx = late.begin().await.unwrap();
    let err = legacy::acquire(&mut tx, a, 5, POSITIVE_US, AT_US)
        .await
        .unwrap_err();
    assert_eq!(legacy::sqlstate(&err).as_deref(), Some("42703"));
    tx.rollback().await.unwrap();
    assert_eq!(snapshot(&mut setup).await, before);
}

#[tokio::test]
async fn retained_connection_old_release_consolidate_reclaim_fail_undefined_column() {
    let db = v16_db().await;
    let mut setup = support::connect(&db).await;
    let a = legacy::create_account(&mut setup, "legacy").await.unwrap();
    legacy::deposit(&mut setup, a, 100, AT_US).await.unwrap();
    let (l1, _) = legacy::acquire(&mut setup, a, 10, AT_US + 1_000, AT_US)
        .await
        .unwrap();
    let (l2, _) = legacy::acquire(&mut setup, a, 10, AT_US + 1_000, AT_US)
        .await
        .unwrap();
    let mut old = support::connect(&db).await;
    // Warm the old statements on the retained connection (all no-ops).
    assert!(
        legacy::reclaim_select(&mut old, i64::MIN, 1)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        legacy::consolidate_select(&mut old, a, &[])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        legacy::release_lease(&mut old, -1, 0, 0, 0)
            .await
            .unwrap()
            .is_none()
    );

    migrate_17(&db).await;
    let before = snapshot(&mut setup).await;

    let mut tx = old.begin().await.unwrap();
    let err = legacy::release(&mut tx, l1, 3, 5_000_000, AT_US)
        .await
        .unwrap_err();
    assert_eq!(legacy::sqlstate(&err).as_deref(), Some("42703"));
    tx.rollback().await.unwrap();

    let mut tx = old.begin().await.unwrap();
    let err = legacy::consolidate(&mut tx, a, &[l1, l2], AT_US + 9_000_000, AT_US)
        .await
        .unwrap_err();
    assert_eq!(legacy::sqlstate(&err).as_deref(), Some("42703"));
    tx.rollback().await.unwrap();

    let mut tx = old.begin().await.unwrap();
    let err = legacy::reclaim(&mut tx, AT_US + 10_000_000, 10, AT_US + 10_000_000)
        .await
        .unwrap_err();
    assert_eq!(legacy::sqlstate(&err).as_deref(), Some("42703"));
    tx.rollback().await.unwrap();

    assert_eq!(snapshot(&mut setup).await, before);
    assert_eq!(
        legacy_bound_counts(&mut setup).await,
        vec![("active".into(), true, 2)]
    );
}

#[tokio::test]
async fn binary_knowing_only_1_to_16_refuses_the_migrated_database() {
    let db = v16_db().await;
    // This binary refuses the version-16 database until it is migrated.
    let err = PostgresStore::connect_with(
        db.url(),
        policy(),
        support::test_key(),
        support::TEST_OPTIONS,
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        StorageError::Failure {
            message: "database schema is at version 16 but this binary requires version 21; \
                      pending migrations: 17, 18, 19, 20, 21; run the migrations first"
                .into()
        }
    );
    migrate_17(&db).await;

    let old = Schema::through(16).unwrap();
    assert_eq!(old.latest_version(), 16);
    let refusal = StorageError::Failure {
        message: "database has applied migration version 17 (exact instants), which this \
                  binary does not know (it knows versions 1 through 16); refusing to start \
                  against a newer schema: run a binary that carries version 17"
            .into(),
    };
    let pool = PgPool::connect(db.url()).await.unwrap();
    assert_eq!(old.check(&pool).await.unwrap_err(), refusal);
    assert_eq!(old.migrate(db.url()).await.unwrap_err(), refusal);
    assert_eq!(old.pending(db.url()).await.unwrap_err(), refusal);
    // The current binary accepts it.
    Schema::current().check(&pool).await.unwrap();
    assert_eq!(schema_version(&pool).await.unwrap(), Some(21));
    pool.close().await;
}

#[tokio::test]
async fn old_transaction_makes_the_migration_wait_for_its_lock() {
    let db = v16_db().await;
    let mut setup = support::connect(&db).await;
    let a = legacy::create_account(&mut setup, "legacy").await.unwrap();
    legacy::deposit(&mut setup, a, 100, AT_US).await.unwrap();

    // An old acquire still running (its transaction holds the table locks).
    let mut old = support::connect(&db).await;
    let mut tx = old.begin().await.unwrap();
    let (lease_id, _) = legacy::acquire(&mut tx, a, 10, POSITIVE_US, AT_US)
        .await
        .unwrap();

    let url = db.url().to_string();
    let migration = tokio::spawn(async move { tollgate_pg::migrate(&url).await });
    let mut observer = support::connect(&db).await;
    // (pg_stat_activity shows the first 1 KiB of the migration's text.)
    wait_for_blocked_migration(&mut observer, "-- Migration 0017: exact lease instants.").await;
    assert_eq!(version(&mut observer).await, Some(16));
    assert!(
        columns(&mut observer, "tollgate_leases")
            .await
            .contains(&"expires_at_us".into())
    );
    assert!(!migration.is_finished());
    let pool = PgPool::connect(db.url()).await.unwrap();
    assert!(tollgate_pg::migration_in_progress(&pool).await.unwrap());

    tx.commit().await.unwrap();
    let report = tokio::time::timeout(WAIT_MAX, migration)
        .await
        .expect("migration did not finish after the old transaction committed")
        .unwrap()
        .unwrap();
    assert_eq!(report.applied, vec![17, 18, 19, 20, 21]);
    // The old transaction's lease committed first and was backfilled.
    let row: (i64, i16, bool, i64) = sqlx::query_as(
        "SELECT expiry_floor_us, expiry_submicro_ns, expiry_is_upper_bound, units \
         FROM tollgate_leases WHERE lease_id = $1",
    )
    .bind(lease_id)
    .fetch_one(&mut observer)
    .await
    .unwrap();
    assert_eq!(row, (POSITIVE_US, 999, true, 10));
    // Maintenance ends when the migration connection is gone (the server
    // ends the session asynchronously).
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    while tollgate_pg::migration_in_progress(&pool).await.unwrap() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "maintenance never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.close().await;
}

#[tokio::test]
async fn new_format_is_invisible_to_other_sessions_until_the_migration_commits() {
    let db = v16_db().await;
    let mut setup = support::connect(&db).await;
    let a = legacy::create_account(&mut setup, "legacy").await.unwrap();
    legacy::deposit(&mut setup, a, 100, AT_US).await.unwrap();
    legacy::acquire(&mut setup, a, 10, POSITIVE_US, AT_US)
        .await
        .unwrap();
    let legacy_columns = columns(&mut setup, "tollgate_leases").await;
    assert_eq!(
        legacy_columns,
        [
            "lease_id",
            "account_id",
            "units",
            "expires_at_us",
            "state",
            "fence",
            "consumed"
        ]
    );

    // Hold the migration after its SQL ran but before its transaction
    // commits: it must insert its bookkeeping row, which this SHARE lock
    // blocks.
    let mut blocker = support::connect(&db).await;
    let mut hold = blocker.begin().await.unwrap();
    sqlx::query("LOCK TABLE _sqlx_migrations IN SHARE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let url = db.url().to_string();
    let migration = tokio::spawn(async move { tollgate_pg::migrate(&url).await });
    let mut observer = support::connect(&db).await;
    wait_for_blocked_migration(&mut observer, "INSERT INTO _sqlx_migrations").await;

    // Everything of 0017 has executed in the migration's transaction, yet
    // other sessions see the old schema and version, and cannot read the
    // locked table.
    assert_eq!(
        columns(&mut observer, "tollgate_leases").await,
        legacy_columns
    );
    assert_eq!(version(&mut observer).await, Some(16));
    // (Catalog rows only: pg_get_indexdef would wait for the table lock.)
    let index_names: Vec<String> = sqlx::query_scalar(
        "SELECT ic.relname::text FROM pg_index i \
         JOIN pg_class ic ON ic.oid = i.indexrelid JOIN pg_class tc ON tc.oid = i.indrelid \
         WHERE tc.relname = 'tollgate_leases' ORDER BY 1",
    )
    .fetch_all(&mut observer)
    .await
    .unwrap();
    assert_eq!(
        index_names,
        [
            "tollgate_leases_account",
            "tollgate_leases_active_expires_at",
            "tollgate_leases_pkey"
        ]
    );
    sqlx::query("SET lock_timeout = '200ms'")
        .execute(&mut observer)
        .await
        .unwrap();
    let err = sqlx::query("SELECT count(*) FROM tollgate_leases")
        .execute(&mut observer)
        .await
        .unwrap_err();
    assert_eq!(legacy::sqlstate(&err).as_deref(), Some("55P03"));
    sqlx::query("RESET lock_timeout")
        .execute(&mut observer)
        .await
        .unwrap();

    hold.commit().await.unwrap();
    let report = tokio::time::timeout(WAIT_MAX, migration)
        .await
        .expect("migration did not finish")
        .unwrap()
        .unwrap();
    assert_eq!(report.applied, vec![17, 18, 19, 20, 21]);
    assert_eq!(
        columns(&mut observer, "tollgate_leases").await,
        [
            "lease_id",
            "account_id",
            "units",
            "expiry_floor_us",
            "state",
            "fence",
            "consumed",
            "expiry_submicro_ns",
            "expiry_is_upper_bound"
        ]
    );
    assert_eq!(
        lease_indexes(&mut observer).await,
        vec![
            (
                "tollgate_leases_account".into(),
                "CREATE INDEX tollgate_leases_account ON public.tollgate_leases USING btree \
                 (account_id, lease_id)"
                    .into()
            ),
            (
                "tollgate_leases_active_expiry".into(),
                "CREATE INDEX tollgate_leases_active_expiry ON public.tollgate_leases USING \
                 btree (expiry_floor_us, expiry_submicro_ns) WHERE (state = 'active'::text)"
                    .into()
            ),
            (
                "tollgate_leases_pkey".into(),
                "CREATE UNIQUE INDEX tollgate_leases_pkey ON public.tollgate_leases USING btree \
                 (lease_id)"
                    .into()
            ),
        ]
    );
}

#[tokio::test]
async fn new_store_settles_and_drains_legacy_grants_issued_before_0017() {
    let db = v16_db().await;
    let mut c = support::connect(&db).await;
    // The old binary's first start recorded the same policy; it issued
    // capabilities from the stored identity and the shared key.
    legacy::record_policy(&mut c, policy()).await.unwrap();
    let key = support::test_key();
    let store_id: StoreId = legacy::store_id(&mut c).await;
    let t0 = ts("2026-11-29T12:00:00.000000500Z");
    let t0_us = legacy::truncated_us(t0);
    assert_eq!(t0_us, 1_795_953_600_000_000);
    let a = legacy::create_account(&mut c, "legacy").await.unwrap();
    legacy::deposit(&mut c, a, 1_000, t0_us).await.unwrap();
    let exp_30s = t0_us + 30_000_000;
    let exp_1s = t0_us + 1_000_000;
    let (l1, _) = legacy::acquire(&mut c, a, 100, exp_30s, t0_us)
        .await
        .unwrap();
    let (l2, _) = legacy::acquire(&mut c, a, 50, exp_30s, t0_us)
        .await
        .unwrap();
    let (l3, _) = legacy::acquire(&mut c, a, 70, exp_30s, t0_us)
        .await
        .unwrap();
    let (l4, l4_fence) = legacy::acquire(&mut c, a, 200, exp_1s, t0_us)
        .await
        .unwrap();
    let (l5, _) = legacy::acquire(&mut c, a, 10, exp_30s, t0_us)
        .await
        .unwrap();
    let cap = |id: i64| key.derive(store_id, LeaseId(id));

    migrate_17(&db).await;
    let s = store(&db, key.clone()).await;
    let account = tollgate::AccountId(a);
    assert_eq!(s.store_id(), store_id);
    let t1 = ts("2026-11-29T12:00:10Z");

    // Release with a capability issued before the migration.
    let r1 = s
        .release(LeaseId(l1), &cap(l1), t1, Some(40))
        .await
        .unwrap();
    assert_eq!(
        (r1.state, r1.units, r1.consumed, r1.returned, r1.balances),
        (
            LeaseState::Released,
            100,
            40,
            60,
            Balances {
                deposited: 1_000,
                available: 630,
                held: 330,
                consumed: 40
            }
        )
    );
    // Consolidate two legacy grants into an exact one.
    let g6 = s
        .consolidate(
            account,
            &[(LeaseId(l3), cap(l3)), (LeaseId(l2), cap(l2))],
            SignedDuration::new(20, 7),
            t1.into(),
        )
        .await
        .unwrap();
    assert_eq!(
        (g6.units, g6.expiry),
        (120, ts("2026-11-29T12:00:30.000000007Z"))
    );
    let l6 = s.lease(g6.lease_id, &g6.capability).await.unwrap();
    assert!(!l6.expiry_is_upper_bound);
    // Renew a legacy grant: its new expiry is exact.
    let renewed = s
        .renew(
            LeaseId(l5),
            &cap(l5),
            SignedDuration::from_secs(60),
            t1.into(),
        )
        .await
        .unwrap();
    assert_eq!(renewed.lease.expiry, ts("2026-11-29T12:01:10Z"));
    assert!(!renewed.lease.expiry_is_upper_bound);

    // Reclaim compares the legacy bound (exp_1s us + 999 ns) exactly:
    // reclaimable at bound + grace, not one nanosecond earlier.
    let bound = at_ns(i128::from(exp_1s) * 1000 + 999);
    assert_eq!(bound, ts("2026-11-29T12:00:01.000000999Z"));
    let due = bound.checked_add(SignedDuration::from_secs(5)).unwrap();
    let early = s
        .reclaim(due.checked_sub(SignedDuration::from_nanos(1)).unwrap(), 100)
        .await
        .unwrap();
    assert_eq!(early.reclaimed, Vec::<LeaseId>::new());
    let legacy_release_too_late = s.release(LeaseId(l4), &cap(l4), due, None).await;
    assert_eq!(
        legacy_release_too_late.unwrap_err().code(),
        "lease_reclaimable"
    );
    let report = s.reclaim(due, 100).await.unwrap();
    assert_eq!(report.reclaimed, vec![LeaseId(l4)]);
    assert_eq!(report.units_charged, 200);
    assert_eq!(report.cutoff, Some(bound));
    let entry = s.ledger(0, 100).await.unwrap().pop().unwrap();
    assert_eq!(
        (
            entry.kind,
            entry.lease_id,
            entry.units,
            entry.consumed,
            entry.fence,
            entry.expiry,
            entry.at
        ),
        (
            LedgerKind::Reclaim,
            Some(LeaseId(l4)),
            200,
            200,
            Some(tollgate::Fence(l4_fence)),
            Some(bound),
            due
        )
    );

    // Drain the rest.
    s.release(LeaseId(l5), &cap(l5), t1, None).await.unwrap();
    let last = s
        .release(g6.lease_id, &g6.capability, t1, Some(0))
        .await
        .unwrap();
    assert_eq!(
        last.balances,
        Balances {
            deposited: 1_000,
            available: 750,
            held: 0,
            consumed: 250
        }
    );
    assert_eq!(
        legacy_bound_counts(&mut c).await,
        vec![
            ("consolidated".into(), true, 2),
            ("reclaimed".into(), true, 1),
            ("released".into(), false, 2),
            ("released".into(), true, 1),
        ]
    );
    let pool = PgPool::connect(db.url()).await.unwrap();
    let count = |state, expiry_is_upper_bound, count| tollgate_pg::LeaseCount {
        state,
        expiry_is_upper_bound,
        count,
    };
    assert_eq!(
        tollgate_pg::lease_counts(&pool).await.unwrap(),
        vec![
            count(LeaseState::Consolidated, true, 2),
            count(LeaseState::Reclaimed, true, 1),
            count(LeaseState::Released, false, 2),
            count(LeaseState::Released, true, 1),
        ]
    );
    pool.close().await;
    let active_legacy: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tollgate_leases WHERE state = 'active' AND expiry_is_upper_bound",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(active_legacy, 0);
    let audit = s.audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_available,
            audit.total_held,
            audit.total_consumed
        ),
        (1_000, 750, 0, 250)
    );
}

#[tokio::test]
async fn schema_constraints_enforce_the_pair_domain() {
    let db = support::migrated_db().await;
    let mut c = support::connect(&db).await;
    let a = legacy::create_account(&mut c, "x").await.unwrap();
    // Every lease writer declares the recorded grant policy (migration 0019).
    legacy::record_policy(&mut c, policy()).await.unwrap();
    tollgate_pg::declare_session(&mut c, &policy(), false)
        .await
        .unwrap();
    sqlx::query("UPDATE tollgate_accounts SET deposited = 10, available = 0, held = 10")
        .execute(&mut c)
        .await
        .unwrap();
    let insert = |floor: i64, sub: Option<i16>, bound: Option<bool>| {
        sqlx::query(
            "INSERT INTO tollgate_leases (account_id, units, fence, expiry_floor_us, \
             expiry_submicro_ns, expiry_is_upper_bound, state) \
             VALUES ($1, 1, nextval('tollgate_fence_seq'), $2, $3, $4, 'active')",
        )
        .bind(a)
        .bind(floor)
        .bind(sub)
        .bind(bound)
    };
    let max = InstantPair::MAX;
    let min = InstantPair::MIN;
    let cases: [ConstraintCase; 9] = [
        (max.floor_us, Some(max.submicro_ns), Some(false), None),
        (min.floor_us, Some(min.submicro_ns), Some(false), None),
        (-1, Some(999), Some(false), None),
        (max.floor_us + 1, Some(0), Some(false), Some("23514")),
        (min.floor_us - 1, Some(999), Some(false), Some("23514")),
        (0, Some(1_000), Some(false), Some("23514")),
        (0, Some(-1), Some(false), Some("23514")),
        (0, None, Some(false), Some("23502")),
        (0, Some(0), None, Some("23502")),
    ];
    for (floor, sub, bound, expected) in cases {
        let result = insert(floor, sub, bound).execute(&mut c).await;
        match expected {
            None => assert!(result.is_ok(), "({floor}, {sub:?}) refused: {result:?}"),
            Some(code) => {
                let err = result.unwrap_err();
                assert_eq!(
                    legacy::sqlstate(&err).as_deref(),
                    Some(code),
                    "({floor}, {sub:?}, {bound:?}): {err}"
                );
            }
        }
    }
}

#[tokio::test]
async fn pending_migrations_and_versions() {
    let db = support::fresh_db().await;
    let all = tollgate_pg::pending_migrations(db.url()).await.unwrap();
    assert_eq!(
        all.iter().map(|m| m.version).collect::<Vec<_>>(),
        (1..=21).collect::<Vec<i64>>()
    );
    assert_eq!(all[16].description, "exact instants");
    assert_eq!(all[17].description, "safe time");
    assert_eq!(all[18].description, "lease write guard");
    assert_eq!(all[19].description, "seal covers active leases");
    assert_eq!(all[20].description, "publish at observation");
    assert_eq!(all[0].description, "accounts");
    Schema::through(16)
        .unwrap()
        .migrate(db.url())
        .await
        .unwrap();
    let pending = tollgate_pg::pending_migrations(db.url()).await.unwrap();
    assert_eq!(
        pending,
        vec![
            tollgate_pg::PendingMigration {
                version: 17,
                description: "exact instants".into()
            },
            tollgate_pg::PendingMigration {
                version: 18,
                description: "safe time".into()
            },
            tollgate_pg::PendingMigration {
                version: 19,
                description: "lease write guard".into()
            },
            tollgate_pg::PendingMigration {
                version: 20,
                description: "seal covers active leases".into()
            },
            tollgate_pg::PendingMigration {
                version: 21,
                description: "publish at observation".into()
            }
        ]
    );
    migrate_17(&db).await;
    assert_eq!(
        tollgate_pg::pending_migrations(db.url()).await.unwrap(),
        vec![]
    );
    // Running it again applies nothing.
    let again = tollgate_pg::migrate(db.url()).await.unwrap();
    assert_eq!(
        (again.from_version, again.to_version, again.applied),
        (Some(21), Some(21), vec![])
    );
    assert_eq!(
        Schema::through(22).unwrap_err(),
        StorageError::Failure {
            message: "this binary has no migration version 22".into()
        }
    );
    assert_eq!(
        Schema::current().latest_version(),
        tollgate_pg::PUBLISH_AT_OBSERVATION_VERSION
    );
}

#[test]
fn migration_0017_domain_literals_are_the_encoded_timestamp_bounds() {
    let sql = include_str!("../migrations/0017_exact_instants.sql");
    let min = format!(
        "({}, {})",
        InstantPair::MIN.floor_us,
        InstantPair::MIN.submicro_ns
    );
    let max = format!(
        "({}, {})",
        InstantPair::MAX.floor_us,
        InstantPair::MAX.submicro_ns
    );
    assert_eq!(min, "(-377705023201000000, 0)");
    assert_eq!(max, "(253402207200999999, 999)");
    // Every tuple literal in the migration is one of the two bounds.
    let literals: Vec<&str> = sql
        .match_indices("(-3")
        .chain(sql.match_indices("(25"))
        .map(|(i, _)| &sql[i..i + sql[i..].find(')').unwrap() + 1])
        .collect();
    assert!(!literals.is_empty());
    for lit in &literals {
        assert!(*lit == min || *lit == max, "unexpected literal {lit}");
    }
    assert_eq!(literals.iter().filter(|l| **l == min).count(), 13);
    assert_eq!(literals.iter().filter(|l| **l == max).count(), 13);
    // The same constants bound the comments' description.
    assert!(sql.contains(&format!("[{min}, {max}]")));
}
