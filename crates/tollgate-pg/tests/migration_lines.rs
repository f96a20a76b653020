//! The migration lines on real PostgreSQL: a fresh database gets every line
//! in order; a database built by the binary before the lines (sqlx's own
//! migrator on `_sqlx_migrations`) upgrades without a changed row or a
//! re-run migration; a line at a version this binary does not know is
//! refused; and a second line keeps its own bookkeeping and fence.

mod support;

use jiff::{SignedDuration, Timestamp};
use pgkit::MigrationLine;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{PgConnection, PgPool};
use support::{catalog, data};
use tollgate::{AcquireRequest, Allocator, GrantPolicy, NewAccount, StorageError};
use tollgate_pg::{PendingMigration, PostgresStore, Schema};

/// sqlx's own migrator on `_sqlx_migrations`, as the binary before the
/// lines embedded and ran it, over this binary's migrations of Tollgate's
/// line (that binary carried 1 through 18; the upgrade from 18 with data
/// is `tests/migration_0019.rs`), but for migration 0018's reworded opening
/// comment ([`main_migrator`]).
static MAIN_MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// [`MAIN_MIGRATOR`] with the checksum migration 0018 had in the binary
/// before the lines.
fn main_migrator() -> Migrator {
    let previous = tollgate_pg::schema::SAFE_TIME_PREVIOUS_CHECKSUM;
    let bytes: Vec<u8> = (0..previous.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&previous[i..i + 2], 16).unwrap())
        .collect();
    let mut migrations = MAIN_MIGRATOR.migrations.to_vec();
    let m18 = migrations.iter_mut().find(|m| m.version == 18).unwrap();
    assert_ne!(&*m18.checksum, bytes.as_slice(), "0018 was reworded");
    m18.checksum = bytes.into();
    Migrator {
        migrations: migrations.into(),
        ..Migrator::DEFAULT
    }
}

fn policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap()
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn backend(message: &str) -> StorageError {
    StorageError::Failure {
        message: message.into(),
    }
}

/// The refusal of a Tollgate line at version 22 (the message of the
/// binaries before the lines).
const UNKNOWN_22: &str = "database has applied migration version 22 (future), which this \
     binary does not know (it knows versions 1 through 21); refusing to start against a newer \
     schema: run a binary that carries version 22";

/// The refusal of a safe-time line at version 1.
const UNKNOWN_SAFE_TIME_1: &str = "safetime migrations (table _safetime_migrations): database \
     has applied migration version 1 (cut history), which this binary does not know (it knows \
     none); refusing to start against a newer schema: run a binary that carries version 1";

/// The full bookkeeping rows of `table`, `installed_on` and
/// `execution_time` included.
async fn bookkeeping(conn: &mut PgConnection, table: &str) -> Vec<String> {
    sqlx::query_scalar(&format!(
        "SELECT to_jsonb(t)::text FROM {table} t ORDER BY version"
    ))
    .fetch_all(conn)
    .await
    .unwrap()
}

async fn table_exists(conn: &mut PgConnection, table: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// `(version, description, success, checksum)` of `table`.
async fn rows(conn: &mut PgConnection, table: &str) -> Vec<(i64, String, bool, Vec<u8>)> {
    sqlx::query_as(&format!(
        "SELECT version, description, success, checksum FROM {table} ORDER BY version"
    ))
    .fetch_all(conn)
    .await
    .unwrap()
}

fn expected_rows(line: &MigrationLine) -> Vec<(i64, String, bool, Vec<u8>)> {
    line.migrations()
        .iter()
        .map(|m| {
            (
                m.version,
                m.description.to_string(),
                true,
                m.checksum.to_vec(),
            )
        })
        .collect()
}

fn mig(version: i64, description: &'static str, sql: &'static str) -> Migration {
    Migration::new(
        version,
        description.into(),
        MigrationType::Simple,
        sql.into(),
        false,
    )
}

/// A test-only line whose first migration needs Tollgate's tables.
fn test_line(through: i64) -> MigrationLine {
    let all = vec![
        mig(
            1,
            "notes",
            "CREATE TABLE tgtest_notes (account_id bigint PRIMARY KEY \
             REFERENCES tollgate_accounts (account_id), note text NOT NULL)",
        ),
        mig(
            2,
            "note length",
            "ALTER TABLE tgtest_notes ADD CHECK (length(note) <= 100)",
        ),
    ];
    MigrationLine::new(
        "tgtest",
        "_tgtest_migrations",
        all.into_iter()
            .filter(|m| m.version <= through)
            .collect::<Vec<_>>(),
    )
}

/// A line's report as `(line, from_version, to_version, applied)`.
type Versions<'a> = (&'a str, Option<i64>, Option<i64>, Vec<i64>);

fn versions(report: &[pgkit::LineReport]) -> Vec<Versions<'_>> {
    report
        .iter()
        .map(|r| (r.line, r.from_version, r.to_version, r.applied.clone()))
        .collect()
}

// ---------------------------------------------------------------------------
// (a) A fresh database.

#[tokio::test]
async fn a_fresh_database_gets_every_line_in_order() {
    let db = support::fresh_db().await;
    let report = tollgate_pg::migrate(db.url()).await.unwrap();
    assert_eq!(
        (
            report.from_version,
            report.to_version,
            report.applied.clone()
        ),
        (None, Some(21), (1..=21).collect::<Vec<i64>>())
    );
    assert_eq!(
        versions(&report.lines),
        [
            ("tollgate", None, Some(21), (1..=21).collect()),
            ("safetime", None, None, vec![]),
        ]
    );
    let mut c = support::connect(&db).await;
    assert_eq!(
        rows(&mut c, "_sqlx_migrations").await,
        expected_rows(&tollgate_pg::tollgate_line())
    );
    // Safe time's table exists, with sqlx's columns, and is empty.
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_name = '_safetime_migrations' ORDER BY ordinal_position",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    let sqlx_columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
         WHERE table_name = '_sqlx_migrations' ORDER BY ordinal_position",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(columns, sqlx_columns);
    assert_eq!(
        columns.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        [
            "version",
            "description",
            "installed_on",
            "success",
            "checksum",
            "execution_time"
        ]
    );
    assert_eq!(rows(&mut c, "_safetime_migrations").await, vec![]);

    // With a further line that depends on Tollgate's tables: applied last.
    let db2 = support::fresh_db().await;
    let schema = Schema::current().with_line(test_line(2));
    let report = schema.migrate(db2.url()).await.unwrap();
    assert_eq!(
        versions(&report.lines),
        [
            ("tollgate", None, Some(21), (1..=21).collect()),
            ("safetime", None, None, vec![]),
            ("tgtest", None, Some(2), vec![1, 2]),
        ]
    );
    let mut c2 = support::connect(&db2).await;
    let first_test: String = sqlx::query_scalar(
        "SELECT (SELECT max(installed_on) FROM _sqlx_migrations) \
                <= (SELECT min(installed_on) FROM _tgtest_migrations) \
                AND (SELECT count(*) FROM _sqlx_migrations WHERE version > 21) = 0 \
                AND to_regclass('tgtest_notes') IS NOT NULL AS ok",
    )
    .fetch_one(&mut c2)
    .await
    .map(|ok: bool| ok.to_string())
    .unwrap();
    assert_eq!(first_test, "true");
    schema
        .check(&PgPool::connect(db2.url()).await.unwrap())
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------
// (b) A database migrated by the binary before the lines.

#[tokio::test]
async fn a_database_migrated_by_the_binary_before_the_lines_upgrades_unchanged() {
    let db = support::fresh_db().await;
    // Today's main: a plain `sqlx::migrate!` migrator on `_sqlx_migrations`.
    let pool = PgPool::connect(db.url()).await.unwrap();
    main_migrator().run(&pool).await.unwrap();

    // This binary's store opens it as it is (the safe-time line has nothing
    // pending), and writes a history: accounts, keys, grants, renewals,
    // releases, a consolidation, a reclaim, idempotency records, policy
    // changes.
    let store = support::store_on(&db, policy(), support::test_key()).await;
    let t0 = ts("2026-03-01T12:00:00.123456789Z");
    let keyed = store
        .create_account(NewAccount {
            name: "keyed".into(),
            api_key_sha256: Some([7; 32]),
        })
        .await
        .unwrap()
        .account_id;
    let plain = tollgate::testkit::new_account(&store, "plain", 1_000, t0).await;
    store.deposit(keyed, 500, t0).await.unwrap();
    let g1 = tollgate::testkit::acquire(&store, plain, 10, SignedDuration::new(30, 7), t0).await;
    let g2 = tollgate::testkit::acquire(&store, plain, 20, SignedDuration::new(40, 1), t0).await;
    let g3 = tollgate::testkit::acquire(&store, keyed, 5, SignedDuration::from_secs(1), t0).await;
    let idem = store
        .acquire(
            AcquireRequest {
                account_id: plain,
                units: 3,
                ttl: SignedDuration::from_secs(10),
                idempotency_key: Some("k-1".into()),
            },
            t0.into(),
        )
        .await
        .unwrap();
    store
        .renew(
            g1.lease_id,
            &g1.capability,
            SignedDuration::new(50, 3),
            t0.into(),
        )
        .await
        .unwrap();
    store
        .release(g2.lease_id, &g2.capability, t0, Some(4))
        .await
        .unwrap();
    store
        .consolidate(
            plain,
            &[
                (g1.lease_id, g1.capability.clone()),
                (idem.lease_id, idem.capability.clone()),
            ],
            SignedDuration::from_secs(20),
            t0.into(),
        )
        .await
        .unwrap();
    let reclaimed = store
        .reclaim(ts("2026-03-01T12:00:07Z"), 100)
        .await
        .unwrap();
    assert_eq!(reclaimed.reclaimed.len(), 1, "{reclaimed:?}");
    assert_eq!(reclaimed.reclaimed, [g3.lease_id]);
    tollgate_pg::set_policy(
        store.pool(),
        GrantPolicy::new(SignedDuration::from_secs(90), SignedDuration::from_secs(5)).unwrap(),
        "ops",
    )
    .await
    .unwrap();
    store.close().await;

    let mut c = support::connect(&db).await;
    let data_before = data(&mut c, &[]).await;
    let catalog_before = catalog(&mut c).await;
    let bookkeeping_before = bookkeeping(&mut c, "_sqlx_migrations").await;
    assert_eq!(bookkeeping_before.len(), 21);
    assert!(!table_exists(&mut c, "_safetime_migrations").await);
    // Every Tollgate table has rows to compare.
    for table in [
        "tollgate_accounts",
        "tollgate_account_keys",
        "tollgate_leases",
        "tollgate_ledger",
        "tollgate_idempotency",
        "tollgate_policy",
        "tollgate_policy_changes",
        "tollgate_store",
    ] {
        let n = data_before
            .iter()
            .find(|(t, _)| t == table)
            .map(|(_, r)| r.len());
        assert!(n.is_some_and(|n| n > 0), "{table}: {n:?}");
    }

    // This binary's migrate: no migration of Tollgate's line runs again.
    let report = tollgate_pg::migrate(db.url()).await.unwrap();
    assert_eq!(
        (
            report.from_version,
            report.to_version,
            report.applied.clone()
        ),
        (Some(21), Some(21), vec![])
    );
    assert_eq!(
        versions(&report.lines),
        [
            ("tollgate", Some(21), Some(21), vec![]),
            ("safetime", None, None, vec![]),
        ]
    );
    assert_eq!(
        data(&mut c, &["_safetime_migrations"]).await,
        data_before,
        "a row changed"
    );
    assert_eq!(
        bookkeeping(&mut c, "_sqlx_migrations").await,
        bookkeeping_before,
        "a bookkeeping row changed"
    );
    // The one change: safe time's empty bookkeeping table.
    let mut expected_catalog = catalog_before.clone();
    for (column, ty) in [
        ("version", "bigint"),
        ("description", "text"),
        ("installed_on", "timestamp with time zone"),
        ("success", "boolean"),
        ("checksum", "bytea"),
        ("execution_time", "bigint"),
    ] {
        expected_catalog.push(format!("column _safetime_migrations.{column} {ty}"));
    }
    expected_catalog.push("constraint _safetime_migrations_pkey PRIMARY KEY (version)".into());
    expected_catalog.push(
        "index CREATE UNIQUE INDEX _safetime_migrations_pkey ON public._safetime_migrations \
         USING btree (version)"
            .into(),
    );
    expected_catalog.sort();
    assert_eq!(catalog(&mut c).await, expected_catalog);
    assert_eq!(rows(&mut c, "_safetime_migrations").await, vec![]);

    // Both binaries accept the result: this one's fence, the old one's
    // fence and its migrator (nothing to do).
    Schema::current().check(&pool).await.unwrap();
    Schema::through(tollgate_pg::PUBLISH_AT_OBSERVATION_VERSION)
        .unwrap()
        .check(&pool)
        .await
        .unwrap();
    main_migrator().run(&pool).await.unwrap();
    assert_eq!(
        bookkeeping(&mut c, "_sqlx_migrations").await,
        bookkeeping_before
    );
    // And the store carries on from the same history.
    let store = support::store_on(&db, policy_after(), support::test_key()).await;
    let g4 = tollgate::testkit::acquire(&store, plain, 1, SignedDuration::from_secs(5), t0).await;
    assert!(g4.fence > g3.fence);
    let audit = store.audit().await.unwrap();
    assert!(audit.is_clean(), "{:?}", audit.violations);
    store.close().await;
    pool.close().await;
}

fn policy_after() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_secs(90), SignedDuration::from_secs(5)).unwrap()
}

// ---------------------------------------------------------------------------
// (c) A line at a version this binary does not know.

#[tokio::test]
async fn a_line_at_an_unknown_version_is_refused_everywhere() {
    // Tollgate's line at 22: the message of the binaries before the lines.
    let db = support::migrated_db().await;
    let mut c = support::connect(&db).await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (22, 'future', true, '\\x00', 0)",
    )
    .execute(&mut c)
    .await
    .unwrap();
    check_refused_everywhere(&db, UNKNOWN_22).await;

    // Safe time's line at 1, on a database whose Tollgate line is at 16:
    // refused before anything is applied.
    let db = support::fresh_db().await;
    Schema::through(16)
        .unwrap()
        .migrate(db.url())
        .await
        .unwrap();
    let mut c = support::connect(&db).await;
    sqlx::raw_sql(
        "CREATE TABLE _safetime_migrations (version BIGINT PRIMARY KEY, \
         description TEXT NOT NULL, installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), \
         success BOOLEAN NOT NULL, checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL); \
         INSERT INTO _safetime_migrations (version, description, success, checksum, \
         execution_time) VALUES (1, 'cut history', true, '\\x00', 0)",
    )
    .execute(&mut c)
    .await
    .unwrap();
    check_refused_everywhere(&db, UNKNOWN_SAFE_TIME_1).await;
    let tollgate_at: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(tollgate_at, 16);
    // The binary before the lines knows no safe-time line, and so does not
    // look at it.
    Schema::through(16)
        .unwrap()
        .check(&PgPool::connect(db.url()).await.unwrap())
        .await
        .unwrap();
}

/// `migrate`, `pending_migrations`, the store fence and the store refuse
/// the database at `db` with `message`, as `storage_failure`.
async fn check_refused_everywhere(db: &support::Db, message: &str) {
    let refusal = backend(message);
    assert_eq!(refusal.code(), "storage_failure");
    assert_eq!(tollgate_pg::migrate(db.url()).await.unwrap_err(), refusal);
    assert_eq!(
        tollgate_pg::pending_migrations(db.url()).await.unwrap_err(),
        refusal
    );
    assert_eq!(
        Schema::current().pending_lines(db.url()).await.unwrap_err(),
        refusal
    );
    let pool = PgPool::connect(db.url()).await.unwrap();
    assert_eq!(Schema::current().check(&pool).await.unwrap_err(), refusal);
    pool.close().await;
    let err = PostgresStore::connect_with(
        db.url(),
        policy(),
        support::test_key(),
        support::TEST_OPTIONS,
    )
    .await
    .unwrap_err();
    assert_eq!(err, refusal);
}

// ---------------------------------------------------------------------------
// (d) A second line's own bookkeeping and fence.

#[tokio::test]
async fn a_second_line_has_its_own_bookkeeping_and_fence() {
    let db = support::migrated_db().await;
    let mut c = support::connect(&db).await;
    let sqlx_before = bookkeeping(&mut c, "_sqlx_migrations").await;
    let pool = PgPool::connect(db.url()).await.unwrap();
    let v1 = Schema::current().with_line(test_line(1));
    let v2 = Schema::current().with_line(test_line(2));

    // Before its first run the line is pending, in its own words.
    assert_eq!(
        v1.check(&pool).await.unwrap_err(),
        backend(
            "tgtest migrations (table _tgtest_migrations): database schema is at version 0 \
             but this binary requires version 1; pending migrations: 1; run the migrations \
             first"
        )
    );
    let report = v1.migrate(db.url()).await.unwrap();
    assert_eq!(
        versions(&report.lines),
        [
            ("tollgate", Some(21), Some(21), vec![]),
            ("safetime", None, None, vec![]),
            ("tgtest", None, Some(1), vec![1]),
        ]
    );
    assert_eq!(
        (report.from_version, report.to_version, report.applied),
        (Some(21), Some(21), vec![])
    );
    assert_eq!(
        rows(&mut c, "_tgtest_migrations").await,
        expected_rows(&test_line(1))
    );
    v1.check(&pool).await.unwrap();
    // The version-2 binary sees its pending migration, and the fence holds
    // until it is applied.
    let statuses = v2.pending_lines(db.url()).await.unwrap();
    assert_eq!(
        statuses
            .iter()
            .map(|s| (s.line, s.applied_max, s.pending.clone()))
            .collect::<Vec<_>>(),
        [
            ("tollgate", Some(21), vec![]),
            ("safetime", None, vec![]),
            (
                "tgtest",
                Some(1),
                vec![PendingMigration {
                    version: 2,
                    description: "note length".into()
                }]
            ),
        ]
    );
    assert_eq!(v2.pending(db.url()).await.unwrap(), vec![]);
    assert_eq!(
        v2.check(&pool).await.unwrap_err(),
        backend(
            "tgtest migrations (table _tgtest_migrations): database schema is at version 1 \
             but this binary requires version 2; pending migrations: 2; run the migrations \
             first"
        )
    );
    let report = v2.migrate(db.url()).await.unwrap();
    assert_eq!(
        versions(&report.lines)[2],
        ("tgtest", Some(1), Some(2), vec![2])
    );
    assert_eq!(
        rows(&mut c, "_tgtest_migrations").await,
        expected_rows(&test_line(2))
    );
    v2.check(&pool).await.unwrap();
    let check_exists: bool = sqlx::query_scalar(
        "SELECT count(*) = 1 FROM pg_constraint WHERE conrelid = 'tgtest_notes'::regclass \
         AND contype = 'c'",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert!(check_exists);

    // The version-1 binary refuses the line at 2, naming it.
    let refusal = backend(
        "tgtest migrations (table _tgtest_migrations): database has applied migration \
         version 2 (note length), which this binary does not know (it knows versions 1 through \
         1); refusing to start against a newer schema: run a binary that carries version 2",
    );
    assert_eq!(v1.check(&pool).await.unwrap_err(), refusal);
    assert_eq!(v1.migrate(db.url()).await.unwrap_err(), refusal);
    assert_eq!(v1.pending(db.url()).await.unwrap_err(), refusal);
    // A changed migration is refused too.
    let changed = Schema::current().with_line(MigrationLine::new(
        "tgtest",
        "_tgtest_migrations",
        vec![
            test_line(1).migrations()[0].clone(),
            mig(2, "note length", "SELECT 1"),
        ],
    ));
    assert_eq!(
        changed.check(&pool).await.unwrap_err(),
        backend(
            "tgtest migrations (table _tgtest_migrations): migration version 2 (note length) \
             differs from the one this binary carries (checksum mismatch); refusing to start"
        )
    );
    // A binary without the line does not look at it; Tollgate's
    // bookkeeping never saw the line's rows.
    Schema::current().check(&pool).await.unwrap();
    assert_eq!(bookkeeping(&mut c, "_sqlx_migrations").await, sqlx_before);
    pool.close().await;
}
