//! kill -9 of the worker process (a real `little-compute worker`, a real
//! SIGKILL) while commands run and a real `little-compute gateway` moves
//! their output, twice, with a real `little-compute provider` and a real
//! sampler: after the
//! restarts nothing is lost or doubled (every exec's pages are 1..n in
//! order and its stdout is exactly what the command wrote), every
//! Reservation returned exactly once (exact balances, a clean Tollgate
//! audit), and every instance is destroyed (the provider's signed
//! observation of each lease generation says it no longer runs). And
//! kill -9 of the provider, which takes its instance along: the worker
//! stops renewing the lost instance's Lease, which expires on a certain cut
//! and is released with the restarted provider's fence, returning its
//! Reservation once; the pages stored before the crash stay, in order.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_core::evidence::{InstanceState, Statement};
use lc_core::store::ControlStore;
use lc_core::{CutReading, Digest, ExecId, ExecRequest, ExecState, OperationKey, PageKind};
use lc_provider::{HttpProvider, Provider};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use tokio::sync::watch;

const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
/// 64 hex digits: the server secret file's text, whose bytes are the key.
const SECRET_TEXT: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
const EXECS: usize = 3;
const LINES: usize = 400;

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

/// The exec gateway beside the workers: it moves output into `DIR/blobs`
/// and releases exited execs.
fn gateway(url: &str, secret: &Path, dir: &Path) -> Proc {
    Proc(
        Command::new(exe())
            .args(["gateway", "--interval-ms", "20"])
            .arg("--secret-file")
            .arg(secret)
            .arg("--blob-dir")
            .arg(dir.join("blobs"))
            .args(["--safetime-gap-max-ms", "2000"])
            .env("LC_DATABASE_URL", url)
            .env_remove("LC_GATEWAY_CRASH_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join("gateway.log"))
                    .unwrap(),
            )
            .spawn()
            .unwrap(),
    )
}

/// A page's bytes: the store's, else the sink's under its digest.
fn page_bytes(dir: &Path, p: &lc_core::owner::StoredPage) -> Vec<u8> {
    use lc_blob::BlobStore as _;
    match &p.bytes {
        Some(b) => b.clone(),
        None => lc_blob::LocalBlobStore::open(dir.join("blobs"))
            .unwrap()
            .get(&p.meta.sha256)
            .unwrap()
            .expect("the page's blob"),
    }
}

fn worker(url: &str, secret: &Path, provider_url: &str, log: &Path) -> Proc {
    worker_with(url, secret, provider_url, log, &[])
}

fn worker_with(url: &str, secret: &Path, provider_url: &str, log: &Path, extra: &[&str]) -> Proc {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Proc(
        Command::new(exe())
            .args([
                "worker",
                "--provider-url",
                provider_url,
                "--interval-ms",
                "20",
            ])
            .arg("--secret-file")
            .arg(secret)
            .args(["--safetime-gap-max-ms", "2000"])
            .args(extra)
            .env("LC_DATABASE_URL", url)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

async fn reading(clock: &SafeCutClock) -> CutReading {
    let r = clock.read().await.unwrap();
    CutReading {
        cut: r.now,
        certain: r.is_certain(),
        retry_after_s: 1,
    }
}

/// Pages stored so far over all execs.
async fn stored_pages(store: &lc_pg::LcStore, tenant: lc_core::TenantId) -> usize {
    let mut n = 0;
    for e in 1..=EXECS {
        n += store
            .output(tenant, ExecId(i64::try_from(e).unwrap()), 0, 1000)
            .await
            .unwrap()
            .len();
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_loses_nothing_and_returns_every_reservation_once() {
    ensure_supervisor();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let sampler = Sampler::new(&url, sampler_options()).unwrap();
    let (sampler_stop, rx) = watch::channel(false);
    tokio::spawn(async move { sampler.run(rx).await });
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
    let deadline = Instant::now() + Duration::from_secs(30);
    while !clock.read().await.is_ok_and(|r| r.is_certain()) {
        assert!(Instant::now() < deadline, "no certain cut");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let dir = PathBuf::from(format!("/tmp/lc-wkill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, format!("{SECRET_TEXT}\n")).unwrap();
    let port = free_port();
    let provider_url = format!("http://127.0.0.1:{port}");
    let cgroup_parent = format!("little-compute-wkill-{}", std::process::id());
    let _provider = Proc(
        Command::new(exe())
            .args(["provider", "--id", "local", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--state-dir")
            .arg(dir.join("provider"))
            .args(["--cgroup-parent", &cgroup_parent])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("provider.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
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
    // The provider must be registered before admission names it.
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
            Some(6),
            &|id| Digest::of(format!("k{}", id.0).as_bytes()),
        )
        .await
        .unwrap()
        .tenant_id;
    let script =
        format!("i=1; while [ $i -le {LINES} ]; do echo line $i; i=$((i+1)); sleep 0.005; done");
    for e in 1..=EXECS {
        let key = format!("e-{e}");
        let exec = store
            .admit_exec(
                &OperationKey::new(&key, Digest::of(key.as_bytes())).unwrap(),
                reading(&clock).await,
                tenant,
                &ExecRequest {
                    runtime: "base".into(),
                    shape: "small".into(),
                    command: vec!["sh".into(), "-c".into(), script.clone()],
                    timeout_ms: None,
                    stdin_open: false,
                    idle_ttl_ms: None,
                    on_timeout: lc_core::OnTimeout::Terminate,
                },
            )
            .await
            .unwrap();
        assert_eq!(exec.exec_id, ExecId(i64::try_from(e).unwrap()));
    }
    let t = store.tenant(tenant).await.unwrap();
    assert_eq!((t.available, t.held), (3, 3));

    // Kill the worker twice while output is being moved.
    let _gateway = gateway(&url, &secret, &dir);
    let log = dir.join("worker.log");
    for round in 1..=2 {
        let mut w = worker(&url, &secret, &provider_url, &log);
        let before = stored_pages(&store, tenant).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = stored_pages(&store, tenant).await;
            if now >= before + 20 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no progress ({now} pages):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        w.0.kill().unwrap(); // SIGKILL
        let status = w.0.wait().unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(9));
    }

    // A last worker finishes everything.
    let _w = worker(&url, &secret, &provider_url, &log);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t = store.tenant(tenant).await.unwrap();
        if t.held == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all released: {t:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let want: String = (1..=LINES).map(|i| format!("line {i}\n")).collect();
    for e in 1..=EXECS {
        let exec = ExecId(i64::try_from(e).unwrap());
        let rec = store.exec(tenant, exec).await.unwrap();
        assert_eq!(
            (rec.state, rec.exit_code),
            (ExecState::Terminal, Some(0)),
            "{rec:?}"
        );
        let mut pages = Vec::new();
        let mut after = 0;
        loop {
            let got = store.output(tenant, exec, after, 1000).await.unwrap();
            if got.is_empty() {
                break;
            }
            after = got.last().unwrap().meta.seq;
            pages.extend(got);
        }
        let seqs: Vec<i64> = pages.iter().map(|p| p.meta.seq).collect();
        let n = i64::try_from(seqs.len()).unwrap();
        assert_eq!(
            seqs,
            (1..=n).collect::<Vec<_>>(),
            "exec {e}: every page once, in order"
        );
        assert_eq!(pages.last().unwrap().meta.kind, PageKind::Terminal);
        let stdout: Vec<u8> = pages
            .iter()
            .filter(|p| p.meta.kind == PageKind::Stdout)
            .flat_map(|p| page_bytes(&dir, p))
            .collect();
        assert_eq!(
            String::from_utf8(stdout).unwrap(),
            want,
            "exec {e}'s output exactly"
        );
        // The instance of its only lease generation is gone.
        let lease = rec.canonical.lease_id;
        let env = http.observe(lease, lc_core::Generation(1)).await.unwrap();
        let st = lc_core::evidence::verify_signature(&env, &http.public_key()).unwrap();
        match st {
            Statement::Observation { state, .. } => {
                assert_ne!(state, InstanceState::Running, "exec {e}'s instance runs on")
            }
            other => panic!("{other:?}"),
        }
    }
    let t = store.tenant(tenant).await.unwrap();
    assert_eq!((t.deposited, t.available, t.held, t.consumed), (6, 6, 0, 0));
    use tollgate::Allocator as _;
    let audit = store.tollgate().audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_held,
            audit.total_consumed
        ),
        (6, 0, 0)
    );
    let _ = sampler_stop.send(true);
    drop(_w);
    drop(_provider);
    let _ = std::fs::remove_dir_all(&dir);
    for c in ["memory", "pids", "cpu"] {
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(&cgroup_parent));
    }
}

fn provider(exe_dir_port: u16, dir: &Path, cgroup_parent: &str, log: &str) -> Proc {
    Proc(
        Command::new(exe())
            .args(["provider", "--id", "local", "--listen"])
            .arg(format!("127.0.0.1:{exe_dir_port}"))
            .arg("--state-dir")
            .arg(dir.join("provider"))
            .args(["--cgroup-parent", cgroup_parent])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(log))
                    .unwrap(),
            )
            .spawn()
            .unwrap(),
    )
}

async fn connect(url: &str) -> HttpProvider {
    let deadline = Instant::now() + Duration::from_secs(30);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_provider_s_lease_expires_and_its_reservation_returns_once() {
    ensure_supervisor();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let sampler = Sampler::new(&url, sampler_options()).unwrap();
    let (sampler_stop, rx) = watch::channel(false);
    tokio::spawn(async move { sampler.run(rx).await });
    let lease_ttl = SignedDuration::from_secs(3);
    let store = lc_pg::LcStore::connect(
        &url,
        tollgate::GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5))
            .unwrap(),
        tollgate::CapabilityKey::new(SECRET_TEXT.as_bytes()).unwrap(),
        lc_pg::LcConfig {
            max_connections: 4,
            lease_ttl,
            ..lc_pg::LcConfig::default()
        },
    )
    .await
    .unwrap();
    let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !clock.read().await.is_ok_and(|r| r.is_certain()) {
        assert!(Instant::now() < deadline, "no certain cut");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dir = PathBuf::from(format!("/tmp/lc-pkill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, format!("{SECRET_TEXT}\n")).unwrap();
    let port = free_port();
    let provider_url = format!("http://127.0.0.1:{port}");
    let cgroup_parent = format!("little-compute-pkill-{}", std::process::id());
    let mut first = provider(port, &dir, &cgroup_parent, "provider.log");
    let http = connect(&provider_url).await;
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
            Some(2),
            &|id| Digest::of(format!("k{}", id.0).as_bytes()),
        )
        .await
        .unwrap()
        .tenant_id;
    let exec = store
        .admit_exec(
            &OperationKey::new("e", Digest([3; 32])).unwrap(),
            reading(&clock).await,
            tenant,
            &ExecRequest {
                runtime: "base".into(),
                shape: "small".into(),
                command: vec![
                    "sh".into(),
                    "-c".into(),
                    "i=1; while :; do echo line $i; i=$((i+1)); sleep 0.005; done".into(),
                ],
                timeout_ms: None,
                stdin_open: false,
                idle_ttl_ms: None,
                on_timeout: lc_core::OnTimeout::Terminate,
            },
        )
        .await
        .unwrap()
        .exec_id;
    let log = dir.join("worker.log");
    let _gateway = gateway(&url, &secret, &dir);
    let _w = worker_with(
        &url,
        &secret,
        &provider_url,
        &log,
        &["--lease-ttl-ms", "3000"],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.output(tenant, exec, 0, 1000).await.unwrap().len() < 20 {
        assert!(
            Instant::now() < deadline,
            "no output:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.0.kill().unwrap(); // SIGKILL: the instance dies with it
    first.0.wait().unwrap();
    drop(first);
    let _second = provider(port, &dir, &cgroup_parent, "provider.log");
    let http = connect(&provider_url).await;

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = store.tenant(tenant).await.unwrap();
        if t.held == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not released: {t:?}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rec = store.exec(tenant, exec).await.unwrap();
    assert_eq!(rec.state, ExecState::Terminal);
    assert_eq!(rec.terminal_reason, Some(lc_core::TerminalReason::Expired));
    assert_eq!(rec.exit_code, None);
    let pages = store.output(tenant, exec, 0, 1000).await.unwrap();
    let seqs: Vec<i64> = pages.iter().map(|p| p.meta.seq).collect();
    let n = i64::try_from(seqs.len()).unwrap();
    assert!(n >= 20);
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "the stored pages, once and in order"
    );
    let stdout = String::from_utf8(
        pages
            .iter()
            .filter(|p| p.meta.kind == PageKind::Stdout)
            .flat_map(|p| page_bytes(&dir, p))
            .collect(),
    )
    .unwrap();
    let lines = stdout.lines().count();
    let want: String = (1..=lines).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout, want, "a prefix of the output, exactly");
    let env = http
        .observe(rec.canonical.lease_id, lc_core::Generation(1))
        .await
        .unwrap();
    match lc_core::evidence::verify_signature(&env, &http.public_key()).unwrap() {
        Statement::Observation { state, .. } => assert_ne!(state, InstanceState::Running),
        other => panic!("{other:?}"),
    }
    let t = store.tenant(tenant).await.unwrap();
    assert_eq!((t.deposited, t.available, t.held, t.consumed), (2, 2, 0, 0));
    use tollgate::Allocator as _;
    let audit = store.tollgate().audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    let _ = sampler_stop.send(true);
    drop(_w);
    drop(_second);
    let _ = std::fs::remove_dir_all(&dir);
    for c in ["memory", "pids", "cpu"] {
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(&cgroup_parent));
    }
}
