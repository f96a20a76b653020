//! The conformance test cases. Each takes a [`StoreFactory`] and panics on
//! the first wrong value.

use jiff::{SignedDuration, Timestamp};

use super::*;
use crate::{Capability, LeaseId, LeaseState, RECLAIM_BATCH_MAX};

const NOW: &str = "2026-11-29T12:00:00.123456789Z";

fn grace_1_5s() -> SignedDuration {
    dur(1, 500_000_001)
}

fn p60(grace: SignedDuration) -> GrantPolicy {
    policy(dur(60, 0), grace)
}

/// A fractional TTL and the 1 ns part of a fractional grace survive
/// acquire, read-back and renewal exactly.
pub async fn fractional_ttl_precision(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(grace_1_5s()), 100, now).await;
    let g = acquire(&*s, a, 7, dur(30, 1), now).await;
    assert_eq!(g.expiry, ts("2026-11-29T12:00:30.12345679Z"));
    assert_eq!(g.granted_ttl, dur(30, 1));
    assert_eq!(g.units, 7);
    let l = s.lease(g.lease_id, &g.capability).await.unwrap();
    assert_eq!(l.expiry, g.expiry);
    assert!(!l.expiry_is_upper_bound);
    assert_eq!(l.state, LeaseState::Active);
    assert_eq!(l.fence, g.fence);
    let later = ts("2026-11-29T12:00:10.000000001Z");
    let r = s
        .renew(
            g.lease_id,
            &g.capability,
            dur(59, 999_999_999),
            later.into(),
        )
        .await
        .unwrap();
    assert_eq!(r.lease.expiry, ts("2026-11-29T12:01:10Z"));
    assert_eq!(r.granted_ttl, dur(59, 999_999_999));
    // The grace's last nanosecond decides: e + 1.500000001 s.
    let boundary = ts("2026-11-29T12:01:11.500000001Z");
    let before = boundary.checked_sub(dur(0, 1)).unwrap();
    let rep = s.reclaim(before, 10).await.unwrap();
    assert_eq!(rep.reclaimed, Vec::<LeaseId>::new());
    assert_eq!(rep.cutoff, Some(ts("2026-11-29T12:01:09.999999999Z")));
    assert_eq!(rep.late_by, Vec::<SignedDuration>::new());
    let rep = s.reclaim(boundary, 10).await.unwrap();
    assert_eq!(rep.reclaimed, vec![g.lease_id]);
    assert_eq!(rep.cutoff, Some(ts("2026-11-29T12:01:10Z")));
    // Reclaimed at the first instant the rule allows: late by nothing.
    assert_eq!(rep.late_by, vec![SignedDuration::ZERO]);
    assert_balances(&*s, a, (100, 93, 0, 7)).await;
}

/// A requested TTL is clamped to `max_ttl` and to nothing else.
pub async fn ttl_is_clamped_to_max_ttl_only(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, policy(dur(10, 5), SignedDuration::ZERO), 100, now).await;
    let g = acquire(&*s, a, 1, dur(10, 6), now).await;
    assert_eq!(g.granted_ttl, dur(10, 5));
    assert_eq!(g.expiry, ts("2026-11-29T12:00:10.123456794Z"));
    let g = acquire(&*s, a, 1, dur(10, 5), now).await;
    assert_eq!(g.granted_ttl, dur(10, 5));
    let g = acquire(&*s, a, 1, dur(0, 1), now).await;
    assert_eq!(g.granted_ttl, dur(0, 1));
    assert_eq!(g.expiry, ts("2026-11-29T12:00:00.12345679Z"));
    let g = acquire(&*s, a, 1, SignedDuration::MAX, now).await;
    assert_eq!(g.granted_ttl, dur(10, 5));
    assert_balances(&*s, a, (100, 96, 4, 0)).await;
}

/// Zero/negative units and TTLs, insufficient balance and unknown accounts
/// are typed errors that change nothing.
pub async fn invalid_input_changes_nothing(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, now).await;
    let req = |units: i64, ttl: SignedDuration| AcquireRequest {
        account_id: a,
        units,
        ttl,
        idempotency_key: None,
    };
    expect_code(
        s.acquire(req(0, dur(1, 0)), now.into()).await,
        "invalid_units",
    );
    expect_code(
        s.acquire(req(-1, dur(1, 0)), now.into()).await,
        "invalid_units",
    );
    expect_code(
        s.acquire(req(1, SignedDuration::ZERO), now.into()).await,
        "invalid_ttl",
    );
    expect_code(
        s.acquire(req(1, dur(0, -1)), now.into()).await,
        "invalid_ttl",
    );
    expect_code(
        s.acquire(req(1, SignedDuration::MIN), now.into()).await,
        "invalid_ttl",
    );
    expect_code(
        s.acquire(req(11, dur(1, 0)), now.into()).await,
        "insufficient_balance",
    );
    expect_code(
        s.acquire(req(i64::MAX, dur(1, 0)), now.into()).await,
        "insufficient_balance",
    );
    expect_code(
        s.acquire(
            AcquireRequest {
                account_id: AccountId(a.0 + 1000),
                ..req(1, dur(1, 0))
            },
            now.into(),
        )
        .await,
        "account_not_found",
    );
    expect_code(s.deposit(a, 0, now).await, "invalid_units");
    expect_code(s.deposit(a, -5, now).await, "invalid_units");
    expect_code(
        s.create_account(NewAccount {
            name: " ".into(),
            api_key_sha256: None,
        })
        .await,
        "invalid_account_name",
    );
    expect_code(
        s.create_account(NewAccount {
            name: "a\u{0}b".into(),
            api_key_sha256: None,
        })
        .await,
        "invalid_account_name",
    );
    expect_code(s.reclaim(now, 0).await, "invalid_limit");
    expect_code(s.reclaim(now, RECLAIM_BATCH_MAX + 1).await, "invalid_limit");
    expect_code(s.ledger(0, 0).await, "invalid_limit");
    assert_balances(&*s, a, (10, 10, 0, 0)).await;
    assert_eq!(ledger_kinds(&*s).await, vec![LedgerKind::Deposit]);
    assert_audit(&*s, (10, 10, 0, 0)).await;
}

/// Instants before the Unix epoch work to the nanosecond.
pub async fn negative_timestamps(f: &dyn StoreFactory) {
    let now = ts("1969-12-31T23:59:59.999999999Z");
    let (s, a) = setup(f, p60(dur(0, 3)), 50, now).await;
    let g = acquire(&*s, a, 5, dur(0, 1), now).await;
    assert_eq!(g.expiry, ts("1970-01-01T00:00:00Z"));
    let g2 = acquire(&*s, a, 5, dur(0, 1), ts("1969-12-31T23:59:59.999998999Z")).await;
    assert_eq!(g2.expiry.as_nanosecond(), -1000);
    let old = ts("-000999-06-01T00:00:00.000000001Z");
    let g3 = acquire(&*s, a, 5, dur(1, 1), old).await;
    assert_eq!(g3.expiry, ts("-000999-06-01T00:00:01.000000002Z"));
    // g2: e = -1000 ns, grace 3 ns: boundary at -997 ns.
    let b2 = Timestamp::from_nanosecond(-997).unwrap();
    let just_before = Timestamp::from_nanosecond(-998).unwrap();
    let rep = s.reclaim(just_before, 10).await.unwrap();
    assert_eq!(rep.reclaimed, vec![g3.lease_id]);
    assert_eq!(rep.cutoff.map(|c| c.as_nanosecond()), Some(-1001));
    let rep = s.reclaim(b2, 10).await.unwrap();
    assert_eq!(rep.reclaimed, vec![g2.lease_id]);
    let st = s
        .release(
            g.lease_id,
            &g.capability,
            Timestamp::from_nanosecond(2).unwrap(),
            Some(1),
        )
        .await
        .unwrap();
    assert_eq!((st.consumed, st.returned), (1, 4));
    expect_code(
        s.renew(g.lease_id, &g.capability, dur(1, 0), b2.into())
            .await,
        "lease_not_active",
    );
    assert_balances(&*s, a, (50, 39, 0, 11)).await;
    assert_audit(&*s, (50, 39, 0, 11)).await;
}

/// Both ends of the timestamp domain: the last representable expiry is
/// granted, one more nanosecond is a typed error before any debit.
pub async fn domain_endpoints(f: &dyn StoreFactory) {
    let max_minus_1 = Timestamp::MAX.checked_sub(dur(0, 1)).unwrap();
    let (s, a) = setup(
        f,
        policy(SignedDuration::MAX, dur(0, 1)),
        20,
        Timestamp::MIN,
    )
    .await;
    let g = acquire(&*s, a, 3, dur(0, 1), max_minus_1).await;
    assert_eq!(g.expiry, Timestamp::MAX);
    let l = s.lease(g.lease_id, &g.capability).await.unwrap();
    assert_eq!(l.expiry, Timestamp::MAX);
    let err = s
        .acquire(
            AcquireRequest {
                account_id: a,
                units: 3,
                ttl: dur(0, 2),
                idempotency_key: None,
            },
            max_minus_1.into(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RuleError::UnrepresentableExpiry {
            now: max_minus_1,
            ttl: dur(0, 2)
        }
    );
    assert_balances(&*s, a, (20, 17, 3, 0)).await;
    // e = MAX and grace 1 ns: e + g lies beyond MAX and has not elapsed at MAX.
    let rep = s.reclaim(Timestamp::MAX, 10).await.unwrap();
    assert_eq!(rep.reclaimed, Vec::<LeaseId>::new());
    assert_eq!(rep.cutoff, Some(max_minus_1));
    let st = s
        .release(g.lease_id, &g.capability, Timestamp::MAX, None)
        .await
        .unwrap();
    assert_eq!(
        (st.consumed, st.returned, st.settled_at),
        (3, 0, Timestamp::MAX)
    );
    // The domain minimum as supplied time and as expiry's origin.
    let g = acquire(&*s, a, 1, dur(0, 1), Timestamp::MIN).await;
    assert_eq!(g.expiry.as_nanosecond(), crate::TIMESTAMP_MIN_NS + 1);
    let rep = s.reclaim(Timestamp::MIN, 10).await.unwrap();
    assert_eq!(rep.cutoff, None);
    assert_eq!(rep.reclaimed, Vec::<LeaseId>::new());
    let rep = s
        .reclaim(g.expiry.checked_add(dur(0, 1)).unwrap(), 10)
        .await
        .unwrap();
    assert_eq!(rep.reclaimed, vec![g.lease_id]);
    assert_eq!(rep.cutoff, Some(g.expiry));
    assert_balances(&*s, a, (20, 16, 0, 4)).await;
    assert_audit(&*s, (20, 16, 0, 4)).await;
}

/// `e + g - 1ns` is not reclaimable (release works, reclaim skips);
/// `e + g` is (release refused, reclaim settles).
pub async fn exact_reclaim_boundary(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(grace_1_5s()), 10, now).await;
    let g1 = acquire(&*s, a, 4, dur(2, 7), now).await;
    let g2 = acquire(&*s, a, 5, dur(2, 7), now).await;
    let boundary = ts("2026-11-29T12:00:03.623456797Z");
    let before = boundary.checked_sub(dur(0, 1)).unwrap();
    assert!(!s.policy().is_reclaimable(g1.expiry, before));
    assert!(s.policy().is_reclaimable(g1.expiry, boundary));
    assert_eq!(s.reclaim(before, 10).await.unwrap().reclaimed, vec![]);
    let st = s
        .release(g1.lease_id, &g1.capability, before, Some(0))
        .await
        .unwrap();
    assert_eq!(
        (st.state, st.consumed, st.returned),
        (LeaseState::Released, 0, 4)
    );
    let err = s
        .release(g2.lease_id, &g2.capability, boundary, Some(0))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RuleError::LeaseReclaimable {
            lease_id: g2.lease_id,
            expiry: g2.expiry,
            now: boundary
        }
    );
    assert_balances(&*s, a, (10, 5, 5, 0)).await;
    let rep = s.reclaim(boundary, 10).await.unwrap();
    assert_eq!(rep.reclaimed, vec![g2.lease_id]);
    assert_eq!(rep.units_charged, 5);
    assert_balances(&*s, a, (10, 5, 0, 5)).await;
    let l = s.lease(g2.lease_id, &g2.capability).await.unwrap();
    assert_eq!((l.state, l.consumed), (LeaseState::Reclaimed, Some(5)));
}

/// With zero grace the boundary is the expiry itself.
pub async fn grace_zero_boundary(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, now).await;
    let g = acquire(&*s, a, 2, dur(0, 1), now).await;
    let st = s
        .release(g.lease_id, &g.capability, now, None)
        .await
        .unwrap();
    assert_eq!(st.consumed, 2);
    let g = acquire(&*s, a, 3, dur(0, 1), now).await;
    expect_code(
        s.release(g.lease_id, &g.capability, g.expiry, None).await,
        "lease_reclaimable",
    );
    let rep = s.reclaim(g.expiry, 10).await.unwrap();
    assert_eq!(rep.cutoff, Some(g.expiry));
    assert_eq!(rep.reclaimed, vec![g.lease_id]);
    assert_balances(&*s, a, (10, 5, 0, 5)).await;
}

/// With grace `SignedDuration::MAX` nothing is ever reclaimable and the
/// cutoff underflows at every representable time.
pub async fn grace_max_never_reclaims(f: &dyn StoreFactory) {
    let now = Timestamp::MIN;
    let (s, a) = setup(f, p60(SignedDuration::MAX), 10, now).await;
    let g = acquire(&*s, a, 2, dur(0, 1), now).await;
    for n in [now, ts(NOW), Timestamp::MAX] {
        let rep = s.reclaim(n, 10).await.unwrap();
        assert_eq!(rep.cutoff, None);
        assert_eq!(rep.reclaimed, vec![]);
    }
    let r = s
        .renew(g.lease_id, &g.capability, dur(1, 0), ts(NOW).into())
        .await
        .unwrap();
    assert_eq!(r.lease.expiry, ts("2026-11-29T12:00:01.123456789Z"));
    let st = s
        .release(g.lease_id, &g.capability, Timestamp::MAX, Some(1))
        .await
        .unwrap();
    assert_eq!((st.consumed, st.returned), (1, 1));
    assert_balances(&*s, a, (10, 9, 0, 1)).await;
}

/// Renewal is accepted at `e + g - 1ns` and refused at `e + g`.
pub async fn renew_each_side_of_boundary(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(grace_1_5s()), 10, now).await;
    let g = acquire(&*s, a, 1, dur(1, 0), now).await;
    let g2 = acquire(&*s, a, 1, dur(1, 0), now).await;
    let boundary = ts("2026-11-29T12:00:02.62345679Z");
    let before = boundary.checked_sub(dur(0, 1)).unwrap();
    let r = s
        .renew(g.lease_id, &g.capability, dur(0, 1), before.into())
        .await
        .unwrap();
    // now + 1ns is later than the old expiry: the new expiry is exactly that.
    assert_eq!(r.lease.expiry, boundary);
    assert_eq!(r.granted_ttl, dur(0, 1));
    expect_code(
        s.renew(g2.lease_id, &g2.capability, dur(5, 0), boundary.into())
            .await,
        "lease_reclaimable",
    );
    let l = s.lease(g2.lease_id, &g2.capability).await.unwrap();
    assert_eq!(l.expiry, ts("2026-11-29T12:00:01.123456789Z"));
    assert_eq!(l.fence, g2.fence);
    expect_code(
        s.renew(g2.lease_id, &g2.capability, dur(0, 0), before.into())
            .await,
        "invalid_ttl",
    );
}

/// A renewal never shortens a lease; every grant and renewal takes a
/// strictly greater fence.
pub async fn renew_never_shortens_and_fences_increase(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, now).await;
    let g = acquire(&*s, a, 1, dur(50, 0), now).await;
    let g2 = acquire(&*s, a, 1, dur(50, 0), now).await;
    assert!(g2.fence > g.fence);
    let r = s
        .renew(g.lease_id, &g.capability, dur(1, 0), now.into())
        .await
        .unwrap();
    assert_eq!(r.lease.expiry, g.expiry);
    assert_eq!(r.granted_ttl, dur(1, 0));
    assert!(!r.extended, "now + 1 s does not pass the expiry: kept");
    assert!(r.lease.fence > g2.fence);
    let r2 = s
        .renew(g.lease_id, &g.capability, dur(60, 0), now.into())
        .await
        .unwrap();
    assert_eq!(r2.lease.expiry, ts("2026-11-29T12:01:00.123456789Z"));
    assert!(r2.extended);
    assert!(r2.lease.fence > r.lease.fence);
    let c = s
        .consolidate(
            a,
            &[
                (g.lease_id, g.capability.clone()),
                (g2.lease_id, g2.capability.clone()),
            ],
            dur(1, 0),
            now.into(),
        )
        .await
        .unwrap();
    assert!(c.fence > r2.lease.fence);
    let l = s.lease(g.lease_id, &g.capability).await.unwrap();
    assert_eq!(l.fence, r2.lease.fence);
    assert_eq!(l.state, LeaseState::Consolidated);
    assert_balances(&*s, a, (10, 8, 2, 0)).await;
}

/// Consolidation is accepted at `e + g - 1ns` and refused at `e + g`, where
/// it settles nothing.
pub async fn consolidate_each_side_of_boundary(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(grace_1_5s()), 100, now).await;
    let g1 = acquire(&*s, a, 10, dur(1, 0), now).await;
    let g2 = acquire(&*s, a, 20, dur(3, 0), now).await;
    let g3 = acquire(&*s, a, 30, dur(3, 0), now).await;
    let boundary1 = ts("2026-11-29T12:00:02.62345679Z");
    let err = s
        .consolidate(
            a,
            &[
                (g2.lease_id, g2.capability.clone()),
                (g1.lease_id, g1.capability.clone()),
            ],
            dur(5, 3),
            boundary1.into(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "lease_reclaimable");
    for g in [&g1, &g2] {
        let l = s.lease(g.lease_id, &g.capability).await.unwrap();
        assert_eq!(l.state, LeaseState::Active);
    }
    let before = boundary1.checked_sub(dur(0, 1)).unwrap();
    let c = s
        .consolidate(
            a,
            &[
                (g2.lease_id, g2.capability.clone()),
                (g1.lease_id, g1.capability.clone()),
                (g3.lease_id, g3.capability.clone()),
            ],
            dur(5, 3),
            before.into(),
        )
        .await
        .unwrap();
    assert_eq!(c.units, 60);
    assert_eq!(c.expiry, ts("2026-11-29T12:00:07.623456792Z"));
    assert_eq!(c.granted_ttl, dur(5, 3));
    for g in [&g1, &g2, &g3] {
        let l = s.lease(g.lease_id, &g.capability).await.unwrap();
        assert_eq!((l.state, l.consumed), (LeaseState::Consolidated, Some(0)));
        expect_code(
            s.release(g.lease_id, &g.capability, before, None).await,
            "lease_not_active",
        );
    }
    assert_balances(&*s, a, (100, 40, 60, 0)).await;
    let st = s
        .release(c.lease_id, &c.capability, before, Some(15))
        .await
        .unwrap();
    assert_eq!((st.consumed, st.returned), (15, 45));
    assert_balances(&*s, a, (100, 85, 0, 15)).await;
    assert_audit(&*s, (100, 85, 0, 15)).await;
}

/// An unrepresentable consolidated expiry fails before anything settles.
pub async fn consolidate_unrepresentable_expiry_settles_nothing(f: &dyn StoreFactory) {
    let near_max = Timestamp::MAX.checked_sub(dur(10, 0)).unwrap();
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, near_max).await;
    let g1 = acquire(&*s, a, 1, dur(5, 0), near_max).await;
    let g2 = acquire(&*s, a, 2, dur(5, 0), near_max).await;
    let leases = [
        (g1.lease_id, g1.capability.clone()),
        (g2.lease_id, g2.capability.clone()),
    ];
    let err = s
        .consolidate(a, &leases, dur(10, 1), near_max.into())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RuleError::UnrepresentableExpiry {
            now: near_max,
            ttl: dur(10, 1)
        }
    );
    for g in [&g1, &g2] {
        let l = s.lease(g.lease_id, &g.capability).await.unwrap();
        assert_eq!(l.state, LeaseState::Active);
    }
    let kinds = ledger_kinds(&*s).await;
    assert_eq!(
        kinds,
        vec![
            LedgerKind::Deposit,
            LedgerKind::Acquire,
            LedgerKind::Acquire
        ]
    );
    let c = s
        .consolidate(a, &leases, dur(10, 0), near_max.into())
        .await
        .unwrap();
    assert_eq!(c.expiry, Timestamp::MAX);
    assert_eq!(c.units, 3);
}

/// Empty, duplicate, foreign and settled lease sets are typed errors that
/// change nothing.
pub async fn consolidate_rejects_bad_sets(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, now).await;
    let b = new_account(&*s, "other", 10, now).await;
    let g1 = acquire(&*s, a, 1, dur(5, 0), now).await;
    let g2 = acquire(&*s, a, 1, dur(5, 0), now).await;
    let gb = acquire(&*s, b, 1, dur(5, 0), now).await;
    expect_code(
        s.consolidate(a, &[], dur(1, 0), now.into()).await,
        "invalid_lease_count",
    );
    let dup = [
        (g1.lease_id, g1.capability.clone()),
        (g1.lease_id, g1.capability.clone()),
    ];
    expect_code(
        s.consolidate(a, &dup, dur(1, 0), now.into()).await,
        "duplicate_lease",
    );
    let foreign = [
        (g1.lease_id, g1.capability.clone()),
        (gb.lease_id, gb.capability.clone()),
    ];
    expect_code(
        s.consolidate(a, &foreign, dur(1, 0), now.into()).await,
        "lease_account_mismatch",
    );
    let forged = [
        (g1.lease_id, g1.capability.clone()),
        (g2.lease_id, g1.capability.clone()),
    ];
    expect_code(
        s.consolidate(a, &forged, dur(1, 0), now.into()).await,
        "capability_mismatch",
    );
    let ok = [
        (g1.lease_id, g1.capability.clone()),
        (g2.lease_id, g2.capability.clone()),
    ];
    expect_code(
        s.consolidate(a, &ok, SignedDuration::ZERO, now.into())
            .await,
        "invalid_ttl",
    );
    expect_code(
        s.consolidate(AccountId(a.0 + 1000), &ok, dur(1, 0), now.into())
            .await,
        "account_not_found",
    );
    s.release(g2.lease_id, &g2.capability, now, Some(1))
        .await
        .unwrap();
    expect_code(
        s.consolidate(a, &ok, dur(1, 0), now.into()).await,
        "lease_not_active",
    );
    let l = s.lease(g1.lease_id, &g1.capability).await.unwrap();
    assert_eq!(l.state, LeaseState::Active);
    assert_balances(&*s, a, (10, 8, 1, 1)).await;
    assert_balances(&*s, b, (10, 9, 1, 0)).await;
    assert_eq!(
        ledger_kinds(&*s).await,
        vec![
            LedgerKind::Deposit,
            LedgerKind::Deposit,
            LedgerKind::Acquire,
            LedgerKind::Acquire,
            LedgerKind::Acquire,
            LedgerKind::Release
        ]
    );
}

/// Release charges `consumed` (default all units) and returns the rest;
/// over-reporting is a typed error; a settled lease can't be released again.
pub async fn release_accounting(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 100, now).await;
    let g1 = acquire(&*s, a, 30, dur(5, 0), now).await;
    let g2 = acquire(&*s, a, 20, dur(5, 0), now).await;
    assert_balances(&*s, a, (100, 50, 50, 0)).await;
    expect_code(
        s.release(g1.lease_id, &g1.capability, now, Some(31)).await,
        "invalid_consumed",
    );
    expect_code(
        s.release(g1.lease_id, &g1.capability, now, Some(-1)).await,
        "invalid_consumed",
    );
    assert_balances(&*s, a, (100, 50, 50, 0)).await;
    let st = s
        .release(g1.lease_id, &g1.capability, now, Some(12))
        .await
        .unwrap();
    assert_eq!(
        (st.units, st.consumed, st.returned, st.state),
        (30, 12, 18, LeaseState::Released)
    );
    assert_eq!(
        st.balances,
        Balances {
            deposited: 100,
            available: 68,
            held: 20,
            consumed: 12
        }
    );
    let st = s
        .release(g2.lease_id, &g2.capability, now, None)
        .await
        .unwrap();
    assert_eq!((st.consumed, st.returned), (20, 0));
    let err = s
        .release(g2.lease_id, &g2.capability, now, None)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        RuleError::LeaseNotActive {
            lease_id: g2.lease_id,
            state: LeaseState::Released
        }
    );
    assert_balances(&*s, a, (100, 68, 0, 32)).await;
    assert_audit(&*s, (100, 68, 0, 32)).await;
}

/// Reclaim charges all held units and never settles a lease twice.
pub async fn reclaim_is_idempotent_and_charges_all(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(dur(0, 10)), 100, now).await;
    let g1 = acquire(&*s, a, 30, dur(1, 0), now).await;
    let g2 = acquire(&*s, a, 20, dur(2, 0), now).await;
    let late = ts("2026-11-29T12:00:05Z");
    let rep = s.reclaim(late, 10).await.unwrap();
    assert_eq!(rep.reclaimed, vec![g1.lease_id, g2.lease_id]);
    assert_eq!(rep.units_charged, 50);
    assert_eq!(rep.cutoff, Some(ts("2026-11-29T12:00:04.99999999Z")));
    // late - (expiry + 10 ns), per lease, in settlement order: expiries
    // 12:00:01.123456789 and 12:00:02.123456789.
    assert_eq!(rep.late_by, vec![dur(3, 876_543_201), dur(2, 876_543_201)]);
    let rep = s.reclaim(late, 10).await.unwrap();
    assert_eq!(rep.reclaimed, vec![]);
    assert_eq!(rep.units_charged, 0);
    assert_eq!(rep.late_by, vec![]);
    expect_code(
        s.release(g1.lease_id, &g1.capability, now, Some(0)).await,
        "lease_not_active",
    );
    assert_balances(&*s, a, (100, 50, 0, 50)).await;
    let kinds = ledger_kinds(&*s).await;
    assert_eq!(
        kinds.iter().filter(|k| **k == LedgerKind::Reclaim).count(),
        2
    );
    assert_audit(&*s, (100, 50, 0, 50)).await;
}

/// Reclaim settles in (account, lease) order and at most `limit` per batch.
pub async fn reclaim_order_and_batch_limit(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let s = f.store(p60(SignedDuration::ZERO)).await;
    let a = new_account(&*s, "a", 100, now).await;
    let b = new_account(&*s, "b", 100, now).await;
    // Interleave accounts so lease id order differs from (account, lease).
    let mut by_account: Vec<(AccountId, LeaseId)> = Vec::new();
    // Expiry NOW + 1 s + i ns, grace 0: at 12:00:30 each is late by
    // 30 s - 1.123456789 s - i ns.
    let mut late_of = std::collections::BTreeMap::new();
    for i in 0..3 {
        for acct in [b, a] {
            let g = acquire(&*s, acct, 1 + i, dur(1, i as i32), now).await;
            by_account.push((acct, g.lease_id));
            late_of.insert(g.lease_id, dur(28, 876_543_211 - i as i32));
        }
    }
    let live = acquire(&*s, a, 5, dur(60, 0), now).await;
    by_account.sort();
    let expected: Vec<LeaseId> = by_account.iter().map(|(_, l)| *l).collect();
    let late = ts("2026-11-29T12:00:30Z");
    let late_by =
        |ids: &[LeaseId]| -> Vec<SignedDuration> { ids.iter().map(|id| late_of[id]).collect() };
    let r1 = s.reclaim(late, 4).await.unwrap();
    assert_eq!(r1.reclaimed, expected[..4].to_vec());
    assert_eq!(r1.late_by, late_by(&expected[..4]));
    let r2 = s.reclaim(late, 4).await.unwrap();
    assert_eq!(r2.reclaimed, expected[4..].to_vec());
    assert_eq!(r2.late_by, late_by(&expected[4..]));
    let r3 = s.reclaim(late, 4).await.unwrap();
    assert_eq!(r3.reclaimed, vec![]);
    let l = s.lease(live.lease_id, &live.capability).await.unwrap();
    assert_eq!(l.state, LeaseState::Active);
    assert_balances(&*s, a, (100, 89, 5, 6)).await;
    assert_balances(&*s, b, (100, 94, 0, 6)).await;
    assert_audit(&*s, (200, 183, 5, 12)).await;
}

/// Release (before the boundary) and reclaim (after it) race on the same
/// lease: exactly one settles, every time.
pub async fn release_vs_reclaim_race(f: &dyn StoreFactory) {
    const ROUNDS: i64 = 40;
    let now = ts(NOW);
    let (s, a) = setup(f, p60(dur(0, 1)), ROUNDS * 10, now).await;
    let mut released = 0;
    let mut reclaimed = 0;
    for _ in 0..ROUNDS {
        let g = acquire(&*s, a, 10, dur(1, 0), now).await;
        let before = g.expiry;
        let after = g.expiry.checked_add(dur(0, 1)).unwrap();
        let s1 = s.clone();
        let cap = g.capability.clone();
        let rel = tokio::spawn(async move { s1.release(g.lease_id, &cap, before, Some(4)).await });
        let s2 = s.clone();
        let rec = tokio::spawn(async move { s2.reclaim(after, 10).await });
        let rel = rel.await.expect("join");
        let rec = rec.await.expect("join").expect("reclaim");
        match rel {
            Ok(st) => {
                assert_eq!((st.consumed, st.returned), (4, 6));
                assert_eq!(rec.reclaimed, vec![]);
                released += 1;
            }
            Err(e) => {
                assert_eq!(e.code(), "lease_not_active");
                assert_eq!(rec.reclaimed, vec![g.lease_id]);
                reclaimed += 1;
            }
        }
    }
    assert_eq!(released + reclaimed, ROUNDS);
    let total = ROUNDS * 10;
    let consumed = released * 4 + reclaimed * 10;
    assert_balances(&*s, a, (total, total - consumed, 0, consumed)).await;
    assert_audit(
        &*s,
        (total.into(), (total - consumed).into(), 0, consumed.into()),
    )
    .await;
}

/// Concurrent acquires on one account never overdraw it.
pub async fn concurrent_acquires_never_overdraw(f: &dyn StoreFactory) {
    const TASKS: usize = 40;
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 100, now).await;
    let mut handles = Vec::new();
    for _ in 0..TASKS {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            s.acquire(
                AcquireRequest {
                    account_id: a,
                    units: 3,
                    ttl: dur(10, 0),
                    idempotency_key: None,
                },
                now.into(),
            )
            .await
        }));
    }
    let mut ok = 0;
    let mut insufficient = 0;
    let mut fences = Vec::new();
    for h in handles {
        match h.await.expect("join") {
            Ok(g) => {
                ok += 1;
                fences.push(g.fence);
            }
            Err(e) => {
                assert_eq!(e.code(), "insufficient_balance");
                insufficient += 1;
            }
        }
    }
    assert_eq!((ok, insufficient), (33, 7));
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), 33);
    assert_balances(&*s, a, (100, 1, 99, 0)).await;
    assert_audit(&*s, (100, 1, 99, 0)).await;
}

/// A retry with the same idempotency key and request returns the same grant
/// (capability included) and debits once; a different request conflicts.
pub async fn idempotent_acquire(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, now).await;
    let b = new_account(&*s, "other", 10, now).await;
    let req = |account_id: AccountId, units: i64, key: &str| AcquireRequest {
        account_id,
        units,
        ttl: dur(5, 5),
        idempotency_key: Some(key.into()),
    };
    let g = s.acquire(req(a, 4, "k-1"), now.into()).await.unwrap();
    let later = ts("2026-11-29T12:00:01Z");
    let again = s.acquire(req(a, 4, "k-1"), later.into()).await.unwrap();
    assert_eq!(again, g);
    assert_eq!(again.capability.expose(), g.capability.expose());
    assert_eq!(again.expiry, ts("2026-11-29T12:00:05.123456794Z"));
    expect_code(
        s.acquire(req(a, 5, "k-1"), now.into()).await,
        "idempotency_conflict",
    );
    let mut other_ttl = req(a, 4, "k-1");
    other_ttl.ttl = dur(5, 6);
    expect_code(
        s.acquire(other_ttl, now.into()).await,
        "idempotency_conflict",
    );
    let gb = s.acquire(req(b, 4, "k-1"), now.into()).await.unwrap();
    assert_ne!(gb.lease_id, g.lease_id);
    expect_code(
        s.acquire(req(a, 1, ""), now.into()).await,
        "invalid_idempotency_key",
    );
    expect_code(
        s.acquire(req(a, 1, "has space"), now.into()).await,
        "invalid_idempotency_key",
    );
    expect_code(
        s.acquire(req(a, 1, &"x".repeat(256)), now.into()).await,
        "invalid_idempotency_key",
    );
    let long = "y".repeat(255);
    s.acquire(req(a, 1, &long), now.into()).await.unwrap();
    assert_balances(&*s, a, (10, 5, 5, 0)).await;
    assert_balances(&*s, b, (10, 6, 4, 0)).await;
    // Even after release, the retry returns the original grant.
    s.release(g.lease_id, &g.capability, now, None)
        .await
        .unwrap();
    let again = s.acquire(req(a, 4, "k-1"), later.into()).await.unwrap();
    assert_eq!(again, g);
    assert_balances(&*s, a, (10, 5, 1, 4)).await;
}

/// A wrong capability is refused without revealing whether the lease exists.
pub async fn capabilities_are_checked(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, now).await;
    let g1 = acquire(&*s, a, 1, dur(5, 0), now).await;
    let g2 = acquire(&*s, a, 1, dur(5, 0), now).await;
    assert_ne!(g1.capability, g2.capability);
    assert!(g1.capability.expose().len() >= 32);
    let forged = Capability::from_presented("tgc1.00");
    expect_code(s.lease(g1.lease_id, &forged).await, "capability_mismatch");
    expect_code(
        s.lease(g1.lease_id, &g2.capability).await,
        "capability_mismatch",
    );
    expect_code(
        s.release(g1.lease_id, &g2.capability, now, None).await,
        "capability_mismatch",
    );
    expect_code(
        s.renew(g1.lease_id, &g2.capability, dur(1, 0), now.into())
            .await,
        "capability_mismatch",
    );
    // An unknown lease with a forged capability: the same answer.
    expect_code(
        s.lease(LeaseId(999_999), &forged).await,
        "capability_mismatch",
    );
    expect_code(
        s.release(LeaseId(999_999), &g1.capability, now, None).await,
        "capability_mismatch",
    );
    let l = s.lease(g1.lease_id, &g1.capability).await.unwrap();
    assert_eq!(l.state, LeaseState::Active);
    assert_balances(&*s, a, (10, 8, 2, 0)).await;
}

/// Deposits that would overflow and unknown accounts are typed errors.
pub async fn deposit_overflow_and_unknown_account(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), i64::MAX - 1, now).await;
    let acct = s.deposit(a, 1, now).await.unwrap();
    assert_eq!(acct.balances.deposited, i64::MAX);
    expect_code(s.deposit(a, 1, now).await, "units_overflow");
    expect_code(
        s.deposit(AccountId(a.0 + 1000), 1, now).await,
        "account_not_found",
    );
    expect_code(s.account(AccountId(a.0 + 1000)).await, "account_not_found");
    let g = acquire(&*s, a, i64::MAX, dur(1, 0), now).await;
    assert_eq!(g.units, i64::MAX);
    assert_balances(&*s, a, (i64::MAX, 0, i64::MAX, 0)).await;
    let st = s
        .release(g.lease_id, &g.capability, now, Some(1))
        .await
        .unwrap();
    assert_eq!(st.returned, i64::MAX - 1);
    assert_balances(&*s, a, (i64::MAX, i64::MAX - 1, 0, 1)).await;
}

/// Every state change is a ledger entry with exact before/after balances and
/// supplied time.
pub async fn ledger_records_every_change(f: &dyn StoreFactory) {
    let now = ts(NOW);
    let (s, a) = setup(f, p60(SignedDuration::ZERO), 10, now).await;
    let t1 = ts("2026-11-29T12:00:01.000000001Z");
    let g = acquire(&*s, a, 4, dur(5, 0), t1).await;
    let t2 = ts("2026-11-29T12:00:02.000000002Z");
    let r = s
        .renew(g.lease_id, &g.capability, dur(9, 0), t2.into())
        .await
        .unwrap();
    let t3 = ts("2026-11-29T12:00:03.000000003Z");
    s.release(g.lease_id, &g.capability, t3, Some(3))
        .await
        .unwrap();
    let entries = s.ledger(0, 100).await.unwrap();
    assert_eq!(entries.len(), 4);
    let seqs: Vec<i64> = entries.iter().map(|e| e.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seq increases: {seqs:?}"
    );
    let d = &entries[0];
    assert_eq!(
        (d.kind, d.units, d.at, d.lease_id),
        (LedgerKind::Deposit, 10, now, None)
    );
    let q = &entries[1];
    assert_eq!(
        (q.kind, q.units, q.at, q.lease_id, q.fence, q.expiry),
        (
            LedgerKind::Acquire,
            4,
            t1,
            Some(g.lease_id),
            Some(g.fence),
            Some(g.expiry)
        )
    );
    assert_eq!(
        (q.before, q.after),
        (
            Balances {
                deposited: 10,
                available: 10,
                held: 0,
                consumed: 0
            },
            Balances {
                deposited: 10,
                available: 6,
                held: 4,
                consumed: 0
            }
        )
    );
    let n = &entries[2];
    assert_eq!(
        (n.kind, n.at, n.fence, n.expiry, n.before, n.after),
        (
            LedgerKind::Renew,
            t2,
            Some(r.lease.fence),
            Some(ts("2026-11-29T12:00:11.000000002Z")),
            q.after,
            q.after
        )
    );
    let rel = &entries[3];
    assert_eq!(
        (rel.kind, rel.units, rel.consumed, rel.at),
        (LedgerKind::Release, 4, 3, t3)
    );
    assert_eq!(
        rel.after,
        Balances {
            deposited: 10,
            available: 7,
            held: 0,
            consumed: 3
        }
    );
    let page = s.ledger(entries[1].seq, 2).await.unwrap();
    assert_eq!(
        page.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![entries[2].seq, entries[3].seq]
    );
    assert_audit(&*s, (10, 7, 0, 3)).await;
}
