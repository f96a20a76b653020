//! Migration 0019 (the lease-write guard) on a database at version 18 that
//! holds leases, a recorded policy and a claimed cut: it changes no row
//! and adds only its functions and triggers; afterwards a store of this
//! binary works on the old leases, while writes that do not declare the
//! recorded policy, or that would pass the quarantined cut plus the
//! horizon, are refused.

mod support;

use jiff::{SignedDuration, Timestamp};
use sqlx::{Connection, PgConnection};
use support::{catalog, data, legacy};
use tollgate::{Allocator, GrantPolicy, LeaseId, LeaseState, StorageError};
use tollgate_pg::Schema;

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap()
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Inserts an active lease of `units` on `account` expiring at `expiry`, as
/// a writer of schema 18 did; returns its id.
async fn insert_lease(
    c: &mut PgConnection,
    account: i64,
    units: i64,
    expiry: Timestamp,
    upper_bound: bool,
) -> Result<i64, sqlx::Error> {
    let pair = tollgate::InstantPair::encode(expiry);
    sqlx::query_scalar(
        "INSERT INTO tollgate_leases (account_id, units, fence, expiry_floor_us, \
         expiry_submicro_ns, expiry_is_upper_bound, state) \
         VALUES ($1, $2, nextval('tollgate_fence_seq'), $3, $4, $5, 'active') \
         RETURNING lease_id",
    )
    .bind(account)
    .bind(units)
    .bind(pair.floor_us)
    .bind(pair.submicro_ns)
    .bind(upper_bound)
    .fetch_one(&mut *c)
    .await
}

#[tokio::test]
async fn a_database_at_18_with_leases_upgrades_without_a_changed_row() {
    let db = support::fresh_db().await;
    let report = Schema::through(18)
        .unwrap()
        .migrate(db.url())
        .await
        .unwrap();
    assert_eq!(report.to_version, Some(18));
    let mut c = support::connect(&db).await;
    legacy::record_policy(&mut c, policy()).await.unwrap();
    let account: i64 = sqlx::query_scalar(
        "INSERT INTO tollgate_accounts (name, deposited, available, held) \
         VALUES ('a', 100, 85, 15) RETURNING account_id",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    let exact = insert_lease(
        &mut c,
        account,
        10,
        ts("2026-11-29T12:00:30.000000001Z"),
        false,
    )
    .await
    .unwrap();
    let legacy_bound = insert_lease(
        &mut c,
        account,
        5,
        ts("2026-11-29T12:00:30.000000999Z"),
        true,
    )
    .await
    .unwrap();
    // A sampler claims epoch 1: the installation holds leases, so the cut
    // starts quarantined at the Unix epoch.
    let mut sampler = PgConnection::connect(db.url()).await.unwrap();
    assert!(safetime_pg::try_lock(&mut sampler).await.unwrap());
    let horizon = safetime_pg::load_policy(&mut sampler).await.unwrap();
    let claim = safetime_pg::claim(&mut sampler, &horizon).await.unwrap();
    assert_eq!(
        (claim.epoch, claim.cut, claim.quarantined),
        (1, Timestamp::UNIX_EPOCH, true)
    );
    sampler.close().await.unwrap();

    let data_before = data(&mut c, &[]).await;
    let catalog_before = catalog(&mut c).await;
    let report = tollgate_pg::migrate(db.url()).await.unwrap();
    assert_eq!(
        (report.from_version, report.to_version, report.applied),
        (Some(18), Some(21), vec![19, 20, 21])
    );
    // No row changed; the bookkeeping gained the rows of 0019, 0020 and
    // 0021 and safe time's (empty) table.
    let data_after = data(&mut c, &["_sqlx_migrations", "_safetime_migrations"]).await;
    let data_before_rows: Vec<_> = data_before
        .into_iter()
        .filter(|(t, _)| t != "_sqlx_migrations")
        .collect();
    assert_eq!(data_after, data_before_rows, "a row changed");
    // The catalog gained exactly the functions and triggers of 0019 and
    // 0020 (and safe time's bookkeeping table), and 0021 swapped the
    // publish for the one dated by its observation; nothing else changed
    // or vanished.
    let catalog_after = catalog(&mut c).await;
    let old_publish =
        "function tollgate_safetime_publish(bigint,bigint,integer,text,boolean,boolean) ";
    let new_publish =
        "function tollgate_safetime_publish(bigint,bigint,integer,text,boolean,boolean,bigint) ";
    let gone: Vec<&String> = catalog_before
        .iter()
        .filter(|e| !catalog_after.contains(e))
        .collect();
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert!(gone[0].starts_with(old_publish), "{gone:?}");
    assert_eq!(
        catalog_after
            .iter()
            .filter(|e| e.starts_with(new_publish))
            .count(),
        1
    );
    let added: Vec<String> = catalog_after
        .into_iter()
        .filter(|e| {
            !catalog_before.contains(e)
                && !e.contains("_safetime_migrations")
                && !e.starts_with(new_publish)
        })
        .map(|e| {
            // A function's entry ends with the md5 of its body.
            e.rsplit_once(' ')
                .filter(|_| e.starts_with("function "))
                .map_or(e.clone(), |(head, _)| head.to_owned())
        })
        .collect();
    assert_eq!(
        added,
        [
            "function tollgate_duration_text(numeric)",
            "function tollgate_grant_policy_declaration()",
            "function tollgate_instant_text(numeric)",
            "function tollgate_leases_under_policy()",
            "function tollgate_leases_within_horizon()",
            "function tollgate_policy_change_waits()",
            "function tollgate_seal_covers_active_leases()",
            "trigger tollgate_leases_under_policy tollgate_leases",
            "trigger tollgate_leases_within_horizon_insert tollgate_leases",
            "trigger tollgate_leases_within_horizon_update tollgate_leases",
            "trigger tollgate_policy_change_waits tollgate_policy",
            "trigger tollgate_seal_covers_active_leases tollgate_safetime_policy",
        ]
    );

    // This binary's store opens the database and settles an old lease.
    let key = support::test_key();
    let store = tollgate_pg::PostgresStore::connect_with(
        db.url(),
        policy(),
        key.clone(),
        tollgate_pg::StoreOptions {
            on_safe_cut: true,
            ..support::TEST_OPTIONS
        },
    )
    .await
    .unwrap();
    let store_id = legacy::store_id(&mut c).await;
    let cap = |id: i64| key.derive(store_id, LeaseId(id));
    let now = ts("2026-11-29T12:00:00Z");
    store
        .release(LeaseId(exact), &cap(exact), now, Some(3))
        .await
        .unwrap();
    assert_eq!(
        store
            .lease(LeaseId(exact), &cap(exact))
            .await
            .unwrap()
            .state,
        LeaseState::Released
    );
    // Extending the legacy-bound lease from a time far ahead of the
    // quarantined cut would pass cut + horizon: refused, no row changed
    // (the fence it drew is skipped, as after any rollback).
    let rows = async |c: &mut PgConnection| {
        let mut d = data(c, &[]).await;
        d.retain(|(t, _)| t != "(sequences)");
        d
    };
    let before = rows(&mut c).await;
    let err = store
        .renew(
            LeaseId(legacy_bound),
            &cap(legacy_bound),
            SignedDuration::from_mins(1),
            now.into(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "horizon_exceeded");
    assert!(
        matches!(&err, tollgate::AllocatorError::Storage(StorageError::HorizonExceeded { message })
            if message.contains("beyond cut 1970-01-01T00:00:00Z + horizon PT87600H (sealed policy version 1)")),
        "{err}"
    );
    assert_eq!(rows(&mut c).await, before);
    // A session on the cut that declares no policy (an older binary still
    // running) writes nothing.
    sqlx::query("SET tollgate.clock = 'safe-cut'")
        .execute(&mut c)
        .await
        .unwrap();
    let err = insert_lease(&mut c, account, 1, ts("1970-01-02T00:00:00Z"), false)
        .await
        .unwrap_err();
    assert_eq!(legacy::sqlstate(&err).as_deref(), Some("TGS11"), "{err}");
    store.close().await;
}
