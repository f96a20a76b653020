//! Qualification: the sampler process is paused (SIGSTOP) longer than the
//! sampling-gap bound; nothing is published meanwhile, and on resumption it
//! reports the gap and recovers. On PostgreSQL 15 and 18. (What the service
//! does meanwhile, refusing and pausing reclaim, is in tests/service.rs.)

mod support;

use std::time::Duration;

use safetime::UncertainReason;
use serde_json::{Value, json};
use support::{CutWatch, SamplerProc};

/// `tollgate-safetime status --gap-max 2s` (the bound the sampler runs
/// with), parsed.
fn status(url: &str) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-safetime"))
        .args(["status", "--gap-max", "2s", "--database-url", url])
        .env_remove("TOLLGATE_SAFETIME_GAP_MAX")
        .output()
        .expect("run tollgate-safetime status");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

async fn paused_sampler(major: u32) {
    let server =
        tollgate_pg_harness::PgServer::start_dedicated_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let sampler = SamplerProc::start(db.url(), &format!("gap{major}"));
    let mut w = CutWatch::new(db.url()).await;
    w.until(30, "a certain cut", |r| r.uncertain.is_none())
        .await;
    let st = status(db.url());
    assert_eq!(
        (
            &st["certain"],
            &st["uncertain_reason"],
            &st["published_reason"],
            &st["gap_max"],
            &st["epoch"]
        ),
        (
            &json!(true),
            &json!(null),
            &json!(null),
            &json!("PT2S"),
            &json!(1)
        ),
        "{st}"
    );

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
    // `tollgate-safetime status` is such a reader: the row is over 3 s old
    // in database time, past the 2 s bound.
    let st = status(db.url());
    assert_eq!(
        (
            &st["certain"],
            &st["uncertain_reason"],
            &st["published_reason"],
            &st["publish_seq"]
        ),
        (
            &json!(false),
            &json!("stale"),
            &json!(null),
            &json!(paused.publish_seq)
        ),
        "{st}"
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
