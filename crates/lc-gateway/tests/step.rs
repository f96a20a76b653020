//! `Gateway::step` on real parts: `LcStore` on a PostgreSQL cluster the
//! tests start (a fresh database each), the safe-cut clock read from the
//! cut a real in-process sampler publishes, the real bubblewrap provider
//! running real commands under real supervisors, and the real local sink
//! (see `support`). Uncertainty and expiry come from the published cut:
//! a sampler restarted with a long recovery grace, a certain cut passing a
//! short heartbeat TTL. Crash points are driven by a fault hook that
//! records the point (the gateway then abandons its step, as if it had
//! died there); the real-process tests kill it instead.

mod support;

use std::sync::{Arc, Mutex};

use lc_blob::BlobStore as _;
use lc_core::owner::{OwnerCredential, OwnerFence, OwnerToken, PageMeta};
use lc_core::page::{ExitStatus, Page};
use lc_core::store::GatewayStore;
use lc_core::{AttemptNo, Digest, LeaseState, PageKind, TerminalReason};
use lc_gateway::{CrashPoint, FaultHook, Gateway, GatewayOptions};
use lc_provider::Provider;
use support::{Forging, Rig, TTL};

#[derive(Default)]
struct Recorder(Mutex<Vec<CrashPoint>>);

impl FaultHook for Recorder {
    fn reached(&self, point: CrashPoint) {
        self.0.lock().unwrap().push(point);
    }
}

const EXITED: (Option<TerminalReason>, LeaseState) =
    (Some(TerminalReason::Exited), LeaseState::ReleasePending);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_step_moves_every_page_exactly_once_then_releases() {
    let f = Rig::start().await;
    let (e, expected) = f.streamed(5).await;
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (
            r.claimed,
            r.taken_over,
            r.pages_staged,
            r.pages_acked,
            r.bytes_acked
        ),
        (1, 0, 6, 6, 5000)
    );
    assert_eq!((r.supervisor_acks, r.released, r.owned), (1, 1, 0));
    assert_eq!(f.output(e).await, (expected, Some(ExitStatus::exited(3))));
    assert_eq!(f.releases(e).await, (1, EXITED.0, EXITED.1));
    f.supervisor_done(e).await;
    let m = g.metrics().snapshot();
    assert_eq!(
        (m.claims, m.pages_acked, m.bytes_acked, m.releases),
        (1, 6, 5000, 1)
    );
    assert_eq!((m.owned_execs, m.ack_latency_count), (0, 1));
    // Nothing more to do: a released exec is never claimed again.
    let r = g.step().await;
    assert_eq!((r.claimed, r.owned, r.pages_acked), (0, 0, 0));
    assert_eq!(f.releases(e).await.0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_bounded_per_exec_and_step() {
    let f = Rig::start().await;
    let (e, expected) = f.streamed(150).await;
    let g = f.gateway(GatewayOptions {
        heartbeat_ttl: TTL,
        owned_max: 1,
        pages_per_step: 64,
        ..GatewayOptions::default()
    });
    // Each step acks the supervisor once: through 64, 128, then the
    // terminal page 151, after which the supervisor exits.
    let r = g.step().await;
    assert_eq!((r.pages_acked, r.supervisor_acks, r.released), (64, 1, 0));
    assert_eq!(f.spool(e).await.acked_through, 64);
    let r = g.step().await;
    assert_eq!((r.heartbeats, r.pages_acked, r.released), (1, 64, 0));
    assert_eq!(
        (r.supervisor_acks, f.spool(e).await.acked_through),
        (1, 128)
    );
    let r = g.step().await;
    // 22 data pages and the terminal page.
    assert_eq!((r.pages_acked, r.released), (23, 1));
    assert_eq!(r.supervisor_acks, 1);
    f.supervisor_done(e).await;
    assert_eq!(f.output(e).await, (expected, Some(ExitStatus::exited(3))));
}

/// A gateway dies at `point`; a second one takes over once a certain cut
/// passes the first one's heartbeat expiry and finishes exactly once; the
/// first one, resumed, is refused on its first write and forgets the exec.
async fn crash_and_take_over(point: CrashPoint) {
    let mut f = Rig::start().await;
    let (e, expected) = f.streamed(5).await;
    let hook = Arc::new(Recorder::default());
    let a = f
        .default_gateway()
        .with_crash_point(Some(point), hook.clone());
    let r = a.step().await;
    assert_eq!(r.crashed, Some(point));
    assert_eq!(*hook.0.lock().unwrap(), vec![point]);
    let expiry = r.at.unwrap().cut + TTL;
    let (staged, acked) = f.page_counts(e).await;
    assert_eq!(staged, 6, "{point}");
    let want_acked = match point {
        CrashPoint::AfterMetadata | CrashPoint::AfterSink => 0,
        CrashPoint::AfterAckResult | CrashPoint::BeforeSupervisorAck => 6,
        CrashPoint::AfterSend => unreachable!("this exec has no input"),
        p => unreachable!("{p} is reached only by a hibernation"),
    };
    assert_eq!(acked, want_acked, "{point}");
    // The spool still holds every page: nothing was acked to the supervisor.
    assert_eq!(f.spooled(e).await, vec![1, 2, 3, 4, 5, 6]);

    let b = f.default_gateway();
    // While the first owner's heartbeat is live nothing is taken over.
    let r = b.step().await;
    let at = r.at.unwrap();
    assert!(at.certain && at.cut < expiry, "{at:?}");
    assert_eq!((r.claimed, r.taken_over, r.owned), (0, 0, 0));
    // Past it, but on an uncertain cut: still nothing.
    f.uncertain_past(expiry).await;
    let r = b.step().await;
    let at = r.at.unwrap();
    assert!(!at.certain && at.cut > expiry, "{at:?}");
    assert_eq!((r.taken_over, r.owned), (0, 0));
    // On a certain cut past the expiry: taken over, finished, released.
    f.certain_again().await;
    let r = b.step().await;
    assert_eq!(r.failures, vec![], "{point}");
    assert_eq!((r.taken_over, r.released), (1, 1), "{point}");
    assert_eq!(r.pending_finished, 6 - want_acked as usize, "{point}");
    assert_eq!(r.pages_staged, 0, "{point}");
    // The supervisor was told once, through the terminal page.
    assert_eq!(r.supervisor_acks, 1, "{point}");
    assert_eq!(
        f.output(e).await,
        (expected.clone(), Some(ExitStatus::exited(3)))
    );
    assert_eq!(f.releases(e).await, (1, EXITED.0, EXITED.1));
    f.supervisor_done(e).await;
    assert_eq!(b.metrics().snapshot().takeovers, 1);

    // The first gateway comes back: its heartbeat is refused, it forgets
    // the exec, and nothing changes.
    let r = a.step().await;
    assert_eq!(
        (r.stale_refused, r.owned, r.pages_acked, r.supervisor_acks),
        (1, 0, 0, 0),
        "{point}"
    );
    assert_eq!(a.metrics().snapshot().stale_refused, 1);
    assert_eq!(f.output(e).await, (expected, Some(ExitStatus::exited(3))));
    assert_eq!(f.releases(e).await.0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_metadata_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::AfterMetadata).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_sink_write_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::AfterSink).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_ack_result_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::AfterAckResult).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_supervisor_ack_is_finished_by_the_successor() {
    crash_and_take_over(CrashPoint::BeforeSupervisorAck).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_is_refused_on_every_write_after_a_takeover() {
    let f = Rig::start().await;
    // Only the first two pages are there yet: the command pauses past the
    // heartbeat TTL after its second page.
    let (e, _) = f.stream(3, 2, 8).await;
    f.spool_when(e, |s| s.pages == 2).await;
    let a = f.default_gateway();
    let r = a.step().await;
    assert_eq!((r.claimed, r.pages_acked, r.released), (1, 2, 0));
    let expiry = r.at.unwrap().cut + TTL;
    // `a` stalls past its heartbeat; `b` takes over and finishes.
    f.spool_when(e, |s| s.terminal_seq == 4).await;
    f.certain_at(expiry).await;
    let b = f.default_gateway();
    let r = b.step().await;
    assert_eq!((r.taken_over, r.pages_acked, r.released), (1, 2, 1));
    let before = f.output(e).await;
    let r = a.step().await;
    assert_eq!(
        (r.stale_refused, r.owned, r.pages_acked, r.released),
        (1, 0, 0, 0)
    );
    assert_eq!(f.refused("owner_stale"), Some(1));
    assert_eq!(f.output(e).await, before);
    assert_eq!(f.releases(e).await.0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_heartbeat_expired_is_refused_and_forgets_the_exec() {
    let f = Rig::start().await;
    let (e, _) = f.streamed(1).await;
    f.supervisor_reachable(e, false);
    let a = f.default_gateway();
    let r = a.step().await;
    assert_eq!(r.claimed, 1);
    assert_eq!(r.failures[0].code, "supervisor_unavailable");
    let expiry = r.at.unwrap().cut + TTL;
    // No step ran for a whole TTL: the heartbeat is refused as expired.
    f.certain_at(expiry).await;
    // In the same step, the exec is free to take: this gateway takes it
    // again as a new ownership (the next generation and fence).
    let r = a.step().await;
    assert_eq!((r.stale_refused, r.heartbeats, r.taken_over), (1, 0, 1));
    assert_eq!(f.refused("owner_expired"), Some(1));
    assert_eq!(f.owner(e).await, (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_uncertain_the_owner_keeps_serving_but_nothing_is_claimed_or_released() {
    let mut f = Rig::start().await;
    let (e, expected) = f.streamed(2).await;
    let now = f.wait_reading(|_| true).await.cut;
    f.uncertain_past(now).await;
    let g = f.default_gateway();
    let r = g.step().await;
    assert!(!r.at.unwrap().certain);
    assert_eq!((r.claimed, r.owned), (0, 0));
    f.certain_again().await;
    f.supervisor_reachable(e, false);
    let r = g.step().await;
    assert_eq!(r.claimed, 1);
    let expiry = r.at.unwrap().cut + TTL;
    f.supervisor_reachable(e, true);
    // Past the expiry, but uncertain: the heartbeat and the pages go on,
    // the release waits.
    f.uncertain_past(expiry).await;
    let r = g.step().await;
    assert!(!r.at.unwrap().certain);
    assert_eq!(
        (r.heartbeats, r.pages_acked, r.released, r.owned),
        (1, 3, 0, 1)
    );
    assert_eq!(f.releases(e).await.0, 0);
    f.certain_again().await;
    let r = g.step().await;
    assert_eq!((r.heartbeats, r.released, r.owned), (1, 1, 0));
    assert_eq!(f.output(e).await, (expected, Some(ExitStatus::exited(3))));
    let m = g.metrics().snapshot();
    assert_eq!((m.steps, m.steps_uncertain), (4, 2));
}

/// The successor reads the spool through [`Forging`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_page_that_differs_in_the_spool_is_never_acked() {
    let f = Rig::start().await;
    let (e, _) = f.streamed(2).await;
    let hook = Arc::new(Recorder::default());
    let a = f
        .default_gateway()
        .with_crash_point(Some(CrashPoint::AfterMetadata), hook);
    let r = a.step().await;
    assert_eq!(r.crashed, Some(CrashPoint::AfterMetadata));
    f.certain_at(r.at.unwrap().cut + TTL).await;
    let b = f.gateway_on(
        Arc::new(Forging {
            real: f.provider.clone(),
            page: true,
            measurement: false,
        }),
        GatewayOptions {
            heartbeat_ttl: TTL,
            ..GatewayOptions::default()
        },
    );
    let r = b.step().await;
    assert_eq!(r.taken_over, 1);
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].code, "page_mismatch");
    assert_eq!(
        r.failures[0].message,
        "spooled page 2 differs from its committed metadata; it is not acked"
    );
    assert_eq!(r.pages_acked, 0);
    assert_eq!(f.page_counts(e).await, (3, 0));
    assert_eq!(f.releases(e).await.0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_sink_blob_is_replaced_before_the_ack() {
    let f = Rig::start().await;
    let (e, expected) = f.streamed(1).await;
    let first = Page::data(1, PageKind::Stdout, expected.clone()).unwrap();
    let d = Digest(first.sha256());
    f.sink.put(&d, first.bytes()).unwrap();
    std::fs::write(f.sink.path_of(&d), b"damaged").unwrap();
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!((r.pages_acked, r.released), (2, 1));
    assert_eq!(g.metrics().snapshot().sink_replaced, 1);
    assert_eq!(f.output(e).await, (expected, Some(ExitStatus::exited(3))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_are_refused_with_their_codes() {
    let f = Rig::start().await;
    let build = |o: GatewayOptions| {
        Gateway::new(
            f.gateway_store.clone(),
            Arc::new(support::InProcess(f.provider.clone())),
            f.sink.clone(),
            f.clock.clone(),
            o,
        )
        .map(|_| ())
        .map_err(|e| e.code())
    };
    let d = GatewayOptions::default();
    assert_eq!(build(d), Ok(()));
    assert_eq!(
        build(GatewayOptions {
            heartbeat_ttl: jiff::SignedDuration::from_millis(999),
            ..d
        }),
        Err("invalid_timeout")
    );
    assert_eq!(
        build(GatewayOptions { owned_max: 0, ..d }),
        Err("invalid_limit")
    );
    assert_eq!(
        build(GatewayOptions {
            pages_per_step: lc_gateway::PAGES_PER_STEP_MAX + 1,
            ..d
        }),
        Err("invalid_limit")
    );
    for n in [0, lc_gateway::SERVE_CONCURRENCY_MAX + 1] {
        assert_eq!(
            build(GatewayOptions {
                serve_concurrency: n,
                ..d
            }),
            Err("invalid_limit")
        );
    }
    // Each provider call's bound: at least the minimum, at most a third
    // of the heartbeat TTL, so an exec being served renews its heartbeat
    // between two calls.
    let third = std::time::Duration::from_nanos(1_666_666_666);
    assert_eq!(
        build(GatewayOptions {
            provider_call_timeout: third,
            ..d
        }),
        Ok(())
    );
    for bad in [
        lc_gateway::PROVIDER_CALL_TIMEOUT_MIN - std::time::Duration::from_nanos(1),
        third + std::time::Duration::from_nanos(1),
    ] {
        assert_eq!(
            build(GatewayOptions {
                provider_call_timeout: bad,
                ..d
            }),
            Err("invalid_timeout")
        );
    }
    // The quiesce bound: from the provider call bound to an hour.
    for (q, want) in [
        (d.provider_call_timeout, Ok(())),
        (lc_gateway::QUIESCE_TIMEOUT_MAX, Ok(())),
        (
            d.provider_call_timeout - std::time::Duration::from_nanos(1),
            Err("invalid_timeout"),
        ),
        (
            lc_gateway::QUIESCE_TIMEOUT_MAX + std::time::Duration::from_nanos(1),
            Err("invalid_timeout"),
        ),
    ] {
        assert_eq!(
            build(GatewayOptions {
                quiesce_timeout: q,
                ..d
            }),
            want,
            "{q:?}"
        );
    }
    let e = Gateway::new(
        f.gateway_store.clone(),
        Arc::new(support::InProcess(f.provider.clone())),
        f.sink.clone(),
        f.clock.clone(),
        GatewayOptions {
            heartbeat_ttl: jiff::SignedDuration::from_secs(1),
            ..d
        },
    )
    .map(|_| ())
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid timeout: the provider call timeout 1s must be in 10ms..=333.333333ms (a third of the heartbeat TTL); lower it or raise the TTL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_commits_its_receipt_then_kills_and_releases_after_the_signal_page() {
    let f = Rig::start().await;
    let e = f.run(&["sh", "-c", "echo started; exec sleep 600"]).await;
    f.spool_when(e, |s| s.pages == 1).await;
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!((r.claimed, r.pages_acked, r.cancels), (1, 1, 0));
    f.cancel(e).await;
    // The heartbeat sees the request; the receipt, then the supervisor.
    let r = g.step().await;
    assert_eq!((r.cancels, r.released), (1, 0));
    assert_eq!(
        f.receipts(e, "cancel").await,
        vec!["cancel-1-g1".to_string()]
    );
    assert!(f.spool(e).await.cancelled);
    // The signal-9 terminal page is acked and the Lease released as cancelled.
    f.spool_when(e, |s| s.terminal_seq == 2).await;
    let r = g.step().await;
    assert_eq!((r.pages_acked, r.cancels, r.released), (1, 0, 1));
    assert_eq!(
        f.output(e).await,
        (b"started\n".to_vec(), Some(ExitStatus::signaled(9)))
    );
    assert_eq!(
        f.releases(e).await,
        (
            1,
            Some(TerminalReason::Cancelled),
            LeaseState::ReleasePending
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_supervisor_refuses_a_stale_fence_and_the_gateway_forgets_the_exec() {
    let f = Rig::start().await;
    let (e, _) = f.streamed(2).await;
    let a = f.default_gateway();
    f.supervisor_reachable(e, false);
    assert_eq!(a.step().await.claimed, 1);
    assert_eq!(f.owner(e).await, (1, 1));
    // A newer owner's fence reached the supervisor (the store still names
    // `a`, as it would between a takeover and `a`'s next store write).
    f.supervisor_reachable(e, true);
    let newer = f
        .provider
        .pages(e.lease, e.generation, OwnerFence(5), 0, 1)
        .await
        .unwrap();
    assert_eq!(newer.len(), 1);
    let r = a.step().await;
    assert_eq!((r.stale_refused, r.owned, r.pages_acked), (1, 0, 0));
    // The store accepted the heartbeat: the refusal was the supervisor's.
    assert_eq!((r.heartbeats, f.refused("owner_stale")), (1, None));
    assert_eq!(f.spool(e).await.highest_fence, 5);
    assert_eq!(a.metrics().snapshot().stale_refused, 1);
    assert_eq!(f.spooled(e).await, vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_occupancy_is_sampled_into_the_metrics() {
    let f = Rig::start().await;
    f.streamed(3).await;
    let g = f.gateway(GatewayOptions {
        heartbeat_ttl: TTL,
        owned_max: 1,
        pages_per_step: 2,
        ..GatewayOptions::default()
    });
    let r = g.step().await;
    assert_eq!(r.pages_acked, 2);
    let m = g.metrics().snapshot();
    // Pages 3 and 4 (the terminal page) are still spooled.
    assert_eq!((m.spool_pages, m.spool_bytes), (2, 1000));
}

/// The predecessor is this test, driving the real store with its own
/// owner token, so the successor takes the exec over (the original
/// scenario's claim of an unowned exec with pending pages cannot exist in
/// the real store: pages are only staged under an ownership).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_pending_pages_than_one_request_are_finished_before_any_new_page() {
    let f = Rig::start().await;
    let (e, expected) = f.streamed(100).await;
    // A predecessor committed the metadata of pages 1..=100 and died.
    let token = OwnerToken::from_bytes([0xa1; 32]);
    let at = f.wait_reading(|r| r.certain).await;
    let owned = f.gateway_store.claim(&token, at, TTL, 1).await.unwrap();
    assert_eq!(owned.len(), 1);
    let o = &owned[0].ownership;
    let cred = OwnerCredential {
        token,
        generation: o.generation,
        fence: o.fence,
    };
    for after in [0, 64] {
        let pages = f
            .provider
            .pages(e.lease, e.generation, o.fence, after, 64)
            .await
            .unwrap();
        let metas: Vec<PageMeta> = pages
            .iter()
            .filter(|p| p.seq() <= 100)
            .map(|p| PageMeta::of_page(e.id, AttemptNo(1), p))
            .collect();
        let s = f
            .gateway_store
            .stage_pages(&cred, e.id, at, &metas)
            .await
            .unwrap();
        assert_eq!(s.staged, metas.len());
    }
    assert_eq!(f.page_counts(e).await, (100, 0));
    f.certain_at(o.heartbeat_expiry).await;
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!(
        (
            r.taken_over,
            r.pending_finished,
            r.pages_staged,
            r.pages_acked,
            r.released
        ),
        (1, 64, 0, 64, 0)
    );
    assert_eq!((r.supervisor_acks, f.spool(e).await.acked_through), (1, 64));
    let r = g.step().await;
    assert_eq!(
        (
            r.pending_finished,
            r.pages_staged,
            r.pages_acked,
            r.released
        ),
        (36, 1, 37, 1)
    );
    // Acked to the supervisor through 100, then through the terminal page.
    assert_eq!(r.supervisor_acks, 2);
    f.supervisor_done(e).await;
    assert_eq!(f.output(e).await, (expected, Some(ExitStatus::exited(3))));
}
