//! Qualification: the cut carried across a new epoch, on PostgreSQL 15 and
//! 18, with the real `tollgate-safetime` binary. A standby reads the
//! published cut every interval, and a leader keeps its own accepted
//! publishes, so the lag grows only by time no sampler process observed:
//!
//! * the leader is frozen and then killed (SIGSTOP, then SIGKILL) with a
//!   warm standby: the standby's takeover adds at most one sampling
//!   interval plus round trips to the lag, not the outage;
//! * PostgreSQL restarts under a live leader: its next epoch adds at most
//!   that too;
//! * the database clock steps an hour forward while the leader is down
//!   (libfaketime): the standby's new epoch reports `clock_step_forward`,
//!   carries the monotonic time of the outage and not the step.
//!
//! The cut lag is database time minus the cut, read in one statement right
//! after a publish ([`support::lag_after_a_publish`]): asserted as of the
//! publish (`published_at`, the database's time in the publish, minus the
//! cut, both in the row), so that how late the test's own read came does
//! not enter; as of the read (`clock_timestamp()` minus the cut) it is
//! printed too. Every outage is made long (at least a second, measured on
//! the database clock) so that a takeover that carried nothing would add
//! all of it and fail the bound.

mod support;

use std::time::Duration;

use jiff::SignedDuration;
use safetime::UncertainReason;
use safetime_pg::CutRow;
use safetime_pg::sampler::STANDBY_READER_APPLICATION_NAME;
use sqlx::{Connection, PgConnection};
use support::{
    CutWatch, SamplerProc, db_instant_us, lag_after_a_publish, logged_round_trip_max,
    published_reasons, until_db,
};
use tollgate_pg_harness::PgServer;

/// The samplers' `--interval` in [`support::FAST`].
const INTERVAL: Duration = Duration::from_millis(100);

/// The samplers' drift allowance (`--drift-ppm`, default), in parts per
/// million.
const DRIFT_PPM: u32 = 50;

/// SQL: whether the standby's reader started a read at least 20 ms (of
/// database time) after the last publish, so that its snapshot holds that
/// publish (committed within the publish statement, a moment after its
/// `published_at`).
fn standby_read_the_last_publish() -> String {
    format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity a, tollgate_safetime s \
          WHERE a.datname = current_database() AND a.application_name = \
          '{STANDBY_READER_APPLICATION_NAME}' \
            AND a.query_start > s.published_at + interval '20 milliseconds')"
    )
}

/// The cut lag as of the row's publish: `published_at` minus the cut.
fn lag_at_publish(row: &CutRow) -> SignedDuration {
    row.published_at.duration_since(row.cut)
}

/// Asserts that the lag as of a publish ([`lag_at_publish`]) grew from
/// `before` to `after` by at most one sampling interval (the standby's
/// reading comes up to an interval after a publish), three round trips
/// (the last publish's, the carried reading's and the new epoch's first
/// publish's; `rtt` is the longest measured, by the samplers for their own
/// statements or by the test for its reads) and the drift allowance over
/// the outage; prints the figures, with the lag as of the test's reads. `outage_us` (database time) must be at least 1 s, so that
/// carrying nothing would have failed.
fn check_added_lag(
    what: &str,
    major: u32,
    before: &CutRow,
    after: &CutRow,
    outage_us: i64,
    rtt: Duration,
) {
    let outage = SignedDuration::from_micros(outage_us);
    let drift =
        SignedDuration::from_nanos(outage.as_nanos() as i64 * i64::from(DRIFT_PPM) / 1_000_000);
    let allowed = SignedDuration::try_from(INTERVAL + 3 * rtt).unwrap() + drift;
    let added = lag_at_publish(after) - lag_at_publish(before);
    eprintln!(
        "{what} on PostgreSQL {major}: outage {:.3} ms of database time; cut lag at a publish \
         {:.3} ms before, {:.3} ms after: added {:.3} ms, allowed {:.3} ms (interval {INTERVAL:?} \
         + 3 x round trip {rtt:?} + {DRIFT_PPM} ppm of the outage); at the test's reads {:.3} ms \
         before, {:.3} ms after: added {:.3} ms",
        ms(outage),
        ms(lag_at_publish(before)),
        ms(lag_at_publish(after)),
        ms(added),
        ms(allowed),
        ms(before.lag()),
        ms(after.lag()),
        ms(after.lag() - before.lag())
    );
    assert!(
        outage_us >= 1_000_000,
        "{what}: the outage lasted only {outage:#}, too short to tell a carry from none"
    );
    assert!(
        added <= allowed,
        "{what}: the cut lag grew by {added:#} over a {outage:#} outage, more than {allowed:#}"
    );
}

/// `d` in milliseconds, for the printed figures.
fn ms(d: SignedDuration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The leader freezes (SIGSTOP) and, 1.5 s of database time after its last
/// publish, is killed (SIGKILL); the warm standby takes over with epoch 2
/// and carries the cut it read.
async fn leader_killed(major: u32) {
    let server = PgServer::start_dedicated_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let a = SamplerProc::start(db.url(), &format!("carry-kill-a{major}"));
    let mut w = CutWatch::new(db.url()).await;
    w.until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;
    let b = SamplerProc::start(db.url(), &format!("carry-kill-b{major}"));
    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    until_db(
        &mut admin,
        30,
        "the standby reading the cut",
        &standby_read_the_last_publish(),
    )
    .await;
    let reader_locks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
          WHERE a.application_name = $1 AND l.locktype = 'advisory'",
    )
    .bind(STANDBY_READER_APPLICATION_NAME)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(reader_locks, 0, "the standby's reader never takes the lock");
    let (before, rtt_before) = lag_after_a_publish(&mut admin, 1).await;

    a.signal("STOP");
    until_db(
        &mut admin,
        30,
        "1.5 s since the frozen leader's last publish",
        "SELECT clock_timestamp() - published_at >= interval '1500 milliseconds' \
           FROM tollgate_safetime",
    )
    .await;
    until_db(
        &mut admin,
        30,
        "the standby reading the last publish",
        &standby_read_the_last_publish(),
    )
    .await;
    let last_publish_us =
        db_instant_us(&mut admin, "SELECT published_at FROM tollgate_safetime").await;
    a.signal("KILL");
    let first = w.until(30, "epoch 2", |r| r.epoch == 2).await;
    assert_eq!(
        first.uncertain,
        Some(UncertainReason::NewEpoch),
        "{first:?}"
    );
    let outage_us = db_instant_us(&mut admin, "SELECT claimed_at FROM tollgate_safetime").await
        - last_publish_us;
    let (after, rtt_after) = lag_after_a_publish(&mut admin, 2).await;
    check_added_lag(
        "leader killed, standby took over",
        major,
        &before,
        &after,
        outage_us,
        rtt_before
            .max(rtt_after)
            .max(logged_round_trip_max(&a.log_text()))
            .max(logged_round_trip_max(&b.log_text())),
    );
    w.until(30, "certain under epoch 2", |r| {
        r.epoch == 2 && r.uncertain.is_none()
    })
    .await;
    // The first publish kept the claim's `new_epoch` (the carry found no
    // anomaly); the next reason logged is `recovering`.
    let log = b.log_text();
    assert!(
        log.contains("carrying the safe cut into the new epoch"),
        "{log}"
    );
    assert_eq!(
        published_reasons(&log, 2).first().map(String::as_str),
        Some("recovering"),
        "{log}"
    );
    assert_eq!(b.terminate(), Some(0));
}

#[tokio::test]
async fn a_killed_leaders_standby_carries_the_cut_on_postgresql_15() {
    leader_killed(15).await;
}

#[tokio::test]
async fn a_killed_leaders_standby_carries_the_cut_on_postgresql_18() {
    leader_killed(18).await;
}

/// PostgreSQL stops for 1.5 s and starts again under the one leader; its
/// next epoch (a primary change: a new postmaster) carries its own last
/// publish.
async fn postgres_restart(major: u32) {
    let mut server = PgServer::start_dedicated_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let a = SamplerProc::start(db.url(), &format!("carry-restart{major}"));
    let mut w = CutWatch::new(db.url()).await;
    w.until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;
    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    let (before, rtt_before) = lag_after_a_publish(&mut admin, 1).await;
    drop((w, admin));

    server.stop().unwrap();
    // Real time has to pass with no server running, so no database clock
    // can time it; how long the outage lasted is measured afterwards on the
    // database clock (from the read above to the new epoch's claim).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    server.start().unwrap();
    let mut w = CutWatch::new(db.url()).await;
    let first = w.until(30, "epoch 2", |r| r.epoch == 2).await;
    assert_eq!(
        first.uncertain,
        Some(UncertainReason::PrimaryChange),
        "{first:?}"
    );
    assert!(first.cut >= before.cut, "never backward across the restart");
    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    let outage_us = db_instant_us(&mut admin, "SELECT claimed_at FROM tollgate_safetime").await
        - before.db_now.as_microsecond();
    let (after, rtt_after) = lag_after_a_publish(&mut admin, 2).await;
    check_added_lag(
        "PostgreSQL restarted under the leader",
        major,
        &before,
        &after,
        outage_us,
        rtt_before
            .max(rtt_after)
            .max(logged_round_trip_max(&a.log_text())),
    );
    w.until(30, "certain under epoch 2", |r| {
        r.epoch == 2 && r.uncertain.is_none()
    })
    .await;
    let log = a.log_text();
    // The first publish kept the claim's `primary_change`; then `recovering`.
    assert!(log.contains("safe-time leadership lost"), "{log}");
    assert!(
        log.contains("carrying the safe cut into the new epoch"),
        "{log}"
    );
    assert_eq!(
        published_reasons(&log, 2).first().map(String::as_str),
        Some("recovering"),
        "{log}"
    );
    assert_eq!(a.terminate(), Some(0));
}

#[tokio::test]
async fn a_leader_carries_its_cut_across_a_postgresql_restart_on_postgresql_15() {
    postgres_restart(15).await;
}

#[tokio::test]
async fn a_leader_carries_its_cut_across_a_postgresql_restart_on_postgresql_18() {
    postgres_restart(18).await;
}

/// The database clock's forward step in [`forward_step_during_the_outage`]:
/// 3,597 s (whole seconds, which libfaketime applies exactly).
const STEP_S: i64 = 3_597;

/// The standby's `--interval` in [`forward_step_during_the_outage`]: its
/// first publish stands long enough for the 20 ms polls to see it.
const STEP_TEST_INTERVAL: &str = "500ms";

/// The leader freezes; 1.5 s of database time after its last publish, with
/// the standby's reading of it taken, the database clock steps an hour
/// forward and the leader is killed. The standby's epoch 2 reports the
/// step, carries the outage's monotonic time and never the step. The
/// standby samples (and reads) every [`STEP_TEST_INTERVAL`].
async fn forward_step_during_the_outage(major: u32) {
    let mut server = PgServer::start_dedicated_faketime_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let a = SamplerProc::start(db.url(), &format!("carry-step-a{major}"));
    let mut w = CutWatch::new(db.url()).await;
    w.until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;
    let b = SamplerProc::start_with(
        db.url(),
        &format!("carry-step-b{major}"),
        &support::fast_with_setting("--interval", STEP_TEST_INTERVAL),
    );
    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    until_db(
        &mut admin,
        30,
        "the standby reading the cut",
        &standby_read_the_last_publish(),
    )
    .await;

    a.signal("STOP");
    until_db(
        &mut admin,
        30,
        "1.5 s since the frozen leader's last publish",
        "SELECT clock_timestamp() - published_at >= interval '1500 milliseconds' \
           FROM tollgate_safetime",
    )
    .await;
    until_db(
        &mut admin,
        30,
        "the standby reading the last publish",
        &standby_read_the_last_publish(),
    )
    .await;
    let last = w.read().await.unwrap();
    assert_eq!(last.epoch, 1);
    let last_publish_us =
        db_instant_us(&mut admin, "SELECT published_at FROM tollgate_safetime").await;
    server.set_clock_offset_ns(STEP_S * 1_000_000_000).unwrap();
    a.signal("KILL");
    let first = w
        .until(30, "epoch 2's first publish", |r| {
            r.epoch == 2 && r.publish_seq > last.publish_seq
        })
        .await;
    assert_eq!(
        first.uncertain.map(|r| r.code()),
        Some("clock_step_forward"),
        "{first:?}"
    );
    let step_us = STEP_S * 1_000_000;
    let outage_us = db_instant_us(&mut admin, "SELECT claimed_at FROM tollgate_safetime").await
        - step_us
        - last_publish_us;
    let carried = first.cut.duration_since(last.cut);
    eprintln!(
        "forward step of {STEP_S} s during a {:.3} ms outage on PostgreSQL {major}: the cut \
         carried {:.3} ms; reason {:?}",
        ms(SignedDuration::from_micros(outage_us)),
        ms(carried),
        first.uncertain
    );
    // The carry vouched for the outage's monotonic time, from the standby's
    // first reading of the last publish: up to one of its 500 ms intervals
    // after it, and round trips (250 ms allowed for them on a loaded host)...
    assert!(
        carried >= SignedDuration::from_micros(outage_us) - SignedDuration::from_millis(750),
        "the cut carried only {carried:#} over a {outage_us} us outage"
    );
    let certain = w
        .until(30, "certain under epoch 2", |r| {
            r.epoch == 2 && r.uncertain.is_none()
        })
        .await;
    // ...and never the step: at every read, the cut had advanced from the
    // last publish by no more than the real time since it (database time
    // less the known step; 1 ms for the microsecond readings).
    for (_, row) in w.seen.iter().filter(|(_, r)| r.epoch == 2) {
        let real_us = row.db_now.as_microsecond() - step_us - last_publish_us;
        let advanced = row.cut.duration_since(last.cut);
        assert!(
            advanced <= SignedDuration::from_micros(real_us) + SignedDuration::from_millis(1),
            "the cut advanced {advanced:#} in {real_us} us of real time"
        );
    }
    assert!(
        certain.lag() >= SignedDuration::from_secs(STEP_S - 5),
        "lag {:#}",
        certain.lag()
    );
    let log = b.log_text();
    assert_eq!(
        published_reasons(&log, 2).first().map(String::as_str),
        Some("clock_step_forward"),
        "{log}"
    );
    assert_eq!(b.terminate(), Some(0));
}

#[tokio::test]
async fn a_forward_step_during_a_takeover_is_detected_and_not_carried_on_postgresql_15() {
    forward_step_during_the_outage(15).await;
}

#[tokio::test]
async fn a_forward_step_during_a_takeover_is_detected_and_not_carried_on_postgresql_18() {
    forward_step_during_the_outage(18).await;
}
