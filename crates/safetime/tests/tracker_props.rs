//! Property tests of the cut tracker (`safetime::tracker`) against an
//! independent model written from the rules' text (the module docs of
//! `tracker.rs`, "How the cut moves" and "Certainty"): instants and monotonic
//! readings are plain `i128` nanoseconds here, and the model classifies
//! every observation itself.
//!
//! Sequences of observations are drawn with edge-biased steps: ordinary
//! samples, database clock steps of any size in both directions, small
//! drifts at and beyond the allowance, sampling gaps, round trips beyond the
//! bound, topology changes and recovery states. For every observation:
//!
//! 1. the proposal is never below the current cut;
//! 2. unless the quarantine clears, it is never above `max(cut, db_now)`;
//! 3. unless the quarantine clears, it advances by at most the monotonic
//!    window `hi = after - prev.before` less the drift allowance (and by
//!    nothing on an epoch's first observation);
//! 4. an observation is an anomaly exactly when the model says so, and an
//!    anomaly is never certain;
//! 5. certainty needs at least `stable_observations_min` consecutive
//!    consistent observations and `recovery_grace` of monotonic time since
//!    the last anomaly, and is never reported while quarantined;
//! 6. the quarantine clears only after a trusted run of a full horizon since
//!    the last anomaly.

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use safetime::{CutTracker, Observation, SafeTimeConfig, Topology};

const MS: i128 = 1_000_000;
const S: i128 = 1_000_000_000;
const DRIFT_PPM: i128 = 50;
const GAP_MAX: i128 = 2 * S;
const RTT_MAX: i128 = 500 * MS;
const STABLE_MIN: u32 = 3;
const GRACE: i128 = 400 * MS;
const HORIZON: i128 = 3 * S;
const T0: i128 = 1_800_000_000 * S;

fn config() -> SafeTimeConfig {
    SafeTimeConfig::new(
        DRIFT_PPM as u32,
        SignedDuration::from_millis(100),
        SignedDuration::from_nanos(GAP_MAX as i64),
        SignedDuration::from_nanos(RTT_MAX as i64),
        STABLE_MIN,
        SignedDuration::from_nanos(GRACE as i64),
    )
    .unwrap()
}

fn trusted(e: i128) -> i128 {
    e.max(0) * (1_000_000 - DRIFT_PPM) / 1_000_000
}

fn slack(e: i128) -> i128 {
    (e.max(0) * DRIFT_PPM + 999_999) / 1_000_000
}

/// One drawn step: monotonic gap before the query, round trip, how far the
/// database clock moves relative to the gap, and topology events.
#[derive(Debug, Clone)]
struct Step {
    gap_ns: i128,
    rtt_ns: i128,
    db_offset_ns: i128,
    new_timeline: bool,
    in_recovery: bool,
}

fn step() -> impl Strategy<Value = Step> {
    let gap = prop_oneof![
        6 => 50 * MS..=150 * MS,
        1 => Just(GAP_MAX),
        1 => Just(GAP_MAX + 1),
        1 => GAP_MAX..=10 * S,
        1 => Just(0i128),
    ];
    let rtt = prop_oneof![
        6 => 0..=2 * MS,
        1 => Just(RTT_MAX),
        1 => Just(RTT_MAX + 1),
    ];
    let offset = prop_oneof![
        6 => -100_000i128..=100_000,
        1 => -3_600 * S..=3_600 * S,
        1 => Just(3_600 * S),
        1 => Just(-3 * S),
        1 => -20 * MS..=20 * MS,
    ];
    (
        gap,
        rtt,
        offset,
        prop::bool::weighted(0.03),
        prop::bool::weighted(0.03),
    )
        .prop_map(
            |(gap_ns, rtt_ns, db_offset_ns, new_timeline, in_recovery)| Step {
                gap_ns,
                rtt_ns,
                db_offset_ns,
                new_timeline,
                in_recovery,
            },
        )
}

#[derive(Debug, Clone, Copy)]
struct RawObs {
    db: i128,
    before: i128,
    after: i128,
    timeline: i64,
    in_recovery: bool,
}

fn ts(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).unwrap()
}

fn to_obs(o: RawObs) -> Observation {
    Observation {
        db_now: ts(o.db),
        topology: Topology {
            system_identifier: 42,
            timeline_id: o.timeline,
            in_recovery: o.in_recovery,
            postmaster_start: ts(T0 - 1_000 * S),
        },
        mono_before_ns: u64::try_from(o.before).unwrap(),
        mono_after_ns: u64::try_from(o.after).unwrap(),
    }
}

/// The model's classification of `o` after `p` (`true`: anomaly).
fn model_anomaly(p: Option<RawObs>, o: RawObs) -> bool {
    let Some(p) = p else { return true };
    if p.timeline != o.timeline || p.in_recovery != o.in_recovery || o.in_recovery {
        return true;
    }
    let rtt = o.after - o.before;
    let lo = o.before - p.after;
    let hi = o.after - p.before;
    if rtt < 0 || lo < 0 || rtt > RTT_MAX || lo > GAP_MAX {
        return true;
    }
    let db = o.db - p.db;
    db > hi + slack(hi) || db < lo - slack(hi)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn cut_tracker_obeys_the_rules(
        start_back_ns in 0i128..=10 * S,
        quarantined in prop::bool::weighted(0.3),
        steps in prop::collection::vec(step(), 1..=80),
    ) {
        let start_cut = if quarantined { 0 } else { T0 - start_back_ns };
        let mut t = CutTracker::new(
            config(),
            ts(start_cut),
            quarantined,
            SignedDuration::from_nanos(HORIZON as i64),
        );
        let mut cut = start_cut;
        let mut prev: Option<RawObs> = None;
        let mut mono = 10 * S;
        let mut db = T0;
        let mut timeline = 1i64;
        let mut consecutive = 0u32;
        let mut last_anomaly_after = 0i128;
        let mut model_quarantined = quarantined;
        for s in steps {
            mono += s.gap_ns;
            db += s.gap_ns + s.db_offset_ns;
            if s.new_timeline {
                timeline += 1;
            }
            let o = RawObs {
                db,
                before: mono,
                after: mono + s.rtt_ns,
                timeline,
                in_recovery: s.in_recovery,
            };
            mono += s.rtt_ns;
            let v = t.observe(to_obs(o));
            let proposal = v.proposal.as_nanosecond();
            let anomaly = model_anomaly(prev, o);
            prop_assert_eq!(v.anomaly, anomaly);
            prop_assert!(proposal >= cut, "backward: {} < {}", proposal, cut);
            if anomaly {
                consecutive = 0;
                last_anomaly_after = o.after;
                prop_assert!(v.uncertain.is_some());
            } else {
                consecutive += 1;
            }
            if v.clears_quarantine {
                prop_assert!(model_quarantined);
                prop_assert!(!anomaly);
                prop_assert!(trusted(o.before - last_anomaly_after) >= HORIZON);
                prop_assert_eq!(proposal, cut.max(o.db));
                model_quarantined = false;
            } else {
                prop_assert!(proposal <= cut.max(o.db), "{} above max({}, {})", proposal, cut, o.db);
                match prev {
                    None => prop_assert_eq!(proposal, cut),
                    Some(p) => prop_assert!(
                        proposal - cut <= trusted(o.after - p.before),
                        "advanced {} > trusted {}", proposal - cut, trusted(o.after - p.before)
                    ),
                }
            }
            if v.uncertain.is_none() {
                prop_assert!(!model_quarantined);
                prop_assert!(consecutive >= STABLE_MIN);
                prop_assert!(o.before - last_anomaly_after >= GRACE);
            }
            prop_assert_eq!(t.quarantined(), model_quarantined);
            prop_assert_eq!(v.publishable, !o.in_recovery);
            t.accepted(v.proposal);
            cut = proposal;
            prev = Some(o);
        }
    }
}
