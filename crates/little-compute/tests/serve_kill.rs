//! kill -9 of the control plane (a real `little-compute serve`, a real
//! SIGKILL) while many admissions, deposits and tenant creations are in
//! flight, at several points, on a real PostgreSQL with a real sampler
//! keeping the cut certain. Each round restarts serve and sends new
//! requests interleaved with replays of every earlier one (same key, same
//! body), and kills it again after a given number of answers; a last,
//! unkilled pass replays everything.
//!
//! After every kill (once the killed process's database sessions are gone,
//! so nothing commits later) and at the end, in one snapshot:
//! - every answer received is what its key recorded, and a recorded
//!   result never changes; a replay answers exactly the first answer;
//! - one exec per recorded admission key and none without one;
//! - every exec has exactly attempt 1, Reservation generation 1 (an active
//!   Tollgate lease of the shape's units on the tenant's account) and
//!   Lease generation 1 `allocating`; no Tollgate lease without its exec;
//! - each tenant's balances: deposited = its initial units plus its
//!   committed deposits, held = the units of its admitted execs,
//!   available = deposited - held, consumed 0; Tollgate's audit is clean.
//!
//! No worker runs, so nothing is released and every Reservation stays
//! held: the balances are exact at every point.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_core::store::ControlStore;
use lc_core::{CutReading, Digest, OperationKey};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use serde_json::{Value, json};
use sqlx::Row as _;
use tokio::sync::{Mutex, watch};

const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
/// 64 hex digits: the server secret file's text, whose bytes are the key.
const SECRET_TEXT: &str = "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5";
const ADMIN: &str = "lcadm-serve-kill-0123456789";
/// Tenants created before the first kill; execs and deposits go to them.
const BASE_TENANTS: usize = 2;
/// Units each base tenant starts with: more than every exec of the test
/// holds, so no admission is refused for capacity.
const BASE_UNITS: i64 = 1_000;
/// Units each tenant created during the rounds starts with.
const NEW_TENANT_UNITS: i64 = 3;
/// New requests of each round, by kind.
const EXECS_PER_ROUND: usize = 30;
const DEPOSITS_PER_ROUND: usize = 8;
const TENANTS_PER_ROUND: usize = 6;
/// Round r kills serve once this many answers of the round arrived: from
/// the first answer to well into the batch, replays included.
const KILL_AFTER: [usize; 4] = [1, 9, 23, 47];
/// Requests in flight at once: more than serve's 10 pooled connections,
/// so at every kill some transactions run and others wait for one.
const CONCURRENCY: usize = 16;
/// Bound on one request (a live serve answers in milliseconds).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on a serve becoming ready, on the killed sessions ending.
const WAIT_MAX: Duration = Duration::from_secs(30);

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_little-compute"))
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

fn policy() -> tollgate::GrantPolicy {
    tollgate::GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5)).unwrap()
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

/// What a request does; its key and body never change between sends.
#[derive(Debug, Clone)]
enum Kind {
    Tenant {
        name: String,
        units: i64,
    },
    Deposit {
        tenant: i64,
        units: i64,
    },
    Exec {
        tenant: i64,
        shape: &'static str,
        units: i64,
    },
}

#[derive(Debug, Clone)]
struct Req {
    key: String,
    kind: Kind,
}

impl Req {
    fn scope(&self) -> i64 {
        match &self.kind {
            Kind::Tenant { .. } => 0,
            Kind::Deposit { tenant, .. } | Kind::Exec { tenant, .. } => *tenant,
        }
    }

    fn op_kind(&self) -> &'static str {
        match self.kind {
            Kind::Tenant { .. } => "create_tenant",
            Kind::Deposit { .. } => "deposit",
            Kind::Exec { .. } => "admit_exec",
        }
    }

    fn want_status(&self) -> u16 {
        match self.kind {
            Kind::Deposit { .. } => 200,
            _ => 201,
        }
    }

    /// The identity the answer and the recorded result must share.
    fn id_of(&self, v: &Value) -> Option<i64> {
        match self.kind {
            Kind::Tenant { .. } | Kind::Deposit { .. } => v["tenant_id"].as_i64(),
            Kind::Exec { .. } => v["exec_id"].as_i64(),
        }
    }

    async fn send(&self, http: &reqwest::Client, base: &str) -> Option<(u16, Value)> {
        let b = match &self.kind {
            Kind::Tenant { name, units } => http
                .post(format!("{base}/v1/tenants"))
                .json(&json!({ "name": name, "units": units })),
            Kind::Deposit { tenant, units } => http
                .post(format!("{base}/v1/tenants/{tenant}/deposits"))
                .json(&json!({ "units": units })),
            Kind::Exec { tenant, shape, .. } => http
                .post(format!("{base}/v1/execs"))
                .header("Lc-Tenant", tenant.to_string())
                .json(&json!({ "runtime": "base", "shape": shape, "command": ["true"] })),
        };
        let r = b
            .bearer_auth(ADMIN)
            .header("Idempotency-Key", &self.key)
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        let body = r.json::<Value>().await.ok()?;
        Some((status, body))
    }
}

/// The new requests of round `round` for the base tenants `base`.
fn new_requests(round: usize, base: &[i64]) -> Vec<Req> {
    let mut execs = (0..EXECS_PER_ROUND).map(|i| {
        let (shape, units) = if i % 3 == 0 {
            ("medium", 2)
        } else {
            ("small", 1)
        };
        Req {
            key: format!("exec-{round}-{i}"),
            kind: Kind::Exec {
                tenant: base[i % base.len()],
                shape,
                units,
            },
        }
    });
    let mut deposits = (0..DEPOSITS_PER_ROUND).map(|i| Req {
        key: format!("deposit-{round}-{i}"),
        kind: Kind::Deposit {
            tenant: base[i % base.len()],
            units: i64::try_from(i % 5 + 1).unwrap(),
        },
    });
    let mut tenants = (0..TENANTS_PER_ROUND).map(|i| Req {
        key: format!("tenant-{round}-{i}"),
        kind: Kind::Tenant {
            name: format!("t-{round}-{i}"),
            units: NEW_TENANT_UNITS,
        },
    });
    // Interleaved: every kind is in flight at every point.
    let mut out = Vec::new();
    loop {
        let before = out.len();
        out.extend(execs.next());
        out.extend(execs.next());
        out.extend(deposits.next());
        out.extend(execs.next());
        out.extend(tenants.next());
        if out.len() == before {
            return out;
        }
    }
}

/// A running `little-compute serve` and how to reach it.
struct Serve {
    proc: Proc,
    base: String,
    app: String,
}

fn spawn_serve(url: &str, dir: &Path, n: usize) -> Serve {
    let port = free_port();
    let app = format!("lc-serve-kill-{n}");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("serve.log"))
        .unwrap();
    let child = Command::new(exe())
        .arg("serve")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--admin-token-file")
        .arg(dir.join("admin.token"))
        .arg("--secret-file")
        .arg(dir.join("secret"))
        .args(["--safetime-gap-max-ms", "2000"])
        .args([
            "--grant-max-ttl-ms",
            "3600000",
            "--reclaim-grace-ms",
            "5000",
        ])
        // Its sessions are told apart from the test's by this name.
        .env("LC_DATABASE_URL", format!("{url}?application_name={app}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Serve {
        proc: Proc(child),
        base: format!("http://127.0.0.1:{port}"),
        app,
    }
}

async fn wait_ready(s: &Serve, dir: &Path) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        if let Ok(r) = http.get(format!("{}/readyz", s.base)).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "serve not ready:\n{}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGKILL, then wait until the database holds no session of it: after
/// that nothing it sent can still commit.
async fn kill(s: Serve, pool: &sqlx::PgPool) {
    let Serve { mut proc, app, .. } = s;
    proc.0.kill().unwrap(); // SIGKILL
    let status = proc.0.wait().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(9));
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(&app)
                .fetch_one(pool)
                .await
                .unwrap();
        if n == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{n} sessions of {app} remain");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first answer of each key (by request index), and every answer that
/// differed from it.
#[derive(Default)]
struct Answers {
    first: BTreeMap<usize, (u16, Value)>,
    mismatches: Vec<String>,
}

/// Sends `batch` (request indices) with [`CONCURRENCY`] in flight; with
/// `kill_after`, sends SIGKILL to `s` as soon as that many answers
/// arrived (requests are still in flight then) and sends nothing more.
/// Returns the number of answers received.
async fn run_batch(
    reqs: &Arc<Vec<Req>>,
    batch: Vec<usize>,
    s: &mut Serve,
    kill_after: Option<usize>,
    answers: &Arc<Mutex<Answers>>,
) -> usize {
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    let batch = Arc::new(batch);
    let next = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let (count_tx, mut count_rx) = watch::channel(0usize);
    let count_tx = Arc::new(count_tx);
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (reqs, batch, next, killed) =
            (reqs.clone(), batch.clone(), next.clone(), killed.clone());
        let (http, base, answers, count_tx) = (
            http.clone(),
            s.base.clone(),
            answers.clone(),
            count_tx.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                if killed.load(Ordering::SeqCst) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&r) = batch.get(i) else { return };
                let Some((status, body)) = reqs[r].send(&http, &base).await else {
                    continue;
                };
                let mut a = answers.lock().await;
                match a.first.get(&r) {
                    Some(first) if *first != (status, body.clone()) => {
                        let m = format!("{}: first {first:?}, then {status} {body}", reqs[r].key);
                        a.mismatches.push(m);
                    }
                    Some(_) => {}
                    None => {
                        a.first.insert(r, (status, body));
                    }
                }
                drop(a);
                count_tx.send_modify(|n| *n += 1);
            }
        }));
    }
    if let Some(n) = kill_after {
        tokio::time::timeout(WAIT_MAX, count_rx.wait_for(|c| *c >= n))
            .await
            .expect("answers before the kill")
            .unwrap();
        s.proc.0.kill().unwrap(); // SIGKILL, with requests in flight
        killed.store(true, Ordering::SeqCst);
    }
    for t in tasks {
        t.await.unwrap();
    }
    *count_rx.borrow()
}

/// A Reservation with its Tollgate lease: exec, attempt, generation,
/// units, state; the lease's account, units, state.
type ReservationRow = (i64, i32, i64, i64, String, i64, i64, String);

/// What the database says was committed, read in one snapshot, checked
/// against every invariant; returns the recorded identity of each
/// committed key (by request index).
async fn check_state(
    pool: &sqlx::PgPool,
    store: &lc_pg::LcStore,
    reqs: &[Req],
    answers: &Answers,
) -> BTreeMap<usize, i64> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await
        .unwrap();
    let ops: BTreeMap<(i64, String), (String, Value)> =
        sqlx::query("SELECT scope, op_key, kind, result::text AS result FROM lc_operations")
            .fetch_all(&mut *tx)
            .await
            .unwrap()
            .into_iter()
            .map(|r| {
                let result: String = r.get("result");
                (
                    (r.get("scope"), r.get("op_key")),
                    (r.get("kind"), serde_json::from_str(&result).unwrap()),
                )
            })
            .collect();
    // Every key recorded is one of the test's, of its kind.
    let by_key: BTreeMap<(i64, &str), usize> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.scope(), r.key.as_str()), i))
        .collect();
    let mut committed = BTreeMap::new();
    for ((scope, key), (kind, result)) in &ops {
        if key == "base-runtime" {
            continue;
        }
        let i = *by_key
            .get(&(*scope, key.as_str()))
            .unwrap_or_else(|| panic!("a key the test never sent: {scope} {key}"));
        assert_eq!(kind, reqs[i].op_kind(), "{key}");
        let id = reqs[i]
            .id_of(result)
            .unwrap_or_else(|| panic!("{key} recorded {result}"));
        committed.insert(i, id);
    }
    // Every answer received was committed, with the same identity.
    for (i, (status, body)) in &answers.first {
        let r = &reqs[*i];
        assert_eq!(*status, r.want_status(), "{}: {body}", r.key);
        assert_eq!(
            committed.get(i).copied(),
            r.id_of(body),
            "{}: answered {body}, recorded otherwise",
            r.key
        );
        if let Kind::Deposit { .. } = r.kind {
            let (_, recorded) = &ops[&(r.scope(), r.key.clone())];
            assert_eq!(
                body, recorded,
                "{}: the deposit's balances as recorded",
                r.key
            );
        }
    }

    // Execs: one per admission key, each with exactly its first attempt,
    // Reservation and Lease generation.
    let execs: Vec<(i64, i64, i64, i64, String, i32)> = sqlx::query_as(
        "SELECT exec_id, tenant_id, lease_id, units, state, current_attempt FROM lc_execs ORDER BY exec_id",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let mut want_execs: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (i, id) in &committed {
        if let Kind::Exec { tenant, units, .. } = reqs[*i].kind {
            assert!(
                want_execs.insert(*id, (tenant, units)).is_none(),
                "exec {id} recorded by two keys"
            );
        }
    }
    let got: BTreeMap<i64, (i64, i64)> = execs.iter().map(|e| (e.0, (e.1, e.3))).collect();
    assert_eq!(got, want_execs, "exactly one exec per recorded admission");
    let attempts: Vec<(i64, i32, String, i64)> =
        sqlx::query_as("SELECT exec_id, attempt, state, generation FROM lc_attempts ORDER BY 1, 2")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        execs
            .iter()
            .map(|e| (e.0, 1, "runnable".to_string(), 1))
            .collect::<Vec<_>>()
    );
    let reservations: Vec<ReservationRow> = sqlx::query_as(
        "SELECT r.exec_id, r.attempt, r.generation, r.units, r.state, l.account_id, l.units, l.state \
         FROM lc_reservations r JOIN tollgate_leases l ON l.lease_id = r.tollgate_lease_id \
         ORDER BY r.exec_id, r.attempt, r.generation",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        reservations,
        execs
            .iter()
            .map(|e| (
                e.0,
                1,
                1,
                e.3,
                "held".to_string(),
                e.1,
                e.3,
                "active".to_string()
            ))
            .collect::<Vec<_>>()
    );
    let leases: Vec<(i64, i64, i32, i64, String)> = sqlx::query_as(
        "SELECT lease_id, exec_id, attempt, generation, state FROM lc_sandbox_leases ORDER BY exec_id",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        leases,
        execs
            .iter()
            .map(|e| (e.2, e.0, 1, 1, "allocating".to_string()))
            .collect::<Vec<_>>()
    );
    assert!(execs.iter().all(|e| (e.4.as_str(), e.5) == ("admitted", 1)));
    // No Tollgate lease without its exec.
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tollgate_leases l WHERE NOT EXISTS \
         (SELECT 1 FROM lc_reservations r WHERE r.tollgate_lease_id = l.lease_id)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(orphans, 0, "Tollgate leases without their exec");

    // Tenants and their balances.
    let mut want: BTreeMap<i64, (String, i64, i64)> = BTreeMap::new();
    for (i, id) in &committed {
        match &reqs[*i].kind {
            Kind::Tenant { name, units } => {
                assert!(
                    want.insert(*id, (name.clone(), *units, 0)).is_none(),
                    "tenant {id} recorded by two keys"
                );
            }
            Kind::Deposit { .. } | Kind::Exec { .. } => {}
        }
    }
    for i in committed.keys() {
        match reqs[*i].kind {
            Kind::Deposit { tenant, units } => want.get_mut(&tenant).unwrap().1 += units,
            Kind::Exec { tenant, units, .. } => want.get_mut(&tenant).unwrap().2 += units,
            Kind::Tenant { .. } => {}
        }
    }
    let accounts: Vec<(i64, String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT a.account_id, t.name, a.deposited, a.available, a.held, a.consumed \
         FROM tollgate_accounts a FULL JOIN lc_tenants t ON t.tenant_id = a.account_id \
         ORDER BY a.account_id",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        accounts,
        want.iter()
            .map(|(id, (name, dep, held))| (*id, name.clone(), *dep, dep - held, *held, 0))
            .collect::<Vec<_>>(),
        "tenants and balances"
    );
    tx.commit().await.unwrap();

    use tollgate::Allocator as _;
    let audit = store.tollgate().audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    let deposited: i64 = want.values().map(|w| w.1).sum();
    let held: i64 = want.values().map(|w| w.2).sum();
    assert_eq!(
        (
            audit.total_deposited,
            audit.total_available,
            audit.total_held,
            audit.total_consumed
        ),
        (
            i128::from(deposited),
            i128::from(deposited - held),
            i128::from(held),
            0
        )
    );
    committed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_control_plane_admits_each_key_once_and_holds_exact_balances() {
    let started = Instant::now();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let sampler = Sampler::new(&url, sampler_options()).unwrap();
    let (sampler_stop, rx) = watch::channel(false);
    tokio::spawn(async move { sampler.run(rx).await });
    let store = lc_pg::LcStore::connect(
        &url,
        policy(),
        tollgate::CapabilityKey::new(SECRET_TEXT.as_bytes()).unwrap(),
        lc_pg::LcConfig {
            max_connections: 4,
            ..lc_pg::LcConfig::default()
        },
    )
    .await
    .unwrap();
    let pool = store.pool().clone();
    let clock = SafeCutClock::new(pool.clone(), GAP_MAX);
    let deadline = Instant::now() + WAIT_MAX;
    while !clock.read().await.is_ok_and(|r| r.is_certain()) {
        assert!(Instant::now() < deadline, "no certain cut");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = clock.read().await.unwrap();
    let at = CutReading {
        cut: r.now,
        certain: r.is_certain(),
        retry_after_s: 1,
    };
    let manifest = lc_core::manifest::Manifest::base();
    store
        .register_runtime(
            &OperationKey::new("base-runtime", Digest([1; 32])).unwrap(),
            at,
            "base",
            Digest(manifest.digest()),
            serde_json::from_slice(&manifest.canonical()).unwrap(),
        )
        .await
        .unwrap();
    {
        // Admission names a provider; none is reached, as no worker runs.
        use lc_core::store::ReconcileStore as _;
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]).verifying_key();
        store
            .register_provider(
                &lc_core::ProviderId::new("local").unwrap(),
                "http://127.0.0.1:9",
                key.to_bytes(),
            )
            .await
            .unwrap();
    }

    let dir = PathBuf::from(format!("/tmp/lc-skill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret"), format!("{SECRET_TEXT}\n")).unwrap();
    std::fs::write(dir.join("admin.token"), format!("{ADMIN}\n")).unwrap();

    // The base tenants first: their ids are what execs and deposits name.
    let mut reqs: Vec<Req> = (0..BASE_TENANTS)
        .map(|n| Req {
            key: format!("tenant-base-{n}"),
            kind: Kind::Tenant {
                name: format!("base-{n}"),
                units: BASE_UNITS,
            },
        })
        .collect();
    let mut serves = 0;
    let mut s = spawn_serve(&url, &dir, serves);
    serves += 1;
    wait_ready(&s, &dir).await;
    let answers = Arc::new(Mutex::new(Answers::default()));
    let shared = Arc::new(reqs.clone());
    let got = run_batch(&shared, (0..BASE_TENANTS).collect(), &mut s, None, &answers).await;
    assert_eq!(got, BASE_TENANTS);
    let base: Vec<i64> = {
        let a = answers.lock().await;
        (0..BASE_TENANTS)
            .map(|i| a.first[&i].1["tenant_id"].as_i64().unwrap())
            .collect()
    };
    kill(s, &pool).await;
    let mut recorded = check_state(&pool, &store, &reqs, &*answers.lock().await).await;

    for (round, &kill_after) in KILL_AFTER.iter().enumerate() {
        let old = reqs.len();
        reqs.extend(new_requests(round, &base));
        let shared = Arc::new(reqs.clone());
        // New and earlier requests interleaved.
        let mut batch = Vec::new();
        let (mut n, mut o) = (old..reqs.len(), 0..old);
        loop {
            let before = batch.len();
            batch.extend(n.next());
            batch.extend(o.next());
            if batch.len() == before {
                break;
            }
        }
        let sent = batch.len();
        let mut s = spawn_serve(&url, &dir, serves);
        serves += 1;
        wait_ready(&s, &dir).await;
        let got = run_batch(&shared, batch, &mut s, Some(kill_after), &answers).await;
        kill(s, &pool).await;
        // The kill happened while requests were still to be answered.
        assert!(
            got >= kill_after && got < sent,
            "round {round}: {got} of {sent}"
        );
        let now = check_state(&pool, &store, &reqs, &*answers.lock().await).await;
        for (i, id) in &recorded {
            assert_eq!(
                now.get(i),
                Some(id),
                "{}: a recorded result changed",
                reqs[*i].key
            );
        }
        let answered = answers.lock().await.first.len();
        eprintln!(
            "round {round}: {got} answers of {sent} sent; {} keys committed, {answered} answered",
            now.len()
        );
        recorded = now;
    }

    // The last serve replays every request and is not killed.
    let mut s = spawn_serve(&url, &dir, serves);
    serves += 1;
    wait_ready(&s, &dir).await;
    let shared = Arc::new(reqs.clone());
    let got = run_batch(&shared, (0..reqs.len()).collect(), &mut s, None, &answers).await;
    assert_eq!(got, reqs.len(), "every request answered");
    let a = answers.lock().await;
    assert_eq!(
        a.mismatches,
        Vec::<String>::new(),
        "replays answer as first"
    );
    assert_eq!(a.first.len(), reqs.len());
    let now = check_state(&pool, &store, &reqs, &a).await;
    assert_eq!(now.len(), reqs.len(), "every key committed once");
    for (i, id) in &recorded {
        assert_eq!(
            now.get(i),
            Some(id),
            "{}: a recorded result changed",
            reqs[*i].key
        );
    }
    drop(a);

    // Exactly: every request of the test took effect once.
    let of = |f: fn(&Kind) -> bool| i64::try_from(reqs.iter().filter(|r| f(&r.kind)).count());
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM lc_execs), (SELECT count(*) FROM tollgate_leases), \
                (SELECT count(*) FROM lc_tenants)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let execs = of(|k| matches!(k, Kind::Exec { .. })).unwrap();
    assert_eq!(
        counts,
        (
            execs,
            execs,
            of(|k| matches!(k, Kind::Tenant { .. })).unwrap()
        )
    );
    assert_eq!(
        execs,
        i64::try_from(KILL_AFTER.len() * EXECS_PER_ROUND).unwrap()
    );
    let http = reqwest::Client::new();
    for (n, tenant) in base.iter().enumerate() {
        let deposited = BASE_UNITS
            + reqs
                .iter()
                .filter_map(|r| match r.kind {
                    Kind::Deposit { tenant: t, units } if t == *tenant => Some(units),
                    _ => None,
                })
                .sum::<i64>();
        let held: i64 = reqs
            .iter()
            .filter_map(|r| match r.kind {
                Kind::Exec {
                    tenant: t, units, ..
                } if t == *tenant => Some(units),
                _ => None,
            })
            .sum();
        let got: Value = http
            .get(format!("{}/v1/tenants/{tenant}", s.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            got,
            json!({
                "tenant_id": tenant,
                "name": format!("base-{n}"),
                "deposited": deposited,
                "available": deposited - held,
                "held": held,
                "consumed": 0,
                "approval_policy": {"require": "off", "shapes": []},
            })
        );
    }
    eprintln!(
        "{} requests, {} serve processes, {:?}",
        reqs.len(),
        serves,
        started.elapsed()
    );
    drop(s);
    let _ = sampler_stop.send(true);
    let _ = std::fs::remove_dir_all(&dir);
}
