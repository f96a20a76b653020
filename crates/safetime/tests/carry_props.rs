//! Property tests of the carried cut (`safetime::carry`) and of the first
//! observation of an epoch that uses it (`CutTracker::with_carry`), against
//! an independent model written from the rules' text (the module docs of
//! `carry.rs`): instants and monotonic readings are plain `i128`
//! nanoseconds here.
//!
//! A standby's readings are drawn with edge-biased steps: a publish seen
//! again (a frozen leader) or a newer one, a new epoch, database clock
//! steps of any size in both directions between readings, a topology
//! change; then, after an outage of any length, the new epoch's first
//! observation, with or without a clock step, an implausible round trip
//! or a topology change. For every drawn history:
//!
//! 1. the vouched bound is the first sighting of the newest publish's cut
//!    plus the monotonic time since its answer less the drift allowance,
//!    exactly, and never more than that monotonic time;
//! 2. the proposal is exactly `max(persisted, min(db_now, bound))`: never
//!    below the persisted cut, never past database time, never past the
//!    bound (a forward step is never followed);
//! 3. the first observation is always an anomaly, and its reason is the
//!    model's: the claim's primary change, else the first that applies of
//!    a topology change, an implausible reading or a clock step against
//!    the last reading, a step between readings no leader has observed
//!    since, else the start reason;
//! 4. a quarantined epoch ignores the carry.

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use safetime::{
    CarriedCut, CutReading, CutTracker, Observation, SafeTimeConfig, Topology, UncertainReason,
};

const MS: i128 = 1_000_000;
const S: i128 = 1_000_000_000;
const DRIFT_PPM: i128 = 50;
const RTT_MAX: i128 = 500 * MS;
const T0: i128 = 1_800_000_000 * S;

fn config() -> SafeTimeConfig {
    SafeTimeConfig::new(
        DRIFT_PPM as u32,
        SignedDuration::from_millis(100),
        SignedDuration::from_secs(2),
        SignedDuration::from_nanos(RTT_MAX as i64),
        3,
        SignedDuration::from_millis(400),
    )
    .unwrap()
}

fn trusted(e: i128) -> i128 {
    e.max(0) * (1_000_000 - DRIFT_PPM) / 1_000_000
}

fn slack(e: i128) -> i128 {
    (e.max(0) * DRIFT_PPM + 999_999) / 1_000_000
}

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).unwrap()
}

/// A reading or observation as the model sees it.
#[derive(Debug, Clone, Copy)]
struct Raw {
    db: i128,
    before: i128,
    after: i128,
    timeline: i64,
    epoch: i64,
    seq: i64,
    cut: i128,
}

fn observation(r: &Raw) -> Observation {
    Observation {
        db_now: ts(r.db),
        topology: Topology {
            system_identifier: 42,
            timeline_id: r.timeline,
            in_recovery: false,
            postmaster_start: ts(T0 - 1_000 * S),
        },
        mono_before_ns: u64::try_from(r.before).unwrap(),
        mono_after_ns: u64::try_from(r.after).unwrap(),
    }
}

fn reading(r: &Raw) -> CutReading {
    CutReading {
        cut: ts(r.cut),
        epoch: r.epoch,
        publish_seq: r.seq,
        observation: observation(r),
    }
}

/// The model's clock step of `o` after `p`: database time elapsed outside
/// `[lo - slack, hi + slack]`, `slack = hi * drift` rounded up.
fn model_step(p: &Raw, o: &Raw) -> Option<UncertainReason> {
    let lo = o.before - p.after;
    let hi = o.after - p.before;
    let db = o.db - p.db;
    if db > hi + slack(hi) {
        Some(UncertainReason::ClockStepForward)
    } else if db < lo - slack(hi) {
        Some(UncertainReason::ClockStepBackward)
    } else {
        None
    }
}

/// One drawn step between readings.
#[derive(Debug, Clone)]
struct Step {
    gap_ns: i128,
    rtt_ns: i128,
    db_offset_ns: i128,
    seq_advance: i64,
    new_epoch: bool,
    new_timeline: bool,
    cut_advance_ns: i128,
}

fn db_offset() -> impl Strategy<Value = i128> {
    prop_oneof![
        6 => -100_000i128..=100_000,
        1 => -3_600 * S..=3_600 * S,
        1 => Just(3_600 * S),
        1 => Just(-3 * S),
        1 => -20 * MS..=20 * MS,
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![6 => 50 * MS..=150 * MS, 1 => Just(0i128), 1 => 2 * S..=10 * S],
        prop_oneof![6 => 0..=2 * MS, 1 => Just(RTT_MAX), 1 => RTT_MAX..=3 * S],
        db_offset(),
        prop_oneof![3 => Just(0i64), 3 => Just(1i64), 1 => Just(2i64)],
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.03),
        0..=200 * MS,
    )
        .prop_map(
            |(
                gap_ns,
                rtt_ns,
                db_offset_ns,
                seq_advance,
                new_epoch,
                new_timeline,
                cut_advance_ns,
            )| {
                Step {
                    gap_ns,
                    rtt_ns,
                    db_offset_ns,
                    seq_advance,
                    new_epoch,
                    new_timeline,
                    cut_advance_ns,
                }
            },
        )
}

/// The new epoch's first observation, after the last reading.
#[derive(Debug, Clone)]
struct First {
    outage_ns: i128,
    rtt_ns: i128,
    db_offset_ns: i128,
    new_timeline: bool,
    persisted_offset_ns: i128,
    primary_change: bool,
    quarantined: bool,
}

fn first() -> impl Strategy<Value = First> {
    (
        prop_oneof![3 => 0..=2 * S, 3 => 2 * S..=120 * S, 1 => Just(0i128)],
        prop_oneof![
            6 => 0..=2 * MS,
            1 => Just(RTT_MAX),
            1 => Just(RTT_MAX + 1),
            1 => Just(-1i128),
        ],
        db_offset(),
        prop::bool::weighted(0.1),
        prop_oneof![3 => -S..=0, 1 => 0..=150 * S],
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(
                outage_ns,
                rtt_ns,
                db_offset_ns,
                new_timeline,
                persisted_offset_ns,
                primary_change,
                quarantined,
            )| First {
                outage_ns,
                rtt_ns,
                db_offset_ns,
                new_timeline,
                persisted_offset_ns,
                primary_change,
                quarantined,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn a_carried_cut_vouches_for_monotonic_time_only(
        steps in prop::collection::vec(step(), 0..=40),
        f in first(),
    ) {
        let config = config();
        let mut r = Raw {
            db: T0,
            before: 10 * S,
            after: 10 * S + MS,
            timeline: 1,
            epoch: 4,
            seq: 90,
            cut: T0 - 2 * S,
        };
        let mut readings = vec![r];
        for s in &steps {
            let before = r.after + s.gap_ns;
            let mut next = Raw {
                db: r.db + (before - r.before) + s.db_offset_ns,
                before,
                after: before + s.rtt_ns,
                ..r
            };
            if s.new_timeline {
                next.timeline += 1;
            }
            if s.new_epoch {
                next.epoch += 1;
                next.seq += 1;
            } else {
                next.seq += s.seq_advance;
            }
            if next.seq != r.seq || next.epoch != r.epoch {
                next.cut += s.cut_advance_ns;
            }
            readings.push(next);
            r = next;
        }
        let mut carried = CarriedCut::new(reading(&readings[0]));
        for x in &readings[1..] {
            carried = carried.read(&config, reading(x));
        }
        let last = *readings.last().unwrap();

        // The model's anchor: the first reading of the last run of readings
        // showing one publish.
        let same = |a: &Raw, b: &Raw| a.epoch == b.epoch && a.seq == b.seq && a.cut == b.cut;
        let mut anchor_at = readings.len() - 1;
        while anchor_at > 0 && same(&readings[anchor_at - 1], &last) {
            anchor_at -= 1;
        }
        let anchor = readings[anchor_at];
        prop_assert_eq!(carried.anchor(), &reading(&anchor));
        prop_assert_eq!(carried.last(), &reading(&last));

        // The model's pending step: the latest step between consecutive
        // readings of one topology, unless a later reading shows another
        // epoch or a publish sequence number two beyond the step's reading.
        let latest_step = (1..readings.len()).rev().find_map(|i| {
            let (p, o) = (&readings[i - 1], &readings[i]);
            (p.timeline == o.timeline).then(|| model_step(p, o).map(|why| (i, why))).flatten()
        });
        let pending = latest_step.and_then(|(i, why)| {
            let at = readings[i];
            let observed = readings[i + 1..]
                .iter()
                .any(|x| x.epoch != at.epoch || x.seq >= at.seq + 2);
            (!observed).then_some(why)
        });
        prop_assert_eq!(carried.pending_step(), pending);

        // The first observation of the new epoch.
        let before = last.after + f.outage_ns;
        let o = Raw {
            db: last.db + (before - last.before) + f.db_offset_ns,
            before,
            after: before + f.rtt_ns,
            timeline: last.timeline + i64::from(f.new_timeline),
            ..last
        };
        let bound = anchor.cut + trusted(o.after.max(anchor.after) - anchor.after);
        prop_assert!(bound - anchor.cut <= (o.after - anchor.after).max(0));
        prop_assert_eq!(
            carried.vouched_at(&config, u64::try_from(o.after.max(anchor.after)).unwrap()),
            Some(ts(bound))
        );
        let persisted = anchor.cut + f.persisted_offset_ns;
        let start = if f.primary_change {
            UncertainReason::PrimaryChange
        } else {
            UncertainReason::NewEpoch
        };
        let mut t = CutTracker::new(
            config,
            ts(if f.quarantined { 0 } else { persisted }),
            f.quarantined,
            SignedDuration::from_hours(1),
        )
        .with_start_reason(start)
        .with_carry(carried);
        let v = t.observe(observation(&o));
        prop_assert!(v.anomaly);
        if f.quarantined {
            prop_assert_eq!(v.proposal, ts(0));
            prop_assert_eq!(v.uncertain, Some(UncertainReason::InitialQuarantine));
            return Ok(());
        }
        prop_assert_eq!(v.proposal, ts(persisted.max(o.db.min(bound))));
        let rtt = o.after - o.before;
        let lo = o.before - last.after;
        let found = if o.timeline != last.timeline {
            Some(UncertainReason::PrimaryChange)
        } else if rtt < 0 || lo < 0 || rtt > RTT_MAX {
            Some(UncertainReason::ImplausibleObservation)
        } else {
            model_step(&last, &o).or(pending)
        };
        let reason = if f.primary_change { start } else { found.unwrap_or(start) };
        prop_assert_eq!(v.uncertain, Some(reason));
    }
}
