//! The gateway store against a real PostgreSQL with a real in-process
//! sampler: claims and takeovers with exact generations, fences and
//! heartbeat expiries; racing takeovers; nothing claimed or taken over on
//! an uncertain cut while the owner keeps serving; the page protocol
//! (stage, pending, ack) with its refusals; release only after the
//! terminal page is acknowledged, once, with the Reservation returned only
//! by the destroy proof; and every transition's replay for the same, a
//! replaced and an expired owner, and racing a takeover.

mod support;

use jiff::{SignedDuration, Timestamp};
use lc_core::owner::{
    OwnedExec, OwnerCredential, OwnerFence, OwnerGeneration, OwnerToken, Ownership, PageMeta,
    StageReport, StoredPage, TakeoverBasis, TransitionKind, TransitionReceipt,
};
use lc_core::page::{ExitStatus, Page, PageKind};
use lc_core::{
    AttemptNo, ControlStore, CutReading, Digest, ExecId, ExecRecord, GatewayStore, Generation,
    LcError, LeaseAction, LeaseState, ReconcileStore, TerminalReason,
};
use sqlx::{Connection, PgConnection};
use support::*;

const TTL: SignedDuration = SignedDuration::from_secs(5);
const TTL_MIN: SignedDuration = SignedDuration::from_secs(1);

fn token(b: u8) -> OwnerToken {
    OwnerToken::from_bytes([b; 32])
}

fn cred_of(o: &OwnedExec, t: &OwnerToken) -> OwnerCredential {
    OwnerCredential {
        token: t.clone(),
        generation: o.ownership.generation,
        fence: o.ownership.fence,
    }
}

fn data(e: ExecId, seq: i64, kind: PageKind, bytes: &[u8]) -> PageMeta {
    PageMeta::of_page(
        e,
        AttemptNo(1),
        &Page::data(seq, kind, bytes.to_vec()).unwrap(),
    )
}

fn terminal(e: ExecId, seq: i64, code: i32) -> PageMeta {
    PageMeta::of_page(
        e,
        AttemptNo(1),
        &Page::terminal(seq, ExitStatus::exited(code)).unwrap(),
    )
}

fn acked(m: &PageMeta) -> StoredPage {
    StoredPage {
        meta: m.clone(),
        bytes: None,
    }
}

/// Admits a small exec under `key` and marks its Lease active.
async fn active_exec(f: &Fixture, key: &str, at: CutReading) -> ExecRecord {
    let e = f
        .store
        .admit_exec(&op(key, key), at, f.tenant, &req("small", &["sleep", "9"]))
        .await
        .unwrap();
    f.store
        .mark_active(e.canonical.lease_id, Generation(1), at)
        .await
        .unwrap();
    f.store.exec(f.tenant, e.exec_id).await.unwrap()
}

/// A certain reading whose cut is at or after `t`.
async fn certain_at(f: &Fixture, t: Timestamp) -> CutReading {
    wait_reading(&f.clock, 20, "a certain cut past a heartbeat expiry", |r| {
        r.certain && r.cut >= t
    })
    .await
}

/// `(owners, transitions, pages)` row counts.
async fn counts(url: &str) -> (i64, i64, i64) {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM lc_exec_owners), (SELECT count(*) FROM lc_transitions), \
                (SELECT count(*) FROM lc_output_pages)",
    )
    .fetch_one(&mut c)
    .await
    .unwrap()
}

fn ownership(e: ExecId, t: &OwnerToken, g: i64, fence: OwnerFence, expiry: Timestamp) -> Ownership {
    Ownership {
        exec_id: e,
        token_sha256: t.sha256(),
        generation: OwnerGeneration(g),
        fence,
        heartbeat_expiry: expiry,
        released: false,
    }
}

#[tokio::test]
async fn claims_heartbeats_and_takeovers_have_exact_generations_fences_and_expiries() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let e1 = active_exec(&f, "e1", at).await;
    let e2 = active_exec(&f, "e2", at).await;
    // Allocating: nothing to own yet.
    let e3 = f
        .store
        .admit_exec(&op("e3", "e3"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    let (a, b) = (token(0xa1), token(0xb2));

    let got = f.store.claim(&a, at, TTL_MIN, 10).await.unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].ownership.exec_id, e1.exec_id);
    assert_eq!(got[1].ownership.exec_id, e2.exec_id);
    let f1 = got[0].ownership.fence;
    let f2 = got[1].ownership.fence;
    assert!(f2 > f1, "{f1} then {f2}");
    assert_eq!(
        got[0],
        OwnedExec {
            ownership: ownership(e1.exec_id, &a, 1, f1, at.cut + TTL_MIN),
            basis: TakeoverBasis::Unowned,
            tenant_id: f.tenant,
            identity: e1.canonical.clone(),
            attempt: AttemptNo(1),
            lease_id: e1.canonical.lease_id,
            lease_generation: Generation(1),
            lease_state: LeaseState::Active,
            provider_url: "http://127.0.0.1:7001".into(),
            staged_through: 0,
            acked_through: 0,
            terminal_acked_seq: None,
            cancel_requested: false,
            hibernation_step: None,
            attempt_parked: false,
            resume_op_key: None,
            lease_attached: false,
            stopped_acked_seq: None,
        }
    );
    assert_eq!(
        got[1].ownership,
        ownership(e2.exec_id, &a, 1, f2, at.cut + TTL_MIN)
    );
    let (c1, c2) = (cred_of(&got[0], &a), cred_of(&got[1], &a));
    // Owned: another claim finds nothing; a takeover is refused.
    let before = snapshot(&f.db.url).await;
    assert_eq!(f.store.claim(&b, at, TTL, 10).await.unwrap(), vec![]);
    assert_eq!(
        f.store
            .take_over(&b, f.tenant, e1.exec_id, at, TTL)
            .await
            .unwrap_err(),
        LcError::OwnerLive {
            exec_id: e1.exec_id,
            generation: OwnerGeneration(1),
            heartbeat_expiry: at.cut + TTL_MIN,
        }
    );
    // The allocating exec, a missing one, another tenant's.
    assert_eq!(
        f.store
            .take_over(&b, f.tenant, e3.exec_id, at, TTL)
            .await
            .unwrap_err()
            .code(),
        "illegal_transition"
    );
    for (t, e) in [
        (f.tenant, ExecId(e3.exec_id.0 + 100)),
        (lc_core::TenantId(f.tenant.0 + 1), e1.exec_id),
    ] {
        assert_eq!(
            f.store.take_over(&b, t, e, at, TTL).await.unwrap_err(),
            LcError::not_found("exec", e)
        );
    }
    // Bad TTLs and limits.
    for ttl in [
        SignedDuration::from_millis(999),
        SignedDuration::from_secs(601),
    ] {
        assert_eq!(
            f.store.claim(&b, at, ttl, 1).await.unwrap_err().code(),
            "invalid_timeout"
        );
        assert_eq!(
            f.store
                .heartbeat(&c1, e1.exec_id, at, ttl)
                .await
                .unwrap_err()
                .code(),
            "invalid_timeout"
        );
    }
    assert_eq!(
        f.store.claim(&b, at, TTL, 0).await.unwrap_err().code(),
        "invalid_limit"
    );
    // A reading ahead of the persisted cut.
    let ahead = CutReading::certain(at.cut + SignedDuration::from_hours(1));
    assert_eq!(
        f.store.claim(&b, ahead, TTL, 1).await.unwrap_err().code(),
        "invalid_cut_reading"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Heartbeats: an older reading keeps the expiry; a later one extends
    // exactly to cut + ttl; e2 goes to the longest TTL.
    let older = CutReading::certain(at.cut - SignedDuration::from_nanos(1));
    let h = f
        .store
        .heartbeat(&c1, e1.exec_id, older, TTL_MIN)
        .await
        .unwrap();
    assert_eq!(h.ownership.heartbeat_expiry, at.cut + TTL_MIN);
    let long = SignedDuration::from_secs(600);
    let h2 = f.store.heartbeat(&c2, e2.exec_id, at, long).await.unwrap();
    assert_eq!(
        h2.ownership,
        ownership(e2.exec_id, &a, 1, f2, at.cut + long)
    );
    // A shorter TTL never shortens.
    let h2 = f
        .store
        .heartbeat(&c2, e2.exec_id, at, TTL_MIN)
        .await
        .unwrap();
    assert_eq!(h2.ownership.heartbeat_expiry, at.cut + long);

    // Past e1's expiry on a certain cut: its owner is expired, and may be
    // taken over.
    let past = certain_at(&f, at.cut + TTL_MIN).await;
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .heartbeat(&c1, e1.exec_id, past, TTL)
            .await
            .unwrap_err(),
        LcError::OwnerExpired {
            exec_id: e1.exec_id,
            generation: OwnerGeneration(1),
            heartbeat_expiry: at.cut + TTL_MIN,
        }
    );
    assert_eq!(
        f.store
            .stage_pages(
                &c1,
                e1.exec_id,
                past,
                &[data(e1.exec_id, 1, PageKind::Stdout, b"x")]
            )
            .await
            .unwrap_err()
            .code(),
        "owner_expired"
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let t = f
        .store
        .take_over(&b, f.tenant, e1.exec_id, past, TTL)
        .await
        .unwrap();
    let f3 = t.ownership.fence;
    assert!(f3 > f2, "{f2} then {f3}");
    assert_eq!(
        t.ownership,
        ownership(e1.exec_id, &b, 2, f3, past.cut + TTL)
    );
    assert_eq!(t.basis, TakeoverBasis::Expired);
    // The canonical identity is exactly as admitted.
    assert_eq!(t.identity, e1.canonical);
    assert_eq!(
        f.store.exec(f.tenant, e1.exec_id).await.unwrap().canonical,
        e1.canonical
    );
    // The stale owner's writes are refused and change nothing.
    let before = snapshot(&f.db.url).await;
    let rows = counts(&f.db.url).await;
    assert_eq!(rows, (2, 0, 0));
    let stale = LcError::OwnerStale {
        exec_id: e1.exec_id,
        presented: OwnerGeneration(1),
        current: OwnerGeneration(2),
    };
    assert_eq!(
        f.store
            .heartbeat(&c1, e1.exec_id, past, TTL)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        f.store
            .stage_pages(
                &c1,
                e1.exec_id,
                past,
                &[data(e1.exec_id, 1, PageKind::Stdout, b"x")]
            )
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        f.store
            .pending_pages(&c1, e1.exec_id, past, 10)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        f.store
            .ack_pages(&c1, e1.exec_id, past, "ack-1-1", 1)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        GatewayStore::cancel(&f.store, &c1, e1.exec_id, past, "cancel-1")
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        f.store
            .release(&c1, e1.exec_id, past, "release-1")
            .await
            .unwrap_err(),
        stale
    );
    // The new generation with the old fence, or the old token: stale too.
    let forged = OwnerCredential {
        token: b.clone(),
        generation: OwnerGeneration(2),
        fence: f2,
    };
    assert_eq!(
        f.store
            .heartbeat(&forged, e1.exec_id, past, TTL)
            .await
            .unwrap_err()
            .code(),
        "owner_stale"
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(counts(&f.db.url).await, rows);
    // e2's owner still serves.
    assert_eq!(
        f.store
            .heartbeat(&c2, e2.exec_id, past, TTL)
            .await
            .unwrap()
            .ownership
            .heartbeat_expiry,
        at.cut + long
    );
    // Once e3 is active, a claim takes exactly it.
    f.store
        .mark_active(e3.canonical.lease_id, Generation(1), past)
        .await
        .unwrap();
    let got = f.store.claim(&b, past, TTL, 10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(got[0].ownership.fence > f3);
    assert_eq!(
        got[0].ownership,
        ownership(e3.exec_id, &b, 1, got[0].ownership.fence, past.cut + TTL)
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (3, 0, 3, 0)
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn of_two_racing_takeovers_exactly_one_wins_and_the_other_changes_nothing() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "race", at).await;
    let x = e.exec_id;
    let mut last_fence = OwnerFence(0);
    let mut reading = at;
    for round in 1..=3_i64 {
        let (a, b) = (token(2 * round as u8), token(2 * round as u8 + 1));
        let (ra, rb) = tokio::join!(
            f.store.take_over(&a, f.tenant, x, reading, TTL_MIN),
            f.store.take_over(&b, f.tenant, x, reading, TTL_MIN),
        );
        let (won, winner, lost) = match (ra, rb) {
            (Ok(w), Err(l)) => (w, a, l),
            (Err(l), Ok(w)) => (w, b, l),
            other => panic!("round {round}: not exactly one winner: {other:?}"),
        };
        assert_eq!(won.ownership.generation, OwnerGeneration(round));
        assert!(won.ownership.fence > last_fence);
        assert_eq!(
            won.ownership,
            ownership(
                x,
                &winner,
                round,
                won.ownership.fence,
                reading.cut + TTL_MIN
            )
        );
        assert_eq!(
            won.basis,
            if round == 1 {
                TakeoverBasis::Unowned
            } else {
                TakeoverBasis::Expired
            }
        );
        assert_eq!(
            lost,
            LcError::OwnerLive {
                exec_id: x,
                generation: OwnerGeneration(round),
                heartbeat_expiry: reading.cut + TTL_MIN,
            }
        );
        // Exactly the winner's row.
        let mut c = PgConnection::connect(&f.db.url).await.unwrap();
        let row: (Vec<u8>, i64, i64, bool) = sqlx::query_as(
            "SELECT token_sha256, generation, fence, released FROM lc_exec_owners WHERE exec_id = $1",
        )
        .bind(x.0)
        .fetch_one(&mut c)
        .await
        .unwrap();
        assert_eq!(
            row,
            (
                winner.sha256().0.to_vec(),
                round,
                won.ownership.fence.0,
                false
            )
        );
        assert_eq!(counts(&f.db.url).await, (1, 0, 0));
        last_fence = won.ownership.fence;
        reading = certain_at(&f, reading.cut + TTL_MIN).await;
    }
    f.sampler.stop().await;
}

#[tokio::test]
async fn nothing_is_claimed_or_taken_over_while_uncertain_but_the_owner_keeps_serving() {
    let f = fixture(2).await;
    let at = certain(&f.clock).await;
    let e1 = active_exec(&f, "u1", at).await;
    let e2 = active_exec(&f, "u2", at).await;
    let a = token(7);
    let got = f.store.claim(&a, at, TTL_MIN, 1).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].ownership.exec_id, e1.exec_id);
    let c1 = cred_of(&got[0], &a);

    // Pause the sampler: the clock turns uncertain.
    f.sampler.stop().await;
    let u = wait_reading(&f.clock, 10, "an uncertain cut", |r| !r.certain).await;
    let b = token(8);
    let before = snapshot(&f.db.url).await;
    // Nothing is claimed (not even the unowned e2), nothing taken over.
    assert_eq!(f.store.claim(&b, u, TTL, 10).await.unwrap(), vec![]);
    let uncertain = LcError::TimeUncertain {
        retry_after_s: u.retry_after_s.max(1),
    };
    assert_eq!(
        f.store
            .take_over(&b, f.tenant, e2.exec_id, u, TTL)
            .await
            .unwrap_err(),
        uncertain
    );
    assert_eq!(
        f.store
            .take_over(&b, f.tenant, e1.exec_id, u, TTL)
            .await
            .unwrap_err(),
        uncertain
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // The owner keeps serving, however far the frozen cut is past its
    // expiry: its heartbeat renews to max(current, cut + ttl), its writes
    // are accepted.
    let h = f.store.heartbeat(&c1, e1.exec_id, u, TTL).await.unwrap();
    assert_eq!(
        h.ownership.heartbeat_expiry,
        (at.cut + TTL_MIN).max(u.cut + TTL)
    );
    let p1 = data(e1.exec_id, 1, PageKind::Stdout, b"still here");
    assert_eq!(
        f.store
            .stage_pages(&c1, e1.exec_id, u, std::slice::from_ref(&p1))
            .await
            .unwrap(),
        StageReport {
            staged: 1,
            duplicates: 0,
            staged_through: 1
        }
    );
    let r = f
        .store
        .ack_pages(&c1, e1.exec_id, u, "ack-1-1", 1)
        .await
        .unwrap();
    assert_eq!(r.committed_cut, u.cut);
    assert_eq!(
        f.store.output(f.tenant, e1.exec_id, 0, 10).await.unwrap(),
        vec![acked(&p1)]
    );
    assert_eq!(counts(&f.db.url).await, (1, 1, 1));
}

#[tokio::test]
async fn pages_stage_idempotently_ack_in_order_and_release_needs_the_acked_terminal_page() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "pages", at).await;
    let (x, lease) = (e.exec_id, e.canonical.lease_id);
    let a = token(9);
    let o = f.store.take_over(&a, f.tenant, x, at, TTL).await.unwrap();
    let c = cred_of(&o, &a);
    let p1 = data(x, 1, PageKind::Stdout, b"hello ");
    let p2 = data(x, 2, PageKind::Stderr, b"warn");
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[p2.clone(), p1.clone()])
            .await
            .unwrap(),
        StageReport {
            staged: 2,
            duplicates: 0,
            staged_through: 2
        }
    );
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[p1.clone(), p2.clone()])
            .await
            .unwrap(),
        StageReport {
            staged: 0,
            duplicates: 2,
            staged_through: 2
        }
    );
    // Refusals change nothing: another digest for seq 2, a gap, a page
    // after nothing, broken metadata, a foreign exec, too many pages, and
    // an ACK beyond the staged metadata.
    let before = snapshot(&f.db.url).await;
    let other2 = data(x, 2, PageKind::Stderr, b"WARN");
    assert_eq!(
        f.store.stage_pages(&c, x, at, &[other2]).await.unwrap_err(),
        LcError::PageConflict { exec_id: x, seq: 2 }
    );
    let mut longer2 = p2.clone();
    longer2.length = 5;
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[longer2])
            .await
            .unwrap_err(),
        LcError::PageConflict { exec_id: x, seq: 2 }
    );
    let gap = data(x, 4, PageKind::Stdout, b"x");
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[gap])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    let mut empty_bad = data(x, 3, PageKind::Stdout, b"");
    empty_bad.sha256 = Digest::of(b"not empty");
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[empty_bad])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    let mut too_long = data(x, 3, PageKind::Stdout, b"y");
    too_long.length = 65_537;
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[too_long])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    let foreign = data(ExecId(x.0 + 1), 3, PageKind::Stdout, b"z");
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[foreign])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    let many: Vec<PageMeta> = (3..=67)
        .map(|s| data(x, s, PageKind::Stdout, b"m"))
        .collect();
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &many)
            .await
            .unwrap_err()
            .code(),
        "invalid_limit"
    );
    assert_eq!(
        f.store
            .ack_pages(&c, x, at, "ack-1-3", 3)
            .await
            .unwrap_err(),
        LcError::InvalidPage {
            reason: format!(
                "an ACK through page 3 of exec {x} attempt 1: its staged metadata ends at page 2"
            )
        }
    );
    assert_eq!(
        f.store
            .ack_pages(&c, x, at, "ack-1-0", 0)
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    assert_eq!(
        f.store
            .ack_pages(&c, x, at, "ack 1", 1)
            .await
            .unwrap_err()
            .code(),
        "invalid_transition_id"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Pending pages are invisible to readers.
    assert_eq!(f.store.output(f.tenant, x, 0, 10).await.unwrap(), vec![]);
    assert_eq!(
        f.store.pending_pages(&c, x, at, 10).await.unwrap(),
        vec![p1.clone(), p2.clone()]
    );
    assert_eq!(
        f.store.pending_pages(&c, x, at, 1).await.unwrap(),
        vec![p1.clone()]
    );
    let r1 = f.store.ack_pages(&c, x, at, "ack-1-1", 1).await.unwrap();
    assert_eq!(
        r1,
        TransitionReceipt {
            exec_id: x,
            transition_id: "ack-1-1".into(),
            kind: TransitionKind::Ack,
            token_sha256: a.sha256(),
            owner_generation: OwnerGeneration(1),
            owner_fence: o.ownership.fence,
            request_sha256: lc_core::owner::transition_request_sha256(
                TransitionKind::Ack,
                x,
                "attempt=1 through_seq=1"
            ),
            committed_cut: at.cut,
            detail: serde_json::json!({"attempt": 1, "through_seq": 1, "pages_acked": 1}),
        }
    );
    assert_eq!(
        f.store.output(f.tenant, x, 0, 10).await.unwrap(),
        vec![acked(&p1)]
    );
    let h = f.store.heartbeat(&c, x, at, TTL).await.unwrap();
    assert_eq!(
        (h.staged_through, h.acked_through, h.terminal_acked_seq),
        (2, 1, None)
    );
    // The same ACK again: the same receipt, nothing written; the same id
    // with another seq: a conflict.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store.ack_pages(&c, x, at, "ack-1-1", 1).await.unwrap(),
        r1
    );
    assert_eq!(
        f.store
            .ack_pages(&c, x, at, "ack-1-1", 2)
            .await
            .unwrap_err(),
        LcError::IdempotencyConflict {
            key: "ack-1-1".into()
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The terminal page, staged but not acked: no release, neither by the
    // owner nor by the reconciler; the reconciler is not told to release.
    let end = terminal(x, 3, 4);
    f.store
        .stage_pages(&c, x, at, std::slice::from_ref(&end))
        .await
        .unwrap();
    let after_end = data(x, 4, PageKind::Stdout, b"late");
    assert_eq!(
        f.store
            .stage_pages(&c, x, at, &[after_end])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store.release(&c, x, at, "release-1").await.unwrap_err(),
        LcError::ReleaseNotProven { exec_id: x }
    );
    assert_eq!(
        f.store
            .begin_release(lease, Generation(1), TerminalReason::Exited, at)
            .await
            .unwrap_err(),
        LcError::ReleaseNotProven { exec_id: x }
    );
    let w = &f.store.due_work(at, 10).await.unwrap()[0];
    assert_eq!((w.action, w.last_seq), (LeaseAction::Maintain, 3));
    assert_eq!(snapshot(&f.db.url).await, before);

    let r3 = f.store.ack_pages(&c, x, at, "ack-1-3", 3).await.unwrap();
    assert_eq!(
        r3.detail,
        serde_json::json!({"attempt": 1, "through_seq": 3, "pages_acked": 2})
    );
    assert_eq!(
        f.store.output(f.tenant, x, 0, 10).await.unwrap(),
        vec![acked(&p1), acked(&p2), acked(&end)]
    );
    assert_eq!(
        f.store.output(f.tenant, x, 1, 1).await.unwrap(),
        vec![acked(&p2)]
    );
    let h = f.store.heartbeat(&c, x, at, TTL).await.unwrap();
    assert_eq!(
        (h.staged_through, h.acked_through, h.terminal_acked_seq),
        (3, 3, Some(3))
    );
    assert_eq!(f.store.pending_pages(&c, x, at, 10).await.unwrap(), vec![]);

    // Release: the Lease release_pending (exited) once, the ownership
    // released, the units still held until the destroy is proven.
    let rel = f.store.release(&c, x, at, "release-1").await.unwrap();
    assert_eq!(
        rel.detail,
        serde_json::json!({
            "attempt": 1,
            "lease_id": lease.0,
            "lease_generation": 1,
            "reason": "exited",
            "basis": {"basis": "terminal_page_acked", "seq": 3},
        })
    );
    let rec = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (rec.lease_state, rec.terminal_reason),
        (
            Some(LeaseState::ReleasePending),
            Some(TerminalReason::Exited)
        )
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 0, 1, 0)
    );
    let before = snapshot(&f.db.url).await;
    assert_eq!(f.store.release(&c, x, at, "release-1").await.unwrap(), rel);
    // The released owner writes nothing more; the exec is not claimable.
    assert_eq!(
        f.store.heartbeat(&c, x, at, TTL).await.unwrap_err().code(),
        "owner_stale"
    );
    assert_eq!(
        f.store
            .release(&c, x, at, "release-2")
            .await
            .unwrap_err()
            .code(),
        "owner_stale"
    );
    assert_eq!(
        f.store.claim(&token(10), at, TTL, 10).await.unwrap(),
        vec![]
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let w = &f.store.due_work(at, 10).await.unwrap()[0];
    assert_eq!(w.action, LeaseAction::Destroy);
    // The reconciler's begin_release is now a no-op.
    f.store
        .begin_release(lease, Generation(1), TerminalReason::Exited, at)
        .await
        .unwrap();
    assert_eq!(snapshot(&f.db.url).await, before);
    let now = certain(&f.clock).await;
    let out = f
        .store
        .commit_release(lease, Generation(1), &f.provider.absence(lease, 1), now)
        .await
        .unwrap();
    assert_eq!((out.units_returned, out.replay), (1, false));
    let again = f
        .store
        .commit_release(lease, Generation(1), &f.provider.absence(lease, 1), now)
        .await
        .unwrap();
    assert_eq!((again.units_returned, again.replay), (1, true));
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );
    let done = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (done.state, done.terminal_reason, done.exit_code),
        (
            lc_core::ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(4)
        )
    );
    assert_eq!(counts(&f.db.url).await, (1, 3, 3));
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

/// Stages `[data 1, terminal 2]` for `c` and acks them as `ack-1-2`.
async fn stage_and_ack_all(
    f: &Fixture,
    c: &OwnerCredential,
    x: ExecId,
    at: CutReading,
) -> TransitionReceipt {
    f.store
        .stage_pages(
            c,
            x,
            at,
            &[data(x, 1, PageKind::Stdout, b"out"), terminal(x, 2, 0)],
        )
        .await
        .unwrap();
    f.store.ack_pages(c, x, at, "ack-1-2", 2).await.unwrap()
}

/// The transition under test: commits `kind` as its id.
async fn commit_kind(
    f: &Fixture,
    kind: TransitionKind,
    c: &OwnerCredential,
    x: ExecId,
    at: CutReading,
) -> (String, TransitionReceipt) {
    match kind {
        TransitionKind::Ack => ("ack-1-2".into(), stage_and_ack_all(f, c, x, at).await),
        TransitionKind::Cancel => (
            "cancel-1".into(),
            GatewayStore::cancel(&f.store, c, x, at, "cancel-1")
                .await
                .unwrap(),
        ),
        TransitionKind::Release => {
            stage_and_ack_all(f, c, x, at).await;
            (
                "release-1".into(),
                f.store.release(c, x, at, "release-1").await.unwrap(),
            )
        }
        TransitionKind::Send => unreachable!("send is tested with its inputs in tests/input.rs"),
    }
}

async fn replay_kind(
    f: &Fixture,
    kind: TransitionKind,
    c: &OwnerCredential,
    x: ExecId,
    at: CutReading,
    id: &str,
) -> Result<TransitionReceipt, LcError> {
    match kind {
        TransitionKind::Ack => f.store.ack_pages(c, x, at, id, 2).await,
        TransitionKind::Cancel => GatewayStore::cancel(&f.store, c, x, at, id).await,
        TransitionKind::Release => f.store.release(c, x, at, id).await,
        TransitionKind::Send => unreachable!("send is tested with its inputs in tests/input.rs"),
    }
}

const KINDS: [TransitionKind; 3] = [
    TransitionKind::Ack,
    TransitionKind::Cancel,
    TransitionKind::Release,
];

#[tokio::test]
async fn every_transition_replays_only_for_its_current_unexpired_owner() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let a = token(0x11);
    let b = token(0x22);
    let mut cases = Vec::new();
    for kind in KINDS {
        let e = active_exec(&f, kind.as_str(), at).await;
        let o = f
            .store
            .take_over(&a, f.tenant, e.exec_id, at, TTL_MIN)
            .await
            .unwrap();
        let c = cred_of(&o, &a);
        let (id, receipt) = commit_kind(&f, kind, &c, e.exec_id, at).await;
        assert_eq!(
            (
                receipt.kind,
                receipt.owner_generation,
                receipt.owner_fence,
                receipt.token_sha256
            ),
            (kind, OwnerGeneration(1), o.ownership.fence, a.sha256())
        );
        cases.push((kind, e, c, id, receipt));
    }
    // Same owner, unexpired (its reading): the same receipt, nothing
    // written.
    let before = snapshot(&f.db.url).await;
    for (kind, e, c, id, receipt) in &cases {
        assert_eq!(
            replay_kind(&f, *kind, c, e.exec_id, at, id).await.unwrap(),
            *receipt,
            "{kind:?}"
        );
    }
    assert_eq!(snapshot(&f.db.url).await, before);
    // Expired owner (a certain cut past its heartbeat): refused.
    let past = certain_at(&f, at.cut + TTL_MIN).await;
    for (kind, e, c, id, _) in &cases {
        assert_eq!(
            replay_kind(&f, *kind, c, e.exec_id, past, id)
                .await
                .unwrap_err(),
            LcError::TransitionReplayRefused {
                exec_id: e.exec_id,
                transition_id: id.clone(),
                receipt_generation: OwnerGeneration(1),
                current_generation: OwnerGeneration(1),
            },
            "{kind:?}"
        );
    }
    assert_eq!(snapshot(&f.db.url).await, before);
    // Replaced owner: a takeover, then neither the old owner nor the new
    // one replays the old receipt. A released exec is not taken over (its
    // Lease is release_pending): its receipt stays refused as expired.
    for (kind, e, c, id, _) in &cases {
        let t = f.store.take_over(&b, f.tenant, e.exec_id, past, TTL).await;
        if *kind == TransitionKind::Release {
            assert_eq!(t.unwrap_err().code(), "illegal_transition");
            continue;
        }
        let t = t.unwrap();
        assert_eq!(t.ownership.generation, OwnerGeneration(2));
        let refused = LcError::TransitionReplayRefused {
            exec_id: e.exec_id,
            transition_id: id.clone(),
            receipt_generation: OwnerGeneration(1),
            current_generation: OwnerGeneration(2),
        };
        let before = snapshot(&f.db.url).await;
        assert_eq!(
            replay_kind(&f, *kind, c, e.exec_id, past, id)
                .await
                .unwrap_err(),
            refused,
            "{kind:?}"
        );
        // Even with a reading from before the takeover.
        assert_eq!(
            replay_kind(&f, *kind, c, e.exec_id, at, id)
                .await
                .unwrap_err(),
            refused,
            "{kind:?}"
        );
        assert_eq!(
            replay_kind(&f, *kind, &cred_of(&t, &b), e.exec_id, past, id)
                .await
                .unwrap_err(),
            refused,
            "{kind:?}"
        );
        assert_eq!(snapshot(&f.db.url).await, before);
    }
    // Receipts are immutable in the database itself.
    let mut conn = PgConnection::connect(&f.db.url).await.unwrap();
    for sql in [
        "UPDATE lc_transitions SET detail = '{}'::jsonb",
        "DELETE FROM lc_transitions",
        "TRUNCATE lc_transitions",
    ] {
        let err = sqlx::query(sql).execute(&mut conn).await.unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS03"),
            "{sql}"
        );
    }
    // Ownership and pages only move forward.
    let x = cases[0].1.exec_id;
    for sql in [
        "UPDATE lc_exec_owners SET generation = generation - 1 WHERE exec_id = $1",
        "UPDATE lc_exec_owners SET heartbeat_expiry_floor_us = heartbeat_expiry_floor_us - 1 WHERE exec_id = $1",
        "UPDATE lc_exec_owners SET fence = fence + 1000 WHERE exec_id = $1",
    ] {
        let err = sqlx::query(sql)
            .bind(x.0)
            .execute(&mut conn)
            .await
            .unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS04"),
            "{sql}"
        );
    }
    for sql in [
        "UPDATE lc_output_pages SET state = 'pending' WHERE exec_id = $1",
        "UPDATE lc_output_pages SET length = length + 1 WHERE exec_id = $1 AND seq = 1",
        "DELETE FROM lc_output_pages WHERE exec_id = $1",
    ] {
        let err = sqlx::query(sql)
            .bind(x.0)
            .execute(&mut conn)
            .await
            .unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS05"),
            "{sql}"
        );
    }
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_replay_racing_a_takeover_has_one_consistent_outcome() {
    let f = fixture(6).await;
    let a = token(0x33);
    let b = token(0x44);
    for round in 0..2 {
        let at = certain(&f.clock).await;
        let mut cases = Vec::new();
        for kind in KINDS {
            let key = format!("{}-{round}", kind.as_str());
            let e = active_exec(&f, &key, at).await;
            let o = f
                .store
                .take_over(&a, f.tenant, e.exec_id, at, TTL_MIN)
                .await
                .unwrap();
            let c = cred_of(&o, &a);
            let (id, receipt) = commit_kind(&f, kind, &c, e.exec_id, at).await;
            cases.push((kind, e, c, id, receipt));
        }
        let past = certain_at(&f, at.cut + TTL_MIN).await;
        for (kind, e, c, id, receipt) in &cases {
            let rows = counts(&f.db.url).await;
            // The old owner replays with its reading from before its
            // expiry while another gateway takes over on a certain cut
            // past it.
            let (replay, takeover) = tokio::join!(
                replay_kind(&f, *kind, c, e.exec_id, at, id),
                f.store.take_over(&b, f.tenant, e.exec_id, past, TTL),
            );
            if *kind == TransitionKind::Release {
                // A released exec is not taken over; its owner's replay
                // on the unexpired reading is the receipt.
                assert_eq!(takeover.unwrap_err().code(), "illegal_transition");
                assert_eq!(replay.unwrap(), *receipt);
            } else {
                let t = takeover.unwrap();
                assert_eq!(
                    (t.ownership.generation, t.basis),
                    (OwnerGeneration(2), TakeoverBasis::Expired)
                );
                match replay {
                    Ok(r) => assert_eq!(r, *receipt, "{kind:?}"),
                    Err(e2) => assert_eq!(
                        e2,
                        LcError::TransitionReplayRefused {
                            exec_id: e.exec_id,
                            transition_id: id.clone(),
                            receipt_generation: OwnerGeneration(1),
                            current_generation: OwnerGeneration(2),
                        },
                        "{kind:?}"
                    ),
                }
                // After the race the old owner is refused either way.
                assert_eq!(
                    replay_kind(&f, *kind, c, e.exec_id, at, id)
                        .await
                        .unwrap_err()
                        .code(),
                    "transition_replay_refused"
                );
            }
            // The replay wrote nothing, whatever the order.
            assert_eq!(counts(&f.db.url).await, rows, "{kind:?}");
        }
    }
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_cancel_receipt_makes_the_release_cancelled_and_begin_release_exited_needs_an_acked_page()
{
    let f = fixture(2).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "c", at).await;
    let x = e.exec_id;
    let a = token(0x55);
    let o = f.store.take_over(&a, f.tenant, x, at, TTL).await.unwrap();
    let c = cred_of(&o, &a);
    GatewayStore::cancel(&f.store, &c, x, at, "cancel-1")
        .await
        .unwrap();
    // The command's terminal page after SIGKILL.
    let end = PageMeta::of_page(
        x,
        AttemptNo(1),
        &Page::terminal(1, ExitStatus::signaled(9)).unwrap(),
    );
    f.store
        .stage_pages(&c, x, at, std::slice::from_ref(&end))
        .await
        .unwrap();
    f.store.ack_pages(&c, x, at, "ack-1-1", 1).await.unwrap();
    let rel = f.store.release(&c, x, at, "release-1").await.unwrap();
    assert_eq!(rel.detail["reason"], "cancelled");
    let rec = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (rec.lease_state, rec.terminal_reason),
        (
            Some(LeaseState::ReleasePending),
            Some(TerminalReason::Cancelled)
        )
    );

    // Without any page, the reconciler cannot release as exited; it still
    // can as cancelled.
    let e2 = active_exec(&f, "c2", at).await;
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .begin_release(
                e2.canonical.lease_id,
                Generation(1),
                TerminalReason::Exited,
                at
            )
            .await
            .unwrap_err(),
        LcError::ReleaseNotProven {
            exec_id: e2.exec_id
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let w = f
        .store
        .begin_release(
            e2.canonical.lease_id,
            Generation(1),
            TerminalReason::Cancelled,
            at,
        )
        .await
        .unwrap();
    assert_eq!(w.state, LeaseState::ReleasePending);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (2, 0, 2, 0)
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn concurrent_claims_take_disjoint_execs_and_together_all_of_them() {
    let f = fixture(6).await;
    let at = certain(&f.clock).await;
    let mut all = Vec::new();
    for i in 0..6 {
        all.push(active_exec(&f, &format!("c{i}"), at).await.exec_id);
    }
    let (a, b) = (token(0x61), token(0x62));
    let (ra, rb) = tokio::join!(f.store.claim(&a, at, TTL, 4), f.store.claim(&b, at, TTL, 4));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let mut got: Vec<ExecId> = ra
        .iter()
        .chain(rb.iter())
        .map(|o| o.ownership.exec_id)
        .collect();
    got.sort();
    // Each exec at most once. A claim skips the rows the other holds, and
    // one that read its candidates before the other committed finds their
    // owners live and skips them too; a third claim takes what is left.
    assert!(ra.len() <= 4 && rb.len() <= 4);
    let mut dedup = got.clone();
    dedup.dedup();
    assert_eq!(dedup, got, "no exec owned twice");
    let rest = f.store.claim(&token(0x63), at, TTL, 10).await.unwrap();
    let mut owned: Vec<ExecId> = got
        .into_iter()
        .chain(rest.iter().map(|o| o.ownership.exec_id))
        .collect();
    owned.sort();
    assert_eq!(owned, all);
    // Every ownership is generation 1 with its own fence.
    let mut fences: Vec<i64> = ra
        .iter()
        .chain(rb.iter())
        .chain(rest.iter())
        .map(|o| {
            assert_eq!(o.ownership.generation, OwnerGeneration(1));
            o.ownership.fence.0
        })
        .collect();
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), 6);
    assert_eq!(counts(&f.db.url).await, (6, 0, 0));
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_database_bounds_the_heartbeat_by_the_horizon_and_the_inventory_counts_owners() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "h", at).await;
    let o = f
        .store
        .take_over(&token(0x71), f.tenant, e.exec_id, at, TTL)
        .await
        .unwrap();
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    // The default horizon is 3650 days: one more is refused by the
    // database, exactly cut + horizon is accepted.
    let err = sqlx::query(
        "UPDATE lc_exec_owners SET heartbeat_expiry_floor_us = \
             (SELECT cut_floor_us FROM tollgate_safetime) + 3651::bigint * 86400 * 1000000 \
          WHERE exec_id = $1",
    )
    .bind(e.exec_id.0)
    .execute(&mut c)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("LCS01")
    );
    sqlx::query(
        "UPDATE lc_exec_owners SET heartbeat_expiry_floor_us = s.cut_floor_us + 3650::bigint * 86400 * 1000000, \
                heartbeat_expiry_submicro_ns = s.cut_submicro_ns \
           FROM tollgate_safetime s WHERE exec_id = $1",
    )
    .bind(e.exec_id.0)
    .execute(&mut c)
    .await
    .unwrap();
    // A new owner with the same or a lower fence, or a skipped
    // generation: refused.
    for (generation, fence) in [(2, o.ownership.fence.0), (3, o.ownership.fence.0 + 1000)] {
        let err = sqlx::query(
            "UPDATE lc_exec_owners SET generation = $2, fence = $3, basis = 'expired' WHERE exec_id = $1",
        )
        .bind(e.exec_id.0)
        .bind(generation)
        .bind(fence)
        .execute(&mut c)
        .await
        .unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS04"),
            "generation {generation} fence {fence}"
        );
    }
    f.sampler.stop().await;

    // The initial cut: an unreleased owner or a transition receipt alone
    // (their other rows left out: only they are the authority under
    // test) quarantines it.
    let empty = migrated_db().await;
    let (q, kind, inv) = first_claim(&empty.url).await;
    assert_eq!((q, kind.as_str()), (false, "initial_cut"));
    assert_eq!(
        (&inv["unreleased_owners"], &inv["transition_receipts"]),
        (&serde_json::json!(0), &serde_json::json!(0))
    );
    for (what, sql) in [
        (
            "unreleased_owners",
            "INSERT INTO lc_exec_owners (exec_id, tenant_id, token_sha256, generation, \
                 heartbeat_expiry_floor_us, heartbeat_expiry_submicro_ns, basis) \
             VALUES (1, 1, decode(repeat('00', 32), 'hex'), 1, 5000000, 0, 'unowned')",
        ),
        (
            "transition_receipts",
            "INSERT INTO lc_transitions (exec_id, transition_id, kind, token_sha256, \
                 owner_generation, owner_fence, request_sha256, committed_floor_us, \
                 committed_submicro_ns, detail) \
             VALUES (1, 'ack-1-1', 'ack', decode(repeat('00', 32), 'hex'), 1, 1, \
                 decode(repeat('00', 32), 'hex'), 0, 0, '{}')",
        ),
    ] {
        let db = migrated_db().await;
        let mut c = PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(&format!(
            "BEGIN; SET LOCAL session_replication_role = replica; {sql}; COMMIT;"
        ))
        .execute(&mut c)
        .await
        .unwrap();
        let (q, kind, inv) = first_claim(&db.url).await;
        assert_eq!((q, kind.as_str()), (true, "initial_quarantine"), "{what}");
        assert_eq!(inv[what], 1, "{what}");
    }
}

/// `(seq, bytes, length, state, owner_generation)` of a stored page.
type PageRow = (i64, Option<Vec<u8>>, i32, String, Option<i64>);

#[tokio::test]
async fn migration_0002_keeps_the_pages_written_before_it_acknowledged_with_their_bytes() {
    let db = fresh_db().await;
    // The schema as it was before 0002: every line, Little Compute's at 1.
    let all = sqlx::migrate!("./migrations");
    let first: Vec<sqlx::migrate::Migration> = all.migrations[..1].to_vec();
    assert_eq!(first[0].version, 1);
    let before = tollgate_pg::Schema::current().with_line(pgkit::MigrationLine::new(
        lc_pg::LC_LINE,
        lc_pg::LC_MIGRATIONS_TABLE,
        std::borrow::Cow::<[sqlx::migrate::Migration]>::Owned(first),
    ));
    before.migrate(&db.url).await.unwrap();
    let mut c = PgConnection::connect(&db.url).await.unwrap();
    // Two legacy pages (their other rows left out).
    sqlx::raw_sql(
        "BEGIN; SET LOCAL session_replication_role = replica; \
         INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256) \
         VALUES (1, 1, 1, 'stdout', '\\x6869', sha256('\\x6869'::bytea)); \
         INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, exit_code) \
         VALUES (1, 1, 2, 'terminal', '\\x', sha256('\\x'::bytea), 0); \
         COMMIT;",
    )
    .execute(&mut c)
    .await
    .unwrap();
    lc_pg::migrate(&db.url).await.unwrap();
    let rows: Vec<PageRow> = sqlx::query_as(
        "SELECT seq, bytes, length, state, owner_generation FROM lc_output_pages ORDER BY seq",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (1, Some(b"hi".to_vec()), 2, "acked".into(), None),
            (2, Some(Vec::new()), 0, "acked".into(), None),
        ]
    );
    // The checks that replace 0001's: each refused insert names its rule.
    let mut tx = c.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    for (what, sql) in [
        (
            "a digest that is not the bytes'",
            "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, length, state) \
             VALUES (1, 1, 3, 'stdout', '\\x01', sha256('\\x02'::bytea), 1, 'acked')",
        ),
        (
            "a length that is not the bytes'",
            "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, length, state) \
             VALUES (1, 1, 3, 'stdout', '\\x01', sha256('\\x01'::bytea), 2, 'acked')",
        ),
        (
            "no bytes and no owner",
            "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, sha256, length, state) \
             VALUES (1, 1, 3, 'stdout', sha256('\\x01'::bytea), 1, 'pending')",
        ),
        (
            "a terminal page with a length",
            "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, sha256, length, state, \
                 exit_code, owner_generation, owner_fence) \
             VALUES (1, 1, 3, 'terminal', sha256('\\x01'::bytea), 1, 'pending', 0, 1, 1)",
        ),
        (
            "length 0 with another digest",
            "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, sha256, length, state, \
                 owner_generation, owner_fence) \
             VALUES (1, 1, 3, 'stdout', sha256('\\x01'::bytea), 0, 'pending', 1, 1)",
        ),
    ] {
        sqlx::query("SAVEPOINT s").execute(&mut *tx).await.unwrap();
        let err = sqlx::query(sql).execute(&mut *tx).await.unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("23514"),
            "{what}"
        );
        sqlx::query("ROLLBACK TO SAVEPOINT s")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    // A staged page without its bytes is accepted.
    sqlx::query(
        "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, sha256, length, state, \
             owner_generation, owner_fence) \
         VALUES (1, 1, 3, 'stdout', sha256('\\x01'::bytea), 1, 'pending', 1, 1)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn a_successor_finishes_the_pending_pages_of_the_owner_it_replaced() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "succ", at).await;
    let x = e.exec_id;
    let (a, b) = (token(0x81), token(0x82));
    let oa = f
        .store
        .take_over(&a, f.tenant, x, at, TTL_MIN)
        .await
        .unwrap();
    let ca = cred_of(&oa, &a);
    let p1 = data(x, 1, PageKind::Stdout, b"one");
    let p2 = data(x, 2, PageKind::Stdout, b"two");
    f.store
        .stage_pages(&ca, x, at, &[p1.clone(), p2.clone()])
        .await
        .unwrap();
    f.store.ack_pages(&ca, x, at, "ack-1-1", 1).await.unwrap();
    // A dies after committing page 2's metadata; B takes over once a
    // certain cut passes A's heartbeat.
    let past = certain_at(&f, at.cut + TTL_MIN).await;
    let ob = f.store.take_over(&b, f.tenant, x, past, TTL).await.unwrap();
    assert_eq!(
        (ob.staged_through, ob.acked_through, ob.terminal_acked_seq),
        (2, 1, None)
    );
    let cb = cred_of(&ob, &b);
    assert_eq!(
        f.store.pending_pages(&cb, x, past, 10).await.unwrap(),
        vec![p2.clone()]
    );
    // Re-staging what the spool still holds is a no-op; A's late writes
    // are refused and change nothing.
    assert_eq!(
        f.store
            .stage_pages(&cb, x, past, std::slice::from_ref(&p2))
            .await
            .unwrap(),
        StageReport {
            staged: 0,
            duplicates: 1,
            staged_through: 2
        }
    );
    let rows = counts(&f.db.url).await;
    assert_eq!(rows, (1, 1, 2));
    for r in [
        f.store.ack_pages(&ca, x, at, "ack-1-2", 2).await,
        f.store.ack_pages(&ca, x, past, "ack-1-2", 2).await,
    ] {
        assert_eq!(
            r.unwrap_err(),
            LcError::OwnerStale {
                exec_id: x,
                presented: OwnerGeneration(1),
                current: OwnerGeneration(2),
            }
        );
    }
    assert_eq!(
        f.store
            .stage_pages(&ca, x, at, &[terminal(x, 3, 0)])
            .await
            .unwrap_err()
            .code(),
        "owner_stale"
    );
    assert_eq!(counts(&f.db.url).await, rows);
    // B completes the ACK and the output reads both pages once, in order.
    let r = f.store.ack_pages(&cb, x, past, "ack-1-2", 2).await.unwrap();
    assert_eq!(
        (r.owner_generation, r.owner_fence, r.token_sha256),
        (OwnerGeneration(2), ob.ownership.fence, b.sha256())
    );
    assert_eq!(
        r.detail,
        serde_json::json!({"attempt": 1, "through_seq": 2, "pages_acked": 1})
    );
    assert_eq!(
        f.store.output(f.tenant, x, 0, 10).await.unwrap(),
        vec![acked(&p1), acked(&p2)]
    );
    // The staged rows keep the ownership that staged them.
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let by: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT seq, owner_generation, owner_fence FROM lc_output_pages WHERE exec_id = $1 ORDER BY seq",
    )
    .bind(x.0)
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(
        by,
        vec![(1, 1, oa.ownership.fence.0), (2, 1, oa.ownership.fence.0)]
    );
    f.sampler.stop().await;
}
