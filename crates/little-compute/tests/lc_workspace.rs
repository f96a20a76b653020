//! The real `lc` binary against the real router on the real store, served
//! on loopback, with snapshot blobs in a real blob directory: `exec
//! hibernate --wait` and `exec resume --wait` waiting for the gateway's
//! steps, `workspace show` and `workspace snapshots`, `workspace download`
//! writing the exact files, modes and symlink (a non-empty directory and
//! a corrupt blob refused with nothing written), and `exec output
//! --follow` going on past a stopped page into the resumed generation.

#[path = "../../lc-api/tests/support/mod.rs"]
mod support;

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
    let m = ws::quiesce(&s, &r, &tree, &blobs).await;
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

    // workspace download: exact files, modes and symlink.
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
