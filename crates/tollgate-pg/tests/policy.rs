//! The recorded grant policy: recorded by the first start, enforced on every
//! later start and by every reclaim batch, changed only by the explicit
//! operator command, which is recorded.

mod support;

use jiff::{SignedDuration, Timestamp};
use sqlx::PgPool;
use tollgate::{Allocator, GrantPolicy, LeaseState, StorageError};
use tollgate_pg::{FIRST_START, PolicyChange, PostgresStore};

fn p(ttl: SignedDuration, grace: SignedDuration) -> GrantPolicy {
    GrantPolicy::new(ttl, grace).unwrap()
}

fn without_time(c: &PolicyChange) -> (i64, String, Option<GrantPolicy>, GrantPolicy) {
    (c.change_id, c.changed_by.clone(), c.old, c.new)
}

#[tokio::test]
async fn first_start_records_later_starts_must_match_and_changes_are_recorded() {
    let db = support::migrated_db().await;
    let p1 = p(SignedDuration::from_secs(60), SignedDuration::from_secs(5));
    let s1 = support::store_on(&db, p1, support::test_key()).await;
    let pool = PgPool::connect(db.url()).await.unwrap();
    assert_eq!(tollgate_pg::recorded_policy(&pool).await.unwrap(), Some(p1));
    let changes = tollgate_pg::policy_changes(&pool).await.unwrap();
    assert_eq!(
        changes.iter().map(without_time).collect::<Vec<_>>(),
        vec![(1, FIRST_START.to_string(), None, p1)]
    );

    // Same policy: accepted. A different grace (by one nanosecond) or
    // max_ttl: refused, naming both.
    support::store_on(&db, p1, support::test_key()).await;
    let p2 = p(SignedDuration::from_secs(60), SignedDuration::new(5, 1));
    let err = PostgresStore::connect_with(db.url(), p2, support::test_key(), support::TEST_OPTIONS)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::PolicyMismatch(
            "the database records max_ttl PT1M and reclaim_grace PT5S, but this process is \
             configured with max_ttl PT1M and reclaim_grace PT5.000000001S; every process sharing \
             these grants must apply the same policy: change the recorded one only with the \
             explicit policy command"
                .into()
        )
    );
    let p3 = p(SignedDuration::new(0, 999), SignedDuration::from_secs(5));
    let err = PostgresStore::connect_with(db.url(), p3, support::test_key(), support::TEST_OPTIONS)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "policy_mismatch");
    assert!(
        err.to_string().contains("records max_ttl PT1M")
            && err
                .to_string()
                .contains("configured with max_ttl PT0.000000999S"),
        "{err}"
    );

    // A lease of the running store becomes due under p1.
    let t0: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
    let a = tollgate::testkit::new_account(&s1, "a", 10, t0).await;
    let g = tollgate::testkit::acquire(&s1, a, 10, SignedDuration::from_secs(1), t0).await;

    // The operator changes the grace; the change is recorded.
    let change = tollgate_pg::set_policy(&pool, p2, "ops: alice")
        .await
        .unwrap();
    assert_eq!(
        without_time(&change),
        (2, "ops: alice".to_string(), Some(p1), p2)
    );
    assert_eq!(
        tollgate_pg::policy_changes(&pool)
            .await
            .unwrap()
            .iter()
            .map(without_time)
            .collect::<Vec<_>>(),
        vec![
            (1, FIRST_START.to_string(), None, p1),
            (2, "ops: alice".to_string(), Some(p1), p2)
        ]
    );
    // Now p2 starts and p1 is refused.
    support::store_on(&db, p2, support::test_key()).await;
    let err = PostgresStore::connect_with(db.url(), p1, support::test_key(), support::TEST_OPTIONS)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "policy_mismatch");
    // The still-running p1 process must not reclaim with its old grace.
    let due_under_p1 = "2026-11-29T12:00:06Z".parse().unwrap();
    assert_eq!(
        s1.reclaim(due_under_p1, 10).await.unwrap_err().code(),
        "policy_mismatch"
    );
    assert_eq!(
        s1.lease(g.lease_id, &g.capability).await.unwrap().state,
        LeaseState::Active
    );
    // Invalid operator names are refused before anything changes.
    for bad in ["", "  ", "a\nb"] {
        assert_eq!(
            tollgate_pg::set_policy(&pool, p1, bad).await.unwrap_err(),
            StorageError::Failure {
                message: "changed_by must be 1..=200 characters without control characters".into()
            }
        );
    }
    assert_eq!(tollgate_pg::recorded_policy(&pool).await.unwrap(), Some(p2));
    pool.close().await;
}

#[tokio::test]
async fn extreme_durations_are_recorded_exactly() {
    let db = support::migrated_db().await;
    let extreme = p(SignedDuration::new(0, 1), SignedDuration::MAX);
    let s = support::store_on(&db, extreme, support::test_key()).await;
    assert_eq!(s.policy(), extreme);
    let pool = PgPool::connect(db.url()).await.unwrap();
    assert_eq!(
        tollgate_pg::recorded_policy(&pool).await.unwrap(),
        Some(extreme)
    );
    let row: (i64, i32, i64, i32) = sqlx::query_as(
        "SELECT max_ttl_secs, max_ttl_nanos, reclaim_grace_secs, reclaim_grace_nanos \
         FROM tollgate_policy",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row, (0, 1, i64::MAX, 999_999_999));
    // A second process with the same extreme policy starts.
    support::store_on(&db, extreme, support::test_key()).await;
    // Grace MAX: nothing is ever due, and reclaim asks nothing.
    let r = s.reclaim(Timestamp::MAX, 10).await.unwrap();
    assert_eq!((r.cutoff, r.reclaimed.len()), (None, 0));
    pool.close().await;
}
