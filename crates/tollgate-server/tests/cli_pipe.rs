//! The CLI's output to a closed pipe (`tollgate ... | head -1`) ends quietly:
//! exit status as usual, no panic (`println!` would panic with "failed
//! printing to stdout" as soon as `head -3` has its lines).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

#[test]
fn output_to_a_closed_pipe_does_not_panic() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    // Close the reading end first: every write the CLI makes gets EPIPE.
    drop(reader);
    let out = Command::new(BIN)
        .args([
            "serve",
            "--print-config",
            "--admin-token",
            "tgadm1.pipe-test-token-0123",
        ])
        .env_remove("DATABASE_URL")
        .env_remove("TOLLGATE_DATABASE_URL")
        .stdout(writer)
        .output()
        .expect("run tollgate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}

/// `tollgate serve | head -1`: the reader goes away after the first line.
/// The server keeps serving (the "listening" line is also in the log) and
/// stops cleanly on SIGTERM, without a panic.
#[test]
fn serve_with_a_closed_stdout_keeps_serving() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-token",
            "tgadm1.pipe-test-token-0123",
        ])
        .env_remove("DATABASE_URL")
        .env_remove("TOLLGATE_DATABASE_URL")
        .env("TOLLGATE_LOG_LEVEL", "info")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run tollgate serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !seen.contains("tollgate listening") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => {
                let _ = child.kill();
                panic!("no 'tollgate listening' log line within 30 s:\n{seen}");
            }
        }
    }
    // Still running after the failed stdout write.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(child.try_wait().expect("try_wait"), None, "{seen}");
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok);
    let status = child.wait().expect("wait");
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(5)) {
        seen.push_str(&line);
        seen.push('\n');
    }
    assert_eq!(status.code(), Some(0), "{seen}");
    assert!(!seen.contains("panicked"), "{seen}");
    // Standard error is a pipe, not a terminal: no colour codes.
    assert!(!seen.contains('\u{1b}'), "{seen:?}");
}

/// With no configured admin token the memory store generates one and
/// prints it once on stdout. When stdout cannot take it, the start is
/// refused (exit 2, configuration) rather than running with a token nobody
/// has seen.
#[test]
fn generated_admin_token_needs_a_stdout() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("DATABASE_URL")
        .env_remove("TOLLGATE_DATABASE_URL")
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .stdout(writer)
        .output()
        .expect("run tollgate serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains("cannot show the generated admin token on standard output"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}

/// Runs `tollgate <args>` through `sh` with standard output redirected by
/// `redirect` (`>&-` closes it, `>/dev/full` fills it).
fn with_stdout(redirect: &str, args: &[&str]) -> std::process::Output {
    let mut script = String::from("exec \"$0\"");
    for i in 1..=args.len() {
        script.push_str(&format!(" \"${i}\""));
    }
    script.push(' ');
    script.push_str(redirect);
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(BIN)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("TOLLGATE_DATABASE_URL")
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .output()
        .expect("run tollgate through sh")
}

/// Output that cannot be written (a full disk) is an error: exit 1 with the
/// reason, never 0 with the result lost.
#[test]
fn lost_output_exits_1() {
    let out = with_stdout(
        ">/dev/full",
        &[
            "serve",
            "--print-config",
            "--admin-token",
            "tgadm1.pipe-test-token-0123",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: cannot write the output: No space left on device"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A generated admin token whose standard output is closed at start (the
/// runtime reopens it on `/dev/null`) or is `/dev/null`: refused (exit 2),
/// not a service running with a token nobody has seen.
#[test]
fn generated_admin_token_into_nothing_is_refused() {
    for redirect in [">&-", ">/dev/null"] {
        let out = with_stdout(redirect, &["serve", "--listen", "127.0.0.1:0"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{redirect}: {stderr}");
        assert!(
            stderr.contains(
                "cannot show the generated admin token on standard output \
                 (it goes to /dev/null or was closed)"
            ),
            "{redirect}: {stderr}"
        );
    }
}

/// A `TOLLGATE_LOG_LEVEL` (or `--log-level`) that is neither a level nor
/// `target=level` directives (a bare word would silence every log) is
/// reported and replaced by the default level; valid values pass without a
/// word. The former name `TOLLGATE_LOG` still works, with a deprecation
/// warning naming the new one.
#[test]
fn unusable_log_filter_is_reported() {
    let run = |var: &str, value: &str| {
        Command::new(BIN)
            .args([
                "serve",
                "--print-config",
                "--admin-token",
                "tgadm1.pipe-test-token-0123",
            ])
            .env_remove("DATABASE_URL")
            .env_remove("TOLLGATE_DATABASE_URL")
            .env_remove("TOLLGATE_LOG")
            .env_remove("TOLLGATE_LOG_LEVEL")
            .env(var, value)
            .output()
            .expect("run tollgate")
    };
    let out = run("TOLLGATE_LOG_LEVEL", "garbage");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "warning: --log-level (or TOLLGATE_LOG_LEVEL) \"garbage\" is neither a level (error, \
         warn, info, debug, trace, off) nor target=level directives; logging at info\n"
    );
    for ok in [
        "debug",
        "WARN",
        "info,tollgate_pg=debug",
        "tower_http=trace",
    ] {
        let out = run("TOLLGATE_LOG_LEVEL", ok);
        assert_eq!(out.status.code(), Some(0), "{ok}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{ok}");
    }
    let out = run("TOLLGATE_LOG", "debug");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "warning: TOLLGATE_LOG is deprecated; set TOLLGATE_LOG_LEVEL (or --log-level) instead, \
         the name both tollgate and tollgate-safetime read\n"
    );
}

/// An operator command given both a server and a database refuses (exit 2)
/// instead of silently going to one of them; `--help` never shows the
/// database URL from the environment (it may hold a password).
#[test]
fn two_targets_are_refused_and_help_hides_the_database_url() {
    let out = Command::new(BIN)
        .args([
            "status",
            "--server",
            "http://127.0.0.1:1",
            "--database-url",
            "postgres://u:secretpw@127.0.0.1:1/db",
        ])
        .env_remove("DATABASE_URL")
        .env_remove("TOLLGATE_DATABASE_URL")
        .env_remove("TOLLGATE_SERVER")
        .output()
        .expect("run tollgate");
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ),
        (
            Some(2),
            "error: invalid configuration: both a server (--server or TOLLGATE_SERVER) and a \
             database (--database-url, TOLLGATE_DATABASE_URL, DATABASE_URL or the config file) \
             are given; give one"
        )
    );
    for sub in [&["serve"][..], &["status"], &["policy", "show"]] {
        let out = Command::new(BIN)
            .args(sub)
            .arg("--help")
            .env("TOLLGATE_DATABASE_URL", "postgres://u:secretpw@h/db")
            .output()
            .expect("run tollgate --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{sub:?}");
        assert!(text.contains("TOLLGATE_DATABASE_URL"), "{sub:?}: {text}");
        assert!(!text.contains("secretpw"), "{sub:?}: {text}");
    }
}

/// A standard error that cannot be written (here a full disk) loses the
/// message, not the exit status: exit 2 for the bad flag, no panic (101).
#[test]
fn unwritable_stderr_keeps_the_exit_status() {
    let out = Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" serve --print-config --max-ttl bogus 2>/dev/full")
        .arg(BIN)
        .env_remove("DATABASE_URL")
        .env_remove("TOLLGATE_DATABASE_URL")
        .output()
        .expect("run tollgate through sh");
    assert_eq!(out.status.code(), Some(2));
}
