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

use std::os::unix::process::ExitStatusExt as _;

use clock::UncertainReason;
use jiff::Timestamp;
use lc_core::{ExecState, LeaseState, TerminalReason};
use support::fake_clock::{
    BACKWARD_STEP_NS, FORWARD_STEP_NS, HEARTBEAT_TTL, OwnerRow, PAUSE_RECOVERY_GRACE, Rig,
    STEP_RECOVERY_GRACE, UNITS,
};
use support::{free_port, metric, metrics, signal};

/// Steps of the successor, each on an uncertain cut past the dead owner's
/// heartbeat expiry, before the test checks that it took nothing over.
const SUCCESSOR_STEPS: u64 = 25;

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
