//! The database's lease-write guard (migration 0019) through the real
//! router on PostgreSQL: a service on the safe-cut clock started with
//! max_ttl PT1H keeps running while the operator records PT20S/PT5S and
//! seals a 25 s horizon; once the next epoch's cut is certain its lease
//! writes are refused with `503 policy_mismatch`, whose detail says what to
//! do, and change nothing; a service started with the recorded policy
//! serves. A process whose time runs ahead of the cut meets
//! `503 horizon_exceeded`. The cut row is written directly as the owner,
//! as in `safe_cut.rs`.

mod common;

use std::sync::Arc;

use clock::safe_cut::SafeCutClock;
use clock::{Clock, TestClock};
use common::*;
use jiff::SignedDuration;
use serde_json::json;
use sqlx::{Connection, PgConnection};
use tollgate::CapabilityKey;
use tollgate::instant_pair::InstantPair;
use tollgate_api::api;

/// A service over the database at `url` with `policy`, its store on the
/// cut, and `clock`.
async fn service(url: &str, policy: tollgate::GrantPolicy, clock: Arc<dyn Clock>) -> Harness {
    let store = tollgate_pg::PostgresStore::connect_with(
        url,
        policy,
        CapabilityKey::new(&PG_KEY).expect("key"),
        PG_OPTIONS_ON_CUT,
    )
    .await
    .expect("store");
    let backend = tollgate_server::pg::service_store(Arc::new(store));
    let state = state(backend.clone(), clock, std::time::Duration::from_secs(30));
    Harness {
        router: api::router(state.clone()),
        state,
        clock: Arc::new(TestClock::new(ts(T0))),
        store: backend,
    }
}

/// A service on the safe-cut clock.
async fn on_cut(url: &str, policy: tollgate::GrantPolicy) -> Harness {
    let pool = sqlx::PgPool::connect(url).await.expect("pool");
    let clock = Arc::new(SafeCutClock::new(pool, SignedDuration::from_secs(60)));
    service(url, policy, clock).await
}

/// Writes the cut row as a claim of `epoch` under horizon policy `version`
/// and a certain publish at `at` would leave it.
async fn publish(conn: &mut PgConnection, epoch: i64, version: i64, at: &str) {
    let pair = InstantPair::encode(ts(at));
    let written = sqlx::query(
        "INSERT INTO tollgate_safetime AS s \
           (singleton, epoch, policy_version, cut_floor_us, cut_submicro_ns, certain, \
            uncertain_reason, quarantined, proof_started_at, leader_pid, \
            system_identifier, timeline_id, postmaster_start, claimed_at, published_at, \
            publish_seq) \
         VALUES (true, $1, $2, $3, $4, true, NULL, false, clock_timestamp(), \
            pg_backend_pid(), 0, 1, clock_timestamp(), clock_timestamp(), \
            clock_timestamp(), 1) \
         ON CONFLICT (singleton) DO UPDATE SET \
            epoch = EXCLUDED.epoch, policy_version = EXCLUDED.policy_version, \
            cut_floor_us = EXCLUDED.cut_floor_us, cut_submicro_ns = EXCLUDED.cut_submicro_ns, \
            certain = true, uncertain_reason = NULL, \
            published_at = clock_timestamp(), publish_seq = s.publish_seq + 1",
    )
    .bind(epoch)
    .bind(version)
    .bind(pair.floor_us)
    .bind(i32::from(pair.submicro_ns))
    .execute(conn)
    .await
    .expect("publish");
    assert_eq!(written.rows_affected(), 1);
}

/// Every row of the accounts, leases, ledger and idempotency records.
async fn rows(conn: &mut PgConnection) -> Vec<String> {
    let mut out = Vec::new();
    for table in [
        "tollgate_accounts",
        "tollgate_leases",
        "tollgate_ledger",
        "tollgate_idempotency",
    ] {
        let r: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT '{table} ' || to_jsonb(t)::text FROM {table} t ORDER BY 1"
        ))
        .fetch_all(&mut *conn)
        .await
        .expect("rows");
        out.extend(r);
    }
    out
}

const MISMATCH: &str = "the database records max_ttl PT20S and reclaim_grace PT5S, but this \
     process is configured with max_ttl PT1H and reclaim_grace PT30S; every process sharing \
     these grants must apply the recorded policy: restart this process with the recorded grant \
     policy (`tollgate policy show`)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_started_before_a_policy_change_writes_no_lease() {
    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let old_policy = policy(SignedDuration::from_hours(1), SignedDuration::from_secs(30));
    let new_policy = policy(SignedDuration::from_secs(20), SignedDuration::from_secs(5));
    let mut conn = PgConnection::connect(&url).await.expect("owner");
    let old = on_cut(&url, old_policy).await;
    publish(&mut conn, 1, 1, "2026-11-29T12:00:00Z").await;
    let (a, key) = old.account("a", 100).await;
    let g = old.acquire(a, &key, 10, "PT10M").await;
    assert_eq!(g["granted_ttl"], json!("PT10M"));

    // The operator records the new policy and seals a horizon; no sampler
    // holds the lock; the next epoch takes it and is certain. A 31 s
    // horizon (the shortest a service with the new policy can start under:
    // max_ttl + grace + the 5 s gap bound, plus 1 s) does not cover the
    // 10-minute lease still active (its expiry plus the recorded 5 s of
    // grace, from the cut 12:00:00), so the database refuses it, naming the
    // shortest horizon that does, and seals nothing; that one is accepted.
    let pool = sqlx::PgPool::connect(&url).await.expect("pool");
    tollgate_pg::set_policy(&pool, new_policy, "ops")
        .await
        .expect("policy set");
    let long_expiry: jiff::Timestamp = g["expiry"]
        .as_str()
        .expect("expiry")
        .parse()
        .expect("instant");
    let need_ns = (long_expiry + SignedDuration::from_secs(5))
        .duration_since(ts("2026-11-29T12:00:00Z"))
        .as_nanos();
    let need_ms = i64::try_from((need_ns + 999_999) / 1_000_000).expect("ms");
    assert!((600_000..=610_000).contains(&need_ms), "{need_ms}");
    let refused = safetime_pg::seal_policy(&mut conn, 31_000, "ops")
        .await
        .expect_err("a seal that does not cover an active lease");
    assert_eq!(refused.code(), "horizon_below_policy");
    assert!(
        refused
            .to_string()
            .ends_with(&format!("seal a horizon of at least {need_ms} ms")),
        "{refused}"
    );
    safetime_pg::seal_policy(&mut conn, need_ms - 1, "ops")
        .await
        .expect_err("one millisecond short");
    let sealed = safetime_pg::seal_policy(&mut conn, need_ms, "ops")
        .await
        .expect("seal");
    assert_eq!(sealed.version(), 2);
    publish(&mut conn, 2, 2, "2026-11-29T12:00:01Z").await;

    let before = rows(&mut conn).await;
    let acquire = old
        .send(
            Req::post(format!("/v1/accounts/{a}/leases"))
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT50M"})),
        )
        .await;
    // The old process's own reading knows the sealed horizon: its grace
    // and a PT50M TTL exceed it (about PT10M5S), so it refuses every new deadline
    // before it reaches the database.
    acquire.problem(503, "deadline_beyond_horizon");
    let cap = g["capability"].as_str().expect("capability");
    let renew = old
        .send(
            Req::post(format!("/v1/leases/{}/renew", g["lease_id"]))
                .token(cap)
                .json(json!({"ttl": "PT50M"})),
        )
        .await;
    renew.problem(503, "deadline_beyond_horizon");
    // The reclaim pass (no new deadline) reaches the database, which
    // refuses it: the process does not apply the recorded policy.
    let reclaim = old.send(Req::post("/v1/admin/reclaim").token(ADMIN)).await;
    reclaim.problem(503, "policy_mismatch");
    assert_eq!(reclaim.body["detail"], json!(MISMATCH));
    assert_eq!(
        rows(&mut conn).await,
        before,
        "a refused request changed a row"
    );
    let m = old.send(Req::get("/metrics")).await.text;
    assert!(
        m.lines()
            .any(|l| l == "tollgate_errors_total{code=\"policy_mismatch\"} 1"),
        "{m}"
    );

    // A service started with the recorded policy serves PT20S at the cut.
    let new = on_cut(&url, new_policy).await;
    let g = new.acquire(a, &key, 1, "PT50M").await;
    assert_eq!(
        (&g["granted_ttl"], &g["expires_in"]),
        (&json!("PT20S"), &json!("PT20S"))
    );
    // Counted from the cut (12:00:01) plus the reading's staleness bound,
    // which is under the 5 s gap bound.
    let expiry: jiff::Timestamp = g["expiry"]
        .as_str()
        .expect("expiry")
        .parse()
        .expect("instant");
    assert!(
        expiry >= ts("2026-11-29T12:00:21Z") && expiry <= ts("2026-11-29T12:00:26Z"),
        "{expiry}"
    );
    new.assert_audit_clean().await;
    conn.close().await.expect("close");
    pool.close().await;
}

/// A service whose time runs ahead of the cut (here: its store declares
/// the cut, its clock is a test clock) would grant past cut + horizon: the
/// database refuses, `503 horizon_exceeded` with the exact instants, and
/// nothing changes; exactly at the bound it grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_past_the_cut_plus_the_horizon_is_horizon_exceeded() {
    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let p = policy(SignedDuration::from_secs(20), SignedDuration::from_secs(5));
    let mut conn = PgConnection::connect(&url).await.expect("owner");
    let clock = Arc::new(TestClock::new(ts("2026-11-29T12:00:00Z")));
    let h = service(&url, p, clock.clone()).await;
    safetime_pg::seal_policy(&mut conn, 25_000, "ops")
        .await
        .expect("seal");
    publish(&mut conn, 1, 2, "2026-11-29T12:00:00Z").await;
    let (a, key) = h.account("a", 100).await;
    let g = h.acquire(a, &key, 1, "PT1M").await;
    assert_eq!(g["expiry"], json!("2026-11-29T12:00:20Z"));

    clock.set(ts("2026-11-29T12:00:00.000000001Z"));
    let before = rows(&mut conn).await;
    let r = h
        .send(
            Req::post(format!("/v1/accounts/{a}/leases"))
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT1M"})),
        )
        .await;
    r.problem(503, "horizon_exceeded");
    assert_eq!(
        r.body["detail"],
        json!(
            "lease_beyond_horizon: the new lease's expiry 2026-11-29T12:00:20.000000001Z plus \
             the recorded reclaim_grace PT5S is 2026-11-29T12:00:25.000000001Z, beyond cut \
             2026-11-29T12:00:00Z + horizon PT25S (sealed policy version 2) = \
             2026-11-29T12:00:25Z by PT0.000000001S; every deadline must fit inside cut + \
             horizon: grant at the cut (--clock safe-cut) and keep max_ttl + reclaim_grace \
             within the sealed horizon (`tollgate-safetime policy show`) (SQLSTATE TGS12)"
        )
    );
    assert_eq!(
        rows(&mut conn).await,
        before,
        "a refused request changed a row"
    );
    conn.close().await.expect("close");
}
