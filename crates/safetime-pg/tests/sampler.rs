//! The sampler loop against a real PostgreSQL: it wins an epoch, publishes
//! a cut that becomes certain and tracks database time; a standby waits and
//! takes over with the next epoch when the leader stops or its backend is
//! terminated; a leader that loses its lock carries its own cut into its
//! next epoch. (The takeovers that carry a standby's readings, a
//! PostgreSQL restart and a clock step during an outage are qualified
//! against the real binary in `crates/tollgate-safetime/tests`.)

mod support;

use std::time::Duration;

use jiff::SignedDuration;
use safetime::{SafeTimeConfig, UncertainReason};
use safetime_pg::CutRow;
use safetime_pg::sampler::{Sampler, SamplerOptions, SamplerStatus};
use sqlx::{Connection, PgConnection};
use tokio::sync::watch;

/// Fast settings: 50 ms samples, 2 s gap bound, 3 stable observations and
/// 200 ms of calm to recover.
fn fast(standby_poll: Duration) -> SamplerOptions {
    SamplerOptions {
        config: SafeTimeConfig::new(
            50,
            SignedDuration::from_millis(50),
            SignedDuration::from_secs(2),
            SignedDuration::from_millis(500),
            3,
            SignedDuration::from_millis(200),
        )
        .unwrap(),
        standby_poll,
        reconnect_max: Duration::from_millis(500),
    }
}

struct Running {
    stop: watch::Sender<bool>,
    status: watch::Receiver<SamplerStatus>,
    task: tokio::task::JoinHandle<()>,
}

fn start(url: &str, options: SamplerOptions) -> Running {
    let sampler = Sampler::new(url, options).unwrap();
    let status = sampler.status();
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(async move { sampler.run(rx).await });
    Running { stop, status, task }
}

impl Running {
    async fn shutdown(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("sampler stops within 10 s")
            .unwrap();
    }
}

/// Polls the cut every 20 ms until `pred` holds (at most `secs` seconds).
async fn wait_cut(url: &str, secs: u64, what: &str, pred: impl Fn(&CutRow) -> bool) -> CutRow {
    let mut c = PgConnection::connect(url).await.unwrap();
    let mut last = None;
    for _ in 0..secs * 50 {
        if let Some(row) = safetime_pg::read_cut(&mut c).await.unwrap() {
            if pred(&row) {
                return row;
            }
            last = Some(row);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}; last cut row: {last:?}");
}

#[tokio::test]
async fn the_leader_publishes_a_certain_cut_that_tracks_database_time() {
    let db = support::migrated_db().await;
    let s = start(db.url(), fast(Duration::from_millis(50)));
    let row = wait_cut(db.url(), 20, "a certain cut", |r| r.uncertain.is_none()).await;
    assert_eq!((row.epoch, row.quarantined), (1, false));
    // Three stable observations after the first: at least 4 publishes.
    assert!(row.publish_seq >= 4, "publish_seq {}", row.publish_seq);
    assert!(row.cut <= row.db_now);
    assert!(
        row.lag() < SignedDuration::from_secs(1),
        "lag {}",
        row.lag()
    );
    assert_eq!(s.status.borrow().epoch, Some(1));
    // It keeps advancing.
    let later = wait_cut(db.url(), 10, "an advanced cut", |r| r.cut > row.cut).await;
    assert_eq!(later.uncertain, None);
    s.shutdown().await;
}

#[tokio::test]
async fn a_standby_waits_and_takes_over_with_the_next_epoch() {
    let db = support::migrated_db().await;
    let a = start(db.url(), fast(Duration::from_millis(50)));
    wait_cut(db.url(), 20, "a certain cut", |r| r.uncertain.is_none()).await;
    let b = start(db.url(), fast(Duration::from_millis(20)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(b.status.borrow().epoch, None, "a standby never steals");
    assert_eq!(a.status.borrow().epoch, Some(1));
    let before = wait_cut(db.url(), 5, "epoch 1", |r| r.epoch == 1).await;

    a.shutdown().await;
    let row = wait_cut(db.url(), 20, "epoch 2", |r| r.epoch == 2).await;
    assert!(row.cut >= before.cut, "never backward");
    let mut status = b.status.clone();
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.epoch == Some(2)),
    )
    .await
    .unwrap()
    .unwrap();
    wait_cut(db.url(), 20, "certain under epoch 2", |r| {
        r.epoch == 2 && r.uncertain.is_none()
    })
    .await;
    b.shutdown().await;
}

#[tokio::test]
async fn terminating_the_leaders_backend_hands_over_to_the_standby() {
    let db = support::migrated_db().await;
    // The leader yields 2 s after losing leadership; the standby polls
    // every 20 ms, so the standby takes over.
    let a = start(db.url(), fast(Duration::from_secs(2)));
    wait_cut(db.url(), 20, "a certain cut", |r| r.uncertain.is_none()).await;
    let b = start(db.url(), fast(Duration::from_millis(20)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.status.borrow().epoch, None);

    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    let terminated: bool =
        sqlx::query_scalar("SELECT pg_terminate_backend(leader_pid) FROM tollgate_safetime")
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(terminated);
    let row = wait_cut(db.url(), 20, "epoch 2", |r| r.epoch == 2).await;
    assert!(matches!(
        row.uncertain,
        Some(UncertainReason::NewEpoch) | Some(UncertainReason::Recovering) | None
    ));
    let mut sb = b.status.clone();
    tokio::time::timeout(Duration::from_secs(10), sb.wait_for(|s| s.epoch == Some(2)))
        .await
        .unwrap()
        .unwrap();
    // The old leader may still believe it leads until its next statement
    // fails (its session is gone, so the lock already is): the observation,
    // or the publish if the termination landed between the two (57P01).
    let mut wa = a.status.clone();
    let sa = tokio::time::timeout(Duration::from_secs(10), wa.wait_for(|s| s.epoch.is_none()))
        .await
        .expect("the old leader notices the loss within 10 s")
        .unwrap()
        .clone();
    assert_eq!(sa.epoch, None);
    assert!(
        sa.last_loss
            .as_deref()
            .is_some_and(|l| l.starts_with("observation failed")
                || (l.starts_with("publish refused") && l.contains("57P01"))),
        "{:?}",
        sa.last_loss
    );
    // The old leader's epoch is refused even with the lock: only the
    // successor's epoch can publish.
    b.shutdown().await;
    let mut c = PgConnection::connect(db.url()).await.unwrap();
    for _ in 0..100 {
        if safetime_pg::try_lock(&mut c).await.unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v = safetime::Verdict {
        proposal: row.cut,
        uncertain: None,
        anomaly: false,
        clears_quarantine: false,
        publishable: true,
        observed_at: row.cut,
    };
    let err = safetime_pg::publish(&mut c, 1, &v).await.unwrap_err();
    assert_eq!(err.code(), "stale_epoch");
    drop(c);
    a.shutdown().await;
}

/// The lag right after a new publish of `epoch`: reads the cut every
/// millisecond until its publish sequence number moves past the first
/// read's (or its epoch is `epoch` for the first time), at most 10 s.
/// Returns that row and the longest round trip of the reads, so the lag
/// seen is at most one read behind the publish.
async fn lag_after_a_publish(c: &mut PgConnection, epoch: i64) -> (CutRow, Duration) {
    let first = safetime_pg::read_cut(&mut *c).await.unwrap().unwrap();
    let mut rtt_max = Duration::ZERO;
    for _ in 0..10_000 {
        let sent = std::time::Instant::now();
        let row = safetime_pg::read_cut(&mut *c).await.unwrap().unwrap();
        rtt_max = rtt_max.max(sent.elapsed());
        if row.epoch == epoch && (row.epoch != first.epoch || row.publish_seq > first.publish_seq) {
            return (row, rtt_max);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("no publish of epoch {epoch} within 10 s");
}

/// A database instant of the cut row, as microseconds since the Unix epoch.
async fn row_instant_us(c: &mut PgConnection, column: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT tollgate_safetime_pair_us({column}) FROM tollgate_safetime"
    ))
    .fetch_one(c)
    .await
    .unwrap()
}

/// A leader whose backend is terminated, with no standby, waits one
/// standby poll (2 s here) and wins the next epoch itself: it carries its
/// own last publish across, so the lag grows by about a round trip, not
/// by the 2 s outage.
#[tokio::test]
async fn a_leader_that_loses_its_lock_carries_its_own_cut_into_its_next_epoch() {
    let db = support::migrated_db().await;
    let a = start(db.url(), fast(Duration::from_secs(2)));
    wait_cut(db.url(), 20, "a certain cut", |r| r.uncertain.is_none()).await;
    let mut c = PgConnection::connect(db.url()).await.unwrap();
    let (before, rtt_before) = lag_after_a_publish(&mut c, 1).await;
    let terminated: bool =
        sqlx::query_scalar("SELECT pg_terminate_backend(leader_pid) FROM tollgate_safetime")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert!(terminated);
    let last_publish_us = row_instant_us(&mut c, "published_at").await;
    let first = wait_cut(db.url(), 20, "epoch 2", |r| r.epoch == 2).await;
    assert_eq!(
        first.uncertain,
        Some(UncertainReason::NewEpoch),
        "{first:?}"
    );
    let outage_us = row_instant_us(&mut c, "claimed_at").await - last_publish_us;
    let (after, rtt_after) = lag_after_a_publish(&mut c, 2).await;
    let interval = Duration::from_millis(50);
    let rtt = rtt_before.max(rtt_after);
    let added = after.lag() - before.lag();
    eprintln!(
        "lost lock: outage {outage_us} us of database time; lag {} before, {} after, added {added} \
         (allowed: interval {interval:?} + 3 x round trip {rtt:?})",
        before.lag(),
        after.lag()
    );
    assert!(outage_us >= 2_000_000, "the outage lasted {outage_us} us");
    let allowed = SignedDuration::try_from(interval + 3 * rtt).unwrap();
    assert!(
        added <= allowed,
        "the lag grew by {added}, more than {allowed}"
    );
    a.shutdown().await;
}
