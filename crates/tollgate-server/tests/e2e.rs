//! End to end: the real `tollgate` binary serving on a loopback port, driven
//! by its own CLI client subcommands, with the memory store and with
//! PostgreSQL (shared harness cluster): create an account, deposit, acquire
//! with a fractional TTL, renew, release, let a lease expire on the test
//! clock, reclaim, audit clean, shut down on SIGTERM. The PostgreSQL run
//! also migrates with the CLI, kills the server with SIGKILL mid-way and
//! shows that grants and capabilities survive the restart, also with four
//! clients acquiring, renewing and releasing at the moment of the kill.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");
const ADMIN: &str = "tgadm1.e2e-admin-token-0123456789";

/// How long a server may take to start (PostgreSQL mode migrates first).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A `tollgate` command with a clean environment (no inherited
/// `DATABASE_URL` or `TOLLGATE_*`).
fn tollgate() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("TOLLGATE_") || k == "DATABASE_URL" {
            c.env_remove(k);
        }
    }
    c.env("TOLLGATE_LOG_LEVEL", "warn");
    c
}

/// A running server; killed on drop.
struct Server {
    child: Child,
    url: String,
    stderr_path: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(args: &[&str], dir: &Path) -> Server {
        let stderr_path = dir.join(format!(
            "server-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let stderr = std::fs::File::create(&stderr_path).expect("log file");
        let mut child = tollgate()
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin-token", ADMIN])
            .args(args)
            .env("TOLLGATE_LOG_LEVEL", "info")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn tollgate serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("tollgate listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = match rx.recv_timeout(START_TIMEOUT) {
            Ok(url) => url,
            Err(_) => panic!(
                "server did not start: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            ),
        };
        Server {
            child,
            url,
            stderr_path,
        }
    }

    /// Runs a CLI client subcommand against this server.
    fn cli(&self, args: &[&str], token: &str) -> Output {
        tollgate()
            .args(args)
            .args(["--server", &self.url, "--token", token])
            .output()
            .expect("run tollgate")
    }

    /// Runs a client subcommand that must succeed; returns its JSON.
    #[track_caller]
    fn ok(&self, args: &[&str], token: &str) -> Value {
        let out = self.cli(args, token);
        assert!(
            out.status.success(),
            "tollgate {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "tollgate {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// SIGTERM, then waits for a clean exit.
    fn stop(mut self) {
        self.signal("-TERM");
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "exit status {status}");
                break;
            }
            assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        assert!(log.contains("tollgate stopped"), "{log}");
        assert!(!log.contains(ADMIN), "the admin token was logged");
    }

    /// SIGKILL: no chance to clean up.
    fn crash(mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
    }
}

fn s(v: &Value, k: &str) -> String {
    match &v[k] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tollgate-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The walk-through both stores share, up to (not including) shutdown.
/// Returns `(account_id, api_key, released lease, its capability)`.
fn walk_through(srv: &Server) -> (String, String, String, String) {
    let clock = srv.ok(&["clock", "set", "2026-11-29T12:00:00.5+00:00"], ADMIN);
    assert_eq!(
        clock,
        json!({"now": "2026-11-29T12:00:00.5Z", "now_ns": "1795953600500000000", "clock": "test"})
    );
    let created = srv.ok(&["account", "create", "--name", "team blue"], ADMIN);
    let account = s(&created, "account_id");
    let key = s(&created, "api_key");
    assert!(key.starts_with("tga1."));
    let dep = srv.ok(&["account", "deposit", &account, "--units", "100"], ADMIN);
    assert_eq!(dep["available"], json!(100));

    // Acquire with a fractional TTL: exact expiry.
    let g = srv.ok(
        &[
            "lease",
            "acquire",
            &account,
            "--units",
            "10",
            "--ttl",
            "PT30.000000001S",
        ],
        &key,
    );
    assert_eq!(g["expiry"], json!("2026-11-29T12:00:30.500000001Z"));
    assert_eq!(g["granted_ttl"], json!("PT30.000000001S"));
    let lease = s(&g, "lease_id");
    let cap = s(&g, "capability");

    // Renew, then release with a usage report.
    srv.ok(&["clock", "set", "2026-11-29T12:00:10Z"], ADMIN);
    let r = srv.ok(&["lease", "renew", &lease, "--ttl", "45s"], &cap);
    assert_eq!(r["expiry"], json!("2026-11-29T12:00:55Z"));
    assert_eq!(r["granted_ttl"], json!("PT45S"));
    assert!(r["fence"].as_i64() > g["fence"].as_i64());
    let rel = srv.ok(&["lease", "release", &lease, "--consumed", "4"], &cap);
    assert_eq!(
        rel["balances"],
        json!({"deposited": 100, "available": 96, "held": 0, "consumed": 4})
    );

    // Another key cannot read the lease.
    let denied = srv.cli(&["lease", "show", &lease], &key);
    assert_eq!(denied.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("403 capability_mismatch"),
        "{}",
        String::from_utf8_lossy(&denied.stderr)
    );
    (account, key, lease, cap)
}

/// A lease that expires: acquired at 12:00:10 for 1 s (grace 5 s), so its
/// holder may act until 12:00:15.999999999 and reclaim settles it at
/// 12:00:16.
fn expire_and_reclaim(srv: &Server, account: &str, key: &str) {
    let g = srv.ok(
        &[
            "lease", "acquire", account, "--units", "20", "--ttl", "PT1S",
        ],
        key,
    );
    let lease = s(&g, "lease_id");
    let cap = s(&g, "capability");
    assert_eq!(g["expiry"], json!("2026-11-29T12:00:11Z"));
    srv.ok(&["clock", "set", "2026-11-29T12:00:15.999999999Z"], ADMIN);
    let none = srv.ok(&["reclaim", "--once"], ADMIN);
    assert_eq!(none["reclaimed"], json!([]));
    srv.ok(&["clock", "set", "2026-11-29T12:00:16Z"], ADMIN);
    let refused = srv.cli(&["lease", "release", &lease], &cap);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("409 lease_reclaimable"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let r = srv.ok(&["reclaim", "--once"], ADMIN);
    assert_eq!(
        r,
        json!({"reclaimed": [g["lease_id"]], "cutoff": "2026-11-29T12:00:11Z",
               "cutoff_ns": "1795953611000000000", "units_charged": 20,
               "now": "2026-11-29T12:00:16Z", "now_ns": "1795953616000000000"})
    );
    let shown = srv.ok(&["lease", "show", &lease], &cap);
    assert_eq!(shown["state"], json!("reclaimed"));
    let acct = srv.ok(&["account", "show", account], key);
    assert_eq!(
        acct,
        json!({"account_id": account.parse::<i64>().expect("id"),
               "name": "team blue", "deposited": 100, "available": 76, "held": 0, "consumed": 24})
    );
    let audit = srv.ok(&["audit"], ADMIN);
    assert_eq!(audit["clean"], json!(true));
    assert_eq!(audit["violations"], json!([]));
    let status = srv.ok(&["status"], ADMIN);
    assert_eq!(status["active_leases"], json!(0));
    assert_eq!(status["readiness"]["ready"], json!(true));
}

#[test]
fn memory_walk_through() {
    let dir = temp_dir("memory");
    let srv = Server::start(
        &[
            "--clock",
            "test",
            "--max-ttl",
            "PT1M",
            "--reclaim-grace",
            "PT5S",
            "--reclaim-interval",
            "PT1H",
        ],
        &dir,
    );
    let (account, key, _, _) = walk_through(&srv);
    expire_and_reclaim(&srv, &account, &key);
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The worker inside `serve` reclaims on its own once the clock passes the
/// boundary (bounded polling: the worker runs every 10 ms).
#[test]
fn memory_worker_reclaims_inside_serve() {
    let dir = temp_dir("worker");
    let srv = Server::start(
        &[
            "--clock",
            "test",
            "--reclaim-grace",
            "PT0S",
            "--reclaim-interval",
            "PT0.01S",
        ],
        &dir,
    );
    srv.ok(&["clock", "set", "2026-11-29T12:00:00Z"], ADMIN);
    let created = srv.ok(&["account", "create", "--name", "w"], ADMIN);
    let account = s(&created, "account_id");
    let key = s(&created, "api_key");
    srv.ok(&["account", "deposit", &account, "--units", "5"], ADMIN);
    let g = srv.ok(
        &[
            "lease", "acquire", &account, "--units", "5", "--ttl", "PT1S",
        ],
        &key,
    );
    srv.ok(&["clock", "set", "2026-11-29T12:00:01Z"], ADMIN);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = srv.ok(&["lease", "show", &s(&g, "lease_id")], &s(&g, "capability"));
        if shown["state"] == json!("reclaimed") {
            break;
        }
        assert!(Instant::now() < deadline, "worker did not reclaim: {shown}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let metrics = reqwest_blocking_get(&format!("{}/metrics", srv.url));
    assert!(
        metrics.contains("tollgate_reclaim_leases_total 1\n"),
        "{metrics}"
    );
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM right after the "listening" line (as a supervisor may send it)
/// is a graceful stop, not death by the default action: the handlers are
/// installed before the line is printed.
#[test]
fn sigterm_right_after_start_is_graceful() {
    let dir = temp_dir("early-term");
    for _ in 0..5 {
        Server::start(&["--no-reclaim-worker"], &dir).stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tollgate serve` on a loopback port with `args`, under the shell's
/// `ulimit` arguments `limit` (`-n 300`: soft and hard; `-Sn 300`: soft
/// only): its exit status and stderr when it stops on its own within
/// [`START_TIMEOUT`], or `None` and the stderr so far once it printed its
/// listening line (it is then stopped with SIGTERM and must exit 0).
fn serve_under_ulimit(limit: &str, args: &[&str]) -> (Option<i32>, String) {
    let dir = temp_dir("ulimit");
    let log = dir.join(format!("serve-{}.log", limit.replace(' ', "")));
    let mut sh = Command::new("sh");
    for (k, _) in std::env::vars() {
        if k.starts_with("TOLLGATE_") || k == "DATABASE_URL" {
            sh.env_remove(k);
        }
    }
    let mut child = sh
        .arg("-c")
        .arg(format!("ulimit {limit} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-token", ADMIN])
        .args(args)
        .env("TOLLGATE_LOG_LEVEL", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn sh");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("tollgate listening on ") {
                let _ = tx.send(());
            }
        }
    });
    let listening = rx.recv_timeout(START_TIMEOUT).is_ok();
    let status = if listening {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let status = child.wait().expect("wait");
        assert!(status.success(), "exit status {status}");
        None
    } else {
        let status = child.wait().expect("wait");
        Some(status.code().expect("exit code"))
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    (status, stderr)
}

/// The connection bound must fit under the open-file limit: a hard limit
/// too low for the default bound stops the start (exit 2) naming the
/// largest bound that fits, with which it starts; a soft limit too low is
/// raised (up to the hard limit) and logged.
#[test]
fn connection_bound_must_fit_the_open_file_limit() {
    let (status, err) = serve_under_ulimit("-n 300", &[]);
    assert_eq!(status, Some(2), "{err}");
    assert!(
        err.contains(
            "invalid configuration: connections_max 512 needs 608 open files (with 96 for the \
             service itself), but the hard limit on open files (RLIMIT_NOFILE) is 300: raise it \
             (ulimit -Hn, systemd LimitNOFILE=) or set connections_max to at most 204"
        ),
        "{err}"
    );
    let (status, err) = serve_under_ulimit("-n 300", &["--connections-max", "204"]);
    assert_eq!(status, None, "{err}");
    assert!(!err.contains("raised the soft limit"), "{err}");
    let (status, err) = serve_under_ulimit("-n 300", &["--connections-max", "205"]);
    assert_eq!(status, Some(2), "{err}");
    let (status, err) = serve_under_ulimit("-Sn 300", &[]);
    assert_eq!(status, None, "{err}");
    assert!(
        err.contains("raised the soft limit on open files to fit the connection bound"),
        "{err}"
    );
}

/// The served binary holds its connection bound and logs at it: with
/// `--connections-max 1` and that connection running a request, a new one
/// gets 503 `too_many_connections` and the refusal is logged (once, with
/// its count); a silent connection is closed after
/// `--header-read-timeout`, which is logged too.
#[test]
fn connection_bound_and_head_timeout_are_served_and_logged() {
    use std::io::{Read, Write};
    let dir = temp_dir("bound");
    let srv = Server::start(
        &[
            "--no-reclaim-worker",
            "--connections-max",
            "1",
            "--header-read-timeout",
            "500ms",
        ],
        &dir,
    );
    let host = srv
        .url
        .strip_prefix("http://")
        .expect("http url")
        .to_string();
    let connect = || {
        let s = std::net::TcpStream::connect(&host).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s
    };
    // Busy: its handler reads the body (100 Continue says so) and waits.
    let mut busy = connect();
    write!(
        busy,
        "POST /v1/accounts HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n"
    )
    .expect("write");
    let mut continued = [0u8; 25];
    busy.read_exact(&mut continued).expect("100 Continue");
    assert_eq!(&continued, b"HTTP/1.1 100 Continue\r\n\r\n");
    let mut refused = String::new();
    connect().read_to_string(&mut refused).expect("refusal");
    assert!(
        refused.starts_with("HTTP/1.1 503 Service Unavailable\r\n")
            && refused.contains("\r\nretry-after: 1\r\n")
            && refused.contains(r#""code":"too_many_connections""#),
        "{refused}"
    );
    busy.write_all(br#"{"name":1}"#).expect("body");
    let mut answer = [0u8; 12];
    busy.read_exact(&mut answer).expect("answer");
    assert_eq!(&answer, b"HTTP/1.1 422");
    drop(busy);
    // Let the server see that close, so the silent connection below takes
    // a free place rather than racing the end of the busy one's response.
    std::thread::sleep(Duration::from_millis(100));
    // Silent: closed after the header-read timeout.
    let started = Instant::now();
    let mut silent = connect();
    let mut rest = Vec::new();
    silent.read_to_end(&mut rest).expect("closed");
    assert!(rest.is_empty() && started.elapsed() < Duration::from_secs(5));
    let log_path = srv.stderr_path.clone();
    srv.stop();
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let line = |needle: &str| {
        log.lines()
            .filter(|l| l.contains(needle))
            .collect::<Vec<_>>()
    };
    let refusals = line("refused new connections");
    assert_eq!(refusals.len(), 1, "{log}");
    assert!(refusals[0].contains("refused=1"), "{log}");
    let timeouts = line("request head did not arrive in time");
    assert_eq!(timeouts.len(), 1, "{log}");
    assert!(timeouts[0].contains("closed=1"), "{log}");
    assert!(!log.contains("request failed"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET` with the CLI's own tooling unavailable: a tiny HTTP/1.0 client
/// over a socket to the loopback server.
fn reqwest_blocking_get(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http url");
    let (host, path) = rest.split_once('/').expect("path");
    let mut sock = std::net::TcpStream::connect(host).expect("connect");
    write!(sock, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").expect("write");
    let mut out = String::new();
    sock.read_to_string(&mut out).expect("read");
    out
}

#[test]
fn configuration_errors_exit_2() {
    // A configuration error is refused before the port is touched: with
    // the port held by someone else it is still the configuration error,
    // exit 2, not the busy port.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let held_addr = held.local_addr().expect("addr").to_string();
    for (args, message) in [
        (
            vec![
                "serve",
                "--listen",
                held_addr.as_str(),
                "--database-url",
                "postgres://u:pw@127.0.0.1:1/db",
                "--admin-token",
                ADMIN,
            ],
            "--secret-file",
        ),
        (
            vec!["serve", "--reclaim-grace", "-PT1S", "--print-config"],
            "reclaim_grace must be nonnegative",
        ),
        (
            vec!["serve", "--max-ttl", "PT0S", "--print-config"],
            "max_ttl must be positive",
        ),
        (
            vec!["serve", "--database-url", "mysql://x/y", "--print-config"],
            "database_url must be postgres://",
        ),
        (
            vec!["serve", "--database-url", "not a url", "--print-config"],
            "database_url is not a URL",
        ),
        (
            vec!["serve", "--reclaim-batch", "0", "--print-config"],
            "reclaim_batch",
        ),
        (
            vec!["serve", "--admin-token", "short", "--print-config"],
            "admin_token must be at least 16",
        ),
        (
            vec!["serve", "--listen", "localhost", "--print-config"],
            "listen",
        ),
        (
            vec!["serve", "--clock", "safe-cut", "--print-config"],
            "clock safe-cut reads the safe expiry cut from PostgreSQL",
        ),
        (
            vec![
                "serve",
                "--database-url",
                "postgres://h/db",
                "--clock",
                "safe-cut",
                "--safetime-gap-max",
                "PT0S",
                "--print-config",
            ],
            "safetime_gap_max must be positive",
        ),
        (
            vec![
                "serve",
                "--database-url",
                "postgres://u:pw@127.0.0.1:1/db",
                "--admin-token",
                ADMIN,
            ],
            "--secret-file",
        ),
        (
            vec!["serve", "--database-url", "postgres://u:pw@127.0.0.1:1/db"],
            "--admin-token",
        ),
        (vec!["migrate", "--dry-run"], "migrate needs --database-url"),
    ] {
        let out = tollgate().args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
        assert!(!err.contains("pw@"), "password printed: {err}");
    }
    drop(held);
}

#[test]
fn print_config_merges_flags_env_and_file() {
    let dir = temp_dir("config");
    let file = dir.join("tollgate.toml");
    std::fs::write(
        &file,
        "max_ttl = \"PT2M\"\nreclaim_grace = \"PT7S\"\nreclaim_batch = 50\nlisten = \"127.0.0.1:9000\"\nadmin_token = \"file-admin-token-123456\"\n",
    )
    .expect("write");
    let out = tollgate()
        .args(["serve", "--print-config", "--config"])
        .arg(&file)
        .args(["--reclaim-grace", "max"])
        .env("TOLLGATE_RECLAIM_BATCH", "75")
        .env("DATABASE_URL", "postgres://tg:hunter2@127.0.0.1:5432/tg")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "listen = \"127.0.0.1:9000\"\n\
         database_url = \"postgres://tg:***@127.0.0.1:5432/tg\"\n\
         connect_timeout = \"PT30S\"\n\
         max_ttl = \"PT2M\"\n\
         reclaim_grace = \"PT2562047788015215H30M7.999999999S\"\n\
         reclaim_interval = \"PT1S\"\n\
         reclaim_batch = 75\n\
         reclaim_worker = true\n\
         migrate_on_start = true\n\
         admin_token = \"<redacted>\"\n\
         clock = \"system\"\n\
         # secret_file unset: required with PostgreSQL (serve refuses to start without \
         --secret-file)\n\
         request_timeout = \"PT30S\"\n\
         header_read_timeout = \"PT10S\"\n\
         idle_timeout = \"PT1M\"\n\
         connections_max = 512\n\
         shutdown_timeout = \"PT10S\"\n\
         safetime_gap_max = \"PT5S\"\n"
    );
    // Unknown keys in the file are refused.
    std::fs::write(&file, "max_tl = \"PT1M\"\n").expect("write");
    let out = tollgate()
        .args(["serve", "--print-config", "--config"])
        .arg(&file)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `max_tl`"));
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------- PostgreSQL

fn pg_url() -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(common::fresh_pg_url())
}

fn run_ok(args: &[&str]) -> String {
    let out = tollgate().args(args).output().expect("run");
    assert!(
        out.status.success(),
        "tollgate {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The CLI migrates: all pending, then applied, then none.
fn migrate_all(url: &str) {
    let all = usize::try_from(tollgate_server::pg::expected_schema_version()).expect("version");
    let pending = run_ok(&["migrate", "--dry-run", "--database-url", url]);
    assert_eq!(pending.lines().count(), all, "{pending}");
    assert!(pending.starts_with("pending 0001 "), "{pending}");
    let applied = run_ok(&["migrate", "--database-url", url]);
    assert_eq!(applied.lines().count(), all, "{applied}");
    assert_eq!(
        run_ok(&["migrate", "--dry-run", "--database-url", url]),
        "no migrations pending\n"
    );
}

/// One run of a read-only direct command: the command, its extra flags,
/// its extra environment and the whole standard error it must print.
type ReadOnlyCase = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    String,
);

/// Direct operator commands against the database (at policy `PT1M`,
/// `PT5S`): status and audit only read, so they need no policy flags (they
/// take the recorded policy); reclaim writes, so it runs with the service's
/// policy; a different policy given is refused; the test clock, which
/// exists only inside `serve`, is a usage error.
fn direct_operator_commands(url: &str) {
    let status: Value =
        serde_json::from_str(&run_ok(&["status", "--database-url", url])).expect("status json");
    assert_eq!(
        status["readiness"]["schema_version"],
        json!(tollgate_server::pg::expected_schema_version())
    );
    assert_eq!(status["clock"], json!("system"));
    assert_eq!(status["safe_time"], json!(null));
    assert_eq!(status["readiness"]["ready"], json!(true));
    assert_eq!(status["active_leases"], json!(0));
    assert_eq!(status["active_legacy_bounds"], json!(0));
    assert_eq!(status["policy"]["max_ttl"], json!("PT1M"));
    assert_eq!(status["policy"]["reclaim_grace"], json!("PT5S"));
    let audit: Value =
        serde_json::from_str(&run_ok(&["audit", "--database-url", url])).expect("audit json");
    assert_eq!(audit["clean"], json!(true));
    assert_eq!(audit["total_consumed"], json!(24));
    let reclaim: Value = serde_json::from_str(&run_ok(&[
        "reclaim",
        "--once",
        "--database-url",
        url,
        "--max-ttl",
        "PT1M",
        "--reclaim-grace",
        "PT5S",
    ]))
    .expect("reclaim json");
    assert_eq!(reclaim["reclaimed"], json!([]));
    for cmd in ["status", "audit", "reclaim"] {
        let out = tollgate()
            .args([cmd, "--database-url", url, "--clock", "test"])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            "error: --clock test exists only inside `tollgate serve` (it is set over its HTTP \
             API); run status, audit and reclaim directly with --clock system or --clock \
             safe-cut, or against the test server with --server\n",
            "{cmd}"
        );
    }
    // Status and audit only read: a different policy, by flag or by
    // variable, and a key file that does not exist are ignored with one
    // warning line each, naming what and why; the answer is the recorded
    // policy's.
    let policy_warning = tollgate_server::cli::READ_ONLY_IGNORES_POLICY;
    let key_warning = tollgate_server::cli::READ_ONLY_IGNORES_SECRET_FILE;
    assert_eq!(
        policy_warning,
        "warning: status and audit only read, so they ignore --max-ttl and --reclaim-grace \
         (and TOLLGATE_MAX_TTL, TOLLGATE_RECLAIM_GRACE, the config file's max_ttl and \
         reclaim_grace) and use the policy recorded in the database"
    );
    let cases: [ReadOnlyCase; 4] = [
        (
            "audit",
            &["--max-ttl", "PT2M", "--reclaim-grace", "PT5S"],
            &[],
            format!("{policy_warning}\n"),
        ),
        (
            "status",
            &["--max-ttl", "PT5M"],
            &[],
            format!("{policy_warning}\n"),
        ),
        (
            "status",
            &[],
            &[("TOLLGATE_MAX_TTL", "PT5M")],
            format!("{policy_warning}\n"),
        ),
        (
            "audit",
            &["--secret-file", "/nonexistent/tollgate.key"],
            &[],
            format!("{key_warning}\n"),
        ),
    ];
    for (cmd, flags, env, stderr) in cases {
        let out = tollgate()
            .args([cmd, "--database-url", url])
            .args(flags)
            .envs(env.iter().copied())
            .output()
            .expect("run");
        assert_eq!(
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned()
            ),
            (Some(0), stderr),
            "{cmd} {flags:?} {env:?}"
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        if cmd == "status" {
            assert_eq!(v["policy"]["max_ttl"], json!("PT1M"), "{cmd} {flags:?}");
        } else {
            assert_eq!(v["clean"], json!(true), "{cmd} {flags:?}");
        }
    }
    // The recorded policy itself given: nothing to warn about.
    let out = tollgate()
        .args([
            "status",
            "--database-url",
            url,
            "--max-ttl",
            "PT1M",
            "--reclaim-grace",
            "PT5S",
        ])
        .output()
        .expect("run");
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned()
        ),
        (Some(0), String::new())
    );
}

#[test]
fn postgres_walk_through_with_crash_restart() {
    let dir = temp_dir("pg");
    let url = pg_url();
    let secret = dir.join("capability.key");
    std::fs::write(
        &secret,
        "0123456789abcdef0123456789abcdef0123456789abcdef\n",
    )
    .expect("secret");
    let secret_s = secret.to_string_lossy().into_owned();

    migrate_all(&url);

    let serve_args = [
        "--database-url",
        url.as_str(),
        "--secret-file",
        secret_s.as_str(),
        "--clock",
        "test",
        "--max-ttl",
        "PT1M",
        "--reclaim-grace",
        "PT5S",
        "--no-reclaim-worker",
        "--no-migrate",
    ];
    // No worker: after the restart the test clock starts at the system
    // time, and a worker would (correctly) reclaim every lease before the
    // test sets the clock back.
    let srv = Server::start(&serve_args, &dir);
    let (account, key, lease, cap) = walk_through(&srv);
    let live = srv.ok(
        &[
            "lease",
            "acquire",
            &account,
            "--units",
            "3",
            "--ttl",
            "PT50.000000007S",
        ],
        &key,
    );
    assert_eq!(live["expiry"], json!("2026-11-29T12:01:00.000000007Z"));

    // SIGKILL, restart: every acknowledged grant and capability survives.
    srv.crash();
    let srv = Server::start(&serve_args, &dir);
    srv.ok(&["clock", "set", "2026-11-29T12:00:10Z"], ADMIN);
    let shown = srv.ok(
        &["lease", "show", &s(&live, "lease_id")],
        &s(&live, "capability"),
    );
    assert_eq!(shown["expiry"], json!("2026-11-29T12:01:00.000000007Z"));
    assert_eq!(shown["state"], json!("active"));
    let old = srv.ok(&["lease", "show", &lease], &cap);
    assert_eq!(old["state"], json!("released"));
    srv.ok(
        &["lease", "release", &s(&live, "lease_id"), "--consumed", "0"],
        &s(&live, "capability"),
    );
    expire_and_reclaim(&srv, &account, &key);

    direct_operator_commands(&url);
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `f` on a connection to `url` (the database owner), on a private
/// runtime.
fn with_db<T>(
    url: &str,
    f: impl for<'c> FnOnce(
        &'c mut sqlx::PgConnection,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'c>>,
) -> T {
    use sqlx::Connection;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
        let out = f(&mut conn).await;
        conn.close().await.expect("close");
        out
    })
}

/// `serve --clock safe-cut` with the real binary and no sampler: refused
/// at start-up while the sealed horizon is shorter than max_ttl + grace;
/// then, with no cut, acquire is refused (`time_uncertain`, `no_cut`) and
/// status says why; once a certain cut is written (as the sampler would),
/// acquire runs at the cut; direct `status --clock safe-cut` reads it too.
#[test]
fn postgres_safe_cut_clock() {
    let dir = temp_dir("safecut");
    let url = pg_url();
    let secret = dir.join("capability.key");
    std::fs::write(&secret, [7u8; 32]).expect("secret");
    let secret_s = secret.to_string_lossy().into_owned();
    run_ok(&["migrate", "--database-url", &url]);
    let seal = |horizon_ms: i64| {
        with_db(&url, |c| {
            Box::pin(async move {
                safetime_pg::seal_policy(c, horizon_ms, "e2e")
                    .await
                    .expect("seal")
                    .version()
            })
        })
    };
    assert_eq!(seal(64_999), 2);
    let policy = [
        "--max-ttl",
        "PT1M",
        "--reclaim-grace",
        "PT5S",
        "--clock",
        "safe-cut",
    ];
    let out = tollgate()
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-token", ADMIN])
        .args(["--database-url", &url, "--secret-file", &secret_s])
        .args(policy)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "max_ttl PT1M + reclaim_grace PT5S + safetime_gap_max PT5S exceeds the sealed \
             safe-time horizon of 64999 ms"
        ),
        "{err}"
    );
    // The horizon must hold max_ttl + grace + the gap bound (PT1M below).
    assert_eq!(seal(125_000), 3);

    let mut serve_args = vec!["--database-url", url.as_str(), "--secret-file", &secret_s];
    serve_args.extend(policy);
    serve_args.extend(["--safetime-gap-max", "PT1M", "--no-reclaim-worker"]);
    let srv = Server::start(&serve_args, &dir);
    let status = srv.ok(&["status"], ADMIN);
    assert_eq!(status["clock"], json!("safe-cut"));
    assert_eq!(status["safe_time"]["certain"], json!(false));
    assert_eq!(status["safe_time"]["uncertain_reason"], json!("no_cut"));
    assert_eq!(status["safe_time"]["gap_max"], json!("PT1M"));
    let created = srv.ok(&["account", "create", "--name", "a"], ADMIN);
    let account = s(&created, "account_id");
    let key = s(&created, "api_key");
    srv.ok(&["account", "deposit", &account, "--units", "10"], ADMIN);
    let acquire = [
        "lease", "acquire", &account, "--units", "2", "--ttl", "PT30S",
    ];
    let refused = srv.cli(&acquire, &key);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(
        err.contains("503 time_uncertain: the safe expiry cut is uncertain (no_cut)"),
        "{err}"
    );
    with_db(&url, |c| {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO tollgate_safetime (singleton, epoch, policy_version,                     cut_floor_us, cut_submicro_ns, certain, uncertain_reason, quarantined,                     proof_started_at, leader_pid, system_identifier, timeline_id,                     postmaster_start, claimed_at, published_at, publish_seq)                  VALUES (true, 1, 3, 1795953600000000, 0, true, NULL, false,                     clock_timestamp(), 0, 0, 1, clock_timestamp(), clock_timestamp(),                     clock_timestamp(), 1)",
            )
            .execute(c)
            .await
            .expect("cut row")
        })
    });
    let g = srv.ok(&acquire, &key);
    // Counted from the cut plus the reading's staleness bound (the row's
    // age, under the gap bound), and the holder told the full TTL.
    let expiry: jiff::Timestamp = g["expiry"].as_str().expect("expiry").parse().expect("ts");
    let cut: jiff::Timestamp = "2026-11-29T12:00:00Z".parse().expect("ts");
    assert!(
        expiry >= cut + jiff::SignedDuration::from_secs(30)
            && expiry <= cut + jiff::SignedDuration::from_secs(90),
        "{g}"
    );
    assert_eq!(g["expires_in"], json!("PT30S"));
    let status = srv.ok(&["status"], ADMIN);
    assert_eq!(status["safe_time"]["certain"], json!(true));
    assert_eq!(status["safe_time"]["cut"], json!("2026-11-29T12:00:00Z"));
    assert_eq!(status["safe_time"]["policy_version"], json!(3));
    assert_eq!(status["safe_time"]["horizon"], json!("PT2M5S"));
    assert_eq!(status["paused"]["acquire"], json!(1));
    let mut direct = vec!["status", "--database-url", url.as_str()];
    direct.extend(policy);
    direct.extend(["--safetime-gap-max", "PT1M"]);
    let status: Value = serde_json::from_str(&run_ok(&direct)).expect("status json");
    assert_eq!(status["clock"], json!("safe-cut"));
    assert_eq!(status["safe_time"]["certain"], json!(true));
    assert_eq!(status["safe_time"]["cut"], json!("2026-11-29T12:00:00Z"));
    assert_eq!(status["paused"], json!(null));
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a client saw acknowledged for one lease before the crash.
#[derive(Debug, Clone)]
struct Acked {
    lease_id: i64,
    capability: String,
    units: i64,
    expiry: String,
    released: bool,
}

/// One client: acquire, renew, release in a loop (bounded), recording every
/// acknowledged result; stops at the first transport error (the crash).
/// Returns the acknowledged leases and the lease of the request in flight
/// at the crash, whose outcome is unknown.
async fn client_loop(
    url: String,
    account: i64,
    key: String,
    ops_max: usize,
) -> (Vec<Acked>, Option<i64>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let mut acked: Vec<Acked> = Vec::new();
    for i in 0..ops_max {
        let live: Vec<usize> = (0..acked.len()).filter(|j| !acked[*j].released).collect();
        let (req, target) = match (i % 3, live.last()) {
            (1, Some(&j)) => (
                http.post(format!("{url}/v1/leases/{}/renew", acked[j].lease_id))
                    .bearer_auth(&acked[j].capability)
                    .json(&json!({"ttl": "PT50.000000003S"})),
                Some(j),
            ),
            (2, Some(&j)) => (
                http.post(format!("{url}/v1/leases/{}/release", acked[j].lease_id))
                    .bearer_auth(&acked[j].capability)
                    .json(&json!({"consumed": 1})),
                Some(j),
            ),
            _ => (
                http.post(format!("{url}/v1/accounts/{account}/leases"))
                    .bearer_auth(&key)
                    .json(&json!({"units": 2, "ttl": "PT40.000000001S"})),
                None,
            ),
        };
        let resp = match req.send().await {
            Ok(r) => r,
            Err(_) => {
                let lost = target.map_or(-1, |j| acked[j].lease_id);
                return (acked, Some(lost));
            }
        };
        let status = resp.status().as_u16();
        let body: Value = match resp.json().await {
            Ok(b) => b,
            Err(_) => {
                let lost = target.map_or(-1, |j| acked[j].lease_id);
                return (acked, Some(lost));
            }
        };
        match (target, status) {
            (None, 201) => acked.push(Acked {
                lease_id: body["lease_id"].as_i64().expect("id"),
                capability: s(&body, "capability"),
                units: 2,
                expiry: s(&body, "expiry"),
                released: false,
            }),
            (Some(j), 200) if i % 3 == 1 => acked[j].expiry = s(&body, "expiry"),
            (Some(j), 200) => acked[j].released = true,
            (_, 409) => {} // insufficient balance: nothing happened
            other => panic!("unexpected answer {other:?}: {body}"),
        }
    }
    (acked, None)
}

/// Crash safety: while four clients acquire, renew and release, SIGKILL
/// the service; after a restart every acknowledged grant exists with its
/// exact acknowledged expiry, every capability issued before the crash
/// works, and the audit is clean (no unit lost or counted twice).
#[test]
fn postgres_crash_under_load() {
    let dir = temp_dir("pg-crash");
    let url = pg_url();
    let secret = dir.join("capability.key");
    std::fs::write(&secret, [7u8; 32]).expect("secret");
    let secret_s = secret.to_string_lossy().into_owned();
    let serve_args = [
        "--database-url",
        url.as_str(),
        "--secret-file",
        secret_s.as_str(),
        "--clock",
        "test",
        "--no-reclaim-worker",
    ];
    let srv = Server::start(&serve_args, &dir);
    srv.ok(&["clock", "set", "2026-11-29T12:00:00Z"], ADMIN);
    let created = srv.ok(&["account", "create", "--name", "load"], ADMIN);
    let account = created["account_id"].as_i64().expect("id");
    let key = s(&created, "api_key");
    srv.ok(
        &[
            "account",
            "deposit",
            &account.to_string(),
            "--units",
            "100000",
        ],
        ADMIN,
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let clients: Vec<_> = (0..4)
        .map(|_| rt.spawn(client_loop(srv.url.clone(), account, key.clone(), 400)))
        .collect();
    // Let the clients get going, then kill the server mid-flight.
    std::thread::sleep(Duration::from_millis(1000));
    srv.crash();
    let mut acked = Vec::new();
    let mut in_flight = Vec::new();
    for c in clients {
        let (a, f) = rt.block_on(c).expect("client");
        acked.extend(a);
        in_flight.extend(f);
    }
    assert!(acked.len() >= 4, "clients made progress: {}", acked.len());
    eprintln!(
        "crash after {} acknowledged grants ({} released); in flight: {in_flight:?}",
        acked.len(),
        acked.iter().filter(|a| a.released).count()
    );

    let srv = Server::start(&serve_args, &dir);
    srv.ok(&["clock", "set", "2026-11-29T12:00:00Z"], ADMIN);
    let mut held_acked = 0;
    for a in &acked {
        let shown = srv.ok(&["lease", "show", &a.lease_id.to_string()], &a.capability);
        if in_flight.contains(&a.lease_id) {
            // The request in flight at the crash may or may not have landed.
            continue;
        }
        let state = if a.released { "released" } else { "active" };
        assert_eq!(shown["state"], json!(state), "{a:?}");
        assert_eq!(shown["expiry"], json!(a.expiry), "{a:?}");
        if !a.released {
            held_acked += a.units;
        }
    }
    let audit = srv.ok(&["audit"], ADMIN);
    assert_eq!(audit["clean"], json!(true), "{audit}");
    let acct = srv.ok(&["account", "show", &account.to_string()], &key);
    assert!(
        acct["held"].as_i64() >= Some(held_acked),
        "{acct} vs {held_acked}"
    );
    // Every capability issued before the crash still works: release all.
    for a in acked
        .iter()
        .filter(|a| !a.released && !in_flight.contains(&a.lease_id))
    {
        srv.ok(
            &[
                "lease",
                "release",
                &a.lease_id.to_string(),
                "--consumed",
                "0",
            ],
            &a.capability,
        );
    }
    srv.ok(&["audit"], ADMIN);
    srv.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------ policy commands

/// Runs `cmd`, which must exit within [`START_TIMEOUT`] (it is killed and
/// the test fails otherwise): for a `serve` that must refuse to start.
fn output_within_start_timeout(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + START_TIMEOUT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "did not exit: {}",
                String::from_utf8_lossy(&out.stderr).into_owned()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// Runs a `policy` subcommand that must succeed; returns its JSON and its
/// stderr.
#[track_caller]
fn policy_ok(args: &[&str]) -> (Value, String) {
    let out = tollgate().arg("policy").args(args).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "policy {args:?}: {err}");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "policy {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (v, err)
}

/// `recorded_at` of a change, which must lie within `[from, to]` (the
/// database's transaction time; same machine, same clock).
#[track_caller]
fn recorded_between(change: &Value, from: jiff::Timestamp, to: jiff::Timestamp) -> String {
    let at = s(change, "recorded_at");
    let t: jiff::Timestamp = at.parse().expect("recorded_at is RFC 3339");
    assert!(from <= t && t <= to, "{at} not within {from}..{to}");
    at
}

/// The explicit, recorded policy change: `policy show` before and after a
/// first start, `policy set` adding exactly one change row with the old and
/// new values, a running server with the old grace refusing to reclaim, and
/// a restart with the old grace refused naming both policies.
/// An unmigrated database: `policy show` is refused (exit 1), naming the
/// pending migrations.
fn unmigrated_database_is_refused(url: &str) {
    let out = tollgate()
        .args(["policy", "show", "--database-url", url])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: checking the schema: "), "{err}");
    assert!(err.contains("pending"), "{err}");
}

/// Invalid values are usage errors (exit 2) and record nothing; so is a
/// `policy set` without a database.
fn invalid_values_are_usage_errors(url: &str) {
    for (args, message) in [
        (
            vec!["--max-ttl", "PT1M", "--reclaim-grace", "-PT1S"],
            "invalid configuration: reclaim_grace must be nonnegative",
        ),
        (
            vec!["--max-ttl", "PT0S", "--reclaim-grace", "PT5S"],
            "invalid configuration: max_ttl must be positive",
        ),
        (
            vec!["--max-ttl", "soon", "--reclaim-grace", "PT5S"],
            "invalid configuration: max_ttl: \"soon\" is not an ISO 8601 or friendly duration",
        ),
        (
            vec![
                "--max-ttl",
                "PT1M",
                "--reclaim-grace",
                "PT5S",
                "--changed-by",
                " ",
            ],
            "invalid configuration: changed_by must be 1..=200 characters without control characters",
        ),
    ] {
        let mut all = vec!["policy", "set", "--database-url", url];
        all.extend(&args);
        if !args.contains(&"--changed-by") {
            all.extend(["--changed-by", "ops: alice"]);
        }
        let out = tollgate().args(&all).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {err}");
        assert!(
            err.starts_with(&format!("error: {message}")),
            "{all:?}: {err}"
        );
        assert_eq!(out.stdout, b"", "{all:?}");
    }
    let out = tollgate()
        .args([
            "policy",
            "set",
            "--max-ttl",
            "PT1M",
            "--reclaim-grace",
            "PT5S",
        ])
        .args(["--changed-by", "ops: alice"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("error: invalid configuration: policy needs --database-url"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A restart with the old grace is refused at start-up, naming both.
fn restart_with_the_old_policy_is_refused(old_args: &[&str], mismatch: &str) {
    let out = output_within_start_timeout(
        tollgate()
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin-token", ADMIN])
            .args(old_args),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "error: opening the PostgreSQL store: {mismatch}; every process sharing these \
             grants must apply the same policy"
        )),
        "{err}"
    );
    assert_eq!(out.stdout, b"");
}

#[test]
fn postgres_policy_show_and_set() {
    let dir = temp_dir("policy");
    let url = pg_url();
    let secret = dir.join("capability.key");
    std::fs::write(&secret, "policy-test-capability-key-0123456789\n").expect("secret");
    let secret_s = secret.to_string_lossy().into_owned();

    unmigrated_database_is_refused(&url);

    run_ok(&["migrate", "--database-url", &url]);
    let (shown, _) = policy_ok(&["show", "--database-url", &url]);
    assert_eq!(shown, json!({"policy": null, "changes": []}));

    // The first start records the policy.
    let serve_args = |grace: &'static str| {
        [
            "--database-url",
            url.as_str(),
            "--secret-file",
            secret_s.as_str(),
            "--clock",
            "test",
            "--max-ttl",
            "PT1M",
            "--reclaim-grace",
            grace,
            "--no-reclaim-worker",
        ]
        .map(str::to_string)
    };
    let old_args = serve_args("PT5S");
    let old_args: Vec<&str> = old_args.iter().map(String::as_str).collect();
    let before_start = jiff::Timestamp::now();
    let srv = Server::start(&old_args, &dir);
    let after_start = jiff::Timestamp::now();
    let (shown, _) = policy_ok(&["show", "--database-url", &url]);
    let first_at = recorded_between(&shown["changes"][0], before_start, after_start);
    let first = json!({"change_id": 1, "changed_by": "first start", "recorded_at": first_at,
                       "old": null, "new": {"max_ttl": "PT1M", "reclaim_grace": "PT5S"}});
    assert_eq!(
        shown,
        json!({"policy": {"max_ttl": "PT1M", "reclaim_grace": "PT5S"}, "changes": [first]})
    );

    invalid_values_are_usage_errors(&url);
    let (unchanged, _) = policy_ok(&["show", "--database-url", &url]);
    assert_eq!(unchanged, shown);

    // An account on the running server, before the change.
    let created = srv.ok(&["account", "create", "--name", "a"], ADMIN);
    let account = s(&created, "account_id");
    let key = s(&created, "api_key");
    srv.ok(&["account", "deposit", &account, "--units", "100"], ADMIN);

    // The change: one new row with the old and new values and who did it.
    let before_set = jiff::Timestamp::now();
    let (change, note) = policy_ok(&[
        "set",
        "--database-url",
        &url,
        "--max-ttl",
        "PT1M",
        "--reclaim-grace",
        "PT7.5S",
        "--changed-by",
        "ops: alice",
    ]);
    let second_at = recorded_between(&change, before_set, jiff::Timestamp::now());
    let second = json!({"change_id": 2, "changed_by": "ops: alice", "recorded_at": second_at,
                        "old": {"max_ttl": "PT1M", "reclaim_grace": "PT5S"},
                        "new": {"max_ttl": "PT1M", "reclaim_grace": "PT7.5S"}});
    assert_eq!(change, second);
    assert_eq!(
        note,
        "policy recorded; restart every process sharing this database with \
         --max-ttl PT1M --reclaim-grace PT7.5S\n"
    );
    let (shown, _) = policy_ok(&["show", "--database-url", &url]);
    assert_eq!(
        shown,
        json!({"policy": {"max_ttl": "PT1M", "reclaim_grace": "PT7.5S"},
               "changes": [first, second]})
    );

    // The server still running with the old grace refuses to reclaim (the
    // store's check) and, from the database, every lease write: 503 (a
    // process with the recorded policy would serve it), saying what to do.
    let mismatch = "the database records max_ttl PT1M and reclaim_grace PT7.5S, but this \
                    process is configured with max_ttl PT1M and reclaim_grace PT5S";
    let restart = "every process sharing these grants must apply the recorded policy: restart \
                   this process with the recorded grant policy (`tollgate policy show`)";
    let refused = srv.cli(&["reclaim", "--once"], ADMIN);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        format!("error: 503 policy_mismatch: {mismatch}; {restart}\n")
    );
    let refused = srv.cli(
        &[
            "lease", "acquire", &account, "--units", "10", "--ttl", "PT50M",
        ],
        &key,
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    let guard = format!("lease_policy_mismatch: {mismatch}; {restart} (SQLSTATE TGS11)");
    assert_eq!(err, format!("error: 503 policy_mismatch: {guard}\n"));
    let balances = srv.ok(&["account", "show", &account], &key);
    assert_eq!(
        (&balances["available"], &balances["held"]),
        (&json!(100), &json!(0))
    );
    // Logged once, with the code.
    let log = std::fs::read_to_string(&srv.stderr_path).expect("server log");
    assert!(log.contains(mismatch), "{log}");
    assert_eq!(log.matches(&guard).count(), 1, "{log}");
    srv.stop();

    restart_with_the_old_policy_is_refused(&old_args, mismatch);

    // With the new values it starts; `max` is accepted for the grace.
    let new_args = serve_args("PT7.5S");
    let new_args: Vec<&str> = new_args.iter().map(String::as_str).collect();
    Server::start(&new_args, &dir).stop();
    let (third, _) = policy_ok(&[
        "set",
        "--database-url",
        &url,
        "--max-ttl",
        "PT2M",
        "--reclaim-grace",
        "max",
        "--changed-by",
        "ops: bob",
    ]);
    assert_eq!(third["change_id"], json!(3));
    assert_eq!(
        (&third["old"], &third["new"]),
        (
            &json!({"max_ttl": "PT1M", "reclaim_grace": "PT7.5S"}),
            &json!({"max_ttl": "PT2M", "reclaim_grace": "PT2562047788015215H30M7.999999999S"})
        )
    );
    let (shown, _) = policy_ok(&["show", "--database-url", &url]);
    assert_eq!(shown["changes"], json!([first, second, third]));
    assert_eq!(shown["policy"], third["new"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The read-only direct commands under a sealed horizon shorter than the
/// default policy (`PT1H` + `PT30S`): `status` and `audit` need no policy
/// flags, with a policy recorded (they take it) and before any is (they
/// record nothing).
#[test]
fn read_only_commands_need_no_policy_flags_under_a_short_horizon() {
    let url = pg_url();
    run_ok(&["migrate", "--database-url", &url]);
    let seal = |horizon_ms: i64| {
        with_db(&url, move |c| {
            Box::pin(async move {
                safetime_pg::seal_policy(c, horizon_ms, "e2e")
                    .await
                    .expect("seal")
                    .version()
            })
        })
    };
    // 100 s: shorter than the default policy, longer than PT1M + PT5S.
    assert_eq!(seal(100_000), 2);
    let recorded = |url: &str| {
        with_db(url, |c| {
            Box::pin(async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tollgate_policy")
                    .fetch_one(c)
                    .await
                    .expect("count")
            })
        })
    };
    for cmd in ["status", "audit"] {
        let v: Value = serde_json::from_str(&run_ok(&[cmd, "--database-url", &url])).expect("json");
        assert_ne!(v, Value::Null, "{cmd}");
    }
    assert_eq!(recorded(&url), 0, "a read-only command recorded a policy");
    policy_ok(&[
        "set",
        "--database-url",
        &url,
        "--max-ttl",
        "PT1M",
        "--reclaim-grace",
        "PT5S",
        "--changed-by",
        "e2e",
    ]);
    let status: Value =
        serde_json::from_str(&run_ok(&["status", "--database-url", &url])).expect("json");
    assert_eq!(status["policy"]["max_ttl"], json!("PT1M"));
    assert_eq!(status["policy"]["reclaim_grace"], json!("PT5S"));
    assert_eq!(status["readiness"]["ready"], json!(true));
    let audit: Value =
        serde_json::from_str(&run_ok(&["audit", "--database-url", &url])).expect("json");
    assert_eq!(audit["clean"], json!(true));
}
