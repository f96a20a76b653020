//! The exec gateway on real processes: a real PostgreSQL, a real sampler,
//! a real `little-compute provider` (bubblewrap instances with the
//! supervisor's spool), a real `little-compute worker` and real
//! `little-compute gateway` processes.
//!
//! * For each crash point of the page protocol, a gateway started with
//!   `LC_GATEWAY_CRASH_AT=<point>` kills itself (SIGKILL) there while the
//!   exec streams output; a second gateway takes over once a certain cut
//!   passes the first one's heartbeat expiry. Every page appears exactly
//!   once, in order, with the right SHA-256 (the whole stdout is compared
//!   with what the command wrote), the terminal page is acked, the Lease is
//!   released once and the tenant's units return exactly once.
//! * Stdin input: a gateway started with `LC_GATEWAY_CRASH_AT=after_send`
//!   dies after the supervisor accepted the first input and before its
//!   `send` receipt committed; the successor takes over, delivers that
//!   input again (the supervisor writes each input seq once) and the rest,
//!   and records each. The command, numbering the lines it reads, shows
//!   each input exactly once, in order; the `eof` input ends it; the
//!   terminal page is acked, the Lease released once, the units back once.
//! * A command that ended without reading its stdin: the supervisor
//!   refuses its queued input (`input_closed`), which stays queued, and the
//!   gateway still moves its output and releases its Lease.
//! * While the cut is uncertain (the sampler stopped), a dead gateway's
//!   exec is not taken over by a successor stepping on it; once a new
//!   sampler makes the cut certain the successor takes it over and
//!   finishes it, nothing lost.
//! * A gateway stopped (SIGSTOP) past its heartbeat, resumed (SIGCONT)
//!   after a successor took over: its first write is refused, it counts
//!   one `stale_refused` and forgets the exec; the output is still exactly
//!   once.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_blob::BlobStore as _;
use lc_core::store::ControlStore;
use lc_core::{
    CutReading, Digest, ExecId, ExecRequest, ExecState, OperationKey, PageKind, TenantId,
    TerminalReason,
};
use lc_provider::{HttpProvider, Provider};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use tokio::sync::watch;

const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
/// 64 hex digits: the server secret file's text, whose bytes are the key.
const SECRET_TEXT: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
/// The gateways' heartbeat TTL: 3 s, so a takeover follows a death within
/// seconds, while a live owner on a loaded machine (the gateway renews
/// every third of the TTL) keeps a margin of 2 s per renewal; at the
/// shortest accepted TTL (1 s) a CI run saw a successor outlive its own
/// heartbeat and take its exec over again (generation 3).
const HEARTBEAT_TTL_MS: &str = "3000";
/// Units of the tenant (one exec of shape `small` holds one).
const UNITS: i64 = 2;
/// The longest any wait of these tests polls for.
const WAIT_MAX: Duration = Duration::from_secs(90);
/// Pause between two polls.
const POLL: Duration = Duration::from_millis(20);

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_little-compute"))
}

/// Builds `lc-supervisor` fresh (once per process) beside the
/// `little-compute` binary, where the provider looks for it.
fn ensure_supervisor() {
    let built = tollgate_pg_harness::cargo_built("lc-supervisor", &["-p", "lc-supervisor"]);
    assert_eq!(built.parent(), exe().parent());
}

fn sampler_options() -> SamplerOptions {
    SamplerOptions {
        config: SafeTimeConfig::new(
            50,
            SignedDuration::from_millis(50),
            GAP_MAX,
            SignedDuration::from_millis(500),
            3,
            SignedDuration::from_millis(200),
        )
        .unwrap(),
        standby_poll: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(500),
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn append(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

fn signal(p: &Proc, sig: i32) {
    let pid = i32::try_from(p.0.id()).unwrap();
    // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

async fn reading(clock: &SafeCutClock) -> CutReading {
    let r = clock.read().await.unwrap();
    CutReading {
        cut: r.now,
        certain: r.is_certain(),
        retry_after_s: 1,
    }
}

struct Rig {
    _db: tollgate_pg_harness::TestDb,
    url: String,
    store: lc_pg::LcStore,
    clock: SafeCutClock,
    dir: PathBuf,
    secret: PathBuf,
    blob_dir: PathBuf,
    provider_url: String,
    cgroup_parent: String,
    tenant: TenantId,
    sampler_stop: watch::Sender<bool>,
    sampler: Option<tokio::task::JoinHandle<()>>,
    worker: Option<Proc>,
    provider: Option<Proc>,
}

impl Rig {
    async fn new(name: &str) -> Rig {
        ensure_supervisor();
        let db = tollgate_pg_harness::shared().await.fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.unwrap();
        let sampler = Sampler::new(&url, sampler_options()).unwrap();
        let (sampler_stop, rx) = watch::channel(false);
        let sampler = Some(tokio::spawn(async move { sampler.run(rx).await }));
        let store = lc_pg::LcStore::connect(
            &url,
            tollgate::GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5))
                .unwrap(),
            tollgate::CapabilityKey::new(SECRET_TEXT.as_bytes()).unwrap(),
            lc_pg::LcConfig {
                max_connections: 4,
                ..lc_pg::LcConfig::default()
            },
        )
        .await
        .unwrap();
        let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
        let deadline = Instant::now() + WAIT_MAX;
        while !clock.read().await.is_ok_and(|r| r.is_certain()) {
            assert!(Instant::now() < deadline, "no certain cut");
            tokio::time::sleep(POLL).await;
        }
        let dir = PathBuf::from(format!("/tmp/lc-gw-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, format!("{SECRET_TEXT}\n")).unwrap();
        let port = free_port();
        let provider_url = format!("http://127.0.0.1:{port}");
        let cgroup_parent = format!("little-compute-gw-{name}-{}", std::process::id());
        let provider = Proc(
            Command::new(exe())
                .args(["provider", "--id", "local", "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .arg("--state-dir")
                .arg(dir.join("provider"))
                .args(["--cgroup-parent", &cgroup_parent])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(append(&dir.join("provider.log")))
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + WAIT_MAX;
        let http = loop {
            match HttpProvider::connect(&provider_url).await {
                Ok(p) => break p,
                Err(e) => {
                    assert!(Instant::now() < deadline, "provider: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let at = reading(&clock).await;
        let base = lc_core::manifest::Manifest::base();
        store
            .register_runtime(
                &OperationKey::new("base", Digest([1; 32])).unwrap(),
                at,
                "base",
                Digest(base.digest()),
                serde_json::from_slice(&base.canonical()).unwrap(),
            )
            .await
            .unwrap();
        {
            use lc_core::store::ReconcileStore as _;
            store
                .register_provider(http.id(), &provider_url, http.public_key().to_bytes())
                .await
                .unwrap();
        }
        let tenant = store
            .create_tenant(
                &OperationKey::new("t", Digest([2; 32])).unwrap(),
                at,
                "blue",
                Some(UNITS),
                &|id| Digest::of(format!("k{}", id.0).as_bytes()),
            )
            .await
            .unwrap()
            .tenant_id;
        let worker = Proc(
            Command::new(exe())
                .args(["worker", "--provider-url", &provider_url])
                .args(["--interval-ms", "20"])
                .arg("--secret-file")
                .arg(&secret)
                .args(["--safetime-gap-max-ms", "2000"])
                .env("LC_DATABASE_URL", &url)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(append(&dir.join("worker.log")))
                .spawn()
                .unwrap(),
        );
        let blob_dir = dir.join("blobs");
        Rig {
            _db: db,
            url,
            store,
            clock,
            dir,
            secret,
            blob_dir,
            provider_url,
            cgroup_parent,
            tenant,
            sampler_stop,
            sampler,
            worker: Some(worker),
            provider: Some(provider),
        }
    }

    /// Stops the sampler: its last cut goes stale, frozen and uncertain.
    async fn stop_sampler(&mut self) {
        let _ = self.sampler_stop.send(true);
        if let Some(task) = self.sampler.take() {
            tokio::time::timeout(WAIT_MAX, task)
                .await
                .expect("the sampler stops")
                .unwrap();
        }
    }

    /// Starts a new sampler (a new epoch, certain after its recovery).
    fn start_sampler(&mut self) {
        let sampler = Sampler::new(&self.url, sampler_options()).unwrap();
        let (stop, rx) = watch::channel(false);
        self.sampler = Some(tokio::spawn(async move { sampler.run(rx).await }));
        self.sampler_stop = stop;
    }

    fn gateway(&self, name: &str, crash_at: Option<&str>, metrics_port: Option<u16>) -> Proc {
        let mut cmd = Command::new(exe());
        cmd.args(["gateway", "--interval-ms", "20"])
            .args(["--heartbeat-ttl-ms", HEARTBEAT_TTL_MS])
            .args(["--safetime-gap-max-ms", "2000"])
            .arg("--secret-file")
            .arg(&self.secret)
            .arg("--blob-dir")
            .arg(&self.blob_dir)
            .env("LC_DATABASE_URL", &self.url)
            .env_remove("LC_GATEWAY_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(append(&self.log(name)));
        if let Some(p) = crash_at {
            cmd.env("LC_GATEWAY_CRASH_AT", p);
        }
        if let Some(port) = metrics_port {
            cmd.arg("--metrics-listen").arg(format!("127.0.0.1:{port}"));
        }
        Proc(cmd.spawn().unwrap())
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let p = entry.unwrap().path();
            if p.extension().is_some_and(|e| e == "log") {
                out.push_str(&format!(
                    "==== {}\n{}\n",
                    p.display(),
                    std::fs::read_to_string(&p).unwrap_or_default()
                ));
            }
        }
        out
    }

    async fn admit(&self, key: &str, script: &str) -> ExecId {
        self.admit_with(key, script, false).await
    }

    /// Admits `sh -c script`, its stdin open for input when `stdin_open`.
    async fn admit_with(&self, key: &str, script: &str, stdin_open: bool) -> ExecId {
        self.store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                reading(&self.clock).await,
                self.tenant,
                &ExecRequest {
                    runtime: "base".into(),
                    shape: "small".into(),
                    command: vec!["sh".into(), "-c".into(), script.into()],
                    timeout_ms: None,
                    stdin_open,
                },
            )
            .await
            .unwrap()
            .exec_id
    }

    /// Queues `bytes` (then `eof`) for the stdin of `exec` under `key`;
    /// returns the input seq.
    async fn send_input(&self, key: &str, exec: ExecId, bytes: &[u8], eof: bool) -> i64 {
        self.store
            .send_input(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                reading(&self.clock).await,
                self.tenant,
                exec,
                bytes,
                eof,
            )
            .await
            .unwrap()
            .input_seq
    }

    async fn scalar(&self, sql: &str, exec: ExecId) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(exec.0)
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    /// Acked pages of `exec` so far.
    async fn acked_pages(&self, exec: ExecId) -> i64 {
        self.scalar(
            "SELECT count(*) FROM lc_output_pages WHERE exec_id = $1 AND state = 'acked'",
            exec,
        )
        .await
    }

    async fn wait_for(&self, what: &str, mut done: impl AsyncFnMut() -> bool) {
        let deadline = Instant::now() + WAIT_MAX;
        while !done().await {
            assert!(Instant::now() < deadline, "{what}:\n{}", self.logs());
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `exec` is terminal and the tenant holds nothing.
    async fn wait_released(&self, exec: ExecId) {
        self.wait_for("the exec is released", async || {
            let t = self.store.tenant(self.tenant).await.unwrap();
            let e = self.store.exec(self.tenant, exec).await.unwrap();
            t.held == 0 && e.state == ExecState::Terminal
        })
        .await;
    }

    /// The exec's stdout from its acked pages (each page's bytes from the
    /// store or the sink, each checked against its SHA-256), and the
    /// terminal page's exit code; asserts the seqs are 1..=n once each.
    async fn output(&self, exec: ExecId) -> (Vec<u8>, Option<i32>) {
        let sink = lc_blob::LocalBlobStore::open(&self.blob_dir).unwrap();
        let mut pages = Vec::new();
        let mut after = 0;
        loop {
            let got = self
                .store
                .output(self.tenant, exec, after, 1000)
                .await
                .unwrap();
            let Some(last) = got.last() else { break };
            after = last.meta.seq;
            pages.extend(got);
        }
        let seqs: Vec<i64> = pages.iter().map(|p| p.meta.seq).collect();
        let n = i64::try_from(seqs.len()).unwrap();
        assert_eq!(
            seqs,
            (1..=n).collect::<Vec<_>>(),
            "every page once, in order"
        );
        let mut stdout = Vec::new();
        let mut exit = None;
        for p in &pages {
            let bytes = match &p.bytes {
                Some(b) => b.clone(),
                None => sink.get(&p.meta.sha256).unwrap().expect("the page's blob"),
            };
            assert_eq!(Digest::of(&bytes), p.meta.sha256, "page {}", p.meta.seq);
            assert_eq!(bytes.len(), p.meta.length as usize, "page {}", p.meta.seq);
            match p.meta.kind {
                PageKind::Stdout => stdout.extend(bytes),
                PageKind::Stderr => {}
                PageKind::Terminal => {
                    assert_eq!(p.meta.seq, n, "the terminal page is the last");
                    exit = p.meta.exit.and_then(|e| e.code);
                }
                PageKind::Stopped => panic!("page {}: no exec here is stopped", p.meta.seq),
            }
        }
        (stdout, exit)
    }

    /// The exec's end as the store records it, its owner generation, and
    /// its release receipts.
    async fn settled(
        &self,
        exec: ExecId,
    ) -> (ExecState, Option<TerminalReason>, Option<i32>, i64, i64) {
        let e = self.store.exec(self.tenant, exec).await.unwrap();
        let generation = self
            .scalar(
                "SELECT generation FROM lc_exec_owners WHERE exec_id = $1",
                exec,
            )
            .await;
        let releases = self
            .scalar(
                "SELECT count(*) FROM lc_transitions WHERE exec_id = $1 AND kind = 'release'",
                exec,
            )
            .await;
        (
            e.state,
            e.terminal_reason,
            e.exit_code,
            generation,
            releases,
        )
    }

    async fn balance(&self) -> (i64, i64, i64, i64) {
        let t = self.store.tenant(self.tenant).await.unwrap();
        (t.deposited, t.available, t.held, t.consumed)
    }

    async fn finish(mut self) {
        use tollgate::Allocator as _;
        let audit = self.store.tollgate().audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.violations);
        assert_eq!(
            (
                audit.total_deposited,
                audit.total_held,
                audit.total_consumed
            ),
            (i128::from(UNITS), 0, 0)
        );
        let _ = self.sampler_stop.send(true);
        drop(self.worker.take());
        drop(self.provider.take());
        let _ = std::fs::remove_dir_all(&self.dir);
        for c in ["memory", "pids", "cpu"] {
            let _ = std::fs::remove_dir(
                Path::new("/sys/fs/cgroup")
                    .join(c)
                    .join(&self.cgroup_parent),
            );
        }
    }
}

/// `lines` lines `line N`, a short pause after each so the output spans
/// many pages, then exit 3.
fn script(lines: usize, pause: &str) -> (String, Vec<u8>) {
    let s = format!(
        "i=1; while [ $i -le {lines} ]; do echo line $i; i=$((i+1)); sleep {pause}; done; exit 3"
    );
    let want: String = (1..=lines).map(|i| format!("line {i}\n")).collect();
    (s, want.into_bytes())
}

async fn wait_exit(rig: &Rig, p: &mut Proc, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", rig.logs());
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_at_each_crash_point_is_finished_by_a_successor() {
    let rig = Rig::new("crash").await;
    // The points of the page protocol; `after_send` is reached only with
    // input, in its own test.
    let points = lc_gateway::CrashPoint::ALL
        .into_iter()
        .filter(|p| *p != lc_gateway::CrashPoint::AfterSend);
    for (round, point) in points.enumerate() {
        let (s, want) = script(80, "0.01");
        let exec = rig.admit(&format!("e-{round}"), &s).await;
        let mut first = rig.gateway(&format!("first-{point}"), Some(point.as_str()), None);
        let status = wait_exit(&rig, &mut first, &format!("the gateway dies at {point}")).await;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: {status:?}");
        let log = std::fs::read_to_string(rig.log(&format!("first-{point}"))).unwrap();
        assert!(
            log.contains(&format!("fault injection: SIGKILL at {point}")),
            "{point}: {log}"
        );
        let _second = rig.gateway(&format!("second-{point}"), None, None);
        rig.wait_released(exec).await;
        let (stdout, exit) = rig.output(exec).await;
        assert_eq!(
            String::from_utf8(stdout).unwrap(),
            String::from_utf8(want).unwrap(),
            "{point}: the whole stdout, exactly"
        );
        assert_eq!(exit, Some(3), "{point}: the terminal page is acked");
        assert_eq!(
            rig.settled(exec).await,
            (
                ExecState::Terminal,
                Some(TerminalReason::Exited),
                Some(3),
                2,
                1
            ),
            "{point}: taken over once (generation 2), released once"
        );
        assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0), "{point}");
    }
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_sent_by_a_gateway_killed_before_its_receipt_reaches_the_command_once() {
    let rig = Rig::new("send").await;
    // Numbers each line it reads, so an input written twice would show.
    let script =
        "n=0; while IFS= read -r l; do n=$((n+1)); echo \"$n: $l\"; done; echo done; exit 5";
    let exec = rig.admit_with("e-send", script, true).await;
    assert_eq!(rig.send_input("in-1", exec, b"alpha\n", false).await, 1);
    assert_eq!(rig.send_input("in-2", exec, b"beta two\n", false).await, 2);
    assert_eq!(rig.send_input("in-3", exec, b"gamma\n", false).await, 3);
    let mut first = rig.gateway("first-send", Some("after_send"), None);
    let status = wait_exit(&rig, &mut first, "the gateway dies after its first send").await;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let log = std::fs::read_to_string(rig.log("first-send")).unwrap();
    assert!(
        log.contains("fault injection: SIGKILL at after_send"),
        "{log}"
    );
    let inputs = async || -> Vec<(i64, String, Option<String>)> {
        sqlx::query_as::<_, (i64, String, Option<String>)>(
            "SELECT input_seq, state, send_transition_id FROM lc_exec_inputs \
              WHERE exec_id = $1 ORDER BY input_seq",
        )
        .bind(exec.0)
        .fetch_all(rig.store.pool())
        .await
        .unwrap()
    };
    // Input 1 reached the supervisor, but its receipt never committed.
    assert_eq!(
        inputs().await,
        vec![
            (1, "queued".into(), None),
            (2, "queued".into(), None),
            (3, "queued".into(), None),
        ]
    );
    // More input while no gateway runs: the last closes stdin.
    assert_eq!(rig.send_input("in-4", exec, b"delta\n", true).await, 4);
    let port = free_port();
    let _second = rig.gateway("second-send", None, Some(port));
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        "1: alpha\n2: beta two\n3: gamma\n4: delta\ndone\n",
        "each input exactly once, in order"
    );
    assert_eq!(exit, Some(5), "the terminal page is acked");
    // The successor recorded every input under its own generation,
    // including the one its predecessor delivered.
    assert_eq!(
        inputs().await,
        (1..=4)
            .map(|n| (n, "sent".to_string(), Some(format!("send-1-{n}-g2"))))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        rig.scalar(
            "SELECT count(*) FROM lc_transitions WHERE exec_id = $1 AND kind = 'send'",
            exec
        )
        .await,
        4
    );
    assert_eq!(metric(port, "lc_gateway_inputs_sent_total").await, Some(4));
    assert_eq!(
        metric(port, "lc_gateway_input_bytes_sent_total").await,
        Some(6 + 9 + 6 + 6)
    );
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(5),
            2,
            1
        ),
        "taken over once (generation 2), released once"
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_to_a_command_that_ended_does_not_hold_its_release() {
    let rig = Rig::new("ended").await;
    let exec = rig.admit_with("e-ended", "echo bye; exit 4", true).await;
    let lease = rig
        .store
        .exec(rig.tenant, exec)
        .await
        .unwrap()
        .canonical
        .lease_id;
    let provider = HttpProvider::connect(&rig.provider_url).await.unwrap();
    // No gateway yet: the command runs, ends, and its pages wait in the
    // spool.
    rig.wait_for("the command ends", async || {
        provider
            .spool_status(lease, lc_core::Generation(1))
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s.command_exited && s.terminal_seq > 0)
    })
    .await;
    assert_eq!(rig.send_input("in-late", exec, b"late\n", false).await, 1);
    let port = free_port();
    let _gateway = rig.gateway("ended", None, Some(port));
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(stdout, b"bye\n");
    assert_eq!(exit, Some(4));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(4),
            1,
            1
        )
    );
    // The input was never written: it stays queued, without a receipt.
    assert_eq!(
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT state, send_transition_id FROM lc_exec_inputs WHERE exec_id = $1"
        )
        .bind(exec.0)
        .fetch_all(rig.store.pool())
        .await
        .unwrap(),
        vec![("queued".to_string(), None)]
    );
    assert_eq!(metric(port, "lc_gateway_inputs_sent_total").await, Some(0));
    // Refused once: the gateway stops offering input to a closed stdin.
    let log = std::fs::read_to_string(rig.log("ended")).unwrap();
    assert_eq!(
        log.matches("input_closed: the command's stdin is closed")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(metric(port, "lc_gateway_failures_total").await, Some(0));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

async fn stale_refused(port: u16) -> Option<u64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("lc_gateway_stale_refused_total "))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_gateway_is_refused_after_a_takeover_and_output_stays_exactly_once() {
    let rig = Rig::new("pause").await;
    let (s, want) = script(150, "0.02");
    let exec = rig.admit("e-pause", &s).await;
    let port = free_port();
    let first = rig.gateway("paused", None, Some(port));
    rig.wait_for("the first gateway acks pages", async || {
        rig.acked_pages(exec).await >= 5
    })
    .await;
    assert_eq!(stale_refused(port).await, Some(0));
    signal(&first, libc::SIGSTOP);
    let _second = rig.gateway("successor", None, None);
    rig.wait_released(exec).await;
    assert_eq!(rig.settled(exec).await.3, 2, "the successor took over");
    signal(&first, libc::SIGCONT);
    rig.wait_for("the resumed gateway is refused", async || {
        stale_refused(port).await == Some(1)
    })
    .await;
    let log = std::fs::read_to_string(rig.log("paused")).unwrap();
    assert_eq!(log.matches("stale_refused:").count(), 1, "{log}");
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap()
    );
    assert_eq!(exit, Some(3));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            2,
            1
        )
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    // The resumed gateway owns nothing and stays that way.
    assert_eq!(stale_refused(port).await, Some(1));
    drop(first);
    rig.finish().await;
}

/// A counter of the gateway's `/metrics` on `port`.
async fn metric(port: u16, name: &str) -> Option<u64> {
    metric_in(&scrape(port).await?, name)
}

/// The gateway's `/metrics` text, if it answers.
async fn scrape(port: u16) -> Option<String> {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// The value of the unlabelled sample `name` in a metrics text.
fn metric_in(text: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_cut_is_uncertain_a_dead_gateway_s_exec_is_not_taken_over() {
    let mut rig = Rig::new("uncertain").await;
    // Long enough to outlast the sampler's stop and the cut's turn to
    // uncertain (the sampling-gap bound, 2 s).
    let (s, want) = script(500, "0.01");
    let exec = rig.admit("e-uncertain", &s).await;
    let mut first = rig.gateway("before", None, None);
    rig.wait_for("the first gateway acks pages", async || {
        rig.acked_pages(exec).await >= 3
    })
    .await;
    // The sampler stops: the cut freezes and turns uncertain.
    rig.stop_sampler().await;
    rig.wait_for("an uncertain cut", async || {
        rig.clock.read().await.is_ok_and(|r| !r.is_certain())
    })
    .await;
    first.0.kill().unwrap();
    assert_eq!(first.0.wait().unwrap().signal(), Some(libc::SIGKILL));
    let port = free_port();
    let _second = rig.gateway("during", None, Some(port));
    // Fifty steps of the successor, every one on an uncertain cut: no
    // takeover, no release.
    rig.wait_for("fifty uncertain steps", async || {
        metric(port, "lc_gateway_steps_uncertain_total")
            .await
            .is_some_and(|n| n >= 50)
    })
    .await;
    // Both counters from one scrape, polled until no step is half counted
    // (a step bumps one, then the other); a certain step of the successor
    // would keep them apart for good and fail this wait.
    rig.wait_for(
        "every step of the successor read an uncertain cut",
        async || {
            let Some(text) = scrape(port).await else {
                return false;
            };
            let (all, uncertain) = (
                metric_in(&text, "lc_gateway_steps_total"),
                metric_in(&text, "lc_gateway_steps_uncertain_total"),
            );
            // A scrape may fall between the two increments of one step: they
            // differ by at most one then; a certain step would keep them apart
            // and time this wait out.
            all.is_some() && all == uncertain
        },
    )
    .await;
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_owned_execs").await, Some(0));
    let (_, _, _, generation, releases) = rig.settled(exec).await;
    assert_eq!((generation, releases), (1, 0));
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    // A new sampler: once the cut is certain again the successor takes the
    // exec over and finishes it, nothing lost.
    rig.start_sampler();
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap()
    );
    assert_eq!(exit, Some(3));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            2,
            1
        )
    );
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(1));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}
