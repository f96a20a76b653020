//! The gateway tests' real world, after the rig of the reconciler's tests
//! (crates/lc-worker/tests/real.rs, whose set-up is copied in part): a
//! fresh database per test on the harness's one cluster, migrated to
//! Little Compute's schema; a real safe-time sampler publishing the cut in
//! process; `LcStore`; the safe-cut clock the gateway uses in production;
//! the real bubblewrap provider running real commands (allocated by a real
//! reconciler); the real local sink in the rig's directory. Time is never
//! simulated: a sampler restarted with a long recovery grace makes the cut
//! advance while uncertain, one with a short grace makes it certain again,
//! and a short heartbeat TTL lets a certain cut pass an expiry within
//! seconds.

// Each test binary uses a part of the rig.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clock::safe_cut::SafeCutClock;
use jiff::SignedDuration;
use lc_blob::{BlobStore as _, LocalBlobStore};
use lc_core::input::InputRecord;
use lc_core::owner::{
    OwnedExec, OwnerCredential, OwnerToken, PageMeta, StageReport, TransitionReceipt,
};
use lc_core::page::{ExitStatus, SpoolStatus};
use lc_core::rules::LIST_LIMIT_MAX;
use lc_core::store::{ControlStore, GatewayStore, ReconcileStore};
use lc_core::{
    CutReading, Digest, ExecId, ExecRequest, Generation, LcError, LeaseState, LeaseWork,
    OperationKey, PageKind, SandboxLeaseId, TenantId, TerminalReason,
};
use lc_gateway::{Gateway, GatewayOptions, ProviderConnector};
use lc_provider::{BwrapConfig, BwrapProvider, Provider, ProviderError};
use lc_worker::{Reconciler, ReconcilerOptions};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use sqlx::{Connection, PgConnection};
use tokio::sync::watch;

/// The tests' heartbeat TTL (the default): a certain cut passes it within
/// seconds, while the steps that must run inside it, and a new sampler's
/// recovery to a certain cut, take well under a second.
pub const TTL: SignedDuration = SignedDuration::from_secs(5);
const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);
/// The sampler's recovery grace: certain again soon after a start.
const RECOVERY_GRACE: SignedDuration = SignedDuration::from_millis(200);
/// A recovery grace no test outlasts: the cut advances but stays uncertain.
const RECOVERY_GRACE_LONG: SignedDuration = SignedDuration::from_mins(10);
/// How long a test waits for anything real (a cut, a process, a page).
pub const WAIT_MAX: Duration = Duration::from_secs(60);
/// How many 10 ms polls a streaming command waits for its go-file before
/// it writes on regardless (30 s: a pacing task that died must not hang
/// the command forever; the test's exact page count then reports it).
pub const GO_POLLS_MAX: u32 = 3000;
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

fn start_sampler(
    url: &str,
    recovery_grace: SignedDuration,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let sampler = Sampler::new(url, sampler_options(recovery_grace)).expect("sampler");
    let (stop, rx) = watch::channel(false);
    (stop, tokio::spawn(async move { sampler.run(rx).await }))
}

/// `lc-supervisor` beside this test's profile directory, built fresh once per process.
fn supervisor_bin() -> PathBuf {
    tollgate_pg_harness::cargo_built("lc-supervisor", &["-p", "lc-supervisor"])
}

/// The rig's one in-process provider, whatever URL the store recorded.
pub struct InProcess(pub Arc<dyn Provider>);

#[async_trait]
impl ProviderConnector for InProcess {
    async fn connect(&self, _url: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(self.0.clone())
    }
}

/// The real store as the gateway sees it, recording the code of every
/// write it refused as stale or expired and counting the reads of queued
/// inputs (it changes no answer).
pub struct Refusals {
    inner: Arc<lc_pg::LcStore>,
    refused: Mutex<BTreeMap<&'static str, usize>>,
    queued_reads: AtomicUsize,
}

impl Refusals {
    fn note<T>(&self, r: Result<T, LcError>) -> Result<T, LcError> {
        if let Err(e) = &r
            && matches!(e.code(), "owner_stale" | "owner_expired")
        {
            *self.refused.lock().unwrap().entry(e.code()).or_insert(0) += 1;
        }
        r
    }
}

#[async_trait]
impl GatewayStore for Refusals {
    async fn claim(
        &self,
        token: &OwnerToken,
        at: CutReading,
        ttl: SignedDuration,
        limit: usize,
    ) -> Result<Vec<OwnedExec>, LcError> {
        self.note(self.inner.claim(token, at, ttl, limit).await)
    }
    async fn take_over(
        &self,
        token: &OwnerToken,
        tenant: TenantId,
        exec_id: ExecId,
        at: CutReading,
        ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        self.note(self.inner.take_over(token, tenant, exec_id, at, ttl).await)
    }
    async fn heartbeat(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        self.note(self.inner.heartbeat(cred, exec_id, at, ttl).await)
    }
    async fn stage_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        pages: &[PageMeta],
    ) -> Result<StageReport, LcError> {
        self.note(self.inner.stage_pages(cred, exec_id, at, pages).await)
    }
    async fn pending_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<PageMeta>, LcError> {
        self.note(self.inner.pending_pages(cred, exec_id, at, limit).await)
    }
    async fn ack_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        through_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        let r = self
            .inner
            .ack_pages(cred, exec_id, at, transition_id, through_seq);
        self.note(r.await)
    }
    async fn cancel(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        let r = GatewayStore::cancel(&*self.inner, cred, exec_id, at, transition_id);
        self.note(r.await)
    }
    async fn queued_inputs(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<InputRecord>, LcError> {
        self.queued_reads.fetch_add(1, Ordering::SeqCst);
        self.note(self.inner.queued_inputs(cred, exec_id, at, limit).await)
    }
    async fn record_send(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        input_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        let r = self
            .inner
            .record_send(cred, exec_id, at, transition_id, input_seq);
        self.note(r.await)
    }
    async fn release(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        self.note(self.inner.release(cred, exec_id, at, transition_id).await)
    }
    #[allow(clippy::too_many_arguments)]
    async fn commit_quiescence(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        generation: Generation,
        manifest: &[u8],
        head: Digest,
        evidence: &serde_json::Value,
        measurement: Option<&serde_json::Value>,
    ) -> Result<lc_core::HibernationRecord, LcError> {
        let r = self.inner.commit_quiescence(
            cred,
            exec_id,
            at,
            generation,
            manifest,
            head,
            evidence,
            measurement,
        );
        self.note(r.await)
    }
    async fn refuse_quiescence(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        generation: Generation,
        refusal: &lc_core::hibernate::QuiescenceRefusal,
    ) -> Result<lc_core::HibernationRecord, LcError> {
        let r = self
            .inner
            .refuse_quiescence(cred, exec_id, at, generation, refusal);
        self.note(r.await)
    }
    async fn prepare_resume(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        op_key: &str,
    ) -> Result<LeaseWork, LcError> {
        self.note(self.inner.prepare_resume(cred, exec_id, at, op_key).await)
    }
    async fn commit_resume(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        op_key: &str,
    ) -> Result<lc_core::ResumeReceipt, LcError> {
        self.note(self.inner.commit_resume(cred, exec_id, at, op_key).await)
    }
}

/// One test's world; see the module docs.
pub struct Rig {
    url: String,
    pub store: Arc<lc_pg::LcStore>,
    /// The store the rig's gateways use (the real one, refusals recorded).
    pub gateway_store: Arc<Refusals>,
    pub clock: Arc<SafeCutClock>,
    pub provider: Arc<BwrapProvider>,
    pub sink: Arc<LocalBlobStore>,
    rec: Reconciler,
    sampler_stop: watch::Sender<bool>,
    sampler: Option<tokio::task::JoinHandle<()>>,
    dir: PathBuf,
    pub tenant: TenantId,
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

/// A running exec of the rig: its ids.
#[derive(Debug, Clone, Copy)]
pub struct Exec {
    pub id: ExecId,
    pub lease: SandboxLeaseId,
    pub generation: Generation,
}

impl Rig {
    /// A rig on a certain cut, with the runtime `base` and a tenant of 4 units.
    pub async fn start() -> Rig {
        Rig::start_with_units(4).await
    }

    /// [`Rig::start`] with a tenant of `units` units.
    pub async fn start_with_units(units: i64) -> Rig {
        let db = tollgate_pg_harness::shared().await.fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.expect("migrate");
        let (sampler_stop, sampler) = start_sampler(&url, RECOVERY_GRACE);
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
        let dir = PathBuf::from(format!("/tmp/lcg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cfg = BwrapConfig::new(
            lc_core::ProviderId::new("local").unwrap(),
            &dir,
            &supervisor_bin(),
        );
        cfg.cgroup_parent = format!("little-compute-gtest-{}-{n}", std::process::id());
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
            ReconcilerOptions::default(),
        )
        .unwrap();
        let sink = Arc::new(LocalBlobStore::open(dir.join("blobs")).expect("sink"));
        let mut rig = Rig {
            url,
            gateway_store: Arc::new(Refusals {
                inner: store.clone(),
                refused: Mutex::new(BTreeMap::new()),
                queued_reads: AtomicUsize::new(0),
            }),
            store,
            clock,
            provider,
            sink,
            rec,
            sampler_stop,
            sampler: Some(sampler),
            dir,
            tenant: TenantId(0),
        };
        let at = rig.wait_reading(|r| r.certain).await;
        let base = lc_core::manifest::Manifest::base();
        rig.store
            .register_runtime(
                &OperationKey::new("setup-base", Digest::of(b"base")).unwrap(),
                at,
                "base",
                Digest(base.digest()),
                serde_json::from_slice(&base.canonical()).unwrap(),
            )
            .await
            .expect("runtime");
        rig.tenant = rig
            .store
            .create_tenant(
                &OperationKey::new("t-1", Digest([2; 32])).unwrap(),
                at,
                "blue",
                Some(units),
                &|id| Digest::of(format!("key-{}", id.0).as_bytes()),
            )
            .await
            .expect("tenant")
            .tenant_id;
        rig
    }

    /// A gateway over the rig's store, sink and clock, reaching `provider`.
    pub fn gateway_on(&self, provider: Arc<dyn Provider>, options: GatewayOptions) -> Gateway {
        Gateway::new(
            self.gateway_store.clone(),
            Arc::new(InProcess(provider)),
            self.sink.clone(),
            self.clock.clone(),
            options,
        )
        .expect("gateway")
    }

    /// A gateway with `options` on the real provider.
    pub fn gateway(&self, options: GatewayOptions) -> Gateway {
        self.gateway_on(self.provider.clone(), options)
    }

    /// A gateway with the default options and [`TTL`].
    pub fn default_gateway(&self) -> Gateway {
        self.gateway(GatewayOptions {
            heartbeat_ttl: TTL,
            ..GatewayOptions::default()
        })
    }

    /// Queues `bytes` (closing stdin after them when `eof`) for the exec's
    /// stdin, as a client does, under the operation key `key`.
    pub async fn queue(&self, e: Exec, key: &str, bytes: &[u8], eof: bool) -> Result<i64, LcError> {
        let at = self.wait_reading(|r| r.certain).await;
        let op = OperationKey::new(key, Digest::of(key.as_bytes())).unwrap();
        ControlStore::send_input(&*self.store, &op, at, self.tenant, e.id, bytes, eof)
            .await
            .map(|i| i.input_seq)
    }

    /// How many times the rig's gateways read queued inputs.
    pub fn queued_reads(&self) -> usize {
        self.gateway_store.queued_reads.load(Ordering::SeqCst)
    }

    /// `(send receipt, input seq)` of every input of the exec recorded
    /// sent, by seq.
    pub async fn recorded(&self, e: Exec) -> Vec<(String, i64)> {
        sqlx::query_as(
            "SELECT send_transition_id, input_seq FROM lc_exec_inputs \
             WHERE exec_id = $1 AND state = 'sent' ORDER BY input_seq",
        )
        .bind(e.id.0)
        .fetch_all(&mut self.sql().await)
        .await
        .unwrap()
    }

    /// The seqs of the exec's inputs still queued.
    pub async fn still_queued(&self, e: Exec) -> Vec<i64> {
        sqlx::query_scalar(
            "SELECT input_seq FROM lc_exec_inputs \
             WHERE exec_id = $1 AND state = 'queued' ORDER BY input_seq",
        )
        .bind(e.id.0)
        .fetch_all(&mut self.sql().await)
        .await
        .unwrap()
    }

    /// Steps `g` (bounded by [`WAIT_MAX`], polling), each step without a
    /// failure, until the exec has its release receipt (at once if it has
    /// one); returns how many inputs those steps delivered.
    pub async fn released_by(&self, g: &Gateway, e: Exec) -> usize {
        let deadline = Instant::now() + WAIT_MAX;
        let mut sent = 0;
        while self.receipts(e, "release").await.is_empty() {
            assert!(
                Instant::now() < deadline,
                "not released within {WAIT_MAX:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            let r = g.step().await;
            assert_eq!(r.failures, vec![]);
            sent += r.inputs_sent;
        }
        sent
    }

    /// Writes refused with `code` so far.
    pub fn refused(&self, code: &str) -> Option<usize> {
        self.gateway_store
            .refused
            .lock()
            .unwrap()
            .get(code)
            .copied()
    }

    /// Polls the clock (bounded by [`WAIT_MAX`]) until a reading satisfies
    /// `want`; returns it.
    pub async fn wait_reading(&self, want: impl Fn(&CutReading) -> bool) -> CutReading {
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

    /// A new sampler (a new epoch) whose cut stays uncertain while it
    /// advances; returns once a reading is uncertain with a cut past `after`.
    pub async fn uncertain_past(&mut self, after: jiff::Timestamp) -> CutReading {
        self.restart_sampler(RECOVERY_GRACE_LONG).await;
        self.wait_reading(|r| !r.certain && r.cut > after).await
    }

    /// A new sampler with a short recovery grace; returns its first certain
    /// reading.
    pub async fn certain_again(&mut self) -> CutReading {
        self.restart_sampler(RECOVERY_GRACE).await;
        self.wait_reading(|r| r.certain).await
    }

    async fn restart_sampler(&mut self, recovery_grace: SignedDuration) {
        let _ = self.sampler_stop.send(true);
        if let Some(task) = self.sampler.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("the sampler stops")
                .unwrap();
        }
        let (stop, task) = start_sampler(&self.url, recovery_grace);
        self.sampler_stop = stop;
        self.sampler = Some(task);
    }

    /// A certain reading at or past `t` (waits for one).
    pub async fn certain_at(&self, t: jiff::Timestamp) -> CutReading {
        self.wait_reading(|r| r.certain && r.cut >= t).await
    }

    /// Admits `argv` and lets the real reconciler allocate its instance
    /// (the Lease active, the command started).
    pub async fn run(&self, argv: &[&str]) -> Exec {
        self.run_stdin(argv, false).await
    }

    /// [`Rig::run`], the command's stdin a pipe fed by queued inputs when
    /// `stdin_open` (else `/dev/null`).
    pub async fn run_stdin(&self, argv: &[&str], stdin_open: bool) -> Exec {
        self.run_keyed("e-1", argv, stdin_open).await
    }

    /// [`Rig::run_stdin`] admitted under the operation key `key`, so a
    /// test can run several execs at once.
    pub async fn run_keyed(&self, key: &str, argv: &[&str], stdin_open: bool) -> Exec {
        let at = self.wait_reading(|r| r.certain).await;
        let id = self
            .store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                at,
                self.tenant,
                &ExecRequest {
                    runtime: "base".into(),
                    shape: "small".into(),
                    command: argv.iter().map(|s| s.to_string()).collect(),
                    timeout_ms: None,
                    stdin_open,
                    idle_ttl_ms: None,
                    on_timeout: lc_core::OnTimeout::Terminate,
                },
            )
            .await
            .expect("admit")
            .exec_id;
        let r = self.rec.step().await.expect("reconciler step");
        assert_eq!((r.allocated, r.failures), (1, vec![]));
        let w = self.lease(id).await.expect("the exec's Lease");
        assert_eq!(w.state, LeaseState::Active);
        Exec {
            id,
            lease: w.lease_id,
            generation: w.generation,
        }
    }

    /// Runs a command writing `data_pages` pages of 1000 distinct bytes
    /// each, pausing `pause_s` seconds after page `pause_after`, then
    /// exiting 3. Returns the exec and every byte it writes.
    ///
    /// Each page is its own write of 1000 bytes (below `PIPE_BUF`, so one
    /// pipe read takes it whole), and the command writes the next one only
    /// once the supervisor has spooled this one: after write `i` it waits
    /// for the file `.go<i>` in its workspace, which a pacing task creates
    /// when the spool's next seq has passed `i`. So every write is exactly
    /// one page however loaded the machine is, with no timing assumption.
    pub async fn stream(&self, data_pages: i64, pause_after: i64, pause_s: u32) -> (Exec, Vec<u8>) {
        let script = format!(
            "i=1; while [ $i -le {data_pages} ]; do printf '%0999d\\n' $i; \
             n=0; while [ ! -e /workspace/.go$i ] && [ $n -lt {GO_POLLS_MAX} ]; do \
             sleep 0.01; n=$((n+1)); done; \
             if [ $i -eq {pause_after} ]; then sleep {pause_s}; fi; \
             i=$((i+1)); done; exit 3"
        );
        let e = self.run(&["sh", "-c", &script]).await;
        let workspace = self
            .store
            .exec(self.tenant, e.id)
            .await
            .expect("the exec")
            .canonical
            .workspace_id;
        let dir = self.provider.workspace_dir(workspace);
        let provider = self.provider.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + WAIT_MAX;
            for i in 1..=data_pages {
                loop {
                    match provider.spool_status(e.lease, e.generation).await {
                        Ok(Some(st)) if st.next_seq > i => break,
                        Ok(Some(_)) if tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(5)).await
                        }
                        // Gone, failed or past the bound: the test's own
                        // waits report what is missing.
                        _ => return,
                    }
                }
                if std::fs::write(dir.join(format!(".go{i}")), b"").is_err() {
                    return;
                }
            }
        });
        let expected = (1..=data_pages)
            .flat_map(|i| format!("{i:0999}\n").into_bytes())
            .collect();
        (e, expected)
    }

    /// [`Rig::stream`] without a long pause, once the command has ended:
    /// the spool then holds exactly its `data_pages` pages and the
    /// terminal page.
    pub async fn streamed(&self, data_pages: i64) -> (Exec, Vec<u8>) {
        let (e, expected) = self.stream(data_pages, 0, 0).await;
        let s = self.spool_when(e, |s| s.terminal_seq != 0).await;
        assert_eq!(
            (s.pages, s.bytes, s.terminal_seq),
            (
                data_pages as u64 + 1,
                data_pages as u64 * 1000,
                data_pages + 1
            ),
            "each write of the command is one page"
        );
        (e, expected)
    }

    /// The spool's status (unfenced).
    pub async fn spool(&self, e: Exec) -> SpoolStatus {
        self.provider
            .spool_status(e.lease, e.generation)
            .await
            .expect("spool status")
            .expect("the instance has a supervisor")
    }

    /// Polls the spool (bounded) until `want` holds; returns its status.
    pub async fn spool_when(&self, e: Exec, want: impl Fn(&SpoolStatus) -> bool) -> SpoolStatus {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let s = self.spool(e).await;
            if want(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "spool not so within {WAIT_MAX:?}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The seqs spooled now (acked through excluded).
    pub async fn spooled(&self, e: Exec) -> Vec<i64> {
        let s = self.spool(e).await;
        (s.acked_through + 1..).take(s.pages as usize).collect()
    }

    /// Makes the supervisor unreachable or reachable again: its socket is
    /// moved aside and something that is not a socket put at its name (as
    /// a sandboxed command could), so every request fails at once
    /// `supervisor_unavailable` while the supervisor runs on.
    pub fn supervisor_reachable(&self, e: Exec, reachable: bool) {
        let run = self
            .dir
            .join(format!("instances/{}-{}/run", e.lease.0, e.generation.0));
        let (sock, away) = (
            run.join("supervisor.sock"),
            run.join("supervisor.sock.away"),
        );
        if reachable {
            std::fs::remove_file(&sock).expect("remove the stand-in");
            std::fs::rename(&away, &sock).expect("put the socket back");
        } else {
            std::fs::rename(&sock, &away).expect("move the socket aside");
            std::fs::write(&sock, b"not a socket").expect("a stand-in");
        }
    }

    /// The pid of the exec's supervisor: the process of the instance's
    /// cgroup whose `argv[0]` is the supervisor's path in the sandbox.
    pub fn supervisor_pid(&self, e: Exec) -> i32 {
        let pids = self.provider.instance_cgroup(e.lease, e.generation).pids();
        let found: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).next() == Some(b"/.lc/supervisor"))
            })
            .collect();
        assert_eq!(found.len(), 1, "one supervisor among {pids:?}");
        found[0]
    }

    /// Sends the real signal `signal` (`STOP`, `CONT`) to the exec's
    /// supervisor: a stopped supervisor's socket still accepts connections,
    /// but no request is answered until it continues.
    pub fn signal_supervisor(&self, e: Exec, signal: &str) {
        let pid = self.supervisor_pid(e);
        let status = std::process::Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -s {signal} {pid}: {status}");
    }

    /// Waits (bounded) until the supervisor has exited, which it does only
    /// once its terminal page was acked (its socket then goes away): the
    /// spool dropped every page through the terminal page.
    pub async fn supervisor_done(&self, e: Exec) {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let s = self.provider.spool_status(e.lease, e.generation).await;
            match s {
                Ok(None) => return,
                _ => assert!(
                    Instant::now() < deadline,
                    "the supervisor still runs: {s:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The exec's Lease as the store has it now (`None` once released).
    pub async fn lease(&self, exec: ExecId) -> Option<LeaseWork> {
        let at = self.rec.reading().await.expect("clock");
        self.store
            .due_work(at, LIST_LIMIT_MAX)
            .await
            .expect("due work")
            .into_iter()
            .find(|w| w.exec_id == exec)
    }

    /// Asks to cancel the exec, as a client does.
    pub async fn cancel(&self, e: Exec) {
        let at = self.wait_reading(|r| r.certain).await;
        ControlStore::cancel(
            &*self.store,
            &OperationKey::new("c-1", Digest::of(b"c-1")).unwrap(),
            at,
            self.tenant,
            e.id,
        )
        .await
        .expect("cancel");
    }

    async fn sql(&self) -> PgConnection {
        PgConnection::connect(&self.url).await.expect("connect")
    }

    /// `(staged, acked)` pages of the exec in the store.
    pub async fn page_counts(&self, e: Exec) -> (i64, i64) {
        sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE state = 'acked') \
             FROM lc_output_pages WHERE exec_id = $1",
        )
        .bind(e.id.0)
        .fetch_one(&mut self.sql().await)
        .await
        .unwrap()
    }

    /// The transition ids of the exec's receipts of `kind`, in order.
    pub async fn receipts(&self, e: Exec, kind: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT transition_id FROM lc_transitions WHERE exec_id = $1 AND kind = $2 \
             ORDER BY transition_id",
        )
        .bind(e.id.0)
        .bind(kind)
        .fetch_all(&mut self.sql().await)
        .await
        .unwrap()
    }

    /// The exec's `(owner generation, owner fence)`.
    pub async fn owner(&self, e: Exec) -> (i64, i64) {
        sqlx::query_as("SELECT generation, fence FROM lc_exec_owners WHERE exec_id = $1")
            .bind(e.id.0)
            .fetch_one(&mut self.sql().await)
            .await
            .unwrap()
    }

    /// `(releases, the Lease's terminal reason, its state)`.
    pub async fn releases(&self, e: Exec) -> (usize, Option<TerminalReason>, LeaseState) {
        let w = self.lease(e.id).await.expect("the exec's Lease");
        (
            self.receipts(e, "release").await.len(),
            w.terminal_reason,
            w.state,
        )
    }

    /// A reconciler step on a certain reading (waits for one, bounded).
    pub async fn rec_step(&self) -> lc_worker::StepReport {
        loop {
            self.wait_reading(|r| r.certain).await;
            let r = self.rec.step().await.expect("reconciler step");
            if r.at.certain {
                return r;
            }
        }
    }

    /// `(deposited, available, held, consumed)` of the rig's tenant.
    pub async fn balances(&self) -> (i64, i64, i64, i64) {
        let t = self.store.tenant(self.tenant).await.unwrap();
        (t.deposited, t.available, t.held, t.consumed)
    }

    /// Seals a hibernation of the exec (reason `requested`) under the
    /// operation key `key`, as a client does.
    pub async fn hibernate(&self, e: ExecId, key: &str) -> lc_core::HibernationRecord {
        let at = self.wait_reading(|r| r.certain).await;
        self.store
            .request_hibernation(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                at,
                self.tenant,
                e,
            )
            .await
            .expect("request hibernation")
    }

    /// The workspace's head (it has one once a hibernation committed).
    pub async fn head(&self, e: ExecId) -> Digest {
        self.store
            .workspace(self.tenant, e)
            .await
            .unwrap()
            .head
            .expect("a workspace head")
    }

    /// Asks to resume the parked exec from its head (a digest of zeros
    /// when it has none) under `key`, as a client does.
    pub async fn resume(&self, e: ExecId, key: &str) -> Result<lc_core::ResumeIntent, LcError> {
        let head = self
            .store
            .workspace(self.tenant, e)
            .await
            .unwrap()
            .head
            .unwrap_or(Digest([0; 32]));
        let at = self.wait_reading(|r| r.certain).await;
        self.store
            .request_resume(
                &OperationKey::new(
                    key,
                    lc_core::hibernate::resume_request_sha256(e, Some(head)),
                )
                .unwrap(),
                at,
                self.tenant,
                e,
                Some(head),
            )
            .await
    }

    /// Asks to resume the parked exec from whatever its head is, naming
    /// none (`{"head": null}`), under `key`, as a client does.
    pub async fn resume_headless(
        &self,
        e: ExecId,
        key: &str,
    ) -> Result<lc_core::ResumeIntent, LcError> {
        let at = self.wait_reading(|r| r.certain).await;
        let op = OperationKey::new(key, lc_core::hibernate::resume_request_sha256(e, None));
        self.store
            .request_resume(&op.unwrap(), at, self.tenant, e, None)
            .await
    }

    /// The exec's pages in the store, by seq: `(seq, kind, bytes)`, the
    /// bytes read from the sink (verified).
    pub async fn pages(&self, e: ExecId) -> Vec<(i64, PageKind, Vec<u8>)> {
        let pages = self
            .store
            .output(self.tenant, e, 0, 1000)
            .await
            .expect("output");
        pages
            .iter()
            .map(|p| {
                (
                    p.meta.seq,
                    p.meta.kind,
                    self.sink
                        .get(&p.meta.sha256)
                        .unwrap()
                        .expect("the page's blob"),
                )
            })
            .collect()
    }

    /// Rows of `sql` (one bigint column, `$1` the exec id) for the exec.
    pub async fn count(&self, e: ExecId, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .bind(e.0)
            .fetch_one(&mut self.sql().await)
            .await
            .unwrap()
    }

    /// `(op_key, refused_code, refused_message)` of the exec's resume
    /// intents, by op key.
    pub async fn intents(&self, e: ExecId) -> Vec<(String, Option<String>, Option<String>)> {
        sqlx::query_as(
            "SELECT op_key, refused_code, refused_message FROM lc_resume_intents \
              WHERE exec_id = $1 ORDER BY op_key",
        )
        .bind(e.0)
        .fetch_all(&mut self.sql().await)
        .await
        .unwrap()
    }

    /// The acked pages of the exec concatenated from the sink, verified,
    /// with no gap from seq 1, and the terminal page's exit.
    pub async fn output(&self, e: Exec) -> (Vec<u8>, Option<ExitStatus>) {
        let pages = self
            .store
            .output(self.tenant, e.id, 0, 1000)
            .await
            .expect("output");
        let mut out = Vec::new();
        let mut exit = None;
        for (expect, p) in (1..).zip(&pages) {
            assert_eq!(p.meta.seq, expect, "no gap");
            if p.meta.kind == PageKind::Terminal {
                exit = p.meta.exit;
            } else {
                out.extend(
                    self.sink
                        .get(&p.meta.sha256)
                        .unwrap()
                        .expect("the page's blob"),
                );
            }
        }
        (out, exit)
    }
}

/// The real provider, except for what a real one never does, to show
/// that the gateway refuses it: with `page`, the spool answers other
/// bytes under seq 2 (a pending page whose spooled bytes differ from its
/// committed metadata is never acked); with `measurement`, `measure`
/// answers a signed observation, not a measurement (the store refuses it
/// and the milestone records no observation).
pub struct Forging {
    pub real: Arc<dyn Provider>,
    pub page: bool,
    pub measurement: bool,
}

#[async_trait]
impl Provider for Forging {
    fn id(&self) -> &lc_core::ProviderId {
        self.real.id()
    }
    fn public_key(&self) -> ed25519_dalek::VerifyingKey {
        self.real.public_key()
    }
    async fn allocate(
        &self,
        req: lc_provider::AllocateRequest,
    ) -> Result<lc_provider::Allocation, ProviderError> {
        self.real.allocate(req).await
    }
    async fn destroy(
        &self,
        l: SandboxLeaseId,
        g: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        self.real.destroy(l, g).await
    }
    async fn prove_not_sent(
        &self,
        l: SandboxLeaseId,
        g: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        self.real.prove_not_sent(l, g).await
    }
    async fn observe(
        &self,
        l: SandboxLeaseId,
        g: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        self.real.observe(l, g).await
    }
    async fn measure(
        &self,
        l: SandboxLeaseId,
        g: Generation,
    ) -> Result<lc_core::evidence::Envelope, ProviderError> {
        if self.measurement {
            return self.real.observe(l, g).await;
        }
        self.real.measure(l, g).await
    }
    async fn pages(
        &self,
        l: SandboxLeaseId,
        g: Generation,
        fence: lc_core::owner::OwnerFence,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<lc_core::page::Page>, ProviderError> {
        let mut pages = self.real.pages(l, g, fence, after_seq, max).await?;
        if self.page {
            for p in &mut pages {
                if p.seq() == 2 {
                    *p =
                        lc_core::page::Page::data(2, PageKind::Stdout, b"forged".to_vec()).unwrap();
                }
            }
        }
        Ok(pages)
    }
    async fn inventory(&self) -> Result<Vec<lc_provider::InstanceSummary>, ProviderError> {
        self.real.inventory().await
    }
    async fn ack(
        &self,
        l: SandboxLeaseId,
        g: Generation,
        fence: lc_core::owner::OwnerFence,
        through_seq: i64,
    ) -> Result<(), ProviderError> {
        self.real.ack(l, g, fence, through_seq).await
    }
    async fn cancel(
        &self,
        l: SandboxLeaseId,
        g: Generation,
        fence: lc_core::owner::OwnerFence,
    ) -> Result<(), ProviderError> {
        self.real.cancel(l, g, fence).await
    }
    async fn send(
        &self,
        l: SandboxLeaseId,
        g: Generation,
        fence: lc_core::owner::OwnerFence,
        input_seq: i64,
        bytes: Vec<u8>,
        eof: bool,
    ) -> Result<i64, ProviderError> {
        self.real.send(l, g, fence, input_seq, bytes, eof).await
    }
    async fn stop(
        &self,
        l: SandboxLeaseId,
        g: Generation,
        fence: lc_core::owner::OwnerFence,
    ) -> Result<Option<lc_core::page::StopOutcome>, ProviderError> {
        self.real.stop(l, g, fence).await
    }
    async fn quiesce(
        &self,
        l: SandboxLeaseId,
        g: Generation,
        fence: lc_core::owner::OwnerFence,
    ) -> Result<lc_provider::Quiesced, ProviderError> {
        self.real.quiesce(l, g, fence).await
    }
    async fn spool_status(
        &self,
        l: SandboxLeaseId,
        g: Generation,
    ) -> Result<Option<SpoolStatus>, ProviderError> {
        self.real.spool_status(l, g).await
    }
}
