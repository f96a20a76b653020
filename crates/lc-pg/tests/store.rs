//! The store against a real PostgreSQL with a real in-process sampler:
//! admission with exact Tollgate balances, refusals that write nothing,
//! operation-key replays and conflicts, the uncertain cut, renewal,
//! release only with valid evidence on a certain cut and exactly once,
//! output pages, operation-key receipts and GC to the nanosecond, the
//! database guards and the initial-cut inventory, and the providers'
//! measurements.

mod support;

#[path = "store/authorities.rs"]
mod authorities;
#[path = "store/measurements.rs"]
mod measurements;
#[path = "store/tokens.rs"]
mod tokens;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use lc_core::approval::{ApprovalDecision, ApprovalPolicy, ApprovalRequire, ApproverKind};
use lc_core::evidence::{InstanceState, Statement};
use lc_core::owner::{PageMeta, StoredPage};
use lc_core::page::{ExitStatus, Page, PageKind};
use lc_core::{
    ControlStore, CutReading, Digest, ExecId, ExecRequest, ExecState, Generation, LcError,
    LeaseAction, LeaseState, OpScope, OutputPage, ReconcileStore, TenantId, TerminalReason,
};
use sqlx::{Connection, PgConnection};
use support::*;

#[tokio::test]
async fn admission_holds_the_shapes_units_and_replays_by_key() {
    let f = fixture(5).await;
    let at = certain(&f.clock).await;
    let small = f
        .store
        .admit_exec(
            &op("e1", "small echo"),
            at,
            f.tenant,
            &req("small", &["echo", "hi"]),
        )
        .await
        .unwrap();
    assert_eq!(small.state, ExecState::Admitted);
    assert_eq!(small.units, 1);
    assert_eq!(small.lease_state, Some(LeaseState::Allocating));
    assert_eq!(small.admitted_cut, at.cut);
    assert_eq!(small.canonical.exec_id, small.exec_id);
    assert_eq!(small.canonical.provider_id, f.provider.id);
    assert_eq!(small.canonical.runtime, Digest::of(b"base manifest"));
    assert_eq!(small.command, ["echo", "hi"]);
    let t = f.store.tenant(f.tenant).await.unwrap();
    assert_eq!(balances(&t), (5, 4, 1, 0));

    let medium = f
        .store
        .admit_exec(&op("e2", "medium"), at, f.tenant, &req("medium", &["true"]))
        .await
        .unwrap();
    assert_eq!(medium.units, 2);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (5, 2, 3, 0)
    );

    // The same key and body: the same exec, nothing more held.
    let later = certain(&f.clock).await;
    let again = f
        .store
        .admit_exec(
            &op("e1", "small echo"),
            later,
            f.tenant,
            &req("small", &["echo", "hi"]),
        )
        .await
        .unwrap();
    assert_eq!(again, small);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (5, 2, 3, 0)
    );
    // The same key with another body: a conflict, nothing written.
    let before = snapshot(&f.db.url).await;
    let err = f
        .store
        .admit_exec(
            &op("e1", "other"),
            later,
            f.tenant,
            &req("small", &["false"]),
        )
        .await
        .unwrap_err();
    assert_eq!(err, LcError::IdempotencyConflict { key: "e1".into() });
    assert_eq!(snapshot(&f.db.url).await, before);

    // The lease expiry is exactly cut + 60 s, as the work list shows.
    let work = f.store.due_work(later, 10).await.unwrap();
    assert_eq!(work.len(), 2);
    assert_eq!(work[0].lease_id, small.canonical.lease_id);
    assert_eq!(work[0].expiry, at.cut + SignedDuration::from_secs(60));
    assert_eq!(work[0].action, LeaseAction::Allocate);
    assert_eq!(work[0].generation, Generation(1));
    assert_eq!(work[0].provider_url, "http://127.0.0.1:7001");
    assert_eq!(f.store.execs(f.tenant, None, 10).await.unwrap().len(), 2);
    assert_eq!(
        f.store
            .execs(f.tenant, Some(small.exec_id), 10)
            .await
            .unwrap()
            .iter()
            .map(|e| e.exec_id)
            .collect::<Vec<_>>(),
        [medium.exec_id]
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn refusals_write_nothing() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let before = snapshot(&f.db.url).await;
    let err = f
        .store
        .admit_exec(&op("m1", "medium"), at, f.tenant, &req("medium", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        LcError::InsufficientCapacity {
            requested: 2,
            available: 1
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );

    // Bad input, unknown tenant, unknown runtime, a reading ahead of the
    // persisted cut: each refused with its code, nothing written.
    let codes = [
        (req("huge", &["true"]), f.tenant, at, "invalid_shape"),
        (req("small", &[]), f.tenant, at, "invalid_command"),
        (req("small", &["a\0b"]), f.tenant, at, "invalid_command"),
        (
            ExecRequest {
                timeout_ms: Some(0),
                ..req("small", &["true"])
            },
            f.tenant,
            at,
            "invalid_timeout",
        ),
        (
            ExecRequest {
                runtime: "No Such".into(),
                ..req("small", &["true"])
            },
            f.tenant,
            at,
            "invalid_runtime",
        ),
        (
            ExecRequest {
                runtime: "nope".into(),
                ..req("small", &["true"])
            },
            f.tenant,
            at,
            "not_found",
        ),
        (req("small", &["true"]), TenantId(999), at, "not_found"),
        (
            req("small", &["true"]),
            f.tenant,
            CutReading::certain(at.cut + SignedDuration::from_hours(1)),
            "invalid_cut_reading",
        ),
    ];
    for (i, (r, tenant, at, code)) in codes.into_iter().enumerate() {
        let err = f
            .store
            .admit_exec(&op(&format!("bad{i}"), &format!("{r:?}")), at, tenant, &r)
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "case {i}: {err}");
    }
    assert_eq!(snapshot(&f.db.url).await, before);
    f.sampler.stop().await;
}

#[tokio::test]
async fn an_uncertain_cut_admits_nothing_and_renewal_never_shortens() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("a", "a"), at, f.tenant, &req("small", &["sleep", "9"]))
        .await
        .unwrap();
    let lease = e.canonical.lease_id;
    let g = Generation(1);
    f.store.mark_active(lease, g, at).await.unwrap();
    assert_eq!(
        f.store.exec(f.tenant, e.exec_id).await.unwrap().state,
        ExecState::Running
    );
    let expiry0 = at.cut + SignedDuration::from_secs(60);

    // A renewal with an older reading keeps the later expiry.
    let older = CutReading::certain(at.cut - SignedDuration::from_nanos(1));
    let w = f.store.renew(lease, g, older).await.unwrap();
    assert_eq!(w.expiry, expiry0);
    // A later one extends to exactly cut + 60 s.
    let later = wait_reading(&f.clock, 10, "a later certain cut", |r| {
        r.certain && r.cut > at.cut
    })
    .await;
    let w = f.store.renew(lease, g, later).await.unwrap();
    assert_eq!(w.expiry, later.cut + SignedDuration::from_secs(60));
    assert_eq!(w.action, LeaseAction::Maintain);

    // Pause the sampler: the clock turns uncertain (stale) within the gap.
    f.sampler.stop().await;
    let frozen = wait_reading(&f.clock, 10, "an uncertain cut", |r| !r.certain).await;
    let before = snapshot(&f.db.url).await;
    let err = f
        .store
        .admit_exec(&op("b", "b"), frozen, f.tenant, &req("small", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        LcError::TimeUncertain {
            retry_after_s: frozen.retry_after_s
        }
    );
    assert!(frozen.retry_after_s >= 1);
    assert_eq!(snapshot(&f.db.url).await, before);
    // A replay of an admitted key still answers while uncertain.
    assert_eq!(
        f.store
            .admit_exec(
                &op("a", "a"),
                frozen,
                f.tenant,
                &req("small", &["sleep", "9"])
            )
            .await
            .unwrap()
            .exec_id,
        e.exec_id
    );
    // Renewal on the frozen cut never shortens: max(current, cut + ttl).
    let w = f.store.renew(lease, g, frozen).await.unwrap();
    assert_eq!(
        w.expiry,
        (later.cut + SignedDuration::from_secs(60)).max(frozen.cut + SignedDuration::from_secs(60))
    );
    // Nothing expires while uncertain, however late the reading claims.
    let far = CutReading::uncertain(frozen.cut, 1);
    assert_eq!(w.action, LeaseAction::Maintain);
    assert_eq!(
        f.store.due_work(far, 10).await.unwrap()[0].action,
        LeaseAction::Maintain
    );
    let err = f
        .store
        .begin_release(lease, g, TerminalReason::Expired, frozen)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "time_uncertain");
    // A stale generation is fenced.
    assert_eq!(
        f.store
            .renew(lease, Generation(2), frozen)
            .await
            .unwrap_err()
            .code(),
        "fenced"
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (3, 2, 1, 0)
    );
}

#[tokio::test]
async fn release_needs_valid_evidence_on_a_certain_cut_and_returns_units_once() {
    let f = fixture(2).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(
            &op("x", "x"),
            at,
            f.tenant,
            &req("medium", &["sleep", "60"]),
        )
        .await
        .unwrap();
    let lease = e.canonical.lease_id;
    let g = Generation(1);
    f.store.mark_active(lease, g, at).await.unwrap();
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (2, 0, 2, 0)
    );

    // Cancel: the exec is flagged; the reconciler begins the release.
    let c = f
        .store
        .cancel(&op("cx", "cancel"), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    assert!(c.cancel_requested);
    let w = &f.store.due_work(at, 10).await.unwrap()[0];
    assert_eq!(
        w.action,
        LeaseAction::BeginRelease(TerminalReason::Cancelled)
    );
    // The Reservation's grant runs cut + 10 min (the configured TTL,
    // within the policy's 1 h), in Tollgate and in the store alike.
    let ten_min = SignedDuration::from_mins(10);
    assert_eq!(
        reservation_expiries(&f.db.url).await,
        vec![(at.cut + ten_min, at.cut + ten_min)]
    );
    let later = wait_reading(&f.clock, 10, "a later certain cut", |r| {
        r.certain && r.cut > at.cut
    })
    .await;
    let w = f
        .store
        .begin_release(lease, g, TerminalReason::Cancelled, later)
        .await
        .unwrap();
    assert_eq!(
        (w.state, w.action),
        (LeaseState::ReleasePending, LeaseAction::Destroy)
    );
    // Beginning the release renewed the Reservation; the lease keeps its
    // expiry.
    assert_eq!(
        reservation_expiries(&f.db.url).await,
        vec![(later.cut + ten_min, later.cut + ten_min)]
    );
    assert_eq!(w.expiry, at.cut + SignedDuration::from_secs(60));
    // A release-pending Reservation is still renewed, never shortened.
    f.store.renew(lease, g, at).await.unwrap();
    assert_eq!(
        reservation_expiries(&f.db.url).await,
        vec![(later.cut + ten_min, later.cut + ten_min)]
    );

    // Forged: signed by another key; an observation is no proof; another
    // generation; not an envelope. Each refused, nothing written.
    let before = snapshot(&f.db.url).await;
    let forger = TestProvider::new("p1", 9);
    let cases = [
        forger.absence(lease, 1),
        f.provider.sign(Statement::Observation {
            provider_id: "p1".into(),
            lease_id: lease.0,
            generation: 1,
            state: InstanceState::Absent,
        }),
        f.provider.absence(lease, 2),
        f.provider
            .absence(lc_core::SandboxLeaseId(lease.0 + 100), 1),
        serde_json::json!({"payloadType": "x"}),
    ];
    for (i, ev) in cases.iter().enumerate() {
        let err = f.store.commit_release(lease, g, ev, at).await.unwrap_err();
        assert_eq!(err.code(), "evidence_rejected", "case {i}: {err}");
    }
    // A tampered payload: the signature no longer verifies.
    let mut tampered = f.provider.absence(lease, 1);
    tampered["payload"] = serde_json::Value::String(base64_of(&format!(
        r#"{{"generation":1,"lease_id":{},"provider_id":"p1","statement":"fence"}}"#,
        lease.0
    )));
    assert_eq!(
        f.store
            .commit_release(lease, g, &tampered, at)
            .await
            .unwrap_err()
            .code(),
        "evidence_rejected"
    );
    // Valid evidence on an uncertain cut: refused.
    let good = f.provider.absence(lease, 1);
    assert_eq!(
        f.store
            .commit_release(lease, g, &good, CutReading::uncertain(at.cut, 1))
            .await
            .unwrap_err(),
        LcError::TimeUncertain { retry_after_s: 1 }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (2, 0, 2, 0)
    );

    // Valid on a certain cut: released, units back, exec terminal.
    let now = certain(&f.clock).await;
    let out = f.store.commit_release(lease, g, &good, now).await.unwrap();
    assert_eq!(
        (
            out.units_returned,
            out.replay,
            out.released_cut,
            out.exec_id
        ),
        (2, false, now.cut, e.exec_id)
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (2, 2, 0, 0)
    );
    let done = f.store.exec(f.tenant, e.exec_id).await.unwrap();
    assert_eq!(done.state, ExecState::Terminal);
    assert_eq!(done.terminal_reason, Some(TerminalReason::Cancelled));
    assert_eq!(done.lease_state, Some(LeaseState::Released));
    assert!(f.store.due_work(now, 10).await.unwrap().is_empty());

    // A second commit is a replay: the same outcome, nothing changes.
    let after = snapshot(&f.db.url).await;
    let later = certain(&f.clock).await;
    let again = f
        .store
        .commit_release(lease, g, &good, later)
        .await
        .unwrap();
    assert!(again.replay);
    assert_eq!((again.units_returned, again.released_cut), (2, now.cut));
    assert_eq!(snapshot(&f.db.url).await, after);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (2, 2, 0, 0)
    );
    // Released is final.
    assert_eq!(
        f.store.renew(lease, g, later).await.unwrap_err().code(),
        "illegal_transition"
    );
    assert_eq!(
        f.store
            .mark_active(lease, g, later)
            .await
            .unwrap_err()
            .code(),
        "illegal_transition"
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

/// `(store's expiry, Tollgate's expiry)` of every Reservation.
async fn reservation_expiries(url: &str) -> Vec<(Timestamp, Timestamp)> {
    let mut c = PgConnection::connect(url).await.unwrap();
    let rows: Vec<(i64, i32, i64, i32)> = sqlx::query_as(
        "SELECT r.expiry_floor_us, r.expiry_submicro_ns, l.expiry_floor_us, l.expiry_submicro_ns::int \
           FROM lc_reservations r JOIN tollgate_leases l ON l.lease_id = r.tollgate_lease_id \
          ORDER BY r.exec_id",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    let t =
        |f: i64, s: i32| Timestamp::from_nanosecond(i128::from(f) * 1000 + i128::from(s)).unwrap();
    rows.into_iter()
        .map(|(a, b, c, d)| (t(a, b), t(c, d)))
        .collect()
}

fn base64_of(s: &str) -> String {
    use std::fmt::Write as _;
    // Standard base64 with padding, written here to keep the test's
    // dependencies to the store's.
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                let _ = out.write_char(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How the store returns `p`, a page it holds the bytes of.
fn stored(p: &OutputPage) -> StoredPage {
    StoredPage {
        meta: PageMeta::of_page(p.exec_id, p.attempt, &p.to_page().unwrap()),
        bytes: Some(p.bytes.clone()),
    }
}

fn page(e: ExecId, p: Page) -> OutputPage {
    OutputPage::from_page(e, lc_core::AttemptNo(1), &p)
}

#[tokio::test]
async fn output_pages_are_idempotent_ordered_and_end_with_the_terminal_page() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(
            &op("o", "o"),
            at,
            f.tenant,
            &req("small", &["sh", "-c", "echo"]),
        )
        .await
        .unwrap();
    let (lease, g, x) = (e.canonical.lease_id, Generation(1), e.exec_id);
    f.store.mark_active(lease, g, at).await.unwrap();
    let p1 = page(
        x,
        Page::data(1, PageKind::Stdout, b"hello ".to_vec()).unwrap(),
    );
    let p2 = page(
        x,
        Page::data(2, PageKind::Stderr, b"warn".to_vec()).unwrap(),
    );
    let r = f
        .store
        .append_pages(lease, g, &[p2.clone(), p1.clone()])
        .await
        .unwrap();
    assert_eq!((r.appended, r.duplicates, r.last_seq), (2, 0, 2));
    // The same pages again: no-ops.
    let r = f
        .store
        .append_pages(lease, g, &[p1.clone(), p2.clone()])
        .await
        .unwrap();
    assert_eq!((r.appended, r.duplicates, r.last_seq), (0, 2, 2));
    // Seq 2 with other bytes: a conflict; a gap; a wrong sha; nothing written.
    let before = snapshot(&f.db.url).await;
    let other2 = page(
        x,
        Page::data(2, PageKind::Stderr, b"WARN".to_vec()).unwrap(),
    );
    assert_eq!(
        f.store.append_pages(lease, g, &[other2]).await.unwrap_err(),
        LcError::PageConflict { exec_id: x, seq: 2 }
    );
    let gap = page(x, Page::data(4, PageKind::Stdout, b"x".to_vec()).unwrap());
    assert_eq!(
        f.store
            .append_pages(lease, g, &[gap])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    let mut bad_sha = page(x, Page::data(3, PageKind::Stdout, b"y".to_vec()).unwrap());
    bad_sha.sha256 = Digest([0; 32]);
    assert_eq!(
        f.store
            .append_pages(lease, g, &[bad_sha])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    let mut foreign = page(x, Page::data(3, PageKind::Stdout, b"z".to_vec()).unwrap());
    foreign.exec_id = ExecId(x.0 + 1);
    assert_eq!(
        f.store
            .append_pages(lease, g, &[foreign])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    assert_eq!(
        f.store
            .append_pages(lease, Generation(2), std::slice::from_ref(&p1))
            .await
            .unwrap_err()
            .code(),
        "fenced"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The full 64 KiB page and the terminal page.
    let big = page(
        x,
        Page::data(3, PageKind::Stdout, vec![b'z'; 65_536]).unwrap(),
    );
    let end = page(x, Page::terminal(4, ExitStatus::exited(3)).unwrap());
    let r = f
        .store
        .append_pages(lease, g, &[big.clone(), end.clone()])
        .await
        .unwrap();
    assert_eq!((r.appended, r.last_seq), (2, 4));
    let after_end = page(
        x,
        Page::data(5, PageKind::Stdout, b"late".to_vec()).unwrap(),
    );
    assert_eq!(
        f.store
            .append_pages(lease, g, &[after_end])
            .await
            .unwrap_err()
            .code(),
        "invalid_page"
    );
    // The reconciler's pages are acknowledged and keep their bytes.
    let all = f.store.output(f.tenant, x, 0, 100).await.unwrap();
    assert_eq!(
        all,
        vec![stored(&p1), stored(&p2), stored(&big), stored(&end)]
    );
    assert_eq!(
        f.store.output(f.tenant, x, 2, 1).await.unwrap(),
        vec![stored(&big)]
    );
    assert_eq!(f.store.output(f.tenant, x, 4, 10).await.unwrap(), vec![]);
    assert_eq!(
        f.store
            .output(TenantId(f.tenant.0 + 1), x, 0, 10)
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );

    // The terminal page makes the reconciler release as exited; the exit
    // code is recorded when the release commits.
    let w = &f.store.due_work(at, 10).await.unwrap()[0];
    assert_eq!(w.action, LeaseAction::BeginRelease(TerminalReason::Exited));
    assert_eq!(w.last_seq, 4);
    f.store
        .begin_release(lease, g, TerminalReason::Exited, at)
        .await
        .unwrap();
    let now = certain(&f.clock).await;
    f.store
        .commit_release(lease, g, &f.provider.absence(lease, 1), now)
        .await
        .unwrap();
    let done = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (done.state, done.terminal_reason, done.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(3))
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn expiry_needs_a_certain_cut_past_the_deadline() {
    let f = fixture_with(
        1,
        lc_pg::LcConfig {
            lease_ttl: SignedDuration::from_millis(300),
            ..config()
        },
    )
    .await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("t", "t"), at, f.tenant, &req("small", &["sleep", "60"]))
        .await
        .unwrap();
    let (lease, g) = (e.canonical.lease_id, Generation(1));
    let expiry = at.cut + SignedDuration::from_millis(300);
    // One nanosecond before the deadline: not expired.
    let before = CutReading::certain(expiry - SignedDuration::from_nanos(1));
    let past = wait_reading(&f.clock, 10, "the cut past the lease", |r| {
        r.certain && r.cut >= expiry
    })
    .await;
    assert_eq!(
        f.store.due_work(before, 10).await.unwrap()[0].action,
        LeaseAction::Allocate
    );
    assert_eq!(
        f.store
            .begin_release(lease, g, TerminalReason::Expired, before)
            .await
            .unwrap_err()
            .code(),
        "illegal_transition"
    );
    // At the deadline exactly: expired.
    let at_deadline = CutReading::certain(expiry);
    assert_eq!(
        f.store.due_work(at_deadline, 10).await.unwrap()[0].action,
        LeaseAction::BeginRelease(TerminalReason::Expired)
    );
    let w = f
        .store
        .begin_release(lease, g, TerminalReason::Expired, past)
        .await
        .unwrap();
    assert_eq!(w.state, LeaseState::ReleasePending);
    f.store
        .commit_release(lease, g, &f.provider.absence(lease, 1), past)
        .await
        .unwrap();
    let done = f.store.exec(f.tenant, e.exec_id).await.unwrap();
    assert_eq!(done.terminal_reason, Some(TerminalReason::Expired));
    // No timeout: the Lease's own expiry passed unrenewed.
    assert_eq!(done.expired_by, Some(lc_core::ExpiryCause::Lease));
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn operation_keys_get_receipts_past_the_floor_and_gc_at_floor_plus_ttl() {
    let ttl = SignedDuration::from_millis(500);
    let f = fixture_with(
        10,
        lc_pg::LcConfig {
            operation_ttl: ttl,
            ..config()
        },
    )
    .await;
    // The fixture's own keys (the runtime's and the tenant's, made with the
    // same TTL) get their receipts and are collected first, so every count
    // below is d1's and d2's alone, however far the cut moved meanwhile.
    let fixture_gc = ["rt-base", "t-blue"];
    let mut gc_max = Timestamp::MIN;
    for k in fixture_gc {
        gc_max = gc_max.max(f.store.operation(OpScope::Admin, k).await.unwrap().gc_at);
    }
    let r = wait_reading(&f.clock, 10, "the cut past the fixture's keys", |r| {
        r.certain && r.cut > gc_max
    })
    .await;
    assert_eq!(f.store.attach_receipts(r, 10).await.unwrap(), 2);
    assert_eq!(f.store.gc_operations(r, 10).await.unwrap(), 2);
    let at = certain(&f.clock).await;
    let scope = OpScope::Tenant(f.tenant);
    for k in ["d1", "d2"] {
        f.store.deposit(&op(k, "1"), at, f.tenant, 1).await.unwrap();
    }
    let rec = f.store.operation(scope, "d1").await.unwrap();
    assert_eq!((rec.created_cut, rec.floor), (at.cut, at.cut));
    assert_eq!(rec.ttl_ns, 500_000_000);
    assert_eq!(rec.gc_at, at.cut + ttl);
    assert_eq!(rec.kind, "deposit");
    assert_eq!(rec.result["deposited"], 11);
    assert!(!rec.receipt_attached);
    // A deposit replay returns the recorded result, moves nothing.
    let again = f
        .store
        .deposit(&op("d1", "1"), at, f.tenant, 1)
        .await
        .unwrap();
    assert_eq!(again.deposited, 11);
    assert_eq!(f.store.tenant(f.tenant).await.unwrap().deposited, 12);

    // Wait until the persisted cut is past gc_at + 1 ns, so every reading
    // below is one the store accepts.
    let gc_at = at.cut + ttl;
    wait_reading(&f.clock, 10, "the cut past gc_at", |r| {
        r.certain && r.cut > gc_at + SignedDuration::from_nanos(1)
    })
    .await;
    let ns = SignedDuration::from_nanos(1);
    // Before the receipt, nothing is deletable, however late.
    assert_eq!(
        f.store
            .gc_operations(CutReading::certain(gc_at + ns), 10)
            .await
            .unwrap(),
        0
    );
    // Receipt: not at the floor, not uncertain; one ns past it, yes.
    assert_eq!(
        f.store
            .attach_receipts(CutReading::certain(at.cut), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        f.store
            .attach_receipts(CutReading::uncertain(at.cut + ns, 1), 10)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        f.store
            .attach_receipts(CutReading::certain(at.cut + ns), 10)
            .await
            .unwrap(),
        2, // the two deposits
    );
    assert!(
        f.store
            .operation(scope, "d1")
            .await
            .unwrap()
            .receipt_attached
    );
    // GC of the two deposits (created at `at`): 1 ns before gc_at, kept;
    // uncertain, kept; at gc_at, deleted.
    assert_eq!(
        f.store
            .gc_operations(CutReading::certain(gc_at - ns), 10)
            .await
            .unwrap(),
        0
    );
    for k in ["d1", "d2"] {
        assert!(f.store.operation(scope, k).await.unwrap().receipt_attached);
    }
    assert_eq!(
        f.store
            .gc_operations(CutReading::uncertain(gc_at, 1), 10)
            .await
            .unwrap(),
        0
    );
    let n = f
        .store
        .gc_operations(CutReading::certain(gc_at), 10)
        .await
        .unwrap();
    assert_eq!(n, 2);
    for k in ["d1", "d2"] {
        assert_eq!(
            f.store.operation(scope, k).await.unwrap_err().code(),
            "not_found"
        );
    }
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM lc_operations")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(left, 0);
    f.sampler.stop().await;
}

#[tokio::test]
async fn tenants_runtimes_and_providers() {
    let f = fixture(0).await;
    let at = certain(&f.clock).await;
    let t = f.store.tenant(f.tenant).await.unwrap();
    assert_eq!((t.name.as_str(), balances(&t)), ("blue", (0, 0, 0, 0)));
    assert_eq!(
        f.store.tenant_by_key(api_key_of(f.tenant)).await.unwrap(),
        Some(f.tenant)
    );
    assert_eq!(f.store.tenant_by_key(Digest([1; 32])).await.unwrap(), None);
    // Replaying the creation returns the recorded tenant; the same name
    // under another key is taken.
    let again = f
        .store
        .create_tenant(&op("t-blue", "blue"), at, "blue", None, &api_key_of)
        .await
        .unwrap();
    assert_eq!(again.tenant_id, f.tenant);
    assert_eq!(
        f.store
            .create_tenant(&op("t-blue", "green"), at, "green", None, &api_key_of)
            .await
            .unwrap_err()
            .code(),
        "idempotency_conflict"
    );
    let err = f
        .store
        .create_tenant(&op("t-blue-2", "blue"), at, "blue", None, &api_key_of)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "already_exists");
    // Runtimes: same name and digest again is the same record; another
    // digest under the name is taken.
    let rt = f
        .store
        .register_runtime(
            &op("rt2", "base2"),
            at,
            "base",
            Digest::of(b"base manifest"),
            serde_json::json!({}),
        )
        .await
        .unwrap();
    assert_eq!(
        rt.manifest,
        serde_json::json!({"kind": "host-usr", "name": "base"})
    );
    assert_eq!(
        f.store
            .register_runtime(
                &op("rt3", "base3"),
                at,
                "base",
                Digest([2; 32]),
                serde_json::json!({})
            )
            .await
            .unwrap_err()
            .code(),
        "already_exists"
    );
    assert_eq!(f.store.runtimes().await.unwrap().len(), 1);
    // Providers: a URL update with the same key; another key is refused.
    let p2 = TestProvider::new("p1", 8);
    assert_eq!(
        f.store
            .register_provider(
                &p2.id,
                "http://127.0.0.1:7002",
                p2.key.verifying_key().to_bytes()
            )
            .await
            .unwrap_err()
            .code(),
        "already_exists"
    );
    let p = f
        .store
        .register_provider(
            &f.provider.id,
            "http://127.0.0.1:7003",
            f.provider.key.verifying_key().to_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(p.url, "http://127.0.0.1:7003");
    assert_eq!(
        f.store
            .register_provider(
                &f.provider.id,
                "ftp://x",
                f.provider.key.verifying_key().to_bytes()
            )
            .await
            .unwrap_err()
            .code(),
        "invalid_provider"
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_database_refuses_deadlines_beyond_the_horizon_and_identity_changes() {
    let f = fixture(2).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("g", "g"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    // The default horizon is 3650 days; an expiry 3651 days after the cut
    // is refused by the database itself.
    let err = sqlx::query(
        "UPDATE lc_sandbox_leases SET expiry_floor_us = (SELECT cut_floor_us FROM tollgate_safetime) \
             + 3651::bigint * 86400 * 1000000 WHERE lease_id = $1",
    )
    .bind(e.canonical.lease_id.0)
    .execute(&mut c)
    .await
    .unwrap_err();
    let db_err = err.as_database_error().unwrap();
    assert_eq!(db_err.code().as_deref(), Some("LCS01"));
    assert!(
        db_err.message().starts_with("deadline_beyond_horizon:"),
        "{}",
        db_err.message()
    );
    // Exactly cut + horizon is accepted.
    sqlx::query(
        "UPDATE lc_sandbox_leases SET expiry_floor_us = s.cut_floor_us + 3650::bigint * 86400 * 1000000, \
                expiry_submicro_ns = s.cut_submicro_ns FROM tollgate_safetime s WHERE lease_id = $1",
    )
    .bind(e.canonical.lease_id.0)
    .execute(&mut c)
    .await
    .unwrap();
    let err = sqlx::query("UPDATE lc_execs SET workspace_id = workspace_id + 1 WHERE exec_id = $1")
        .bind(e.exec_id.0)
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("LCS02")
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_initial_cut_is_quarantined_when_little_compute_holds_authority() {
    // Empty: the cut starts at database time.
    let empty = migrated_db().await;
    let (q, kind, inv) = first_claim(&empty.url).await;
    assert_eq!((q, kind.as_str()), (false, "initial_cut"));
    assert_eq!(inv["operation_keys"], 0);
    assert_eq!(inv["unfinished_execs"], 0);

    // An operation key (no Tollgate authority at all): quarantined.
    let with_key = migrated_db().await;
    let mut c = PgConnection::connect(&with_key.url).await.unwrap();
    sqlx::query(
        "INSERT INTO lc_operations (scope, op_key, kind, request_sha256, result, created_floor_us, \
             created_submicro_ns, floor_floor_us, floor_submicro_ns, ttl_ns, gc_floor_us, gc_submicro_ns) \
         VALUES (0, 'k', 'create_tenant', decode(repeat('00', 32), 'hex'), 'null', 0, 0, 0, 0, 1, 0, 1)",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let (q, kind, inv) = first_claim(&with_key.url).await;
    assert_eq!((q, kind.as_str()), (true, "initial_quarantine"));
    assert_eq!(inv["operation_keys"], 1);

    // An unfinished exec (its other rows left out: only the exec is the
    // authority under test): quarantined.
    let with_exec = migrated_db().await;
    let mut c = PgConnection::connect(&with_exec.url).await.unwrap();
    sqlx::raw_sql(
        "BEGIN; SET LOCAL session_replication_role = replica; \
         INSERT INTO lc_execs (tenant_id, lease_id, provider_id, runtime_digest, workspace_id, shape, \
             units, command, admitted_floor_us, admitted_submicro_ns, state) \
         VALUES (1, 1, 'p1', decode(repeat('00', 32), 'hex'), 1, 'small', 1, '[\"true\"]', 0, 0, 'admitted'); \
         COMMIT;",
    )
    .execute(&mut c)
    .await
    .unwrap();
    let (q, kind, inv) = first_claim(&with_exec.url).await;
    assert_eq!((q, kind.as_str()), (true, "initial_quarantine"));
    assert_eq!(inv["unfinished_execs"], 1);
}

#[tokio::test]
async fn concurrent_replays_admit_once_and_concurrent_commits_return_units_once() {
    let f = std::sync::Arc::new(fixture(4).await);
    let at = certain(&f.clock).await;
    // Eight concurrent first uses of one key: one exec, one unit held.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            f.store
                .admit_exec(&op("same", "same"), at, f.tenant, &req("small", &["true"]))
                .await
                .unwrap()
                .exec_id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (4, 3, 1, 0)
    );
    let e = f.store.exec(f.tenant, ids[0]).await.unwrap();
    let (lease, g) = (e.canonical.lease_id, Generation(1));
    f.store
        .begin_release(lease, g, TerminalReason::Cancelled, at)
        .await
        .unwrap();
    // Four concurrent commits of the same proof: one release, three replays.
    let now = certain(&f.clock).await;
    let evidence = f.provider.absence(lease, 1);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (f, evidence) = (f.clone(), evidence.clone());
        tasks.push(tokio::spawn(async move {
            f.store
                .commit_release(lease, g, &evidence, now)
                .await
                .unwrap()
        }));
    }
    let mut fresh = 0;
    for t in tasks {
        let out = t.await.unwrap();
        assert_eq!(out.units_returned, 1);
        fresh += usize::from(!out.replay);
    }
    assert_eq!(fresh, 1);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (4, 4, 0, 0)
    );
    assert_audit_clean(&f.store).await;
    let Ok(f) = std::sync::Arc::try_unwrap(f) else {
        panic!("every task has ended")
    };
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_start_failure_releases_from_allocating_and_cancel_of_a_terminal_exec_changes_nothing() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("s", "s"), at, f.tenant, &req("small", &["nope"]))
        .await
        .unwrap();
    let (lease, g) = (e.canonical.lease_id, Generation(1));
    // allocating -> release_pending directly on the provider's not-sent
    // proof; twice is the same.
    let proof = f.provider.sign(Statement::NotSent {
        provider_id: "p1".into(),
        lease_id: lease.0,
        generation: 1,
    });
    for _ in 0..2 {
        let w = f
            .store
            .begin_release_not_sent(lease, g, &proof, at)
            .await
            .unwrap();
        assert_eq!(w.state, LeaseState::ReleasePending);
    }
    // No way back to active.
    assert_eq!(
        f.store.mark_active(lease, g, at).await.unwrap_err(),
        LcError::IllegalTransition {
            what: "lease",
            from: "release_pending",
            to: "active"
        }
    );
    let now = certain(&f.clock).await;
    // A fence of a later generation covers this one.
    let fence = f.provider.sign(Statement::Fence {
        provider_id: "p1".into(),
        lease_id: lease.0,
        generation: 3,
    });
    let out = f.store.commit_release(lease, g, &fence, now).await.unwrap();
    assert_eq!((out.units_returned, out.replay), (1, false));
    let done = f.store.exec(f.tenant, e.exec_id).await.unwrap();
    assert_eq!(
        (done.state, done.terminal_reason, done.exit_code),
        (ExecState::Terminal, Some(TerminalReason::StartFailed), None)
    );
    // Cancelling a terminal exec returns it as it is and writes only the
    // operation key.
    let c = f
        .store
        .cancel(&op("c", "c"), now, f.tenant, e.exec_id)
        .await
        .unwrap();
    assert_eq!(c, done);
    assert_eq!(
        f.store
            .cancel(&op("c2", "c2"), now, f.tenant, ExecId(e.exec_id.0 + 50))
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

/// The rate of `admissions_max` per one second, with a pool large enough
/// for concurrent admissions.
fn rated(admissions_max: u32) -> lc_pg::LcConfig {
    lc_pg::LcConfig {
        admission_rate: lc_core::rate::AdmissionRate::new(
            admissions_max,
            SignedDuration::from_secs(1),
        )
        .unwrap(),
        max_connections: 8,
        ..config()
    }
}

#[tokio::test]
async fn admissions_beyond_the_rate_are_refused_until_the_oldest_leaves_the_window() {
    let f = fixture_with(10, rated(2)).await;
    let mut admitted = Vec::new();
    for i in 0..2 {
        let at = certain(&f.clock).await;
        let rec = f
            .store
            .admit_exec(
                &op(&format!("r{i}"), "small"),
                at,
                f.tenant,
                &req("small", &["true"]),
            )
            .await
            .unwrap();
        admitted.push(rec.admitted_cut);
    }
    let at = certain(&f.clock).await;
    let before = snapshot(&f.db.url).await;
    let err = f
        .store
        .admit_exec(&op("r2", "small"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap_err();
    // The oldest admission leaves the window at admitted[0] + 1 s, less
    // than a second after this reading: retry after exactly 1 s.
    let leaves = admitted[0] + SignedDuration::from_secs(1);
    assert!(at.cut < leaves, "the third admission came a window late");
    assert_eq!(
        err,
        LcError::RateLimited {
            admissions_max: 2,
            window: SignedDuration::from_secs(1),
            retry_after_s: 1,
        }
    );
    assert_eq!(
        snapshot(&f.db.url).await,
        before,
        "a refusal writes nothing"
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (10, 8, 2, 0)
    );

    // Once a certain cut is a full window past the oldest, one more fits,
    // under the same key.
    let at = loop {
        let at = certain(&f.clock).await;
        if at.cut > leaves {
            break at;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let rec = f
        .store
        .admit_exec(&op("r2", "small"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    assert_eq!(rec.admitted_cut, at.cut);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (10, 7, 3, 0)
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn concurrent_admissions_of_one_tenant_respect_the_rate_exactly() {
    let f = fixture_with(10, rated(3)).await;
    let at = certain(&f.clock).await;
    let store = std::sync::Arc::new(f.store);
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let store = store.clone();
            let tenant = f.tenant;
            tokio::spawn(async move {
                store
                    .admit_exec(
                        &op(&format!("c{i}"), "small"),
                        at,
                        tenant,
                        &req("small", &["true"]),
                    )
                    .await
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(LcError::RateLimited {
                admissions_max: 3, ..
            }) => limited += 1,
            Err(e) => panic!("unexpected refusal: {e}"),
        }
    }
    assert_eq!((ok, limited), (3, 3));
    assert_eq!(
        balances(&store.tenant(f.tenant).await.unwrap()),
        (10, 7, 3, 0)
    );
    assert_audit_clean(&store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_deposit_past_i64_max_is_units_overflow_and_writes_nothing() {
    let f = fixture(4).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .deposit(&op("d-max", "max"), at, f.tenant, i64::MAX)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        LcError::UnitsOverflow {
            tenant_id: f.tenant,
            units: i64::MAX,
            deposited: 4
        }
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (4, 4, 0, 0)
    );
    assert_eq!(
        f.store
            .operation(OpScope::Tenant(f.tenant), "d-max")
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    // The largest deposit that fits still lands.
    let t = f
        .store
        .deposit(&op("d-fit", "fit"), at, f.tenant, i64::MAX - 4)
        .await
        .unwrap();
    assert_eq!(balances(&t), (i64::MAX, i64::MAX, 0, 0));
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

/// Claims with the shortest TTL and a one-second grace, so a certain cut
/// passes expiry + grace within seconds.
fn claims_config() -> lc_pg::LcConfig {
    lc_pg::LcConfig {
        claim_ttl: SignedDuration::from_secs(1),
        claim_grace: SignedDuration::from_secs(1),
        ..config()
    }
}

#[tokio::test]
async fn claims_take_free_leases_keep_live_ones_and_fence_the_old_holder() {
    use lc_core::claim::{ClaimGeneration, ClaimHolder, ClaimItem, ClaimKind};
    use lc_core::owner::TakeoverBasis;
    let ns = SignedDuration::from_nanos(1);
    let sec = SignedDuration::from_secs(1);
    let f = fixture_with(3, claims_config()).await;
    let at = certain(&f.clock).await;
    let mut leases = Vec::new();
    for i in 0..3 {
        let e = f
            .store
            .admit_exec(
                &op(&format!("c{i}"), "c"),
                at,
                f.tenant,
                &req("small", &["sleep", "60"]),
            )
            .await
            .unwrap();
        leases.push(e.canonical.lease_id);
    }
    let a = ClaimHolder::from_bytes([0xa1; 16]);
    let b = ClaimHolder::from_bytes([0xb2; 16]);
    let c0 = certain(&f.clock).await;

    // A takes free Leases, at most its limit, in due order: generation 1,
    // expiry cut + ttl.
    let won = f.store.claim_due_work(&a, c0, 2).await.unwrap();
    let got: Vec<_> = won
        .iter()
        .map(|c| (c.work.lease_id, c.claim.generation, c.expiry, c.work.action))
        .collect();
    assert_eq!(
        got,
        [
            (
                leases[0],
                ClaimGeneration(1),
                c0.cut + sec,
                LeaseAction::Allocate
            ),
            (
                leases[1],
                ClaimGeneration(1),
                c0.cut + sec,
                LeaseAction::Allocate
            ),
        ]
    );
    let a0 = won[0].claim;
    assert_eq!(
        a0.item,
        ClaimItem {
            kind: ClaimKind::Lease,
            id: leases[0].0
        }
    );
    // B: A's live claims are not taken; the free third Lease is.
    let b_won = f.store.claim_due_work(&b, c0, 10).await.unwrap();
    assert_eq!(
        b_won
            .iter()
            .map(|c| (c.work.lease_id, c.claim.generation))
            .collect::<Vec<_>>(),
        [(leases[2], ClaimGeneration(1))]
    );

    // The boundary: expiry + grace - 1 ns is still A's, on a certain cut.
    let boundary = c0.cut + sec + sec;
    wait_reading(&f.clock, 10, "a certain cut past expiry + grace", |r| {
        r.certain && r.cut >= boundary + SignedDuration::from_millis(1)
    })
    .await;
    let before = snapshot(&f.db.url).await;
    let just_before = CutReading::certain(boundary - ns);
    let b_again = f.store.claim_due_work(&b, just_before, 10).await.unwrap();
    assert_eq!(
        b_again.iter().map(|c| c.work.lease_id).collect::<Vec<_>>(),
        [leases[2]]
    );
    // Uncertain at (and far past) expiry + grace: nothing is taken.
    let uncertain = CutReading {
        cut: boundary,
        certain: false,
        retry_after_s: 1,
    };
    let b_uncertain = f.store.claim_due_work(&b, uncertain, 10).await.unwrap();
    assert_eq!(
        b_uncertain
            .iter()
            .map(|c| c.work.lease_id)
            .collect::<Vec<_>>(),
        [leases[2]]
    );
    // Only B's own claim was renewed (max(current, cut + ttl)).
    let listed = f.store.claims(uncertain, None, 10).await.unwrap();
    let rows: Vec<_> = listed
        .iter()
        .map(|r| {
            (
                r.claim.item.id,
                r.claim.generation,
                r.claim.expiry,
                r.expired,
                r.takeable,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (leases[0].0, ClaimGeneration(1), c0.cut + sec, false, false),
            (leases[1].0, ClaimGeneration(1), c0.cut + sec, false, false),
            (
                leases[2].0,
                ClaimGeneration(1),
                boundary + sec,
                false,
                false
            ),
        ]
    );
    assert_ne!(snapshot(&f.db.url).await, before);

    // At expiry + grace on a certain cut: B takes A's Leases, generation 2.
    let at_boundary = CutReading::certain(boundary);
    let listed = f.store.claims(at_boundary, None, 1).await.unwrap();
    assert_eq!(
        (listed.len(), listed[0].expired, listed[0].takeable),
        (1, true, true)
    );
    let taken = f.store.claim_due_work(&b, at_boundary, 10).await.unwrap();
    assert_eq!(
        taken
            .iter()
            .map(|c| (c.work.lease_id, c.claim.generation, c.expiry))
            .collect::<Vec<_>>(),
        [
            (leases[0], ClaimGeneration(2), boundary + sec),
            (leases[1], ClaimGeneration(2), boundary + sec),
            (leases[2], ClaimGeneration(1), boundary + sec),
        ]
    );
    let listed = f.store.claims(at_boundary, None, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|r| (r.claim.holder_sha256, r.claim.basis))
            .collect::<Vec<_>>(),
        [
            (b.sha256(), TakeoverBasis::Expired),
            (b.sha256(), TakeoverBasis::Expired),
            (b.sha256(), TakeoverBasis::Unowned),
        ]
    );
    // A finds nothing: B's claims are live.
    assert_eq!(
        f.store.claim_due_work(&a, at_boundary, 10).await.unwrap(),
        vec![]
    );

    // The old holder's writes are refused claim_stale and change nothing.
    let before = snapshot(&f.db.url).await;
    let stale = f.store.claimed(a0);
    let g = Generation(1);
    let e = stale
        .mark_active(leases[0], g, at_boundary)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        LcError::ClaimStale {
            item: format!("lease {}", leases[0].0),
            presented: ClaimGeneration(1),
            current: Some(ClaimGeneration(2)),
        }
    );
    assert_eq!(
        stale
            .renew(leases[0], g, at_boundary)
            .await
            .unwrap_err()
            .code(),
        "claim_stale"
    );
    assert_eq!(
        stale
            .begin_release(leases[0], g, TerminalReason::Cancelled, at_boundary)
            .await
            .unwrap_err()
            .code(),
        "claim_stale"
    );
    assert_eq!(
        stale
            .commit_release(leases[0], g, &f.provider.absence(leases[0], 1), at_boundary)
            .await
            .unwrap_err()
            .code(),
        "claim_stale"
    );
    // A claim presented for another Lease proves nothing about it.
    let new0 = taken[0].claim;
    assert_eq!(
        f.store
            .claimed(new0)
            .mark_active(leases[1], g, at_boundary)
            .await
            .unwrap_err(),
        LcError::ClaimStale {
            item: format!("lease {}", leases[1].0),
            presented: ClaimGeneration(2),
            current: Some(ClaimGeneration(2)),
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // The current holder's write goes through.
    let w = f
        .store
        .claimed(new0)
        .mark_active(leases[0], g, at_boundary)
        .await
        .unwrap();
    assert_eq!(w.state, LeaseState::Active);

    // Renewal while uncertain keeps the max: an earlier cut changes
    // nothing, a cut 1 ns later extends by 1 ns.
    let frozen = CutReading {
        cut: boundary - sec,
        certain: false,
        retry_after_s: 1,
    };
    let r = f.store.claim_due_work(&b, frozen, 1).await.unwrap();
    assert_eq!(
        (r[0].work.lease_id, r[0].expiry),
        (leases[0], boundary + sec)
    );
    let later = CutReading {
        cut: boundary + ns,
        certain: false,
        retry_after_s: 1,
    };
    let r = f.store.claim_due_work(&b, later, 1).await.unwrap();
    assert_eq!(
        (r[0].work.lease_id, r[0].claim.generation, r[0].expiry),
        (leases[0], ClaimGeneration(2), boundary + sec + ns)
    );

    // The database guard: a claim only moves forward, and is never deleted.
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    for (sql, what) in [
        (
            "UPDATE lc_claims SET generation = 1 WHERE item_id = $1",
            "a generation moved back",
        ),
        (
            "UPDATE lc_claims SET generation = 4, holder_sha256 = sha256('x'::bytea) WHERE item_id = $1",
            "a generation skipped",
        ),
        (
            "UPDATE lc_claims SET expiry_floor_us = expiry_floor_us - 1 WHERE item_id = $1",
            "an expiry shortened",
        ),
        (
            "UPDATE lc_claims SET generation = 3 WHERE item_id = $1",
            "a take by the same holder",
        ),
        ("DELETE FROM lc_claims WHERE item_id = $1", "a deletion"),
    ] {
        let e = sqlx::query(sql)
            .bind(leases[0].0)
            .execute(&mut c)
            .await
            .expect_err(what);
        let db = e.as_database_error().expect(what);
        assert_eq!(db.code().as_deref(), Some("LCSC1"), "{what}: {db}");
        assert!(db.message().starts_with("claim_regression: "), "{what}");
    }
    // LCS01: a claim's expiry beyond cut + horizon.
    let e =
        sqlx::query("UPDATE lc_claims SET expiry_floor_us = 9000000000000000 WHERE item_id = $1")
            .bind(leases[0].0)
            .execute(&mut c)
            .await
            .unwrap_err();
    assert_eq!(
        e.as_database_error().unwrap().code().as_deref(),
        Some("LCS01")
    );
    f.sampler.stop().await;
}

// ---------------------------------------------------------------------------
// Approvals.

fn policy_of(require: ApprovalRequire, shapes: &[&str]) -> ApprovalPolicy {
    let shapes: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
    ApprovalPolicy::new(require, &shapes).unwrap()
}

async fn set_policy(f: &Fixture, key: &str, p: &ApprovalPolicy) {
    let at = certain(&f.clock).await;
    let t = f
        .store
        .set_approval_policy(&op(key, &format!("{p:?}")), at, f.tenant, p)
        .await
        .unwrap();
    assert_eq!(&t.approval_policy, p);
}

async fn count(url: &str, sql: &str) -> i64 {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap()
}

#[tokio::test]
async fn a_gated_admission_holds_nothing_until_an_approval_moves_its_units_exactly() {
    let f = fixture(3).await;
    assert_eq!(
        f.store.tenant(f.tenant).await.unwrap().approval_policy,
        ApprovalPolicy::default()
    );
    set_policy(&f, "pol", &policy_of(ApprovalRequire::Network, &[])).await;
    let at = certain(&f.clock).await;
    let plain = f
        .store
        .admit_exec(&op("a1", "small"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    assert_eq!(plain.state, ExecState::Admitted);
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (3, 2, 1, 0)
    );
    let gated_req = ExecRequest {
        timeout_ms: Some(90_000),
        ..req("small-net", &["curl", "x"])
    };
    let gated = f
        .store
        .admit_exec(&op("a2", "net"), at, f.tenant, &gated_req)
        .await
        .unwrap();
    assert_eq!(gated.state, ExecState::AwaitingApproval);
    assert_eq!(gated.lease_state, None);
    assert_eq!(gated.approval, None);
    assert_eq!(gated.timeout_ms, Some(90_000));
    assert_eq!(gated.timeout_deadline, None);
    assert_eq!(gated.admitted_cut, at.cut);
    // No capacity held: balances, Reservations and Leases as before.
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (3, 2, 1, 0)
    );
    let mine = format!(
        "SELECT count(*) FROM lc_sandbox_leases WHERE exec_id = {}",
        gated.exec_id
    );
    assert_eq!(count(&f.db.url, &mine).await, 0);
    let res = format!(
        "SELECT count(*) FROM lc_reservations WHERE exec_id = {}",
        gated.exec_id
    );
    assert_eq!(count(&f.db.url, &res).await, 0);
    assert_eq!(f.store.due_work(at, 10).await.unwrap().len(), 1);
    let page = f.store.approvals(f.tenant, 10).await.unwrap();
    assert_eq!(page.awaiting, std::slice::from_ref(&gated));
    assert!(page.decisions.is_empty());

    // Refusals: uncertain, a validity out of bounds, an exec not awaiting,
    // another tenant's or a missing exec: each with its code, nothing
    // written.
    let before = snapshot(&f.db.url).await;
    let unsure = CutReading::uncertain(at.cut, 3);
    let err = f
        .store
        .approve(
            &op("ap0", "x"),
            unsure,
            f.tenant,
            gated.exec_id,
            ApproverKind::Tenant,
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err, LcError::TimeUncertain { retry_after_s: 3 });
    for (i, (exec, validity, code)) in [
        (gated.exec_id, Some(0), "invalid_validity"),
        (gated.exec_id, Some(3_600_001), "invalid_validity"),
        (plain.exec_id, None, "exec_not_awaiting_approval"),
        (ExecId(gated.exec_id.0 + 50), None, "not_found"),
    ]
    .into_iter()
    .enumerate()
    {
        let err = f
            .store
            .approve(
                &op(&format!("bad{i}"), "x"),
                at,
                f.tenant,
                exec,
                ApproverKind::Tenant,
                validity,
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "case {i}: {err}");
    }
    assert_eq!(
        f.store
            .approve(
                &op("bad9", "x"),
                at,
                f.tenant,
                plain.exec_id,
                ApproverKind::Admin,
                None
            )
            .await
            .unwrap_err(),
        LcError::ExecNotAwaitingApproval {
            exec_id: plain.exec_id,
            state: "admitted"
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The approval: the Reservation and the Lease, exactly the shape's
    // unit, valid until the decided cut + 60 s, the timeout from here.
    let now = wait_reading(&f.clock, 10, "a later certain cut", |r| {
        r.certain && r.cut > at.cut
    })
    .await;
    let approved = f
        .store
        .approve(
            &op("ap", "ok"),
            now,
            f.tenant,
            gated.exec_id,
            ApproverKind::Tenant,
            Some(60_000),
        )
        .await
        .unwrap();
    assert_eq!(approved.state, ExecState::Admitted);
    assert_eq!(approved.lease_state, Some(LeaseState::Allocating));
    assert_eq!(approved.canonical, gated.canonical);
    assert_eq!(
        approved.timeout_deadline,
        Some(now.cut + SignedDuration::from_secs(90))
    );
    let ap = approved.approval.clone().unwrap();
    assert_eq!(
        (
            ap.decision,
            ap.approver,
            ap.decided_cut,
            ap.validity_ms,
            ap.valid_until,
            ap.reason.clone()
        ),
        (
            ApprovalDecision::Approved,
            ApproverKind::Tenant,
            now.cut,
            Some(60_000),
            Some(now.cut + SignedDuration::from_secs(60)),
            None
        )
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (3, 1, 2, 0)
    );
    let work = f.store.due_work(now, 10).await.unwrap();
    assert_eq!(work.len(), 2);
    let w = work.iter().find(|w| w.exec_id == gated.exec_id).unwrap();
    assert_eq!(
        (w.lease_id, w.generation, w.action, w.expiry),
        (
            gated.canonical.lease_id,
            Generation(1),
            LeaseAction::Allocate,
            now.cut + SignedDuration::from_secs(60)
        )
    );
    // A replay returns the same record and moves nothing; another key is
    // refused with the stable code.
    let later = certain(&f.clock).await;
    let again = f
        .store
        .approve(
            &op("ap", "ok"),
            later,
            f.tenant,
            gated.exec_id,
            ApproverKind::Tenant,
            Some(60_000),
        )
        .await
        .unwrap();
    assert_eq!(again, approved);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .approve(
                &op("ap2", "ok"),
                later,
                f.tenant,
                gated.exec_id,
                ApproverKind::Tenant,
                None
            )
            .await
            .unwrap_err(),
        LcError::ExecNotAwaitingApproval {
            exec_id: gated.exec_id,
            state: "admitted"
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let page = f.store.approvals(f.tenant, 10).await.unwrap();
    assert!(page.awaiting.is_empty());
    assert_eq!(page.decisions, [ap]);
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn deny_and_cancel_end_an_awaiting_exec_and_a_short_tenant_keeps_awaiting() {
    let f = fixture(1).await;
    set_policy(&f, "pol", &policy_of(ApprovalRequire::All, &[])).await;
    let at = certain(&f.clock).await;
    let admit = |key: &'static str, shape: &'static str| {
        let store = &f.store;
        let tenant = f.tenant;
        async move {
            store
                .admit_exec(&op(key, key), at, tenant, &req(shape, &["true"]))
                .await
                .unwrap()
        }
    };
    let a = admit("a", "small").await;
    let b = admit("b", "small").await;
    let m = admit("m", "medium").await;
    for e in [&a, &b, &m] {
        assert_eq!(e.state, ExecState::AwaitingApproval);
    }
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );
    // Two units asked of one available: refused, nothing written, still
    // awaiting.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .approve(
                &op("am", "m"),
                at,
                f.tenant,
                m.exec_id,
                ApproverKind::Admin,
                None
            )
            .await
            .unwrap_err(),
        LcError::InsufficientCapacity {
            requested: 2,
            available: 1
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    let denied = f
        .store
        .deny(
            &op("da", "a"),
            at,
            f.tenant,
            a.exec_id,
            ApproverKind::Admin,
            Some("not now"),
        )
        .await
        .unwrap();
    assert_eq!(
        (denied.state, denied.terminal_reason, denied.lease_state),
        (ExecState::Terminal, Some(TerminalReason::Denied), None)
    );
    let d = denied.approval.clone().unwrap();
    assert_eq!(
        (
            d.decision,
            d.approver,
            d.decided_cut,
            d.validity_ms,
            d.valid_until,
            d.reason.as_deref()
        ),
        (
            ApprovalDecision::Denied,
            ApproverKind::Admin,
            at.cut,
            None,
            None,
            Some("not now")
        )
    );
    // A replay: the same record; a second decision: refused.
    assert_eq!(
        f.store
            .deny(
                &op("da", "a"),
                at,
                f.tenant,
                a.exec_id,
                ApproverKind::Admin,
                Some("not now")
            )
            .await
            .unwrap(),
        denied
    );
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .approve(
                &op("aa", "a"),
                at,
                f.tenant,
                a.exec_id,
                ApproverKind::Admin,
                None
            )
            .await
            .unwrap_err(),
        LcError::ExecNotAwaitingApproval {
            exec_id: a.exec_id,
            state: "terminal"
        }
    );
    assert_eq!(
        f.store
            .deny(
                &op("dz", "z"),
                CutReading::uncertain(at.cut, 2),
                f.tenant,
                b.exec_id,
                ApproverKind::Tenant,
                None
            )
            .await
            .unwrap_err(),
        LcError::TimeUncertain { retry_after_s: 2 }
    );
    assert_eq!(
        f.store
            .deny(
                &op("dl", "l"),
                at,
                f.tenant,
                b.exec_id,
                ApproverKind::Tenant,
                Some(&"x".repeat(513))
            )
            .await
            .unwrap_err()
            .code(),
        "invalid_name"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The tenant cancels an awaiting exec: terminal at once, nothing to
    // return, no decision recorded.
    let c = f
        .store
        .cancel(&op("cb", "b"), at, f.tenant, b.exec_id)
        .await
        .unwrap();
    assert_eq!(
        (c.state, c.terminal_reason, c.cancel_requested, c.approval),
        (
            ExecState::Terminal,
            Some(TerminalReason::Cancelled),
            true,
            None
        )
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );
    let page = f.store.approvals(f.tenant, 10).await.unwrap();
    assert_eq!(
        page.awaiting,
        [f.store.exec(f.tenant, m.exec_id).await.unwrap()]
    );
    assert_eq!(page.decisions, [d]);
    assert!(f.store.due_work(at, 10).await.unwrap().is_empty());
    // The policy of a missing tenant: not found.
    assert_eq!(
        f.store
            .set_approval_policy(
                &op("p9", "p9"),
                at,
                TenantId(999),
                &ApprovalPolicy::default()
            )
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_start_gate_is_exact_on_the_cut_and_an_expired_approval_returns_its_unit_once() {
    let f = fixture(1).await;
    set_policy(&f, "pol", &policy_of(ApprovalRequire::Shapes, &["small"])).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("a", "a"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    assert_eq!(e.state, ExecState::AwaitingApproval);
    let approved = f
        .store
        .approve(
            &op("ap", "ap"),
            at,
            f.tenant,
            e.exec_id,
            ApproverKind::Tenant,
            Some(1),
        )
        .await
        .unwrap();
    let vu = approved.approval.unwrap().valid_until.unwrap();
    assert_eq!(vu, at.cut + SignedDuration::from_millis(1));
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 0, 1, 0)
    );
    // Wait until the persisted cut passed valid_until, then read it at
    // exactly the boundary.
    wait_reading(&f.clock, 10, "a certain cut past valid_until", |r| {
        r.certain && r.cut > vu
    })
    .await;
    let one_ns = SignedDuration::from_nanos(1);
    let below = f
        .store
        .due_work(CutReading::certain(vu - one_ns), 10)
        .await
        .unwrap();
    assert_eq!(below.len(), 1);
    assert_eq!(below[0].action, LeaseAction::Allocate);
    let at_vu = f.store.due_work(CutReading::certain(vu), 10).await.unwrap();
    assert_eq!(
        at_vu[0].action,
        LeaseAction::BeginRelease(TerminalReason::ApprovalExpired)
    );
    // Uncertain: nothing starts and nothing expires.
    assert!(
        f.store
            .due_work(CutReading::uncertain(vu, 1), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let (lease, g) = (e.canonical.lease_id, Generation(1));
    let before = snapshot(&f.db.url).await;
    for early in [
        CutReading::certain(vu - one_ns),
        CutReading::uncertain(vu, 1),
    ] {
        assert!(
            f.store
                .begin_release(lease, g, TerminalReason::ApprovalExpired, early)
                .await
                .is_err()
        );
    }
    assert_eq!(
        f.store
            .begin_release(lease, g, TerminalReason::Denied, CutReading::certain(vu))
            .await
            .unwrap_err()
            .code(),
        "illegal_transition"
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let w = f
        .store
        .begin_release(
            lease,
            g,
            TerminalReason::ApprovalExpired,
            CutReading::certain(vu),
        )
        .await
        .unwrap();
    assert_eq!(
        (w.state, w.action, w.terminal_reason),
        (
            LeaseState::ReleasePending,
            LeaseAction::Destroy,
            Some(TerminalReason::ApprovalExpired)
        )
    );
    let now = certain(&f.clock).await;
    let evidence = f.provider.absence(lease, 1);
    let out = f
        .store
        .commit_release(lease, g, &evidence, now)
        .await
        .unwrap();
    assert_eq!((out.units_returned, out.replay), (1, false));
    let again = f
        .store
        .commit_release(lease, g, &evidence, now)
        .await
        .unwrap();
    assert_eq!((again.units_returned, again.replay), (1, true));
    let done = f.store.exec(f.tenant, e.exec_id).await.unwrap();
    assert_eq!(
        (done.state, done.terminal_reason, done.lease_state),
        (
            ExecState::Terminal,
            Some(TerminalReason::ApprovalExpired),
            Some(LeaseState::Released)
        )
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (1, 1, 0, 0)
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_database_guards_approvals_valid_until_decisions_and_the_first_lease() {
    let f = fixture(2).await;
    set_policy(&f, "pol", &policy_of(ApprovalRequire::All, &[])).await;
    let at = certain(&f.clock).await;
    let admit = |key: &'static str| {
        let store = &f.store;
        let tenant = f.tenant;
        async move {
            store
                .admit_exec(&op(key, key), at, tenant, &req("small", &["true"]))
                .await
                .unwrap()
        }
    };
    let waiting = admit("w").await;
    let decided = admit("d").await;
    f.store
        .deny(
            &op("dn", "dn"),
            at,
            f.tenant,
            decided.exec_id,
            ApproverKind::Admin,
            None,
        )
        .await
        .unwrap();
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let insert = |days: i64| {
        format!(
            "INSERT INTO lc_approvals (exec_id, tenant_id, decision, approver, decided_floor_us, \
                 decided_submicro_ns, validity_ms, valid_until_floor_us, valid_until_submicro_ns) \
             SELECT {}, {}, 'approved', 'admin', s.cut_floor_us, s.cut_submicro_ns, 1, \
                    s.cut_floor_us + {days}::bigint * 86400 * 1000000, s.cut_submicro_ns \
               FROM tollgate_safetime s",
            waiting.exec_id, f.tenant
        )
    };
    // valid_until beyond cut + horizon (3650 days): LCS01.
    let err = sqlx::query(&insert(3651))
        .execute(&mut c)
        .await
        .unwrap_err();
    let db_err = err.as_database_error().unwrap();
    assert_eq!(db_err.code().as_deref(), Some("LCS01"));
    assert!(
        db_err.message().starts_with("deadline_beyond_horizon:"),
        "{}",
        db_err.message()
    );
    // Exactly cut + horizon is accepted (rolled back).
    let mut tx = c.begin().await.unwrap();
    sqlx::query(&insert(3650)).execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    // A decision is never rewritten nor removed.
    for sql in [
        "UPDATE lc_approvals SET reason = 'x' WHERE exec_id = $1",
        "DELETE FROM lc_approvals WHERE exec_id = $1",
    ] {
        let err = sqlx::query(sql)
            .bind(decided.exec_id.0)
            .execute(&mut c)
            .await
            .unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS02"),
            "{sql}"
        );
    }
    // An exec admitted without its first Lease is refused at commit.
    let err = sqlx::query("UPDATE lc_execs SET state = 'admitted' WHERE exec_id = $1")
        .bind(waiting.exec_id.0)
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("23503")
    );
    assert_eq!(
        f.store.exec(f.tenant, waiting.exec_id).await.unwrap().state,
        ExecState::AwaitingApproval
    );
    f.sampler.stop().await;
}
