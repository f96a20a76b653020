//! `Gateway::step` against an in-memory store that applies lc-core's
//! ownership rules, an in-memory spool behind the `Provider` trait, the
//! real local sink and a clock the test moves. Crash points are driven by a
//! fault hook that records the point (the gateway then abandons its step,
//! as if it had died there); the real-process tests kill it instead.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clock::{Clock, ClockError, ClockKind, ClockReading, UncertainReason};
use ed25519_dalek::VerifyingKey;
use jiff::{SignedDuration, Timestamp};
use lc_blob::{BlobStore, LocalBlobStore};
use lc_core::evidence::Envelope;
use lc_core::model::{CanonicalIdentity, TenantId, WorkspaceId};
use lc_core::owner::{
    OwnedExec, OwnerCredential, OwnerFence, OwnerGeneration, OwnerToken, Ownership, PageMeta,
    PageState, StageReport, TransitionKind, TransitionPlan, TransitionReceipt, check_owner,
    check_release, heartbeat_expiry, plan_takeover, plan_transition,
};
use lc_core::page::{ExitStatus, Page, SpoolStatus};
use lc_core::store::GatewayStore;
use lc_core::{
    AttemptNo, CutReading, Digest, ExecId, Generation, LcError, LeaseState, PageKind, ProviderId,
    SandboxLeaseId,
};
use lc_gateway::{CrashPoint, FaultHook, Gateway, GatewayOptions, ProviderConnector, StepReport};
use lc_provider::{AllocateRequest, Allocation, Provider, ProviderError};

// ---------------------------------------------------------------- clock

#[derive(Debug)]
struct MovableClock {
    now: Mutex<(Timestamp, bool)>,
}

impl MovableClock {
    fn at(s: i64) -> Arc<MovableClock> {
        Arc::new(MovableClock {
            now: Mutex::new((Timestamp::from_second(s).unwrap(), true)),
        })
    }
    fn set(&self, s: i64, certain: bool) {
        *self.now.lock().unwrap() = (Timestamp::from_second(s).unwrap(), certain);
    }
}

#[async_trait]
impl Clock for MovableClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        let (now, certain) = *self.now.lock().unwrap();
        let mut r = ClockReading::certain(now);
        if !certain {
            r.uncertain = Some(UncertainReason::SamplingGap);
        }
        Ok(r)
    }
    fn kind(&self) -> ClockKind {
        ClockKind::Test
    }
}

// ---------------------------------------------------------------- store

struct FakeExec {
    tenant: TenantId,
    identity: CanonicalIdentity,
    attempt: AttemptNo,
    lease_generation: Generation,
    lease_state: LeaseState,
    provider_url: String,
    ownership: Option<Ownership>,
    pages: BTreeMap<i64, (PageMeta, PageState)>,
    cancel_requested: bool,
    releases: usize,
    release_reason: Option<&'static str>,
}

#[derive(Default)]
struct StoreState {
    execs: BTreeMap<ExecId, FakeExec>,
    fence_seq: i64,
    receipts: BTreeMap<(ExecId, String), TransitionReceipt>,
    /// Refused fenced writes, by code.
    refused: BTreeMap<&'static str, usize>,
}

#[derive(Default)]
struct FakeStore {
    s: Mutex<StoreState>,
}

fn view(e: &FakeExec, basis: lc_core::owner::TakeoverBasis) -> OwnedExec {
    let staged_through = e.pages.keys().next_back().copied().unwrap_or(0);
    let mut acked_through = 0;
    for (seq, (_, st)) in &e.pages {
        if *st == PageState::Acked && *seq == acked_through + 1 {
            acked_through = *seq;
        }
    }
    let terminal_acked_seq = e
        .pages
        .values()
        .find(|(m, st)| m.kind == PageKind::Terminal && *st == PageState::Acked)
        .map(|(m, _)| m.seq);
    OwnedExec {
        ownership: e.ownership.clone().unwrap(),
        basis,
        tenant_id: e.tenant,
        identity: e.identity.clone(),
        attempt: e.attempt,
        lease_id: e.identity.lease_id,
        lease_generation: e.lease_generation,
        lease_state: e.lease_state,
        provider_url: e.provider_url.clone(),
        staged_through,
        acked_through,
        terminal_acked_seq,
        cancel_requested: e.cancel_requested,
    }
}

impl FakeStore {
    fn add_exec(&self, id: i64, url: &str) {
        let mut s = self.s.lock().unwrap();
        s.execs.insert(
            ExecId(id),
            FakeExec {
                tenant: TenantId(1),
                identity: CanonicalIdentity {
                    exec_id: ExecId(id),
                    lease_id: SandboxLeaseId(100 + id),
                    provider_id: ProviderId::new("p1").unwrap(),
                    runtime: Digest::of(b"runtime"),
                    workspace_id: WorkspaceId(7),
                },
                attempt: AttemptNo(1),
                lease_generation: Generation(1),
                lease_state: LeaseState::Active,
                provider_url: url.into(),
                ownership: None,
                pages: BTreeMap::new(),
                cancel_requested: false,
                releases: 0,
                release_reason: None,
            },
        );
    }

    fn with<T>(&self, f: impl FnOnce(&mut StoreState) -> T) -> T {
        f(&mut self.s.lock().unwrap())
    }

    /// Checks the owner in the "same transaction" as the write.
    fn fenced<T>(
        &self,
        cred: &OwnerCredential,
        id: ExecId,
        at: CutReading,
        f: impl FnOnce(&mut StoreState, ExecId) -> Result<T, LcError>,
    ) -> Result<T, LcError> {
        let mut s = self.s.lock().unwrap();
        let e = s.execs.get(&id).ok_or(LcError::NotFound {
            what: "exec",
            id: id.to_string(),
        })?;
        let owner = e.ownership.clone().ok_or(LcError::OwnerStale {
            exec_id: id,
            presented: cred.generation,
            current: OwnerGeneration(0),
        })?;
        if let Err(err) = check_owner(&owner, cred, at) {
            *s.refused.entry(err.code()).or_insert(0) += 1;
            return Err(err);
        }
        f(&mut s, id)
    }

    fn transition(
        s: &mut StoreState,
        id: ExecId,
        cred: &OwnerCredential,
        at: CutReading,
        (tid, kind, request): (&str, TransitionKind, String),
        commit: impl FnOnce(&mut FakeExec) -> Result<serde_json::Value, LcError>,
    ) -> Result<TransitionReceipt, LcError> {
        let req = Digest::of(request.as_bytes());
        let current = s.execs[&id].ownership.clone().unwrap();
        let stored = s.receipts.get(&(id, tid.to_owned()));
        match plan_transition(stored, kind, req, &current, cred, at)? {
            TransitionPlan::Replay(r) => Ok(r),
            TransitionPlan::Commit => {
                let detail = commit(s.execs.get_mut(&id).unwrap())?;
                let r = TransitionReceipt {
                    exec_id: id,
                    transition_id: tid.into(),
                    kind,
                    token_sha256: cred.token.sha256(),
                    owner_generation: cred.generation,
                    owner_fence: cred.fence,
                    request_sha256: req,
                    committed_cut: at.cut,
                    detail,
                };
                s.receipts.insert((id, tid.into()), r.clone());
                Ok(r)
            }
        }
    }
}

#[async_trait]
impl GatewayStore for FakeStore {
    async fn claim(
        &self,
        token: &OwnerToken,
        at: CutReading,
        ttl: SignedDuration,
        limit: usize,
    ) -> Result<Vec<OwnedExec>, LcError> {
        let mut s = self.s.lock().unwrap();
        let mut out = Vec::new();
        let ids: Vec<ExecId> = s.execs.keys().copied().collect();
        for id in ids {
            if out.len() >= limit {
                break;
            }
            let e = &s.execs[&id];
            if e.lease_state != LeaseState::Active {
                continue;
            }
            let Ok(basis) = plan_takeover(e.ownership.as_ref(), at) else {
                continue;
            };
            s.fence_seq += 1;
            let fence = OwnerFence(s.fence_seq);
            let e = s.execs.get_mut(&id).unwrap();
            let generation =
                OwnerGeneration(e.ownership.as_ref().map_or(0, |o| o.generation.0) + 1);
            e.ownership = Some(Ownership {
                exec_id: id,
                token_sha256: token.sha256(),
                generation,
                fence,
                heartbeat_expiry: at.cut + ttl,
                released: false,
            });
            out.push(view(e, basis));
        }
        Ok(out)
    }

    async fn take_over(
        &self,
        _token: &OwnerToken,
        _tenant: TenantId,
        _exec_id: ExecId,
        _at: CutReading,
        _ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        unreachable!("the gateway claims")
    }

    async fn heartbeat(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        self.fenced(cred, exec_id, at, |s, id| {
            let e = s.execs.get_mut(&id).unwrap();
            let o = e.ownership.as_mut().unwrap();
            o.heartbeat_expiry = heartbeat_expiry(o, cred, at, ttl)?;
            Ok(view(e, lc_core::owner::TakeoverBasis::Unowned))
        })
    }

    async fn stage_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        pages: &[PageMeta],
    ) -> Result<StageReport, LcError> {
        self.fenced(cred, exec_id, at, |s, id| {
            let e = s.execs.get_mut(&id).unwrap();
            let mut r = StageReport::default();
            for m in pages {
                let next = e.pages.keys().next_back().copied().unwrap_or(0) + 1;
                match e.pages.get(&m.seq) {
                    Some((old, _)) if old == m => r.duplicates += 1,
                    Some(_) => {
                        return Err(LcError::PageConflict {
                            exec_id: id,
                            seq: m.seq,
                        });
                    }
                    None if m.seq == next => {
                        e.pages.insert(m.seq, (m.clone(), PageState::Pending));
                        r.staged += 1;
                    }
                    None => {
                        return Err(LcError::InvalidPage {
                            reason: format!("seq {} does not follow {}", m.seq, next - 1),
                        });
                    }
                }
            }
            r.staged_through = e.pages.keys().next_back().copied().unwrap_or(0);
            Ok(r)
        })
    }

    async fn pending_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        limit: usize,
    ) -> Result<Vec<PageMeta>, LcError> {
        self.fenced(cred, exec_id, at, |s, id| {
            Ok(s.execs[&id]
                .pages
                .values()
                .filter(|(_, st)| *st == PageState::Pending)
                .take(limit)
                .map(|(m, _)| m.clone())
                .collect())
        })
    }

    async fn ack_pages(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        through_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        self.fenced(cred, exec_id, at, |s, id| {
            FakeStore::transition(
                s,
                id,
                cred,
                at,
                (
                    transition_id,
                    TransitionKind::Ack,
                    format!("ack {through_seq}"),
                ),
                |e| {
                    if !e.pages.contains_key(&through_seq) {
                        return Err(LcError::InvalidPage {
                            reason: "beyond the committed pages".into(),
                        });
                    }
                    for (_, (_, st)) in e.pages.range_mut(..=through_seq) {
                        *st = PageState::Acked;
                    }
                    Ok(serde_json::json!({ "through_seq": through_seq }))
                },
            )
        })
    }

    async fn cancel(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        self.fenced(cred, exec_id, at, |s, id| {
            FakeStore::transition(
                s,
                id,
                cred,
                at,
                (transition_id, TransitionKind::Cancel, "cancel".into()),
                |_| Ok(serde_json::json!({})),
            )
        })
    }

    async fn queued_inputs(
        &self,
        _cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        _limit: usize,
    ) -> Result<Vec<lc_core::input::InputRecord>, LcError> {
        Ok(Vec::new())
    }

    async fn record_send(
        &self,
        _cred: &OwnerCredential,
        exec_id: ExecId,
        _at: CutReading,
        _transition_id: &str,
        _input_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        Err(LcError::not_found("input", exec_id))
    }

    async fn release(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        self.fenced(cred, exec_id, at, |s, id| {
            let cancelled = s
                .receipts
                .values()
                .any(|r| r.exec_id == id && r.kind == TransitionKind::Cancel);
            FakeStore::transition(
                s,
                id,
                cred,
                at,
                (transition_id, TransitionKind::Release, "release".into()),
                |e| {
                    let terminal =
                        view(e, lc_core::owner::TakeoverBasis::Unowned).terminal_acked_seq;
                    check_release(id, terminal, false)?;
                    e.lease_state = LeaseState::ReleasePending;
                    e.ownership.as_mut().unwrap().released = true;
                    e.releases += 1;
                    e.release_reason = Some(if cancelled { "cancelled" } else { "exited" });
                    Ok(serde_json::json!({}))
                },
            )
        })
    }
}

// ---------------------------------------------------------------- spool

#[derive(Default)]
struct SpoolState {
    pages: BTreeMap<i64, Page>,
    acked_through: i64,
    /// Every ack the supervisor received, in order.
    acks: Vec<i64>,
    /// Refuse every call with `supervisor_unavailable` while set.
    down: bool,
    /// The highest owner fence shown; a lower one is refused.
    highest_fence: i64,
    /// Fenced calls refused as stale.
    stale: usize,
    cancels: usize,
}

impl SpoolState {
    fn fence(&mut self, fence: OwnerFence) -> Result<(), ProviderError> {
        if self.down {
            return Err(ProviderError::SupervisorUnavailable {
                detail: "down".into(),
            });
        }
        if fence.0 < self.highest_fence {
            self.stale += 1;
            return Err(ProviderError::StaleFence {
                presented: fence.0,
                highest: self.highest_fence,
            });
        }
        self.highest_fence = fence.0;
        Ok(())
    }
}

struct FakeProvider {
    id: ProviderId,
    spool: Mutex<SpoolState>,
}

impl FakeProvider {
    fn new(id: &str) -> Arc<FakeProvider> {
        Arc::new(FakeProvider {
            id: ProviderId::new(id).unwrap(),
            spool: Mutex::new(SpoolState::default()),
        })
    }
    fn push(&self, page: Page) {
        let mut s = self.spool.lock().unwrap();
        s.pages.insert(page.seq(), page);
    }
    fn spooled(&self) -> Vec<i64> {
        self.spool.lock().unwrap().pages.keys().copied().collect()
    }
}

fn unsupported() -> ProviderError {
    ProviderError::InvalidRequest {
        detail: "not in this fake".into(),
    }
}

#[async_trait]
impl Provider for FakeProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }
    fn public_key(&self) -> VerifyingKey {
        ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]).verifying_key()
    }
    async fn allocate(&self, _req: AllocateRequest) -> Result<Allocation, ProviderError> {
        Err(unsupported())
    }
    async fn destroy(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        Err(unsupported())
    }
    async fn observe(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        Err(unsupported())
    }
    async fn pages(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
        fence: OwnerFence,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<Page>, ProviderError> {
        let mut s = self.spool.lock().unwrap();
        s.fence(fence)?;
        Ok(s.pages
            .range(after_seq + 1..)
            .take(max)
            .map(|(_, p)| p.clone())
            .collect())
    }
    async fn ack(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
        fence: OwnerFence,
        through_seq: i64,
    ) -> Result<(), ProviderError> {
        let mut s = self.spool.lock().unwrap();
        s.fence(fence)?;
        s.acks.push(through_seq);
        s.acked_through = s.acked_through.max(through_seq);
        s.pages.retain(|seq, _| *seq > through_seq);
        Ok(())
    }
    async fn cancel(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
        fence: OwnerFence,
    ) -> Result<(), ProviderError> {
        let mut s = self.spool.lock().unwrap();
        s.fence(fence)?;
        s.cancels += 1;
        // The command dies by SIGKILL: its terminal page follows.
        let next = s
            .pages
            .keys()
            .next_back()
            .copied()
            .unwrap_or(s.acked_through)
            + 1;
        if !s.pages.values().any(Page::is_terminal) {
            s.pages
                .insert(next, Page::terminal(next, ExitStatus::signaled(9)).unwrap());
        }
        Ok(())
    }
    async fn send(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
        _fence: OwnerFence,
        _input_seq: i64,
        _bytes: Vec<u8>,
        _eof: bool,
    ) -> Result<i64, ProviderError> {
        Err(unsupported())
    }
    async fn spool_status(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
    ) -> Result<Option<SpoolStatus>, ProviderError> {
        let s = self.spool.lock().unwrap();
        Ok(Some(SpoolStatus {
            pages: s.pages.len() as u64,
            bytes: s.pages.values().map(|p| p.bytes().len() as u64).sum(),
            pages_max: 1000,
            bytes_max: 1 << 23,
            next_seq: s
                .pages
                .keys()
                .next_back()
                .copied()
                .unwrap_or(s.acked_through)
                + 1,
            acked_through: s.acked_through,
            highest_fence: s.highest_fence,
            terminal_seq: s
                .pages
                .values()
                .find(|p| p.is_terminal())
                .map_or(0, Page::seq),
            command_exited: false,
            cancelled: s.cancels > 0,
            input_seq: 0,
        }))
    }
}

struct OneProvider(Arc<FakeProvider>);

#[async_trait]
impl ProviderConnector for OneProvider {
    async fn connect(&self, url: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        if url == "http://p1" {
            Ok(self.0.clone())
        } else {
            Err(ProviderError::Unreachable { detail: url.into() })
        }
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<CrashPoint>>);

impl FaultHook for Recorder {
    fn reached(&self, point: CrashPoint) {
        self.0.lock().unwrap().push(point);
    }
}

// ---------------------------------------------------------------- fixture

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<FakeStore>,
    provider: Arc<FakeProvider>,
    sink: Arc<LocalBlobStore>,
    clock: Arc<MovableClock>,
}

const TTL_S: i64 = 5;

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let sink = Arc::new(LocalBlobStore::open(dir.path()).unwrap());
        Fixture {
            _dir: dir,
            store: Arc::new(FakeStore::default()),
            provider: FakeProvider::new("p1"),
            sink,
            clock: MovableClock::at(1_000),
        }
    }

    fn gateway(&self, options: GatewayOptions) -> Gateway {
        Gateway::new(
            self.store.clone(),
            Arc::new(OneProvider(self.provider.clone())),
            self.sink.clone(),
            self.clock.clone(),
            options,
        )
        .unwrap()
    }

    fn default_gateway(&self) -> Gateway {
        self.gateway(GatewayOptions {
            heartbeat_ttl: SignedDuration::from_secs(TTL_S),
            ..GatewayOptions::default()
        })
    }

    /// The acked pages of exec 1 concatenated from the sink, verified, and
    /// the terminal page's exit.
    fn output(&self) -> (Vec<u8>, Option<ExitStatus>) {
        self.store.with(|s| {
            let e = &s.execs[&ExecId(1)];
            let mut out = Vec::new();
            let mut exit = None;
            for (expect, (seq, (m, st))) in (1..).zip(e.pages.iter()) {
                assert_eq!(*seq, expect, "no gap");
                if *st != PageState::Acked {
                    continue;
                }
                if m.kind == PageKind::Terminal {
                    exit = m.exit;
                } else {
                    out.extend(self.sink.get(&m.sha256).unwrap().unwrap());
                }
            }
            (out, exit)
        })
    }
}

/// Exec 1 writes `data_pages` pages of 1000 distinct bytes each, then
/// exits 3.
fn stream(f: &Fixture, data_pages: i64) -> Vec<u8> {
    f.store.add_exec(1, "http://p1");
    let mut expected = Vec::new();
    for seq in 1..=data_pages {
        let bytes: Vec<u8> = (0..1000)
            .map(|i| ((i as i64 * 7 + seq) % 256) as u8)
            .collect();
        expected.extend(&bytes);
        f.provider
            .push(Page::data(seq, PageKind::Stdout, bytes).unwrap());
    }
    f.provider
        .push(Page::terminal(data_pages + 1, ExitStatus::exited(3)).unwrap());
    expected
}

fn releases(f: &Fixture) -> (usize, Option<&'static str>, LeaseState) {
    f.store.with(|s| {
        let e = &s.execs[&ExecId(1)];
        (e.releases, e.release_reason, e.lease_state)
    })
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn one_step_moves_every_page_exactly_once_then_releases() {
    let f = Fixture::new();
    let expected = stream(&f, 5);
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (
            r.claimed,
            r.taken_over,
            r.pages_staged,
            r.pages_acked,
            r.bytes_acked
        ),
        (1, 0, 6, 6, 5000)
    );
    assert_eq!((r.supervisor_acks, r.released, r.owned), (1, 1, 0));
    assert_eq!(f.output(), (expected, Some(ExitStatus::exited(3))));
    assert_eq!(
        releases(&f),
        (1, Some("exited"), LeaseState::ReleasePending)
    );
    assert_eq!(f.provider.spooled(), Vec::<i64>::new());
    assert_eq!(f.provider.spool.lock().unwrap().acks, vec![6]);
    let m = g.metrics().snapshot();
    assert_eq!(
        (m.claims, m.pages_acked, m.bytes_acked, m.releases),
        (1, 6, 5000, 1)
    );
    assert_eq!((m.owned_execs, m.ack_latency_count), (0, 1));
    // Nothing more to do: a released exec is never claimed again.
    let r = g.step().await;
    assert_eq!((r.claimed, r.owned, r.pages_acked), (0, 0, 0));
    assert_eq!(releases(&f).0, 1);
}

#[tokio::test]
async fn pages_are_bounded_per_exec_and_step() {
    let f = Fixture::new();
    let expected = stream(&f, 150);
    let g = f.gateway(GatewayOptions {
        heartbeat_ttl: SignedDuration::from_secs(TTL_S),
        owned_max: 1,
        pages_per_step: 64,
    });
    let r = g.step().await;
    assert_eq!((r.pages_acked, r.supervisor_acks, r.released), (64, 1, 0));
    let r = g.step().await;
    assert_eq!((r.heartbeats, r.pages_acked, r.released), (1, 64, 0));
    let r = g.step().await;
    // 22 data pages and the terminal page.
    assert_eq!((r.pages_acked, r.released), (23, 1));
    assert_eq!(f.output(), (expected, Some(ExitStatus::exited(3))));
    assert_eq!(f.provider.spool.lock().unwrap().acks, vec![64, 128, 151]);
}

/// A gateway dies at `point`; a second one takes over once a certain cut
/// passes the first one's heartbeat expiry and finishes exactly once; the
/// first one, resumed, is refused on its first write and forgets the exec.
async fn crash_and_take_over(point: CrashPoint) {
    let f = Fixture::new();
    let expected = stream(&f, 5);
    let hook = Arc::new(Recorder::default());
    let a = f
        .default_gateway()
        .with_crash_point(Some(point), hook.clone());
    let r = a.step().await;
    assert_eq!(r.crashed, Some(point));
    assert_eq!(*hook.0.lock().unwrap(), vec![point]);
    let (staged, acked) = f.store.with(|s| {
        let e = &s.execs[&ExecId(1)];
        (
            e.pages.len(),
            e.pages
                .values()
                .filter(|(_, st)| *st == PageState::Acked)
                .count(),
        )
    });
    assert_eq!(staged, 6, "{point}");
    let want_acked = match point {
        CrashPoint::AfterMetadata | CrashPoint::AfterSink => 0,
        CrashPoint::AfterAckResult | CrashPoint::BeforeSupervisorAck => 6,
    };
    assert_eq!(acked, want_acked, "{point}");
    // The spool still holds every page: nothing was acked to the supervisor.
    assert_eq!(f.provider.spooled(), vec![1, 2, 3, 4, 5, 6]);

    let b = f.default_gateway();
    // While the first owner's heartbeat is live nothing is taken over.
    f.clock.set(1_000 + TTL_S - 1, true);
    let r = b.step().await;
    assert_eq!((r.claimed, r.taken_over, r.owned), (0, 0, 0));
    // Past it, but on an uncertain cut: still nothing.
    f.clock.set(1_000 + TTL_S + 10, false);
    let r = b.step().await;
    assert_eq!((r.taken_over, r.owned), (0, 0));
    // On a certain cut at the expiry: taken over, finished, released.
    f.clock.set(1_000 + TTL_S, true);
    let r = b.step().await;
    assert_eq!(r.failures, vec![], "{point}");
    assert_eq!((r.taken_over, r.released), (1, 1), "{point}");
    assert_eq!(r.pending_finished, 6 - want_acked, "{point}");
    assert_eq!(r.pages_staged, 0, "{point}");
    assert_eq!(f.output(), (expected.clone(), Some(ExitStatus::exited(3))));
    assert_eq!(
        releases(&f),
        (1, Some("exited"), LeaseState::ReleasePending)
    );
    assert_eq!(f.provider.spooled(), Vec::<i64>::new());
    assert_eq!(f.provider.spool.lock().unwrap().acks, vec![6]);
    assert_eq!(b.metrics().snapshot().takeovers, 1);

    // The first gateway comes back: its heartbeat is refused, it forgets
    // the exec, and nothing changes.
    let r = a.step().await;
    assert_eq!(
        (r.stale_refused, r.owned, r.pages_acked),
        (1, 0, 0),
        "{point}"
    );
    assert_eq!(a.metrics().snapshot().stale_refused, 1);
    assert_eq!(f.output(), (expected, Some(ExitStatus::exited(3))));
    assert_eq!(releases(&f).0, 1);
    assert_eq!(f.provider.spool.lock().unwrap().acks, vec![6]);
}

#[tokio::test]
async fn a_crash_after_metadata_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::AfterMetadata).await;
}

#[tokio::test]
async fn a_crash_after_the_sink_write_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::AfterSink).await;
}

#[tokio::test]
async fn a_crash_after_the_ack_result_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::AfterAckResult).await;
}

#[tokio::test]
async fn a_crash_before_the_supervisor_ack_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::BeforeSupervisorAck).await;
}

#[tokio::test]
async fn a_paused_owner_is_refused_on_every_write_after_a_takeover() {
    let f = Fixture::new();
    stream(&f, 3);
    // Only the first two pages are there yet.
    let terminal = f.provider.spool.lock().unwrap().pages.split_off(&3);
    let a = f.default_gateway();
    let r = a.step().await;
    assert_eq!((r.claimed, r.pages_acked, r.released), (1, 2, 0));
    // `a` stalls past its heartbeat; `b` takes over and finishes.
    f.provider.spool.lock().unwrap().pages.extend(terminal);
    f.clock.set(1_000 + TTL_S, true);
    let b = f.default_gateway();
    let r = b.step().await;
    assert_eq!((r.taken_over, r.pages_acked, r.released), (1, 2, 1));
    let before = f.output();
    let r = a.step().await;
    assert_eq!(
        (r.stale_refused, r.owned, r.pages_acked, r.released),
        (1, 0, 0, 0)
    );
    assert_eq!(
        f.store.with(|s| s.refused.get("owner_stale").copied()),
        Some(1)
    );
    assert_eq!(f.output(), before);
    assert_eq!(releases(&f).0, 1);
}

#[tokio::test]
async fn an_owner_whose_heartbeat_expired_is_refused_and_forgets_the_exec() {
    let f = Fixture::new();
    stream(&f, 1);
    f.provider.spool.lock().unwrap().down = true;
    let a = f.default_gateway();
    let r = a.step().await;
    assert_eq!(r.claimed, 1);
    assert_eq!(r.failures[0].code, "supervisor_unavailable");
    // No step ran for a whole TTL: the heartbeat is refused as expired.
    f.clock.set(1_000 + TTL_S, true);
    // In the same step, the exec is free to take: this gateway takes it
    // again as a new ownership (the next generation and fence).
    let r = a.step().await;
    assert_eq!((r.stale_refused, r.heartbeats, r.taken_over), (1, 0, 1));
    assert_eq!(
        f.store.with(|s| s.refused.get("owner_expired").copied()),
        Some(1)
    );
    let o = f
        .store
        .with(|s| s.execs[&ExecId(1)].ownership.clone().unwrap());
    assert_eq!((o.generation, o.fence), (OwnerGeneration(2), OwnerFence(2)));
}

#[tokio::test]
async fn while_uncertain_the_owner_keeps_serving_but_nothing_is_claimed_or_released() {
    let f = Fixture::new();
    let expected = stream(&f, 2);
    f.clock.set(1_000, false);
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!((r.claimed, r.owned), (0, 0));
    f.clock.set(1_000, true);
    f.provider.spool.lock().unwrap().down = true;
    assert_eq!(g.step().await.claimed, 1);
    f.provider.spool.lock().unwrap().down = false;
    // Far past the expiry, but uncertain: the heartbeat and the pages go on,
    // the release waits.
    f.clock.set(1_000 + 10 * TTL_S, false);
    let r = g.step().await;
    assert_eq!(
        (r.heartbeats, r.pages_acked, r.released, r.owned),
        (1, 3, 0, 1)
    );
    assert_eq!(releases(&f).0, 0);
    f.clock.set(1_000 + 10 * TTL_S, true);
    let r = g.step().await;
    assert_eq!((r.heartbeats, r.released, r.owned), (1, 1, 0));
    assert_eq!(f.output(), (expected, Some(ExitStatus::exited(3))));
    let m = g.metrics().snapshot();
    assert_eq!((m.steps, m.steps_uncertain), (4, 2));
}

#[tokio::test]
async fn a_pending_page_that_differs_in_the_spool_is_never_acked() {
    let f = Fixture::new();
    stream(&f, 2);
    let hook = Arc::new(Recorder::default());
    let a = f
        .default_gateway()
        .with_crash_point(Some(CrashPoint::AfterMetadata), hook);
    assert_eq!(a.step().await.crashed, Some(CrashPoint::AfterMetadata));
    // The spool now holds other bytes under seq 2.
    f.provider
        .push(Page::data(2, PageKind::Stdout, b"forged".to_vec()).unwrap());
    f.clock.set(1_000 + TTL_S, true);
    let b = f.default_gateway();
    let r = b.step().await;
    assert_eq!(r.taken_over, 1);
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].code, "page_mismatch");
    assert_eq!(
        r.failures[0].message,
        "spooled page 2 differs from its committed metadata; it is not acked"
    );
    assert_eq!(r.pages_acked, 0);
    let acked = f.store.with(|s| {
        s.execs[&ExecId(1)]
            .pages
            .values()
            .filter(|(_, st)| *st == PageState::Acked)
            .count()
    });
    assert_eq!(acked, 0);
    assert_eq!(releases(&f).0, 0);
}

#[tokio::test]
async fn a_corrupt_sink_blob_is_replaced_before_the_ack() {
    let f = Fixture::new();
    let expected = stream(&f, 1);
    let first = f.provider.spool.lock().unwrap().pages[&1].clone();
    let d = Digest(first.sha256());
    f.sink.put(&d, first.bytes()).unwrap();
    std::fs::write(f.sink.path_of(&d), b"damaged").unwrap();
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!((r.pages_acked, r.released), (2, 1));
    assert_eq!(g.metrics().snapshot().sink_replaced, 1);
    assert_eq!(f.output(), (expected, Some(ExitStatus::exited(3))));
}

#[tokio::test]
async fn bad_options_are_refused_with_their_codes() {
    let f = Fixture::new();
    let build = |o: GatewayOptions| {
        Gateway::new(
            f.store.clone(),
            Arc::new(OneProvider(f.provider.clone())),
            f.sink.clone(),
            f.clock.clone(),
            o,
        )
        .map(|_| ())
        .map_err(|e| e.code())
    };
    let d = GatewayOptions::default();
    assert_eq!(build(d), Ok(()));
    assert_eq!(
        build(GatewayOptions {
            heartbeat_ttl: SignedDuration::from_millis(999),
            ..d
        }),
        Err("invalid_timeout")
    );
    assert_eq!(
        build(GatewayOptions { owned_max: 0, ..d }),
        Err("invalid_limit")
    );
    assert_eq!(
        build(GatewayOptions {
            pages_per_step: lc_gateway::PAGES_PER_STEP_MAX + 1,
            ..d
        }),
        Err("invalid_limit")
    );
}

#[allow(dead_code)]
fn _report_is_debug(r: &StepReport) -> String {
    format!("{r:?}")
}

#[tokio::test]
async fn a_cancel_commits_its_receipt_then_kills_and_releases_after_the_signal_page() {
    let f = Fixture::new();
    f.store.add_exec(1, "http://p1");
    f.provider
        .push(Page::data(1, PageKind::Stdout, b"started\n".to_vec()).unwrap());
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!((r.claimed, r.pages_acked, r.cancels), (1, 1, 0));
    f.store
        .with(|s| s.execs.get_mut(&ExecId(1)).unwrap().cancel_requested = true);
    // The heartbeat sees the request; the receipt, then the supervisor.
    let r = g.step().await;
    assert_eq!((r.cancels, r.released), (1, 0));
    let receipts: Vec<String> = f.store.with(|s| {
        s.receipts
            .values()
            .filter(|r| r.kind == TransitionKind::Cancel)
            .map(|r| r.transition_id.clone())
            .collect()
    });
    assert_eq!(receipts, vec!["cancel-1-g1".to_string()]);
    assert_eq!(f.provider.spool.lock().unwrap().cancels, 1);
    // The signal-9 terminal page is acked and the Lease released as cancelled.
    let r = g.step().await;
    assert_eq!((r.pages_acked, r.cancels, r.released), (1, 0, 1));
    assert_eq!(
        f.output(),
        (b"started\n".to_vec(), Some(ExitStatus::signaled(9)))
    );
    assert_eq!(
        releases(&f),
        (1, Some("cancelled"), LeaseState::ReleasePending)
    );
}

#[tokio::test]
async fn the_supervisor_refuses_a_stale_fence_and_the_gateway_forgets_the_exec() {
    let f = Fixture::new();
    stream(&f, 2);
    let a = f.default_gateway();
    f.provider.spool.lock().unwrap().down = true;
    assert_eq!(a.step().await.claimed, 1);
    // A newer owner's fence reached the supervisor (the store still names
    // `a`, as it would between a takeover and `a`'s next store write).
    {
        let mut s = f.provider.spool.lock().unwrap();
        s.down = false;
        s.highest_fence = 5;
    }
    let r = a.step().await;
    assert_eq!((r.stale_refused, r.owned, r.pages_acked), (1, 0, 0));
    assert_eq!(f.provider.spool.lock().unwrap().stale, 1);
    assert_eq!(a.metrics().snapshot().stale_refused, 1);
    assert_eq!(f.provider.spooled(), vec![1, 2, 3]);
}

#[tokio::test]
async fn spool_occupancy_is_sampled_into_the_metrics() {
    let f = Fixture::new();
    stream(&f, 3);
    let g = f.gateway(GatewayOptions {
        heartbeat_ttl: SignedDuration::from_secs(TTL_S),
        owned_max: 1,
        pages_per_step: 2,
    });
    let r = g.step().await;
    assert_eq!(r.pages_acked, 2);
    let m = g.metrics().snapshot();
    // Pages 3 and 4 (the terminal page) are still spooled.
    assert_eq!((m.spool_pages, m.spool_bytes), (2, 1000));
}

#[tokio::test]
async fn more_pending_pages_than_one_request_are_finished_before_any_new_page() {
    let f = Fixture::new();
    let expected = stream(&f, 100);
    // A predecessor committed the metadata of pages 1..=100 and died.
    let spooled: Vec<Page> = f
        .provider
        .spool
        .lock()
        .unwrap()
        .pages
        .values()
        .cloned()
        .collect();
    f.store.with(|s| {
        let e = s.execs.get_mut(&ExecId(1)).unwrap();
        for p in spooled.iter().filter(|p| p.seq() <= 100) {
            e.pages.insert(
                p.seq(),
                (
                    PageMeta::of_page(ExecId(1), AttemptNo(1), p),
                    PageState::Pending,
                ),
            );
        }
    });
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (
            r.claimed,
            r.pending_finished,
            r.pages_staged,
            r.pages_acked,
            r.released
        ),
        (1, 64, 0, 64, 0)
    );
    let r = g.step().await;
    assert_eq!(
        (
            r.pending_finished,
            r.pages_staged,
            r.pages_acked,
            r.released
        ),
        (36, 1, 37, 1)
    );
    assert_eq!(f.output(), (expected, Some(ExitStatus::exited(3))));
    assert_eq!(f.provider.spool.lock().unwrap().acks, vec![64, 100, 101]);
}
