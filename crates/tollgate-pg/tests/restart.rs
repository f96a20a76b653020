//! Durability on a dedicated server: data and capabilities survive a
//! restart and a crash of PostgreSQL; while it is down operations fail as
//! `Unavailable` and change nothing.

mod support;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use sqlx::Connection;
use tollgate::{Allocator, Balances, GrantPolicy, LeaseState};
use tollgate_pg::{PostgresStore, StoreOptions};
use tollgate_pg_harness::PgServer;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_and_capabilities_survive_restart_and_crash() {
    let mut server = tokio::task::spawn_blocking(PgServer::start_dedicated)
        .await
        .unwrap()
        .expect("dedicated server");
    let db = support::create_db(&server.admin_url(), |name| server.url_for(name)).await;
    // The harness runs servers with synchronous_commit off for speed, which
    // may lose the last commits when the postmaster is killed. This
    // database commits synchronously, as production does (WAL reaches the
    // kernel before a commit returns, which survives a process kill).
    let mut admin = sqlx::PgConnection::connect(&server.admin_url())
        .await
        .unwrap();
    sqlx::query(&format!(
        "ALTER DATABASE \"{}\" SET synchronous_commit = on",
        db.name
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    admin.close().await.unwrap();
    tollgate_pg::migrate(db.url()).await.unwrap();
    let policy =
        GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(1)).unwrap();
    let options = StoreOptions {
        max_connections: 2,
        acquire_timeout: Duration::from_secs(3),
        on_safe_cut: false,
    };
    let key = support::test_key();
    let s = PostgresStore::connect_with(db.url(), policy, key.clone(), options)
        .await
        .unwrap();
    let t0 = ts("2026-11-29T12:00:00.123456789Z");
    let a = tollgate::testkit::new_account(&s, "durable", 100, t0).await;
    let g1 = tollgate::testkit::acquire(&s, a, 10, SignedDuration::new(30, 1), t0).await;
    let g2 = tollgate::testkit::acquire(&s, a, 20, SignedDuration::new(40, 2), t0).await;
    let store_id = s.store_id();

    server = tokio::task::spawn_blocking(move || {
        server.restart().expect("restart");
        server
    })
    .await
    .unwrap();
    // The same store reconnects; the capability issued before still works.
    let r1 = s
        .release(g1.lease_id, &g1.capability, t0, Some(3))
        .await
        .unwrap();
    assert_eq!(
        r1.balances,
        Balances {
            deposited: 100,
            available: 77,
            held: 20,
            consumed: 3
        }
    );

    // A crash (SIGKILL of the postmaster) after commit loses nothing.
    server = tokio::task::spawn_blocking(move || {
        server.kill().expect("kill");
        server
    })
    .await
    .unwrap();
    let down = s.account(a).await.unwrap_err();
    assert_eq!(down.code(), "storage_unavailable", "{down}");
    server = tokio::task::spawn_blocking(move || {
        server.start().expect("start");
        server
    })
    .await
    .unwrap();

    // A new process (same key) sees everything and honours old capabilities.
    let s2 = PostgresStore::connect_with(db.url(), policy, key, options)
        .await
        .unwrap();
    assert_eq!(s2.store_id(), store_id);
    let l2 = s2.lease(g2.lease_id, &g2.capability).await.unwrap();
    assert_eq!(
        (
            l2.state,
            l2.expiry,
            l2.fence,
            l2.units,
            l2.expiry_is_upper_bound
        ),
        (
            LeaseState::Active,
            ts("2026-11-29T12:00:40.123456791Z"),
            g2.fence,
            20,
            false
        )
    );
    let l1 = s2.lease(g1.lease_id, &g1.capability).await.unwrap();
    assert_eq!((l1.state, l1.consumed), (LeaseState::Released, Some(3)));
    let r2 = s2
        .release(g2.lease_id, &g2.capability, t0, None)
        .await
        .unwrap();
    assert_eq!(
        r2.balances,
        Balances {
            deposited: 100,
            available: 77,
            held: 0,
            consumed: 23
        }
    );
    let audit = s2.audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    assert_eq!(audit.entries_checked, 5);
    s.close().await;
    s2.close().await;
    tokio::task::spawn_blocking(move || server.stop().expect("stop"))
        .await
        .unwrap();
}
