//! Failures: a statement failing anywhere leaves accounts, leases and
//! ledger exactly as before; serialization failures and deadlocks are
//! retried a bounded number of times; connection failures are
//! `Unavailable`; no message leaks the URL or its password.
//!
//! Failures are injected with a trigger on `tollgate_ledger` (the last
//! table each operation writes), so every earlier statement of the
//! operation has run when it fails.

mod support;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgConnection};
use tollgate::{
    AcquireRequest, Allocator, Balances, CapabilityKey, GrantPolicy, LeaseId, RuleError,
    StorageError,
};
use tollgate_pg::{Op, OpStats, PostgresStore, StoreOptions, TX_ATTEMPTS_MAX};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(1)).unwrap()
}

/// Makes every ledger insert fail with SQLSTATE `code` while the first
/// `failures` inserts (counted by a sequence, which rollbacks do not
/// undo) have not yet failed; `failures = None` fails forever.
async fn inject(c: &mut PgConnection, code: &str, failures: Option<i64>) {
    let limit = failures.map_or("true".to_string(), |n| {
        format!("nextval('tg_injected_failures') <= {n}")
    });
    for sql in [
        "DROP TRIGGER IF EXISTS tg_inject ON tollgate_ledger".to_string(),
        "DROP SEQUENCE IF EXISTS tg_injected_failures".to_string(),
        "CREATE SEQUENCE tg_injected_failures".to_string(),
        format!(
            "CREATE OR REPLACE FUNCTION tg_inject() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF {limit} THEN RAISE EXCEPTION 'injected failure' USING ERRCODE = '{code}'; \
             END IF; RETURN NEW; END $$"
        ),
        "CREATE TRIGGER tg_inject BEFORE INSERT ON tollgate_ledger \
         FOR EACH STATEMENT EXECUTE FUNCTION tg_inject()"
            .to_string(),
    ] {
        sqlx::query(&sql).execute(&mut *c).await.unwrap();
    }
}

async fn uninject(c: &mut PgConnection) {
    sqlx::query("DROP TRIGGER tg_inject ON tollgate_ledger")
        .execute(&mut *c)
        .await
        .unwrap();
}

/// Every row of the store's tables except sequences.
async fn dump(c: &mut PgConnection) -> Vec<String> {
    let mut out = Vec::new();
    for table in [
        "tollgate_accounts",
        "tollgate_account_keys",
        "tollgate_leases",
        "tollgate_ledger",
        "tollgate_idempotency",
        "tollgate_policy",
    ] {
        let rows: Vec<String> =
            sqlx::query_scalar(&format!("SELECT t::text FROM {table} t ORDER BY t::text"))
                .fetch_all(&mut *c)
                .await
                .unwrap();
        out.extend(rows.into_iter().map(|r| format!("{table}: {r}")));
    }
    out
}

#[tokio::test]
async fn a_failing_last_statement_leaves_everything_as_before() {
    let db = support::migrated_db().await;
    let s = support::store_on(&db, policy(), support::test_key()).await;
    let mut c = support::connect(&db).await;
    let t0 = ts("2026-11-29T12:00:00Z");
    let a = tollgate::testkit::new_account(&s, "a", 100, t0).await;
    let g1 = tollgate::testkit::acquire(&s, a, 10, SignedDuration::from_secs(10), t0).await;
    let g2 = tollgate::testkit::acquire(&s, a, 20, SignedDuration::from_secs(10), t0).await;
    let before = dump(&mut c).await;
    let later = ts("2026-11-29T12:00:05Z");
    let due = ts("2026-11-29T12:00:11Z");

    inject(&mut c, "P0001", None).await;
    let injected = StorageError::Failure {
        message: "injected failure (SQLSTATE P0001)".into(),
    };
    assert_eq!(s.deposit(a, 5, later).await.unwrap_err(), injected);
    let req = AcquireRequest {
        account_id: a,
        units: 5,
        ttl: SignedDuration::new(3, 3),
        idempotency_key: Some("k".into()),
    };
    assert_eq!(
        s.acquire(req.clone(), later.into()).await.unwrap_err(),
        injected
    );
    assert_eq!(
        s.renew(
            g1.lease_id,
            &g1.capability,
            SignedDuration::from_secs(30),
            later.into()
        )
        .await
        .unwrap_err(),
        injected
    );
    assert_eq!(
        s.release(g1.lease_id, &g1.capability, later, Some(3))
            .await
            .unwrap_err(),
        injected
    );
    assert_eq!(
        s.consolidate(
            a,
            &[
                (g1.lease_id, g1.capability.clone()),
                (g2.lease_id, g2.capability.clone())
            ],
            SignedDuration::from_secs(30),
            later.into()
        )
        .await
        .unwrap_err(),
        injected
    );
    assert_eq!(s.reclaim(due, 10).await.unwrap_err(), injected);
    assert_eq!(dump(&mut c).await, before);
    for op in [
        Op::Deposit,
        Op::Acquire,
        Op::Renew,
        Op::Release,
        Op::Consolidate,
        Op::Reclaim,
    ] {
        assert_eq!(
            s.op_stats(op).failed,
            1,
            "{} must fail once without retries",
            op.as_str()
        );
        assert_eq!(s.op_stats(op).retried, 0);
    }

    // Without the fault the same requests succeed.
    uninject(&mut c).await;
    let g3 = s.acquire(req, later.into()).await.unwrap();
    assert_eq!(g3.expiry, ts("2026-11-29T12:00:08.000000003Z"));
    let r = s.reclaim(due, 10).await.unwrap();
    assert_eq!(r.reclaimed, vec![g1.lease_id, g2.lease_id, g3.lease_id]);
    assert_eq!(
        s.account(a).await.unwrap().balances,
        Balances {
            deposited: 100,
            available: 65,
            held: 0,
            consumed: 35
        }
    );
}

#[tokio::test]
async fn a_failing_key_insert_rolls_back_the_new_account() {
    let db = support::migrated_db().await;
    let s = support::store_on(&db, policy(), support::test_key()).await;
    let mut c = support::connect(&db).await;
    sqlx::query(
        "CREATE FUNCTION tg_fail_key() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'injected key failure' USING ERRCODE = 'P0001'; END $$",
    )
    .execute(&mut c)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER tg_fail_key BEFORE INSERT ON tollgate_account_keys \
         FOR EACH ROW EXECUTE FUNCTION tg_fail_key()",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let err = s
        .create_account(tollgate::NewAccount {
            name: "keyed".into(),
            api_key_sha256: Some([7; 32]),
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::Failure {
            message: "injected key failure (SQLSTATE P0001)".into()
        }
    );
    assert_eq!(s.accounts(None, 10).await.unwrap(), vec![]);
}

#[tokio::test]
async fn serialization_failures_and_deadlocks_are_retried_then_exhausted() {
    let db = support::migrated_db().await;
    let s = support::store_on(&db, policy(), support::test_key()).await;
    let mut c = support::connect(&db).await;
    let t0 = ts("2026-11-29T12:00:00Z");
    let a = tollgate::testkit::new_account(&s, "a", 100, t0).await;
    assert_eq!(
        s.op_stats(Op::Deposit),
        OpStats {
            committed: 1,
            retried: 0,
            failed: 0
        }
    );

    // Always failing: exhausted after TX_ATTEMPTS_MAX attempts.
    for code in ["40001", "40P01"] {
        inject(&mut c, code, None).await;
        assert_eq!(
            s.deposit(a, 1, t0).await.unwrap_err(),
            StorageError::RetryExhausted {
                attempts: TX_ATTEMPTS_MAX
            }
        );
    }
    assert_eq!(TX_ATTEMPTS_MAX, 8);
    assert_eq!(
        s.op_stats(Op::Deposit),
        OpStats {
            committed: 1,
            retried: 14,
            failed: 2
        }
    );
    // Failing three times: the fourth attempt commits, once.
    inject(&mut c, "40001", Some(3)).await;
    let acct = s.deposit(a, 1, t0).await.unwrap();
    assert_eq!(
        acct.balances,
        Balances {
            deposited: 101,
            available: 101,
            held: 0,
            consumed: 0
        }
    );
    assert_eq!(
        s.op_stats(Op::Deposit),
        OpStats {
            committed: 2,
            retried: 17,
            failed: 2
        }
    );
    assert_eq!(tollgate::testkit::ledger_kinds(&s).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_deadlock_is_retried_and_the_release_settles_once() {
    let db = support::migrated_db().await;
    let s = std::sync::Arc::new(support::store_on(&db, policy(), support::test_key()).await);
    let t0 = ts("2026-11-29T12:00:00Z");
    let a = tollgate::testkit::new_account(&*s, "a", 100, t0).await;
    let g = tollgate::testkit::acquire(&*s, a, 10, SignedDuration::from_secs(10), t0).await;

    // Another session holds the lease row...
    let mut other = support::connect(&db).await;
    // ...and checks for deadlocks only long after the release does, so the
    // release's backend is the one that finds the cycle and is aborted
    // (PostgreSQL aborts the session whose deadlock check runs first).
    sqlx::query("SET deadlock_timeout = '60s'")
        .execute(&mut other)
        .await
        .unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tollgate_leases WHERE lease_id = $1 FOR UPDATE")
        .bind(g.lease_id.0)
        .execute(&mut *tx)
        .await
        .unwrap();
    // ...while the release locks the account and waits for the lease.
    let release = {
        let (s, g) = (s.clone(), g.clone());
        tokio::spawn(async move { s.release(g.lease_id, &g.capability, t0, Some(4)).await })
    };
    let mut observer = support::connect(&db).await;
    let other_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(other_pid)
        .fetch_one(&mut observer)
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "release never waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Now close the cycle: the other session wants the account. The
    // release waited first, so its deadlock check (after deadlock_timeout)
    // finds the cycle and aborts it; the other session then gets the row.
    sqlx::query("SELECT 1 FROM tollgate_accounts WHERE account_id = $1 FOR UPDATE")
        .bind(a.0)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(20), release)
        .await
        .expect("release did not finish")
        .unwrap()
        .unwrap();
    assert_eq!(
        (settled.consumed, settled.returned, settled.balances),
        (
            4,
            6,
            Balances {
                deposited: 100,
                available: 96,
                held: 0,
                consumed: 4
            }
        )
    );
    assert_eq!(
        s.op_stats(Op::Release),
        OpStats {
            committed: 1,
            retried: 1,
            failed: 0
        }
    );
    let kinds = tollgate::testkit::ledger_kinds(&*s).await;
    assert_eq!(kinds.len(), 3);
}

#[tokio::test]
async fn unreachable_database_is_unavailable_without_leaking_the_url() {
    let url = "postgres://tollgate:s3cret-pw@127.0.0.1:1/tollgate";
    let options = StoreOptions {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(2),
        on_safe_cut: false,
    };
    let err = PostgresStore::connect_with(url, policy(), support::test_key(), options)
        .await
        .unwrap_err();
    let StorageError::Unavailable { message } = &err else {
        panic!("expected unavailable, got {err:?}");
    };
    for secret in ["s3cret-pw", "tollgate:", "127.0.0.1:1"] {
        assert!(!message.contains(secret), "{message}");
    }
    let err = tollgate_pg::migrate(url).await.unwrap_err();
    assert_eq!(err.code(), "storage_unavailable");
    assert!(!err.to_string().contains("s3cret-pw"), "{err}");
    assert_eq!(
        PostgresStore::connect("not a url", policy(), support::test_key())
            .await
            .unwrap_err(),
        StorageError::Failure {
            message: "invalid database url".into()
        }
    );
    assert_eq!(
        tollgate_pg::migrate("postgres://x:s3cret@[::1")
            .await
            .unwrap_err(),
        StorageError::Failure {
            message: "invalid database url".into()
        }
    );
}

#[tokio::test]
async fn an_unmigrated_database_is_refused() {
    let db = support::fresh_db().await;
    let err = PostgresStore::connect(db.url(), policy(), support::test_key())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::Failure {
            message: "database schema is at version 0 but this binary requires version 21; \
                      pending migrations: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, \
                      16, 17, 18, 19, 20, 21; run the migrations first"
                .into()
        }
    );
}

#[tokio::test]
async fn capabilities_are_checked_before_the_database_is_touched() {
    let db = support::migrated_db().await;
    let s = support::store_on(&db, policy(), support::test_key()).await;
    let t0 = ts("2026-11-29T12:00:00Z");
    let a = tollgate::testkit::new_account(&s, "a", 100, t0).await;
    let g = tollgate::testkit::acquire(&s, a, 10, SignedDuration::from_secs(10), t0).await;
    let before = OpStats::default();
    let forged = CapabilityKey::new(&[1; 32])
        .unwrap()
        .derive(s.store_id(), g.lease_id);
    assert_eq!(
        s.release(g.lease_id, &forged, t0, None).await.unwrap_err(),
        RuleError::CapabilityMismatch
    );
    assert_eq!(
        s.lease(LeaseId(999), &forged).await.unwrap_err(),
        RuleError::CapabilityMismatch
    );
    // No transaction ran for either.
    assert_eq!(s.op_stats(Op::Release), before);
    assert_eq!(s.op_stats(Op::ReadLease), before);
}
