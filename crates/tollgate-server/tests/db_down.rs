//! With the database down, every request is answered within the same
//! bound (the pool's acquire bound, [`pg::STORE_ACQUIRE_MAX`], which is the
//! readiness probe's) with the documented code, whatever its route or
//! clock: `/readyz` 503 `not_ready`, status 200 reporting the store
//! unreachable, and every other request 503 `storage_unavailable`, on the
//! system clock and on the safe-cut clock alike (`GET /v1/leases/{id}`
//! included, with one wait: on the safe-cut clock a clock read that finds
//! the database down answers at once, even for another lease's capability;
//! on the system clock that capability is refused, 403, without storage).
//! A dedicated PostgreSQL server is started, used, then stopped by the test.

mod common;

use std::sync::Arc;
use std::time::Duration;

use clock::safe_cut::SafeCutClock;
use clock::{Clock, ClockKind, SystemClock};
use common::*;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use tollgate::CapabilityKey;
use tollgate::instant_pair::InstantPair;
use tollgate_api::api::{self, AppState};
use tollgate_pg_harness::PgServer;
use tollgate_server::config::{Config, FileConfig, RawConfig};
use tollgate_server::pg;

/// Far more than the bound, so that an answer that does not come fails the
/// test instead of hanging it; the bound itself is checked on the pool.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

fn config(url: &str, clock: ClockKind) -> Config {
    Config::merge(
        RawConfig {
            database_url: Some(url.to_string()),
            max_ttl: Some("PT1M".into()),
            reclaim_grace: Some("PT5S".into()),
            clock: Some(clock),
            ..RawConfig::default()
        },
        FileConfig::default(),
        None,
    )
    .expect("config")
}

/// Publishes a certain cut at `at` as a sampler would (epoch 1, policy 1).
async fn publish_certain(url: &str, at: &str) {
    let mut conn = PgConnection::connect(url).await.expect("owner connection");
    let pair = InstantPair::encode(ts(at));
    sqlx::query(
        "INSERT INTO tollgate_safetime \
           (singleton, epoch, policy_version, cut_floor_us, cut_submicro_ns, certain, \
            uncertain_reason, quarantined, proof_started_at, leader_pid, \
            system_identifier, timeline_id, postmaster_start, claimed_at, published_at, \
            publish_seq) \
         VALUES (true, 1, 1, $1, $2, true, NULL, false, clock_timestamp(), \
            pg_backend_pid(), 0, 1, clock_timestamp(), clock_timestamp(), \
            clock_timestamp(), 1)",
    )
    .bind(pair.floor_us)
    .bind(i32::from(pair.submicro_ns))
    .execute(&mut conn)
    .await
    .expect("publish");
    conn.close().await.expect("close");
}

/// Sends `req`, failing the test if no answer comes within
/// [`ANSWER_WITHIN`].
async fn answered(h: &Harness, req: Req, what: &str) -> Resp {
    tokio::time::timeout(ANSWER_WITHIN, h.send(req))
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {ANSWER_WITHIN:?}"))
}

/// Runs the service on `clock` over a database of a dedicated server,
/// makes an account and a lease, stops the server, and checks every
/// answer.
async fn every_request_answers_with_the_database_down(clock: ClockKind) {
    let clock_kind = clock;
    let mut server = PgServer::start_dedicated().expect("dedicated PostgreSQL server");
    let db = server.fresh_database().await;
    let url = db.url().to_string();
    let cfg = config(&url, clock);
    let store = pg::connect(&cfg, CapabilityKey::new(&PG_KEY).expect("key"))
        .await
        .expect("store");
    let pool = store.ops.pg_pool().expect("pool").clone();
    // The bound every request is held to: the pool's acquire bound, the
    // same as the readiness probe's.
    assert_eq!(pool.options().get_acquire_timeout(), pg::STORE_ACQUIRE_MAX);
    assert_eq!(pg::STORE_ACQUIRE_MAX, pg::READINESS_PROBE_MAX);
    let clock: Arc<dyn Clock> = match clock {
        ClockKind::SafeCut => {
            publish_certain(&url, "2026-11-29T12:00:00Z").await;
            Arc::new(SafeCutClock::new(pool, cfg.safetime_gap_max))
        }
        _ => Arc::new(SystemClock),
    };
    let state: AppState = state(store.clone(), clock, Duration::from_secs(30));
    let h = Harness {
        router: api::router(state.clone()),
        state,
        clock: Arc::new(clock::TestClock::new(ts(T0))),
        store,
    };
    let created = h
        .send(
            Req::post("/v1/accounts")
                .token(ADMIN)
                .json(json!({"name": "a"})),
        )
        .await;
    let key = created.ok(201)["api_key"]
        .as_str()
        .expect("key")
        .to_string();
    h.send(
        Req::post("/v1/accounts/1/deposits")
            .token(ADMIN)
            .json(json!({"units": 10})),
    )
    .await
    .ok(200);
    let grant = h
        .send(
            Req::post("/v1/accounts/1/leases")
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT50S"})),
        )
        .await;
    let cap = grant.ok(201)["capability"]
        .as_str()
        .expect("capability")
        .to_string();
    let other = h
        .send(
            Req::post("/v1/accounts/1/leases")
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT50S"})),
        )
        .await;
    let other_cap = other.ok(201)["capability"]
        .as_str()
        .expect("capability")
        .to_string();

    server.stop().expect("stop the server");

    let ready = answered(&h, Req::get("/readyz"), "readyz").await;
    assert_eq!(
        (ready.status.as_u16(), ready.body["code"].clone()),
        (503, json!("not_ready")),
        "{}",
        ready.text
    );
    let status = answered(&h, Req::get("/v1/admin/status").token(ADMIN), "status").await;
    assert_eq!(status.ok(200)["readiness"]["ready"], json!(false));
    assert_eq!(status.body["readiness"]["storage_reachable"], json!(false));
    let requests: Vec<(&str, Req)> = vec![
        (
            "acquire",
            Req::post("/v1/accounts/1/leases")
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT10S"})),
        ),
        (
            "renew",
            Req::post("/v1/leases/1/renew")
                .token(&cap)
                .json(json!({"ttl": "PT10S"})),
        ),
        (
            "release",
            Req::post("/v1/leases/1/release")
                .token(&cap)
                .json(json!({"consumed": 1})),
        ),
        ("lease show", Req::get("/v1/leases/1").token(&cap)),
        ("account show", Req::get("/v1/accounts/1").token(&key)),
        (
            "deposit",
            Req::post("/v1/accounts/1/deposits")
                .token(ADMIN)
                .json(json!({"units": 1})),
        ),
        (
            "account create",
            Req::post("/v1/accounts")
                .token(ADMIN)
                .json(json!({"name": "b"})),
        ),
        ("reclaim", Req::post("/v1/admin/reclaim").token(ADMIN)),
        ("audit", Req::get("/v1/admin/audit").token(ADMIN)),
        (
            "lease show, another lease's capability",
            Req::get("/v1/leases/1").token(&other_cap),
        ),
    ];
    let mut codes: Vec<(&str, u16, Value)> = Vec::new();
    for (what, req) in requests {
        let r = answered(&h, req, what).await;
        codes.push((what, r.status.as_u16(), r.body["code"].clone()));
    }
    let expected: Vec<(&str, u16, Value)> = [
        "acquire",
        "renew",
        "release",
        "lease show",
        "account show",
        "deposit",
        "account create",
        "reclaim",
        "audit",
    ]
    .into_iter()
    .map(|w| (w, 503, json!("storage_unavailable")))
    .chain([(
        "lease show, another lease's capability",
        // The safe-cut clock reads the database first, so the answer is
        // its 503; the system clock needs no storage to see that the
        // capability is not this lease's, so it is refused as any request
        // with the wrong credential is.
        if clock_kind == ClockKind::SafeCut {
            503
        } else {
            403
        },
        if clock_kind == ClockKind::SafeCut {
            json!("storage_unavailable")
        } else {
            json!("capability_mismatch")
        },
    )])
    .collect();
    assert_eq!(codes, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_clock_answers_every_request_with_the_database_down() {
    every_request_answers_with_the_database_down(ClockKind::System).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safe_cut_clock_answers_every_request_with_the_database_down() {
    every_request_answers_with_the_database_down(ClockKind::SafeCut).await;
}
