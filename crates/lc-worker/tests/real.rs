//! The reconciler's step against the real parts: a fresh database on the
//! harness cluster (Tollgate and Little Compute migrated), a real safe-time
//! sampler publishing the cut in process, LcStore, and a real bubblewrap
//! provider running real commands. A command runs to its terminal page,
//! its output lands exactly once and in order, its Reservation returns
//! exactly once (exact balances, a clean Tollgate audit); with the sampler
//! stopped (the cut uncertain) the destroy is retried but nothing is
//! released and no capacity returns until a new sampler makes the cut
//! certain again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_core::store::{ControlStore, ReconcileStore};
use lc_core::{CutReading, Digest, ExecId, ExecRequest, ExecState, OperationKey, TenantId};
use lc_provider::{BwrapConfig, BwrapProvider, Provider};
use lc_worker::{ProviderAdapter, ProviderPort, Reconciler, ReconcilerOptions, StepReport};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use tokio::sync::watch;

const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
const SECRET: [u8; 32] = [0x5a; 32];
static COUNTER: AtomicU32 = AtomicU32::new(0);

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
        .expect("sampler config"),
        standby_poll: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(500),
    }
}

/// `lc-supervisor` beside this test's profile directory, built when missing.
fn supervisor_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let bin = profile.join("lc-supervisor");
    if !bin.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "-p", "lc-supervisor"]);
        if profile.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("cargo runs").success());
    }
    assert!(bin.is_file(), "{} missing", bin.display());
    bin
}

struct Rig {
    url: String,
    store: Arc<lc_pg::LcStore>,
    clock: Arc<SafeCutClock>,
    provider: Arc<BwrapProvider>,
    rec: Reconciler,
    sampler_stop: watch::Sender<bool>,
    sampler: tokio::task::JoinHandle<()>,
    dir: PathBuf,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.sampler_stop.send(true);
        let parent = self.provider.config().cgroup_parent.clone();
        let _ = std::fs::remove_dir_all(&self.dir);
        for c in ["memory", "pids", "cpu"] {
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(&parent));
        }
    }
}

fn start_sampler(url: &str) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let sampler = Sampler::new(url, sampler_options()).expect("sampler");
    let (stop, rx) = watch::channel(false);
    (stop, tokio::spawn(async move { sampler.run(rx).await }))
}

impl Rig {
    async fn start() -> Rig {
        let db = tollgate_pg_harness::shared().await.fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.expect("migrate");
        let (sampler_stop, sampler) = start_sampler(&url);
        let store = Arc::new(
            lc_pg::LcStore::connect(
                &url,
                tollgate::GrantPolicy::new(
                    SignedDuration::from_hours(1),
                    SignedDuration::from_secs(5),
                )
                .unwrap(),
                tollgate::CapabilityKey::new(&SECRET).unwrap(),
                lc_pg::LcConfig {
                    max_connections: 4,
                    acquire_timeout: Duration::from_secs(30),
                    ..lc_pg::LcConfig::default()
                },
            )
            .await
            .expect("store"),
        );
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
        let port = ProviderAdapter::new(provider.clone() as Arc<dyn Provider>);
        store
            .register_provider(port.id(), "http://127.0.0.1:9", port.public_key())
            .await
            .expect("register provider");
        let rec = Reconciler::new(
            store.clone(),
            vec![Arc::new(port) as Arc<dyn ProviderPort>],
            clock.clone(),
            ReconcilerOptions::default(),
        )
        .unwrap();
        let rig = Rig {
            url,
            store,
            clock,
            provider,
            rec,
            sampler_stop,
            sampler,
            dir,
        };
        rig.wait_certain(true).await;
        let at = rig.reading().await;
        let base = lc_core::manifest::Manifest::base();
        rig.store
            .register_runtime(
                &OperationKey::new("setup-base", Digest([1; 32])).unwrap(),
                at,
                "base",
                Digest(base.digest()),
                serde_json::from_slice(&base.canonical()).unwrap(),
            )
            .await
            .expect("base runtime");
        rig
    }

    async fn reading(&self) -> CutReading {
        self.rec.reading().await.expect("clock")
    }

    /// Waits (bounded) until the clock's certainty is `certain`.
    async fn wait_certain(&self, certain: bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self
                .clock
                .read()
                .await
                .is_ok_and(|r| r.is_certain() == certain)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cut did not become certain={certain}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn tenant(&self, units: i64) -> TenantId {
        let at = self.reading().await;
        self.store
            .create_tenant(
                &OperationKey::new("t-1", Digest([2; 32])).unwrap(),
                at,
                "blue",
                Some(units),
                &|id| Digest::of(format!("key-{}", id.0).as_bytes()),
            )
            .await
            .expect("tenant")
            .tenant_id
    }

    async fn admit(&self, tenant: TenantId, key: &str, argv: &[&str]) -> ExecId {
        let at = self.reading().await;
        self.store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                at,
                tenant,
                &ExecRequest {
                    runtime: "base".into(),
                    shape: "small".into(),
                    command: argv.iter().map(|s| s.to_string()).collect(),
                    timeout_ms: None,
                },
            )
            .await
            .expect("admit")
            .exec_id
    }

    /// Steps until `done` holds for the sum of the reports (bounded).
    async fn step_until(&self, done: impl Fn(&Totals) -> bool) -> Totals {
        let mut t = Totals::default();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&t) {
            assert!(Instant::now() < deadline, "not done within 60 s: {t:?}");
            let r = self.rec.step().await.expect("step");
            t.add(&r);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        t
    }
}

#[derive(Debug, Default, Clone)]
struct Totals {
    allocated: usize,
    pages_appended: usize,
    pages_duplicate: usize,
    releases_begun: usize,
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
        self.pages_appended += r.pages_appended;
        self.pages_duplicate += r.pages_duplicate;
        self.releases_begun += r.releases_begun;
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
}

async fn stdout_of(store: &lc_pg::LcStore, tenant: TenantId, exec: ExecId) -> (Vec<i64>, Vec<u8>) {
    let pages = store.output(tenant, exec, 0, 1000).await.expect("output");
    let seqs = pages.iter().map(|p| p.seq).collect();
    let bytes = pages
        .iter()
        .filter(|p| p.kind == lc_core::PageKind::Stdout)
        .flat_map(|p| p.bytes.clone())
        .collect();
    (seqs, bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_command_runs_to_terminal_and_its_units_return_once() {
    let rig = Rig::start().await;
    let tenant = rig.tenant(4).await;
    let exec = rig
        .admit(
            tenant,
            "e-1",
            &["sh", "-c", "seq 1 20000; echo done >&2; exit 7"],
        )
        .await;
    let t = rig.store.tenant(tenant).await.unwrap();
    assert_eq!((t.deposited, t.available, t.held, t.consumed), (4, 3, 1, 0));

    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!(totals.failures, Vec::<String>::new());
    assert_eq!(
        (
            totals.allocated,
            totals.releases_begun,
            totals.released,
            totals.units_returned
        ),
        (1, 1, 1, 1)
    );
    let rec = rig.store.exec(tenant, exec).await.unwrap();
    assert_eq!(rec.state, ExecState::Terminal);
    assert_eq!(rec.exit_code, Some(7));
    let (seqs, stdout) = stdout_of(&rig.store, tenant, exec).await;
    let n = i64::try_from(seqs.len()).unwrap();
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "every page once, in order"
    );
    assert_eq!(totals.pages_appended, seqs.len());
    let want: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(stdout, want.as_bytes());
    let t = rig.store.tenant(tenant).await.unwrap();
    assert_eq!((t.deposited, t.available, t.held, t.consumed), (4, 4, 0, 0));

    // More steps change nothing: the units came back once.
    for _ in 0..3 {
        let r = rig.rec.step().await.unwrap();
        assert_eq!((r.leases_seen, r.released, r.units_returned), (0, 0, 0));
    }
    let t = rig.store.tenant(tenant).await.unwrap();
    assert_eq!((t.available, t.held), (4, 0));
    use tollgate::Allocator as _;
    let audit = rig.store.tollgate().audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_held,
            audit.total_consumed
        ),
        (4, 0, 0)
    );
    let _ = &rig.url;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sampler_retries_the_destroy_but_returns_nothing_until_certain() {
    let mut rig = Rig::start().await;
    let tenant = rig.tenant(2).await;
    let exec = rig.admit(tenant, "e-1", &["sh", "-c", "echo hi"]).await;
    rig.step_until(|t| t.releases_begun == 1).await;
    let t = rig.store.tenant(tenant).await.unwrap();
    assert_eq!((t.available, t.held), (1, 1));

    // The sampler stops: its last publish goes stale, the cut uncertain.
    let _ = rig.sampler_stop.send(true);
    tokio::time::timeout(Duration::from_secs(10), &mut rig.sampler)
        .await
        .expect("the sampler stops")
        .unwrap();
    rig.wait_certain(false).await;
    for _ in 0..3 {
        let r = rig.rec.step().await.unwrap();
        assert!(!r.at.certain);
        assert_eq!(r.failures, vec![]);
        assert_eq!(
            (
                r.destroyed,
                r.release_deferred,
                r.released,
                r.units_returned
            ),
            (1, 1, 0, 0)
        );
        let t = rig.store.tenant(tenant).await.unwrap();
        assert_eq!(
            (t.available, t.held),
            (1, 1),
            "no capacity returns while uncertain"
        );
        assert_ne!(
            rig.store.exec(tenant, exec).await.unwrap().state,
            ExecState::Terminal
        );
    }

    // A new sampler: a new epoch, certain after its recovery.
    let (stop, task) = start_sampler(&rig.url);
    rig.sampler_stop = stop;
    rig.sampler = task;
    rig.wait_certain(true).await;
    let totals = rig.step_until(|t| t.released == 1).await;
    assert_eq!((totals.units_returned, totals.release_deferred), (1, 0));
    let t = rig.store.tenant(tenant).await.unwrap();
    assert_eq!((t.deposited, t.available, t.held, t.consumed), (2, 2, 0, 0));
    assert_eq!(
        rig.store.exec(tenant, exec).await.unwrap().state,
        ExecState::Terminal
    );
    use tollgate::Allocator as _;
    assert!(rig.store.tollgate().audit().await.unwrap().is_clean());
}
