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
//! While no provider answers, nothing about the instance is observed and
//! the exec's view says so (no observation, re-execution ineligible); the
//! restarted provider then measures it from the accounting its groups
//! kept.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_blob::LocalBlobStore;
use lc_core::evidence::{InstanceState, Statement};
use lc_core::observation::ExternalityObservation;
use lc_core::store::ControlStore;
use lc_core::{Digest, ExecId, ExecState, OperationKey, PageKind};
use lc_provider::Provider as _;
use support::{GAP_MAX, Proc, exe, free_port, page_bytes, reading};

const EXECS: usize = 3;
const LINES: usize = 400;
/// The longest the set-up waits for a certain cut or the provider.
const SETUP_WAIT_MAX: Duration = Duration::from_secs(30);

/// The exec gateway beside the workers: it moves output into `DIR/blobs`
/// and releases exited execs.
fn gateway(url: &str, secret: &Path, dir: &Path) -> Proc {
    support::spawn_gateway(&support::GatewayArgs {
        url,
        secret,
        blob_dir: &dir.join("blobs"),
        log: dir.join("gateway.log"),
        heartbeat_ttl_ms: None,
        crash_at: None,
        metrics_port: None,
    })
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
    support::ensure_supervisor();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let (sampler_stop, _sampler) = support::start_sampler(&url);
    let store = support::connect_store(&url, support::store_config()).await;
    let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
    support::wait_certain(&clock, SETUP_WAIT_MAX, Duration::from_millis(50)).await;

    let dir = support::fresh_dir("lc-wkill");
    let secret = support::write_secret(&dir);
    let port = free_port();
    let provider_url = format!("http://127.0.0.1:{port}");
    let cgroup_parent = format!("little-compute-wkill-{}", std::process::id());
    let _provider = support::spawn_provider(port, &dir, &cgroup_parent, "provider.log");
    let http = support::connect_provider(&provider_url, SETUP_WAIT_MAX).await;

    let at = reading(&clock).await;
    let tenant =
        support::register_base_provider_and_tenant(&store, at, &http, &provider_url, 6).await;
    let script =
        format!("i=1; while [ $i -le {LINES} ]; do echo line $i; i=$((i+1)); sleep 0.005; done");
    for e in 1..=EXECS {
        let key = format!("e-{e}");
        let exec = store
            .admit_exec(
                &OperationKey::new(&key, Digest::of(key.as_bytes())).unwrap(),
                reading(&clock).await,
                tenant,
                &support::sh_request(&script, false),
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
    let sink = LocalBlobStore::open(dir.join("blobs")).unwrap();
    for e in 1..=EXECS {
        let exec = ExecId(i64::try_from(e).unwrap());
        let rec = store.exec(tenant, exec).await.unwrap();
        assert_eq!(
            (rec.state, rec.exit_code),
            (ExecState::Terminal, Some(0)),
            "{rec:?}"
        );
        let pages = support::all_pages(&store, tenant, exec).await;
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
            .flat_map(|p| page_bytes(&sink, p))
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
    support::assert_audit_clean(&store, 6).await;
    let _ = sampler_stop.send(true);
    drop(_w);
    drop(_provider);
    let _ = std::fs::remove_dir_all(&dir);
    support::remove_cgroup_parent(&cgroup_parent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_provider_s_lease_expires_and_its_reservation_returns_once() {
    support::ensure_supervisor();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let (sampler_stop, _sampler) = support::start_sampler(&url);
    let lease_ttl = SignedDuration::from_secs(3);
    let store = support::connect_store(
        &url,
        lc_pg::LcConfig {
            lease_ttl,
            ..support::store_config()
        },
    )
    .await;
    let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
    support::wait_certain(&clock, SETUP_WAIT_MAX, Duration::from_millis(50)).await;
    let dir = support::fresh_dir("lc-pkill");
    let secret = support::write_secret(&dir);
    let port = free_port();
    let provider_url = format!("http://127.0.0.1:{port}");
    let cgroup_parent = format!("little-compute-pkill-{}", std::process::id());
    let mut first = support::spawn_provider(port, &dir, &cgroup_parent, "provider.log");
    let http = support::connect_provider(&provider_url, SETUP_WAIT_MAX).await;
    let at = reading(&clock).await;
    let tenant =
        support::register_base_provider_and_tenant(&store, at, &http, &provider_url, 2).await;
    let exec = store
        .admit_exec(
            &OperationKey::new("e", Digest([3; 32])).unwrap(),
            reading(&clock).await,
            tenant,
            &support::sh_request(
                "i=1; while :; do echo line $i; i=$((i+1)); sleep 0.005; done",
                false,
            ),
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
    // While no provider answers, the expired Lease's destroy can neither
    // measure nor destroy: nothing is observed, and the exec's view says
    // so (no observation, re-execution ineligible), never zero or clean.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("no terminal measurement; the observation stays absent")
    {
        assert!(
            Instant::now() < deadline,
            "no measurement attempted:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let unmeasured = store.exec(tenant, exec).await.unwrap();
    assert_eq!(
        (unmeasured.observation, unmeasured.state),
        (None, ExecState::Running)
    );
    let view = serde_json::to_value(lc_api::dto::ExecView::from(unmeasured)).unwrap();
    assert_eq!(view.get("observation"), None);
    assert_eq!(
        view["reexecution"],
        serde_json::json!({"eligible": false, "reason": "externality_unobserved"})
    );
    let _second = support::spawn_provider(port, &dir, &cgroup_parent, "provider.log");
    let http = support::connect_provider(&provider_url, SETUP_WAIT_MAX).await;

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
    // The restarted provider measured the instance from the accounting
    // its groups kept: the cost the command used until the kill, and no
    // side effects (its shape has no network path).
    let measured = rec.observation.expect("measured by the restarted provider");
    let cost = measured
        .cost
        .expect("the instance's groups kept its accounting");
    assert!(
        cost.peak_memory_bytes > 0 && cost.peak_memory_bytes <= 268_435_456,
        "{cost:?}"
    );
    assert_eq!(
        measured.externality,
        ExternalityObservation::no_network_path()
    );
    let view = serde_json::to_value(lc_api::dto::ExecView::from(rec.clone())).unwrap();
    assert_eq!(view["reexecution"], serde_json::json!({"eligible": true}));
    let pages = store.output(tenant, exec, 0, 1000).await.unwrap();
    let sink = LocalBlobStore::open(dir.join("blobs")).unwrap();
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
            .flat_map(|p| page_bytes(&sink, p))
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
    support::remove_cgroup_parent(&cgroup_parent);
}
