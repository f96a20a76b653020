//! Hibernation and resume driven by the gateway itself, against the real
//! store, a real sampler, the real bubblewrap provider and the real
//! reconciler, each driven by its `step()`:
//!
//! * a sealed generation is stopped, its pages moved through the stopped
//!   page, quiesced and committed by its owner; the reconciler parks it and
//!   returns its unit once; a resume request makes the exec claimable, the
//!   owner prepares it, waits for the attachment, commits it, and serves
//!   the new generation, which reads the old one's files, modes and
//!   symlinks byte for byte and whose pages continue after the stopped
//!   page;
//! * twenty cycles on one exec, balances exact after each;
//! * sixteen concurrent requests of one resume: one receipt, one Lease,
//!   one Reservation;
//! * a gateway dying at each new crash point is finished by a successor;
//! * a corrupted blob: the resume is refused with the provider's code and
//!   the path and digest, the exec stays parked, a later resume works;
//! * a cancel while a hibernation is sealed ends the exec; a command that
//!   ends before the stop ends the exec and the hibernation is never acted
//!   on;
//! * a workspace the provider cannot snapshot (a fifo in it): the refusal
//!   is recorded once with its reason and path, the exec ends
//!   `snapshot_refused`, its unit returns once, nothing is retried.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lc_core::store::ControlStore as _;
use lc_core::{ExecState, Generation, HibernationStep, LeaseState, PageKind, TerminalReason};
use lc_gateway::{CrashPoint, FaultHook, Gateway, StepReport};
use lc_provider::Provider as _;
use support::{Exec, Rig, TTL};

#[derive(Default)]
struct Recorder(Mutex<Vec<CrashPoint>>);

impl FaultHook for Recorder {
    fn reached(&self, point: CrashPoint) {
        self.0.lock().unwrap().push(point);
    }
}

/// How long a test drives steps for one thing to happen.
const DRIVE_MAX: Duration = Duration::from_secs(60);

/// Generation 1 writes a workspace (a file, a 0640 file, a symlink) and
/// waits to be stopped; a resumed generation prints what it finds and
/// exits 3.
const RESUMABLE: &str = "if [ -e /workspace/gen1 ]; then \
    cat /workspace/a.txt; sha256sum /workspace/b.txt; stat -c %a /workspace/a.txt; \
    readlink /workspace/link; exit 3; fi; \
    printf 'hello\\n' > /workspace/a.txt; chmod 0640 /workspace/a.txt; \
    seq 1 20000 > /workspace/b.txt; ln -s a.txt /workspace/link; touch /workspace/gen1; \
    echo ready; exec sleep 1000";

/// Each generation counts itself in the workspace, says so and waits.
const CYCLER: &str = "n=$(cat /workspace/n 2>/dev/null || echo 0); n=$((n+1)); \
    echo $n > /workspace/n; echo gen $n; exec sleep 1000";

/// What a resumed [`RESUMABLE`] prints.
fn resumed_stdout() -> String {
    let b: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    format!(
        "hello\n{}  /workspace/b.txt\n640\na.txt\n",
        lc_core::Digest::of(b.as_bytes()).to_hex()
    )
}

/// The counts of several gateway steps.
#[derive(Debug, Default)]
struct Sum {
    claimed: usize,
    taken_over: usize,
    stops: usize,
    hibernated: usize,
    hibernations_refused: usize,
    resumes_prepared: usize,
    resumes_committed: usize,
    resumes_refused: usize,
    released: usize,
    dropped: usize,
    crashed: Option<CrashPoint>,
}

impl Sum {
    fn add(&mut self, r: &StepReport) {
        self.claimed += r.claimed;
        self.taken_over += r.taken_over;
        self.stops += r.stops;
        self.hibernated += r.hibernated;
        self.hibernations_refused += r.hibernations_refused;
        self.resumes_prepared += r.resumes_prepared;
        self.resumes_committed += r.resumes_committed;
        self.resumes_refused += r.resumes_refused;
        self.released += r.released;
        self.dropped += r.dropped;
        self.crashed = self.crashed.or(r.crashed);
    }
}

/// Steps `g` until `done` holds for the sum of its reports (bounded by
/// [`DRIVE_MAX`]); every step must succeed.
async fn drive(g: &Gateway, done: impl Fn(&Sum) -> bool) -> Sum {
    let mut sum = Sum::default();
    let deadline = Instant::now() + DRIVE_MAX;
    while !done(&sum) {
        assert!(
            Instant::now() < deadline,
            "not done within {DRIVE_MAX:?}: {sum:?}"
        );
        let r = g.step().await;
        assert_eq!(r.failures, vec![], "{sum:?}");
        sum.add(&r);
        if !done(&sum) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    sum
}

/// The stdout of the exec's acked pages with seq above `after`.
async fn stdout_after(f: &Rig, e: Exec, after: i64) -> String {
    let bytes: Vec<u8> = f
        .pages(e.id)
        .await
        .into_iter()
        .filter(|(seq, kind, _)| *seq > after && *kind == PageKind::Stdout)
        .flat_map(|(_, _, b)| b)
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// Steps `g` until the exec's acked stdout ends with `tail`.
async fn drive_until_stdout(f: &Rig, g: &Gateway, e: Exec, tail: &str) {
    let deadline = Instant::now() + DRIVE_MAX;
    while !stdout_after(f, e, 0).await.ends_with(tail) {
        assert!(
            Instant::now() < deadline,
            "no {tail:?} within {DRIVE_MAX:?}"
        );
        let r = g.step().await;
        assert_eq!(r.failures, vec![]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Seals a hibernation under `key`, lets `g` stop, move, quiesce and
/// commit it, and the reconciler park it (its unit returned once).
/// Returns the stopped page's seq.
async fn park(f: &Rig, g: &Gateway, e: Exec, key: &str) -> i64 {
    let before = f.balances().await;
    let hib = f.hibernate(e.id, key).await;
    assert_eq!(hib.step, HibernationStep::Sealed);
    let sum = drive(g, |s| s.hibernated == 1).await;
    assert_eq!((sum.stops, sum.hibernated, sum.released), (1, 1, 0));
    let pages = f.pages(e.id).await;
    let (stopped_seq, kind, _) = pages.last().cloned().unwrap();
    assert_eq!(kind, PageKind::Stopped);
    // The commit released the ownership: the gateway forgot the exec.
    assert_eq!(g.owned().await, vec![]);
    assert_eq!(
        f.balances().await,
        before,
        "held until the destroy is proven"
    );
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.destroyed, r.parked, r.released, r.units_returned),
        (1, 1, 0, 1)
    );
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.lease_state),
        (ExecState::Hibernated, None, Some(LeaseState::Released))
    );
    stopped_seq
}

/// Records a resume under `key` (naming no head: the workspace's) and
/// drives it: `g` claims the parked exec
/// and prepares it, the reconciler allocates and attaches, `g` commits, the
/// reconciler marks the Lease active. Returns the new generation's Lease.
async fn resume(f: &Rig, g: &Gateway, e: Exec, key: &str, from: Generation) -> Exec {
    let intent = f.resume_headless(e.id, key).await.expect("resume request");
    assert_eq!(
        (intent.exec_id, intent.from_generation, intent.head),
        (e.id, from, f.head(e.id).await)
    );
    // One resume at a time: a request under another key is refused while
    // this one is pending, naming it, and records nothing.
    let other = format!("{key}-other");
    let in_progress = |r: Result<lc_core::ResumeIntent, lc_core::LcError>| match r {
        Err(lc_core::LcError::ResumeInProgress { exec_id, op_key }) => {
            assert_eq!((exec_id, op_key.as_str()), (e.id, key));
        }
        other => panic!("{other:?}"),
    };
    in_progress(f.resume(e.id, &other).await);
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.claimed + r.taken_over, r.resumes_prepared), (1, 1));
    in_progress(f.resume(e.id, &other).await);
    let w = f.lease(e.id).await.unwrap();
    assert_eq!(
        (w.generation, w.state, w.attached, w.attempt_parked),
        (Generation(from.0 + 1), LeaseState::Allocating, false, true)
    );
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.attached, r.awaiting_resume, r.allocated), (1, 1, 0));
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.resumes_committed, r.owned), (1, 1));
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.allocated, r.attached, r.awaiting_resume), (1, 0, 0));
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.lease_state),
        (ExecState::Running, Some(LeaseState::Active))
    );
    assert_eq!(
        f.resume(e.id, &other).await.unwrap_err().code(),
        "exec_not_parked"
    );
    assert_eq!(
        rows(
            f,
            e,
            "lc_resume_intents",
            &format!("AND op_key = '{other}'")
        )
        .await,
        0
    );
    Exec {
        id: e.id,
        lease: w.lease_id,
        generation: w.generation,
    }
}

/// Drives the exited exec to its release by `g` and the reconciler's
/// destroy; its unit returns once.
async fn finish(f: &Rig, g: &Gateway, e: Exec) {
    let sum = drive(g, |s| s.released == 1).await;
    assert_eq!(sum.released, 1);
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.destroyed, r.released, r.parked, r.units_returned),
        (1, 1, 0, 1)
    );
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(3))
    );
}

/// `SELECT count(*)` of the exec's rows of `table`, `where_` added.
async fn rows(f: &Rig, e: Exec, table: &str, where_: &str) -> i64 {
    f.count(
        e.id,
        &format!("SELECT count(*) FROM {table} WHERE exec_id = $1 {where_}"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_582_first_resume_after_pause_finds_the_exec() {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let g = f.default_gateway();
    drive_until_stdout(&f, &g, e, "ready\n").await;
    let stopped_seq = park(&f, &g, e, "h-1").await;
    assert_eq!(f.balances().await, (4, 4, 0, 0));

    // The first resume right after the pause finds the parked exec.
    let e2 = resume(&f, &g, e, "r-1", Generation(1)).await;
    assert_eq!(e2.generation, Generation(2));
    assert_eq!(f.balances().await, (4, 3, 1, 0));
    finish(&f, &g, e2).await;

    // Generation 2 read generation 1's files, modes and symlink byte for
    // byte, and its pages continue after the stopped page.
    assert_eq!(stdout_after(&f, e, stopped_seq).await, resumed_stdout());
    let pages = f.pages(e.id).await;
    let n = pages.len() as i64;
    assert_eq!(
        pages.iter().map(|p| p.0).collect::<Vec<_>>(),
        (1..=n).collect::<Vec<_>>(),
        "one seq line across generations"
    );
    assert_eq!(pages[stopped_seq as usize - 1].1, PageKind::Stopped);
    assert_eq!(pages.last().unwrap().1, PageKind::Terminal);
    let m = g.metrics().snapshot();
    assert_eq!(
        (
            m.hibernated,
            m.resumes_prepared,
            m.resumes_committed,
            m.resumes_refused
        ),
        (1, 1, 1, 0)
    );
    assert!(
        g.metrics()
            .render()
            .lines()
            .any(|l| l == "lc_gateway_resumes_committed_total 1")
    );
    assert_eq!(f.balances().await, (4, 4, 0, 0));
    assert_eq!(f.provider.inventory().await.unwrap(), vec![]);
}

/// A measurement the store refuses does not stop the hibernation: the
/// gateway commits the quiescence without it, and the milestone records
/// no observation (unknown, never zero or clean), so re-execution from it
/// is ineligible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_measurement_leaves_the_milestone_unobserved() {
    use lc_core::observation::{Eligibility, IneligibleReason, reexecution_eligibility};
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let g = f.gateway_on(
        Arc::new(support::Forging {
            real: f.provider.clone(),
            page: false,
            measurement: true,
        }),
        lc_gateway::GatewayOptions {
            heartbeat_ttl: TTL,
            ..lc_gateway::GatewayOptions::default()
        },
    );
    drive_until_stdout(&f, &g, e, "ready\n").await;
    park(&f, &g, e, "h-1").await;
    assert_eq!(f.balances().await, (4, 4, 0, 0));
    let milestones = f.store.milestones(f.tenant, e.id, 0, 100).await.unwrap();
    assert_eq!(
        milestones
            .iter()
            .map(|m| (m.seq, m.generation, m.milestone.clone()))
            .collect::<Vec<_>>(),
        vec![(
            1,
            Generation(1),
            lc_core::observation::Milestone {
                head: f.head(e.id).await.to_hex(),
                cost: None,
                externality: None,
            }
        )]
    );
    assert_eq!(
        reexecution_eligibility(Some(&milestones[0].milestone)),
        Eligibility::Ineligible(IneligibleReason::ExternalityUnobserved)
    );
    // The instance itself was measurable: the reconciler measured it
    // before the destroy, and the exec shows that; the milestone keeps
    // what the gateway could record at the quiescence, which was nothing.
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        rec.observation.map(|o| o.externality),
        Some(lc_core::observation::ExternalityObservation::no_network_path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_736_second_resume_succeeds_like_the_first() {
    // Twenty hibernate/resume cycles on one exec: each resume like the
    // first, the balances exact after each step of each cycle.
    const CYCLES: i64 = 20;
    let f = Rig::start().await;
    let mut e = f.run(&["sh", "-c", CYCLER]).await;
    let g = f.default_gateway();
    let mut stopped = Vec::new();
    for k in 1..=CYCLES {
        drive_until_stdout(&f, &g, e, &format!("gen {k}\n")).await;
        assert_eq!(f.balances().await, (4, 3, 1, 0), "cycle {k} running");
        let head_before = if k > 1 {
            Some(f.head(e.id).await)
        } else {
            None
        };
        stopped.push(park(&f, &g, e, &format!("h-{k}")).await);
        assert_eq!(f.balances().await, (4, 4, 0, 0), "cycle {k} parked");
        // The previous cycle's request, replayed as sent (no head), is the
        // recorded one, on the head it resumed, though the head moved.
        if let Some(old_head) = head_before {
            let replay = f
                .resume_headless(e.id, &format!("r-{}", k - 1))
                .await
                .unwrap();
            assert_eq!(
                (replay.op_key, replay.from_generation, replay.head),
                (format!("r-{}", k - 1), Generation(k - 1), old_head)
            );
            assert_ne!(f.head(e.id).await, old_head);
        }
        if k < CYCLES {
            e = resume(&f, &g, e, &format!("r-{k}"), e.generation).await;
            assert_eq!(e.generation, Generation(k + 1));
        }
    }
    let want: String = (1..=CYCLES).map(|k| format!("gen {k}\n")).collect();
    assert_eq!(stdout_after(&f, e, 0).await, want);
    let pages = f.pages(e.id).await;
    assert_eq!(
        pages
            .iter()
            .filter(|p| p.1 == PageKind::Stopped)
            .map(|p| p.0)
            .collect::<Vec<_>>(),
        stopped
    );
    let n = pages.len() as i64;
    assert_eq!(
        pages.iter().map(|p| p.0).collect::<Vec<_>>(),
        (1..=n).collect::<Vec<_>>()
    );
    assert_eq!(rows(&f, e, "lc_resume_receipts", "").await, CYCLES - 1);
    assert_eq!(
        f.store.workspace(f.tenant, e.id).await.unwrap().snapshots,
        CYCLES
    );
    assert_eq!(rows(&f, e, "lc_reservations", "").await, CYCLES);
    assert_eq!(
        rows(&f, e, "lc_sandbox_leases", "AND state <> 'released'").await,
        0
    );
    // One milestone per cycle, at that cycle's snapshot, measured by the
    // gateway through the real provider: the cost so far is each
    // generation's measured CPU time summed and the largest peak, and with
    // no network path no side effect (eligible).
    let measured: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT l.generation, m.cpu_time_ms, m.peak_memory_bytes \
           FROM lc_sandbox_leases l JOIN lc_measurements m USING (lease_id) \
          WHERE l.exec_id = $1 ORDER BY l.generation",
    )
    .bind(e.id.0)
    .fetch_all(f.store.pool())
    .await
    .unwrap();
    assert_eq!(
        measured.iter().map(|m| m.0).collect::<Vec<_>>(),
        (1..=CYCLES).collect::<Vec<_>>(),
        "every generation measured"
    );
    let snapshots = f.store.snapshots(f.tenant, e.id, 0, 100).await.unwrap();
    let milestones = f.store.milestones(f.tenant, e.id, 0, 100).await.unwrap();
    let mut want = Vec::new();
    let (mut cpu, mut peak) = (0u64, 0u64);
    for (k, (g, c, p)) in measured.iter().enumerate() {
        cpu += u64::try_from(*c).unwrap();
        peak = peak.max(u64::try_from(*p).unwrap());
        want.push((
            u32::try_from(k + 1).unwrap(),
            *g,
            snapshots[k].digest.to_hex(),
            Some(lc_core::observation::CostObservation {
                cpu_time_ms: cpu,
                peak_memory_bytes: peak,
            }),
            Some(lc_core::observation::ExternalityObservation::no_network_path()),
        ));
    }
    assert_eq!(
        milestones
            .iter()
            .map(|m| (
                m.seq,
                m.generation.0,
                m.milestone.head.clone(),
                m.milestone.cost,
                m.milestone.externality
            ))
            .collect::<Vec<_>>(),
        want
    );
    assert!(peak > 0, "a running shell has a peak: {peak}");
    // A cancel ends the parked exec at once.
    f.cancel(e).await;
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason),
        (ExecState::Terminal, Some(TerminalReason::Cancelled))
    );
    assert_eq!(f.balances().await, (4, 4, 0, 0));
    assert_eq!(f.provider.inventory().await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_resume_requests_make_one_receipt_one_lease_one_reservation() {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let g = f.default_gateway();
    drive_until_stdout(&f, &g, e, "ready\n").await;
    park(&f, &g, e, "h-1").await;
    let requests = (0..16).map(|_| f.resume_headless(e.id, "r-1"));
    let intents = futures_util::future::join_all(requests).await;
    let first = intents[0].clone().expect("resume request");
    for i in &intents {
        assert_eq!(i.as_ref(), Ok(&first));
    }
    let e2 = resume(&f, &g, e, "r-1", Generation(1)).await;
    assert_eq!(rows(&f, e, "lc_resume_intents", "").await, 1);
    assert_eq!(rows(&f, e, "lc_resume_receipts", "").await, 1);
    assert_eq!(
        rows(&f, e, "lc_sandbox_leases", "AND generation = 2").await,
        1
    );
    assert_eq!(
        rows(&f, e, "lc_reservations", "AND generation = 2").await,
        1
    );
    assert_eq!(f.balances().await, (4, 3, 1, 0));
    finish(&f, &g, e2).await;
    assert_eq!(rows(&f, e, "lc_resume_receipts", "").await, 1);
    assert_eq!(f.balances().await, (4, 4, 0, 0));
}

/// A gateway dies at `point`; once a certain cut passes its heartbeat
/// expiry a successor finishes: a hibernation point ends parked with no
/// live Lease and the unit returned once, a resume point running with
/// exactly one live Lease.
async fn crash_and_finish(point: CrashPoint) {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let hook = Arc::new(Recorder::default());
    let a = f
        .default_gateway()
        .with_crash_point(Some(point), hook.clone());
    drive_until_stdout(&f, &a, e, "ready\n").await;
    let resuming = matches!(
        point,
        CrashPoint::AfterPrepareResume | CrashPoint::BeforeCommitResume
    );
    if resuming {
        park(&f, &a, e, "h-1").await;
        f.resume(e.id, "r-1").await.expect("resume request");
    } else {
        f.hibernate(e.id, "h-1").await;
    }
    // Step the first gateway (and the reconciler, for the attachment)
    // until it dies at the point.
    let deadline = Instant::now() + DRIVE_MAX;
    let last = loop {
        assert!(Instant::now() < deadline, "{point} not reached");
        let r = a.step().await;
        if r.crashed.is_some() {
            assert_eq!(r.crashed, Some(point));
            break r.at.unwrap();
        }
        assert_eq!(r.failures, vec![], "{point}");
        if resuming {
            f.rec_step().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(*hook.0.lock().unwrap(), vec![point]);
    f.certain_at(last.cut + TTL).await;

    let b = f.default_gateway();
    if resuming {
        let deadline = Instant::now() + DRIVE_MAX;
        let mut sum = Sum::default();
        while sum.resumes_committed == 0 {
            assert!(Instant::now() < deadline, "{point}: {sum:?}");
            let r = b.step().await;
            assert_eq!(r.failures, vec![], "{point}");
            sum.add(&r);
            let r = f.rec_step().await;
            assert_eq!(r.failures, vec![], "{point}");
        }
        // The successor committed what the first prepared: no second
        // prepare, one receipt.
        assert_eq!(
            (sum.taken_over, sum.resumes_prepared, sum.resumes_committed),
            (1, 0, 1),
            "{point}"
        );
        let r = f.rec_step().await;
        assert_eq!(r.failures, vec![], "{point}");
        assert_eq!(
            rows(&f, e, "lc_sandbox_leases", "AND state <> 'released'").await,
            1,
            "{point}"
        );
        assert_eq!(rows(&f, e, "lc_resume_receipts", "").await, 1, "{point}");
        assert_eq!(f.balances().await, (4, 3, 1, 0), "{point}");
        let w = f.lease(e.id).await.unwrap();
        assert_eq!(
            (w.generation, w.state),
            (Generation(2), LeaseState::Active),
            "{point}"
        );
        let e2 = Exec {
            id: e.id,
            lease: w.lease_id,
            generation: w.generation,
        };
        finish(&f, &b, e2).await;
        let stopped = f
            .pages(e.id)
            .await
            .iter()
            .find(|p| p.1 == PageKind::Stopped)
            .unwrap()
            .0;
        assert_eq!(
            stdout_after(&f, e, stopped).await,
            resumed_stdout(),
            "{point}"
        );
    } else {
        let sum = drive(&b, |s| s.hibernated == 1).await;
        // The stop was the first gateway's: the successor's stop finds it
        // stopped (or its supervisor finished).
        assert_eq!(
            (sum.taken_over, sum.stops, sum.hibernated),
            (1, 0, 1),
            "{point}"
        );
        let r = f.rec_step().await;
        assert_eq!(r.failures, vec![], "{point}");
        assert_eq!(
            (r.destroyed, r.parked, r.units_returned),
            (1, 1, 1),
            "{point}"
        );
        assert_eq!(
            rows(&f, e, "lc_sandbox_leases", "AND state <> 'released'").await,
            0,
            "{point}"
        );
        assert_eq!(
            f.store.workspace(f.tenant, e.id).await.unwrap().snapshots,
            1,
            "{point}"
        );
        assert_eq!(
            rows(&f, e, "lc_output_pages", "AND kind = 'stopped'").await,
            1,
            "{point}"
        );
        let rec = f.store.exec(f.tenant, e.id).await.unwrap();
        assert_eq!(rec.state, ExecState::Hibernated, "{point}");
    }
    assert_eq!(f.balances().await, (4, 4, 0, 0), "{point}");
    // The first gateway, stepped again, is refused and forgets the exec.
    let r = a.step().await;
    assert_eq!((r.owned, r.crashed), (0, None), "{point}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_stop_is_finished_by_a_successor() {
    crash_and_finish(CrashPoint::AfterStop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_stopped_ack_is_finished_by_a_successor() {
    crash_and_finish(CrashPoint::AfterStoppedAck).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_quiesce_is_finished_by_a_successor() {
    crash_and_finish(CrashPoint::AfterQuiesce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_prepare_is_finished_by_a_successor() {
    crash_and_finish(CrashPoint::AfterPrepareResume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_resume_commit_is_finished_by_a_successor() {
    crash_and_finish(CrashPoint::BeforeCommitResume).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_884_resume_restores_every_file_or_none() {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let g = f.default_gateway();
    drive_until_stdout(&f, &g, e, "ready\n").await;
    let stopped_seq = park(&f, &g, e, "h-1").await;
    let head = f.head(e.id).await;

    // b.txt's blob in the provider's blob store no longer has its bytes.
    let manifest = lc_core::snapshot::Manifest::from_canonical(
        &f.store
            .snapshot_manifest(f.tenant, e.id, head)
            .await
            .unwrap(),
    )
    .unwrap();
    let Some(lc_core::snapshot::Entry {
        kind: lc_core::snapshot::EntryKind::File { sha256, .. },
        ..
    }) = manifest.entry("b.txt")
    else {
        panic!("b.txt is a file of the snapshot: {manifest:?}");
    };
    let blob = f.provider.blobs().path_of(sha256);
    let original = std::fs::read(&blob).unwrap();
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, b"not the bytes of b.txt").unwrap();

    // The resume is prepared, the restore refused: no instance starts.
    f.resume(e.id, "r-1").await.expect("resume request");
    let r = g.step().await;
    assert_eq!(
        (r.taken_over, r.resumes_prepared, r.failures),
        (1, 1, vec![])
    );
    assert_eq!(f.balances().await, (4, 3, 1, 0));
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.start_failed, r.restore_failed, r.allocated, r.attached),
        (1, 1, 0, 0)
    );
    let want = format!(
        "restore failed (blob_corrupt) at \"b.txt\" blob {}: ",
        sha256.to_hex()
    );
    let intents = f.intents(e.id).await;
    assert_eq!(intents.len(), 1);
    let (key, code, message) = &intents[0];
    assert_eq!(
        (key.as_str(), code.as_deref()),
        ("r-1", Some("restore_failed"))
    );
    let message = message.as_deref().unwrap();
    assert!(message.starts_with(&want), "{message}");
    assert_eq!(message, r.start_refusals[0].message);
    // The request, replayed, shows the refusal.
    let replay = f.resume(e.id, "r-1").await.unwrap();
    assert_eq!(
        replay.refused,
        Some(lc_core::hibernate::ResumeRefusal {
            code: "restore_failed".into(),
            message: message.to_owned(),
        })
    );
    // The gateway sees the refusal and leaves the exec parked; it never
    // prepares that request again.
    let r = g.step().await;
    assert_eq!(
        (r.resumes_refused, r.resumes_prepared, r.owned, r.failures),
        (1, 0, 0, vec![])
    );
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.destroyed, r.parked, r.released, r.units_returned),
        (1, 1, 0, 1)
    );
    assert_eq!(f.balances().await, (4, 4, 0, 0));
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason),
        (ExecState::Hibernated, None)
    );
    for _ in 0..2 {
        let r = g.step().await;
        assert_eq!((r.claimed, r.taken_over, r.resumes_prepared), (0, 0, 0));
        let r = f.rec_step().await;
        assert_eq!((r.leases_seen, r.start_failed, r.units_returned), (0, 0, 0));
    }
    assert_eq!(f.provider.inventory().await.unwrap(), vec![]);
    assert_eq!(rows(&f, e, "lc_resume_receipts", "").await, 0);

    // Repaired, a new request resumes on every file.
    std::fs::remove_file(&blob).unwrap();
    std::fs::write(&blob, &original).unwrap();
    let at = f.wait_reading(|r| r.certain).await;
    // The gateway's ownership of the refused resume lapses first.
    f.certain_at(at.cut + TTL).await;
    let e3 = resume(&f, &g, e, "r-2", Generation(2)).await;
    assert_eq!(e3.generation, Generation(3));
    finish(&f, &g, e3).await;
    assert_eq!(stdout_after(&f, e, stopped_seq).await, resumed_stdout());
    assert_eq!(f.balances().await, (4, 4, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_1031_after_resume_the_exec_reports_the_new_generation_command_only() {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let g = f.default_gateway();
    drive_until_stdout(&f, &g, e, "ready\n").await;
    let stopped_seq = park(&f, &g, e, "h-1").await;
    let before: Vec<_> = f.pages(e.id).await;
    let e2 = resume(&f, &g, e, "r-1", Generation(1)).await;
    // Exactly the new generation's instance runs; the old one is gone.
    let inventory = f.provider.inventory().await.unwrap();
    assert_eq!(
        inventory
            .iter()
            .map(|i| (i.exec_id, i.lease_id, i.generation))
            .collect::<Vec<_>>(),
        vec![(e.id, e2.lease, Generation(2))]
    );
    assert_ne!(e2.lease, e.lease);
    let w = f.lease(e.id).await.unwrap();
    assert_eq!(
        (w.lease_id, w.generation, w.first_seq),
        (e2.lease, Generation(2), stopped_seq + 1)
    );
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(rec.command, vec!["sh", "-c", RESUMABLE]);
    finish(&f, &g, e2).await;
    // The old generation's pages are never moved again: the pages through
    // the stopped page are exactly those of before the resume, and
    // everything after it is the new generation's output only.
    let after = f.pages(e.id).await;
    assert_eq!(&after[..before.len()], &before[..]);
    assert_eq!(stdout_after(&f, e, stopped_seq).await, resumed_stdout());
    assert!(!stdout_after(&f, e, stopped_seq).await.contains("ready"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_a_hibernation_is_sealed_ends_the_exec() {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let g = f.default_gateway();
    drive_until_stdout(&f, &g, e, "ready\n").await;
    f.hibernate(e.id, "h-1").await;
    f.cancel(e).await;
    let sum = drive(&g, |s| s.released == 1).await;
    assert_eq!((sum.stops, sum.hibernated, sum.released), (0, 0, 1));
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.destroyed, r.released, r.units_returned), (1, 1, 1));
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason),
        (ExecState::Terminal, Some(TerminalReason::Cancelled))
    );
    // The sealed hibernation is never acted on and no longer listed.
    assert_eq!(r.hibernations_unfinished, 0);
    assert_eq!(
        f.store.workspace(f.tenant, e.id).await.unwrap().snapshots,
        0
    );
    assert_eq!(
        f.resume(e.id, "r-1").await.unwrap_err().code(),
        "exec_terminal"
    );
    assert_eq!(f.balances().await, (4, 4, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ends_before_the_stop_ends_the_exec() {
    let f = Rig::start().await;
    // The command exits at once; the hibernation is sealed before the
    // gateway moved any page, so its stop finds the command ended.
    let e = f.run(&["sh", "-c", "echo bye; exit 3"]).await;
    f.spool_when(e, |s| s.command_exited && s.terminal_seq > 0)
        .await;
    let hib = f.hibernate(e.id, "h-1").await;
    assert_eq!(hib.step, HibernationStep::Sealed);
    let g = f.default_gateway();
    let sum = drive(&g, |s| s.released == 1).await;
    assert_eq!((sum.stops, sum.hibernated, sum.released), (0, 0, 1));
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.destroyed, r.released, r.units_returned), (1, 1, 1));
    assert_eq!(r.hibernations_unfinished, 0);
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason, rec.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(3))
    );
    assert_eq!(stdout_after(&f, e, 0).await, "bye\n");
    assert_eq!(
        f.resume(e.id, "r-1").await.unwrap_err().code(),
        "exec_terminal"
    );
    assert_eq!(f.balances().await, (4, 4, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_after_the_stop_ends_the_exec_once_it_parks() {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", RESUMABLE]).await;
    let hook = Arc::new(Recorder::default());
    let a = f
        .default_gateway()
        .with_crash_point(Some(CrashPoint::AfterStop), hook.clone());
    drive_until_stdout(&f, &a, e, "ready\n").await;
    f.hibernate(e.id, "h-1").await;
    let r = a.step().await;
    assert_eq!((r.crashed, r.stops), (Some(CrashPoint::AfterStop), 1));
    // The command is stopped; the cancel comes too late to kill it.
    f.cancel(e).await;
    f.certain_at(r.at.unwrap().cut + TTL).await;
    let b = f.default_gateway();
    let sum = drive(&b, |s| s.hibernated == 1).await;
    assert_eq!((sum.taken_over, sum.hibernated, sum.released), (1, 1, 0));
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.destroyed, r.units_returned), (1, 1));
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (rec.state, rec.terminal_reason),
        (ExecState::Terminal, Some(TerminalReason::Cancelled))
    );
    assert_eq!(
        f.resume(e.id, "r-1").await.unwrap_err().code(),
        "exec_terminal"
    );
    assert_eq!(f.balances().await, (4, 4, 0, 0));
    assert_eq!(f.provider.inventory().await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_with_a_fifo_ends_the_exec_snapshot_refused_and_its_unit_returns_once() {
    let f = Rig::start().await;
    let e = f
        .run(&[
            "sh",
            "-c",
            "printf kept > /workspace/a.txt; mkfifo /workspace/pipe; echo ready; exec sleep 1000",
        ])
        .await;
    let g = f.default_gateway();
    drive_until_stdout(&f, &g, e, "ready\n").await;
    assert_eq!(f.balances().await, (4, 3, 1, 0));
    let hib = f.hibernate(e.id, "h-1").await;
    assert_eq!(hib.step, HibernationStep::Sealed);
    let sum = drive(&g, |s| s.hibernations_refused == 1).await;
    assert_eq!(
        (
            sum.stops,
            sum.hibernated,
            sum.hibernations_refused,
            sum.released
        ),
        (1, 0, 1, 0)
    );
    // The refusal released the ownership: the gateway forgot the exec,
    // and no later step claims it or quiesces again.
    assert_eq!(g.owned().await, vec![]);
    for _ in 0..3 {
        let r = g.step().await;
        assert_eq!(r.failures, vec![]);
        assert_eq!(
            (r.owned, r.claimed, r.taken_over, r.hibernations_refused),
            (0, 0, 0, 0)
        );
    }
    assert_eq!(
        f.balances().await,
        (4, 3, 1, 0),
        "held until the destroy is proven"
    );
    let (_, kind, _) = f.pages(e.id).await.last().cloned().unwrap();
    assert_eq!(kind, PageKind::Stopped);
    let r = f.rec_step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (r.destroyed, r.released, r.parked, r.units_returned),
        (1, 1, 0, 1)
    );
    let rec = f.store.exec(f.tenant, e.id).await.unwrap();
    assert_eq!(
        (
            rec.state,
            rec.terminal_reason,
            rec.exit_code,
            rec.lease_state
        ),
        (
            ExecState::Terminal,
            Some(TerminalReason::SnapshotRefused),
            None,
            Some(LeaseState::Released)
        )
    );
    let hib = rec.hibernation.expect("the hibernation");
    assert_eq!((hib.step, hib.head), (HibernationStep::Refused, None));
    assert_eq!(
        hib.refusal,
        Some(lc_core::hibernate::QuiescenceRefusal {
            reason: "special_file".into(),
            path: "pipe".into(),
            message: "\"pipe\" is a device, fifo or socket; a snapshot holds only directories, \
                      regular files and symlinks: remove it and snapshot again"
                .into(),
        })
    );
    assert_eq!(r.hibernations_unfinished, 0);
    let ws = f.store.workspace(f.tenant, e.id).await.unwrap();
    assert_eq!((ws.head, ws.snapshots), (None, 0));
    assert_eq!(
        f.resume(e.id, "r-1").await.unwrap_err().code(),
        "exec_terminal"
    );
    // Nothing more to return: the reconciler's next step finds nothing.
    let r = f.rec_step().await;
    assert_eq!((r.destroyed, r.released, r.units_returned), (0, 0, 0));
    assert_eq!(f.balances().await, (4, 4, 0, 0));
    assert_eq!(f.provider.inventory().await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_the_tenant_has_no_units_for_is_refused_until_they_return() {
    let f = Rig::start_with_units(2).await;
    let e = f.run(&["sh", "-c", CYCLER]).await;
    let g = f.default_gateway();
    drive_until_stdout(&f, &g, e, "gen 1\n").await;
    park(&f, &g, e, "h-1").await;
    // Two other execs take both units.
    let others = [
        f.run_keyed("e-2", &["sh", "-c", "exec sleep 1000"], false)
            .await,
        f.run_keyed("e-3", &["sh", "-c", "exec sleep 1000"], false)
            .await,
    ];
    assert_eq!(f.balances().await, (2, 0, 2, 0));
    assert_eq!(
        f.resume_headless(e.id, "r-1").await.unwrap_err(),
        lc_core::LcError::InsufficientCapacity {
            requested: 1,
            available: 0
        }
    );
    assert_eq!(rows(&f, e, "lc_resume_intents", "").await, 0);
    // Once a unit returns, the same request is taken and carried out.
    f.cancel(others[0]).await;
    let sum = drive(&g, |s| s.released == 1).await;
    assert_eq!(sum.released, 1);
    let r = f.rec_step().await;
    assert_eq!((r.destroyed, r.units_returned), (1, 1));
    assert_eq!(f.balances().await, (2, 1, 1, 0));
    let intent = f.resume_headless(e.id, "r-1").await.unwrap();
    assert_eq!(intent.from_generation, Generation(1));
    let deadline = Instant::now() + DRIVE_MAX;
    while !stdout_after(&f, e, 0).await.ends_with("gen 2\n") {
        assert!(
            Instant::now() < deadline,
            "not resumed within {DRIVE_MAX:?}"
        );
        let r = g.step().await;
        assert_eq!(r.failures, vec![]);
        let r = f.rec_step().await;
        assert_eq!(r.failures, vec![]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rows(&f, e, "lc_resume_receipts", "").await, 1);
    assert_eq!(f.balances().await, (2, 0, 2, 0));
}
