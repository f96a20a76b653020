//! The appliance end to end, as a user runs it: from a clean data
//! directory, `little-compute appliance up` as a real child process (its
//! own PostgreSQL cluster, a real sampler as `lc-sampler`, the control
//! plane, a bubblewrap provider, the worker and the gateway); a tenant and a real
//! command through the `lc` client; the command's exact output, its
//! terminal state and exit code, its units back and a clean Tollgate audit;
//! then a stop (SIGTERM, every process gone), a second `up` on the same
//! directory that reads the same exec, and `appliance down`.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long one `up` may take until it prints `appliance ready`: a new
/// cluster, migrations, and a new sampler epoch that becomes certain after
/// its recovery grace.
const UP_MAX: Duration = Duration::from_secs(240);
/// How long a stop may take.
const STOP_MAX: Duration = Duration::from_secs(120);

fn exe(name: &str) -> PathBuf {
    match name {
        "little-compute" => PathBuf::from(env!("CARGO_BIN_EXE_little-compute")),
        "lc" => PathBuf::from(env!("CARGO_BIN_EXE_lc")),
        other => panic!("no binary {other}"),
    }
}

/// The sampler and the supervisor are other packages' binaries: the
/// appliance finds them beside its own. Builds them when they are missing
/// (the workspace's test run builds them anyway).
fn ensure_sibling_binaries() {
    let dir = exe("little-compute").parent().unwrap().to_path_buf();
    let missing: Vec<&str> = ["tollgate-safetime", "lc-supervisor"]
        .into_iter()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if missing.is_empty() {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build");
    for b in &missing {
        cmd.args(["-p", b]);
    }
    // The profile directory is the one this test binary was built into.
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cargo build runs");
    assert!(status.success(), "building {missing:?} failed");
    for b in &missing {
        assert!(
            dir.join(b).is_file(),
            "{b} not built into {}",
            dir.display()
        );
    }
}

struct Up {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Up {
    fn start(dir: &Path) -> Up {
        let mut up = Up::spawn(dir, &[]);
        up.wait_for("appliance ready", UP_MAX);
        up
    }

    fn spawn(dir: &Path, extra: &[&str]) -> Up {
        let mut child = Command::new(exe("little-compute"))
            .args(["appliance", "up", "--data-dir"])
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("appliance up starts");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Up {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn wait_for(&mut self, needle: &str, bound: Duration) {
        let deadline = Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .lines
                .recv_timeout(left.min(Duration::from_millis(500)))
            {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!(
                        "appliance exited before {needle:?}:\n{}",
                        self.seen.join("\n")
                    )
                }
            }
            if Instant::now() >= deadline {
                panic!("no {needle:?} within {bound:?}:\n{}", self.seen.join("\n"));
            }
        }
    }

    /// Waits for the process to exit; its status.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + STOP_MAX;
        loop {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            if let Some(s) = self.child.try_wait().unwrap() {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(line);
                }
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "the appliance did not stop within {STOP_MAX:?}:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + STOP_MAX;
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Removes the (empty, once every instance was destroyed) parent cgroups
/// the appliance's provider made for `dir`.
fn remove_cgroups(dir: &Path) {
    use std::os::unix::ffi::OsStrExt as _;
    let hex = lc_core::Digest::of(dir.as_os_str().as_bytes()).to_hex();
    for c in ["memory", "pids", "cpu", "cpuacct"] {
        let _ = std::fs::remove_dir(
            Path::new("/sys/fs/cgroup")
                .join(c)
                .join(format!("little-compute-{}", &hex[..12])),
        );
    }
}

/// Runs `lc --data-dir DIR args...`: (exit code, stdout, stderr).
fn lc(dir: &Path, args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = Command::new(exe("lc"))
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env_remove("LC_SERVER")
        .env_remove("LC_TOKEN")
        .output()
        .expect("lc runs");
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn lc_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let (code, out, err) = lc(dir, args);
    assert_eq!(code, 0, "lc {args:?}: {err}");
    serde_json::from_slice(&out).unwrap_or_else(|e| panic!("lc {args:?}: {e}: {out:?}"))
}

fn pids(dir: &Path) -> serde_json::Map<String, serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("appliance.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["pids"].as_object().unwrap().clone()
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next())
                .is_some_and(|c| c != 'Z' && c != 'X')
        })
        .unwrap_or(false)
}

/// The Tollgate audit of the installation's database, through the owner's
/// credentials the appliance keeps in `DIR/secrets`.
async fn audit(dir: &Path) -> tollgate::AuditReport {
    let conf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("appliance.conf.json")).unwrap())
            .unwrap();
    let pw = std::fs::read_to_string(dir.join("secrets/pg-owner")).unwrap();
    let url = format!(
        "postgres://lc_owner:{}@127.0.0.1:{}/little_compute",
        pw.trim(),
        conf["postgres"]
    );
    let secret = std::fs::read_to_string(dir.join("secrets/server-secret")).unwrap();
    let policy = tollgate::GrantPolicy::new(
        jiff::SignedDuration::from_mins(15),
        jiff::SignedDuration::from_hours(1),
    )
    .unwrap();
    let key = tollgate::CapabilityKey::new(secret.trim().as_bytes()).unwrap();
    let store = lc_pg::LcStore::connect(&url, policy, key, lc_pg::LcConfig::default())
        .await
        .expect("the store opens with the appliance's policy and secret");
    let report = {
        use tollgate::Allocator as _;
        store.tollgate().audit().await.unwrap()
    };
    store.pool().close().await;
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appliance_runs_a_real_command_and_keeps_it_across_a_restart() {
    ensure_sibling_binaries();
    let tmp = tempfile::Builder::new()
        .prefix("lca-")
        .tempdir_in("/tmp")
        .unwrap();
    // PostgreSQL's account must reach DIR/pg.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let dir = tmp.path().join("lc");

    let mut up = Up::start(&dir);
    // A first start names the first steps.
    let first_step = format!(
        "  lc --data-dir {} tenant create --name blue --units 8",
        dir.display()
    );
    assert!(up.seen.contains(&first_step), "{:?}", up.seen);
    assert!(
        up.seen[0].contains("single-host installation")
            && up.seen[0].contains("separate hardened hosts"),
        "{:?}",
        up.seen[0]
    );
    let first_pids = pids(&dir);
    for name in [
        "appliance",
        "postgres",
        "sampler",
        "serve",
        "provider",
        "worker",
        "gateway",
    ] {
        let pid = first_pids[name].as_u64().unwrap();
        assert!(alive(pid), "{name} ({pid}) runs");
    }
    // serve, the gateway and the provider share one blob directory, so the
    // snapshot files quiescence writes are the ones the file routes read;
    // all three run as the same user.
    let blobs = dir.join("blobs").display().to_string();
    let mut uids = Vec::new();
    for name in ["serve", "gateway", "provider"] {
        let pid = first_pids[name].as_u64().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let at = args.iter().position(|a| a == "--blob-dir");
        assert_eq!(
            at.and_then(|i| args.get(i + 1)),
            Some(&blobs),
            "{name}: {args:?}"
        );
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        uids.push(
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .unwrap()
                .to_string(),
        );
    }
    assert!(uids.iter().all(|u| *u == uids[0]), "{uids:?}");
    // The sampler runs as its own unprivileged account.
    let sampler = first_pids["sampler"].as_u64().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{sampler}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let sampler_uid: u32 = uid_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt as _;
        m.uid() == 0
    });
    if root {
        assert_ne!(sampler_uid, 0, "the sampler is not root: {uid_line}");
    }
    // The sampler is in no sandbox: the namespaces of this test's process
    // and no instance cgroup of the provider.
    for ns in ["mnt", "net", "pid", "user", "ipc", "uts"] {
        assert_eq!(
            std::fs::read_link(format!("/proc/{sampler}/ns/{ns}")).unwrap(),
            std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap(),
            "the sampler's {ns} namespace"
        );
    }
    let cgroups = std::fs::read_to_string(format!("/proc/{sampler}/cgroup")).unwrap();
    assert!(!cgroups.contains("little-compute"), "{cgroups}");
    let status = Command::new(exe("little-compute"))
        .args(["appliance", "status", "--json", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(status.status.success());
    let st: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(st["up"], true);
    assert_eq!(st["cut"]["certain"], true);

    let tenant = lc_json(
        &dir,
        &[
            "tenant", "create", "--name", "blue", "--units", "8", "--json",
        ],
    );
    let t = tenant["tenant_id"].as_i64().unwrap().to_string();
    assert!(tenant["api_key"].as_str().unwrap().starts_with("lc_"));
    let (code, _, err) = lc(
        &dir,
        &[
            "--tenant",
            &t,
            "exec",
            "create",
            "--runtime",
            "base",
            "--shape",
            "small",
            "--wait",
            "--",
            "sh",
            "-c",
            "printf 'hello\\nworld\\n'; printf oops >&2; exit 3",
        ],
    );
    assert_eq!(
        code, 3,
        "exec create --wait exits with the command's code: {err}"
    );
    let exec = lc_json(&dir, &["--tenant", &t, "exec", "show", "1", "--json"]);
    assert_eq!(exec["state"], "terminal");
    assert_eq!(exec["exit_code"], 3);
    assert_eq!(exec["terminal_reason"], "exited");
    // The provider measured the instance before destroying it: a cost, and
    // no side effects (the default shape has no network), so re-executing
    // it would be safe; `lc exec show` says so.
    assert_eq!(
        (
            &exec["observation"]["externality"],
            &exec["reexecution"],
            exec["observation"]["cost"]["cpuTimeMs"].is_u64(),
            exec["observation"]["cost"]["peakMemoryBytes"].is_u64(),
        ),
        (
            &serde_json::json!({"networkWrites": false, "databaseCommits": false, "externalApiCalls": false}),
            &serde_json::json!({"eligible": true}),
            true,
            true
        ),
        "{exec}"
    );
    let (code, shown, err) = lc(&dir, &["--tenant", &t, "exec", "show", "1"]);
    assert_eq!(code, 0, "{err}");
    let shown = String::from_utf8(shown).unwrap();
    for line in [
        "externality.network_writes      false",
        "externality.external_api_calls  false",
        "reexecution                     eligible",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line:?} in:\n{shown}");
    }
    let (code, out, err) = lc(&dir, &["--tenant", &t, "exec", "output", "1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, b"hello\nworld\n");
    let (code, _, err) = lc(&dir, &["--tenant", &t, "exec", "output", "1", "--stderr"]);
    assert_eq!(code, 0);
    assert!(err.contains("oops"), "{err:?}");

    // No path of the sampler (its binary under DIR/bin, its process) is
    // visible inside a sandbox.
    let sampler_bin = dir.join("bin/tollgate-safetime");
    assert!(sampler_bin.is_file());
    let probe = format!(
        "test -e {} && echo visible || echo absent; test -e /proc/{sampler} && echo visible || echo absent",
        sampler_bin.display()
    );
    let (code, _, err) = lc(
        &dir,
        &[
            "--tenant",
            &t,
            "exec",
            "create",
            "--runtime",
            "base",
            "--shape",
            "small",
            "--wait",
            "--",
            "sh",
            "-c",
            &probe,
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = lc(&dir, &["--tenant", &t, "exec", "output", "2"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, b"absent\nabsent\n");

    // Output survives a gateway killed while the command streams: the
    // appliance starts another, which takes the exec over once the dead
    // one's heartbeat expires, and every line arrives exactly once.
    let (code, _, err) = lc(
        &dir,
        &[
            "--tenant",
            &t,
            "exec",
            "create",
            "--runtime",
            "base",
            "--shape",
            "small",
            "--",
            "sh",
            "-c",
            "i=1; while [ $i -le 40 ]; do echo line $i; i=$((i+1)); sleep 0.1; done",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while lc(&dir, &["--tenant", &t, "exec", "output", "3"])
        .1
        .is_empty()
    {
        assert!(Instant::now() < deadline, "no output of exec 3");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dead = pids(&dir)["gateway"].as_u64().unwrap();
    let killed = Command::new("kill")
        .args(["-9", &dead.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let next = loop {
        let p = pids(&dir)["gateway"].as_u64().unwrap();
        if p != dead {
            break p;
        }
        assert!(Instant::now() < deadline, "no new gateway");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(alive(next), "the new gateway ({next}) runs");
    let (code, out, err) = lc(&dir, &["--tenant", &t, "exec", "output", "3", "--follow"]);
    assert_eq!(code, 0, "{err}");
    let want: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    assert_eq!(String::from_utf8(out).unwrap(), want);

    // The Reservations' units come back once the worker commits the releases.
    let deadline = Instant::now() + Duration::from_secs(60);
    let balances = loop {
        let b = lc_json(&dir, &["tenant", "show", &t, "--json"]);
        if b["held"] == 0 || Instant::now() > deadline {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (
            &balances["deposited"],
            &balances["available"],
            &balances["held"],
            &balances["consumed"]
        ),
        (
            &serde_json::json!(8),
            &serde_json::json!(8),
            &serde_json::json!(0),
            &serde_json::json!(0)
        )
    );
    let report = audit(&dir).await;
    assert!(report.is_clean(), "{:?}", report.violations);
    assert_eq!(
        (
            report.total_deposited,
            report.total_held,
            report.total_consumed
        ),
        (8, 0, 0)
    );

    // SIGTERM stops everything in order, and nothing is left running.
    let killed = Command::new("kill")
        .args(["-TERM", &up.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let ended = up.wait_exit();
    assert!(ended.success(), "{ended}: {}", up.seen.join("\n"));
    let restarted = format!(
        "gateway (pid {dead}) ended (signal: 9 (SIGKILL)) without the appliance stopping it"
    );
    let started_next = format!("started gateway pid {next} (1 of at most 100 restarts)");
    assert!(
        up.seen
            .iter()
            .any(|l| l.contains(&restarted) && l.contains(&started_next)),
        "{}",
        up.seen.join("\n")
    );
    let stops: Vec<&String> = up
        .seen
        .iter()
        .filter(|l| l.starts_with("stopped "))
        .collect();
    let order: Vec<&str> = stops
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "gateway", "worker", "provider", "serve", "sampler", "postgres"
        ]
    );
    for (name, pid) in &first_pids {
        assert!(!alive(pid.as_u64().unwrap()), "{name} is gone");
    }
    assert!(!dir.join("appliance.json").exists());
    drop(up);

    // A second `up` on the same directory keeps every state.
    let mut up = Up::start(&dir);
    assert!(
        up.seen
            .iter()
            .any(|l| l.contains("reusing the PostgreSQL cluster"))
    );
    // A later start names what the directory holds, not the first steps.
    assert!(!up.seen.contains(&first_step), "{:?}", up.seen);
    assert!(
        up.seen.contains(
            &"this data directory holds 1 tenant(s), their execs and workspaces; for example:"
                .to_owned()
        ),
        "{:?}",
        up.seen
    );
    let again = lc_json(&dir, &["--tenant", &t, "exec", "show", "1", "--json"]);
    assert_eq!(again, exec);
    let (code, out, _) = lc(&dir, &["--tenant", &t, "exec", "output", "1"]);
    assert_eq!((code, out.as_slice()), (0, b"hello\nworld\n".as_slice()));
    let b = lc_json(&dir, &["tenant", "show", &t, "--json"]);
    assert_eq!(
        (&b["available"], &b["held"]),
        (&serde_json::json!(8), &serde_json::json!(0))
    );

    // A third `up` while this one runs is refused and changes nothing of
    // it: the directories' modes stay, and a new exec still runs.
    let mode = |p: &str| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777
    };
    let modes_before = (mode("provider"), mode("runtimes"));
    let third = Command::new(exe("little-compute"))
        .args(["appliance", "up", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(third.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&third.stderr).contains("is already up")
            || String::from_utf8_lossy(&third.stdout).contains("is already up"),
        "{}",
        String::from_utf8_lossy(&third.stderr)
    );
    assert_eq!((mode("provider"), mode("runtimes")), modes_before);
    let (code, _, err) = lc(
        &dir,
        &[
            "--tenant",
            &t,
            "exec",
            "create",
            "--runtime",
            "base",
            "--shape",
            "small",
            "--wait",
            "--",
            "true",
        ],
    );
    assert_eq!(code, 0, "{err}");

    let down = Command::new(exe("little-compute"))
        .args(["appliance", "down", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stdout)
    );
    let ended = up.wait_exit();
    assert!(ended.success(), "{ended}");
    let status = Command::new(exe("little-compute"))
        .args(["appliance", "status", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(3), "no appliance is up");
    remove_cgroups(&dir);
}

/// SIGKILL of `appliance up` itself: every process it started receives its
/// stop signal from the kernel (parent death) and exits; a new `up` on the
/// same directory waits for them, starts cleanly and serves the tenant the
/// first one created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_appliance_leaves_nothing_running_and_starts_again() {
    ensure_sibling_binaries();
    let tmp = tempfile::Builder::new()
        .prefix("lck-")
        .tempdir_in("/tmp")
        .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let dir = tmp.path().join("lc");
    let mut up = Up::start(&dir);
    let tenant = lc_json(
        &dir,
        &[
            "tenant", "create", "--name", "red", "--units", "2", "--json",
        ],
    );
    let t = tenant["tenant_id"].as_i64().unwrap().to_string();
    let first = pids(&dir);
    up.child.kill().unwrap(); // SIGKILL
    let _ = up.child.wait();
    let deadline = Instant::now() + STOP_MAX;
    for (name, pid) in &first {
        while alive(pid.as_u64().unwrap()) {
            assert!(
                Instant::now() < deadline,
                "{name} ({pid}) outlived its appliance"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(up);
    // The dead appliance's appliance.json is stale; `up` replaces it.
    let up = Up::start(&dir);
    let b = lc_json(&dir, &["tenant", "show", &t, "--json"]);
    assert_eq!(
        (&b["deposited"], &b["held"]),
        (&serde_json::json!(2), &serde_json::json!(0))
    );
    let (code, _, err) = lc(
        &dir,
        &[
            "--tenant",
            &t,
            "exec",
            "create",
            "--runtime",
            "base",
            "--shape",
            "small",
            "--wait",
            "--",
            "true",
        ],
    );
    assert_eq!(code, 0, "{err}");
    drop(up);
    remove_cgroups(&dir);
}

/// `--sampler external`: the appliance starts no sampler and waits, saying
/// so, until a sampler elsewhere (here `tollgate-safetime run` started by
/// the test with the sampler role's credentials) publishes a certain cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_external_sampler_the_appliance_waits_for_its_cut() {
    ensure_sibling_binaries();
    let tmp = tempfile::Builder::new()
        .prefix("lcx-")
        .tempdir_in("/tmp")
        .unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let dir = tmp.path().join("lc");
    let mut up = Up::spawn(&dir, &["--sampler", "external"]);
    up.wait_for("waiting for a certain cut from a sampler elsewhere", UP_MAX);
    assert!(!pids(&dir).contains_key("sampler"), "no local sampler");
    assert!(!up.seen.iter().any(|l| l.contains("sampler started")));
    let conf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("appliance.conf.json")).unwrap())
            .unwrap();
    let pw = std::fs::read_to_string(dir.join("secrets/pg-sampler")).unwrap();
    let url = format!(
        "postgres://lc_sampler:{}@127.0.0.1:{}/little_compute",
        pw.trim(),
        conf["postgres"]
    );
    let sampler_bin = exe("little-compute")
        .parent()
        .unwrap()
        .join("tollgate-safetime");
    let mut sampler = Command::new(sampler_bin)
        .arg("run")
        .env("TOLLGATE_DATABASE_URL", &url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    up.wait_for("appliance ready", UP_MAX);
    let tenant = lc_json(
        &dir,
        &[
            "tenant", "create", "--name", "green", "--units", "1", "--json",
        ],
    );
    assert_eq!(tenant["tenant_id"], 1);
    let _ = Command::new("kill")
        .args(["-TERM", &up.child.id().to_string()])
        .status();
    assert!(up.wait_exit().success());
    let _ = Command::new("kill")
        .args(["-TERM", &sampler.id().to_string()])
        .status();
    let _ = sampler.wait();
    remove_cgroups(&dir);
}
