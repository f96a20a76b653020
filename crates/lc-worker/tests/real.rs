//! The reconciler's step against the real parts: a fresh database per test
//! on the harness's one cluster (Tollgate and Little Compute migrated), a
//! real safe-time sampler publishing the cut in process, LcStore, and a real
//! bubblewrap provider running real commands, with an in-process exec
//! gateway (`lc-gateway`) beside the reconciler, since output and the
//! release of an exited exec are the gateway's. Time is never simulated: a
//! sampler stopped makes the cut stale (frozen and uncertain), a new
//! sampler with a long recovery grace makes it advance while uncertain
//! (`recovering`), and short Lease TTLs let a certain cut pass an expiry
//! within seconds.
//!
//! * A command runs to its terminal page: the gateway moves its output
//!   exactly once and in order and releases the Lease; the reconciler never
//!   begins that release itself, destroys the instance and returns the
//!   Reservation exactly once (exact balances, a clean Tollgate audit).
//! * An uncertain cut: the destroy is retried but nothing is released and
//!   no capacity returns; a Lease past its expiry is renewed, not expired,
//!   and a renewal never shortens it.
//! * A certain cut past the Lease's expiry releases it as `expired`.
//! * An instance that cannot start releases as `start_failed`; a command
//!   that does not exist is not one (it exits 127).
//! * A cancel of a running exec goes through its gateway (the command is
//!   killed, its signal-9 terminal page acked, the Lease released as
//!   `cancelled`); one before the Lease is active is released by the
//!   reconciler; the instance's processes are gone.
//! * A flood of binary output (twice the spool), a command that closes
//!   stdout early and one that leaves a child behind lose no byte.
//! * A step handles at most its batch.
//! * Hibernation and resume, with the test as the exec's owner doing the
//!   gateway's calls (take over, page moves, stop, quiesce, commit the
//!   quiescence, prepare and commit the resume, release): the reconciler's
//!   destroy parks the attempt and returns the unit once; it allocates the
//!   resume's generation with the restore, records the attachment, marks
//!   it active only after the resume is committed; the resumed command
//!   reads generation 1's files byte for byte and its pages continue after
//!   the stopped page, and its inputs after the ones generation 1 was
//!   given. A corrupted blob fails the restore once
//!   (`restore_failed`, naming the path and digest), the attempt stays
//!   parked and the unit returns. An idle exec is sealed once, on a
//!   certain cut, never while the cut is uncertain.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_blob::BlobStore as _;
use lc_core::rules::LIST_LIMIT_MAX;
use lc_core::store::{ControlStore, ReconcileStore};
use lc_core::{
    CutReading, Digest, ExecId, ExecRecord, ExecRequest, ExecState, Generation, LcError,
    LeaseState, LeaseWork, OperationKey, PageKind, SandboxLeaseId, TenantId, TerminalReason,
};
use lc_gateway::{Gateway, GatewayOptions, ProviderConnector};
use lc_provider::{BwrapConfig, BwrapProvider, Provider, ProviderError};
use lc_worker::{Reconciler, ReconcilerOptions, StepReport};
use safetime::{SafeTimeConfig, UncertainReason};
use safetime_pg::sampler::{Sampler, SamplerOptions};
use tokio::sync::watch;

const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
/// The test sampler's recovery grace: certain again soon after a start.
const RECOVERY_GRACE: SignedDuration = SignedDuration::from_millis(200);
/// A recovery grace no test outlasts: the cut advances but stays uncertain.
const RECOVERY_GRACE_LONG: SignedDuration = SignedDuration::from_mins(10);
/// A Lease TTL short enough for a certain cut to pass it within seconds,
/// long enough for the steps before that to run inside it.
const TTL_SHORT: SignedDuration = SignedDuration::from_secs(2);
/// How long a test waits for anything real (a cut, a process).
const WAIT_MAX: Duration = Duration::from_secs(30);
const SECRET: [u8; 32] = [0x5a; 32];
static COUNTER: AtomicU32 = AtomicU32::new(0);

fn sampler_options(recovery_grace: SignedDuration) -> SamplerOptions {
    SamplerOptions {
        config: SafeTimeConfig::new(
            50,
            SignedDuration::from_millis(50),
            GAP_MAX,
            SignedDuration::from_millis(500),
            3,
            recovery_grace,
        )
        .expect("sampler config"),
        standby_poll: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(500),
    }
}

/// `lc-supervisor` beside this test's profile directory, built fresh once per process.
fn supervisor_bin() -> PathBuf {
    tollgate_pg_harness::cargo_built("lc-supervisor", &["-p", "lc-supervisor"])
}

async fn connect_store(url: &str, lease_ttl: SignedDuration) -> Arc<lc_pg::LcStore> {
    connect_store_with(
        url,
        lc_pg::LcConfig {
            lease_ttl,
            ..lc_pg::LcConfig::default()
        },
    )
    .await
}

/// A store on `url` with `config` (few connections, a long acquire wait).
async fn connect_store_with(url: &str, config: lc_pg::LcConfig) -> Arc<lc_pg::LcStore> {
    Arc::new(
        lc_pg::LcStore::connect(
            url,
            tollgate::GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5))
                .unwrap(),
            tollgate::CapabilityKey::new(&SECRET).unwrap(),
            lc_pg::LcConfig {
                max_connections: 4,
                acquire_timeout: Duration::from_secs(30),
                ..config
            },
        )
        .await
        .expect("store"),
    )
}

fn start_sampler(
    url: &str,
    recovery_grace: SignedDuration,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let sampler = Sampler::new(url, sampler_options(recovery_grace)).expect("sampler");
    let (stop, rx) = watch::channel(false);
    (stop, tokio::spawn(async move { sampler.run(rx).await }))
}

/// The rig's one in-process provider, whatever URL the store recorded.
struct InProcess(Arc<BwrapProvider>);

#[async_trait::async_trait]
impl ProviderConnector for InProcess {
    async fn connect(&self, _url: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(self.0.clone())
    }
}

struct Rig {
    url: String,
    /// The exec gateway beside the reconciler; its sink is `dir/blobs`.
    gateway: Gateway,
    sink: Arc<lc_blob::LocalBlobStore>,
    store: Arc<lc_pg::LcStore>,
    clock: Arc<SafeCutClock>,
    provider: Arc<BwrapProvider>,
    rec: Reconciler,
    sampler_stop: watch::Sender<bool>,
    /// The running sampler's task (`None` once stopped).
    sampler: Option<tokio::task::JoinHandle<()>>,
    dir: PathBuf,
}

impl Drop for Rig {
    /// Kills what a test left running (its instances' cgroups), then
    /// removes the provider's state and parent cgroups.
    fn drop(&mut self) {
        let _ = self.sampler_stop.send(true);
        if let Ok(entries) = std::fs::read_dir(self.dir.join("instances")) {
            for e in entries.flatten().take(1000) {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some((l, g)) = name.split_once('-')
                    && let (Ok(l), Ok(g)) = (l.parse(), g.parse())
                {
                    let _ = self
                        .provider
                        .instance_cgroup(SandboxLeaseId(l), Generation(g))
                        .kill_and_remove();
                }
            }
        }
        let parent = self.provider.config().cgroup_parent.clone();
        let _ = std::fs::remove_dir_all(&self.dir);
        for c in ["", "memory", "pids", "cpu", "cpuacct"] {
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(&parent));
        }
    }
}

impl Rig {
    /// A rig whose store gives Leases `lease_ttl`, its reconciler `options`.
    async fn start(lease_ttl: SignedDuration, options: ReconcilerOptions) -> Rig {
        let db = tollgate_pg_harness::shared().await.fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.expect("migrate");
        let (sampler_stop, sampler) = start_sampler(&url, RECOVERY_GRACE);
        let store = connect_store(&url, lease_ttl).await;
        let clock = Arc::new(SafeCutClock::new(store.pool().clone(), GAP_MAX));
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = PathBuf::from(format!("/tmp/lcw-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cfg = BwrapConfig::new(
            lc_core::ProviderId::new("local").unwrap(),
            &dir,
            &supervisor_bin(),
        );
        cfg.cgroup_parent = format!("little-compute-wtest-{}-{n}", std::process::id());
        let provider = Arc::new(BwrapProvider::open(cfg).expect("provider"));
        store
            .register_provider(
                provider.id(),
                "http://127.0.0.1:9",
                provider.public_key().to_bytes(),
            )
            .await
            .expect("register provider");
        let rec = Reconciler::new(
            store.clone(),
            vec![provider.clone() as Arc<dyn Provider>],
            clock.clone(),
            options,
        )
        .unwrap();
        let sink = Arc::new(lc_blob::LocalBlobStore::open(dir.join("blobs")).expect("sink"));
        let gateway = Gateway::new(
            store.clone(),
            Arc::new(InProcess(provider.clone())),
            sink.clone(),
            clock.clone(),
            GatewayOptions::default(),
        )
        .expect("gateway");
        let rig = Rig {
            url,
            gateway,
            sink,
            store,
            clock,
            provider,
            rec,
            sampler_stop,
            sampler: Some(sampler),
            dir,
        };
        rig.wait_reading(|r| r.certain).await;
        let base = lc_core::manifest::Manifest::base();
        rig.register_runtime(
            "base",
            Digest(base.digest()),
            serde_json::from_slice(&base.canonical()).unwrap(),
        )
        .await;
        rig
    }

    /// Another reconciler of this rig's worker activation (its claims are
    /// the rig's reconciler's) on this rig's clock and provider, over
    /// `store`.
    fn reconciler(&self, store: Arc<lc_pg::LcStore>, options: ReconcilerOptions) -> Reconciler {
        self.worker(store, options).with_holder(self.rec.holder())
    }

    /// A reconciler of a worker activation of its own (a second worker
    /// process) on this rig's clock and provider, over `store`.
    fn worker(&self, store: Arc<lc_pg::LcStore>, options: ReconcilerOptions) -> Reconciler {
        Reconciler::new(
            store,
            vec![self.provider.clone() as Arc<dyn Provider>],
            self.clock.clone(),
            options,
        )
        .unwrap()
    }

    async fn register_runtime(&self, name: &str, digest: Digest, manifest: serde_json::Value) {
        let at = self.reading().await;
        self.store
            .register_runtime(
                &OperationKey::new(format!("setup-{name}"), Digest::of(name.as_bytes())).unwrap(),
                at,
                name,
                digest,
                manifest,
            )
            .await
            .expect("runtime");
    }

    async fn reading(&self) -> CutReading {
        self.rec.reading().await.expect("clock")
    }

    /// Polls the clock (bounded by [`WAIT_MAX`]) until a reading satisfies
    /// `want`; returns it.
    async fn wait_reading(&self, want: impl Fn(&CutReading) -> bool) -> CutReading {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Ok(r) = self.rec.reading().await
                && want(&r)
            {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no such reading within {WAIT_MAX:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the sampler and starts a new one (a new epoch, uncertain from
    /// its start) with `recovery_grace`.
    async fn restart_sampler(&mut self, recovery_grace: SignedDuration) {
        self.stop_sampler().await;
        let (stop, task) = start_sampler(&self.url, recovery_grace);
        self.sampler_stop = stop;
        self.sampler = Some(task);
    }

    /// Stops the sampler: its last publish goes stale, the cut uncertain
    /// and frozen.
    async fn stop_sampler(&mut self) {
        let _ = self.sampler_stop.send(true);
        if let Some(task) = self.sampler.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("the sampler stops")
                .unwrap();
        }
    }

    async fn tenant(&self, units: i64) -> TenantId {
        self.tenant_named("t-1", "blue", units).await
    }

    /// A tenant named `name`, created under operation key `key`.
    async fn tenant_named(&self, key: &str, name: &str, units: i64) -> TenantId {
        let at = self.reading().await;
        self.store
            .create_tenant(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                at,
                name,
                Some(units),
                &|id| Digest::of(format!("key-{}", id.0).as_bytes()),
            )
            .await
            .expect("tenant")
            .tenant_id
    }

    async fn admit(&self, tenant: TenantId, key: &str, argv: &[&str]) -> ExecId {
        self.admit_on(tenant, key, "base", argv).await
    }

    async fn admit_on(&self, tenant: TenantId, key: &str, runtime: &str, argv: &[&str]) -> ExecId {
        let at = self.reading().await;
        self.store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                at,
                tenant,
                &ExecRequest {
                    runtime: runtime.into(),
                    shape: "small".into(),
                    command: argv.iter().map(|s| s.to_string()).collect(),
                    timeout_ms: None,
                    stdin_open: false,
                    idle_ttl_ms: None,
                    on_timeout: lc_core::OnTimeout::Terminate,
                },
            )
            .await
            .expect("admit")
            .exec_id
    }

    async fn exec(&self, tenant: TenantId, exec: ExecId) -> ExecRecord {
        self.store.exec(tenant, exec).await.expect("exec")
    }

    /// The exec's Lease as the store has it now (`None` once released).
    async fn lease(&self, exec: ExecId) -> Option<LeaseWork> {
        let at = self.reading().await;
        self.store
            .due_work(at, LIST_LIMIT_MAX)
            .await
            .expect("due work")
            .into_iter()
            .find(|w| w.exec_id == exec)
    }

    /// A gateway step, then a reconciler step; the reconciler's report.
    async fn step(&self) -> StepReport {
        self.step_both().await.1
    }

    async fn step_both(&self) -> (lc_gateway::StepReport, StepReport) {
        let g = self.gateway.step().await;
        (g, self.rec.step().await.expect("step"))
    }

    /// Steps (gateway, then reconciler) until a gateway step released a
    /// Lease; the reconciler has not stepped since (bounded).
    async fn step_until_gateway_released(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let g = self.gateway.step().await;
            assert_eq!(g.failures, vec![]);
            if g.released == 1 {
                return;
            }
            assert!(Instant::now() < deadline, "no release within 60 s");
            let r = self.rec.step().await.expect("step");
            assert_eq!(r.failures, vec![]);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Steps until `done` holds for the sum of the reports (bounded).
    async fn step_until(&self, done: impl Fn(&Totals) -> bool) -> Totals {
        let mut t = Totals::default();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&t) {
            assert!(Instant::now() < deadline, "not done within 60 s: {t:?}");
            let (g, r) = self.step_both().await;
            t.add_gateway(&g);
            t.add(&r);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t
    }

    /// `(deposited, available, held, consumed)` of `tenant`.
    async fn balances(&self, tenant: TenantId) -> (i64, i64, i64, i64) {
        let t = self.store.tenant(tenant).await.unwrap();
        (t.deposited, t.available, t.held, t.consumed)
    }

    /// Tollgate's audit is clean and its totals are `(deposited, held, consumed)`.
    async fn assert_audit(&self, totals: (i128, i128, i128)) {
        use tollgate::Allocator as _;
        let audit = self.store.tollgate().audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.violations);
        assert_eq!(
            (
                audit.total_deposited,
                audit.total_held,
                audit.total_consumed
            ),
            totals
        );
    }

    /// The host pids of the lease's instance (its cgroup's members).
    fn pids(&self, w: &LeaseWork) -> Vec<i32> {
        self.provider
            .instance_cgroup(w.lease_id, w.generation)
            .pids()
    }
}

/// Waits (bounded) until none of `pids` exists any more.
async fn assert_gone(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Some(p) = pids
        .iter()
        .find(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        assert!(Instant::now() < deadline, "process {p} still exists");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, Default, Clone)]
struct Totals {
    allocated: usize,
    start_failed: usize,
    /// Pages the gateway acked (sink-bound and committed).
    pages_acked: usize,
    /// Leases the gateway released after their terminal page was acked.
    gateway_released: usize,
    releases_begun: usize,
    exited_left_to_gateway: usize,
    cancels_left_to_gateway: usize,
    measured: usize,
    unmeasured: usize,
    destroyed: usize,
    released: usize,
    released_replay: usize,
    units_returned: i64,
    release_deferred: usize,
    failures: Vec<String>,
}

impl Totals {
    fn add(&mut self, r: &StepReport) {
        self.allocated += r.allocated;
        self.start_failed += r.start_failed;
        self.releases_begun += r.releases_begun;
        self.exited_left_to_gateway += r.exited_left_to_gateway;
        self.cancels_left_to_gateway += r.cancels_left_to_gateway;
        self.measured += r.measured;
        self.unmeasured += r.unmeasured;
        self.destroyed += r.destroyed;
        self.released += r.released;
        self.released_replay += r.released_replay;
        self.units_returned += r.units_returned;
        self.release_deferred += r.release_deferred;
        self.failures.extend(
            r.failures
                .iter()
                .map(|f| format!("{}: {}", f.code, f.message)),
        );
    }

    fn add_gateway(&mut self, r: &lc_gateway::StepReport) {
        self.pages_acked += r.pages_acked;
        self.gateway_released += r.released;
        self.failures.extend(
            r.failures
                .iter()
                .map(|f| format!("gateway {}: {}", f.code, f.message)),
        );
    }
}

/// The acked pages' seqs, and the bytes of the pages of `kind`, read from
/// the gateway's sink by digest (verified).
async fn output_of(
    rig: &Rig,
    tenant: TenantId,
    exec: ExecId,
    kind: PageKind,
) -> (Vec<i64>, Vec<u8>) {
    let pages = rig
        .store
        .output(tenant, exec, 0, 1000)
        .await
        .expect("output");
    let seqs = pages.iter().map(|p| p.meta.seq).collect();
    let bytes = pages
        .iter()
        .filter(|p| p.meta.kind == kind)
        .flat_map(|p| {
            assert_eq!(
                p.bytes, None,
                "the gateway's pages keep their bytes in the sink"
            );
            rig.sink
                .get(&p.meta.sha256)
                .unwrap()
                .expect("the page's blob")
        })
        .collect();
    (seqs, bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_command_runs_to_terminal_and_its_units_return_once() {
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(4).await;
    let exec = rig
        .admit(
            tenant,
            "e-1",
            &["sh", "-c", "seq 1 20000; echo done >&2; exit 7"],
        )
        .await;
    assert_eq!(rig.balances(tenant).await, (4, 3, 1, 0));

    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!(totals.failures, Vec::<String>::new());
    assert_eq!(
        (
            totals.allocated,
            totals.gateway_released,
            totals.releases_begun,
            totals.measured,
            totals.unmeasured,
            totals.destroyed,
            totals.released,
            totals.units_returned,
        ),
        (1, 1, 0, 1, 0, 1, 1, 1)
    );
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(rec.state, ExecState::Terminal);
    assert_eq!(rec.terminal_reason, Some(TerminalReason::Exited));
    assert_eq!(rec.exit_code, Some(7));
    // Measured before the destroy from the instance's own groups: some
    // memory within the shape's 256 MiB, and no side effects (no network
    // path).
    let measured = rec.observation.expect("measured before the destroy");
    let cost = measured.cost.expect("the instance's accounting");
    assert!(
        cost.peak_memory_bytes > 0 && cost.peak_memory_bytes <= 268_435_456,
        "{cost:?}"
    );
    assert_eq!(
        measured.externality,
        lc_core::observation::ExternalityObservation::no_network_path()
    );
    let (seqs, stdout) = output_of(&rig, tenant, exec, PageKind::Stdout).await;
    let n = i64::try_from(seqs.len()).unwrap();
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "every page once, in order"
    );
    assert_eq!(totals.pages_acked, seqs.len());
    let want: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(stdout, want.as_bytes());
    let (_, stderr) = output_of(&rig, tenant, exec, PageKind::Stderr).await;
    assert_eq!(stderr, b"done\n");
    let last = rig.store.output(tenant, exec, n - 1, 1).await.unwrap();
    assert_eq!(last[0].meta.kind, PageKind::Terminal);
    assert_eq!(rig.balances(tenant).await, (4, 4, 0, 0));
    assert_eq!(rig.provider.inventory().await.unwrap(), vec![]);

    // More steps change nothing: the units came back once.
    for _ in 0..3 {
        let r = rig.step().await;
        assert_eq!((r.leases_seen, r.released, r.units_returned), (0, 0, 0));
    }
    assert_eq!(rig.balances(tenant).await, (4, 4, 0, 0));
    rig.assert_audit((4, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sampler_retries_the_destroy_but_returns_nothing_until_certain() {
    let mut rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(2).await;
    let exec = rig.admit(tenant, "e-1", &["sh", "-c", "echo hi"]).await;
    rig.step_until_gateway_released().await;
    assert_eq!(rig.balances(tenant).await, (2, 1, 1, 0));

    rig.stop_sampler().await;
    let frozen = rig.wait_reading(|r| !r.certain).await;
    for _ in 0..3 {
        let r = rig.step().await;
        assert!(!r.at.certain);
        assert_eq!(r.at.cut, frozen.cut, "a stopped sampler's cut is frozen");
        assert_eq!(r.failures, vec![]);
        assert_eq!(
            (
                r.destroyed,
                r.release_deferred,
                r.released,
                r.released_replay,
                r.units_returned
            ),
            (1, 1, 0, 0, 0)
        );
        assert_eq!(
            rig.balances(tenant).await,
            (2, 1, 1, 0),
            "no capacity returns while uncertain"
        );
        let rec = rig.exec(tenant, exec).await;
        assert_eq!(
            (rec.state, rec.lease_state),
            (ExecState::Running, Some(LeaseState::ReleasePending))
        );
    }
    // The destroy was done: the instance is gone, only the commit waits.
    assert_eq!(rig.provider.inventory().await.unwrap(), vec![]);
    rig.assert_audit((2, 1, 0)).await;

    // A new sampler: a new epoch, certain after its recovery.
    rig.restart_sampler(RECOVERY_GRACE).await;
    rig.wait_reading(|r| r.certain).await;
    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!(
        (
            totals.destroyed,
            totals.units_returned,
            totals.release_deferred
        ),
        (1, 1, 0)
    );
    assert_eq!(rig.balances(tenant).await, (2, 2, 0, 0));
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(0))
    );
    rig.assert_audit((2, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_cut_expires_nothing_and_renewal_never_shortens() {
    let mut rig = Rig::start(TTL_SHORT, ReconcilerOptions::default()).await;
    let tenant = rig.tenant(1).await;
    let exec = rig.admit(tenant, "e-1", &["sleep", "600"]).await;
    let admitted = rig.exec(tenant, exec).await.admitted_cut;
    assert_eq!(rig.lease(exec).await.unwrap().expiry, admitted + TTL_SHORT);
    let r = rig.step().await;
    assert_eq!((r.allocated, r.renewed, r.failures), (1, 0, vec![]));

    // Within renew_ahead (30 s) of a certain cut: renewed to cut + ttl.
    let r = rig.step().await;
    assert!(r.at.certain);
    assert_eq!((r.renewed, r.releases_begun, r.failures), (1, 0, vec![]));
    let expiry = rig.lease(exec).await.unwrap().expiry;
    assert_eq!(expiry, r.at.cut + TTL_SHORT);

    // A new epoch that stays in recovery: the cut advances, uncertain. No
    // step runs until it is past the Lease's expiry.
    rig.restart_sampler(RECOVERY_GRACE_LONG).await;
    let late = rig.wait_reading(|r| !r.certain && r.cut > expiry).await;
    let reading = rig.clock.read().await.unwrap();
    assert_eq!(reading.uncertain, Some(UncertainReason::Recovering));
    let r = rig.step().await;
    assert!(!r.at.certain);
    assert!(r.at.cut >= late.cut && r.at.cut > expiry);
    assert_eq!(
        (r.releases_begun, r.renewed, r.destroyed, r.failures),
        (0, 1, 0, vec![]),
        "past its expiry on an uncertain cut the Lease is renewed, not expired"
    );
    let w = rig.lease(exec).await.unwrap();
    assert_eq!((w.state, w.terminal_reason), (LeaseState::Active, None));
    let expiry = w.expiry;
    assert_eq!(expiry, r.at.cut + TTL_SHORT);
    assert_eq!(rig.balances(tenant).await, (1, 0, 1, 0));
    assert!(!rig.pids(&w).is_empty(), "the command still runs");

    // A worker whose store renews by 1 ms renews on every step, and never
    // below the expiry already granted.
    let short = rig.reconciler(
        connect_store(&rig.url, SignedDuration::from_millis(1)).await,
        ReconcilerOptions::default(),
    );
    let r = short.step().await.unwrap();
    assert!(!r.at.certain);
    assert!(r.at.cut + SignedDuration::from_millis(1) < expiry);
    assert_eq!((r.renewed, r.releases_begun, r.failures), (1, 0, vec![]));
    assert_eq!(rig.lease(exec).await.unwrap().expiry, expiry);

    // More than renew_ahead left: no renewal at all.
    let lazy = rig.reconciler(
        rig.store.clone(),
        ReconcilerOptions {
            renew_ahead: SignedDuration::from_millis(1),
            ..ReconcilerOptions::default()
        },
    );
    let r = lazy.step().await.unwrap();
    assert!(r.at.cut + SignedDuration::from_millis(1) < expiry);
    assert_eq!((r.leases_seen, r.renewed, r.failures), (1, 0, vec![]));
    assert_eq!(rig.lease(exec).await.unwrap().expiry, expiry);
    rig.assert_audit((1, 1, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certain_cut_past_the_expiry_releases_it_as_expired() {
    let rig = Rig::start(TTL_SHORT, ReconcilerOptions::default()).await;
    let tenant = rig.tenant(1).await;
    let exec = rig.admit(tenant, "e-1", &["sleep", "600"]).await;
    let r = rig.step().await;
    assert_eq!((r.allocated, r.failures), (1, vec![]));
    let w = rig.lease(exec).await.unwrap();
    let pids = rig.pids(&w);
    assert!(!pids.is_empty());

    // The worker stops renewing: no step until a certain cut reaches the expiry.
    rig.wait_reading(|r| r.certain && r.cut >= w.expiry).await;
    let r = rig.step().await;
    assert!(r.at.certain && r.at.cut >= w.expiry);
    assert_eq!(
        (r.releases_begun, r.renewed, r.destroyed, r.failures),
        (1, 0, 0, vec![])
    );
    let pending = rig.lease(exec).await.unwrap();
    assert_eq!(
        (pending.state, pending.terminal_reason, pending.expiry),
        (
            LeaseState::ReleasePending,
            Some(TerminalReason::Expired),
            w.expiry
        )
    );
    assert_eq!(rig.balances(tenant).await, (1, 0, 1, 0));

    let r = rig.step().await;
    assert_eq!(
        (r.destroyed, r.released, r.units_returned, r.failures),
        (1, 1, 1, vec![])
    );
    assert_gone(&pids).await;
    assert!(
        !rig.provider
            .instance_cgroup(w.lease_id, w.generation)
            .exists()
    );
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (
            rec.state,
            rec.terminal_reason,
            rec.exit_code,
            rec.lease_state
        ),
        (
            ExecState::Terminal,
            Some(TerminalReason::Expired),
            None,
            Some(LeaseState::Released)
        )
    );
    assert_eq!(rig.balances(tenant).await, (1, 1, 0, 0));
    rig.assert_audit((1, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_cannot_start_releases_with_start_failed() {
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    // Registered in the control plane, never imported on the provider.
    rig.register_runtime(
        "ghost",
        Digest([0xee; 32]),
        serde_json::json!({ "kind": "tree", "entries": [] }),
    )
    .await;
    let tenant = rig.tenant(2).await;
    let ghost = rig.admit_on(tenant, "e-1", "ghost", &["true"]).await;
    // A command that does not exist starts an instance: it exits 127.
    let missing = rig.admit(tenant, "e-2", &["no-such-command"]).await;
    assert_eq!(rig.balances(tenant).await, (2, 0, 2, 0));

    let r = rig.step().await;
    assert_eq!(
        (
            r.leases_seen,
            r.allocated,
            r.start_failed,
            r.restore_failed,
            r.failures
        ),
        (2, 1, 1, 0, vec![])
    );
    let w = rig.lease(ghost).await.unwrap();
    assert_eq!(
        r.start_refusals,
        vec![lc_worker::LeaseFailure {
            lease_id: Some(w.lease_id),
            action: "allocate",
            code: "unknown_runtime".into(),
            message: format!(
                "runtime {} is not in this provider's store",
                "ee".repeat(32)
            ),
        }]
    );
    assert_eq!(
        (w.state, w.terminal_reason),
        (
            LeaseState::ReleasePending,
            Some(TerminalReason::StartFailed)
        )
    );

    let totals = rig.step_until(|t| t.released == 2).await;
    assert_eq!(totals.failures, Vec::<String>::new());
    assert_eq!((totals.units_returned, totals.start_failed), (2, 0));
    let rec = rig.exec(tenant, ghost).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::StartFailed), None)
    );
    assert_eq!(
        rig.store.output(tenant, ghost, 0, 10).await.unwrap(),
        Vec::<lc_core::owner::StoredPage>::new()
    );
    let rec = rig.exec(tenant, missing).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(127))
    );
    let (seqs, stderr) = output_of(&rig, tenant, missing, PageKind::Stderr).await;
    assert_eq!(seqs, vec![1, 2]);
    assert_eq!(
        String::from_utf8(stderr).unwrap(),
        "lc-supervisor: cannot start \"no-such-command\": No such file or directory (os error 2)\n"
    );
    assert_eq!(rig.balances(tenant).await, (2, 2, 0, 0));
    rig.assert_audit((2, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_releases_as_cancelled_and_kills_the_instance() {
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(1).await;
    let exec = rig
        .admit(tenant, "e-1", &["sh", "-c", "sleep 600 & sleep 600"])
        .await;
    let r = rig.step().await;
    assert_eq!((r.allocated, r.failures), (1, vec![]));
    let w = rig.lease(exec).await.unwrap();
    // Both sleeps run inside the instance (with bubblewrap, the supervisor
    // and the shell: every process of the instance is in its cgroup).
    let sleeps = |pids: &[i32]| {
        pids.iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c == "sleep\n")
            })
            .count()
    };
    let deadline = Instant::now() + WAIT_MAX;
    while sleeps(&rig.pids(&w)) < 2 {
        assert!(Instant::now() < deadline, "pids: {:?}", rig.pids(&w));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pids = rig.pids(&w);
    assert_eq!(sleeps(&pids), 2);

    let at = rig.reading().await;
    let rec = rig
        .store
        .cancel(
            &OperationKey::new("c-1", Digest([3; 32])).unwrap(),
            at,
            tenant,
            exec,
        )
        .await
        .unwrap();
    assert!(rec.cancel_requested);
    // The Lease is active: the gateway cancels (receipt, then the
    // supervisor kills the command), acks the signal's terminal page and
    // releases; the reconciler only destroys and proves.
    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!(totals.failures, Vec::<String>::new());
    assert_eq!(
        (
            totals.gateway_released,
            totals.releases_begun,
            totals.destroyed,
            totals.units_returned
        ),
        (1, 0, 1, 1)
    );
    assert!(totals.cancels_left_to_gateway >= 1, "{totals:?}");
    let pages = rig.store.output(tenant, exec, 0, 10).await.unwrap();
    let last = pages.last().expect("the terminal page");
    assert_eq!(
        (last.meta.kind, last.meta.exit),
        (
            PageKind::Terminal,
            Some(lc_core::page::ExitStatus::signaled(9))
        )
    );
    assert_gone(&pids).await;
    assert!(
        !rig.provider
            .instance_cgroup(w.lease_id, w.generation)
            .exists()
    );
    assert_eq!(rig.provider.inventory().await.unwrap(), vec![]);
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Cancelled), None)
    );
    assert_eq!(rig.balances(tenant).await, (1, 1, 0, 0));

    // Cancelled before its Lease is active: the reconciler releases it.
    let early = rig.admit(tenant, "e-2", &["sleep", "600"]).await;
    let at = rig.reading().await;
    rig.store
        .cancel(
            &OperationKey::new("c-2", Digest([4; 32])).unwrap(),
            at,
            tenant,
            early,
        )
        .await
        .unwrap();
    let r = rig.step().await;
    assert_eq!((r.allocated, r.releases_begun, r.failures), (0, 1, vec![]));
    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!((totals.gateway_released, totals.units_returned), (0, 1));
    let rec = rig.exec(tenant, early).await;
    assert_eq!(
        (rec.state, rec.terminal_reason),
        (ExecState::Terminal, Some(TerminalReason::Cancelled))
    );
    assert_eq!(rig.balances(tenant).await, (1, 1, 0, 0));
    rig.assert_audit((1, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_binary_output_an_early_closed_stdout_and_an_orphan_lose_nothing() {
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(2).await;
    // 16 MiB of every byte value (invalid UTF-8 throughout), twice the
    // supervisor's default spool, from a command that leaves a child
    // running behind it.
    let flood = rig
        .admit(
            tenant,
            "e-flood",
            &[
                "sh",
                "-c",
                "sleep 600 & python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 65536)'",
            ],
        )
        .await;
    // stdout closed early, stderr still written after it.
    let closed = rig
        .admit(
            tenant,
            "e-closed",
            &["sh", "-c", "echo before; exec 1>&-; echo after >&2; exit 4"],
        )
        .await;
    let totals = rig.step_until(|t| t.released == 2).await;
    assert_eq!(totals.failures, Vec::<String>::new());
    assert_eq!(
        (
            totals.gateway_released,
            totals.releases_begun,
            totals.units_returned
        ),
        (2, 0, 2)
    );
    let rec = rig.exec(tenant, flood).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(0))
    );
    let (seqs, stdout) = output_of(&rig, tenant, flood, PageKind::Stdout).await;
    let n = i64::try_from(seqs.len()).unwrap();
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "every page once, in order"
    );
    assert_eq!(stdout.len(), 16 * 1024 * 1024);
    assert!(
        stdout == (0u8..=255).collect::<Vec<u8>>().repeat(65536),
        "the flood's bytes, exactly"
    );
    let rec = rig.exec(tenant, closed).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(4))
    );
    assert_eq!(
        output_of(&rig, tenant, closed, PageKind::Stdout).await.1,
        b"before\n"
    );
    assert_eq!(
        output_of(&rig, tenant, closed, PageKind::Stderr).await.1,
        b"after\n"
    );
    // The orphan died with the instance.
    assert_eq!(rig.provider.inventory().await.unwrap(), vec![]);
    assert_eq!(rig.balances(tenant).await, (2, 2, 0, 0));
    rig.assert_audit((2, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_handles_at_most_its_batch() {
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions {
            batch: 2,
            ..ReconcilerOptions::default()
        },
    )
    .await;
    let tenant = rig.tenant(5).await;
    let mut execs = Vec::new();
    for i in 1..=5 {
        execs.push(rig.admit(tenant, &format!("e-{i}"), &["true"]).await);
    }
    let r = rig.step().await;
    assert_eq!((r.leases_seen, r.allocated, r.failures), (2, 2, vec![]));
    let mut states = Vec::new();
    for e in &execs {
        states.push(rig.lease(*e).await.unwrap().state);
    }
    assert_eq!(
        states,
        [
            LeaseState::Active,
            LeaseState::Active,
            LeaseState::Allocating,
            LeaseState::Allocating,
            LeaseState::Allocating
        ]
    );
    assert_eq!(rig.provider.inventory().await.unwrap().len(), 2);
    for batch in [0, LIST_LIMIT_MAX + 1] {
        let e = Reconciler::new(
            rig.store.clone(),
            vec![],
            rig.clock.clone(),
            ReconcilerOptions {
                batch,
                ..ReconcilerOptions::default()
            },
        )
        .unwrap_err();
        assert!(
            matches!(e, LcError::InvalidLimit { limit, max } if limit == batch && max == LIST_LIMIT_MAX),
            "{e:?}"
        );
    }
    let with = |options: ReconcilerOptions| {
        Reconciler::new(rig.store.clone(), vec![], rig.clock.clone(), options)
    };
    for (n, ok) in [
        (0, false),
        (1, true),
        (lc_worker::ALLOCATE_CONCURRENCY_MAX, true),
        (lc_worker::ALLOCATE_CONCURRENCY_MAX + 1, false),
    ] {
        let r = with(ReconcilerOptions {
            allocate_concurrency: n,
            ..ReconcilerOptions::default()
        });
        match r {
            Ok(rec) => assert!(ok && rec.options().allocate_concurrency == n, "{n}"),
            Err(e) => assert!(
                !ok && matches!(e, LcError::InvalidLimit { limit, max } if limit == n && max == lc_worker::ALLOCATE_CONCURRENCY_MAX),
                "{n}: {e:?}"
            ),
        }
    }
    let ms = Duration::from_millis(1);
    for (t, ok) in [
        (lc_worker::PROVIDER_CALL_TIMEOUT_MIN - ms, false),
        (lc_worker::PROVIDER_CALL_TIMEOUT_MIN, true),
        (lc_worker::PROVIDER_CALL_TIMEOUT_MAX, true),
        (lc_worker::PROVIDER_CALL_TIMEOUT_MAX + ms, false),
    ] {
        let r = with(ReconcilerOptions {
            provider_call_timeout: t,
            ..ReconcilerOptions::default()
        });
        match r {
            Ok(rec) => assert!(ok && rec.options().provider_call_timeout == t, "{t:?}"),
            Err(e) => {
                assert!(!ok, "{t:?}");
                assert_eq!(e.code(), "invalid_timeout");
                assert_eq!(
                    e.to_string(),
                    format!(
                        "invalid timeout: the provider call timeout {t:?} must be in 10ms..=600s; above the provider's start wait"
                    )
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_destroy_keeps_its_reservation_renewed() {
    // renew_ahead beyond the Reservation's TTL: every step is within it.
    let mut rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions {
            renew_ahead: SignedDuration::from_hours(1),
            ..ReconcilerOptions::default()
        },
    )
    .await;
    let tenant = rig.tenant(1).await;
    let exec = rig.admit(tenant, "e-1", &["true"]).await;
    rig.step_until_gateway_released().await;
    let before = rig.lease(exec).await.expect("release pending");
    assert_eq!(before.state, LeaseState::ReleasePending);

    rig.stop_sampler().await;
    let frozen = rig.wait_reading(|r| !r.certain).await;
    let r = rig.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.renewed, r.destroyed, r.release_deferred, r.released),
        (1, 1, 1, 0)
    );
    let after = rig.lease(exec).await.expect("still release pending");
    // The store's Reservation TTL is its default, 10 min (under the
    // policy's 1 h max_ttl); the Lease keeps its expiry.
    let ttl = lc_pg::LcConfig::default().reservation_ttl;
    assert_eq!(
        after.reservation_expiry,
        before.reservation_expiry.max(frozen.cut + ttl)
    );
    assert_eq!(after.expiry, before.expiry);
    assert_eq!(rig.balances(tenant).await, (1, 0, 1, 0));

    rig.restart_sampler(RECOVERY_GRACE).await;
    rig.wait_reading(|r| r.certain).await;
    rig.step_until(|t| t.released == 1).await;
    assert_eq!(rig.balances(tenant).await, (1, 1, 0, 0));
    rig.assert_audit((1, 0, 0)).await;
}

// ---------------------------------------------------------------------------
// Hibernation and resume. The test itself is the exec's owner (it takes
// the exec over and holds the credential), doing the gateway's part with
// the provider and store calls the gateway makes; the reconciler's step
// does the rest.

/// The test as the exec's owner.
struct Owner {
    cred: lc_core::owner::OwnerCredential,
    exec: ExecId,
    attempt: lc_core::AttemptNo,
}

/// Heartbeat TTL of the test's ownership: longer than any test.
const OWNER_TTL: SignedDuration = SignedDuration::from_secs(120);

impl Rig {
    async fn admit_request(&self, tenant: TenantId, key: &str, req: &ExecRequest) -> ExecId {
        let at = self.reading().await;
        self.store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                at,
                tenant,
                req,
            )
            .await
            .expect("admit")
            .exec_id
    }

    /// Takes the exec over with a token of `byte`s (its Lease is active).
    async fn take_over(&self, tenant: TenantId, exec: ExecId, byte: u8) -> Owner {
        use lc_core::store::GatewayStore as _;
        let token =
            lc_core::owner::OwnerToken::from_bytes([byte; lc_core::owner::OWNER_TOKEN_BYTES]);
        let at = self.wait_reading(|r| r.certain).await;
        let owned = self
            .store
            .take_over(&token, tenant, exec, at, OWNER_TTL)
            .await
            .expect("take over");
        Owner {
            cred: lc_core::owner::OwnerCredential {
                token,
                generation: owned.ownership.generation,
                fence: owned.ownership.fence,
            },
            exec,
            attempt: owned.attempt,
        }
    }

    /// The gateway's page protocol for the instance of `(lease, g)`, by
    /// hand: fetch the spooled pages after `after_seq`, stage their
    /// metadata, put their bytes in the sink, commit the ACK result, ack
    /// the supervisor; until `done` holds for the pages moved (bounded).
    /// Returns them.
    async fn move_pages(
        &self,
        o: &Owner,
        lease: SandboxLeaseId,
        g: Generation,
        mut after_seq: i64,
        done: impl Fn(&[lc_core::page::Page]) -> bool,
    ) -> Vec<lc_core::page::Page> {
        use lc_core::store::GatewayStore as _;
        let mut moved = Vec::new();
        let deadline = Instant::now() + WAIT_MAX;
        while !done(&moved) {
            assert!(
                Instant::now() < deadline,
                "pages not moved within {WAIT_MAX:?}"
            );
            let pages = self
                .provider
                .pages(lease, g, o.cred.fence, after_seq, 256)
                .await
                .expect("pages");
            if let Some(last) = pages.last() {
                let through = last.seq();
                let metas: Vec<_> = pages
                    .iter()
                    .map(|p| lc_core::owner::PageMeta::of_page(o.exec, o.attempt, p))
                    .collect();
                let at = self.reading().await;
                self.store
                    .stage_pages(&o.cred, o.exec, at, &metas)
                    .await
                    .expect("stage");
                for p in &pages {
                    self.sink.put(&Digest(p.sha256()), p.bytes()).unwrap();
                }
                self.store
                    .ack_pages(
                        &o.cred,
                        o.exec,
                        at,
                        &format!("ack-{}-{through}", o.attempt.0),
                        through,
                    )
                    .await
                    .expect("ack result");
                self.provider
                    .ack(lease, g, o.cred.fence, through)
                    .await
                    .expect("supervisor ack");
                after_seq = through;
                moved.extend(pages);
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        moved
    }

    /// The gateway's part of a hibernation of the sealed generation
    /// `(lease, g)` whose pages through `after_seq` are moved: stop, move
    /// pages through the stopped page, quiesce, commit the quiescence.
    /// Returns the stopped page's seq and the committed head.
    async fn stop_and_quiesce(
        &self,
        o: &Owner,
        lease: SandboxLeaseId,
        g: Generation,
        after_seq: i64,
    ) -> (i64, Digest) {
        use lc_core::store::GatewayStore as _;
        assert_eq!(
            self.provider.stop(lease, g, o.cred.fence).await.unwrap(),
            Some(lc_core::page::StopOutcome::Killed)
        );
        let moved = self
            .move_pages(o, lease, g, after_seq, |ps| {
                ps.last().is_some_and(|p| p.kind() == PageKind::Stopped)
            })
            .await;
        let stopped_seq = moved.last().unwrap().seq();
        let quiesced = self
            .provider
            .quiesce(lease, g, o.cred.fence)
            .await
            .expect("quiesce");
        let head = Digest::of(&quiesced.manifest);
        let at = self.wait_reading(|r| r.certain).await;
        let hib = self
            .store
            .commit_quiescence(
                &o.cred,
                o.exec,
                at,
                g,
                &quiesced.manifest,
                head,
                &serde_json::to_value(&quiesced.evidence).unwrap(),
                None,
            )
            .await
            .expect("commit quiescence");
        assert_eq!(
            (hib.step, hib.head),
            (lc_core::HibernationStep::Quiesced, Some(head))
        );
        (stopped_seq, head)
    }

    /// The tenant's resume intent and the owner's `prepare_resume`: the
    /// resume's Lease (generation g+1, allocating, restoring `head`).
    async fn request_and_prepare_resume(
        &self,
        o: &Owner,
        tenant: TenantId,
        head: Digest,
        key: &str,
    ) -> LeaseWork {
        use lc_core::store::GatewayStore as _;
        let at = self.wait_reading(|r| r.certain).await;
        self.store
            .request_resume(
                &OperationKey::new(
                    key,
                    lc_core::hibernate::resume_request_sha256(o.exec, Some(head)),
                )
                .unwrap(),
                at,
                tenant,
                o.exec,
                Some(head),
            )
            .await
            .expect("resume intent");
        let at = self.wait_reading(|r| r.certain).await;
        self.store
            .prepare_resume(&o.cred, o.exec, at, key)
            .await
            .expect("prepare resume")
    }

    /// A reconciler step on a certain reading (waits for one, bounded).
    async fn certain_step(&self) -> StepReport {
        self.wait_reading(|r| r.certain).await;
        loop {
            let r = self.rec.step().await.expect("step");
            if r.at.certain {
                return r;
            }
            self.wait_reading(|r| r.certain).await;
        }
    }
}

/// The text of the stdout pages among `pages`.
fn stdout_of(pages: &[lc_core::page::Page]) -> String {
    let bytes: Vec<u8> = pages
        .iter()
        .filter(|p| p.kind() == PageKind::Stdout)
        .flat_map(|p| p.bytes().to_vec())
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// Generation 1 writes a workspace (a file, a 0640 file, a symlink) and
/// waits to be stopped; a resumed generation prints what it finds and
/// exits 3.
const RESUMABLE: &str = "if [ -e /workspace/gen1 ]; then \
    cat /workspace/a.txt; sha256sum /workspace/b.txt; stat -c %a /workspace/a.txt; \
    readlink /workspace/link; exit 3; fi; \
    printf 'hello\\n' > /workspace/a.txt; chmod 0640 /workspace/a.txt; \
    seq 1 20000 > /workspace/b.txt; ln -s a.txt /workspace/link; touch /workspace/gen1; \
    echo ready; exec sleep 1000";

/// An exec of [`RESUMABLE`] run to generation 1's `ready`, sealed
/// (requested), stopped, quiesced and parked by the reconciler's destroy.
/// Returns the owner, generation 1's stopped seq and the head.
async fn parked_exec(rig: &Rig, tenant: TenantId) -> (Owner, i64, Digest) {
    let exec = rig.admit(tenant, "e-1", &["sh", "-c", RESUMABLE]).await;
    let r = rig.certain_step().await;
    assert_eq!((r.allocated, r.attached, r.failures), (1, 0, vec![]));
    let g1 = rig.lease(exec).await.unwrap();
    assert_eq!(
        (g1.generation, g1.first_seq, g1.first_input_seq),
        (Generation(1), 1, 1)
    );
    let owner = rig.take_over(tenant, exec, 0x11).await;
    let moved = rig
        .move_pages(&owner, g1.lease_id, g1.generation, 0, |ps| {
            stdout_of(ps).ends_with("ready\n")
        })
        .await;
    let after = moved.last().unwrap().seq();

    // Seal (requested): the reconciler lists it, never counts it as its seal.
    let at = rig.wait_reading(|r| r.certain).await;
    let hib = rig
        .store
        .request_hibernation(
            &OperationKey::new("h-1", Digest::of(b"h-1")).unwrap(),
            at,
            tenant,
            exec,
        )
        .await
        .expect("request hibernation");
    assert_eq!(
        (hib.reason, hib.step, hib.sealed_cut, hib.generation),
        (
            lc_core::HibernationReason::Requested,
            lc_core::HibernationStep::Sealed,
            at.cut,
            Generation(1)
        )
    );
    let r = rig.certain_step().await;
    assert_eq!(
        (r.hibernations_sealed, r.hibernations_unfinished, r.failures),
        (0, 1, vec![])
    );

    let (stopped_seq, head) = rig
        .stop_and_quiesce(&owner, g1.lease_id, g1.generation, after)
        .await;
    assert_eq!(rig.balances(tenant).await, (4, 3, 1, 0));

    // The reconciler destroys generation 1 and the store parks it.
    let r = rig.certain_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (
            r.destroyed,
            r.parked,
            r.released,
            r.units_returned,
            r.hibernations_unfinished
        ),
        (1, 1, 0, 1, 0)
    );
    assert_eq!(rig.balances(tenant).await, (4, 4, 0, 0));
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.lease_state),
        (ExecState::Hibernated, None, Some(LeaseState::Released))
    );
    // Parked once: more steps return nothing again.
    let r = rig.certain_step().await;
    assert_eq!((r.leases_seen, r.parked, r.units_returned), (0, 0, 0));
    assert_eq!(rig.balances(tenant).await, (4, 4, 0, 0));
    // The quiescence released the ownership; the resume's owner takes the
    // parked exec over.
    let owner = rig.take_over(tenant, exec, 0x11).await;
    (owner, stopped_seq, head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_exec_parks_once_and_resumes_on_its_files_with_seqs_continued() {
    use lc_core::store::GatewayStore as _;
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(4).await;
    let (owner, stopped_seq, head) = parked_exec(&rig, tenant).await;
    let exec = owner.exec;

    // The owner prepares the resume: Reservation and Lease of generation 2.
    let g2 = rig
        .request_and_prepare_resume(&owner, tenant, head, "r-1")
        .await;
    assert_eq!(
        (
            g2.generation,
            g2.state,
            g2.restore_head,
            g2.first_seq,
            g2.first_input_seq,
            g2.attached,
            g2.attempt_parked
        ),
        (
            Generation(2),
            LeaseState::Allocating,
            Some(head),
            stopped_seq + 1,
            1,
            false,
            true
        )
    );
    assert_eq!(rig.balances(tenant).await, (4, 3, 1, 0));

    // The reconciler allocates generation 2 with the restore and records
    // the attachment; the attempt is still parked, so not active yet.
    let r = rig.certain_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (
            r.leases_seen,
            r.attached,
            r.awaiting_resume,
            r.allocated,
            r.start_failed
        ),
        (1, 1, 1, 0, 0)
    );
    let w = rig.lease(exec).await.unwrap();
    assert_eq!(
        (w.generation, w.state, w.attached, w.attempt_parked),
        (Generation(2), LeaseState::Allocating, true, true)
    );
    // Waiting changes nothing and allocates nothing again.
    let r = rig.certain_step().await;
    assert_eq!(
        (r.attached, r.awaiting_resume, r.allocated, r.failures),
        (0, 1, 0, vec![])
    );

    // The owner commits the resume; the next step marks generation 2 active.
    let at = rig.wait_reading(|r| r.certain).await;
    let receipt = rig
        .store
        .commit_resume(&owner.cred, exec, at, "r-1")
        .await
        .expect("commit resume");
    assert_eq!(
        (receipt.from_generation, receipt.to_generation),
        (Generation(1), Generation(2))
    );
    let r = rig.certain_step().await;
    assert_eq!(
        (r.allocated, r.attached, r.awaiting_resume, r.failures),
        (1, 0, 0, vec![])
    );
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (rec.state, rec.lease_state),
        (ExecState::Running, Some(LeaseState::Active))
    );
    // Generation 1 was measured before its destroy, generation 2 not yet:
    // the attempt as a whole is not measured.
    assert_eq!(rec.observation, None);

    // Generation 2's command sees generation 1's files, byte for byte,
    // and its pages continue after the stopped page.
    let moved = rig
        .move_pages(&owner, g2.lease_id, g2.generation, stopped_seq, |ps| {
            ps.last().is_some_and(|p| p.kind() == PageKind::Terminal)
        })
        .await;
    assert_eq!(moved[0].seq(), stopped_seq + 1);
    let b: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(
        stdout_of(&moved),
        format!(
            "hello\n{}  /workspace/b.txt\n640\na.txt\n",
            Digest::of(b.as_bytes()).to_hex()
        )
    );
    let (seqs, _) = output_of(&rig, tenant, exec, PageKind::Stdout).await;
    let n = moved.last().unwrap().seq();
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "one seq line across generations"
    );
    let stored = rig
        .store
        .output(tenant, exec, stopped_seq - 1, 1)
        .await
        .unwrap();
    assert_eq!(stored[0].meta.kind, PageKind::Stopped);

    // The owner releases the exited exec; the reconciler returns its units.
    let at = rig.wait_reading(|r| r.certain).await;
    rig.store
        .release(&owner.cred, exec, at, "release-1")
        .await
        .expect("release");
    let r = rig.certain_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.destroyed, r.released, r.parked, r.units_returned),
        (1, 1, 0, 1)
    );
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(3))
    );
    // Both generations measured, with no side effects; generation 1's
    // cost is the accounting its quiesce kept before removing its groups,
    // so the attempt's cost is known: some memory within the shape.
    let measured = rec.observation.expect("every generation measured");
    let cost = measured.cost.expect("both generations' accounting");
    assert!(
        cost.peak_memory_bytes > 0 && cost.peak_memory_bytes <= 268_435_456,
        "{cost:?}"
    );
    assert_eq!(
        measured.externality,
        lc_core::observation::ExternalityObservation::no_network_path()
    );
    assert_eq!(rig.balances(tenant).await, (4, 4, 0, 0));
    assert_eq!(rig.provider.inventory().await.unwrap(), vec![]);
    rig.assert_audit((4, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_blob_fails_the_restore_once_and_leaves_the_exec_parked() {
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(4).await;
    let (owner, _, head) = parked_exec(&rig, tenant).await;
    let exec = owner.exec;

    // b.txt's blob in the provider's blob store no longer has its bytes.
    let manifest = lc_core::snapshot::Manifest::from_canonical(
        &rig.store
            .snapshot_manifest(tenant, exec, head)
            .await
            .unwrap(),
    )
    .unwrap();
    let Some(lc_core::snapshot::Entry {
        kind: lc_core::snapshot::EntryKind::File { sha256, .. },
        ..
    }) = manifest.entry("b.txt")
    else {
        panic!("b.txt is a file of the snapshot: {manifest:?}");
    };
    let blob = rig.provider.blobs().path_of(sha256);
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, b"not the bytes of b.txt").unwrap();

    let g2 = rig
        .request_and_prepare_resume(&owner, tenant, head, "r-1")
        .await;
    assert_eq!(rig.balances(tenant).await, (4, 3, 1, 0));
    let r = rig.certain_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.start_failed, r.restore_failed, r.allocated, r.attached),
        (1, 1, 0, 0)
    );
    assert_eq!(r.start_refusals.len(), 1);
    let refusal = &r.start_refusals[0];
    assert_eq!(
        (refusal.lease_id, refusal.action, refusal.code.as_str()),
        (Some(g2.lease_id), "restore", "restore_failed")
    );
    let want = format!(
        "restore failed (blob_corrupt) at \"b.txt\" blob {}: ",
        sha256.to_hex()
    );
    assert!(refusal.message.starts_with(&want), "{}", refusal.message);
    let w = rig.lease(exec).await.unwrap();
    assert_eq!(
        (w.generation, w.state, w.attempt_parked),
        (Generation(2), LeaseState::ReleasePending, true)
    );

    // The destroy returns generation 2's unit and the attempt stays parked.
    let r = rig.certain_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.destroyed, r.parked, r.released, r.units_returned),
        (1, 1, 0, 1)
    );
    assert_eq!(rig.balances(tenant).await, (4, 4, 0, 0));
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.lease_state),
        (ExecState::Hibernated, None, Some(LeaseState::Released))
    );
    let ws = rig.store.workspace(tenant, exec).await.unwrap();
    assert_eq!((ws.head, ws.snapshots), (Some(head), 1));
    // Not retried: nothing is due any more.
    for _ in 0..2 {
        let r = rig.certain_step().await;
        assert_eq!(
            (r.leases_seen, r.start_failed, r.units_returned, r.failures),
            (0, 0, 0, vec![])
        );
    }
    assert_eq!(rig.provider.inventory().await.unwrap(), vec![]);
    rig.assert_audit((4, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_exec_is_sealed_once_on_a_certain_cut_and_never_while_uncertain() {
    let mut rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(2).await;
    let idle_ttl = SignedDuration::from_millis(500);
    let exec = rig
        .admit_request(
            tenant,
            "e-1",
            &ExecRequest {
                runtime: "base".into(),
                shape: "small".into(),
                command: vec!["sleep".into(), "1000".into()],
                timeout_ms: None,
                stdin_open: false,
                idle_ttl_ms: Some(500),
                on_timeout: lc_core::OnTimeout::Terminate,
            },
        )
        .await;
    let admitted = rig.exec(tenant, exec).await.admitted_cut;

    // Uncertain from here (the cut advances, recovering): the allocation
    // goes on, no seal does.
    rig.restart_sampler(RECOVERY_GRACE_LONG).await;
    let due = admitted.checked_add(idle_ttl).unwrap();
    let uncertain = rig.wait_reading(|r| !r.certain && r.cut >= due).await;
    let r = rig.rec.step().await.unwrap();
    assert!(!r.at.certain);
    assert_eq!(
        (
            r.allocated,
            r.hibernations_sealed,
            r.hibernations_unfinished,
            r.failures
        ),
        (1, 0, 0, vec![])
    );
    let r = rig.rec.step().await.unwrap();
    assert!(!r.at.certain && r.at.cut >= uncertain.cut);
    assert_eq!((r.hibernations_sealed, r.hibernations_unfinished), (0, 0));
    let at = rig.reading().await;
    assert!(!at.certain);
    assert_eq!(rig.store.due_hibernations(at, 10).await.unwrap(), vec![]);

    // Certain again: the first step seals it, at its own cut, once.
    rig.restart_sampler(RECOVERY_GRACE).await;
    let r = rig.certain_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.hibernations_sealed, r.hibernations_unfinished), (1, 1));
    let sealed_at = r.at.cut;
    let later = rig.wait_reading(|x| x.certain && x.cut > sealed_at).await;
    let hs = rig.store.due_hibernations(later, 10).await.unwrap();
    assert_eq!(hs.len(), 1);
    assert_eq!(
        (
            hs[0].exec_id,
            hs[0].generation,
            hs[0].reason,
            hs[0].step,
            hs[0].sealed_cut
        ),
        (
            exec,
            Generation(1),
            lc_core::HibernationReason::Idle,
            lc_core::HibernationStep::Sealed,
            sealed_at
        )
    );
    for _ in 0..2 {
        let r = rig.certain_step().await;
        assert!(r.at.cut > sealed_at);
        assert_eq!(
            (r.hibernations_sealed, r.hibernations_unfinished, r.failures),
            (0, 1, vec![])
        );
    }
    // The exec still runs: sealing stops nothing (its owner does).
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (rec.state, rec.lease_state),
        (ExecState::Running, Some(LeaseState::Active))
    );
    assert_eq!(rig.balances(tenant).await, (2, 1, 1, 0));
}

impl Rig {
    /// The tenant queues `bytes` (`eof`) under `key`; the owner delivers
    /// it to generation `(lease, g)`'s supervisor and records it sent.
    /// Returns its input seq.
    async fn deliver_input(
        &self,
        o: &Owner,
        tenant: TenantId,
        (lease, g): (SandboxLeaseId, Generation),
        key: &str,
        bytes: &[u8],
        eof: bool,
    ) -> i64 {
        use lc_core::store::GatewayStore as _;
        let at = self.wait_reading(|r| r.certain).await;
        let input = self
            .store
            .send_input(
                &OperationKey::new(
                    key,
                    lc_core::input::input_request_sha256(Digest::of(bytes), eof),
                )
                .unwrap(),
                at,
                tenant,
                o.exec,
                bytes,
                eof,
            )
            .await
            .expect("send input");
        let seq = input.input_seq;
        let queued = self
            .store
            .queued_inputs(&o.cred, o.exec, at, 10)
            .await
            .expect("queued inputs");
        assert_eq!(
            queued.iter().map(|i| i.input_seq).collect::<Vec<_>>(),
            vec![seq]
        );
        assert_eq!(
            self.provider
                .send(lease, g, o.cred.fence, seq, bytes.to_vec(), eof)
                .await
                .expect("supervisor send"),
            seq
        );
        self.store
            .record_send(&o.cred, o.exec, at, &format!("send-{seq}"), seq)
            .await
            .expect("record send");
        seq
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_generation_takes_the_inputs_after_the_ones_delivered_before() {
    use lc_core::store::GatewayStore as _;
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(4).await;
    let exec = rig
        .admit_request(
            tenant,
            "e-1",
            &ExecRequest {
                runtime: "base".into(),
                shape: "small".into(),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    "if [ -e /workspace/gen1 ]; then cat; exit 0; fi; touch /workspace/gen1; \
                     read line; echo \"got $line\"; echo ready; exec sleep 1000"
                        .into(),
                ],
                timeout_ms: None,
                stdin_open: true,
                idle_ttl_ms: None,
                on_timeout: lc_core::OnTimeout::Terminate,
            },
        )
        .await;
    let r = rig.certain_step().await;
    assert_eq!((r.allocated, r.failures), (1, vec![]));
    let g1 = rig.lease(exec).await.unwrap();
    let owner = rig.take_over(tenant, exec, 0x22).await;
    let one = rig
        .deliver_input(
            &owner,
            tenant,
            (g1.lease_id, g1.generation),
            "i-1",
            b"one\n",
            false,
        )
        .await;
    assert_eq!(one, 1);
    let moved = rig
        .move_pages(&owner, g1.lease_id, g1.generation, 0, |ps| {
            stdout_of(ps).ends_with("ready\n")
        })
        .await;
    assert_eq!(stdout_of(&moved), "got one\nready\n");
    let at = rig.wait_reading(|r| r.certain).await;
    rig.store
        .request_hibernation(
            &OperationKey::new("h-1", Digest::of(b"h-1")).unwrap(),
            at,
            tenant,
            exec,
        )
        .await
        .expect("request hibernation");
    let (stopped_seq, head) = rig
        .stop_and_quiesce(
            &owner,
            g1.lease_id,
            g1.generation,
            moved.last().unwrap().seq(),
        )
        .await;
    let r = rig.certain_step().await;
    assert_eq!((r.parked, r.units_returned, r.failures), (1, 1, vec![]));
    // The quiescence released the ownership; take the parked exec over.
    let owner = rig.take_over(tenant, exec, 0x22).await;

    let g2 = rig
        .request_and_prepare_resume(&owner, tenant, head, "r-1")
        .await;
    assert_eq!((g2.first_seq, g2.first_input_seq), (stopped_seq + 1, 2));
    let r = rig.certain_step().await;
    assert_eq!((r.attached, r.awaiting_resume, r.failures), (1, 1, vec![]));
    let at = rig.wait_reading(|r| r.certain).await;
    rig.store
        .commit_resume(&owner.cred, exec, at, "r-1")
        .await
        .expect("commit resume");
    let r = rig.certain_step().await;
    assert_eq!((r.allocated, r.failures), (1, vec![]));

    // Input 2 is generation 2's first: its supervisor takes it as such.
    let two = rig
        .deliver_input(
            &owner,
            tenant,
            (g2.lease_id, g2.generation),
            "i-2",
            b"two\n",
            true,
        )
        .await;
    assert_eq!(two, 2);
    let moved = rig
        .move_pages(&owner, g2.lease_id, g2.generation, stopped_seq, |ps| {
            ps.last().is_some_and(|p| p.kind() == PageKind::Terminal)
        })
        .await;
    assert_eq!(stdout_of(&moved), "two\n");
    let at = rig.wait_reading(|r| r.certain).await;
    rig.store
        .release(&owner.cred, exec, at, "release-1")
        .await
        .expect("release");
    let r = rig.certain_step().await;
    assert_eq!(
        (r.released, r.parked, r.units_returned, r.failures),
        (1, 0, 1, vec![])
    );
    let rec = rig.exec(tenant, exec).await;
    assert_eq!((rec.state, rec.exit_code), (ExecState::Terminal, Some(0)));
    assert_eq!(rig.balances(tenant).await, (4, 4, 0, 0));
    rig.assert_audit((4, 0, 0)).await;
}

/// The rig's provider, except that an allocate of a lease in `silent` is
/// carried out by the provider and then never answered (once): a provider
/// that took the call and went silent, as one whose start a command could
/// stall did.
struct Silent {
    inner: Arc<BwrapProvider>,
    silent: std::sync::Mutex<Vec<SandboxLeaseId>>,
}

#[async_trait::async_trait]
impl Provider for Silent {
    fn id(&self) -> &lc_core::ProviderId {
        self.inner.id()
    }

    fn public_key(&self) -> ed25519_dalek::VerifyingKey {
        self.inner.public_key()
    }

    async fn allocate(
        &self,
        req: lc_provider::AllocateRequest,
    ) -> Result<lc_provider::Allocation, ProviderError> {
        let lease = req.lease_id;
        let a = self.inner.allocate(req).await?;
        let silent = {
            let mut s = self.silent.lock().unwrap();
            let found = s.contains(&lease);
            s.retain(|l| *l != lease);
            found
        };
        if silent {
            std::future::pending::<()>().await;
        }
        Ok(a)
    }

    async fn destroy(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        self.inner.destroy(lease_id, generation).await
    }

    async fn prove_not_sent(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        self.inner.prove_not_sent(lease_id, generation).await
    }

    async fn measure(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        self.inner.measure(lease_id, generation).await
    }

    async fn observe(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        self.inner.observe(lease_id, generation).await
    }

    async fn pages(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: lc_core::owner::OwnerFence,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<lc_core::page::Page>, ProviderError> {
        self.inner
            .pages(lease_id, generation, fence, after_seq, max)
            .await
    }

    async fn ack(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: lc_core::owner::OwnerFence,
        through_seq: i64,
    ) -> Result<(), ProviderError> {
        self.inner
            .ack(lease_id, generation, fence, through_seq)
            .await
    }

    async fn cancel(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: lc_core::owner::OwnerFence,
    ) -> Result<(), ProviderError> {
        self.inner.cancel(lease_id, generation, fence).await
    }

    async fn send(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: lc_core::owner::OwnerFence,
        input_seq: i64,
        bytes: Vec<u8>,
        eof: bool,
    ) -> Result<i64, ProviderError> {
        self.inner
            .send(lease_id, generation, fence, input_seq, bytes, eof)
            .await
    }

    async fn spool_status(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Option<lc_core::page::SpoolStatus>, ProviderError> {
        self.inner.spool_status(lease_id, generation).await
    }
}

/// The bound on the reconciler's provider calls in the hostile-tenant
/// test: well above a healthy answer, well below the Lease TTL.
const CALL_TIMEOUT_SHORT: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_exec_delays_no_other_tenants_allocation_and_its_own_lease_expires() {
    let rig = Rig::start(TTL_SHORT, ReconcilerOptions::default()).await;
    let silent = Arc::new(Silent {
        inner: rig.provider.clone(),
        silent: std::sync::Mutex::new(Vec::new()),
    });
    let rec = Reconciler::new(
        rig.store.clone(),
        vec![silent.clone() as Arc<dyn Provider>],
        rig.clock.clone(),
        ReconcilerOptions {
            provider_call_timeout: CALL_TIMEOUT_SHORT,
            ..ReconcilerOptions::default()
        },
    )
    .unwrap();
    let red = rig.tenant_named("t-red", "red", 1).await;
    let blue = rig.tenant_named("t-blue", "blue", 1).await;
    // Red's command stops its supervisor (its parent, PID 2 of the
    // instance) the moment it runs, and its provider call goes unanswered.
    let hostile = rig
        .admit(red, "e-red", &["sh", "-c", "kill -STOP $PPID; echo never"])
        .await;
    let ordinary = rig.admit(blue, "e-blue", &["sh", "-c", "echo hi"]).await;
    let h = rig.lease(hostile).await.unwrap();
    let o = rig.lease(ordinary).await.unwrap();
    silent.silent.lock().unwrap().push(h.lease_id);
    assert_eq!(rig.balances(red).await, (1, 0, 1, 0));
    assert_eq!(rig.balances(blue).await, (1, 0, 1, 0));

    // One step: blue is allocated and active, red's allocation ends with
    // its code and stays to be retried.
    let r = tokio::time::timeout(WAIT_MAX, rec.step())
        .await
        .expect("a step ends although a provider call never answers")
        .unwrap();
    assert_eq!(
        (r.leases_seen, r.allocated, r.start_failed, r.start_refusals),
        (2, 1, 0, vec![])
    );
    assert_eq!(
        r.failures,
        vec![lc_worker::LeaseFailure {
            lease_id: Some(h.lease_id),
            action: "allocate",
            code: "provider_timeout".into(),
            message: format!(
                "the provider's allocate call did not answer within {CALL_TIMEOUT_SHORT:?}; the lease is handled again at the next step"
            ),
        }]
    );
    assert_eq!(rig.lease(ordinary).await.unwrap().state, LeaseState::Active);
    assert_eq!(
        rig.lease(hostile).await.unwrap().state,
        LeaseState::Allocating
    );

    // The next step's allocate is answered with the instance the silent
    // call started: one instance, never two.
    let r = rec.step().await.unwrap();
    assert_eq!((r.allocated, r.start_failed), (1, 0));
    assert_eq!(rig.lease(hostile).await.unwrap().state, LeaseState::Active);
    let supervisors = || -> Vec<(i32, String)> {
        rig.pids(&h)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .unwrap_or_default()
                    .starts_with(b"/.lc/supervisor\0")
            })
            .map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let state = stat
                    .rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("")
                    .to_owned();
                (pid, state)
            })
            .collect()
    };
    // Once the command has stopped its supervisor it has run (a child
    // between fork and exec still shows the supervisor's command line).
    let t = Instant::now();
    while !supervisors().iter().any(|(_, state)| state == "T") {
        assert!(
            t.elapsed() < WAIT_MAX,
            "the command never stopped its supervisor"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let found = supervisors();
    assert_eq!(
        found.len(),
        1,
        "one instance of the hostile lease: {found:?}"
    );

    // Blue runs to its end and is released by its gateway; red's stopped
    // supervisor answers nothing, so its Lease is not renewed and expires.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut failures: Vec<(Option<SandboxLeaseId>, String)> = Vec::new();
    let mut released = 0;
    let mut units_returned = 0;
    loop {
        let g = rig.gateway.step().await;
        for f in &g.failures {
            assert_eq!(
                (f.exec_id, f.code.as_str()),
                (Some(hostile), "provider_timeout"),
                "{f:?}"
            );
        }
        let r = rec.step().await.unwrap();
        released += r.released;
        units_returned += r.units_returned;
        failures.extend(r.failures.iter().map(|f| (f.lease_id, f.code.clone())));
        let done = rig.exec(red, hostile).await.state == ExecState::Terminal
            && rig.exec(blue, ordinary).await.state == ExecState::Terminal;
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "not done within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Only red's calls failed, each for want of an answer.
    for f in &failures {
        assert_eq!((f.0, f.1.as_str()), (Some(h.lease_id), "provider_timeout"));
    }
    // Both releases are committed by the reconciler, each unit once.
    assert_eq!((released, units_returned), (2, 2));
    let rec_o = rig.exec(blue, ordinary).await;
    assert_eq!(
        (rec_o.terminal_reason, rec_o.exit_code, rec_o.lease_state),
        (
            Some(TerminalReason::Exited),
            Some(0),
            Some(LeaseState::Released)
        )
    );
    let (_, stdout) = output_of(&rig, blue, ordinary, PageKind::Stdout).await;
    assert_eq!(stdout, b"hi\n");
    let rec_h = rig.exec(red, hostile).await;
    assert_eq!(
        (rec_h.terminal_reason, rec_h.exit_code, rec_h.lease_state),
        (
            Some(TerminalReason::Expired),
            None,
            Some(LeaseState::Released)
        )
    );
    assert!(
        !rig.provider
            .instance_cgroup(h.lease_id, h.generation)
            .exists()
    );
    assert!(
        !rig.provider
            .instance_cgroup(o.lease_id, o.generation)
            .exists()
    );
    assert_eq!(rig.balances(red).await, (1, 1, 0, 0));
    assert_eq!(rig.balances(blue).await, (1, 1, 0, 0));
    rig.assert_audit((2, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_without_a_c_library_ends_its_exec_start_failed() {
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    // dash alone: neither the supervisor nor dash can run without the C
    // library and its loader, so the command is never released.
    let src = rig.dir.join("src-no-libc");
    std::fs::create_dir_all(src.join("bin")).unwrap();
    std::fs::copy(
        std::fs::canonicalize("/bin/dash").unwrap(),
        src.join("bin/sh"),
    )
    .unwrap();
    let imported = rig
        .provider
        .runtimes()
        .import_dir(&src, lc_provider::runtime::ImportLimits::default())
        .unwrap();
    rig.register_runtime(
        "bare",
        imported.digest,
        serde_json::from_slice(&imported.manifest.canonical()).unwrap(),
    )
    .await;
    let tenant = rig.tenant(1).await;
    let exec = rig
        .admit_on(tenant, "e-1", "bare", &["sh", "-c", "echo ran"])
        .await;
    let w = rig.lease(exec).await.unwrap();

    let r = rig.step().await;
    assert_eq!(
        (r.leases_seen, r.allocated, r.start_failed, r.failures),
        (1, 0, 1, vec![])
    );
    assert_eq!(r.start_refusals.len(), 1);
    let refusal = &r.start_refusals[0];
    assert_eq!(
        (refusal.lease_id, refusal.action, refusal.code.as_str()),
        (Some(w.lease_id), "allocate", "start_failed")
    );
    assert!(
        refusal.message.starts_with(
            "instance start failed: bwrap exited with exit status: 1: bwrap: execvp /.lc/supervisor: No such file or directory"
        ),
        "{}",
        refusal.message
    );
    let pending = rig.lease(exec).await.unwrap();
    assert_eq!(
        (pending.state, pending.terminal_reason),
        (
            LeaseState::ReleasePending,
            Some(TerminalReason::StartFailed)
        )
    );

    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!(totals.failures, Vec::<String>::new());
    assert_eq!((totals.units_returned, totals.start_failed), (1, 0));
    let rec = rig.exec(tenant, exec).await;
    assert_eq!(
        (
            rec.state,
            rec.terminal_reason,
            rec.exit_code,
            rec.lease_state
        ),
        (
            ExecState::Terminal,
            Some(TerminalReason::StartFailed),
            None,
            Some(LeaseState::Released)
        )
    );
    assert_eq!(
        rig.store.output(tenant, exec, 0, 10).await.unwrap(),
        Vec::<lc_core::owner::StoredPage>::new()
    );
    assert_eq!(rig.balances(tenant).await, (1, 1, 0, 0));
    rig.assert_audit((1, 0, 0)).await;
}

/// Two workers (two activations, each over its own store on one database)
/// with short claims: each Lease is allocated by exactly one of them, and
/// each step of each sees only the Leases it claimed; once one stops, the
/// other takes its Leases only when a certain cut has reached their claims'
/// expiry + grace, and the stopped one's writes are refused `claim_stale`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_allocate_each_lease_once_and_take_a_stopped_one_s_only_after_expiry_plus_grace()
 {
    use lc_core::claim::{ClaimCredential, ClaimGeneration, ClaimItem, ClaimKind};
    use lc_core::owner::TakeoverBasis;
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let claims = lc_pg::LcConfig {
        claim_ttl: SignedDuration::from_secs(1),
        claim_grace: SignedDuration::from_secs(1),
        ..lc_pg::LcConfig::default()
    };
    let w1 = rig.worker(
        connect_store_with(&rig.url, claims).await,
        ReconcilerOptions::default(),
    );
    let w2 = rig.worker(
        connect_store_with(&rig.url, claims).await,
        ReconcilerOptions::default(),
    );
    assert_ne!(w1.holder(), w2.holder());
    let tenant = rig.tenant(4).await;
    let first = [
        rig.admit(tenant, "e-1", &["sleep", "600"]).await,
        rig.admit(tenant, "e-2", &["sleep", "600"]).await,
    ];
    let r = w1.step().await.unwrap();
    assert_eq!((r.leases_seen, r.allocated, r.failures), (2, 2, vec![]));
    let second = [
        rig.admit(tenant, "e-3", &["sleep", "600"]).await,
        rig.admit(tenant, "e-4", &["sleep", "600"]).await,
    ];
    // w1's claims are live: w2 takes only the two new Leases.
    let r = w2.step().await.unwrap();
    assert_eq!((r.leases_seen, r.allocated, r.failures), (2, 2, vec![]));
    // Both at once, a few times: each sees its own two, none allocates again.
    for _ in 0..3 {
        let (r1, r2) = tokio::join!(w1.step(), w2.step());
        let (r1, r2) = (r1.unwrap(), r2.unwrap());
        assert_eq!((r1.leases_seen, r1.allocated, r1.failures), (2, 0, vec![]));
        assert_eq!((r2.leases_seen, r2.allocated, r2.failures), (2, 0, vec![]));
    }
    assert_eq!(rig.provider.inventory().await.unwrap().len(), 4);
    for e in first.iter().chain(&second) {
        assert_eq!(rig.lease(*e).await.unwrap().state, LeaseState::Active);
    }
    let at = rig.reading().await;
    let listed = rig.store.claims(at, None, 10).await.unwrap();
    let holders: Vec<_> = listed
        .iter()
        .map(|c| (c.claim.holder_sha256, c.claim.generation))
        .collect();
    let (h1, h2) = (w1.holder().sha256(), w2.holder().sha256());
    assert_eq!(
        holders,
        [
            (h1, ClaimGeneration(1)),
            (h1, ClaimGeneration(1)),
            (h2, ClaimGeneration(1)),
            (h2, ClaimGeneration(1)),
        ]
    );
    // w1 stops. Its claims' latest expiry + grace is when w2 may take them.
    let takeable_at =
        listed[..2].iter().map(|c| c.claim.expiry).max().unwrap() + SignedDuration::from_secs(1);
    let deadline = Instant::now() + WAIT_MAX;
    let taken = loop {
        let r = w2.step().await.unwrap();
        assert_eq!(r.failures, vec![]);
        if r.at.certain && r.at.cut >= takeable_at {
            break r;
        }
        assert_eq!(r.leases_seen, 2, "taken before expiry + grace: {:?}", r.at);
        assert!(
            Instant::now() < deadline,
            "no certain cut past {takeable_at}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((taken.leases_seen, taken.allocated), (4, 0));
    let listed = rig.store.claims(taken.at, None, 10).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|c| (c.claim.holder_sha256, c.claim.generation, c.claim.basis))
            .collect::<Vec<_>>(),
        [
            (h2, ClaimGeneration(2), TakeoverBasis::Expired),
            (h2, ClaimGeneration(2), TakeoverBasis::Expired),
            (h2, ClaimGeneration(1), TakeoverBasis::Unowned),
            (h2, ClaimGeneration(1), TakeoverBasis::Unowned),
        ]
    );
    // w1 comes back: w2's claims are live, so it sees nothing, and a write
    // under its old claim is refused and changes nothing.
    let r = w1.step().await.unwrap();
    assert_eq!((r.leases_seen, r.failures), (0, vec![]));
    let lease = rig.lease(first[0]).await.unwrap();
    let old = ClaimCredential {
        item: ClaimItem {
            kind: ClaimKind::Lease,
            id: lease.lease_id.0,
        },
        holder: w1.holder(),
        generation: ClaimGeneration(1),
    };
    let at = rig.reading().await;
    let e = rig
        .store
        .claimed(old)
        .renew(lease.lease_id, lease.generation, at)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "claim_stale");
    assert_eq!(rig.lease(first[0]).await.unwrap().expiry, lease.expiry);
    assert_eq!(rig.provider.inventory().await.unwrap().len(), 4);
    assert_eq!(rig.balances(tenant).await, (4, 0, 4, 0));
}

/// A real command's output deleted (2 s of grace) is purged by the
/// reconciler's step, once, only on a certain cut past its purge_after;
/// the exec itself stays for its retention, Tollgate's ledger untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_purges_a_deleted_output_once_past_its_grace_and_keeps_the_exec() {
    use lc_core::deletion::{DeletedItem, PurgeReport};
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions {
            purge_batch: 1,
            ..ReconcilerOptions::default()
        },
    )
    .await;
    // The control plane's store: the deletion's grace and the exec's
    // retention are taken where they are recorded.
    let control = lc_pg::LcStore::connect(
        &rig.url,
        tollgate::GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5))
            .unwrap(),
        tollgate::CapabilityKey::new(&SECRET).unwrap(),
        lc_pg::LcConfig {
            deletion_grace: SignedDuration::from_secs(2),
            max_connections: 2,
            ..lc_pg::LcConfig::default()
        },
    )
    .await
    .expect("control store");
    let tenant = rig.tenant(4).await;
    let exec = rig.admit(tenant, "p-1", &["sh", "-c", "echo purged"]).await;
    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!(totals.failures, Vec::<String>::new());
    let (_, stdout) = output_of(&rig, tenant, exec, PageKind::Stdout).await;
    assert_eq!(stdout, b"purged\n");
    // Every page of its one attempt (a stdout page and the terminal page).
    let pages = rig.store.output(tenant, exec, 0, 64).await.unwrap().len();
    let at = rig.wait_reading(|r| r.certain).await;
    let d = control
        .delete_item(
            &OperationKey::new("p-del", Digest::of(b"p-del")).unwrap(),
            at,
            tenant,
            exec,
            DeletedItem::Output,
        )
        .await
        .unwrap();
    assert!(pages >= 2, "{pages}");
    // Steps before the cut passed purge_after purge nothing.
    let r = rig.step().await;
    assert!(
        r.at.cut < d.purge_after,
        "{} >= {}",
        r.at.cut,
        d.purge_after
    );
    assert_eq!(r.purged, PurgeReport::default());
    rig.wait_reading(|r| r.certain && r.cut >= d.purge_after)
        .await;
    let r = rig.step().await;
    assert_eq!(
        r.purged,
        PurgeReport {
            workspaces_purged: 0,
            outputs_purged: 1,
            rows_purged: u64::try_from(pages).unwrap(),
            execs_purged: 0,
        }
    );
    assert_eq!(
        rig.store
            .output(tenant, exec, 0, 10)
            .await
            .unwrap_err()
            .code(),
        "output_purged"
    );
    let r = rig.step().await;
    assert_eq!(r.purged, PurgeReport::default());
    // The exec itself is retained 30 days (the default): it stays.
    assert_eq!(rig.exec(tenant, exec).await.state, ExecState::Terminal);
    rig.assert_audit((4, 0, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_approval_starts_nothing_and_returns_its_unit_once() {
    use lc_core::approval::{ApprovalPolicy, ApprovalRequire, ApproverKind};
    let rig = Rig::start(
        lc_core::rules::LEASE_TTL_DEFAULT,
        ReconcilerOptions::default(),
    )
    .await;
    let tenant = rig.tenant(1).await;
    let key = |k: &str| OperationKey::new(k, Digest::of(k.as_bytes())).unwrap();
    let at = rig.reading().await;
    let all = ApprovalPolicy::new(ApprovalRequire::All, &[]).unwrap();
    rig.store
        .set_approval_policy(&key("pol"), at, tenant, &all)
        .await
        .unwrap();
    let exec = rig.admit(tenant, "e-1", &["sleep", "600"]).await;
    assert_eq!(
        rig.exec(tenant, exec).await.state,
        ExecState::AwaitingApproval
    );
    // Awaiting: nothing for the reconciler, nothing held.
    let r = rig.step().await;
    assert_eq!((r.leases_seen, r.allocated, r.failures), (0, 0, vec![]));
    assert_eq!(rig.balances(tenant).await, (1, 1, 0, 0));
    // Approved for 1 ms: the unit is held, but the reconciler steps only
    // once a certain cut has reached valid_until.
    let at = rig.reading().await;
    let rec = rig
        .store
        .approve(&key("ap"), at, tenant, exec, ApproverKind::Tenant, Some(1))
        .await
        .unwrap();
    let vu = rec.approval.unwrap().valid_until.unwrap();
    assert_eq!(vu, at.cut + SignedDuration::from_millis(1));
    assert_eq!(rig.balances(tenant).await, (1, 0, 1, 0));
    rig.wait_reading(|r| r.certain && r.cut >= vu).await;
    let r = rig.step().await;
    assert!(r.at.certain && r.at.cut >= vu);
    assert_eq!((r.allocated, r.releases_begun, r.failures), (0, 1, vec![]));
    let w = rig.lease(exec).await.unwrap();
    assert_eq!(
        (w.state, w.terminal_reason),
        (
            LeaseState::ReleasePending,
            Some(TerminalReason::ApprovalExpired)
        )
    );
    // Never started on the provider.
    assert!(rig.pids(&w).is_empty());
    let r = rig.step().await;
    assert_eq!(
        (r.destroyed, r.released, r.units_returned, r.failures),
        (1, 1, 1, vec![])
    );
    let done = rig.exec(tenant, exec).await;
    assert_eq!(
        (done.state, done.terminal_reason, done.lease_state),
        (
            ExecState::Terminal,
            Some(TerminalReason::ApprovalExpired),
            Some(LeaseState::Released)
        )
    );
    // Once: a further step returns nothing.
    let r = rig.step().await;
    assert_eq!((r.leases_seen, r.units_returned), (0, 0));
    assert_eq!(rig.balances(tenant).await, (1, 1, 0, 0));
    rig.assert_audit((1, 0, 0)).await;
}
