//! The exec gateway on real processes: a real PostgreSQL, a real sampler,
//! a real `little-compute provider` (bubblewrap instances with the
//! supervisor's spool), a real `little-compute worker` and real
//! `little-compute gateway` processes.
//!
//! * For each crash point of the page protocol, a gateway started with
//!   `LC_GATEWAY_CRASH_AT=<point>` kills itself (SIGKILL) there while the
//!   exec streams output; a second gateway takes over once a certain cut
//!   passes the first one's heartbeat expiry. Every page appears exactly
//!   once, in order, with the right SHA-256 (the whole stdout is compared
//!   with what the command wrote), the terminal page is acked, the Lease is
//!   released once and the tenant's units return exactly once.
//! * Stdin input: a gateway started with `LC_GATEWAY_CRASH_AT=after_send`
//!   dies after the supervisor accepted the first input and before its
//!   `send` receipt committed; the successor takes over, delivers that
//!   input again (the supervisor writes each input seq once) and the rest,
//!   and records each. The command, numbering the lines it reads, shows
//!   each input exactly once, in order; the `eof` input ends it; the
//!   terminal page is acked, the Lease released once, the units back once.
//! * A command that ended without reading its stdin: the supervisor
//!   refuses its queued input (`input_closed`), which stays queued, and the
//!   gateway still moves its output and releases its Lease.
//! * While the cut is uncertain (the sampler stopped), a dead gateway's
//!   exec is not taken over by a successor stepping on it; once a new
//!   sampler makes the cut certain the successor takes it over and
//!   finishes it, nothing lost.
//! * A gateway stopped (SIGSTOP) past its heartbeat, resumed (SIGCONT)
//!   after a successor took over: its first write is refused, it counts
//!   one `stale_refused` and forgets the exec; the output is still exactly
//!   once.

mod support;

use std::ops::Deref;
use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use clock::Clock;
use clock::safe_cut::SafeCutClock;
use lc_core::store::ControlStore;
use lc_core::{Digest, ExecId, ExecState, OperationKey, TerminalReason};
use lc_provider::{HttpProvider, Provider as _};
use support::{Plane, Proc, free_port, metric, reading, signal};
use tokio::sync::watch;

/// The gateways' heartbeat TTL: 3 s, so a takeover follows a death within
/// seconds, while a live owner on a loaded machine (the gateway renews
/// every third of the TTL) keeps a margin of 2 s per renewal; at the
/// shortest accepted TTL (1 s) a CI run saw a successor outlive its own
/// heartbeat and take its exec over again (generation 3).
const HEARTBEAT_TTL_MS: &str = "3000";
/// Units of the tenant (one exec of shape `small` holds one).
const UNITS: i64 = 2;
/// The longest any wait of these tests polls for.
const WAIT_MAX: Duration = Duration::from_secs(90);

struct Rig {
    _db: tollgate_pg_harness::TestDb,
    plane: Plane,
    clock: SafeCutClock,
    sampler_stop: watch::Sender<bool>,
    sampler: Option<tokio::task::JoinHandle<()>>,
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
    async fn new(name: &str) -> Rig {
        let p = support::start_plane(&format!("gw-{name}"), UNITS, WAIT_MAX).await;
        let worker = support::spawn_worker(
            &p.plane.url,
            &p.plane.secret,
            &p.plane.provider_url,
            &p.plane.dir.join("worker.log"),
        );
        Rig {
            _db: p.db,
            plane: p.plane,
            clock: p.clock,
            sampler_stop: p.sampler_stop,
            sampler: Some(p.sampler),
            worker: Some(worker),
            provider: Some(p.provider),
        }
    }

    /// Stops the sampler: its last cut goes stale, frozen and uncertain.
    async fn stop_sampler(&mut self) {
        let _ = self.sampler_stop.send(true);
        if let Some(task) = self.sampler.take() {
            tokio::time::timeout(WAIT_MAX, task)
                .await
                .expect("the sampler stops")
                .unwrap();
        }
    }

    /// Starts a new sampler (a new epoch, certain after its recovery).
    fn start_sampler(&mut self) {
        let (stop, task) = support::start_sampler(&self.url);
        self.sampler = Some(task);
        self.sampler_stop = stop;
    }

    fn gateway(&self, name: &str, crash_at: Option<&str>, metrics_port: Option<u16>) -> Proc {
        support::spawn_gateway(&support::GatewayArgs {
            heartbeat_ttl_ms: Some(HEARTBEAT_TTL_MS),
            crash_at,
            metrics_port,
            ..self.gateway_args(name)
        })
    }

    async fn admit(&self, key: &str, script: &str) -> ExecId {
        self.admit_with(key, script, false).await
    }

    /// Admits `sh -c script`, its stdin open for input when `stdin_open`.
    async fn admit_with(&self, key: &str, script: &str, stdin_open: bool) -> ExecId {
        self.plane
            .admit(key, reading(&self.clock).await, script, stdin_open)
            .await
    }

    /// Queues `bytes` (then `eof`) for the stdin of `exec` under `key`;
    /// returns the input seq.
    async fn send_input(&self, key: &str, exec: ExecId, bytes: &[u8], eof: bool) -> i64 {
        self.store
            .send_input(
                &OperationKey::new(key, Digest::of(key.as_bytes())).unwrap(),
                reading(&self.clock).await,
                self.tenant,
                exec,
                bytes,
                eof,
            )
            .await
            .unwrap()
            .input_seq
    }

    async fn finish(mut self) {
        support::assert_audit_clean(&self.store, UNITS).await;
        let _ = self.sampler_stop.send(true);
        drop(self.worker.take());
        drop(self.provider.take());
        let _ = std::fs::remove_dir_all(&self.dir);
        support::remove_cgroup_parent(&self.cgroup_parent);
    }
}

async fn wait_exit(rig: &Rig, p: &mut Proc, what: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + WAIT_MAX;
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}:\n{}",
            rig.logs()
        );
        tokio::time::sleep(support::POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_at_each_crash_point_is_finished_by_a_successor() {
    let rig = Rig::new("crash").await;
    // The points of the page protocol; `after_send` is reached only with
    // input, the hibernation points only by a hibernation, in their own
    // tests.
    let points = lc_gateway::CrashPoint::PAGE_PROTOCOL.into_iter();
    for (round, point) in points.enumerate() {
        let (s, want) = support::script(80, "0.01");
        let exec = rig.admit(&format!("e-{round}"), &s).await;
        let mut first = rig.gateway(&format!("first-{point}"), Some(point.as_str()), None);
        let status = wait_exit(&rig, &mut first, &format!("the gateway dies at {point}")).await;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: {status:?}");
        let log = std::fs::read_to_string(rig.log(&format!("first-{point}"))).unwrap();
        assert!(
            log.contains(&format!("fault injection: SIGKILL at {point}")),
            "{point}: {log}"
        );
        let _second = rig.gateway(&format!("second-{point}"), None, None);
        rig.wait_released(exec).await;
        let (stdout, exit) = rig.output(exec).await;
        assert_eq!(
            String::from_utf8(stdout).unwrap(),
            String::from_utf8(want).unwrap(),
            "{point}: the whole stdout, exactly"
        );
        assert_eq!(exit, Some(3), "{point}: the terminal page is acked");
        assert_eq!(
            rig.settled(exec).await,
            (
                ExecState::Terminal,
                Some(TerminalReason::Exited),
                Some(3),
                2,
                1
            ),
            "{point}: taken over once (generation 2), released once"
        );
        assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0), "{point}");
    }
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_sent_by_a_gateway_killed_before_its_receipt_reaches_the_command_once() {
    let rig = Rig::new("send").await;
    // Numbers each line it reads, so an input written twice would show.
    let script =
        "n=0; while IFS= read -r l; do n=$((n+1)); echo \"$n: $l\"; done; echo done; exit 5";
    let exec = rig.admit_with("e-send", script, true).await;
    assert_eq!(rig.send_input("in-1", exec, b"alpha\n", false).await, 1);
    assert_eq!(rig.send_input("in-2", exec, b"beta two\n", false).await, 2);
    assert_eq!(rig.send_input("in-3", exec, b"gamma\n", false).await, 3);
    let mut first = rig.gateway("first-send", Some("after_send"), None);
    let status = wait_exit(&rig, &mut first, "the gateway dies after its first send").await;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let log = std::fs::read_to_string(rig.log("first-send")).unwrap();
    assert!(
        log.contains("fault injection: SIGKILL at after_send"),
        "{log}"
    );
    let inputs = async || -> Vec<(i64, String, Option<String>)> {
        sqlx::query_as::<_, (i64, String, Option<String>)>(
            "SELECT input_seq, state, send_transition_id FROM lc_exec_inputs \
              WHERE exec_id = $1 ORDER BY input_seq",
        )
        .bind(exec.0)
        .fetch_all(rig.store.pool())
        .await
        .unwrap()
    };
    // Input 1 reached the supervisor, but its receipt never committed.
    assert_eq!(
        inputs().await,
        vec![
            (1, "queued".into(), None),
            (2, "queued".into(), None),
            (3, "queued".into(), None),
        ]
    );
    // More input while no gateway runs: the last closes stdin.
    assert_eq!(rig.send_input("in-4", exec, b"delta\n", true).await, 4);
    let port = free_port();
    let _second = rig.gateway("second-send", None, Some(port));
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        "1: alpha\n2: beta two\n3: gamma\n4: delta\ndone\n",
        "each input exactly once, in order"
    );
    assert_eq!(exit, Some(5), "the terminal page is acked");
    // The successor recorded every input under its own generation,
    // including the one its predecessor delivered.
    assert_eq!(
        inputs().await,
        (1..=4)
            .map(|n| (n, "sent".to_string(), Some(format!("send-1-{n}-g2"))))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        rig.scalar(
            "SELECT count(*) FROM lc_transitions WHERE exec_id = $1 AND kind = 'send'",
            exec
        )
        .await,
        4
    );
    assert_eq!(metric(port, "lc_gateway_inputs_sent_total").await, Some(4));
    assert_eq!(
        metric(port, "lc_gateway_input_bytes_sent_total").await,
        Some(6 + 9 + 6 + 6)
    );
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(5),
            2,
            1
        ),
        "taken over once (generation 2), released once"
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_to_a_command_that_ended_does_not_hold_its_release() {
    let rig = Rig::new("ended").await;
    let exec = rig.admit_with("e-ended", "echo bye; exit 4", true).await;
    let lease = rig
        .store
        .exec(rig.tenant, exec)
        .await
        .unwrap()
        .canonical
        .lease_id;
    let provider = HttpProvider::connect(&rig.provider_url).await.unwrap();
    // No gateway yet: the command runs, ends, and its pages wait in the
    // spool.
    rig.wait_for("the command ends", async || {
        provider
            .spool_status(lease, lc_core::Generation(1))
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s.command_exited && s.terminal_seq > 0)
    })
    .await;
    assert_eq!(rig.send_input("in-late", exec, b"late\n", false).await, 1);
    let port = free_port();
    let _gateway = rig.gateway("ended", None, Some(port));
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(stdout, b"bye\n");
    assert_eq!(exit, Some(4));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(4),
            1,
            1
        )
    );
    // The input was never written: it stays queued, without a receipt.
    assert_eq!(
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT state, send_transition_id FROM lc_exec_inputs WHERE exec_id = $1"
        )
        .bind(exec.0)
        .fetch_all(rig.store.pool())
        .await
        .unwrap(),
        vec![("queued".to_string(), None)]
    );
    assert_eq!(metric(port, "lc_gateway_inputs_sent_total").await, Some(0));
    // Refused once: the gateway stops offering input to a closed stdin.
    let log = std::fs::read_to_string(rig.log("ended")).unwrap();
    assert_eq!(
        log.matches("input_closed: the command's stdin is closed")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(metric(port, "lc_gateway_failures_total").await, Some(0));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}

/// The gateway's `lc_gateway_stale_refused_total` on `port`.
async fn stale_refused(port: u16) -> Option<u64> {
    metric(port, "lc_gateway_stale_refused_total").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_gateway_is_refused_after_a_takeover_and_output_stays_exactly_once() {
    let rig = Rig::new("pause").await;
    let (s, want) = support::script(150, "0.02");
    let exec = rig.admit("e-pause", &s).await;
    let port = free_port();
    let first = rig.gateway("paused", None, Some(port));
    rig.wait_for("the first gateway acks pages", async || {
        rig.acked_pages(exec).await >= 5
    })
    .await;
    assert_eq!(stale_refused(port).await, Some(0));
    signal(&first, libc::SIGSTOP);
    let _second = rig.gateway("successor", None, None);
    rig.wait_released(exec).await;
    // The successor took over (generation 2). On a loaded host its own
    // heartbeat may lapse once and it is owned again (generation 3): each
    // is a takeover the paused gateway's fence is behind; only the paused
    // gateway's generation 1 must be gone.
    let generation = rig.settled(exec).await.3;
    assert!(
        (2..=3).contains(&generation),
        "the successor took over: owner generation {generation}"
    );
    signal(&first, libc::SIGCONT);
    rig.wait_for("the resumed gateway is refused", async || {
        stale_refused(port).await == Some(1)
    })
    .await;
    let log = std::fs::read_to_string(rig.log("paused")).unwrap();
    assert_eq!(log.matches("stale_refused:").count(), 1, "{log}");
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap()
    );
    assert_eq!(exit, Some(3));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            generation,
            1
        )
    );
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    // The resumed gateway owns nothing and stays that way.
    assert_eq!(stale_refused(port).await, Some(1));
    drop(first);
    rig.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_cut_is_uncertain_a_dead_gateway_s_exec_is_not_taken_over() {
    let mut rig = Rig::new("uncertain").await;
    // Long enough to outlast the sampler's stop and the cut's turn to
    // uncertain (the sampling-gap bound, 2 s).
    let (s, want) = support::script(500, "0.01");
    let exec = rig.admit("e-uncertain", &s).await;
    let mut first = rig.gateway("before", None, None);
    rig.wait_for("the first gateway acks pages", async || {
        rig.acked_pages(exec).await >= 3
    })
    .await;
    // The sampler stops: the cut freezes and turns uncertain.
    rig.stop_sampler().await;
    rig.wait_for("an uncertain cut", async || {
        rig.clock.read().await.is_ok_and(|r| !r.is_certain())
    })
    .await;
    first.0.kill().unwrap();
    assert_eq!(first.0.wait().unwrap().signal(), Some(libc::SIGKILL));
    let port = free_port();
    let _second = rig.gateway("during", None, Some(port));
    // Fifty steps of the successor, every one on an uncertain cut: no
    // takeover, no release.
    rig.wait_for("fifty uncertain steps", async || {
        metric(port, "lc_gateway_steps_uncertain_total")
            .await
            .is_some_and(|n| n >= 50)
    })
    .await;
    rig.every_step_uncertain(port).await;
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(0));
    assert_eq!(metric(port, "lc_gateway_owned_execs").await, Some(0));
    let (_, _, _, generation, releases) = rig.settled(exec).await;
    assert_eq!((generation, releases), (1, 0));
    assert_eq!(rig.balance().await, (UNITS, UNITS - 1, 1, 0));
    // A new sampler: once the cut is certain again the successor takes the
    // exec over and finishes it, nothing lost.
    rig.start_sampler();
    rig.wait_released(exec).await;
    let (stdout, exit) = rig.output(exec).await;
    assert_eq!(
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(want).unwrap()
    );
    assert_eq!(exit, Some(3));
    assert_eq!(
        rig.settled(exec).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            2,
            1
        )
    );
    assert_eq!(metric(port, "lc_gateway_takeovers_total").await, Some(1));
    assert_eq!(rig.balance().await, (UNITS, UNITS, 0, 0));
    rig.finish().await;
}
