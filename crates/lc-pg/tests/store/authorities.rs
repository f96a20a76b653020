//! Every deadline-bearing authority against the sealed horizon and the
//! initial cut: the start-up check over the whole inventory, the database
//! guard on every deadline column, and the initial-cut inventory.

use jiff::SignedDuration;
use safetime::DeadlineInventory;
use safetime::inventory as kinds;
use sqlx::{Connection, PgConnection};

use super::support::{config, first_claim, migrated_db, store_on};

/// Every trigger of the deadline guard (LCS01), as `(table, floor column)`:
/// a new deadline column without its guard fails here.
const GUARDED: [(&str, &str); 10] = [
    ("lc_approvals", "valid_until_floor_us"),
    ("lc_claims", "expiry_floor_us"),
    ("lc_deletions", "purge_after_floor_us"),
    ("lc_exec_owners", "heartbeat_expiry_floor_us"),
    ("lc_execs", "retain_until_floor_us"),
    ("lc_execs", "timeout_floor_us"),
    ("lc_operations", "gc_floor_us"),
    ("lc_reservations", "expiry_floor_us"),
    ("lc_sandbox_leases", "expiry_floor_us"),
    ("lc_tokens", "deadline_floor_us"),
];

/// The control plane's whole inventory fits the default horizon; sealed
/// at 29 days, the first kind that does not fit (a 30-day token) is named
/// with the policy, and a worker's own kinds stop at its 30-day retention
/// while a gateway's heartbeat still fits.
#[tokio::test]
async fn each_process_checks_its_deadlines_against_the_sealed_horizon() {
    let db = migrated_db().await;
    let store = store_on(&db, config()).await;
    let policy = store
        .check_horizon(&DeadlineInventory::KINDS)
        .await
        .unwrap();
    assert_eq!(
        (policy.version(), policy.horizon_ms()),
        (1, safetime::DEFAULT_HORIZON_MS)
    );
    let inv = store.config().deadline_inventory(&super::support::policy());
    assert_eq!(
        (
            inv.token_ttl_max,
            inv.retention,
            inv.deletion_grace,
            inv.approval_validity_max,
            inv.claim_ttl_max,
            inv.claim_grace,
            inv.owner_heartbeat_ttl_max,
            inv.rate_window_max,
            inv.operation_key_ttl_max,
        ),
        (
            SignedDuration::from_hours(30 * 24),
            SignedDuration::from_hours(30 * 24),
            SignedDuration::from_hours(7 * 24),
            SignedDuration::from_hours(1),
            SignedDuration::from_secs(10),
            SignedDuration::from_secs(2),
            SignedDuration::from_secs(600),
            SignedDuration::from_secs(60),
            SignedDuration::from_hours(24),
        )
    );

    let days_29_ms = 29 * 86_400_000;
    let mut c = PgConnection::connect(&db.url).await.unwrap();
    safetime_pg::seal_policy(&mut c, days_29_ms, "test")
        .await
        .unwrap();
    let err = store
        .check_horizon(&DeadlineInventory::KINDS)
        .await
        .unwrap_err();
    match &err {
        safetime_pg::HorizonCheckError::TooShort { shortfall, which } => assert_eq!(
            (shortfall.kind, shortfall.longest, shortfall.version, *which),
            (
                kinds::SCOPED_TOKEN,
                Some(SignedDuration::from_hours(30 * 24)),
                2,
                "the newest sealed"
            )
        ),
        other => panic!("expected a shortfall, got {other:?}"),
    }
    let worker = [
        kinds::LEASE_GRANT,
        kinds::RESERVATION,
        kinds::SANDBOX_LEASE,
        kinds::CLAIM,
        kinds::RETENTION,
    ];
    match store.check_horizon(&worker).await.unwrap_err() {
        safetime_pg::HorizonCheckError::TooShort { shortfall, .. } => {
            assert_eq!(shortfall.kind, kinds::RETENTION)
        }
        other => panic!("expected a shortfall, got {other:?}"),
    }
    assert_eq!(
        store
            .check_horizon(&[kinds::OWNER_HEARTBEAT])
            .await
            .unwrap()
            .version(),
        2
    );
    // A store whose settings fit 29 days passes every kind.
    let short = store_on(
        &db,
        lc_pg::LcConfig {
            token_ttl_max: SignedDuration::from_hours(29 * 24),
            retention: SignedDuration::from_hours(29 * 24),
            ..config()
        },
    )
    .await;
    assert_eq!(
        short
            .check_horizon(&DeadlineInventory::KINDS)
            .await
            .unwrap()
            .horizon_ms(),
        days_29_ms
    );
}

/// The database guards every deadline column with the horizon (the
/// trigger list is exactly the expected one), and the initial-cut
/// inventory counts each new authority: any one of them alone
/// quarantines the first claim.
#[tokio::test]
async fn every_deadline_column_is_guarded_and_every_authority_quarantines_the_initial_cut() {
    let db = migrated_db().await;
    let mut c = PgConnection::connect(&db.url).await.unwrap();
    let mut guarded: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, \
                encode(substring(t.tgargs FROM 1 FOR position('\\x00'::bytea IN t.tgargs) - 1), 'escape') \
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid \
          WHERE p.proname = 'lc_deadline_within_horizon'",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    guarded.sort();
    let want: Vec<(String, String)> = GUARDED
        .iter()
        .map(|(t, col)| (t.to_string(), col.to_string()))
        .collect();
    assert_eq!(guarded, want);

    let empty = migrated_db().await;
    let (q, kind, inv) = first_claim(&empty.url).await;
    assert_eq!((q, kind.as_str()), (false, "initial_cut"));
    for key in [
        "unrevoked_tokens",
        "approvals",
        "pending_deletions",
        "retained_execs",
        "claims",
    ] {
        assert_eq!(inv[key], 0, "{key}");
    }
    // Each authority alone (its other rows left out: only it is the
    // authority under test), written with the guards off.
    for (what, sql) in [
        (
            "unrevoked_tokens",
            "INSERT INTO lc_tokens (tenant_id, secret_sha256, operations, minted_floor_us, \
                 minted_submicro_ns, deadline_floor_us, deadline_submicro_ns) \
             VALUES (1, decode(repeat('01', 32), 'hex'), ARRAY['exec.read'], 0, 0, 5000000, 0)",
        ),
        (
            "claims",
            "INSERT INTO lc_claims (item_kind, item_id, holder_sha256, generation, \
                 expiry_floor_us, expiry_submicro_ns, basis) \
             VALUES ('lease', 1, decode(repeat('02', 32), 'hex'), 1, 5000000, 0, 'unowned')",
        ),
        (
            "pending_deletions",
            "INSERT INTO lc_deletions SELECT * FROM json_populate_record(NULL::lc_deletions, \
                 '{\"exec_id\": 1, \"item\": \"workspace\", \"state\": \"deleted\", \
                   \"deleted_floor_us\": 0, \"deleted_submicro_ns\": 0, \
                   \"purge_after_floor_us\": 5000000, \"purge_after_submicro_ns\": 0}')",
        ),
        (
            "approvals",
            "INSERT INTO lc_approvals SELECT * FROM json_populate_record(NULL::lc_approvals, \
                 '{\"exec_id\": 1, \"tenant_id\": 1, \"decision\": \"denied\", \"approver\": \"admin\", \"decided_floor_us\": 0, \"decided_submicro_ns\": 0}')",
        ),
    ] {
        let db = migrated_db().await;
        let mut c = PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(&format!(
            "BEGIN; SET LOCAL session_replication_role = replica; {sql}; COMMIT;"
        ))
        .execute(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let (q, kind, inv) = first_claim(&db.url).await;
        assert_eq!((q, kind.as_str()), (true, "initial_quarantine"), "{what}");
        assert_eq!(inv[what], 1, "{what}");
    }
}
