//! What the CLI says when something is wrong, with the real binary: each
//! error names what to do, usage errors exit 2 and say which flag, and a
//! service that cannot start shows no token. Nothing here needs a
//! database but the unreachable one.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");
const ADMIN: &str = "tgadm1.guidance-admin-token-0123";

/// A `tollgate` command with a clean environment (no inherited
/// `DATABASE_URL` or `TOLLGATE_*`).
fn tollgate() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("TOLLGATE_") || k == "DATABASE_URL" {
            c.env_remove(k);
        }
    }
    c
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn run(args: &[&str]) -> Output {
    tollgate().args(args).output().expect("run tollgate")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A stopped service: exit 1, naming the URL tried and `--server`
/// (`TOLLGATE_SERVER`), not reqwest's "error sending request".
#[test]
fn an_unreachable_server_is_named_with_what_to_do() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    for args in [
        vec!["account", "show", "1"],
        vec!["status"],
        vec!["reclaim", "--once"],
    ] {
        let mut all = args.clone();
        all.extend(["--server", url.as_str(), "--token", ADMIN]);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(1), "{all:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "error: the server is unreachable at {url}/ (Connection refused (os error \
                 111)); start it (tollgate serve) or point --server (or TOLLGATE_SERVER) at \
                 the running service\n"
            ),
            "{all:?}"
        );
        assert_eq!(out.stdout, b"", "{all:?}");
    }
}

/// `--server` without `http://` is a usage error (exit 2) saying what to
/// give, before anything is sent.
#[test]
fn a_server_without_a_scheme_is_a_usage_error() {
    let out = run(&["status", "--server", "localhost:8080"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: --server \"localhost:8080\" must start with http:// (read as scheme \
         \"localhost\"): give the service's base URL, e.g. http://127.0.0.1:8080 (--server or \
         TOLLGATE_SERVER)\n"
    );
    let out = tollgate()
        .args(["lease", "show", "1"])
        .env("TOLLGATE_SERVER", "127.0.0.1:8080")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Durations and instants are checked by the CLI and refused in the
/// flag's terms (exit 2), without the parser's internals and before any
/// request (the server here does not exist).
#[test]
fn durations_and_instants_are_refused_in_the_flags_terms() {
    let server = format!("http://127.0.0.1:{}", closed_port());
    for (args, message) in [
        (
            vec![
                "lease",
                "acquire",
                "1",
                "--units",
                "1",
                "--ttl",
                "10 parsecs",
            ],
            "error: --ttl: \"10 parsecs\" is not an ISO 8601 or friendly duration: write e.g. \
             PT30S, PT0.000000001S, 30s, 1h 30m or 250ms\n",
        ),
        (
            vec!["lease", "renew", "1", "--ttl", "-5s"],
            "error: --ttl must be positive, got -PT5S\n",
        ),
        (
            vec!["lease", "renew", "1", "--ttl", "PT0S"],
            "error: --ttl must be positive, got PT0S\n",
        ),
        (
            vec!["clock", "set", "tomorrow"],
            "error: clock set: \"tomorrow\" is not an RFC 3339 instant: write e.g. \
             2026-11-29T12:00:00Z or 2026-11-29T12:00:00.000000001+00:00\n",
        ),
        (
            vec!["clock", "set", "9999-12-31T23:59:59.999999999Z"],
            "error: clock set: \"9999-12-31T23:59:59.999999999Z\" is outside the supported \
             range of instants, -009999-01-02T01:59:59Z to 9999-12-30T22:00:00.999999999Z\n",
        ),
        (
            vec!["reclaim", "--loop", "--interval", "often"],
            "error: --interval: \"often\" is not an ISO 8601 or friendly duration: write e.g. \
             PT30S, PT0.000000001S, 30s, 1h 30m or 250ms\n",
        ),
    ] {
        let mut all = args.clone();
        all.extend(["--server", server.as_str(), "--token", ADMIN]);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), message, "{all:?}");
        assert!(!stderr(&out).contains("jiff"), "{all:?}");
    }
}

/// What the service would refuse is refused by the CLI first (exit 2,
/// nothing sent; the server here does not exist): a credential that cannot
/// be a bearer token (not repeated in the message), an id that is not in
/// canonical decimal (the service's own rule for path ids), and an account
/// name outside the core's bound.
#[test]
fn malformed_credentials_ids_and_names_are_usage_errors() {
    let server = format!("http://127.0.0.1:{}", closed_port());
    let id = |raw: &str, arg: &str| {
        format!(
            "error: invalid value '{raw}' for '{arg}': \"{raw}\" is not a positive integer in \
             canonical decimal (1..=9223372036854775807, no sign or leading zero)\n\n\
             For more information, try '--help'.\n"
        )
    };
    let long_name = "n".repeat(100_000);
    for (args, message) in [
        (
            vec![
                "lease",
                "renew",
                "1",
                "--ttl",
                "1s",
                "--capability",
                "tgc1.\u{fc}",
            ],
            "error: --token (or TOLLGATE_TOKEN; aliases --api-key and --capability) has a \
             character that is not printable ASCII (character 6 of 6): admin tokens, API keys \
             and capabilities are printable ASCII without spaces; copy it again from the answer \
             that issued it\n"
                .to_string(),
        ),
        (
            vec!["account", "show", "1", "--api-key", "tga1 x"],
            "error: --token (or TOLLGATE_TOKEN; aliases --api-key and --capability) has a \
             character that is not printable ASCII (character 5 of 6): admin tokens, API keys \
             and capabilities are printable ASCII without spaces; copy it again from the answer \
             that issued it\n"
                .to_string(),
        ),
        (
            vec!["account", "show", "01", "--token", ADMIN],
            id("01", "<ACCOUNT_ID>"),
        ),
        (
            vec!["lease", "show", "+1", "--token", ADMIN],
            id("+1", "<LEASE_ID>"),
        ),
        (
            vec!["account", "deposit", "0", "--units", "1", "--token", ADMIN],
            id("0", "<ACCOUNT_ID>"),
        ),
        (
            vec![
                "account",
                "create",
                "--name",
                long_name.as_str(),
                "--token",
                ADMIN,
            ],
            "error: --name: account name must be 1..=200 characters without control \
             characters\n"
                .to_string(),
        ),
        (
            vec!["account", "create", "--name", "a\u{7}b", "--token", ADMIN],
            "error: --name: account name must be 1..=200 characters without control \
             characters\n"
                .to_string(),
        ),
    ] {
        let mut all = args.clone();
        all.extend(["--server", server.as_str()]);
        let out = run(&all);
        let shown: Vec<String> = all.iter().map(|a| a.chars().take(40).collect()).collect();
        assert_eq!(out.status.code(), Some(2), "{shown:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), message, "{shown:?}");
        assert_eq!(out.stdout, b"", "{shown:?}");
    }
}

/// A memory-store service on a free port, with `args`; returns the child,
/// its URL and the lines it printed before the listening line.
fn serve(args: &[&str]) -> (std::process::Child, String, Vec<String>) {
    let mut child = tollgate()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                if let Some(url) = line.strip_prefix("tollgate listening on ") {
                    return (child, url.to_string(), lines);
                }
                lines.push(line);
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("serve did not start: {lines:?}");
            }
        }
    }
}

/// A missing credential (401) or one that may not do this (403
/// `forbidden`, which an admin route answers for any other bearer): the
/// problem, then which flag and variable carry the credential.
#[test]
fn a_missing_or_wrong_token_names_the_flags() {
    let (mut child, url, _) = serve(&["--admin-token", ADMIN]);
    let hint = "give the credential with --token (or TOLLGATE_TOKEN; aliases --api-key and \
                --capability): the admin token for account creation, deposits and admin \
                commands, the account's API key for its leases, the lease capability for renew, \
                release and show";
    let missing = run(&["account", "create", "--name", "a", "--server", &url]);
    let wrong = run(&["audit", "--server", &url, "--token", "not-a-token"]);
    let wrong_kind = run(&[
        "audit",
        "--server",
        &url,
        "--token",
        "tgadm1.not-the-admin-token-000",
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        stderr(&missing),
        format!("error: 401 unauthenticated: a bearer credential is required; {hint}\n")
    );
    assert_eq!(wrong_kind.status.code(), Some(1));
    assert_eq!(
        stderr(&wrong_kind),
        format!("error: 403 forbidden: this credential may not perform this operation; {hint}\n")
    );
    assert_eq!(wrong.status.code(), Some(1));
    assert_eq!(stderr(&wrong), stderr(&wrong_kind));
}

/// A busy port fails the start at once (exit 1, naming the address and
/// `--listen`) and shows no generated admin token: the token is printed
/// only once the service listens.
#[test]
fn a_busy_port_prints_no_token() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = holder.local_addr().expect("addr").to_string();
    let out = run(&["serve", "--listen", &addr]);
    drop(holder);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        out.stdout, b"",
        "a token was shown for a service that never started"
    );
    assert_eq!(
        stderr(&out),
        format!(
            "error: cannot listen on {addr}: Address already in use (os error 98); stop what \
             holds the port or give another --listen (or TOLLGATE_LISTEN)\n"
        )
    );
    // Started for real, the generated token comes before the listening
    // line.
    let (mut child, _url, before) = serve(&[]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(
        before[0].starts_with("admin token (generated, shown only now): tgadm1."),
        "{before:?}"
    );
}

/// A database that does not answer: `migrate` gives up after
/// `--connect-timeout`, logging the wait once (not once per attempt), and
/// says how long it waited.
#[test]
fn migrate_gives_up_after_the_connect_timeout_logging_once() {
    let url = format!("postgres://tollgate@127.0.0.1:{}/tollgate", closed_port());
    let out = run(&["migrate", "--database-url", &url, "--connect-timeout", "2s"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains(
            "database unavailable; retrying until it answers or --connect-timeout passes"
        ),
        "{err}"
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: applying migrations: storage unavailable: ")
            && last.ends_with("; --connect-timeout is PT2S)"),
        "{err}"
    );
    // The bound is checked like every duration setting.
    let out = run(&["migrate", "--database-url", &url, "--connect-timeout", "2h"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: invalid configuration: connect_timeout must be at most PT1H, got PT2H\n"
    );
}

/// A database URL of another scheme is refused before connecting (exit 2)
/// by every command that takes one, without repeating the URL.
#[test]
fn a_database_url_of_another_scheme_is_a_usage_error() {
    for args in [
        vec!["serve"],
        vec!["migrate"],
        vec!["status"],
        vec!["audit"],
        vec!["policy", "show"],
    ] {
        let mut all = args.clone();
        all.extend(["--database-url", "mysql://u:hunter2@127.0.0.1:1/db"]);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            "error: invalid configuration: database_url must be postgres:// or postgresql://, \
             got mysql://\n",
            "{all:?}"
        );
    }
}

/// `--help` says what `--database-url` means for each command, and
/// `migrate --help` lists only what migrating uses.
#[test]
fn help_says_what_the_database_url_means_per_command() {
    let help = |args: &[&str]| {
        let out = run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for cmd in ["status", "audit", "reclaim"] {
        let h = help(&[cmd, "--help"]);
        assert!(
            h.contains("run against the database directly; absent: ask the service at --server"),
            "{cmd}: {h}"
        );
        assert!(!h.contains("memory store"), "{cmd}: {h}");
    }
    assert!(help(&["serve", "--help"]).contains("absent: the in-memory store"));
    let migrate = help(&["migrate", "--help"]);
    assert!(
        migrate.contains("PostgreSQL URL (also DATABASE_URL); required"),
        "{migrate}"
    );
    for serve_only in [
        "--max-ttl",
        "--reclaim-grace",
        "--secret-file",
        "--clock",
        "--listen",
        "--admin-token",
    ] {
        assert!(!migrate.contains(serve_only), "{serve_only}: {migrate}");
    }
    assert!(migrate.contains("--connect-timeout"), "{migrate}");
}

/// Results are one line of JSON when standard output is not a terminal
/// (here a pipe), for every command alike.
#[test]
fn json_results_are_one_line_off_a_terminal() {
    let (mut child, url, _) = serve(&["--admin-token", ADMIN]);
    let created = run(&[
        "account", "create", "--name", "a", "--server", &url, "--token", ADMIN,
    ]);
    let status = run(&["status", "--server", &url, "--token", ADMIN]);
    let reclaim = run(&["reclaim", "--once", "--server", &url, "--token", ADMIN]);
    let _ = child.kill();
    let _ = child.wait();
    for out in [created, status, reclaim] {
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(text.lines().count(), 1, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).expect("one JSON document");
    }
}
