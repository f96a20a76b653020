//! The real `lc` binary against the real router on the real store, served
//! on loopback: `--json` outputs with the exact field names scripts rely
//! on, human tables, `exec output` writing page bytes exactly (stderr's
//! with `--stderr`, `--follow` until the terminal page, each seq once,
//! resumed after the server went away, exiting with the command's code or
//! 128 + its signal), `exec create
//! --wait` exiting with the command's exit code, `--data-dir` reading
//! `appliance.json`, `exec send` splitting a file into inputs with keys
//! derived from one base key (a retried command sends nothing twice), and
//! the server's refusals on stderr with exit 1.

#[path = "../../lc-api/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lc_core::model::{PageExit, PageKind};
use serde_json::{Value, json};
use support::ADMIN;
use support::pg::PgSvc;
use tokio::net::TcpListener;

/// The service on a loopback port; its base URL.
async fn serve(s: &PgSvc) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = s.router.clone();
    let state = s.state.clone();
    tokio::spawn(httpkit::serve(
        listener,
        router,
        state,
        httpkit::ConnectionLimits::default(),
        std::future::pending(),
    ));
    format!("http://{addr}")
}

/// Runs `lc` with `args` and `env`, off the async runtime.
async fn lc(args: &[&str], env: &[(&str, &str)]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_lc"));
        c.args(&args).env_remove("LC_SERVER").env_remove("LC_TOKEN");
        for (k, v) in &env {
            c.env(k, v);
        }
        c.stdin(Stdio::null()).output().expect("run lc")
    })
    .await
    .expect("join")
}

/// `a` then `b`.
fn cat<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    [a, b].concat()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_execs_and_output_through_the_cli() {
    let s = PgSvc::start().await;
    let url = serve(&s).await;
    let admin = ["--server", &url, "--token", ADMIN];
    // tenant create --json: tenant_id and api_key.
    let o = lc(
        &cat(
            &admin,
            &[
                "tenant", "create", "--name", "blue", "--units", "4", "--json",
            ],
        ),
        &[],
    )
    .await;
    let t = json_of(&o);
    let id = t["tenant_id"].as_i64().expect("tenant_id");
    assert_eq!(
        t,
        json!({"tenant_id": id, "name": "blue", "api_key": s.key_of(id)})
    );
    let key = t["api_key"].as_str().unwrap().to_string();
    let id_s = id.to_string();
    // tenant show --json: the exact balances.
    let o = lc(&cat(&admin, &["tenant", "show", &id_s, "--json"]), &[]).await;
    assert_eq!(
        json_of(&o),
        json!({"tenant_id": id, "name": "blue", "deposited": 4, "available": 4, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}})
    );
    // The human form.
    let o = lc(&cat(&admin, &["tenant", "show", &id_s]), &[]).await;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!(
            "tenant_id  {id}\nname       blue\ndeposited  4\navailable  4\nheld       0\nconsumed   0\n"
        )
    );
    // The tenant's key from the environment: exec create --json.
    let env = [("LC_SERVER", url.as_str()), ("LC_TOKEN", key.as_str())];
    let o = lc(
        &["exec", "create", "--json", "--", "sh", "-c", "printf hi"],
        &env,
    )
    .await;
    let e = json_of(&o);
    let exec_id = e["exec_id"].as_i64().expect("exec_id");
    assert_eq!(e["state"], "admitted");
    let exec_s = exec_id.to_string();
    let o = lc(&["exec", "show", &exec_s, "--json"], &env).await;
    let shown = json_of(&o);
    assert_eq!(
        (shown["state"].clone(), shown["exit_code"].clone()),
        (json!("admitted"), Value::Null)
    );
    let o = lc(&cat(&admin, &["tenant", "show", &id_s, "--json"]), &[]).await;
    assert_eq!(json_of(&o)["held"], 1);
    // The admin with --tenant sees the same exec.
    let o = lc(
        &cat(
            &admin,
            &["--tenant", &id_s, "exec", "show", &exec_s, "--json"],
        ),
        &[],
    )
    .await;
    assert_eq!(json_of(&o), shown);
    // The list, as JSON and as a table.
    let o = lc(&["exec", "list", "--json"], &env).await;
    assert_eq!(json_of(&o)["execs"][0]["exec_id"], json!(exec_id));
    let o = lc(&["exec", "list"], &env).await;
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        table.starts_with(
            "EXEC_ID  STATE     TERMINAL_REASON  EXIT_CODE  SHAPE  ATTEMPT  COMMAND\n"
        ),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "{exec_id}        admitted  -                -          small  1        sh -c printf hi"
        )),
        "{table}"
    );
    // Output: a follower started before any page waits for the terminal
    // page; meanwhile the reconciler's part stores the pages.
    let binary: Vec<u8> = (0u8..=255).rev().collect();
    let follower = {
        let env = env.map(|(k, v)| (k, v.to_string()));
        let exec_s = exec_s.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_lc"))
                .args(["exec", "output", &exec_s, "--follow", "--stderr"])
                .envs(env)
                .stdin(Stdio::null())
                .output()
                .expect("run lc")
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.run_exec(
        exec_id,
        &[
            (PageKind::Stdout, b"hi", None),
            (PageKind::Stderr, b"oops\n", None),
            (PageKind::Stdout, &binary, None),
            (PageKind::Terminal, b"", Some(PageExit::exited(3))),
        ],
    )
    .await;
    let followed = tokio::time::timeout(Duration::from_secs(30), follower)
        .await
        .expect("the follower ends at the terminal page")
        .expect("join");
    // The follower exits with the command's own exit code.
    assert_eq!(followed.status.code(), Some(3), "{followed:?}");
    assert_eq!(followed.stdout, [b"hi".as_slice(), &binary].concat());
    assert_eq!(followed.stderr, b"oops\n");
    // Without --stderr only stdout bytes, exactly.
    let o = lc(&["exec", "output", &exec_s], &env).await;
    assert!(o.status.success());
    assert_eq!(o.stdout, [b"hi".as_slice(), &binary].concat());
    assert_eq!(o.stderr, b"");
    // From a seq on.
    let o = lc(&["exec", "output", &exec_s, "--after-seq", "2"], &env).await;
    assert_eq!(o.stdout, binary);
    // exec show --json at the end: terminal with the exit code; the unit
    // is back.
    let o = lc(&["exec", "show", &exec_s, "--json"], &env).await;
    let done = json_of(&o);
    assert_eq!(
        (done["state"].clone(), done["exit_code"].clone()),
        (json!("terminal"), json!(3))
    );
    let o = lc(&["tenant", "show", &id_s, "--json"], &env).await;
    assert_eq!(
        json_of(&o),
        json!({"tenant_id": id, "name": "blue", "deposited": 4, "available": 4, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}})
    );
    // operation show.
    let o = lc(
        &cat(&admin, &["operation", "show", "--json", "never-used"]),
        &[],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).starts_with("error: 404 not_found: "),
        "{o:?}"
    );
    // A negative deposit is a value, not a flag: the server refuses it and
    // the balances stay as they were.
    let o = lc(
        &cat(&admin, &["tenant", "deposit", &id_s, "--units", "-4"]),
        &[],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .starts_with("error: 422 invalid_units: invalid units -4: must be at least 1"),
        "{o:?}"
    );
    let o = lc(&cat(&admin, &["tenant", "show", &id_s, "--json"]), &[]).await;
    assert_eq!(json_of(&o)["deposited"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_with_the_commands_code_and_refusals_exit_1() {
    let s = PgSvc::start_with(lc_api::ServiceOptions {
        runtime_dir: Some(
            std::env::temp_dir().join(format!("lc-cli-runtimes-{}", std::process::id())),
        ),
        ..lc_api::ServiceOptions::default()
    })
    .await;
    let url = serve(&s).await;
    let dir = std::env::temp_dir().join(format!("lc-cli-{}-{}", std::process::id(), url.len()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("admin.token"), format!("{ADMIN}\n")).unwrap();
    std::fs::write(
        dir.join("appliance.json"),
        serde_json::to_vec(&json!({"url": url, "admin_token_file": "admin.token", "pids": {}}))
            .unwrap(),
    )
    .unwrap();
    let data_dir = dir.to_str().unwrap().to_string();
    // --data-dir: the URL and the admin token from appliance.json.
    let o = lc(
        &[
            "--data-dir",
            &data_dir,
            "tenant",
            "create",
            "--name",
            "green",
            "--units",
            "1",
            "--json",
        ],
        &[],
    )
    .await;
    let t = json_of(&o);
    let id = t["tenant_id"].as_i64().unwrap();
    let id_s = id.to_string();
    // --idempotency-key: a replay prints the same tenant and key.
    let o1 = lc(
        &[
            "--data-dir",
            &data_dir,
            "--idempotency-key",
            "k-red",
            "tenant",
            "create",
            "--name",
            "red",
            "--json",
        ],
        &[],
    )
    .await;
    let o2 = lc(
        &[
            "--data-dir",
            &data_dir,
            "--idempotency-key",
            "k-red",
            "tenant",
            "create",
            "--name",
            "red",
            "--json",
        ],
        &[],
    )
    .await;
    assert_eq!(json_of(&o1), json_of(&o2));
    let o3 = lc(
        &[
            "--data-dir",
            &data_dir,
            "--idempotency-key",
            "k-red",
            "tenant",
            "create",
            "--name",
            "rose",
            "--json",
        ],
        &[],
    )
    .await;
    assert_eq!(o3.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o3.stderr).starts_with("error: 409 idempotency_conflict: "),
        "{o3:?}"
    );
    // A refusal: medium needs 2 units, 1 is there.
    let o = lc(
        &[
            "--data-dir",
            &data_dir,
            "--tenant",
            &id_s,
            "exec",
            "create",
            "--shape",
            "medium",
            "--",
            "true",
        ],
        &[],
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "error: 409 insufficient_capacity: insufficient capacity: 2 units requested, 1 available; wait for the tenant's running execs to end (their units return) or cancel one, or have the admin deposit more units\n"
    );
    assert_eq!(o.stdout, b"");
    // --wait: the command's exit code.
    let waiter = {
        let data_dir = data_dir.clone();
        let id_s = id_s.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_lc"))
                .args([
                    "--data-dir",
                    &data_dir,
                    "--tenant",
                    &id_s,
                    "exec",
                    "create",
                    "--wait",
                    "--json",
                    "--",
                    "false",
                ])
                .env_remove("LC_SERVER")
                .env_remove("LC_TOKEN")
                .stdin(Stdio::null())
                .output()
                .expect("run lc")
        })
    };
    // Find the exec once admitted, then finish it with exit code 42.
    let mut exec_id = None;
    for _ in 0..100 {
        let o = lc(
            &[
                "--data-dir",
                &data_dir,
                "--tenant",
                &id_s,
                "exec",
                "list",
                "--json",
            ],
            &[],
        )
        .await;
        if let Some(e) = json_of(&o)["execs"][0]["exec_id"].as_i64() {
            exec_id = Some(e);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let exec_id = exec_id.expect("the waiting exec was admitted");
    s.run_exec(
        exec_id,
        &[(PageKind::Terminal, b"", Some(PageExit::exited(42)))],
    )
    .await;
    let waited = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("--wait ends at the terminal state")
        .expect("join");
    assert_eq!(waited.status.code(), Some(42), "{waited:?}");
    let shown: Value = serde_json::from_slice(&waited.stdout).expect("json");
    assert_eq!(
        (shown["state"].clone(), shown["exit_code"].clone()),
        (json!("terminal"), json!(42))
    );
    // tenant deposit, as JSON.
    let o = lc(
        &[
            "--data-dir",
            &data_dir,
            "tenant",
            "deposit",
            &id_s,
            "--units",
            "2",
            "--json",
        ],
        &[],
    )
    .await;
    assert_eq!(
        json_of(&o),
        json!({"tenant_id": id, "name": "green", "deposited": 3, "available": 3, "held": 0, "consumed": 0, "approval_policy": {"require": "off", "shapes": []}})
    );
    // exec cancel with a chosen key, then operation show of that key.
    let o = lc(
        &[
            "--data-dir",
            &data_dir,
            "--tenant",
            &id_s,
            "exec",
            "create",
            "--json",
            "--",
            "sleep",
            "100",
        ],
        &[],
    )
    .await;
    let sleeper = json_of(&o)["exec_id"].as_i64().unwrap().to_string();
    let o = lc(
        &[
            "--data-dir",
            &data_dir,
            "--tenant",
            &id_s,
            "--idempotency-key",
            "cancel-sleeper",
            "exec",
            "cancel",
            &sleeper,
            "--json",
        ],
        &[],
    )
    .await;
    let cancelled = json_of(&o);
    assert_eq!(cancelled["cancel_requested"], true);
    let o = lc(
        &[
            "--data-dir",
            &data_dir,
            "--tenant",
            &id_s,
            "operation",
            "show",
            "cancel-sleeper",
            "--json",
        ],
        &[],
    )
    .await;
    let op = json_of(&o);
    assert_eq!(
        (
            op["key"].clone(),
            op["scope"].clone(),
            op["tenant_id"].clone()
        ),
        (json!("cancel-sleeper"), json!("tenant"), json!(id))
    );
    // runtime import of a directory, then list.
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    std::fs::write(tree.join("bin/tool"), b"#!/bin/sh\necho tool\n").unwrap();
    std::os::unix::fs::symlink("bin/tool", tree.join("tool")).unwrap();
    let o = lc(
        &[
            "--data-dir",
            &data_dir,
            "runtime",
            "import",
            "--name",
            "tools",
            tree.to_str().unwrap(),
            "--json",
        ],
        &[],
    )
    .await;
    let rt = json_of(&o);
    assert_eq!(rt["name"], "tools");
    let digest = rt["digest"].as_str().unwrap().to_string();
    assert!(
        s.runtime_dir()
            .join(&digest)
            .join("tree/bin/tool")
            .is_file(),
        "unpacked by digest"
    );
    let o = lc(&["--data-dir", &data_dir, "runtime", "list"], &[]).await;
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(table.starts_with("NAME   DIGEST\nbase   "), "{table}");
    assert!(table.ends_with(&format!("tools  {digest}\n")), "{table}");
    // While the cut is uncertain a command waits for it (bounded), with
    // the same idempotency key, and proceeds once it is certain.
    s.clock.force_uncertain(true);
    let creator = {
        let data_dir = data_dir.clone();
        let id_s = id_s.clone();
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_lc"))
                .args([
                    "--data-dir",
                    &data_dir,
                    "--tenant",
                    &id_s,
                    "exec",
                    "create",
                    "--json",
                    "--",
                    "true",
                ])
                .env_remove("LC_SERVER")
                .env_remove("LC_TOKEN")
                .stdin(Stdio::null())
                .output()
                .expect("run lc")
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.clock.force_uncertain(false);
    let o = tokio::time::timeout(Duration::from_secs(30), creator)
        .await
        .expect("lc ends")
        .expect("join");
    assert_eq!(json_of(&o)["state"], "admitted");
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .starts_with("the safe expiry cut is uncertain (stale); retrying in 2 s\n"),
        "{o:?}"
    );
    // No credential: the server's 401.
    let o = lc(&["--server", &url, "exec", "list"], &[]).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "error: 401 unauthenticated: a bearer credential is required\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(s.runtime_dir()).unwrap();
}

/// Serves `s` on `addr` until `stop` fires; the task ends once every
/// connection has closed.
fn serve_on(
    s: &PgSvc,
    listener: TcpListener,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(httpkit::serve(
        listener,
        s.router.clone(),
        s.state.clone(),
        httpkit::ConnectionLimits::default(),
        async move {
            let _ = stop.await;
        },
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_resumes_after_a_dropped_connection_and_writes_each_seq_once() {
    use std::io::Read as _;
    use std::sync::{Arc, Mutex};
    let s = PgSvc::start().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let url = format!("http://{addr}");
    let (stop, rx) = tokio::sync::oneshot::channel();
    let first = serve_on(&s, listener, rx);
    let admin = ["--server", &url, "--token", ADMIN];
    let t = json_of(
        &lc(
            &cat(
                &admin,
                &[
                    "tenant", "create", "--name", "blue", "--units", "2", "--json",
                ],
            ),
            &[],
        )
        .await,
    );
    let key = t["api_key"].as_str().unwrap().to_string();
    let env = [("LC_SERVER", url.as_str()), ("LC_TOKEN", key.as_str())];
    let e = json_of(&lc(&["exec", "create", "--json", "--", "sh", "-c", "x"], &env).await);
    let exec_id = e["exec_id"].as_i64().unwrap();
    s.run_exec(
        exec_id,
        &[
            (PageKind::Stdout, b"one\n", None),
            (PageKind::Stdout, b"two\n", None),
        ],
    )
    .await;

    // The follower, its stdout and stderr collected as they come.
    let mut child = Command::new(env!("CARGO_BIN_EXE_lc"))
        .args([
            "exec",
            "output",
            &exec_id.to_string(),
            "--follow",
            "--wait-timeout-s",
            "60",
        ])
        .env("LC_SERVER", &url)
        .env("LC_TOKEN", &key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lc");
    let collect = |mut r: Box<dyn std::io::Read + Send>| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let b = buf.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = r.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                b.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        buf
    };
    let out = collect(Box::new(child.stdout.take().unwrap()));
    let err = collect(Box::new(child.stderr.take().unwrap()));
    let wait_for = |buf: &Arc<Mutex<Vec<u8>>>, what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if String::from_utf8_lossy(&buf.lock().unwrap()).contains(what) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no {what:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(&out, "one\ntwo\n");

    // The server goes away; the follower retries from seq 2.
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the server stops")
        .unwrap();
    let at = s.reading().await;
    let lease = {
        use lc_core::store::ReconcileStore as _;
        s.store
            .due_work(at, 10)
            .await
            .unwrap()
            .into_iter()
            .find(|w| w.exec_id.0 == exec_id)
            .unwrap()
    };
    let page = |seq: i64, kind, bytes: &[u8], exit| lc_core::OutputPage {
        exec_id: lc_core::ExecId(exec_id),
        attempt: lc_core::AttemptNo(1),
        seq,
        kind,
        bytes: bytes.to_vec(),
        sha256: lc_core::Digest::of(bytes),
        exit,
    };
    {
        use lc_core::store::ReconcileStore as _;
        s.store
            .append_pages(
                lease.lease_id,
                lease.generation,
                &[
                    page(3, PageKind::Stdout, b"three\n", None),
                    page(4, PageKind::Terminal, b"", Some(PageExit::signaled(15))),
                ],
            )
            .await
            .unwrap();
    }
    wait_for(&err, "resuming after seq 2");

    // The same address again: the follower resumes and ends at the
    // terminal page with 128 + the signal.
    let listener = TcpListener::bind(addr).await.expect("rebind");
    let (_stop, rx) = tokio::sync::oneshot::channel();
    let _second = serve_on(&s, listener, rx);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(143));
    // Let the reader threads drain what is left.
    wait_for(&out, "three\n");
    assert_eq!(
        String::from_utf8(out.lock().unwrap().clone()).unwrap(),
        "one\ntwo\nthree\n"
    );
    let errs = String::from_utf8(err.lock().unwrap().clone()).unwrap();
    assert!(
        errs.lines().all(|l| l.contains("resuming after seq 2")),
        "{errs}"
    );
    // While the server was down the waits doubled from 200 ms (at most
    // 5 s), one line per try.
    let waits: Vec<u64> = errs
        .lines()
        .map(|l| {
            l.rsplit_once(" in ")
                .and_then(|(_, w)| w.strip_suffix(" ms"))
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("no wait in {l:?}"))
        })
        .collect();
    let doubling = [200, 400, 800, 1600, 3200, 5000, 5000, 5000];
    assert!(
        !waits.is_empty() && waits.len() <= doubling.len() && waits[..] == doubling[..waits.len()],
        "{waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_send_splits_into_inputs_and_a_retried_command_sends_nothing_twice() {
    use lc_core::owner::{OwnerCredential, OwnerToken};
    use lc_core::page::INPUT_BYTES_MAX;
    use lc_core::store::{GatewayStore as _, ReconcileStore as _};
    let s = PgSvc::start().await;
    let url = serve(&s).await;
    let admin = ["--server", &url, "--token", ADMIN];
    let t = json_of(
        &lc(
            &cat(
                &admin,
                &[
                    "tenant", "create", "--name", "blue", "--units", "4", "--json",
                ],
            ),
            &[],
        )
        .await,
    );
    let key = t["api_key"].as_str().unwrap().to_string();
    let env = [("LC_SERVER", url.as_str()), ("LC_TOKEN", key.as_str())];
    let create = |open: bool| async move {
        let mut args = vec!["exec", "create", "--json"];
        if open {
            args.push("--stdin-open");
        }
        args.extend(["--", "cat"]);
        json_of(&lc(&args, &env).await)["exec_id"].as_i64().unwrap()
    };
    let exec = create(true).await;
    let exec_s = exec.to_string();

    // Two full inputs and 10 bytes more: three inputs, in order.
    let bytes: Vec<u8> = (0..2 * INPUT_BYTES_MAX + 10)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect();
    let dir = std::env::temp_dir().join(format!("lc-cli-send-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("input.bin");
    std::fs::write(&file, &bytes).unwrap();
    let file_s = file.to_str().unwrap().to_string();
    let send_file = [
        "--idempotency-key",
        "feed-1",
        "exec",
        "send",
        &exec_s,
        "--file",
        &file_s,
        "--json",
    ];
    let want_inputs: Vec<Value> = bytes
        .chunks(INPUT_BYTES_MAX)
        .enumerate()
        .map(|(i, c)| {
            json!({
                "exec_id": exec,
                "input_seq": i + 1,
                "length": c.len(),
                "sha256": lc_core::Digest::of(c).to_hex(),
                "eof": false,
                "state": "queued",
            })
        })
        .collect();
    let first = json_of(&lc(&send_file, &env).await);
    assert_eq!(first, json!({ "inputs": want_inputs }));
    // The same command again: the same inputs, none sent twice.
    assert_eq!(json_of(&lc(&send_file, &env).await), first);
    // The human table.
    let o = lc(
        &[
            "--idempotency-key",
            "feed-1",
            "exec",
            "send",
            &exec_s,
            "--file",
            &file_s,
        ],
        &env,
    )
    .await;
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        text.lines()
            .map(|l| l.split_whitespace().take(5).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>(),
        vec![
            "EXEC_ID INPUT_SEQ LENGTH EOF STATE".to_string(),
            format!("{exec} 1 65536 false queued"),
            format!("{exec} 2 65536 false queued"),
            format!("{exec} 3 10 false queued"),
        ],
        "{text}"
    );

    // Text and eof: the fourth input closes stdin; nothing follows it.
    let o = lc(
        &[
            "exec", "send", &exec_s, "--data", "tail\n", "--eof", "--json",
        ],
        &env,
    )
    .await;
    assert_eq!(
        json_of(&o),
        json!({"inputs": [{
            "exec_id": exec,
            "input_seq": 4,
            "length": 5,
            "sha256": lc_core::Digest::of(b"tail\n").to_hex(),
            "eof": true,
            "state": "queued",
        }]})
    );
    let o = lc(&["exec", "send", &exec_s, "--data", "more"], &env).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "error: 409 input_closed: exec {exec}: stdin was closed by input 4; nothing more is accepted\n"
        )
    );

    // The store holds exactly those four inputs, the file's bytes in order.
    let at = s.reading().await;
    let work = s.store.due_work(at, 10).await.expect("due work");
    let lease = work.iter().find(|w| w.exec_id.0 == exec).expect("lease");
    s.store
        .mark_active(lease.lease_id, lease.generation, at)
        .await
        .expect("active");
    let token = OwnerToken::from_bytes([5; 32]);
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
    let cred = OwnerCredential {
        token,
        generation: owned[0].ownership.generation,
        fence: owned[0].ownership.fence,
    };
    let queued = s
        .store
        .queued_inputs(&cred, lc_core::ExecId(exec), s.reading().await, 16)
        .await
        .expect("queued");
    assert_eq!(
        queued.iter().map(|i| i.input_seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    let mut want = bytes.clone();
    want.extend_from_slice(b"tail\n");
    assert_eq!(queued.concat_bytes(), want);

    // Refusals with what to do next.
    let o = lc(&["exec", "send", &exec_s], &env).await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "error: nothing to send: name the bytes with --data TEXT, --file PATH or - for stdin, or close stdin with --eof alone\n"
    );
    let o = lc(&["exec", "send", &exec_s, "stdin"], &env).await;
    assert_eq!(
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned()),
        (
            Some(1),
            "error: unexpected argument \"stdin\": name the bytes with --data TEXT, --file PATH, or - for stdin\n".to_string()
        )
    );
    let other = create(true).await;
    let other_s = other.to_string();
    // `-` reads stdin (empty here): without --eof that is nothing to send.
    let o = lc(&["exec", "send", &other_s, "-"], &env).await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(1),
            "error: nothing to send: the bytes are empty; add --eof to close stdin\n".to_string()
        )
    );
    let o = lc(&["exec", "send", &other_s, "-", "--eof", "--json"], &env).await;
    assert_eq!(json_of(&o)["inputs"][0]["length"], json!(0));
    assert_eq!(json_of(&o)["inputs"][0]["eof"], json!(true));
    let shut = create(false).await;
    let o = lc(&["exec", "send", &shut.to_string(), "--data", "x"], &env).await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(1),
            format!(
                "error: 409 stdin_not_open: exec {shut} was admitted without stdin_open: its command reads no input\n"
            )
        )
    );

    // A queue no gateway drains: 4 full inputs fit (256 KiB), the fifth
    // waits and the command gives up with exit 124, naming the key to
    // run it again with.
    let full = create(true).await;
    std::fs::write(&file, vec![b'z'; 5 * INPUT_BYTES_MAX]).unwrap();
    let o = lc(
        &[
            "--idempotency-key",
            "feed-2",
            "exec",
            "send",
            &full.to_string(),
            "--file",
            &file_s,
            "--wait-timeout-s",
            "0",
        ],
        &env,
    )
    .await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(124),
            format!(
                "exec {full}: the input queue stayed full for 0 s (is a gateway running?); 4 of 5 inputs were accepted; run the same command again to send the rest (nothing is sent twice)\n"
            )
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bytes of inputs, concatenated in their order.
trait ConcatBytes {
    fn concat_bytes(&self) -> Vec<u8>;
}

impl ConcatBytes for Vec<lc_core::input::InputRecord> {
    fn concat_bytes(&self) -> Vec<u8> {
        self.iter().flat_map(|i| i.bytes.iter().copied()).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_of_an_exec_that_did_not_finish_exits_1_naming_its_reason() {
    use lc_core::model::TerminalReason;
    let s = PgSvc::start().await;
    let url = serve(&s).await;
    let admin = ["--server", &url, "--token", ADMIN];
    let t = json_of(
        &lc(
            &cat(
                &admin,
                &[
                    "tenant", "create", "--name", "gray", "--units", "4", "--json",
                ],
            ),
            &[],
        )
        .await,
    );
    let tenant = t["tenant_id"].as_i64().unwrap().to_string();
    let acting = cat(&admin, &["--tenant", &tenant]);
    // Cancelled before it started: no page at all.
    let cancelled = json_of(
        &lc(
            &cat(&acting, &["exec", "create", "--json", "--", "sleep", "100"]),
            &[],
        )
        .await,
    )["exec_id"]
        .as_i64()
        .unwrap();
    let c = cancelled.to_string();
    json_of(&lc(&cat(&acting, &["exec", "cancel", &c, "--json"]), &[]).await);
    s.end_exec_unstarted(cancelled, TerminalReason::Cancelled)
        .await;
    // Expired (its 1 ms timeout passed on a certain cut) before it started.
    let expired = json_of(
        &lc(
            &cat(
                &acting,
                &[
                    "exec",
                    "create",
                    "--timeout-ms",
                    "1",
                    "--json",
                    "--",
                    "sleep",
                    "100",
                ],
            ),
            &[],
        )
        .await,
    )["exec_id"]
        .as_i64()
        .unwrap();
    let x = expired.to_string();
    s.end_exec_unstarted(expired, TerminalReason::Expired).await;
    let o = lc(&cat(&acting, &["exec", "output", &c, "--follow"]), &[]).await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
            o.stdout.len()
        ),
        (
            Some(1),
            format!(
                "exec {c} ended cancelled: it was cancelled before its command exited; the output it wrote is kept (lc exec output {c})\n"
            ),
            0
        )
    );
    let o = lc(&cat(&acting, &["exec", "output", &x, "--follow"]), &[]).await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
            o.stdout.len()
        ),
        (
            Some(1),
            format!(
                "exec {x} ended expired: its --timeout-ms passed before its command exited; the output it wrote is kept (lc exec output {x}); run it again with a larger --timeout-ms (or none) with lc exec create\n"
            ),
            0
        )
    );
    // Without --follow the bytes are all there is to write: exit 0.
    let o = lc(&cat(&acting, &["exec", "output", &x]), &[]).await;
    assert_eq!((o.status.code(), o.stderr.len()), (Some(0), 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_flag_or_the_check_that_fixes_them() {
    let s = PgSvc::start().await;
    let url = serve(&s).await;
    // The admin token without --tenant on a tenant command: the flag.
    let o = lc(&["--server", &url, "--token", ADMIN, "exec", "list"], &[]).await;
    assert_eq!(
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned()),
        (
            Some(1),
            "error: 400 tenant_required: the admin token acts for one tenant on this command: name it with --tenant N\n".into()
        )
    );
    // A token the server does not know: refused, and what to check.
    let o = lc(
        &[
            "--server",
            &url,
            "--token",
            "lcadm_forged-token-0123456789",
            "exec",
            "list",
        ],
        &[],
    )
    .await;
    assert_eq!(
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned()),
        (
            Some(1),
            "error: 401 unauthenticated: the bearer credential was not accepted: it is neither this service's admin token nor a tenant API key or scoped token it issued; check the token sent (lc takes it from --token, LC_TOKEN or the admin token file of --data-dir) and that it belongs to this control plane\n".into()
        )
    );
    // Nothing listens: the URL, and how to check.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gone = format!("http://127.0.0.1:{closed}");
    let o = lc(
        &["--server", &gone, "--token", ADMIN, "runtime", "list"],
        &[],
    )
    .await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(1),
            format!(
                "error: the control plane is not reachable at http://127.0.0.1:{closed}/ (connection refused); check that it runs (little-compute appliance status --data-dir DIR) and that --server, LC_SERVER or --data-dir names it\n"
            )
        )
    );
    // Named through --data-dir, the hint names that directory.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), ADMIN).unwrap();
    std::fs::write(
        dir.path().join("appliance.json"),
        serde_json::to_vec(&json!({"url": gone, "admin_token_file": "admin.token"})).unwrap(),
    )
    .unwrap();
    let d = dir.path().to_str().unwrap();
    let o = lc(&["--data-dir", d, "runtime", "list"], &[]).await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(1),
            format!(
                "error: the control plane is not reachable at http://127.0.0.1:{closed}/ (connection refused); check that it runs (little-compute appliance status --data-dir {d}) and that --server, LC_SERVER or --data-dir names it\n"
            )
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_is_minted_used_listed_and_revoked_through_the_cli() {
    let s = PgSvc::start().await;
    let url = serve(&s).await;
    let admin = ["--server", &url, "--token", ADMIN];
    let t = json_of(
        &lc(
            &cat(
                &admin,
                &[
                    "tenant", "create", "--name", "teal", "--units", "2", "--json",
                ],
            ),
            &[],
        )
        .await,
    );
    let key = t["api_key"].as_str().unwrap().to_string();
    let tenant_env = [("LC_SERVER", url.as_str()), ("LC_TOKEN", key.as_str())];
    let e = json_of(&lc(&["exec", "create", "--json", "--", "true"], &tenant_env).await);
    let exec_s = e["exec_id"].as_i64().unwrap().to_string();

    // Mint: the secret once and the deadline, in the human form.
    let o = lc(
        &[
            "token",
            "mint",
            "--exec",
            &exec_s,
            "--op",
            "exec.read",
            "--op",
            "workspace.read",
            "--ttl",
            "1h",
        ],
        &tenant_env,
    )
    .await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == name).then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    let (id, secret, deadline) = (field("token_id"), field("token"), field("deadline"));
    assert!(secret.starts_with("lct_") && secret.len() == 47, "{text}");
    assert_eq!(
        text,
        format!(
            "token_id    {id}\ntoken       {secret}\nexec_id     {exec_s}\noperations  exec.read workspace.read\ndeadline    {deadline}\n"
        )
    );

    // The agent uses it as --token: its exec, and nothing else.
    let agent = ["--server", url.as_str(), "--token", secret.as_str()];
    let shown = json_of(&lc(&cat(&agent, &["exec", "show", &exec_s, "--json"]), &[]).await);
    assert_eq!(shown["exec_id"].to_string(), exec_s);
    let o = lc(&cat(&agent, &["exec", "list"]), &[]).await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(1),
            format!(
                "error: 403 forbidden: this token is bound to exec {exec_s}: it acts only on that exec's routes, not on exec.read across execs\n"
            )
        )
    );
    let o = lc(&cat(&agent, &["token", "list"]), &[]).await;
    assert_eq!(
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned()),
        (
            Some(1),
            "error: 403 forbidden: a scoped token may not call GET /v1/tokens: tokens are minted, listed and revoked only with the tenant's API key\n".into()
        )
    );

    // Listed by the tenant, without the secret.
    let list = json_of(&lc(&["token", "list", "--json"], &tenant_env).await);
    assert_eq!(list["tokens"].as_array().unwrap().len(), 1);
    assert_eq!(list["tokens"][0]["token_id"].to_string(), id);
    assert_eq!(list["tokens"][0]["revoked"], json!(false));
    assert!(!list.to_string().contains(&secret));

    // Revoked (twice: the same record), then refused.
    let r1 = json_of(&lc(&["token", "revoke", &id, "--json"], &tenant_env).await);
    assert_eq!(r1["revoked"], json!(true));
    let r2 = json_of(&lc(&["token", "revoke", &id, "--json"], &tenant_env).await);
    assert_eq!(r1, r2);
    let o = lc(&cat(&agent, &["exec", "show", &exec_s]), &[]).await;
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(1),
            format!(
                "error: 401 token_revoked: token {id} was revoked; mint a new one (POST /v1/tokens, lc token mint)\n"
            )
        )
    );

    // A replayed mint cannot show the secret again: exit 1 and what to do.
    let mint = [
        "token",
        "mint",
        "--op",
        "exec.read",
        "--ttl",
        "90s",
        "--idempotency-key",
        "m-1",
    ];
    assert!(lc(&mint, &tenant_env).await.status.success());
    let o = lc(&mint, &tenant_env).await;
    let again = String::from_utf8_lossy(&o.stdout).into_owned();
    let id2 = again
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("token_id")
        .trim()
        .to_string();
    assert_eq!(
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned()
        ),
        (
            Some(1),
            format!(
                "error: token {id2} was minted by an earlier use of this --idempotency-key, and its secret is shown only once: revoke it (lc token revoke {id2}) and mint another under a new key\n"
            )
        )
    );
    // A malformed --ttl is a usage error.
    let o = lc(
        &["token", "mint", "--op", "exec.read", "--ttl", "1y"],
        &tenant_env,
    )
    .await;
    assert_eq!(o.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_list_shows_workers_claims_to_the_admin_only() {
    use lc_core::claim::ClaimHolder;
    use lc_core::store::ReconcileStore as _;
    let s = PgSvc::start().await;
    let url = serve(&s).await;
    let admin = ["--server", &url, "--token", ADMIN];
    let t = json_of(
        &lc(
            &cat(
                &admin,
                &[
                    "tenant", "create", "--name", "blue", "--units", "1", "--json",
                ],
            ),
            &[],
        )
        .await,
    );
    let key = t["api_key"].as_str().unwrap().to_string();
    let tenant = ["--server", url.as_str(), "--token", key.as_str()];
    json_of(
        &lc(
            &cat(&tenant, &["exec", "create", "--json", "--", "sleep", "60"]),
            &[],
        )
        .await,
    );
    // Nothing claimed yet: an empty list.
    let o = lc(&cat(&admin, &["claim", "list", "--json"]), &[]).await;
    assert_eq!(json_of(&o)["claims"], json!([]));
    let holder = ClaimHolder::from_bytes([0x42; 16]);
    let at = s.reading().await;
    let won = s.store.claim_due_work(&holder, at, 10).await.unwrap();
    assert_eq!(won.len(), 1);
    let (lease, expiry) = (won[0].work.lease_id.0, won[0].expiry);
    let o = lc(&cat(&admin, &["claim", "list", "--json"]), &[]).await;
    let v = json_of(&o);
    assert_eq!(
        (&v["certain"], &v["claims"], &v["next_after_lease"]),
        (
            &json!(true),
            &json!([{
                "item_kind": "lease",
                "item_id": lease,
                "holder_sha256": holder.sha256().to_hex(),
                "generation": 1,
                "expiry": expiry,
                "basis": "unowned",
                "expired": false,
                "takeable": false,
            }]),
            &Value::Null
        )
    );
    // The human table: a header and one row.
    let o = lc(&cat(&admin, &["claim", "list"]), &[]).await;
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "ITEM_KIND",
            "ITEM_ID",
            "HOLDER_SHA256",
            "GENERATION",
            "EXPIRY",
            "BASIS",
            "EXPIRED",
            "TAKEABLE"
        ]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        [
            "lease".to_string(),
            lease.to_string(),
            holder.sha256().to_hex(),
            "1".to_string(),
            expiry.to_string(),
            "unowned".to_string(),
            "false".to_string(),
            "false".to_string()
        ]
    );
    // Past the last claim: empty.
    let after = lease.to_string();
    let o = lc(
        &cat(
            &admin,
            &["claim", "list", "--after-lease", &after, "--json"],
        ),
        &[],
    )
    .await;
    assert_eq!(json_of(&o)["claims"], json!([]));
    // A tenant's key is refused, exit 1, the code on stderr.
    let o = lc(&cat(&tenant, &["claim", "list"]), &[]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).starts_with("error: 403 forbidden: "),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A limit outside 1..=1000: the server's refusal names it.
    let o = lc(&cat(&admin, &["claim", "list", "--limit", "0"]), &[]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).starts_with("error: 422 invalid_limit: "),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_through_the_cli() {
    let s = PgSvc::start().await;
    let url = serve(&s).await;
    let admin = ["--server", &url, "--token", ADMIN];
    let t = json_of(
        &lc(
            &cat(
                &admin,
                &[
                    "tenant", "create", "--name", "blue", "--units", "2", "--json",
                ],
            ),
            &[],
        )
        .await,
    );
    let id = t["tenant_id"].as_i64().unwrap();
    let id_s = id.to_string();
    let key = t["api_key"].as_str().unwrap().to_string();
    // The policy (admin): the named shapes need an approval.
    let o = lc(
        &cat(
            &admin,
            &[
                "tenant",
                "approval-policy",
                &id_s,
                "--shape",
                "small",
                "--shape",
                "medium",
            ],
        ),
        &[],
    )
    .await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!(
            "tenant_id        {id}\nname             blue\ndeposited        2\navailable        2\nheld             0\nconsumed         0\napproval_policy  small medium\n"
        )
    );
    // Neither --require nor --shape: refused by lc, nothing sent.
    let o = lc(&cat(&admin, &["tenant", "approval-policy", &id_s]), &[]).await;
    assert_eq!(o.status.code(), Some(2));
    let env = [("LC_SERVER", url.as_str()), ("LC_TOKEN", key.as_str())];
    let e = json_of(&lc(&["exec", "create", "--json", "--", "true"], &env).await);
    assert_eq!(e["state"], "awaiting_approval");
    let exec = e["exec_id"].as_i64().unwrap().to_string();
    let o = lc(&["exec", "show", &exec], &env).await;
    assert!(
        has_field(
            &String::from_utf8_lossy(&o.stdout),
            "state",
            "awaiting_approval"
        ),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let list = json_of(&lc(&["approval", "list", "--json"], &env).await);
    assert_eq!(list, json!({"awaiting": [e.clone()], "decisions": []}));
    // A bad --valid-for is refused by lc; 2h by the server's bound.
    let o = lc(&["approval", "approve", &exec, "--valid-for", "15x"], &env).await;
    assert_eq!(o.status.code(), Some(2));
    let o = lc(&["approval", "approve", &exec, "--valid-for", "2h"], &env).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("422 invalid_validity"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let ok = json_of(
        &lc(
            &[
                "approval",
                "approve",
                &exec,
                "--valid-for",
                "15m",
                "--json",
                "--idempotency-key",
                "ap-1",
            ],
            &env,
        )
        .await,
    );
    assert_eq!(ok["state"], "admitted");
    assert_eq!(ok["approval"]["validity_ms"], 900_000);
    assert_eq!(ok["approval"]["approver"], "tenant");
    // The same key again: the same record.
    let again = json_of(
        &lc(
            &[
                "approval",
                "approve",
                &exec,
                "--valid-for",
                "15m",
                "--json",
                "--idempotency-key",
                "ap-1",
            ],
            &env,
        )
        .await,
    );
    assert_eq!(again, ok);
    let o = lc(&["exec", "show", &exec], &env).await;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(has_field(&text, "approval.decision", "approved"), "{text}");
    assert!(has_field(&text, "approval.approver", "tenant"), "{text}");
    // A second decision: 409 on stderr, exit 1.
    let o = lc(&["approval", "deny", &exec, "--reason", "late"], &env).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("409 exec_not_awaiting_approval"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The admin denies another with --tenant.
    let e2 = json_of(
        &lc(
            &[
                "exec", "create", "--shape", "medium", "--json", "--", "true",
            ],
            &env,
        )
        .await,
    );
    let exec2 = e2["exec_id"].as_i64().unwrap().to_string();
    let d = json_of(
        &lc(
            &cat(
                &admin,
                &[
                    "--tenant", &id_s, "approval", "deny", &exec2, "--reason", "no", "--json",
                ],
            ),
            &[],
        )
        .await,
    );
    assert_eq!(
        (d["state"].clone(), d["terminal_reason"].clone()),
        (json!("terminal"), json!("denied"))
    );
    assert_eq!(d["approval"]["approver"], "admin");
    let list = json_of(&lc(&["approval", "list", "--json"], &env).await);
    assert_eq!(list["awaiting"], json!([]));
    assert_eq!(
        list["decisions"],
        json!([d["approval"].clone(), ok["approval"].clone()])
    );
    let o = lc(&["approval", "list"], &env).await;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        text.starts_with(
            "awaiting approval: none\ndecisions:\nEXEC_ID  DECISION  APPROVER  DECIDED_CUT"
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!("\n{exec2}        denied    admin     ")),
        "{text}"
    );
}

/// Whether the `field  value` lines of `text` hold `name` with exactly
/// `value` (however wide the name column is).
fn has_field(text: &str, name: &str, value: &str) -> bool {
    text.lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == [name, value])
}
