//! The HTTP cases against the PostgreSQL store (a fresh migrated database
//! per test on the shared harness cluster), plus what only a durable store
//! shows: capabilities and grants survive a new store on the same database.

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use tollgate::CapabilityKey;

tollgate_api::all_http_cases!(PgFactory::default());

/// A second service on the same database (a restart) honours every
/// capability and account key issued by the first, with the exact expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_survive_a_new_store() {
    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let open = || async {
        let store = tollgate_pg::PostgresStore::connect_with(
            &url,
            default_policy(),
            CapabilityKey::new(&PG_KEY).expect("key"),
            PG_OPTIONS,
        )
        .await
        .expect("store");
        Harness::over(tollgate_server::pg::service_store(Arc::new(store)))
    };
    let first = open().await;
    let (a, key) = first.account("a", 100).await;
    let g = first.acquire(a, &key, 10, "PT30.000000001S").await;
    drop(first);
    let second = open().await;
    let lease = g["lease_id"].as_i64().expect("id");
    let cap = g["capability"].as_str().expect("cap");
    let l = second
        .send(Req::get(format!("/v1/leases/{lease}")).token(cap))
        .await;
    assert_eq!(l.ok(200)["expiry"], json!("2026-11-29T12:00:30.000000001Z"));
    let own = second
        .send(Req::get(format!("/v1/accounts/{a}")).token(&key))
        .await;
    assert_eq!(own.ok(200)["held"], json!(10));
    second
        .send(
            Req::post(format!("/v1/leases/{lease}/release"))
                .token(cap)
                .json(json!({"consumed": 2})),
        )
        .await
        .ok(200);
    second.assert_audit_clean().await;
}

/// A store started with another policy is refused at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_mismatch_refuses_to_start() {
    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let key = || CapabilityKey::new(&PG_KEY).expect("key");
    tollgate_pg::PostgresStore::connect_with(&url, default_policy(), key(), PG_OPTIONS)
        .await
        .expect("first start records the policy");
    let other = policy(dur(60, 0), dur(5, 1));
    let err = tollgate_pg::PostgresStore::connect_with(&url, other, key(), PG_OPTIONS)
        .await
        .expect_err("policy mismatch");
    assert_eq!(err.code(), "policy_mismatch");
}

/// Readiness and the status counts come from `tollgate-pg`'s accessors: a
/// session named like the migrator's means maintenance (not ready), and
/// only active leases count, those whose expiry is a legacy upper bound
/// also apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_and_maintenance_from_the_store() {
    use sqlx::{ConnectOptions, Connection};
    use std::str::FromStr;
    use tollgate_api::storage::{Readiness, StatusCounts};

    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    // Once migrate has returned, its session no longer shows as a running
    // migration, though its backend may still be exiting.
    let mut probe = sqlx::PgConnection::connect(&url).await.expect("connect");
    let named: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = $1",
    )
    .bind(tollgate_pg::MIGRATE_APPLICATION_NAME)
    .fetch_one(&mut probe)
    .await
    .expect("pg_stat_activity");
    assert_eq!(named, 0);
    probe.close().await.expect("close");
    let store = tollgate_pg::PostgresStore::connect_with(
        &url,
        default_policy(),
        CapabilityKey::new(&PG_KEY).expect("key"),
        PG_OPTIONS,
    )
    .await
    .expect("store");
    let h = Harness::over(tollgate_server::pg::service_store(Arc::new(store)));
    let (a, key) = h.account("a", 100).await;
    let id = |g: &serde_json::Value| g["lease_id"].as_i64().expect("id");
    let g1 = h.acquire(a, &key, 10, "PT30S").await;
    let g2 = h.acquire(a, &key, 5, "PT30S").await;
    let g3 = h.acquire(a, &key, 1, "PT30S").await;
    assert_eq!((id(&g1), id(&g2), id(&g3)), (1, 2, 3));
    h.send(
        Req::post(format!("/v1/leases/{}/release", id(&g3)))
            .token(g3["capability"].as_str().expect("cap"))
            .json(json!({"consumed": 1})),
    )
    .await
    .ok(200);
    // Rows as migration 0017 leaves pre-0017 leases: the expiry is an upper
    // bound. The released one is not counted.
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    // Lease writers declare the recorded grant policy (migration 0019).
    tollgate_pg::declare_session(&mut conn, &default_policy(), false)
        .await
        .expect("declare");
    let marked = sqlx::query(
        "UPDATE tollgate_leases SET expiry_is_upper_bound = true WHERE lease_id = ANY($1)",
    )
    .bind(vec![id(&g2), id(&g3)])
    .execute(&mut conn)
    .await
    .expect("mark legacy bounds");
    assert_eq!(marked.rows_affected(), 2);
    assert_eq!(
        h.store.ops.counts().await.expect("counts"),
        StatusCounts {
            active_leases: 2,
            active_legacy_bounds: 1,
        }
    );

    let ready = Readiness {
        store: "postgres",
        reachable: true,
        schema_version: Some(tollgate_server::pg::expected_schema_version()),
        expected_schema_version: Some(tollgate_server::pg::expected_schema_version()),
        maintenance: false,
        detail: None,
    };
    assert_eq!(h.store.ops.readiness().await, ready);
    let migrator = sqlx::postgres::PgConnectOptions::from_str(&url)
        .expect("url")
        .application_name(tollgate_pg::MIGRATE_APPLICATION_NAME)
        .connect()
        .await
        .expect("migrator session");
    let during = h.store.ops.readiness().await;
    assert_eq!(
        during,
        Readiness {
            maintenance: true,
            ..ready.clone()
        }
    );
    assert!(!during.is_ready());
    migrator.close().await.expect("close");
    conn.close().await.expect("close");
}

/// A readiness probe answers while the database does not: with the
/// migrations and lease tables locked by an open transaction, `/readyz`
/// gives up after `READINESS_PROBE_MAX` (2 s) and says the storage is
/// unreachable, and the status report answers with the counts unknown;
/// once the lock is gone the service is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_probe_is_bounded() {
    use sqlx::Connection;

    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let store = tollgate_pg::PostgresStore::connect_with(
        &url,
        default_policy(),
        CapabilityKey::new(&PG_KEY).expect("key"),
        PG_OPTIONS,
    )
    .await
    .expect("store");
    let h = Harness::over(tollgate_server::pg::service_store(Arc::new(store)));
    // Ready once the migration's own session has left the server (its
    // backend exits a moment after the client closed it, and until then
    // readiness reports maintenance in progress): bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = h.send(Req::get("/readyz")).await;
        if r.status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready 10 s after the migration: {:?}",
            r.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::query("BEGIN")
        .execute(&mut conn)
        .await
        .expect("begin");
    sqlx::query("LOCK TABLE _sqlx_migrations, tollgate_leases IN ACCESS EXCLUSIVE MODE")
        .execute(&mut conn)
        .await
        .expect("lock");
    let r = h.send(Req::get("/readyz")).await;
    r.problem(503, "not_ready");
    assert_eq!(
        r.body["detail"],
        json!(format!(
            "not ready: storage unreachable; schema version none, expected {}",
            tollgate_server::pg::expected_schema_version()
        ))
    );
    let detail = h.store.ops.readiness().await.detail;
    assert_eq!(
        detail.as_deref(),
        Some("the database did not answer within 2 s")
    );
    // The status report answers too: not ready, and the counts unknown
    // (`null`) rather than a 503 after the pool's timeouts.
    let st = h
        .send(Req::get("/v1/admin/status").token(ADMIN))
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (
            &st["readiness"]["ready"],
            &st["readiness"]["storage_reachable"],
            &st["active_leases"],
            &st["active_legacy_bounds"]
        ),
        (&json!(false), &json!(false), &json!(null), &json!(null)),
        "{st}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("rollback");
    h.send(Req::get("/readyz")).await.ok(200);
    let st = h
        .send(Req::get("/v1/admin/status").token(ADMIN))
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (
            &st["readiness"]["ready"],
            &st["active_leases"],
            &st["active_legacy_bounds"]
        ),
        (&json!(true), &json!(0), &json!(0)),
        "{st}"
    );
}
