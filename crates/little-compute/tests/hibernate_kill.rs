//! kill -9 of every process at the steps of hibernation and resume, on
//! real processes: a real PostgreSQL, the in-process sampler, a real
//! `little-compute provider` (bubblewrap instances), a real `little-compute
//! worker` (the reconciler) and real `little-compute gateway` processes.
//!
//! Each exec runs [`WORKSPACE`]: generation 1 writes a workspace (files
//! with modes 0640 and 0755, a symlink, 2.7 MB of text), prints `ready` and
//! waits; a resumed generation finds the files and prints their SHA-256,
//! modes and link target, then exits 3.
//!
//! * A gateway started with `LC_GATEWAY_CRASH_AT=<point>` kills itself at
//!   each point of hibernation and resume; a successor takes over once a
//!   certain cut passes the dead one's heartbeat expiry and finishes.
//! * `little-compute serve` is killed right after it answered a hibernate
//!   and then a resume request: each request is durable and completes; a
//!   replay of its Idempotency-Key on a restarted control plane returns
//!   the same record (the hibernation as it is now, parked with its head;
//!   the resume request unchanged).
//! * The worker is killed after the quiescence commit, before the destroy
//!   that parks the attempt (the Reservation still held), and after the
//!   resume's attachment is recorded and the resume committed, before the
//!   Lease is marked active; a restarted worker finishes each.
//! * The provider is killed after the stop, before the quiesce: its
//!   instance dies, but the stopped command's workspace stays in the
//!   provider's state directory, so the restarted provider quiesces it and
//!   proves the destroy, and the exec parks and resumes on every file. Killed
//!   while the resume's Lease allocates (prepared, not attached), no
//!   instance of the new generation exists yet: the worker allocates with
//!   the restore on the restarted provider and the resume completes. Killed
//!   after the attachment, the new generation's instance dies with it:
//!   nothing renews its Lease, which expires on a certain cut and is
//!   released with the restarted provider's proof; the exec ends expired,
//!   its unit back once.
//!
//! After each kill the design's invariant holds exactly in the database:
//! either the attempt is parked with no live Lease and the tenant's units
//! back exactly once, or it is running with exactly one live Lease and one
//! held Reservation, Tollgate's audit clean. In the end the resumed
//! command shows every file back byte for byte, and the pages are 1..n in
//! order exactly once across both generations.

mod support;

use std::ops::Deref;
use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clock::safe_cut::SafeCutClock;
use lc_blob::LocalBlobStore;
use lc_core::store::ControlStore as _;
use lc_core::{Digest, ExecId, ExecState, LeaseState, OperationKey, PageKind, TerminalReason};
use support::{Plane, Proc, append, exe, free_port, reading, signal};
use tokio::sync::watch;

/// The gateways' heartbeat TTL where a successor takes over: a takeover
/// follows a death within seconds, with a margin for a loaded machine.
const HEARTBEAT_TTL_MS: &str = "3000";
/// Units of the tenant (one exec of shape `small` holds one).
const UNITS: i64 = 2;
/// The longest any wait of these tests polls for.
const WAIT_MAX: Duration = Duration::from_secs(90);
/// Lines of `/workspace/big.txt` (`seq 1 BIG_LINES`, 2.7 MB).
const BIG_LINES: usize = 400_000;

/// Generation 1 writes the workspace and waits to be stopped; a resumed
/// generation prints what it finds and exits 3.
const WORKSPACE: &str = "cd /workspace; if [ -e gen1 ]; then \
    sha256sum a.txt big.txt x.sh; stat -c '%a %n' a.txt x.sh; readlink link; exit 3; fi; \
    printf 'hello\\n' > a.txt; chmod 0640 a.txt; seq 1 400000 > big.txt; \
    printf '#!/bin/sh\\necho hi\\n' > x.sh; chmod 0755 x.sh; ln -s a.txt link; touch gen1; \
    echo ready; exec sleep 1000";

/// What a resumed [`WORKSPACE`] prints.
fn resumed_stdout() -> String {
    let big: String = (1..=BIG_LINES).map(|i| format!("{i}\n")).collect();
    format!(
        "{}  a.txt\n{}  big.txt\n{}  x.sh\n640 a.txt\n755 x.sh\na.txt\n",
        Digest::of(b"hello\n").to_hex(),
        Digest::of(big.as_bytes()).to_hex(),
        Digest::of(b"#!/bin/sh\necho hi\n").to_hex(),
    )
}

struct Rig {
    _db: tollgate_pg_harness::TestDb,
    plane: Plane,
    clock: SafeCutClock,
    sampler_stop: watch::Sender<bool>,
    _sampler: tokio::task::JoinHandle<()>,
    worker: Option<Proc>,
    provider: Option<Proc>,
    provider_port: u16,
}

impl Deref for Rig {
    type Target = Plane;

    fn deref(&self) -> &Plane {
        &self.plane
    }
}

impl Rig {
    async fn new(name: &str) -> Rig {
        let p = support::start_plane(&format!("hk-{name}"), UNITS, WAIT_MAX).await;
        let mut rig = Rig {
            _db: p.db,
            plane: p.plane,
            clock: p.clock,
            sampler_stop: p.sampler_stop,
            _sampler: p.sampler,
            worker: None,
            provider: Some(p.provider),
            provider_port: p.provider_port,
        };
        rig.start_worker();
        rig
    }

    /// Starts a `little-compute worker` whose Leases live 3 s (renewed
    /// every 1.5 s), its output appended to `worker.log`.
    fn start_worker(&mut self) {
        let log = self.log("worker");
        self.worker = Some(Proc(
            Command::new(exe())
                .args(["worker", "--provider-url", &self.plane.provider_url])
                .args(["--interval-ms", "20", "--lease-ttl-ms", "3000"])
                .arg("--secret-file")
                .arg(&self.plane.secret)
                .args(["--safetime-gap-max-ms", support::GAP_MAX_MS])
                .env("LC_DATABASE_URL", &self.plane.url)
                .stdin(Stdio::null())
                .stdout(append(&log))
                .stderr(append(&log))
                .spawn()
                .unwrap(),
        ));
    }

    /// SIGKILLs the worker and reaps it.
    fn kill_worker(&mut self) {
        let mut w = self.worker.take().expect("a worker runs");
        w.0.kill().unwrap();
        assert_eq!(w.0.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    fn gateway(&self, name: &str, crash_at: Option<&str>, heartbeat_ttl_ms: &str) -> Proc {
        support::spawn_gateway(&support::GatewayArgs {
            heartbeat_ttl_ms: Some(heartbeat_ttl_ms),
            crash_at,
            ..self.gateway_args(name)
        })
    }

    async fn admit(&self, key: &str) -> ExecId {
        self.plane
            .admit(key, reading(&self.clock).await, WORKSPACE, false)
            .await
    }

    /// A certain reading (the store refuses an uncertain one).
    async fn certain(&self) -> lc_core::CutReading {
        support::wait_certain(&self.clock, WAIT_MAX, support::POLL).await;
        reading(&self.clock).await
    }

    /// Requests the hibernation of `exec` under `key`.
    async fn hibernate(&self, exec: ExecId, key: &str) -> lc_core::HibernationRecord {
        self.store
            .request_hibernation(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                self.certain().await,
                self.tenant,
                exec,
            )
            .await
            .unwrap()
    }

    /// Requests the resume of the parked `exec` from its head under `key`.
    async fn resume(&self, exec: ExecId, key: &str) -> lc_core::ResumeIntent {
        let head = self
            .store
            .workspace(self.tenant, exec)
            .await
            .unwrap()
            .head
            .expect("a parked exec has a head");
        self.store
            .request_resume(
                &OperationKey::new(
                    key,
                    lc_core::hibernate::resume_request_sha256(exec, Some(head)),
                )
                .unwrap(),
                self.certain().await,
                self.tenant,
                exec,
                Some(head),
            )
            .await
            .unwrap()
    }

    /// The exec's stored pages, by seq: `(seq, kind, bytes)`, each page's
    /// bytes checked against its SHA-256 and length.
    async fn pages(&self, exec: ExecId) -> Vec<(i64, PageKind, Vec<u8>)> {
        let sink = LocalBlobStore::open(&self.blob_dir).unwrap();
        support::all_pages(&self.store, self.tenant, exec)
            .await
            .iter()
            .map(|p| {
                let b = support::page_bytes(&sink, p);
                assert_eq!(Digest::of(&b), p.meta.sha256, "page {}", p.meta.seq);
                assert_eq!(b.len(), p.meta.length as usize, "page {}", p.meta.seq);
                (p.meta.seq, p.meta.kind, b)
            })
            .collect()
    }

    async fn stdout(&self, exec: ExecId) -> String {
        let b: Vec<u8> = self
            .pages(exec)
            .await
            .into_iter()
            .filter(|p| p.1 == PageKind::Stdout)
            .flat_map(|p| p.2)
            .collect();
        String::from_utf8(b).unwrap()
    }

    async fn wait_ready(&self, exec: ExecId) {
        self.wait_for("generation 1 prints ready", async || {
            self.stdout(exec).await == "ready\n"
        })
        .await;
    }

    /// The hibernation row's step of the exec's newest hibernation.
    async fn hibernation_step(&self, exec: ExecId) -> Option<String> {
        sqlx::query_scalar(
            "SELECT step FROM lc_hibernations WHERE exec_id = $1 \
              ORDER BY generation DESC LIMIT 1",
        )
        .bind(exec.0)
        .fetch_optional(self.store.pool())
        .await
        .unwrap()
    }

    /// The exec's Leases: `(generation, state, attachment recorded)`.
    async fn leases(&self, exec: ExecId) -> Vec<(i64, String, bool)> {
        sqlx::query_as(
            "SELECT generation, state, attachment IS NOT NULL FROM lc_sandbox_leases \
              WHERE exec_id = $1 ORDER BY generation",
        )
        .bind(exec.0)
        .fetch_all(self.store.pool())
        .await
        .unwrap()
    }

    /// The exec's Reservations: `(generation, state)`.
    async fn reservations(&self, exec: ExecId) -> Vec<(i64, String)> {
        sqlx::query_as(
            "SELECT generation, state FROM lc_reservations WHERE exec_id = $1 \
              ORDER BY generation",
        )
        .bind(exec.0)
        .fetch_all(self.store.pool())
        .await
        .unwrap()
    }

    async fn attempt_state(&self, exec: ExecId) -> String {
        sqlx::query_scalar("SELECT state FROM lc_attempts WHERE exec_id = $1")
            .bind(exec.0)
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    /// Tollgate's audit is clean with [`UNITS`] deposited, `held` held and
    /// nothing consumed.
    async fn assert_audit(&self, held: i64, what: &str) {
        use tollgate::Allocator as _;
        let audit = self.store.tollgate().audit().await.unwrap();
        assert!(audit.is_clean(), "{what}: {:?}", audit.violations);
        assert_eq!(
            (
                audit.total_deposited,
                audit.total_held,
                audit.total_consumed
            ),
            (i128::from(UNITS), i128::from(held), 0),
            "{what}"
        );
    }

    /// Waits until generation `generation` of `exec` is parked: its
    /// attempt `parked`, its Lease released.
    async fn wait_parked(&self, exec: ExecId, generation: i64) {
        self.wait_for(&format!("generation {generation} parks"), async || {
            self.attempt_state(exec).await == "parked"
                && self
                    .leases(exec)
                    .await
                    .iter()
                    .all(|(_, state, _)| state == "released")
        })
        .await;
    }

    /// The invariant of a parked attempt whose generations `1..=generation`
    /// ended: the exec hibernated, no live Lease, every Reservation
    /// returned once, the units all back, the audit clean.
    async fn assert_parked(&self, exec: ExecId, generation: i64, what: &str) {
        let rec = self.store.exec(self.tenant, exec).await.unwrap();
        assert_eq!(
            (rec.state, rec.terminal_reason, rec.lease_state),
            (ExecState::Hibernated, None, Some(LeaseState::Released)),
            "{what}"
        );
        assert_eq!(self.attempt_state(exec).await, "parked", "{what}");
        assert_eq!(
            self.leases(exec).await,
            (1..=generation)
                .map(|g| (g, "released".to_string(), g > 1))
                .collect::<Vec<_>>(),
            "{what}: no live Lease"
        );
        assert_eq!(
            self.reservations(exec).await,
            (1..=generation)
                .map(|g| (g, "returned".to_string()))
                .collect::<Vec<_>>(),
            "{what}: every Reservation returned once"
        );
        assert_eq!(self.hibernation_step(exec).await.as_deref(), Some("parked"));
        let milestones = self
            .store
            .milestones(self.tenant, exec, 0, 100)
            .await
            .unwrap();
        assert_eq!(
            milestones
                .iter()
                .map(|m| (m.seq, m.generation.0, m.source.as_str()))
                .collect::<Vec<_>>(),
            (1..=generation)
                .map(|g| (u32::try_from(g).unwrap(), g, "hibernation"))
                .collect::<Vec<_>>(),
            "{what}: one milestone per hibernated generation"
        );
        assert_eq!(
            milestones.last().map(|m| m.milestone.head.clone()),
            rec.workspace_head.map(|h| h.to_hex()),
            "{what}: the newest milestone saved the workspace's head"
        );
        assert_eq!(self.balance().await, (UNITS, UNITS, 0, 0), "{what}");
        self.assert_audit(0, what).await;
    }

    /// The milestone of generation 1's hibernation was measured by the
    /// live provider: a cost within the `small` shape's 256 MiB and, with
    /// no network path, all three side effects observed false (eligible).
    async fn assert_measured_milestone(&self, exec: ExecId, what: &str) {
        use lc_core::observation::{Eligibility, ExternalityObservation, reexecution_eligibility};
        let m = &self
            .store
            .milestones(self.tenant, exec, 0, 1)
            .await
            .unwrap()[0]
            .milestone;
        let cost = m
            .cost
            .unwrap_or_else(|| panic!("{what}: the milestone's cost is measured: {m:?}"));
        assert!(
            cost.peak_memory_bytes > 0 && cost.peak_memory_bytes <= 268_435_456,
            "{what}: {cost:?}"
        );
        assert_eq!(
            m.externality,
            Some(ExternalityObservation::no_network_path()),
            "{what}"
        );
        assert_eq!(
            reexecution_eligibility(Some(m)),
            Eligibility::Eligible,
            "{what}"
        );
    }

    /// Waits until generation `generation` of `exec` runs: the exec
    /// running, its Lease active.
    async fn wait_running(&self, exec: ExecId, generation: i64) {
        self.wait_for(&format!("generation {generation} runs"), async || {
            let rec = self.store.exec(self.tenant, exec).await.unwrap();
            (rec.state, rec.lease_state) == (ExecState::Running, Some(LeaseState::Active))
                && self
                    .leases(exec)
                    .await
                    .last()
                    .is_some_and(|l| l.0 == generation)
        })
        .await;
    }

    /// The invariant of a running attempt at `generation`: exactly one
    /// live Lease (that generation's, active) and one held Reservation,
    /// every earlier one released and returned, one unit held, the audit
    /// clean.
    async fn assert_running(&self, exec: ExecId, generation: i64, what: &str) {
        assert_eq!(self.attempt_state(exec).await, "running", "{what}");
        let mut leases: Vec<_> = (1..generation)
            .map(|g| (g, "released".to_string(), g > 1))
            .collect();
        leases.push((generation, "active".into(), generation > 1));
        assert_eq!(self.leases(exec).await, leases, "{what}: one live Lease");
        let mut reservations: Vec<_> = (1..generation)
            .map(|g| (g, "returned".to_string()))
            .collect();
        reservations.push((generation, "held".into()));
        assert_eq!(
            self.reservations(exec).await,
            reservations,
            "{what}: one held Reservation"
        );
        assert_eq!(self.balance().await, (UNITS, UNITS - 1, 1, 0), "{what}");
        self.assert_audit(1, what).await;
    }

    /// Waits for the resumed generation 2 to exit and be released, then
    /// checks the whole run: pages 1..n once each, `ready` then the stopped
    /// page, the resumed stdout byte for byte, the terminal page last with
    /// exit 3, one resume receipt, every Reservation returned once.
    async fn assert_finished(&self, exec: ExecId, what: &str) {
        self.wait_released(exec).await;
        let pages = self.pages(exec).await;
        let n = i64::try_from(pages.len()).unwrap();
        assert_eq!(
            pages.iter().map(|p| p.0).collect::<Vec<_>>(),
            (1..=n).collect::<Vec<_>>(),
            "{what}: one seq line across generations"
        );
        let stopped: Vec<usize> = (0..pages.len())
            .filter(|&i| pages[i].1 == PageKind::Stopped)
            .collect();
        assert_eq!(stopped.len(), 1, "{what}: one stopped page");
        let stdout = |ps: &[(i64, PageKind, Vec<u8>)]| {
            String::from_utf8(
                ps.iter()
                    .filter(|p| p.1 == PageKind::Stdout)
                    .flat_map(|p| p.2.clone())
                    .collect(),
            )
            .unwrap()
        };
        assert_eq!(stdout(&pages[..stopped[0]]), "ready\n", "{what}");
        assert_eq!(
            stdout(&pages[stopped[0]..]),
            resumed_stdout(),
            "{what}: every file back byte for byte"
        );
        assert_eq!(pages.last().unwrap().1, PageKind::Terminal, "{what}");
        let rec = self.store.exec(self.tenant, exec).await.unwrap();
        assert_eq!(
            (rec.state, rec.terminal_reason, rec.exit_code),
            (ExecState::Terminal, Some(TerminalReason::Exited), Some(3)),
            "{what}"
        );
        assert_eq!(
            self.scalar(
                "SELECT count(*) FROM lc_resume_receipts WHERE exec_id = $1",
                exec
            )
            .await,
            1,
            "{what}: one resume receipt"
        );
        assert_eq!(
            self.reservations(exec).await,
            vec![(1, "returned".into()), (2, "returned".into())],
            "{what}"
        );
        assert_eq!(self.releases(exec).await, 1, "{what}: released once");
        assert_eq!(self.balance().await, (UNITS, UNITS, 0, 0), "{what}");
        self.assert_audit(0, what).await;
    }

    /// SIGKILLs the provider (its instances die with it) and starts a new
    /// one on the same port and state directory.
    async fn restart_provider(&mut self) {
        let mut p = self.provider.take().expect("a provider runs");
        p.0.kill().unwrap();
        assert_eq!(p.0.wait().unwrap().signal(), Some(libc::SIGKILL));
        self.provider = Some(support::spawn_provider(
            self.provider_port,
            &self.plane.dir,
            &self.plane.cgroup_parent,
            "provider.log",
        ));
        support::connect_provider(&self.plane.provider_url, WAIT_MAX).await;
    }

    async fn finish(mut self) {
        let _ = self.sampler_stop.send(true);
        drop(self.worker.take());
        drop(self.provider.take());
        let _ = std::fs::remove_dir_all(&self.dir);
        support::remove_cgroup_parent(&self.cgroup_parent);
    }
}

/// Waits until `p` exits; returns its status.
async fn wait_exit(rig: &Rig, p: &mut Proc, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", rig.logs());
        tokio::time::sleep(support::POLL).await;
    }
}

/// Waits until the gateway `p`, started as `name` with `point`, killed
/// itself there.
async fn wait_crashed(rig: &Rig, p: &mut Proc, name: &str, point: &str) {
    let status = wait_exit(rig, p, &format!("the gateway dies at {point}")).await;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: {status:?}");
    let log = std::fs::read_to_string(rig.log(name)).unwrap();
    assert!(
        log.contains(&format!("fault injection: SIGKILL at {point}")),
        "{point}: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_at_each_hibernation_and_resume_point_is_finished_by_a_successor() {
    let rig = Rig::new("gw").await;
    for (round, point) in lc_gateway::CrashPoint::HIBERNATION.into_iter().enumerate() {
        let point = point.as_str();
        let resuming = matches!(point, "after_prepare_resume" | "before_commit_resume");
        let exec = rig.admit(&format!("e-{round}")).await;
        let first_name = format!("first-{point}");
        let mut first = rig.gateway(&first_name, Some(point), HEARTBEAT_TTL_MS);
        rig.wait_ready(exec).await;
        rig.hibernate(exec, &format!("h-{round}")).await;
        let mut _second = None;
        if !resuming {
            wait_crashed(&rig, &mut first, &first_name, point).await;
            // Dead before its quiescence committed: the hibernation is
            // still sealed and generation 1 still holds its Lease.
            assert_eq!(
                rig.hibernation_step(exec).await.as_deref(),
                Some("sealed"),
                "{point}"
            );
            assert_eq!(
                rig.reservations(exec).await,
                vec![(1, "held".into())],
                "{point}"
            );
            _second = Some(rig.gateway(&format!("second-{point}"), None, HEARTBEAT_TTL_MS));
        }
        rig.wait_parked(exec, 1).await;
        rig.assert_parked(exec, 1, point).await;
        rig.assert_measured_milestone(exec, point).await;
        rig.resume(exec, &format!("r-{round}")).await;
        if resuming {
            wait_crashed(&rig, &mut first, &first_name, point).await;
            // Dead after its prepare: Lease 2 exists, no receipt yet.
            assert_eq!(
                rig.scalar(
                    "SELECT count(*) FROM lc_resume_receipts WHERE exec_id = $1",
                    exec
                )
                .await,
                0,
                "{point}"
            );
            let leases = rig.leases(exec).await;
            assert_eq!(
                (leases.len(), &leases[1].1),
                (2, &"allocating".to_string()),
                "{point}"
            );
            if point == "before_commit_resume" {
                assert!(leases[1].2, "{point}: the attachment is recorded");
            }
            _second = Some(rig.gateway(&format!("second-{point}"), None, HEARTBEAT_TTL_MS));
        }
        rig.wait_running(exec, 2).await;
        rig.assert_running(exec, 2, point).await;
        rig.assert_finished(exec, point).await;
    }
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_before_the_park_and_before_mark_active_is_finished_by_a_restart() {
    let mut rig = Rig::new("worker").await;
    let exec = rig.admit("e-worker").await;
    // A long heartbeat: this gateway is paused below and must stay owner.
    let gateway = rig.gateway("gateway", None, "30000");
    rig.wait_ready(exec).await;

    // The worker is paused, so nothing destroys the quiesced instance.
    signal(rig.worker.as_ref().unwrap(), libc::SIGSTOP);
    rig.hibernate(exec, "h-1").await;
    rig.wait_for("the quiescence commits", async || {
        rig.hibernation_step(exec).await.as_deref() == Some("quiesced")
    })
    .await;
    rig.kill_worker();
    // Quiesced, not parked: the quiescence asked for the release of
    // generation 1's Lease, which keeps its unit until its destroy is
    // proven.
    assert_eq!(
        rig.leases(exec).await,
        vec![(1, "release_pending".into(), false)],
        "the destroy is not committed"
    );
    assert_eq!(rig.reservations(exec).await, vec![(1, "held".into())]);
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    rig.assert_audit(1, "quiesced").await;
    rig.start_worker();
    rig.wait_parked(exec, 1).await;
    rig.assert_parked(exec, 1, "after the park").await;

    // The worker is paused again: the gateway prepares the resume.
    signal(rig.worker.as_ref().unwrap(), libc::SIGSTOP);
    rig.resume(exec, "r-1").await;
    rig.wait_for("the resume is prepared", async || {
        rig.leases(exec).await.len() == 2
    })
    .await;
    // The gateway is paused while the worker allocates and attaches, so
    // the worker's mark_active cannot follow before it is killed.
    signal(&gateway, libc::SIGSTOP);
    signal(rig.worker.as_ref().unwrap(), libc::SIGCONT);
    rig.wait_for("the attachment is recorded", async || {
        rig.leases(exec).await.get(1).is_some_and(|l| l.2)
    })
    .await;
    signal(rig.worker.as_ref().unwrap(), libc::SIGSTOP);
    signal(&gateway, libc::SIGCONT);
    rig.wait_for("the resume commits", async || {
        rig.scalar(
            "SELECT count(*) FROM lc_resume_receipts WHERE exec_id = $1",
            exec,
        )
        .await
            == 1
    })
    .await;
    rig.kill_worker();
    assert_eq!(
        rig.leases(exec).await,
        vec![
            (1, "released".into(), false),
            (2, "allocating".into(), true)
        ],
        "attached and committed, not marked active"
    );
    assert_eq!(
        rig.reservations(exec).await,
        vec![(1, "returned".into()), (2, "held".into())]
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    rig.assert_audit(1, "attached").await;
    rig.start_worker();
    rig.wait_running(exec, 2).await;
    rig.assert_running(exec, 2, "after mark_active").await;
    rig.assert_finished(exec, "worker").await;
    drop(gateway);
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_killed_during_hibernation_and_during_resume() {
    let mut rig = Rig::new("provider").await;
    // During hibernation: the gateway dies after the stopped page is acked,
    // before the quiesce; then the provider is killed, taking the
    // instance along. The workspace stays in the provider's state
    // directory: the restarted provider quiesces it for the successor and
    // proves the destroy, and the exec parks.
    let exec = rig.admit("e-hib").await;
    let mut first = rig.gateway("first", Some("after_stopped_ack"), HEARTBEAT_TTL_MS);
    rig.wait_ready(exec).await;
    rig.hibernate(exec, "h-1").await;
    wait_crashed(&rig, &mut first, "first", "after_stopped_ack").await;
    assert_eq!(rig.hibernation_step(exec).await.as_deref(), Some("sealed"));
    assert_eq!(
        rig.pages(exec).await.last().map(|p| (p.0, p.1)),
        Some((2, PageKind::Stopped)),
        "stopped, its stopped page stored"
    );
    rig.restart_provider().await;
    let second = rig.gateway("second", None, HEARTBEAT_TTL_MS);
    rig.wait_parked(exec, 1).await;
    rig.assert_parked(exec, 1, "provider killed before the quiesce")
        .await;
    rig.resume(exec, "r-1").await;
    rig.wait_running(exec, 2).await;
    rig.assert_running(exec, 2, "resumed after the provider's restart")
        .await;
    rig.assert_finished(exec, "provider killed before the quiesce")
        .await;

    // During resume: the worker is paused, the resume prepared (Lease 2
    // allocating, not attached), the provider killed. No instance of
    // generation 2 exists yet and the snapshot's blobs are in the
    // provider's state directory: the worker allocates with the restore on
    // the restarted provider and the resume completes.
    let exec = rig.admit("e-res").await;
    rig.wait_ready(exec).await;
    rig.hibernate(exec, "h-2").await;
    rig.wait_parked(exec, 1).await;
    signal(rig.worker.as_ref().unwrap(), libc::SIGSTOP);
    rig.resume(exec, "r-2").await;
    rig.wait_for("the resume is prepared", async || {
        rig.leases(exec).await.len() == 2
    })
    .await;
    assert_eq!(
        rig.leases(exec).await,
        vec![
            (1, "released".into(), false),
            (2, "allocating".into(), false)
        ]
    );
    assert_eq!(
        rig.reservations(exec).await,
        vec![(1, "returned".into()), (2, "held".into())]
    );
    rig.assert_audit(1, "prepared").await;
    rig.restart_provider().await;
    signal(rig.worker.as_ref().unwrap(), libc::SIGCONT);
    rig.wait_running(exec, 2).await;
    rig.assert_running(exec, 2, "provider killed while Lease 2 allocates")
        .await;
    rig.assert_finished(exec, "provider killed while Lease 2 allocates")
        .await;

    // After the attachment: generation 2's instance runs on the restored
    // workspace when the provider is killed (the gateway paused, so the
    // resume is not committed yet).
    let exec = rig.admit("e-att").await;
    rig.wait_ready(exec).await;
    rig.hibernate(exec, "h-3").await;
    rig.wait_parked(exec, 1).await;
    signal(rig.worker.as_ref().unwrap(), libc::SIGSTOP);
    rig.resume(exec, "r-3").await;
    rig.wait_for("the resume is prepared", async || {
        rig.leases(exec).await.len() == 2
    })
    .await;
    signal(&second, libc::SIGSTOP);
    signal(rig.worker.as_ref().unwrap(), libc::SIGCONT);
    rig.wait_for("the attachment is recorded", async || {
        rig.leases(exec).await.get(1).is_some_and(|l| l.2)
    })
    .await;
    assert_eq!(
        rig.leases(exec).await,
        vec![
            (1, "released".into(), false),
            (2, "allocating".into(), true)
        ]
    );
    rig.restart_provider().await;
    signal(&second, libc::SIGCONT);
    // The instance died with the provider: nothing renews Lease 2, which
    // expires on a certain cut (the 60 s it was prepared with) and is
    // released with the restarted provider's proof, its Reservation
    // returned once. The exec ends expired; the snapshot stays.
    rig.wait_released(exec).await;
    let rec = rig.store.exec(rig.tenant, exec).await.unwrap();
    assert_eq!(
        (
            rec.state,
            rec.terminal_reason,
            rec.exit_code,
            rec.lease_state
        ),
        (
            ExecState::Terminal,
            Some(TerminalReason::Expired),
            None,
            Some(LeaseState::Released)
        )
    );
    assert_eq!(rig.attempt_state(exec).await, "terminal");
    assert_eq!(
        rig.leases(exec).await,
        vec![(1, "released".into(), false), (2, "released".into(), true)],
        "no live Lease"
    );
    assert_eq!(
        rig.reservations(exec).await,
        vec![(1, "returned".into()), (2, "returned".into())],
        "every Reservation returned once"
    );
    assert_eq!(
        rig.store
            .workspace(rig.tenant, exec)
            .await
            .unwrap()
            .snapshots,
        1
    );
    let pages = rig.pages(exec).await;
    let n = i64::try_from(pages.len()).unwrap();
    assert_eq!(
        pages.iter().map(|p| p.0).collect::<Vec<_>>(),
        (1..=n).collect::<Vec<_>>()
    );
    assert_eq!(pages[1].1, PageKind::Stopped);
    let resumed: Vec<u8> = pages[2..]
        .iter()
        .filter(|p| p.1 == PageKind::Stdout)
        .flat_map(|p| p.2.clone())
        .collect();
    assert!(
        resumed_stdout().as_bytes().starts_with(&resumed),
        "what generation 2 printed before it died, if anything: {resumed:?}"
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.assert_audit(0, "expired").await;
    drop(second);
    rig.finish().await;
}

/// The admin token `little-compute serve` is started with.
const ADMIN: &str = "lcadm-hibernate-kill-0123456789";

/// A running `little-compute serve`: the process, its base URL, and the
/// `application_name` its database sessions carry.
struct Serve {
    proc: Proc,
    base: String,
    app: String,
}

impl Rig {
    /// Starts `little-compute serve` (its sessions named
    /// `lc-hk-serve-<n>`) and waits until `/readyz` answers 200.
    async fn serve(&self, n: usize) -> Serve {
        let port = free_port();
        let app = format!("lc-hk-serve-{n}");
        let token = self.dir.join("admin.token");
        std::fs::write(&token, format!("{ADMIN}\n")).unwrap();
        let proc = Proc(
            Command::new(exe())
                .arg("serve")
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--admin-token-file")
                .arg(&token)
                .arg("--secret-file")
                .arg(&self.secret)
                .args(["--safetime-gap-max-ms", support::GAP_MAX_MS])
                .args(["--grant-max-ttl-ms", "3600000"])
                .args(["--reclaim-grace-ms", "5000"])
                .env(
                    "LC_DATABASE_URL",
                    format!("{}?application_name={app}", self.url),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(append(&self.log("serve")))
                .spawn()
                .unwrap(),
        );
        let s = Serve {
            proc,
            base: format!("http://127.0.0.1:{port}"),
            app,
        };
        let http = reqwest::Client::new();
        self.wait_for("serve answers /readyz with 200", async || {
            http.get(format!("{}/readyz", s.base))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await;
        s
    }

    /// SIGKILLs `s`, then waits until the database holds no session of
    /// it: after that nothing it sent can still commit.
    async fn kill_serve(&self, s: Serve) {
        let Serve { mut proc, app, .. } = s;
        proc.0.kill().unwrap();
        assert_eq!(proc.0.wait().unwrap().signal(), Some(libc::SIGKILL));
        self.wait_for(&format!("no session of {app} remains"), async || {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(&app)
            .fetch_one(self.store.pool())
            .await
            .unwrap()
                == 0
        })
        .await;
    }

    /// POSTs `/v1/execs/{exec}/{action}` to `s` as the admin acting for the
    /// tenant, under `key`; returns the status and the JSON body.
    async fn post(
        &self,
        s: &Serve,
        exec: ExecId,
        action: &str,
        key: &str,
    ) -> (u16, serde_json::Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/execs/{}/{action}", s.base, exec.0))
            .bearer_auth(ADMIN)
            .header("Lc-Tenant", self.tenant.0.to_string())
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_killed_after_answering_a_hibernate_and_a_resume_completes_both() {
    let rig = Rig::new("serve").await;
    let _gateway = rig.gateway("gateway", None, HEARTBEAT_TTL_MS);
    let exec = rig.admit("e-serve").await;
    rig.wait_ready(exec).await;

    // Killed right after it answered the hibernate: the sealed
    // hibernation is durable and the gateway and the worker park it.
    let serve = rig.serve(1).await;
    let (status, sealed) = rig.post(&serve, exec, "hibernate", "h-serve").await;
    rig.kill_serve(serve).await;
    assert_eq!(status, 202, "{sealed}");
    assert_eq!(
        (&sealed["exec_id"], &sealed["generation"], &sealed["reason"]),
        (
            &serde_json::json!(exec.0),
            &serde_json::json!(1),
            &serde_json::json!("requested")
        )
    );
    assert_eq!(
        (&sealed["step"], &sealed["head"]),
        (&serde_json::json!("sealed"), &serde_json::Value::Null)
    );
    rig.wait_parked(exec, 1).await;
    rig.assert_parked(exec, 1, "after the hibernate's answer")
        .await;
    // The replay on a restarted control plane returns the same
    // hibernation, as it is now: parked, with its head.
    let serve = rig.serve(2).await;
    let head = rig
        .store
        .workspace(rig.tenant, exec)
        .await
        .unwrap()
        .head
        .unwrap();
    let mut want = sealed.clone();
    want["step"] = "parked".into();
    want["head"] = head.to_hex().into();
    assert_eq!(
        rig.post(&serve, exec, "hibernate", "h-serve").await,
        (202, want)
    );

    // Killed right after it answered the resume: the recorded request is
    // durable and the gateway and the worker resume the exec.
    let (status, intent) = rig.post(&serve, exec, "resume", "r-serve").await;
    rig.kill_serve(serve).await;
    assert_eq!(status, 202, "{intent}");
    assert_eq!(
        (
            &intent["exec_id"],
            &intent["op_key"],
            &intent["head"],
            &intent["from_generation"]
        ),
        (
            &serde_json::json!(exec.0),
            &serde_json::json!("r-serve"),
            &serde_json::json!(head.to_hex()),
            &serde_json::json!(1)
        )
    );
    rig.wait_running(exec, 2).await;
    rig.assert_running(exec, 2, "after the resume's answer")
        .await;
    let serve = rig.serve(3).await;
    assert_eq!(
        rig.post(&serve, exec, "resume", "r-serve").await,
        (202, intent),
        "the replay returns the recorded request"
    );
    rig.assert_finished(exec, "serve").await;
    rig.kill_serve(serve).await;
    rig.finish().await;
}
