//! Hibernation, resume and workspaces over the real router on the real
//! store, with snapshot blobs in a real blob directory: the hibernate
//! route's record, replay and refusal; the resume route's refusals and
//! recorded request; the exec's view of its idle TTL, timeout action,
//! head, hibernation and resume; the workspace, snapshot list, tree and
//! file routes with exact entries and bytes; a corrupt blob never served;
//! paths that leave the tree refused; another tenant's exec not found;
//! and output that goes on past a stopped page.

mod support;

use base64::Engine as _;
use lc_blob::LocalBlobStore;
use lc_core::model::{Digest, ExecId, Generation, PageExit, PageKind};
use serde_json::{Value, json};
use support::pg::{PgSvc, psql};
use support::ws::{self, Running};
use support::{Req, send};

/// The service with `blobs` as its blob directory.
async fn start(what: &str) -> (PgSvc, LocalBlobStore, std::path::PathBuf) {
    let dir = ws::temp_dir(what);
    let blobs = LocalBlobStore::open(dir.join("blobs")).expect("blobs");
    let s = PgSvc::start_with(lc_api::ServiceOptions {
        sink: Some(std::sync::Arc::new(blobs.clone())),
        ..lc_api::ServiceOptions::default()
    })
    .await;
    (s, blobs, dir)
}

/// The sealed cut of the exec's hibernation of generation 1, as the
/// database holds it, in nanoseconds since the epoch.
async fn sealed_ns(s: &PgSvc, exec: i64) -> i128 {
    let out = psql(
        &s.url,
        format!(
            "SELECT sealed_floor_us * 1000 + sealed_submicro_ns FROM lc_hibernations \
              WHERE exec_id = {exec} AND generation = 1;\n"
        ),
    )
    .await;
    out.trim().parse().expect("nanoseconds")
}

fn ns_of(v: &Value) -> i128 {
    support::ts(v.as_str().expect("an instant")).as_nanosecond()
}

fn exec_body() -> Value {
    json!({
        "runtime": "base", "shape": "small", "command": ["sleep", "9"],
        "idle_ttl_ms": 600000, "on_timeout": "hibernate"
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernate_resume_and_the_workspace_routes() {
    let (s, blobs, dir) = start("routes").await;
    let (t, key) = ws::tenant(&s, "acme", 10).await;
    let (_, other_key) = ws::tenant(&s, "other", 10).await;
    let r: Running = ws::running(&s, t, &key, "x1", exec_body()).await;
    let x = r.exec_id;
    assert_eq!(r.admitted["idle_ttl_ms"], json!(600000));
    assert_eq!(r.admitted["on_timeout"], json!("hibernate"));
    assert_eq!(r.admitted["workspace_head"], Value::Null);
    assert_eq!(r.admitted["hibernation"], Value::Null);
    assert_eq!(r.admitted["resume"], Value::Null);
    let exec_path = format!("/v1/execs/{x}");

    // Resume on a running exec: not parked, with or without a head.
    send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&key)
            .key("r0"),
    )
    .await
    .problem(409, "exec_not_parked");
    send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&key)
            .key("r0b")
            .json(json!({"head": "ab".repeat(32)})),
    )
    .await
    .problem(409, "exec_not_parked");

    // Hibernate: 202 with the sealed record, the replay the same, a second
    // key refused.
    let h = send(
        &s.router,
        Req::post(format!("{exec_path}/hibernate"))
            .token(&key)
            .key("h1"),
    )
    .await;
    let sealed = h.ok(202).clone();
    assert_eq!(
        sealed,
        json!({
            "exec_id": x, "attempt": 1, "generation": 1, "lease_id": r.lease_id.0,
            "reason": "requested", "sealed_cut": sealed["sealed_cut"], "step": "sealed",
            "head": null, "refusal": null
        })
    );
    assert_eq!(ns_of(&sealed["sealed_cut"]), sealed_ns(&s, x).await);
    let replay = send(
        &s.router,
        Req::post(format!("{exec_path}/hibernate"))
            .token(&key)
            .key("h1"),
    )
    .await;
    assert_eq!(replay.ok(202), &sealed);
    send(
        &s.router,
        Req::post(format!("{exec_path}/hibernate"))
            .token(&key)
            .key("h2"),
    )
    .await
    .problem(409, "hibernation_in_progress");
    send(
        &s.router,
        Req::post(format!("{exec_path}/hibernate"))
            .token(&other_key)
            .key("h3"),
    )
    .await
    .problem(404, "not_found");
    let view = send(&s.router, Req::get(&exec_path).token(&key)).await;
    assert_eq!(view.ok(200)["hibernation"], sealed);

    // Quiesce a real tree into the blob directory and park.
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    ws::write_tree(&tree);
    let cost = lc_core::observation::CostObservation {
        cpu_time_ms: 0,
        peak_memory_bytes: 4096,
    };
    let m = ws::quiesce_measured(&s, &r, &tree, &blobs, Some(cost)).await;
    let head = m.digest();
    // Its milestone: the head, the measured cost (a measured 0 is 0) and
    // no side effect (no network path): re-execution from it is eligible.
    let ms = send(
        &s.router,
        Req::get(format!("{exec_path}/milestones")).token(&key),
    )
    .await;
    let ms = ms.ok(200);
    assert_eq!(
        ms,
        &json!({"milestones": [{
            "seq": 1, "attempt": 1, "generation": 1, "source": "hibernation",
            "head": head.to_hex(),
            "cost": {"cpuTimeMs": 0, "peakMemoryBytes": 4096},
            "externality": {"networkWrites": false, "databaseCommits": false, "externalApiCalls": false},
            "reexecution": {"eligible": true},
            "recorded_cut": ms["milestones"][0]["recorded_cut"]
        }], "next_after_seq": null})
    );
    for (query, status, code) in [
        ("?limit=0", 422, "invalid_limit"),
        ("?after_seq=-1", 400, "invalid_query"),
        ("?color=red", 400, "invalid_query"),
    ] {
        send(
            &s.router,
            Req::get(format!("{exec_path}/milestones{query}")).token(&key),
        )
        .await
        .problem(status, code);
    }
    let view = send(&s.router, Req::get(&exec_path).token(&key)).await;
    let v = view.ok(200);
    assert_eq!(v["state"], json!("hibernated"));
    assert_eq!(v["workspace_head"], json!(head.to_hex()));
    assert_eq!(v["hibernation"]["step"], json!("parked"));
    assert_eq!(v["hibernation"]["head"], json!(head.to_hex()));
    assert_eq!(v["hibernation"]["refusal"], json!(null));
    assert_eq!(v["hibernation"]["sealed_cut"], sealed["sealed_cut"]);

    // Workspace and snapshots.
    let w = send(
        &s.router,
        Req::get(format!("{exec_path}/workspace")).token(&key),
    )
    .await;
    assert_eq!(
        w.ok(200),
        &json!({"workspace_id": r.workspace_id, "exec_id": x, "head": head.to_hex(), "snapshots": 1})
    );
    let l = send(
        &s.router,
        Req::get(format!("{exec_path}/snapshots")).token(&key),
    )
    .await;
    let l = l.ok(200);
    assert_eq!(
        l,
        &json!({"snapshots": [{
            "seq": 1, "digest": head.to_hex(), "parent": null,
            "manifest_bytes": m.canonical_bytes().len(), "lease_id": r.lease_id.0,
            "generation": 1, "committed_cut": l["snapshots"][0]["committed_cut"]
        }], "next_after_seq": null})
    );
    let l = send(
        &s.router,
        Req::get(format!("{exec_path}/snapshots?after_seq=1&limit=5")).token(&key),
    )
    .await;
    assert_eq!(l.ok(200), &json!({"snapshots": [], "next_after_seq": null}));
    send(
        &s.router,
        Req::get(format!("{exec_path}/snapshots?after_seq=-1")).token(&key),
    )
    .await
    .problem(400, "invalid_query");

    // The tree, exactly.
    let snap = format!("{exec_path}/snapshots/{}", head.to_hex());
    let tr = send(&s.router, Req::get(format!("{snap}/tree")).token(&key)).await;
    let a = Digest::of(b"hello\n").to_hex();
    let run = Digest::of(b"#!/bin/sh\necho hi\n").to_hex();
    let empty = Digest::of(b"").to_hex();
    assert_eq!(
        tr.ok(200),
        &json!({"digest": head.to_hex(), "workspace_id": r.workspace_id, "parent": null, "entries": [
            {"path": "a.txt", "kind": "file", "mode": 0o644, "size": 6, "sha256": a, "target": null},
            {"path": "link", "kind": "symlink", "mode": 0o777, "size": null, "sha256": null, "target": "a.txt"},
            {"path": "sub", "kind": "dir", "mode": 0o750, "size": null, "sha256": null, "target": null},
            {"path": "sub/empty", "kind": "file", "mode": 0o600, "size": 0, "sha256": empty, "target": null},
            {"path": "sub/run.sh", "kind": "file", "mode": 0o755, "size": 18, "sha256": run, "target": null},
        ]})
    );

    // Files, exactly; refusals typed.
    for (path, bytes) in [
        ("a.txt", &b"hello\n"[..]),
        ("sub/run.sh", &b"#!/bin/sh\necho hi\n"[..]),
        ("sub/empty", &b""[..]),
    ] {
        let f = send(
            &s.router,
            Req::get(format!("{snap}/files/{path}")).token(&key),
        )
        .await;
        assert_eq!(f.status.as_u16(), 200, "{path}: {}", f.text);
        assert_eq!(f.text.as_bytes(), bytes, "{path}");
        assert_eq!(
            f.headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/octet-stream")
        );
        assert_eq!(
            f.headers
                .get("content-length")
                .and_then(|v| v.to_str().ok()),
            Some(bytes.len().to_string().as_str())
        );
        assert_eq!(
            f.headers.get("lc-sha256").and_then(|v| v.to_str().ok()),
            Some(Digest::of(bytes).to_hex().as_str())
        );
    }
    send(&s.router, Req::get(format!("{snap}/files/sub")).token(&key))
        .await
        .problem(409, "entry_not_file")
        .detail(&format!(
            "\"sub\" is a directory in snapshot {}, not a file; read the snapshot's tree (GET /v1/execs/{{id}}/snapshots/{}/tree) for its entries and a symlink's target",
            head.to_hex(),
            head.to_hex()
        ));
    send(
        &s.router,
        Req::get(format!("{snap}/files/link")).token(&key),
    )
    .await
    .problem(409, "entry_not_file");
    send(
        &s.router,
        Req::get(format!("{snap}/files/nope")).token(&key),
    )
    .await
    .problem(404, "not_found");
    for bad in [
        "sub/../a.txt",
        "sub/%2E%2E/a.txt",
        "%2Fetc%2Fpasswd",
        "./a.txt",
        "sub//run.sh",
    ] {
        send(
            &s.router,
            Req::get(format!("{snap}/files/{bad}")).token(&key),
        )
        .await
        .problem(400, "invalid_path");
    }
    send(
        &s.router,
        Req::get(format!("{exec_path}/snapshots/{}/tree", "0".repeat(64))).token(&key),
    )
    .await
    .problem(404, "not_found");
    send(
        &s.router,
        Req::get(format!("{exec_path}/snapshots/xyz/tree")).token(&key),
    )
    .await
    .problem(422, "invalid_digest");

    // Another tenant sees none of it.
    for path in [
        format!("{exec_path}/workspace"),
        format!("{exec_path}/snapshots"),
        format!("{snap}/tree"),
        format!("{snap}/files/a.txt"),
    ] {
        send(&s.router, Req::get(&path).token(&other_key))
            .await
            .problem(404, "not_found");
    }

    // Resume: a wrong head, another tenant, then the current head.
    send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&key)
            .key("r1")
            .json(json!({"head": "ab".repeat(32)})),
    )
    .await
    .problem(409, "workspace_head_mismatch");
    send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&other_key)
            .key("r1")
            .json(json!({"head": head.to_hex()})),
    )
    .await
    .problem(404, "not_found");
    send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&key)
            .key("r1")
            .json(json!({"head": "nothex"})),
    )
    .await
    .problem(422, "invalid_digest");
    let want_sha = lc_core::hibernate::resume_request_sha256(ExecId(x), None).to_hex();
    let intent = send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&key)
            .key("r2"),
    )
    .await;
    let intent = intent.ok(202).clone();
    assert_eq!(
        intent,
        json!({"exec_id": x, "op_key": "r2", "request_sha256": want_sha, "head": head.to_hex(),
               "attempt": 1, "from_generation": 1, "recorded_cut": intent["recorded_cut"],
               "refused": null})
    );
    let again = send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&key)
            .key("r2"),
    )
    .await;
    assert_eq!(again.ok(202), &intent);
    // The same key with another body (naming the head) is another
    // request.
    send(
        &s.router,
        Req::post(format!("{exec_path}/resume"))
            .token(&key)
            .key("r2")
            .json(json!({"head": head.to_hex()})),
    )
    .await
    .problem(409, "idempotency_conflict");

    // The gateway carries it out: the exec shows the receipt.
    let lease2 = ws::resume(&s, &r, "r2", head).await;
    let v = send(&s.router, Req::get(&exec_path).token(&key)).await;
    let v = v.ok(200);
    assert_eq!(v["state"], json!("running"));
    assert_eq!(
        v["resume"],
        json!({"op_key": "r2", "attempt": 1, "from_generation": 1, "to_generation": 2,
               "lease_id": lease2.0, "head": head.to_hex(), "committed_cut": v["resume"]["committed_cut"]})
    );

    // A corrupted blob is refused, never served.
    let blob = blobs.path_of(&Digest::of(b"hello\n"));
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::write(&blob, b"HELLO\n").unwrap();
    send(&s.router, Req::get(format!("{snap}/files/a.txt")).token(&key))
        .await
        .problem(500, "blob_corrupt")
        .detail(&format!(
            "snapshot file \"a.txt\" (blob {a}) is corrupt: its stored bytes do not hash to the manifest's digest, so none are served; ask the operator to restore the blob from its source"
        ));
    std::fs::remove_file(&blob).unwrap();
    send(
        &s.router,
        Req::get(format!("{snap}/files/a.txt")).token(&key),
    )
    .await
    .problem(500, "blob_missing");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_restore_shows_on_the_resume_request() {
    let (s, blobs, dir) = start("refused").await;
    let (t, key) = ws::tenant(&s, "acme", 10).await;
    let r = ws::running(&s, t, &key, "x1", exec_body()).await;
    let exec_path = format!("/v1/execs/{}", r.exec_id);
    let hibernate = Req::post(format!("{exec_path}/hibernate")).token(&key);
    send(&s.router, hibernate.key("h1")).await.ok(202);
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    ws::write_tree(&tree);
    let head = ws::quiesce(&s, &r, &tree, &blobs).await.digest();
    let resume = |k: &str| Req::post(format!("{exec_path}/resume")).token(&key).key(k);
    let intent = send(&s.router, resume("r1")).await.ok(202).clone();
    assert_eq!(intent["refused"], Value::Null);

    let refusal = lc_core::hibernate::ResumeRefusal {
        code: "restore_failed".into(),
        message: format!(
            "restore failed (blob_corrupt) at \"a.txt\" blob {}: its bytes do not hash to it",
            Digest::of(b"hello\n").to_hex()
        ),
    };
    ws::refuse(&s, &r, "r1", &refusal).await;
    let replay = send(&s.router, resume("r1")).await.ok(202).clone();
    let mut want = intent.clone();
    want["refused"] = json!({"code": refusal.code, "message": refusal.message});
    assert_eq!(replay, want);
    let v = send(&s.router, Req::get(&exec_path).token(&key)).await;
    let v = v.ok(200);
    assert_eq!(
        (&v["state"], &v["workspace_head"], &v["resume"]),
        (&json!("hibernated"), &json!(head.to_hex()), &Value::Null)
    );
    // A new request resumes from the refused one's generation.
    let again = send(&s.router, resume("r2")).await.ok(202).clone();
    assert_eq!(
        (&again["from_generation"], &again["refused"]),
        (&json!(2), &Value::Null)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_validates_idle_ttl_and_on_timeout() {
    let (s, _blobs, dir) = start("create").await;
    let (_, key) = ws::tenant(&s, "acme", 10).await;
    let body = |extra: Value| {
        let mut b = json!({"runtime": "base", "shape": "small", "command": ["true"]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("c1")
            .json(body(json!({"on_timeout": "pause"}))),
    )
    .await
    .problem(422, "invalid_timeout")
    .detail("invalid timeout: on_timeout is `terminate` or `hibernate`, not \"pause\"");
    send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("c2")
            .json(body(json!({"idle_ttl_ms": 0}))),
    )
    .await
    .problem(422, "invalid_timeout");
    let plain = send(
        &s.router,
        Req::post("/v1/execs")
            .token(&key)
            .key("c3")
            .json(body(json!({}))),
    )
    .await;
    let plain = plain.ok(201);
    assert_eq!(
        (&plain["idle_ttl_ms"], &plain["on_timeout"]),
        (&Value::Null, &json!("terminate"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_goes_on_past_a_stopped_page() {
    let (s, blobs, dir) = start("output").await;
    let (t, key) = ws::tenant(&s, "acme", 10).await;
    let r = ws::running(&s, t, &key, "x1", exec_body()).await;
    let x = r.exec_id;
    send(
        &s.router,
        Req::post(format!("/v1/execs/{x}/hibernate"))
            .token(&key)
            .key("h1"),
    )
    .await
    .ok(202);
    let stop = PageExit {
        code: None,
        signal: Some(15),
    };
    ws::append(
        &s,
        x,
        r.lease_id,
        Generation(1),
        1,
        &[
            (PageKind::Stdout, b"before\n", None),
            (PageKind::Stopped, b"", Some(stop)),
        ],
    )
    .await;
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    ws::write_tree(&tree);
    let m = ws::quiesce(&s, &r, &tree, &blobs).await;
    // Not measured (the provider did not answer): the milestone has no
    // cost and no externality, never 0 or false, and is ineligible.
    let ms = send(
        &s.router,
        Req::get(format!("/v1/execs/{}/milestones", r.exec_id)).token(&key),
    )
    .await;
    let ms = ms.ok(200);
    assert_eq!(
        ms["milestones"],
        json!([{
            "seq": 1, "attempt": 1, "generation": 1, "source": "hibernation",
            "head": m.digest().to_hex(),
            "reexecution": {"eligible": false, "reason": "externality_unobserved"},
            "recorded_cut": ms["milestones"][0]["recorded_cut"]
        }])
    );
    let out = send(
        &s.router,
        Req::get(format!("/v1/execs/{x}/output")).token(&key),
    )
    .await;
    let o = out.ok(200);
    assert_eq!(
        (&o["terminal"], &o["stopped"], &o["next_seq"]),
        (&json!(false), &json!(true), &json!(3))
    );
    assert_eq!(o["pages"][1]["kind"], json!("stopped"));
    assert_eq!(o["pages"][1]["exit"], json!({"code": null, "signal": 15}));
    let out = send(
        &s.router,
        Req::get(format!("/v1/execs/{x}/output?after_seq=2")).token(&key),
    )
    .await;
    assert_eq!(
        out.ok(200),
        &json!({"pages": [], "terminal": false, "stopped": true, "next_seq": 3})
    );
    send(
        &s.router,
        Req::post(format!("/v1/execs/{x}/resume"))
            .token(&key)
            .key("r1"),
    )
    .await
    .ok(202);
    let lease2 = ws::resume(&s, &r, "r1", m.digest()).await;
    ws::append(
        &s,
        x,
        lease2,
        Generation(2),
        3,
        &[
            (PageKind::Stdout, b"after\n", None),
            (
                PageKind::Terminal,
                b"",
                Some(PageExit {
                    code: Some(0),
                    signal: None,
                }),
            ),
        ],
    )
    .await;
    let out = send(
        &s.router,
        Req::get(format!("/v1/execs/{x}/output?after_seq=2")).token(&key),
    )
    .await;
    let o = out.ok(200);
    assert_eq!(
        (&o["terminal"], &o["stopped"], &o["next_seq"]),
        (&json!(true), &json!(false), &json!(5))
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(o["pages"][0]["data_b64"], json!(b64.encode(b"after\n")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_workspace_and_output_keeps_them_restorable_for_the_grace() {
    use axum::http::Method;
    use support::pg::{SAMPLER_WRITES, snapshot};
    let (s, blobs, dir) = start("deletion").await;
    let (t, key) = ws::tenant(&s, "acme", 10).await;
    let (_, other_key) = ws::tenant(&s, "other", 10).await;
    let r: Running = ws::running(&s, t, &key, "x1", exec_body()).await;
    let x = r.exec_id;
    let exec_path = format!("/v1/execs/{x}");
    let del = |path: String| Req::new(Method::DELETE, path);

    // A running exec's workspace and output are not deleted.
    for item in ["workspace", "output"] {
        send(
            &s.router,
            del(format!("{exec_path}/{item}")).token(&key).key("d0"),
        )
        .await
        .problem(409, "exec_not_terminal")
        .detail(&format!(
            "exec {x} is running: only a terminal exec's {item} can be deleted; cancel it (lc exec cancel {x}) and delete its {item} once it has ended"
        ));
    }
    // Park it on a real snapshot, then cancel: terminal with a workspace.
    send(
        &s.router,
        Req::post(format!("{exec_path}/hibernate"))
            .token(&key)
            .key("h1"),
    )
    .await
    .ok(202);
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    ws::write_tree(&tree);
    let head = ws::quiesce(&s, &r, &tree, &blobs).await.digest();
    let c = send(
        &s.router,
        Req::post(format!("{exec_path}/cancel"))
            .token(&key)
            .key("c1"),
    )
    .await;
    assert_eq!(c.ok(200)["state"], json!("terminal"));
    let snap = format!("{exec_path}/snapshots/{}", head.to_hex());
    let file = format!("{snap}/files/a.txt");
    let reads = [
        format!("{exec_path}/workspace"),
        format!("{exec_path}/snapshots"),
        format!("{snap}/tree"),
        file.clone(),
    ];
    let mut before = Vec::new();
    for path in &reads {
        let got = send(&s.router, Req::get(path).token(&key)).await;
        assert_eq!(got.status.as_u16(), 200, "{path}: {}", got.text);
        before.push(got.text.clone());
    }
    let out_before = send(
        &s.router,
        Req::get(format!("{exec_path}/output")).token(&key),
    )
    .await;
    assert_eq!(out_before.status.as_u16(), 200);

    // Without a credential 401, without a key 400; uncertain 503; another
    // tenant 404: nothing written.
    let held = snapshot(&s.url, &SAMPLER_WRITES).await;
    send(&s.router, del(format!("{exec_path}/workspace")).key("d1"))
        .await
        .problem(401, "unauthenticated");
    send(&s.router, del(format!("{exec_path}/workspace")).token(&key))
        .await
        .problem(400, "idempotency_key_required")
        .detail("every POST and DELETE needs an Idempotency-Key header (1 to 255 printable ASCII characters)");
    send(
        &s.router,
        del(format!("{exec_path}/workspace"))
            .token(&other_key)
            .key("d1"),
    )
    .await
    .problem(404, "not_found");
    s.clock.force_uncertain(true);
    let u = send(
        &s.router,
        del(format!("{exec_path}/workspace")).token(&key).key("d1"),
    )
    .await;
    u.problem(503, "time_uncertain");
    assert!(u.headers.get("retry-after").is_some());
    s.clock.force_uncertain(false);
    send(
        &s.router,
        Req::post(format!("{exec_path}/workspace/undelete"))
            .token(&key)
            .key("u0"),
    )
    .await
    .problem(409, "not_deleted")
    .detail(&format!(
        "the workspace of exec {x} is not deleted: there is nothing to undelete"
    ));
    assert_eq!(snapshot(&s.url, &SAMPLER_WRITES).await, held);

    // The delete: 7 days of grace to the nanosecond; a replay the same.
    let d = send(
        &s.router,
        del(format!("{exec_path}/workspace")).token(&key).key("d1"),
    )
    .await;
    let d = d.ok(200).clone();
    assert_eq!(
        d,
        json!({"exec_id": x, "item": "workspace", "state": "deleted",
               "deleted_at": d["deleted_at"], "purge_after": d["purge_after"],
               "purged_at": null, "undelete": format!("lc workspace undelete {x}")})
    );
    assert_eq!(
        ns_of(&d["purge_after"]) - ns_of(&d["deleted_at"]),
        7 * 86_400_000_000_000
    );
    let replay = send(
        &s.router,
        del(format!("{exec_path}/workspace")).token(&key).key("d1"),
    )
    .await;
    assert_eq!(replay.ok(200), &d);
    for path in &reads {
        send(&s.router, Req::get(path).token(&key))
            .await
            .problem(410, "workspace_deleted")
            .detail(&format!(
                "the workspace of exec {x} is deleted and is purged once a certain cut reaches {}; until then `lc workspace undelete {x}` restores it",
                d["purge_after"].as_str().unwrap()
            ));
    }
    // The undelete restores every read byte for byte.
    let u = send(
        &s.router,
        Req::post(format!("{exec_path}/workspace/undelete"))
            .token(&key)
            .key("u1"),
    )
    .await;
    assert_eq!(u.ok(200)["state"], json!("restored"));
    assert_eq!(u.ok(200)["purge_after"], d["purge_after"]);
    // Nothing is left to undelete: no command to do it.
    assert_eq!(u.ok(200)["undelete"], Value::Null);
    for (path, want) in reads.iter().zip(&before) {
        let got = send(&s.router, Req::get(path).token(&key)).await;
        assert_eq!((got.status.as_u16(), &got.text), (200, want), "{path}");
    }

    // The output, the same way.
    let o = send(
        &s.router,
        del(format!("{exec_path}/output")).token(&key).key("o1"),
    )
    .await;
    assert_eq!(o.ok(200)["item"], json!("output"));
    assert_eq!(
        o.ok(200)["undelete"],
        json!(format!("lc exec output {x} --undelete"))
    );
    send(
        &s.router,
        Req::get(format!("{exec_path}/output")).token(&key),
    )
    .await
    .problem(410, "output_deleted");
    // The workspace is not deleted with it.
    let w = send(&s.router, Req::get(&reads[0]).token(&key)).await;
    assert_eq!(w.status.as_u16(), 200);
    send(
        &s.router,
        Req::post(format!("{exec_path}/output/undelete"))
            .token(&key)
            .key("o2"),
    )
    .await
    .ok(200);
    let out = send(
        &s.router,
        Req::get(format!("{exec_path}/output")).token(&key),
    )
    .await;
    assert_eq!((out.status.as_u16(), &out.text), (200, &out_before.text));
    std::fs::remove_dir_all(&dir).unwrap();
}
