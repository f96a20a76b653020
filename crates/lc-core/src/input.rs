//! Input for a command's stdin: what a client may queue, and how the exec's
//! owner records that it delivered it.
//!
//! # Rules
//!
//! * **Stdin open.** Only an exec admitted with
//!   [`crate::ExecRequest::stdin_open`] takes input; a terminal exec takes
//!   none.
//! * **Order.** An exec's inputs have seqs `1, 2, ...` without gaps, in the
//!   order the store accepted them; each carries at most
//!   [`INPUT_BYTES_MAX`] bytes, and an input of no bytes must close stdin
//!   (`eof`). Nothing follows an `eof` input.
//! * **Bound** ([`plan_input`]): at most [`INPUT_QUEUE_INPUTS_MAX`] inputs
//!   and [`INPUT_QUEUE_BYTES_MAX`] bytes are queued (accepted, not yet
//!   delivered) per exec at once, so a client cannot grow the queue
//!   without bound while no gateway delivers it.
//! * **Delivery** ([`check_send`]): the owner delivers queued inputs in seq
//!   order. The supervisor writes each input seq to the command's stdin
//!   once, so an owner that dies after delivering and before recording it
//!   lets its successor deliver the same seq again harmlessly; the `send`
//!   receipt then marks the input `sent`.
//!
//! No function here reads a clock or does I/O.

use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::model::{Digest, ExecId};

/// The most bytes one input carries: what the supervisor writes in one
/// `send` request ([`crate::page::INPUT_BYTES_MAX`], 64 KiB), so each
/// stored input is delivered whole under its own seq.
pub const INPUT_BYTES_MAX: usize = crate::page::INPUT_BYTES_MAX;

/// The most inputs queued (accepted, not yet delivered) per exec: 16. A
/// live gateway drains the queue within a heartbeat; a client that keeps
/// sending while none delivers is refused instead of growing the store.
pub const INPUT_QUEUE_INPUTS_MAX: u32 = 16;

/// The most bytes queued per exec: 256 KiB (4 full inputs), so many small
/// inputs meet [`INPUT_QUEUE_INPUTS_MAX`] first and a few large ones this.
pub const INPUT_QUEUE_BYTES_MAX: u64 = 262_144;

/// Where an input is in its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputState {
    /// Accepted from the client; not yet recorded as delivered.
    Queued,
    /// Delivered to the supervisor; its `send` receipt is committed.
    Sent,
}

impl InputState {
    /// The state's wire name: `queued` or `sent`.
    pub fn as_str(self) -> &'static str {
        match self {
            InputState::Queued => "queued",
            InputState::Sent => "sent",
        }
    }

    /// The state named `s`, if any.
    pub fn parse(s: &str) -> Option<InputState> {
        match s {
            "queued" => Some(InputState::Queued),
            "sent" => Some(InputState::Sent),
            _ => None,
        }
    }
}

/// One input of an exec as the store records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRecord {
    /// The exec.
    pub exec_id: ExecId,
    /// `1..`, consecutive within the exec.
    pub input_seq: i64,
    /// The bytes for the command's stdin (`0..=`[`INPUT_BYTES_MAX`]).
    pub bytes: Vec<u8>,
    /// SHA-256 of `bytes`.
    pub sha256: Digest,
    /// Whether stdin closes after these bytes.
    pub eof: bool,
    /// Queued or sent.
    pub state: InputState,
    /// The transition id of the `send` receipt, once sent.
    pub send_transition_id: Option<String>,
}

/// An exec's input queue as the store counts it before accepting one more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InputQueue {
    /// The highest input seq stored (0 if none).
    pub last_seq: i64,
    /// Inputs queued, not yet sent.
    pub queued_inputs: u32,
    /// Bytes of the queued inputs.
    pub queued_bytes: u64,
    /// The seq of the `eof` input, if one is stored.
    pub eof_seq: Option<i64>,
}

/// The seq the next input of the exec gets, if it may be accepted:
/// `queue.last_seq + 1`.
///
/// # Errors
/// In this order: [`LcError::ExecTerminal`] (`terminal`);
/// [`LcError::StdinNotOpen`] (admitted without stdin open);
/// [`LcError::InvalidInput`] (more than [`INPUT_BYTES_MAX`] bytes, or no
/// bytes without `eof`); [`LcError::InputClosed`] (an `eof` input is
/// stored); [`LcError::InputQueueFull`] (one more would exceed
/// [`INPUT_QUEUE_INPUTS_MAX`] inputs or [`INPUT_QUEUE_BYTES_MAX`] bytes).
pub fn plan_input(
    exec_id: ExecId,
    stdin_open: bool,
    terminal: bool,
    queue: &InputQueue,
    bytes_len: usize,
    eof: bool,
) -> Result<i64, LcError> {
    if terminal {
        return Err(LcError::ExecTerminal { exec_id });
    }
    if !stdin_open {
        return Err(LcError::StdinNotOpen { exec_id });
    }
    if bytes_len > INPUT_BYTES_MAX {
        return Err(LcError::InvalidInput {
            reason: format!(
                "{bytes_len} bytes is more than the {INPUT_BYTES_MAX} one input carries; split it"
            ),
        });
    }
    if bytes_len == 0 && !eof {
        return Err(LcError::InvalidInput {
            reason: "an input of no bytes must close stdin (eof: true)".into(),
        });
    }
    if let Some(eof_seq) = queue.eof_seq {
        return Err(LcError::InputClosed { exec_id, eof_seq });
    }
    let bytes_after = queue.queued_bytes.saturating_add(bytes_len as u64);
    if queue.queued_inputs >= INPUT_QUEUE_INPUTS_MAX || bytes_after > INPUT_QUEUE_BYTES_MAX {
        return Err(LcError::InputQueueFull {
            exec_id,
            queued_inputs: queue.queued_inputs,
            queued_bytes: queue.queued_bytes,
            inputs_max: INPUT_QUEUE_INPUTS_MAX,
            bytes_max: INPUT_QUEUE_BYTES_MAX,
        });
    }
    Ok(queue.last_seq + 1)
}

/// SHA-256 of a client's input request (its bytes' digest and `eof`), kept
/// with the input: the same operation key with other bytes or another
/// `eof` is refused.
pub fn input_request_sha256(bytes_sha256: Digest, eof: bool) -> Digest {
    Digest::of(format!("input\nsha256={}\neof={eof}", bytes_sha256.to_hex()).as_bytes())
}

/// The canonical arguments of the `send` transition of `input`, for
/// [`crate::owner::transition_request_sha256`]: its seq, its bytes' digest
/// and `eof`.
pub fn send_args(input: &InputRecord) -> String {
    format!(
        "input_seq={} sha256={} eof={}",
        input.input_seq,
        input.sha256.to_hex(),
        input.eof
    )
}

/// Checks that the owner may record `input` as sent now: it is queued and
/// every earlier input is sent (`sent_through`, the highest sent seq, is
/// `input.input_seq - 1`), since the supervisor writes inputs in seq order.
///
/// # Errors
/// [`LcError::InvalidInput`] naming what is wrong: already sent (under
/// which transition), or an earlier input still queued.
pub fn check_send(input: &InputRecord, sent_through: i64) -> Result<(), LcError> {
    if input.state == InputState::Sent {
        return Err(LcError::InvalidInput {
            reason: format!(
                "input {} of exec {} is already recorded sent by transition {:?}",
                input.input_seq,
                input.exec_id,
                input.send_transition_id.as_deref().unwrap_or("")
            ),
        });
    }
    if sent_through != input.input_seq - 1 {
        return Err(LcError::InvalidInput {
            reason: format!(
                "input {} of exec {} is out of order: inputs are sent by seq and input {} is the next",
                input.input_seq,
                input.exec_id,
                sent_through + 1
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: ExecId = ExecId(7);

    fn queue(last_seq: i64, queued_inputs: u32, queued_bytes: u64) -> InputQueue {
        InputQueue {
            last_seq,
            queued_inputs,
            queued_bytes,
            eof_seq: None,
        }
    }

    #[test]
    fn the_next_input_continues_the_seqs() {
        assert_eq!(plan_input(E, true, false, &queue(0, 0, 0), 5, false), Ok(1));
        assert_eq!(
            plan_input(E, true, false, &queue(41, 3, 10), 0, true),
            Ok(42)
        );
        assert_eq!(
            plan_input(E, true, false, &queue(3, 0, 0), INPUT_BYTES_MAX, false),
            Ok(4)
        );
    }

    #[test]
    fn refusals_come_in_their_order() {
        let closed = InputQueue {
            eof_seq: Some(2),
            ..queue(2, 16, 0)
        };
        let code = |r: Result<i64, LcError>| r.unwrap_err().code();
        assert_eq!(
            code(plan_input(E, false, true, &closed, 0, false)),
            "exec_terminal"
        );
        assert_eq!(
            code(plan_input(E, false, false, &closed, 0, false)),
            "stdin_not_open"
        );
        assert_eq!(
            code(plan_input(
                E,
                true,
                false,
                &closed,
                INPUT_BYTES_MAX + 1,
                false
            )),
            "invalid_input"
        );
        assert_eq!(
            code(plan_input(E, true, false, &closed, 0, false)),
            "invalid_input"
        );
        assert_eq!(
            plan_input(E, true, false, &closed, 1, false),
            Err(LcError::InputClosed {
                exec_id: E,
                eof_seq: 2
            })
        );
    }

    #[test]
    fn the_queue_is_bounded_by_inputs_and_bytes() {
        assert_eq!(
            (INPUT_QUEUE_INPUTS_MAX, INPUT_QUEUE_BYTES_MAX),
            (16, 256 * 1024)
        );
        let full = |q: InputQueue, len: usize| {
            plan_input(E, true, false, &q, len, false)
                == Err(LcError::InputQueueFull {
                    exec_id: E,
                    queued_inputs: q.queued_inputs,
                    queued_bytes: q.queued_bytes,
                    inputs_max: INPUT_QUEUE_INPUTS_MAX,
                    bytes_max: INPUT_QUEUE_BYTES_MAX,
                })
        };
        assert!(full(queue(16, 16, 16), 1));
        assert_eq!(
            plan_input(E, true, false, &queue(15, 15, 15), 1, false),
            Ok(16)
        );
        assert!(full(queue(2, 1, INPUT_QUEUE_BYTES_MAX - 1), 2));
        assert_eq!(
            plan_input(
                E,
                true,
                false,
                &queue(2, 1, INPUT_QUEUE_BYTES_MAX - 2),
                2,
                false
            ),
            Ok(3)
        );
    }

    fn input(seq: i64, state: InputState) -> InputRecord {
        InputRecord {
            exec_id: E,
            input_seq: seq,
            bytes: b"ab".to_vec(),
            sha256: Digest::of(b"ab"),
            eof: false,
            state,
            send_transition_id: (state == InputState::Sent).then(|| "send-1-3".to_owned()),
        }
    }

    #[test]
    fn inputs_are_sent_in_seq_order_once() {
        assert_eq!(check_send(&input(3, InputState::Queued), 2), Ok(()));
        assert_eq!(
            check_send(&input(3, InputState::Queued), 1)
                .unwrap_err()
                .to_string(),
            "invalid input: input 3 of exec 7 is out of order: inputs are sent by seq and input 2 is the next"
        );
        assert_eq!(
            check_send(&input(3, InputState::Sent), 3)
                .unwrap_err()
                .to_string(),
            "invalid input: input 3 of exec 7 is already recorded sent by transition \"send-1-3\""
        );
    }

    #[test]
    fn request_digests_cover_bytes_and_eof() {
        let d = Digest::of(b"x");
        assert_ne!(
            input_request_sha256(d, false),
            input_request_sha256(d, true)
        );
        assert_ne!(
            input_request_sha256(d, false),
            input_request_sha256(Digest::of(b"y"), false)
        );
        assert_eq!(
            send_args(&input(3, InputState::Queued)),
            format!(
                "input_seq=3 sha256={} eof=false",
                Digest::of(b"ab").to_hex()
            )
        );
        assert_eq!(InputState::parse("sent"), Some(InputState::Sent));
        assert_eq!(
            InputState::parse(InputState::Queued.as_str()),
            Some(InputState::Queued)
        );
        assert_eq!(InputState::parse("gone"), None);
    }
}
