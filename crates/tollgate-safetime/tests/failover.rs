//! Qualification: a real two-node primary/standby pair (streaming
//! replication on loopback), on PostgreSQL 15 and 18. The primary dies, the
//! standby is promoted; the sampler waiting there claims the successor
//! epoch, reports the primary change, carries the cut it read there, and
//! only that epoch can publish.

mod support;

use safetime::{UncertainReason, Verdict};
use sqlx::{Connection, PgConnection};
use support::{CutWatch, SamplerProc};
use tollgate_pg_harness::PgPair;

async fn failover(major: u32) {
    let mut pair = PgPair::start_with(support::binaries(major)).unwrap();
    let db = pair.primary().fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let standby_url = pair.standby().url_for(db.name());

    let a = SamplerProc::start(db.url(), &format!("primary{major}"));
    let mut wp = CutWatch::new(db.url()).await;
    let c1 = wp
        .until(30, "a certain cut on the primary", |r| {
            r.uncertain.is_none()
        })
        .await;
    assert_eq!(c1.epoch, 1);
    // A second sampler waits on the standby: it cannot claim there (the
    // server is read-only), so it never publishes.
    let b = SamplerProc::start(&standby_url, &format!("standby{major}"));
    pair.wait_replay_caught_up().await.unwrap();
    let mut ws = CutWatch::new(&standby_url).await;
    let replicated = ws.read().await.unwrap();
    assert_eq!(replicated.epoch, 1);
    drop(wp);

    pair.kill_primary().unwrap();
    pair.promote_standby().await.unwrap();
    let r = ws
        .until(30, "epoch 2 reporting the primary change", |r| {
            r.epoch == 2 && r.uncertain == Some(UncertainReason::PrimaryChange)
        })
        .await;
    assert!(
        r.cut >= replicated.cut,
        "never backward across the failover"
    );
    let certain = ws
        .until(30, "certainty under epoch 2", |r| {
            r.epoch == 2 && r.uncertain.is_none()
        })
        .await;
    assert_eq!(certain.epoch, 2);
    // The sampler waiting on the standby read the replicated cut between
    // its attempts (each refused while the server was in recovery), and
    // carried it into epoch 2.
    assert!(
        b.log_text()
            .contains("carrying the safe cut into the new epoch"),
        "{}",
        b.log_text()
    );
    eprintln!(
        "failover on PostgreSQL {major}: cut lag {:.3} ms on the standby before it, {:.3} ms once \
         certain under epoch 2",
        replicated.lag().as_secs_f64() * 1e3,
        certain.lag().as_secs_f64() * 1e3
    );

    // The stale leader's epoch cannot publish on the new primary: without
    // the lock it is not the leader; with it, epoch 1 is stale.
    let v = Verdict {
        proposal: certain.cut,
        uncertain: None,
        anomaly: false,
        clears_quarantine: false,
        publishable: true,
        observed_at: certain.cut,
    };
    let mut c = PgConnection::connect(&standby_url).await.unwrap();
    assert_eq!(
        safetime_pg::publish(&mut c, 1, &v)
            .await
            .unwrap_err()
            .code(),
        "not_leader"
    );
    assert_eq!(b.terminate(), Some(0));
    support::take_lock(&mut c, "once the leaders stopped").await;
    assert_eq!(
        safetime_pg::publish(&mut c, 1, &v)
            .await
            .unwrap_err()
            .code(),
        "stale_epoch"
    );
    let seq = safetime_pg::read_cut(&mut c)
        .await
        .unwrap()
        .unwrap()
        .publish_seq;
    assert!(seq >= certain.publish_seq);
    assert_eq!(
        safetime_pg::publish(&mut c, 2, &v)
            .await
            .unwrap()
            .publish_seq,
        seq + 1
    );
    assert!(
        a.log_text().contains("safe-time leadership lost"),
        "the old leader noticed: {}",
        a.log_text()
    );
}

#[tokio::test]
async fn failover_on_postgresql_15() {
    failover(15).await;
}

#[tokio::test]
async fn failover_on_postgresql_18() {
    failover(18).await;
}
