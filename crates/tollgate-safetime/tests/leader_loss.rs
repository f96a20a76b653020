//! Qualification: the leader's backend is terminated
//! (`pg_terminate_backend`); the standby process takes over with the next
//! epoch and the old epoch can no longer publish. On PostgreSQL 15 and 18.

mod support;

use std::time::Duration;

use sqlx::{Connection, PgConnection};
use support::{CutWatch, SamplerProc};
use tollgate::safe_time::Verdict;
use tollgate_pg::safe_time;
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
    };
    let err = safe_time::publish(&mut c, 1, &v).await.unwrap_err();
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
