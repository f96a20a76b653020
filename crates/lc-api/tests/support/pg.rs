//! The service on the real store: a fresh database on the harness cluster
//! migrated for Tollgate and Little Compute, an in-process safe-time
//! sampler publishing a certain cut, the store, the safe-cut clock on its
//! pool (behind a switch a test can force uncertain), one registered
//! provider and the `base` runtime.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use clock::safe_cut::SafeCutClock;
use clock::{Clock, ClockError, ClockKind, ClockReading, SafeTimeStatus, UncertainReason};
use jiff::SignedDuration;
use lc_api::ServiceOptions;
use lc_api::auth::{AdminDigest, ServerSecret};
use lc_core::evidence::Statement;
use lc_core::model::{
    AttemptNo, CutReading, Digest, ExecId, OutputPage, PageExit, PageKind, ProviderId, TenantId,
    TerminalReason,
};
use lc_core::opkey::OperationKey;
use lc_core::store::{ControlStore, ReconcileStore};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use tokio::sync::watch;

use super::{ADMIN, SECRET};

/// The sampling-gap bound of the test clock and sampler.
pub const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);

/// A clock that reads the safe-cut clock, and reports its readings
/// uncertain (`stale`) while forced.
#[derive(Debug)]
pub struct Switch {
    inner: SafeCutClock,
    forced: AtomicBool,
}

impl Switch {
    /// Forces readings uncertain (`true`) or passes them through.
    pub fn force_uncertain(&self, on: bool) {
        self.forced.store(on, Ordering::SeqCst);
    }
}

#[async_trait]
impl Clock for Switch {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        let mut r = self.inner.read().await?;
        if self.forced.load(Ordering::SeqCst) {
            r.uncertain = Some(UncertainReason::Stale);
        }
        Ok(r)
    }
    fn kind(&self) -> ClockKind {
        ClockKind::SafeCut
    }
    fn retry_after_secs(&self) -> u64 {
        self.inner.retry_after_secs()
    }
    fn safe_time(&self) -> Option<SafeTimeStatus> {
        self.inner.safe_time()
    }
    async fn refresh_safe_time(&self, bound: Duration) -> Option<SafeTimeStatus> {
        self.inner.refresh_safe_time(bound).await
    }
}

/// The test provider's signing key.
pub fn provider_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[7u8; 32])
}

/// A running service on the real store.
pub struct PgSvc {
    pub router: axum::Router,
    pub state: lc_api::AppState,
    pub store: Arc<lc_pg::LcStore>,
    pub clock: Arc<Switch>,
    pub url: String,
    pub secret: ServerSecret,
    runtime_dir: Option<std::path::PathBuf>,
    stop: watch::Sender<bool>,
}

impl Drop for PgSvc {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Fast sampler settings: 50 ms samples, [`GAP_MAX`], 3 stable
/// observations.
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

impl PgSvc {
    /// A fresh installation; returns once the cut is certain.
    pub async fn start() -> PgSvc {
        PgSvc::start_with(ServiceOptions::default()).await
    }

    /// [`PgSvc::start`] with `options`.
    pub async fn start_with(options: ServiceOptions) -> PgSvc {
        let db = tollgate_pg_harness::shared().await.fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.expect("migrate");
        let sampler = Sampler::new(&url, sampler_options()).expect("sampler");
        let (stop, rx) = watch::channel(false);
        tokio::spawn(async move { sampler.run(rx).await });
        let store = Arc::new(
            lc_pg::LcStore::connect(
                &url,
                tollgate::GrantPolicy::new(
                    SignedDuration::from_hours(1),
                    SignedDuration::from_secs(5),
                )
                .expect("policy"),
                tollgate::CapabilityKey::new(&SECRET).expect("capability key"),
                lc_pg::LcConfig {
                    max_connections: 4,
                    acquire_timeout: Duration::from_secs(30),
                    ..lc_pg::LcConfig::default()
                },
            )
            .await
            .expect("store"),
        );
        let clock = Arc::new(Switch {
            inner: SafeCutClock::new(store.pool().clone(), GAP_MAX),
            forced: AtomicBool::new(false),
        });
        let mut certain = false;
        for _ in 0..400 {
            if clock.read().await.is_ok_and(|r| r.is_certain()) {
                certain = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(certain, "the cut did not become certain within 20 s");
        let secret = ServerSecret::new(&SECRET).expect("secret");
        let runtime_dir = options.runtime_dir.clone();
        let (router, state) = lc_api::build(
            store.clone(),
            clock.clone(),
            AdminDigest::of_token(ADMIN).expect("admin"),
            secret.clone(),
            options,
        );
        let svc = PgSvc {
            router,
            state,
            store,
            clock,
            url,
            secret,
            runtime_dir,
            stop,
        };
        svc.store
            .register_provider(
                &ProviderId::new("local").expect("provider id"),
                "http://127.0.0.1:9",
                provider_key().verifying_key().to_bytes(),
            )
            .await
            .expect("provider");
        let at = svc.reading().await;
        let base = lc_core::manifest::Manifest::base();
        svc.store
            .register_runtime(
                &OperationKey::new("setup-base", Digest([1; 32])).expect("key"),
                at,
                "base",
                Digest(base.digest()),
                serde_json::from_slice(&base.canonical()).expect("manifest json"),
            )
            .await
            .expect("base runtime");
        svc
    }

    /// A reading of the cut as the store takes it.
    pub async fn reading(&self) -> CutReading {
        let r = self.clock.read().await.expect("clock");
        CutReading {
            cut: r.now,
            certain: r.is_certain(),
            retry_after_s: 1,
        }
    }

    /// Plays the reconciler for `exec_id`: allocates its lease, stores
    /// `pages` (seq from 1), and when the last is terminal begins the
    /// release (`exited`) and commits it with the provider's signed
    /// absence, returning the Reservation.
    pub async fn run_exec(&self, exec_id: i64, pages: &[(PageKind, &[u8], Option<PageExit>)]) {
        let at = self.reading().await;
        let work = self.store.due_work(at, 100).await.expect("due work");
        let lease = work
            .iter()
            .find(|w| w.exec_id == ExecId(exec_id))
            .expect("the exec's lease is due")
            .clone();
        self.store
            .mark_active(lease.lease_id, lease.generation, at)
            .await
            .expect("active");
        let pages: Vec<OutputPage> = pages
            .iter()
            .enumerate()
            .map(|(i, (kind, bytes, exit))| OutputPage {
                exec_id: ExecId(exec_id),
                attempt: AttemptNo(1),
                seq: i64::try_from(i).unwrap() + 1,
                kind: *kind,
                bytes: bytes.to_vec(),
                sha256: Digest::of(bytes),
                exit: *exit,
            })
            .collect();
        self.store
            .append_pages(lease.lease_id, lease.generation, &pages)
            .await
            .expect("append pages");
        if pages.last().is_some_and(|p| p.kind == PageKind::Terminal) {
            let at = self.reading().await;
            self.store
                .begin_release(lease.lease_id, lease.generation, TerminalReason::Exited, at)
                .await
                .expect("begin release");
            let envelope = lc_core::evidence::sign(
                &Statement::Absence {
                    provider_id: "local".into(),
                    lease_id: lease.lease_id.0,
                    generation: lease.generation.0,
                },
                &provider_key(),
            );
            let at = self.reading().await;
            self.store
                .commit_release(
                    lease.lease_id,
                    lease.generation,
                    &serde_json::to_value(&envelope).expect("envelope json"),
                    at,
                )
                .await
                .expect("commit release");
        }
    }

    /// Plays the reconciler ending `exec_id` for `reason` without a
    /// terminal page (before its command started, or after `run_exec`
    /// stored pages without one): begins the release of its Lease
    /// and commits it with the provider's signed absence, returning the
    /// Reservation. `expired` needs the cut past the Lease's expiry or
    /// the exec's timeout; this waits (bounded, 30 s) for that.
    pub async fn end_exec_unstarted(&self, exec_id: i64, reason: TerminalReason) {
        let at = self.reading().await;
        let work = self.store.due_work(at, 100).await.expect("due work");
        let lease = work
            .iter()
            .find(|w| w.exec_id == ExecId(exec_id))
            .expect("the exec's lease is due")
            .clone();
        let mut began = None;
        for _ in 0..300 {
            let at = self.reading().await;
            match self
                .store
                .begin_release(lease.lease_id, lease.generation, reason, at)
                .await
            {
                Ok(_) => {
                    began = Some(());
                    break;
                }
                Err(lc_core::LcError::IllegalTransition { .. })
                    if reason == TerminalReason::Expired =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("begin release: {e}"),
            }
        }
        began.expect("the release began within 30 s");
        let envelope = lc_core::evidence::sign(
            &Statement::Absence {
                provider_id: "local".into(),
                lease_id: lease.lease_id.0,
                generation: lease.generation.0,
            },
            &provider_key(),
        );
        let at = self.reading().await;
        self.store
            .commit_release(
                lease.lease_id,
                lease.generation,
                &serde_json::to_value(&envelope).expect("envelope json"),
                at,
            )
            .await
            .expect("commit release");
    }

    /// The runtime directory the service was started with.
    ///
    /// # Panics
    /// When it was started without one.
    pub fn runtime_dir(&self) -> &std::path::Path {
        self.runtime_dir.as_deref().expect("a runtime directory")
    }

    /// The API key of `tenant`.
    pub fn key_of(&self, tenant: i64) -> String {
        self.secret.tenant_api_key(TenantId(tenant))
    }
}

// ---------------------------------------------------------------------------
// A cut that is missing, then certain, then stale; the database gone;
// snapshots of every table.

/// The tables only the safe-time sampler writes (each publish updates the
/// cut row; a claim or an anomaly appends evidence, drawing its sequence):
/// a snapshot taken while a sampler runs leaves them out.
pub const SAMPLER_WRITES: [&str; 3] = [
    "tollgate_safetime",
    "tollgate_safetime_evidence",
    "tollgate_safetime_evidence_evidence_id_seq",
];

/// A store on `url` with the settings of [`PgSvc::start`].
async fn connect_store(url: &str) -> lc_pg::LcStore {
    lc_pg::LcStore::connect(
        url,
        tollgate::GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5))
            .expect("policy"),
        tollgate::CapabilityKey::new(&SECRET).expect("capability key"),
        lc_pg::LcConfig {
            max_connections: 4,
            acquire_timeout: Duration::from_secs(30),
            ..lc_pg::LcConfig::default()
        },
    )
    .await
    .expect("store")
}

impl PgSvc {
    /// A service on a fresh, migrated database on which no sampler has
    /// run: the clock reads `no_cut` and the store refuses every mutation
    /// (`time_uncertain`) until [`PgSvc::start_sampler`]. Nothing is
    /// registered yet, since registering is a mutation.
    pub async fn start_without_cut() -> PgSvc {
        let db = tollgate_pg_harness::shared().await.fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.expect("migrate");
        let store = Arc::new(connect_store(&url).await);
        let clock = Arc::new(Switch {
            inner: SafeCutClock::new(store.pool().clone(), GAP_MAX),
            forced: AtomicBool::new(false),
        });
        let secret = ServerSecret::new(&SECRET).expect("secret");
        let (router, state) = lc_api::build(
            store.clone(),
            clock.clone(),
            AdminDigest::of_token(ADMIN).expect("admin"),
            secret.clone(),
            ServiceOptions::default(),
        );
        // No sampler holds the receiver: nothing to stop yet.
        let (stop, _) = watch::channel(false);
        PgSvc {
            router,
            state,
            store,
            clock,
            url,
            secret,
            runtime_dir: None,
            stop,
        }
    }

    /// Starts a sampler on the service's database, waits (at most 20 s)
    /// until the clock reads the cut certain, and registers the provider
    /// and the `base` runtime when they are not registered yet, as
    /// [`PgSvc::start`] does.
    pub async fn start_sampler(&mut self) {
        let sampler = Sampler::new(&self.url, sampler_options()).expect("sampler");
        let (stop, rx) = watch::channel(false);
        tokio::spawn(async move { sampler.run(rx).await });
        self.stop = stop;
        let mut certain = false;
        for _ in 0..400 {
            if self.clock.read().await.is_ok_and(|r| r.is_certain()) {
                certain = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(certain, "the cut did not become certain within 20 s");
        self.store
            .register_provider(
                &ProviderId::new("local").expect("provider id"),
                "http://127.0.0.1:9",
                provider_key().verifying_key().to_bytes(),
            )
            .await
            .expect("provider");
        let at = self.reading().await;
        let base = lc_core::manifest::Manifest::base();
        self.store
            .register_runtime(
                &OperationKey::new("setup-base", Digest([1; 32])).expect("key"),
                at,
                "base",
                Digest(base.digest()),
                serde_json::from_slice(&base.canonical()).expect("manifest json"),
            )
            .await
            .expect("base runtime");
    }

    /// Stops the sampler, waits (at most 10 s) until it has ended, then (at
    /// most 10 s) until the clock reads the cut stale: its last publish is
    /// older than [`GAP_MAX`] and nobody publishes again.
    pub async fn stop_sampler(&self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.stop.closed())
            .await
            .expect("the sampler ends within 10 s");
        for _ in 0..500 {
            if let Ok(r) = self.clock.read().await
                && r.uncertain == Some(UncertainReason::Stale)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the cut did not read stale within 10 s");
    }

    /// Drops the service's database, closing its connections: from then on
    /// the store and the clock cannot reach it.
    pub async fn drop_database(&self) {
        let name = self.url.rsplit('/').next().expect("a database name");
        psql(
            &tollgate_pg_harness::shared().await.admin_url(),
            format!("DROP DATABASE \"{name}\" WITH (FORCE);\n"),
        )
        .await;
    }
}

/// Runs `script` with `psql` from the harness's binaries against `url`
/// (unaligned, tuples only, stopping at the first error); returns its
/// standard output.
///
/// # Panics
/// When `psql` cannot run or the script fails, with its standard error.
pub async fn psql(url: &str, script: String) -> String {
    use std::io::Write as _;
    let bin = tollgate_pg_harness::shared()
        .await
        .binaries()
        .dir()
        .join("psql");
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let mut child = std::process::Command::new(&bin)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", &url])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        child
            .stdin
            .take()
            .expect("psql stdin")
            .write_all(script.as_bytes())
            .expect("write the script");
        let out = child.wait_with_output().expect("psql runs");
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("psql output is UTF-8")
    })
    .await
    .expect("psql task")
}

/// Every row of every Little Compute and Tollgate table (`lc_*`,
/// `tollgate_*`) and the position of every such sequence, but `except`
/// (relation names), as text, ordered by relation and row: two snapshots
/// are equal exactly when nothing was written to them.
pub async fn snapshot(url: &str, except: &[&str]) -> Vec<(String, Vec<String>)> {
    let out = psql(
        url,
        r"SELECT CASE c.relkind
           WHEN 'S' THEN format('SELECT %L, jsonb_build_array(last_value::text || '','' || is_called::text) FROM %I', c.relname, c.relname)
           ELSE format('SELECT %L, coalesce(jsonb_agg(t::text ORDER BY t::text), ''[]'') FROM %I t', c.relname, c.relname)
         END
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S')
     AND (c.relname LIKE 'lc\_%' OR c.relname LIKE 'tollgate\_%')
   ORDER BY c.relname \gexec
"
        .to_string(),
    )
    .await;
    let snap: Vec<(String, Vec<String>)> = out
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (name, rows) = l.split_once('|').expect("name|rows");
            let rows: Vec<String> = serde_json::from_str(rows).expect("rows as JSON text");
            (name.to_string(), rows)
        })
        .filter(|(name, _)| !except.contains(&name.as_str()))
        .collect();
    for must in [
        "lc_execs",
        "lc_operations",
        "tollgate_leases",
        "tollgate_ledger",
    ] {
        assert!(
            snap.iter().any(|(name, _)| name == must),
            "the snapshot lacks {must}"
        );
    }
    snap
}
