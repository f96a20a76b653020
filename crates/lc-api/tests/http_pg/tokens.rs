//! Scoped tokens through the real router: mint (secret once, replay
//! without it), list, revoke; a token acting only within its scope and
//! its tenant, a bound token only on its exec; every refusal's status,
//! code and detail; acceptance refused while the cut is uncertain and once
//! a certain cut reaches the deadline; refusals that write nothing.

use axum::http::Method;
use serde_json::{Value, json};

use crate::support::pg::{PgSvc, SAMPLER_WRITES, snapshot};
use crate::support::*;
use crate::{small, tenant};

async fn mint(s: &PgSvc, key: &str, idem: &str, body: Value) -> Value {
    send(
        &s.router,
        Req::post("/v1/tokens").token(key).key(idem).json(body),
    )
    .await
    .ok(201)
    .clone()
}

fn delete(path: String) -> Req {
    Req::new(Method::DELETE, path)
}

#[tokio::test]
async fn scoped_tokens_act_only_within_their_scope_and_tenant() {
    let s = PgSvc::start().await;
    let r = &s.router;
    let (a, a_key) = tenant(&s, "alpha", 4).await;
    let (b, b_key) = tenant(&s, "beta", 2).await;
    let mut execs = Vec::new();
    for (key, k) in [(&a_key, "x1"), (&a_key, "x2"), (&b_key, "x3")] {
        let v = send(
            r,
            Req::post("/v1/execs")
                .token(key)
                .key(k)
                .json(small(&["true"])),
        )
        .await;
        execs.push(v.ok(201)["exec_id"].as_i64().unwrap());
    }
    let (ea, eb, ec) = (execs[0], execs[1], execs[2]);

    // Minted by the tenant's key: the secret once, the deadline exact.
    let body = json!({"operations": ["exec.read", "exec.create"], "ttl_ms": 3_600_000});
    let m = mint(&s, &a_key, "m1", body.clone()).await;
    let id = m["token_id"].as_i64().unwrap();
    let secret = m["token"].as_str().unwrap().to_string();
    assert!(secret.starts_with("lct_") && secret.len() == 47, "{secret}");
    assert_eq!(
        ts(m["deadline"].as_str().unwrap()),
        ts(m["minted_cut"].as_str().unwrap()) + jiff::SignedDuration::from_hours(1)
    );
    let record = json!({
        "token_id": id, "tenant_id": a, "exec_id": null,
        "operations": ["exec.create", "exec.read"],
        "minted_cut": m["minted_cut"], "deadline": m["deadline"],
        "revoked": false, "revoked_cut": null,
    });
    let mut want = record.clone();
    want["token"] = json!(secret);
    want["replay"] = json!(false);
    assert_eq!(m, want);
    // A replay answers the record without the secret.
    let mut replayed = record.clone();
    replayed["token"] = Value::Null;
    replayed["replay"] = json!(true);
    assert_eq!(mint(&s, &a_key, "m1", body).await, replayed);

    // Within its scope and tenant.
    let list = send(r, Req::get("/v1/execs").token(&secret)).await;
    assert_eq!(
        list.ok(200)["execs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["exec_id"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [ea, eb]
    );
    send(r, Req::get(format!("/v1/execs/{ea}")).token(&secret))
        .await
        .ok(200);
    send(r, Req::get("/v1/runtimes").token(&secret))
        .await
        .ok(200);
    let created = send(
        r,
        Req::post("/v1/execs")
            .token(&secret)
            .key("x4")
            .json(small(&["true"])),
    )
    .await;
    assert_eq!(created.ok(201)["tenant_id"], json!(a));
    send(r, Req::get("/v1/operations/x4").token(&secret))
        .await
        .ok(200);
    // Another tenant's exec: as if it did not exist.
    send(r, Req::get(format!("/v1/execs/{ec}")).token(&secret))
        .await
        .problem(404, "not_found")
        .detail(&format!("exec {ec} not found"));

    let before = snapshot(&s.url, &SAMPLER_WRITES).await;
    // Outside its operations.
    send(
        r,
        Req::post(format!("/v1/execs/{ea}/cancel"))
            .token(&secret)
            .key("c"),
    )
    .await
    .problem(403, "forbidden")
    .detail("this token does not hold the operation exec.cancel (it holds exec.create, exec.read)");
    send(
        r,
        Req::get(format!("/v1/execs/{ea}/workspace")).token(&secret),
    )
    .await
    .problem(403, "forbidden")
    .detail(
        "this token does not hold the operation workspace.read (it holds exec.create, exec.read)",
    );
    // Outside its tenant, and never an admin's or a tenant key's routes.
    send(r, Req::get("/v1/execs").token(&secret).tenant(b))
        .await
        .problem(403, "forbidden")
        .detail("this credential may not perform this operation");
    send(
        r,
        Req::post("/v1/tenants")
            .token(&secret)
            .key("t")
            .json(json!({"name": "x"})),
    )
    .await
    .problem(403, "forbidden")
    .detail("this credential may not perform this operation");
    send(r, Req::get(format!("/v1/tenants/{a}")).token(&secret))
        .await
        .problem(403, "forbidden")
        .detail("a scoped token reads no tenant: its tenant's API key does");
    // No escalation: a token never mints, lists or revokes tokens.
    for (req, what) in [
        (
            Req::post("/v1/tokens")
                .token(&secret)
                .key("m9")
                .json(json!({"operations": ["exec.read"], "ttl_ms": 1000})),
            "POST /v1/tokens",
        ),
        (Req::get("/v1/tokens").token(&secret), "GET /v1/tokens"),
        (
            delete(format!("/v1/tokens/{id}")).token(&secret),
            "DELETE /v1/tokens/{token_id}",
        ),
    ] {
        send(r, req)
            .await
            .problem(403, "forbidden")
            .detail(&format!("a scoped token may not call {what}: tokens are minted, listed and revoked only with the tenant's API key"));
    }

    assert_eq!(snapshot(&s.url, &SAMPLER_WRITES).await, before);

    // Bound to exec ea: only that exec's routes.
    let bound = mint(
        &s,
        &a_key,
        "m2",
        json!({"exec_id": ea, "operations": ["workspace.read", "exec.read"], "ttl_ms": 60_000}),
    )
    .await;
    let bound_id = bound["token_id"].as_i64().unwrap();
    assert_eq!(
        (&bound["exec_id"], &bound["operations"]),
        (&json!(ea), &json!(["exec.read", "workspace.read"]))
    );
    let bsecret = bound["token"].as_str().unwrap().to_string();
    send(r, Req::get(format!("/v1/execs/{ea}")).token(&bsecret))
        .await
        .ok(200);
    send(
        r,
        Req::get(format!("/v1/execs/{ea}/workspace")).token(&bsecret),
    )
    .await
    .ok(200);
    // Another exec, of its tenant or not, existing or not: the same 403.
    for other in [eb, ec, 99_999] {
        send(r, Req::get(format!("/v1/execs/{other}")).token(&bsecret))
            .await
            .problem(403, "forbidden")
            .detail(&format!(
                "this token is bound to exec {ea}; exec {other} is outside its scope"
            ));
    }
    for (req, op) in [
        (Req::get("/v1/execs").token(&bsecret), "exec.read"),
        (Req::get("/v1/operations/x4").token(&bsecret), "exec.read"),
    ] {
        send(r, req)
            .await
            .problem(403, "forbidden")
            .detail(&format!("this token is bound to exec {ea}: it acts only on that exec's routes, not on {op} across execs"));
    }
    send(
        r,
        Req::post("/v1/execs")
            .token(&bsecret)
            .key("x5")
            .json(small(&["true"])),
    )
    .await
    .problem(403, "forbidden")
    .detail(
        "this token does not hold the operation exec.create (it holds exec.read, workspace.read)",
    );
    // A path id that is not one is the route's own 400, after the token.
    send(r, Req::get("/v1/execs/01").token(&bsecret))
        .await
        .problem(400, "invalid_path");

    // Refused mints.
    let before = snapshot(&s.url, &SAMPLER_WRITES).await;
    for (body, status, code) in [
        (
            json!({"exec_id": ea, "operations": ["exec.create"], "ttl_ms": 1000}),
            422,
            "invalid_token_scope",
        ),
        (
            json!({"operations": ["exec.write"], "ttl_ms": 1000}),
            422,
            "invalid_token_scope",
        ),
        (
            json!({"operations": [], "ttl_ms": 1000}),
            422,
            "invalid_token_scope",
        ),
        (
            json!({"operations": ["exec.read"], "ttl_ms": 0}),
            422,
            "invalid_timeout",
        ),
        (
            json!({"operations": ["exec.read"], "ttl_ms": 2_592_000_001_u64}),
            422,
            "invalid_timeout",
        ),
        (
            json!({"exec_id": ec, "operations": ["exec.read"], "ttl_ms": 1000}),
            404,
            "not_found",
        ),
        (json!({"operations": ["exec.read"]}), 422, "invalid_body"),
    ] {
        send(
            r,
            Req::post("/v1/tokens")
                .token(&a_key)
                .key("bad")
                .json(body.clone()),
        )
        .await
        .problem(status, code);
    }
    send(
        r,
        Req::post("/v1/tokens")
            .token(&a_key)
            .json(json!({"operations": ["exec.read"], "ttl_ms": 1})),
    )
    .await
    .problem(400, "idempotency_key_required");
    send(
        r,
        Req::post("/v1/tokens")
            .token(ADMIN)
            .key("bad")
            .json(json!({"operations": ["exec.read"], "ttl_ms": 1})),
    )
    .await
    .problem(400, "tenant_required");
    assert_eq!(snapshot(&s.url, &SAMPLER_WRITES).await, before);

    // Listed without secrets, by the tenant's key or the admin for it.
    let list = send(r, Req::get("/v1/tokens").token(&a_key))
        .await
        .ok(200)
        .clone();
    assert_eq!(list["tokens"].as_array().unwrap().len(), 2);
    assert_eq!(list["tokens"][0], record);
    assert_eq!(list["next_after"], Value::Null);
    assert!(!list.to_string().contains("lct_"));
    assert_eq!(
        send(r, Req::get("/v1/tokens").token(ADMIN).tenant(a))
            .await
            .ok(200),
        &list
    );
    let page = send(r, Req::get("/v1/tokens?limit=1").token(&a_key))
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (
            page["tokens"][0]["token_id"].as_i64(),
            page["next_after"].as_i64()
        ),
        (Some(id), Some(id))
    );
    assert_eq!(
        send(r, Req::get("/v1/tokens").token(&b_key)).await.ok(200)["tokens"],
        json!([])
    );

    // Revoked, idempotently; another tenant's token is not found.
    let revoked = send(r, delete(format!("/v1/tokens/{id}")).token(&a_key))
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (
            revoked["revoked"].as_bool(),
            revoked["revoked_cut"].is_string()
        ),
        (Some(true), true)
    );
    assert_eq!(
        send(r, delete(format!("/v1/tokens/{id}")).token(&a_key))
            .await
            .ok(200),
        &revoked
    );
    send(r, delete(format!("/v1/tokens/{id}")).token(&b_key))
        .await
        .problem(404, "not_found")
        .detail(&format!("token {id} not found"));
    // The revoked token: 401 before its path is looked at.
    for req in [Req::get("/v1/execs"), Req::get("/v1/execs/01")] {
        let resp = send(r, req.token(&secret)).await;
        resp.problem(401, "token_revoked").detail(&format!(
            "token {id} was revoked; mint a new one (POST /v1/tokens, lc token mint)"
        ));
        assert_eq!(
            resp.headers["www-authenticate"],
            "Bearer realm=\"little-compute\""
        );
    }
    send(
        r,
        Req::get("/v1/execs").token(&format!("lct_{}", "A".repeat(43))),
    )
    .await
    .problem(401, "unauthenticated");

    // While the cut is uncertain: the token cannot be proven unexpired,
    // and nothing is minted; a revocation still commits.
    s.clock.force_uncertain(true);
    let before = snapshot(&s.url, &SAMPLER_WRITES).await;
    send(r, Req::get(format!("/v1/execs/{ea}")).token(&bsecret))
        .await
        .uncertain("stale", "2");
    send(
        r,
        Req::post("/v1/tokens")
            .token(&a_key)
            .key("m3")
            .json(json!({"operations": ["exec.read"], "ttl_ms": 1000})),
    )
    .await
    .uncertain("stale", "2");
    assert_eq!(snapshot(&s.url, &SAMPLER_WRITES).await, before);
    let r2 = send(r, delete(format!("/v1/tokens/{bound_id}")).token(&a_key)).await;
    assert_eq!(r2.ok(200)["revoked"], json!(true));
    s.clock.force_uncertain(false);
    send(r, Req::get(format!("/v1/execs/{ea}")).token(&bsecret))
        .await
        .problem(401, "token_revoked");
}

#[tokio::test]
async fn a_token_is_refused_once_a_certain_cut_reaches_its_deadline() {
    let s = PgSvc::start().await;
    let r = &s.router;
    let (_, key) = tenant(&s, "gamma", 1).await;
    let m = mint(
        &s,
        &key,
        "short",
        json!({"operations": ["exec.read"], "ttl_ms": 1}),
    )
    .await;
    let deadline = ts(m["deadline"].as_str().unwrap());
    let secret = m["token"].as_str().unwrap();
    let mut passed = false;
    for _ in 0..500 {
        if s.reading().await.cut >= deadline {
            passed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(passed, "the cut did not reach {deadline} within 5 s");
    let resp = send(r, Req::get("/v1/execs").token(secret)).await;
    resp.problem(401, "token_expired").detail(&format!(
        "token {} expired at {deadline} on the cut; mint a new one (POST /v1/tokens, lc token mint)",
        m["token_id"]
    ));
    assert_eq!(
        resp.headers["www-authenticate"],
        "Bearer realm=\"little-compute\""
    );
}
