//! The rig the little-compute process tests share: the `little-compute`
//! binary and the supervisor beside it, child processes stopped when
//! dropped, the in-process sampler, the store, a provider, a worker and
//! gateways started as real processes, the registrations every test
//! needs, and [`Plane`], one test's database, files and tenant with the
//! waits and readings its checks are made of.
//!
//! Every wait polls with a bound and fails saying what it waited for.

// Each test binary uses a part of the rig.
#![allow(dead_code)]

pub mod fake_clock;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_blob::{BlobStore as _, LocalBlobStore};
use lc_core::owner::StoredPage;
use lc_core::store::ControlStore;
use lc_core::{
    CutReading, Digest, ExecId, ExecRequest, ExecState, OperationKey, PageKind, TenantId,
    TerminalReason,
};
use lc_provider::{HttpProvider, Provider};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use tokio::sync::watch;

/// The sampling-gap bound of the sampler, the gateways, the worker and
/// the tests' clock: a reading older than this is stale.
pub const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
/// [`GAP_MAX`] as the processes' `--safetime-gap-max-ms` takes it.
pub const GAP_MAX_MS: &str = "2000";
/// 64 hex digits: the server secret file's text, whose bytes are the key.
pub const SECRET_TEXT: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
/// Pause between two polls of a [`Plane`] wait.
pub const POLL: Duration = Duration::from_millis(20);
/// The most pages one `output` call of the store returns here.
const PAGES_PER_CALL: usize = 1000;

/// The `little-compute` binary under test.
pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_little-compute"))
}

/// Builds `lc-supervisor` fresh (once per process) beside the
/// `little-compute` binary, where the provider looks for it.
pub fn ensure_supervisor() {
    let built = tollgate_pg_harness::cargo_built("lc-supervisor", &["-p", "lc-supervisor"]);
    assert_eq!(built.parent(), exe().parent());
}

/// A child process, killed (SIGKILL, which ends a stopped process too) and
/// reaped when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends signal `sig` to `p`.
pub fn signal(p: &Proc, sig: i32) {
    let pid = i32::try_from(p.0.id()).unwrap();
    // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `path` opened for appending, created when missing.
pub fn append(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

/// The empty directory `/tmp/<stem>-<pid>` (whatever stood there removed).
pub fn fresh_dir(stem: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/{stem}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes the secret file `dir/secret` ([`SECRET_TEXT`] and a newline);
/// returns its path.
pub fn write_secret(dir: &Path) -> PathBuf {
    let secret = dir.join("secret");
    std::fs::write(&secret, format!("{SECRET_TEXT}\n")).unwrap();
    secret
}

/// Removes the provider's cgroup `parent` under each controller (an error,
/// such as a parent still holding children, is ignored).
pub fn remove_cgroup_parent(parent: &str) {
    for c in ["memory", "pids", "cpu", "cpuacct"] {
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(parent));
    }
}

/// The in-process sampler's options: 50 ms interval, [`GAP_MAX`], a
/// 500 ms round-trip bound, 3 stable observations, a 200 ms recovery
/// grace.
pub fn sampler_options() -> SamplerOptions {
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

/// Starts a sampler on `url` in this process (a new epoch); returns the
/// sender that stops it (send `true`) and its task.
pub fn start_sampler(url: &str) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let sampler = Sampler::new(url, sampler_options()).unwrap();
    let (stop, rx) = watch::channel(false);
    (stop, tokio::spawn(async move { sampler.run(rx).await }))
}

/// The store's configuration in these tests: four connections, the rest
/// the defaults.
pub fn store_config() -> lc_pg::LcConfig {
    lc_pg::LcConfig {
        max_connections: 4,
        ..lc_pg::LcConfig::default()
    }
}

/// The store on `url` with a 1 h grant bound, a 5 s grant minimum and the
/// key of [`SECRET_TEXT`].
pub async fn connect_store(url: &str, config: lc_pg::LcConfig) -> lc_pg::LcStore {
    lc_pg::LcStore::connect(
        url,
        tollgate::GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5))
            .unwrap(),
        tollgate::CapabilityKey::new(SECRET_TEXT.as_bytes()).unwrap(),
        config,
    )
    .await
    .unwrap()
}

/// Polls `clock` every `poll` until it reads certain; fails after
/// `wait_max`.
pub async fn wait_certain(clock: &SafeCutClock, wait_max: Duration, poll: Duration) {
    let deadline = Instant::now() + wait_max;
    while !clock.read().await.is_ok_and(|r| r.is_certain()) {
        assert!(Instant::now() < deadline, "no certain cut");
        tokio::time::sleep(poll).await;
    }
}

/// One reading of `clock` as the store takes it, certain or not.
pub async fn reading(clock: &SafeCutClock) -> CutReading {
    let r = clock.read().await.unwrap();
    CutReading {
        cut: r.now,
        certain: r.is_certain(),
        retry_after_s: 1,
    }
}

/// Starts `little-compute provider` with id `local` on `127.0.0.1:port`,
/// its state in `dir/provider`, its instances under `cgroup_parent`, its
/// stderr appended to `dir/log_name`.
pub fn spawn_provider(port: u16, dir: &Path, cgroup_parent: &str, log_name: &str) -> Proc {
    Proc(
        Command::new(exe())
            .args(["provider", "--id", "local", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--state-dir")
            .arg(dir.join("provider"))
            .args(["--cgroup-parent", cgroup_parent])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(append(&dir.join(log_name)))
            .spawn()
            .unwrap(),
    )
}

/// Connects to the provider at `url`, retrying every 100 ms until it
/// answers; fails after `wait_max`.
pub async fn connect_provider(url: &str, wait_max: Duration) -> HttpProvider {
    let deadline = Instant::now() + wait_max;
    loop {
        match HttpProvider::connect(url).await {
            Ok(p) => return p,
            Err(e) => {
                assert!(Instant::now() < deadline, "provider: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Registers, at the reading `at`, the runtime `base`, the provider `http`
/// at `provider_url` (admission names it) and the tenant `blue` with
/// `units` units; returns the tenant.
pub async fn register_base_provider_and_tenant(
    store: &lc_pg::LcStore,
    at: CutReading,
    http: &HttpProvider,
    provider_url: &str,
    units: i64,
) -> TenantId {
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
            .register_provider(http.id(), provider_url, http.public_key().to_bytes())
            .await
            .unwrap();
    }
    store
        .create_tenant(
            &OperationKey::new("t", Digest([2; 32])).unwrap(),
            at,
            "blue",
            Some(units),
            &|id| Digest::of(format!("k{}", id.0).as_bytes()),
        )
        .await
        .unwrap()
        .tenant_id
}

/// Starts `little-compute worker` for the provider at `provider_url`
/// (20 ms interval, [`GAP_MAX_MS`]), its stderr appended to `log`.
pub fn spawn_worker(url: &str, secret: &Path, provider_url: &str, log: &Path) -> Proc {
    Proc(
        Command::new(exe())
            .args(["worker", "--provider-url", provider_url])
            .args(["--interval-ms", "20"])
            .arg("--secret-file")
            .arg(secret)
            .args(["--safetime-gap-max-ms", GAP_MAX_MS])
            .env("LC_DATABASE_URL", url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(append(log))
            .spawn()
            .unwrap(),
    )
}

/// What a `little-compute gateway` process is started with.
pub struct GatewayArgs<'a> {
    /// The database URL (`LC_DATABASE_URL`).
    pub url: &'a str,
    /// `--secret-file`.
    pub secret: &'a Path,
    /// `--blob-dir`: the sink its output pages go to.
    pub blob_dir: &'a Path,
    /// The file its stderr is appended to.
    pub log: PathBuf,
    /// `--heartbeat-ttl-ms`; the gateway's default when `None`.
    pub heartbeat_ttl_ms: Option<&'a str>,
    /// `LC_GATEWAY_CRASH_AT`; unset when `None`.
    pub crash_at: Option<&'a str>,
    /// The port of `--metrics-listen` on 127.0.0.1; no metrics when `None`.
    pub metrics_port: Option<u16>,
}

/// Starts `little-compute gateway` (20 ms interval, [`GAP_MAX_MS`]) with
/// `args`.
pub fn spawn_gateway(args: &GatewayArgs<'_>) -> Proc {
    let mut cmd = Command::new(exe());
    cmd.args(["gateway", "--interval-ms", "20"]);
    if let Some(ttl_ms) = args.heartbeat_ttl_ms {
        cmd.args(["--heartbeat-ttl-ms", ttl_ms]);
    }
    cmd.args(["--safetime-gap-max-ms", GAP_MAX_MS])
        .arg("--secret-file")
        .arg(args.secret)
        .arg("--blob-dir")
        .arg(args.blob_dir)
        .env("LC_DATABASE_URL", args.url)
        .env_remove("LC_GATEWAY_CRASH_AT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(append(&args.log));
    if let Some(p) = args.crash_at {
        cmd.env("LC_GATEWAY_CRASH_AT", p);
    }
    if let Some(port) = args.metrics_port {
        cmd.arg("--metrics-listen").arg(format!("127.0.0.1:{port}"));
    }
    Proc(cmd.spawn().unwrap())
}

/// `lines` lines `line N`, a pause of `pause` seconds (as `sleep` takes
/// it) after each so the output spans many pages, then exit 3; and the
/// stdout it writes.
pub fn script(lines: usize, pause: &str) -> (String, Vec<u8>) {
    let s = format!(
        "i=1; while [ $i -le {lines} ]; do echo line $i; i=$((i+1)); sleep {pause}; done; exit 3"
    );
    let want: String = (1..=lines).map(|i| format!("line {i}\n")).collect();
    (s, want.into_bytes())
}

/// `sh -c script` in runtime `base`, shape `small`, no timeout, its stdin
/// open for input when `stdin_open`.
pub fn sh_request(script: &str, stdin_open: bool) -> ExecRequest {
    ExecRequest {
        runtime: "base".into(),
        shape: "small".into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        timeout_ms: None,
        stdin_open,
        idle_ttl_ms: None,
        on_timeout: lc_core::OnTimeout::Terminate,
    }
}

/// Every stored page of `exec`, in seq order, read in calls of at most
/// [`PAGES_PER_CALL`].
pub async fn all_pages(store: &lc_pg::LcStore, tenant: TenantId, exec: ExecId) -> Vec<StoredPage> {
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let got = store
            .output(tenant, exec, after, PAGES_PER_CALL)
            .await
            .unwrap();
        let Some(last) = got.last() else { break };
        after = last.meta.seq;
        pages.extend(got);
    }
    pages
}

/// A page's bytes: the store's, else the sink's under its digest.
pub fn page_bytes(sink: &LocalBlobStore, p: &StoredPage) -> Vec<u8> {
    match &p.bytes {
        Some(b) => b.clone(),
        None => sink.get(&p.meta.sha256).unwrap().expect("the page's blob"),
    }
}

/// Asserts that Tollgate's audit of `store` is clean with `units`
/// deposited, nothing held and nothing consumed.
pub async fn assert_audit_clean(store: &lc_pg::LcStore, units: i64) {
    use tollgate::Allocator as _;
    let audit = store.tollgate().audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_held,
            audit.total_consumed
        ),
        (i128::from(units), 0, 0)
    );
}

/// The gateway's `/metrics` text on `port`, if it answers.
pub async fn scrape(port: u16) -> Option<String> {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// The value of the unlabelled sample `name` in a metrics text.
pub fn metric_in(text: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.parse().ok())
}

/// A counter or gauge of the gateway's `/metrics` on `port`.
pub async fn metric(port: u16, name: &str) -> Option<u64> {
    metric_in(&scrape(port).await?, name)
}

/// Every sample of the gateway's `/metrics` on `port`, from one scrape.
pub async fn metrics(port: u16) -> Option<BTreeMap<String, u64>> {
    let text = scrape(port).await?;
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

/// A started control plane without a worker or gateway: a fresh migrated
/// database, the in-process sampler (its cut certain), the store and its
/// clock, the provider process, and the base runtime, that provider and a
/// tenant of `units` registered.
pub struct Started {
    pub db: tollgate_pg_harness::TestDb,
    pub plane: Plane,
    pub clock: SafeCutClock,
    pub sampler_stop: watch::Sender<bool>,
    pub sampler: tokio::task::JoinHandle<()>,
    pub provider: Proc,
    pub provider_port: u16,
}

/// Starts a [`Started`] whose files live in a fresh `/tmp/lc-<stem>-*`
/// and whose instances go under the cgroup parent
/// `little-compute-<stem>-<pid>`; every wait is bounded by `wait_max`.
pub async fn start_plane(stem: &str, units: i64, wait_max: Duration) -> Started {
    ensure_supervisor();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let (sampler_stop, sampler) = start_sampler(&url);
    let store = connect_store(&url, store_config()).await;
    let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
    wait_certain(&clock, wait_max, POLL).await;
    let dir = fresh_dir(&format!("lc-{stem}"));
    let secret = write_secret(&dir);
    let provider_port = free_port();
    let provider_url = format!("http://127.0.0.1:{provider_port}");
    let cgroup_parent = format!("little-compute-{stem}-{}", std::process::id());
    let provider = spawn_provider(provider_port, &dir, &cgroup_parent, "provider.log");
    let http = connect_provider(&provider_url, wait_max).await;
    let at = reading(&clock).await;
    let tenant = register_base_provider_and_tenant(&store, at, &http, &provider_url, units).await;
    let blob_dir = dir.join("blobs");
    Started {
        db,
        plane: Plane {
            url,
            store,
            dir,
            secret,
            blob_dir,
            provider_url,
            cgroup_parent,
            tenant,
            wait_max,
        },
        clock,
        sampler_stop,
        sampler,
        provider,
        provider_port,
    }
}

/// One test's control plane: its migrated database's URL, the store, its
/// files (`dir`, holding the secret, the sink and the processes' logs),
/// the provider's URL and cgroup parent, the tenant, and how long its
/// waits poll.
pub struct Plane {
    /// The migrated database's URL.
    pub url: String,
    pub store: lc_pg::LcStore,
    /// The test's directory: the secret, the sink, the provider's state,
    /// the processes' `*.log`.
    pub dir: PathBuf,
    /// The secret file, [`SECRET_TEXT`].
    pub secret: PathBuf,
    /// The gateways' sink, `dir/blobs`.
    pub blob_dir: PathBuf,
    /// `http://127.0.0.1:<port>` of the provider process.
    pub provider_url: String,
    /// The cgroup the provider puts its instances under.
    pub cgroup_parent: String,
    /// The test's tenant.
    pub tenant: TenantId,
    /// The longest any wait of [`Plane::wait_for`] polls for.
    pub wait_max: Duration,
}

impl Plane {
    /// The log file of the process called `name`.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// Every `*.log` of `dir`, each under a `====` line naming it.
    pub fn logs(&self) -> String {
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

    /// A gateway's arguments on this plane, its log `name.log`, every
    /// option at its default.
    pub fn gateway_args(&self, name: &str) -> GatewayArgs<'_> {
        GatewayArgs {
            url: &self.url,
            secret: &self.secret,
            blob_dir: &self.blob_dir,
            log: self.log(name),
            heartbeat_ttl_ms: None,
            crash_at: None,
            metrics_port: None,
        }
    }

    /// Polls `done` every [`POLL`] until it holds; fails saying `what`,
    /// with the logs, after `wait_max`.
    pub async fn wait_for(&self, what: &str, mut done: impl AsyncFnMut() -> bool) {
        let deadline = Instant::now() + self.wait_max;
        while !done().await {
            assert!(Instant::now() < deadline, "{what}:\n{}", self.logs());
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `exec` is terminal and the tenant holds nothing.
    pub async fn wait_released(&self, exec: ExecId) {
        self.wait_for("the exec is released", async || {
            let t = self.store.tenant(self.tenant).await.unwrap();
            let e = self.store.exec(self.tenant, exec).await.unwrap();
            t.held == 0 && e.state == ExecState::Terminal
        })
        .await;
    }

    /// Waits until one scrape of the gateway on `port` shows its steps
    /// equal to its uncertain steps: no step of it read a certain cut. (A
    /// step bumps one counter, then the other, so a scrape between the two
    /// shows them one apart; a step on a certain cut would keep them apart
    /// for good and time this wait out.)
    pub async fn every_step_uncertain(&self, port: u16) {
        self.wait_for(
            "every step of the successor read an uncertain cut",
            async || {
                let Some(text) = scrape(port).await else {
                    return false;
                };
                let all = metric_in(&text, "lc_gateway_steps_total");
                all.is_some() && all == metric_in(&text, "lc_gateway_steps_uncertain_total")
            },
        )
        .await;
    }

    /// Admits `sh -c script` for the tenant under `key` at the reading
    /// `at`, its stdin open for input when `stdin_open`.
    pub async fn admit(&self, key: &str, at: CutReading, script: &str, stdin_open: bool) -> ExecId {
        self.store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                at,
                self.tenant,
                &sh_request(script, stdin_open),
            )
            .await
            .unwrap()
            .exec_id
    }

    /// The one `i64` that `sql`, with `exec` bound to `$1`, selects.
    pub async fn scalar(&self, sql: &str, exec: ExecId) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(exec.0)
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    /// Acked pages of `exec` so far.
    pub async fn acked_pages(&self, exec: ExecId) -> i64 {
        self.scalar(
            "SELECT count(*) FROM lc_output_pages WHERE exec_id = $1 AND state = 'acked'",
            exec,
        )
        .await
    }

    /// Release receipts of `exec`.
    pub async fn releases(&self, exec: ExecId) -> i64 {
        self.scalar(
            "SELECT count(*) FROM lc_transitions WHERE exec_id = $1 AND kind = 'release'",
            exec,
        )
        .await
    }

    /// The exec's end as the store records it, its owner generation, and
    /// its release receipts.
    pub async fn settled(
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
        let releases = self.releases(exec).await;
        (
            e.state,
            e.terminal_reason,
            e.exit_code,
            generation,
            releases,
        )
    }

    /// The exec's stdout from its acked pages (each page's bytes from the
    /// store or the sink, each checked against its SHA-256 and length), and
    /// the terminal page's exit code; asserts the seqs are 1..=n once each
    /// and the terminal page is the last.
    pub async fn output(&self, exec: ExecId) -> (Vec<u8>, Option<i32>) {
        let sink = LocalBlobStore::open(&self.blob_dir).unwrap();
        let pages = all_pages(&self.store, self.tenant, exec).await;
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
            let bytes = page_bytes(&sink, p);
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

    /// The tenant's deposited, available, held and consumed units.
    pub async fn balance(&self) -> (i64, i64, i64, i64) {
        let t = self.store.tenant(self.tenant).await.unwrap();
        (t.deposited, t.available, t.held, t.consumed)
    }
}
