//! Input for a command's stdin against a real PostgreSQL with a real
//! in-process sampler: inputs queue with exact seqs and bytes, a client's
//! replay returns the recorded input and a changed request is refused; the
//! queue is bounded by inputs and bytes; an eof input closes stdin; an exec
//! admitted without stdin open takes none; the owner reads the queue and
//! records each delivery in order with a `send` receipt, whose replay
//! follows the owner rule (same owner: the receipt, nothing written;
//! expired or replaced owner: refused; racing a takeover: one consistent
//! outcome); a stale owner changes nothing; concurrent inputs get
//! consecutive seqs; the database keeps the input order itself; a queued
//! input quarantines the initial cut.

mod support;

use jiff::SignedDuration;
use lc_core::input::{
    INPUT_BYTES_MAX, INPUT_QUEUE_BYTES_MAX, INPUT_QUEUE_INPUTS_MAX, InputRecord, InputState,
};
use lc_core::owner::{
    self, OwnedExec, OwnerCredential, OwnerGeneration, OwnerToken, TakeoverBasis, TransitionKind,
    TransitionReceipt,
};
use lc_core::{
    ControlStore, CutReading, Digest, ExecId, ExecRecord, GatewayStore, Generation, LcError,
    ReconcileStore, TenantId,
};
use sqlx::{Connection, PgConnection};
use support::*;

const TTL: SignedDuration = SignedDuration::from_secs(5);
const TTL_MIN: SignedDuration = SignedDuration::from_secs(1);
const G1: Generation = Generation(1);

fn token(b: u8) -> OwnerToken {
    OwnerToken::from_bytes([b; 32])
}

fn cred_of(o: &OwnedExec, t: &OwnerToken) -> OwnerCredential {
    OwnerCredential {
        token: t.clone(),
        generation: o.ownership.generation,
        fence: o.ownership.fence,
    }
}

/// Admits a small exec under `key` (stdin open when `stdin_open`) and
/// marks its Lease active.
async fn active_exec(f: &Fixture, key: &str, at: CutReading, stdin_open: bool) -> ExecRecord {
    let e = f
        .store
        .admit_exec(
            &op(key, key),
            at,
            f.tenant,
            &lc_core::ExecRequest {
                stdin_open,
                idle_ttl_ms: None,
                on_timeout: lc_core::OnTimeout::Terminate,
                ..req("small", &["cat"])
            },
        )
        .await
        .unwrap();
    f.store
        .mark_active(e.canonical.lease_id, G1, at)
        .await
        .unwrap();
    f.store.exec(f.tenant, e.exec_id).await.unwrap()
}

/// A certain reading whose cut is at or after `t`.
async fn certain_at(f: &Fixture, t: jiff::Timestamp) -> CutReading {
    wait_reading(&f.clock, 20, "a certain cut past a heartbeat expiry", |r| {
        r.certain && r.cut >= t
    })
    .await
}

/// `(queued inputs, sent inputs, transition receipts, operation keys)`.
async fn counts(url: &str) -> (i64, i64, i64, i64) {
    let mut c = PgConnection::connect(url).await.unwrap();
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM lc_exec_inputs WHERE state = 'queued'), \
                (SELECT count(*) FROM lc_exec_inputs WHERE state = 'sent'), \
                (SELECT count(*) FROM lc_transitions), \
                (SELECT count(*) FROM lc_operations)",
    )
    .fetch_one(&mut c)
    .await
    .unwrap()
}

fn queued(x: ExecId, seq: i64, bytes: &[u8], eof: bool) -> InputRecord {
    InputRecord {
        exec_id: x,
        input_seq: seq,
        bytes: bytes.to_vec(),
        sha256: Digest::of(bytes),
        eof,
        state: InputState::Queued,
        send_transition_id: None,
    }
}

fn sent(mut r: InputRecord, id: &str) -> InputRecord {
    r.state = InputState::Sent;
    r.send_transition_id = Some(id.to_owned());
    r
}

/// The `send` receipt `id` of `input` by the owner `o` of token `t` at `at`.
fn send_receipt(
    input: &InputRecord,
    id: &str,
    o: &OwnedExec,
    t: &OwnerToken,
    at: CutReading,
) -> TransitionReceipt {
    TransitionReceipt {
        exec_id: input.exec_id,
        transition_id: id.to_owned(),
        kind: TransitionKind::Send,
        token_sha256: t.sha256(),
        owner_generation: o.ownership.generation,
        owner_fence: o.ownership.fence,
        request_sha256: owner::transition_request_sha256(
            TransitionKind::Send,
            input.exec_id,
            &format!(
                "input_seq={} sha256={} eof={}",
                input.input_seq,
                Digest::of(&input.bytes).to_hex(),
                input.eof
            ),
        ),
        committed_cut: at.cut,
        detail: serde_json::json!({
            "input_seq": input.input_seq,
            "length": input.bytes.len(),
            "sha256": Digest::of(&input.bytes).to_hex(),
            "eof": input.eof,
        }),
    }
}

async fn send(
    f: &Fixture,
    key: &str,
    at: CutReading,
    x: ExecId,
    bytes: &[u8],
    eof: bool,
) -> Result<InputRecord, LcError> {
    f.store
        .send_input(&op(key, key), at, f.tenant, x, bytes, eof)
        .await
}

#[tokio::test]
async fn inputs_queue_with_exact_seqs_and_bytes_replay_idempotently_and_are_sent_in_order() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "e", at, true).await;
    let x = e.exec_id;
    assert!(e.stdin_open);
    // The reconciler's work carries stdin_open for the allocation.
    let w = f.store.renew(e.canonical.lease_id, G1, at).await.unwrap();
    assert!(w.stdin_open);

    let one = send(&f, "i1", at, x, b"hello\n", false).await.unwrap();
    assert_eq!(one, queued(x, 1, b"hello\n", false));
    let binary: &[u8] = b"\x00\xff\xfe not utf-8 \xc3\x28";
    let two = send(&f, "i2", at, x, binary, false).await.unwrap();
    assert_eq!(two, queued(x, 2, binary, false));

    // A client's replay: the recorded input, nothing written.
    let before = snapshot(&f.db.url).await;
    assert_eq!(send(&f, "i1", at, x, b"hello\n", false).await.unwrap(), one);
    assert_eq!(send(&f, "i2", at, x, binary, false).await.unwrap(), two);
    // The same key with other bytes or another eof: refused, whether or
    // not the caller's own digest saw the difference.
    for (bytes, eof) in [(&b"hullo\n"[..], false), (&b"hello\n"[..], true)] {
        assert_eq!(
            send(&f, "i1", at, x, bytes, eof).await.unwrap_err(),
            LcError::IdempotencyConflict { key: "i1".into() }
        );
    }
    assert_eq!(
        f.store
            .send_input(
                &op("i1", "another body"),
                at,
                f.tenant,
                x,
                b"hello\n",
                false
            )
            .await
            .unwrap_err()
            .code(),
        "idempotency_conflict"
    );
    // Refusals: too many bytes, no bytes without eof, another tenant's
    // exec, no such exec.
    let too_big = vec![7u8; INPUT_BYTES_MAX + 1];
    assert_eq!(
        send(&f, "big", at, x, &too_big, false).await.unwrap_err(),
        LcError::InvalidInput {
            reason: "65537 bytes is more than the 65536 one input carries; split it".into()
        }
    );
    assert_eq!(
        send(&f, "none", at, x, b"", false).await.unwrap_err(),
        LcError::InvalidInput {
            reason: "an input of no bytes must close stdin (eof: true)".into()
        }
    );
    assert_eq!(
        f.store
            .send_input(&op("other", "other"), at, TenantId(999), x, b"a", false)
            .await
            .unwrap_err(),
        LcError::not_found("exec", x)
    );
    assert_eq!(
        send(&f, "nox", at, ExecId(999_999), b"a", false)
            .await
            .unwrap_err(),
        LcError::not_found("exec", ExecId(999_999))
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // The owner reads the queue by seq and records each delivery.
    let a = token(0xa1);
    let o = f.store.take_over(&a, f.tenant, x, at, TTL).await.unwrap();
    let c = cred_of(&o, &a);
    assert_eq!(
        f.store.queued_inputs(&c, x, at, 10).await.unwrap(),
        vec![one.clone(), two.clone()]
    );
    assert_eq!(
        f.store.queued_inputs(&c, x, at, 1).await.unwrap(),
        vec![one.clone()]
    );
    assert_eq!(
        f.store
            .queued_inputs(&c, x, at, 0)
            .await
            .unwrap_err()
            .code(),
        "invalid_limit"
    );
    // Out of order, unknown seq, bad id: refused, nothing written.
    let rows = counts(&f.db.url).await;
    assert_eq!(
        f.store
            .record_send(&c, x, at, "send-1-2", 2)
            .await
            .unwrap_err(),
        LcError::InvalidInput {
            reason: format!(
                "input 2 of exec {x} is out of order: inputs are sent by seq and input 1 is the next"
            )
        }
    );
    assert_eq!(
        f.store
            .record_send(&c, x, at, "send-1-9", 9)
            .await
            .unwrap_err(),
        LcError::InvalidInput {
            reason: format!("exec {x} has no input 9")
        }
    );
    assert_eq!(
        f.store
            .record_send(&c, x, at, "send 1", 1)
            .await
            .unwrap_err()
            .code(),
        "invalid_transition_id"
    );
    assert_eq!(counts(&f.db.url).await, rows);

    let r1 = f.store.record_send(&c, x, at, "send-1-1", 1).await.unwrap();
    assert_eq!(r1, send_receipt(&one, "send-1-1", &o, &a, at));
    assert_eq!(
        f.store.queued_inputs(&c, x, at, 10).await.unwrap(),
        vec![two.clone()]
    );
    // The client's replay now shows the input sent.
    assert_eq!(
        send(&f, "i1", at, x, b"hello\n", false).await.unwrap(),
        sent(one.clone(), "send-1-1")
    );
    // The same id for another input, or another id for a sent input:
    // refused, nothing written.
    let rows = counts(&f.db.url).await;
    assert_eq!(
        f.store
            .record_send(&c, x, at, "send-1-1", 2)
            .await
            .unwrap_err(),
        LcError::IdempotencyConflict {
            key: "send-1-1".into()
        }
    );
    assert_eq!(
        f.store
            .record_send(&c, x, at, "send-again", 1)
            .await
            .unwrap_err(),
        LcError::InvalidInput {
            reason: format!(
                "input 1 of exec {x} is already recorded sent by transition \"send-1-1\""
            )
        }
    );
    assert_eq!(counts(&f.db.url).await, rows);

    // eof closes stdin: nothing after it, though its input is not sent.
    let three = send(&f, "i3", at, x, b"", true).await.unwrap();
    assert_eq!(three, queued(x, 3, b"", true));
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        send(&f, "i4", at, x, b"late", false).await.unwrap_err(),
        LcError::InputClosed {
            exec_id: x,
            eof_seq: 3
        }
    );
    assert_eq!(
        send(&f, "i5", at, x, b"", true).await.unwrap_err().code(),
        "input_closed"
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let r2 = f.store.record_send(&c, x, at, "send-1-2", 2).await.unwrap();
    let r3 = f.store.record_send(&c, x, at, "send-1-3", 3).await.unwrap();
    assert_eq!(r2, send_receipt(&two, "send-1-2", &o, &a, at));
    assert_eq!(r3, send_receipt(&three, "send-1-3", &o, &a, at));
    assert_eq!(f.store.queued_inputs(&c, x, at, 10).await.unwrap(), vec![]);
    let (q, s, t, _) = counts(&f.db.url).await;
    assert_eq!((q, s, t), (0, 3, 3));
    assert_eq!(
        send(&f, "i4", at, x, b"late", false)
            .await
            .unwrap_err()
            .code(),
        "input_closed"
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}

#[tokio::test]
async fn no_input_for_an_exec_without_stdin_open_or_a_terminal_one() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let closed = active_exec(&f, "closed", at, false).await;
    assert!(!closed.stdin_open);
    let w = f
        .store
        .renew(closed.canonical.lease_id, G1, at)
        .await
        .unwrap();
    assert!(!w.stdin_open);
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        send(&f, "c1", at, closed.exec_id, b"x", false)
            .await
            .unwrap_err(),
        LcError::StdinNotOpen {
            exec_id: closed.exec_id
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // A terminal exec (cancelled before it ran, destroy proven).
    let e = active_exec(&f, "t", at, true).await;
    assert!(e.stdin_open);
    f.store
        .begin_release(
            e.canonical.lease_id,
            G1,
            lc_core::TerminalReason::Cancelled,
            at,
        )
        .await
        .unwrap();
    let now = certain(&f.clock).await;
    f.store
        .commit_release(
            e.canonical.lease_id,
            G1,
            &f.provider.absence(e.canonical.lease_id, 1),
            now,
        )
        .await
        .unwrap();
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        send(&f, "t1", now, e.exec_id, b"x", false)
            .await
            .unwrap_err(),
        LcError::ExecTerminal { exec_id: e.exec_id }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_input_queue_is_bounded_by_inputs_and_bytes_and_drains_as_inputs_are_sent() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    // Many small inputs meet the input bound.
    let small = active_exec(&f, "small", at, true).await;
    for i in 1..=i64::from(INPUT_QUEUE_INPUTS_MAX) {
        let r = send(&f, &format!("s{i}"), at, small.exec_id, b"a", false)
            .await
            .unwrap();
        assert_eq!(r.input_seq, i);
    }
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        send(&f, "s-full", at, small.exec_id, b"a", false)
            .await
            .unwrap_err(),
        LcError::InputQueueFull {
            exec_id: small.exec_id,
            queued_inputs: 16,
            queued_bytes: 16,
            inputs_max: INPUT_QUEUE_INPUTS_MAX,
            bytes_max: INPUT_QUEUE_BYTES_MAX,
        }
    );
    // Even an eof input: the queue must drain first.
    assert_eq!(
        send(&f, "s-eof", at, small.exec_id, b"", true)
            .await
            .unwrap_err()
            .code(),
        "input_queue_full"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // A few full inputs meet the byte bound.
    let big = active_exec(&f, "big", at, true).await;
    let page = vec![0x5a_u8; INPUT_BYTES_MAX];
    for i in 1..=4 {
        send(&f, &format!("b{i}"), at, big.exec_id, &page, false)
            .await
            .unwrap();
    }
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        send(&f, "b-full", at, big.exec_id, b"z", false)
            .await
            .unwrap_err(),
        LcError::InputQueueFull {
            exec_id: big.exec_id,
            queued_inputs: 4,
            queued_bytes: 4 * 65536,
            inputs_max: INPUT_QUEUE_INPUTS_MAX,
            bytes_max: INPUT_QUEUE_BYTES_MAX,
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Once the owner records a delivery, the queue takes one more.
    let a = token(0xb1);
    let o = f
        .store
        .take_over(&a, f.tenant, big.exec_id, at, TTL)
        .await
        .unwrap();
    f.store
        .record_send(&cred_of(&o, &a), big.exec_id, at, "send-1-1", 1)
        .await
        .unwrap();
    assert_eq!(
        send(&f, "b-full", at, big.exec_id, b"z", false)
            .await
            .unwrap(),
        queued(big.exec_id, 5, b"z", false)
    );
    // 3 full inputs and 1 byte are queued: one more full input is 1 byte
    // too many.
    assert_eq!(
        send(&f, "b-more", at, big.exec_id, &page, false)
            .await
            .unwrap_err(),
        LcError::InputQueueFull {
            exec_id: big.exec_id,
            queued_inputs: 4,
            queued_bytes: 3 * 65536 + 1,
            inputs_max: INPUT_QUEUE_INPUTS_MAX,
            bytes_max: INPUT_QUEUE_BYTES_MAX,
        }
    );
    assert_eq!(
        send(&f, "b-more", at, big.exec_id, &page[1..], false)
            .await
            .unwrap()
            .input_seq,
        6
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_send_replays_only_for_its_current_unexpired_owner_and_a_stale_owner_changes_nothing() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "e", at, true).await;
    let x = e.exec_id;
    let one = send(&f, "i1", at, x, b"one", false).await.unwrap();
    let two = send(&f, "i2", at, x, b"two", false).await.unwrap();
    let (a, b) = (token(0x11), token(0x22));
    let oa = f
        .store
        .take_over(&a, f.tenant, x, at, TTL_MIN)
        .await
        .unwrap();
    let ca = cred_of(&oa, &a);
    let receipt = f
        .store
        .record_send(&ca, x, at, "send-1-1", 1)
        .await
        .unwrap();
    assert_eq!(receipt, send_receipt(&one, "send-1-1", &oa, &a, at));

    // Same owner, unexpired: the same receipt, nothing written.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .record_send(&ca, x, at, "send-1-1", 1)
            .await
            .unwrap(),
        receipt
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Expired owner (a certain cut past its heartbeat): its replay is
    // refused, and so are its new send and its queue read.
    let past = certain_at(&f, at.cut + TTL_MIN).await;
    assert_eq!(
        f.store
            .record_send(&ca, x, past, "send-1-1", 1)
            .await
            .unwrap_err(),
        LcError::TransitionReplayRefused {
            exec_id: x,
            transition_id: "send-1-1".into(),
            receipt_generation: OwnerGeneration(1),
            current_generation: OwnerGeneration(1),
        }
    );
    assert_eq!(
        f.store
            .record_send(&ca, x, past, "send-1-2", 2)
            .await
            .unwrap_err(),
        LcError::OwnerExpired {
            exec_id: x,
            generation: OwnerGeneration(1),
            heartbeat_expiry: at.cut + TTL_MIN,
        }
    );
    assert_eq!(
        f.store
            .queued_inputs(&ca, x, past, 10)
            .await
            .unwrap_err()
            .code(),
        "owner_expired"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Replaced owner: after a takeover neither the old owner nor the new
    // one replays the old receipt, even with a reading from before the
    // takeover; the old owner's record_send and queue read are refused
    // with nothing changed.
    let ob = f.store.take_over(&b, f.tenant, x, past, TTL).await.unwrap();
    assert_eq!(
        (ob.ownership.generation, ob.basis),
        (OwnerGeneration(2), TakeoverBasis::Expired)
    );
    let cb = cred_of(&ob, &b);
    let refused = LcError::TransitionReplayRefused {
        exec_id: x,
        transition_id: "send-1-1".into(),
        receipt_generation: OwnerGeneration(1),
        current_generation: OwnerGeneration(2),
    };
    let rows = counts(&f.db.url).await;
    let before = snapshot(&f.db.url).await;
    for (c, r) in [(&ca, past), (&ca, at), (&cb, past)] {
        assert_eq!(
            f.store
                .record_send(c, x, r, "send-1-1", 1)
                .await
                .unwrap_err(),
            refused
        );
    }
    let stale = LcError::OwnerStale {
        exec_id: x,
        presented: OwnerGeneration(1),
        current: OwnerGeneration(2),
    };
    // The old owner delivered input 2 and tries to record it too late.
    assert_eq!(
        f.store
            .record_send(&ca, x, at, "send-1-2", 2)
            .await
            .unwrap_err(),
        stale
    );
    assert_eq!(
        f.store.queued_inputs(&ca, x, at, 10).await.unwrap_err(),
        stale
    );
    assert_eq!(counts(&f.db.url).await, rows);
    assert_eq!(snapshot(&f.db.url).await, before);
    // The successor finds input 2 still queued, delivers it again (the
    // supervisor writes a seq once) and records it under its own fence.
    assert_eq!(
        f.store.queued_inputs(&cb, x, past, 10).await.unwrap(),
        vec![two.clone()]
    );
    let r2 = f
        .store
        .record_send(&cb, x, past, "send-2-2", 2)
        .await
        .unwrap();
    assert_eq!(r2, send_receipt(&two, "send-2-2", &ob, &b, past));
    let (q, s, t, _) = counts(&f.db.url).await;
    assert_eq!((q, s, t), (0, 2, 2));
    // The old owner's late attempt at the same seq: still refused.
    assert_eq!(
        f.store
            .record_send(&ca, x, at, "send-1-2", 2)
            .await
            .unwrap_err(),
        stale
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_send_replay_racing_a_takeover_has_one_consistent_outcome() {
    let f = fixture(6).await;
    let (a, b) = (token(0x33), token(0x44));
    for round in 0..3 {
        let at = certain(&f.clock).await;
        let e = active_exec(&f, &format!("e{round}"), at, true).await;
        let x = e.exec_id;
        let one = send(&f, &format!("i{round}"), at, x, b"race", false)
            .await
            .unwrap();
        let o = f
            .store
            .take_over(&a, f.tenant, x, at, TTL_MIN)
            .await
            .unwrap();
        let c = cred_of(&o, &a);
        let receipt = f.store.record_send(&c, x, at, "send-1-1", 1).await.unwrap();
        assert_eq!(receipt, send_receipt(&one, "send-1-1", &o, &a, at));
        let past = certain_at(&f, at.cut + TTL_MIN).await;
        let rows = counts(&f.db.url).await;
        // The old owner replays with its reading from before its expiry
        // while another gateway takes over on a certain cut past it.
        let (replay, takeover) = tokio::join!(
            f.store.record_send(&c, x, at, "send-1-1", 1),
            f.store.take_over(&b, f.tenant, x, past, TTL),
        );
        let t = takeover.unwrap();
        assert_eq!(
            (t.ownership.generation, t.basis),
            (OwnerGeneration(2), TakeoverBasis::Expired)
        );
        match replay {
            Ok(r) => assert_eq!(r, receipt),
            Err(err) => assert_eq!(
                err,
                LcError::TransitionReplayRefused {
                    exec_id: x,
                    transition_id: "send-1-1".into(),
                    receipt_generation: OwnerGeneration(1),
                    current_generation: OwnerGeneration(2),
                }
            ),
        }
        // After the race the old owner is refused either way.
        assert_eq!(
            f.store
                .record_send(&c, x, at, "send-1-1", 1)
                .await
                .unwrap_err()
                .code(),
            "transition_replay_refused"
        );
        // The replay wrote nothing, whatever the order.
        assert_eq!(counts(&f.db.url).await, rows);
    }
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_database_keeps_the_input_order_and_a_queued_input_quarantines_the_initial_cut() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "e", at, true).await;
    let closed = active_exec(&f, "closed", at, false).await;
    let x = e.exec_id;
    send(&f, "i1", at, x, b"one", false).await.unwrap();
    send(&f, "i2", at, x, b"two", false).await.unwrap();
    let a = token(0x55);
    let o = f.store.take_over(&a, f.tenant, x, at, TTL).await.unwrap();
    f.store
        .record_send(&cred_of(&o, &a), x, at, "send-1-1", 1)
        .await
        .unwrap();
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let insert = |exec: i64, seq: i64, eof: bool| {
        format!(
            "INSERT INTO lc_exec_inputs (exec_id, input_seq, bytes, sha256, eof, op_key, \
                 request_sha256, state, queued_floor_us, queued_submicro_ns) \
             VALUES ({exec}, {seq}, 'x'::bytea, sha256('x'::bytea), {eof}, 'raw-{exec}-{seq}', \
                 decode(repeat('00', 32), 'hex'), 'queued', 0, 0)"
        )
    };
    let before = snapshot(&f.db.url).await;
    for sql in [
        // A gap, an input for an exec without stdin open.
        insert(x.0, 4, false),
        insert(closed.exec_id.0, 1, false),
        // Bytes and digest changed, sent back to queued, deleted, the
        // exec's stdin_open changed.
        format!(
            "UPDATE lc_exec_inputs SET bytes = 'y'::bytea, sha256 = sha256('y'::bytea) WHERE exec_id = {}",
            x.0
        ),
        format!(
            "UPDATE lc_exec_inputs SET state = 'queued', send_transition_id = NULL WHERE exec_id = {} AND input_seq = 1",
            x.0
        ),
        format!("DELETE FROM lc_exec_inputs WHERE exec_id = {}", x.0),
        format!(
            "UPDATE lc_execs SET stdin_open = false WHERE exec_id = {}",
            x.0
        ),
    ] {
        let err = sqlx::query(&sql).execute(&mut c).await.unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS06"),
            "{sql}"
        );
    }
    assert_eq!(snapshot(&f.db.url).await, before);
    // Input 3 (queued) may not be sent before input 2.
    sqlx::query(&insert(x.0, 3, true))
        .execute(&mut c)
        .await
        .unwrap();
    let err = sqlx::query(
        "UPDATE lc_exec_inputs SET state = 'sent', send_transition_id = 'send-1-1' \
          WHERE exec_id = $1 AND input_seq = 3",
    )
    .bind(x.0)
    .execute(&mut c)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("LCS06")
    );
    // Nothing after the eof input.
    let err = sqlx::query(&insert(x.0, 4, false))
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("LCS06")
    );
    // A sent input names a committed send receipt of its exec.
    GatewayStore::cancel(&f.store, &cred_of(&o, &a), x, at, "cancel-1")
        .await
        .unwrap();
    let before = snapshot(&f.db.url).await;
    for id in ["no-such-receipt", "cancel-1"] {
        let err = sqlx::query(
            "UPDATE lc_exec_inputs SET state = 'sent', send_transition_id = $2 \
              WHERE exec_id = $1 AND input_seq = 2",
        )
        .bind(x.0)
        .bind(id)
        .execute(&mut c)
        .await
        .unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS06"),
            "{id}"
        );
    }
    assert_eq!(snapshot(&f.db.url).await, before);
    f.sampler.stop().await;

    // The initial cut: a queued input alone (its other rows left out: only
    // it is the authority under test) quarantines it; a sent one does not
    // count.
    let empty = migrated_db().await;
    let (q, kind, inv) = first_claim(&empty.url).await;
    assert_eq!((q, kind.as_str()), (false, "initial_cut"));
    assert_eq!(inv["queued_inputs"], 0);
    for (state, quarantined) in [("queued", true), ("sent", false)] {
        let db = migrated_db().await;
        let mut c = PgConnection::connect(&db.url).await.unwrap();
        let tid = if state == "sent" {
            "'send-1-1'"
        } else {
            "NULL"
        };
        sqlx::raw_sql(&format!(
            "BEGIN; SET LOCAL session_replication_role = replica; \
             INSERT INTO lc_exec_inputs (exec_id, input_seq, bytes, sha256, eof, op_key, \
                 request_sha256, state, send_transition_id, queued_floor_us, queued_submicro_ns) \
             VALUES (1, 1, 'x'::bytea, sha256('x'::bytea), false, 'k', \
                 decode(repeat('00', 32), 'hex'), '{state}', {tid}, 0, 0); COMMIT;"
        ))
        .execute(&mut c)
        .await
        .unwrap();
        let (q, kind, inv) = first_claim(&db.url).await;
        assert_eq!(
            (q, kind.as_str()),
            if quarantined {
                (true, "initial_quarantine")
            } else {
                (false, "initial_cut")
            },
            "{state}"
        );
        assert_eq!(inv["queued_inputs"], i64::from(quarantined), "{state}");
    }
}

#[tokio::test]
async fn concurrent_inputs_get_consecutive_seqs_and_a_racing_replay_one_input() {
    let f = fixture(3).await;
    let at = certain(&f.clock).await;
    let e = active_exec(&f, "e", at, true).await;
    let x = e.exec_id;
    // Six distinct keys at once: seqs 1..=6, each once.
    let s = |i: u8| {
        let key = format!("k{i}");
        let f = &f;
        async move { send(f, &key, at, x, &[b'a' + i], false).await.unwrap() }
    };
    let (r0, r1, r2, r3, r4, r5) = tokio::join!(s(0), s(1), s(2), s(3), s(4), s(5));
    let mut got: Vec<(i64, Vec<u8>)> = [r0, r1, r2, r3, r4, r5]
        .into_iter()
        .map(|r| (r.input_seq, r.bytes))
        .collect();
    got.sort();
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    let mut bytes: Vec<u8> = got.iter().map(|(_, b)| b[0]).collect();
    bytes.sort();
    assert_eq!(bytes, b"abcdef");
    // The queue holds them in seq order with the bytes each got.
    let a = token(0x66);
    let o = f.store.take_over(&a, f.tenant, x, at, TTL).await.unwrap();
    let q = f
        .store
        .queued_inputs(&cred_of(&o, &a), x, at, 10)
        .await
        .unwrap();
    assert_eq!(
        q.into_iter()
            .map(|r| (r.input_seq, r.bytes))
            .collect::<Vec<_>>(),
        got
    );
    // One key twice at once: one input, the same record for both.
    let (r1, r2) = tokio::join!(
        send(&f, "same", at, x, b"once", false),
        send(&f, "same", at, x, b"once", false),
    );
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert_eq!(r1, r2);
    assert_eq!(r1, queued(x, 7, b"once", false));
    assert_eq!(counts(&f.db.url).await.0, 7);
    f.sampler.stop().await;
}
