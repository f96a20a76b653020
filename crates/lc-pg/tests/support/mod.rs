//! Shared test support: a fresh database per test on the harness cluster,
//! migrated to Little Compute's schema; a real in-process sampler with a
//! tight configuration (the cut becomes certain in about a second); the
//! safe-cut clock; a store; a signing provider; snapshots of every table.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use ed25519_dalek::SigningKey;
use jiff::SignedDuration;
use lc_core::evidence::{self, Statement};
use lc_core::{
    ControlStore, CutReading, Digest, OperationKey, ProviderId, ReconcileStore, SandboxLeaseId,
};
use lc_pg::{LcConfig, LcStore};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::watch;
use tollgate::{Allocator, CapabilityKey, GrantPolicy};

/// A test database: its name and URL.
#[derive(Debug, Clone)]
pub struct Db {
    pub name: String,
    pub url: String,
}

static DB_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh database `lcpg_<pid>_<n>` on `admin_url`'s cluster, not migrated.
pub async fn fresh_db_on(admin_url: &str, url_for: impl Fn(&str) -> String) -> Db {
    let name = format!(
        "lcpg_{}_{}",
        std::process::id(),
        DB_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let mut admin = PgConnection::connect(admin_url)
        .await
        .expect("admin connection");
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut admin)
        .await
        .expect("create database");
    admin.close().await.expect("close admin connection");
    Db {
        url: url_for(&name),
        name,
    }
}

/// A fresh database on the shared cluster, not migrated.
pub async fn fresh_db() -> Db {
    let cluster = tollgate_pg_harness::shared().await;
    fresh_db_on(&cluster.admin_url(), |n| cluster.url_for(n)).await
}

/// A fresh database migrated to Little Compute's schema.
pub async fn migrated_db() -> Db {
    let db = fresh_db().await;
    lc_pg::migrate(&db.url).await.expect("migrate");
    db
}

/// The grant policy of the tests: 1 h max TTL, 5 s reclaim grace.
pub fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_hours(1), SignedDuration::from_secs(5)).unwrap()
}

/// A fixed 32-byte capability key.
pub fn key() -> CapabilityKey {
    CapabilityKey::new(&[0x5a; 32]).expect("key")
}

/// Few connections: several tests share the cluster.
pub fn config() -> LcConfig {
    LcConfig {
        max_connections: 4,
        acquire_timeout: Duration::from_secs(30),
        ..LcConfig::default()
    }
}

/// A store on `db` (migrated).
pub async fn store_on(db: &Db, config: LcConfig) -> LcStore {
    LcStore::connect(&db.url, policy(), key(), config)
        .await
        .expect("connect store")
}

/// Fast sampler settings: 50 ms samples, 2 s gap bound, 3 stable
/// observations and 200 ms of calm.
pub fn fast_sampler() -> SamplerOptions {
    SamplerOptions {
        config: SafeTimeConfig::new(
            50,
            SignedDuration::from_millis(50),
            SignedDuration::from_secs(2),
            SignedDuration::from_millis(500),
            3,
            SignedDuration::from_millis(200),
        )
        .unwrap(),
        standby_poll: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
    }
}

/// A sampler running in this process.
pub struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops it and waits for it (at most 10 s).
    pub async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("sampler stops within 10 s")
            .unwrap();
    }
}

/// Starts a sampler on `url`.
pub fn start_sampler(url: &str) -> Running {
    let sampler = Sampler::new(url, fast_sampler()).unwrap();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(async move { sampler.run(rx).await });
    Running { stop, task }
}

/// The safe-cut clock on `pool` with the sampler's gap bound.
pub fn clock_on(pool: &PgPool) -> SafeCutClock {
    SafeCutClock::new(pool.clone(), SignedDuration::from_secs(2))
}

/// One reading of `clock` as the store takes it.
pub async fn read(clock: &SafeCutClock) -> CutReading {
    let r = clock.read().await.expect("read the cut");
    CutReading {
        cut: r.now,
        certain: r.uncertain.is_none(),
        retry_after_s: clock.retry_after_secs(),
    }
}

/// Polls `clock` every 20 ms until `pred` holds (at most `secs` s).
pub async fn wait_reading(
    clock: &SafeCutClock,
    secs: u64,
    what: &str,
    pred: impl Fn(&CutReading) -> bool,
) -> CutReading {
    let mut last = None;
    for _ in 0..secs * 50 {
        let r = read(clock).await;
        if pred(&r) {
            return r;
        }
        last = Some(r);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}; last reading {last:?}");
}

/// A certain reading (waits for one, at most 20 s).
pub async fn certain(clock: &SafeCutClock) -> CutReading {
    wait_reading(clock, 20, "a certain cut", |r| r.certain).await
}

/// An operation key `key` for a request whose canonical form is `body`.
pub fn op(key: &str, body: &str) -> OperationKey {
    OperationKey::new(key, Digest::of(body.as_bytes())).unwrap()
}

/// The API-key digest the tests give tenant `t`.
pub fn api_key_of(t: lc_core::TenantId) -> Digest {
    Digest::of(format!("lc_test_key_{}", t.0).as_bytes())
}

/// A provider identity that signs evidence.
pub struct TestProvider {
    pub id: ProviderId,
    pub key: SigningKey,
}

impl TestProvider {
    pub fn new(id: &str, seed: u8) -> TestProvider {
        TestProvider {
            id: ProviderId::new(id).unwrap(),
            key: SigningKey::from_bytes(&[seed; 32]),
        }
    }

    /// Registers it with `store`.
    pub async fn register(&self, store: &LcStore) {
        store
            .register_provider(
                &self.id,
                "http://127.0.0.1:7001",
                self.key.verifying_key().to_bytes(),
            )
            .await
            .expect("register provider");
    }

    /// Signed absence evidence of (lease, generation), as JSON.
    pub fn absence(&self, lease: SandboxLeaseId, generation: i64) -> serde_json::Value {
        self.sign(Statement::Absence {
            provider_id: self.id.to_string(),
            lease_id: lease.0,
            generation,
        })
    }

    /// Signed quiescence of (lease, generation, workspace) at `head`.
    pub fn quiescence(
        &self,
        lease: SandboxLeaseId,
        generation: i64,
        workspace: i64,
        head: Digest,
    ) -> serde_json::Value {
        self.sign(Statement::Quiescence {
            provider_id: self.id.to_string(),
            lease_id: lease.0,
            generation,
            workspace_id: workspace,
            head: head.to_hex(),
        })
    }

    /// Signed writable attachment of (lease, generation, workspace) at
    /// `head`.
    pub fn attachment(
        &self,
        lease: SandboxLeaseId,
        generation: i64,
        workspace: i64,
        head: Digest,
    ) -> serde_json::Value {
        self.sign(Statement::Attachment {
            provider_id: self.id.to_string(),
            lease_id: lease.0,
            generation,
            workspace_id: workspace,
            head: head.to_hex(),
            writable: true,
        })
    }

    /// `statement` signed, as JSON.
    pub fn sign(&self, statement: Statement) -> serde_json::Value {
        serde_json::to_value(evidence::sign(&statement, &self.key)).unwrap()
    }
}

/// A store's test world (the fixture of the store tests): a migrated
/// database with a certain cut, the store, its clock and sampler, a
/// registered provider, the runtime `base` and a tenant.
pub struct Fixture {
    pub db: Db,
    pub store: LcStore,
    pub clock: SafeCutClock,
    pub sampler: Running,
    pub provider: TestProvider,
    pub tenant: lc_core::TenantId,
}

/// A migrated database with a certain cut, a store, a registered provider,
/// the runtime `base` and a tenant holding `units`.
pub async fn fixture(units: i64) -> Fixture {
    fixture_with(units, config()).await
}

pub async fn fixture_with(units: i64, config: lc_pg::LcConfig) -> Fixture {
    fixture_on(migrated_db().await, units, config).await
}

/// The fixture on `db` (migrated), wherever its cluster runs.
pub async fn fixture_on(db: Db, units: i64, config: lc_pg::LcConfig) -> Fixture {
    let sampler = start_sampler(&db.url);
    let store = store_on(&db, config).await;
    let clock = clock_on(store.pool());
    let at = certain(&clock).await;
    let provider = TestProvider::new("p1", 7);
    provider.register(&store).await;
    store
        .register_runtime(
            &op("rt-base", "base"),
            at,
            "base",
            Digest::of(b"base manifest"),
            serde_json::json!({"kind": "host-usr", "name": "base"}),
        )
        .await
        .unwrap();
    let tenant = store
        .create_tenant(
            &op("t-blue", "blue"),
            at,
            "blue",
            (units > 0).then_some(units),
            &api_key_of,
        )
        .await
        .unwrap();
    Fixture {
        db,
        store,
        clock,
        sampler,
        provider,
        tenant: tenant.tenant_id,
    }
}

pub fn req(shape: &str, argv: &[&str]) -> lc_core::ExecRequest {
    lc_core::ExecRequest {
        runtime: "base".into(),
        shape: shape.into(),
        command: argv.iter().map(|s| s.to_string()).collect(),
        timeout_ms: None,
        stdin_open: false,
        idle_ttl_ms: None,
        on_timeout: lc_core::OnTimeout::Terminate,
    }
}

pub fn balances(t: &lc_core::Tenant) -> (i64, i64, i64, i64) {
    (t.deposited, t.available, t.held, t.consumed)
}

pub async fn assert_audit_clean(store: &LcStore) {
    let audit = store.tollgate().audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
}

/// Claims the first epoch with a real sampler and returns
/// `(quarantined, evidence kind, little_compute inventory)`.
pub async fn first_claim(url: &str) -> (bool, String, serde_json::Value) {
    let s = start_sampler(url);
    let mut c = PgConnection::connect(url).await.unwrap();
    let mut row = None;
    for _ in 0..500 {
        row = safetime_pg::read_cut(&mut c).await.unwrap();
        if row.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let row = row.expect("a claim within 10 s");
    s.stop().await;
    let (kind, detail): (String, String) = sqlx::query_as(
        "SELECT kind, detail::text FROM tollgate_safetime_evidence \
          WHERE kind IN ('initial_cut', 'initial_quarantine')",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    let detail: serde_json::Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(
        row.quarantined,
        row.cut == jiff::Timestamp::UNIX_EPOCH,
        "a quarantined cut starts at the Unix epoch"
    );
    (row.quarantined, kind, detail["little_compute"].clone())
}

/// Every row of every Little Compute and Tollgate table, as text, in a
/// fixed order: two snapshots are equal exactly when nothing was written.
pub async fn snapshot(url: &str) -> Vec<(String, Vec<String>)> {
    let mut c = PgConnection::connect(url).await.unwrap();
    let mut out = Vec::new();
    for table in [
        "lc_tenants",
        "lc_runtimes",
        "lc_providers",
        "lc_execs",
        "lc_attempts",
        "lc_reservations",
        "lc_sandbox_leases",
        "lc_output_pages",
        "lc_operations",
        "lc_exec_owners",
        "lc_transitions",
        "lc_exec_inputs",
        "lc_workspaces",
        "lc_snapshots",
        "lc_hibernations",
        "lc_resume_intents",
        "lc_resume_receipts",
        "lc_tokens",
        "lc_claims",
        "lc_deletions",
        "lc_approvals",
        "tollgate_accounts",
        "tollgate_leases",
        "tollgate_ledger",
        "tollgate_idempotency",
    ] {
        let rows: Vec<String> =
            sqlx::query_scalar(&format!("SELECT t::text FROM {table} t ORDER BY t::text"))
                .fetch_all(&mut c)
                .await
                .unwrap();
        out.push((table.to_owned(), rows));
    }
    out
}
