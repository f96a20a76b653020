//! Refusals of the worker, gateway and appliance commands before they
//! touch anything: exact exit codes and messages.

use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_little-compute"));
    cmd.args(args)
        .env_remove("LC_DATABASE_URL")
        .env_remove("LC_GATEWAY_CRASH_AT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_worker_refuses_bad_arguments_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "short\n").unwrap();
    let s = secret.to_str().unwrap();
    let db = [("LC_DATABASE_URL", "postgres://u:p@127.0.0.1:1/db")];
    let base = [
        "worker",
        "--provider-url",
        "http://127.0.0.1:1",
        "--secret-file",
        s,
    ];

    let (code, out) = run(&["worker", "--secret-file", s], &db);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--provider-url"), "{out}");

    let (code, out) = run(&[&base[..], &["--interval-ms", "5"]].concat(), &db);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--interval-ms must be in 10..=60000, got 5"),
        "{out}"
    );

    let (code, out) = run(&base, &db);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--secret-file: at least 32 bytes, got 5"),
        "{out}"
    );

    let (code, out) = run(&[&base[..], &["--batch", "0"]].concat(), &db);
    assert_eq!(code, 2, "{out}");

    for (flag, value, message) in [
        (
            "--allocate-concurrency",
            "0",
            "--allocate-concurrency must be in 1..=64, got 0",
        ),
        (
            "--allocate-concurrency",
            "65",
            "--allocate-concurrency must be in 1..=64, got 65",
        ),
        (
            "--provider-call-timeout-ms",
            "9",
            "--provider-call-timeout-ms must be in 10..=600000, got 9",
        ),
        (
            "--provider-call-timeout-ms",
            "600001",
            "--provider-call-timeout-ms must be in 10..=600000, got 600001",
        ),
    ] {
        let (code, out) = run(&[&base[..], &[flag, value]].concat(), &db);
        assert_eq!(code, 2, "{out}");
        assert_eq!(out, format!("little-compute worker: {message}\n"));
    }

    let (code, out) = run(&[&base[..], &["--purge-batch", "0"]].concat(), &db);
    assert_eq!(code, 2, "{out}");
    assert_eq!(
        out,
        "little-compute worker: --purge-batch must be in 1..=1000, got 0\n"
    );
    for retention in ["0", "315360001"] {
        let (code, out) = run(&[&base[..], &["--retention-s", retention]].concat(), &db);
        assert_eq!(code, 2, "{out}");
        assert!(
            out.starts_with(
                "little-compute worker: --retention-s: invalid timeout: the retention "
            ) && out.contains(" must be positive and at most "),
            "{out}"
        );
    }

    let (code, out) = run(&base, &[]);
    assert_eq!(code, 2, "no database URL: {out}");
}

#[test]
fn the_gateway_refuses_bad_arguments_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "short\n").unwrap();
    let s = secret.to_str().unwrap();
    let blobs = dir.path().join("blobs");
    let b = blobs.to_str().unwrap();
    let db = [("LC_DATABASE_URL", "postgres://u:p@127.0.0.1:1/db")];
    let base = ["gateway", "--secret-file", s, "--blob-dir", b];

    let (code, out) = run(&["gateway", "--secret-file", s], &db);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--blob-dir"), "{out}");

    let with_crash = [db[0], ("LC_GATEWAY_CRASH_AT", "after_lunch")];
    let (code, out) = run(&base, &with_crash);
    assert_eq!(code, 2, "{out}");
    assert_eq!(
        out,
        "little-compute gateway: LC_GATEWAY_CRASH_AT=\"after_lunch\" names no crash point; use after_metadata, after_sink, after_ack_result, before_supervisor_ack, after_send, after_stop, after_stopped_ack, after_quiesce, after_prepare_resume or before_commit_resume, or unset it\n"
    );

    let (code, out) = run(&[&base[..], &["--heartbeat-ttl-ms", "999"]].concat(), &db);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--heartbeat-ttl-ms must be in 1000..=600000, got 999"),
        "{out}"
    );

    let (code, out) = run(&[&base[..], &["--interval-ms", "1001"]].concat(), &db);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--interval-ms must be in 10..=1000, got 1001"),
        "{out}"
    );

    let (code, out) = run(
        &[&base[..], &["--metrics-listen", "0.0.0.0:9100"]].concat(),
        &db,
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--metrics-listen must be a loopback address, got 0.0.0.0:9100"),
        "{out}"
    );

    let (code, out) = run(&base, &db);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--secret-file: at least 32 bytes, got 5"),
        "{out}"
    );
    // Nothing was created before the refusals.
    assert!(!blobs.exists());
}

#[test]
fn the_appliance_listens_on_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("lc");
    let (code, out) = run(
        &[
            "appliance",
            "up",
            "--data-dir",
            d.to_str().unwrap(),
            "--listen",
            "0.0.0.0:7480",
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("--listen 0.0.0.0:7480: the appliance listens on loopback only"),
        "{out}"
    );
    assert!(!d.exists(), "nothing was created");
}

#[test]
fn status_and_down_of_a_directory_without_an_appliance() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, out) = run(&["appliance", "status", "--data-dir", d, "--json"], &[]);
    assert_eq!((code, out.trim()), (3, r#"{"up":false}"#));
    let (code, out) = run(&["appliance", "down", "--data-dir", d], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no appliance is up"), "{out}");
    // lc on that directory says the same, and what to do.
    let (code, out) = lc(&["--data-dir", d, "tenant", "show", "1"]);
    assert_eq!(
        (code, out),
        (
            1,
            format!(
                "error: no appliance is up on {d} (it has no appliance.json): start it with `little-compute appliance up --data-dir {d}`, or name a server with --server and --token\n"
            )
        )
    );
}

#[test]
fn a_data_directory_too_long_for_the_sockets_is_refused_before_anything() {
    // /instances/<i64::MAX>-<i64::MAX>/run/supervisor.sock is 70 bytes, a
    // socket path at most 107: DIR/provider at most 37, DIR at most 28.
    let d = format!("/tmp/{}", "x".repeat(24));
    assert_eq!(d.len(), 29);
    // Any free port: the refusal must not depend on 7480 being free.
    let (code, out) = run(
        &[
            "appliance",
            "up",
            "--data-dir",
            &d,
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "the data directory {d} is 1 bytes too long: the sandboxes' sockets live below it and a unix socket path has at most 107 bytes; choose one of at most 28 bytes"
        )),
        "{out}"
    );
    assert!(!std::path::Path::new(&d).exists(), "nothing was created");
}

/// Runs `lc` (no server is contacted when clap refuses the arguments).
fn lc(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lc"))
        .args(args)
        .env_remove("LC_SERVER")
        .env_remove("LC_TOKEN")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn an_absurd_wait_timeout_is_a_usage_error_not_a_panic() {
    let huge = "18446744073709551615";
    for args in [
        vec!["exec", "output", "1", "--follow", "--wait-timeout-s", huge],
        vec!["exec", "send", "1", "--data", "x", "--wait-timeout-s", huge],
        vec![
            "exec",
            "create",
            "--wait",
            "--wait-timeout-s",
            huge,
            "--",
            "true",
        ],
    ] {
        let mut all = vec!["--server", "http://127.0.0.1:1"];
        all.extend(args);
        let (code, out) = lc(&all);
        assert_eq!(code, 2, "{all:?}: {out}");
        assert!(
            out.starts_with(&format!(
                "error: invalid value '{huge}' for '--wait-timeout-s <WAIT_TIMEOUT_S>': {huge} is not in 0..=31536000\n"
            )),
            "{all:?}: {out}"
        );
    }
    // The largest accepted value is taken (and refused only by the
    // unreachable server).
    let (code, out) = lc(&[
        "--server",
        "http://127.0.0.1:1",
        "exec",
        "send",
        "1",
        "--data",
        "x",
        "--wait-timeout-s",
        "31536000",
    ]);
    assert_eq!(code, 1, "{out}");
}

#[test]
fn the_control_plane_s_duration_flags_are_bounded() {
    for (flag, value, range) in [
        (
            "--request-timeout-ms",
            "18446744073709551615",
            "1..=3600000",
        ),
        (
            "--shutdown-timeout-ms",
            "18446744073709551615",
            "0..=3600000",
        ),
        ("--safetime-gap-max-ms", "0", "1..=3600000"),
    ] {
        let (code, out) = run(
            &[
                "serve",
                "--database-url",
                "postgres://x@127.0.0.1:1/x",
                "--admin-token-file",
                "/nonexistent",
                "--secret-file",
                "/nonexistent",
                flag,
                value,
            ],
            &[],
        );
        assert_eq!(code, 2, "{flag}: {out}");
        let placeholder = flag
            .trim_start_matches("--")
            .replace('-', "_")
            .to_uppercase();
        assert!(
            out.starts_with(&format!(
                "error: invalid value '{value}' for '{flag} <{placeholder}>': {value} is not in {range}\n"
            )),
            "{flag}: {out}"
        );
    }
}

#[test]
fn an_unsearchable_ancestor_is_refused_before_anything_is_created() {
    // As root PostgreSQL runs as its own account, which must reach DIR/pg:
    // a temporary directory is mode 0700.
    assert!(
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")),
        "this test runs as root, where PostgreSQL needs its own account"
    );
    let dir = tempfile::tempdir().unwrap();
    let parent = dir.path();
    std::fs::set_permissions(parent, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let d = parent.join("lc");
    // A port another process holds: the directory, which no retry mends,
    // is refused first, before the port conflict (which may pass).
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = format!("127.0.0.1:{}", held.local_addr().unwrap().port());
    let (code, out) = run(
        &[
            "appliance",
            "up",
            "--data-dir",
            d.to_str().unwrap(),
            "--listen",
            &listen,
        ],
        &[],
    );
    drop(held);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "little-compute appliance: {} is not searchable by other users (mode 700), so PostgreSQL's account cannot reach {}/pg; choose a data directory under a searchable path or chmod o+x it\n",
            parent.display(),
            d.display()
        )),
        "{out}"
    );
    assert!(!d.exists(), "nothing was created");
}

#[test]
fn a_busy_control_plane_port_is_refused_before_anything_starts() {
    // Another process (here: this test) holds the port and answers
    // nothing; an appliance must not take any answer on it for its own.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let d = format!("/tmp/lc-busy-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&d);
    let listen = format!("127.0.0.1:{port}");
    let (code, out) = run(
        &["appliance", "up", "--data-dir", &d, "--listen", &listen],
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "little-compute appliance: the control plane's address 127.0.0.1:{port} is in use by another process; stop that process (another appliance: `little-compute appliance down --data-dir ITS_DIR`) or choose another port with --listen 127.0.0.1:PORT (0 picks a free one)\n"
        )),
        "{out}"
    );
    assert!(!out.contains("control plane is up"), "{out}");
    assert!(!std::path::Path::new(&d).exists(), "nothing was created");
    drop(held);
}
