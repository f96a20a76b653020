//! The exec gateway while the time authority misbehaves, on real
//! processes: a PostgreSQL server on a fake wall clock (libfaketime, one
//! server for this test binary, its clock stepped while it runs), a real
//! `tollgate-safetime run` sampler process, a real `little-compute
//! provider`, a real `little-compute worker` and real `little-compute
//! gateway` processes, while an exec streams output.
//!
//! * **A forward and a backward step of the database's wall clock.** The
//!   sampler sees the step and publishes the cut uncertain for its
//!   recovery grace. While uncertain the owner keeps serving (its pages are
//!   still acked); the owner is then killed (SIGKILL) and a successor
//!   started: though the uncertain cut passes the dead owner's heartbeat
//!   expiry, every step of the successor reads an uncertain cut and it
//!   takes nothing over (owner generation, fence and basis unchanged in the
//!   database), and no Lease is released. Once the cut is certain again the
//!   successor takes the exec over (generation 2) and finishes it, keeping
//!   its ownership while it works off the backlog (never refused stale):
//!   the whole stdout exactly once, the terminal page acked, the Lease
//!   released once, the tenant's unit back once.
//! * **A paused sampler.** The sampler process is stopped (SIGSTOP) past
//!   its staleness bound: every reading is `stale`. The owner keeps
//!   serving, as the ownership rules say (a heartbeat renews to
//!   `max(current, cut + ttl)` on any cut; a fenced page write needs the
//!   current, unreleased owner not expired on a certain cut, so an
//!   uncertain cut expires nobody): its heartbeat reaches exactly the frozen
//!   cut plus the TTL, and it stages and acks every remaining page, the
//!   terminal page included. It does not release the Lease (a release
//!   needs a certain cut), and a successor started meanwhile takes nothing
//!   over. After SIGCONT, once the cut is certain, the same owner (still
//!   generation 1) releases the Lease once; the output is exactly once.
//!
//! Every wait polls the database, the clock or a gateway's `/metrics` with
//! a bound; nothing is timed. Every reading of the cut this test takes
//! checks that the cut never went backward.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clock::safe_cut::SafeCutClock;
use clock::{Clock, ClockReading, UncertainReason};
use jiff::{SignedDuration, Timestamp};
use lc_blob::BlobStore as _;
use lc_core::store::ControlStore;
use lc_core::{
    CutReading, Digest, ExecId, ExecRequest, ExecState, LeaseState, OperationKey, PageKind,
    TenantId, TerminalReason,
};
use lc_provider::{HttpProvider, Provider};
use tollgate_pg_harness::PgServer;

/// The sampling-gap bound of the sampler, the gateways, the worker and
/// this test's clock: a reading older than this is stale.
const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
const GAP_MAX_MS: &str = "2000";
/// 64 hex digits: the server secret file's text, whose bytes are the key.
const SECRET_TEXT: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
/// The gateways' heartbeat TTL: the shortest accepted, so a certain cut
/// would pass a dead owner's heartbeat within about a second.
const HEARTBEAT_TTL: SignedDuration = SignedDuration::from_secs(1);
const HEARTBEAT_TTL_MS: &str = "1000";
/// Units of the tenant (one exec of shape `small` holds one).
const UNITS: i64 = 2;
/// The longest any wait of these tests polls for.
const WAIT_MAX: Duration = Duration::from_secs(120);
/// Pause between two polls.
const POLL: Duration = Duration::from_millis(20);
/// The sampler's recovery grace in the clock-step scenarios: how long the
/// cut stays uncertain after a step. Long enough for the owner to ack on
/// the uncertain cut, its death, a successor's start, the uncertain cut
/// passing the dead owner's heartbeat expiry (after a backward step the
/// cut stands until database time passes it again) and
/// [`SUCCESSOR_STEPS`] of the successor's steps, all inside it; a test
/// whose checks end after the cut turned certain again fails saying so.
const STEP_RECOVERY_GRACE: &str = "12s";
/// The recovery grace in the paused-sampler scenario, where the test
/// itself decides how long the cut stays uncertain.
const PAUSE_RECOVERY_GRACE: &str = "500ms";
/// Steps of the successor, each on an uncertain cut past the dead owner's
/// heartbeat expiry, before the test checks that it took nothing over.
const SUCCESSOR_STEPS: u64 = 25;
/// The size of the forward step of the database's wall clock, ns.
const FORWARD_STEP_NS: i64 = 120 * 1_000_000_000;
/// The size of the backward step, ns (the cut stands this long).
const BACKWARD_STEP_NS: i64 = -2 * 1_000_000_000;

/// The one PostgreSQL server on a fake clock of this test binary. The tests
/// take turns (a step of its clock is every database's), each on a fresh
/// database of its own; the harness stops the server when the binary
/// exits.
static SERVER: tokio::sync::Mutex<Option<PgServer>> = tokio::sync::Mutex::const_new(None);

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_little-compute"))
}

/// The supervisor and the sampler are other packages' binaries, found
/// beside `little-compute`; built when missing.
fn ensure_sibling_binaries() {
    let dir = exe().parent().unwrap().to_path_buf();
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
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    assert!(cmd.status().unwrap().success(), "building {missing:?}");
    for b in &missing {
        assert!(
            dir.join(b).is_file(),
            "{b} not built into {}",
            dir.display()
        );
    }
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(p: &Proc, sig: i32) {
    let pid = i32::try_from(p.0.id()).unwrap();
    // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
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

/// A counter or gauge of the gateway's `/metrics` on `port`.
async fn metric(port: u16, name: &str) -> Option<u64> {
    metrics(port).await?.get(name).copied()
}

/// Every series of the gateway's `/metrics` on `port`, from one scrape.
async fn metrics(port: u16) -> Option<std::collections::BTreeMap<String, u64>> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

/// Waits for one scrape of the gateway on `port` in which its steps equal
/// its uncertain steps: no step of it read a certain cut. (The two counters
/// are bumped one after the other, so a scrape between the two bumps shows
/// one more step; a step on a certain cut would show it in every scrape.)
async fn every_step_uncertain(rig: &Rig, port: u16) {
    rig.wait_for(
        "every step of the successor read an uncertain cut",
        async || {
            metrics(port).await.is_some_and(|m| {
                m.get("lc_gateway_steps_total") == m.get("lc_gateway_steps_uncertain_total")
            })
        },
    )
    .await;
}

/// `lines` lines `line N`, a 10 ms pause after each so the output spans
/// many pages and the command runs at least `lines * 10 ms`, then exit 3.
fn script(lines: usize) -> (String, Vec<u8>) {
    let s = format!(
        "i=1; while [ $i -le {lines} ]; do echo line $i; i=$((i+1)); sleep 0.01; done; exit 3"
    );
    let want: String = (1..=lines).map(|i| format!("line {i}\n")).collect();
    (s, want.into_bytes())
}

/// An exec's ownership row: generation, fence, released, basis, and the
/// heartbeat expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnerRow {
    generation: i64,
    fence: i64,
    released: bool,
    basis: String,
    heartbeat_expiry: Timestamp,
}

struct Rig {
    server: tokio::sync::MutexGuard<'static, Option<PgServer>>,
    url: String,
    store: lc_pg::LcStore,
    clock: SafeCutClock,
    /// The latest cut this test read: no later read may be earlier.
    last_cut: std::sync::Mutex<Option<Timestamp>>,
    dir: PathBuf,
    secret: PathBuf,
    blob_dir: PathBuf,
    cgroup_parent: String,
    tenant: TenantId,
    sampler: Option<Proc>,
    worker: Option<Proc>,
    provider: Option<Proc>,
}

impl Rig {
    /// The server (started on first use), a fresh migrated database, a
    /// sampler process with `recovery_grace`, a certain cut, the provider,
    /// the runtime `base`, a tenant with [`UNITS`] units and the worker.
    async fn new(name: &str, recovery_grace: &str) -> Rig {
        ensure_sibling_binaries();
        let mut server = SERVER.lock().await;
        if server.is_none() {
            let started = tokio::task::spawn_blocking(PgServer::start_dedicated_faketime)
                .await
                .unwrap()
                .expect("start PostgreSQL on a fake clock");
            *server = Some(started);
        }
        let db = server.as_ref().unwrap().fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.unwrap();
        let dir = PathBuf::from(format!("/tmp/lcgc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sampler = Proc(
            Command::new(exe().parent().unwrap().join("tollgate-safetime"))
                .arg("run")
                .args(["--interval", "50ms", "--gap-max", "2s"])
                .args(["--round-trip-max", "500ms", "--stable-observations", "3"])
                .args(["--recovery-grace", recovery_grace])
                .args(["--standby-poll", "100ms"])
                .env("TOLLGATE_DATABASE_URL", &url)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(append(&dir.join("sampler.log")))
                .spawn()
                .unwrap(),
        );
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
        let secret = dir.join("secret");
        std::fs::write(&secret, format!("{SECRET_TEXT}\n")).unwrap();
        let cgroup_parent = format!("lc-gwclock-{name}-{}", std::process::id());
        let mut rig = Rig {
            server,
            url,
            store,
            clock,
            last_cut: std::sync::Mutex::new(None),
            blob_dir: dir.join("blobs"),
            dir,
            secret,
            cgroup_parent,
            tenant: TenantId(0),
            sampler: Some(sampler),
            worker: None,
            provider: None,
        };
        rig.wait_for("a certain cut", async || {
            rig.read().await.uncertain.is_none()
        })
        .await;
        let port = free_port();
        let provider_url = format!("http://127.0.0.1:{port}");
        rig.provider = Some(Proc(
            Command::new(exe())
                .args(["provider", "--id", "local", "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .arg("--state-dir")
                .arg(rig.dir.join("provider"))
                .args(["--cgroup-parent", &rig.cgroup_parent])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(append(&rig.dir.join("provider.log")))
                .spawn()
                .unwrap(),
        ));
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
        let at = rig.certain().await;
        let base = lc_core::manifest::Manifest::base();
        rig.store
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
            rig.store
                .register_provider(http.id(), &provider_url, http.public_key().to_bytes())
                .await
                .unwrap();
        }
        rig.tenant = rig
            .store
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
        rig.worker = Some(Proc(
            Command::new(exe())
                .args(["worker", "--provider-url", &provider_url])
                .args(["--interval-ms", "20"])
                .arg("--secret-file")
                .arg(&rig.secret)
                .args(["--safetime-gap-max-ms", GAP_MAX_MS])
                .env("LC_DATABASE_URL", &rig.url)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(append(&rig.dir.join("worker.log")))
                .spawn()
                .unwrap(),
        ));
        rig
    }

    /// One reading of the clock; asserts that the cut did not go backward
    /// since the previous reading of this test.
    async fn read(&self) -> ClockReading {
        let r = self.clock.read().await.unwrap();
        let mut last = self.last_cut.lock().unwrap();
        if let Some(prev) = *last {
            assert!(
                r.now >= prev,
                "the cut went backward: {prev} then {}",
                r.now
            );
        }
        *last = Some(r.now);
        r
    }

    /// A certain reading as the store takes it.
    async fn certain(&self) -> CutReading {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let r = self.read().await;
            if r.uncertain.is_none() {
                return CutReading {
                    cut: r.now,
                    certain: true,
                    retry_after_s: 1,
                };
            }
            assert!(
                Instant::now() < deadline,
                "no certain cut:\n{}",
                self.logs()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Asserts that the clock reads uncertain now: what the test observed
    /// since the cut turned uncertain happened while it was.
    async fn assert_uncertain(&self, what: &str) {
        let r = self.read().await;
        assert!(
            r.uncertain.is_some(),
            "the cut turned certain again before {what} was checked (the recovery grace \
             {STEP_RECOVERY_GRACE} was too short for this machine): {r:?}"
        );
    }

    /// Waits for an uncertain reading for `reason`; returns it.
    async fn uncertain_for(&self, reason: UncertainReason) -> ClockReading {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let r = self.read().await;
            if r.uncertain == Some(reason) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no reading uncertain for {reason:?}; last {r:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Steps the database server's wall clock by `step_ns` from where it
    /// stands.
    fn step_clock(&mut self, step_ns: i64) {
        let server = self.server.as_mut().unwrap();
        let offset = server.clock_offset_ns().expect("a fake clock");
        server.set_clock_offset_ns(offset + step_ns).unwrap();
    }

    fn gateway(&self, name: &str, metrics_port: u16) -> Proc {
        let mut cmd = Command::new(exe());
        cmd.args(["gateway", "--interval-ms", "20"])
            .args(["--heartbeat-ttl-ms", HEARTBEAT_TTL_MS])
            .args(["--safetime-gap-max-ms", GAP_MAX_MS])
            .arg("--secret-file")
            .arg(&self.secret)
            .arg("--blob-dir")
            .arg(&self.blob_dir)
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .env("LC_DATABASE_URL", &self.url)
            .env_remove("LC_GATEWAY_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(append(&self.dir.join(format!("{name}.log"))));
        Proc(cmd.spawn().unwrap())
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
        self.store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                self.certain().await,
                self.tenant,
                &ExecRequest {
                    runtime: "base".into(),
                    shape: "small".into(),
                    command: vec!["sh".into(), "-c".into(), script.into()],
                    timeout_ms: None,
                    stdin_open: false,
                },
            )
            .await
            .unwrap()
            .exec_id
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

    /// Acked terminal pages of `exec` (0 or 1).
    async fn terminal_acked(&self, exec: ExecId) -> i64 {
        self.scalar(
            "SELECT count(*) FROM lc_output_pages \
              WHERE exec_id = $1 AND state = 'acked' AND kind = 'terminal'",
            exec,
        )
        .await
    }

    /// Release receipts of `exec`.
    async fn releases(&self, exec: ExecId) -> i64 {
        self.scalar(
            "SELECT count(*) FROM lc_transitions WHERE exec_id = $1 AND kind = 'release'",
            exec,
        )
        .await
    }

    async fn owner(&self, exec: ExecId) -> OwnerRow {
        let (generation, fence, released, basis, floor_us, submicro_ns): (
            i64,
            i64,
            bool,
            String,
            i64,
            i32,
        ) = sqlx::query_as(
            "SELECT generation, fence, released, basis, heartbeat_expiry_floor_us, \
                    heartbeat_expiry_submicro_ns \
               FROM lc_exec_owners WHERE exec_id = $1",
        )
        .bind(exec.0)
        .fetch_one(self.store.pool())
        .await
        .unwrap();
        OwnerRow {
            generation,
            fence,
            released,
            basis,
            heartbeat_expiry: Timestamp::from_nanosecond(
                i128::from(floor_us) * 1000 + i128::from(submicro_ns),
            )
            .unwrap(),
        }
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
    /// store or the sink, each checked against its SHA-256 and length), and
    /// the terminal page's exit code; asserts the seqs are 1..=n once each
    /// and the terminal page is the last.
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
        (
            e.state,
            e.terminal_reason,
            e.exit_code,
            self.owner(exec).await.generation,
            self.releases(exec).await,
        )
    }

    async fn lease_state(&self, exec: ExecId) -> LeaseState {
        self.store
            .exec(self.tenant, exec)
            .await
            .unwrap()
            .lease_state
    }

    async fn balance(&self) -> (i64, i64, i64, i64) {
        let t = self.store.tenant(self.tenant).await.unwrap();
        (t.deposited, t.available, t.held, t.consumed)
    }

    /// Asserts that Tollgate's audit is clean with every unit back, then
    /// removes the rig's files (dropping it stops its processes).
    async fn finish(self) {
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
        self.store.pool().close().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Rig {
    /// Stops the rig's processes and removes its cgroups, whether the test
    /// passed or not (a failed test keeps its logs in `dir`).
    fn drop(&mut self) {
        drop(self.worker.take());
        drop(self.provider.take());
        drop(self.sampler.take());
        for c in ["memory", "pids", "cpu"] {
            let parent = Path::new("/sys/fs/cgroup")
                .join(c)
                .join(&self.cgroup_parent);
            if let Ok(children) = std::fs::read_dir(&parent) {
                for child in children.flatten() {
                    if child.path().is_dir() {
                        let _ = std::fs::remove_dir(child.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(&parent);
        }
    }
}

/// A step of `step_ns` of the database's wall clock while an exec streams;
/// the sampler reports it as `reason`.
async fn a_clock_step(name: &str, step_ns: i64, reason: UncertainReason) {
    let mut rig = Rig::new(name, STEP_RECOVERY_GRACE).await;
    // At least 20 s of output: it outlasts the uncertain period.
    let (s, want) = script(2000);
    let exec = rig.admit(&format!("e-{name}"), &s).await;
    let first_port = free_port();
    let mut first = rig.gateway("first", first_port);
    rig.wait_for("the first gateway acks pages", async || {
        rig.acked_pages(exec).await >= 3
    })
    .await;
    let before = rig.owner(exec).await;
    assert_eq!(
        (before.generation, before.released, before.basis.as_str()),
        (1, false, "unowned")
    );

    rig.step_clock(step_ns);
    rig.uncertain_for(reason).await;
    // The owner keeps serving on the uncertain cut: more pages are acked.
    let acked = rig.acked_pages(exec).await;
    rig.wait_for("the owner acks a page on the uncertain cut", async || {
        rig.acked_pages(exec).await > acked
    })
    .await;
    rig.assert_uncertain("the owner's acks").await;
    assert_eq!(
        metric(first_port, "lc_gateway_stale_refused_total").await,
        Some(0)
    );

    first.0.kill().unwrap();
    assert_eq!(first.0.wait().unwrap().signal(), Some(libc::SIGKILL));
    let dead = rig.owner(exec).await;
    assert_eq!(
        (dead.generation, dead.fence, dead.released),
        (1, before.fence, false)
    );
    assert!(dead.heartbeat_expiry >= before.heartbeat_expiry);
    let port = free_port();
    let _second = rig.gateway("second", port);
    // The uncertain cut passes the dead owner's heartbeat expiry: on a
    // certain cut that would allow a takeover.
    rig.wait_for(
        "an uncertain cut past the dead owner's heartbeat expiry",
        async || {
            let r = rig.read().await;
            assert!(
                r.uncertain.is_some(),
                "the cut turned certain before it passed the dead owner's heartbeat \
                 expiry {} (recovery grace {STEP_RECOVERY_GRACE}): {r:?}",
                dead.heartbeat_expiry
            );
            r.now >= dead.heartbeat_expiry
        },
    )
    .await;
    let mut steps_then = None;
    rig.wait_for("the successor's metrics", async || {
        steps_then = metric(port, "lc_gateway_steps_uncertain_total").await;
        steps_then.is_some()
    })
    .await;
    let steps_then = steps_then.unwrap();
    rig.wait_for("the successor steps on the uncertain cut", async || {
        metric(port, "lc_gateway_steps_uncertain_total")
            .await
            .is_some_and(|n| n >= steps_then + SUCCESSOR_STEPS)
    })
    .await;
    every_step_uncertain(&rig, port).await;
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_claims_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_owned_execs").await, Some(0));
    assert_eq!(
        rig.owner(exec).await,
        dead,
        "no takeover, no heartbeat: the ownership row is the dead owner's"
    );
    assert_eq!(rig.releases(exec).await, 0);
    assert_eq!(rig.lease_state(exec).await, LeaseState::Active);
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    rig.assert_uncertain("the successor's refusal to take over")
        .await;

    // Certain again: the successor takes over once and finishes.
    rig.certain().await;
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap(),
        "the whole stdout, exactly once"
    );
    assert_eq!(exit, Some(3), "the terminal page is acked");
    let successor = metrics(port).await.unwrap_or_default();
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            2,
            1
        ),
        "taken over once (generation 2), released once; the successor's takeovers {:?}, \
         stale_refused {:?}",
        successor.get("lc_gateway_takeovers_total"),
        successor.get("lc_gateway_stale_refused_total"),
    );
    assert_eq!(
        successor.get("lc_gateway_stale_refused_total"),
        Some(&0),
        "the successor never lost its own ownership"
    );
    let after = rig.owner(exec).await;
    assert_eq!((after.released, after.basis.as_str()), (true, "expired"));
    assert!(after.fence > dead.fence, "{} > {}", after.fence, dead.fence);
    assert_eq!(rig.terminal_acked(exec).await, 1);
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(1));
    assert_eq!(metric(port, "lc_gateway_releases_total").await, Some(1));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_clock_step_takes_nothing_over_and_releases_nothing_while_uncertain() {
    a_clock_step("fwd", FORWARD_STEP_NS, UncertainReason::ClockStepForward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_clock_step_takes_nothing_over_and_releases_nothing_while_uncertain() {
    a_clock_step("bwd", BACKWARD_STEP_NS, UncertainReason::ClockStepBackward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sampler_keeps_the_owner_serving_and_releases_only_on_a_certain_cut() {
    let rig = Rig::new("pause", PAUSE_RECOVERY_GRACE).await;
    // At least 6 s of output: it is still streaming when the readings turn
    // stale (the 2 s gap bound after the pause).
    let (s, want) = script(600);
    let exec = rig.admit("e-paused", &s).await;
    let first_port = free_port();
    let _first = rig.gateway("owner", first_port);
    rig.wait_for("the owner acks pages", async || {
        rig.acked_pages(exec).await >= 3
    })
    .await;
    let before = rig.owner(exec).await;
    assert_eq!((before.generation, before.basis.as_str()), (1, "unowned"));

    let sampler = rig.sampler.as_ref().unwrap();
    signal(sampler, libc::SIGSTOP);
    let frozen = rig.uncertain_for(UncertainReason::Stale).await;
    let acked_at_stale = rig.acked_pages(exec).await;
    assert_eq!(rig.terminal_acked(exec).await, 0, "the command still runs");
    // The owner's heartbeat renews on the frozen cut: exactly its cut plus
    // the TTL, and there it stays.
    rig.wait_for("the owner heartbeats on the frozen cut", async || {
        rig.owner(exec).await.heartbeat_expiry == frozen.now + HEARTBEAT_TTL
    })
    .await;
    let port = free_port();
    let _second = rig.gateway("successor", port);
    // The owner stages and acks every remaining page while the sampler is
    // stopped, the terminal page included.
    rig.wait_for("the terminal page acked on the stale cut", async || {
        rig.terminal_acked(exec).await == 1
    })
    .await;
    assert!(rig.acked_pages(exec).await > acked_at_stale);
    rig.wait_for("the successor steps on the stale cut", async || {
        metric(port, "lc_gateway_steps_uncertain_total")
            .await
            .is_some_and(|n| n >= SUCCESSOR_STEPS)
    })
    .await;
    // The Lease is not released while the readings are stale, though its
    // terminal page is acked and its owner is alive.
    assert_eq!(rig.releases(exec).await, 0);
    assert_eq!(rig.lease_state(exec).await, LeaseState::Active);
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    assert_eq!(
        metric(first_port, "lc_gateway_releases_total").await,
        Some(0)
    );
    assert_eq!(metric(first_port, "lc_gateway_owned_execs").await, Some(1));
    assert_eq!(
        metric(first_port, "lc_gateway_stale_refused_total").await,
        Some(0)
    );
    every_step_uncertain(&rig, port).await;
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_claims_total").await, Some(0));
    assert_eq!(
        rig.owner(exec).await,
        with_heartbeat(&before, frozen.now + HEARTBEAT_TTL),
        "the same ownership, its heartbeat at the frozen cut plus the TTL"
    );
    let r = rig.read().await;
    assert_eq!(
        (r.now, r.uncertain),
        (frozen.now, Some(UncertainReason::Stale)),
        "the cut stayed frozen and stale"
    );

    // The sampler resumes: once the cut is certain the same owner releases.
    signal(sampler, libc::SIGCONT);
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap(),
        "the whole stdout, exactly once"
    );
    assert_eq!(exit, Some(3));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            1,
            1
        ),
        "never taken over (generation 1), released once"
    );
    let after = rig.owner(exec).await;
    assert_eq!(
        (after.fence, after.released, after.basis.as_str()),
        (before.fence, true, "unowned")
    );
    assert_eq!(
        metric(first_port, "lc_gateway_releases_total").await,
        Some(1)
    );
    assert_eq!(
        metric(first_port, "lc_gateway_stale_refused_total").await,
        Some(0)
    );
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_claims_total").await, Some(0));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

/// `o` with its heartbeat expiry at `expiry`.
fn with_heartbeat(o: &OwnerRow, expiry: Timestamp) -> OwnerRow {
    OwnerRow {
        heartbeat_expiry: expiry,
        ..o.clone()
    }
}
