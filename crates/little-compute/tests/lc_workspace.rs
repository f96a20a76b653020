//! The real `lc` binary against the real router on the real store, served
//! on loopback, with snapshot blobs in a real blob directory: `exec
//! hibernate --wait` and `exec resume --wait` waiting for the gateway's
//! steps, `workspace show` and `workspace snapshots`, `workspace download`
//! writing the exact files, modes and symlink (a non-empty directory and
//! a corrupt blob refused with nothing written), and `exec output
//! --follow` going on past a stopped page into the resumed generation.
//!
//! On real processes (a real PostgreSQL, the in-process sampler, `little-
//! compute serve`, a bubblewrap provider, the worker and a gateway):
//! `exec hibernate --wait` of an exec whose workspace holds a fifo ends at
//! the provider's refusal to snapshot it, once, with the exec terminal
//! `snapshot_refused` and the tenant's units all back.

#[path = "../../lc-api/tests/support/mod.rs"]
mod support;

#[path = "support/mod.rs"]
mod rig;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use lc_blob::LocalBlobStore;
use lc_core::model::{Digest, Generation, PageExit, PageKind};
use serde_json::{Value, json};
use support::pg::PgSvc;
use support::ws;
use tokio::net::TcpListener;

/// The service with a blob directory under `dir`, on a loopback port; its
/// base URL.
async fn start(dir: &Path) -> (PgSvc, LocalBlobStore, String) {
    let blobs = LocalBlobStore::open(dir.join("blobs")).expect("blobs");
    let s = PgSvc::start_with(lc_api::ServiceOptions {
        sink: Some(std::sync::Arc::new(blobs.clone())),
        ..lc_api::ServiceOptions::default()
    })
    .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(httpkit::serve(
        listener,
        s.router.clone(),
        s.state.clone(),
        httpkit::ConnectionLimits::default(),
        std::future::pending(),
    ));
    (s, blobs, format!("http://{addr}"))
}

/// Pause between two looks for what a running `lc` process did.
const PROCESS_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Looks for it before the test fails (30 s).
const PROCESS_POLLS_MAX: u32 = 600;

/// Runs `lc` with `args`, off the async runtime.
fn lc(args: &[&str]) -> tokio::task::JoinHandle<Output> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_lc"))
            .args(&args)
            .env_remove("LC_SERVER")
            .env_remove("LC_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run lc")
    })
}

async fn run(args: &[&str]) -> Output {
    lc(args).await.expect("join")
}

#[track_caller]
fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "lc failed: {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn exec_body() -> Value {
    json!({"runtime": "base", "shape": "small", "command": ["sleep", "9"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernate_resume_and_download_through_the_cli() {
    let dir = ws::temp_dir("cli-download");
    let (s, blobs, url) = start(&dir).await;
    let (t, key) = ws::tenant(&s, "blue", 4).await;
    let r = ws::running(&s, t, &key, "x1", exec_body()).await;
    let id = r.exec_id.to_string();
    let base = ["--server", url.as_str(), "--token", key.as_str()];
    // `lc` as the tenant with `more` after the connection flags.
    let cli = |more: &[&str]| lc(&[&base[..], more].concat());

    // exec hibernate --wait: prints the sealed record, then the exec once
    // the provider's quiescence and destroy park it.
    let waiting = cli(&[
        "--json",
        "--idempotency-key",
        "h1",
        "exec",
        "hibernate",
        &id,
        "--wait",
        "--wait-timeout-s",
        "60",
    ]);
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    ws::write_tree(&tree);
    // Special bits the sandbox set: kept in the snapshot, never written by
    // a download.
    std::fs::set_permissions(
        tree.join("sub/run.sh"),
        std::fs::Permissions::from_mode(0o6755),
    )
    .unwrap();
    std::fs::set_permissions(tree.join("sub"), std::fs::Permissions::from_mode(0o1750)).unwrap();
    // The seal is lc's request, a process of its own: wait (bounded) for
    // it to be recorded, then play the provider.
    let mut sealed = false;
    for _ in 0..PROCESS_POLLS_MAX {
        let v = support::send(
            &s.router,
            support::Req::get(format!("/v1/execs/{id}")).token(&key),
        )
        .await;
        if v.body["hibernation"].is_object() {
            sealed = true;
            break;
        }
        tokio::time::sleep(PROCESS_POLL).await;
    }
    assert!(
        sealed,
        "lc's hibernate request was not recorded within 30 s"
    );
    let cost = lc_core::observation::CostObservation {
        cpu_time_ms: 0,
        peak_memory_bytes: 4096,
    };
    let m = ws::quiesce_measured(&s, &r, &tree, &blobs, Some(cost)).await;
    let head = m.digest().to_hex();
    let o = waiting.await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let lines: Vec<Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", text(&o.stdout));
    assert_eq!(
        (
            &lines[0]["step"],
            &lines[0]["reason"],
            &lines[0]["generation"]
        ),
        (&json!("sealed"), &json!("requested"), &json!(1))
    );
    assert_eq!(
        (&lines[1]["state"], &lines[1]["workspace_head"]),
        (&json!("hibernated"), &json!(head))
    );

    // exec milestones: the hibernation's, measured (a measured 0 is 0).
    let o = cli(&["exec", "milestones", &id]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let rows: Vec<Vec<String>> = text(&o.stdout)
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{}", text(&o.stdout));
    assert_eq!(
        (&rows[1][..4], &rows[1][5..]),
        (
            &["1", "1", "1", "hibernation"].map(String::from)[..],
            &[
                "0",
                "4096",
                "false",
                "false",
                "false",
                "eligible",
                head.as_str()
            ]
            .map(String::from)[..]
        ),
        "{}",
        text(&o.stdout)
    );
    let o = cli(&["exec", "milestones", &id, "--after-seq", "1"])
        .await
        .unwrap();
    assert_eq!(
        text(&o.stdout),
        "no milestones (each committed hibernation records one)\n"
    );

    // workspace show / snapshots.
    let w = json_of(&cli(&["--json", "workspace", "show", &id]).await.unwrap());
    assert_eq!(
        w,
        json!({"workspace_id": r.workspace_id, "exec_id": r.exec_id, "head": head, "snapshots": 1})
    );
    let o = cli(&["workspace", "show", &id]).await.unwrap();
    assert_eq!(
        text(&o.stdout),
        format!(
            "exec_id       {}\nworkspace_id  {}\nhead          {head}\nsnapshots     1\n",
            r.exec_id, r.workspace_id
        )
    );
    let l = json_of(
        &cli(&["--json", "workspace", "snapshots", &id])
            .await
            .unwrap(),
    );
    assert_eq!(l["snapshots"][0]["digest"], json!(head));
    assert_eq!(l["snapshots"][0]["seq"], json!(1));

    // The snapshot keeps the special bits.
    let tree_view = support::send(
        &s.router,
        support::Req::get(format!("/v1/execs/{id}/snapshots/{head}/tree")).token(&key),
    )
    .await;
    let modes: Vec<(String, u64)> = tree_view.ok(200)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["mode"].as_u64().unwrap(),
            )
        })
        .filter(|(p, _)| p.starts_with("sub"))
        .collect();
    assert_eq!(
        modes,
        [
            ("sub".to_owned(), 0o1750),
            ("sub/empty".to_owned(), 0o600),
            ("sub/run.sh".to_owned(), 0o6755)
        ]
    );
    // workspace download: exact files, modes (without setuid, setgid and
    // sticky) and symlink.
    let to = dir.join("out");
    let to_s = to.to_str().unwrap().to_string();
    let d = json_of(
        &cli(&["--json", "workspace", "download", &id, "--to", &to_s])
            .await
            .unwrap(),
    );
    assert_eq!(
        d,
        json!({"exec_id": r.exec_id, "head": head, "dir": to_s, "files": 3, "dirs": 1, "symlinks": 1, "bytes": 24})
    );
    assert_eq!(std::fs::read(to.join("a.txt")).unwrap(), b"hello\n");
    assert_eq!(
        std::fs::read(to.join("sub/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(std::fs::read(to.join("sub/empty")).unwrap(), b"");
    assert_eq!(
        [
            mode_of(&to.join("a.txt")),
            mode_of(&to.join("sub")),
            mode_of(&to.join("sub/run.sh")),
            mode_of(&to.join("sub/empty")),
        ],
        [0o644, 0o750, 0o755, 0o600]
    );
    assert_eq!(
        std::fs::read_link(to.join("link")).unwrap(),
        Path::new("a.txt")
    );
    let mut names: Vec<String> = std::fs::read_dir(&to)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "link", "sub"]);
    // Nothing left next to it.
    let mut siblings: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    siblings.sort();
    assert_eq!(siblings, ["blobs", "out", "tree"]);

    // A non-empty directory is refused, unchanged.
    let o = cli(&["workspace", "download", &id, "--head", &head, "--to", &to_s])
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!(
            "error: {to_s} is not empty; name a new or empty directory with --to (nothing was written)\n"
        )
    );
    // A wrong head is the server's refusal.
    let o = cli(&[
        "workspace",
        "download",
        &id,
        "--head",
        &"ab".repeat(32),
        "--to",
        &format!("{to_s}2"),
    ])
    .await
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!(
            "error: 404 not_found: snapshot {} not found\n",
            "ab".repeat(32)
        )
    );
    assert!(!dir.join("out2").exists());

    // A corrupt blob: refused, nothing written, no temporary left.
    let blob = blobs.path_of(&Digest::of(b"#!/bin/sh\necho hi\n"));
    std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&blob, b"#!/bin/sh\necho HI\n").unwrap();
    let to3 = format!("{to_s}3");
    let o = cli(&["workspace", "download", &id, "--to", &to3])
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let run_sha = Digest::of(b"#!/bin/sh\necho hi\n");
    assert_eq!(
        text(&o.stderr),
        format!(
            "error: 500 blob_corrupt: snapshot file \"sub/run.sh\" (blob {run_sha}) is corrupt: its stored bytes do not hash to the manifest's digest, so none are served; ask the operator to restore the blob from its source\n"
        )
    );
    assert!(!Path::new(&to3).exists());
    let mut siblings: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    siblings.sort();
    assert_eq!(siblings, ["blobs", "out", "tree"]);

    // exec resume --wait: prints the request, then the exec once the
    // gateway committed the resume.
    let waiting = cli(&[
        "--json",
        "--idempotency-key",
        "r1",
        "exec",
        "resume",
        &id,
        "--wait",
        "--wait-timeout-s",
        "60",
    ]);
    wait_one_intent(&s, r.exec_id).await;
    ws::resume(&s, &r, "r1", m.digest()).await;
    let o = waiting.await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let lines: Vec<Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(
        (&lines[0]["op_key"], &lines[0]["head"]),
        (&json!("r1"), &json!(head))
    );
    assert_eq!(
        (
            &lines[1]["state"],
            &lines[1]["resume"]["op_key"],
            &lines[1]["resume"]["to_generation"]
        ),
        (&json!("running"), &json!("r1"), &json!(2))
    );
    // Resume of a running exec: the server's refusal, exit 1.
    let o = cli(&["exec", "resume", &id]).await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!(
            "error: 409 exec_not_parked: exec {id} is not parked (its attempt is running); only a hibernated exec resumes\n"
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Resume requests recorded for `exec`.
/// Waits (bounded) until `lc`, a process of its own, recorded its resume
/// request on `exec`: the first one.
async fn wait_one_intent(s: &PgSvc, exec: i64) {
    for _ in 0..PROCESS_POLLS_MAX {
        if psql_intents(s, exec).await == 1 {
            return;
        }
        tokio::time::sleep(PROCESS_POLL).await;
    }
    panic!("lc's resume request was not recorded within 30 s");
}

async fn psql_intents(s: &PgSvc, exec: i64) -> i64 {
    support::pg::psql(
        &s.url,
        format!("SELECT count(*) FROM lc_resume_intents WHERE exec_id = {exec};\n"),
    )
    .await
    .trim()
    .parse()
    .unwrap()
}

/// `exec resume --wait` ends at a restore the provider refused: exit 1
/// and a line with the code and the provider's message (path and digest),
/// not a wait until `--wait-timeout-s` for a resume that cannot happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_wait_reports_a_refused_restore() {
    let dir = ws::temp_dir("cli-refused");
    let (s, blobs, url) = start(&dir).await;
    let (t, key) = ws::tenant(&s, "blue", 4).await;
    let r = ws::running(&s, t, &key, "x1", exec_body()).await;
    let id = r.exec_id.to_string();
    support::send(
        &s.router,
        support::Req::post(format!("/v1/execs/{id}/hibernate"))
            .token(&key)
            .key("h1"),
    )
    .await
    .ok(202);
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    ws::write_tree(&tree);
    ws::quiesce(&s, &r, &tree, &blobs).await;
    let waiting = lc(&[
        "--server",
        &url,
        "--token",
        &key,
        "--idempotency-key",
        "r1",
        "exec",
        "resume",
        &id,
        "--wait",
        "--wait-timeout-s",
        "60",
    ]);
    wait_one_intent(&s, r.exec_id).await;
    let refusal = lc_core::hibernate::ResumeRefusal {
        code: "restore_failed".into(),
        message: "restore failed (blob_corrupt) at \"a.txt\"".into(),
    };
    ws::refuse(&s, &r, "r1", &refusal).await;
    let o = waiting.await.unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stderr),
        format!(
            "exec {id}: resume refused (restore_failed): restore failed (blob_corrupt) at \"a.txt\"; \
             the exec stays hibernated on its head; after fixing the cause, lc exec resume {id} again (a new request)\n"
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_goes_on_past_a_stopped_page_into_the_resumed_generation() {
    let dir = ws::temp_dir("cli-follow");
    let (s, blobs, url) = start(&dir).await;
    let (t, key) = ws::tenant(&s, "blue", 4).await;
    let r = ws::running(&s, t, &key, "x1", exec_body()).await;
    let id = r.exec_id.to_string();
    support::send(
        &s.router,
        support::Req::post(format!("/v1/execs/{id}/hibernate"))
            .token(&key)
            .key("h1"),
    )
    .await
    .ok(202);
    ws::append(
        &s,
        r.exec_id,
        r.lease_id,
        Generation(1),
        1,
        &[
            (PageKind::Stdout, b"before\n", None),
            (
                PageKind::Stopped,
                b"",
                Some(PageExit {
                    code: None,
                    signal: Some(15),
                }),
            ),
        ],
    )
    .await;
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    ws::write_tree(&tree);
    let m = ws::quiesce(&s, &r, &tree, &blobs).await;
    // Without --follow: the pages so far, the stopped page named, exit 0.
    let o = run(&["--server", &url, "--token", &key, "exec", "output", &id]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "before\n");
    assert_eq!(
        text(&o.stderr),
        format!(
            "exec {id}: hibernated at page 2: its command was stopped and its workspace kept; the output goes on after lc exec resume {id}\n"
        )
    );
    let follow = lc(&[
        "--server",
        &url,
        "--token",
        &key,
        "exec",
        "output",
        &id,
        "--follow",
        "--wait-timeout-s",
        "60",
    ]);
    support::send(
        &s.router,
        support::Req::post(format!("/v1/execs/{id}/resume"))
            .token(&key)
            .key("r1"),
    )
    .await
    .ok(202);
    let lease2 = ws::resume(&s, &r, "r1", m.digest()).await;
    ws::append(
        &s,
        r.exec_id,
        lease2,
        Generation(2),
        3,
        &[
            (PageKind::Stdout, b"after\n", None),
            (
                PageKind::Terminal,
                b"",
                Some(PageExit {
                    code: Some(3),
                    signal: None,
                }),
            ),
        ],
    )
    .await;
    ws::finish(&s, lease2, Generation(2)).await;
    let o = follow.await.unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "before\nafter\n");
    assert_eq!(
        text(&o.stderr),
        format!(
            "exec {id}: hibernated at page 2: its command was stopped and its workspace kept; the output goes on after lc exec resume {id}\n"
        )
    );
    // Read again after the resume: the stopped page is named as passed,
    // not as a hibernation still waiting for a resume.
    let o = run(&["--server", &url, "--token", &key, "exec", "output", &id]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "before\nafter\n");
    assert_eq!(
        text(&o.stderr),
        format!(
            "exec {id}: hibernated at page 2, then resumed: the pages after it are the resumed run's\n"
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_passes_the_idle_ttl_and_the_timeout_action() {
    let dir = ws::temp_dir("cli-create");
    let (s, _blobs, url) = start(&dir).await;
    let (_, key) = ws::tenant(&s, "blue", 4).await;
    let base = ["--server", url.as_str(), "--token", key.as_str()];
    let o = run(&[
        &base[..],
        &[
            "--json",
            "exec",
            "create",
            "--idle-ttl-ms",
            "5000",
            "--on-timeout",
            "hibernate",
            "--timeout-ms",
            "60000",
            "--",
            "true",
        ],
    ]
    .concat())
    .await;
    let v = json_of(&o);
    assert_eq!(
        (&v["idle_ttl_ms"], &v["on_timeout"], &v["timeout_ms"]),
        (&json!(5000), &json!("hibernate"), &json!(60000))
    );
    let o = run(&[
        &base[..],
        &["exec", "create", "--idle-ttl-ms", "0", "--", "true"],
    ]
    .concat())
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        "error: 422 invalid_timeout: invalid timeout: an idle ttl is 1..=86400000 ms, not 0\n"
    );
    let o = run(&[
        &base[..],
        &["exec", "create", "--on-timeout", "pause", "--", "true"],
    ]
    .concat())
    .await;
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The admin token `little-compute serve` is started with.
const REFUSED_ADMIN: &str = "lcadm-lc-workspace-refused-0123456789";
/// Units of the tenant of the refused hibernation (its exec holds one).
const REFUSED_UNITS: i64 = 2;
/// The longest any wait of the refused hibernation's test polls for.
const REFUSED_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(90);
/// Makes a fifo in the workspace (the command's working directory), then
/// prints `ready` and waits to be stopped.
const FIFO_SCRIPT: &str = "mkfifo pipe && echo ready && exec sleep 600";

/// `exec hibernate --wait` of an exec whose workspace holds a fifo: the
/// provider refuses the snapshot (`special_file` at `pipe`), the gateway
/// records the refusal once and does not ask again, the exec ends
/// `snapshot_refused`, its units come back exactly once its sandbox is
/// destroyed, its output ends at what it wrote (exit 1, with no word of a
/// resume that cannot come), and a further hibernate is refused as for any
/// terminal exec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernate_wait_reports_a_snapshot_the_provider_refused() {
    use lc_core::store::{ControlStore as _, ReconcileStore as _};
    use lc_provider::Provider as _;

    rig::ensure_supervisor();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let (sampler_stop, _sampler) = rig::start_sampler(&url);
    let store = rig::connect_store(&url, rig::store_config()).await;
    let clock = clock::safe_cut::SafeCutClock::new(store.pool().clone(), rig::GAP_MAX);
    rig::wait_certain(&clock, REFUSED_WAIT_MAX, rig::POLL).await;
    let dir = rig::fresh_dir("lc-ws-refused");
    let secret = rig::write_secret(&dir);
    let provider_port = rig::free_port();
    let provider_url = format!("http://127.0.0.1:{provider_port}");
    let cgroup_parent = format!("little-compute-ws-refused-{}", std::process::id());
    let _provider = rig::spawn_provider(provider_port, &dir, &cgroup_parent, "provider.log");
    let http = rig::connect_provider(&provider_url, REFUSED_WAIT_MAX).await;
    let base = lc_core::manifest::Manifest::base();
    store
        .register_runtime(
            &lc_core::OperationKey::new("base", Digest([1; 32])).unwrap(),
            rig::reading(&clock).await,
            "base",
            Digest(base.digest()),
            serde_json::from_slice(&base.canonical()).unwrap(),
        )
        .await
        .unwrap();
    store
        .register_provider(http.id(), &provider_url, http.public_key().to_bytes())
        .await
        .unwrap();

    // The control plane the CLI talks to, with the gateway's sink.
    let blob_dir = dir.join("blobs");
    let serve_port = rig::free_port();
    let server = format!("http://127.0.0.1:{serve_port}");
    let admin_file = dir.join("admin.token");
    std::fs::write(&admin_file, format!("{REFUSED_ADMIN}\n")).unwrap();
    let _serve = rig::Proc(
        Command::new(rig::exe())
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{serve_port}"))
            .arg("--admin-token-file")
            .arg(&admin_file)
            .arg("--secret-file")
            .arg(&secret)
            .arg("--blob-dir")
            .arg(&blob_dir)
            .args(["--safetime-gap-max-ms", rig::GAP_MAX_MS])
            .args(["--grant-max-ttl-ms", "3600000"])
            .args(["--reclaim-grace-ms", "5000"])
            .env("LC_DATABASE_URL", &url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(rig::append(&dir.join("serve.log")))
            .spawn()
            .unwrap(),
    );
    let mut plane = rig::Plane {
        url: url.clone(),
        store,
        dir: dir.clone(),
        secret,
        blob_dir,
        provider_url,
        cgroup_parent,
        tenant: lc_core::TenantId(0),
        wait_max: REFUSED_WAIT_MAX,
    };
    let readyz = reqwest::Client::new();
    plane
        .wait_for("serve answers /readyz with 200", async || {
            readyz
                .get(format!("{server}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await;
    let _worker = rig::spawn_worker(
        &plane.url,
        &plane.secret,
        &plane.provider_url,
        &plane.log("worker"),
    );
    let metrics_port = rig::free_port();
    let _gateway = rig::spawn_gateway(&rig::GatewayArgs {
        metrics_port: Some(metrics_port),
        ..plane.gateway_args("gateway")
    });

    // The tenant, through the CLI as the admin.
    let t = json_of(
        &run(&[
            "--server",
            &server,
            "--token",
            REFUSED_ADMIN,
            "--json",
            "tenant",
            "create",
            "--name",
            "blue",
            "--units",
            &REFUSED_UNITS.to_string(),
        ])
        .await,
    );
    plane.tenant = lc_core::TenantId(t["tenant_id"].as_i64().unwrap());
    let key = t["api_key"].as_str().unwrap().to_string();
    let conn = ["--server", server.as_str(), "--token", key.as_str()];
    let cli = |more: &[&str]| lc(&[&conn[..], more].concat());

    let v = json_of(
        &cli(&["--json", "exec", "create", "--", "sh", "-c", FIFO_SCRIPT])
            .await
            .unwrap(),
    );
    let id = v["exec_id"].as_i64().unwrap().to_string();
    plane
        .wait_for("the command prints ready", async || {
            let o = cli(&["exec", "output", &id]).await.unwrap();
            o.status.code() == Some(0) && o.stdout == b"ready\n"
        })
        .await;
    assert_eq!(
        plane.balance().await,
        (REFUSED_UNITS, REFUSED_UNITS - 1, 1, 0)
    );

    let o = cli(&[
        "--idempotency-key",
        "h1",
        "exec",
        "hibernate",
        &id,
        "--wait",
        "--wait-timeout-s",
        "60",
    ])
    .await
    .unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}\n{}",
        text(&o.stderr),
        plane.logs()
    );
    let stderr = text(&o.stderr);

    // The exec's record: terminal snapshot_refused, the refusal recorded.
    let e = json_of(&cli(&["--json", "exec", "show", &id]).await.unwrap());
    assert_eq!(
        (
            &e["state"],
            &e["terminal_reason"],
            &e["exit_code"],
            &e["hibernation"]["step"],
            &e["hibernation"]["refusal"]["reason"],
            &e["hibernation"]["refusal"]["path"],
        ),
        (
            &json!("terminal"),
            &json!("snapshot_refused"),
            &Value::Null,
            &json!("refused"),
            &json!("special_file"),
            &json!("pipe"),
        ),
        "{e}"
    );
    // The line names the refusal's reason, path and the provider's
    // message as the record holds them.
    let message = e["hibernation"]["refusal"]["message"].as_str().unwrap();
    assert!(message.contains("pipe"), "{message}");
    assert_eq!(
        stderr,
        format!(
            "exec {id}: hibernation refused (special_file) at \"pipe\": {message}; the command was stopped and the exec ended snapshot_refused; its workspace head did not move and its units are returned once its sandbox is destroyed; the provider's advice is for a new exec: keep such entries out of a workspace that hibernates\n"
        )
    );

    // Its units come back exactly, once the reconciler destroyed the
    // sandbox and released the Lease.
    plane
        .wait_for("the tenant holds nothing", async || {
            plane.balance().await.2 == 0
        })
        .await;
    assert_eq!(plane.balance().await, (REFUSED_UNITS, REFUSED_UNITS, 0, 0));
    let tenant_id = plane.tenant.0.to_string();
    let tn = json_of(
        &cli(&["--json", "tenant", "show", &tenant_id])
            .await
            .unwrap(),
    );
    assert_eq!(
        (&tn["available"], &tn["held"], &tn["consumed"]),
        (&json!(REFUSED_UNITS), &json!(0), &json!(0)),
        "{tn}"
    );
    rig::assert_audit_clean(&plane.store, REFUSED_UNITS).await;
    // Its one Lease released, its one Reservation returned.
    let exec_id: i64 = id.parse().unwrap();
    let leases: Vec<(i64, String)> = sqlx::query_as(
        "SELECT generation, state FROM lc_sandbox_leases WHERE exec_id = $1 ORDER BY generation",
    )
    .bind(exec_id)
    .fetch_all(plane.store.pool())
    .await
    .unwrap();
    assert_eq!(leases, [(1, "released".to_string())]);
    let reservations: Vec<(i64, String)> = sqlx::query_as(
        "SELECT generation, state FROM lc_reservations WHERE exec_id = $1 ORDER BY generation",
    )
    .bind(exec_id)
    .fetch_all(plane.store.pool())
    .await
    .unwrap();
    assert_eq!(reservations, [(1, "returned".to_string())]);

    // The output ends at what the command wrote; an exec that ended
    // otherwise than exited gives 1.
    let o = cli(&["exec", "output", &id, "--follow", "--wait-timeout-s", "60"])
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(o.stdout, b"ready\n");
    let follow_stderr = text(&o.stderr);
    assert_eq!(
        follow_stderr,
        format!(
            "exec {id}: its command was stopped at page 2 for a hibernation, and the exec ended without resuming; lc exec show {id} tells why\n\
             exec {id} ended snapshot_refused without an exit status; lc exec show {id} tells more\n"
        )
    );

    // Nothing resumes it: it ended.
    let o = cli(&["exec", "resume", &id]).await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!("error: 409 exec_terminal: exec {id} is terminal\n")
    );

    // Hibernating it again: the server's refusal for a terminal exec; the
    // first request's key replays the refused hibernation.
    let o = cli(&["exec", "hibernate", &id]).await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!("error: 409 exec_terminal: exec {id} is terminal\n")
    );
    let h = json_of(
        &cli(&[
            "--json",
            "--idempotency-key",
            "h1",
            "exec",
            "hibernate",
            &id,
        ])
        .await
        .unwrap(),
    );
    assert_eq!(
        (&h["step"], &h["refusal"]["reason"], &h["refusal"]["path"]),
        (&json!("refused"), &json!("special_file"), &json!("pipe")),
        "{h}"
    );

    // The gateway asked the provider to quiesce once (the provider logs
    // every request it answers), recorded the refusal once and asked no
    // more: one refusal, no quiescence committed, no failed step.
    let provider_log = std::fs::read_to_string(plane.dir.join("provider.log")).unwrap();
    assert_eq!(
        provider_log
            .lines()
            .filter(|l| l.contains("route=/v1/instances/{lease}/{generation}/quiesce"))
            .map(|l| l.contains(" status=422 "))
            .collect::<Vec<_>>(),
        [true],
        "{provider_log}"
    );
    let m = rig::metrics(metrics_port)
        .await
        .expect("the gateway's metrics");
    assert_eq!(
        (
            m.get("lc_gateway_hibernations_refused_total"),
            m.get("lc_gateway_hibernated_total"),
            m.get("lc_gateway_failures_total"),
        ),
        (Some(&1), Some(&0), Some(&0)),
        "{m:?}"
    );
    let log = std::fs::read_to_string(plane.log("gateway")).unwrap();
    assert_eq!(
        log.matches("hibernation refused: the provider cannot snapshot")
            .count(),
        1,
        "{log}"
    );

    // The output of an exec that ended without a snapshot does not say
    // it goes on after a resume: nothing can resume it (above).
    assert!(!follow_stderr.contains("lc exec resume"), "{follow_stderr}");

    let _ = sampler_stop.send(true);
    drop(_gateway);
    drop(_worker);
    drop(_provider);
    let _ = std::fs::remove_dir_all(&dir);
    rig::remove_cgroup_parent(&plane.cgroup_parent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_delete_and_undelete_and_output_delete_through_the_cli() {
    let dir = ws::temp_dir("cli-deletion");
    let (s, _blobs, url) = start(&dir).await;
    let (t, key) = ws::tenant(&s, "blue", 4).await;
    let r = ws::running(&s, t, &key, "x1", exec_body()).await;
    let id = r.exec_id.to_string();
    let base = ["--server", url.as_str(), "--token", key.as_str()];
    let cli = |more: &[&str]| lc(&[&base[..], more].concat());

    // A running exec: refused with what to do, nothing deleted.
    let o = cli(&["workspace", "delete", &id]).await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!(
            "error: 409 exec_not_terminal: exec {id} is running: only a terminal exec's workspace can be deleted; cancel it (lc exec cancel {id}) and delete its workspace once it has ended\n"
        )
    );
    // Its command ends with one stdout page: terminal, with output.
    s.run_exec(
        r.exec_id,
        &[
            (PageKind::Stdout, b"kept\n", None),
            (PageKind::Terminal, b"", Some(PageExit::exited(0))),
        ],
    )
    .await;
    let o = cli(&["exec", "output", &id]).await.unwrap();
    assert_eq!(
        (o.status.code(), text(&o.stdout)),
        (Some(0), "kept\n".into())
    );

    // workspace delete: the deletion, 7 days of grace; show refused
    // naming the undelete; undelete restores it.
    let d = json_of(&cli(&["--json", "workspace", "delete", &id]).await.unwrap());
    assert_eq!(
        (
            &d["exec_id"],
            &d["item"],
            &d["state"],
            &d["purged_at"],
            &d["undelete"]
        ),
        (
            &json!(r.exec_id),
            &json!("workspace"),
            &json!("deleted"),
            &Value::Null,
            &json!(format!("lc workspace undelete {id}"))
        )
    );
    let ns = |v: &Value| support::ts(v.as_str().unwrap()).as_nanosecond();
    assert_eq!(
        ns(&d["purge_after"]) - ns(&d["deleted_at"]),
        604_800_000_000_000
    );
    let o = cli(&["workspace", "show", &id]).await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!(
            "error: 410 workspace_deleted: the workspace of exec {id} is deleted and is purged once a certain cut reaches {}; until then `lc workspace undelete {id}` restores it\n",
            d["purge_after"].as_str().unwrap()
        )
    );
    let u = json_of(
        &cli(&["--json", "workspace", "undelete", &id])
            .await
            .unwrap(),
    );
    assert_eq!(
        (&u["state"], &u["purge_after"], &u["undelete"]),
        (&json!("restored"), &d["purge_after"], &Value::Null)
    );
    let w = json_of(&cli(&["--json", "workspace", "show", &id]).await.unwrap());
    assert_eq!(
        w,
        json!({"workspace_id": r.workspace_id, "exec_id": r.exec_id, "head": null, "snapshots": 0})
    );
    let o = cli(&["workspace", "undelete", &id]).await.unwrap();
    assert_eq!(
        (o.status.code(), text(&o.stderr)),
        (
            Some(1),
            format!(
                "error: 409 not_deleted: the workspace of exec {id} is not deleted: there is nothing to undelete\n"
            )
        )
    );

    // exec output --delete / --undelete.
    let d = json_of(
        &cli(&["--json", "exec", "output", &id, "--delete"])
            .await
            .unwrap(),
    );
    assert_eq!(
        (&d["item"], &d["state"], &d["undelete"]),
        (
            &json!("output"),
            &json!("deleted"),
            &json!(format!("lc exec output {id} --undelete"))
        )
    );
    let o = cli(&["exec", "output", &id]).await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        text(&o.stderr),
        format!(
            "error: 410 output_deleted: the output of exec {id} is deleted and is purged once a certain cut reaches {}; until then `lc exec output {id} --undelete` restores it\n",
            d["purge_after"].as_str().unwrap()
        )
    );
    let o = cli(&["exec", "output", &id, "--undelete"]).await.unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).starts_with(&format!("exec_id      {id}\n")),
        "{}",
        text(&o.stdout)
    );
    let o = cli(&["exec", "output", &id]).await.unwrap();
    assert_eq!(
        (o.status.code(), text(&o.stdout)),
        (Some(0), "kept\n".into())
    );
    // --delete does not go with reading flags.
    let o = cli(&["exec", "output", &id, "--delete", "--follow"])
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}
