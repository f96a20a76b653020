//! Refusals decided before the store is asked for anything but a key
//! lookup: credentials, headers, bodies, paths, queries, bounds, and
//! admission on an uncertain cut. The store here records every call and
//! fails each that is not a key lookup, so "nothing written" is exact:
//! no mutating call reached the store at all.

mod support;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clock::UncertainReason;
use lc_api::ServiceOptions;
use lc_api::auth::{AdminDigest, ServerSecret};
use lc_core::error::LcError;
use lc_core::model::{
    CutReading, Digest, ExecId, ExecRecord, ExecRequest, OpScope, OperationRecord, OutputPage,
    Runtime, Tenant, TenantId,
};
use lc_core::opkey::OperationKey;
use lc_core::store::ControlStore;
use serde_json::json;
use support::*;

/// Knows tenants 1 and 2 by their keys; records and fails everything else.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<&'static str>>,
}

impl Recorder {
    fn record(&self, name: &'static str) -> LcError {
        self.calls.lock().unwrap().push(name);
        LcError::StorageFailure {
            message: format!("{name} must not be reached"),
        }
    }
    fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap().clone()
    }
}

fn secret() -> ServerSecret {
    ServerSecret::new(&SECRET).unwrap()
}

#[async_trait]
impl ControlStore for Recorder {
    async fn create_tenant(
        &self,
        _: &OperationKey,
        _: CutReading,
        _: &str,
        _: Option<i64>,
        _: &(dyn Fn(TenantId) -> Digest + Send + Sync),
    ) -> Result<Tenant, LcError> {
        Err(self.record("create_tenant"))
    }
    async fn deposit(
        &self,
        _: &OperationKey,
        _: CutReading,
        _: TenantId,
        _: i64,
    ) -> Result<Tenant, LcError> {
        Err(self.record("deposit"))
    }
    async fn tenant(&self, _: TenantId) -> Result<Tenant, LcError> {
        Err(self.record("tenant"))
    }
    async fn tenant_by_key(&self, d: Digest) -> Result<Option<TenantId>, LcError> {
        let s = secret();
        Ok([1, 2]
            .into_iter()
            .map(TenantId)
            .find(|t| Digest(s.tenant_api_key_sha256(*t)) == d))
    }
    async fn register_runtime(
        &self,
        _: &OperationKey,
        _: CutReading,
        _: &str,
        _: Digest,
        _: serde_json::Value,
    ) -> Result<Runtime, LcError> {
        Err(self.record("register_runtime"))
    }
    async fn runtimes(&self) -> Result<Vec<Runtime>, LcError> {
        Err(self.record("runtimes"))
    }
    /// As the contract says for a new key: an uncertain reading is
    /// refused with the reading's `Retry-After`, nothing written.
    async fn admit_exec(
        &self,
        _: &OperationKey,
        at: CutReading,
        _: TenantId,
        _: &ExecRequest,
    ) -> Result<ExecRecord, LcError> {
        if !at.certain {
            self.calls.lock().unwrap().push("admit_exec(uncertain)");
            return Err(LcError::TimeUncertain {
                retry_after_s: at.retry_after_s,
            });
        }
        Err(self.record("admit_exec"))
    }
    async fn exec(&self, _: TenantId, _: ExecId) -> Result<ExecRecord, LcError> {
        Err(self.record("exec"))
    }
    async fn execs(
        &self,
        _: TenantId,
        _: Option<ExecId>,
        _: usize,
    ) -> Result<Vec<ExecRecord>, LcError> {
        Err(self.record("execs"))
    }
    async fn output(
        &self,
        _: TenantId,
        _: ExecId,
        _: i64,
        _: usize,
    ) -> Result<Vec<OutputPage>, LcError> {
        Err(self.record("output"))
    }
    async fn cancel(
        &self,
        _: &OperationKey,
        _: CutReading,
        _: TenantId,
        _: ExecId,
    ) -> Result<ExecRecord, LcError> {
        Err(self.record("cancel"))
    }
    async fn operation(&self, _: OpScope, _: &str) -> Result<OperationRecord, LcError> {
        Err(self.record("operation"))
    }
}

struct Svc {
    router: axum::Router,
    store: Arc<Recorder>,
    clock: Arc<ScriptedClock>,
}

fn svc() -> Svc {
    let store = Arc::new(Recorder::default());
    let clock = Arc::new(ScriptedClock::new(ts("2026-12-01T10:00:00Z"), 3));
    let (router, _) = lc_api::build(
        store.clone(),
        clock.clone(),
        AdminDigest::of_token(ADMIN).unwrap(),
        secret(),
        ServiceOptions::default(),
    );
    Svc {
        router,
        store,
        clock,
    }
}

fn key1() -> String {
    secret().tenant_api_key(TenantId(1))
}

fn exec_body() -> serde_json::Value {
    json!({"runtime": "base", "shape": "small", "command": ["true"]})
}

#[tokio::test]
async fn credentials_are_checked_before_anything_else() {
    let s = svc();
    // No credential: 401 with the challenge, on every protected route.
    for req in [
        Req::post("/v1/tenants").key("k").json(json!({"name": "a"})),
        Req::get("/v1/tenants/1"),
        Req::post("/v1/execs").key("k").json(exec_body()),
        Req::get("/v1/execs"),
        Req::get("/v1/execs/1"),
        Req::get("/v1/execs/1/output"),
        Req::post("/v1/execs/1/cancel").key("k"),
        Req::get("/v1/runtimes"),
        Req::get("/v1/operations/k"),
    ] {
        let r = send(&s.router, req).await;
        r.problem(401, "unauthenticated");
        assert_eq!(
            r.headers["www-authenticate"],
            "Bearer realm=\"little-compute\""
        );
    }
    // An unknown token on a tenant route: 401, after one key lookup at most.
    send(
        &s.router,
        Req::get("/v1/execs").token(&format!("lc_{}", "A".repeat(43))),
    )
    .await
    .problem(401, "unauthenticated");
    send(&s.router, Req::get("/v1/execs").token("not-a-key-at-all"))
        .await
        .problem(401, "unauthenticated");
    // A tenant key on admin routes: 403, nothing looked up.
    for req in [
        Req::post("/v1/tenants").key("k").json(json!({"name": "a"})),
        Req::post("/v1/tenants/1/deposits")
            .key("k")
            .json(json!({"units": 1})),
        Req::post("/v1/runtimes?name=x")
            .key("k")
            .raw(vec![0u8; 512], Some("application/x-tar")),
    ] {
        send(&s.router, req.token(&key1()))
            .await
            .problem(403, "forbidden")
            .detail("this credential may not perform this operation");
    }
    // Tenant 1's key for tenant 2: 403 on its balances and as Lc-Tenant.
    send(&s.router, Req::get("/v1/tenants/2").token(&key1()))
        .await
        .problem(403, "forbidden");
    send(&s.router, Req::get("/v1/tenants/99").token(&key1()))
        .await
        .problem(403, "forbidden");
    send(&s.router, Req::get("/v1/execs").token(&key1()).tenant(2))
        .await
        .problem(403, "forbidden");
    // The admin token on a tenant route needs Lc-Tenant.
    send(&s.router, Req::get("/v1/execs").token(ADMIN))
        .await
        .problem(400, "tenant_required");
    send(
        &s.router,
        Req::get("/v1/execs").token(ADMIN).header("Lc-Tenant", "01"),
    )
    .await
    .problem(400, "invalid_header");
    send(
        &s.router,
        Req::get("/v1/execs").token(ADMIN).tenant(1).tenant(1),
    )
    .await
    .problem(400, "invalid_header");
    assert_eq!(s.store.calls(), Vec::<&str>::new());
}

#[tokio::test]
async fn every_post_needs_a_valid_idempotency_key() {
    let s = svc();
    for req in [
        Req::post("/v1/tenants")
            .token(ADMIN)
            .json(json!({"name": "a"})),
        Req::post("/v1/tenants/1/deposits")
            .token(ADMIN)
            .json(json!({"units": 1})),
        Req::post("/v1/execs").token(&key1()).json(exec_body()),
        Req::post("/v1/execs/1/cancel").token(&key1()),
        Req::post("/v1/runtimes?name=x")
            .token(ADMIN)
            .raw(vec![0u8; 512], Some("application/x-tar")),
    ] {
        send(&s.router, req)
            .await
            .problem(400, "idempotency_key_required");
    }
    for bad in [
        String::new(),
        "k".repeat(256),
        "tab\there".into(),
        "é".into(),
    ] {
        send(
            &s.router,
            Req::post("/v1/execs")
                .token(&key1())
                .json(exec_body())
                .key(&bad),
        )
        .await
        .problem(400, "invalid_operation_key");
    }
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key1())
            .json(exec_body())
            .key("a")
            .key("b"),
    )
    .await
    .problem(400, "invalid_header");
    assert_eq!(s.store.calls(), Vec::<&str>::new());
}

#[tokio::test]
async fn bad_bodies_paths_and_queries_are_typed_refusals() {
    let s = svc();
    let post = || Req::post("/v1/execs").token(&key1()).key("k1");
    send(&s.router, post()).await.problem(400, "invalid_json");
    send(&s.router, post().raw("{", Some("application/json")))
        .await
        .problem(400, "invalid_json");
    send(&s.router, post().raw("{}", Some("text/plain")))
        .await
        .problem(415, "unsupported_media_type");
    send(
        &s.router,
        post().json(json!({"runtime": "base", "shape": "small"})),
    )
    .await
    .problem(422, "invalid_body")
    .detail("missing field `command` at line 1 column 34");
    send(
        &s.router,
        post().json(json!({"runtime": "base", "shape": "small", "command": ["true"], "env": {}})),
    )
    .await
    .problem(422, "invalid_body");
    send(
        &s.router,
        post().json(json!({"runtime": "base", "shape": "small", "command": "true"})),
    )
    .await
    .problem(422, "invalid_body");
    // Over the JSON bound: 413 naming it.
    let big = json!({"runtime": "base", "shape": "small", "command": ["x".repeat(600 * 1024)]});
    send(&s.router, post().json(big))
        .await
        .problem(413, "payload_too_large")
        .detail("request body exceeds 524288 bytes");
    // Paths.
    for p in [
        "/v1/execs/0",
        "/v1/execs/01",
        "/v1/execs/-1",
        "/v1/execs/x",
        "/v1/execs/9223372036854775808",
    ] {
        send(&s.router, Req::get(p).token(&key1()))
            .await
            .problem(400, "invalid_path");
    }
    send(&s.router, Req::get("/v1/tenants/0").token(ADMIN))
        .await
        .problem(400, "invalid_path");
    send(&s.router, Req::get("/v1/operations/%09").token(ADMIN))
        .await
        .problem(400, "invalid_path");
    // Queries.
    for q in ["after=x", "limit=-1", "after=-1", "bogus=1"] {
        send(&s.router, Req::get(format!("/v1/execs?{q}")).token(&key1()))
            .await
            .problem(400, "invalid_query");
    }
    send(&s.router, Req::get("/v1/execs?limit=0").token(&key1()))
        .await
        .problem(422, "invalid_limit");
    send(&s.router, Req::get("/v1/execs?limit=1001").token(&key1()))
        .await
        .problem(422, "invalid_limit");
    send(
        &s.router,
        Req::get("/v1/execs/1/output?after_seq=-1").token(&key1()),
    )
    .await
    .problem(400, "invalid_query");
    send(
        &s.router,
        Req::get("/v1/execs/1/output?limit=65").token(&key1()),
    )
    .await
    .problem(422, "invalid_limit");
    // Runtime import: a tarball body and a valid name.
    send(
        &s.router,
        Req::post("/v1/runtimes?name=x")
            .token(ADMIN)
            .key("k")
            .json(json!({})),
    )
    .await
    .problem(415, "unsupported_media_type")
    .detail("a runtime is imported as an application/x-tar body");
    send(
        &s.router,
        Req::post("/v1/runtimes")
            .token(ADMIN)
            .key("k")
            .raw(vec![0u8; 512], Some("application/x-tar")),
    )
    .await
    .problem(400, "invalid_query");
    send(
        &s.router,
        Req::post("/v1/runtimes?name=")
            .token(ADMIN)
            .key("k")
            .raw(vec![0u8; 512], Some("application/x-tar")),
    )
    .await
    .problem(422, "invalid_name");
    // Without a runtime directory the import is refused before the store.
    send(
        &s.router,
        Req::post("/v1/runtimes?name=x")
            .token(ADMIN)
            .key("k")
            .raw(vec![0u8; 512], Some("application/x-tar")),
    )
    .await
    .problem(409, "runtime_import_disabled");
    // Routes and methods.
    send(&s.router, Req::get("/v1/nothing").token(ADMIN))
        .await
        .problem(404, "not_found");
    send(
        &s.router,
        Req::new(axum::http::Method::DELETE, "/v1/execs/1").token(ADMIN),
    )
    .await
    .problem(405, "method_not_allowed");
    assert_eq!(s.store.calls(), Vec::<&str>::new());
}

#[tokio::test]
async fn admission_on_an_uncertain_cut_is_503_with_the_reason_and_retry_after() {
    let s = svc();
    s.clock.uncertain(UncertainReason::Stale);
    for token in [key1(), ADMIN.to_string()] {
        send(
            &s.router,
            Req::post("/v1/execs").token(&token).tenant(1).key("k").json(exec_body()),
        )
        .await
        .uncertain("stale", "3")
        .detail("the safe expiry cut is uncertain (stale): nothing that admits a deadline runs until it is certain again; retry in 3 s");
    }
    s.clock.uncertain(UncertainReason::NoCut);
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key1())
            .key("k")
            .json(exec_body()),
    )
    .await
    .uncertain("no_cut", "3");
    // The store was handed the uncertain reading, and refused it.
    assert_eq!(s.store.calls(), ["admit_exec(uncertain)"; 3]);
    let m = send(&s.router, Req::get("/metrics")).await;
    assert!(
        m.text.lines().any(|l| l == "lc_admissions_paused_total 3"),
        "{}",
        m.text
    );
    // Readiness names both what is missing.
    send(&s.router, Req::get("/readyz"))
        .await
        .problem(503, "not_ready")
        .detail("not ready: the database is unreachable; the cut is uncertain (no_cut)");
}

#[tokio::test]
async fn service_routes() {
    let s = svc();
    let r = send(&s.router, Req::get("/healthz")).await;
    assert_eq!(r.ok(200), &json!({"status": "ok"}));
    let doc = send(&s.router, Req::get("/v1/openapi.json")).await;
    let doc = doc.ok(200);
    let mut paths: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "/healthz",
            "/metrics",
            "/readyz",
            "/v1/execs",
            "/v1/execs/{exec_id}",
            "/v1/execs/{exec_id}/cancel",
            "/v1/execs/{exec_id}/output",
            "/v1/openapi.json",
            "/v1/operations/{key}",
            "/v1/runtimes",
            "/v1/tenants",
            "/v1/tenants/{tenant_id}",
            "/v1/tenants/{tenant_id}/deposits",
        ]
    );
    assert_eq!(
        doc["paths"]["/v1/execs"]["post"]["responses"]["503"]["content"]["application/problem+json"]
            ["schema"]["$ref"],
        json!("#/components/schemas/Problem")
    );
    for schema in [
        "CreatedTenant",
        "TenantView",
        "ExecView",
        "OutputView",
        "PageView",
        "OperationView",
        "RuntimeList",
    ] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    let m = send(&s.router, Req::get("/metrics")).await;
    assert_eq!(m.ok(200), &json!(m.text.clone()));
    assert!(
        m.text.lines().any(|l| l == "lc_http_requests_total{method=\"GET\",route=\"/v1/openapi.json\",status=\"200\"} 1"),
        "{}",
        m.text
    );
}
