//! Hibernation and resume against a real PostgreSQL with a real in-process
//! sampler: the whole sequence hibernate -> quiesce -> park -> resume ->
//! runnable at store level with real signed envelopes and the tenant's
//! units exact at each step; every refusal with its code and nothing
//! changed; a replayed resume returning the identical receipt; 16
//! concurrent commits giving exactly one receipt; the database's guards
//! (the resume guard, immutable snapshots and receipts); and idle and
//! deadline detection exact to the nanosecond, never on an uncertain cut;
//! a provider's refusal to snapshot recorded exactly, ending the exec
//! `snapshot_refused` (or `cancelled`) with its units returned once and
//! the workspace head unmoved, every refusal of it changing nothing; and
//! migration 0006 keeping the hibernations it finds.

mod support;

use jiff::SignedDuration;
use lc_core::hibernate::{
    self, HibernationRecord, QuiescenceRefusal, ResumeReceipt, SnapshotMeta, WorkspaceRecord,
};
use lc_core::owner::{OwnedExec, OwnerCredential, OwnerGeneration, OwnerToken, PageMeta};
use lc_core::page::{ExitStatus, Page, PageKind};
use lc_core::{
    AttemptNo, ControlStore, CutReading, Digest, ExecId, ExecRecord, ExecState, GatewayStore,
    Generation, HibernationReason, HibernationStep, LcError, LeaseAction, LeaseState, OnTimeout,
    OperationKey, ReconcileStore, SandboxLeaseId,
};
use sqlx::{Connection, PgConnection};
use support::*;
use tollgate_pg_harness::{PgBinaries, PgServer};

const TTL: SignedDuration = SignedDuration::from_secs(1);

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

fn resume_op(key: &str, exec: ExecId, head: Digest) -> OperationKey {
    OperationKey::new(key, hibernate::resume_request_sha256(exec, Some(head))).unwrap()
}

async fn available(f: &Fixture) -> (i64, i64) {
    let t = f.store.tenant(f.tenant).await.unwrap();
    (t.available, t.held)
}

async fn attempt_state(url: &str, exec: ExecId) -> (String, i64) {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_as("SELECT state, generation FROM lc_attempts WHERE exec_id = $1")
        .bind(exec.0)
        .fetch_one(&mut c)
        .await
        .unwrap()
}

/// Admits a medium exec (2 units) with the given idle TTL, timeout and
/// on_timeout, and marks its Lease active.
async fn running_exec(
    f: &Fixture,
    key: &str,
    at: CutReading,
    idle_ttl_ms: Option<u64>,
    timeout_ms: Option<u64>,
    on_timeout: OnTimeout,
) -> ExecRecord {
    let mut r = req("medium", &["sleep", "9"]);
    r.idle_ttl_ms = idle_ttl_ms;
    r.timeout_ms = timeout_ms;
    r.on_timeout = on_timeout;
    let e = f
        .store
        .admit_exec(&op(key, key), at, f.tenant, &r)
        .await
        .unwrap();
    f.store
        .mark_active(e.canonical.lease_id, Generation(1), at)
        .await
        .unwrap();
    f.store.exec(f.tenant, e.exec_id).await.unwrap()
}

/// Everything a resume commit needs, set up through the store's steps.
struct Parked {
    exec: ExecRecord,
    cred: OwnerCredential,
    manifest: Vec<u8>,
    head: Digest,
    lease2: SandboxLeaseId,
    at: CutReading,
}

/// The canonical bytes of a real manifest of workspace `ws` after
/// `parent` with `entries`.
fn manifest_of(ws: i64, parent: Option<Digest>, entries: Vec<lc_core::snapshot::Entry>) -> Vec<u8> {
    lc_core::snapshot::Manifest::new(lc_core::WorkspaceId(ws), parent, entries)
        .unwrap()
        .canonical_bytes()
}

/// Runs an exec (with `timeout_ms`, terminating on it) to parked
/// (generation 1 hibernated, destroy proven): the exec, its owner, the
/// manifest and head.
async fn parked(
    f: &Fixture,
    at: CutReading,
    timeout_ms: Option<u64>,
) -> (ExecRecord, OwnerCredential, Vec<u8>, Digest) {
    let e = running_exec(f, "px", at, None, timeout_ms, OnTimeout::Terminate).await;
    let tok = token(0x77);
    let owned = f
        .store
        .take_over(&tok, f.tenant, e.exec_id, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    let cred = cred_of(&owned, &tok);
    f.store
        .request_hibernation(&op("ph", "ph"), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    let ws = e.canonical.workspace_id.0;
    let manifest = manifest_of(ws, None, vec![]);
    let head = Digest::of(&manifest);
    let lease1 = e.canonical.lease_id;
    f.store
        .commit_quiescence(
            &cred,
            e.exec_id,
            at,
            Generation(1),
            &manifest,
            head,
            &f.provider.quiescence(lease1, 1, ws, head),
            None,
        )
        .await
        .unwrap();
    f.store
        .commit_release(lease1, Generation(1), &f.provider.absence(lease1, 1), at)
        .await
        .unwrap();
    // The quiescence released the ownership; the owner of the resume takes
    // the parked exec over.
    let owned = f
        .store
        .take_over(&tok, f.tenant, e.exec_id, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(owned.ownership.generation.0, cred.generation.0 + 1);
    let cred = cred_of(&owned, &tok);
    (e, cred, manifest, head)
}

/// Runs an exec to a prepared, attached resume (generation 2).
async fn prepared(f: &Fixture, at: CutReading) -> Parked {
    let (e, cred, manifest, head) = parked(f, at, None).await;
    let ws = e.canonical.workspace_id.0;
    f.store
        .request_resume(
            &resume_op("pr", e.exec_id, head),
            at,
            f.tenant,
            e.exec_id,
            Some(head),
        )
        .await
        .unwrap();
    let w = f
        .store
        .prepare_resume(&cred, e.exec_id, at, "pr")
        .await
        .unwrap();
    f.store
        .record_attachment(
            w.lease_id,
            Generation(2),
            &f.provider.attachment(w.lease_id, 2, ws, head),
            at,
        )
        .await
        .unwrap();
    Parked {
        exec: e,
        cred,
        manifest,
        head,
        lease2: w.lease_id,
        at,
    }
}

/// A fixture on a dedicated PostgreSQL 18 server (`TOLLGATE_PG18_BIN`
/// names its binaries; the test fails without it), kept alive with it.
async fn fixture_pg18(units: i64) -> (PgServer, Fixture) {
    let dir = std::env::var_os("TOLLGATE_PG18_BIN")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("TOLLGATE_PG18_BIN is not set: this test needs PostgreSQL 18"));
    let bins = PgBinaries::from_dir(&dir).expect("PostgreSQL 18 binaries");
    assert_eq!(bins.major_version().unwrap(), 18);
    let server = tokio::task::spawn_blocking(|| PgServer::start_dedicated_with(bins))
        .await
        .unwrap()
        .expect("start PostgreSQL 18");
    let db = fresh_db_on(&server.admin_url(), |n| server.url_for(n)).await;
    lc_pg::migrate(&db.url).await.expect("migrate");
    let f = fixture_on(db, units, config()).await;
    (server, f)
}

#[tokio::test]
async fn the_full_sequence_on_postgresql_15() {
    full_sequence(fixture(3).await).await;
}

#[tokio::test]
async fn the_full_sequence_on_postgresql_18() {
    let (_server, f) = fixture_pg18(3).await;
    full_sequence(f).await;
}

#[tokio::test]
async fn the_resume_guard_on_postgresql_15() {
    resume_guard(fixture(3).await).await;
}

#[tokio::test]
async fn the_resume_guard_on_postgresql_18() {
    let (_server, f) = fixture_pg18(3).await;
    resume_guard(f).await;
}

/// Hibernate, quiesce, park, resume, runnable, running: exact units at
/// each step and every refusal changing nothing.
async fn full_sequence(f: Fixture) {
    let at = certain(&f.clock).await;
    let e = running_exec(&f, "e1", at, None, None, OnTimeout::Terminate).await;
    let x = e.exec_id;
    let lease1 = e.canonical.lease_id;
    let ws = e.canonical.workspace_id;
    assert_eq!(available(&f).await, (1, 2));
    assert_eq!(
        f.store.workspace(f.tenant, x).await.unwrap(),
        WorkspaceRecord {
            workspace_id: ws,
            exec_id: x,
            head: None,
            snapshots: 0
        }
    );
    let tok = token(0xa1);
    let owned = f.store.take_over(&tok, f.tenant, x, at, TTL).await.unwrap();
    let cred = cred_of(&owned, &tok);
    let heartbeat_expiry = owned.ownership.heartbeat_expiry;
    let stale = OwnerCredential {
        generation: OwnerGeneration(cred.generation.0 + 1),
        ..cred.clone()
    };
    // One page staged, so generation 2 numbers from seq 2.
    let page = PageMeta::of_page(
        x,
        AttemptNo(1),
        &Page::data(1, PageKind::Stdout, b"hello".to_vec()).unwrap(),
    );
    f.store.stage_pages(&cred, x, at, &[page]).await.unwrap();

    // Seal.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .request_hibernation(
                &op("h1", "h1"),
                CutReading::uncertain(at.cut, 4),
                f.tenant,
                x
            )
            .await
            .unwrap_err(),
        LcError::TimeUncertain { retry_after_s: 4 }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let sealed = f
        .store
        .request_hibernation(&op("h1", "h1"), at, f.tenant, x)
        .await
        .unwrap();
    let want_sealed = HibernationRecord {
        exec_id: x,
        attempt: AttemptNo(1),
        generation: Generation(1),
        lease_id: lease1,
        reason: HibernationReason::Requested,
        sealed_cut: at.cut,
        step: HibernationStep::Sealed,
        head: None,
        refusal: None,
    };
    assert_eq!(sealed, want_sealed);
    assert_eq!(
        f.store
            .request_hibernation(&op("h1", "h1"), at, f.tenant, x)
            .await
            .unwrap(),
        want_sealed
    );
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .request_hibernation(&op("h2", "h2"), at, f.tenant, x)
            .await
            .unwrap_err(),
        LcError::HibernationInProgress {
            exec_id: x,
            step: "sealed"
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Quiesce: every refusal first, each changing nothing.
    let manifest = manifest_of(ws.0, None, vec![lc_core::snapshot::Entry::dir("a", 0o755)]);
    let head = Digest::of(&manifest);
    let good = f.provider.quiescence(lease1, 1, ws.0, head);
    let forged = TestProvider::new("p1", 99).quiescence(lease1, 1, ws.0, head);
    let other_ws = f.provider.quiescence(lease1, 1, ws.0 + 1, head);
    // A manifest whose parent is not the workspace's head (it has none).
    let stale_chain = manifest_of(ws.0, Some(Digest([8; 32])), vec![]);
    let stale_head = Digest::of(&stale_chain);
    // A manifest of another workspace, though the statement names this one.
    let foreign = manifest_of(ws.0 + 1, None, vec![]);
    let foreign_head = Digest::of(&foreign);
    // Bytes that are no manifest at all.
    let junk = br#"{"manifest":1}"#.to_vec();
    let junk_head = Digest::of(&junk);
    let cases: Vec<(&str, OwnerCredential, &[u8], Digest, serde_json::Value)> = vec![
        (
            "workspace_head_mismatch",
            cred.clone(),
            &manifest,
            Digest([9; 32]),
            good.clone(),
        ),
        (
            "workspace_head_mismatch",
            cred.clone(),
            &stale_chain,
            stale_head,
            f.provider.quiescence(lease1, 1, ws.0, stale_head),
        ),
        (
            "workspace_head_mismatch",
            cred.clone(),
            &foreign,
            foreign_head,
            f.provider.quiescence(lease1, 1, ws.0, foreign_head),
        ),
        (
            "invalid_input",
            cred.clone(),
            &junk,
            junk_head,
            f.provider.quiescence(lease1, 1, ws.0, junk_head),
        ),
        ("evidence_rejected", cred.clone(), &manifest, head, forged),
        ("evidence_rejected", cred.clone(), &manifest, head, other_ws),
        ("owner_stale", stale.clone(), &manifest, head, good.clone()),
    ];
    for (code, c, m, h, ev) in cases {
        let before = snapshot(&f.db.url).await;
        let err = f
            .store
            .commit_quiescence(&c, x, at, Generation(1), m, h, &ev, None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        assert_eq!(snapshot(&f.db.url).await, before, "{code}");
    }
    let quiesced = f
        .store
        .commit_quiescence(&cred, x, at, Generation(1), &manifest, head, &good, None)
        .await
        .unwrap();
    let want_quiesced = HibernationRecord {
        step: HibernationStep::Quiesced,
        head: Some(head),
        ..want_sealed.clone()
    };
    assert_eq!(quiesced, want_quiesced);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .commit_quiescence(&cred, x, at, Generation(1), &manifest, head, &good, None)
            .await
            .unwrap(),
        want_quiesced
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // The commit released the ownership: the owner's next write is stale,
    // while its replay above still returned the record.
    assert_eq!(
        f.store
            .heartbeat(&cred, x, at, TTL)
            .await
            .unwrap_err()
            .code(),
        "owner_stale"
    );
    assert_eq!(
        f.store.workspace(f.tenant, x).await.unwrap(),
        WorkspaceRecord {
            workspace_id: ws,
            exec_id: x,
            head: Some(head),
            snapshots: 1
        }
    );
    assert_eq!(
        f.store.snapshots(f.tenant, x, 0, 10).await.unwrap(),
        vec![SnapshotMeta {
            workspace_id: ws,
            seq: 1,
            digest: head,
            parent: None,
            manifest_bytes: manifest.len() as i64,
            lease_id: lease1,
            generation: Generation(1),
            committed_cut: at.cut,
        }]
    );
    assert_eq!(f.store.snapshots(f.tenant, x, 1, 10).await.unwrap(), vec![]);
    assert_eq!(
        f.store.snapshot_manifest(f.tenant, x, head).await.unwrap(),
        manifest
    );
    assert_eq!(
        f.store
            .snapshot_manifest(f.tenant, x, Digest([1; 32]))
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    let e_now = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (e_now.state, e_now.lease_state, e_now.terminal_reason),
        (ExecState::Running, Some(LeaseState::ReleasePending), None)
    );
    // Units are still held until the destroy is proven.
    assert_eq!(available(&f).await, (1, 2));

    // Prove and return: the attempt parks, the units come back once.
    let w = f.store.due_work(at, 10).await.unwrap();
    assert_eq!(
        w.iter().map(|w| (w.lease_id, w.action)).collect::<Vec<_>>(),
        vec![(lease1, LeaseAction::Destroy)]
    );
    let out = f
        .store
        .commit_release(lease1, Generation(1), &f.provider.absence(lease1, 1), at)
        .await
        .unwrap();
    assert_eq!(
        (out.units_returned, out.replay, out.parked, out.released_cut),
        (2, false, true, at.cut)
    );
    assert_eq!(available(&f).await, (3, 0));
    let again = f
        .store
        .commit_release(lease1, Generation(1), &f.provider.absence(lease1, 1), at)
        .await
        .unwrap();
    assert_eq!(
        (again.units_returned, again.replay, again.parked),
        (2, true, true)
    );
    assert_eq!(available(&f).await, (3, 0));
    let e_now = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (e_now.state, e_now.lease_state, e_now.terminal_reason),
        (ExecState::Hibernated, Some(LeaseState::Released), None)
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("parked".into(), 1));
    assert_eq!(f.store.due_hibernations(at, 10).await.unwrap(), vec![]);

    // Resume intent.
    let before = snapshot(&f.db.url).await;
    let forged_digest = OperationKey::new("r1", Digest([3; 32])).unwrap();
    assert_eq!(
        f.store
            .request_resume(&forged_digest, at, f.tenant, x, Some(head))
            .await
            .unwrap_err(),
        LcError::RequestDigestMismatch {
            expected: hibernate::resume_request_sha256(x, Some(head)),
            found: Digest([3; 32]),
        }
    );
    let wrong = Digest([4; 32]);
    assert_eq!(
        f.store
            .request_resume(&resume_op("r1", x, wrong), at, f.tenant, x, Some(wrong))
            .await
            .unwrap_err()
            .code(),
        "workspace_head_mismatch"
    );
    assert_eq!(
        f.store
            .request_resume(
                &resume_op("r1", x, head),
                at,
                lc_core::TenantId(f.tenant.0 + 1),
                x,
                Some(head)
            )
            .await
            .unwrap_err(),
        LcError::not_found("exec", x)
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let intent = f
        .store
        .request_resume(&resume_op("r1", x, head), at, f.tenant, x, Some(head))
        .await
        .unwrap();
    assert_eq!(
        (
            intent.head,
            intent.attempt,
            intent.from_generation,
            intent.request_sha256,
            intent.recorded_cut
        ),
        (
            head,
            AttemptNo(1),
            Generation(1),
            hibernate::resume_request_sha256(x, Some(head)),
            at.cut
        )
    );
    assert_eq!(
        f.store
            .request_resume(&resume_op("r1", x, head), at, f.tenant, x, Some(head))
            .await
            .unwrap(),
        intent
    );

    // The resume's owner takes the parked exec over (its owner released).
    let owned = f.store.take_over(&tok, f.tenant, x, at, TTL).await.unwrap();
    assert_eq!(
        (
            owned.basis,
            owned.attempt_parked,
            owned.resume_op_key.as_deref()
        ),
        (lc_core::owner::TakeoverBasis::Released, true, Some("r1"))
    );
    let cred = cred_of(&owned, &tok);
    let stale = OwnerCredential {
        generation: OwnerGeneration(cred.generation.0 + 1),
        ..cred.clone()
    };
    // Prepare: refusals, then Reservation 2 and Lease 2.
    for (code, c, reading) in [
        (
            "time_uncertain",
            cred.clone(),
            CutReading::uncertain(at.cut, 1),
        ),
        ("owner_stale", stale.clone(), at),
    ] {
        let before = snapshot(&f.db.url).await;
        assert_eq!(
            f.store
                .prepare_resume(&c, x, reading, "r1")
                .await
                .unwrap_err()
                .code(),
            code
        );
        assert_eq!(snapshot(&f.db.url).await, before, "{code}");
    }
    let w2 = f.store.prepare_resume(&cred, x, at, "r1").await.unwrap();
    assert_eq!(
        (
            w2.generation,
            w2.state,
            w2.action,
            w2.restore_head,
            w2.first_seq,
            w2.last_seq,
            w2.attached,
            w2.expiry
        ),
        (
            Generation(2),
            LeaseState::Allocating,
            LeaseAction::Allocate,
            Some(head),
            2,
            1,
            false,
            at.cut + f.store.config().lease_ttl
        )
    );
    let lease2 = w2.lease_id;
    assert_ne!(lease2, lease1);
    assert_eq!(available(&f).await, (1, 2));
    assert_eq!(
        f.store.prepare_resume(&cred, x, at, "r1").await.unwrap(),
        w2
    );
    assert_eq!(available(&f).await, (1, 2));
    assert_eq!(
        f.store
            .restore_manifest(lease2, Generation(2))
            .await
            .unwrap(),
        manifest
    );
    // One resume at a time: a second request while r1 is pending is
    // refused, naming r1, and writes nothing.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .request_resume(&resume_op("r2", x, head), at, f.tenant, x, Some(head))
            .await
            .unwrap_err(),
        LcError::ResumeInProgress {
            exec_id: x,
            op_key: "r1".into()
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // An intent the store no longer records beside a pending one,
    // written directly: its prepare still refuses to compete with the
    // prepared Lease.
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    sqlx::query(
        "INSERT INTO lc_resume_intents (exec_id, op_key, request_sha256, head, attempt, \
             from_generation, recorded_floor_us, recorded_submicro_ns) \
         SELECT exec_id, 'r2', request_sha256, head, attempt, from_generation, \
                recorded_floor_us, recorded_submicro_ns \
           FROM lc_resume_intents WHERE exec_id = $1 AND op_key = 'r1'",
    )
    .bind(x.0)
    .execute(&mut c)
    .await
    .unwrap();
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .prepare_resume(&cred, x, at, "r2")
            .await
            .unwrap_err()
            .code(),
        "competing_right"
    );
    // No attachment yet: not resumable.
    assert_eq!(
        f.store
            .commit_resume(&cred, x, at, "r1")
            .await
            .unwrap_err()
            .code(),
        "competing_right"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Attachment: a forged signature and another head are refused.
    for (code, ev) in [
        (
            "evidence_rejected",
            TestProvider::new("p1", 98).attachment(lease2, 2, ws.0, head),
        ),
        (
            "workspace_head_mismatch",
            f.provider.attachment(lease2, 2, ws.0, Digest([5; 32])),
        ),
        (
            "evidence_rejected",
            f.provider.attachment(lease2, 1, ws.0, head),
        ),
    ] {
        let before = snapshot(&f.db.url).await;
        assert_eq!(
            f.store
                .record_attachment(lease2, Generation(2), &ev, at)
                .await
                .unwrap_err()
                .code(),
            code
        );
        assert_eq!(snapshot(&f.db.url).await, before, "{code}");
    }
    let attach = f.provider.attachment(lease2, 2, ws.0, head);
    let w = f
        .store
        .record_attachment(lease2, Generation(2), &attach, at)
        .await
        .unwrap();
    assert!(w.attached);
    assert_eq!(
        f.store
            .record_attachment(lease2, Generation(2), &attach, at)
            .await
            .unwrap(),
        w
    );

    // Commit: uncertain, stale, a tampered intent digest, then an
    // expired owner; each changes nothing.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .commit_resume(&cred, x, CutReading::uncertain(at.cut, 2), "r1")
            .await
            .unwrap_err(),
        LcError::TimeUncertain { retry_after_s: 2 }
    );
    assert_eq!(
        f.store
            .commit_resume(&stale, x, at, "r1")
            .await
            .unwrap_err()
            .code(),
        "owner_stale"
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    {
        let mut c = PgConnection::connect(&f.db.url).await.unwrap();
        sqlx::query(
            "UPDATE lc_resume_intents SET request_sha256 = $3 WHERE exec_id = $1 AND op_key = $2",
        )
        .bind(x.0)
        .bind("r1")
        .bind(&[6u8; 32][..])
        .execute(&mut c)
        .await
        .unwrap();
        let tampered = snapshot(&f.db.url).await;
        assert_eq!(
            f.store
                .commit_resume(&cred, x, at, "r1")
                .await
                .unwrap_err()
                .code(),
            "request_digest_mismatch"
        );
        assert_eq!(snapshot(&f.db.url).await, tampered);
        sqlx::query(
            "UPDATE lc_resume_intents SET request_sha256 = $3 WHERE exec_id = $1 AND op_key = $2",
        )
        .bind(x.0)
        .bind("r1")
        .bind(&hibernate::resume_request_sha256(x, Some(head)).0[..])
        .execute(&mut c)
        .await
        .unwrap();
    }
    let late = wait_reading(&f.clock, 20, "a certain cut past the heartbeat", |r| {
        r.certain && r.cut >= heartbeat_expiry
    })
    .await;
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .commit_resume(&cred, x, late, "r1")
            .await
            .unwrap_err(),
        LcError::OwnerExpired {
            exec_id: x,
            generation: cred.generation,
            heartbeat_expiry,
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // A successor takes the hibernated exec over and commits.
    let tok2 = token(0xb2);
    let owned2 = f
        .store
        .take_over(&tok2, f.tenant, x, late, SignedDuration::from_secs(30))
        .await
        .unwrap();
    let cred2 = cred_of(&owned2, &tok2);
    let receipt = f.store.commit_resume(&cred2, x, late, "r1").await.unwrap();
    assert_eq!(
        receipt,
        ResumeReceipt {
            exec_id: x,
            op_key: "r1".into(),
            attempt: AttemptNo(1),
            from_generation: Generation(1),
            to_generation: Generation(2),
            lease_id: lease2,
            head,
            request_sha256: hibernate::resume_request_sha256(x, Some(head)),
            token_sha256: tok2.sha256(),
            owner_generation: owned2.ownership.generation.0,
            owner_fence: owned2.ownership.fence.0,
            committed_cut: late.cut,
        }
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("runnable".into(), 2));
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store.commit_resume(&cred2, x, late, "r1").await.unwrap(),
        receipt
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // Another resume of the runnable exec is refused.
    assert_eq!(
        f.store
            .request_resume(&resume_op("r3", x, head), late, f.tenant, x, Some(head))
            .await
            .unwrap_err(),
        LcError::ExecNotParked {
            exec_id: x,
            state: "runnable"
        }
    );
    assert_eq!(
        f.store
            .commit_resume(&cred2, x, late, "r2")
            .await
            .unwrap_err()
            .code(),
        "exec_not_parked"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The instance runs: generation 2 active, exec running again.
    f.store
        .mark_active(lease2, Generation(2), late)
        .await
        .unwrap();
    let e_now = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (e_now.state, e_now.lease_state, e_now.attempt),
        (ExecState::Running, Some(LeaseState::Active), AttemptNo(1))
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("running".into(), 2));
    assert_eq!(available(&f).await, (1, 2));

    // The database's guards.
    let before = snapshot(&f.db.url).await;
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    for (sql, code) in [
        ("UPDATE lc_snapshots SET generation = 7", "LCS07"),
        ("DELETE FROM lc_snapshots", "LCS07"),
        ("UPDATE lc_resume_receipts SET owner_fence = 7", "LCS08"),
        ("DELETE FROM lc_resume_receipts", "LCS08"),
    ] {
        let err = sqlx::query(sql).execute(&mut c).await.unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some(code),
            "{sql}"
        );
    }
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_audit_clean(&f.store).await;
}

/// The resume guard refuses a raw update of a parked attempt to
/// runnable; the store's routine passes it.
async fn resume_guard(f: Fixture) {
    let at = certain(&f.clock).await;
    let p = prepared(&f, at).await;
    let x = p.exec.exec_id;
    assert_eq!(attempt_state(&f.db.url, x).await, ("parked".into(), 2));
    let before = snapshot(&f.db.url).await;
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let err = sqlx::query("UPDATE lc_attempts SET state = 'runnable' WHERE exec_id = $1")
        .bind(x.0)
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("LCS09")
    );
    assert!(err.to_string().contains("resume_not_committed"), "{err}");
    assert_eq!(snapshot(&f.db.url).await, before);
    // The store's routine is the way: its receipt and the CAS commit together.
    let r = f.store.commit_resume(&p.cred, x, p.at, "pr").await.unwrap();
    assert_eq!(
        (r.to_generation, r.lease_id, r.head),
        (Generation(2), p.lease2, p.head)
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("runnable".into(), 2));
    assert_eq!(
        f.store
            .restore_manifest(p.lease2, Generation(2))
            .await
            .unwrap(),
        p.manifest
    );
}

#[tokio::test]
async fn sixteen_concurrent_commits_make_one_receipt_and_one_transition() {
    let f = fixture_with(
        3,
        lc_pg::LcConfig {
            max_connections: 17,
            ..config()
        },
    )
    .await;
    let at = certain(&f.clock).await;
    let p = prepared(&f, at).await;
    let x = p.exec.exec_id;
    let store = std::sync::Arc::new(f.store);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let store = store.clone();
        let cred = p.cred.clone();
        tasks.push(tokio::spawn(async move {
            store.commit_resume(&cred, x, at, "pr").await
        }));
    }
    let mut receipts = Vec::new();
    for t in tasks {
        receipts.push(t.await.unwrap().unwrap());
    }
    assert_eq!(receipts.len(), 16);
    assert!(receipts.iter().all(|r| *r == receipts[0]), "{receipts:?}");
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let (n, runnable): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM lc_resume_receipts WHERE exec_id = $1), \
                (SELECT count(*) FROM lc_attempts WHERE exec_id = $1 AND state = 'runnable')",
    )
    .bind(x.0)
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!((n, runnable), (1, 1));
    assert_eq!(receipts[0].committed_cut, at.cut);
}

#[tokio::test]
async fn idle_and_deadline_are_due_exactly_and_never_on_an_uncertain_cut() {
    let f = fixture(6).await;
    let at = certain(&f.clock).await;
    let idle = running_exec(&f, "idle", at, Some(5), None, OnTimeout::Terminate).await;
    let deadline = running_exec(&f, "dl", at, None, Some(7), OnTimeout::Hibernate).await;
    let never = running_exec(&f, "never", at, None, Some(3), OnTimeout::Terminate).await;
    let base = at.cut;
    let ms = |n: i64| SignedDuration::from_millis(n);
    let ns = SignedDuration::from_nanos(1);
    wait_reading(&f.clock, 20, "a certain cut 10 ms past admission", |r| {
        r.certain && r.cut >= base + ms(10)
    })
    .await;
    // The exec that terminates on timeout is released for it, not hibernated.
    let w = f
        .store
        .due_work(CutReading::certain(base + ms(3)), 10)
        .await
        .unwrap();
    let action = |l: SandboxLeaseId| w.iter().find(|w| w.lease_id == l).unwrap().action;
    assert_eq!(
        action(never.canonical.lease_id),
        LeaseAction::BeginRelease(lc_core::TerminalReason::Expired)
    );
    assert_eq!(action(deadline.canonical.lease_id), LeaseAction::Maintain);

    let before = snapshot(&f.db.url).await;
    for reading in [
        CutReading::certain(base + ms(5) - ns),
        CutReading::uncertain(base + ms(10), 1),
    ] {
        assert_eq!(f.store.due_hibernations(reading, 10).await.unwrap(), vec![]);
        assert_eq!(snapshot(&f.db.url).await, before, "{reading:?}");
    }
    let sealed = |e: &ExecRecord, reason, cut| HibernationRecord {
        exec_id: e.exec_id,
        attempt: AttemptNo(1),
        generation: Generation(1),
        lease_id: e.canonical.lease_id,
        reason,
        sealed_cut: cut,
        step: HibernationStep::Sealed,
        head: None,
        refusal: None,
    };
    let at_idle = base + ms(5);
    assert_eq!(
        f.store
            .due_hibernations(CutReading::certain(at_idle), 10)
            .await
            .unwrap(),
        vec![sealed(&idle, HibernationReason::Idle, at_idle)]
    );
    assert_eq!(
        f.store
            .due_hibernations(CutReading::certain(base + ms(7) - ns), 10)
            .await
            .unwrap(),
        vec![sealed(&idle, HibernationReason::Idle, at_idle)]
    );
    let at_dl = base + ms(7);
    assert_eq!(
        f.store
            .due_hibernations(CutReading::certain(at_dl), 10)
            .await
            .unwrap(),
        vec![
            sealed(&idle, HibernationReason::Idle, at_idle),
            sealed(&deadline, HibernationReason::Deadline, at_dl)
        ]
    );
    // Bounded.
    assert_eq!(
        f.store
            .due_hibernations(CutReading::certain(at_dl), 1)
            .await
            .unwrap(),
        vec![sealed(&idle, HibernationReason::Idle, at_idle)]
    );
    assert_eq!(
        f.store
            .due_hibernations(CutReading::certain(at_dl), 0)
            .await
            .unwrap_err()
            .code(),
        "invalid_limit"
    );
}

#[tokio::test]
async fn activity_moves_the_idle_boundary() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let e = running_exec(&f, "busy", at, Some(5), None, OnTimeout::Terminate).await;
    let x = e.exec_id;
    let tok = token(0xc3);
    let owned = f
        .store
        .take_over(&tok, f.tenant, x, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    let cred = cred_of(&owned, &tok);
    let ms = |n: i64| SignedDuration::from_millis(n);
    let ns = SignedDuration::from_nanos(1);
    let later = wait_reading(&f.clock, 20, "a certain cut 1 ms later", |r| {
        r.certain && r.cut >= at.cut + ms(1)
    })
    .await;
    let page = PageMeta::of_page(
        x,
        AttemptNo(1),
        &Page::data(1, PageKind::Stdout, b"tick".to_vec()).unwrap(),
    );
    f.store.stage_pages(&cred, x, later, &[page]).await.unwrap();
    wait_reading(&f.clock, 20, "a certain cut past the new boundary", |r| {
        r.certain && r.cut >= later.cut + ms(5)
    })
    .await;
    // Due at the admission's boundary no more; exactly at the page's.
    assert_eq!(
        f.store
            .due_hibernations(CutReading::certain(at.cut + ms(5)), 10)
            .await
            .unwrap(),
        vec![]
    );
    assert_eq!(
        f.store
            .due_hibernations(CutReading::certain(later.cut + ms(5) - ns), 10)
            .await
            .unwrap(),
        vec![]
    );
    let got = f
        .store
        .due_hibernations(CutReading::certain(later.cut + ms(5)), 10)
        .await
        .unwrap();
    assert_eq!(
        got.iter()
            .map(|h| (h.exec_id, h.reason, h.sealed_cut))
            .collect::<Vec<_>>(),
        vec![(x, HibernationReason::Idle, later.cut + ms(5))]
    );
}

#[tokio::test]
async fn a_resume_whose_lease_is_released_uncommitted_stays_parked_and_resumes_again() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let p = prepared(&f, at).await;
    let x = p.exec.exec_id;
    let ws = p.exec.canonical.workspace_id.0;
    assert_eq!(available(&f).await, (1, 2));
    // The restored instance never got its command: released with the
    // provider's not-sent proof, the units return once, the attempt stays
    // parked and the exec hibernated, with no terminal reason.
    let not_sent = f.provider.sign(lc_core::evidence::Statement::NotSent {
        provider_id: "p1".into(),
        lease_id: p.lease2.0,
        generation: 2,
    });
    f.store
        .begin_release_not_sent(p.lease2, Generation(2), &not_sent, at)
        .await
        .unwrap();
    let out = f
        .store
        .commit_release(
            p.lease2,
            Generation(2),
            &f.provider.absence(p.lease2, 2),
            at,
        )
        .await
        .unwrap();
    assert_eq!(
        (out.units_returned, out.parked, out.replay),
        (2, true, false)
    );
    assert_eq!(available(&f).await, (3, 0));
    let e = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (e.state, e.lease_state, e.terminal_reason),
        (ExecState::Hibernated, Some(LeaseState::Released), None)
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("parked".into(), 2));
    // The old request's Lease is gone: it cannot commit.
    assert_eq!(
        f.store
            .commit_resume(&p.cred, x, at, "pr")
            .await
            .unwrap_err()
            .code(),
        "competing_right"
    );
    // A new request resumes from generation 2 to 3 on the same head.
    let i = f
        .store
        .request_resume(&resume_op("pr2", x, p.head), at, f.tenant, x, Some(p.head))
        .await
        .unwrap();
    assert_eq!(i.from_generation, Generation(2));
    let w3 = f.store.prepare_resume(&p.cred, x, at, "pr2").await.unwrap();
    assert_eq!(
        (w3.generation, w3.restore_head, w3.state),
        (Generation(3), Some(p.head), LeaseState::Allocating)
    );
    assert_eq!(available(&f).await, (1, 2));
    f.store
        .record_attachment(
            w3.lease_id,
            Generation(3),
            &f.provider.attachment(w3.lease_id, 3, ws, p.head),
            at,
        )
        .await
        .unwrap();
    let r = f.store.commit_resume(&p.cred, x, at, "pr2").await.unwrap();
    assert_eq!(
        (r.from_generation, r.to_generation, r.lease_id),
        (Generation(2), Generation(3), w3.lease_id)
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("runnable".into(), 3));
    assert_audit_clean(&f.store).await;
}

/// The timeout bounds each run of an exec: a committed resume restarts it
/// from the commit's cut, so a timeout that passed while the exec was
/// parked does not end the resumed run the moment it is active.
#[tokio::test]
async fn a_committed_resume_restarts_the_timeout_from_its_cut() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let timeout = SignedDuration::from_millis(5);
    let (e, cred, _, head) = parked(&f, at, Some(5)).await;
    let x = e.exec_id;
    assert_eq!(e.timeout_deadline, Some(at.cut + timeout));
    let later = wait_reading(&f.clock, 20, "a certain cut past the timeout", |r| {
        r.certain && r.cut > at.cut + timeout
    })
    .await;
    f.store
        .request_resume(&resume_op("rt", x, head), later, f.tenant, x, Some(head))
        .await
        .unwrap();
    let w = f.store.prepare_resume(&cred, x, later, "rt").await.unwrap();
    let ws = e.canonical.workspace_id.0;
    f.store
        .record_attachment(
            w.lease_id,
            Generation(2),
            &f.provider.attachment(w.lease_id, 2, ws, head),
            later,
        )
        .await
        .unwrap();
    let r = f.store.commit_resume(&cred, x, later, "rt").await.unwrap();
    assert_eq!(r.committed_cut, later.cut);
    assert_eq!(
        f.store.exec(f.tenant, x).await.unwrap().timeout_deadline,
        Some(later.cut + timeout)
    );
    f.store
        .mark_active(w.lease_id, Generation(2), later)
        .await
        .unwrap();
    let action_at = |cut| {
        let store = &f.store;
        async move {
            let w2 = store.due_work(CutReading::certain(cut), 10).await.unwrap();
            w2.iter().find(|d| d.lease_id == w.lease_id).unwrap().action
        }
    };
    wait_reading(
        &f.clock,
        20,
        "a certain cut past the restarted timeout",
        |r| r.certain && r.cut >= later.cut + timeout,
    )
    .await;
    let ns = SignedDuration::from_nanos(1);
    assert_eq!(
        action_at(later.cut + timeout - ns).await,
        LeaseAction::Maintain
    );
    assert_eq!(
        action_at(later.cut + timeout).await,
        LeaseAction::BeginRelease(lc_core::TerminalReason::Expired)
    );
    // A replay of the commit returns the one receipt and moves nothing.
    assert_eq!(
        f.store.commit_resume(&cred, x, later, "rt").await.unwrap(),
        r
    );
    assert_eq!(
        f.store.exec(f.tenant, x).await.unwrap().timeout_deadline,
        Some(later.cut + timeout)
    );
}

#[tokio::test]
async fn migration_0004_backfills_one_workspace_per_exec_and_admits_the_new_states() {
    let db = fresh_db().await;
    tollgate_pg::Schema::current()
        .with_line(lc_pg::lc_line().through(3).unwrap())
        .migrate(&db.url)
        .await
        .expect("migrate through 3");
    let mut c = PgConnection::connect(&db.url).await.unwrap();
    // Two execs as a version-3 store left them (their other rows left
    // out: only the backfill is under test).
    sqlx::raw_sql(
        "BEGIN; SET LOCAL session_replication_role = replica; \
         INSERT INTO lc_execs (tenant_id, lease_id, provider_id, runtime_digest, workspace_id, shape, \
             units, command, admitted_floor_us, admitted_submicro_ns, state) \
         VALUES (1, 1, 'p1', decode(repeat('00', 32), 'hex'), 41, 'small', 1, '[\"true\"]', 5, 7, 'running'), \
                (1, 2, 'p1', decode(repeat('00', 32), 'hex'), 42, 'small', 1, '[\"true\"]', 6, 8, 'admitted'); \
         COMMIT;",
    )
    .execute(&mut c)
    .await
    .unwrap();
    lc_pg::migrate(&db.url)
        .await
        .expect("migrate to the current version");
    let rows: Vec<(i64, i64, Option<Vec<u8>>, i64)> = sqlx::query_as(
        "SELECT workspace_id, exec_id, head, snapshots FROM lc_workspaces ORDER BY workspace_id",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(rows, vec![(41, 1, None, 0), (42, 2, None, 0)]);
    let (idle, on_timeout, last): (Option<i64>, String, Option<i64>) = sqlx::query_as(
        "SELECT idle_ttl_ms, on_timeout, last_activity_floor_us FROM lc_execs WHERE exec_id = 1",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!((idle, on_timeout.as_str(), last), (None, "terminate", None));
    // The state and page-kind checks take the new values, and only them.
    let mut tx = c.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE lc_execs SET state = 'hibernated' WHERE exec_id = 1")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, length, \
             exit_code, exit_signal, state) \
         VALUES (1, 1, 1, 'stopped', '', sha256(''), 0, NULL, 15, 'acked')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    for sql in [
        "UPDATE lc_execs SET state = 'sleeping' WHERE exec_id = 1",
        "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, length, \
             exit_code, exit_signal, state) \
         VALUES (1, 1, 1, 'stopped', '', sha256(''), 0, NULL, NULL, 'acked')",
        "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, length, \
             exit_code, exit_signal, state) \
         VALUES (1, 1, 1, 'paused', '', sha256(''), 0, NULL, NULL, 'acked')",
    ] {
        let mut tx = c.begin().await.unwrap();
        sqlx::query("SET LOCAL session_replication_role = replica")
            .execute(&mut *tx)
            .await
            .unwrap();
        let err = sqlx::query(sql).execute(&mut *tx).await.unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("23514"),
            "{sql}"
        );
        tx.rollback().await.unwrap();
    }
    // A snapshot whose bytes are not its digest is refused by the database.
    let mut tx = c.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = sqlx::query(
        "INSERT INTO lc_snapshots (workspace_id, digest, seq, parent, manifest, lease_id, generation, \
             committed_floor_us, committed_submicro_ns) \
         VALUES (41, sha256('a'), 1, NULL, 'b', 1, 1, 0, 0)",
    )
    .execute(&mut *tx)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.constraint()),
        Some("lc_snapshots_digest")
    );
}

#[tokio::test]
async fn a_pending_resume_is_claimable_and_a_cancel_ends_a_parked_exec() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let (e, _cred, _manifest, head) = parked(&f, at, None).await;
    let x = e.exec_id;
    // Its owner released: a parked exec without a resume request is not
    // claimed; with one it is.
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    sqlx::query("UPDATE lc_exec_owners SET released = true WHERE exec_id = $1")
        .bind(x.0)
        .execute(&mut c)
        .await
        .unwrap();
    let b = token(0xd4);
    assert_eq!(f.store.claim(&b, at, TTL, 10).await.unwrap(), vec![]);
    f.store
        .request_resume(&resume_op("q1", x, head), at, f.tenant, x, Some(head))
        .await
        .unwrap();
    let got = f.store.claim(&b, at, TTL, 10).await.unwrap();
    assert_eq!(
        got.iter()
            .map(|o| (o.ownership.exec_id, o.basis, o.lease_state))
            .collect::<Vec<_>>(),
        vec![(
            x,
            lc_core::owner::TakeoverBasis::Released,
            LeaseState::Released
        )]
    );
    // A cancel ends it at once: nothing runs, no units are held.
    let rec = ControlStore::cancel(&f.store, &op("c1", "c1"), at, f.tenant, x)
        .await
        .unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.cancel_requested),
        (
            ExecState::Terminal,
            Some(lc_core::TerminalReason::Cancelled),
            true
        )
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("terminal".into(), 1));
    assert_eq!(available(&f).await, (3, 0));
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .request_resume(&resume_op("q2", x, head), at, f.tenant, x, Some(head))
            .await
            .unwrap_err(),
        LcError::ExecTerminal { exec_id: x }
    );
    let cred_b = cred_of(&got[0], &b);
    assert_eq!(
        f.store
            .prepare_resume(&cred_b, x, at, "q1")
            .await
            .unwrap_err(),
        LcError::ExecNotParked {
            exec_id: x,
            state: "terminal"
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_audit_clean(&f.store).await;
}

#[tokio::test]
async fn an_input_sent_moves_the_idle_boundary() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let mut r = req("small", &["cat"]);
    r.stdin_open = true;
    r.idle_ttl_ms = Some(5);
    let e = f
        .store
        .admit_exec(&op("in", "in"), at, f.tenant, &r)
        .await
        .unwrap();
    let x = e.exec_id;
    f.store
        .mark_active(e.canonical.lease_id, Generation(1), at)
        .await
        .unwrap();
    let tok = token(0xe5);
    let owned = f
        .store
        .take_over(&tok, f.tenant, x, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    let cred = cred_of(&owned, &tok);
    f.store
        .send_input(&op("i1", "i1"), at, f.tenant, x, b"hi\n", false)
        .await
        .unwrap();
    let ms = |n: i64| SignedDuration::from_millis(n);
    let ns = SignedDuration::from_nanos(1);
    let later = wait_reading(&f.clock, 20, "a certain cut 1 ms later", |r| {
        r.certain && r.cut >= at.cut + ms(1)
    })
    .await;
    // Queuing input is the tenant's act, not the command's: only the
    // owner's send moves the boundary.
    f.store
        .record_send(&cred, x, later, "send-1", 1)
        .await
        .unwrap();
    wait_reading(&f.clock, 20, "a certain cut past the new boundary", |r| {
        r.certain && r.cut >= later.cut + ms(5)
    })
    .await;
    for reading in [at.cut + ms(5), later.cut + ms(5) - ns] {
        assert_eq!(
            f.store
                .due_hibernations(CutReading::certain(reading), 10)
                .await
                .unwrap(),
            vec![]
        );
    }
    let got = f
        .store
        .due_hibernations(CutReading::certain(later.cut + ms(5)), 10)
        .await
        .unwrap();
    assert_eq!(
        got.iter()
            .map(|h| (h.exec_id, h.reason, h.sealed_cut))
            .collect::<Vec<_>>(),
        vec![(x, HibernationReason::Idle, later.cut + ms(5))]
    );
}

#[tokio::test]
async fn a_refused_restore_is_recorded_on_its_intent_and_a_new_request_retries() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let p = prepared(&f, at).await;
    let x = p.exec.exec_id;
    let not_sent = f.provider.sign(lc_core::evidence::Statement::NotSent {
        provider_id: "p1".into(),
        lease_id: p.lease2.0,
        generation: 2,
    });
    // A message over the bound is cut at a character boundary (113 ASCII
    // bytes, then two-byte characters: byte 2048 is inside one).
    let long = format!(
        "restore failed (blob_corrupt) at \"b.txt\" blob {}: x{}",
        Digest([7; 32]).to_hex(),
        "é".repeat(2000)
    );
    let refusal = hibernate::ResumeRefusal {
        code: "restore_failed".into(),
        message: long.clone(),
    };
    let w = f
        .store
        .refuse_restore(p.lease2, Generation(2), &not_sent, at, &refusal)
        .await
        .unwrap();
    assert_eq!(w.state, LeaseState::ReleasePending);
    // Idempotent: the refusal recorded first is kept.
    let other = hibernate::ResumeRefusal {
        code: "snapshot_refused".into(),
        message: "another".into(),
    };
    f.store
        .refuse_restore(p.lease2, Generation(2), &not_sent, at, &other)
        .await
        .unwrap();
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let (code, message): (String, String) = sqlx::query_as(
        "SELECT refused_code, refused_message FROM lc_resume_intents WHERE exec_id = $1",
    )
    .bind(x.0)
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(code, "restore_failed");
    assert_eq!(message.len(), 2047, "2048 would split a two-byte character");
    assert!(long.starts_with(&message));
    // The refused intent is never prepared again.
    let before = snapshot(&f.db.url).await;
    let err = f
        .store
        .prepare_resume(&p.cred, x, at, "pr")
        .await
        .unwrap_err();
    assert_eq!(err.code(), "resume_refused");
    assert_eq!(
        err.to_string(),
        format!(
            "the resume \"pr\" of exec {x} was refused by the provider (restore_failed: {message}); repair the snapshot's blobs and request the resume again under a new operation key"
        )
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    f.store
        .commit_release(
            p.lease2,
            Generation(2),
            &f.provider.absence(p.lease2, 2),
            at,
        )
        .await
        .unwrap();
    assert_eq!(available(&f).await, (3, 0));
    assert_eq!(attempt_state(&f.db.url, x).await, ("parked".into(), 2));
    // Released, the parked exec with only a refused request is not
    // claimable; the owner's view shows nothing to act on.
    sqlx::query("UPDATE lc_exec_owners SET released = true WHERE exec_id = $1")
        .bind(x.0)
        .execute(&mut c)
        .await
        .unwrap();
    let b = token(0xe5);
    assert_eq!(f.store.claim(&b, at, TTL, 10).await.unwrap(), vec![]);
    // A new request (another key) retries: claimable, prepared as
    // generation 3.
    f.store
        .request_resume(&resume_op("pr2", x, p.head), at, f.tenant, x, Some(p.head))
        .await
        .unwrap();
    let got = f.store.claim(&b, at, TTL, 10).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (
            got[0].attempt_parked,
            got[0].resume_op_key.as_deref(),
            got[0].lease_state,
            got[0].lease_attached
        ),
        // The current Lease is still generation 2's, released (this
        // fixture recorded its attachment before the refusal).
        (true, Some("pr2"), LeaseState::Released, true)
    );
    let cred_b = cred_of(&got[0], &b);
    let w3 = f.store.prepare_resume(&cred_b, x, at, "pr2").await.unwrap();
    assert_eq!(w3.generation, Generation(3));
    let view = f.store.heartbeat(&cred_b, x, at, TTL).await.unwrap();
    assert_eq!(
        (
            view.resume_op_key.as_deref(),
            view.lease_state,
            view.lease_generation
        ),
        (Some("pr2"), LeaseState::Allocating, Generation(3))
    );
    assert_audit_clean(&f.store).await;
}

#[tokio::test]
async fn a_resume_key_reused_after_its_record_was_collected_is_a_typed_refusal() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let (e, _cred, _manifest, head) = parked(&f, at, None).await;
    let x = e.exec_id;
    f.store
        .request_resume(&resume_op("k1", x, head), at, f.tenant, x, Some(head))
        .await
        .unwrap();
    // What the operation-key GC does once the key's TTL passed: the
    // record goes, the intent (a receipt may refer to it) stays.
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let gone = sqlx::query("DELETE FROM lc_operations WHERE op_key = 'k1'")
        .execute(&mut c)
        .await
        .unwrap();
    assert_eq!(gone.rows_affected(), 1);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .request_resume(&resume_op("k1", x, head), at, f.tenant, x, Some(head))
            .await
            .unwrap_err(),
        LcError::IdempotencyConflict { key: "k1".into() }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
}

fn refusal(reason: &str, path: &str, message: &str) -> QuiescenceRefusal {
    QuiescenceRefusal {
        reason: reason.into(),
        path: path.into(),
        message: message.into(),
    }
}

/// What a provider says of a workspace holding a fifo.
fn fifo_refusal() -> QuiescenceRefusal {
    refusal(
        "special_file",
        "pipe",
        "\"pipe\" is a fifo: a snapshot keeps regular files, directories and symlinks",
    )
}

/// Admits a running exec (2 units), takes it over with `tok` (60 s) and
/// seals its hibernation of generation 1 at `at`.
async fn sealed_exec(
    f: &Fixture,
    key: &str,
    tok: &OwnerToken,
    at: CutReading,
) -> (ExecRecord, OwnerCredential, HibernationRecord) {
    let e = running_exec(f, key, at, None, None, OnTimeout::Terminate).await;
    let owned = f
        .store
        .take_over(tok, f.tenant, e.exec_id, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    let cred = cred_of(&owned, tok);
    let h = f
        .store
        .request_hibernation(&op(&format!("h-{key}"), key), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    assert_eq!(
        (h.exec_id, h.generation, h.step, h.head, h.refusal.clone()),
        (
            e.exec_id,
            Generation(1),
            HibernationStep::Sealed,
            None,
            None
        )
    );
    (e, cred, h)
}

/// The stopped command's pages: one stdout page, then the stopped page
/// (seq 2).
fn stop_pages(x: ExecId) -> Vec<PageMeta> {
    vec![
        PageMeta::of_page(
            x,
            AttemptNo(1),
            &Page::data(1, PageKind::Stdout, b"out".to_vec()).unwrap(),
        ),
        PageMeta::of_page(
            x,
            AttemptNo(1),
            &Page::stopped(2, ExitStatus::signaled(15)).unwrap(),
        ),
    ]
}

/// Stages the stopped command's pages and acknowledges them through the
/// stopped page.
async fn stop_and_ack(f: &Fixture, x: ExecId, cred: &OwnerCredential, at: CutReading) {
    let r = f
        .store
        .stage_pages(cred, x, at, &stop_pages(x))
        .await
        .unwrap();
    assert_eq!((r.staged, r.duplicates, r.staged_through), (2, 0, 2));
    let receipt = f.store.ack_pages(cred, x, at, "ack-1-2", 2).await.unwrap();
    assert_eq!(receipt.detail["pages_acked"], 2);
}

/// The exec's Reservation of generation 1: its state and expiry.
async fn reservation(url: &str, exec: ExecId) -> (String, i64, i32) {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_as(
        "SELECT state, expiry_floor_us, expiry_submicro_ns FROM lc_reservations \
          WHERE exec_id = $1 AND attempt = 1 AND generation = 1",
    )
    .bind(exec.0)
    .fetch_one(&mut c)
    .await
    .unwrap()
}

/// `t` as the (floor microsecond, sub-microsecond nanosecond) pair the
/// store keeps.
fn pair_of(t: jiff::Timestamp) -> (i64, i32) {
    let ns = t.as_nanosecond();
    (ns.div_euclid(1000) as i64, ns.rem_euclid(1000) as i32)
}

/// The stored refusal columns of the exec's hibernation of generation 1.
async fn stored_refusal(
    url: &str,
    exec: ExecId,
) -> (String, bool, Option<String>, Option<String>, Option<String>) {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_as(
        "SELECT step, head IS NULL, refused_reason, refused_path, refused_message \
           FROM lc_hibernations WHERE exec_id = $1 AND attempt = 1 AND generation = 1",
    )
    .bind(exec.0)
    .fetch_one(&mut c)
    .await
    .unwrap()
}

async fn owner_released(url: &str, exec: ExecId) -> bool {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar("SELECT released FROM lc_exec_owners WHERE exec_id = $1")
        .bind(exec.0)
        .fetch_one(&mut c)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_refused_snapshot_on_postgresql_15() {
    refused_snapshot(fixture(3).await).await;
}

#[tokio::test]
async fn a_refused_snapshot_on_postgresql_18() {
    let (_server, f) = fixture_pg18(3).await;
    refused_snapshot(f).await;
}

/// Seal, stop, refuse, prove the destroy: the refusal is recorded exactly,
/// the exec ends `snapshot_refused`, the units come back exactly once and
/// the workspace head never moves; every refusal before it and every
/// replay after it changes nothing.
async fn refused_snapshot(f: Fixture) {
    let at = certain(&f.clock).await;
    let tok = token(0xf1);
    let (e, cred, sealed) = sealed_exec(&f, "rf", &tok, at).await;
    let x = e.exec_id;
    let lease1 = e.canonical.lease_id;
    let ws = e.canonical.workspace_id;
    assert_eq!(available(&f).await, (1, 2));
    let fifo = fifo_refusal();
    let refuse = |c: &OwnerCredential, reading: CutReading, g: i64, r: &QuiescenceRefusal| {
        let (store, c, r) = (&f.store, c.clone(), r.clone());
        async move {
            store
                .refuse_quiescence(&c, x, reading, Generation(g), &r)
                .await
        }
    };
    let not_stopped = LcError::IllegalTransition {
        what: "hibernation (a refused snapshot needs the stopped page acknowledged)",
        from: "sealed",
        to: "refused",
    };

    // Before the command is stopped: no stopped page at all, then one
    // staged but not acknowledged, then only the page before it acked.
    let before = snapshot(&f.db.url).await;
    assert_eq!(refuse(&cred, at, 1, &fifo).await.unwrap_err(), not_stopped);
    assert_eq!(snapshot(&f.db.url).await, before);
    f.store
        .stage_pages(&cred, x, at, &stop_pages(x))
        .await
        .unwrap();
    let before = snapshot(&f.db.url).await;
    assert_eq!(refuse(&cred, at, 1, &fifo).await.unwrap_err(), not_stopped);
    assert_eq!(snapshot(&f.db.url).await, before);
    f.store.ack_pages(&cred, x, at, "ack-1-1", 1).await.unwrap();
    let before = snapshot(&f.db.url).await;
    assert_eq!(refuse(&cred, at, 1, &fifo).await.unwrap_err(), not_stopped);
    assert_eq!(snapshot(&f.db.url).await, before);
    f.store.ack_pages(&cred, x, at, "ack-1-2", 2).await.unwrap();

    // Stopped and acknowledged: each other refusal changes nothing.
    let stale = OwnerCredential {
        generation: OwnerGeneration(cred.generation.0 + 1),
        ..cred.clone()
    };
    let other = OwnerCredential {
        token: token(0xee),
        ..cred.clone()
    };
    let cases: Vec<(LcError, OwnerCredential, CutReading, i64, QuiescenceRefusal)> = vec![
        (
            LcError::TimeUncertain { retry_after_s: 4 },
            cred.clone(),
            CutReading::uncertain(at.cut, 4),
            1,
            fifo.clone(),
        ),
        (
            LcError::InvalidInput {
                reason: "a snapshot refusal's reason is a stable code ([a-z][a-z0-9_]{0,63}), not \"Bad-Code\"".into(),
            },
            cred.clone(),
            at,
            1,
            refusal("Bad-Code", "pipe", "m"),
        ),
        (
            LcError::OwnerStale {
                exec_id: x,
                presented: stale.generation,
                current: cred.generation,
            },
            stale.clone(),
            at,
            1,
            fifo.clone(),
        ),
        (
            LcError::OwnerStale {
                exec_id: x,
                presented: cred.generation,
                current: cred.generation,
            },
            other.clone(),
            at,
            1,
            fifo.clone(),
        ),
    ];
    for (want, c, reading, g, r) in cases {
        let before = snapshot(&f.db.url).await;
        assert_eq!(refuse(&c, reading, g, &r).await.unwrap_err(), want);
        assert_eq!(snapshot(&f.db.url).await, before, "{want}");
    }
    // Another generation of the Lease is fenced.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        refuse(&cred, at, 2, &fifo).await.unwrap_err().code(),
        "fenced"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The refusal, on a later cut: the Reservation is renewed from it.
    let later = wait_reading(&f.clock, 20, "a certain cut 1 ms later", |r| {
        r.certain && r.cut >= at.cut + SignedDuration::from_millis(1)
    })
    .await;
    let ttl = f
        .store
        .config()
        .reservation_ttl
        .min(SignedDuration::from_hours(1));
    let (state, floor, sub) = reservation(&f.db.url, x).await;
    assert_eq!(state, "held");
    assert!((floor, sub) < pair_of(later.cut + ttl), "{floor} {sub}");
    let rec = refuse(&cred, later, 1, &fifo).await.unwrap();
    let want = HibernationRecord {
        step: HibernationStep::Refused,
        head: None,
        refusal: Some(fifo.clone()),
        ..sealed.clone()
    };
    assert_eq!(rec, want);
    assert_eq!(
        want,
        HibernationRecord {
            exec_id: x,
            attempt: AttemptNo(1),
            generation: Generation(1),
            lease_id: lease1,
            reason: HibernationReason::Requested,
            sealed_cut: at.cut,
            step: HibernationStep::Refused,
            head: None,
            refusal: Some(QuiescenceRefusal {
                reason: "special_file".into(),
                path: "pipe".into(),
                message: fifo.message.clone(),
            }),
        }
    );
    assert_eq!(
        stored_refusal(&f.db.url, x).await,
        (
            "refused".into(),
            true,
            Some("special_file".into()),
            Some("pipe".into()),
            Some(fifo.message.clone())
        )
    );
    let e_now = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (
            e_now.state,
            e_now.lease_state,
            e_now.terminal_reason,
            e_now.exit_code
        ),
        (
            ExecState::Running,
            Some(LeaseState::ReleasePending),
            Some(lc_core::TerminalReason::SnapshotRefused),
            None
        )
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("running".into(), 1));
    let (fl, sb) = pair_of(later.cut + ttl);
    assert_eq!(reservation(&f.db.url, x).await, ("held".into(), fl, sb));
    // The units are held until the destroy is proven.
    assert_eq!(available(&f).await, (1, 2));
    // The head stays where it was: no snapshot.
    assert_eq!(
        f.store.workspace(f.tenant, x).await.unwrap(),
        WorkspaceRecord {
            workspace_id: ws,
            exec_id: x,
            head: None,
            snapshots: 0
        }
    );
    assert_eq!(f.store.snapshots(f.tenant, x, 0, 10).await.unwrap(), vec![]);
    // The ownership is released: the owner's next write is stale.
    assert!(owner_released(&f.db.url, x).await);
    assert_eq!(
        f.store
            .heartbeat(&cred, x, later, TTL)
            .await
            .unwrap_err()
            .code(),
        "owner_stale"
    );
    // A refused hibernation is finished; the reconciler destroys the Lease.
    assert_eq!(f.store.due_hibernations(later, 10).await.unwrap(), vec![]);
    let w = f.store.due_work(later, 10).await.unwrap();
    assert_eq!(
        w.iter().map(|w| (w.lease_id, w.action)).collect::<Vec<_>>(),
        vec![(lease1, LeaseAction::Destroy)]
    );

    // Replays by the owner return the recorded refusal (the first one,
    // even when another is presented) and write nothing; another
    // credential is still stale.
    let before = snapshot(&f.db.url).await;
    assert_eq!(refuse(&cred, later, 1, &fifo).await.unwrap(), want);
    assert_eq!(
        refuse(&cred, later, 1, &refusal("path_not_utf8", "x", "y"))
            .await
            .unwrap(),
        want
    );
    assert_eq!(
        refuse(&stale, later, 1, &fifo).await.unwrap_err(),
        LcError::OwnerStale {
            exec_id: x,
            presented: stale.generation,
            current: cred.generation,
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The destroy proof returns the units once and ends the exec.
    let out = f
        .store
        .commit_release(lease1, Generation(1), &f.provider.absence(lease1, 1), later)
        .await
        .unwrap();
    assert_eq!(
        (
            out.lease_id,
            out.generation,
            out.exec_id,
            out.units_returned,
            out.replay,
            out.parked,
            out.released_cut
        ),
        (lease1, Generation(1), x, 2, false, false, later.cut)
    );
    assert_eq!(available(&f).await, (3, 0));
    let e_now = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (
            e_now.state,
            e_now.lease_state,
            e_now.terminal_reason,
            e_now.exit_code
        ),
        (
            ExecState::Terminal,
            Some(LeaseState::Released),
            Some(lc_core::TerminalReason::SnapshotRefused),
            None
        )
    );
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let (state, reason): (String, Option<String>) =
        sqlx::query_as("SELECT state, terminal_reason FROM lc_execs WHERE exec_id = $1")
            .bind(x.0)
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), reason.as_deref()),
        ("terminal", Some("snapshot_refused"))
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("terminal".into(), 1));
    assert_eq!(reservation(&f.db.url, x).await.0, "returned");
    // The refusal stays as recorded; the head never moved.
    assert_eq!(
        stored_refusal(&f.db.url, x).await,
        (
            "refused".into(),
            true,
            Some("special_file".into()),
            Some("pipe".into()),
            Some(fifo.message.clone())
        )
    );
    assert_eq!(f.store.workspace(f.tenant, x).await.unwrap().head, None);
    // A second proof is a replay: it names the Reservation's units, returns
    // none again and writes nothing.
    let before = snapshot(&f.db.url).await;
    let again = f
        .store
        .commit_release(lease1, Generation(1), &f.provider.absence(lease1, 1), later)
        .await
        .unwrap();
    assert_eq!(
        (
            again.units_returned,
            again.replay,
            again.parked,
            again.released_cut
        ),
        (2, true, false, later.cut)
    );
    assert_eq!(available(&f).await, (3, 0));
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(f.store.due_work(later, 10).await.unwrap(), vec![]);
    assert_audit_clean(&f.store).await;
}

/// A refused hibernation takes no quiescence afterwards (the provider's
/// later snapshot of that generation is refused and writes nothing).
#[tokio::test]
async fn a_refused_hibernation_takes_no_quiescence() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let tok = token(0xf2);
    let (e, cred, _) = sealed_exec(&f, "rq", &tok, at).await;
    let x = e.exec_id;
    let lease1 = e.canonical.lease_id;
    let ws = e.canonical.workspace_id.0;
    stop_and_ack(&f, x, &cred, at).await;
    f.store
        .refuse_quiescence(&cred, x, at, Generation(1), &fifo_refusal())
        .await
        .unwrap();
    let manifest = manifest_of(ws, None, vec![]);
    let head = Digest::of(&manifest);
    let before = snapshot(&f.db.url).await;
    let err = f
        .store
        .commit_quiescence(
            &cred,
            x,
            at,
            Generation(1),
            &manifest,
            head,
            &f.provider.quiescence(lease1, 1, ws, head),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(err.code(), "illegal_transition", "{err}");
}

/// Every refusal that is not a sealed hibernation of an active Lease, its
/// command stopped: the exact error, nothing written.
#[tokio::test]
async fn a_refusal_needs_a_sealed_hibernation_of_an_active_lease() {
    let f = fixture(8).await;
    let at = certain(&f.clock).await;
    let fifo = fifo_refusal();

    // No hibernation is sealed; no such exec.
    let e = running_exec(&f, "nh", at, None, None, OnTimeout::Terminate).await;
    let tok = token(0xf3);
    let owned = f
        .store
        .take_over(&tok, f.tenant, e.exec_id, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    let cred = cred_of(&owned, &tok);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .refuse_quiescence(&cred, e.exec_id, at, Generation(1), &fifo)
            .await
            .unwrap_err(),
        LcError::not_found("hibernation of generation", Generation(1))
    );
    let ghost = ExecId(e.exec_id.0 + 1000);
    assert_eq!(
        f.store
            .refuse_quiescence(&cred, ghost, at, Generation(1), &fifo)
            .await
            .unwrap_err(),
        LcError::not_found("exec", ghost)
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // A committed quiescence released its owner's ownership: stale.
    let tok = token(0xf4);
    let (e, cred, _) = sealed_exec(&f, "qz", &tok, at).await;
    let x = e.exec_id;
    let lease1 = e.canonical.lease_id;
    let ws = e.canonical.workspace_id.0;
    stop_and_ack(&f, x, &cred, at).await;
    let manifest = manifest_of(ws, None, vec![]);
    let head = Digest::of(&manifest);
    f.store
        .commit_quiescence(
            &cred,
            x,
            at,
            Generation(1),
            &manifest,
            head,
            &f.provider.quiescence(lease1, 1, ws, head),
            None,
        )
        .await
        .unwrap();
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .refuse_quiescence(&cred, x, at, Generation(1), &fifo)
            .await
            .unwrap_err(),
        LcError::IllegalTransition {
            what: "hibernation (its quiescence is committed)",
            from: "quiesced",
            to: "refused",
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // Quiesced, no other owner takes the exec over (its Lease is not
    // active); once parked, a new owner is refused the transition.
    let tok2 = token(0xf5);
    assert_eq!(
        f.store
            .take_over(&tok2, f.tenant, x, at, SignedDuration::from_secs(60))
            .await
            .unwrap_err()
            .code(),
        "illegal_transition"
    );
    f.store
        .commit_release(lease1, Generation(1), &f.provider.absence(lease1, 1), at)
        .await
        .unwrap();
    assert_eq!(attempt_state(&f.db.url, x).await, ("parked".into(), 1));
    let owned2 = f
        .store
        .take_over(&tok2, f.tenant, x, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    let cred2 = cred_of(&owned2, &tok2);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .refuse_quiescence(&cred2, x, at, Generation(1), &fifo)
            .await
            .unwrap_err(),
        LcError::IllegalTransition {
            what: "hibernation (its quiescence is committed)",
            from: "parked",
            to: "refused",
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // A Lease the reconciler already releases (for a cancel). Only a
    // refused quiescence ends an exec snapshot_refused, never a release.
    let tok = token(0xf6);
    let (e, cred, _) = sealed_exec(&f, "rl", &tok, at).await;
    let x = e.exec_id;
    let lease = e.canonical.lease_id;
    stop_and_ack(&f, x, &cred, at).await;
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .begin_release(
                lease,
                Generation(1),
                lc_core::TerminalReason::SnapshotRefused,
                at
            )
            .await
            .unwrap_err(),
        LcError::IllegalTransition {
            what: "lease (a refused snapshot is released by its hibernation)",
            from: "active",
            to: "release_pending",
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let w = f
        .store
        .begin_release(lease, Generation(1), lc_core::TerminalReason::Cancelled, at)
        .await
        .unwrap();
    assert_eq!(w.state, LeaseState::ReleasePending);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .refuse_quiescence(&cred, x, at, Generation(1), &fifo)
            .await
            .unwrap_err(),
        LcError::IllegalTransition {
            what: "hibernation (a refused snapshot needs an active Lease)",
            from: "sealed",
            to: "refused",
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // An owner whose heartbeat lapsed.
    let tok = token(0xf7);
    let e = running_exec(&f, "ox", at, None, None, OnTimeout::Terminate).await;
    let x = e.exec_id;
    let owned = f.store.take_over(&tok, f.tenant, x, at, TTL).await.unwrap();
    let cred = cred_of(&owned, &tok);
    f.store
        .request_hibernation(&op("h-ox", "ox"), at, f.tenant, x)
        .await
        .unwrap();
    stop_and_ack(&f, x, &cred, at).await;
    let expiry = owned.ownership.heartbeat_expiry;
    let late = wait_reading(&f.clock, 20, "a certain cut past the heartbeat", |r| {
        r.certain && r.cut >= expiry
    })
    .await;
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .refuse_quiescence(&cred, x, late, Generation(1), &fifo)
            .await
            .unwrap_err(),
        LcError::OwnerExpired {
            exec_id: x,
            generation: cred.generation,
            heartbeat_expiry: expiry,
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_audit_clean(&f.store).await;
}

/// A cancel requested after the stop (too late to cancel the command):
/// the refused exec ends `cancelled`.
#[tokio::test]
async fn a_cancel_after_the_stop_ends_a_refused_exec_cancelled() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let tok = token(0xf8);
    let (e, cred, sealed) = sealed_exec(&f, "rc", &tok, at).await;
    let x = e.exec_id;
    let lease1 = e.canonical.lease_id;
    stop_and_ack(&f, x, &cred, at).await;
    let rec = ControlStore::cancel(&f.store, &op("c-rc", "rc"), at, f.tenant, x)
        .await
        .unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.cancel_requested),
        (ExecState::Running, None, true)
    );
    let got = f
        .store
        .refuse_quiescence(&cred, x, at, Generation(1), &fifo_refusal())
        .await
        .unwrap();
    assert_eq!(
        got,
        HibernationRecord {
            step: HibernationStep::Refused,
            refusal: Some(fifo_refusal()),
            ..sealed
        }
    );
    let e_now = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (e_now.state, e_now.lease_state, e_now.terminal_reason),
        (
            ExecState::Running,
            Some(LeaseState::ReleasePending),
            Some(lc_core::TerminalReason::Cancelled)
        )
    );
    assert_eq!(available(&f).await, (1, 2));
    let out = f
        .store
        .commit_release(lease1, Generation(1), &f.provider.absence(lease1, 1), at)
        .await
        .unwrap();
    assert_eq!(
        (out.units_returned, out.replay, out.parked),
        (2, false, false)
    );
    assert_eq!(available(&f).await, (3, 0));
    let e_now = f.store.exec(f.tenant, x).await.unwrap();
    assert_eq!(
        (
            e_now.state,
            e_now.lease_state,
            e_now.terminal_reason,
            e_now.exit_code
        ),
        (
            ExecState::Terminal,
            Some(LeaseState::Released),
            Some(lc_core::TerminalReason::Cancelled),
            None
        )
    );
    assert_eq!(attempt_state(&f.db.url, x).await, ("terminal".into(), 1));
    assert_audit_clean(&f.store).await;
}

/// The refusal's path and message are stored cut to 1024 and 2048 bytes,
/// a character across the bound left out whole.
#[tokio::test]
async fn a_refusal_s_path_and_message_are_stored_cut_to_their_bounds() {
    let f = fixture(4).await;
    let at = certain(&f.clock).await;
    for (key, tok, path, message, want_path, want_message) in [
        (
            "ca",
            0xf9,
            "a".repeat(2000),
            "b".repeat(5000),
            "a".repeat(1024),
            "b".repeat(2048),
        ),
        // "x" then two-byte characters: bytes 1024 and 2048 are inside one.
        (
            "cb",
            0xfa,
            format!("x{}", "é".repeat(1000)),
            format!("m{}m", "é".repeat(2499)),
            format!("x{}", "é".repeat(511)),
            format!("m{}", "é".repeat(1023)),
        ),
    ] {
        assert_eq!(message.len(), 5000);
        let tok = token(tok);
        let (e, cred, _) = sealed_exec(&f, key, &tok, at).await;
        let x = e.exec_id;
        stop_and_ack(&f, x, &cred, at).await;
        let got = f
            .store
            .refuse_quiescence(
                &cred,
                x,
                at,
                Generation(1),
                &refusal("special_file", &path, &message),
            )
            .await
            .unwrap();
        let kept = got.refusal.unwrap();
        assert_eq!(
            (kept.path.len(), kept.message.len()),
            (want_path.len(), want_message.len())
        );
        assert_eq!(
            kept,
            refusal("special_file", &want_path, &want_message),
            "{key}"
        );
        let mut c = PgConnection::connect(&f.db.url).await.unwrap();
        let lens: (i32, i32) = sqlx::query_as(
            "SELECT octet_length(refused_path), octet_length(refused_message) \
               FROM lc_hibernations WHERE exec_id = $1",
        )
        .bind(x.0)
        .fetch_one(&mut c)
        .await
        .unwrap();
        assert_eq!(
            lens,
            (want_path.len() as i32, want_message.len() as i32),
            "{key}"
        );
        assert_eq!(
            stored_refusal(&f.db.url, x).await,
            (
                "refused".into(),
                true,
                Some("special_file".into()),
                Some(want_path.clone()),
                Some(want_message.clone())
            )
        );
    }
    assert_eq!(
        (
            hibernate::REFUSAL_PATH_BYTES_MAX,
            hibernate::REFUSAL_MESSAGE_BYTES_MAX
        ),
        (1024, 2048)
    );
}

/// Version 5 -> 6: a sealed and a quiesced hibernation read back
/// unchanged with no refusal; the new terminal reason and step are
/// admitted, and a refusal's columns come together and within bounds.
#[tokio::test]
async fn migration_0006_keeps_hibernations_and_admits_a_refused_snapshot() {
    const { assert!(lc_pg::LC_VERSION >= 6) };
    let db = fresh_db().await;
    tollgate_pg::Schema::current()
        .with_line(lc_pg::lc_line().through(5).unwrap())
        .migrate(&db.url)
        .await
        .expect("migrate through 5");
    // The cut is claimed on the empty database, before the rows below
    // (an unfinished exec at the first claim would quarantine it).
    let sampler = start_sampler(&db.url);
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let clock = clock_on(&pool);
    certain(&clock).await;
    let mut c = PgConnection::connect(&db.url).await.unwrap();
    // Two execs as a version-5 store left them: one sealed, one quiesced
    // (their other rows left out: only the hibernations are under test).
    sqlx::raw_sql(
        "BEGIN; SET LOCAL session_replication_role = replica; \
         INSERT INTO lc_execs (tenant_id, lease_id, provider_id, runtime_digest, workspace_id, shape, \
             units, command, admitted_floor_us, admitted_submicro_ns, state) \
         VALUES (1, 11, 'p1', decode(repeat('00', 32), 'hex'), 41, 'medium', 2, '[\"true\"]', 5, 7, 'running'), \
                (1, 12, 'p1', decode(repeat('00', 32), 'hex'), 42, 'medium', 2, '[\"true\"]', 6, 8, 'running'); \
         INSERT INTO lc_attempts (exec_id, attempt, state, generation) \
         VALUES (1, 1, 'running', 1), (2, 1, 'running', 1); \
         INSERT INTO lc_sandbox_leases (lease_id, exec_id, attempt, generation, provider_id, state, \
             expiry_floor_us, expiry_submicro_ns) \
         VALUES (11, 1, 1, 1, 'p1', 'active', 900, 0), (12, 2, 1, 1, 'p1', 'release_pending', 900, 0); \
         INSERT INTO lc_hibernations (exec_id, attempt, generation, lease_id, reason, sealed_floor_us, \
             sealed_submicro_ns, step, head, quiescence) \
         VALUES (1, 1, 1, 11, 'requested', 100, 3, 'sealed', NULL, NULL), \
                (2, 1, 1, 12, 'idle', 200, 4, 'quiesced', sha256('m'), '{\"payloadType\": \"q\"}'); \
         COMMIT;",
    )
    .execute(&mut c)
    .await
    .unwrap();
    const COLUMNS: &str = "SELECT (exec_id, attempt, generation, lease_id, reason, sealed_floor_us, \
         sealed_submicro_ns, step, head, quiescence)::text FROM lc_hibernations ORDER BY exec_id";
    let rows_v5: Vec<String> = sqlx::query_scalar(COLUMNS).fetch_all(&mut c).await.unwrap();
    assert_eq!(rows_v5.len(), 2);
    // Version 5 knows neither the reason nor the step.
    for sql in [
        "UPDATE lc_execs SET state = 'terminal', terminal_reason = 'snapshot_refused' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused' WHERE exec_id = 1",
    ] {
        let err = sqlx::query(sql).execute(&mut c).await.unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("23514"),
            "{sql}"
        );
    }
    lc_pg::migrate(&db.url)
        .await
        .expect("migrate to the current version");
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _lc_migrations WHERE success ORDER BY version")
            .fetch_all(&mut c)
            .await
            .unwrap();
    let known: Vec<i64> = lc_pg::lc_line()
        .migrations()
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(&versions[..6], &[1, 2, 3, 4, 5, 6]);
    assert_eq!(versions, known);
    let rows_v6: Vec<String> = sqlx::query_scalar(COLUMNS).fetch_all(&mut c).await.unwrap();
    assert_eq!(rows_v6, rows_v5);
    let refused: Vec<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT refused_reason, refused_path, refused_message FROM lc_hibernations ORDER BY exec_id",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(refused, vec![(None, None, None), (None, None, None)]);
    let index: String = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'lc_hibernations_unfinished'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert!(
        index.ends_with("WHERE (step = ANY (ARRAY['sealed'::text, 'quiesced'::text]))"),
        "{index}"
    );

    // The store reads them back with no refusal.
    let store = store_on(&db, config()).await;
    let at = certain(&clock).await;
    let ts = |ns: i128| jiff::Timestamp::from_nanosecond(ns).unwrap();
    assert_eq!(
        store.due_hibernations(at, 10).await.unwrap(),
        vec![
            HibernationRecord {
                exec_id: ExecId(1),
                attempt: AttemptNo(1),
                generation: Generation(1),
                lease_id: SandboxLeaseId(11),
                reason: HibernationReason::Requested,
                sealed_cut: ts(100_003),
                step: HibernationStep::Sealed,
                head: None,
                refusal: None,
            },
            HibernationRecord {
                exec_id: ExecId(2),
                attempt: AttemptNo(1),
                generation: Generation(1),
                lease_id: SandboxLeaseId(12),
                reason: HibernationReason::Idle,
                sealed_cut: ts(200_004),
                step: HibernationStep::Quiesced,
                head: Some(Digest::of(b"m")),
                refusal: None,
            },
        ]
    );

    // The new reason and step, and only with a whole refusal in bounds.
    let ok = [
        "UPDATE lc_execs SET state = 'terminal', terminal_reason = 'snapshot_refused' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = 'special_file', \
             refused_path = repeat('a', 1024), refused_message = repeat('b', 2048) WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = 'a', refused_path = '', \
             refused_message = '' WHERE exec_id = 1",
    ];
    for sql in ok {
        let mut tx = c.begin().await.unwrap();
        sqlx::query("SET LOCAL session_replication_role = replica")
            .execute(&mut *tx)
            .await
            .unwrap();
        let done = sqlx::query(sql).execute(&mut *tx).await.unwrap();
        assert_eq!(done.rows_affected(), 1, "{sql}");
        tx.rollback().await.unwrap();
    }
    for sql in [
        "UPDATE lc_execs SET state = 'terminal', terminal_reason = 'snapshot_refusal' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = 'special_file' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET refused_reason = 'special_file', refused_path = 'p', \
             refused_message = 'm' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = 'Bad-Code', refused_path = 'p', \
             refused_message = 'm' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = 'special_file', \
             refused_path = repeat('a', 1025), refused_message = 'm' WHERE exec_id = 1",
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = 'special_file', \
             refused_path = 'p', refused_message = repeat('b', 2049) WHERE exec_id = 1",
        // A refused hibernation has no head.
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = 'special_file', \
             refused_path = 'p', refused_message = 'm' WHERE exec_id = 2",
        "UPDATE lc_hibernations SET step = 'resting' WHERE exec_id = 1",
    ] {
        let mut tx = c.begin().await.unwrap();
        sqlx::query("SET LOCAL session_replication_role = replica")
            .execute(&mut *tx)
            .await
            .unwrap();
        let err = sqlx::query(sql).execute(&mut *tx).await.unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some("23514"),
            "{sql}"
        );
        tx.rollback().await.unwrap();
    }
    sampler.stop().await;
}

// ---------------------------------------------------------------------------
// Deletion grace: a terminal exec's workspace and output deleted on a
// certain cut, restorable until a certain cut reaches purge_after, purged
// exactly once after it; the database refuses an early purge (LCS90).

/// The SQLSTATE of a raw statement's refusal.
async fn sqlstate_of(url: &str, sql: &str, exec: ExecId) -> String {
    let mut c = PgConnection::connect(url).await.unwrap();
    let e = sqlx::query(sql)
        .bind(exec.0)
        .execute(&mut c)
        .await
        .unwrap_err();
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_default()
}

/// A terminal exec (parked, then cancelled) with one snapshot (head) and
/// one stdout page `hello` whose bytes the store holds.
async fn terminal_exec_with_data(f: &Fixture, at: CutReading) -> (ExecRecord, Digest) {
    let (e, _cred, _manifest, head) = parked(f, at, None).await;
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    sqlx::query(
        "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, length, state) \
         VALUES ($1, 1, 1, 'stdout', 'hello'::bytea, sha256('hello'::bytea), 5, 'acked')",
    )
    .bind(e.exec_id.0)
    .execute(&mut c)
    .await
    .unwrap();
    let rec = ControlStore::cancel(&f.store, &op("dc", "dc"), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    assert_eq!(rec.state, ExecState::Terminal);
    (rec, head)
}

#[tokio::test]
async fn a_deleted_workspace_and_output_are_restorable_until_purged_exactly_once() {
    use lc_core::deletion::{
        DELETION_GRACE_DEFAULT, DeletedItem, DeletionRecord, DeletionState, PurgeReport,
    };
    let grace = SignedDuration::from_millis(300);
    let f = fixture_with(
        6,
        lc_pg::LcConfig {
            deletion_grace: grace,
            ..config()
        },
    )
    .await;
    // A second store on the same database with the default grace (7 days):
    // its deletions stay ahead of the persisted cut for the whole test.
    let long = store_on(&f.db, config()).await;
    let ns = SignedDuration::from_nanos(1);
    let at = certain(&f.clock).await;
    let (e, head) = terminal_exec_with_data(&f, at).await;
    let x = e.exec_id;
    let ws = e.canonical.workspace_id;
    let (ws_sql, pages_sql, purge_sql) = (
        "DELETE FROM lc_snapshots WHERE workspace_id = $1",
        "DELETE FROM lc_output_pages WHERE exec_id = $1",
        "UPDATE lc_deletions SET state = 'purged', purged_floor_us = 0, purged_submicro_ns = 0 \
          WHERE exec_id = $1",
    );

    // A running exec's workspace and output are not deleted; an uncertain
    // reading deletes nothing; another tenant's exec is not found; an
    // undelete of what is not deleted is refused. Nothing is written.
    let run = running_exec(&f, "run", at, None, None, OnTimeout::Terminate).await;
    let before = snapshot(&f.db.url).await;
    for item in [DeletedItem::Workspace, DeletedItem::Output] {
        assert_eq!(
            f.store
                .delete_item(&op("d-run", "d-run"), at, f.tenant, run.exec_id, item)
                .await
                .unwrap_err(),
            LcError::ExecNotTerminal {
                exec_id: run.exec_id,
                state: "running",
                item,
            }
        );
    }
    assert_eq!(
        f.store
            .delete_item(
                &op("d-unc", "d-unc"),
                CutReading::uncertain(at.cut, 4),
                f.tenant,
                x,
                DeletedItem::Workspace
            )
            .await
            .unwrap_err(),
        LcError::TimeUncertain { retry_after_s: 4 }
    );
    assert_eq!(
        f.store
            .delete_item(
                &op("d-404", "d-404"),
                at,
                lc_core::TenantId(f.tenant.0 + 1000),
                x,
                DeletedItem::Workspace
            )
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    assert_eq!(
        f.store
            .undelete_item(
                &op("u-none", "u-none"),
                at,
                f.tenant,
                x,
                DeletedItem::Output
            )
            .await
            .unwrap_err(),
        LcError::NotDeleted {
            exec_id: x,
            item: DeletedItem::Output
        }
    );
    // Without a deletion, snapshots stay immutable and pages undeletable.
    assert_eq!(sqlstate_of(&f.db.url, ws_sql, ExecId(ws.0)).await, "LCS07");
    assert_eq!(sqlstate_of(&f.db.url, pages_sql, x).await, "LCS05");
    assert_eq!(snapshot(&f.db.url).await, before);

    let ws_before = f.store.workspace(f.tenant, x).await.unwrap();
    let snaps_before = f.store.snapshots(f.tenant, x, 0, 10).await.unwrap();
    let manifest_before = f.store.snapshot_manifest(f.tenant, x, head).await.unwrap();
    let pages_before = ControlStore::output(&f.store, f.tenant, x, 0, 10)
        .await
        .unwrap();
    assert_eq!((ws_before.head, ws_before.snapshots), (Some(head), 1));
    assert_eq!(pages_before.len(), 1);
    assert_eq!(pages_before[0].bytes.as_deref(), Some(&b"hello"[..]));
    let restored_exactly = || async {
        assert_eq!(f.store.workspace(f.tenant, x).await.unwrap(), ws_before);
        assert_eq!(
            f.store.snapshots(f.tenant, x, 0, 10).await.unwrap(),
            snaps_before
        );
        assert_eq!(
            f.store.snapshot_manifest(f.tenant, x, head).await.unwrap(),
            manifest_before
        );
        assert_eq!(
            ControlStore::output(&f.store, f.tenant, x, 0, 10)
                .await
                .unwrap(),
            pages_before
        );
    };

    // Deleted through the 7-day store: reads refused naming the undelete
    // and the purge instant; the database refuses every purge from raw SQL
    // while the persisted cut has not reached purge_after; an undelete
    // restores the bytes exactly.
    let la = certain(&f.clock).await;
    let lw = long
        .delete_item(&op("lw", "lw"), la, f.tenant, x, DeletedItem::Workspace)
        .await
        .unwrap();
    let lo = long
        .delete_item(&op("lo", "lo"), la, f.tenant, x, DeletedItem::Output)
        .await
        .unwrap();
    assert_eq!(
        (lw.deleted_at, lw.purge_after, lo.purge_after),
        (
            la.cut,
            la.cut + DELETION_GRACE_DEFAULT,
            la.cut + DELETION_GRACE_DEFAULT
        )
    );
    let deleted = |d: &DeletionRecord, undelete: String| LcError::ItemDeleted {
        exec_id: x,
        item: d.item,
        purge_after: d.purge_after,
        undelete,
    };
    let ws_deleted = deleted(&lw, format!("lc workspace undelete {x}"));
    assert_eq!(
        f.store.workspace(f.tenant, x).await.unwrap_err(),
        ws_deleted
    );
    assert_eq!(
        f.store.snapshots(f.tenant, x, 0, 10).await.unwrap_err(),
        ws_deleted
    );
    assert_eq!(
        f.store
            .snapshot_manifest(f.tenant, x, head)
            .await
            .unwrap_err(),
        ws_deleted
    );
    assert_eq!(ws_deleted.code(), "workspace_deleted");
    let out_deleted = ControlStore::output(&f.store, f.tenant, x, 0, 10)
        .await
        .unwrap_err();
    assert_eq!(out_deleted.code(), "output_deleted");
    assert_eq!(
        out_deleted.to_string(),
        format!(
            "the output of exec {x} is deleted and is purged once a certain cut reaches {}; until then `lc exec output {x} --undelete` restores it",
            lo.purge_after
        )
    );
    let held = snapshot(&f.db.url).await;
    assert_eq!(sqlstate_of(&f.db.url, ws_sql, ExecId(ws.0)).await, "LCS90");
    assert_eq!(sqlstate_of(&f.db.url, pages_sql, x).await, "LCS90");
    assert_eq!(sqlstate_of(&f.db.url, purge_sql, x).await, "LCS90");
    assert_eq!(
        f.store
            .purge_due(certain(&f.clock).await, 10)
            .await
            .unwrap(),
        PurgeReport::default()
    );
    assert_eq!(snapshot(&f.db.url).await, held);
    for item in [DeletedItem::Workspace, DeletedItem::Output] {
        // Undone on an uncertain reading too: it admits no deadline.
        let u = long
            .undelete_item(
                &op(&format!("lu-{item}"), "lu"),
                CutReading::uncertain(la.cut, 1),
                f.tenant,
                x,
                item,
            )
            .await
            .unwrap();
        assert_eq!(u.state, DeletionState::Restored);
    }
    restored_exactly().await;

    // Deleted through the 300 ms store: purge_after = cut + 300 ms to the
    // nanosecond; a replay answers the record, another key the same
    // deletion (its grace not extended).
    let d1_at = certain(&f.clock).await;
    let d1 = f
        .store
        .delete_item(&op("d1", "d1"), d1_at, f.tenant, x, DeletedItem::Workspace)
        .await
        .unwrap();
    let want = DeletionRecord {
        exec_id: x,
        item: DeletedItem::Workspace,
        state: DeletionState::Deleted,
        deleted_at: d1_at.cut,
        purge_after: d1_at.cut + grace,
        purged_at: None,
    };
    assert_eq!(d1, want);
    assert_eq!(
        f.store
            .delete_item(&op("d1", "d1"), d1_at, f.tenant, x, DeletedItem::Workspace)
            .await
            .unwrap(),
        want
    );
    let later = certain(&f.clock).await;
    assert_eq!(
        f.store
            .delete_item(
                &op("d1b", "d1b"),
                later,
                f.tenant,
                x,
                DeletedItem::Workspace
            )
            .await
            .unwrap(),
        want
    );
    // Once a certain cut reached purge_after: purge_after - 1 ns purges
    // nothing, nor does an uncertain reading at it.
    wait_reading(&f.clock, 20, "a certain cut past purge_after", |r| {
        r.certain && r.cut >= want.purge_after
    })
    .await;
    let held = snapshot(&f.db.url).await;
    for reading in [
        CutReading::certain(want.purge_after - ns),
        CutReading::uncertain(want.purge_after, 1),
    ] {
        assert_eq!(
            f.store.purge_due(reading, 10).await.unwrap(),
            PurgeReport::default(),
            "{reading:?}"
        );
        assert_eq!(snapshot(&f.db.url).await, held, "{reading:?}");
    }
    // An undelete past purge_after but before the purge restores it.
    let u1 = f
        .store
        .undelete_item(&op("u1", "u1"), later, f.tenant, x, DeletedItem::Workspace)
        .await
        .unwrap();
    assert_eq!(
        u1,
        DeletionRecord {
            state: DeletionState::Restored,
            ..want
        }
    );
    restored_exactly().await;

    // Deleted again: a new grace from the new cut; purged at exactly
    // purge_after, one item per transaction, exactly once.
    let d2_at = certain(&f.clock).await;
    let d2 = f
        .store
        .delete_item(&op("d2", "d2"), d2_at, f.tenant, x, DeletedItem::Workspace)
        .await
        .unwrap();
    let o2 = f
        .store
        .delete_item(&op("do2", "do2"), d2_at, f.tenant, x, DeletedItem::Output)
        .await
        .unwrap();
    assert_eq!(
        (d2.deleted_at, d2.purge_after, o2.purge_after),
        (d2_at.cut, d2_at.cut + grace, d2_at.cut + grace)
    );
    wait_reading(
        &f.clock,
        20,
        "a certain cut past the second purge_after",
        |r| r.certain && r.cut >= d2.purge_after,
    )
    .await;
    let purge_at = CutReading::certain(d2.purge_after);
    let one = |w: usize, o: usize| PurgeReport {
        workspaces_purged: w,
        outputs_purged: o,
        rows_purged: 1,
        execs_purged: 0,
    };
    let first = f.store.purge_due(purge_at, 1).await.unwrap();
    let second = f.store.purge_due(purge_at, 10).await.unwrap();
    assert!(
        (first, second) == (one(1, 0), one(0, 1)) || (first, second) == (one(0, 1), one(1, 0)),
        "{first:?} {second:?}"
    );
    assert_eq!(
        f.store.purge_due(purge_at, 10).await.unwrap(),
        PurgeReport::default()
    );
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let counts: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM lc_snapshots WHERE workspace_id = $2), \
                (SELECT count(*) FROM lc_output_pages WHERE exec_id = $1), \
                (SELECT snapshots FROM lc_workspaces WHERE exec_id = $1), \
                (SELECT count(*) FROM lc_deletions WHERE exec_id = $1 AND state = 'purged')",
    )
    .bind(x.0)
    .bind(ws.0)
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(counts, (0, 0, 0, 2));
    let purged = LcError::ItemPurged {
        exec_id: x,
        item: DeletedItem::Workspace,
        purged_at: Some(d2.purge_after),
    };
    assert_eq!(f.store.workspace(f.tenant, x).await.unwrap_err(), purged);
    assert_eq!(purged.code(), "workspace_purged");
    assert_eq!(
        ControlStore::output(&f.store, f.tenant, x, 0, 10)
            .await
            .unwrap_err(),
        LcError::ItemPurged {
            exec_id: x,
            item: DeletedItem::Output,
            purged_at: Some(o2.purge_after),
        }
    );
    let after = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .undelete_item(&op("u3", "u3"), later, f.tenant, x, DeletedItem::Workspace)
            .await
            .unwrap_err(),
        purged
    );
    assert_eq!(
        f.store
            .delete_item(
                &op("d3", "d3"),
                certain(&f.clock).await,
                f.tenant,
                x,
                DeletedItem::Workspace
            )
            .await
            .unwrap_err(),
        purged
    );
    // A purged deletion never moves back or goes on its own.
    for sql in [
        "UPDATE lc_deletions SET state = 'deleted', purged_floor_us = NULL, purged_submicro_ns = NULL \
          WHERE exec_id = $1",
        "DELETE FROM lc_deletions WHERE exec_id = $1",
    ] {
        assert_eq!(sqlstate_of(&f.db.url, sql, x).await, "LCS90", "{sql}");
    }
    assert_eq!(snapshot(&f.db.url).await, after);
    assert_audit_clean(&f.store).await;
}

// ---------------------------------------------------------------------------
// Retention: a terminal exec's records are kept until a certain cut passes
// retain_until = terminal cut + retention, and while a deletion of it
// waits for its purge; the database refuses any earlier purge (LCS91).

/// How many rows every table holding exec `x`'s records has of it.
async fn exec_rows(url: &str, x: ExecId) -> i64 {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM lc_execs WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_attempts WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_reservations WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_sandbox_leases WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_output_pages WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_exec_owners WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_transitions WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_exec_inputs WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_workspaces WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_snapshots s JOIN lc_workspaces w USING (workspace_id) \
                  WHERE w.exec_id = $1) \
              + (SELECT count(*) FROM lc_hibernations WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_resume_intents WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_resume_receipts WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_deletions WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_tokens WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_measurements WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_milestones WHERE exec_id = $1) \
              + (SELECT count(*) FROM lc_claims c JOIN lc_sandbox_leases l \
                    ON c.item_kind = 'lease' AND c.item_id = l.lease_id WHERE l.exec_id = $1)",
    )
    .bind(x.0)
    .fetch_one(&mut c)
    .await
    .unwrap()
}

/// Exec `x`'s retain_until as stored.
async fn retain_until_of(url: &str, x: ExecId) -> Option<(i64, i32)> {
    let mut c = PgConnection::connect(url).await.unwrap();
    let (f, s): (Option<i64>, Option<i32>) = sqlx::query_as(
        "SELECT retain_until_floor_us, retain_until_submicro_ns FROM lc_execs WHERE exec_id = $1",
    )
    .bind(x.0)
    .fetch_one(&mut c)
    .await
    .unwrap();
    f.zip(s)
}

/// Ends `e` (running with an active Lease) through `store`: cancel,
/// release pending, signed absence committed at `at`.
async fn end_released(
    f: &Fixture,
    store: &lc_pg::LcStore,
    e: &ExecRecord,
    key: &str,
    at: CutReading,
) {
    ControlStore::cancel(store, &op(key, key), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    let lease = e.canonical.lease_id;
    store
        .begin_release(lease, Generation(1), lc_core::TerminalReason::Cancelled, at)
        .await
        .unwrap();
    let out = store
        .commit_release(lease, Generation(1), &f.provider.absence(lease, 1), at)
        .await
        .unwrap();
    assert_eq!(out.units_returned, 2);
}

#[tokio::test]
async fn a_terminal_exec_s_records_are_kept_until_a_certain_cut_passes_its_retention() {
    use lc_core::deletion::{DeletedItem, PurgeReport, RETENTION_DEFAULT};
    let retention = SignedDuration::from_millis(400);
    let f = fixture_with(
        6,
        lc_pg::LcConfig {
            retention,
            deletion_grace: SignedDuration::from_millis(300),
            ..config()
        },
    )
    .await;
    let long = store_on(&f.db, config()).await;
    let ns = SignedDuration::from_nanos(1);
    let at = certain(&f.clock).await;
    // x ends by a cancel while parked (at `at`), its workspace deleted at
    // once (300 ms grace, before its 400 ms retention).
    let (xe, _head) = terminal_exec_with_data(&f, at).await;
    // Its generation's measurement (its milestone came with the park):
    // records the purge takes with the rest.
    {
        let mut c = PgConnection::connect(&f.db.url).await.unwrap();
        sqlx::query(
            "INSERT INTO lc_measurements (lease_id, exec_id, cpu_time_ms, peak_memory_bytes, \
                 evidence, recorded_floor_us, recorded_submicro_ns) \
             VALUES ($1, $2, 7, 4096, '{}'::jsonb, 0, 0)",
        )
        .bind(xe.canonical.lease_id.0)
        .bind(xe.exec_id.0)
        .execute(&mut c)
        .await
        .unwrap();
    }
    let x = xe.exec_id;
    let retain_x = at.cut + retention;
    assert_eq!(retain_until_of(&f.db.url, x).await, Some(pair_of(retain_x)));
    f.store
        .delete_item(&op("rx-d", "rx-d"), at, f.tenant, x, DeletedItem::Workspace)
        .await
        .unwrap();
    // y ends by a release committed at a later cut; its output is deleted
    // through the 7-day store.
    let at2 = wait_reading(&f.clock, 10, "a later certain cut", |r| {
        r.certain && r.cut > at.cut
    })
    .await;
    let ye = running_exec(&f, "ry", at2, None, None, OnTimeout::Terminate).await;
    let y = ye.exec_id;
    // While y runs, a worker claims its Lease and the tenant mints a token
    // bound to it: its purge removes both (nothing is left for either).
    let holder = lc_core::claim::ClaimHolder::from_bytes([0x7e; 16]);
    let claimed = lc_core::ReconcileStore::claim_due_work(&f.store, &holder, at2, 10)
        .await
        .unwrap();
    assert!(
        claimed
            .iter()
            .any(|c| c.work.lease_id == ye.canonical.lease_id),
        "{claimed:?}"
    );
    let scope =
        lc_core::token::TokenScope::new(Some(y), &[lc_core::token::Operation::ExecRead]).unwrap();
    f.store
        .mint_token(
            &op("ry-t", "ry-t"),
            at2,
            f.tenant,
            scope,
            60_000,
            Digest([0x7f; 32]),
        )
        .await
        .unwrap();
    end_released(&f, &f.store, &ye, "ry-c", at2).await;
    let retain_y = at2.cut + retention;
    assert_eq!(retain_until_of(&f.db.url, y).await, Some(pair_of(retain_y)));
    long.delete_item(&op("ry-d", "ry-d"), at2, f.tenant, y, DeletedItem::Output)
        .await
        .unwrap();
    // z ends through the store with the default retention (30 days): the
    // database refuses every purge of its records from raw SQL.
    let ze = running_exec(&f, "rz", at2, None, None, OnTimeout::Terminate).await;
    let z = ze.exec_id;
    end_released(&f, &long, &ze, "rz-c", at2).await;
    assert_eq!(
        retain_until_of(&f.db.url, z).await,
        Some(pair_of(at2.cut + RETENTION_DEFAULT))
    );
    let held = snapshot(&f.db.url).await;
    for table in [
        "lc_execs",
        "lc_attempts",
        "lc_reservations",
        "lc_sandbox_leases",
        "lc_workspaces",
    ] {
        assert_eq!(
            sqlstate_of(
                &f.db.url,
                &format!("DELETE FROM {table} WHERE exec_id = $1"),
                z
            )
            .await,
            "LCS91",
            "{table}"
        );
    }
    assert_eq!(snapshot(&f.db.url).await, held);

    wait_reading(&f.clock, 20, "a certain cut past y's retention", |r| {
        r.certain && r.cut >= retain_y
    })
    .await;
    // Just before x's retain_until: only x's workspace deletion is due.
    assert_eq!(
        f.store
            .purge_due(CutReading::certain(retain_x - ns), 10)
            .await
            .unwrap(),
        PurgeReport {
            workspaces_purged: 1,
            outputs_purged: 0,
            rows_purged: 1,
            execs_purged: 0,
        }
    );
    // Uncertain past both: nothing.
    let held = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .purge_due(CutReading::uncertain(retain_y, 1), 10)
            .await
            .unwrap(),
        PurgeReport::default()
    );
    assert_eq!(snapshot(&f.db.url).await, held);
    // At x's retain_until exactly: x's records go, every row of them.
    let x_rows = exec_rows(&f.db.url, x).await;
    assert!(x_rows >= 8, "{x_rows}");
    let leases_before: i64 = {
        let mut c = PgConnection::connect(&f.db.url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM tollgate_leases")
            .fetch_one(&mut c)
            .await
            .unwrap()
    };
    assert_eq!(
        f.store
            .purge_due(CutReading::certain(retain_x), 10)
            .await
            .unwrap(),
        PurgeReport {
            workspaces_purged: 0,
            outputs_purged: 0,
            rows_purged: u64::try_from(x_rows).unwrap(),
            execs_purged: 1,
        }
    );
    assert_eq!(exec_rows(&f.db.url, x).await, 0);
    assert_eq!(
        f.store.exec(f.tenant, x).await.unwrap_err(),
        LcError::not_found("exec", x)
    );
    // y's retention has passed but its output deletion waits: kept.
    let y_rows = exec_rows(&f.db.url, y).await;
    assert_eq!(
        f.store
            .purge_due(CutReading::certain(retain_y), 10)
            .await
            .unwrap(),
        PurgeReport::default()
    );
    assert_eq!(
        sqlstate_of(&f.db.url, "DELETE FROM lc_execs WHERE exec_id = $1", y).await,
        "LCS91"
    );
    // Undeleted, y goes at retain_y (its deletion with it: one row less).
    long.undelete_item(&op("ry-u", "ry-u"), at2, f.tenant, y, DeletedItem::Output)
        .await
        .unwrap();
    assert_eq!(
        f.store
            .purge_due(CutReading::certain(retain_y - ns), 10)
            .await
            .unwrap(),
        PurgeReport::default()
    );
    assert_eq!(
        f.store
            .purge_due(CutReading::certain(retain_y), 10)
            .await
            .unwrap(),
        PurgeReport {
            workspaces_purged: 0,
            outputs_purged: 0,
            rows_purged: u64::try_from(y_rows - 1).unwrap(),
            execs_purged: 1,
        }
    );
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let (tokens, claims): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM lc_tokens WHERE exec_id = $1), \
                (SELECT count(*) FROM lc_claims WHERE item_kind = 'lease' AND item_id = $2)",
    )
    .bind(y.0)
    .bind(ye.canonical.lease_id.0)
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!((tokens, claims), (0, 0));
    assert_eq!(
        f.store
            .purge_due(CutReading::certain(retain_y), 10)
            .await
            .unwrap(),
        PurgeReport::default()
    );
    // z stays; Tollgate's ledger is Tollgate's and stays whole.
    assert_eq!(f.store.exec(f.tenant, z).await.unwrap().exec_id, z);
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let leases_after: i64 = sqlx::query_scalar("SELECT count(*) FROM tollgate_leases")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(leases_after, leases_before);
    assert_audit_clean(&f.store).await;
}

// Milestones: each committed quiescence records one, carrying the
// attempt's observation up to it (the provider's signed measurement of
// the quiesced generation, verified), or none when the provider could
// not measure; a replay records nothing more; a milestone never changes.

/// The provider's signed measurement of `lease`'s generation 1.
fn measured(
    f: &Fixture,
    lease: SandboxLeaseId,
    cpu_time_ms: u64,
    network: bool,
) -> serde_json::Value {
    use lc_core::evidence::Statement;
    f.provider.sign(Statement::Measurement {
        provider_id: f.provider.id.to_string(),
        lease_id: lease.0,
        generation: 1,
        cost: Some(lc_core::observation::CostObservation {
            cpu_time_ms,
            peak_memory_bytes: 8_388_608,
        }),
        externality: lc_core::observation::ExternalityObservation::of_sandbox(network),
    })
}

/// Runs an exec to a sealed hibernation and commits its quiescence with
/// `measurement` (made for its Lease): the exec, its owner, head and the
/// quiescence evidence.
async fn quiesced_with(
    f: &Fixture,
    key: &str,
    at: CutReading,
    measurement: impl Fn(SandboxLeaseId) -> Option<serde_json::Value>,
) -> (ExecRecord, OwnerCredential, Digest, serde_json::Value) {
    let e = running_exec(f, key, at, None, None, OnTimeout::Terminate).await;
    let tok = token(0x5a);
    let owned = f
        .store
        .take_over(&tok, f.tenant, e.exec_id, at, SignedDuration::from_secs(60))
        .await
        .unwrap();
    let cred = cred_of(&owned, &tok);
    let hk = format!("{key}-h");
    f.store
        .request_hibernation(&op(&hk, &hk), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    let ws = e.canonical.workspace_id.0;
    let manifest = manifest_of(ws, None, vec![]);
    let head = Digest::of(&manifest);
    let lease = e.canonical.lease_id;
    let evidence = f.provider.quiescence(lease, 1, ws, head);
    let m = measurement(lease);
    f.store
        .commit_quiescence(
            &cred,
            e.exec_id,
            at,
            Generation(1),
            &manifest,
            head,
            &evidence,
            m.as_ref(),
        )
        .await
        .unwrap();
    (e, cred, head, evidence)
}

#[tokio::test]
async fn a_committed_quiescence_records_a_milestone_with_the_observation_up_to_it() {
    use lc_core::observation::{
        CostObservation, Eligibility, ExternalityObservation, IneligibleReason, Milestone,
        MilestoneRecord, MilestoneSource, reexecution_eligibility,
    };
    let f = fixture(8).await;
    let at = certain(&f.clock).await;

    // Measured, no network: cost and three flags false; eligible.
    let (e, cred, head, evidence) =
        quiesced_with(&f, "ma", at, |l| Some(measured(&f, l, 250, false))).await;
    let want = MilestoneRecord {
        exec_id: e.exec_id,
        seq: 1,
        attempt: AttemptNo(1),
        generation: Generation(1),
        source: MilestoneSource::Hibernation,
        milestone: Milestone {
            head: head.to_hex(),
            cost: Some(CostObservation {
                cpu_time_ms: 250,
                peak_memory_bytes: 8_388_608,
            }),
            externality: Some(ExternalityObservation::no_network_path()),
        },
        recorded_cut: at.cut,
    };
    let listed = f
        .store
        .milestones(f.tenant, e.exec_id, 0, 100)
        .await
        .unwrap();
    assert_eq!(listed, vec![want.clone()]);
    assert_eq!(
        reexecution_eligibility(Some(&listed[0].milestone)),
        Eligibility::Eligible
    );
    // The measurement is the generation's, also on the exec.
    assert_eq!(
        f.store
            .exec(f.tenant, e.exec_id)
            .await
            .unwrap()
            .observation
            .map(|o| o.cost),
        Some(want.milestone.cost)
    );

    // A replay records no second milestone and changes nothing.
    let manifest = manifest_of(e.canonical.workspace_id.0, None, vec![]);
    let before = snapshot(&f.db.url).await;
    let again = measured(&f, e.canonical.lease_id, 250, false);
    f.store
        .commit_quiescence(
            &cred,
            e.exec_id,
            at,
            Generation(1),
            &manifest,
            head,
            &evidence,
            Some(&again),
        )
        .await
        .unwrap();
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(
        f.store
            .milestones(f.tenant, e.exec_id, 0, 100)
            .await
            .unwrap(),
        vec![want.clone()]
    );

    // Not measured (the provider could not): the milestone has neither
    // cost nor externality, never 0 or false; ineligible.
    let (u, _, uhead, _) = quiesced_with(&f, "mu", at, |_| None).await;
    let unmeasured = f
        .store
        .milestones(f.tenant, u.exec_id, 0, 100)
        .await
        .unwrap();
    assert_eq!(
        unmeasured,
        vec![MilestoneRecord {
            exec_id: u.exec_id,
            milestone: Milestone {
                head: uhead.to_hex(),
                cost: None,
                externality: None,
            },
            ..want.clone()
        }]
    );
    assert_eq!(
        reexecution_eligibility(Some(&unmeasured[0].milestone)),
        Eligibility::Ineligible(IneligibleReason::ExternalityUnobserved)
    );
    assert_eq!(
        f.store.exec(f.tenant, u.exec_id).await.unwrap().observation,
        None
    );

    // With network: the sandbox sees no egress, so no flag is observed;
    // the cost is measured all the same.
    let (n, _, nhead, _) = quiesced_with(&f, "mn", at, |l| Some(measured(&f, l, 0, true))).await;
    assert_eq!(
        f.store
            .milestones(f.tenant, n.exec_id, 0, 100)
            .await
            .unwrap()[0]
            .milestone,
        Milestone {
            head: nhead.to_hex(),
            cost: Some(CostObservation {
                cpu_time_ms: 0,
                peak_memory_bytes: 8_388_608,
            }),
            externality: None,
        }
    );

    // A measurement signed by another key is refused with the quiescence,
    // nothing written.
    let forger = TestProvider::new("p1", 9);
    let e4 = running_exec(&f, "mf", at, None, None, OnTimeout::Terminate).await;
    let tok = token(0x5b);
    let owned = f
        .store
        .take_over(
            &tok,
            f.tenant,
            e4.exec_id,
            at,
            SignedDuration::from_secs(60),
        )
        .await
        .unwrap();
    let c4 = cred_of(&owned, &tok);
    f.store
        .request_hibernation(&op("mf-h", "mf-h"), at, f.tenant, e4.exec_id)
        .await
        .unwrap();
    let ws4 = e4.canonical.workspace_id.0;
    let m4 = manifest_of(ws4, None, vec![]);
    let h4 = Digest::of(&m4);
    let l4 = e4.canonical.lease_id;
    let forged = forger.sign(lc_core::evidence::Statement::Measurement {
        provider_id: f.provider.id.to_string(),
        lease_id: l4.0,
        generation: 1,
        cost: None,
        externality: ExternalityObservation::no_network_path(),
    });
    let before = snapshot(&f.db.url).await;
    let err = f
        .store
        .commit_quiescence(
            &c4,
            e4.exec_id,
            at,
            Generation(1),
            &m4,
            h4,
            &f.provider.quiescence(l4, 1, ws4, h4),
            Some(&forged),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "evidence_rejected", "{err}");
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(
        f.store
            .milestones(f.tenant, e4.exec_id, 0, 100)
            .await
            .unwrap(),
        vec![]
    );

    // Paging, another tenant's exec, a bad limit.
    assert_eq!(
        f.store
            .milestones(f.tenant, e.exec_id, 1, 100)
            .await
            .unwrap(),
        vec![]
    );
    let other = lc_core::TenantId(f.tenant.0 + 1000);
    assert_eq!(
        f.store
            .milestones(other, e.exec_id, 0, 100)
            .await
            .unwrap_err()
            .code(),
        "not_found"
    );
    assert_eq!(
        f.store
            .milestones(f.tenant, e.exec_id, 0, 0)
            .await
            .unwrap_err()
            .code(),
        "invalid_limit"
    );

    // The database keeps milestones as they are.
    let x = e.exec_id;
    for (sql, code) in [
        (
            "UPDATE lc_milestones SET cpu_time_ms = 0 WHERE exec_id = $1",
            "LCSM2",
        ),
        (
            "UPDATE lc_milestones SET network_writes = NULL WHERE exec_id = $1",
            "LCSM2",
        ),
        ("DELETE FROM lc_milestones WHERE exec_id = $1", "LCS91"),
    ] {
        assert_eq!(sqlstate_of(&f.db.url, sql, x).await, code, "{sql}");
    }
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let truncate = sqlx::query("TRUNCATE lc_milestones")
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_eq!(
        truncate
            .as_database_error()
            .and_then(|d| d.code())
            .as_deref(),
        Some("LCSM2")
    );
    assert_eq!(
        f.store.milestones(f.tenant, x, 0, 100).await.unwrap(),
        vec![want]
    );
}
