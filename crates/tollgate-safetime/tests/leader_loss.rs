//! Qualification: the leader's backend is terminated
//! (`pg_terminate_backend`); the standby process takes over with the next
//! epoch and the old epoch can no longer publish. On PostgreSQL 15 and 18.

mod support;

use std::time::Duration;

use safetime::Verdict;
use sqlx::{Connection, PgConnection};
use support::{CutWatch, SamplerProc};
use tollgate_pg_harness::PgServer;

async fn leader_loss(major: u32) {
    let server = PgServer::start_dedicated_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let a = SamplerProc::start(db.url(), &format!("loss-a{major}"));
    let mut w = CutWatch::new(db.url()).await;
    let first = w
        .until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;
    assert_eq!(first.epoch, 1);
    let b = SamplerProc::start(db.url(), &format!("loss-b{major}"));
    // The standby waits: a second and more of publishes, all from epoch 1.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let r = w.read().await.unwrap();
    assert_eq!(r.epoch, 1);
    assert!(r.publish_seq > first.publish_seq);

    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    let (pid, terminated): (i32, bool) = sqlx::query_as(
        "SELECT leader_pid, pg_terminate_backend(leader_pid) FROM tollgate_safetime",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(terminated, "terminated backend {pid}");
    let r2 = w.until(30, "epoch 2", |r| r.epoch == 2).await;
    assert!(r2.cut >= r.cut);
    let leader2: i32 = sqlx::query_scalar("SELECT leader_pid FROM tollgate_safetime")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_ne!(leader2, pid);
    w.until(30, "certain under epoch 2", |r| {
        r.epoch == 2 && r.uncertain.is_none()
    })
    .await;
    assert!(
        a.log_text().contains("safe-time leadership lost"),
        "the old leader noticed: {}",
        a.log_text()
    );
    assert!(
        b.log_text().contains("safe-time leadership won"),
        "the standby took over: {}",
        b.log_text()
    );
    // Epoch 1 is refused even to a session holding the lock.
    drop(w);
    assert_eq!(b.terminate(), Some(0));
    assert_eq!(a.terminate(), Some(0));
    let mut c = PgConnection::connect(db.url()).await.unwrap();
    support::take_lock(&mut c, "once the leaders stopped").await;
    let v = Verdict {
        proposal: r2.cut,
        uncertain: None,
        anomaly: false,
        clears_quarantine: false,
        publishable: true,
        observed_at: r2.cut,
    };
    let err = safetime_pg::publish(&mut c, 1, &v).await.unwrap_err();
    assert_eq!(err.code(), "stale_epoch");
}

#[tokio::test]
async fn leader_loss_on_postgresql_15() {
    leader_loss(15).await;
}

#[tokio::test]
async fn leader_loss_on_postgresql_18() {
    leader_loss(18).await;
}

/// A frozen leader (SIGSTOP, as a hung or partitioned host would be) holds
/// the lock only until the server ends its idle session (twice the 2 s gap
/// bound); then the standby takes over with the next epoch, and the old
/// leader, resumed, finds its session gone.
async fn frozen_leader(major: u32) {
    let server = PgServer::start_dedicated_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let a = SamplerProc::start(db.url(), &format!("frozen-a{major}"));
    let mut w = CutWatch::new(db.url()).await;
    w.until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;
    let b = SamplerProc::start(db.url(), &format!("frozen-b{major}"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(w.read().await.unwrap().epoch, 1);
    a.signal("STOP");
    // The server's idle timer starts when the frozen leader's last statement
    // ends, which is after that statement's `published_at` (or, for a last
    // sample, after the publish before it). Both instants below are the
    // database's own clock, so host scheduling (the `kill` above, a slow
    // poll) cannot shorten the measured hold. A read that still sees an
    // older publish only lowers `last_publish`, which lengthens the bound.
    let mut admin = PgConnection::connect(db.url()).await.unwrap();
    let last_publish = db_instant(
        &mut admin,
        "SELECT published_at FROM tollgate_safetime WHERE epoch = 1",
    )
    .await;
    let r = w.until(20, "the standby's epoch 2", |r| r.epoch == 2).await;
    assert_eq!(r.epoch, 2);
    let claimed = db_instant(
        &mut admin,
        "SELECT claimed_at FROM tollgate_safetime WHERE epoch = 2",
    )
    .await;
    let held_us = claimed - last_publish;
    // idle_session_timeout = 2 x the 2 s gap bound.
    assert!(
        held_us >= 4_000_000,
        "a healthy-looking leader kept the lock for only {held_us} us of database time"
    );
    a.signal("CONT");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !a.log_text().contains("safe-time leadership lost") {
        assert!(std::time::Instant::now() < deadline, "{}", a.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.until(20, "certain under epoch 2", |r| {
        r.epoch == 2 && r.uncertain.is_none()
    })
    .await;
    assert_eq!(b.terminate(), Some(0));
    assert_eq!(a.terminate(), Some(0));
}

/// A database instant as microseconds since the Unix epoch.
async fn db_instant(c: &mut PgConnection, sql: &str) -> i64 {
    let q = format!("SELECT (extract(epoch FROM t) * 1000000)::bigint FROM ({sql}) AS s(t)");
    sqlx::query_scalar(&q).fetch_one(c).await.unwrap()
}

#[tokio::test]
async fn frozen_leader_on_postgresql_15() {
    frozen_leader(15).await;
}

#[tokio::test]
async fn frozen_leader_on_postgresql_18() {
    frozen_leader(18).await;
}
