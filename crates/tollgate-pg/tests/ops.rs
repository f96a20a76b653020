//! `tollgate_pg::ops` inside a caller's own transaction: the caller's rows
//! and the allocator's commit together or not at all. A rolled-back
//! transaction leaves balances, leases, ledger and idempotency records
//! exactly as before, and the fence sequence only one number further (a
//! sequence is never rolled back: the number is skipped, never reused); a
//! committed one leaves both with exact values.

mod support;

use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgConnection, Row};
use tollgate::{
    AccountId, AcquireRequest, Allocator, Balances, Fence, GrantPolicy, LeaseState, LedgerKind,
    RuleError,
};
use tollgate_pg::PostgresStore;
use tollgate_pg::ops::{self, TxError};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn bal(deposited: i64, available: i64, held: i64, consumed: i64) -> Balances {
    Balances {
        deposited,
        available,
        held,
        consumed,
    }
}

/// Everything of the allocator's state a caller's transaction could leave
/// behind, read outside any transaction.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    balances: Balances,
    leases: Vec<(i64, String, i64)>,
    ledger_kinds: Vec<String>,
    idempotency_records: i64,
    admissions: Vec<(i64, String, Option<i64>)>,
    fence_last_value: i64,
}

async fn snapshot(s: &PostgresStore, conn: &mut PgConnection, a: AccountId) -> Snapshot {
    let leases: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT lease_id, state, fence FROM tollgate_leases ORDER BY lease_id")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let ledger_kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM tollgate_ledger ORDER BY seq")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let idempotency_records: i64 = sqlx::query_scalar("SELECT count(*) FROM tollgate_idempotency")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let admissions: Vec<(i64, String, Option<i64>)> =
        sqlx::query_as("SELECT admission_id, note, lease_id FROM admissions ORDER BY admission_id")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    // The last fence drawn (0 before the first): `last_value` counts only
    // once `is_called`.
    let fence_last_value: i64 = sqlx::query(
        "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END \
           FROM tollgate_fence_seq",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
    .get(0);
    Snapshot {
        balances: s.account(a).await.unwrap().balances,
        leases,
        ledger_kinds,
        idempotency_records,
        admissions,
        fence_last_value,
    }
}

async fn admit(conn: &mut PgConnection, id: i64, note: &str, lease_id: Option<i64>) {
    let done =
        sqlx::query("INSERT INTO admissions (admission_id, note, lease_id) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(note)
            .bind(lease_id)
            .execute(&mut *conn)
            .await
            .unwrap();
    assert_eq!(done.rows_affected(), 1);
}

/// One database with an account of 100 units and the caller's own table.
struct Fixture {
    s: PostgresStore,
    reader: PgConnection,
    a: AccountId,
    req: AcquireRequest,
    t0: Timestamp,
}

async fn fixture() -> Fixture {
    let db = support::migrated_db().await;
    let policy =
        GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(1)).unwrap();
    let s = support::store_on(&db, policy, support::test_key()).await;
    let mut reader = support::connect(&db).await;
    sqlx::query(
        "CREATE TABLE admissions (admission_id bigint PRIMARY KEY, note text NOT NULL, \
         lease_id bigint)",
    )
    .execute(&mut reader)
    .await
    .unwrap();
    let t0 = ts("2026-11-29T12:00:00.123456789Z");
    let a = tollgate::testkit::new_account(&s, "lc", 100, t0).await;
    let req = AcquireRequest {
        account_id: a,
        units: 10,
        ttl: SignedDuration::new(30, 1),
        idempotency_key: Some("admission-1".into()),
    };
    Fixture {
        s,
        reader,
        a,
        req,
        t0,
    }
}

impl Fixture {
    async fn snapshot(&mut self) -> Snapshot {
        snapshot(&self.s, &mut self.reader, self.a).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_transaction_commits_its_rows_and_the_reservation_together() {
    let mut f = fixture().await;
    let start = f.snapshot().await;
    assert_eq!(start.balances, bal(100, 100, 0, 0));
    assert_eq!(start.ledger_kinds, ["deposit"]);
    assert!(start.leases.is_empty() && start.admissions.is_empty());
    let start = a_rolled_back_acquire_leaves_only_a_skipped_fence(&mut f, start).await;
    let (grant, committed) =
        a_committed_acquire_and_the_callers_row_are_both_there(&mut f, start).await;
    a_refusal_rolls_back_with_the_callers_row(&mut f, &committed).await;
    renew_and_release_join_the_callers_transaction(&mut f, &grant, committed).await;
    let report = f.s.audit().await.unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    f.reader.close().await.unwrap();
    f.s.close().await;
}

/// Rolled back: nothing of either remains, and the one fence the grant
/// drew is skipped. Returns the state after.
async fn a_rolled_back_acquire_leaves_only_a_skipped_fence(
    f: &mut Fixture,
    start: Snapshot,
) -> Snapshot {
    let mut tx = f.s.pool().begin().await.unwrap();
    admit(&mut tx, 1, "first try", None).await;
    let aborted = ops::acquire(&mut tx, &f.s, &f.req, f.t0.into())
        .await
        .unwrap();
    assert_eq!(aborted.fence, Fence(start.fence_last_value + 1));
    tx.rollback().await.unwrap();
    let after_rollback = f.snapshot().await;
    let expected = Snapshot {
        fence_last_value: start.fence_last_value + 1,
        ..start
    };
    assert_eq!(after_rollback, expected);
    after_rollback
}

/// Committed: both are there, with exact values. The key was never
/// recorded by the rolled-back try, so the same request is a new grant; a
/// retry of it then replays. Returns the grant and the state after.
async fn a_committed_acquire_and_the_callers_row_are_both_there(
    f: &mut Fixture,
    before: Snapshot,
) -> (tollgate::Grant, Snapshot) {
    let (s, t0) = (&f.s, f.t0);
    let mut tx = s.pool().begin().await.unwrap();
    let grant = ops::acquire(&mut tx, s, &f.req, t0.into()).await.unwrap();
    admit(&mut tx, 1, "admitted", Some(grant.lease_id.0)).await;
    tx.commit().await.unwrap();
    assert_eq!(grant.units, 10);
    assert_eq!(grant.fence, Fence(before.fence_last_value + 1));
    assert_eq!(grant.expiry, ts("2026-11-29T12:00:30.123456790Z"));
    assert_eq!(grant.granted_ttl, SignedDuration::new(30, 1));
    let committed = f.snapshot().await;
    assert_eq!(committed.balances, bal(100, 90, 10, 0));
    assert_eq!(
        committed.leases,
        [(grant.lease_id.0, "active".to_string(), grant.fence.0)]
    );
    assert_eq!(committed.ledger_kinds, ["deposit", "acquire"]);
    assert_eq!(committed.idempotency_records, 1);
    assert_eq!(
        committed.admissions,
        [(1, "admitted".to_string(), Some(grant.lease_id.0))]
    );
    let s = &f.s;
    let lease = s.lease(grant.lease_id, &grant.capability).await.unwrap();
    assert_eq!(
        (lease.units, lease.fence, lease.expiry, lease.state),
        (10, grant.fence, grant.expiry, LeaseState::Active)
    );
    let entry = s.ledger(1, 10).await.unwrap().pop().unwrap();
    assert_eq!(
        (
            entry.kind,
            entry.lease_id,
            entry.units,
            entry.before,
            entry.after,
            entry.fence,
            entry.expiry,
            entry.at
        ),
        (
            LedgerKind::Acquire,
            Some(grant.lease_id),
            10,
            bal(100, 100, 0, 0),
            bal(100, 90, 10, 0),
            Some(grant.fence),
            Some(grant.expiry),
            t0
        )
    );
    let mut tx = s.pool().begin().await.unwrap();
    assert_eq!(
        ops::acquire(&mut tx, s, &f.req, t0.into()).await.unwrap(),
        grant
    );
    tx.commit().await.unwrap();
    assert_eq!(f.snapshot().await, committed);
    (grant, committed)
}

/// A refusal inside the caller's transaction: the caller rolls back and its
/// own row goes with it.
async fn a_refusal_rolls_back_with_the_callers_row(f: &mut Fixture, committed: &Snapshot) {
    let mut tx = f.s.pool().begin().await.unwrap();
    admit(&mut tx, 2, "too big", None).await;
    let too_big = AcquireRequest {
        units: 91,
        idempotency_key: None,
        ..f.req.clone()
    };
    let err = ops::acquire(&mut tx, &f.s, &too_big, f.t0.into())
        .await
        .unwrap_err();
    assert!(!err.is_retryable());
    let TxError::Rule(rule) = err else {
        panic!("expected a rule refusal, got {err:?}")
    };
    assert_eq!(
        rule,
        RuleError::InsufficientBalance {
            account_id: f.a,
            requested: 91,
            available: 90,
        }
    );
    tx.rollback().await.unwrap();
    assert_eq!(&f.snapshot().await, committed);
}

/// Renew and release join a caller's transaction the same way: rolled
/// back, the lease keeps its expiry and fence (one fence skipped);
/// committed, it is released with exact balances.
async fn renew_and_release_join_the_callers_transaction(
    f: &mut Fixture,
    grant: &tollgate::Grant,
    committed: Snapshot,
) {
    let s = &f.s;
    let t1 = ts("2026-11-29T12:00:10Z");
    let (id, cap) = (grant.lease_id, &grant.capability);
    let mut tx = s.pool().begin().await.unwrap();
    let renewal = ops::renew(
        &mut tx,
        s,
        id,
        cap,
        SignedDuration::from_secs(50),
        t1.into(),
    )
    .await
    .unwrap();
    assert_eq!(renewal.lease.expiry, ts("2026-11-29T12:01:00Z"));
    let settlement = ops::release(&mut tx, s, id, cap, t1, Some(4))
        .await
        .unwrap();
    assert_eq!(settlement.balances, bal(100, 96, 0, 4));
    admit(&mut tx, 3, "done", Some(id.0)).await;
    tx.rollback().await.unwrap();
    let expected = Snapshot {
        fence_last_value: committed.fence_last_value + 1,
        ..committed
    };
    assert_eq!(f.snapshot().await, expected);
    let s = &f.s;
    let lease = s.lease(id, cap).await.unwrap();
    assert_eq!((lease.expiry, lease.fence), (grant.expiry, grant.fence));

    let mut tx = s.pool().begin().await.unwrap();
    let settlement = ops::release(&mut tx, s, id, cap, t1, Some(4))
        .await
        .unwrap();
    admit(&mut tx, 3, "done", Some(id.0)).await;
    tx.commit().await.unwrap();
    assert_eq!(
        (
            settlement.consumed,
            settlement.returned,
            settlement.balances
        ),
        (4, 6, bal(100, 96, 0, 4))
    );
    let done = f.snapshot().await;
    assert_eq!(done.balances, bal(100, 96, 0, 4));
    assert_eq!(done.leases, [(id.0, "released".to_string(), grant.fence.0)]);
    assert_eq!(done.ledger_kinds, ["deposit", "acquire", "release"]);
    assert_eq!(
        done.admissions,
        [
            (1, "admitted".to_string(), Some(id.0)),
            (3, "done".to_string(), Some(id.0))
        ]
    );
}
