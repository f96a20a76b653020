//! The rig of the process tests on a fake database clock: one PostgreSQL
//! server on a fake wall clock (libfaketime) per test binary, its clock
//! stepped while it runs, a real `tollgate-safetime run` sampler process, a
//! real `little-compute provider` and `little-compute worker`, and the
//! test's gateways; [`Rig`] reads the cut (never backward) and the
//! database's rows the checks are made of.

use std::ops::Deref;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clock::safe_cut::SafeCutClock;
use clock::{Clock, ClockReading, UncertainReason};
use jiff::{SignedDuration, Timestamp};
use lc_core::store::ControlStore;
use lc_core::{CutReading, ExecId, LeaseState};
use tollgate_pg_harness::PgServer;

use super::{GAP_MAX, POLL, Plane, Proc, exe, free_port};

/// The gateways' heartbeat TTL: the shortest accepted, so a certain cut
/// would pass a dead owner's heartbeat within about a second.
pub const HEARTBEAT_TTL: SignedDuration = SignedDuration::from_secs(1);
/// [`HEARTBEAT_TTL`] as `--heartbeat-ttl-ms` takes it.
pub const HEARTBEAT_TTL_MS: &str = "1000";
/// Units of the tenant (one exec of shape `small` holds one).
pub const UNITS: i64 = 2;
/// The longest any wait of these tests polls for.
pub const WAIT_MAX: Duration = Duration::from_secs(120);
/// The sampler's recovery grace in the clock-step scenarios: how long the
/// cut stays uncertain after a step (after a backward step the cut stands
/// until database time passes it again). Long enough for every check a
/// test makes on the uncertain cut; a test whose checks end after the cut
/// turned certain again fails saying so ([`Rig::assert_uncertain`]).
pub const STEP_RECOVERY_GRACE: &str = "12s";
/// The recovery grace in the paused-sampler scenarios, where the test
/// itself decides how long the cut stays uncertain.
pub const PAUSE_RECOVERY_GRACE: &str = "500ms";
/// The size of the forward step of the database's wall clock, ns.
pub const FORWARD_STEP_NS: i64 = 120 * 1_000_000_000;
/// The size of the backward step, ns (the cut stands this long).
pub const BACKWARD_STEP_NS: i64 = -2 * 1_000_000_000;

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

/// An exec's ownership row (`lc_exec_owners`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRow {
    /// The owner generation.
    pub generation: i64,
    /// The fence.
    pub fence: i64,
    /// Whether the ownership is released.
    pub released: bool,
    /// How the ownership was taken (`unowned`, `expired`, ...).
    pub basis: String,
    /// The heartbeat expiry, cut time.
    pub heartbeat_expiry: Timestamp,
}

/// One test's rig on the fake-clock server: its [`Plane`], the clock the
/// test reads, and the sampler, worker and provider processes (stopped
/// when dropped).
pub struct Rig {
    server: tokio::sync::MutexGuard<'static, Option<PgServer>>,
    pub plane: Plane,
    pub clock: SafeCutClock,
    /// The latest cut this test read: no later read may be earlier.
    last_cut: std::sync::Mutex<Option<Timestamp>>,
    /// The sampler process.
    pub sampler: Option<Proc>,
    /// The worker process.
    pub worker: Option<Proc>,
    /// The provider process.
    pub provider: Option<Proc>,
    /// The sampler's recovery grace, as its `--recovery-grace` takes it.
    pub recovery_grace: String,
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
    pub async fn new(name: &str, recovery_grace: &str) -> Rig {
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
        let dir = super::fresh_dir(&format!("lcclock-{name}"));
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
                .stderr(super::append(&dir.join("sampler.log")))
                .spawn()
                .unwrap(),
        );
        let store = super::connect_store(&url, super::store_config()).await;
        let clock = SafeCutClock::new(store.pool().clone(), GAP_MAX);
        let secret = super::write_secret(&dir);
        let cgroup_parent = format!("lc-clock-{name}-{}", std::process::id());
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
            recovery_grace: recovery_grace.to_owned(),
            worker: None,
            provider: None,
        };
        rig.wait_for("a certain cut", async || {
            rig.read().await.uncertain.is_none()
        })
        .await;
        let port = free_port();
        rig.plane.provider_url = format!("http://127.0.0.1:{port}");
        rig.provider = Some(super::spawn_provider(
            port,
            &rig.dir,
            &rig.cgroup_parent,
            "provider.log",
        ));
        let http = super::connect_provider(&rig.provider_url, WAIT_MAX).await;
        let at = rig.certain().await;
        rig.plane.tenant = super::register_base_provider_and_tenant(
            &rig.store,
            at,
            &http,
            &rig.provider_url,
            UNITS,
        )
        .await;
        rig.worker = Some(super::spawn_worker(
            &rig.url,
            &rig.secret,
            &rig.provider_url,
            &rig.dir.join("worker.log"),
        ));
        rig
    }
    /// One reading of the clock; asserts that the cut did not go backward
    /// since the previous reading of this test.
    pub async fn read(&self) -> ClockReading {
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
    pub async fn certain(&self) -> CutReading {
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
    /// since the cut turned uncertain happened while it was. Returns that
    /// reading.
    pub async fn assert_uncertain(&self, what: &str) -> ClockReading {
        let r = self.read().await;
        assert!(
            r.uncertain.is_some(),
            "the cut turned certain again before {what} was checked (the recovery grace \
             {} was too short for this machine): {r:?}",
            self.recovery_grace
        );
        r
    }

    /// Waits for an uncertain reading for `reason`; returns it.
    pub async fn uncertain_for(&self, reason: UncertainReason) -> ClockReading {
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
    pub fn step_clock(&mut self, step_ns: i64) {
        let server = self.server.as_mut().unwrap();
        let offset = server.clock_offset_ns().expect("a fake clock");
        server.set_clock_offset_ns(offset + step_ns).unwrap();
    }

    pub fn gateway(&self, name: &str, metrics_port: u16) -> Proc {
        super::spawn_gateway(&super::GatewayArgs {
            heartbeat_ttl_ms: Some(HEARTBEAT_TTL_MS),
            metrics_port: Some(metrics_port),
            ..self.gateway_args(name)
        })
    }

    pub async fn admit(&self, key: &str, script: &str) -> ExecId {
        self.plane
            .admit(key, self.certain().await, script, false)
            .await
    }

    /// Acked terminal pages of `exec` (0 or 1).
    pub async fn terminal_acked(&self, exec: ExecId) -> i64 {
        self.scalar(
            "SELECT count(*) FROM lc_output_pages \
              WHERE exec_id = $1 AND state = 'acked' AND kind = 'terminal'",
            exec,
        )
        .await
    }

    pub async fn owner(&self, exec: ExecId) -> OwnerRow {
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

    pub async fn lease_state(&self, exec: ExecId) -> LeaseState {
        self.store
            .exec(self.tenant, exec)
            .await
            .unwrap()
            .lease_state
            .expect("an admitted exec has a Lease")
    }

    /// Asserts that Tollgate's audit is clean with every unit back, then
    /// removes the rig's files (dropping it stops its processes).
    pub async fn finish(self) {
        super::assert_audit_clean(&self.store, UNITS).await;
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
        for c in ["memory", "pids", "cpu", "cpuacct"] {
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
