//! Input delivery of `Gateway::step` on real parts (see `support`): inputs
//! queued in `LcStore` as a client queues them, delivered by the gateway to
//! a real supervisor whose command (`cat`, unless a test says otherwise)
//! echoes its stdin, so what the command received is read back from its
//! acked output pages. The supervisor's rules are its own: a repeated seq
//! answers ok without writing again, a gap is refused `input_gap`, input
//! after the command ended `input_closed`, a lower fence `stale_fence`,
//! and a full input queue `input_busy`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lc_core::owner::{OwnerCredential, OwnerFence, OwnerToken};
use lc_core::page::ExitStatus;
use lc_core::store::{ControlStore as _, GatewayStore};
use lc_gateway::{CrashPoint, FaultHook, INPUTS_PER_STEP};
use lc_provider::{Provider as _, ProviderError};
use support::{Exec, GO_POLLS_MAX, Rig, TTL, WAIT_MAX};

#[derive(Default)]
struct Recorder(Mutex<Vec<CrashPoint>>);

impl FaultHook for Recorder {
    fn reached(&self, point: CrashPoint) {
        self.0.lock().unwrap().push(point);
    }
}

fn tids(seqs: std::ops::RangeInclusive<i64>, generation: i64) -> Vec<(String, i64)> {
    seqs.map(|n| (format!("send-1-{n}-g{generation}"), n))
        .collect()
}

/// A running `cat` reading the inputs queued for it.
async fn cat(f: &Rig) -> Exec {
    f.run_stdin(&["cat"], true).await
}

/// Queues the line `{n}\n` under the operation key `in-{n}`; its seq or
/// the store's error code.
async fn line(f: &Rig, e: Exec, n: i64, eof: bool) -> Result<i64, &'static str> {
    let key = format!("in-{n}");
    let bytes = format!("{n}\n");
    f.queue(e, &key, bytes.as_bytes(), eof)
        .await
        .map_err(|e| e.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_are_delivered_once_in_seq_order_at_most_a_bound_per_step() {
    let f = Rig::start().await;
    let e = cat(&f).await;
    // The store queues at most the per-step bound: a full queue is drained
    // by one step, and one more input is refused until it is.
    let bound = i64::try_from(INPUTS_PER_STEP).unwrap();
    for n in 1..=bound {
        assert_eq!(line(&f, e, n, false).await, Ok(n));
    }
    let full = f.queue(e, "in-full", b"x", false).await;
    assert_eq!(full.map_err(|e| e.code()), Err("input_queue_full"));
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!(r.failures, vec![]);
    assert_eq!((r.claimed, r.inputs_sent), (1, INPUTS_PER_STEP));
    assert_eq!(f.recorded(e).await, tids(1..=bound, 1));
    let extra = 4;
    let total = bound + extra;
    for n in bound + 1..=total {
        assert_eq!(line(&f, e, n, n == total).await, Ok(n));
    }
    let r = g.step().await;
    assert_eq!(
        (r.inputs_sent, r.failures.clone()),
        (extra as usize, vec![])
    );
    assert_eq!(f.recorded(e).await, tids(1..=total, 1));
    // After the eof input nothing more can follow: the queue is not read
    // again, and the command, its stdin closed, ends and is released.
    let reads = f.queued_reads();
    assert_eq!(reads, 2);
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures.clone()), (0, vec![]));
    assert_eq!(f.released_by(&g, e).await, 0);
    assert_eq!(f.queued_reads(), reads);
    let want: String = (1..=total).map(|n| format!("{n}\n")).collect();
    assert_eq!(
        f.output(e).await,
        (want.clone().into_bytes(), Some(ExitStatus::exited(0)))
    );
    let m = g.metrics().snapshot();
    assert_eq!(m.inputs_sent, u64::try_from(total).unwrap());
    assert_eq!(m.input_bytes_sent, want.len() as u64);
}

/// The supervisor's input queue fills for real: the command does not read
/// its stdin until its workspace holds `.go`. Input 1 (1 byte) may or may
/// not have been written into the command's stdin pipe (64 KiB, Linux's
/// default) by the time the later ones arrive; input 2 (64 KiB) then
/// cannot be written whole, so it and every later input stay counted in
/// the supervisor's input queue of 1 MiB (its `INPUT_QUEUE_BYTES_MAX`).
/// Inputs 2..=16 (64 KiB each) and 17 (64 KiB - 1) fit in it with or
/// without input 1; input 18 (64 KiB) does not with either, so the
/// supervisor answers it `input_busy` until the command reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_supervisor_ends_the_step_s_inputs_and_the_next_step_resumes() {
    let f = Rig::start().await;
    let script = format!(
        "n=0; while [ ! -e /workspace/.go ] && [ $n -lt {GO_POLLS_MAX} ]; do \
         sleep 0.01; n=$((n+1)); done; exec cat"
    );
    let e = f.run_stdin(&["sh", "-c", &script], true).await;
    let full = lc_core::input::INPUT_BYTES_MAX;
    let input = |n: usize| {
        let len = match n {
            1 => 1,
            17 => full - 1,
            19 => 0,
            _ => full,
        };
        vec![b'a' + (n % 26) as u8; len]
    };
    let g = f.default_gateway();
    // Queued a store queue's worth at a time, each delivered whole.
    for round in [1..=4, 5..=8, 9..=12, 13..=16, 17..=17] {
        for n in round.clone() {
            let seq = f.queue(e, &format!("in-{n}"), &input(n), false).await;
            assert_eq!(seq, Ok(n as i64));
        }
        let r = g.step().await;
        assert_eq!((r.inputs_sent, r.failures), (round.count(), vec![]));
    }
    assert_eq!(f.recorded(e).await, tids(1..=17, 1));
    assert_eq!(f.queue(e, "in-18", &input(18), false).await, Ok(18));
    assert_eq!(f.queue(e, "in-19", &input(19), true).await, Ok(19));
    // Input 18 is not taken, and input 19 is not offered (the supervisor
    // would refuse it `input_gap`, a failure): both stay queued, at every
    // step while the command does not read.
    for _ in 0..2 {
        let r = g.step().await;
        assert_eq!((r.inputs_sent, r.failures, r.owned), (0, vec![], 1));
        assert_eq!(f.still_queued(e).await, vec![18, 19]);
    }
    // The supervisor's own answer to input 18 (a refusal changes nothing).
    let busy = f
        .provider
        .send(e.lease, e.generation, OwnerFence(1), 18, input(18), false);
    match busy.await {
        Err(ProviderError::InputRefused { reason, detail }) => assert_eq!(
            (reason.as_str(), detail.as_str()),
            (
                "input_busy",
                "the command has not read its earlier input yet: retry later"
            )
        ),
        other => panic!("input 18 is not refused input_busy: {other:?}"),
    }
    let workspace = f
        .store
        .exec(f.tenant, e.id)
        .await
        .unwrap()
        .canonical
        .workspace_id;
    std::fs::write(f.provider.workspace_dir(workspace).join(".go"), b"").unwrap();
    // Once the command reads, a next step delivers both.
    let deadline = Instant::now() + WAIT_MAX;
    while !f.still_queued(e).await.is_empty() {
        assert!(Instant::now() < deadline, "inputs 18 and 19 still queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let r = g.step().await;
        assert_eq!(r.failures, vec![]);
    }
    assert_eq!(f.recorded(e).await, tids(1..=19, 1));
    f.released_by(&g, e).await;
    let want: Vec<u8> = (1..=19).flat_map(input).collect();
    assert_eq!(want.len(), 17 * full);
    assert_eq!(f.output(e).await, (want, Some(ExitStatus::exited(0))));
    assert_eq!(g.metrics().snapshot().inputs_sent, 19);
}

/// The command ended without reading its stdin before the input was
/// queued: the supervisor answers `input_closed`, and the exec's pages
/// move and it is released in the same step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdin_ends_delivery_for_the_activation_without_holding_up_the_release() {
    let f = Rig::start().await;
    let e = f.run_stdin(&["sh", "-c", "echo bye"], true).await;
    f.spool_when(e, |s| s.terminal_seq != 0).await;
    assert_eq!(f.queue(e, "late", b"late\n", false).await, Ok(1));
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!(
        (r.inputs_sent, r.failures.clone(), r.released, r.owned),
        (0, vec![], 1, 0)
    );
    let r = g.step().await;
    assert_eq!((r.claimed, r.inputs_sent, r.owned), (0, 0, 0));
    // Offered once; the input stays queued, without a receipt.
    assert_eq!(f.queued_reads(), 1);
    assert_eq!(f.still_queued(e).await, vec![1]);
    assert_eq!(f.recorded(e).await, vec![]);
    assert_eq!(
        f.output(e).await,
        (b"bye\n".to_vec(), Some(ExitStatus::exited(0)))
    );
}

/// A real gap: a predecessor (this test, on the real store with its own
/// owner token) recorded input 1 sent although it never reached the
/// supervisor, so the successor's `send` of input 2 is refused `input_gap`
/// until input 1 is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_refusal_is_a_failure_retried_at_the_next_step() {
    let f = Rig::start().await;
    let e = cat(&f).await;
    assert_eq!(f.queue(e, "in-1", b"1\n", false).await, Ok(1));
    assert_eq!(f.queue(e, "in-2", b"2\n", true).await, Ok(2));
    let token = OwnerToken::from_bytes([0xa1; 32]);
    let at = f.wait_reading(|r| r.certain).await;
    let owned = f.gateway_store.claim(&token, at, TTL, 1).await.unwrap();
    let o = &owned[0].ownership;
    let cred = OwnerCredential {
        token,
        generation: o.generation,
        fence: o.fence,
    };
    f.gateway_store
        .record_send(&cred, e.id, at, "send-1-1-g1", 1)
        .await
        .unwrap();
    f.certain_at(o.heartbeat_expiry).await;
    let g = f.default_gateway();
    let want = vec![(
        Some(e.id),
        "input_refused",
        "input refused (input_gap): send the inputs before this seq first",
    )];
    for step in 0..2 {
        let r = g.step().await;
        assert_eq!((r.taken_over, r.inputs_sent), (1 - step, 0));
        assert_eq!(
            r.failures
                .iter()
                .map(|e| (e.exec_id, e.code.as_str(), e.message.as_str()))
                .collect::<Vec<_>>(),
            want
        );
        assert_eq!(r.owned, 1, "the exec is kept");
    }
    // Input 1 reaches the supervisor under the owner's fence; input 2
    // follows at the next step.
    assert_eq!(f.owner(e).await, (2, 2));
    let written = f.provider.send(
        e.lease,
        e.generation,
        OwnerFence(2),
        1,
        b"1\n".to_vec(),
        false,
    );
    assert_eq!(written.await.unwrap(), 1);
    let r = g.step().await;
    assert_eq!((r.inputs_sent, r.failures), (1, vec![]));
    assert_eq!(
        f.recorded(e).await,
        vec![("send-1-1-g1".into(), 1), ("send-1-2-g2".into(), 2)]
    );
    f.released_by(&g, e).await;
    assert_eq!(
        f.output(e).await,
        (b"1\n2\n".to_vec(), Some(ExitStatus::exited(0)))
    );
}

/// A newer owner's fence reached the supervisor before the gateway's
/// first `send` (the store still names the gateway, as it would between a
/// takeover and its next store write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_fence_on_send_forgets_the_exec() {
    let f = Rig::start().await;
    let e = cat(&f).await;
    assert_eq!(f.queue(e, "in-1", b"x", false).await, Ok(1));
    let newer = f.provider.pages(e.lease, e.generation, OwnerFence(5), 0, 1);
    assert_eq!(newer.await.unwrap().len(), 0);
    let g = f.default_gateway();
    let r = g.step().await;
    assert_eq!(
        (
            r.claimed,
            r.inputs_sent,
            r.stale_refused,
            r.owned,
            r.failures
        ),
        (1, 0, 1, 0, vec![])
    );
    assert_eq!(f.owner(e).await, (1, 1));
    assert_eq!(f.refused("owner_stale"), None);
    assert_eq!(f.recorded(e).await, vec![]);
    assert_eq!(f.still_queued(e).await, vec![1]);
    assert_eq!(f.spool(e).await.highest_fence, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_send_leaves_the_input_queued_for_a_successor() {
    let f = Rig::start().await;
    let e = cat(&f).await;
    assert_eq!(f.queue(e, "in-1", b"one\n", false).await, Ok(1));
    assert_eq!(f.queue(e, "in-2", b"two\n", true).await, Ok(2));
    let hook = Arc::new(Recorder::default());
    let a = f
        .default_gateway()
        .with_crash_point(Some(CrashPoint::AfterSend), hook.clone());
    let r = a.step().await;
    assert_eq!(r.crashed, Some(CrashPoint::AfterSend));
    assert_eq!(*hook.0.lock().unwrap(), vec![CrashPoint::AfterSend]);
    // The supervisor wrote input 1 (the command echoed its 4 bytes); the
    // store still has it queued.
    f.spool_when(e, |s| s.bytes == 4).await;
    assert_eq!(f.recorded(e).await, vec![]);
    assert_eq!(f.still_queued(e).await, vec![1, 2]);
    // Past its heartbeat the successor (generation 2) delivers input 1
    // again, which writes nothing twice, and records it under its own
    // transition id.
    f.certain_at(r.at.unwrap().cut + TTL).await;
    let b = f.default_gateway();
    let r = b.step().await;
    assert_eq!((r.taken_over, r.inputs_sent, r.failures), (1, 2, vec![]));
    assert_eq!(f.recorded(e).await, tids(1..=2, 2));
    assert_eq!(f.released_by(&b, e).await, 0);
    assert_eq!(
        f.output(e).await,
        (b"one\ntwo\n".to_vec(), Some(ExitStatus::exited(0)))
    );
    // The dead owner is refused from here on.
    assert_eq!(a.step().await.stale_refused, 1);
}
