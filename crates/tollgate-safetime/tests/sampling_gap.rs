//! Qualification: the sampler process is paused (SIGSTOP) longer than the
//! sampling-gap bound; nothing is published meanwhile, and on resumption it
//! reports the gap and recovers. On PostgreSQL 15 and 18. (What the service
//! does meanwhile, refusing and pausing reclaim, is in tests/service.rs.)

mod support;

use std::time::Duration;

use support::{CutWatch, SamplerProc};
use tollgate::safe_time::UncertainReason;

async fn paused_sampler(major: u32) {
    let server =
        tollgate_pg_harness::PgServer::start_dedicated_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let sampler = SamplerProc::start(db.url(), &format!("gap{major}"));
    let mut w = CutWatch::new(db.url()).await;
    w.until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;

    sampler.signal("STOP");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let paused = w.read().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = w.read().await.unwrap();
    assert_eq!(
        (still.publish_seq, still.cut, still.uncertain),
        (paused.publish_seq, paused.cut, None),
        "a stopped sampler publishes nothing; the row alone still claims certainty, \
         which is why readers apply the gap bound themselves"
    );
    sampler.signal("CONT");
    w.until(10, "the reported gap", |r| {
        r.uncertain == Some(UncertainReason::SamplingGap)
    })
    .await;
    w.until(20, "certainty after the gap", |r| r.uncertain.is_none())
        .await;
    assert_eq!(sampler.terminate(), Some(0));
}

#[tokio::test]
async fn a_paused_sampler_publishes_nothing_then_reports_the_gap_on_postgresql_15() {
    paused_sampler(15).await;
}

#[tokio::test]
async fn a_paused_sampler_publishes_nothing_then_reports_the_gap_on_postgresql_18() {
    paused_sampler(18).await;
}
