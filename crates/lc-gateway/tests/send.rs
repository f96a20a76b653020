//! Input delivery of `Gateway::step` against an in-memory store holding
//! one exec with queued stdin inputs and an in-memory supervisor behind the
//! `Provider` trait that answers `send` as the real one does (a repeated
//! seq is ok without writing again, a gap is refused) or as a test scripts
//! it (`input_busy`, `input_closed`, a stale fence). No page ever appears:
//! these tests are about input only.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clock::{Clock, ClockError, ClockKind, ClockReading};
use ed25519_dalek::VerifyingKey;
use jiff::{SignedDuration, Timestamp};
use lc_blob::LocalBlobStore;
use lc_core::evidence::Envelope;
use lc_core::input::{InputRecord, InputState};
use lc_core::model::{CanonicalIdentity, TenantId, WorkspaceId};
use lc_core::owner::{
    OwnedExec, OwnerCredential, OwnerFence, OwnerGeneration, OwnerToken, Ownership, PageMeta,
    StageReport, TakeoverBasis, TransitionKind, TransitionReceipt,
};
use lc_core::page::{Page, SpoolStatus};
use lc_core::store::GatewayStore;
use lc_core::{
    AttemptNo, CutReading, Digest, ExecId, Generation, LcError, LeaseState, ProviderId,
    SandboxLeaseId,
};
use lc_gateway::{
    CrashPoint, FaultHook, Gateway, GatewayOptions, INPUTS_PER_STEP, ProviderConnector,
};
use lc_provider::{AllocateRequest, Allocation, Provider, ProviderError};

const EXEC: ExecId = ExecId(1);

#[derive(Debug)]
struct FixedClock;

#[async_trait]
impl Clock for FixedClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        Ok(ClockReading::certain(
            Timestamp::from_second(1_000).unwrap(),
        ))
    }
    fn kind(&self) -> ClockKind {
        ClockKind::Test
    }
}

// ---------------------------------------------------------------- store

#[derive(Default)]
struct StoreState {
    ownership: Option<Ownership>,
    /// Ownerships granted so far (the last one's generation and fence).
    claims: i64,
    inputs: Vec<InputRecord>,
    /// `record_send` calls accepted: (transition id, input seq).
    recorded: Vec<(String, i64)>,
    /// `queued_inputs` calls.
    queued_reads: usize,
}

#[derive(Default)]
struct InputStore {
    s: Mutex<StoreState>,
}

impl InputStore {
    fn queue(&self, bytes: &[u8], eof: bool) {
        let mut s = self.s.lock().unwrap();
        let seq = i64::try_from(s.inputs.len()).unwrap() + 1;
        s.inputs.push(InputRecord {
            exec_id: EXEC,
            input_seq: seq,
            bytes: bytes.to_vec(),
            sha256: Digest::of(bytes),
            eof,
            state: InputState::Queued,
            send_transition_id: None,
        });
    }

    fn view(s: &StoreState) -> OwnedExec {
        OwnedExec {
            ownership: s.ownership.clone().unwrap(),
            basis: TakeoverBasis::Unowned,
            tenant_id: TenantId(1),
            identity: CanonicalIdentity {
                exec_id: EXEC,
                lease_id: SandboxLeaseId(100),
                provider_id: ProviderId::new("p1").unwrap(),
                runtime: Digest::of(b"runtime"),
                workspace_id: WorkspaceId(7),
            },
            attempt: AttemptNo(1),
            lease_id: SandboxLeaseId(100),
            lease_generation: Generation(1),
            lease_state: LeaseState::Active,
            provider_url: "http://p1".into(),
            staged_through: 0,
            acked_through: 0,
            terminal_acked_seq: None,
            cancel_requested: false,
        }
    }

    fn owned_by(s: &StoreState, cred: &OwnerCredential) -> Result<(), LcError> {
        let o = s.ownership.as_ref().unwrap();
        if o.token_sha256 != cred.token.sha256() || o.generation != cred.generation {
            return Err(LcError::OwnerStale {
                exec_id: EXEC,
                presented: cred.generation,
                current: o.generation,
            });
        }
        Ok(())
    }

    fn recorded(&self) -> Vec<(String, i64)> {
        self.s.lock().unwrap().recorded.clone()
    }

    fn queued_reads(&self) -> usize {
        self.s.lock().unwrap().queued_reads
    }
}

fn not_here(what: &str) -> LcError {
    LcError::StorageFailure {
        message: format!("{what} is not in this fake"),
    }
}

#[async_trait]
impl GatewayStore for InputStore {
    async fn claim(
        &self,
        token: &OwnerToken,
        at: CutReading,
        ttl: SignedDuration,
        _limit: usize,
    ) -> Result<Vec<OwnedExec>, LcError> {
        let mut s = self.s.lock().unwrap();
        if s.ownership.is_some() {
            return Ok(Vec::new());
        }
        s.claims += 1;
        s.ownership = Some(Ownership {
            exec_id: EXEC,
            token_sha256: token.sha256(),
            generation: OwnerGeneration(s.claims),
            fence: OwnerFence(s.claims),
            heartbeat_expiry: at.cut + ttl,
            released: false,
        });
        Ok(vec![InputStore::view(&s)])
    }
    async fn take_over(
        &self,
        _token: &OwnerToken,
        _tenant: TenantId,
        _exec_id: ExecId,
        _at: CutReading,
        _ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        Err(not_here("take_over"))
    }
    async fn heartbeat(
        &self,
        cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        _ttl: SignedDuration,
    ) -> Result<OwnedExec, LcError> {
        let s = self.s.lock().unwrap();
        InputStore::owned_by(&s, cred)?;
        Ok(InputStore::view(&s))
    }
    async fn stage_pages(
        &self,
        _cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        _pages: &[PageMeta],
    ) -> Result<StageReport, LcError> {
        Err(not_here("stage_pages"))
    }
    async fn pending_pages(
        &self,
        cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        _limit: usize,
    ) -> Result<Vec<PageMeta>, LcError> {
        InputStore::owned_by(&self.s.lock().unwrap(), cred)?;
        Ok(Vec::new())
    }
    async fn ack_pages(
        &self,
        _cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        _transition_id: &str,
        _through_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        Err(not_here("ack_pages"))
    }
    async fn cancel(
        &self,
        _cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        _transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        Err(not_here("cancel"))
    }
    async fn release(
        &self,
        _cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        _transition_id: &str,
    ) -> Result<TransitionReceipt, LcError> {
        Err(not_here("release"))
    }
    async fn queued_inputs(
        &self,
        cred: &OwnerCredential,
        _exec_id: ExecId,
        _at: CutReading,
        limit: usize,
    ) -> Result<Vec<InputRecord>, LcError> {
        let mut s = self.s.lock().unwrap();
        InputStore::owned_by(&s, cred)?;
        s.queued_reads += 1;
        Ok(s.inputs
            .iter()
            .filter(|i| i.state == InputState::Queued)
            .take(limit)
            .cloned()
            .collect())
    }
    async fn record_send(
        &self,
        cred: &OwnerCredential,
        exec_id: ExecId,
        at: CutReading,
        transition_id: &str,
        input_seq: i64,
    ) -> Result<TransitionReceipt, LcError> {
        let mut s = self.s.lock().unwrap();
        InputStore::owned_by(&s, cred)?;
        let sent_through = s
            .inputs
            .iter()
            .filter(|i| i.state == InputState::Sent)
            .map(|i| i.input_seq)
            .max()
            .unwrap_or(0);
        let idx = usize::try_from(input_seq - 1).unwrap();
        lc_core::input::check_send(&s.inputs[idx], sent_through)?;
        s.inputs[idx].state = InputState::Sent;
        s.inputs[idx].send_transition_id = Some(transition_id.to_owned());
        s.recorded.push((transition_id.to_owned(), input_seq));
        Ok(TransitionReceipt {
            exec_id,
            transition_id: transition_id.to_owned(),
            kind: TransitionKind::Send,
            token_sha256: cred.token.sha256(),
            owner_generation: cred.generation,
            owner_fence: cred.fence,
            request_sha256: Digest::of(transition_id.as_bytes()),
            committed_cut: at.cut,
            detail: serde_json::json!({ "input_seq": input_seq }),
        })
    }
}

// ---------------------------------------------------------------- supervisor

#[derive(Default)]
struct Stdin {
    /// The highest input seq accepted.
    input_seq: i64,
    /// The bytes written to the command's stdin, in order.
    written: Vec<u8>,
    /// Whether stdin was closed (after an `eof` input).
    closed: bool,
    /// Answers to the next `send`s, in order: `Some` is given instead of
    /// the real rules, `None` applies them.
    scripted: VecDeque<Option<ProviderError>>,
    /// `send` calls: (input seq, eof).
    calls: Vec<(i64, bool)>,
}

struct FakeSupervisor {
    id: ProviderId,
    stdin: Mutex<Stdin>,
}

fn unsupported() -> ProviderError {
    ProviderError::InvalidRequest {
        detail: "not in this fake".into(),
    }
}

fn refused(reason: &str) -> ProviderError {
    ProviderError::InputRefused {
        reason: reason.into(),
        detail: format!("{reason} from the fake"),
    }
}

#[async_trait]
impl Provider for FakeSupervisor {
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
        _fence: OwnerFence,
        _after_seq: i64,
        _max: usize,
    ) -> Result<Vec<Page>, ProviderError> {
        Ok(Vec::new())
    }
    async fn ack(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
        _fence: OwnerFence,
        _through_seq: i64,
    ) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn cancel(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
        _fence: OwnerFence,
    ) -> Result<(), ProviderError> {
        Err(unsupported())
    }
    async fn send(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
        _fence: OwnerFence,
        input_seq: i64,
        bytes: Vec<u8>,
        eof: bool,
    ) -> Result<i64, ProviderError> {
        let mut st = self.stdin.lock().unwrap();
        st.calls.push((input_seq, eof));
        if let Some(Some(e)) = st.scripted.pop_front() {
            return Err(e);
        }
        if input_seq <= st.input_seq {
            return Ok(st.input_seq);
        }
        if input_seq > st.input_seq + 1 {
            return Err(refused("input_gap"));
        }
        if st.closed {
            return Err(refused("input_closed"));
        }
        st.written.extend_from_slice(&bytes);
        st.input_seq = input_seq;
        st.closed = eof;
        Ok(input_seq)
    }
    async fn spool_status(
        &self,
        _lease_id: SandboxLeaseId,
        _generation: Generation,
    ) -> Result<Option<SpoolStatus>, ProviderError> {
        Ok(None)
    }
}

struct OneProvider(Arc<FakeSupervisor>);

#[async_trait]
impl ProviderConnector for OneProvider {
    async fn connect(&self, _url: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(self.0.clone())
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<CrashPoint>>);

impl FaultHook for Recorder {
    fn reached(&self, point: CrashPoint) {
        self.0.lock().unwrap().push(point);
    }
}

struct Fixture {
    store: Arc<InputStore>,
    supervisor: Arc<FakeSupervisor>,
    sink_dir: std::path::PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let sink_dir =
            std::env::temp_dir().join(format!("lc-gw-send-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&sink_dir);
        Fixture {
            store: Arc::new(InputStore::default()),
            supervisor: Arc::new(FakeSupervisor {
                id: ProviderId::new("p1").unwrap(),
                stdin: Mutex::new(Stdin::default()),
            }),
            sink_dir,
        }
    }

    fn gateway(&self) -> Gateway {
        Gateway::new(
            self.store.clone(),
            Arc::new(OneProvider(self.supervisor.clone())),
            Arc::new(LocalBlobStore::open(&self.sink_dir).unwrap()),
            Arc::new(FixedClock),
            GatewayOptions::default(),
        )
        .unwrap()
    }

    fn written(&self) -> Vec<u8> {
        self.supervisor.stdin.lock().unwrap().written.clone()
    }

    fn calls(&self) -> Vec<(i64, bool)> {
        self.supervisor.stdin.lock().unwrap().calls.clone()
    }

    /// The answers to the next `send`s ([`Stdin::scripted`]).
    fn script(&self, answers: impl IntoIterator<Item = Option<ProviderError>>) {
        self.supervisor
            .stdin
            .lock()
            .unwrap()
            .scripted
            .extend(answers);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.sink_dir);
    }
}

fn tids(seqs: std::ops::RangeInclusive<i64>, generation: i64) -> Vec<(String, i64)> {
    seqs.map(|n| (format!("send-1-{n}-g{generation}"), n))
        .collect()
}

#[tokio::test]
async fn inputs_are_delivered_in_seq_order_at_most_a_bound_per_step() {
    let f = Fixture::new("order");
    let extra = 4;
    let total = INPUTS_PER_STEP + extra;
    for n in 1..=total {
        f.store.queue(format!("{n}\n").as_bytes(), n == total);
    }
    let g = f.gateway();
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(r.inputs_sent, INPUTS_PER_STEP);
    let bound = i64::try_from(INPUTS_PER_STEP).unwrap();
    assert_eq!(f.store.recorded(), tids(1..=bound, 1));
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures.len()), (extra, 0));
    let all = i64::try_from(total).unwrap();
    assert_eq!(f.store.recorded(), tids(1..=all, 1));
    let want: String = (1..=total).map(|n| format!("{n}\n")).collect();
    assert_eq!(f.written(), want.into_bytes());
    // After the eof input nothing more can follow: the queue is not read
    // again.
    let reads = f.store.queued_reads();
    assert_eq!(reads, 2);
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures.len()), (0, 0));
    assert_eq!(f.store.queued_reads(), reads);
    let m = g.metrics().snapshot();
    assert_eq!(m.inputs_sent, u64::try_from(total).unwrap());
    assert_eq!(
        m.input_bytes_sent,
        (1..=total)
            .map(|n| format!("{n}\n").len() as u64)
            .sum::<u64>()
    );
}

#[tokio::test]
async fn a_busy_supervisor_ends_the_step_s_inputs_and_the_next_step_resumes() {
    let f = Fixture::new("busy");
    for b in [&b"a\n"[..], b"b\n", b"c\n"] {
        f.store.queue(b, false);
    }
    // Input 1 is taken; input 2 meets a full supervisor queue.
    f.script([None, Some(refused("input_busy"))]);
    let g = f.gateway();
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures.clone()), (1, vec![]));
    assert_eq!(f.store.recorded(), tids(1..=1, 1));
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures), (2, vec![]));
    assert_eq!(f.store.recorded(), tids(1..=3, 1));
    assert_eq!(f.written(), b"a\nb\nc\n");
    assert_eq!(
        f.calls(),
        vec![(1, false), (2, false), (2, false), (3, false)]
    );
}

#[tokio::test]
async fn a_closed_stdin_ends_delivery_for_the_activation_without_a_failure() {
    let f = Fixture::new("closed");
    f.store.queue(b"late\n", false);
    f.script([Some(refused("input_closed"))]);
    let g = f.gateway();
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures.clone(), r.owned), (0, vec![], 1));
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures, r.owned), (0, vec![], 1));
    // Offered once; the input stays queued, without a receipt.
    assert_eq!(f.calls(), vec![(1, false)]);
    assert_eq!(f.store.queued_reads(), 1);
    assert_eq!(f.store.recorded(), vec![]);
}

#[tokio::test]
async fn another_refusal_is_a_failure_retried_at_the_next_step() {
    let f = Fixture::new("gap");
    f.store.queue(b"x", false);
    f.script([Some(refused("input_gap"))]);
    let g = f.gateway();
    let r = g.step().await;
    assert_eq!(r.inputs_sent, 0);
    assert_eq!(
        r.failures
            .iter()
            .map(|e| (e.exec_id, e.code.as_str(), e.message.as_str()))
            .collect::<Vec<_>>(),
        vec![(
            Some(EXEC),
            "input_refused",
            "input refused (input_gap): input_gap from the fake"
        )]
    );
    assert_eq!(r.owned, 1, "the exec is kept");
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures), (1, vec![]));
    assert_eq!(f.store.recorded(), tids(1..=1, 1));
}

#[tokio::test]
async fn a_stale_fence_on_send_forgets_the_exec() {
    let f = Fixture::new("stale");
    f.store.queue(b"x", false);
    f.script([Some(ProviderError::StaleFence {
        presented: 1,
        highest: 2,
    })]);
    let g = f.gateway();
    let r = g.step().await;
    assert_eq!(
        (r.inputs_sent, r.stale_refused, r.owned, r.failures),
        (0, 1, 0, vec![])
    );
    assert_eq!(f.store.recorded(), vec![]);
}

#[tokio::test]
async fn a_crash_after_send_leaves_the_input_queued_for_a_successor() {
    let f = Fixture::new("crash");
    f.store.queue(b"one\n", false);
    f.store.queue(b"two\n", true);
    let hook = Arc::new(Recorder::default());
    let g = f
        .gateway()
        .with_crash_point(Some(CrashPoint::AfterSend), hook.clone());
    let r = g.step().await;
    assert_eq!(r.crashed, Some(CrashPoint::AfterSend));
    assert_eq!(*hook.0.lock().unwrap(), vec![CrashPoint::AfterSend]);
    // The supervisor wrote input 1; the store still has it queued.
    assert_eq!(f.written(), b"one\n");
    assert_eq!(f.store.recorded(), vec![]);
    // Its ownership ends; the successor (generation 2) delivers input 1
    // again, which writes nothing twice, and records it under its own
    // transition id.
    f.store.s.lock().unwrap().ownership = None;
    let successor = f.gateway();
    let r = successor.step().await;
    assert_eq!((r.inputs_sent, r.failures), (2, vec![]));
    assert_eq!(f.written(), b"one\ntwo\n");
    assert_eq!(f.calls(), vec![(1, false), (1, false), (2, true)]);
    assert_eq!(f.store.recorded(), tids(1..=2, 2));
    // The dead owner is refused from here on.
    assert_eq!(g.step().await.stale_refused, 1);
}
