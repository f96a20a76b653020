//! Qualification: database clock steps under libfaketime, on PostgreSQL 15
//! and 18. The server's wall clock steps while it runs; the sampler (the
//! real binary) must detect each step, make the cut uncertain, never move
//! the cut backward or faster than trusted monotonic time, and recover.

mod support;

use std::time::{Duration, Instant};

use jiff::SignedDuration;
use safetime::UncertainReason;
use support::{CutWatch, SamplerProc};
use tollgate_pg_harness::PgServer;

const SECOND_NS: i64 = 1_000_000_000;

async fn clock_steps(major: u32) {
    let mut server = PgServer::start_dedicated_faketime_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let sampler = SamplerProc::start(db.url(), &format!("steps{major}"));
    let mut w = CutWatch::new(db.url()).await;
    let c0 = w
        .until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;
    assert_eq!((c0.epoch, c0.quarantined), (1, false));

    // Backward step of 3 s: detected, and the cut stands still (database
    // time is behind it) rather than going back. It may become certain
    // again meanwhile (stable observations plus grace): a standing cut is
    // still a safe one.
    let stepped_at = Instant::now();
    server.set_clock_offset_ns(-3 * SECOND_NS).unwrap();
    let b = w
        .until(10, "the backward step", |r| {
            r.uncertain == Some(UncertainReason::ClockStepBackward)
        })
        .await;
    // Database time is now about 3 s behind the cut (less the cut's lag at
    // the step). Every publish is capped at database time, so while a read
    // sees database time still below the cut, no publish before that read
    // can have moved it: the cut stands. (Judged on the database's clock, so
    // a slow host only changes how many reads fall in that window.)
    let mut standing = 0_u32;
    while stepped_at.elapsed() < Duration::from_millis(2_500) {
        let r = w.read().await.unwrap();
        if r.db_now < b.cut {
            standing += 1;
            assert_eq!(
                r.cut, b.cut,
                "the cut stands still while database time is behind it"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        standing >= 5,
        "only {standing} reads saw database time behind the cut"
    );
    let back = w
        .until(20, "certainty after the backward step", |r| {
            r.uncertain.is_none()
        })
        .await;
    assert!(back.cut >= b.cut);
    assert!(
        back.lag() < SignedDuration::from_secs(1),
        "lag {}",
        back.lag()
    );

    // Forward step of one hour: detected; the cut keeps the monotonic rate
    // and never catches up.
    let before = w.read().await.unwrap();
    let i0 = Instant::now();
    server.set_clock_offset_ns(3_597 * SECOND_NS).unwrap();
    w.until(10, "the forward step", |r| {
        r.uncertain == Some(UncertainReason::ClockStepForward)
    })
    .await;
    let after = w
        .until(20, "certainty after the forward step", |r| {
            r.uncertain.is_none()
        })
        .await;
    assert!(
        after.lag() >= SignedDuration::from_secs(3_590),
        "lag {}",
        after.lag()
    );
    for (at, row) in w.seen.iter().filter(|(at, _)| *at >= i0) {
        let advanced = row.cut.duration_since(before.cut);
        let trusted = SignedDuration::try_from(at.duration_since(i0)).unwrap()
            + SignedDuration::from_millis(300);
        assert!(
            advanced <= trusted,
            "the cut advanced {advanced} in {trusted} of monotonic time (incl. 300 ms margin)"
        );
    }
    assert_eq!(sampler.terminate(), Some(0));
}

#[tokio::test]
async fn clock_steps_on_postgresql_15() {
    clock_steps(15).await;
}

#[tokio::test]
async fn clock_steps_on_postgresql_18() {
    clock_steps(18).await;
}
