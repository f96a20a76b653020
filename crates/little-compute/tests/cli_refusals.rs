//! Refusals of the worker and appliance commands before they touch
//! anything: exact exit codes and messages.

use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_little-compute"));
    cmd.args(args).env_remove("LC_DATABASE_URL");
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

    let (code, out) = run(&base, &[]);
    assert_eq!(code, 2, "no database URL: {out}");
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
}

#[test]
fn a_data_directory_too_long_for_the_sockets_is_refused_before_anything() {
    // /instances/<i64::MAX>-<i64::MAX>/run/supervisor.sock is 70 bytes, a
    // socket path at most 107: DIR/provider at most 37, DIR at most 28.
    let d = format!("/tmp/{}", "x".repeat(24));
    assert_eq!(d.len(), 29);
    let (code, out) = run(&["appliance", "up", "--data-dir", &d], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "the data directory {d} is 1 bytes too long: the sandboxes' sockets live below it and a unix socket path has at most 107 bytes; choose one of at most 28 bytes"
        )),
        "{out}"
    );
    assert!(!std::path::Path::new(&d).exists(), "nothing was created");
}
