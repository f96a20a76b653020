//! A supervisor that stops answering costs only its own exec: on real
//! parts (see `support`), four instances' supervisors are stopped with a
//! real `SIGSTOP` (their sockets still accept, no request is answered)
//! while another exec streams output through the same gateway, once with
//! the execs served one at a time and once served at once. Every provider
//! call of the stalled execs hits the gateway's bound and is counted; the
//! other exec keeps its first ownership (no heartbeat of any exec lapses),
//! gets every page once in order and is released; after `SIGCONT` the
//! stalled execs finish too, still under their first ownership.

mod support;

use jiff::SignedDuration;
use lc_core::ExecId;
use lc_core::page::ExitStatus;
use lc_gateway::{GatewayOptions, PROVIDER_CALL_TIMEOUT_DEFAULT};
use support::Rig;

/// The heartbeat TTL of this test: the default provider call bound (1 s)
/// is a third of it.
const TTL: SignedDuration = SignedDuration::from_secs(3);
/// Stalled execs: at the default bound each costs its step at least 1 s,
/// so served one at a time four of them keep the step serving longer than
/// the TTL: every exec served after them, and the last of them, keeps its
/// ownership only because the keeper renews it meanwhile. (Without a
/// bound, each cost the supervisor socket's own 10 s timeout.)
const STALLED: usize = 4;
/// A bound on the steps a test drives.
const STEPS_MAX: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_supervisors_served_one_at_a_time_cost_no_other_exec_its_ownership() {
    stopped_supervisors(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_supervisors_served_at_once_cost_no_other_exec_its_ownership() {
    stopped_supervisors(lc_gateway::SERVE_CONCURRENCY_DEFAULT).await;
}

/// The scenario of the module docs, `serve_concurrency` execs served at once.
async fn stopped_supervisors(serve_concurrency: usize) {
    let f = Rig::start_with_units(STALLED as i64 + 1).await;
    // The stalled execs are admitted first, so they are served before the
    // other one in every step.
    let mut stalled = Vec::new();
    for i in 0..STALLED {
        let e = f
            .run_keyed(
                &format!("stalled-{i}"),
                &["sh", "-c", &format!("printf 'stalled {i}'")],
                false,
            )
            .await;
        stalled.push(e);
    }
    // The other exec writes two pages, pauses for a TTL, then two more:
    // its output arrives over several steps.
    let (other, expected) = f.stream(4, 2, 3).await;
    assert!(stalled.iter().all(|s| s.id < other.id));
    for &s in &stalled {
        f.spool_when(s, |st| st.terminal_seq == 2).await;
        f.signal_supervisor(s, "STOP");
    }

    let g = f.gateway(GatewayOptions {
        heartbeat_ttl: TTL,
        serve_concurrency,
        ..GatewayOptions::default()
    });
    let stalled_ids: Vec<ExecId> = stalled.iter().map(|s| s.id).collect();
    let mut steps = 0;
    let mut other_pages = 0;
    let mut first_owner = None;
    while f.receipts(other, "release").await.is_empty() {
        assert!(steps < STEPS_MAX, "not released within {STEPS_MAX} steps");
        let r = g.step().await;
        steps += 1;
        // Exactly one bounded call per stalled exec and step, nothing else.
        let failed: Vec<(Option<ExecId>, &str)> = r
            .failures
            .iter()
            .map(|x| (x.exec_id, x.code.as_str()))
            .collect();
        let want: Vec<(Option<ExecId>, &str)> = stalled_ids
            .iter()
            .map(|id| (Some(*id), "provider_timeout"))
            .collect();
        assert_eq!(failed, want, "step {steps}");
        assert_eq!(
            r.failures[0].message,
            format!(
                "the provider's pages call did not answer within {PROVIDER_CALL_TIMEOUT_DEFAULT:?}; the exec is served again at the next step"
            )
        );
        assert_eq!(r.provider_timeouts, STALLED, "step {steps}");
        assert_eq!((r.stale_refused, r.taken_over), (0, 0), "step {steps}");
        if steps == 1 {
            assert_eq!(r.claimed, STALLED + 1);
        }
        other_pages += r.pages_acked;
        // The other exec is still under its first ownership: generation 1
        // and the fence it was claimed with.
        let owner = f.owner(other).await;
        assert_eq!(owner.0, 1, "step {steps}");
        assert_eq!(owner, *first_owner.get_or_insert(owner), "step {steps}");
    }
    // Four data pages and the terminal page, each once.
    assert_eq!(other_pages, 5);
    assert_eq!(f.page_counts(other).await, (5, 5));
    assert_eq!(
        f.output(other).await,
        (expected, Some(ExitStatus::exited(3)))
    );
    assert_eq!(f.receipts(other, "release").await.len(), 1);
    f.supervisor_done(other).await;
    let m = g.metrics().snapshot();
    assert_eq!(
        (
            m.provider_timeouts,
            m.failures,
            m.stale_refused,
            m.takeovers
        ),
        ((STALLED * steps) as u64, (STALLED * steps) as u64, 0, 0)
    );
    let mut stalled_owners = Vec::new();
    for &s in &stalled {
        // Renewed throughout, never taken over, nothing of it acked yet.
        let owner = f.owner(s).await;
        assert_eq!(owner.0, 1);
        stalled_owners.push(owner);
        assert_eq!(f.page_counts(s).await, (0, 0));
    }

    // Continued, the stalled execs finish under their first ownership.
    for &s in &stalled {
        f.signal_supervisor(s, "CONT");
    }
    let mut more = 0;
    loop {
        let mut left = 0;
        for &s in &stalled {
            if f.receipts(s, "release").await.is_empty() {
                left += 1;
            }
        }
        if left == 0 {
            break;
        }
        assert!(more < STEPS_MAX, "not released within {STEPS_MAX} steps");
        let r = g.step().await;
        more += 1;
        assert_eq!((r.failures, r.provider_timeouts), (vec![], 0));
    }
    for (i, &s) in stalled.iter().enumerate() {
        assert_eq!(f.owner(s).await, stalled_owners[i]);
        assert_eq!(
            f.output(s).await,
            (
                format!("stalled {i}").into_bytes(),
                Some(ExitStatus::exited(0))
            )
        );
        assert_eq!(f.receipts(s, "release").await.len(), 1);
        f.supervisor_done(s).await;
    }
    let m = g.metrics().snapshot();
    assert_eq!(
        (m.provider_timeouts, m.releases, m.stale_refused),
        ((STALLED * steps) as u64, STALLED as u64 + 1, 0)
    );
}
