//! Refusals decided before anything is written: credentials, headers,
//! bodies, paths, queries, bounds, and admission on an uncertain cut,
//! through the real router on the real store on PostgreSQL with a real
//! in-process sampler. "Nothing was written" is exact: a snapshot of every
//! row of every Little Compute and Tollgate table, taken before the
//! refusals, equals the one taken after.
//!
//! The cases at a certain cut share one service (one database, one
//! sampler, on one runtime that outlives each test): they refuse or read,
//! so they do not interfere, and their snapshots leave out only the
//! sampler's own tables. The uncertain cut has a service of its own, since
//! it stops its sampler; with the sampler stopped its snapshots hold every
//! table.

mod support;

use std::future::Future;
use std::sync::OnceLock;

use serde_json::json;
use support::pg::{PgSvc, SAMPLER_WRITES, psql, snapshot};
use support::*;
use tokio::sync::OnceCell;

/// The shared service at a certain cut: tenant `a` (4 units) with one
/// admitted exec, and tenant `b` (4 units).
struct Fixture {
    svc: PgSvc,
    a: i64,
    a_key: String,
    b: i64,
    exec: i64,
}

impl Fixture {
    async fn start() -> Fixture {
        let svc = PgSvc::start().await;
        let mut ids = Vec::new();
        for name in ["alpha", "beta"] {
            let r = send(
                &svc.router,
                Req::post("/v1/tenants")
                    .token(ADMIN)
                    .key(&format!("create-{name}"))
                    .json(json!({"name": name, "units": 4})),
            )
            .await;
            ids.push(r.ok(201)["tenant_id"].as_i64().expect("tenant id"));
        }
        let (a, b) = (ids[0], ids[1]);
        let a_key = svc.key_of(a);
        let r = send(
            &svc.router,
            Req::post("/v1/execs")
                .token(&a_key)
                .key("admit-a")
                .json(exec_body()),
        )
        .await;
        let exec = r.ok(201)["exec_id"].as_i64().expect("exec id");
        Fixture {
            svc,
            a,
            a_key,
            b,
            exec,
        }
    }

    /// Every table but the sampler's.
    async fn snapshot(&self) -> Vec<(String, Vec<String>)> {
        snapshot(&self.svc.url, &SAMPLER_WRITES).await
    }
}

/// The runtime of the shared service: it outlives each test, as the
/// service's sampler and connections live on it.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// Runs `case` on the shared service, started by the first case that
/// needs it.
fn with_fixture<F: Future<Output = ()>>(case: impl FnOnce(&'static Fixture) -> F) {
    static FIXTURE: OnceCell<Fixture> = OnceCell::const_new();
    runtime().block_on(async { case(FIXTURE.get_or_init(Fixture::start).await).await });
}

fn exec_body() -> serde_json::Value {
    json!({"runtime": "base", "shape": "small", "command": ["true"]})
}

#[test]
fn credentials_are_checked_before_anything_else() {
    with_fixture(|f| async move {
        let before = f.snapshot().await;
        let r = &f.svc.router;
        let (a, b, exec) = (f.a, f.b, f.exec);
        // No credential: 401 with the challenge, on every protected route.
        for req in [
            Req::post("/v1/tenants").key("k").json(json!({"name": "a"})),
            Req::get(format!("/v1/tenants/{a}")),
            Req::post("/v1/execs").key("k").json(exec_body()),
            Req::get("/v1/execs"),
            Req::get(format!("/v1/execs/{exec}")),
            Req::get(format!("/v1/execs/{exec}/output")),
            Req::post(format!("/v1/execs/{exec}/cancel")).key("k"),
            Req::get("/v1/runtimes"),
            Req::get("/v1/operations/admit-a"),
            Req::get("/v1/claims"),
            Req::post(format!("/v1/execs/{exec}/hibernate")).key("k"),
            Req::post(format!("/v1/execs/{exec}/resume")).key("k"),
            Req::get(format!("/v1/execs/{exec}/workspace")),
            Req::get(format!("/v1/execs/{exec}/snapshots")),
            Req::get(format!(
                "/v1/execs/{exec}/snapshots/{}/tree",
                "0".repeat(64)
            )),
            Req::get(format!(
                "/v1/execs/{exec}/snapshots/{}/files/a.txt",
                "0".repeat(64)
            )),
            // The credential is judged before any path parameter: a
            // malformed digest, exec id or tenant id without one is 401.
            Req::get(format!("/v1/execs/{exec}/snapshots/0/tree")),
            Req::get(format!("/v1/execs/{exec}/snapshots/0/files/0")),
            Req::get("/v1/execs/0/snapshots/0/tree"),
            Req::get("/v1/execs/01"),
            Req::post("/v1/execs/0/hibernate").key("k"),
            Req::post("/v1/tenants/0/deposits")
                .key("k")
                .json(json!({"units": 1})),
            Req::post("/v1/tokens")
                .key("k")
                .json(json!({"operations": ["exec.read"], "ttl_ms": 1})),
            Req::get("/v1/tokens"),
            Req::new(axum::http::Method::DELETE, "/v1/tokens/1"),
            Req::new(axum::http::Method::DELETE, "/v1/tokens/0"),
        ] {
            let resp = send(r, req).await;
            resp.problem(401, "unauthenticated");
            assert_eq!(
                resp.headers["www-authenticate"],
                "Bearer realm=\"little-compute\""
            );
        }
        // An unknown token on a tenant route: 401, after one key lookup at most.
        send(
            r,
            Req::get("/v1/execs").token(&format!("lc_{}", "A".repeat(43))),
        )
        .await
        .problem(401, "unauthenticated");
        send(r, Req::get("/v1/execs").token("not-a-key-at-all"))
            .await
            .problem(401, "unauthenticated");
        // A tenant key on admin routes: 403, nothing looked up.
        for req in [
            Req::post("/v1/tenants").key("k").json(json!({"name": "a"})),
            Req::post(format!("/v1/tenants/{a}/deposits"))
                .key("k")
                .json(json!({"units": 1})),
            Req::post("/v1/tenants/0/deposits")
                .key("k")
                .json(json!({"units": 1})),
            Req::post("/v1/runtimes?name=x")
                .key("k")
                .raw(vec![0u8; 512], Some("application/x-tar")),
        ] {
            send(r, req.token(&f.a_key))
                .await
                .problem(403, "forbidden")
                .detail("this credential may not perform this operation");
        }
        // Tenant a's key for tenant b: 403 on its balances and as Lc-Tenant;
        // the same for a tenant that does not exist.
        send(r, Req::get(format!("/v1/tenants/{b}")).token(&f.a_key))
            .await
            .problem(403, "forbidden");
        send(r, Req::get("/v1/tenants/99999").token(&f.a_key))
            .await
            .problem(403, "forbidden");
        send(r, Req::get("/v1/execs").token(&f.a_key).tenant(b))
            .await
            .problem(403, "forbidden");
        // The admin token on a tenant route needs Lc-Tenant.
        send(r, Req::get("/v1/execs").token(ADMIN))
            .await
            .problem(400, "tenant_required");
        send(
            r,
            Req::get("/v1/execs").token(ADMIN).header("Lc-Tenant", "01"),
        )
        .await
        .problem(400, "invalid_header");
        send(r, Req::get("/v1/execs").token(ADMIN).tenant(a).tenant(a))
            .await
            .problem(400, "invalid_header");
        assert_eq!(f.snapshot().await, before);
    });
}

#[test]
fn every_post_needs_a_valid_idempotency_key() {
    with_fixture(|f| async move {
        let before = f.snapshot().await;
        let r = &f.svc.router;
        let (a, exec) = (f.a, f.exec);
        for req in [
            Req::post("/v1/tenants")
                .token(ADMIN)
                .json(json!({"name": "a"})),
            Req::post(format!("/v1/tenants/{a}/deposits"))
                .token(ADMIN)
                .json(json!({"units": 1})),
            Req::post("/v1/execs").token(&f.a_key).json(exec_body()),
            Req::post(format!("/v1/execs/{exec}/cancel")).token(&f.a_key),
            Req::post("/v1/runtimes?name=x")
                .token(ADMIN)
                .raw(vec![0u8; 512], Some("application/x-tar")),
        ] {
            send(r, req).await.problem(400, "idempotency_key_required");
        }
        for bad in [
            String::new(),
            "k".repeat(256),
            "tab\there".into(),
            "é".into(),
        ] {
            send(
                r,
                Req::post("/v1/execs")
                    .token(&f.a_key)
                    .json(exec_body())
                    .key(&bad),
            )
            .await
            .problem(400, "invalid_operation_key");
        }
        send(
            r,
            Req::post("/v1/execs")
                .token(&f.a_key)
                .json(exec_body())
                .key("a")
                .key("b"),
        )
        .await
        .problem(400, "invalid_header");
        assert_eq!(f.snapshot().await, before);
    });
}

#[test]
fn bad_bodies_paths_and_queries_are_typed_refusals() {
    with_fixture(|f| async move {
        let before = f.snapshot().await;
        let r = &f.svc.router;
        let exec = f.exec;
        let post = || Req::post("/v1/execs").token(&f.a_key).key("k1");
        send(r, post()).await.problem(400, "invalid_json");
        send(r, post().raw("{", Some("application/json")))
            .await
            .problem(400, "invalid_json");
        send(r, post().raw("{}", Some("text/plain")))
            .await
            .problem(415, "unsupported_media_type");
        send(r, post().json(json!({"runtime": "base", "shape": "small"})))
            .await
            .problem(422, "invalid_body")
            .detail("missing field `command` at line 1 column 34");
        send(
            r,
            post()
                .json(json!({"runtime": "base", "shape": "small", "command": ["true"], "env": {}})),
        )
        .await
        .problem(422, "invalid_body");
        send(
            r,
            post().json(json!({"runtime": "base", "shape": "small", "command": "true"})),
        )
        .await
        .problem(422, "invalid_body");
        // Over the JSON bound: 413 naming it.
        let big = json!({"runtime": "base", "shape": "small", "command": ["x".repeat(600 * 1024)]});
        send(r, post().json(big))
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
            send(r, Req::get(p).token(&f.a_key))
                .await
                .problem(400, "invalid_path");
        }
        send(r, Req::get("/v1/tenants/0").token(ADMIN))
            .await
            .problem(400, "invalid_path");
        send(r, Req::get("/v1/operations/%09").token(ADMIN))
            .await
            .problem(400, "invalid_path");
        // Queries.
        for q in ["after=x", "limit=-1", "after=-1", "bogus=1"] {
            send(r, Req::get(format!("/v1/execs?{q}")).token(&f.a_key))
                .await
                .problem(400, "invalid_query");
        }
        send(r, Req::get("/v1/execs?limit=0").token(&f.a_key))
            .await
            .problem(422, "invalid_limit");
        send(r, Req::get("/v1/execs?limit=1001").token(&f.a_key))
            .await
            .problem(422, "invalid_limit");
        send(
            r,
            Req::get(format!("/v1/execs/{exec}/output?after_seq=-1")).token(&f.a_key),
        )
        .await
        .problem(400, "invalid_query");
        send(
            r,
            Req::get(format!("/v1/execs/{exec}/output?limit=65")).token(&f.a_key),
        )
        .await
        .problem(422, "invalid_limit");
        // Runtime import: a tarball body and a valid name.
        send(
            r,
            Req::post("/v1/runtimes?name=x")
                .token(ADMIN)
                .key("k")
                .json(json!({})),
        )
        .await
        .problem(415, "unsupported_media_type")
        .detail("a runtime is imported as an application/x-tar body");
        send(
            r,
            Req::post("/v1/runtimes")
                .token(ADMIN)
                .key("k")
                .raw(vec![0u8; 512], Some("application/x-tar")),
        )
        .await
        .problem(400, "invalid_query");
        send(
            r,
            Req::post("/v1/runtimes?name=")
                .token(ADMIN)
                .key("k")
                .raw(vec![0u8; 512], Some("application/x-tar")),
        )
        .await
        .problem(422, "invalid_name");
        // Without a runtime directory the import is refused before the store.
        send(
            r,
            Req::post("/v1/runtimes?name=x")
                .token(ADMIN)
                .key("k")
                .raw(vec![0u8; 512], Some("application/x-tar")),
        )
        .await
        .problem(409, "runtime_import_disabled");
        // Routes and methods.
        send(r, Req::get("/v1/nothing").token(ADMIN))
            .await
            .problem(404, "not_found");
        send(
            r,
            Req::new(axum::http::Method::DELETE, format!("/v1/execs/{exec}")).token(ADMIN),
        )
        .await
        .problem(405, "method_not_allowed");
        assert_eq!(f.snapshot().await, before);
    });
}

#[tokio::test]
async fn admission_on_an_uncertain_cut_is_503_with_the_reason_and_retry_after() {
    // No sampler has ever run on this database: the cut reads no_cut and
    // the store refuses the admission. Creating a tenant is a mutation,
    // refused too, so tenant 1 is written by hand (an account without
    // units: the cut is checked before capacity); the admin acts for it.
    let mut s = PgSvc::start_without_cut().await;
    psql(
        &s.url,
        "INSERT INTO tollgate_accounts (name) VALUES ('by-hand'); \
         INSERT INTO lc_tenants VALUES (1, 'by-hand', sha256('by-hand'::bytea));"
            .into(),
    )
    .await;
    let before = snapshot(&s.url, &[]).await;
    // Tenant 2 does not exist: 404 before anything else.
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(ADMIN)
            .tenant(2)
            .key("k")
            .json(exec_body()),
    )
    .await
    .problem(404, "not_found")
    .detail("tenant 2 not found");
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(ADMIN)
            .tenant(1)
            .key("k")
            .json(exec_body()),
    )
    .await
    .uncertain("no_cut", "2")
    .detail("the safe expiry cut is uncertain (no_cut): nothing that admits a deadline runs until it is certain again; retry in 2 s");
    send(&s.router, Req::get("/readyz"))
        .await
        .problem(503, "not_ready")
        .detail("not ready: the cut is uncertain (no_cut)");
    assert_eq!(snapshot(&s.url, &[]).await, before);

    // A certain cut: a tenant with units, and the request admits.
    s.start_sampler().await;
    let t = send(
        &s.router,
        Req::post("/v1/tenants")
            .token(ADMIN)
            .key("create-blue")
            .json(json!({"name": "blue", "units": 4})),
    )
    .await
    .ok(201)["tenant_id"]
        .as_i64()
        .expect("tenant id");
    let key = s.key_of(t);
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("admitted")
            .json(exec_body()),
    )
    .await
    .ok(201);

    // The sampler stopped: the cut goes stale, and the same request with a
    // new key is refused, by the tenant's key and by the admin alike.
    s.stop_sampler().await;
    let before = snapshot(&s.url, &[]).await;
    for token in [key.clone(), ADMIN.to_string()] {
        send(
            &s.router,
            Req::post("/v1/execs").token(&token).tenant(t).key("k").json(exec_body()),
        )
        .await
        .uncertain("stale", "2")
        .detail("the safe expiry cut is uncertain (stale): nothing that admits a deadline runs until it is certain again; retry in 2 s");
    }
    send(&s.router, Req::get("/v1/operations/k").token(&key))
        .await
        .problem(404, "not_found");
    send(&s.router, Req::get("/readyz"))
        .await
        .problem(503, "not_ready")
        .detail("not ready: the cut is uncertain (stale)");
    assert_eq!(snapshot(&s.url, &[]).await, before);
    let m = send(&s.router, Req::get("/metrics")).await;
    assert!(
        m.text.lines().any(|l| l == "lc_admissions_paused_total 3"),
        "{}",
        m.text
    );

    // The database gone: readiness names both what is missing.
    s.drop_database().await;
    send(&s.router, Req::get("/readyz"))
        .await
        .problem(503, "not_ready")
        .detail("not ready: the database is unreachable; the cut cannot be read");
}

#[test]
fn service_routes() {
    with_fixture(|f| async move {
        let before = f.snapshot().await;
        let r = &f.svc.router;
        let resp = send(r, Req::get("/healthz")).await;
        assert_eq!(resp.ok(200), &json!({"status": "ok"}));
        let doc = send(r, Req::get("/v1/openapi.json")).await;
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
                "/v1/approvals",
                "/v1/claims",
                "/v1/execs",
                "/v1/execs/{exec_id}",
                "/v1/execs/{exec_id}/approve",
                "/v1/execs/{exec_id}/cancel",
                "/v1/execs/{exec_id}/deny",
                "/v1/execs/{exec_id}/hibernate",
                "/v1/execs/{exec_id}/input",
                "/v1/execs/{exec_id}/milestones",
                "/v1/execs/{exec_id}/output",
                "/v1/execs/{exec_id}/output/undelete",
                "/v1/execs/{exec_id}/resume",
                "/v1/execs/{exec_id}/snapshots",
                "/v1/execs/{exec_id}/snapshots/{digest}/files/{path}",
                "/v1/execs/{exec_id}/snapshots/{digest}/tree",
                "/v1/execs/{exec_id}/workspace",
                "/v1/execs/{exec_id}/workspace/undelete",
                "/v1/openapi.json",
                "/v1/operations/{key}",
                "/v1/runtimes",
                "/v1/tenants",
                "/v1/tenants/{tenant_id}",
                "/v1/tenants/{tenant_id}/approval-policy",
                "/v1/tenants/{tenant_id}/deposits",
                "/v1/tokens",
                "/v1/tokens/{token_id}",
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
            "HibernationView",
            "ResumeIntentView",
            "WorkspaceView",
            "SnapshotList",
            "TreeView",
            "MintedTokenView",
            "TokenView",
            "TokenList",
            "DeletionView",
        ] {
            assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
        }
        // The deletions: DELETE beside the reads, undelete a POST; each
        // may answer 410.
        for (path, method) in [
            ("/v1/execs/{exec_id}/workspace", "delete"),
            ("/v1/execs/{exec_id}/output", "delete"),
            ("/v1/execs/{exec_id}/workspace/undelete", "post"),
            ("/v1/execs/{exec_id}/output/undelete", "post"),
        ] {
            let op = &doc["paths"][path][method];
            assert!(op["responses"]["200"].is_object(), "{path} {method}");
            assert!(op["responses"]["410"].is_object(), "{path} {method}");
        }
        let file = &doc["paths"]["/v1/execs/{exec_id}/snapshots/{digest}/files/{path}"]["get"];
        assert_eq!(
            file["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["exec_id", "digest", "path", "Lc-Tenant"]
        );
        let m = send(r, Req::get("/metrics")).await;
        assert_eq!(m.ok(200), &json!(m.text.clone()));
        assert!(
            m.text.lines().any(|l| l
                == "lc_http_requests_total{method=\"GET\",route=\"/v1/openapi.json\",status=\"200\"} 1"),
            "{}",
            m.text
        );
        assert_eq!(f.snapshot().await, before);
    });
}

#[test]
fn refusals_say_what_to_check_and_echo_a_bounded_part_of_the_request() {
    with_fixture(|f| async move {
        let before = f.snapshot().await;
        let r = &f.svc.router;
        // A token was sent but not accepted: said so, with what to check.
        let refused = "the bearer credential was not accepted: it is neither this service's admin token nor a tenant API key or scoped token it issued; check the token sent (lc takes it from --token, LC_TOKEN or the admin token file of --data-dir) and that it belongs to this control plane";
        for token in [format!("lc_{}", "A".repeat(43)), "not-a-key-at-all".into()] {
            let resp = send(r, Req::get("/v1/execs").token(&token)).await;
            resp.problem(401, "unauthenticated").detail(refused);
            assert_eq!(
                resp.headers["www-authenticate"],
                "Bearer realm=\"little-compute\""
            );
        }
        // None sent: the request needs one.
        send(r, Req::get("/v1/execs"))
            .await
            .problem(401, "unauthenticated")
            .detail("a bearer credential is required");
        // The same key with another request: what to do instead.
        send(
            r,
            Req::post("/v1/execs")
                .token(&f.a_key)
                .key("admit-a")
                .json(json!({"runtime": "base", "shape": "small", "command": ["false"]})),
        )
        .await
        .problem(409, "idempotency_conflict")
        .detail("idempotency key \"admit-a\" was already used with a different request; send this request under a new Idempotency-Key, or repeat the original request to read its answer");
        // A path of kilobytes is echoed within the bound: its start, how
        // much was left out, and its end.
        let id = "9".repeat(4000);
        let full = format!(
            "path id \"{id}\" is not a positive integer in canonical decimal (1..=9223372036854775807, no sign or leading zero)"
        );
        let head = &full[..lc_api::error::DETAIL_HEAD_BYTES];
        let tail = &full[full.len() - lc_api::error::DETAIL_TAIL_BYTES..];
        let left_out = full.len() - head.len() - tail.len();
        let resp = send(r, Req::get(format!("/v1/execs/{id}")).token(&f.a_key)).await;
        resp.problem(400, "invalid_path")
            .detail(&format!("{head}…[{left_out} bytes left out]…{tail}"));
        assert!(
            resp.body["detail"].as_str().unwrap().len() <= lc_api::error::DETAIL_BYTES_MAX,
            "{}",
            resp.text
        );
        assert_eq!(f.snapshot().await, before);
    });
}
