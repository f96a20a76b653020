//! Fault injection: named points between the steps of the page protocol
//! (and of input delivery, hibernation and resume) where a gateway can be made to die, so tests on
//! real processes can prove that a successor finishes every page, and
//! delivers every input, exactly once.
//!
//! The switch is the environment variable [`CRASH_AT_ENV`]
//! (`LC_GATEWAY_CRASH_AT=<point>`), read once at start-up
//! ([`CrashPoint::from_env`]); an unknown value is a start-up error. When
//! set, the gateway calls its [`FaultHook`] on reaching that point; the
//! binary's hook sends `SIGKILL` to its own process. Production runs leave
//! the variable unset: then no point does anything.

use std::fmt;

/// The environment variable naming the crash point.
pub const CRASH_AT_ENV: &str = "LC_GATEWAY_CRASH_AT";

/// A point between two steps of the page protocol or of input delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// The pages' metadata and ACK intent are committed; nothing is in the
    /// sink yet.
    AfterMetadata,
    /// The pages' bytes are durable in the sink; the ACK result is not
    /// committed.
    AfterSink,
    /// The ACK result is committed; the supervisor has not been told.
    AfterAckResult,
    /// Just before the supervisor is told to drop the acked pages (after
    /// [`CrashPoint::AfterAckResult`] and anything between).
    BeforeSupervisorAck,
    /// The supervisor accepted an input (`send`); its `send` receipt is not
    /// committed, so the input is still `queued` in the store and a
    /// successor delivers the same input seq again (the supervisor writes
    /// it to stdin once).
    AfterSend,
    /// The supervisor was told to stop the command of a sealed hibernation
    /// (`stop`); its stopped page may not be acked yet. A successor's stop
    /// answers that it is stopped already.
    AfterStop,
    /// The stopped page is acked in the store and at the supervisor; the
    /// workspace is not quiesced yet.
    AfterStoppedAck,
    /// The provider quiesced the workspace (manifest and signed statement
    /// in hand); the quiescence is not committed. A successor's quiesce
    /// answers the same head.
    AfterQuiesce,
    /// The resume is prepared (Reservation and Lease g+1 allocating); the
    /// owner has not seen the attachment yet.
    AfterPrepareResume,
    /// The attachment of Lease g+1 is recorded; the resume is not
    /// committed. A successor commits it (a replay returns the one receipt).
    BeforeCommitResume,
}

impl CrashPoint {
    /// Every point, in protocol order.
    pub const ALL: [CrashPoint; 10] = [
        CrashPoint::AfterMetadata,
        CrashPoint::AfterSink,
        CrashPoint::AfterAckResult,
        CrashPoint::BeforeSupervisorAck,
        CrashPoint::AfterSend,
        CrashPoint::AfterStop,
        CrashPoint::AfterStoppedAck,
        CrashPoint::AfterQuiesce,
        CrashPoint::AfterPrepareResume,
        CrashPoint::BeforeCommitResume,
    ];

    /// The points of the page protocol, in order (reached by every exec
    /// with output).
    pub const PAGE_PROTOCOL: [CrashPoint; 4] = [
        CrashPoint::AfterMetadata,
        CrashPoint::AfterSink,
        CrashPoint::AfterAckResult,
        CrashPoint::BeforeSupervisorAck,
    ];

    /// The points of hibernation and resume, in order.
    pub const HIBERNATION: [CrashPoint; 5] = [
        CrashPoint::AfterStop,
        CrashPoint::AfterStoppedAck,
        CrashPoint::AfterQuiesce,
        CrashPoint::AfterPrepareResume,
        CrashPoint::BeforeCommitResume,
    ];

    /// The point's name: `after_metadata`, `after_sink`, `after_ack_result`,
    /// `before_supervisor_ack`, `after_send`, `after_stop`,
    /// `after_stopped_ack`, `after_quiesce`, `after_prepare_resume` or
    /// `before_commit_resume`.
    pub fn as_str(self) -> &'static str {
        match self {
            CrashPoint::AfterMetadata => "after_metadata",
            CrashPoint::AfterSink => "after_sink",
            CrashPoint::AfterAckResult => "after_ack_result",
            CrashPoint::BeforeSupervisorAck => "before_supervisor_ack",
            CrashPoint::AfterSend => "after_send",
            CrashPoint::AfterStop => "after_stop",
            CrashPoint::AfterStoppedAck => "after_stopped_ack",
            CrashPoint::AfterQuiesce => "after_quiesce",
            CrashPoint::AfterPrepareResume => "after_prepare_resume",
            CrashPoint::BeforeCommitResume => "before_commit_resume",
        }
    }

    /// The point named `s`.
    ///
    /// # Errors
    /// [`UnknownCrashPoint`] (code `invalid_crash_point`) naming the
    /// accepted names.
    pub fn parse(s: &str) -> Result<CrashPoint, UnknownCrashPoint> {
        CrashPoint::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownCrashPoint(s.to_owned()))
    }

    /// The point [`CRASH_AT_ENV`] names, `None` when it is unset or empty.
    ///
    /// # Errors
    /// [`UnknownCrashPoint`] for any other value (also one that is not
    /// UTF-8).
    pub fn from_env() -> Result<Option<CrashPoint>, UnknownCrashPoint> {
        match std::env::var_os(CRASH_AT_ENV) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => match v.to_str() {
                Some(s) => CrashPoint::parse(s).map(Some),
                None => Err(UnknownCrashPoint(v.to_string_lossy().into_owned())),
            },
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A [`CRASH_AT_ENV`] value that names no [`CrashPoint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{CRASH_AT_ENV}={0:?} names no crash point; use after_metadata, after_sink, after_ack_result, before_supervisor_ack, after_send, after_stop, after_stopped_ack, after_quiesce, after_prepare_resume or before_commit_resume, or unset it"
)]
pub struct UnknownCrashPoint(pub String);

impl UnknownCrashPoint {
    /// The stable code: `invalid_crash_point`.
    pub fn code(&self) -> &'static str {
        "invalid_crash_point"
    }
}

/// What happens at the configured crash point. The binary's hook kills
/// the process (`SIGKILL`) and never returns; a test's hook may record the
/// point and return, and the gateway then abandons the exec's step as if
/// it had died there.
pub trait FaultHook: Send + Sync {
    /// Called once each time the configured point is reached.
    fn reached(&self, point: CrashPoint);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for p in CrashPoint::ALL {
            assert_eq!(CrashPoint::parse(p.as_str()), Ok(p));
        }
        let e = CrashPoint::parse("after_everything").unwrap_err();
        assert_eq!(e.code(), "invalid_crash_point");
        assert_eq!(
            e.to_string(),
            "LC_GATEWAY_CRASH_AT=\"after_everything\" names no crash point; use after_metadata, after_sink, after_ack_result, before_supervisor_ack, after_send, after_stop, after_stopped_ack, after_quiesce, after_prepare_resume or before_commit_resume, or unset it"
        );
        assert!(CrashPoint::parse("AFTER_SINK").is_err());
    }
}
