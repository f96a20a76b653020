//! Every route against the real store on PostgreSQL, with a certain cut
//! from an in-process sampler: exact statuses, codes and bodies, the
//! authorization rule, replays and conflicts, an uncertain cut and
//! insufficient capacity with the exact balances unchanged.

mod support;

#[path = "http_pg/tokens.rs"]
mod tokens;

use lc_core::model::{AttemptNo, Digest, ExecId, OutputPage, PageExit, PageKind, TenantId};
use lc_core::store::ReconcileStore;
use serde_json::{Value, json};
use support::pg::PgSvc;
use support::*;

/// Creates tenant `name` with `units`; returns (id, key).
async fn tenant(s: &PgSvc, name: &str, units: i64) -> (i64, String) {
    let r = send(
        &s.router,
        Req::post("/v1/tenants")
            .token(ADMIN)
            .key(&format!("create-{name}"))
            .json(json!({"name": name, "units": units})),
    )
    .await;
    let b = r.ok(201);
    (
        b["tenant_id"].as_i64().unwrap(),
        b["api_key"].as_str().unwrap().to_string(),
    )
}

async fn balances(s: &PgSvc, id: i64) -> Value {
    send(
        &s.router,
        Req::get(format!("/v1/tenants/{id}")).token(ADMIN),
    )
    .await
    .ok(200)
    .clone()
}

fn small(cmd: &[&str]) -> Value {
    json!({"runtime": "base", "shape": "small", "command": cmd})
}

#[tokio::test]
async fn tenants_deposits_and_balances() {
    let s = PgSvc::start().await;
    let create = |key: &str, body: Value| Req::post("/v1/tenants").token(ADMIN).key(key).json(body);
    let r = send(
        &s.router,
        create("t-blue", json!({"name": "blue", "units": 8})),
    )
    .await;
    let body = r.ok(201).clone();
    let id = body["tenant_id"].as_i64().unwrap();
    assert_eq!(
        body,
        json!({"tenant_id": id, "name": "blue", "api_key": s.key_of(id)})
    );
    // The same key and body: the same answer, the same derived key.
    let again = send(
        &s.router,
        create("t-blue", json!({"units": 8, "name": "blue"})),
    )
    .await;
    assert_eq!(again.ok(201), &body);
    // The same key, another body: 409, nothing created.
    send(
        &s.router,
        create("t-blue", json!({"name": "blue", "units": 9})),
    )
    .await
    .problem(409, "idempotency_conflict");
    // Another key, a taken name.
    send(&s.router, create("t-blue-2", json!({"name": "blue"})))
        .await
        .problem(409, "already_exists");
    send(
        &s.router,
        create("t-zero", json!({"name": "zero", "units": 0})),
    )
    .await
    .problem(422, "invalid_units");
    send(&s.router, create("t-empty", json!({"name": ""})))
        .await
        .problem(422, "invalid_name");
    let want = json!({"tenant_id": id, "name": "blue", "deposited": 8, "available": 8, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}});
    assert_eq!(balances(&s, id).await, want);
    // The tenant's own key reads it too.
    let own = send(
        &s.router,
        Req::get(format!("/v1/tenants/{id}")).token(&s.key_of(id)),
    )
    .await;
    assert_eq!(own.ok(200), &want);
    // Deposits: admin only, replayable.
    let dep = |key: &str, units: i64| {
        Req::post(format!("/v1/tenants/{id}/deposits"))
            .token(ADMIN)
            .key(key)
            .json(json!({"units": units}))
    };
    let d = send(&s.router, dep("d-1", 2)).await;
    let after = json!({"tenant_id": id, "name": "blue", "deposited": 10, "available": 10, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}});
    assert_eq!(d.ok(200), &after);
    assert_eq!(send(&s.router, dep("d-1", 2)).await.ok(200), &after);
    send(&s.router, dep("d-1", 3))
        .await
        .problem(409, "idempotency_conflict");
    send(&s.router, dep("d-2", 0))
        .await
        .problem(422, "invalid_units");
    send(&s.router, dep("d-3", 1).token(&s.key_of(id)))
        .await
        .problem(403, "forbidden");
    assert_eq!(balances(&s, id).await, after);
    // A missing tenant: 404 for the admin, who may know.
    send(&s.router, Req::get("/v1/tenants/999").token(ADMIN))
        .await
        .problem(404, "not_found");
    send(
        &s.router,
        Req::post("/v1/tenants/999/deposits")
            .token(ADMIN)
            .key("d-x")
            .json(json!({"units": 1})),
    )
    .await
    .problem(404, "not_found");
    // The admin's operation record of the creation.
    let op = send(&s.router, Req::get("/v1/operations/t-blue").token(ADMIN)).await;
    let op = op.ok(200);
    assert_eq!(op["key"], "t-blue");
    assert_eq!(op["scope"], "admin");
    assert_eq!(op["tenant_id"], Value::Null);
    send(
        &s.router,
        Req::get("/v1/operations/never-used").token(ADMIN),
    )
    .await
    .problem(404, "not_found");
}

#[tokio::test]
async fn exec_admission_reads_replays_and_cancel() {
    let s = PgSvc::start().await;
    let (blue, blue_key) = tenant(&s, "blue", 3).await;
    let (green, green_key) = tenant(&s, "green", 3).await;
    let admit =
        |key: &str, body: Value| Req::post("/v1/execs").token(&blue_key).key(key).json(body);
    let r = send(&s.router, admit("e-1", small(&["echo", "hi"]))).await;
    let exec = r.ok(201).clone();
    let exec_id = exec["exec_id"].as_i64().unwrap();
    assert_eq!(exec["state"], "admitted");
    assert_eq!(exec["tenant_id"], json!(blue));
    assert_eq!(exec["terminal_reason"], Value::Null);
    assert_eq!(exec["exit_code"], Value::Null);
    assert_eq!(exec["attempt"], 1);
    assert_eq!(exec["shape"], "small");
    assert_eq!(exec["command"], json!(["echo", "hi"]));
    assert_eq!(exec["cancel_requested"], false);
    // Nothing measured yet: no observation (not zero, not clean), and
    // re-execution is ineligible for that reason.
    assert_eq!(exec.get("observation"), None);
    assert_eq!(
        exec["reexecution"],
        json!({"eligible": false, "reason": "externality_unobserved"})
    );
    assert_eq!(exec["canonical"]["exec_id"], json!(exec_id));
    assert_eq!(exec["canonical"]["provider_id"], "local");
    assert_eq!(
        exec["canonical"]["runtime"],
        json!(hex::encode(lc_core::manifest::Manifest::base().digest()))
    );
    // small reserves one unit, exactly.
    assert_eq!(
        balances(&s, blue).await,
        json!({"tenant_id": blue, "name": "blue", "deposited": 3, "available": 2, "held": 1, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}})
    );
    // A replay returns the same exec and reserves nothing more.
    assert_eq!(
        send(&s.router, admit("e-1", small(&["echo", "hi"])))
            .await
            .ok(201),
        &exec
    );
    assert_eq!(balances(&s, blue).await["held"], 1);
    send(&s.router, admit("e-1", small(&["echo", "bye"])))
        .await
        .problem(409, "idempotency_conflict");
    // The admin acts for blue with Lc-Tenant; the same key space as blue's.
    let as_admin = send(
        &s.router,
        Req::post("/v1/execs")
            .token(ADMIN)
            .tenant(blue)
            .key("e-1")
            .json(small(&["echo", "hi"])),
    )
    .await;
    assert_eq!(as_admin.ok(201), &exec);
    // An Lc-Tenant of no tenant is 404, never an empty tenant, and admits
    // nothing: a list, an operation key, an admission, an approval list.
    let missing = blue + 1000;
    let gone = format!("tenant {missing} not found");
    for req in [
        Req::get("/v1/execs"),
        Req::get("/v1/operations/e-1"),
        Req::get("/v1/approvals"),
        Req::post("/v1/execs").key("e-9").json(small(&["true"])),
    ] {
        send(&s.router, req.token(ADMIN).tenant(missing))
            .await
            .problem(404, "not_found")
            .detail(&gone);
    }
    assert_eq!(balances(&s, blue).await["held"], 1);
    // Reads.
    let got = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}")).token(&blue_key),
    )
    .await;
    assert_eq!(got.ok(200), &exec);
    let got = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}"))
            .token(ADMIN)
            .tenant(blue),
    )
    .await;
    assert_eq!(got.ok(200), &exec);
    // The provider's signed measurement, once recorded, is what the exec
    // shows: a measured 0 as 0, each flag as observed.
    let lease = lc_core::SandboxLeaseId(exec["canonical"]["lease_id"].as_i64().unwrap());
    let measurement = lc_core::evidence::sign(
        &lc_core::evidence::Statement::Measurement {
            provider_id: "local".into(),
            lease_id: lease.0,
            generation: 1,
            cost: Some(lc_core::observation::CostObservation {
                cpu_time_ms: 0,
                peak_memory_bytes: 4096,
            }),
            externality: lc_core::observation::ExternalityObservation::of_sandbox(false),
        },
        &support::pg::provider_key(),
    );
    s.store
        .record_measurement(
            lease,
            lc_core::Generation(1),
            &serde_json::to_value(&measurement).unwrap(),
            s.reading().await,
        )
        .await
        .unwrap();
    let got = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}")).token(&blue_key),
    )
    .await;
    let measured = got.ok(200);
    assert_eq!(
        (&measured["observation"], &measured["reexecution"]),
        (
            &json!({"cost": {"cpuTimeMs": 0, "peakMemoryBytes": 4096}, "externality": {"networkWrites": false, "databaseCommits": false, "externalApiCalls": false}}),
            &json!({"eligible": true})
        )
    );
    let exec = measured.clone();
    // Another tenant's exec: 404, the same as an exec that does not exist.
    let other = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}")).token(&green_key),
    )
    .await;
    other.problem(404, "not_found");
    let missing = send(&s.router, Req::get("/v1/execs/99999").token(&green_key)).await;
    missing.problem(404, "not_found");
    assert_eq!(
        other.body["detail"]
            .as_str()
            .map(|d| d.replace(&exec_id.to_string(), "N")),
        missing.body["detail"]
            .as_str()
            .map(|d| d.replace("99999", "N"))
    );
    send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}/output")).token(&green_key),
    )
    .await
    .problem(404, "not_found");
    send(
        &s.router,
        Req::post(format!("/v1/execs/{exec_id}/cancel"))
            .token(&green_key)
            .key("c-g"),
    )
    .await
    .problem(404, "not_found");
    // Lists.
    let list = send(&s.router, Req::get("/v1/execs").token(&blue_key)).await;
    assert_eq!(
        list.ok(200),
        &json!({"execs": [exec.clone()], "next_after": null})
    );
    let list = send(&s.router, Req::get("/v1/execs?limit=1").token(&blue_key)).await;
    assert_eq!(
        list.ok(200),
        &json!({"execs": [exec.clone()], "next_after": exec_id})
    );
    let list = send(
        &s.router,
        Req::get(format!("/v1/execs?after={exec_id}")).token(&blue_key),
    )
    .await;
    assert_eq!(list.ok(200), &json!({"execs": [], "next_after": null}));
    let list = send(&s.router, Req::get("/v1/execs").token(&green_key)).await;
    assert_eq!(list.ok(200), &json!({"execs": [], "next_after": null}));
    // No output yet.
    let out = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}/output")).token(&blue_key),
    )
    .await;
    assert_eq!(
        out.ok(200),
        &json!({"pages": [], "terminal": false, "stopped": false, "next_seq": 1})
    );
    // Bad admissions: typed, nothing written.
    for (key, body, code) in [
        ("e-bad-1", small(&[]), "invalid_command"),
        ("e-bad-2", small(&[""]), "invalid_command"),
        (
            "e-bad-3",
            json!({"runtime": "base", "shape": "huge", "command": ["true"]}),
            "invalid_shape",
        ),
        (
            "e-bad-4",
            json!({"runtime": "nope", "shape": "small", "command": ["true"]}),
            "invalid_runtime",
        ),
        (
            "e-bad-5",
            json!({"runtime": "base", "shape": "small", "command": ["true"], "timeout_ms": 0}),
            "invalid_timeout",
        ),
    ] {
        send(&s.router, admit(key, body)).await.problem(422, code);
    }
    assert_eq!(balances(&s, blue).await["held"], 1);
    let list = send(&s.router, Req::get("/v1/execs").token(&blue_key)).await;
    assert_eq!(list.ok(200)["execs"].as_array().unwrap().len(), 1);
    // Cancel: replayable; the exec says so.
    let c = send(
        &s.router,
        Req::post(format!("/v1/execs/{exec_id}/cancel"))
            .token(&blue_key)
            .key("c-1"),
    )
    .await;
    let cancelled = c.ok(200).clone();
    assert_eq!(cancelled["exec_id"], json!(exec_id));
    assert_eq!(cancelled["cancel_requested"], true);
    let again = send(
        &s.router,
        Req::post(format!("/v1/execs/{exec_id}/cancel"))
            .token(&blue_key)
            .key("c-1"),
    )
    .await;
    assert_eq!(again.ok(200), &cancelled);
    // Blue's operation keys: its own scope; green sees none of them.
    let op = send(&s.router, Req::get("/v1/operations/e-1").token(&blue_key)).await;
    let op = op.ok(200).clone();
    assert_eq!(op["scope"], "tenant");
    assert_eq!(op["tenant_id"], json!(blue));
    assert_eq!(op["key"], "e-1");
    send(&s.router, Req::get("/v1/operations/e-1").token(&green_key))
        .await
        .problem(404, "not_found");
    let via_admin = send(
        &s.router,
        Req::get("/v1/operations/e-1").token(ADMIN).tenant(blue),
    )
    .await;
    assert_eq!(via_admin.ok(200), &op);
    let _ = green;
}

#[tokio::test]
async fn insufficient_capacity_changes_nothing() {
    let s = PgSvc::start().await;
    let (id, key) = tenant(&s, "tiny", 1).await;
    let before = json!({"tenant_id": id, "name": "tiny", "deposited": 1, "available": 1, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}});
    assert_eq!(balances(&s, id).await, before);
    // medium reserves 2 units; 1 is available.
    let r = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("m-1")
            .json(json!({"runtime": "base", "shape": "medium", "command": ["true"]})),
    )
    .await;
    r.problem(409, "insufficient_capacity")
        .detail("insufficient capacity: 2 units requested, 1 available; wait for the tenant's running execs to end (their units return) or cancel one, or have the admin deposit more units");
    assert_eq!(balances(&s, id).await, before);
    let list = send(&s.router, Req::get("/v1/execs").token(&key)).await;
    assert_eq!(list.ok(200), &json!({"execs": [], "next_after": null}));
    // The refused key was not recorded: it works for a request that fits.
    let ok = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("m-1")
            .json(small(&["true"])),
    )
    .await;
    ok.ok(201);
    assert_eq!(
        balances(&s, id).await,
        json!({"tenant_id": id, "name": "tiny", "deposited": 1, "available": 0, "held": 1, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}})
    );
    // Now nothing is left for another small one.
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("m-2")
            .json(small(&["true"])),
    )
    .await
    .problem(409, "insufficient_capacity")
    .detail("insufficient capacity: 1 units requested, 0 available; wait for the tenant's running execs to end (their units return) or cancel one, or have the admin deposit more units");
}

#[tokio::test]
async fn an_uncertain_cut_refuses_admission_and_writes_nothing() {
    let s = PgSvc::start().await;
    let (id, key) = tenant(&s, "blue", 4).await;
    let first = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("u-0")
            .json(small(&["true"])),
    )
    .await;
    let first = first.ok(201).clone();
    let before = balances(&s, id).await;
    assert_eq!(before["held"], 1);
    s.clock.force_uncertain(true);
    // A replay of a recorded admission still answers its result.
    let replay = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("u-0")
            .json(small(&["true"])),
    )
    .await;
    assert_eq!(replay.ok(201), &first);
    // A new admission: 503 with the reason and Retry-After, nothing written.
    let r = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("u-1")
            .json(small(&["true"])),
    )
    .await;
    r.uncertain("stale", "2");
    assert_eq!(balances(&s, id).await, before);
    let list = send(&s.router, Req::get("/v1/execs").token(&key)).await;
    assert_eq!(
        list.ok(200),
        &json!({"execs": [first.clone()], "next_after": null})
    );
    send(&s.router, Req::get("/v1/operations/u-1").token(&key))
        .await
        .problem(404, "not_found");
    // Nothing else admits a deadline: tenant creation, deposits and
    // cancel go on at the frozen cut.
    let late = send(
        &s.router,
        Req::post("/v1/tenants")
            .token(ADMIN)
            .key("u-t")
            .json(json!({"name": "late"})),
    )
    .await;
    let late_id = late.ok(201)["tenant_id"].as_i64().unwrap();
    assert_eq!(late.body["api_key"], json!(s.key_of(late_id)));
    let d = send(
        &s.router,
        Req::post(format!("/v1/tenants/{id}/deposits"))
            .token(ADMIN)
            .key("u-d")
            .json(json!({"units": 1})),
    )
    .await;
    assert_eq!(
        d.ok(200),
        &json!({"tenant_id": id, "name": "blue", "deposited": 5, "available": 4, "held": 1, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}})
    );
    let c = send(
        &s.router,
        Req::post(format!("/v1/execs/{}/cancel", first["exec_id"]))
            .token(&key)
            .key("u-c"),
    )
    .await;
    assert_eq!(c.ok(200)["cancel_requested"], true);
    let ready = send(&s.router, Req::get("/readyz")).await;
    ready
        .problem(503, "not_ready")
        .detail("not ready: the cut is uncertain (stale)");
    // Certain again: the same key admits.
    s.clock.force_uncertain(false);
    let ok = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("u-1")
            .json(small(&["true"])),
    )
    .await;
    assert_eq!(ok.ok(201)["state"], "admitted");
    let ready = send(&s.router, Req::get("/readyz")).await;
    let v = ready.ok(200);
    assert_eq!(v["ready"], true);
    assert_eq!(v["database_reachable"], true);
    assert_eq!(v["cut_certain"], true);
    assert_eq!(v["uncertain_reason"], Value::Null);
}

#[tokio::test]
async fn output_pages_in_order_with_exact_bytes() {
    let s = PgSvc::start().await;
    let (_, key) = tenant(&s, "blue", 2).await;
    let exec = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("o-1")
            .json(small(&["sh", "-c", "x"])),
    )
    .await;
    let exec_id = exec.ok(201)["exec_id"].as_i64().unwrap();
    let at = s.reading().await;
    let work = s.store.due_work(at, 10).await.expect("due work");
    let lease = work
        .iter()
        .find(|w| w.exec_id == ExecId(exec_id))
        .expect("lease");
    s.store
        .mark_active(lease.lease_id, lease.generation, at)
        .await
        .expect("active");
    let page = |seq: i64, kind: PageKind, bytes: &[u8], exit: Option<PageExit>| OutputPage {
        exec_id: ExecId(exec_id),
        attempt: AttemptNo(1),
        seq,
        kind,
        bytes: bytes.to_vec(),
        sha256: Digest::of(bytes),
        exit,
    };
    let binary: Vec<u8> = (0u8..=255).collect();
    s.store
        .append_pages(
            lease.lease_id,
            lease.generation,
            &[
                page(1, PageKind::Stdout, b"hello\n", None),
                page(2, PageKind::Stderr, b"warn\n", None),
                page(3, PageKind::Stdout, &binary, None),
            ],
        )
        .await
        .expect("append");
    let get = |q: &str| Req::get(format!("/v1/execs/{exec_id}/output{q}")).token(&key);
    let b64 = |b: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b)
    };
    let r = send(&s.router, get("")).await;
    assert_eq!(
        r.ok(200),
        &json!({
            "pages": [
                {"seq": 1, "kind": "stdout", "data_b64": b64(b"hello\n"), "sha256": Digest::of(b"hello\n").to_hex(), "exit": null},
                {"seq": 2, "kind": "stderr", "data_b64": b64(b"warn\n"), "sha256": Digest::of(b"warn\n").to_hex(), "exit": null},
                {"seq": 3, "kind": "stdout", "data_b64": b64(&binary), "sha256": Digest::of(&binary).to_hex(), "exit": null},
            ],
            "terminal": false,
            "stopped": false,
            "next_seq": 4,
        })
    );
    let r = send(&s.router, get("?after_seq=1&limit=1")).await;
    let v = r.ok(200);
    assert_eq!(v["pages"].as_array().unwrap().len(), 1);
    assert_eq!(v["pages"][0]["seq"], 2);
    assert_eq!(v["next_seq"], 3);
    s.store
        .append_pages(
            lease.lease_id,
            lease.generation,
            &[page(4, PageKind::Terminal, b"", Some(PageExit::exited(7)))],
        )
        .await
        .expect("terminal page");
    let r = send(&s.router, get("?after_seq=3")).await;
    assert_eq!(
        r.ok(200),
        &json!({
            "pages": [{"seq": 4, "kind": "terminal", "data_b64": "", "sha256": Digest::of(b"").to_hex(), "exit": {"code": 7, "signal": null}}],
            "terminal": true,
            "stopped": false,
            "next_seq": 5,
        })
    );
    // The largest after_seq whose next seq is still an i64, and one past it.
    let r = send(&s.router, get("?after_seq=9223372036854775806")).await;
    assert_eq!(
        r.ok(200),
        &json!({"pages": [], "terminal": false, "stopped": false, "next_seq": i64::MAX})
    );
    send(&s.router, get("?after_seq=9223372036854775807"))
        .await
        .problem(400, "invalid_query")
        .detail(
            "invalid query: after_seq must be in 0..=9223372036854775806, got 9223372036854775807",
        );
    let _ = TenantId(0);
}

#[tokio::test]
async fn a_finished_exec_is_terminal_with_its_units_back() {
    let s = PgSvc::start().await;
    let (id, key) = tenant(&s, "blue", 2).await;
    let exec = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("f-1")
            .json(small(&["false"])),
    )
    .await;
    let exec_id = exec.ok(201)["exec_id"].as_i64().unwrap();
    assert_eq!(balances(&s, id).await["held"], 1);
    s.run_exec(
        exec_id,
        &[(PageKind::Terminal, b"", Some(PageExit::exited(1)))],
    )
    .await;
    let done = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}")).token(&key),
    )
    .await;
    let done = done.ok(200);
    assert_eq!(done["state"], "terminal");
    assert_eq!(done["terminal_reason"], "exited");
    assert_eq!(done["exit_code"], 1);
    assert_eq!(
        balances(&s, id).await,
        json!({"tenant_id": id, "name": "blue", "deposited": 2, "available": 2, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}})
    );
    let out = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}/output?after_seq=1")).token(&key),
    )
    .await;
    assert_eq!(
        out.ok(200),
        &json!({"pages": [], "terminal": true, "stopped": false, "next_seq": 2})
    );
    // Cancel of a terminal exec returns it as it is.
    let c = send(
        &s.router,
        Req::post(format!("/v1/execs/{exec_id}/cancel"))
            .token(&key)
            .key("f-c"),
    )
    .await;
    assert_eq!(c.ok(200)["state"], "terminal");
}

/// An exec that expired with output but no terminal page (its instance
/// was lost): its page set is final once the exec is terminal, so the
/// answer that reaches the end says `terminal`, and one cut short by
/// `limit` does not.
#[tokio::test]
async fn an_expired_exec_s_last_pages_are_terminal() {
    use lc_core::model::TerminalReason;
    let s = PgSvc::start().await;
    let (id, key) = tenant(&s, "blue", 2).await;
    let exec = send(
        &s.router,
        Req::post("/v1/execs").token(&key).key("x-1").json(
            json!({"runtime": "base", "shape": "small", "command": ["sh", "-c", "x"], "timeout_ms": 200}),
        ),
    )
    .await;
    let exec_id = exec.ok(201)["exec_id"].as_i64().unwrap();
    // Two pages and no terminal page, then the expiry.
    s.run_exec(
        exec_id,
        &[
            (PageKind::Stdout, b"one\n", None),
            (PageKind::Stdout, b"two\n", None),
        ],
    )
    .await;
    s.end_exec_unstarted(exec_id, TerminalReason::Expired).await;
    let done = send(
        &s.router,
        Req::get(format!("/v1/execs/{exec_id}")).token(&key),
    )
    .await;
    let done = done.ok(200);
    // Its 200 ms timeout passed long before its 60 s Lease would have.
    assert_eq!(
        (&done["terminal_reason"], &done["expired_by"]),
        (&json!("expired"), &json!("timeout"))
    );
    assert_eq!(balances(&s, id).await["available"], 2);
    let get = |q: &str| Req::get(format!("/v1/execs/{exec_id}/output{q}")).token(&key);
    let r = send(&s.router, get("")).await;
    let v = r.ok(200);
    assert_eq!(v["pages"].as_array().unwrap().len(), 2);
    assert_eq!(
        (&v["terminal"], &v["stopped"], &v["next_seq"]),
        (&json!(true), &json!(false), &json!(3))
    );
    // Cut short by the limit: page 2 is still to come.
    let r = send(&s.router, get("?limit=1")).await;
    let v = r.ok(200);
    assert_eq!(v["pages"][0]["seq"], 1);
    assert_eq!((&v["terminal"], &v["next_seq"]), (&json!(false), &json!(2)));
    let r = send(&s.router, get("?after_seq=1&limit=1")).await;
    let v = r.ok(200);
    assert_eq!(v["pages"][0]["seq"], 2);
    assert_eq!((&v["terminal"], &v["next_seq"]), (&json!(true), &json!(3)));
}

/// Output staged and acked by a gateway: the bytes live in the sink, and
/// the API serves them verified, never a corrupt or missing blob.
#[tokio::test]
async fn gateway_output_is_served_from_the_sink_verified() {
    use lc_blob::BlobStore as _;
    use lc_core::owner::{OwnerCredential, OwnerToken, PageMeta};
    use lc_core::page::Page;
    use lc_core::store::GatewayStore as _;
    let dir = std::env::temp_dir().join(format!("lc-api-sink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sink = std::sync::Arc::new(lc_blob::LocalBlobStore::open(&dir).expect("sink"));
    let s = PgSvc::start_with(lc_api::ServiceOptions {
        sink: Some(sink.clone()),
        ..lc_api::ServiceOptions::default()
    })
    .await;
    let (_, key) = tenant(&s, "blue", 2).await;
    let exec = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("o-1")
            .json(small(&["sh", "-c", "x"])),
    )
    .await;
    let exec_id = ExecId(exec.ok(201)["exec_id"].as_i64().unwrap());
    let at = s.reading().await;
    let work = s.store.due_work(at, 10).await.expect("due work");
    let lease = work.iter().find(|w| w.exec_id == exec_id).expect("lease");
    s.store
        .mark_active(lease.lease_id, lease.generation, at)
        .await
        .expect("active");
    let token = OwnerToken::from_bytes([9; 32]);
    let owned = s
        .store
        .claim(
            &token,
            s.reading().await,
            jiff::SignedDuration::from_secs(30),
            1,
        )
        .await
        .expect("claim");
    assert_eq!(owned.len(), 1);
    let cred = OwnerCredential {
        token,
        generation: owned[0].ownership.generation,
        fence: owned[0].ownership.fence,
    };
    let binary: Vec<u8> = (0u8..=255).rev().collect();
    let pages = [
        Page::data(1, PageKind::Stdout, b"hello\n".to_vec()).unwrap(),
        Page::data(2, PageKind::Stderr, binary.clone()).unwrap(),
        Page::data(3, PageKind::Stdout, b"pending".to_vec()).unwrap(),
    ];
    let metas: Vec<PageMeta> = pages
        .iter()
        .map(|p| PageMeta::of_page(exec_id, AttemptNo(1), p))
        .collect();
    s.store
        .stage_pages(&cred, exec_id, s.reading().await, &metas)
        .await
        .expect("stage");
    for p in &pages[..2] {
        sink.put(&Digest(p.sha256()), p.bytes()).expect("put");
    }
    s.store
        .ack_pages(&cred, exec_id, s.reading().await, "ack-1-2", 2)
        .await
        .expect("ack");
    let get = || Req::get(format!("/v1/execs/{}/output", exec_id.0)).token(&key);
    let b64 = |b: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b)
    };
    let r = send(&s.router, get()).await;
    let body = r.ok(200);
    // Only the acked pages; the pending one is not readable yet.
    assert_eq!(body["next_seq"], 3);
    assert_eq!(body["terminal"], false);
    let got: Vec<(i64, String, String, String)> = body["pages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["seq"].as_i64().unwrap(),
                p["kind"].as_str().unwrap().to_string(),
                p["data_b64"].as_str().unwrap().to_string(),
                p["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                1,
                "stdout".into(),
                b64(b"hello\n"),
                Digest::of(b"hello\n").to_hex()
            ),
            (
                2,
                "stderr".into(),
                b64(&binary),
                Digest::of(&binary).to_hex()
            ),
        ]
    );
    // A damaged blob is refused, never served.
    let blob = sink.path_of(&Digest::of(&binary));
    std::fs::write(&blob, b"damaged").unwrap();
    send(&s.router, get()).await.problem(500, "blob_corrupt");
    std::fs::remove_file(&blob).unwrap();
    send(&s.router, get()).await.problem(500, "blob_missing");
    // From after the damaged page, the rest is still served.
    let r = send(
        &s.router,
        Req::get(format!("/v1/execs/{}/output?after_seq=2", exec_id.0)).token(&key),
    )
    .await;
    assert_eq!(r.ok(200)["pages"], json!([]));
    let _ = std::fs::remove_dir_all(&dir);

    // A service without a sink cannot serve the gateway's pages.
    let (router, _) = lc_api::build(
        s.store.clone(),
        s.clock.clone(),
        lc_api::auth::AdminDigest::of_token(ADMIN).expect("admin"),
        s.secret.clone(),
        lc_api::ServiceOptions::default(),
    );
    send(&router, get())
        .await
        .problem(503, "sink_unavailable")
        .detail("the bytes of output page 1 cannot be served (sink_unavailable); retry later, or ask the operator to check the blob directory");
}

#[tokio::test]
async fn stdin_input_is_queued_replayed_delivered_and_refused() {
    use base64::Engine as _;
    use lc_core::owner::{OwnerCredential, OwnerToken};
    use lc_core::store::GatewayStore as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let s = PgSvc::start().await;
    let (_, key) = tenant(&s, "blue", 4).await;
    let admit = |k: &str, body: Value| Req::post("/v1/execs").token(&key).key(k).json(body);
    let mut open_body = small(&["cat"]);
    open_body["stdin_open"] = json!(true);
    let open = send(&s.router, admit("e-open", open_body.clone())).await;
    let open_id = open.ok(201)["exec_id"].as_i64().unwrap();
    let closed = send(&s.router, admit("e-closed", small(&["cat"]))).await;
    let closed_id = closed.ok(201)["exec_id"].as_i64().unwrap();
    // `stdin_open: false` is the default and keeps the request's digest.
    let mut explicit = small(&["cat"]);
    explicit["stdin_open"] = json!(false);
    assert_eq!(
        send(&s.router, admit("e-closed", explicit)).await.ok(201)["exec_id"],
        json!(closed_id)
    );
    // The body with stdin_open under another key is another exec.
    send(&s.router, admit("e-open", small(&["cat"])))
        .await
        .problem(409, "idempotency_conflict");

    let input = |exec: i64, k: &str, body: Value| {
        Req::post(format!("/v1/execs/{exec}/input"))
            .token(&key)
            .key(k)
            .json(body)
    };
    let hello = b"hello\n";
    let r = send(
        &s.router,
        input(open_id, "i-1", json!({"data_b64": b64(hello)})),
    )
    .await;
    let first = json!({
        "exec_id": open_id,
        "input_seq": 1,
        "length": 6,
        "sha256": Digest::of(hello).to_hex(),
        "eof": false,
        "state": "queued",
    });
    assert_eq!(r.ok(201), &first);
    // A replay answers the same input; other bytes under the key conflict.
    assert_eq!(
        send(
            &s.router,
            input(
                open_id,
                "i-1",
                json!({"data_b64": b64(hello), "eof": false})
            )
        )
        .await
        .ok(201),
        &first
    );
    send(
        &s.router,
        input(open_id, "i-1", json!({"data_b64": b64(b"other")})),
    )
    .await
    .problem(409, "idempotency_conflict");
    send(
        &s.router,
        input(open_id, "i-1", json!({"data_b64": b64(hello), "eof": true})),
    )
    .await
    .problem(409, "idempotency_conflict");
    // Bad bodies: nothing queued.
    send(
        &s.router,
        input(open_id, "i-bad", json!({"data_b64": "not base64!"})),
    )
    .await
    .problem(422, "invalid_input");
    send(
        &s.router,
        input(
            open_id,
            "i-big",
            json!({"data_b64": b64(&vec![b'x'; lc_core::page::INPUT_BYTES_MAX + 1])}),
        ),
    )
    .await
    .problem(422, "invalid_input")
    .detail("invalid input: 65537 bytes is more than the 65536 one input carries; split it");
    send(
        &s.router,
        input(open_id, "i-empty", json!({"data_b64": ""})),
    )
    .await
    .problem(422, "invalid_input")
    .detail("invalid input: an input of no bytes must close stdin (eof: true)");
    send(
        &s.router,
        input(open_id, "i-x", json!({"data_b64": "", "extra": 1})),
    )
    .await
    .problem(422, "invalid_body");
    send(
        &s.router,
        input(closed_id, "i-c", json!({"data_b64": b64(hello)})),
    )
    .await
    .problem(409, "stdin_not_open")
    .detail(&format!(
        "exec {closed_id} was admitted without stdin_open: its command reads no input"
    ));
    send(
        &s.router,
        input(999, "i-404", json!({"data_b64": b64(hello)})),
    )
    .await
    .problem(404, "not_found");

    // The owner delivers input 1: a replay of its key now says `sent`.
    let at = s.reading().await;
    let work = s.store.due_work(at, 10).await.expect("due work");
    let lease = work
        .iter()
        .find(|w| w.exec_id == ExecId(open_id))
        .expect("lease");
    s.store
        .mark_active(lease.lease_id, lease.generation, at)
        .await
        .expect("active");
    let token = OwnerToken::from_bytes([7; 32]);
    let owned = s
        .store
        .claim(
            &token,
            s.reading().await,
            jiff::SignedDuration::from_secs(30),
            1,
        )
        .await
        .expect("claim");
    assert_eq!(owned.len(), 1);
    let cred = OwnerCredential {
        token,
        generation: owned[0].ownership.generation,
        fence: owned[0].ownership.fence,
    };
    let queued = s
        .store
        .queued_inputs(&cred, ExecId(open_id), s.reading().await, 16)
        .await
        .expect("queued");
    assert_eq!(
        queued
            .iter()
            .map(|i| (i.input_seq, i.bytes.clone()))
            .collect::<Vec<_>>(),
        vec![(1, hello.to_vec())]
    );
    s.store
        .record_send(&cred, ExecId(open_id), s.reading().await, "send-1-1-g1", 1)
        .await
        .expect("record send");
    let mut sent = first.clone();
    sent["state"] = json!("sent");
    assert_eq!(
        send(
            &s.router,
            input(open_id, "i-1", json!({"data_b64": b64(hello)}))
        )
        .await
        .ok(201),
        &sent
    );

    // The queue holds at most 16 inputs: the 17th waits (429, Retry-After).
    for n in 2..=17 {
        let r = send(
            &s.router,
            input(
                open_id,
                &format!("i-{n}"),
                json!({"data_b64": b64(format!("{n}\n").as_bytes())}),
            ),
        )
        .await;
        assert_eq!(r.ok(201)["input_seq"], json!(n));
    }
    let full = send(
        &s.router,
        input(open_id, "i-18", json!({"data_b64": b64(b"18\n")})),
    )
    .await;
    full.problem(429, "input_queue_full").detail(&format!(
        "exec {open_id}: the input queue holds 16 inputs of 40 bytes (at most 16 inputs and 262144 bytes); retry once some are delivered"
    ));
    assert_eq!(
        full.headers
            .get(axum::http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    // Once one is delivered there is room again; eof closes stdin.
    s.store
        .record_send(&cred, ExecId(open_id), s.reading().await, "send-1-2-g1", 2)
        .await
        .expect("record send 2");
    let eof = send(
        &s.router,
        input(
            open_id,
            "i-18",
            json!({"data_b64": b64(b"18\n"), "eof": true}),
        ),
    )
    .await;
    assert_eq!(
        (eof.ok(201)["input_seq"].clone(), eof.body["eof"].clone()),
        (json!(18), json!(true))
    );
    send(
        &s.router,
        input(open_id, "i-19", json!({"data_b64": b64(b"19\n")})),
    )
    .await
    .problem(409, "input_closed")
    .detail(&format!(
        "exec {open_id}: stdin was closed by input 18; nothing more is accepted"
    ));

    // A terminal exec takes no input.
    let mut done_body = small(&["cat"]);
    done_body["stdin_open"] = json!(true);
    let done = send(&s.router, admit("e-done", done_body)).await;
    let done_id = done.ok(201)["exec_id"].as_i64().unwrap();
    s.run_exec(
        done_id,
        &[(
            PageKind::Terminal,
            b"",
            Some(PageExit {
                code: Some(0),
                signal: None,
            }),
        )],
    )
    .await;
    send(
        &s.router,
        input(done_id, "i-d", json!({"data_b64": b64(hello)})),
    )
    .await
    .problem(409, "exec_terminal");

    // The route is in the OpenAPI document, with the body's members.
    let doc = send(&s.router, Req::get("/v1/openapi.json")).await;
    let doc = doc.ok(200);
    let post = &doc["paths"]["/v1/execs/{exec_id}/input"]["post"];
    assert_eq!(
        post["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        json!("#/components/schemas/SendInputBody")
    );
    assert!(post["responses"]["201"].is_object(), "{post}");
    assert!(post["responses"]["429"].is_object(), "{post}");
    let body_schema = &doc["components"]["schemas"]["SendInputBody"]["properties"];
    assert_eq!(
        body_schema.as_object().map(|o| {
            let mut k: Vec<&str> = o.keys().map(String::as_str).collect();
            k.sort_unstable();
            k
        }),
        Some(vec!["data_b64", "eof"])
    );
    assert_eq!(
        doc["components"]["schemas"]["CreateExecBody"]["properties"]["stdin_open"]["type"],
        json!("boolean")
    );
}

#[tokio::test]
async fn a_deposit_past_the_balance_limit_says_so_and_changes_nothing() {
    let s = PgSvc::start().await;
    let (id, _) = tenant(&s, "full", 8).await;
    let dep = |key: &str, units: i64| {
        Req::post(format!("/v1/tenants/{id}/deposits"))
            .token(ADMIN)
            .key(key)
            .json(json!({"units": units}))
    };
    let largest = i64::MAX - 8;
    send(&s.router, dep("d-over", 4_611_686_018_427_387_904)).await;
    let r = send(&s.router, dep("d-huge", i64::MAX)).await;
    r.problem(409, "units_overflow").detail(&format!(
        "a deposit of {} units into tenant {id} would carry its balance past the limit of {} units: it holds 4611686018427387912 deposited units, so the largest deposit it accepts now is {}",
        i64::MAX,
        i64::MAX,
        largest - 4_611_686_018_427_387_904
    ));
    let want = json!({"tenant_id": id, "name": "full", "deposited": 4_611_686_018_427_387_912_i64, "available": 4_611_686_018_427_387_912_i64, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}});
    assert_eq!(balances(&s, id).await, want);
    // The largest deposit it accepts is accepted.
    let d = send(
        &s.router,
        dep("d-last", largest - 4_611_686_018_427_387_904),
    )
    .await;
    assert_eq!(d.ok(200)["deposited"], json!(i64::MAX));
    let r = send(&s.router, dep("d-one", 1)).await;
    r.problem(409, "units_overflow").detail(&format!(
        "a deposit of 1 units into tenant {id} would carry its balance past the limit of {} units: it holds {} deposited units, so the largest deposit it accepts now is 0",
        i64::MAX,
        i64::MAX
    ));
    assert_eq!(balances(&s, id).await["deposited"], json!(i64::MAX));
}

#[tokio::test]
async fn the_claims_list_is_admin_only_and_judges_each_claim_at_the_cut() {
    use lc_core::claim::ClaimHolder;
    let s = PgSvc::start().await;
    let (_, key) = tenant(&s, "blue", 2).await;
    for i in 0..2 {
        send(
            &s.router,
            Req::post("/v1/execs")
                .token(&key)
                .key(&format!("e-{i}"))
                .json(small(&["sleep", "60"])),
        )
        .await
        .ok(201);
    }
    let list = |q: &str| Req::get(format!("/v1/claims{q}"));
    // Nothing claimed yet.
    let b = send(&s.router, list("").token(ADMIN)).await;
    assert_eq!(
        (&b.ok(200)["claims"], &b.body["next_after_lease"]),
        (&json!([]), &Value::Null)
    );
    // A worker activation claims both Leases (the store's defaults: a 10 s
    // TTL, a 2 s grace).
    let holder = ClaimHolder::from_bytes([0x42; 16]);
    let at = s.reading().await;
    let won = s.store.claim_due_work(&holder, at, 10).await.unwrap();
    assert_eq!(won.len(), 2);
    let expiry = won[0].expiry;
    assert_eq!(expiry, at.cut + jiff::SignedDuration::from_secs(10));
    let view = |lease: i64| {
        json!({
            "item_kind": "lease",
            "item_id": lease,
            "holder_sha256": holder.sha256().to_hex(),
            "generation": 1,
            "expiry": expiry,
            "basis": "unowned",
            "expired": false,
            "takeable": false,
        })
    };
    let (l0, l1) = (won[0].work.lease_id.0, won[1].work.lease_id.0);
    let b = send(&s.router, list("").token(ADMIN)).await;
    let body = b.ok(200);
    assert_eq!(body["certain"], json!(true));
    assert_eq!(body["claims"], json!([view(l0), view(l1)]));
    assert_eq!(body["next_after_lease"], Value::Null);
    // Paged by Lease id.
    let b = send(&s.router, list("?limit=1").token(ADMIN)).await;
    assert_eq!(
        (&b.ok(200)["claims"], &b.body["next_after_lease"]),
        (&json!([view(l0)]), &json!(l0))
    );
    let b = send(&s.router, list(&format!("?after_lease={l0}")).token(ADMIN)).await;
    assert_eq!(b.ok(200)["claims"], json!([view(l1)]));
    // Uncertain: the same claims, neither expired nor takeable.
    s.clock.force_uncertain(true);
    let b = send(&s.router, list("").token(ADMIN)).await;
    assert_eq!(
        (&b.ok(200)["certain"], &b.body["claims"]),
        (&json!(false), &json!([view(l0), view(l1)]))
    );
    s.clock.force_uncertain(false);
    // Refusals: no credential, a tenant's key, a bad query.
    send(&s.router, list(""))
        .await
        .problem(401, "unauthenticated");
    send(&s.router, list("").token(&key))
        .await
        .problem(403, "forbidden");
    send(&s.router, list("?limit=0").token(ADMIN))
        .await
        .problem(422, "invalid_limit");
    send(&s.router, list("?after_lease=-1").token(ADMIN))
        .await
        .problem(400, "invalid_query");
    send(&s.router, list("?lease=1").token(ADMIN))
        .await
        .problem(400, "invalid_query");
}

#[tokio::test]
async fn approvals_gate_admission_and_are_decided_through_the_router() {
    let s = PgSvc::start().await;
    let (blue, blue_key) = tenant(&s, "blue", 2).await;
    let (_green, green_key) = tenant(&s, "green", 2).await;
    let policy = |id: i64| format!("/v1/tenants/{id}/approval-policy");
    let put = |path: String| Req::new(axum::http::Method::PUT, path);
    // Admin only, the credential before the path; the body checked.
    send(
        &s.router,
        put("/v1/tenants/abc/approval-policy".into()).json(json!({"require": "all"})),
    )
    .await
    .problem(401, "unauthenticated");
    send(
        &s.router,
        put(policy(blue))
            .token(&blue_key)
            .key("p")
            .json(json!({"require": "all"})),
    )
    .await
    .problem(403, "forbidden");
    send(
        &s.router,
        put(policy(blue))
            .token(ADMIN)
            .json(json!({"require": "all"})),
    )
    .await
    .problem(400, "idempotency_key_required");
    send(
        &s.router,
        put(policy(blue))
            .token(ADMIN)
            .key("p")
            .json(json!({"require": "maybe"})),
    )
    .await
    .problem(422, "invalid_approval_policy");
    send(
        &s.router,
        put(policy(blue))
            .token(ADMIN)
            .key("p")
            .json(json!({"require": "shapes", "shapes": ["huge"]})),
    )
    .await
    .problem(422, "invalid_shape");
    send(
        &s.router,
        put(policy(999))
            .token(ADMIN)
            .key("p9")
            .json(json!({"require": "all"})),
    )
    .await
    .problem(404, "not_found");
    let set = send(
        &s.router,
        put(policy(blue))
            .token(ADMIN)
            .key("p")
            .json(json!({"require": "network"})),
    )
    .await;
    let want = json!({"tenant_id": blue, "name": "blue", "deposited": 2, "available": 2, "held": 0, "consumed": 0,
                      "approval_policy": {"require": "network", "shapes": []}});
    assert_eq!(set.ok(200), &want);
    assert_eq!(balances(&s, blue).await, want);

    // A gated admission: awaiting_approval, no units held.
    let net = |cmd: &[&str]| json!({"runtime": "base", "shape": "small-net", "command": cmd});
    let admit =
        |key: &str, body: Value| Req::post("/v1/execs").token(&blue_key).key(key).json(body);
    let a = send(&s.router, admit("n-1", net(&["curl", "a"])))
        .await
        .ok(201)
        .clone();
    assert_eq!(
        (a["state"].clone(), a["approval"].clone()),
        (json!("awaiting_approval"), Value::Null)
    );
    let b = send(&s.router, admit("n-2", net(&["curl", "b"])))
        .await
        .ok(201)
        .clone();
    let c = send(&s.router, admit("n-3", net(&["curl", "c"])))
        .await
        .ok(201)
        .clone();
    let plain = send(&s.router, admit("s-1", small(&["true"])))
        .await
        .ok(201)
        .clone();
    assert_eq!(plain["state"], "admitted");
    assert_eq!(balances(&s, blue).await["held"], 1);
    let (a_id, b_id, c_id) = (
        a["exec_id"].as_i64().unwrap(),
        b["exec_id"].as_i64().unwrap(),
        c["exec_id"].as_i64().unwrap(),
    );

    send(&s.router, Req::get("/v1/approvals"))
        .await
        .problem(401, "unauthenticated");
    let list = send(&s.router, Req::get("/v1/approvals").token(&blue_key)).await;
    assert_eq!(
        list.ok(200),
        &json!({"awaiting": [a.clone(), b.clone(), c.clone()], "decisions": []})
    );
    assert_eq!(
        send(
            &s.router,
            Req::get("/v1/approvals?limit=1").token(ADMIN).tenant(blue)
        )
        .await
        .ok(200)["awaiting"],
        json!([a.clone()])
    );
    send(
        &s.router,
        Req::get("/v1/approvals?limit=0").token(&blue_key),
    )
    .await
    .problem(422, "invalid_limit");

    // Who may decide: a credential first (even before a bad path), then
    // the acting tenant's own key or the admin with Lc-Tenant.
    let approve = |id: i64| Req::post(format!("/v1/execs/{id}/approve"));
    send(&s.router, Req::post("/v1/execs/abc/approve"))
        .await
        .problem(401, "unauthenticated");
    send(
        &s.router,
        Req::post("/v1/execs/abc/deny").token("nope-not-a-key"),
    )
    .await
    .problem(401, "unauthenticated");
    send(&s.router, approve(a_id).token(&green_key).key("g"))
        .await
        .problem(404, "not_found");
    send(
        &s.router,
        approve(a_id).token(&green_key).tenant(blue).key("g"),
    )
    .await
    .problem(403, "forbidden");
    send(&s.router, approve(a_id).token(ADMIN).key("g"))
        .await
        .problem(400, "tenant_required");
    send(&s.router, approve(a_id).token(&blue_key))
        .await
        .problem(400, "idempotency_key_required");
    let before = support::pg::snapshot(&s.url, &["tollgate_safetime"]).await;
    send(
        &s.router,
        approve(a_id)
            .token(&blue_key)
            .key("v0")
            .json(json!({"validity_ms": 0})),
    )
    .await
    .problem(422, "invalid_validity");
    send(
        &s.router,
        approve(plain["exec_id"].as_i64().unwrap())
            .token(&blue_key)
            .key("v1"),
    )
    .await
    .problem(409, "exec_not_awaiting_approval");
    s.clock.force_uncertain(true);
    send(&s.router, approve(a_id).token(&blue_key).key("ap-a"))
        .await
        .uncertain("stale", "2");
    send(
        &s.router,
        Req::post(format!("/v1/execs/{b_id}/deny"))
            .token(&blue_key)
            .key("dn-b"),
    )
    .await
    .problem(503, "time_uncertain");
    s.clock.force_uncertain(false);
    assert_eq!(
        support::pg::snapshot(&s.url, &["tollgate_safetime"]).await,
        before
    );

    // The tenant approves: admitted, one unit held, valid for 60 s on the
    // cut; a replay is the same record; a second decision is refused.
    let ok = send(
        &s.router,
        approve(a_id)
            .token(&blue_key)
            .key("ap-a")
            .json(json!({"validity_ms": 60_000})),
    )
    .await
    .ok(200)
    .clone();
    assert_eq!(ok["state"], "admitted");
    let ap = &ok["approval"];
    assert_eq!(
        (
            ap["decision"].clone(),
            ap["approver"].clone(),
            ap["validity_ms"].clone()
        ),
        (json!("approved"), json!("tenant"), json!(60_000))
    );
    assert_eq!(
        ts(ap["valid_until"].as_str().unwrap()),
        ts(ap["decided_cut"].as_str().unwrap()) + jiff::SignedDuration::from_secs(60)
    );
    assert_eq!(balances(&s, blue).await["held"], 2);
    assert_eq!(
        send(
            &s.router,
            approve(a_id)
                .token(&blue_key)
                .key("ap-a")
                .json(json!({"validity_ms": 60_000}))
        )
        .await
        .ok(200),
        &ok
    );
    send(
        &s.router,
        approve(a_id)
            .token(&blue_key)
            .key("ap-a")
            .json(json!({"validity_ms": 1})),
    )
    .await
    .problem(409, "idempotency_conflict");
    send(
        &s.router,
        approve(a_id).token(ADMIN).tenant(blue).key("ap-a2"),
    )
    .await
    .problem(409, "exec_not_awaiting_approval");
    assert_eq!(
        send(
            &s.router,
            Req::get(format!("/v1/execs/{a_id}")).token(&blue_key)
        )
        .await
        .ok(200),
        &ok
    );

    // The admin denies b with a reason; the tenant cancels c.
    let denied = send(
        &s.router,
        Req::post(format!("/v1/execs/{b_id}/deny"))
            .token(ADMIN)
            .tenant(blue)
            .key("dn-b")
            .json(json!({"reason": "no network today"})),
    )
    .await
    .ok(200)
    .clone();
    assert_eq!(
        (denied["state"].clone(), denied["terminal_reason"].clone()),
        (json!("terminal"), json!("denied"))
    );
    assert_eq!(
        (
            denied["approval"]["decision"].clone(),
            denied["approval"]["approver"].clone(),
            denied["approval"]["reason"].clone(),
            denied["approval"]["valid_until"].clone()
        ),
        (
            json!("denied"),
            json!("admin"),
            json!("no network today"),
            Value::Null
        )
    );
    send(
        &s.router,
        Req::post(format!("/v1/execs/{b_id}/deny"))
            .token(&blue_key)
            .key("dn-b2"),
    )
    .await
    .problem(409, "exec_not_awaiting_approval");
    send(
        &s.router,
        Req::post(format!("/v1/execs/{c_id}/deny"))
            .token(&blue_key)
            .key("dn-c")
            .json(json!({"reason": "x".repeat(513)})),
    )
    .await
    .problem(422, "invalid_name");
    let cancelled = send(
        &s.router,
        Req::post(format!("/v1/execs/{c_id}/cancel"))
            .token(&blue_key)
            .key("c-c"),
    )
    .await
    .ok(200)
    .clone();
    assert_eq!(
        (
            cancelled["state"].clone(),
            cancelled["terminal_reason"].clone()
        ),
        (json!("terminal"), json!("cancelled"))
    );
    assert_eq!(balances(&s, blue).await["held"], 2);
    let list = send(&s.router, Req::get("/v1/approvals").token(&blue_key)).await;
    assert_eq!(
        list.ok(200),
        &json!({"awaiting": [], "decisions": [denied["approval"].clone(), ok["approval"].clone()]})
    );

    // The routes are in the OpenAPI document.
    let doc = send(&s.router, Req::get("/v1/openapi.json")).await;
    let doc = doc.ok(200);
    assert!(doc["paths"]["/v1/tenants/{tenant_id}/approval-policy"]["put"].is_object());
    assert!(doc["paths"]["/v1/approvals"]["get"].is_object());
    for schema in [
        "ApprovalPolicyView",
        "ApproveBody",
        "DenyBody",
        "ApprovalView",
        "ApprovalList",
    ] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
}
