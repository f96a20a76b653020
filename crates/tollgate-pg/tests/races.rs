//! Races against a real server: operations on the same lease settle it
//! exactly once; concurrent acquires never overdraw; concurrent reclaim
//! workers never settle a lease twice.
//!
//! Iteration counts are bounded so the suite stays within CI's budget on
//! two cores while still interleaving each race many times.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use tokio::sync::Barrier;
use tollgate::{
    AcquireRequest, Allocator, Balances, GrantPolicy, LeaseId, LeaseState, LedgerKind, RuleError,
};
use tollgate_pg::PostgresStore;

/// Iterations of the four-way settlement race.
const SETTLE_RACE_ITERATIONS: usize = 60;
/// Iterations of the overdraw race, and acquirers per iteration.
const OVERDRAW_ITERATIONS: usize = 20;
const OVERDRAW_TASKS: usize = 16;
/// Rounds of the reclaim-worker race, leases per round, workers.
const RECLAIM_ROUNDS: usize = 4;
const RECLAIM_ACCOUNTS: usize = 3;
const RECLAIM_LEASES_PER_ACCOUNT: usize = 60;
const RECLAIM_WORKERS: usize = 4;
const RECLAIM_BATCH: usize = 16;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

async fn store(policy: GrantPolicy) -> Arc<PostgresStore> {
    let db = support::migrated_db().await;
    Arc::new(support::store_on(&db, policy, support::test_key()).await)
}

#[derive(Debug, Default)]
struct Outcomes {
    released: usize,
    consolidated: usize,
    reclaimed: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_renew_consolidate_reclaim_settle_each_lease_exactly_once() {
    let grace = SignedDuration::from_secs(1);
    let policy = GrantPolicy::new(SignedDuration::from_secs(60), grace).unwrap();
    let s = store(policy).await;
    let t0 = ts("2026-11-29T12:00:00.000000001Z");
    let ttl = SignedDuration::new(10, 5);
    let mut outcomes = Outcomes::default();
    for i in 0..SETTLE_RACE_ITERATIONS {
        let a = tollgate::testkit::new_account(&*s, &format!("race-{i}"), 10, t0).await;
        let g = tollgate::testkit::acquire(&*s, a, 10, ttl, t0).await;
        let n1 = g.expiry; // releasable: n1 < expiry + grace
        let n2 = g.expiry.checked_add(grace).unwrap(); // reclaimable unless renewed
        let barrier = Arc::new(Barrier::new(4));
        let spawn_op = |op: u8| {
            let (s, g, barrier) = (s.clone(), g.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                match op {
                    0 => format!("{:?}", s.release(g.lease_id, &g.capability, n1, None).await),
                    1 => format!(
                        "{:?}",
                        s.renew(
                            g.lease_id,
                            &g.capability,
                            SignedDuration::from_secs(30),
                            n1.into()
                        )
                        .await
                        .map(|r| r.lease.state)
                    ),
                    2 => format!(
                        "{:?}",
                        s.consolidate(
                            a,
                            &[(g.lease_id, g.capability.clone())],
                            SignedDuration::from_secs(30),
                            n1.into()
                        )
                        .await
                        .map(|ng| ng.units)
                    ),
                    _ => format!("{:?}", s.reclaim(n2, 100).await.map(|r| r.reclaimed)),
                }
            })
        };
        let handles: Vec<_> = (0..4).map(spawn_op).collect();
        let mut results = Vec::new();
        for h in handles {
            results.push(h.await.unwrap());
        }
        let lease = s.lease(g.lease_id, &g.capability).await.unwrap();
        let entries: Vec<LedgerKind> = s
            .ledger(0, tollgate::AUDIT_PAGE_MAX)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.lease_id == Some(g.lease_id))
            .map(|e| e.kind)
            .filter(|k| {
                matches!(
                    k,
                    LedgerKind::Release | LedgerKind::Reclaim | LedgerKind::Consolidate
                )
            })
            .collect();
        assert_eq!(entries.len(), 1, "iteration {i}: {entries:?} {results:?}");
        let acct = s.account(a).await.unwrap().balances;
        match lease.state {
            LeaseState::Released => {
                outcomes.released += 1;
                assert_eq!(entries, [LedgerKind::Release]);
                assert!(results[0].starts_with("Ok("), "{results:?}");
                assert_eq!(
                    acct,
                    Balances {
                        deposited: 10,
                        available: 0,
                        held: 0,
                        consumed: 10
                    }
                );
            }
            LeaseState::Consolidated => {
                outcomes.consolidated += 1;
                assert_eq!(entries, [LedgerKind::Consolidate]);
                assert_eq!(results[2], "Ok(10)");
                assert_eq!(
                    acct,
                    Balances {
                        deposited: 10,
                        available: 0,
                        held: 10,
                        consumed: 0
                    }
                );
            }
            LeaseState::Reclaimed => {
                outcomes.reclaimed += 1;
                assert_eq!(entries, [LedgerKind::Reclaim]);
                assert_eq!(results[3], format!("Ok([{:?}])", g.lease_id));
                assert_eq!(
                    acct,
                    Balances {
                        deposited: 10,
                        available: 0,
                        held: 0,
                        consumed: 10
                    }
                );
            }
            LeaseState::Active => panic!("iteration {i}: nothing settled: {results:?}"),
        }
        // Every loser saw the settlement, never a second one.
        for (op, r) in results.iter().enumerate() {
            let won = match lease.state {
                LeaseState::Released => op == 0,
                LeaseState::Consolidated => op == 2,
                LeaseState::Reclaimed => op == 3,
                LeaseState::Active => false,
            };
            if won || op == 1 && r.starts_with("Ok(") {
                continue;
            }
            assert!(
                r.contains("LeaseNotActive") || r == "Ok([])",
                "iteration {i}, op {op}: {r}"
            );
        }
    }
    assert_eq!(
        outcomes.released + outcomes.consolidated + outcomes.reclaimed,
        SETTLE_RACE_ITERATIONS
    );
    let audit = s.audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    let n = SETTLE_RACE_ITERATIONS as i128;
    let held = 10 * outcomes.consolidated as i128;
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_available,
            audit.total_held,
            audit.total_consumed
        ),
        (10 * n, 0, held, 10 * n - held)
    );
    println!("settlement race outcomes: {outcomes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_acquires_never_overdraw() {
    let policy = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::ZERO).unwrap();
    let s = store(policy).await;
    let now = ts("2026-11-29T12:00:00Z");
    for i in 0..OVERDRAW_ITERATIONS {
        let a = tollgate::testkit::new_account(&*s, &format!("overdraw-{i}"), 100, now).await;
        let barrier = Arc::new(Barrier::new(OVERDRAW_TASKS));
        let handles: Vec<_> = (0..OVERDRAW_TASKS)
            .map(|_| {
                let (s, barrier) = (s.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    s.acquire(
                        AcquireRequest {
                            account_id: a,
                            units: 7,
                            ttl: SignedDuration::from_secs(30),
                            idempotency_key: None,
                        },
                        now.into(),
                    )
                    .await
                })
            })
            .collect();
        let mut granted = 0;
        for h in handles {
            match h.await.unwrap() {
                Ok(g) => {
                    assert_eq!(g.units, 7);
                    granted += 1;
                }
                Err(e) => assert_eq!(
                    e,
                    RuleError::InsufficientBalance {
                        account_id: a,
                        requested: 7,
                        available: 2
                    }
                ),
            }
        }
        assert_eq!(granted, 14, "iteration {i}");
        assert_eq!(
            s.account(a).await.unwrap().balances,
            Balances {
                deposited: 100,
                available: 2,
                held: 98,
                consumed: 0
            }
        );
    }
    let audit = s.audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    let n = OVERDRAW_ITERATIONS as i128;
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_available,
            audit.total_held,
            audit.total_consumed
        ),
        (100 * n, 2 * n, 98 * n, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reclaim_workers_never_settle_twice() {
    let grace = SignedDuration::new(0, 1);
    let policy = GrantPolicy::new(SignedDuration::from_secs(60), grace).unwrap();
    let s = store(policy).await;
    let t0 = ts("2026-11-29T12:00:00Z");
    let mut total_units: i128 = 0;
    for round in 0..RECLAIM_ROUNDS {
        let mut expected: BTreeSet<LeaseId> = BTreeSet::new();
        for acct in 0..RECLAIM_ACCOUNTS {
            let a = tollgate::testkit::new_account(
                &*s,
                &format!("reclaim-{round}-{acct}"),
                1_000_000,
                t0,
            )
            .await;
            for l in 0..RECLAIM_LEASES_PER_ACCOUNT {
                let ttl = SignedDuration::new(1, i32::try_from(l).unwrap());
                let g = tollgate::testkit::acquire(&*s, a, 1 + l as i64, ttl, t0).await;
                expected.insert(g.lease_id);
                total_units += i128::from(g.units);
            }
        }
        let now = ts("2026-11-29T12:00:02Z");
        let barrier = Arc::new(Barrier::new(RECLAIM_WORKERS));
        let workers: Vec<_> = (0..RECLAIM_WORKERS)
            .map(|_| {
                let (s, barrier) = (s.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let mut mine = Vec::new();
                    // Bounded: each productive batch settles at least one of
                    // a finite set of leases.
                    for _ in 0..RECLAIM_ACCOUNTS * RECLAIM_LEASES_PER_ACCOUNT {
                        let r = s.reclaim(now, RECLAIM_BATCH).await.unwrap();
                        if r.reclaimed.is_empty() {
                            break;
                        }
                        assert!(r.reclaimed.len() <= RECLAIM_BATCH);
                        mine.extend(r.reclaimed);
                    }
                    mine
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.await.unwrap());
        }
        // Workers may stop early while others hold the accounts they want;
        // a final sequential pass settles whatever is left.
        loop {
            let r = s.reclaim(now, RECLAIM_BATCH).await.unwrap();
            if r.reclaimed.is_empty() {
                break;
            }
            all.extend(r.reclaimed);
        }
        let unique: BTreeSet<LeaseId> = all.iter().copied().collect();
        assert_eq!(unique.len(), all.len(), "a lease was reported twice");
        assert_eq!(unique, expected);
    }
    let kinds = tollgate::testkit::ledger_kinds(&*s).await;
    let per_account = 1 + 2 * RECLAIM_LEASES_PER_ACCOUNT;
    assert_eq!(kinds.len(), RECLAIM_ROUNDS * RECLAIM_ACCOUNTS * per_account);
    assert_eq!(
        kinds.iter().filter(|k| **k == LedgerKind::Reclaim).count(),
        RECLAIM_ROUNDS * RECLAIM_ACCOUNTS * RECLAIM_LEASES_PER_ACCOUNT
    );
    let audit = s.audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    let deposited = (RECLAIM_ROUNDS * RECLAIM_ACCOUNTS) as i128 * 1_000_000;
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_available,
            audit.total_held,
            audit.total_consumed
        ),
        (deposited, deposited - total_units, 0, total_units)
    );
}
