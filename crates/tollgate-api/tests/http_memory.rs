//! The HTTP cases against the memory store, plus failure mapping with stub
//! stores and clocks, the test-clock switch, the request timeout, and the
//! OpenAPI document against the router.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use serde_json::json;
use tollgate::{AllocatorError, PairError, RuleError, StorageError};
use tollgate_api::api;
use tollgate_api::dto::NS_PATTERN;
use tollgate_api::error::{SERVICE_CODES, storage_status};
use tollgate_api::storage::ServiceStore;
use tollgate_api::testkit::*;

tollgate_api::all_http_cases!(MemoryFactory);

#[test]
fn service_codes_documented() {
    tollgate_api::testkit::cases::service_codes_documented();
}

fn every_storage_error() -> Vec<AllocatorError> {
    use tollgate::{AccountId, LeaseId, LeaseState};
    let t = ts(T0);
    let pair_error = PairError::SubmicroOutOfRange { submicro_ns: 1000 };
    let rule_errors = vec![
        RuleError::InvalidUnits {
            units: 0,
            max: i64::MAX,
        },
        RuleError::InvalidTtl { ttl: dur(0, 0) },
        RuleError::UnrepresentableExpiry {
            now: t,
            ttl: dur(1, 0),
        },
        RuleError::DeadlineBeyondHorizon {
            grant_base: t,
            ttl: dur(1, 0),
            limit: t,
        },
        RuleError::InsufficientBalance {
            account_id: AccountId(1),
            requested: 2,
            available: 1,
        },
        RuleError::UnitsOverflow {
            account_id: AccountId(1),
        },
        RuleError::AccountNotFound {
            account_id: AccountId(1),
        },
        RuleError::LeaseNotFound {
            lease_id: LeaseId(1),
        },
        RuleError::CapabilityMismatch,
        RuleError::LeaseNotActive {
            lease_id: LeaseId(1),
            state: LeaseState::Released,
        },
        RuleError::LeaseReclaimable {
            lease_id: LeaseId(1),
            expiry: t,
            now: t,
        },
        RuleError::InvalidConsumed {
            consumed: 2,
            units: 1,
        },
        RuleError::IdempotencyConflict,
        RuleError::InvalidIdempotencyKey { max_len: 255 },
        RuleError::InvalidAccountName { max_len: 200 },
        RuleError::DuplicateLease {
            lease_id: LeaseId(1),
        },
        RuleError::LeaseAccountMismatch {
            lease_id: LeaseId(1),
            account_id: AccountId(1),
        },
        RuleError::InvalidLeaseCount {
            count: 0,
            max: 1000,
        },
        RuleError::InvalidLimit {
            limit: 0,
            max: 10_000,
        },
    ];
    let storage_errors = vec![
        StorageError::InvalidStoredInstant(pair_error),
        StorageError::PolicyMismatch(
            "the database records max_ttl PT1S, this process PT2S: restart it".into(),
        ),
        StorageError::HorizonExceeded {
            message: "expiry + grace is beyond cut + horizon by PT1S".into(),
        },
        StorageError::Unavailable {
            message: "connect to db.internal:5432 refused".into(),
        },
        StorageError::RetryExhausted { attempts: 8 },
        StorageError::Failure {
            message: "SELECT secret FROM x failed at db.internal".into(),
        },
    ];
    rule_errors
        .into_iter()
        .map(AllocatorError::from)
        .chain(storage_errors.into_iter().map(AllocatorError::from))
        .collect()
}

/// Every allocator code maps to its status over HTTP; the only 5xx are
/// backend failures, whose detail never leaks the backend's message, and
/// the lease-write guard's refusals, whose detail is the store's message
/// (it says what to do), and the transient `deadline_beyond_horizon` (a cut
/// too stale for the horizon to hold the new deadline).
#[tokio::test]
async fn failing_store_codes() {
    let expected: &[(&str, u16)] = &[
        ("invalid_units", 422),
        ("invalid_ttl", 422),
        ("unrepresentable_expiry", 422),
        ("deadline_beyond_horizon", 503),
        ("insufficient_balance", 409),
        ("units_overflow", 409),
        ("account_not_found", 404),
        ("lease_not_found", 404),
        ("capability_mismatch", 403),
        ("lease_not_active", 409),
        ("lease_reclaimable", 409),
        ("invalid_consumed", 422),
        ("idempotency_conflict", 409),
        ("invalid_idempotency_key", 400),
        ("invalid_account_name", 422),
        ("duplicate_lease", 422),
        ("lease_account_mismatch", 422),
        ("invalid_lease_count", 422),
        ("invalid_limit", 422),
        ("invalid_stored_instant", 500),
        ("policy_mismatch", 503),
        ("horizon_exceeded", 503),
        ("storage_unavailable", 503),
        ("retry_exhausted", 503),
        ("storage_failure", 500),
    ];
    let errors = every_storage_error();
    let codes: Vec<&str> = errors.iter().map(AllocatorError::code).collect();
    assert_eq!(
        codes,
        AllocatorError::CODES.to_vec(),
        "one error per code, in order"
    );
    assert_eq!(
        expected.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
        AllocatorError::CODES.to_vec()
    );
    for (e, (code, status)) in errors.into_iter().zip(expected) {
        assert_eq!(storage_status(&e).as_u16(), *status, "{code}");
        let h = Harness::over(failing_store(e.clone(), Duration::ZERO));
        let r = h
            .send(
                Req::post("/v1/accounts/1/deposits")
                    .token(ADMIN)
                    .json(json!({"units": 1})),
            )
            .await;
        r.problem(*status, code);
        let detail = r.body["detail"].as_str().expect("detail");
        if matches!(*code, "policy_mismatch" | "horizon_exceeded") {
            assert_eq!(detail, e.to_string());
        } else if *status >= 500 {
            assert!(
                !detail.contains("db.internal") && !detail.contains("SELECT"),
                "{detail}"
            );
        } else {
            assert_eq!(detail, e.to_string());
        }
        // Readiness answers even when the allocator fails.
        h.send(Req::get("/healthz")).await.ok(200);
    }
    // Through an account route the key check meets the same error first.
    let h = Harness::over(failing_store(
        StorageError::Unavailable {
            message: "down".into(),
        },
        Duration::ZERO,
    ));
    h.send(Req::get("/v1/accounts/1").token("tga1.x"))
        .await
        .problem(503, "storage_unavailable");
    h.send(Req::get("/v1/admin/audit").token(ADMIN))
        .await
        .problem(503, "storage_unavailable");
    h.send(Req::post("/v1/admin/reclaim").token(ADMIN))
        .await
        .problem(503, "storage_unavailable");
    // The service's own 5xx codes are backend failures too, or (written
    // by the connection layer) the service at its connection bound, or a
    // handler's panic answered as a problem.
    for (code, status) in SERVICE_CODES {
        if *status >= 500 {
            assert!(
                [
                    "clock_unavailable",
                    "time_uncertain",
                    "request_timeout",
                    "not_ready",
                    "too_many_connections",
                    "internal_failure"
                ]
                .contains(code),
                "{code}"
            );
        }
    }
}

/// A client that announces a body and does not send it: 408 `body_timeout`
/// (bad input is never a 5xx), and nothing changes.
#[tokio::test]
async fn body_not_sent_in_time_is_408() {
    use axum::body::Body;
    use futures_util::StreamExt;
    use tower::ServiceExt;
    let store = failing_store(RuleError::IdempotencyConflict, Duration::from_secs(5));
    let st = state(
        store,
        Arc::new(clock::TestClock::new(ts(T0))),
        Duration::from_millis(50),
    );
    let router = api::router(st);
    // A body stream that yields a prefix and then never ends.
    let stream = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(
        axum::body::Bytes::from_static(b"{\"name\":"),
    )])
    .chain(futures_util::stream::pending());
    let req = axum::http::Request::post("/v1/accounts")
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("request");
    let resp = router.oneshot(req).await.expect("infallible");
    assert_eq!(resp.status().as_u16(), 408);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .expect("body");
    let v: serde_json::Value = serde_json::from_slice(&body).expect("problem json");
    assert_eq!(v["code"], json!("body_timeout"));
    assert_eq!(v["status"], json!(408));
    assert_eq!(
        v["detail"],
        json!("the request body did not arrive within 50ms")
    );
}

/// A body that announces `len` bytes (an exact size hint, as a
/// `Content-Length` gives) and never sends one.
struct Announced {
    len: u64,
}

impl axum::body::HttpBody for Announced {
    type Data = axum::body::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Pending
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.len)
    }
}

/// A body announced larger than the limit is refused with 413
/// `payload_too_large` and `Connection: close` at once, without waiting
/// for it (the request bound is 30 s; the answer must come well before);
/// one announced at the limit is waited for as before (408 after the
/// bound).
#[tokio::test]
async fn body_announced_over_the_limit_is_413_at_once() {
    use axum::body::Body;
    use tower::ServiceExt;
    let limit = u64::try_from(api::BODY_LIMIT_BYTES).expect("fits");
    for (len, bound, status) in [
        (52_428_800, Duration::from_secs(30), 413),
        (1 << 63, Duration::from_secs(30), 413),
        (u64::MAX, Duration::from_secs(30), 413),
        (limit + 1, Duration::from_secs(30), 413),
        (limit, Duration::from_millis(50), 408),
    ] {
        let store = failing_store(RuleError::IdempotencyConflict, Duration::from_secs(5));
        let router = api::router(state(store, Arc::new(clock::TestClock::new(ts(T0))), bound));
        let req = axum::http::Request::post("/v1/accounts")
            .header("authorization", format!("Bearer {ADMIN}"))
            .header("content-type", "application/json")
            .body(Body::new(Announced { len }))
            .expect("request");
        let resp = tokio::time::timeout(Duration::from_secs(5), router.oneshot(req))
            .await
            .unwrap_or_else(|_| panic!("{len}: no answer within 5 s"))
            .expect("infallible");
        assert_eq!(resp.status().as_u16(), status, "{len}");
        let close = resp
            .headers()
            .get("connection")
            .map(|v| v.as_bytes().to_vec());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .expect("body");
        if status == 413 {
            assert_eq!(close.as_deref(), Some(&b"close"[..]), "{len}");
            assert_eq!(
                std::str::from_utf8(&body).expect("utf-8"),
                r#"{"type":"urn:tollgate:problem:payload_too_large","title":"Payload too large","status":413,"detail":"request body exceeds 65536 bytes","code":"payload_too_large"}"#,
                "{len}"
            );
        }
    }
}

/// A store slower than the request bound: 503 `request_timeout`.
#[tokio::test]
async fn request_timeout() {
    let store = failing_store(RuleError::IdempotencyConflict, Duration::from_secs(5));
    let st = state(
        store,
        Arc::new(clock::TestClock::new(ts(T0))),
        Duration::from_millis(50),
    );
    let router = api::router(st);
    let r = send(
        &router,
        Req::post("/v1/accounts/1/deposits")
            .token(ADMIN)
            .json(json!({"units": 1})),
    )
    .await;
    r.problem(503, "request_timeout");
    assert_eq!(
        r.body["detail"],
        json!("request did not finish within 50ms")
    );
}

/// A clock that cannot be read at all refuses every time-dependent
/// operation with 503 `clock_unavailable` (the safe cut's database down).
#[tokio::test]
async fn unreadable_clock() {
    let store = ServiceStore::memory(
        default_policy(),
        tollgate::CapabilityKey::generate().expect("key"),
    )
    .expect("memory");
    let router = api::router(state(
        store,
        Arc::new(UnreadableClock),
        Duration::from_secs(5),
    ));
    let created = send(
        &router,
        Req::post("/v1/accounts")
            .token(ADMIN)
            .json(json!({"name": "a"})),
    )
    .await;
    let key = created.ok(201)["api_key"]
        .as_str()
        .expect("key")
        .to_string();
    send(
        &router,
        Req::post("/v1/accounts/1/deposits")
            .token(ADMIN)
            .json(json!({"units": 5})),
    )
    .await
    .problem(503, "clock_unavailable");
    send(
        &router,
        Req::post("/v1/accounts/1/leases")
            .token(&key)
            .json(json!({"units": 1, "ttl": "PT1S"})),
    )
    .await
    .problem(503, "clock_unavailable");
    send(&router, Req::post("/v1/admin/reclaim").token(ADMIN))
        .await
        .problem(503, "clock_unavailable");
    send(&router, Req::get("/v1/accounts/1").token(&key))
        .await
        .ok(200);
}

/// Without `--clock test` the test clock cannot be set.
#[tokio::test]
async fn test_clock_disabled() {
    let store = ServiceStore::memory(
        default_policy(),
        tollgate::CapabilityKey::generate().expect("key"),
    )
    .expect("memory");
    let router = api::router(state(store, system_clock(), Duration::from_secs(5)));
    send(
        &router,
        Req::put("/v1/admin/test-clock")
            .token(ADMIN)
            .json(json!({"now": T0})),
    )
    .await
    .problem(409, "test_clock_disabled");
    send(
        &router,
        Req::put("/v1/admin/test-clock")
            .token("tga1.nope")
            .json(json!({"now": T0})),
    )
    .await
    .problem(403, "forbidden");
    let st = send(&router, Req::get("/v1/admin/status").token(ADMIN)).await;
    assert_eq!(st.ok(200)["clock"], json!("system"));
}

const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/accounts"),
    ("GET", "/v1/accounts/{account_id}"),
    ("POST", "/v1/accounts/{account_id}/deposits"),
    ("POST", "/v1/accounts/{account_id}/leases"),
    ("POST", "/v1/accounts/{account_id}/consolidations"),
    ("GET", "/v1/leases/{lease_id}"),
    ("POST", "/v1/leases/{lease_id}/renew"),
    ("POST", "/v1/leases/{lease_id}/release"),
    ("POST", "/v1/admin/reclaim"),
    ("GET", "/v1/admin/audit"),
    ("GET", "/v1/admin/status"),
    ("PUT", "/v1/admin/test-clock"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

/// The OpenAPI document lists exactly the service's routes ([`ROUTES`]),
/// and the router serves exactly those (method, path) pairs: every
/// documented pair is routed, every other method on those paths is 405.
#[tokio::test]
async fn openapi_matches_router() {
    let doc = serde_json::to_value(api::openapi()).expect("json");
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            if [
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                documented.insert((method.to_uppercase(), path.clone()));
                let responses = op["responses"].as_object().expect("responses");
                assert!(
                    responses.keys().any(|s| s.starts_with('2')),
                    "{method} {path}"
                );
                // The connection layer's problems, on every route.
                for s in ["414", "431", "503"] {
                    assert_eq!(
                        responses[s]["content"]["application/problem+json"]["schema"]["$ref"],
                        json!("#/components/schemas/Problem"),
                        "{method} {path} {s}"
                    );
                }
                if path.starts_with("/v1/") {
                    for s in [
                        "400", "401", "403", "404", "409", "413", "414", "415", "422", "431",
                        "500", "503",
                    ] {
                        assert_eq!(
                            responses[s]["content"]["application/problem+json"]["schema"]["$ref"],
                            json!("#/components/schemas/Problem"),
                            "{method} {path} {s}"
                        );
                    }
                    assert_eq!(op["security"], json!([{"bearer": []}]), "{method} {path}");
                    // Path ids are positive.
                    for p in op["parameters"].as_array().into_iter().flatten() {
                        if p["in"] == json!("path") {
                            assert_eq!(p["schema"]["minimum"], json!(1), "{method} {path}");
                        }
                    }
                }
            }
        }
    }
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, expected);
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"],
        json!({"type": "http", "scheme": "bearer", "description": "The admin token, an account API key (`tga1.`...) or a lease capability (`tgc1.`...), per route."})
    );

    let h = Harness::new(&MemoryFactory, default_policy()).await;
    let methods = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ];
    let paths: BTreeSet<&str> = ROUTES.iter().map(|(_, p)| *p).collect();
    for path in paths {
        let concrete = path.replace("{account_id}", "1").replace("{lease_id}", "1");
        for method in &methods {
            let r = h.send(Req::new(method.clone(), &concrete)).await;
            let code = r.body["code"].as_str().unwrap_or("");
            let routed = expected.contains(&(method.to_string(), path.to_string()));
            if routed {
                assert!(
                    code != "not_found" && code != "method_not_allowed",
                    "{method} {concrete}: {}",
                    r.text
                );
            } else {
                assert_eq!(
                    code, "method_not_allowed",
                    "{method} {concrete}: {}",
                    r.text
                );
            }
        }
    }
}

#[derive(Debug)]
struct Maintenance;

#[async_trait::async_trait]
impl tollgate_api::storage::StoreOps for Maintenance {
    fn kind(&self) -> &'static str {
        "postgres"
    }
    async fn readiness(&self) -> tollgate_api::storage::Readiness {
        tollgate_api::storage::Readiness {
            store: "postgres",
            reachable: true,
            schema_version: Some(16),
            expected_schema_version: Some(17),
            maintenance: true,
            detail: None,
        }
    }
    async fn counts(&self) -> Result<tollgate_api::storage::StatusCounts, StorageError> {
        Ok(tollgate_api::storage::StatusCounts {
            active_leases: 3,
            active_legacy_bounds: 2,
        })
    }
}

/// `/readyz` refuses traffic during maintenance or at the wrong schema
/// version; `/healthz` still answers; status reports counts.
#[tokio::test]
async fn not_ready_during_maintenance() {
    let memory = ServiceStore::memory(
        default_policy(),
        tollgate::CapabilityKey::generate().expect("key"),
    )
    .expect("memory");
    let store = ServiceStore {
        allocator: memory.allocator,
        ops: Arc::new(Maintenance),
    };
    let h = Harness::over(store);
    let r = h.send(Req::get("/readyz")).await;
    r.problem(503, "not_ready");
    assert_eq!(
        r.body["detail"],
        json!("not ready: schema version 16, expected 17; maintenance in progress")
    );
    h.send(Req::get("/healthz")).await.ok(200);
    let mut st = h
        .send(Req::get("/v1/admin/status").token(ADMIN))
        .await
        .ok(200)
        .clone();
    // The telemetry parts are the same as for a healthy store
    // (`audit_and_status`).
    let o = st.as_object_mut().expect("object");
    assert_eq!(o.remove("safe_time"), Some(serde_json::Value::Null));
    assert!(o.remove("paused").is_some() && o.remove("late_expiry").is_some());
    assert_eq!(
        st,
        json!({
            "readiness": {"ready": false, "store": "postgres", "storage_reachable": true,
                          "schema_version": 16, "expected_schema_version": 17, "maintenance": true},
            "active_leases": 3, "active_legacy_bounds": 2,
            "policy": {"max_ttl": "PT1M", "max_ttl_ns": "60000000000",
                       "reclaim_grace": "PT5S", "reclaim_grace_ns": "5000000000"},
            "clock": "test"
        })
    );
}

/// While the clock's reading is uncertain: acquire, consolidation and
/// reclaim are refused with 503 `time_uncertain` (reason, Retry-After) and
/// write nothing; deposit, release and renewal run at the reading's instant,
/// and a renewal keeps the later of its expiry and `now + ttl`.
#[tokio::test]
async fn uncertain_reading_pauses_admission_and_reclaim() {
    use clock::UncertainReason;
    let store = ServiceStore::memory(
        default_policy(),
        tollgate::CapabilityKey::generate().expect("key"),
    )
    .expect("memory");
    let clock = Arc::new(UncertainTestClock {
        clock: clock::TestClock::new(ts(T0)),
        uncertain: std::sync::Mutex::new(None),
    });
    let st = state(store.clone(), clock.clone(), Duration::from_secs(5));
    let h = Harness {
        router: api::router(st.clone()),
        state: st,
        clock: Arc::new(clock::TestClock::new(ts(T0))),
        store,
    };
    let (a, key) = h.account("a", 100).await;
    let g1 = h.acquire(a, &key, 10, "PT30S").await;
    let g2 = h.acquire(a, &key, 20, "PT30S").await;
    let g3 = h.acquire(a, &key, 5, "PT1S").await;
    let cap = |g: &serde_json::Value| g["capability"].as_str().expect("cap").to_string();
    let id = |g: &serde_json::Value| g["lease_id"].as_i64().expect("id");
    *clock.uncertain.lock().expect("lock") = Some(UncertainReason::Recovering);
    clock.clock.set(ts("2026-11-29T12:00:10Z"));
    let entries = h.ledger_len().await;
    h.send(
        Req::post(format!("/v1/accounts/{a}/leases"))
            .token(&key)
            .json(json!({"units": 1, "ttl": "PT1S"})),
    )
    .await
    .uncertain("recovering", "7");
    h.send(
        Req::post(format!("/v1/accounts/{a}/consolidations"))
            .token(&key)
            .json(json!({"ttl": "PT10S", "leases": [
                {"lease_id": id(&g1), "capability": cap(&g1)},
                {"lease_id": id(&g2), "capability": cap(&g2)}]})),
    )
    .await
    .uncertain("recovering", "7");
    // Lease 3 is past expiry + grace (12:00:06), yet nothing is reclaimed.
    h.send(Req::post("/v1/admin/reclaim").token(ADMIN))
        .await
        .uncertain("recovering", "7");
    assert_eq!(h.ledger_len().await, entries);
    // Renewal at 12:00:10: PT10S would end before 12:00:30, so the expiry
    // stays; PT1M ends later, so it extends.
    for (ttl, expiry) in [
        ("PT10S", "2026-11-29T12:00:30Z"),
        ("PT1M", "2026-11-29T12:01:10Z"),
    ] {
        let r = h
            .send(
                Req::post(format!("/v1/leases/{}/renew", id(&g2)))
                    .token(&cap(&g2))
                    .json(json!({"ttl": ttl})),
            )
            .await;
        assert_eq!(r.ok(200)["expiry"], json!(expiry), "{ttl}");
    }
    let s = h
        .send(
            Req::post(format!("/v1/leases/{}/release", id(&g1)))
                .token(&cap(&g1))
                .json(json!({"consumed": 4})),
        )
        .await;
    assert_eq!(s.ok(200)["settled_at"], json!("2026-11-29T12:00:10Z"));
    let m = h.send(Req::get("/metrics")).await;
    for line in [
        "tollgate_safetime_paused_total{operation=\"acquire\"} 1",
        "tollgate_safetime_paused_total{operation=\"consolidate\"} 1",
        "tollgate_safetime_paused_total{operation=\"reclaim\"} 1",
        "tollgate_errors_total{code=\"time_uncertain\"} 3",
        "tollgate_reclaim_late_seconds_count 0",
    ] {
        assert!(m.text.lines().any(|l| l == line), "{line} in\n{}", m.text);
    }
    // Certain again: lease 3 (reclaimable from 12:00:06) is reclaimed 4 s
    // late.
    *clock.uncertain.lock().expect("lock") = None;
    let r = h.send(Req::post("/v1/admin/reclaim").token(ADMIN)).await;
    assert_eq!(r.ok(200)["reclaimed"], json!([id(&g3)]));
    let m = h.send(Req::get("/metrics")).await;
    for line in [
        "tollgate_reclaim_late_seconds_bucket{le=\"1\"} 0",
        "tollgate_reclaim_late_seconds_bucket{le=\"10\"} 1",
        "tollgate_reclaim_late_seconds_sum 4",
        "tollgate_reclaim_late_seconds_count 1",
    ] {
        assert!(m.text.lines().any(|l| l == line), "{line} in\n{}", m.text);
    }
    h.assert_audit_clean().await;
}

/// A safe-cut clock in its initial quarantine: every reading uncertain
/// (`initial_quarantine`), its last reading the row `row`.
#[derive(Debug)]
struct QuarantinedClock {
    row: clock::CutRow,
}

#[async_trait::async_trait]
impl clock::Clock for QuarantinedClock {
    async fn read(&self) -> Result<clock::ClockReading, clock::ClockError> {
        Ok(clock::ClockReading {
            uncertain: Some(clock::UncertainReason::InitialQuarantine),
            ..clock::ClockReading::certain(self.row.cut)
        })
    }
    fn kind(&self) -> clock::ClockKind {
        clock::ClockKind::SafeCut
    }
    fn retry_after_secs(&self) -> u64 {
        5
    }
    fn safe_time(&self) -> Option<clock::SafeTimeStatus> {
        Some(clock::SafeTimeStatus {
            uncertain: Some(clock::UncertainReason::InitialQuarantine),
            read_error: false,
            read_errors_total: 0,
            row: Some(self.row.clone()),
            gap_max: safetime::DEFAULT_GAP_MAX,
        })
    }
}

/// In the initial quarantine an acquire is refused with `time_uncertain`
/// (`initial_quarantine`) whose detail says, exactly, how much trusted time
/// the proof still needs (the default 3,650-day horizon plus the 50 ppm
/// drift allowance, less the day and half second observed) and how to
/// shorten it: a horizon of at least max_ttl + grace + gap (70,000 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_quarantine_says_what_it_still_needs() {
    let horizon_ms = safetime::DEFAULT_HORIZON_MS;
    assert_eq!(horizon_ms, 315_360_000_000);
    let policy = safetime::HorizonPolicy::verified(
        1,
        horizon_ms,
        &safetime::HorizonPolicy::digest_of(1, horizon_ms),
    )
    .expect("the default policy");
    let row = clock::CutRow {
        epoch: 1,
        cut: jiff::Timestamp::UNIX_EPOCH,
        uncertain: Some(clock::UncertainReason::InitialQuarantine),
        quarantined: true,
        publish_seq: 86_401,
        published_at: ts("2026-11-30T12:00:00.5Z"),
        proof_started_at: ts("2026-11-29T12:00:00Z"),
        db_now: ts("2026-11-30T12:00:00.5Z"),
        policy,
    };
    let store = ServiceStore::memory(
        default_policy(),
        tollgate::CapabilityKey::generate().expect("key"),
    )
    .expect("memory");
    let st = state(
        store.clone(),
        Arc::new(QuarantinedClock { row }),
        Duration::from_secs(5),
    );
    let h = Harness {
        router: api::router(st.clone()),
        state: st,
        clock: Arc::new(clock::TestClock::new(ts(T0))),
        store,
    };
    let (a, key) = h.account("a", 100).await;
    let entries = h.ledger_len().await;
    let r = h
        .send(
            Req::post(format!("/v1/accounts/{a}/leases"))
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT1S"})),
        )
        .await;
    r.uncertain("initial_quarantine", "5");
    assert_eq!(
        r.body["detail"],
        json!(
            "the safe expiry cut is uncertain (initial_quarantine): nothing that admits or \
             expires a deadline runs until it is certain again; the initial quarantine needs \
             PT87580H22M48.288439422S more of uninterrupted trusted time (a proof of \
             PT87604H22M48.788439422S in all: the sealed horizon PT87600H plus the 50 ppm drift \
             allowance; PT24H0.5S observed since it began; an anomaly, a sampler restart or a \
             takeover restarts it). To shorten it safely: stop every sampler, seal a shorter \
             horizon (at least 70000 ms, this service's max_ttl + reclaim_grace + \
             safetime_gap_max, and no shorter than any active lease's granted TTL plus \
             grace) with `tollgate-safetime policy seal --horizon-ms <ms> \
             --sealed-by <name>`, then start the samplers again; the next epoch's proof runs \
             for the new horizon"
        )
    );
    assert_eq!(h.ledger_len().await, entries);
}

/// Every instant (`format: date-time`) and every duration of the OpenAPI
/// document has its lossless companion `<name>_ns`: a string (nullable
/// exactly when the instant or duration is) with the pattern
/// `^-?[0-9]+$`, and every `_ns` property is such a companion.
#[test]
fn every_instant_and_duration_has_a_lossless_companion() {
    let doc = serde_json::to_value(api::openapi()).expect("json");
    // ISO 8601 durations are plain strings in the schema: named here.
    const DURATIONS: &[&str] = &[
        "granted_ttl",
        "requested_ttl",
        "expires_in",
        "max_ttl",
        "reclaim_grace",
        "cut_lag",
        "horizon",
        "gap_max",
        "le",
        "sum",
    ];
    // Request bodies take ISO 8601 TTL strings, which no client truncates.
    const REQUEST_TTLS: &[(&str, &str)] = &[
        ("AcquireBody", "ttl"),
        ("RenewBody", "ttl"),
        ("ConsolidateBody", "ttl"),
    ];
    let mut companions = 0;
    for (schema, def) in doc["components"]["schemas"].as_object().expect("schemas") {
        let Some(props) = def["properties"].as_object() else {
            continue;
        };
        for (name, prop) in props {
            let is_instant = prop["format"] == json!("date-time");
            let is_duration = DURATIONS.contains(&name.as_str());
            if let Some(base) = name.strip_suffix("_ns") {
                assert!(props.contains_key(base), "{schema}.{name} has no {base}");
                assert_eq!(prop["pattern"], json!(NS_PATTERN), "{schema}.{name}");
                let nullable = props[base]["type"].is_array();
                let expected = if nullable {
                    json!(["string", "null"])
                } else {
                    json!("string")
                };
                assert_eq!(prop["type"], expected, "{schema}.{name}");
                companions += 1;
            } else if is_instant || is_duration {
                assert!(
                    props.contains_key(&format!("{name}_ns")),
                    "{schema}.{name} has no {name}_ns"
                );
            } else {
                assert!(
                    !REQUEST_TTLS.contains(&(schema.as_str(), name.as_str()))
                        || prop["format"].is_null(),
                    "{schema}.{name}"
                );
            }
        }
    }
    // GrantView 4, LeaseView 2, RenewalView 4, SettlementView 1,
    // ReclaimView 2, ClockView 1, TestClockBody 1, PolicyView 2,
    // SafeTimeView 6, LateExpiryView 1, LateBucketView 1.
    assert_eq!(companions, 25);
    // The renewal's and the grant's own facts are documented.
    let s = &doc["components"]["schemas"];
    assert_eq!(
        s["RenewalView"]["properties"]["extended"]["type"],
        json!("boolean")
    );
    for view in ["RenewalView", "GrantView"] {
        assert_eq!(
            s[view]["properties"]["ttl_clamped"]["type"],
            json!("boolean"),
            "{view}"
        );
        for field in ["ttl_clamped", "requested_ttl", "requested_ttl_ns"] {
            assert!(
                s[view]["required"]
                    .as_array()
                    .expect("required")
                    .contains(&json!(field)),
                "{view}.{field}"
            );
        }
    }
}

/// A clock that reads `clock` until `down` is set, then fails as a safe-cut
/// clock whose database does not answer.
#[derive(Debug)]
struct DatabaseDownClock {
    clock: clock::TestClock,
    down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl clock::Clock for DatabaseDownClock {
    async fn read(&self) -> Result<clock::ClockReading, clock::ClockError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(clock::ClockError::StorageUnavailable(
                "the database did not answer".into(),
            ));
        }
        self.clock.read().await
    }
    fn kind(&self) -> clock::ClockKind {
        clock::ClockKind::SafeCut
    }
}

/// `GET /v1/leases/{id}` on a clock whose database does not answer is 503
/// `storage_unavailable` from the clock's one bounded wait, without a second
/// wait on the store (the memory store here would answer, so a 200 would
/// show the store was asked) and before the capability is judged: a lease's
/// own capability and another lease's both get the 503.
#[tokio::test]
async fn lease_show_with_the_clock_database_down_is_storage_unavailable() {
    let store = ServiceStore::memory(
        default_policy(),
        tollgate::CapabilityKey::generate().expect("key"),
    )
    .expect("memory");
    let clock = Arc::new(DatabaseDownClock {
        clock: clock::TestClock::new(ts(T0)),
        down: std::sync::atomic::AtomicBool::new(false),
    });
    let router = api::router(state(store, clock.clone(), Duration::from_secs(5)));
    let created = send(
        &router,
        Req::post("/v1/accounts")
            .token(ADMIN)
            .json(json!({"name": "a"})),
    )
    .await;
    let key = created.ok(201)["api_key"]
        .as_str()
        .expect("key")
        .to_string();
    send(
        &router,
        Req::post("/v1/accounts/1/deposits")
            .token(ADMIN)
            .json(json!({"units": 5})),
    )
    .await
    .ok(200);
    let mut caps = Vec::new();
    for _ in 0..2 {
        let grant = send(
            &router,
            Req::post("/v1/accounts/1/leases")
                .token(&key)
                .json(json!({"units": 1, "ttl": "PT30S"})),
        )
        .await;
        caps.push(
            grant.ok(201)["capability"]
                .as_str()
                .expect("cap")
                .to_string(),
        );
    }
    // While the clock answers, another lease's capability is refused.
    send(&router, Req::get("/v1/leases/1").token(&caps[1]))
        .await
        .problem(403, "capability_mismatch");
    clock.down.store(true, std::sync::atomic::Ordering::SeqCst);
    send(&router, Req::get("/v1/leases/1").token(&caps[0]))
        .await
        .problem(503, "storage_unavailable");
    send(&router, Req::get("/v1/leases/1").token(&caps[1]))
        .await
        .problem(503, "storage_unavailable");
}
