//! The HTTP cases, each an `async fn(&dyn ServiceStoreFactory)`, run against
//! both stores by `all_http_cases!`. Every check asserts exact values.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::api;
use crate::error::SERVICE_CODES;
use axum::http::{Method, header};
use serde_json::{Value, json};
use tollgate::AllocatorError;

use super::*;

fn fence(v: &Value) -> i64 {
    v["fence"].as_i64().expect("fence")
}

fn id(v: &Value, field: &str) -> i64 {
    v[field].as_i64().expect("id")
}

fn cap(v: &Value) -> String {
    v["capability"].as_str().expect("capability").to_string()
}

/// Account creation, reading with both credentials, deposits.
pub async fn create_show_and_deposit(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let r = h
        .send(
            Req::post("/v1/accounts")
                .token(ADMIN)
                .json(json!({"name": "team blue"})),
        )
        .await;
    let b = r.ok(201).clone();
    let a = id(&b, "account_id");
    let key = b["api_key"].as_str().expect("key");
    assert!(key.starts_with("tga1.") && key.len() == 5 + 64, "{key}");
    assert!(key[5..].bytes().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(b["name"], json!("team blue"));
    assert_eq!(b.as_object().map(|o| o.len()), Some(3));
    let zero = json!({"account_id": a, "name": "team blue", "deposited": 0, "available": 0, "held": 0, "consumed": 0});
    assert_eq!(h.account_view(a).await, zero);
    let own = h
        .send(Req::get(format!("/v1/accounts/{a}")).token(key))
        .await;
    assert_eq!(own.ok(200), &zero);
    let d = h
        .send(
            Req::post(format!("/v1/accounts/{a}/deposits"))
                .token(ADMIN)
                .json(json!({"units": 100})),
        )
        .await;
    assert_eq!(
        d.ok(200),
        &json!({"account_id": a, "name": "team blue", "deposited": 100, "available": 100, "held": 0, "consumed": 0})
    );
    // A second account gets a different key.
    let (b2, key2) = h.account("team red", 0).await;
    assert_ne!(b2, a);
    assert_ne!(key2, key);
    h.assert_audit_clean().await;
}

/// Acquire with a TTL of 30 s + 1 ns at a nanosecond instant: exact expiry.
pub async fn acquire_fractional_ttl_exact(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    h.set_now("2026-11-29T12:00:00.123456789Z");
    let g = h.acquire(a, &key, 10, "PT30.000000001S").await;
    let lease = id(&g, "lease_id");
    assert_eq!(g["expiry"], json!("2026-11-29T12:00:30.12345679Z"));
    assert_eq!(g["granted_ttl"], json!("PT30.000000001S"));
    // The time remaining from the request: the whole TTL on an exact clock.
    assert_eq!(g["expires_in"], json!("PT30.000000001S"));
    // The lossless companions: integer nanoseconds as decimal strings.
    assert_eq!(g["expiry_ns"], json!("1795953630123456790"));
    assert_eq!(g["granted_ttl_ns"], json!("30000000001"));
    assert_eq!(g["expires_in_ns"], json!("30000000001"));
    assert_eq!(
        (
            &g["requested_ttl"],
            &g["requested_ttl_ns"],
            &g["ttl_clamped"]
        ),
        (
            &json!("PT30.000000001S"),
            &json!("30000000001"),
            &json!(false)
        )
    );
    assert_eq!(g["units"], json!(10));
    assert!(cap(&g).starts_with("tgc1."));
    assert_eq!(g.as_object().map(|o| o.len()), Some(13));
    let l = h
        .send(Req::get(format!("/v1/leases/{lease}")).token(&cap(&g)))
        .await;
    assert_eq!(
        l.ok(200),
        &json!({
            "lease_id": lease, "account_id": a, "state": "active", "units": 10,
            "fence": fence(&g), "expiry": "2026-11-29T12:00:30.12345679Z",
            "expiry_ns": "1795953630123456790",
            "expiry_is_upper_bound": false, "consumed": null,
            "expires_in": "PT30.000000001S", "expires_in_ns": "30000000001"
        })
    );
    // Read later, the lease has less left; past its expiry, nothing.
    h.set_now("2026-11-29T12:00:20.123456789Z");
    let l = h
        .send(Req::get(format!("/v1/leases/{lease}")).token(&cap(&g)))
        .await;
    assert_eq!(l.ok(200)["expires_in"], json!("PT10.000000001S"));
    assert_eq!(l.ok(200)["expires_in_ns"], json!("10000000001"));
    h.set_now("2026-11-29T12:00:31Z");
    let l = h
        .send(Req::get(format!("/v1/leases/{lease}")).token(&cap(&g)))
        .await;
    assert_eq!(l.ok(200)["expires_in"], json!("PT0S"));
    assert_eq!(l.ok(200)["expires_in_ns"], json!("0"));
    h.set_now("2026-11-29T12:00:00.123456789Z");
    assert_eq!(
        h.account_view(a).await,
        json!({"account_id": a, "name": "a", "deposited": 100, "available": 90, "held": 10, "consumed": 0})
    );
}

/// TTLs are clamped to max_ttl and only to it; friendly input accepted.
pub async fn ttl_clamped_and_friendly_input(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    // (input, granted, expiry, requested, requested_ns, clamped)
    for (input, granted, expiry, requested, requested_ns, clamped) in [
        (
            "PT2H",
            "PT1M",
            "2026-11-29T12:01:00Z",
            "PT2H",
            "7200000000000",
            true,
        ),
        (
            "PT60.000000001S",
            "PT1M",
            "2026-11-29T12:01:00Z",
            "PT1M0.000000001S",
            "60000000001",
            true,
        ),
        (
            "PT1M",
            "PT1M",
            "2026-11-29T12:01:00Z",
            "PT1M",
            "60000000000",
            false,
        ),
        (
            "PT59.999999999S",
            "PT59.999999999S",
            "2026-11-29T12:00:59.999999999Z",
            "PT59.999999999S",
            "59999999999",
            false,
        ),
        (
            "30s 1ns",
            "PT30.000000001S",
            "2026-11-29T12:00:30.000000001Z",
            "PT30.000000001S",
            "30000000001",
            false,
        ),
        (
            "1ns",
            "PT0.000000001S",
            "2026-11-29T12:00:00.000000001Z",
            "PT0.000000001S",
            "1",
            false,
        ),
        (
            "1.5s",
            "PT1.5S",
            "2026-11-29T12:00:01.5Z",
            "PT1.5S",
            "1500000000",
            false,
        ),
        (
            "PT2562047788015215H30M7.999999999S",
            "PT1M",
            "2026-11-29T12:01:00Z",
            "PT2562047788015215H30M7.999999999S",
            "9223372036854775807999999999",
            true,
        ),
    ] {
        let g = h.acquire(a, &key, 1, input).await;
        assert_eq!(
            (
                g["granted_ttl"].as_str(),
                g["expiry"].as_str(),
                g["requested_ttl"].as_str(),
                g["requested_ttl_ns"].as_str(),
                g["ttl_clamped"].as_bool(),
            ),
            (
                Some(granted),
                Some(expiry),
                Some(requested),
                Some(requested_ns),
                Some(clamped)
            ),
            "{input}"
        );
    }
}

/// Renewal: new fence, expiry the later of old and now + ttl.
pub async fn renew_extends_and_never_shortens(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let g = h.acquire(a, &key, 10, "PT30S").await;
    let lease = id(&g, "lease_id");
    let c = cap(&g);
    h.set_now("2026-11-29T12:00:10Z");
    let r = h
        .send(
            Req::post(format!("/v1/leases/{lease}/renew"))
                .token(&c)
                .json(json!({"ttl": "PT30.000000001S"})),
        )
        .await
        .ok(200)
        .clone();
    assert!(fence(&r) > fence(&g));
    assert_eq!(
        r,
        json!({
            "lease_id": lease, "account_id": a, "state": "active", "units": 10,
            "fence": fence(&r), "expiry": "2026-11-29T12:00:40.000000001Z",
            "expiry_ns": "1795953640000000001", "extended": true,
            "expiry_is_upper_bound": false, "granted_ttl": "PT30.000000001S",
            "granted_ttl_ns": "30000000001", "requested_ttl": "PT30.000000001S",
            "requested_ttl_ns": "30000000001", "ttl_clamped": false,
            "expires_in": "PT30.000000001S", "expires_in_ns": "30000000001"
        })
    );
    // A shorter renewal keeps the expiry and still issues a new fence.
    let r2 = h
        .send(
            Req::post(format!("/v1/leases/{lease}/renew"))
                .token(&c)
                .json(json!({"ttl": "PT1S"})),
        )
        .await
        .ok(200)
        .clone();
    assert!(fence(&r2) > fence(&r));
    assert_eq!(r2["expiry"], json!("2026-11-29T12:00:40.000000001Z"));
    assert_eq!(r2["granted_ttl"], json!("PT1S"));
    // ... and says so: not extended, not clamped.
    assert_eq!(
        (&r2["extended"], &r2["ttl_clamped"], &r2["expiry_ns"]),
        (&json!(false), &json!(false), &json!("1795953640000000001"))
    );
    // The kept expiry is what the holder has left: more than asked for.
    assert_eq!(r2["expires_in"], json!("PT30.000000001S"));
    // A renewal past max_ttl (1 min) is clamped, and says so: 12:00:10 +
    // 1 min passes the kept expiry, so it is extended too.
    let r3 = h
        .send(
            Req::post(format!("/v1/leases/{lease}/renew"))
                .token(&c)
                .json(json!({"ttl": "PT1H"})),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (
            &r3["expiry"],
            &r3["expiry_ns"],
            &r3["extended"],
            &r3["ttl_clamped"],
            &r3["requested_ttl"],
            &r3["requested_ttl_ns"],
            &r3["granted_ttl"],
            &r3["granted_ttl_ns"],
        ),
        (
            &json!("2026-11-29T12:01:10Z"),
            &json!("1795953670000000000"),
            &json!(true),
            &json!(true),
            &json!("PT1H"),
            &json!("3600000000000"),
            &json!("PT1M"),
            &json!("60000000000"),
        )
    );
    // Clamped and not extended: the same 1 h again keeps 12:01:10.
    let r4 = h
        .send(
            Req::post(format!("/v1/leases/{lease}/renew"))
                .token(&c)
                .json(json!({"ttl": "PT1H"})),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (&r4["expiry"], &r4["extended"], &r4["ttl_clamped"]),
        (&json!("2026-11-29T12:01:10Z"), &json!(false), &json!(true))
    );
    let l = h
        .send(Req::get(format!("/v1/leases/{lease}")).token(&c))
        .await;
    assert_eq!(l.ok(200)["fence"], json!(fence(&r4)));
}

/// Release with and without `consumed`: exact settlement and balances.
pub async fn release_settles_exactly(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let g1 = h.acquire(a, &key, 10, "PT30S").await;
    let g2 = h.acquire(a, &key, 20, "PT30S").await;
    h.set_now("2026-11-29T12:00:01.000000001Z");
    let s1 = h
        .send(
            Req::post(format!("/v1/leases/{}/release", id(&g1, "lease_id")))
                .token(&cap(&g1))
                .json(json!({"consumed": 4})),
        )
        .await;
    assert_eq!(
        s1.ok(200),
        &json!({
            "lease_id": id(&g1, "lease_id"), "account_id": a, "state": "released",
            "units": 10, "consumed": 4, "returned": 6,
            "settled_at": "2026-11-29T12:00:01.000000001Z",
            "settled_at_ns": "1795953601000000001",
            "balances": {"deposited": 100, "available": 76, "held": 20, "consumed": 4}
        })
    );
    // Empty body: all units charged.
    let s2 = h
        .send(Req::post(format!("/v1/leases/{}/release", id(&g2, "lease_id"))).token(&cap(&g2)))
        .await;
    assert_eq!(
        s2.ok(200),
        &json!({
            "lease_id": id(&g2, "lease_id"), "account_id": a, "state": "released",
            "units": 20, "consumed": 20, "returned": 0,
            "settled_at": "2026-11-29T12:00:01.000000001Z",
            "settled_at_ns": "1795953601000000001",
            "balances": {"deposited": 100, "available": 76, "held": 0, "consumed": 24}
        })
    );
    // `null` is "no usage report" too.
    let g3 = h.acquire(a, &key, 1, "PT30S").await;
    let s3 = h
        .send(
            Req::post(format!("/v1/leases/{}/release", id(&g3, "lease_id")))
                .token(&cap(&g3))
                .raw(b"null".to_vec(), Some("application/json")),
        )
        .await;
    assert_eq!(s3.ok(200)["consumed"], json!(1));
    // Settled: not active any more; the lease shows its charge.
    h.send(Req::post(format!("/v1/leases/{}/release", id(&g1, "lease_id"))).token(&cap(&g1)))
        .await
        .problem(409, "lease_not_active");
    let l = h
        .send(Req::get(format!("/v1/leases/{}", id(&g1, "lease_id"))).token(&cap(&g1)))
        .await;
    assert_eq!(l.ok(200)["state"], json!("released"));
    assert_eq!(l.ok(200)["consumed"], json!(4));
    h.assert_audit_clean().await;
}

/// The reclaim boundary to the nanosecond, over HTTP with the test clock:
/// grace 5 s, expiry e = T0 + 30.000000001 s.
pub async fn release_and_reclaim_boundary(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let early = h.acquire(a, &key, 10, "PT30.000000001S").await;
    let late = h.acquire(a, &key, 20, "PT30.000000001S").await;
    let put_clock = |now: &'static str| {
        h.send(
            Req::put("/v1/admin/test-clock")
                .token(ADMIN)
                .json(json!({"now": now})),
        )
    };
    // e + g - 1 ns: release works, renew works, reclaim settles nothing.
    put_clock("2026-11-29T12:00:35Z").await.ok(200);
    let r = h
        .send(
            Req::post("/v1/admin/reclaim")
                .token(ADMIN)
                .json(json!({"limit": 10})),
        )
        .await;
    assert_eq!(
        r.ok(200),
        &json!({"reclaimed": [], "cutoff": "2026-11-29T12:00:30Z",
                "cutoff_ns": "1795953630000000000", "units_charged": 0,
                "now": "2026-11-29T12:00:35Z", "now_ns": "1795953635000000000"})
    );
    h.send(
        Req::post(format!("/v1/leases/{}/release", id(&early, "lease_id")))
            .token(&cap(&early))
            .json(json!({"consumed": 1})),
    )
    .await
    .ok(200);
    // e + g: the other lease is reclaimable; its holder can no longer act.
    put_clock("2026-11-29T12:00:35.000000001Z").await.ok(200);
    let late_id = id(&late, "lease_id");
    let refused = h
        .send(
            Req::post(format!("/v1/leases/{late_id}/release"))
                .token(&cap(&late))
                .json(json!({"consumed": 0})),
        )
        .await;
    refused.problem(409, "lease_reclaimable");
    assert_eq!(
        refused.body["detail"],
        json!(format!(
            "lease {late_id} expired at 2026-11-29T12:00:30.000000001Z and is reclaimable at 2026-11-29T12:00:35.000000001Z"
        ))
    );
    h.send(
        Req::post(format!("/v1/leases/{late_id}/renew"))
            .token(&cap(&late))
            .json(json!({"ttl": "PT10S"})),
    )
    .await
    .problem(409, "lease_reclaimable");
    let r = h.send(Req::post("/v1/admin/reclaim").token(ADMIN)).await;
    assert_eq!(
        r.ok(200),
        &json!({"reclaimed": [late_id], "cutoff": "2026-11-29T12:00:30.000000001Z",
                "cutoff_ns": "1795953630000000001", "units_charged": 20,
                "now": "2026-11-29T12:00:35.000000001Z", "now_ns": "1795953635000000001"})
    );
    let l = h
        .send(Req::get(format!("/v1/leases/{late_id}")).token(&cap(&late)))
        .await;
    assert_eq!(l.ok(200)["state"], json!("reclaimed"));
    assert_eq!(l.ok(200)["consumed"], json!(20));
    assert_eq!(
        h.account_view(a).await,
        json!({"account_id": a, "name": "a", "deposited": 100, "available": 79, "held": 0, "consumed": 21})
    );
    // Idempotent: nothing more to do.
    let again = h.send(Req::post("/v1/admin/reclaim").token(ADMIN)).await;
    assert_eq!(again.ok(200)["reclaimed"], json!([]));
    h.assert_audit_clean().await;
}

/// The worker's single step, driven with the test clock (no sleeps).
pub async fn reclaim_worker_steps_without_sleeps(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 1000).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(id(&h.acquire(a, &key, 7, "PT1S").await, "lease_id"));
    }
    let worker = h.state.worker();
    h.set_now("2026-11-29T12:00:05.999999999Z");
    let p = worker.step().await.expect("step");
    assert_eq!(p.report.reclaimed, vec![]);
    assert_eq!(p.now, ts("2026-11-29T12:00:05.999999999Z"));
    h.set_now("2026-11-29T12:00:06Z");
    let p = worker.step_with_limit(2).await.expect("step");
    assert_eq!(
        p.report.reclaimed.iter().map(|l| l.0).collect::<Vec<_>>(),
        ids[..2].to_vec()
    );
    assert_eq!(p.report.cutoff, Some(ts("2026-11-29T12:00:01Z")));
    assert_eq!(p.report.units_charged, 14);
    let p = worker.step().await.expect("step");
    assert_eq!(
        p.report.reclaimed.iter().map(|l| l.0).collect::<Vec<_>>(),
        ids[2..].to_vec()
    );
    assert_eq!(worker.drain().await, 0);
    let m = h.state.metrics();
    assert_eq!(
        m.get(crate::metrics::RECLAIM_PASSES, &[("outcome", "ok")]),
        4
    );
    assert_eq!(m.get(crate::metrics::RECLAIM_LEASES, &[]), 3);
    assert_eq!(m.get(crate::metrics::RECLAIM_UNITS, &[]), 21);
    // limit 0 is the core's invalid_limit, counted as an error pass.
    let e = worker.step_with_limit(0).await.expect_err("invalid limit");
    assert_eq!(e.code(), "invalid_limit");
    assert_eq!(
        m.get(crate::metrics::RECLAIM_PASSES, &[("outcome", "error")]),
        1
    );
    let text = h.send(Req::get("/metrics")).await.text;
    assert!(text.contains("tollgate_reclaim_leases_total 3\n"), "{text}");
    assert!(text.contains("tollgate_reclaim_units_total 21\n"), "{text}");
    h.assert_audit_clean().await;
}

/// Consolidation and its errors.
pub async fn consolidation(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let (b, key_b) = h.account("b", 100).await;
    let g1 = h.acquire(a, &key, 10, "PT10S").await;
    let g2 = h.acquire(a, &key, 15, "PT20S").await;
    let gb = h.acquire(b, &key_b, 5, "PT20S").await;
    let lref = |g: &Value| json!({"lease_id": id(g, "lease_id"), "capability": cap(g)});
    let path = format!("/v1/accounts/{a}/consolidations");
    let before = h.ledger_len().await;
    for (body, status, code) in [
        (
            json!({"leases": [], "ttl": "PT1M"}),
            422,
            "invalid_lease_count",
        ),
        (
            json!({"leases": [lref(&g1), lref(&g1)], "ttl": "PT1M"}),
            422,
            "duplicate_lease",
        ),
        (
            json!({"leases": [lref(&g1), lref(&gb)], "ttl": "PT1M"}),
            422,
            "lease_account_mismatch",
        ),
        (
            json!({"leases": [lref(&g1), {"lease_id": id(&g2, "lease_id"), "capability": cap(&g1)}], "ttl": "PT1M"}),
            403,
            "capability_mismatch",
        ),
        (
            json!({"leases": [lref(&g1)], "ttl": "PT0S"}),
            422,
            "invalid_ttl",
        ),
    ] {
        h.send(Req::post(&path).token(&key).json(body))
            .await
            .problem(status, code);
    }
    assert_eq!(
        h.ledger_len().await,
        before,
        "a refused consolidation wrote nothing"
    );
    h.set_now("2026-11-29T12:00:01Z");
    let c = h
        .send(
            Req::post(&path)
                .token(&key)
                .json(json!({"leases": [lref(&g2), lref(&g1)], "ttl": "PT1M30S"})),
        )
        .await
        .ok(201)
        .clone();
    assert_eq!(c["units"], json!(25));
    assert_eq!(c["expiry"], json!("2026-11-29T12:01:01Z"));
    assert_eq!(c["granted_ttl"], json!("PT1M"));
    assert!(fence(&c) > fence(&gb));
    for g in [&g1, &g2] {
        let l = h
            .send(Req::get(format!("/v1/leases/{}", id(g, "lease_id"))).token(&cap(g)))
            .await;
        assert_eq!(l.ok(200)["state"], json!("consolidated"));
        assert_eq!(l.ok(200)["consumed"], json!(0));
    }
    h.send(
        Req::post(&path)
            .token(&key)
            .json(json!({"leases": [lref(&g1)], "ttl": "PT1M"})),
    )
    .await
    .problem(409, "lease_not_active");
    assert_eq!(
        h.account_view(a).await,
        json!({"account_id": a, "name": "a", "deposited": 100, "available": 75, "held": 25, "consumed": 0})
    );
    h.assert_audit_clean().await;
}

/// Idempotency-Key: a retry returns the original grant; a different
/// request with the same key conflicts; a bad key is refused.
pub async fn idempotent_acquire(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let acquire = |units: i64, ttl: &str, k: &str| {
        h.send(
            Req::post(format!("/v1/accounts/{a}/leases"))
                .token(&key)
                .header("Idempotency-Key", k)
                .json(json!({"units": units, "ttl": ttl})),
        )
    };
    let first = acquire(10, "PT30S", "job-1").await.ok(201).clone();
    h.set_now("2026-11-29T12:00:02Z");
    let retry = acquire(10, "PT30S", "job-1").await.ok(201).clone();
    // The original grant, with the time left from the retry.
    assert_eq!(first["expires_in"], json!("PT30S"));
    assert_eq!(retry["expires_in"], json!("PT28S"));
    assert_eq!(retry["expires_in_ns"], json!("28000000000"));
    let without = |v: &serde_json::Value| {
        let mut v = v.clone();
        let o = v.as_object_mut().expect("object");
        o.remove("expires_in");
        o.remove("expires_in_ns");
        v
    };
    assert_eq!(without(&first), without(&retry));
    acquire(11, "PT30S", "job-1")
        .await
        .problem(409, "idempotency_conflict");
    acquire(10, "PT30S", &"k".repeat(256))
        .await
        .problem(400, "invalid_idempotency_key");
    acquire(10, "PT30S", "has space")
        .await
        .problem(400, "invalid_idempotency_key");
    acquire(10, "PT30S", &"k".repeat(255)).await.ok(201);
    let twice = h
        .send(
            Req::post(format!("/v1/accounts/{a}/leases"))
                .token(&key)
                .header("Idempotency-Key", "x")
                .header("Idempotency-Key", "y")
                .json(json!({"units": 1, "ttl": "PT1S"})),
        )
        .await;
    twice.problem(400, "invalid_header");
    assert_eq!(h.account_view(a).await["held"], json!(20));
    h.assert_audit_clean().await;
}

/// Audit and status reports, exact.
pub async fn audit_and_status(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let (_b, _) = h.account("b", 50).await;
    let g = h.acquire(a, &key, 10, "PT30S").await;
    h.acquire(a, &key, 5, "PT30S").await;
    h.send(
        Req::post(format!("/v1/leases/{}/release", id(&g, "lease_id")))
            .token(&cap(&g))
            .json(json!({"consumed": 3})),
    )
    .await
    .ok(200);
    let audit = h.send(Req::get("/v1/admin/audit").token(ADMIN)).await;
    assert_eq!(
        audit.ok(200),
        &json!({
            "clean": true, "accounts_checked": 2, "entries_checked": 5,
            "total_deposited": 150, "total_available": 142, "total_held": 5,
            "total_consumed": 3, "violations": []
        })
    );
    let status = h.send(Req::get("/v1/admin/status").token(ADMIN)).await;
    let expected_version = json!(f.expected_schema_version());
    assert_eq!(
        status.ok(200),
        &json!({
            "readiness": {
                "ready": true, "store": f.kind(), "storage_reachable": true,
                "schema_version": expected_version, "expected_schema_version": expected_version,
                "maintenance": false
            },
            "active_leases": 1, "active_legacy_bounds": 0,
            "policy": {"max_ttl": "PT1M", "max_ttl_ns": "60000000000",
                       "reclaim_grace": "PT5S", "reclaim_grace_ns": "5000000000"},
            "clock": "test",
            "safe_time": null,
            "paused": {"acquire": 0, "consolidate": 0, "reclaim": 0},
            "late_expiry": {"count": 0, "sum": "PT0S", "sum_ns": "0", "buckets": [
                {"le": "PT0.001S", "le_ns": "1000000", "count": 0},
                {"le": "PT0.01S", "le_ns": "10000000", "count": 0},
                {"le": "PT0.1S", "le_ns": "100000000", "count": 0},
                {"le": "PT1S", "le_ns": "1000000000", "count": 0},
                {"le": "PT10S", "le_ns": "10000000000", "count": 0},
                {"le": "PT1M", "le_ns": "60000000000", "count": 0},
                {"le": "PT10M", "le_ns": "600000000000", "count": 0}
            ]}
        })
    );
}

fn protected_routes(account: i64, lease: i64) -> Vec<(Method, String, Option<Value>)> {
    vec![
        (
            Method::POST,
            "/v1/accounts".into(),
            Some(json!({"name": "x"})),
        ),
        (
            Method::POST,
            format!("/v1/accounts/{account}/deposits"),
            Some(json!({"units": 1})),
        ),
        (Method::GET, format!("/v1/accounts/{account}"), None),
        (
            Method::POST,
            format!("/v1/accounts/{account}/leases"),
            Some(json!({"units": 1, "ttl": "PT1S"})),
        ),
        (
            Method::POST,
            format!("/v1/accounts/{account}/consolidations"),
            Some(json!({"leases": [], "ttl": "PT1S"})),
        ),
        (Method::GET, format!("/v1/leases/{lease}"), None),
        (
            Method::POST,
            format!("/v1/leases/{lease}/renew"),
            Some(json!({"ttl": "PT1S"})),
        ),
        (Method::POST, format!("/v1/leases/{lease}/release"), None),
        (Method::POST, "/v1/admin/reclaim".into(), None),
        (Method::GET, "/v1/admin/audit".into(), None),
        (Method::GET, "/v1/admin/status".into(), None),
        (
            Method::PUT,
            "/v1/admin/test-clock".into(),
            Some(json!({"now": T0})),
        ),
    ]
}

/// Rule 1: no or malformed credentials: 401 on every protected route,
/// before anything is looked up or changed.
pub async fn auth_missing_and_malformed(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let g = h.acquire(a, &key, 10, "PT30S").await;
    let before = h.ledger_len().await;
    for (method, path, body) in protected_routes(a, id(&g, "lease_id")) {
        for auth in [
            None,
            Some("Basic YWRtaW46YWRtaW4="),
            Some("Bearer"),
            Some("Bearer "),
            Some("Token abc"),
            Some("Bearer a b"),
        ] {
            let mut req = Req::new(method.clone(), &path);
            if let Some(v) = auth {
                req = req.header("authorization", v);
            }
            if let Some(b) = &body {
                req = req.json(b.clone());
            }
            let r = h.send(req).await;
            r.problem(401, "unauthenticated");
            assert_eq!(
                r.headers
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok()),
                Some("Bearer realm=\"tollgate\""),
                "{method} {path}"
            );
        }
    }
    // Scheme is case-insensitive.
    h.send(
        Req::get(format!("/v1/accounts/{a}")).header("authorization", &format!("bearer {ADMIN}")),
    )
    .await
    .ok(200);
    assert_eq!(h.ledger_len().await, before);
}

/// Rule 2: admin-only routes refuse every other credential with 403.
pub async fn auth_admin_only_routes(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let g = h.acquire(a, &key, 10, "PT30S").await;
    let before = h.ledger_len().await;
    let admin_only = [
        (
            Method::POST,
            "/v1/accounts".to_string(),
            Some(json!({"name": "x"})),
        ),
        (
            Method::POST,
            format!("/v1/accounts/{a}/deposits"),
            Some(json!({"units": 1})),
        ),
        (Method::POST, "/v1/admin/reclaim".into(), None),
        (Method::GET, "/v1/admin/audit".into(), None),
        (Method::GET, "/v1/admin/status".into(), None),
        (
            Method::PUT,
            "/v1/admin/test-clock".into(),
            Some(json!({"now": T0})),
        ),
    ];
    for (method, path, body) in admin_only {
        for token in [key.as_str(), &cap(&g), "tgadm1.wrong-admin-token-000000"] {
            let mut req = Req::new(method.clone(), &path).token(token);
            if let Some(b) = &body {
                req = req.json(b.clone());
            }
            h.send(req).await.problem(403, "forbidden");
        }
    }
    // The admin token is not a holder credential.
    h.send(
        Req::post(format!("/v1/accounts/{a}/leases"))
            .token(ADMIN)
            .json(json!({"units": 1, "ttl": "PT1S"})),
    )
    .await
    .problem(403, "forbidden");
    h.send(
        Req::post(format!("/v1/accounts/{a}/consolidations"))
            .token(ADMIN)
            .json(json!({"leases": [], "ttl": "PT1S"})),
    )
    .await
    .problem(403, "forbidden");
    // Nor a lease capability.
    h.send(Req::get(format!("/v1/leases/{}", id(&g, "lease_id"))).token(ADMIN))
        .await
        .problem(403, "capability_mismatch");
    assert_eq!(h.ledger_len().await, before);
}

/// Rule 3: account A's key cannot read or acquire on B, and cannot tell B
/// from a missing account (403 for both).
pub async fn auth_account_isolation(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key_a) = h.account("a", 100).await;
    let (b, key_b) = h.account("b", 100).await;
    let missing = b + 1000;
    let before = h.ledger_len().await;
    for target in [b, missing] {
        let read = h
            .send(Req::get(format!("/v1/accounts/{target}")).token(&key_a))
            .await;
        read.problem(403, "forbidden");
        h.send(
            Req::post(format!("/v1/accounts/{target}/leases"))
                .token(&key_a)
                .json(json!({"units": 1, "ttl": "PT1S"})),
        )
        .await
        .problem(403, "forbidden");
        h.send(
            Req::post(format!("/v1/accounts/{target}/consolidations"))
                .token(&key_a)
                .json(json!({"leases": [], "ttl": "PT1S"})),
        )
        .await
        .problem(403, "forbidden");
        // A key that is nobody's.
        h.send(
            Req::get(format!("/v1/accounts/{target}"))
                .token("tga1.0000000000000000000000000000000000000000000000000000000000000000"),
        )
        .await
        .problem(403, "forbidden");
    }
    // The refusals for an existing and a missing account are identical.
    let r1 = h
        .send(Req::get(format!("/v1/accounts/{b}")).token(&key_a))
        .await;
    let r2 = h
        .send(Req::get(format!("/v1/accounts/{missing}")).token(&key_a))
        .await;
    assert_eq!((r1.status, &r1.text), (r2.status, &r2.text));
    // The admin token reads a missing account as missing.
    h.send(Req::get(format!("/v1/accounts/{missing}")).token(ADMIN))
        .await
        .problem(404, "account_not_found");
    h.send(
        Req::post(format!("/v1/accounts/{missing}/deposits"))
            .token(ADMIN)
            .json(json!({"units": 1})),
    )
    .await
    .problem(404, "account_not_found");
    assert_eq!(h.ledger_len().await, before);
    // Each key works on its own account.
    h.acquire(a, &key_a, 1, "PT1S").await;
    h.acquire(b, &key_b, 2, "PT1S").await;
    assert_eq!(h.account_view(a).await["held"], json!(1));
    assert_eq!(h.account_view(b).await["held"], json!(2));
}

/// Rule 4: one lease's capability cannot touch another lease; a missing
/// lease looks the same as a foreign one.
pub async fn auth_capability_isolation(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let g1 = h.acquire(a, &key, 10, "PT30S").await;
    let g2 = h.acquire(a, &key, 20, "PT30S").await;
    let l2 = id(&g2, "lease_id");
    let before = h.ledger_len().await;
    let missing = l2 + 1000;
    let mut bodies = BTreeSet::new();
    for target in [l2, missing] {
        for token in [cap(&g1), key.clone()] {
            for req in [
                Req::get(format!("/v1/leases/{target}")),
                Req::post(format!("/v1/leases/{target}/renew")).json(json!({"ttl": "PT1M"})),
                Req::post(format!("/v1/leases/{target}/release")).json(json!({"consumed": 0})),
            ] {
                let r = h.send(req.token(&token)).await;
                r.problem(403, "capability_mismatch");
                bodies.insert(r.text.clone());
            }
        }
    }
    assert_eq!(bodies.len(), 1, "identical refusals: {bodies:?}");
    assert_eq!(h.ledger_len().await, before);
    let l = h
        .send(Req::get(format!("/v1/leases/{l2}")).token(&cap(&g2)))
        .await;
    assert_eq!(l.ok(200)["state"], json!("active"));
    assert_eq!(l.ok(200)["fence"], json!(fence(&g2)));
}

/// The requests of [`store_error_codes_over_http`], each with the status
/// and code it must get: account `a` (key `key`, 10 units, all held by
/// lease `l` with capability `c`).
fn store_error_requests(a: i64, key: &str, l: i64, c: &str) -> Vec<(Req, u16, &'static str)> {
    let acquire = |units: Value, ttl: &str| {
        Req::post(format!("/v1/accounts/{a}/leases"))
            .token(key)
            .json(json!({"units": units, "ttl": ttl}))
    };
    vec![
        (acquire(json!(0), "PT1S"), 422, "invalid_units"),
        (acquire(json!(-5), "PT1S"), 422, "invalid_units"),
        (acquire(json!(1), "PT0S"), 422, "invalid_ttl"),
        (acquire(json!(1), "-PT1S"), 422, "invalid_ttl"),
        (acquire(json!(1), "PT1S"), 409, "insufficient_balance"),
        (
            Req::post(format!("/v1/accounts/{a}/deposits"))
                .token(ADMIN)
                .json(json!({"units": 0})),
            422,
            "invalid_units",
        ),
        (
            Req::post(format!("/v1/accounts/{a}/deposits"))
                .token(ADMIN)
                .json(json!({"units": i64::MAX})),
            409,
            "units_overflow",
        ),
        (
            Req::get("/v1/accounts/999999").token(ADMIN),
            404,
            "account_not_found",
        ),
        (
            Req::post(format!("/v1/leases/{l}/release"))
                .token(c)
                .json(json!({"consumed": 11})),
            422,
            "invalid_consumed",
        ),
        (
            Req::post(format!("/v1/leases/{l}/release"))
                .token(c)
                .json(json!({"consumed": -1})),
            422,
            "invalid_consumed",
        ),
        (
            Req::post(format!("/v1/leases/{l}/renew"))
                .token(c)
                .json(json!({"ttl": "PT0S"})),
            422,
            "invalid_ttl",
        ),
        (
            Req::post("/v1/accounts")
                .token(ADMIN)
                .json(json!({"name": ""})),
            422,
            "invalid_account_name",
        ),
        (
            Req::post("/v1/accounts")
                .token(ADMIN)
                .json(json!({"name": "x".repeat(201)})),
            422,
            "invalid_account_name",
        ),
        (
            Req::post("/v1/accounts")
                .token(ADMIN)
                .json(json!({"name": "bell\u{7}"})),
            422,
            "invalid_account_name",
        ),
        (
            Req::post("/v1/admin/reclaim")
                .token(ADMIN)
                .json(json!({"limit": 0})),
            422,
            "invalid_limit",
        ),
        (
            Req::post("/v1/admin/reclaim")
                .token(ADMIN)
                .json(json!({"limit": 10001})),
            422,
            "invalid_limit",
        ),
    ]
}

/// Every allocator code a healthy store can produce, over HTTP.
pub async fn store_error_codes_over_http(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 10).await;
    let g = h.acquire(a, &key, 10, "PT30S").await;
    let cases = store_error_requests(a, &key, id(&g, "lease_id"), &cap(&g));
    let before = h.ledger_len().await;
    let view = h.account_view(a).await;
    for (req, status, code) in cases {
        h.send(req).await.problem(status, code);
    }
    assert_eq!(h.ledger_len().await, before);
    assert_eq!(h.account_view(a).await, view);
    // 200 characters is a valid name; a deposit up to i64::MAX is valid.
    h.send(
        Req::post("/v1/accounts")
            .token(ADMIN)
            .json(json!({"name": "x".repeat(200)})),
    )
    .await
    .ok(201);
    let (m, _) = h.account("max", 0).await;
    let d = h
        .send(
            Req::post(format!("/v1/accounts/{m}/deposits"))
                .token(ADMIN)
                .json(json!({"units": i64::MAX})),
        )
        .await;
    assert_eq!(d.ok(200)["available"], json!(i64::MAX));
}

/// A `POST` of `body` as is, with `token` and content type `ct`.
fn raw(path: &str, token: &str, body: &str, ct: Option<&str>) -> Req {
    Req::post(path)
        .token(token)
        .raw(body.as_bytes().to_vec(), ct)
}

/// The requests of [`malformed_inputs_change_nothing`], each with the
/// status and code it must get: account `a` (key `key`) holding lease `l`
/// (capability `c`).
fn malformed_requests(a: i64, key: &str, l: i64, c: &str) -> Vec<(Req, u16, &'static str)> {
    let acquire_path = format!("/v1/accounts/{a}/leases");
    let json_ct = Some("application/json");
    vec![
        (raw(&acquire_path, key, "{", json_ct), 400, "invalid_json"),
        (
            raw(&acquire_path, key, "not json", json_ct),
            400,
            "invalid_json",
        ),
        (
            raw(&acquire_path, key, r#"{"units":1,"ttl":"PT1S"} x"#, json_ct),
            400,
            "invalid_json",
        ),
        (Req::post(&acquire_path).token(key), 400, "invalid_json"),
        (
            raw(
                &acquire_path,
                key,
                r#"{"units":1,"ttl":"PT1S","extra":1}"#,
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (
            raw(&acquire_path, key, r#"{"units":"1","ttl":"PT1S"}"#, json_ct),
            422,
            "invalid_body",
        ),
        (
            raw(&acquire_path, key, r#"{"units":1.5,"ttl":"PT1S"}"#, json_ct),
            422,
            "invalid_body",
        ),
        (
            raw(&acquire_path, key, r#"{"units":1,"ttl":30}"#, json_ct),
            422,
            "invalid_body",
        ),
        (
            raw(&acquire_path, key, r#"{"units":1,"ttl":"soon"}"#, json_ct),
            422,
            "invalid_body",
        ),
        (
            raw(&acquire_path, key, r#"{"ttl":"PT1S"}"#, json_ct),
            422,
            "invalid_body",
        ),
        (
            raw(
                &acquire_path,
                key,
                r#"{"units":null,"ttl":"PT1S"}"#,
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (raw(&acquire_path, key, "[]", json_ct), 422, "invalid_body"),
        (
            raw(&acquire_path, key, r#" [1, "PT1S"]"#, json_ct),
            422,
            "invalid_body",
        ),
        (
            raw("/v1/admin/reclaim", ADMIN, "[]", json_ct),
            422,
            "invalid_body",
        ),
        (
            raw(&format!("/v1/leases/{l}/release"), c, "[3]", json_ct),
            422,
            "invalid_body",
        ),
        (
            raw(
                &format!("/v1/accounts/{a}/consolidations"),
                key,
                &format!(r#"{{"leases":[[{l},"{c}"]],"ttl":"PT1S"}}"#),
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (
            raw(
                &format!("/v1/accounts/{a}/consolidations"),
                key,
                &format!(
                    r#"{{"leases":[{{"lease_id":{l},"capability":"{c}","x":1}}],"ttl":"PT1S"}}"#
                ),
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (
            raw(
                &format!("/v1/accounts/{a}/deposits"),
                ADMIN,
                r#"{"units":1.0}"#,
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (
            raw(
                &acquire_path,
                key,
                r#"{"units":1,"units":2,"ttl":"PT1S"}"#,
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (
            raw(
                &acquire_path,
                key,
                r#"{"units":1,"ttl":"PT1S"}"#,
                Some("text/plain"),
            ),
            415,
            "unsupported_media_type",
        ),
        (
            raw(&acquire_path, key, r#"{"units":1,"ttl":"PT1S"}"#, None),
            415,
            "unsupported_media_type",
        ),
        (
            raw(
                &acquire_path,
                key,
                r#"{"units":1,"ttl":"PT1S"}"#,
                Some("application/json; charset=utf-16"),
            ),
            415,
            "unsupported_media_type",
        ),
        (
            raw(
                &acquire_path,
                key,
                r#"{"units":1,"ttl":"PT1S"}"#,
                Some("application/json; Charset=ISO-8859-1"),
            ),
            415,
            "unsupported_media_type",
        ),
        (
            Req::post(&acquire_path).token(key).raw(
                "{\"units\":1,\"ttl\":\"PT1S\"}"
                    .encode_utf16()
                    .flat_map(u16::to_le_bytes)
                    .collect::<Vec<u8>>(),
                Some("application/json; charset=UTF-16LE"),
            ),
            415,
            "unsupported_media_type",
        ),
        (
            raw(
                &acquire_path,
                key,
                &format!(
                    r#"{{"units":1,"ttl":"PT1S","pad":"{}"}}"#,
                    "x".repeat(70_000)
                ),
                json_ct,
            ),
            413,
            "payload_too_large",
        ),
        (
            raw(
                &format!("/v1/leases/{l}/release"),
                c,
                r#"{"consumed":"all"}"#,
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (
            raw(
                &format!("/v1/leases/{l}/release"),
                c,
                r#"{"consumd":1}"#,
                json_ct,
            ),
            422,
            "invalid_body",
        ),
        (
            raw(&format!("/v1/leases/{l}/renew"), c, "{}", json_ct),
            422,
            "invalid_body",
        ),
        (
            raw("/v1/admin/reclaim", ADMIN, r#"{"limit":-1}"#, json_ct),
            422,
            "invalid_body",
        ),
        (
            Req::put("/v1/admin/test-clock")
                .token(ADMIN)
                .json(json!({"now": "2026-11-29T12:00:00"})),
            422,
            "invalid_body",
        ),
        (
            Req::put("/v1/admin/test-clock")
                .token(ADMIN)
                .json(json!({"now": "2026-13-01T00:00:00Z"})),
            422,
            "invalid_body",
        ),
        (
            Req::put("/v1/admin/test-clock")
                .token(ADMIN)
                .json(json!({"now": 1764417600})),
            422,
            "invalid_body",
        ),
    ]
}

/// Malformed JSON, unknown fields, wrong types, wrong media types and
/// oversized bodies: 4xx problems, nothing changed.
pub async fn malformed_inputs_change_nothing(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let g = h.acquire(a, &key, 10, "PT30S").await;
    let cases = malformed_requests(a, &key, id(&g, "lease_id"), &cap(&g));
    let acquire_path = format!("/v1/accounts/{a}/leases");
    let json_ct = Some("application/json");
    let before = h.ledger_len().await;
    let view = h.account_view(a).await;
    for (req, status, code) in cases {
        h.send(req).await.problem(status, code);
    }
    assert_eq!(h.ledger_len().await, before);
    assert_eq!(h.account_view(a).await, view);
    // The field path is named.
    let r = h
        .send(raw(
            &acquire_path,
            &key,
            r#"{"units":"1","ttl":"PT1S"}"#,
            json_ct,
        ))
        .await;
    assert!(
        r.body["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("units: invalid type: string \"1\", expected i64")),
        "{}",
        r.text
    );
    // `application/merge-patch+json`-style suffixes and parameters are JSON;
    // a charset must be UTF-8.
    h.send(raw(
        &acquire_path,
        &key,
        r#"{"units":1,"ttl":"PT1S"}"#,
        Some("application/json; charset=utf-8"),
    ))
    .await
    .ok(201);
    h.send(raw(
        &acquire_path,
        &key,
        r#"{"units":1,"ttl":"PT1S"}"#,
        Some("Application/JSON; Charset=\"UTF-8\""),
    ))
    .await
    .ok(201);
    let r = h
        .send(raw(
            &acquire_path,
            &key,
            r#"{"units":1,"ttl":"PT1S"}"#,
            Some("application/json; charset=utf-16"),
        ))
        .await;
    r.problem(415, "unsupported_media_type");
    assert_eq!(
        r.body["detail"],
        json!("request bodies must be application/json in UTF-8")
    );
    let clock = h.clock.get();
    assert_eq!(clock, ts(T0));
    h.assert_audit_clean().await;
}

/// Units are JSON integers in i64: never wrapped, never rounded.
pub async fn integer_ranges(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let before = h.ledger_len().await;
    for units in [
        "9223372036854775808",
        "18446744073709551616",
        "-9223372036854775809",
        "1e3",
        "1.0",
        "100000000000000000000000000000",
    ] {
        let body = format!(r#"{{"units":{units}}}"#);
        h.send(
            Req::post(format!("/v1/accounts/{a}/deposits"))
                .token(ADMIN)
                .raw(body.into_bytes(), Some("application/json")),
        )
        .await
        .problem(422, "invalid_body");
        let body = format!(r#"{{"units":{units},"ttl":"PT1S"}}"#);
        h.send(
            Req::post(format!("/v1/accounts/{a}/leases"))
                .token(&key)
                .raw(body.into_bytes(), Some("application/json")),
        )
        .await
        .problem(422, "invalid_body");
    }
    h.send(
        Req::post(format!("/v1/accounts/{a}/deposits"))
            .token(ADMIN)
            .json(json!({"units": -9223372036854775808i64})),
    )
    .await
    .problem(422, "invalid_units");
    assert_eq!(h.ledger_len().await, before);
}

/// Path ids are positive integers in canonical decimal: anything else (a
/// word, a fraction, beyond `i64`, a sign, a leading zero, zero itself or
/// a negative) is 400 `invalid_path` with the same detail on every route,
/// before the credential is looked at; a well-formed id of no object is
/// simply not found.
pub async fn path_ids(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    let g = h.acquire(a, &key, 10, "PT30S").await;
    let (l, c) = (id(&g, "lease_id"), cap(&g));
    let detail = |raw: &str| {
        format!(
            "path id {raw:?} is not a positive integer in canonical decimal \
             (1..=9223372036854775807, no sign or leading zero)"
        )
    };
    for (raw, shown) in [
        ("abc", "abc"),
        ("1.5", "1.5"),
        ("99999999999999999999", "99999999999999999999"),
        ("9223372036854775808", "9223372036854775808"),
        ("%20", " "),
        ("0x10", "0x10"),
        ("+1", "+1"),
        ("%2B1", "+1"),
        ("01", "01"),
        ("001", "001"),
        ("0", "0"),
        ("00", "00"),
        ("-1", "-1"),
        ("-0", "-0"),
        ("-9223372036854775808", "-9223372036854775808"),
        ("1e0", "1e0"),
    ] {
        for (req, token) in [
            (Req::get(format!("/v1/accounts/{raw}")), ADMIN),
            (Req::get(format!("/v1/accounts/{raw}")), key.as_str()),
            (
                Req::post(format!("/v1/accounts/{raw}/deposits")).json(json!({"units": 1})),
                ADMIN,
            ),
            (
                Req::post(format!("/v1/accounts/{raw}/leases"))
                    .json(json!({"units": 1, "ttl": "PT1S"})),
                key.as_str(),
            ),
            (Req::get(format!("/v1/leases/{raw}")), c.as_str()),
            (
                Req::post(format!("/v1/leases/{raw}/renew")).json(json!({"ttl": "PT1S"})),
                c.as_str(),
            ),
            (Req::post(format!("/v1/leases/{raw}/release")), c.as_str()),
        ] {
            let r = h.send(req.token(token)).await;
            r.problem(400, "invalid_path");
            assert_eq!(r.body["detail"], json!(detail(shown)), "{raw}");
        }
    }
    h.send(
        Req::post("/v1/leases/-/renew")
            .token(&key)
            .json(json!({"ttl": "PT1S"})),
    )
    .await
    .problem(400, "invalid_path");
    h.send(
        Req::post("/v1/accounts/x/deposits")
            .token(ADMIN)
            .json(json!({"units": 1})),
    )
    .await
    .problem(400, "invalid_path");
    // The canonical spelling of an existing id reaches it.
    h.send(Req::get(format!("/v1/accounts/{a}")).token(ADMIN))
        .await
        .ok(200);
    h.send(Req::get(format!("/v1/leases/{l}")).token(&c))
        .await
        .ok(200);
    for id in [(a + 1).to_string(), "9223372036854775807".to_string()] {
        h.send(Req::get(format!("/v1/accounts/{id}")).token(ADMIN))
            .await
            .problem(404, "account_not_found");
        h.send(Req::get(format!("/v1/leases/{id}")).token(&key))
            .await
            .problem(403, "capability_mismatch");
    }
    // Nothing was released or renewed by any refused request.
    assert_eq!(h.account_view(a).await["held"], json!(10));
}

/// Unknown routes and methods: problem documents, 404 and 405.
pub async fn routes_and_methods(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    h.send(Req::get("/v1/nope").token(ADMIN))
        .await
        .problem(404, "not_found");
    h.send(Req::get("/").token(ADMIN))
        .await
        .problem(404, "not_found");
    h.send(Req::get("/v1/accounts/1/leases/2").token(ADMIN))
        .await
        .problem(404, "not_found");
    for (method, path) in [
        (Method::DELETE, "/v1/accounts"),
        (Method::GET, "/v1/accounts"),
        (Method::PUT, "/v1/accounts/1"),
        (Method::GET, "/v1/admin/reclaim"),
        (Method::POST, "/v1/admin/test-clock"),
        (Method::POST, "/healthz"),
    ] {
        h.send(Req::new(method, path).token(ADMIN))
            .await
            .problem(405, "method_not_allowed");
    }
    let r = h
        .send(Req::new(Method::DELETE, "/v1/accounts/1").token(ADMIN))
        .await;
    r.problem(405, "method_not_allowed");
    assert_eq!(
        r.headers.get(header::ALLOW).and_then(|v| v.to_str().ok()),
        Some("GET,HEAD")
    );
}

/// Instants: any offset and 0..=9 fractional digits in; UTC `Z`, exact to
/// the nanosecond, out.
pub async fn timestamps_round_trip(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    let (a, key) = h.account("a", 100).await;
    for (input, output, output_ns) in [
        (
            "2026-11-29T12:00:00Z",
            "2026-11-29T12:00:00Z",
            "1795953600000000000",
        ),
        (
            "2026-11-29T13:00:00.5+01:00",
            "2026-11-29T12:00:00.5Z",
            "1795953600500000000",
        ),
        (
            "2026-11-29T06:30:00.123-05:30",
            "2026-11-29T12:00:00.123Z",
            "1795953600123000000",
        ),
        (
            "2026-11-29T12:00:00.000000001Z",
            "2026-11-29T12:00:00.000000001Z",
            "1795953600000000001",
        ),
        (
            "2026-11-29T12:00:00.999999999z",
            "2026-11-29T12:00:00.999999999Z",
            "1795953600999999999",
        ),
        (
            "2026-11-29T12:00:00.120000000Z",
            "2026-11-29T12:00:00.12Z",
            "1795953600120000000",
        ),
        ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "0"),
        (
            "1969-12-31T23:59:59.999999999Z",
            "1969-12-31T23:59:59.999999999Z",
            "-1",
        ),
    ] {
        let r = h
            .send(
                Req::put("/v1/admin/test-clock")
                    .token(ADMIN)
                    .json(json!({"now": input})),
            )
            .await;
        assert_eq!(
            r.ok(200),
            &json!({"now": output, "now_ns": output_ns, "clock": "test"}),
            "{input}"
        );
        // The lossless form sets the same instant.
        let r = h
            .send(
                Req::put("/v1/admin/test-clock")
                    .token(ADMIN)
                    .json(json!({"now_ns": output_ns})),
            )
            .await;
        assert_eq!(
            r.ok(200),
            &json!({"now": output, "now_ns": output_ns, "clock": "test"}),
            "{input}"
        );
        // The server's supplied time is exactly that instant.
        let g = h.acquire(a, &key, 1, "PT0.000000001S").await;
        let expected = ts(output)
            .checked_add(dur(0, 1))
            .expect("in range")
            .to_string();
        assert_eq!(g["expiry"], json!(expected), "{input}");
    }
    // Ten fractional digits are refused, and so is an instant past the
    // supported range, each named in the field's terms.
    for (now, detail) in [
        (
            "2026-11-29T12:00:00.0000000001Z",
            "now: \"2026-11-29T12:00:00.0000000001Z\" is not an RFC 3339 instant: write e.g. \
             2026-11-29T12:00:00Z or 2026-11-29T12:00:00.000000001+00:00",
        ),
        (
            "tomorrow",
            "now: \"tomorrow\" is not an RFC 3339 instant: write e.g. 2026-11-29T12:00:00Z or \
             2026-11-29T12:00:00.000000001+00:00",
        ),
        (
            "9999-12-31T23:59:59.999999999Z",
            "now: \"9999-12-31T23:59:59.999999999Z\" is outside the supported range of \
             instants, -009999-01-02T01:59:59Z to 9999-12-30T22:00:00.999999999Z",
        ),
    ] {
        let r = h
            .send(
                Req::put("/v1/admin/test-clock")
                    .token(ADMIN)
                    .json(json!({ "now": now })),
            )
            .await;
        r.problem(422, "invalid_body");
        assert_eq!(r.body["detail"], json!(detail), "{now}");
    }
    // Exactly one of `now` and `now_ns`; `now_ns` is a decimal string.
    for (body, detail) in [
        (
            json!({}),
            "give the instant as `now` (RFC 3339) or `now_ns` (nanoseconds since the Unix epoch)",
        ),
        (
            json!({"now": "1970-01-01T00:00:00Z", "now_ns": "0"}),
            "give `now` or `now_ns`, not both",
        ),
        (
            json!({"now_ns": "1.5"}),
            "now_ns: invalid instant in nanoseconds \"1.5\": expected a decimal integer of nanoseconds since 1970-01-01T00:00:00Z within the years -9999..=9999",
        ),
        (
            json!({"now_ns": "+1"}),
            "now_ns: invalid instant in nanoseconds \"+1\": expected a decimal integer of nanoseconds since 1970-01-01T00:00:00Z within the years -9999..=9999",
        ),
        (
            json!({"now_ns": "999999999999999999999999"}),
            "now_ns: invalid instant in nanoseconds \"999999999999999999999999\": expected a decimal integer of nanoseconds since 1970-01-01T00:00:00Z within the years -9999..=9999",
        ),
    ] {
        let r = h
            .send(
                Req::put("/v1/admin/test-clock")
                    .token(ADMIN)
                    .json(body.clone()),
            )
            .await;
        r.problem(422, "invalid_body");
        // A field's parse error names the field, not the parser's position.
        assert_eq!(r.body["detail"], json!(detail), "{body}");
    }
}

/// Durations: ISO 8601 out, ISO 8601 or friendly in, exact.
pub async fn durations_round_trip(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, policy(dur(100_000, 0), dur(0, 0))).await;
    let (a, key) = h.account("a", 1000).await;
    for (input, output) in [
        ("PT30.000000001S", "PT30.000000001S"),
        ("PT0.000000001S", "PT0.000000001S"),
        ("PT1H1M1.1S", "PT1H1M1.1S"),
        ("pt2m", "PT2M"),
        ("1h 2m 3s 4ms 5us 6ns", "PT1H2M3.004005006S"),
        ("27h", "PT27H"),
        ("PT100000S", "PT27H46M40S"),
        ("PT100001S", "PT27H46M40S"),
    ] {
        let g = h.acquire(a, &key, 1, input).await;
        assert_eq!(g["granted_ttl"], json!(output), "{input}");
    }
    for bad in [
        "PT",
        "P1D",
        "P1Y",
        "P1M",
        "30",
        "PT9999999999999999999H",
        "",
        "1 fortnight",
        "10 parsecs",
    ] {
        let r = h
            .send(
                Req::post(format!("/v1/accounts/{a}/leases"))
                    .token(&key)
                    .json(json!({"units": 1, "ttl": bad})),
            )
            .await;
        r.problem(422, "invalid_body");
        // Worded in the field's terms, as the command line words a flag:
        // no parser text, no position in the body.
        assert_eq!(
            r.body["detail"],
            json!(format!(
                "ttl: {bad:?} is not an ISO 8601 or friendly duration: write e.g. PT30S, \
                 PT0.000000001S, 30s, 1h 30m or 250ms"
            )),
            "{bad}"
        );
    }
    // The optional duration of a renewal is worded the same.
    let g = h.acquire(a, &key, 1, "PT10S").await;
    let r = h
        .send(
            Req::post(format!("/v1/leases/{}/renew", g["lease_id"]))
                .token(g["capability"].as_str().expect("capability"))
                .json(json!({"ttl": "10 parsecs"})),
        )
        .await;
    r.problem(422, "invalid_body");
    assert_eq!(
        r.body["detail"],
        json!(
            "ttl: \"10 parsecs\" is not an ISO 8601 or friendly duration: write e.g. PT30S, \
             PT0.000000001S, 30s, 1h 30m or 250ms"
        )
    );
    // Zero grace: the reclaim cutoff is now itself.
    let r = h.send(Req::post("/v1/admin/reclaim").token(ADMIN)).await;
    assert_eq!(r.ok(200)["cutoff"], json!(T0));
}

/// An expiry beyond the timestamp range is refused before any debit; a
/// grace larger than the range means nothing is ever due.
pub async fn unrepresentable_expiry(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, policy(dur(60, 0), jiff::SignedDuration::MAX)).await;
    let (a, key) = h.account("a", 100).await;
    h.set_now("9999-12-30T22:00:00.5Z");
    let r = h
        .send(
            Req::post(format!("/v1/accounts/{a}/leases"))
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT1S"})),
        )
        .await;
    r.problem(422, "unrepresentable_expiry");
    assert_eq!(h.account_view(a).await["available"], json!(100));
    let g = h.acquire(a, &key, 1, "PT0.499999999S").await;
    assert_eq!(g["expiry"], json!("9999-12-30T22:00:00.999999999Z"));
    // Beyond 64 bits: the companion string holds it exactly.
    assert_eq!(g["expiry_ns"], json!("253402207200999999999"));
    let r = h.send(Req::post("/v1/admin/reclaim").token(ADMIN)).await;
    assert_eq!(
        r.ok(200),
        &json!({"reclaimed": [], "cutoff": null, "cutoff_ns": null, "units_charged": 0,
                "now": "9999-12-30T22:00:00.5Z", "now_ns": "253402207200500000000"})
    );
    let status = h.send(Req::get("/v1/admin/status").token(ADMIN)).await;
    assert_eq!(
        status.ok(200)["policy"],
        json!({"max_ttl": "PT1M", "max_ttl_ns": "60000000000",
               "reclaim_grace": "PT2562047788015215H30M7.999999999S",
               "reclaim_grace_ns": "9223372036854775807999999999"})
    );
}

/// `lease_not_found`: a valid capability for a lease the store does not
/// hold (only observable where the test can derive capabilities).
pub async fn lease_not_found_with_valid_capability(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    match f.derive_capability(424_242) {
        Some(c) => {
            let r = h.send(Req::get("/v1/leases/424242").token(&c)).await;
            r.problem(404, "lease_not_found");
            assert_eq!(r.body["detail"], json!("lease 424242 not found"));
        }
        None => {
            // The memory store hides its identity; the mapping is covered by
            // `failing_store_codes`. A forged capability is a mismatch.
            h.send(
                Req::get("/v1/leases/424242")
                    .token("tgc1.0000000000000000000000000000000000000000000000000000000000000000"),
            )
            .await
            .problem(403, "capability_mismatch");
        }
    }
}

/// `/healthz`, `/readyz`, `/metrics`, `/openapi.json` (no credentials).
pub async fn readiness_and_metrics(f: &dyn ServiceStoreFactory) {
    let h = Harness::new(f, default_policy()).await;
    assert_eq!(
        h.send(Req::get("/healthz")).await.ok(200),
        &json!({"status": "ok"})
    );
    let expected_version = json!(f.expected_schema_version());
    assert_eq!(
        h.send(Req::get("/readyz")).await.ok(200),
        &json!({"ready": true, "store": f.kind(), "storage_reachable": true,
                "schema_version": expected_version, "expected_schema_version": expected_version,
                "maintenance": false})
    );
    h.send(Req::get("/v1/accounts/abc").token(ADMIN)).await;
    h.send(Req::get("/v1/admin/audit").token(ADMIN)).await;
    let m = h.send(Req::get("/metrics")).await;
    assert_eq!(
        m.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    for line in [
        "# TYPE tollgate_http_requests_total counter",
        "tollgate_http_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"} 1",
        "tollgate_http_requests_total{method=\"GET\",route=\"/v1/accounts/{account_id}\",status=\"400\"} 1",
        "tollgate_http_requests_total{method=\"GET\",route=\"/v1/admin/audit\",status=\"200\"} 1",
        "tollgate_errors_total{code=\"invalid_path\"} 1",
        "tollgate_reclaim_leases_total 0",
    ] {
        assert!(m.text.lines().any(|l| l == line), "{line} in\n{}", m.text);
    }
    let doc = h.send(Req::get("/openapi.json")).await;
    assert_eq!(doc.ok(200)["openapi"], json!("3.1.0"));
    assert_eq!(
        doc.body,
        serde_json::to_value(api::openapi()).expect("json")
    );
}

/// Every service code in the table has the documented status.
pub fn service_codes_documented() {
    let mut seen = BTreeSet::new();
    for (code, status) in SERVICE_CODES {
        assert!(seen.insert(*code), "{code} twice");
        assert!((400..600).contains(status));
    }
    for code in AllocatorError::CODES {
        assert!(!seen.contains(code), "{code} in both tables");
    }
    let _ = Duration::ZERO;
}
