//! The store while the database clock steps (libfaketime) and while the
//! sampler is paused, on PostgreSQL 15 and 18, with a real sampler whose
//! runtime runs on a thread of its own.
//!
//! Each scenario holds one running exec (whose Lease and Reservation are
//! renewed) and one whose release is pending with valid absence evidence in
//! hand. Then the cut turns uncertain: a forward step of the database's
//! wall clock, a backward step, or a sampler that stops publishing without
//! letting go of its leadership. While the clock's readings are uncertain,
//! admission is refused `time_uncertain` with the clock's retry-after and
//! writes nothing; a release with valid evidence does not commit and the
//! tenant's units stay held; renewals keep `max(current, cut + ttl)` to the
//! nanosecond; a deadline that database time has passed is not expired;
//! no exec is claimed or taken over by a gateway, while the running exec's
//! owner keeps renewing its heartbeat to `max(current, cut + ttl)`.
//! Once a reading is certain again the same commit returns the units
//! exactly once and Tollgate's audit is clean. Every read of the persisted
//! cut checks that it never went backward.

#[path = "clock_steps/claims.rs"]
mod claims;
#[path = "clock_steps/rate.rs"]
mod rate;
mod support;

#[path = "clock_steps/tokens.rs"]
mod tokens;

#[path = "clock_steps/deletion.rs"]
mod deletion;

#[path = "clock_steps/approvals.rs"]
mod approvals;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use clock::safe_cut::SafeCutClock;
use clock::{Clock, UncertainReason};
use jiff::{SignedDuration, Timestamp};
use lc_core::owner::{OwnerCredential, OwnerGeneration, OwnerToken};
use lc_core::{
    ControlStore, CutReading, ExecRecord, ExecRequest, ExecState, GatewayStore, Generation,
    LcError, LeaseAction, LeaseState, ReconcileStore, SandboxLeaseId, TenantId, TerminalReason,
};
use lc_pg::{LcConfig, LcStore};
use safetime::SafeTimeConfig;
use safetime_pg::CutRow;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use sqlx::{Connection, PgConnection};
use support::*;
use tokio::sync::watch;
use tollgate::Allocator;
use tollgate_pg_harness::{PgBinaries, PgServer};

const SECOND_NS: i64 = 1_000_000_000;

/// The sampling-gap bound of the sampler and the clock: a reading is stale
/// past it, and the clock's retry-after is its whole seconds.
const GAP_MAX: SignedDuration = SignedDuration::from_secs(2);

/// `retry_after_secs(GAP_MAX)`: what every `time_uncertain` answer carries.
const RETRY_AFTER_S: u64 = 2;

/// The Reservation TTL of the default configuration.
const RESERVATION_TTL: SignedDuration = SignedDuration::from_mins(10);

/// The server binaries of PostgreSQL `major`: 15 from the machine, 18 from
/// `TOLLGATE_PG18_BIN`. Fails, never skips, when they are missing.
fn binaries(major: u32) -> PgBinaries {
    let bins = match major {
        15 => PgBinaries::discover().expect("PostgreSQL 15 binaries"),
        18 => {
            let dir = std::env::var_os("TOLLGATE_PG18_BIN")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| panic!("TOLLGATE_PG18_BIN is not set: this test needs it"));
            PgBinaries::from_dir(&dir).expect("PostgreSQL 18 binaries")
        }
        other => panic!("no binaries configured for PostgreSQL {other}"),
    };
    assert_eq!(bins.major_version().unwrap(), major);
    bins
}

/// The sampler's settings: 50 ms samples, the 2 s gap bound, 3 stable
/// observations, and 3 s of calm before an anomaly's uncertainty ends, so
/// that the store can be exercised with fresh readings while uncertain.
fn sampler_options() -> SamplerOptions {
    SamplerOptions {
        config: SafeTimeConfig::new(
            50,
            SignedDuration::from_millis(50),
            GAP_MAX,
            SignedDuration::from_millis(500),
            3,
            SignedDuration::from_secs(3),
        )
        .unwrap(),
        standby_poll: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
    }
}

/// A sampler on a single-threaded runtime of its own thread. Pausing it
/// blocks that thread: the sampler stops between two steps, keeps its
/// session and its leadership, and publishes nothing, as a stopped
/// (SIGSTOP) sampler process does.
struct ThreadSampler {
    stop: watch::Sender<bool>,
    runtime: tokio::runtime::Handle,
    thread: std::thread::JoinHandle<()>,
}

/// A paused sampler; resumes on drop.
struct Paused {
    _resume: mpsc::Sender<()>,
}

impl ThreadSampler {
    fn start(url: &str) -> ThreadSampler {
        let sampler = Sampler::new(url, sampler_options()).unwrap();
        let (stop, rx) = watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        let thread = std::thread::spawn(move || runtime.block_on(sampler.run(rx)));
        ThreadSampler {
            stop,
            runtime: handle,
            thread,
        }
    }

    /// Blocks the sampler's thread until the returned guard is dropped;
    /// returns once the block is in place (at most 10 s).
    fn pause(&self) -> Paused {
        let (resume, resumed) = mpsc::channel::<()>();
        let (held, holding) = mpsc::channel::<()>();
        self.runtime.spawn(async move {
            held.send(()).unwrap();
            // Blocks the runtime's only thread until the guard is dropped.
            let _ = resumed.recv();
        });
        holding
            .recv_timeout(Duration::from_secs(10))
            .expect("the sampler's thread pauses within 10 s");
        Paused { _resume: resume }
    }

    /// Stops the sampler and joins its thread (at most 10 s).
    async fn stop(self) {
        self.stop.send(true).unwrap();
        let thread = self.thread;
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::task::spawn_blocking(move || thread.join()),
        )
        .await
        .expect("the sampler stops within 10 s")
        .unwrap()
        .expect("the sampler's thread ends without a panic");
    }
}

/// Reads the persisted cut, asserting on every read that it never went
/// backward; keeps every row seen.
struct CutLog {
    conn: PgConnection,
    seen: Vec<CutRow>,
}

impl CutLog {
    async fn new(url: &str) -> CutLog {
        CutLog {
            conn: PgConnection::connect(url).await.unwrap(),
            seen: Vec::new(),
        }
    }

    async fn read(&mut self) -> CutRow {
        let row = safetime_pg::read_cut(&mut self.conn)
            .await
            .unwrap()
            .expect("a claimed cut");
        if let Some(last) = self.seen.last() {
            assert!(
                row.cut >= last.cut,
                "the cut went backward: {} then {}",
                last.cut,
                row.cut
            );
        }
        self.seen.push(row.clone());
        row
    }

    /// Polls every 20 ms until `pred` holds (at most `secs` s).
    async fn until(&mut self, secs: u64, what: &str, pred: impl Fn(&CutRow) -> bool) -> CutRow {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            let row = self.read().await;
            if pred(&row) {
                return row;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "timed out after {secs} s waiting for {what}; last row {:?}",
            self.seen.last()
        );
    }
}

/// One reading of the clock with the reason it gives when uncertain.
async fn reading(clock: &SafeCutClock) -> (CutReading, Option<UncertainReason>) {
    let r = clock.read().await.expect("read the cut");
    let at = CutReading {
        cut: r.now,
        certain: r.uncertain.is_none(),
        retry_after_s: clock.retry_after_secs(),
    };
    (at, r.uncertain)
}

/// How long a test waits for the store's clock to read a fault the
/// sampler already detected as uncertain: the sampler publishes it at its
/// next write, which a loaded machine (a CI run beside the test) can delay
/// by seconds; the bound only ends a wait that would otherwise never end.
const UNCERTAIN_WAIT_S: u64 = 30;

/// Polls the clock every 20 ms until a reading is uncertain (at most
/// `secs` s); returns it with its reason.
async fn uncertain(clock: &SafeCutClock, secs: u64) -> (CutReading, UncertainReason) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if let (at, Some(why)) = reading(clock).await {
            return (at, why);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no uncertain reading within {secs} s");
}

struct Fixture {
    server: PgServer,
    db: Db,
    store: LcStore,
    clock: SafeCutClock,
    sampler: ThreadSampler,
    cuts: CutLog,
    provider: TestProvider,
    tenant: TenantId,
}

/// A dedicated PostgreSQL `major` server on a fake wall clock (offset 0),
/// a migrated database, the sampler, a certain cut, a store with
/// `config`, a registered provider, the runtime `base` and a tenant with
/// 4 units.
async fn fixture(major: u32, config: LcConfig) -> Fixture {
    let bins = binaries(major);
    let server = tokio::task::spawn_blocking(move || PgServer::start_dedicated_faketime_with(bins))
        .await
        .unwrap()
        .expect("start PostgreSQL on a fake clock");
    let db = fresh_db_on(&server.admin_url(), |n| server.url_for(n)).await;
    lc_pg::migrate(&db.url).await.expect("migrate");
    let sampler = ThreadSampler::start(&db.url);
    let store = store_on(&db, config).await;
    let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
    let at = wait_reading(&clock, 30, "a certain cut", |r| r.certain).await;
    let provider = TestProvider::new("p1", 7);
    provider.register(&store).await;
    store
        .register_runtime(
            &op("rt-base", "base"),
            at,
            "base",
            lc_core::Digest::of(b"base manifest"),
            serde_json::json!({"kind": "host-usr", "name": "base"}),
        )
        .await
        .unwrap();
    let tenant = store
        .create_tenant(&op("t", "t"), at, "steps", Some(4), &api_key_of)
        .await
        .unwrap()
        .tenant_id;
    let cuts = CutLog::new(&db.url).await;
    Fixture {
        server,
        db,
        store,
        clock,
        sampler,
        cuts,
        provider,
        tenant,
    }
}

fn req(shape: &str, argv: &[&str]) -> ExecRequest {
    ExecRequest {
        runtime: "base".into(),
        shape: shape.into(),
        command: argv.iter().map(|s| s.to_string()).collect(),
        timeout_ms: None,
        stdin_open: false,
        idle_ttl_ms: None,
        on_timeout: lc_core::OnTimeout::Terminate,
    }
}

/// The request admission refuses while uncertain, and admits afterwards
/// under the same key.
fn late_req() -> ExecRequest {
    req("small", &["echo", "late"])
}

const G1: Generation = Generation(1);

/// `(deposited, available, held, consumed)` of the tenant.
async fn balances(f: &Fixture) -> (i64, i64, i64, i64) {
    let t = f.store.tenant(f.tenant).await.unwrap();
    (t.deposited, t.available, t.held, t.consumed)
}

/// `(store's, Tollgate's)` expiry of the Reservation of `exec`.
async fn reservation_expiry(url: &str, exec: &ExecRecord) -> (Timestamp, Timestamp) {
    let mut c = PgConnection::connect(url).await.unwrap();
    let (a, b, c2, d): (i64, i32, i64, i32) = sqlx::query_as(
        "SELECT r.expiry_floor_us, r.expiry_submicro_ns, l.expiry_floor_us, l.expiry_submicro_ns::int \
           FROM lc_reservations r JOIN tollgate_leases l ON l.lease_id = r.tollgate_lease_id \
          WHERE r.exec_id = $1",
    )
    .bind(exec.exec_id.0)
    .fetch_one(&mut c)
    .await
    .unwrap();
    let t =
        |f: i64, s: i32| Timestamp::from_nanosecond(i128::from(f) * 1000 + i128::from(s)).unwrap();
    (t(a, b), t(c2, d))
}

/// The work planned for `lease` at `at`.
async fn action_of(f: &Fixture, lease: SandboxLeaseId, at: CutReading) -> LeaseAction {
    f.store
        .due_work(at, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|w| w.lease_id == lease)
        .expect("the lease is in the work list")
        .action
}

/// The two execs of a scenario: `running` (small, 1 unit, active, renewed
/// at the last certain reading before the fault) and `releasing` (medium,
/// 2 units, cancelled, release pending, its absence evidence signed).
struct Execs {
    running: ExecRecord,
    releasing: ExecRecord,
    evidence: serde_json::Value,
    /// `running`'s Lease expiry after its last renewal.
    expiry: Timestamp,
    /// `running`'s Reservation expiry after its last renewal.
    reservation: Timestamp,
    /// The gateway owner of `running` (taken over at the last certain
    /// reading with the shortest heartbeat TTL).
    owner: OwnerCredential,
    /// Its heartbeat expiry after its last renewal.
    heartbeat: Timestamp,
    approvals: approvals::Steps,
}

/// The shortest heartbeat TTL: the owner's expiry passes in database time
/// long before the fault ends.
const HEARTBEAT_TTL: SignedDuration = SignedDuration::from_secs(1);

async fn start_execs(f: &Fixture, lease_ttl: SignedDuration) -> Execs {
    let at = certain(&f.clock).await;
    let running = f
        .store
        .admit_exec(&op("a", "a"), at, f.tenant, &req("small", &["sleep", "60"]))
        .await
        .unwrap();
    let releasing = f
        .store
        .admit_exec(
            &op("b", "b"),
            at,
            f.tenant,
            &req("medium", &["sleep", "60"]),
        )
        .await
        .unwrap();
    for e in [&running, &releasing] {
        f.store
            .mark_active(e.canonical.lease_id, G1, at)
            .await
            .unwrap();
    }
    ControlStore::cancel(&f.store, &op("cb", "cb"), at, f.tenant, releasing.exec_id)
        .await
        .unwrap();
    let w = f
        .store
        .begin_release(
            releasing.canonical.lease_id,
            G1,
            TerminalReason::Cancelled,
            at,
        )
        .await
        .unwrap();
    assert_eq!(
        (w.state, w.action),
        (LeaseState::ReleasePending, LeaseAction::Destroy)
    );
    assert_eq!(balances(f).await, (4, 1, 3, 0));
    let pre = wait_reading(&f.clock, 10, "a later certain cut", |r| {
        r.certain && r.cut > at.cut
    })
    .await;
    let w = f
        .store
        .renew(running.canonical.lease_id, G1, pre)
        .await
        .unwrap();
    assert_eq!(w.expiry, pre.cut + lease_ttl);
    let reservation = pre.cut + RESERVATION_TTL;
    assert_eq!(
        reservation_expiry(&f.db.url, &running).await,
        (reservation, reservation)
    );
    let evidence = f.provider.absence(releasing.canonical.lease_id, 1);
    let token = OwnerToken::from_bytes([0x0c; 32]);
    let o = f
        .store
        .take_over(&token, f.tenant, running.exec_id, pre, HEARTBEAT_TTL)
        .await
        .unwrap();
    assert_eq!(
        (o.ownership.generation, o.ownership.heartbeat_expiry),
        (OwnerGeneration(1), pre.cut + HEARTBEAT_TTL)
    );
    Execs {
        running,
        releasing,
        evidence,
        expiry: w.expiry,
        reservation,
        owner: OwnerCredential {
            token,
            generation: o.ownership.generation,
            fence: o.ownership.fence,
        },
        heartbeat: o.ownership.heartbeat_expiry,
        approvals: approvals::before_fault(f, pre).await,
    }
}

/// What the store must do with `u`, a fresh uncertain reading: refuse
/// admission and the release, write nothing, keep the units held, expire
/// nothing, and renew to exactly `max(current, cut + ttl)`. Updates the
/// expiries in `x`.
async fn while_uncertain(f: &Fixture, x: &mut Execs, u: CutReading, lease_ttl: SignedDuration) {
    assert!(!u.certain);
    assert_eq!(u.retry_after_s, RETRY_AFTER_S);
    approvals::while_uncertain(f, &x.approvals, u).await;
    let refused = LcError::TimeUncertain {
        retry_after_s: RETRY_AFTER_S,
    };
    let (running, releasing) = (x.running.canonical.lease_id, x.releasing.canonical.lease_id);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .admit_exec(&op("late", "late"), u, f.tenant, &late_req())
            .await
            .unwrap_err(),
        refused
    );
    assert_eq!(
        f.store
            .commit_release(releasing, G1, &x.evidence, u)
            .await
            .unwrap_err(),
        refused
    );
    assert_eq!(
        f.store
            .begin_release(running, G1, TerminalReason::Expired, u)
            .await
            .unwrap_err(),
        refused
    );
    assert_eq!(action_of(f, running, u).await, LeaseAction::Maintain);
    assert_eq!(action_of(f, releasing, u).await, LeaseAction::Destroy);
    // No gateway claims or takes over anything, though database time is
    // past the owner's heartbeat expiry.
    let other = OwnerToken::from_bytes([0x0d; 32]);
    assert_eq!(
        f.store.claim(&other, u, HEARTBEAT_TTL, 10).await.unwrap(),
        vec![]
    );
    assert_eq!(
        f.store
            .take_over(&other, f.tenant, x.running.exec_id, u, HEARTBEAT_TTL)
            .await
            .unwrap_err(),
        refused
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // The owner keeps serving: its heartbeat renews, never shorter.
    let heartbeat = x.heartbeat.max(u.cut + HEARTBEAT_TTL);
    let h = f
        .store
        .heartbeat(&x.owner, x.running.exec_id, u, HEARTBEAT_TTL)
        .await
        .unwrap();
    assert_eq!(h.ownership.heartbeat_expiry, heartbeat);
    x.heartbeat = heartbeat;
    assert_eq!(balances(f).await, (4, 1, 3, 0));
    assert_eq!(
        f.store
            .exec(f.tenant, x.releasing.exec_id)
            .await
            .unwrap()
            .lease_state,
        Some(LeaseState::ReleasePending)
    );

    // Renewal on the uncertain cut: never shorter, to the nanosecond.
    let w = f.store.renew(running, G1, u).await.unwrap();
    let expiry = x.expiry.max(u.cut + lease_ttl);
    let reservation = x.reservation.max(u.cut + RESERVATION_TTL);
    assert_eq!((w.expiry, w.action), (expiry, LeaseAction::Maintain));
    assert_eq!(
        reservation_expiry(&f.db.url, &x.running).await,
        (reservation, reservation)
    );
    // An older reading shortens nothing: not by 30 s, not by 1 ns.
    let ns = SignedDuration::from_nanos(1);
    for older in [
        u.cut - SignedDuration::from_secs(30),
        expiry - lease_ttl - ns,
    ] {
        let older = CutReading::uncertain(older, RETRY_AFTER_S);
        assert_eq!(
            f.store.renew(running, G1, older).await.unwrap().expiry,
            expiry
        );
    }
    assert_eq!(
        reservation_expiry(&f.db.url, &x.running).await,
        (reservation, reservation)
    );
    x.expiry = expiry;
    x.reservation = reservation;
}

/// Once `c` is certain: the same commit returns the pending exec's 2 units
/// exactly once, and the refused admission goes through under its key.
async fn once_certain(f: &Fixture, x: &Execs, c: CutReading) {
    assert!(c.certain);
    let releasing = x.releasing.canonical.lease_id;
    let out = f
        .store
        .commit_release(releasing, G1, &x.evidence, c)
        .await
        .unwrap();
    assert_eq!(
        (
            out.units_returned,
            out.replay,
            out.released_cut,
            out.exec_id
        ),
        (2, false, c.cut, x.releasing.exec_id)
    );
    assert_eq!(balances(f).await, (4, 3, 1, 0));
    let after = snapshot(&f.db.url).await;
    let again = f
        .store
        .commit_release(releasing, G1, &x.evidence, c)
        .await
        .unwrap();
    assert_eq!(
        (again.units_returned, again.replay, again.released_cut),
        (2, true, c.cut)
    );
    assert_eq!(snapshot(&f.db.url).await, after);
    assert_eq!(balances(f).await, (4, 3, 1, 0));
    let done = f.store.exec(f.tenant, x.releasing.exec_id).await.unwrap();
    assert_eq!(
        (done.state, done.terminal_reason, done.lease_state),
        (
            ExecState::Terminal,
            Some(TerminalReason::Cancelled),
            Some(LeaseState::Released)
        )
    );
    let late = f
        .store
        .admit_exec(&op("late", "late"), c, f.tenant, &late_req())
        .await
        .unwrap();
    assert_eq!((late.units, late.admitted_cut), (1, c.cut));
    assert_eq!(balances(f).await, (4, 2, 2, 0));
    approvals::once_certain(f, &x.approvals, c).await;
}

async fn assert_audit_clean(store: &LcStore) {
    let audit = store.tollgate().audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
}

async fn finish(f: Fixture) {
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
    f.store.pool().close().await;
    drop(f.server);
}

/// The database clock jumps 120 s ahead, past the running exec's Lease
/// deadline in database time; the cut does not follow.
async fn forward_step(major: u32) {
    let ttl = SignedDuration::from_secs(60);
    let mut f = fixture(major, config()).await;
    let mut x = start_execs(&f, ttl).await;
    let rate = rate::start(&f, certain(&f.clock).await).await;
    let tk = tokens::start(&f.store, f.tenant, certain(&f.clock).await).await;
    let del = deletion::before_fault(&f, deletion::GRACE_FORWARD_STEP).await;
    let c0 = f.cuts.read().await;
    assert_eq!(c0.uncertain, None);
    let stepped_at = Instant::now();
    f.server.set_clock_offset_ns(120 * SECOND_NS).unwrap();
    f.cuts
        .until(10, "the forward step detected", |r| {
            r.uncertain == Some(UncertainReason::ClockStepForward)
        })
        .await;
    let (u, _) = uncertain(&f.clock, UNCERTAIN_WAIT_S).await;
    while_uncertain(&f, &mut x, u, ttl).await;
    rate.while_uncertain(&f, u).await;
    tokens::while_uncertain(&f.store, &f.db.url, &tk, u, RETRY_AFTER_S).await;
    claims::while_uncertain(&f, &x, u).await;
    deletion::while_uncertain(&mut f, &del, u, true).await;
    // Database time has passed the deadline; no certain cut has.
    let row = f.cuts.read().await;
    assert!(row.db_now >= x.expiry, "{} < {}", row.db_now, x.expiry);
    assert_eq!(
        action_of(&f, x.running.canonical.lease_id, u).await,
        LeaseAction::Maintain
    );

    assert!(x.approvals.db_passed());
    let c = wait_reading(&f.clock, 30, "a certain cut after the step", |r| r.certain).await;
    let c1 = f.cuts.read().await;
    assert!(c1.cut >= c0.cut && c.cut >= c0.cut);
    // The cut advanced no faster than monotonic time (300 ms margin for
    // the sampler's own round trips), so it is still short of the deadline
    // that database time passed: not expired, on a certain cut either.
    let trusted =
        SignedDuration::try_from(stepped_at.elapsed()).unwrap() + SignedDuration::from_millis(300);
    assert!(
        c1.cut.duration_since(c0.cut) <= trusted,
        "the cut advanced {} in {trusted}",
        c1.cut.duration_since(c0.cut)
    );
    assert!(c.cut < x.expiry);
    let running = x.running.canonical.lease_id;
    assert_eq!(action_of(&f, running, c).await, LeaseAction::Maintain);
    assert_eq!(
        f.store
            .begin_release(running, G1, TerminalReason::Expired, c)
            .await
            .unwrap_err()
            .code(),
        "illegal_transition"
    );
    rate.once_certain(&f, c).await;
    claims::once_certain(&f, &x, c).await;
    once_certain(&f, &x, c).await;
    tokens::once_certain(&f.store, &tk, c).await;
    deletion::once_certain(&f, del).await;
    finish(f).await;
}

/// The database clock steps 3 s back, behind the cut; the cut stands
/// rather than going back.
async fn backward_step(major: u32) {
    let ttl = SignedDuration::from_secs(60);
    let mut f = fixture(major, config()).await;
    let mut x = start_execs(&f, ttl).await;
    let rate = rate::start(&f, certain(&f.clock).await).await;
    let tk = tokens::start(&f.store, f.tenant, certain(&f.clock).await).await;
    let del = deletion::before_fault(&f, deletion::GRACE_REAL_TIME).await;
    let c0 = f.cuts.read().await;
    assert_eq!(c0.uncertain, None);
    f.server.set_clock_offset_ns(-3 * SECOND_NS).unwrap();
    let b = f
        .cuts
        .until(10, "the backward step detected", |r| {
            r.uncertain == Some(UncertainReason::ClockStepBackward)
        })
        .await;
    assert!(b.cut >= c0.cut);
    let (u, _) = uncertain(&f.clock, UNCERTAIN_WAIT_S).await;
    while_uncertain(&f, &mut x, u, ttl).await;
    rate.while_uncertain(&f, u).await;
    tokens::while_uncertain(&f.store, &f.db.url, &tk, u, RETRY_AFTER_S).await;
    claims::while_uncertain(&f, &x, u).await;
    deletion::while_uncertain(&mut f, &del, u, false).await;
    // Database time went behind the cut; the cut did not follow it.
    assert!(
        f.cuts.seen.iter().any(|r| r.db_now < r.cut),
        "no read saw database time behind the cut"
    );
    let c = wait_reading(&f.clock, 30, "a certain cut after the step", |r| r.certain).await;
    let c1 = f.cuts.read().await;
    assert!(c1.cut >= b.cut && c.cut >= c0.cut);
    rate.once_certain(&f, c).await;
    claims::once_certain(&f, &x, c).await;
    once_certain(&f, &x, c).await;
    tokens::once_certain(&f.store, &tk, c).await;
    deletion::once_certain(&f, del).await;
    finish(f).await;
}

/// The sampler stops between two steps, holding its leadership; readings
/// turn stale after the gap bound while database time runs past a 1 s
/// Lease deadline. After it resumes, that deadline expires only on a
/// certain cut.
async fn paused_sampler(major: u32) {
    let ttl = SignedDuration::from_secs(1);
    let mut f = fixture(
        major,
        LcConfig {
            lease_ttl: ttl,
            ..config()
        },
    )
    .await;
    let mut x = start_execs(&f, ttl).await;
    let rate = rate::start(&f, certain(&f.clock).await).await;
    let tk = tokens::start(&f.store, f.tenant, certain(&f.clock).await).await;
    let del = deletion::before_fault(&f, deletion::GRACE_REAL_TIME).await;
    let pause = f.sampler.pause();
    // A publish already sent when the pause began may still land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let frozen = f.cuts.read().await;
    let (u, why) = uncertain(&f.clock, 10).await;
    assert_eq!(why, UncertainReason::Stale);
    assert_eq!(u.cut, frozen.cut);
    while_uncertain(&f, &mut x, u, ttl).await;
    rate.while_uncertain(&f, u).await;
    tokens::while_uncertain(&f.store, &f.db.url, &tk, u, RETRY_AFTER_S).await;
    claims::while_uncertain(&f, &x, u).await;
    deletion::while_uncertain(&mut f, &del, u, true).await;
    let row = f.cuts.read().await;
    assert_eq!((row.cut, row.publish_seq), (frozen.cut, frozen.publish_seq));
    assert!(row.db_now >= x.expiry, "{} < {}", row.db_now, x.expiry);
    let running = x.running.canonical.lease_id;
    assert_eq!(action_of(&f, running, u).await, LeaseAction::Maintain);

    drop(pause);
    let c = wait_reading(&f.clock, 30, "a certain cut past the deadline", |r| {
        r.certain && r.cut >= x.expiry
    })
    .await;
    assert!(f.cuts.read().await.cut >= frozen.cut);
    rate.once_certain(&f, c).await;
    claims::once_certain(&f, &x, c).await;
    once_certain(&f, &x, c).await;
    tokens::once_certain(&f.store, &tk, c).await;
    deletion::once_certain(&f, del).await;
    // The deadline is expired now that a certain cut has passed it.
    assert_eq!(
        action_of(&f, running, c).await,
        LeaseAction::BeginRelease(TerminalReason::Expired)
    );
    f.store
        .begin_release(running, G1, TerminalReason::Expired, c)
        .await
        .unwrap();
    let out = f
        .store
        .commit_release(running, G1, &f.provider.absence(running, 1), c)
        .await
        .unwrap();
    assert_eq!((out.units_returned, out.replay), (1, false));
    let done = f.store.exec(f.tenant, x.running.exec_id).await.unwrap();
    assert_eq!(done.terminal_reason, Some(TerminalReason::Expired));
    assert_eq!(balances(&f).await, (4, 3, 1, 0));
    finish(f).await;
}

#[tokio::test]
async fn a_forward_clock_step_refuses_admission_and_release_and_expires_nothing_on_postgresql_15() {
    forward_step(15).await;
}

#[tokio::test]
async fn a_forward_clock_step_refuses_admission_and_release_and_expires_nothing_on_postgresql_18() {
    forward_step(18).await;
}

#[tokio::test]
async fn a_backward_clock_step_refuses_admission_and_release_and_the_cut_stands_on_postgresql_15() {
    backward_step(15).await;
}

#[tokio::test]
async fn a_backward_clock_step_refuses_admission_and_release_and_the_cut_stands_on_postgresql_18() {
    backward_step(18).await;
}

#[tokio::test]
async fn a_paused_sampler_refuses_admission_and_release_and_expires_nothing_on_postgresql_15() {
    paused_sampler(15).await;
}

#[tokio::test]
async fn a_paused_sampler_refuses_admission_and_release_and_expires_nothing_on_postgresql_18() {
    paused_sampler(18).await;
}
