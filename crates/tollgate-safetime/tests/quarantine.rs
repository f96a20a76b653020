//! Qualification: a populated installation starts quarantined at the Unix
//! epoch, and only an uninterrupted full-horizon run clears it; a sampler
//! restart restarts that proof from zero. The horizon is sealed short
//! (3 s) so the proof runs end to end. On PostgreSQL 15 and 18.

mod support;

use std::time::{Duration, Instant};

use jiff::{SignedDuration, Timestamp};
use safetime::UncertainReason;
use sqlx::{Connection, PgConnection, Row};
use support::{CutWatch, SamplerProc};
use tollgate::{Allocator, CapabilityKey, GrantPolicy};
use tollgate_pg_harness::PgServer;

const HORIZON_MS: i64 = 3_000;

async fn quarantine(major: u32) {
    let server = PgServer::start_dedicated_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    // A lease exists before any sampler ever ran (a service on another
    // clock granted it): the installation holds deadline-bearing authority.
    let policy =
        GrantPolicy::new(SignedDuration::from_secs(1), SignedDuration::from_secs(1)).unwrap();
    let key = CapabilityKey::generate().unwrap();
    let store = tollgate_pg::PostgresStore::connect(db.url(), policy, key.clone())
        .await
        .unwrap();
    let t0 = Timestamp::now();
    let a = tollgate::testkit::new_account(&store, "q", 10, t0).await;
    let g = tollgate::testkit::acquire(&store, a, 4, SignedDuration::from_secs(1), t0).await;
    let mut owner = PgConnection::connect(db.url()).await.unwrap();
    let sealed = safetime_pg::seal_policy(&mut owner, HORIZON_MS, "qualification")
        .await
        .unwrap();
    assert_eq!((sealed.version(), sealed.horizon_ms()), (2, HORIZON_MS));

    // First sampler: quarantined at the Unix epoch, uncertain.
    let first = SamplerProc::start(db.url(), &format!("quarantine-a{major}"));
    let mut w = CutWatch::new(db.url()).await;
    let q = w.until(30, "the quarantined cut", |r| r.epoch == 1).await;
    assert_eq!(
        (q.quarantined, q.uncertain, q.policy.horizon_ms()),
        (true, Some(UncertainReason::InitialQuarantine), HORIZON_MS)
    );
    assert!(
        q.cut < Timestamp::UNIX_EPOCH + SignedDuration::from_secs(60),
        "{}",
        q.cut
    );
    let inv = sqlx::query(
        "SELECT detail->>'active_leases' AS n, detail->>'idempotency_records' AS i, \
                (detail->>'latest_active_expiry_floor_us')::bigint AS e \
           FROM tollgate_safetime_evidence WHERE kind = 'initial_quarantine'",
    )
    .fetch_one(&mut owner)
    .await
    .unwrap();
    assert_eq!(
        (
            inv.get::<String, _>("n"),
            inv.get::<String, _>("i"),
            inv.get::<i64, _>("e")
        ),
        ("1".to_string(), "0".to_string(), g.expiry.as_microsecond())
    );

    // Restart the proof: stop the sampler after 2 s (less than the horizon).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(first.terminate(), Some(0));
    let r = w.read().await.unwrap();
    assert!(r.quarantined, "2 s < 3 s horizon: still quarantined");
    let restarted = Instant::now();
    let second = SamplerProc::start(db.url(), &format!("quarantine-b{major}"));
    let cleared = w
        .until(30, "the quarantine to clear", |r| !r.quarantined)
        .await;
    let proof = restarted.elapsed();
    assert!(
        proof >= Duration::from_millis(HORIZON_MS as u64),
        "cleared {proof:?} after the restart, less than the {HORIZON_MS} ms horizon"
    );
    assert_eq!(cleared.epoch, 2);
    // The cut moved to database time at the clearing.
    assert!(
        cleared.lag() < SignedDuration::from_secs(1),
        "lag {}",
        cleared.lag()
    );
    w.until(10, "certainty", |r| r.uncertain.is_none()).await;
    let kinds: Vec<String> = safetime_pg::evidence(&mut owner, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        ["policy_change", "initial_quarantine", "quarantine_cleared"]
    );
    // The lease granted before the quarantine is long past its deadline in
    // the cleared cut's terms, so a reclaim settles it.
    let cut = w.read().await.unwrap().cut;
    // The store that granted it, opened before any sampler ran and not on
    // the cut, may no longer write leases at all: the database refuses
    // (migration 0018's lease trigger, TGS10), whatever instant it brings.
    let err = store.reclaim(cut, 100).await.unwrap_err();
    assert_eq!(err.code(), "storage_unavailable");
    assert!(
        err.to_string().contains("clock_not_safe_cut") && err.to_string().contains("TGS10"),
        "{err}"
    );
    let on_cut = tollgate_pg::PostgresStore::connect_with(
        db.url(),
        policy,
        key,
        tollgate_pg::StoreOptions {
            on_safe_cut: true,
            ..tollgate_pg::StoreOptions::default()
        },
    )
    .await
    .unwrap();
    let report = on_cut.reclaim(cut, 100).await.unwrap();
    assert_eq!(report.reclaimed, vec![g.lease_id]);
    assert_eq!(second.terminate(), Some(0));
}

#[tokio::test]
async fn quarantine_on_postgresql_15() {
    quarantine(15).await;
}

#[tokio::test]
async fn quarantine_on_postgresql_18() {
    quarantine(18).await;
}
