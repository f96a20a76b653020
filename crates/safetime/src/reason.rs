//! Why the cut is uncertain ([`UncertainReason`], with its stable codes)
//! and how a reader judges one reading of the persisted cut
//! ([`judge_reading`]).

use std::fmt;

use jiff::SignedDuration;

/// Why the cut is uncertain. The string forms ([`UncertainReason::code`])
/// are stable: they are persisted, exported as metric labels and shown by
/// `tollgate status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UncertainReason {
    /// A new epoch began (sampler restart or leader change); elapsed time
    /// across it is vouched for only by a cut a sampler process carried
    /// across it ([`crate::carry`]), and the epoch starts uncertain either
    /// way.
    NewEpoch,
    /// The database's system identifier, timeline, recovery state or
    /// postmaster start time changed (failover, restart, promotion).
    PrimaryChange,
    /// The sampler is connected to a server in recovery (a standby).
    InRecovery,
    /// Database time advanced more than monotonic time plus the allowance.
    ClockStepForward,
    /// Database time advanced less than monotonic time less the allowance
    /// (or went back).
    ClockStepBackward,
    /// An observation that cannot be trusted: a round trip longer than the
    /// bound, or a monotonic reading that went backwards.
    ImplausibleObservation,
    /// More than the sampling-gap bound passed between samples.
    SamplingGap,
    /// Anomalies have stopped; waiting for enough stable observations and
    /// the grace period.
    Recovering,
    /// The installation started quarantined at the Unix epoch and the
    /// full-horizon proof has not finished.
    InitialQuarantine,
    /// (Readers only.) The newest published cut is older than the
    /// sampling-gap bound: the sampler is stopped, paused or cut off.
    Stale,
    /// (Readers only.) No sampler has ever published a cut.
    NoCut,
}

impl UncertainReason {
    /// Every reason, in declaration order.
    pub const ALL: [UncertainReason; 11] = [
        UncertainReason::NewEpoch,
        UncertainReason::PrimaryChange,
        UncertainReason::InRecovery,
        UncertainReason::ClockStepForward,
        UncertainReason::ClockStepBackward,
        UncertainReason::ImplausibleObservation,
        UncertainReason::SamplingGap,
        UncertainReason::Recovering,
        UncertainReason::InitialQuarantine,
        UncertainReason::Stale,
        UncertainReason::NoCut,
    ];

    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            UncertainReason::NewEpoch => "new_epoch",
            UncertainReason::PrimaryChange => "primary_change",
            UncertainReason::InRecovery => "in_recovery",
            UncertainReason::ClockStepForward => "clock_step_forward",
            UncertainReason::ClockStepBackward => "clock_step_backward",
            UncertainReason::ImplausibleObservation => "implausible_observation",
            UncertainReason::SamplingGap => "sampling_gap",
            UncertainReason::Recovering => "recovering",
            UncertainReason::InitialQuarantine => "initial_quarantine",
            UncertainReason::Stale => "stale",
            UncertainReason::NoCut => "no_cut",
        }
    }

    /// Parses a [`code`](UncertainReason::code); `None` for anything else.
    pub fn from_code(code: &str) -> Option<UncertainReason> {
        UncertainReason::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Whether this reason is an anomaly: it resets the recovery count and
    /// restarts any quarantine proof. `Recovering` and `InitialQuarantine`
    /// describe waiting, not a new anomaly.
    pub fn is_anomaly(&self) -> bool {
        !matches!(
            self,
            UncertainReason::Recovering | UncertainReason::InitialQuarantine
        )
    }
}

impl fmt::Display for UncertainReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// How a reader judges one reading of the persisted cut: a cut older than
/// the sampling-gap bound counts as uncertain, because nobody vouches for
/// the time since. The one rule behind every reader of the cut (Tollgate's
/// safe-cut clock, `tollgate-safetime status`).
///
/// * `published`: the publisher's reason (`None`: it declared the cut
///   certain).
/// * `row_age`: the database's time at the read minus the database's time
///   of the last publish (`db_now - published_at`); both instants are the
///   database's, so no host clock enters.
/// * `unchanged_for`: how long this reader has seen the same
///   `(epoch, publish_seq)`, on its own monotonic clock (zero for a one-off
///   read).
/// * `gap_max`: the sampling-gap bound.
///
/// Returns [`UncertainReason::Stale`] when `row_age` or `unchanged_for`
/// exceeds `gap_max` (exactly `gap_max` is still fresh); stale takes
/// precedence over the publisher's reason, which describes a past state
/// nobody is updating. Otherwise returns `published`.
pub fn judge_reading(
    published: Option<UncertainReason>,
    row_age: SignedDuration,
    unchanged_for: SignedDuration,
    gap_max: SignedDuration,
) -> Option<UncertainReason> {
    if row_age > gap_max || unchanged_for > gap_max {
        Some(UncertainReason::Stale)
    } else {
        published
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_codes_round_trip() {
        for r in UncertainReason::ALL {
            assert_eq!(UncertainReason::from_code(r.code()), Some(r));
        }
        assert_eq!(UncertainReason::from_code("nope"), None);
        assert!(UncertainReason::NewEpoch.is_anomaly());
        assert!(!UncertainReason::Recovering.is_anomaly());
    }

    #[test]
    fn judge_reading_boundaries() {
        let gap = SignedDuration::from_secs(2);
        let ns = SignedDuration::from_nanos(1);
        let zero = SignedDuration::ZERO;
        let cases = [
            // (published, row_age, unchanged_for, expected)
            (None, zero, zero, None),
            (None, gap, gap, None),
            (None, gap + ns, zero, Some(UncertainReason::Stale)),
            (None, zero, gap + ns, Some(UncertainReason::Stale)),
            (
                Some(UncertainReason::SamplingGap),
                gap,
                zero,
                Some(UncertainReason::SamplingGap),
            ),
            (
                Some(UncertainReason::ClockStepForward),
                gap + ns,
                zero,
                Some(UncertainReason::Stale),
            ),
            (
                Some(UncertainReason::Recovering),
                zero,
                gap + ns,
                Some(UncertainReason::Stale),
            ),
            // A negative row age (clock stepped back since the publish).
            (None, -gap, zero, None),
        ];
        for (published, row_age, unchanged_for, expected) in cases {
            assert_eq!(
                judge_reading(published, row_age, unchanged_for, gap),
                expected,
                "{published:?} age {row_age} unchanged {unchanged_for}"
            );
        }
    }
}
