//! Hibernation and resume while the time authority misbehaves, on real
//! processes: the PostgreSQL server on a fake wall clock of this test
//! binary (its clock stepped while it runs), a real `tollgate-safetime
//! run` sampler process (stopped with SIGSTOP), a real `little-compute
//! provider`, `little-compute worker` and `little-compute gateway`.
//!
//! Nothing is decided idle or expired while the cut is uncertain, and
//! capacity is not returned before a certain cut:
//!
//! * **Idle during a forward step.** An exec with a short idle TTL goes
//!   quiet; the database's clock steps forward before the idle boundary
//!   and the uncertain cut passes the boundary: no hibernation is sealed.
//!   Once the cut is certain it is sealed exactly once (reason `idle`, its
//!   sealed cut past the boundary and past every uncertain cut read), then
//!   parked with its unit back once.
//! * **A paused sampler between the quiescence and the park.** The worker
//!   is stopped while the owner stops, quiesces and commits the
//!   hibernation; then the sampler is stopped until every reading is
//!   stale, and the worker continues: it destroys the instance, but the
//!   Reservation stays charged (balance unchanged, the exec not
//!   hibernated, the Lease `release_pending`). After SIGCONT the
//!   generation is parked once and its unit returned once.
//! * **A resume requested during a forward and a backward step.** The
//!   request is recorded on the uncertain cut; no gateway claims or
//!   prepares it, no Lease or Reservation of the next generation exists
//!   and the attempt stays parked while uncertain. Once certain the resume
//!   completes with exactly one new Lease, one Reservation and one
//!   receipt, and the resumed generation reads the parked files.
//! * **A hibernate-on-timeout deadline passing while the sampler is
//!   paused.** Though the database's wall clock passes the deadline, the
//!   exec is not hibernated while the readings are stale; after SIGCONT it
//!   is hibernated for its deadline exactly once.
//!
//! Every wait polls the database, the clock, the provider or a gateway's
//! `/metrics` with a bound and fails saying what it waited for; nothing is
//! timed.

mod support;

use clock::UncertainReason;
use jiff::Timestamp;
use lc_core::store::ControlStore as _;
use lc_core::{
    CutReading, Digest, ExecId, ExecRequest, ExecState, LeaseState, OnTimeout, OperationKey,
    PageKind, TerminalReason,
};
use lc_provider::Provider as _;
use support::fake_clock::{
    BACKWARD_STEP_NS, FORWARD_STEP_NS, PAUSE_RECOVERY_GRACE, Rig, STEP_RECOVERY_GRACE, UNITS,
};
use support::{free_port, metric, signal};

/// Gateway steps on the uncertain cut (each 20 ms apart, as the worker's)
/// after the moment that matters before a test checks that nothing was
/// decided: the worker stepped on that cut meanwhile.
const UNCERTAIN_STEPS: u64 = 25;
/// The idle TTL of the idle scenario, ms: longer than the time from the
/// exec's last page to the sampler's report of the clock step.
const IDLE_TTL_MS: u64 = 3000;
/// The timeout of the deadline scenario, ms: longer than the time from
/// admission to the sampler's stop.
const TIMEOUT_MS: u64 = 8000;

/// Generation 1 writes a file into its workspace, says `ready` and waits;
/// a resumed generation prints the file and exits 3.
const RESUMABLE: &str = "if [ -e /workspace/kept.txt ]; then cat /workspace/kept.txt; exit 3; fi; \
    printf 'kept across the park\\n' > /workspace/kept.txt; echo ready; exec sleep 1000";

/// The one hibernation row of an exec (`lc_hibernations`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct HibRow {
    reason: String,
    step: String,
    sealed_cut: Timestamp,
}

/// An instant pair as the database stores it.
fn instant(floor_us: i64, submicro_ns: i32) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(floor_us) * 1000 + i128::from(submicro_ns)).unwrap()
}

/// Admits `sh -c RESUMABLE` with `idle_ttl_ms`, `timeout_ms` and
/// `on_timeout`.
async fn admit(
    rig: &Rig,
    key: &str,
    idle_ttl_ms: Option<u64>,
    timeout_ms: Option<u64>,
    on_timeout: OnTimeout,
) -> ExecId {
    let at = rig.certain().await;
    rig.store
        .admit_exec(
            &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
            at,
            rig.tenant,
            &ExecRequest {
                idle_ttl_ms,
                timeout_ms,
                on_timeout,
                ..support::sh_request(RESUMABLE, false)
            },
        )
        .await
        .unwrap()
        .exec_id
}

/// Every hibernation row of `exec`, by generation.
async fn hibernations(rig: &Rig, exec: ExecId) -> Vec<HibRow> {
    let rows: Vec<(String, String, i64, i32)> = sqlx::query_as(
        "SELECT reason, step, sealed_floor_us, sealed_submicro_ns \
           FROM lc_hibernations WHERE exec_id = $1 ORDER BY generation",
    )
    .bind(exec.0)
    .fetch_all(rig.store.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(reason, step, f, s)| HibRow {
            reason,
            step,
            sealed_cut: instant(f, s),
        })
        .collect()
}

/// The exec's last activity (its admission before any), cut time.
async fn last_activity(rig: &Rig, exec: ExecId) -> Timestamp {
    let (f, s): (i64, i32) = sqlx::query_as(
        "SELECT coalesce(last_activity_floor_us, admitted_floor_us), \
                coalesce(last_activity_submicro_ns, admitted_submicro_ns) \
           FROM lc_execs WHERE exec_id = $1",
    )
    .bind(exec.0)
    .fetch_one(rig.store.pool())
    .await
    .unwrap();
    instant(f, s)
}

/// The database server's wall clock (`now()`, faked).
async fn db_now(rig: &Rig) -> Timestamp {
    let us: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM now()) * 1000000)::bigint")
        .fetch_one(rig.store.pool())
        .await
        .unwrap();
    Timestamp::from_microsecond(us).unwrap()
}

/// The exec's state and its current Lease's state.
async fn states(rig: &Rig, exec: ExecId) -> (ExecState, LeaseState) {
    let e = rig.store.exec(rig.tenant, exec).await.unwrap();
    (
        e.state,
        e.lease_state.expect("an admitted exec has a Lease"),
    )
}

/// `SELECT count(*)` of the exec's rows of `table`, `where_` added.
async fn rows(rig: &Rig, exec: ExecId, table: &str, where_: &str) -> i64 {
    rig.scalar(
        &format!("SELECT count(*) FROM {table} WHERE exec_id = $1 {where_}"),
        exec,
    )
    .await
}

/// The stdout of the exec's stored pages, and the kind of each page in
/// seq order (asserting the seqs are 1..=n).
async fn pages(rig: &Rig, exec: ExecId) -> (String, Vec<PageKind>) {
    let sink = lc_blob::LocalBlobStore::open(&rig.blob_dir).unwrap();
    let all = support::all_pages(&rig.store, rig.tenant, exec).await;
    let seqs: Vec<i64> = all.iter().map(|p| p.meta.seq).collect();
    assert_eq!(seqs, (1..=all.len() as i64).collect::<Vec<_>>());
    let mut stdout = Vec::new();
    for p in all.iter().filter(|p| p.meta.kind == PageKind::Stdout) {
        stdout.extend(support::page_bytes(&sink, p));
    }
    (
        String::from_utf8(stdout).unwrap(),
        all.iter().map(|p| p.meta.kind).collect(),
    )
}

/// Starts the gateway `name` with its metrics on a free port and waits
/// until generation 1 of `exec` said `ready`; returns the gateway and its
/// metrics port.
async fn serve_until_ready(rig: &Rig, name: &str, exec: ExecId) -> (support::Proc, u16) {
    let port = free_port();
    let g = rig.gateway(name, port);
    rig.wait_for("generation 1 says ready", async || {
        pages(rig, exec).await.0 == "ready\n"
    })
    .await;
    (g, port)
}

/// Waits until the gateway on `port` stepped [`UNCERTAIN_STEPS`] more
/// times on an uncertain cut.
async fn uncertain_steps(rig: &Rig, port: u16) {
    let mut then = None;
    rig.wait_for("the gateway's metrics", async || {
        then = metric(port, "lc_gateway_steps_uncertain_total").await;
        then.is_some()
    })
    .await;
    let then = then.unwrap();
    rig.wait_for("the gateway steps on the uncertain cut", async || {
        metric(port, "lc_gateway_steps_uncertain_total")
            .await
            .is_some_and(|n| n >= then + UNCERTAIN_STEPS)
    })
    .await;
}

/// Waits until the exec is parked: hibernated, its Lease released.
async fn wait_parked(rig: &Rig, exec: ExecId) {
    rig.wait_for("the exec is parked", async || {
        states(rig, exec).await == (ExecState::Hibernated, LeaseState::Released)
    })
    .await;
}

/// Asserts the parked end of one hibernation of `exec` for `reason`: one
/// row, parked; the unit back once; one snapshot; the gateway counted one
/// hibernation.
async fn assert_parked_once(rig: &Rig, exec: ExecId, reason: &str, port: u16) -> HibRow {
    let h = hibernations(rig, exec).await;
    assert_eq!(h.len(), 1, "one hibernation: {h:?}");
    assert_eq!(
        (h[0].reason.as_str(), h[0].step.as_str()),
        (reason, "parked")
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    assert_eq!(rows(rig, exec, "lc_reservations", "").await, 1);
    assert_eq!(
        rig.store
            .workspace(rig.tenant, exec)
            .await
            .unwrap()
            .snapshots,
        1
    );
    let (stdout, kinds) = pages(rig, exec).await;
    assert_eq!(stdout, "ready\n");
    assert_eq!(kinds.last(), Some(&PageKind::Stopped));
    assert_eq!(metric(port, "lc_gateway_hibernated_total").await, Some(1));
    h[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_boundary_passed_by_an_uncertain_cut_seals_nothing_until_certain() {
    let mut rig = Rig::new("idle", STEP_RECOVERY_GRACE).await;
    let exec = admit(
        &rig,
        "e-idle",
        Some(IDLE_TTL_MS),
        None,
        OnTimeout::Terminate,
    )
    .await;
    let (_g, port) = serve_until_ready(&rig, "owner", exec).await;
    let boundary =
        last_activity(&rig, exec).await + jiff::SignedDuration::from_millis(IDLE_TTL_MS as i64);

    let before = rig.certain().await;
    assert!(
        before.cut < boundary,
        "the clock is stepped before the idle boundary {boundary}: {before:?}"
    );
    rig.step_clock(FORWARD_STEP_NS);
    rig.uncertain_for(UncertainReason::ClockStepForward).await;
    assert_eq!(hibernations(&rig, exec).await, vec![]);
    rig.wait_for("an uncertain cut past the idle boundary", async || {
        let r = rig.read().await;
        assert!(
            r.uncertain.is_some(),
            "the cut turned certain before it passed the idle boundary {boundary}: {r:?}"
        );
        r.now >= boundary
    })
    .await;
    uncertain_steps(&rig, port).await;
    assert_eq!(hibernations(&rig, exec).await, vec![], "nothing sealed");
    assert_eq!(
        last_activity(&rig, exec).await + jiff::SignedDuration::from_millis(IDLE_TTL_MS as i64),
        boundary
    );
    assert_eq!(
        states(&rig, exec).await,
        (ExecState::Running, LeaseState::Active)
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    assert_eq!(metric(port, "lc_gateway_hibernated_total").await, Some(0));
    let last_uncertain = rig.assert_uncertain("the idle exec's check").await.now;

    // Certain again: sealed once, on a certain cut past the boundary.
    rig.certain().await;
    wait_parked(&rig, exec).await;
    let h = assert_parked_once(&rig, exec, "idle", port).await;
    assert!(
        h.sealed_cut >= boundary && h.sealed_cut >= last_uncertain,
        "sealed at {} on a certain cut: past the boundary {boundary} and the last uncertain \
         cut {last_uncertain}",
        h.sealed_cut
    );
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiesced_generation_keeps_its_reservation_until_a_certain_cut() {
    let rig = Rig::new("park", PAUSE_RECOVERY_GRACE).await;
    let exec = admit(&rig, "e-park", None, None, OnTimeout::Terminate).await;
    let (_g, port) = serve_until_ready(&rig, "owner", exec).await;
    let http = support::connect_provider(&rig.provider_url, rig.wait_max).await;
    assert_eq!(http.inventory().await.unwrap().len(), 1);

    // The worker waits while the owner stops, quiesces and commits.
    let worker = rig.worker.as_ref().unwrap();
    signal(worker, libc::SIGSTOP);
    let at = rig.certain().await;
    rig.store
        .request_hibernation(
            &OperationKey::new("h-1", Digest::of(b"h-1")).unwrap(),
            at,
            rig.tenant,
            exec,
        )
        .await
        .unwrap();
    rig.wait_for("the quiescence committed", async || {
        hibernations(&rig, exec)
            .await
            .first()
            .is_some_and(|h| h.step == "quiesced")
    })
    .await;
    assert_eq!(metric(port, "lc_gateway_hibernated_total").await, Some(1));
    assert_eq!(
        states(&rig, exec).await,
        (ExecState::Running, LeaseState::ReleasePending)
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));

    // The sampler stops; once every reading is stale the worker goes on.
    let sampler = rig.sampler.as_ref().unwrap();
    signal(sampler, libc::SIGSTOP);
    let frozen = rig.uncertain_for(UncertainReason::Stale).await;
    signal(worker, libc::SIGCONT);
    rig.wait_for(
        "the worker destroys the instance on the stale cut",
        async || http.inventory().await.unwrap().is_empty(),
    )
    .await;
    uncertain_steps(&rig, port).await;
    // Destroyed, but nothing is proven on a stale cut: still charged.
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    assert_eq!(
        states(&rig, exec).await,
        (ExecState::Running, LeaseState::ReleasePending)
    );
    let h = hibernations(&rig, exec).await;
    assert_eq!(
        (h.len(), h[0].reason.as_str(), h[0].step.as_str()),
        (1, "requested", "quiesced")
    );
    let r = rig.read().await;
    assert_eq!(
        (r.now, r.uncertain),
        (frozen.now, Some(UncertainReason::Stale)),
        "the cut stayed frozen and stale"
    );

    // The sampler resumes: parked once, the unit back once.
    signal(sampler, libc::SIGCONT);
    wait_parked(&rig, exec).await;
    assert_parked_once(&rig, exec, "requested", port).await;
    rig.finish().await;
}

/// A resume requested on the uncertain cut of a step of `step_ns`
/// (reported as `reason`) waits for a certain cut, then completes once.
async fn a_resume_during_a_step(name: &str, step_ns: i64, reason: UncertainReason) {
    let mut rig = Rig::new(name, STEP_RECOVERY_GRACE).await;
    let exec = admit(&rig, &format!("e-{name}"), None, None, OnTimeout::Terminate).await;
    let (_g, port) = serve_until_ready(&rig, "owner", exec).await;
    let at = rig.certain().await;
    rig.store
        .request_hibernation(
            &OperationKey::new("h-1", Digest::of(b"h-1")).unwrap(),
            at,
            rig.tenant,
            exec,
        )
        .await
        .unwrap();
    wait_parked(&rig, exec).await;
    assert_parked_once(&rig, exec, "requested", port).await;
    let head = rig
        .store
        .workspace(rig.tenant, exec)
        .await
        .unwrap()
        .head
        .unwrap();
    let claims = metric(port, "lc_gateway_claims_total").await;

    rig.step_clock(step_ns);
    let r = rig.uncertain_for(reason).await;
    let key = "r-1";
    let intent = rig
        .store
        .request_resume(
            &OperationKey::new(
                key,
                lc_core::hibernate::resume_request_sha256(exec, Some(head)),
            )
            .unwrap(),
            CutReading {
                cut: r.now,
                certain: false,
                retry_after_s: 1,
            },
            rig.tenant,
            exec,
            Some(head),
        )
        .await
        .unwrap();
    assert_eq!(
        (intent.from_generation.0, intent.head, intent.refused),
        (1, head, None)
    );
    uncertain_steps(&rig, port).await;
    // While uncertain: not claimed, not prepared, no new Lease or
    // Reservation, the attempt parked.
    assert_eq!(metric(port, "lc_gateway_claims_total").await, claims);
    assert_eq!(
        metric(port, "lc_gateway_resumes_prepared_total").await,
        Some(0)
    );
    assert_eq!(rows(&rig, exec, "lc_sandbox_leases", "").await, 1);
    assert_eq!(rows(&rig, exec, "lc_reservations", "").await, 1);
    assert_eq!(rows(&rig, exec, "lc_resume_receipts", "").await, 0);
    assert_eq!(
        rows(
            &rig,
            exec,
            "lc_resume_intents",
            "AND prepared_lease_id IS NULL"
        )
        .await,
        1
    );
    assert_eq!(
        states(&rig, exec).await,
        (ExecState::Hibernated, LeaseState::Released)
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.assert_uncertain("the parked exec's check").await;

    // Certain again: the resume completes once and the files are back.
    rig.certain().await;
    rig.wait_released(exec).await;
    let (stdout, kinds) = pages(&rig, exec).await;
    assert_eq!(stdout, "ready\nkept across the park\n");
    assert_eq!(kinds.iter().filter(|k| **k == PageKind::Stopped).count(), 1);
    assert_eq!(kinds.last(), Some(&PageKind::Terminal));
    let e = rig.store.exec(rig.tenant, exec).await.unwrap();
    assert_eq!(
        (e.state, e.terminal_reason, e.exit_code),
        (ExecState::Terminal, Some(TerminalReason::Exited), Some(3))
    );
    assert_eq!(
        rows(&rig, exec, "lc_sandbox_leases", "AND generation = 2").await,
        1
    );
    assert_eq!(rows(&rig, exec, "lc_sandbox_leases", "").await, 2);
    assert_eq!(
        rows(&rig, exec, "lc_reservations", "AND generation = 2").await,
        1
    );
    assert_eq!(rows(&rig, exec, "lc_reservations", "").await, 2);
    assert_eq!(rows(&rig, exec, "lc_resume_receipts", "").await, 1);
    assert_eq!(
        metric(port, "lc_gateway_resumes_prepared_total").await,
        Some(1)
    );
    assert_eq!(
        metric(port, "lc_gateway_resumes_committed_total").await,
        Some(1)
    );
    assert_eq!(
        metric(port, "lc_gateway_resumes_refused_total").await,
        Some(0)
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_requested_during_a_forward_step_waits_for_a_certain_cut() {
    a_resume_during_a_step("rfwd", FORWARD_STEP_NS, UncertainReason::ClockStepForward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_requested_during_a_backward_step_waits_for_a_certain_cut() {
    a_resume_during_a_step("rbwd", BACKWARD_STEP_NS, UncertainReason::ClockStepBackward).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernate_deadline_passed_while_the_sampler_is_paused_waits_for_a_certain_cut() {
    let rig = Rig::new("deadline", PAUSE_RECOVERY_GRACE).await;
    let exec = admit(
        &rig,
        "e-deadline",
        None,
        Some(TIMEOUT_MS),
        OnTimeout::Hibernate,
    )
    .await;
    let (_g, port) = serve_until_ready(&rig, "owner", exec).await;
    let deadline = rig
        .store
        .exec(rig.tenant, exec)
        .await
        .unwrap()
        .timeout_deadline
        .unwrap();

    let sampler = rig.sampler.as_ref().unwrap();
    signal(sampler, libc::SIGSTOP);
    let frozen = rig.uncertain_for(UncertainReason::Stale).await;
    assert!(
        frozen.now < deadline,
        "the sampler stopped after the deadline {deadline}: {frozen:?}"
    );
    assert!(last_activity(&rig, exec).await < deadline);
    rig.wait_for("the database's clock passes the deadline", async || {
        db_now(&rig).await > deadline
    })
    .await;
    uncertain_steps(&rig, port).await;
    assert_eq!(hibernations(&rig, exec).await, vec![], "nothing sealed");
    assert_eq!(
        states(&rig, exec).await,
        (ExecState::Running, LeaseState::Active)
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    assert_eq!(metric(port, "lc_gateway_hibernated_total").await, Some(0));
    let r = rig.read().await;
    assert_eq!(
        (r.now, r.uncertain),
        (frozen.now, Some(UncertainReason::Stale)),
        "the cut stayed frozen and stale"
    );

    signal(sampler, libc::SIGCONT);
    wait_parked(&rig, exec).await;
    let h = assert_parked_once(&rig, exec, "deadline", port).await;
    assert!(h.sealed_cut >= deadline, "{} >= {deadline}", h.sealed_cut);
    assert_eq!(
        rig.store
            .exec(rig.tenant, exec)
            .await
            .unwrap()
            .terminal_reason,
        None
    );
    rig.finish().await;
}
