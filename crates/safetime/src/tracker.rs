//! The cut tracker: how the *safe expiry cut* moves.
//!
//! The cut is the persisted instant before which no authority may be
//! treated as expired: every deadline of every subsystem is judged against
//! it, never against a host clock, so a clock that jumps cannot expire
//! anything early. A single leader (the sampler) proposes it from
//! [`Observation`]s: database time and topology read in one query,
//! bracketed by the sampler host's monotonic clock. This module is the pure
//! decision procedure ([`CutTracker`]); the database functions of migration
//! 0018 apply the same caps again (never backward, never past database
//! time, only from the current epoch) so a faulty proposal cannot move the
//! cut past what PostgreSQL observes.
//!
//! # How the cut moves
//!
//! Between two consecutive observations `p` and `o` of one epoch:
//!
//! * `lo = o.mono_before - p.mono_after` and `hi = o.mono_after -
//!   p.mono_before` bound the host monotonic time that passed between the
//!   two database reads (each read happened somewhere inside its own round
//!   trip).
//! * The observation is *consistent* when the database's elapsed time
//!   `db = o.db_now - p.db_now` lies in `[lo - slack, hi + slack]` with
//!   `slack = hi * drift_ppm / 10^6`: the drift allowance plus the round
//!   trip. Above that range is a forward clock step, below it a backward one.
//! * Consistent: the cut advances by `min(db, hi * (1 - drift))`, so it never
//!   gains on database time and never outruns the monotonic window less the
//!   drift allowance. Anything else (a step, a gap, a topology change, an
//!   implausible round trip): it advances by only `max(lo, 0) * (1 - drift)`,
//!   the elapsed time the monotonic clock vouches for (by `hi` instead when
//!   readings that break the rules of time make `hi < lo`).
//! * The first observation of an epoch has no predecessor: it is an
//!   anomaly (the epoch starts uncertain) and advances the cut by nothing,
//!   or, given a cut carried across the new epoch ([`CutTracker::with_carry`],
//!   [`crate::carry`]), by up to what that carry vouches for at its answer:
//!   the carried cut plus the monotonic time since it was read, less the
//!   drift allowance.
//! * Whatever the observation, the cut therefore never decreases, never
//!   passes database time and (but for the quarantine's clearing, below)
//!   never advances by more than `hi * (1 - drift)`, or on an epoch's first
//!   observation past the carried bound. [`CutTracker`] asserts
//!   these at both ends of every observation: a violation is a bug, not an
//!   input to handle.
//! * The proposal is capped at the observed database time and never goes
//!   below the current cut.
//!
//! Consequently a forward step of the database clock is never caught up:
//! the cut keeps advancing at the monotonic rate and stays behind database
//! time by the step (the *cut lag*). Availability may be late; acknowledged
//! authority never expires early. A backward step freezes the cut until
//! database time passes it again.
//!
//! # Certainty
//!
//! The cut is *uncertain* from the start of every epoch (a sampler restart
//! or leader change, whether or not a cut is carried across it) and after
//! any anomaly ([`UncertainReason`]). It becomes
//! certain again after [`SafeTimeConfig::stable_observations_min`]
//! consecutive consistent observations *and* at least
//! [`SafeTimeConfig::recovery_grace`] of monotonic time since the last
//! anomaly: one consistent observation right after an anomaly could be a
//! coincidence, and recovery needs both many samples and enough time.
//!
//! # Initial quarantine
//!
//! An installation that may already hold deadline-bearing authority starts
//! its cut at the Unix epoch, *quarantined* (uncertain, reason
//! [`UncertainReason::InitialQuarantine`]). Only an uninterrupted run of at
//! least the sealed horizon of trusted monotonic time (less the drift
//! allowance) within one epoch clears it; any anomaly, restart or takeover
//! restarts that proof from zero, and a quarantined epoch ignores any
//! carried cut (the quarantined cut stays far behind every expiry). At clearing the cut moves to database
//! time: every authority issued before the quarantine has a deadline within
//! one horizon of its issue, so it has expired by then, and while
//! quarantined nothing new was admitted and no renewal could extend past
//! its current expiry (the cut was far behind).

use jiff::{SignedDuration, Timestamp};

use crate::carry::CarriedCut;
use crate::config::SafeTimeConfig;
use crate::reason::UncertainReason;

/// Where the sampler's database is, as one observation sees it. Any change
/// between two observations is a [`UncertainReason::PrimaryChange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// `pg_control_system().system_identifier` (shared by a primary and its
    /// physical standbys).
    pub system_identifier: i64,
    /// The server's current WAL timeline (0 while in recovery).
    pub timeline_id: i64,
    /// `pg_is_in_recovery()`.
    pub in_recovery: bool,
    /// `pg_postmaster_start_time()`: changes on every server restart.
    pub postmaster_start: Timestamp,
}

/// One sample: database time and topology from a single query, bracketed by
/// the sampler host's monotonic clock (nanoseconds since an arbitrary
/// per-process origin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// `clock_timestamp()` inside the query.
    pub db_now: Timestamp,
    /// The database's topology at that moment.
    pub topology: Topology,
    /// Monotonic nanoseconds just before the query was sent.
    pub mono_before_ns: u64,
    /// Monotonic nanoseconds just after its answer arrived.
    pub mono_after_ns: u64,
}

/// What the sampler should publish after an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The proposed cut: never below the current cut, never above the
    /// observation's database time (unless the cut already is).
    pub proposal: Timestamp,
    /// `None` when certain; otherwise why not.
    pub uncertain: Option<UncertainReason>,
    /// This observation was an anomaly: the database restarts any
    /// quarantine proof from zero.
    pub anomaly: bool,
    /// The initial quarantine's full-horizon proof completed with this
    /// observation; the proposal is database time.
    pub clears_quarantine: bool,
    /// Whether the observation may be published at all (`false` while
    /// connected to a server in recovery, which cannot accept writes).
    pub publishable: bool,
    /// The database time of the observation the proposal came from: the
    /// publish is dated by it, so the time between this observation and
    /// the publish (a paused sampler included) counts in every reader's
    /// staleness bound.
    pub observed_at: Timestamp,
}

/// The sampler's in-memory state for one epoch; see the module docs. It
/// starts uncertain ([`UncertainReason::NewEpoch`], or
/// [`UncertainReason::InitialQuarantine`] when quarantined) and is fed one
/// [`Observation`] at a time with [`CutTracker::observe`]; after each
/// publish the database's accepted cut is fed back with
/// [`CutTracker::accepted`].
///
/// # Invariants
///
/// Checked at both ends of every [`CutTracker::observe`] (a violation is a
/// bug in this module, so it panics with the rule it broke):
///
/// * the proposal never goes below the current cut, and never above
///   `max(cut, db_now)` (the cut never passes database time);
/// * except when the initial quarantine clears, the cut advances by at most
///   the monotonic window `hi = o.mono_after - p.mono_before` less the
///   drift allowance (on an epoch's first observation: by nothing, or to
///   no more than the carried cut's bound, [`CarriedCut::vouched_at`]);
/// * while quarantined the reason is [`UncertainReason::InitialQuarantine`],
///   and a certain cut has at least
///   [`SafeTimeConfig::stable_observations_min`] consistent observations
///   behind it.
///
/// Observations that break the rules of time (a round trip that ends before
/// it starts, a sample sent before the previous answer) are operating
/// errors, not bugs: they are anomalies
/// ([`UncertainReason::ImplausibleObservation`]), never panics.
#[derive(Debug, Clone)]
pub struct CutTracker {
    config: SafeTimeConfig,
    horizon_ns: i128,
    cut_ns: i128,
    /// `None` until the epoch's first observation.
    history: Option<History>,
    stable: u32,
    uncertain: Option<UncertainReason>,
    quarantined: bool,
    start_reason: UncertainReason,
    /// What the sampler process carried across the new epoch, if anything.
    carried: Option<CarriedCut>,
}

/// What the tracker remembers of the observations so far in its epoch.
#[derive(Debug, Clone, Copy)]
struct History {
    /// The previous observation.
    prev: Observation,
    /// `mono_after_ns` of the last anomaly: recovery's calm and the
    /// quarantine's proof are both measured from it. The epoch's first
    /// observation is always an anomaly, so there always is one.
    anomaly_after_ns: u64,
}

/// How one observation relates to the previous one of its epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    /// `Some`: the anomaly it is.
    anomaly: Option<UncertainReason>,
    /// How far the cut may advance on this observation's evidence, before
    /// the cap at database time.
    advance_ns: i128,
    /// The monotonic window less the drift allowance, `trusted(hi)`: no
    /// advance may exceed it (on an epoch's first observation: 0, or the
    /// carried bound above the cut).
    advance_max_ns: i128,
}

/// The monotonic brackets of two consecutive observations `p` and `o`, in
/// nanoseconds (any of them may be negative when the readings break the
/// rules of time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// `o.mono_before - p.mono_after`: the least time that passed between
    /// the two database reads.
    pub(crate) lo_ns: i128,
    /// `o.mono_after - p.mono_before`: the most time that passed.
    pub(crate) hi_ns: i128,
    /// `o.mono_after - o.mono_before`: this observation's round trip.
    pub(crate) rtt_ns: i128,
}

impl Window {
    pub(crate) fn between(p: &Observation, o: &Observation) -> Window {
        Window {
            lo_ns: i128::from(o.mono_before_ns) - i128::from(p.mono_after_ns),
            hi_ns: i128::from(o.mono_after_ns) - i128::from(p.mono_before_ns),
            rtt_ns: i128::from(o.mono_after_ns) - i128::from(o.mono_before_ns),
        }
    }
}

/// One move of the cut, as [`assert_cut_move`] checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CutMove {
    /// The cut before the observation.
    before_ns: i128,
    /// The proposal.
    proposal_ns: i128,
    /// The observation's database time.
    db_now_ns: i128,
    /// [`Step::advance_max_ns`].
    advance_max_ns: i128,
    /// The proposal clears the initial quarantine.
    clears_quarantine: bool,
}

/// Panics unless `m` obeys the cut's rules (see [`CutTracker`]'s
/// invariants): a violation is a bug in the tracker, and publishing its
/// proposal could expire authority early.
fn assert_cut_move(m: CutMove) {
    assert!(
        m.proposal_ns >= m.before_ns,
        "the cut never decreases: proposal {} ns below the cut {} ns",
        m.proposal_ns,
        m.before_ns
    );
    assert!(
        m.proposal_ns <= m.before_ns.max(m.db_now_ns),
        "the cut never passes database time: proposal {} ns above max(cut {} ns, db_now {} ns)",
        m.proposal_ns,
        m.before_ns,
        m.db_now_ns
    );
    assert!(
        m.clears_quarantine || m.proposal_ns - m.before_ns <= m.advance_max_ns,
        "the cut never advances faster than monotonic time less the drift allowance: \
         advance {} ns above {} ns",
        m.proposal_ns - m.before_ns,
        m.advance_max_ns
    );
}

impl CutTracker {
    /// A tracker for a new epoch starting from the persisted `cut`.
    /// `quarantined`: the installation is in its initial quarantine.
    /// `horizon`: the sealed maximum-deadline horizon (the length of the
    /// quarantine proof).
    ///
    /// # Panics
    /// If `horizon` is negative (a [`crate::HorizonPolicy`]'s horizon is
    /// always positive).
    pub fn new(
        config: SafeTimeConfig,
        cut: Timestamp,
        quarantined: bool,
        horizon: SignedDuration,
    ) -> CutTracker {
        assert!(
            !horizon.is_negative(),
            "the maximum-deadline horizon is never negative, got {horizon}"
        );
        CutTracker {
            config,
            horizon_ns: horizon.as_nanos(),
            cut_ns: cut.as_nanosecond(),
            history: None,
            stable: 0,
            uncertain: Some(if quarantined {
                UncertainReason::InitialQuarantine
            } else {
                UncertainReason::NewEpoch
            }),
            quarantined,
            start_reason: UncertainReason::NewEpoch,
            carried: None,
        }
    }

    /// The same tracker, reporting `reason` (instead of
    /// [`UncertainReason::NewEpoch`]) for the epoch's first observation:
    /// the database's own finding at the claim, such as
    /// [`UncertainReason::PrimaryChange`] after a failover.
    pub fn with_start_reason(mut self, reason: UncertainReason) -> CutTracker {
        self.start_reason = reason;
        if !self.quarantined {
            self.uncertain = Some(reason);
        }
        self
    }

    /// The same tracker, starting its epoch from what this sampler process
    /// carried across it (see [`crate::carry`]): the first observation may
    /// advance the cut up to the carried bound at its answer, capped at its
    /// database time, and reports the anomaly the carry found
    /// ([`UncertainReason::PrimaryChange`] from the claim still comes
    /// first; no anomaly found leaves the start reason). It is still an
    /// anomaly: the epoch starts uncertain. Ignored while quarantined, and
    /// when the first observation is of another database system.
    pub fn with_carry(mut self, carried: CarriedCut) -> CutTracker {
        self.carried = Some(carried);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &SafeTimeConfig {
        &self.config
    }

    /// The cut as last accepted.
    pub fn cut(&self) -> Timestamp {
        ns_to_timestamp(self.cut_ns)
    }

    /// Whether the initial quarantine is still in force.
    pub fn quarantined(&self) -> bool {
        self.quarantined
    }

    /// Why the cut is uncertain now (`None`: certain).
    pub fn uncertain(&self) -> Option<UncertainReason> {
        self.uncertain
    }

    /// Consecutive consistent observations so far.
    pub fn stable_observations(&self) -> u32 {
        self.stable
    }

    /// Records the cut the database accepted for the last proposal (it may
    /// be lower: capped by the database's own time). Never moves the
    /// tracker's cut backward.
    pub fn accepted(&mut self, cut: Timestamp) {
        self.cut_ns = self.cut_ns.max(cut.as_nanosecond());
    }

    /// Classifies `obs` against the previous observation and proposes the
    /// next cut; see the module docs for the rules and [`CutTracker`] for
    /// the invariants checked at both ends.
    ///
    /// # Panics
    /// Only if an invariant is broken, which is a bug in this module.
    pub fn observe(&mut self, obs: Observation) -> Verdict {
        self.assert_state();
        let before_ns = self.cut_ns;
        let db_now_ns = obs.db_now.as_nanosecond();
        let (step, anomaly_after_ns) = match self.history {
            None => (self.first_step(&obs), obs.mono_after_ns),
            Some(h) => {
                let step = self.config.step(&h.prev, &obs);
                let since = if step.anomaly.is_some() {
                    obs.mono_after_ns
                } else {
                    h.anomaly_after_ns
                };
                (step, since)
            }
        };
        let clears_quarantine = match step.anomaly {
            Some(reason) => {
                self.record_anomaly(reason);
                false
            }
            None => self.record_consistent(&obs, anomaly_after_ns),
        };
        self.history = Some(History {
            prev: obs,
            anomaly_after_ns,
        });
        let proposal_ns = self.propose(step.advance_ns, db_now_ns, clears_quarantine);
        assert_cut_move(CutMove {
            before_ns,
            proposal_ns,
            db_now_ns,
            advance_max_ns: step.advance_max_ns,
            clears_quarantine,
        });
        self.assert_state();
        Verdict {
            proposal: ns_to_timestamp(proposal_ns),
            uncertain: self.uncertain,
            anomaly: step.anomaly.is_some(),
            clears_quarantine,
            publishable: !obs.topology.in_recovery,
            observed_at: obs.db_now,
        }
    }

    /// The epoch's first observation `obs`: always an anomaly (the start
    /// reason, or what the carried cut found, see
    /// [`CutTracker::with_carry`]); it advances the cut by nothing, or by
    /// up to the carried bound above the cut.
    fn first_step(&self, obs: &Observation) -> Step {
        let carry = match &self.carried {
            Some(c) if !self.quarantined => c.first_step(&self.config, obs),
            _ => None,
        };
        let Some(carry) = carry else {
            return Step {
                anomaly: Some(self.start_reason),
                advance_ns: 0,
                advance_max_ns: 0,
            };
        };
        let reason = match (self.start_reason, carry.anomaly) {
            (UncertainReason::PrimaryChange, _) | (_, None) => self.start_reason,
            (_, Some(found)) => found,
        };
        let advance_ns = (carry.bound_ns - self.cut_ns).max(0);
        Step {
            anomaly: Some(reason),
            advance_ns,
            advance_max_ns: advance_ns,
        }
    }

    /// An anomaly: recovery starts over, and so does any quarantine proof.
    fn record_anomaly(&mut self, reason: UncertainReason) {
        self.stable = 0;
        self.uncertain = Some(if self.quarantined {
            UncertainReason::InitialQuarantine
        } else {
            reason
        });
    }

    /// A consistent observation `obs`, `anomaly_after_ns` after the last
    /// anomaly: one more stable observation; recovered once there are
    /// enough of them and the grace has passed; and the quarantine clears
    /// (the return value) once, recovered, a full horizon of trusted time
    /// has run.
    fn record_consistent(&mut self, obs: &Observation, anomaly_after_ns: u64) -> bool {
        let cfg = self.config;
        self.stable = self.stable.saturating_add(1);
        let calm_ns = i128::from(obs.mono_before_ns) - i128::from(anomaly_after_ns);
        let recovered = self.stable >= cfg.stable_observations_min()
            && calm_ns >= cfg.recovery_grace().as_nanos();
        if self.quarantined {
            if recovered && cfg.trusted(calm_ns) >= self.horizon_ns {
                self.quarantined = false;
                self.uncertain = None;
                return true;
            }
            self.uncertain = Some(UncertainReason::InitialQuarantine);
        } else if recovered {
            self.uncertain = None;
        } else if self.uncertain.is_some() {
            self.uncertain = Some(UncertainReason::Recovering);
        }
        false
    }

    /// The next cut: database time when the quarantine clears; otherwise
    /// the cut advanced by `advance_ns` and capped at database time, never
    /// below the cut.
    fn propose(&self, advance_ns: i128, db_now_ns: i128, clears_quarantine: bool) -> i128 {
        if clears_quarantine {
            self.cut_ns.max(db_now_ns)
        } else {
            self.cut_ns.max((self.cut_ns + advance_ns).min(db_now_ns))
        }
    }

    /// Panics unless the tracker's state obeys its invariants (see
    /// [`CutTracker`]).
    fn assert_state(&self) {
        assert!(
            !self.quarantined || self.uncertain == Some(UncertainReason::InitialQuarantine),
            "a quarantined cut is uncertain for the quarantine, not {:?}",
            self.uncertain
        );
        assert!(
            self.uncertain.is_some() || self.stable >= self.config.stable_observations_min(),
            "a certain cut has {} stable observations behind it, fewer than {}",
            self.stable,
            self.config.stable_observations_min()
        );
    }
}

impl SafeTimeConfig {
    /// Classifies `o` after `p` and says how far the cut may advance: by
    /// `min(db, trusted(hi))` when consistent, by `trusted(min(lo, hi))`
    /// after an anomaly (never more than the window vouches for, even when
    /// the readings break the rules of time).
    fn step(&self, p: &Observation, o: &Observation) -> Step {
        let w = Window::between(p, o);
        let db_ns = o.db_now.as_nanosecond() - p.db_now.as_nanosecond();
        let anomaly = self.anomaly(p, o, w, db_ns);
        let advance_max_ns = self.trusted(w.hi_ns);
        let advance_ns = match anomaly {
            None => db_ns.min(advance_max_ns).max(0),
            Some(_) => self.trusted(w.lo_ns.min(w.hi_ns)),
        };
        Step {
            anomaly,
            advance_ns,
            advance_max_ns,
        }
    }

    /// The anomaly `o` is after `p` (`None`: consistent), the first that
    /// applies of: a topology change, a server in recovery, an implausible
    /// reading (a round trip that is negative or above the bound, a sample
    /// sent before the previous answer), a sampling gap, and a database
    /// clock step (its elapsed time `db_ns` outside `[lo - slack, hi +
    /// slack]`).
    fn anomaly(
        &self,
        p: &Observation,
        o: &Observation,
        w: Window,
        db_ns: i128,
    ) -> Option<UncertainReason> {
        if o.topology != p.topology {
            Some(UncertainReason::PrimaryChange)
        } else if o.topology.in_recovery {
            Some(UncertainReason::InRecovery)
        } else if self.implausible(w) {
            Some(UncertainReason::ImplausibleObservation)
        } else if w.lo_ns > self.gap_max().as_nanos() {
            Some(UncertainReason::SamplingGap)
        } else {
            self.clock_step(w, db_ns)
        }
    }

    /// Whether window `w` is implausible: a round trip that is negative or
    /// above the bound, or a sample sent before the previous answer.
    pub(crate) fn implausible(&self, w: Window) -> bool {
        w.rtt_ns < 0 || w.lo_ns < 0 || w.rtt_ns > self.round_trip_max().as_nanos()
    }

    /// The clock step that database time elapsed `db_ns` is over window
    /// `w`: forward above `hi + slack`, backward below `lo - slack`
    /// (`slack = hi * drift`, rounded up); `None` inside.
    pub(crate) fn clock_step(&self, w: Window, db_ns: i128) -> Option<UncertainReason> {
        let slack_ns = self.slack(w.hi_ns);
        if db_ns > w.hi_ns + slack_ns {
            Some(UncertainReason::ClockStepForward)
        } else if db_ns < w.lo_ns - slack_ns {
            Some(UncertainReason::ClockStepBackward)
        } else {
            None
        }
    }
}

/// Nanoseconds to a timestamp.
///
/// # Panics
/// If `ns` is outside the timestamp domain: the cut only ever takes values
/// between an accepted timestamp and database time, so that is a bug.
fn ns_to_timestamp(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns)
        .unwrap_or_else(|e| panic!("the cut stays in the timestamp domain, got {ns} ns: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::carry::CutReading;
    use crate::config::DEFAULT_DRIFT_PPM;

    const S: u64 = 1_000_000_000;

    fn cfg() -> SafeTimeConfig {
        SafeTimeConfig::new(
            50,
            SignedDuration::from_secs(1),
            SignedDuration::from_secs(5),
            SignedDuration::from_millis(500),
            3,
            SignedDuration::from_secs(2),
        )
        .unwrap()
    }

    fn topo() -> Topology {
        Topology {
            system_identifier: 7,
            timeline_id: 1,
            in_recovery: false,
            postmaster_start: Timestamp::from_second(1_000).unwrap(),
        }
    }

    fn ts(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    /// An observation at monotonic `mono_s` seconds with a 1 ms round trip,
    /// database time read at the midpoint.
    fn obs(mono_s: u64, db_ns: i128) -> Observation {
        Observation {
            db_now: ts(db_ns),
            topology: topo(),
            mono_before_ns: mono_s * S,
            mono_after_ns: mono_s * S + 1_000_000,
        }
    }

    const T0: i128 = 1_800_000_000_000_000_000;

    #[test]
    fn steady_samples_track_database_time_and_recover() {
        let mut t = CutTracker::new(
            cfg(),
            ts(T0 - 10 * S as i128),
            false,
            SignedDuration::from_hours(1),
        );
        let v = t.observe(obs(100, T0));
        assert_eq!(v.uncertain, Some(UncertainReason::NewEpoch));
        assert_eq!(v.proposal, ts(T0 - 10 * S as i128));
        assert!(v.anomaly);
        t.accepted(v.proposal);
        // Each later sample: db advanced exactly 1 s; hi = 1.001 s, so the
        // advance is min(1 s, 1.001 s * (1 - 50e-6)) = 1 s.
        for k in 1..=3u64 {
            let v = t.observe(obs(100 + k, T0 + i128::from(k) * S as i128));
            assert_eq!(
                v.proposal,
                ts(T0 - 10 * S as i128 + i128::from(k) * S as i128)
            );
            t.accepted(v.proposal);
            // Three stable observations are needed (and 2 s of calm).
            let expected = if k < 3 {
                Some(UncertainReason::Recovering)
            } else {
                None
            };
            assert_eq!(v.uncertain, expected, "k = {k}");
        }
    }

    #[test]
    fn the_first_observation_reports_the_start_reason() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1))
            .with_start_reason(UncertainReason::PrimaryChange);
        assert_eq!(t.uncertain(), Some(UncertainReason::PrimaryChange));
        let v = t.observe(obs(10, T0));
        assert_eq!(
            (v.uncertain, v.anomaly),
            (Some(UncertainReason::PrimaryChange), true)
        );
        let v = t.observe(obs(11, T0 + S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::Recovering));
    }

    #[test]
    fn forward_step_is_not_caught_up() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        // Database jumps 1 hour forward within 1 s of monotonic time.
        let v = t.observe(obs(11, T0 + 3_601 * S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::ClockStepForward));
        // lo = 1 s - 1 ms = 0.999 s, less 50 ppm, rounded down.
        assert_eq!(v.proposal, ts(T0 + 998_950_050));
    }

    #[test]
    fn backward_step_freezes_the_cut() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        let v = t.observe(obs(11, T0 - 60 * S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::ClockStepBackward));
        assert_eq!(v.proposal, ts(T0));
    }

    #[test]
    fn gap_topology_and_round_trip_anomalies() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        // 6 s gap (> 5 s bound), database consistent with it.
        let v = t.observe(obs(16, T0 + 6 * S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::SamplingGap));
        // lo = 5.999 s less 50 ppm.
        assert_eq!(v.proposal, ts(T0 + 5_998_700_050));
        t.accepted(v.proposal);
        let mut o = obs(17, T0 + 7 * S as i128);
        o.topology.timeline_id = 2;
        let v = t.observe(o);
        assert_eq!(v.uncertain, Some(UncertainReason::PrimaryChange));
        t.accepted(v.proposal);
        let mut o = obs(18, T0 + 8 * S as i128);
        o.topology.timeline_id = 2;
        o.mono_after_ns = o.mono_before_ns + 600_000_000;
        assert_eq!(
            t.observe(o).uncertain,
            Some(UncertainReason::ImplausibleObservation)
        );
        let mut o = obs(19, T0 + 9 * S as i128);
        o.topology.timeline_id = 2;
        o.topology.in_recovery = true;
        let v = t.observe(o);
        assert_eq!(v.uncertain, Some(UncertainReason::PrimaryChange));
        assert!(!v.publishable);
    }

    #[test]
    fn initial_quarantine_clears_only_after_a_full_horizon_run() {
        let horizon = SignedDuration::from_secs(10);
        let mut t = CutTracker::new(cfg(), Timestamp::UNIX_EPOCH, true, horizon);
        let v = t.observe(obs(100, T0));
        assert_eq!(v.uncertain, Some(UncertainReason::InitialQuarantine));
        assert_eq!(v.proposal, Timestamp::UNIX_EPOCH);
        t.accepted(v.proposal);
        // Proof runs from mono 100.001 s; 10 s of trusted time (less 50 ppm)
        // needs mono_before >= 100.001 + 10.0005 s, i.e. the sample at 111.
        for k in 101..=110u64 {
            let v = t.observe(obs(k, T0 + i128::from(k - 100) * S as i128));
            assert_eq!(
                v.uncertain,
                Some(UncertainReason::InitialQuarantine),
                "k = {k}"
            );
            assert!(!v.clears_quarantine);
            assert_eq!(v.proposal, ts(i128::from(k - 100) * S as i128));
            t.accepted(v.proposal);
        }
        let v = t.observe(obs(111, T0 + 11 * S as i128));
        assert!(v.clears_quarantine);
        assert_eq!(v.uncertain, None);
        assert_eq!(v.proposal, ts(T0 + 11 * S as i128));
        assert!(!t.quarantined());
    }

    /// The proof clears at exactly [`SafeTimeConfig::quarantine_run`] of
    /// calm monotonic time after the anomaly that began it (what readers
    /// report as the quarantine's need), and not one nanosecond before.
    #[test]
    fn quarantine_clears_at_exactly_the_reported_run() {
        let horizon = SignedDuration::from_secs(10);
        let run_ns = u64::try_from(cfg().quarantine_run(horizon).as_nanos()).unwrap();
        assert_eq!(run_ns, 10_000_500_026);
        for (late_ns, clears) in [(0u64, true), (1, false)] {
            let mut t = CutTracker::new(cfg(), Timestamp::UNIX_EPOCH, true, horizon);
            // The proof begins at the first observation's answer, 100.001 s.
            t.observe(obs(100, T0));
            for k in 101..=110u64 {
                t.observe(obs(k, T0 + i128::from(k - 100) * S as i128));
            }
            let before = 100 * S + 1_000_000 + run_ns - late_ns;
            let v = t.observe(Observation {
                db_now: ts(T0 + i128::from(before - 100 * S)),
                topology: topo(),
                mono_before_ns: before,
                mono_after_ns: before + 1_000_000,
            });
            assert_eq!(v.clears_quarantine, clears, "{late_ns} ns short");
        }
    }

    #[test]
    fn an_anomaly_restarts_the_quarantine_proof() {
        let horizon = SignedDuration::from_secs(10);
        let mut t = CutTracker::new(cfg(), Timestamp::UNIX_EPOCH, true, horizon);
        t.observe(obs(100, T0));
        for k in 101..=105u64 {
            t.observe(obs(k, T0 + i128::from(k - 100) * S as i128));
        }
        // A backward step at 106 restarts the proof from 106.001 s.
        let v = t.observe(obs(106, T0));
        assert_eq!(v.uncertain, Some(UncertainReason::InitialQuarantine));
        assert!(v.anomaly);
        for k in 107..=116u64 {
            let v = t.observe(obs(k, T0 + i128::from(k - 106) * S as i128));
            assert!(!v.clears_quarantine, "k = {k}");
        }
        assert!(t.observe(obs(117, T0 + 11 * S as i128)).clears_quarantine);
    }

    /// A tracker that has seen one observation at monotonic 10 s (1 ms
    /// round trip) with database time T0, cut T0.
    fn primed() -> CutTracker {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        t
    }

    /// An observation with explicit monotonic bracket and database offset
    /// from T0.
    fn raw(before: u64, after: u64, db_offset: i128) -> Observation {
        Observation {
            db_now: ts(T0 + db_offset),
            topology: topo(),
            mono_before_ns: before,
            mono_after_ns: after,
        }
    }

    #[test]
    fn consistency_window_boundaries_are_exact() {
        // prev: before 10 s, after 10.001 s. This: before 11 s, after
        // 11.001000001 s: lo = 0.999 s, hi = 1.001000001 s,
        // slack = ceil(hi * 50e-6) = 50_051 ns, trusted(hi) = 1_000_949_950,
        // trusted(lo) = 998_950_050.
        let before = 11 * S;
        let after = 11 * S + 1_000_001;
        let cases: [(i128, Option<UncertainReason>, i128); 5] = [
            // db at hi + slack: consistent, advance capped at trusted(hi).
            (1_001_050_052, None, 1_000_949_950),
            // one more: a forward step, advance trusted(lo).
            (
                1_001_050_053,
                Some(UncertainReason::ClockStepForward),
                998_950_050,
            ),
            // db at lo - slack: consistent, advance is the database's own.
            (998_949_949, None, 998_949_949),
            // one less: a backward step; trusted(lo) is capped by db time.
            (
                998_949_948,
                Some(UncertainReason::ClockStepBackward),
                998_949_948,
            ),
            // exactly one second: consistent, advance 1 s.
            (1_000_000_000, None, 1_000_000_000),
        ];
        for (db, reason, advance) in cases {
            let mut t = primed();
            let v = t.observe(raw(before, after, db));
            let expected = if reason.is_some() {
                reason
            } else {
                Some(UncertainReason::Recovering)
            };
            assert_eq!(
                (v.uncertain, v.anomaly, v.proposal),
                (expected, reason.is_some(), ts(T0 + advance)),
                "db offset {db}"
            );
            assert_eq!(t.stable_observations(), u32::from(reason.is_none()));
        }
    }

    #[test]
    fn round_trip_gap_and_ordering_boundaries_are_exact() {
        let p_after = 10 * S + 1_000_000;
        let cases: [(u64, u64, i128, Option<UncertainReason>); 8] = [
            // rtt exactly 500 ms (the bound): fine.
            (11 * S, 11 * S + 500_000_000, 1_000_000_000, None),
            // rtt one nanosecond more: implausible.
            (
                11 * S,
                11 * S + 500_000_001,
                1_000_000_000,
                Some(UncertainReason::ImplausibleObservation),
            ),
            // lo exactly 5 s (the gap bound): fine.
            (
                p_after + 5 * S,
                p_after + 5 * S + 1_000_000,
                5 * S as i128,
                None,
            ),
            // lo one nanosecond more: a gap.
            (
                p_after + 5 * S + 1,
                p_after + 5 * S + 1_000_001,
                5 * S as i128,
                Some(UncertainReason::SamplingGap),
            ),
            // answered in no measurable time (rtt = 0): fine.
            (11 * S, 11 * S, 999_500_000, None),
            // sent the instant the previous answer arrived (lo = 0): fine.
            (p_after, p_after + 1_000_000, 1_000_000, None),
            // sent before the previous answer arrived (lo < 0): implausible.
            (
                p_after - 1,
                p_after + 1_000_000,
                1_000_000,
                Some(UncertainReason::ImplausibleObservation),
            ),
            // answer before question (rtt < 0): implausible.
            (
                11 * S,
                11 * S - 1,
                1_000_000_000,
                Some(UncertainReason::ImplausibleObservation),
            ),
        ];
        for (before, after, db, reason) in cases {
            let mut t = primed();
            let v = t.observe(raw(before, after, db));
            assert_eq!(
                (v.anomaly, v.uncertain.filter(|_| v.anomaly)),
                (reason.is_some(), reason),
                "{before} {after}"
            );
        }
    }

    #[test]
    fn accessors_display_and_start_reason() {
        let c = cfg();
        assert_eq!(
            (
                c.drift_ppm(),
                c.interval(),
                c.gap_max(),
                c.round_trip_max(),
                c.stable_observations_min(),
                c.recovery_grace()
            ),
            (
                50,
                SignedDuration::from_secs(1),
                SignedDuration::from_secs(5),
                SignedDuration::from_millis(500),
                3,
                SignedDuration::from_secs(2)
            )
        );
        assert_eq!(SafeTimeConfig::default().drift_ppm(), DEFAULT_DRIFT_PPM);
        assert_eq!(
            UncertainReason::ClockStepForward.to_string(),
            "clock_step_forward"
        );
        let q = CutTracker::new(c, ts(5), true, SignedDuration::from_secs(1))
            .with_start_reason(UncertainReason::PrimaryChange);
        assert_eq!(
            (
                q.cut(),
                q.quarantined(),
                q.uncertain(),
                q.stable_observations(),
                *q.config()
            ),
            (ts(5), true, Some(UncertainReason::InitialQuarantine), 0, c)
        );
        let n = CutTracker::new(c, ts(5), false, SignedDuration::from_secs(1));
        assert_eq!(
            (n.quarantined(), n.uncertain()),
            (false, Some(UncertainReason::NewEpoch))
        );
        let mut a = n.clone();
        a.accepted(ts(9));
        a.accepted(ts(7));
        assert_eq!(a.cut(), ts(9), "accepted never moves the cut back");
    }

    #[test]
    fn recovery_needs_the_grace_period_as_well() {
        // Grace 2 s, samples every 0.5 s: 3 stable observations arrive at
        // 11.5 s, but calm (before - 10.001 s) reaches 2 s only at 12.5 s.
        let mut t = primed();
        let steps = [
            (105u64, false),
            (110, false),
            (115, false),
            (120, false),
            (125, true),
        ];
        for (tenths, certain) in steps {
            let before = tenths * S / 10;
            let v = t.observe(raw(
                before,
                before + 1_000_000,
                i128::from(before) - 10 * S as i128,
            ));
            assert_eq!(v.uncertain.is_none(), certain, "at {tenths} tenths");
        }
    }

    /// A round trip that ends before it starts (readings that break the
    /// rules of time, so `lo > hi`) is implausible, and the cut advances by
    /// no more than the smaller window vouches for: `trusted(min(lo, hi))`.
    #[test]
    fn a_negative_round_trip_advances_by_the_smaller_window() {
        // prev (10 s, 10.001 s); this (11 s, 10.998 s): lo = 0.999 s,
        // hi = 0.998 s, trusted(hi) = 998_000_000 - 49_900.
        let mut t = primed();
        let v = t.observe(raw(11 * S, 11 * S - 2_000_000, 1_000_000_000));
        assert_eq!(
            (v.anomaly, v.uncertain, v.proposal),
            (
                true,
                Some(UncertainReason::ImplausibleObservation),
                ts(T0 + 997_950_100)
            )
        );
    }

    fn cut_move(
        before_ns: i128,
        proposal_ns: i128,
        db_now_ns: i128,
        advance_max_ns: i128,
    ) -> CutMove {
        CutMove {
            before_ns,
            proposal_ns,
            db_now_ns,
            advance_max_ns,
            clears_quarantine: false,
        }
    }

    #[test]
    fn cut_moves_within_the_rules_pass() {
        for m in [
            cut_move(10, 10, 5, 0),
            cut_move(10, 15, 15, 5),
            cut_move(10, 12, 20, 2),
            CutMove {
                clears_quarantine: true,
                ..cut_move(10, 20, 20, 0)
            },
        ] {
            assert_cut_move(m);
        }
    }

    #[test]
    #[should_panic(expected = "the cut never decreases")]
    fn a_cut_that_decreases_is_a_bug() {
        assert_cut_move(cut_move(10, 9, 20, 5));
    }

    #[test]
    #[should_panic(expected = "the cut never passes database time")]
    fn a_cut_past_database_time_is_a_bug() {
        assert_cut_move(cut_move(10, 16, 15, 10));
    }

    #[test]
    #[should_panic(expected = "the cut never passes database time")]
    fn a_cut_past_database_time_is_a_bug_even_when_clearing() {
        assert_cut_move(CutMove {
            clears_quarantine: true,
            ..cut_move(10, 21, 20, 0)
        });
    }

    #[test]
    #[should_panic(expected = "the cut never advances faster than monotonic time")]
    fn a_cut_faster_than_monotonic_time_is_a_bug() {
        assert_cut_move(cut_move(10, 20, 30, 5));
    }

    #[test]
    #[should_panic(expected = "a quarantined cut is uncertain for the quarantine")]
    fn a_certain_quarantined_tracker_is_a_bug() {
        let mut t = CutTracker::new(cfg(), ts(T0), true, SignedDuration::from_secs(1));
        t.uncertain = Some(UncertainReason::Recovering);
        t.observe(obs(10, T0));
    }

    #[test]
    #[should_panic(expected = "a certain cut has 2 stable observations behind it, fewer than 3")]
    fn a_certain_cut_without_stable_observations_is_a_bug() {
        let mut t = primed();
        t.stable = 2;
        t.uncertain = None;
        t.observe(obs(11, T0 + S as i128));
    }

    /// The state checks hold at the exact bound: certain with exactly
    /// `stable_observations_min` stable observations.
    #[test]
    fn a_certain_cut_with_exactly_enough_stable_observations_passes() {
        let mut t = primed();
        t.stable = 3;
        t.uncertain = None;
        t.assert_state();
    }

    #[test]
    #[should_panic(expected = "the maximum-deadline horizon is never negative")]
    fn a_negative_horizon_is_a_bug() {
        CutTracker::new(cfg(), ts(T0), true, SignedDuration::from_nanos(-1));
    }
    /// A carry of the cut `T0 - 2 s` (publish 90 of epoch 4, read with
    /// database time T0 at monotonic 10 s, 1 ms round trip) read again at
    /// 11 s: its anchor answered at 10.001 s.
    fn carried() -> CarriedCut {
        let reading = |mono_s: u64| CutReading {
            cut: ts(T0 - 2 * S as i128),
            epoch: 4,
            publish_seq: 90,
            observation: obs(mono_s, T0 + i128::from(mono_s - 10) * S as i128),
        };
        CarriedCut::new(reading(10)).read(&cfg(), reading(11))
    }

    /// The bound the carry vouches for at 30.001 s: T0 - 2 s plus 20 s less
    /// 50 ppm.
    const BOUND_AT_30: i128 = T0 - 2 * S as i128 + 19_999_000_000;

    #[test]
    fn a_carried_cut_crosses_the_new_epoch_uncertain() {
        let mut t = CutTracker::new(
            cfg(),
            ts(T0 - 2 * S as i128),
            false,
            SignedDuration::from_hours(1),
        )
        .with_carry(carried());
        // 20 s later, database time consistent with it: the cut advances
        // to the bound (lag 2.001 s), and the epoch still starts uncertain.
        let v = t.observe(obs(30, T0 + 20 * S as i128));
        assert_eq!(
            (v.proposal, v.uncertain, v.anomaly),
            (ts(BOUND_AT_30), Some(UncertainReason::NewEpoch), true)
        );
        t.accepted(v.proposal);
        // Recovery still needs three stable observations and 2 s of calm
        // from the first observation's answer.
        for k in 1..=3u64 {
            let v = t.observe(obs(30 + k, T0 + i128::from(20 + k) * S as i128));
            assert_eq!(v.proposal, ts(BOUND_AT_30 + i128::from(k) * S as i128));
            let expected = (k < 3).then_some(UncertainReason::Recovering);
            assert_eq!((v.uncertain, v.anomaly), (expected, false), "k = {k}");
            t.accepted(v.proposal);
        }
    }

    #[test]
    fn the_first_observation_after_a_carry_at_its_boundaries() {
        let cut = T0 - 2 * S as i128;
        let fwd = Some(UncertainReason::ClockStepForward);
        let back = Some(UncertainReason::ClockStepBackward);
        let new_epoch = Some(UncertainReason::NewEpoch);
        let primary = Some(UncertainReason::PrimaryChange);
        // (persisted cut, start reason, database time, reason, proposal)
        let cases: [(i128, UncertainReason, i128, Option<UncertainReason>, i128); 8] = [
            // A forward step during the outage: detected, not followed.
            (
                cut,
                UncertainReason::NewEpoch,
                T0 + 3_620 * S as i128,
                fwd,
                BOUND_AT_30,
            ),
            // The claim's primary change comes first.
            (
                cut,
                UncertainReason::PrimaryChange,
                T0 + 3_620 * S as i128,
                primary,
                BOUND_AT_30,
            ),
            (
                cut,
                UncertainReason::PrimaryChange,
                T0 + 20 * S as i128,
                primary,
                BOUND_AT_30,
            ),
            // A backward step below the cut: the cut stands.
            (
                cut,
                UncertainReason::NewEpoch,
                T0 - 5 * S as i128,
                back,
                cut,
            ),
            // Database time below the bound: capped at it.
            (
                cut,
                UncertainReason::NewEpoch,
                T0 + 17 * S as i128,
                back,
                T0 + 17 * S as i128,
            ),
            // A persisted cut above the bound: never backward.
            (
                BOUND_AT_30 + 1,
                UncertainReason::NewEpoch,
                T0 + 20 * S as i128,
                new_epoch,
                BOUND_AT_30 + 1,
            ),
            (
                BOUND_AT_30 - 1,
                UncertainReason::NewEpoch,
                T0 + 20 * S as i128,
                new_epoch,
                BOUND_AT_30,
            ),
            // Exactly at database time.
            (
                cut,
                UncertainReason::NewEpoch,
                BOUND_AT_30,
                back,
                BOUND_AT_30,
            ),
        ];
        for (persisted, start, db, reason, proposal) in cases {
            let mut t = CutTracker::new(cfg(), ts(persisted), false, SignedDuration::from_hours(1))
                .with_start_reason(start)
                .with_carry(carried());
            let v = t.observe(obs(30, db));
            assert_eq!(
                (v.uncertain, v.anomaly, v.proposal),
                (reason, true, ts(proposal)),
                "persisted {persisted} start {start} db {db}"
            );
        }
    }

    #[test]
    fn nothing_carries_to_another_database_system() {
        let mut t = CutTracker::new(
            cfg(),
            ts(T0 - 2 * S as i128),
            false,
            SignedDuration::from_hours(1),
        )
        .with_carry(carried());
        let mut o = obs(30, T0 + 20 * S as i128);
        o.topology.system_identifier = 8;
        let v = t.observe(o);
        assert_eq!(
            (v.uncertain, v.proposal),
            (Some(UncertainReason::NewEpoch), ts(T0 - 2 * S as i128))
        );
    }

    /// A quarantined epoch ignores the carry: every verdict, the proof's
    /// clearing included, is the one it would give without it.
    #[test]
    fn a_quarantined_epoch_ignores_the_carry() {
        let horizon = SignedDuration::from_secs(10);
        let mut plain = CutTracker::new(cfg(), Timestamp::UNIX_EPOCH, true, horizon);
        let mut with = plain.clone().with_carry(carried());
        let mut cleared = 0;
        for k in 30..=42u64 {
            let o = obs(k, T0 + i128::from(k - 10) * S as i128);
            let (a, b) = (plain.observe(o), with.observe(o));
            assert_eq!(a, b, "k = {k}");
            cleared += u32::from(a.clears_quarantine);
            plain.accepted(a.proposal);
            with.accepted(b.proposal);
        }
        assert_eq!(cleared, 1);
    }
}
