//! The carried cut: how a sampler vouches for the cut across a new epoch.
//!
//! # Why a cut can be carried
//!
//! The cut is a lower bound on true time whenever it is read: it never
//! advances faster than trusted monotonic time, and it starts at database
//! time or far behind it. So a sampler process that read the cut `c` and
//! got the answer at its monotonic instant `m` knows that true time was at
//! least `c` at `m`, and may later vouch for
//! `c + (mono_now - m) * (1 - drift)` on its own monotonic clock, the
//! clock the whole model already trusts. Without that, every new epoch (a
//! takeover, a sampler's new term after a PostgreSQL restart or a lost
//! lock) would start from the persisted cut and lose the whole gap to the
//! cut lag, for good; with it, the lag grows only by time that no sampler
//! process observed.
//!
//! A [`CarriedCut`] is what one process knows: its readings of the cut
//! ([`CutReading`]: a standby reads the published cut every interval; a
//! leader's own accepted publish is one too). [`CutTracker`] uses it for
//! the first observation of its next epoch
//! ([`CutTracker::with_carry`]).
//!
//! # The rules
//!
//! * **What is vouched for.** The *anchor* is the first reading of the
//!   newest publish this process saw (its epoch, publish sequence number
//!   and cut). A publish seen unchanged for a while (a frozen or dead
//!   leader) is vouched for from its first sighting, the same instant a
//!   reader's staleness rule counts from; a newer publish moves the anchor
//!   to it. The bound at a later monotonic instant is
//!   [`CarriedCut::vouched_at`]. The anchor never reaches further back:
//!   a cut that advanced slower than monotonic time (capped at database
//!   time, held after a backward step) was the cut deadlines were granted
//!   at, and vouching from an older reading would gain on them.
//! * **The first observation of the new epoch** proposes at most the bound
//!   at its answer (`mono_after_ns`), capped at its database time and never
//!   below the persisted cut. It is always an anomaly: the epoch starts
//!   uncertain, and recovery needs its stable observations and grace as
//!   ever.
//! * **Consistency.** The first observation is checked against the *last*
//!   reading the way a leader checks consecutive observations (the
//!   sampling-gap rule aside, since a carry spans a gap by design): a
//!   topology change is `primary_change`, an implausible round trip
//!   `implausible_observation`, and database time elapsed outside
//!   `[lo - slack, hi + slack]` of the monotonic window is a clock step.
//!   Readings are checked against each other in the same way, so a step
//!   between two readings is remembered (*pending*) until the row shows
//!   that a leader observed it (two more publishes of the epoch the step
//!   was seen in) or another epoch began. A forward step is therefore
//!   reported as `clock_step_forward` however it falls, and never
//!   followed: the bound is monotonic time.
//! * **Topology.** A cut carries only within one database system (the same
//!   `system_identifier`): a promoted standby or a restored backup holds a
//!   prefix of the same cut history, which the bound covers; another
//!   system's cut is unrelated to the deadlines granted there, so a carry
//!   to it is dropped (the epoch starts from its persisted cut, as without
//!   a carry).
//! * **Quarantine.** A quarantined epoch ignores the carry: the quarantined
//!   cut must stay far behind every expiry until its proof completes, and
//!   the proof needs one uninterrupted epoch; a carry never shortens or
//!   continues it.
//!
//! Only an outage of every sampler process adds lag (beyond about one
//! sampling interval and a round trip, the time between a publish and a
//! standby's first reading of it): nobody observed that time.
//!
//! [`CutTracker`]: crate::CutTracker
//! [`CutTracker::with_carry`]: crate::CutTracker::with_carry

use jiff::Timestamp;

use crate::config::SafeTimeConfig;
use crate::reason::UncertainReason;
use crate::tracker::{Observation, Window};

/// One reading of the published cut by a sampler process.
///
/// `observation.db_now` is database time read somewhere inside
/// `[observation.mono_before_ns, observation.mono_after_ns]`, and by
/// `observation.mono_after_ns` the reading's answer, holding `cut`, had
/// arrived. A standby's reading is one statement returning both; a
/// leader's is its observation's database time with the answer of the
/// publish that followed it (the bracket then spans both statements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutReading {
    /// The cut read (for a leader: the cut the database accepted).
    pub cut: Timestamp,
    /// The epoch of the row read.
    pub epoch: i64,
    /// The publish sequence number of the row read.
    pub publish_seq: i64,
    /// Database time and topology, bracketed as above.
    pub observation: Observation,
}

impl CutReading {
    /// Whether `other` shows the same publish: the same epoch, publish
    /// sequence number and cut, of the same database system.
    fn same_publish(&self, other: &CutReading) -> bool {
        self.epoch == other.epoch
            && self.publish_seq == other.publish_seq
            && self.cut == other.cut
            && self.observation.topology.system_identifier
                == other.observation.topology.system_identifier
    }
}

/// A clock step seen between two readings that no leader is yet known to
/// have observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingStep {
    /// [`UncertainReason::ClockStepForward`] or
    /// [`UncertainReason::ClockStepBackward`].
    reason: UncertainReason,
    /// The epoch of the reading that showed the step.
    epoch: i64,
    /// Its publish sequence number.
    publish_seq: i64,
}

/// What one sampler process can vouch for across a new epoch; see the
/// module docs. Built from a first reading ([`CarriedCut::new`]) and fed
/// each later one ([`CarriedCut::read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CarriedCut {
    /// The first reading of the newest publish seen: what is vouched for.
    anchor: CutReading,
    /// The latest reading: what the next reading, or the next epoch's first
    /// observation, is checked against.
    last: CutReading,
    pending: Option<PendingStep>,
}

/// How the first observation of a new epoch relates to a carried cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CarryStep {
    /// The anomaly the carry found (`None`: consistent with it).
    pub(crate) anomaly: Option<UncertainReason>,
    /// The vouched lower bound at the observation's answer, in nanoseconds
    /// since the Unix epoch (before the cap at database time).
    pub(crate) bound_ns: i128,
}

/// Panics unless `bound_ns` lies in `[cut_ns, cut_ns + elapsed_ns]`: a
/// carried cut vouches for no more than the monotonic time since its
/// reading, and never for less than the cut it read. A violation is a bug
/// in this module, and a proposal built on it could expire authority
/// early.
fn assert_vouch(cut_ns: i128, bound_ns: i128, elapsed_ns: i128) {
    assert!(
        bound_ns >= cut_ns,
        "a carried cut vouches for at least the cut it read: {bound_ns} ns below {cut_ns} ns"
    );
    assert!(
        bound_ns - cut_ns <= elapsed_ns,
        "a carried cut vouches for no more than the monotonic time since its reading: \
         {} ns above {elapsed_ns} ns",
        bound_ns - cut_ns
    );
}

impl CarriedCut {
    /// What one reading vouches for: it is the anchor and the last
    /// reading, with no pending step. A leader starts over with each of its
    /// accepted publishes (it observed every instant before it itself).
    ///
    /// # Panics
    /// Never.
    ///
    /// ```
    /// use jiff::Timestamp;
    /// use safetime::{CarriedCut, CutReading, Observation, Topology};
    /// let at = |s| Timestamp::from_second(s).unwrap();
    /// let reading = CutReading {
    ///     cut: at(1_800_000_000),
    ///     epoch: 4,
    ///     publish_seq: 90,
    ///     observation: Observation {
    ///         db_now: at(1_800_000_001),
    ///         topology: Topology {
    ///             system_identifier: 7,
    ///             timeline_id: 1,
    ///             in_recovery: false,
    ///             postmaster_start: at(1_700_000_000),
    ///         },
    ///         mono_before_ns: 10_000_000_000,
    ///         mono_after_ns: 10_001_000_000,
    ///     },
    /// };
    /// let carried = CarriedCut::new(reading);
    /// assert_eq!((carried.anchor(), carried.last()), (&reading, &reading));
    /// assert_eq!(carried.pending_step(), None);
    /// ```
    pub fn new(reading: CutReading) -> CarriedCut {
        CarriedCut {
            anchor: reading,
            last: reading,
            pending: None,
        }
    }

    /// The first reading of the newest publish seen: what
    /// [`CarriedCut::vouched_at`] counts from.
    pub fn anchor(&self) -> &CutReading {
        &self.anchor
    }

    /// The latest reading.
    pub fn last(&self) -> &CutReading {
        &self.last
    }

    /// A clock step seen between two readings that no leader is yet known
    /// to have observed ([`UncertainReason::ClockStepForward`] or
    /// [`UncertainReason::ClockStepBackward`]); the next epoch's first
    /// observation reports it unless it finds an anomaly of its own.
    pub fn pending_step(&self) -> Option<UncertainReason> {
        self.pending.map(|p| p.reason)
    }

    /// This carry after one more reading `next`, taken after the last one:
    ///
    /// * `next` is the last reading; it is the anchor too unless it shows
    ///   the anchor's publish again (then the earlier sighting stays the
    ///   anchor);
    /// * database time elapsed between the last reading and `next` outside
    ///   the monotonic window (of the same server: the same topology) is a
    ///   clock step, pending from then on;
    /// * a pending step is forgotten once `next` shows two more publishes
    ///   of the epoch it was seen in (their leader observed it), or another
    ///   epoch, or another database system.
    ///
    /// A reading that breaks the rules of time (its answer before its
    /// question, or sent before the last reading's answer) is an operating
    /// error and is ignored: the carry is returned unchanged.
    ///
    /// # Panics
    /// Never.
    ///
    /// ```
    /// use jiff::Timestamp;
    /// use safetime::{CarriedCut, CutReading, Observation, SafeTimeConfig, Topology, UncertainReason};
    /// let at = |s| Timestamp::from_second(s).unwrap();
    /// let topology = Topology {
    ///     system_identifier: 7,
    ///     timeline_id: 1,
    ///     in_recovery: false,
    ///     postmaster_start: at(1_700_000_000),
    /// };
    /// let reading = |mono_s: u64, db_s: i64, publish_seq: i64| CutReading {
    ///     cut: at(1_800_000_000),
    ///     epoch: 4,
    ///     publish_seq,
    ///     observation: Observation {
    ///         db_now: at(db_s),
    ///         topology,
    ///         mono_before_ns: mono_s * 1_000_000_000,
    ///         mono_after_ns: mono_s * 1_000_000_000 + 1_000_000,
    ///     },
    /// };
    /// let config = SafeTimeConfig::default();
    /// let first = reading(10, 1_800_000_001, 90);
    /// // The same publish a second later: the first sighting stays the anchor.
    /// let carried = CarriedCut::new(first).read(&config, reading(11, 1_800_000_002, 90));
    /// assert_eq!(carried.anchor(), &first);
    /// // Database time one hour ahead a second later: a forward step.
    /// let carried = carried.read(&config, reading(12, 1_800_003_603, 90));
    /// assert_eq!(carried.pending_step(), Some(UncertainReason::ClockStepForward));
    /// ```
    pub fn read(&self, config: &SafeTimeConfig, next: CutReading) -> CarriedCut {
        let (last, o) = (&self.last.observation, &next.observation);
        if o.mono_after_ns < o.mono_before_ns || o.mono_before_ns < last.mono_after_ns {
            return *self;
        }
        let same_system = o.topology.system_identifier == last.topology.system_identifier;
        let mut pending = self.pending.filter(|p| {
            same_system
                && next.epoch == p.epoch
                && i128::from(next.publish_seq) < i128::from(p.publish_seq) + 2
        });
        if o.topology == last.topology {
            let db_ns = o.db_now.as_nanosecond() - last.db_now.as_nanosecond();
            if let Some(reason) = config.clock_step(Window::between(last, o), db_ns) {
                pending = Some(PendingStep {
                    reason,
                    epoch: next.epoch,
                    publish_seq: next.publish_seq,
                });
            }
        }
        let anchor = if next.same_publish(&self.anchor) {
            self.anchor
        } else {
            next
        };
        CarriedCut {
            anchor,
            last: next,
            pending,
        }
    }

    /// The lower bound on true time this carry vouches for at monotonic
    /// instant `mono_ns`: the anchor's cut plus the monotonic time since its
    /// answer, less the drift allowance (`elapsed * (1 - drift)`, rounded
    /// down, in exact integer nanoseconds). `None` only when that instant
    /// would lie past [`Timestamp::MAX`].
    ///
    /// # Panics
    /// If `mono_ns` is before the anchor's answer (a carry vouches only
    /// forward in time, and a monotonic clock never goes back), or if the
    /// bound broke its own rule (`cut <= bound <= cut + elapsed`), which is
    /// a bug in this module.
    ///
    /// ```
    /// use jiff::Timestamp;
    /// use safetime::{CarriedCut, CutReading, Observation, SafeTimeConfig, Topology};
    /// let at = |s| Timestamp::from_second(s).unwrap();
    /// let carried = CarriedCut::new(CutReading {
    ///     cut: at(1_800_000_000),
    ///     epoch: 4,
    ///     publish_seq: 90,
    ///     observation: Observation {
    ///         db_now: at(1_800_000_001),
    ///         topology: Topology {
    ///             system_identifier: 7,
    ///             timeline_id: 1,
    ///             in_recovery: false,
    ///             postmaster_start: at(1_700_000_000),
    ///         },
    ///         mono_before_ns: 10_000_000_000,
    ///         mono_after_ns: 10_001_000_000,
    ///     },
    /// });
    /// // 20 s later, less 50 ppm: 1 ms short of 20 s.
    /// let bound = carried.vouched_at(&SafeTimeConfig::default(), 30_001_000_000);
    /// assert_eq!(bound, Some(Timestamp::from_nanosecond(1_800_000_019_999_000_000).unwrap()));
    /// ```
    pub fn vouched_at(&self, config: &SafeTimeConfig, mono_ns: u64) -> Option<Timestamp> {
        Timestamp::from_nanosecond(self.vouched_ns(config, mono_ns)).ok()
    }

    /// [`CarriedCut::vouched_at`] in nanoseconds since the Unix epoch,
    /// unbounded.
    fn vouched_ns(&self, config: &SafeTimeConfig, mono_ns: u64) -> i128 {
        let answered_ns = self.anchor.observation.mono_after_ns;
        assert!(
            mono_ns >= answered_ns,
            "a carried cut vouches only at or after its reading's answer: {mono_ns} ns is \
             before {answered_ns} ns"
        );
        let elapsed_ns = i128::from(mono_ns) - i128::from(answered_ns);
        let cut_ns = self.anchor.cut.as_nanosecond();
        let bound_ns = cut_ns + config.trusted(elapsed_ns);
        assert_vouch(cut_ns, bound_ns, elapsed_ns);
        bound_ns
    }

    /// How the first observation `o` of a new epoch relates to this carry:
    /// `None` when `o` is of another database system (nothing carries);
    /// otherwise the anomaly it is against the last reading (the first
    /// that applies of: a topology change, a server in recovery, an
    /// implausible reading, a clock step, then a pending step) and the
    /// bound vouched for at its answer (at the anchor's answer, if `o`
    /// answered before it: readings that break the rules of time vouch for
    /// nothing more).
    pub(crate) fn first_step(&self, config: &SafeTimeConfig, o: &Observation) -> Option<CarryStep> {
        let last = &self.last.observation;
        if o.topology.system_identifier != last.topology.system_identifier {
            return None;
        }
        let w = Window::between(last, o);
        let db_ns = o.db_now.as_nanosecond() - last.db_now.as_nanosecond();
        let anomaly = if o.topology != last.topology {
            Some(UncertainReason::PrimaryChange)
        } else if o.topology.in_recovery {
            Some(UncertainReason::InRecovery)
        } else if config.implausible(w) {
            Some(UncertainReason::ImplausibleObservation)
        } else {
            config
                .clock_step(w, db_ns)
                .or(self.pending.map(|p| p.reason))
        };
        let at_ns = o.mono_after_ns.max(self.anchor.observation.mono_after_ns);
        Some(CarryStep {
            anomaly,
            bound_ns: self.vouched_ns(config, at_ns),
        })
    }
}

#[cfg(test)]
mod tests {
    use jiff::SignedDuration;

    use super::*;
    use crate::tracker::Topology;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const T0: i128 = 1_800_000_000_000_000_000;

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

    fn ts(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    fn topo() -> Topology {
        Topology {
            system_identifier: 7,
            timeline_id: 1,
            in_recovery: false,
            postmaster_start: Timestamp::from_second(1_000).unwrap(),
        }
    }

    /// An observation bracketed by `[before, after]` monotonic ns, database
    /// time `T0 + db_offset_ns`.
    fn obs(before: u64, after: u64, db_offset_ns: i128) -> Observation {
        Observation {
            db_now: ts(T0 + db_offset_ns),
            topology: topo(),
            mono_before_ns: before,
            mono_after_ns: after,
        }
    }

    /// A reading of cut `T0 - 1 s + cut_offset_ns` (publish `seq` of epoch
    /// 4) at monotonic `mono_s` s with a 1 ms round trip, database time at
    /// `T0 + db_offset_ns`.
    fn reading(mono_s: u64, db_offset_ns: i128, seq: i64, cut_offset_ns: i128) -> CutReading {
        CutReading {
            cut: ts(T0 - S as i128 + cut_offset_ns),
            epoch: 4,
            publish_seq: seq,
            observation: obs(mono_s * S, mono_s * S + MS, db_offset_ns),
        }
    }

    /// A reading at `mono_s` s whose database time moved in step with
    /// monotonic time since `reading(10, 0, ..)`.
    fn steady(mono_s: u64, seq: i64, cut_offset_ns: i128) -> CutReading {
        reading(
            mono_s,
            i128::from(mono_s - 10) * S as i128,
            seq,
            cut_offset_ns,
        )
    }

    #[test]
    fn the_bound_is_the_anchor_cut_plus_trusted_monotonic_time() {
        let c = CarriedCut::new(reading(10, 0, 90, 0));
        let answered = 10 * S + MS;
        let cut = T0 - S as i128;
        // (monotonic ns after the answer, drift ppm, vouched advance ns)
        let cases: [(u64, u32, i128); 7] = [
            (0, 50, 0),
            (1, 50, 0),
            (19_999, 50, 19_998),
            (20_000, 50, 19_999),
            (20 * S, 50, 19_999_000_000),
            (20 * S, 0, 20_000_000_000),
            (20 * S, 100_000, 18_000_000_000),
        ];
        for (elapsed, drift, advance) in cases {
            let config = SafeTimeConfig::new(
                drift,
                SignedDuration::from_secs(1),
                SignedDuration::from_secs(5),
                SignedDuration::from_millis(500),
                3,
                SignedDuration::from_secs(2),
            )
            .unwrap();
            assert_eq!(
                c.vouched_at(&config, answered + elapsed),
                Some(ts(cut + advance)),
                "{elapsed} ns at {drift} ppm"
            );
        }
    }

    #[test]
    fn a_bound_past_the_timestamp_domain_is_none() {
        let mut r = reading(10, 0, 90, 0);
        r.cut = Timestamp::MAX;
        let c = CarriedCut::new(r);
        let answered = 10 * S + MS;
        assert_eq!(c.vouched_at(&cfg(), answered), Some(Timestamp::MAX));
        // 19_999 ns less 50 ppm is 19_998 ns: past the end.
        assert_eq!(c.vouched_at(&cfg(), answered + 19_999), None);
        // 1 ns less 50 ppm is nothing.
        assert_eq!(c.vouched_at(&cfg(), answered + 1), Some(Timestamp::MAX));
    }

    #[test]
    #[should_panic(expected = "a carried cut vouches only at or after its reading's answer")]
    fn vouching_before_the_answer_is_a_bug() {
        CarriedCut::new(reading(10, 0, 90, 0)).vouched_at(&cfg(), 10 * S + MS - 1);
    }

    #[test]
    fn bounds_within_the_rule_pass() {
        for (cut, bound, elapsed) in [(10, 10, 0), (10, 15, 5), (10, 12, 5), (-5, -5, 0)] {
            assert_vouch(cut, bound, elapsed);
        }
    }

    #[test]
    #[should_panic(expected = "a carried cut vouches for at least the cut it read")]
    fn a_bound_below_the_cut_is_a_bug() {
        assert_vouch(10, 9, 5);
    }

    #[test]
    #[should_panic(expected = "a carried cut vouches for no more than the monotonic time")]
    fn a_bound_beyond_monotonic_time_is_a_bug() {
        assert_vouch(10, 16, 5);
    }

    #[test]
    fn a_new_carry_is_its_reading() {
        let r = reading(10, 0, 90, 0);
        let c = CarriedCut::new(r);
        assert_eq!((c.anchor(), c.last(), c.pending_step()), (&r, &r, None));
    }

    #[test]
    fn the_anchor_is_the_first_sighting_of_the_newest_publish() {
        let first = steady(10, 90, 0);
        let c = CarriedCut::new(first);
        // The same publish again: the earlier sighting vouches more.
        let again = steady(11, 90, 0);
        let c = c.read(&cfg(), again);
        assert_eq!((c.anchor(), c.last()), (&first, &again));
        // A newer publish moves the anchor, even to a lower bound.
        let newer = steady(12, 91, 500_000_000);
        let c = c.read(&cfg(), newer);
        assert_eq!((c.anchor(), c.last()), (&newer, &newer));
        // Another epoch, publish sequence number, cut or database system
        // with everything else equal is another publish.
        let base = steady(13, 91, 500_000_000);
        let mut other_epoch = base;
        other_epoch.epoch = 5;
        let mut other_seq = base;
        other_seq.publish_seq = 92;
        let mut other_cut = base;
        other_cut.cut = ts(T0);
        let mut other_system = base;
        other_system.observation.topology.system_identifier = 8;
        for next in [other_epoch, other_seq, other_cut, other_system] {
            assert_eq!(c.read(&cfg(), next).anchor(), &next, "{next:?}");
        }
        assert_eq!(c.read(&cfg(), base).anchor(), &newer);
    }

    #[test]
    fn readings_that_break_the_rules_of_time_are_ignored() {
        let c = CarriedCut::new(steady(10, 90, 0));
        let last_after = 10 * S + MS;
        let cases: [(u64, u64, bool); 4] = [
            // sent the instant the last answer arrived: taken.
            (last_after, last_after + MS, true),
            // answered in no measurable time: taken.
            (11 * S, 11 * S, true),
            // sent before the last answer arrived: ignored.
            (last_after - 1, last_after + MS, false),
            // answer before question: ignored.
            (11 * S, 11 * S - 1, false),
        ];
        for (before, after, taken) in cases {
            let mut next = steady(11, 91, 0);
            next.observation.mono_before_ns = before;
            next.observation.mono_after_ns = after;
            next.observation.db_now = ts(T0 + i128::from(before) - 10 * S as i128);
            let got = c.read(&cfg(), next);
            assert_eq!(got.last() == &next, taken, "{before} {after}");
            assert_eq!(got == c, !taken, "{before} {after}");
        }
    }

    #[test]
    fn a_step_between_readings_is_pending_at_the_window_boundaries() {
        // last: [10 s, 10.001 s] at T0; next: [11 s, 11.001000001 s]:
        // lo = 0.999 s, hi = 1.001000001 s, slack = 50_051 ns.
        let cases: [(i128, Option<UncertainReason>); 4] = [
            (1_001_050_052, None),
            (1_001_050_053, Some(UncertainReason::ClockStepForward)),
            (998_949_949, None),
            (998_949_948, Some(UncertainReason::ClockStepBackward)),
        ];
        for (db, pending) in cases {
            let c = CarriedCut::new(steady(10, 90, 0));
            let mut next = reading(11, db, 90, 0);
            next.observation.mono_after_ns = 11 * S + 1_000_001;
            assert_eq!(c.read(&cfg(), next).pending_step(), pending, "db {db}");
        }
    }

    #[test]
    fn a_step_on_another_server_is_no_step() {
        let c = CarriedCut::new(steady(10, 90, 0));
        let mut next = reading(11, 3_601 * S as i128, 90, 0);
        next.observation.topology.postmaster_start = Timestamp::from_second(2_000).unwrap();
        assert_eq!(c.read(&cfg(), next).pending_step(), None);
        next.observation.topology = topo();
        assert_eq!(
            c.read(&cfg(), next).pending_step(),
            Some(UncertainReason::ClockStepForward)
        );
    }

    #[test]
    fn a_pending_step_lasts_until_its_epoch_published_twice_more() {
        // A forward step seen by the reading of publish 90.
        let c =
            CarriedCut::new(steady(10, 89, 0)).read(&cfg(), reading(11, 3_601 * S as i128, 90, 0));
        assert_eq!(c.pending_step(), Some(UncertainReason::ClockStepForward));
        let after_step = |mono_s: u64, seq: i64| {
            reading(
                mono_s,
                (3_600 + i128::from(mono_s) - 10) * S as i128,
                seq,
                0,
            )
        };
        // (next publish seq, next epoch, next system, pending after it)
        let cases: [(i64, i64, i64, bool); 6] = [
            (90, 4, 7, true),
            (91, 4, 7, true),
            (92, 4, 7, false),
            (93, 4, 7, false),
            (90, 5, 7, false),
            (90, 4, 8, false),
        ];
        for (seq, epoch, system, pending) in cases {
            let mut next = after_step(12, seq);
            next.epoch = epoch;
            next.observation.topology.system_identifier = system;
            assert_eq!(
                c.read(&cfg(), next).pending_step().is_some(),
                pending,
                "seq {seq} epoch {epoch} system {system}"
            );
        }
        // A later step replaces the pending one, with its own publish.
        let back = c.read(&cfg(), reading(12, 0, 91, 0));
        assert_eq!(
            back.pending_step(),
            Some(UncertainReason::ClockStepBackward)
        );
        let later = back.read(&cfg(), reading(13, S as i128, 92, 0));
        assert_eq!(
            later.pending_step(),
            Some(UncertainReason::ClockStepBackward)
        );
        let cleared = later.read(&cfg(), reading(14, 2 * S as i128, 93, 0));
        assert_eq!(cleared.pending_step(), None);
    }

    /// The carry of `steady(10, 90, 0)` read again at 11 s.
    fn carry() -> CarriedCut {
        CarriedCut::new(steady(10, 90, 0)).read(&cfg(), steady(11, 90, 0))
    }

    #[test]
    fn the_first_observation_is_checked_against_the_last_reading() {
        // The last reading: [11 s, 11.001 s] at T0 + 1 s. The observation:
        // [20 s, 20.000100001 s]: lo = 8.999 s, hi = 9.000100001 s, slack =
        // 450_006 ns; the bound at 20.000100001 s from the anchor's answer
        // at 10.001 s is trusted(9.999100001 s) = 9_998_600_045.
        let bound = T0 - S as i128 + 9_998_600_045;
        let before = 20 * S;
        let after = 20 * S + 100_001;
        let cases: [(i128, Option<UncertainReason>); 5] = [
            (S as i128 + 9_000_550_007, None),
            (
                S as i128 + 9_000_550_008,
                Some(UncertainReason::ClockStepForward),
            ),
            (S as i128 + 8_998_549_994, None),
            (
                S as i128 + 8_998_549_993,
                Some(UncertainReason::ClockStepBackward),
            ),
            (
                S as i128 + 3_600 * S as i128,
                Some(UncertainReason::ClockStepForward),
            ),
        ];
        for (db, anomaly) in cases {
            let got = carry().first_step(&cfg(), &obs(before, after, db));
            assert_eq!(
                got,
                Some(CarryStep {
                    anomaly,
                    bound_ns: bound
                }),
                "db {db}"
            );
        }
    }

    #[test]
    fn the_first_observation_finds_the_first_anomaly_that_applies() {
        let pending =
            CarriedCut::new(steady(10, 89, 0)).read(&cfg(), reading(11, 3_601 * S as i128, 90, 0));
        let consistent_db = |o: &mut Observation, c: &CarriedCut| {
            o.db_now = ts(c.last().observation.db_now.as_nanosecond() + 9 * S as i128);
        };
        let base = obs(20 * S, 20 * S + MS, 0);
        // (the carry, how the observation differs, the anomaly)
        type Change = fn(&mut Observation);
        let cases: [(CarriedCut, Change, Option<UncertainReason>); 7] = [
            (carry(), |_| {}, None),
            (pending, |_| {}, Some(UncertainReason::ClockStepForward)),
            (
                carry(),
                |o| o.topology.timeline_id = 2,
                Some(UncertainReason::PrimaryChange),
            ),
            (
                carry(),
                |o| o.topology.in_recovery = true,
                Some(UncertainReason::PrimaryChange),
            ),
            (
                carry(),
                |o| o.mono_after_ns = o.mono_before_ns + 500_000_001,
                Some(UncertainReason::ImplausibleObservation),
            ),
            (
                pending,
                |o| o.mono_after_ns = o.mono_before_ns + 500_000_000,
                Some(UncertainReason::ClockStepForward),
            ),
            (
                pending,
                |o| o.topology.postmaster_start = Timestamp::from_second(9).unwrap(),
                Some(UncertainReason::PrimaryChange),
            ),
        ];
        for (c, change, anomaly) in cases {
            let mut o = base;
            consistent_db(&mut o, &c);
            change(&mut o);
            assert_eq!(
                c.first_step(&cfg(), &o).map(|s| s.anomaly),
                Some(anomaly),
                "{o:?}"
            );
        }
        // In recovery on the same server as a reading in recovery.
        let mut r = steady(10, 90, 0);
        r.observation.topology.in_recovery = true;
        let mut o = base;
        o.topology.in_recovery = true;
        consistent_db(&mut o, &CarriedCut::new(r));
        assert_eq!(
            CarriedCut::new(r).first_step(&cfg(), &o).map(|s| s.anomaly),
            Some(Some(UncertainReason::InRecovery))
        );
    }

    #[test]
    fn implausible_first_observations_vouch_for_no_more_than_their_answer() {
        let c = carry();
        let cut = T0 - S as i128;
        // (before, after, anomaly, bound advance)
        let cases: [(u64, u64, Option<UncertainReason>, i128); 5] = [
            // sent the instant the last answer arrived.
            (11 * S + MS, 11 * S + 2 * MS, None, 1_000_949_950),
            // sent before the last answer arrived.
            (
                11 * S + MS - 1,
                11 * S + 2 * MS,
                Some(UncertainReason::ImplausibleObservation),
                1_000_949_950,
            ),
            // answer before question: vouched at the answer.
            (
                12 * S,
                12 * S - 1,
                Some(UncertainReason::ImplausibleObservation),
                1_998_900_049,
            ),
            // answered before the anchor's answer: the anchor's cut.
            (
                10 * S,
                10 * S,
                Some(UncertainReason::ImplausibleObservation),
                0,
            ),
            // round trip exactly at the bound: plausible.
            (12 * S, 12 * S + 500 * MS, None, 2_498_875_050),
        ];
        for (before, after, anomaly, advance) in cases {
            let db = i128::from(before) - 10 * S as i128;
            let got = c.first_step(&cfg(), &obs(before, after, db));
            assert_eq!(
                got,
                Some(CarryStep {
                    anomaly,
                    bound_ns: cut + advance
                }),
                "{before} {after}"
            );
        }
    }

    #[test]
    fn another_database_system_carries_nothing() {
        let mut o = obs(20 * S, 20 * S + MS, 10 * S as i128);
        o.topology.system_identifier = 8;
        assert_eq!(carry().first_step(&cfg(), &o), None);
        o.topology.system_identifier = 7;
        assert!(carry().first_step(&cfg(), &o).is_some());
    }
}
