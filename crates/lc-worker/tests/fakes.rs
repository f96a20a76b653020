//! The reconciler's step against an in-memory store and provider that keep
//! the contract's rules (the real store and the bubblewrap provider are
//! tested in their crates and, with the reconciler, in the appliance's
//! end-to-end test): a command runs to its terminal page, its pages are
//! stored once and in order and acked only after they are stored, the
//! Reservation returns exactly once, an uncertain cut retries the destroy
//! but releases nothing, and a start failure releases with `start_failed`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clock::{Clock, ClockError, ClockKind, ClockReading};
use jiff::Timestamp;
use lc_core::rules::{LeaseView, plan_lease_action};
use lc_core::store::ReconcileStore;
use lc_core::{
    AppendReport, AttemptNo, CutReading, Digest, ExecId, Generation, LcError, LeaseState,
    LeaseWork, OutputPage, PageExit, PageKind, Provider, ProviderId, ReleaseOutcome,
    SandboxLeaseId, TenantId, TerminalReason, WorkspaceId,
};
use lc_worker::{PortError, ProviderPort, Reconciler, ReconcilerOptions};

const T0: i128 = 1_800_000_000_000_000_000;
const TTL_NS: i128 = 60_000_000_000;

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).unwrap()
}

/// A clock the test moves and makes uncertain.
#[derive(Debug)]
struct StepClock(Mutex<(Timestamp, bool)>);

impl StepClock {
    fn set(&self, now: Timestamp, certain: bool) {
        *self.0.lock().unwrap() = (now, certain);
    }
}

#[async_trait]
impl Clock for StepClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        let (now, certain) = *self.0.lock().unwrap();
        let mut r = ClockReading::certain(now);
        if !certain {
            r.uncertain = Some(safetime::UncertainReason::Stale);
        }
        Ok(r)
    }
    fn kind(&self) -> ClockKind {
        ClockKind::SafeCut
    }
}

#[derive(Debug, Clone)]
struct Lease {
    state: LeaseState,
    expiry: Timestamp,
    cancel: bool,
    reason: Option<TerminalReason>,
    units: i64,
    released: bool,
}

#[derive(Debug, Default)]
struct StoreState {
    leases: BTreeMap<i64, Lease>,
    pages: Vec<OutputPage>,
    available: i64,
    held: i64,
    releases_committed: usize,
    calls: Vec<String>,
}

/// An in-memory [`ReconcileStore`] with one tenant account.
#[derive(Debug, Default)]
struct MemStore(Mutex<StoreState>);

fn provider_id() -> ProviderId {
    ProviderId::new("local").unwrap()
}

impl MemStore {
    fn admit(&self, lease: i64, units: i64, cut: Timestamp) {
        let mut s = self.0.lock().unwrap();
        s.available -= units;
        s.held += units;
        s.leases.insert(
            lease,
            Lease {
                state: LeaseState::Allocating,
                expiry: ts(cut.as_nanosecond() + TTL_NS),
                cancel: false,
                reason: None,
                units,
                released: false,
            },
        );
    }

    fn work(&self, id: i64, l: &Lease, s: &StoreState, at: CutReading) -> Option<LeaseWork> {
        let terminal_page = s
            .pages
            .iter()
            .any(|p| p.exec_id.0 == id && p.kind == PageKind::Terminal);
        let action = plan_lease_action(
            LeaseView {
                state: l.state,
                expiry: l.expiry,
                cancel_requested: l.cancel,
                timeout_deadline: None,
                terminal_page,
            },
            at,
        )?;
        Some(LeaseWork {
            lease_id: SandboxLeaseId(id),
            generation: Generation(1),
            state: l.state,
            expiry: l.expiry,
            action,
            exec_id: ExecId(id),
            tenant_id: TenantId(1),
            attempt: AttemptNo(1),
            provider_id: provider_id(),
            provider_url: "http://127.0.0.1:1".into(),
            runtime: Digest([7; 32]),
            shape: "small".into(),
            command: vec!["echo".into(), "hi".into()],
            workspace_id: WorkspaceId(id),
            last_seq: s
                .pages
                .iter()
                .filter(|p| p.exec_id.0 == id)
                .map(|p| p.seq)
                .max()
                .unwrap_or(0),
            terminal_reason: l.reason,
        })
    }

    fn lease(&self, id: i64) -> Lease {
        self.0.lock().unwrap().leases[&id].clone()
    }
}

fn not_found() -> LcError {
    LcError::NotFound {
        what: "lease",
        id: String::new(),
    }
}

#[async_trait]
impl ReconcileStore for MemStore {
    async fn register_provider(
        &self,
        id: &ProviderId,
        url: &str,
        public_key: [u8; 32],
    ) -> Result<Provider, LcError> {
        Ok(Provider {
            provider_id: id.clone(),
            url: url.into(),
            public_key,
        })
    }

    async fn due_work(&self, at: CutReading, limit: usize) -> Result<Vec<LeaseWork>, LcError> {
        let s = self.0.lock().unwrap();
        Ok(s.leases
            .iter()
            .filter_map(|(id, l)| self.work(*id, l, &s, at))
            .take(limit)
            .collect())
    }

    async fn mark_active(
        &self,
        lease: SandboxLeaseId,
        _g: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("mark_active {}", lease.0));
        let l = s.leases.get_mut(&lease.0).ok_or_else(not_found)?;
        l.state = LeaseState::Active;
        let l = l.clone();
        Ok(self.work(lease.0, &l, &s, at).unwrap())
    }

    async fn renew(
        &self,
        lease: SandboxLeaseId,
        _g: Generation,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("renew {}", lease.0));
        let l = s.leases.get_mut(&lease.0).ok_or_else(not_found)?;
        l.expiry = l.expiry.max(ts(at.cut.as_nanosecond() + TTL_NS));
        let l = l.clone();
        Ok(self.work(lease.0, &l, &s, at).unwrap())
    }

    async fn append_pages(
        &self,
        lease: SandboxLeaseId,
        _g: Generation,
        pages: &[OutputPage],
    ) -> Result<AppendReport, LcError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("append {} {}", lease.0, pages.len()));
        let mut report = AppendReport::default();
        for p in pages {
            let last = s
                .pages
                .iter()
                .filter(|q| q.exec_id == p.exec_id)
                .map(|q| q.seq)
                .max()
                .unwrap_or(0);
            if p.seq <= last {
                report.duplicates += 1;
            } else if p.seq == last + 1 {
                s.pages.push(p.clone());
                report.appended += 1;
            } else {
                return Err(LcError::InvalidPage {
                    reason: format!("gap at {}", p.seq),
                });
            }
        }
        report.last_seq = s
            .pages
            .iter()
            .filter(|q| q.exec_id.0 == lease.0)
            .map(|q| q.seq)
            .max()
            .unwrap_or(0);
        Ok(report)
    }

    async fn begin_release(
        &self,
        lease: SandboxLeaseId,
        _g: Generation,
        reason: TerminalReason,
        at: CutReading,
    ) -> Result<LeaseWork, LcError> {
        let mut s = self.0.lock().unwrap();
        s.calls
            .push(format!("begin_release {} {}", lease.0, reason.as_str()));
        let l = s.leases.get_mut(&lease.0).ok_or_else(not_found)?;
        if l.state != LeaseState::ReleasePending {
            l.state = LeaseState::ReleasePending;
            l.reason = Some(reason);
        }
        let l = l.clone();
        Ok(self.work(lease.0, &l, &s, at).unwrap())
    }

    async fn commit_release(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
        evidence: &serde_json::Value,
        at: CutReading,
    ) -> Result<ReleaseOutcome, LcError> {
        if !at.certain {
            return Err(LcError::TimeUncertain { retry_after_s: 1 });
        }
        let mut s = self.0.lock().unwrap();
        s.calls.push(format!("commit_release {}", lease.0));
        if evidence["lease_id"] != lease.0 {
            return Err(LcError::EvidenceRejected {
                reason: "wrong lease".into(),
            });
        }
        let l = s.leases.get_mut(&lease.0).ok_or_else(not_found)?;
        let units = l.units;
        let replay = l.released;
        if !replay {
            l.released = true;
            l.state = LeaseState::Released;
            s.available += units;
            s.held -= units;
            s.releases_committed += 1;
        }
        Ok(ReleaseOutcome {
            lease_id: lease,
            generation,
            exec_id: ExecId(lease.0),
            units_returned: units,
            released_cut: at.cut,
            replay,
        })
    }

    async fn attach_receipts(&self, _at: CutReading, _limit: usize) -> Result<usize, LcError> {
        Ok(0)
    }

    async fn gc_operations(&self, _at: CutReading, _limit: usize) -> Result<usize, LcError> {
        Ok(0)
    }
}

#[derive(Debug, Default)]
struct ProviderState {
    /// Spooled pages by lease, the instance alive.
    spool: BTreeMap<i64, (Vec<OutputPage>, bool)>,
    acked: BTreeMap<i64, i64>,
    destroys: usize,
    refuse_allocate: bool,
    /// Each page `pages` returns is appended to this log (seq per lease).
    served: Vec<(i64, i64)>,
}

#[derive(Debug)]
struct FakeProvider {
    id: ProviderId,
    st: Mutex<ProviderState>,
}

fn page(exec: i64, seq: i64, kind: PageKind, bytes: &[u8]) -> OutputPage {
    OutputPage {
        exec_id: ExecId(exec),
        attempt: AttemptNo(1),
        seq,
        kind,
        bytes: bytes.to_vec(),
        sha256: Digest::of(bytes),
        exit: (kind == PageKind::Terminal).then_some(PageExit {
            code: Some(0),
            signal: None,
        }),
    }
}

impl FakeProvider {
    fn new() -> FakeProvider {
        FakeProvider {
            id: provider_id(),
            st: Mutex::new(ProviderState::default()),
        }
    }
    /// The command of `lease` writes `n` stdout pages, then (if `exit`) exits.
    fn emit(&self, lease: i64, n: usize, exit: bool) {
        let mut st = self.st.lock().unwrap();
        let (spool, _) = st.spool.get_mut(&lease).unwrap();
        let mut next = spool.last().map_or(0, |p| p.seq) + 1;
        if let Some(a) = st.acked.get(&lease) {
            next = next.max(a + 1);
        }
        let (spool, _) = st.spool.get_mut(&lease).unwrap();
        for _ in 0..n {
            spool.push(page(
                lease,
                next,
                PageKind::Stdout,
                format!("line {next}\n").as_bytes(),
            ));
            next += 1;
        }
        if exit {
            spool.push(page(lease, next, PageKind::Terminal, b""));
        }
    }
}

#[async_trait]
impl ProviderPort for FakeProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }
    fn public_key(&self) -> [u8; 32] {
        [9; 32]
    }
    async fn allocate(&self, work: &LeaseWork) -> Result<(), PortError> {
        let mut st = self.st.lock().unwrap();
        if st.refuse_allocate {
            return Err(PortError::Refused {
                code: "start_failed".into(),
                message: "no such runtime".into(),
            });
        }
        st.spool
            .entry(work.lease_id.0)
            .or_insert((Vec::new(), true));
        Ok(())
    }
    async fn pages(
        &self,
        work: &LeaseWork,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<OutputPage>, PortError> {
        let lease = work.lease_id;
        let mut st = self.st.lock().unwrap();
        let out: Vec<OutputPage> = st
            .spool
            .get(&lease.0)
            .map(|(s, _)| {
                s.iter()
                    .filter(|p| p.seq > after_seq)
                    .take(max)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for p in &out {
            st.served.push((lease.0, p.seq));
        }
        Ok(out)
    }
    async fn ack(&self, work: &LeaseWork, through_seq: i64) -> Result<(), PortError> {
        let lease = work.lease_id;
        let mut st = self.st.lock().unwrap();
        st.acked.insert(lease.0, through_seq);
        if let Some((s, _)) = st.spool.get_mut(&lease.0) {
            s.retain(|p| p.seq > through_seq);
        }
        Ok(())
    }
    async fn destroy(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
    ) -> Result<serde_json::Value, PortError> {
        let mut st = self.st.lock().unwrap();
        st.destroys += 1;
        st.spool.remove(&lease.0);
        Ok(
            serde_json::json!({ "lease_id": lease.0, "generation": generation.0, "statement": "absence" }),
        )
    }
}

struct Rig {
    store: Arc<MemStore>,
    provider: Arc<FakeProvider>,
    clock: Arc<StepClock>,
    rec: Reconciler,
}

fn rig(options: ReconcilerOptions) -> Rig {
    let store = Arc::new(MemStore::default());
    store.0.lock().unwrap().available = 8;
    let provider = Arc::new(FakeProvider::new());
    let clock = Arc::new(StepClock(Mutex::new((ts(T0), true))));
    let rec = Reconciler::new(
        store.clone(),
        vec![provider.clone() as Arc<dyn ProviderPort>],
        clock.clone(),
        options,
    )
    .unwrap();
    Rig {
        store,
        provider,
        clock,
        rec,
    }
}

#[tokio::test]
async fn a_command_runs_to_its_terminal_page_and_returns_its_units_once() {
    let r = rig(ReconcilerOptions::default());
    r.store.admit(1, 2, ts(T0));
    {
        let st = r.store.0.lock().unwrap();
        assert_eq!((st.available, st.held), (6, 2));
    }

    let s = r.rec.step().await.unwrap();
    assert_eq!((s.leases_seen, s.allocated), (1, 1));
    assert_eq!(r.store.lease(1).state, LeaseState::Active);

    // 70 stdout pages (more than one append batch of 64) and the exit.
    r.provider.emit(1, 70, true);
    let s = r.rec.step().await.unwrap();
    assert_eq!(s.failures, vec![]);
    assert_eq!((s.pages_appended, s.pages_duplicate, s.acks), (71, 0, 2));
    assert_eq!(s.releases_begun, 1);
    assert_eq!(r.store.lease(1).reason, Some(TerminalReason::Exited));
    let seqs: Vec<i64> = r
        .store
        .0
        .lock()
        .unwrap()
        .pages
        .iter()
        .map(|p| p.seq)
        .collect();
    assert_eq!(seqs, (1..=71).collect::<Vec<_>>());
    assert_eq!(r.provider.st.lock().unwrap().acked[&1], 71);

    let s = r.rec.step().await.unwrap();
    assert_eq!((s.destroyed, s.released, s.units_returned), (1, 1, 2));
    {
        let st = r.store.0.lock().unwrap();
        assert_eq!((st.available, st.held, st.releases_committed), (8, 0, 1));
    }

    // Nothing is due any more: no second release.
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.leases_seen, s.released, s.units_returned), (0, 0, 0));
    assert_eq!(r.store.0.lock().unwrap().releases_committed, 1);
}

#[tokio::test]
async fn an_uncertain_cut_retries_the_destroy_but_releases_nothing() {
    let r = rig(ReconcilerOptions::default());
    r.store.admit(1, 3, ts(T0));
    r.rec.step().await.unwrap();
    r.provider.emit(1, 1, true);
    r.rec.step().await.unwrap();
    assert_eq!(r.store.lease(1).state, LeaseState::ReleasePending);

    r.clock.set(ts(T0 + 1_000_000_000), false);
    for _ in 0..3 {
        let s = r.rec.step().await.unwrap();
        assert_eq!((s.destroyed, s.release_deferred, s.released), (1, 1, 0));
        assert!(!s.at.certain);
    }
    assert_eq!(r.provider.st.lock().unwrap().destroys, 3);
    {
        let st = r.store.0.lock().unwrap();
        assert_eq!((st.available, st.held, st.releases_committed), (5, 3, 0));
        assert!(!st.calls.iter().any(|c| c.starts_with("commit_release")));
    }
    r.clock.set(ts(T0 + 2_000_000_000), true);
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.destroyed, s.released, s.units_returned), (1, 1, 3));
    let st = r.store.0.lock().unwrap();
    assert_eq!((st.available, st.held, st.releases_committed), (8, 0, 1));
}

#[tokio::test]
async fn an_uncertain_cut_expires_nothing_and_renewal_never_shortens() {
    let r = rig(ReconcilerOptions::default());
    r.store.admit(1, 1, ts(T0));
    r.rec.step().await.unwrap();
    // Far past the lease's expiry, but uncertain: it is renewed, not expired.
    r.clock.set(ts(T0 + 10 * TTL_NS), false);
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.renewed, s.releases_begun), (1, 0));
    assert_eq!(r.store.lease(1).expiry, ts(T0 + 11 * TTL_NS));
    assert_eq!(r.store.lease(1).state, LeaseState::Active);
    // Within renew_ahead (30 s) of a certain cut: renewed to cut + ttl.
    r.clock.set(ts(T0 + 11 * TTL_NS - 30_000_000_000), true);
    let s = r.rec.step().await.unwrap();
    assert_eq!(s.renewed, 1);
    assert_eq!(
        r.store.lease(1).expiry,
        ts(T0 + 12 * TTL_NS - 30_000_000_000)
    );
    // More than renew_ahead left: no write.
    let s = r.rec.step().await.unwrap();
    assert_eq!(s.renewed, 0);
}

#[tokio::test]
async fn a_certain_cut_past_the_expiry_releases_as_expired() {
    let r = rig(ReconcilerOptions::default());
    r.store.admit(1, 1, ts(T0));
    r.rec.step().await.unwrap();
    r.clock.set(ts(T0 + TTL_NS), true);
    let s = r.rec.step().await.unwrap();
    assert_eq!(s.releases_begun, 1);
    assert_eq!(r.store.lease(1).reason, Some(TerminalReason::Expired));
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.released, s.units_returned), (1, 1));
}

#[tokio::test]
async fn a_start_failure_releases_with_start_failed() {
    let r = rig(ReconcilerOptions::default());
    r.provider.st.lock().unwrap().refuse_allocate = true;
    r.store.admit(1, 2, ts(T0));
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.allocated, s.start_failed), (0, 1));
    assert_eq!(r.store.lease(1).reason, Some(TerminalReason::StartFailed));
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.released, s.units_returned), (1, 2));
}

#[tokio::test]
async fn a_cancel_releases_as_cancelled() {
    let r = rig(ReconcilerOptions::default());
    r.store.admit(1, 1, ts(T0));
    r.rec.step().await.unwrap();
    r.store.0.lock().unwrap().leases.get_mut(&1).unwrap().cancel = true;
    r.rec.step().await.unwrap();
    assert_eq!(r.store.lease(1).reason, Some(TerminalReason::Cancelled));
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.destroyed, s.released), (1, 1));
}

#[tokio::test]
async fn pages_stored_before_a_lost_ack_are_acked_and_not_stored_twice() {
    let r = rig(ReconcilerOptions::default());
    r.store.admit(1, 1, ts(T0));
    r.rec.step().await.unwrap();
    r.provider.emit(1, 3, false);
    // A previous worker stored pages 1..=3 and died before acking them.
    let pages: Vec<OutputPage> = r.provider.st.lock().unwrap().spool[&1].0.clone();
    r.store
        .append_pages(SandboxLeaseId(1), Generation(1), &pages)
        .await
        .unwrap();
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.pages_appended, s.pages_duplicate, s.acks), (0, 0, 1));
    assert_eq!(r.provider.st.lock().unwrap().acked[&1], 3);
    assert!(r.provider.st.lock().unwrap().spool[&1].0.is_empty());
    assert_eq!(r.store.0.lock().unwrap().pages.len(), 3);
}

#[tokio::test]
async fn a_step_handles_at_most_its_batch() {
    let r = rig(ReconcilerOptions {
        batch: 2,
        ..ReconcilerOptions::default()
    });
    r.store.0.lock().unwrap().available = 100;
    for id in 1..=5 {
        r.store.admit(id, 1, ts(T0));
    }
    let s = r.rec.step().await.unwrap();
    assert_eq!((s.leases_seen, s.allocated), (2, 2));
    let active = |r: &Rig| {
        r.store
            .0
            .lock()
            .unwrap()
            .leases
            .values()
            .filter(|l| l.state == LeaseState::Active)
            .count()
    };
    assert_eq!(active(&r), 2);
    assert!(
        Reconciler::new(
            r.store.clone(),
            vec![],
            r.clock.clone(),
            ReconcilerOptions {
                batch: 0,
                ..ReconcilerOptions::default()
            }
        )
        .is_err()
    );
}
