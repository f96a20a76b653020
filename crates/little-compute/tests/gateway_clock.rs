//! The exec gateway while the time authority misbehaves, on real
//! processes: a PostgreSQL server on a fake wall clock (libfaketime, one
//! server for this test binary, its clock stepped while it runs), a real
//! `tollgate-safetime run` sampler process, a real `little-compute
//! provider`, a real `little-compute worker` and real `little-compute
//! gateway` processes, while an exec streams output.
//!
//! * **A forward and a backward step of the database's wall clock.** The
//!   sampler sees the step and publishes the cut uncertain for its
//!   recovery grace. While uncertain the owner keeps serving (its pages are
//!   still acked); the owner is then killed (SIGKILL) and a successor
//!   started: though the uncertain cut passes the dead owner's heartbeat
//!   expiry, every step of the successor reads an uncertain cut and it
//!   takes nothing over (owner generation, fence and basis unchanged in the
//!   database), and no Lease is released. Once the cut is certain again the
//!   successor takes the exec over (generation 2) and finishes it, keeping
//!   its ownership while it works off the backlog (never refused stale):
//!   the whole stdout exactly once, the terminal page acked, the Lease
//!   released once, the tenant's unit back once.
//! * **A paused sampler.** The sampler process is stopped (SIGSTOP) past
//!   its staleness bound: every reading is `stale`. The owner keeps
//!   serving, as the ownership rules say (a heartbeat renews to
//!   `max(current, cut + ttl)` on any cut; a fenced page write needs the
//!   current, unreleased owner not expired on a certain cut, so an
//!   uncertain cut expires nobody): its heartbeat reaches exactly the frozen
//!   cut plus the TTL, and it stages and acks every remaining page, the
//!   terminal page included. It does not release the Lease (a release
//!   needs a certain cut), and a successor started meanwhile takes nothing
//!   over. After SIGCONT, once the cut is certain, the same owner (still
//!   generation 1) releases the Lease once; the output is exactly once.
//!
//! Every wait polls the database, the clock or a gateway's `/metrics` with
//! a bound; nothing is timed. Every reading of the cut this test takes
//! checks that the cut never went backward.

mod support;

use std::ops::Deref;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clock::safe_cut::SafeCutClock;
use clock::{Clock, ClockReading, UncertainReason};
use jiff::{SignedDuration, Timestamp};
use lc_core::store::ControlStore;
use lc_core::{CutReading, ExecId, ExecState, LeaseState, TerminalReason};
use support::{GAP_MAX, POLL, Plane, Proc, exe, free_port, metric, metrics, signal};
use tollgate_pg_harness::PgServer;

/// The gateways' heartbeat TTL: the shortest accepted, so a certain cut
/// would pass a dead owner's heartbeat within about a second.
const HEARTBEAT_TTL: SignedDuration = SignedDuration::from_secs(1);
const HEARTBEAT_TTL_MS: &str = "1000";
/// Units of the tenant (one exec of shape `small` holds one).
const UNITS: i64 = 2;
/// The longest any wait of these tests polls for.
const WAIT_MAX: Duration = Duration::from_secs(120);
/// The sampler's recovery grace in the clock-step scenarios: how long the
/// cut stays uncertain after a step. Long enough for the owner to ack on
/// the uncertain cut, its death, a successor's start, the uncertain cut
/// passing the dead owner's heartbeat expiry (after a backward step the
/// cut stands until database time passes it again) and
/// [`SUCCESSOR_STEPS`] of the successor's steps, all inside it; a test
/// whose checks end after the cut turned certain again fails saying so.
const STEP_RECOVERY_GRACE: &str = "12s";
/// The recovery grace in the paused-sampler scenario, where the test
/// itself decides how long the cut stays uncertain.
const PAUSE_RECOVERY_GRACE: &str = "500ms";
/// Steps of the successor, each on an uncertain cut past the dead owner's
/// heartbeat expiry, before the test checks that it took nothing over.
const SUCCESSOR_STEPS: u64 = 25;
/// The size of the forward step of the database's wall clock, ns.
const FORWARD_STEP_NS: i64 = 120 * 1_000_000_000;
/// The size of the backward step, ns (the cut stands this long).
const BACKWARD_STEP_NS: i64 = -2 * 1_000_000_000;

/// The one PostgreSQL server on a fake clock of this test binary. The tests
/// take turns (a step of its clock is every database's), each on a fresh
/// database of its own; the harness stops the server when the binary
/// exits.
static SERVER: tokio::sync::Mutex<Option<PgServer>> = tokio::sync::Mutex::const_new(None);

/// The supervisor and the sampler are other packages' binaries, found
/// beside `little-compute`: built fresh (once per process), so a test never
/// runs a stale copy of either.
fn ensure_sibling_binaries() {
    for b in ["tollgate-safetime", "lc-supervisor"] {
        let built = tollgate_pg_harness::cargo_built(b, &["-p", b]);
        assert_eq!(built.parent(), exe().parent(), "{b} beside little-compute");
    }
}

/// An exec's ownership row: generation, fence, released, basis, and the
/// heartbeat expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OwnerRow {
    generation: i64,
    fence: i64,
    released: bool,
    basis: String,
    heartbeat_expiry: Timestamp,
}

struct Rig {
    server: tokio::sync::MutexGuard<'static, Option<PgServer>>,
    plane: Plane,
    clock: SafeCutClock,
    /// The latest cut this test read: no later read may be earlier.
    last_cut: std::sync::Mutex<Option<Timestamp>>,
    sampler: Option<Proc>,
    worker: Option<Proc>,
    provider: Option<Proc>,
}

impl Deref for Rig {
    type Target = Plane;

    fn deref(&self) -> &Plane {
        &self.plane
    }
}

impl Rig {
    /// The server (started on first use), a fresh migrated database, a
    /// sampler process with `recovery_grace`, a certain cut, the provider,
    /// the runtime `base`, a tenant with [`UNITS`] units and the worker.
    async fn new(name: &str, recovery_grace: &str) -> Rig {
        ensure_sibling_binaries();
        let mut server = SERVER.lock().await;
        if server.is_none() {
            let started = tokio::task::spawn_blocking(PgServer::start_dedicated_faketime)
                .await
                .unwrap()
                .expect("start PostgreSQL on a fake clock");
            *server = Some(started);
        }
        let db = server.as_ref().unwrap().fresh_database().await;
        let url = db.url().to_string();
        lc_pg::migrate(&url).await.unwrap();
        let dir = support::fresh_dir(&format!("lcgc-{name}"));
        let sampler = Proc(
            Command::new(exe().parent().unwrap().join("tollgate-safetime"))
                .arg("run")
                .args(["--interval", "50ms", "--gap-max", "2s"])
                .args(["--round-trip-max", "500ms", "--stable-observations", "3"])
                .args(["--recovery-grace", recovery_grace])
                .args(["--standby-poll", "100ms"])
                .env("TOLLGATE_DATABASE_URL", &url)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(support::append(&dir.join("sampler.log")))
                .spawn()
                .unwrap(),
        );
        let store = support::connect_store(&url, support::store_config()).await;
        let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
        let secret = support::write_secret(&dir);
        let cgroup_parent = format!("lc-gwclock-{name}-{}", std::process::id());
        let mut rig = Rig {
            server,
            plane: Plane {
                url,
                store,
                blob_dir: dir.join("blobs"),
                dir,
                secret,
                provider_url: String::new(),
                cgroup_parent,
                tenant: lc_core::TenantId(0),
                wait_max: WAIT_MAX,
            },
            clock,
            last_cut: std::sync::Mutex::new(None),
            sampler: Some(sampler),
            worker: None,
            provider: None,
        };
        rig.wait_for("a certain cut", async || {
            rig.read().await.uncertain.is_none()
        })
        .await;
        let port = free_port();
        rig.plane.provider_url = format!("http://127.0.0.1:{port}");
        rig.provider = Some(support::spawn_provider(
            port,
            &rig.dir,
            &rig.cgroup_parent,
            "provider.log",
        ));
        let http = support::connect_provider(&rig.provider_url, WAIT_MAX).await;
        let at = rig.certain().await;
        rig.plane.tenant = support::register_base_provider_and_tenant(
            &rig.store,
            at,
            &http,
            &rig.provider_url,
            UNITS,
        )
        .await;
        rig.worker = Some(support::spawn_worker(
            &rig.url,
            &rig.secret,
            &rig.provider_url,
            &rig.dir.join("worker.log"),
        ));
        rig
    }
    /// One reading of the clock; asserts that the cut did not go backward
    /// since the previous reading of this test.
    async fn read(&self) -> ClockReading {
        let r = self.clock.read().await.unwrap();
        let mut last = self.last_cut.lock().unwrap();
        if let Some(prev) = *last {
            assert!(
                r.now >= prev,
                "the cut went backward: {prev} then {}",
                r.now
            );
        }
        *last = Some(r.now);
        r
    }

    /// A certain reading as the store takes it.
    async fn certain(&self) -> CutReading {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let r = self.read().await;
            if r.uncertain.is_none() {
                return CutReading {
                    cut: r.now,
                    certain: true,
                    retry_after_s: 1,
                };
            }
            assert!(
                Instant::now() < deadline,
                "no certain cut:\n{}",
                self.logs()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Asserts that the clock reads uncertain now: what the test observed
    /// since the cut turned uncertain happened while it was.
    async fn assert_uncertain(&self, what: &str) {
        let r = self.read().await;
        assert!(
            r.uncertain.is_some(),
            "the cut turned certain again before {what} was checked (the recovery grace \
             {STEP_RECOVERY_GRACE} was too short for this machine): {r:?}"
        );
    }

    /// Waits for an uncertain reading for `reason`; returns it.
    async fn uncertain_for(&self, reason: UncertainReason) -> ClockReading {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let r = self.read().await;
            if r.uncertain == Some(reason) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "no reading uncertain for {reason:?}; last {r:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Steps the database server's wall clock by `step_ns` from where it
    /// stands.
    fn step_clock(&mut self, step_ns: i64) {
        let server = self.server.as_mut().unwrap();
        let offset = server.clock_offset_ns().expect("a fake clock");
        server.set_clock_offset_ns(offset + step_ns).unwrap();
    }

    fn gateway(&self, name: &str, metrics_port: u16) -> Proc {
        support::spawn_gateway(&support::GatewayArgs {
            heartbeat_ttl_ms: Some(HEARTBEAT_TTL_MS),
            metrics_port: Some(metrics_port),
            ..self.gateway_args(name)
        })
    }

    async fn admit(&self, key: &str, script: &str) -> ExecId {
        self.plane
            .admit(key, self.certain().await, script, false)
            .await
    }

    /// Acked terminal pages of `exec` (0 or 1).
    async fn terminal_acked(&self, exec: ExecId) -> i64 {
        self.scalar(
            "SELECT count(*) FROM lc_output_pages \
              WHERE exec_id = $1 AND state = 'acked' AND kind = 'terminal'",
            exec,
        )
        .await
    }

    async fn owner(&self, exec: ExecId) -> OwnerRow {
        let (generation, fence, released, basis, floor_us, submicro_ns): (
            i64,
            i64,
            bool,
            String,
            i64,
            i32,
        ) = sqlx::query_as(
            "SELECT generation, fence, released, basis, heartbeat_expiry_floor_us, \
                    heartbeat_expiry_submicro_ns \
               FROM lc_exec_owners WHERE exec_id = $1",
        )
        .bind(exec.0)
        .fetch_one(self.store.pool())
        .await
        .unwrap();
        OwnerRow {
            generation,
            fence,
            released,
            basis,
            heartbeat_expiry: Timestamp::from_nanosecond(
                i128::from(floor_us) * 1000 + i128::from(submicro_ns),
            )
            .unwrap(),
        }
    }

    async fn lease_state(&self, exec: ExecId) -> LeaseState {
        self.store
            .exec(self.tenant, exec)
            .await
            .unwrap()
            .lease_state
    }

    /// Asserts that Tollgate's audit is clean with every unit back, then
    /// removes the rig's files (dropping it stops its processes).
    async fn finish(self) {
        support::assert_audit_clean(&self.store, UNITS).await;
        self.store.pool().close().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Rig {
    /// Stops the rig's processes and removes its cgroups, whether the test
    /// passed or not (a failed test keeps its logs in `dir`).
    fn drop(&mut self) {
        drop(self.worker.take());
        drop(self.provider.take());
        drop(self.sampler.take());
        for c in ["memory", "pids", "cpu"] {
            let parent = Path::new("/sys/fs/cgroup")
                .join(c)
                .join(&self.cgroup_parent);
            if let Ok(children) = std::fs::read_dir(&parent) {
                for child in children.flatten() {
                    if child.path().is_dir() {
                        let _ = std::fs::remove_dir(child.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(&parent);
        }
    }
}

/// A step of `step_ns` of the database's wall clock while an exec streams;
/// the sampler reports it as `reason`.
async fn a_clock_step(name: &str, step_ns: i64, reason: UncertainReason) {
    let mut rig = Rig::new(name, STEP_RECOVERY_GRACE).await;
    // At least 20 s of output: it outlasts the uncertain period.
    let (s, want) = support::script(2000, "0.01");
    let exec = rig.admit(&format!("e-{name}"), &s).await;
    let first_port = free_port();
    let mut first = rig.gateway("first", first_port);
    rig.wait_for("the first gateway acks pages", async || {
        rig.acked_pages(exec).await >= 3
    })
    .await;
    let before = rig.owner(exec).await;
    assert_eq!(
        (before.generation, before.released, before.basis.as_str()),
        (1, false, "unowned")
    );

    rig.step_clock(step_ns);
    rig.uncertain_for(reason).await;
    // The owner keeps serving on the uncertain cut: more pages are acked.
    let acked = rig.acked_pages(exec).await;
    rig.wait_for("the owner acks a page on the uncertain cut", async || {
        rig.acked_pages(exec).await > acked
    })
    .await;
    rig.assert_uncertain("the owner's acks").await;
    assert_eq!(
        metric(first_port, "lc_gateway_stale_refused_total").await,
        Some(0)
    );

    first.0.kill().unwrap();
    assert_eq!(first.0.wait().unwrap().signal(), Some(libc::SIGKILL));
    let dead = rig.owner(exec).await;
    assert_eq!(
        (dead.generation, dead.fence, dead.released),
        (1, before.fence, false)
    );
    assert!(dead.heartbeat_expiry >= before.heartbeat_expiry);
    let port = free_port();
    let _second = rig.gateway("second", port);
    // The uncertain cut passes the dead owner's heartbeat expiry: on a
    // certain cut that would allow a takeover.
    rig.wait_for(
        "an uncertain cut past the dead owner's heartbeat expiry",
        async || {
            let r = rig.read().await;
            assert!(
                r.uncertain.is_some(),
                "the cut turned certain before it passed the dead owner's heartbeat \
                 expiry {} (recovery grace {STEP_RECOVERY_GRACE}): {r:?}",
                dead.heartbeat_expiry
            );
            r.now >= dead.heartbeat_expiry
        },
    )
    .await;
    let mut steps_then = None;
    rig.wait_for("the successor's metrics", async || {
        steps_then = metric(port, "lc_gateway_steps_uncertain_total").await;
        steps_then.is_some()
    })
    .await;
    let steps_then = steps_then.unwrap();
    rig.wait_for("the successor steps on the uncertain cut", async || {
        metric(port, "lc_gateway_steps_uncertain_total")
            .await
            .is_some_and(|n| n >= steps_then + SUCCESSOR_STEPS)
    })
    .await;
    rig.every_step_uncertain(port).await;
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_claims_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_owned_execs").await, Some(0));
    assert_eq!(
        rig.owner(exec).await,
        dead,
        "no takeover, no heartbeat: the ownership row is the dead owner's"
    );
    assert_eq!(rig.releases(exec).await, 0);
    assert_eq!(rig.lease_state(exec).await, LeaseState::Active);
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    rig.assert_uncertain("the successor's refusal to take over")
        .await;

    // Certain again: the successor takes over once and finishes.
    rig.certain().await;
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap(),
        "the whole stdout, exactly once"
    );
    assert_eq!(exit, Some(3), "the terminal page is acked");
    let successor = metrics(port).await.unwrap_or_default();
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            2,
            1
        ),
        "taken over once (generation 2), released once; the successor's takeovers {:?}, \
         stale_refused {:?}",
        successor.get("lc_gateway_takeovers_total"),
        successor.get("lc_gateway_stale_refused_total"),
    );
    assert_eq!(
        successor.get("lc_gateway_stale_refused_total"),
        Some(&0),
        "the successor never lost its own ownership"
    );
    let after = rig.owner(exec).await;
    assert_eq!((after.released, after.basis.as_str()), (true, "expired"));
    assert!(after.fence > dead.fence, "{} > {}", after.fence, dead.fence);
    assert_eq!(rig.terminal_acked(exec).await, 1);
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(1));
    assert_eq!(metric(port, "lc_gateway_releases_total").await, Some(1));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_clock_step_takes_nothing_over_and_releases_nothing_while_uncertain() {
    a_clock_step("fwd", FORWARD_STEP_NS, UncertainReason::ClockStepForward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_clock_step_takes_nothing_over_and_releases_nothing_while_uncertain() {
    a_clock_step("bwd", BACKWARD_STEP_NS, UncertainReason::ClockStepBackward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sampler_keeps_the_owner_serving_and_releases_only_on_a_certain_cut() {
    let rig = Rig::new("pause", PAUSE_RECOVERY_GRACE).await;
    // At least 6 s of output: it is still streaming when the readings turn
    // stale (the 2 s gap bound after the pause).
    let (s, want) = support::script(600, "0.01");
    let exec = rig.admit("e-paused", &s).await;
    let first_port = free_port();
    let _first = rig.gateway("owner", first_port);
    rig.wait_for("the owner acks pages", async || {
        rig.acked_pages(exec).await >= 3
    })
    .await;
    let before = rig.owner(exec).await;
    assert_eq!((before.generation, before.basis.as_str()), (1, "unowned"));

    let sampler = rig.sampler.as_ref().unwrap();
    signal(sampler, libc::SIGSTOP);
    let frozen = rig.uncertain_for(UncertainReason::Stale).await;
    let acked_at_stale = rig.acked_pages(exec).await;
    assert_eq!(rig.terminal_acked(exec).await, 0, "the command still runs");
    // The owner's heartbeat renews on the frozen cut: exactly its cut plus
    // the TTL, and there it stays.
    rig.wait_for("the owner heartbeats on the frozen cut", async || {
        rig.owner(exec).await.heartbeat_expiry == frozen.now + HEARTBEAT_TTL
    })
    .await;
    let port = free_port();
    let _second = rig.gateway("successor", port);
    // The owner stages and acks every remaining page while the sampler is
    // stopped, the terminal page included.
    rig.wait_for("the terminal page acked on the stale cut", async || {
        rig.terminal_acked(exec).await == 1
    })
    .await;
    assert!(rig.acked_pages(exec).await > acked_at_stale);
    rig.wait_for("the successor steps on the stale cut", async || {
        metric(port, "lc_gateway_steps_uncertain_total")
            .await
            .is_some_and(|n| n >= SUCCESSOR_STEPS)
    })
    .await;
    // The Lease is not released while the readings are stale, though its
    // terminal page is acked and its owner is alive.
    assert_eq!(rig.releases(exec).await, 0);
    assert_eq!(rig.lease_state(exec).await, LeaseState::Active);
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    assert_eq!(
        metric(first_port, "lc_gateway_releases_total").await,
        Some(0)
    );
    assert_eq!(metric(first_port, "lc_gateway_owned_execs").await, Some(1));
    assert_eq!(
        metric(first_port, "lc_gateway_stale_refused_total").await,
        Some(0)
    );
    rig.every_step_uncertain(port).await;
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_claims_total").await, Some(0));
    assert_eq!(
        rig.owner(exec).await,
        with_heartbeat(&before, frozen.now + HEARTBEAT_TTL),
        "the same ownership, its heartbeat at the frozen cut plus the TTL"
    );
    let r = rig.read().await;
    assert_eq!(
        (r.now, r.uncertain),
        (frozen.now, Some(UncertainReason::Stale)),
        "the cut stayed frozen and stale"
    );

    // The sampler resumes: once the cut is certain the same owner releases.
    signal(sampler, libc::SIGCONT);
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap(),
        "the whole stdout, exactly once"
    );
    assert_eq!(exit, Some(3));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            1,
            1
        ),
        "never taken over (generation 1), released once"
    );
    let after = rig.owner(exec).await;
    assert_eq!(
        (after.fence, after.released, after.basis.as_str()),
        (before.fence, true, "unowned")
    );
    assert_eq!(
        metric(first_port, "lc_gateway_releases_total").await,
        Some(1)
    );
    assert_eq!(
        metric(first_port, "lc_gateway_stale_refused_total").await,
        Some(0)
    );
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_claims_total").await, Some(0));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

/// `o` with its heartbeat expiry at `expiry`.
fn with_heartbeat(o: &OwnerRow, expiry: Timestamp) -> OwnerRow {
    OwnerRow {
        heartbeat_expiry: expiry,
        ..o.clone()
    }
}
