//! Checks shared by the PostgreSQL 15 tests and the PostgreSQL 18 ones
//! (`tests/pg18.rs`): one `check_*` per capability, so that both majors
//! are held to the same exact expectations.
#![allow(dead_code, reason = "each test binary uses a part of this module")]

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection, Row};
use tollgate_pg_harness::{HarnessError, PgPair, PgServer, STANDBY_SLOT};

pub const NS_PER_S: i64 = 1_000_000_000;

/// How far the server's stepped clock may be from real time plus the
/// offset: query latency and scheduling on a busy two-core machine.
pub const CLOCK_TOLERANCE_US: i64 = 5_000_000;

pub async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

pub async fn scalar<T>(conn: &mut PgConnection, sql: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql)
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The server's `clock_timestamp()` in microseconds since the epoch
/// (extract gives an exact numeric in PostgreSQL 14 and later).
async fn server_clock_us(conn: &mut PgConnection) -> i64 {
    scalar(
        conn,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
    )
    .await
}

/// This process's (real) wall clock in microseconds since the epoch.
fn real_clock_us() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_micros()).unwrap()
}

fn assert_within(what: &str, got_us: i64, expected_us: i64) {
    assert!(
        (expected_us - CLOCK_TOLERANCE_US..=expected_us + CLOCK_TOLERANCE_US).contains(&got_us),
        "{what}: {got_us} us, expected {expected_us} us +- {CLOCK_TOLERANCE_US} us"
    );
}

/// The postmaster has libfaketime mapped exactly when `expected`.
pub fn assert_preloaded(server: &PgServer, expected: bool) {
    let pid = server.pid().expect("postmaster running");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert_eq!(
        maps.contains("libfaketime.so.1"),
        expected,
        "postmaster {pid} maps libfaketime: expected {expected}"
    );
}

/// A server from `start_dedicated_faketime*`: its clock starts real, steps
/// by +1 h and -1 h in an open session and for new sessions, keeps its
/// offset across a restart, and returns to real time at offset 0.
pub async fn check_clock_steps(server: &mut PgServer) {
    const HOUR_US: i64 = 3_600 * 1_000_000;
    assert_eq!(server.clock_offset_ns(), Some(0));
    assert_preloaded(server, true);
    let offset_file = server.dir().join("faketime.rc");
    assert_eq!(
        std::fs::read_to_string(&offset_file).unwrap(),
        "+0.000000000\n"
    );

    let mut conn = connect(&server.admin_url()).await;
    let base_us = server_clock_us(&mut conn).await;
    assert_within("skew at offset 0", base_us - real_clock_us(), 0);

    for (offset_s, file_text) in [(3_600, "+3600.000000000\n"), (-3_600, "-3600.000000000\n")] {
        server.set_clock_offset_ns(offset_s * NS_PER_S).unwrap();
        assert_eq!(server.clock_offset_ns(), Some(offset_s * NS_PER_S));
        assert_eq!(std::fs::read_to_string(&offset_file).unwrap(), file_text);
        let offset_us = offset_s * 1_000_000;
        // The same session sees the step at its next call...
        let stepped_us = server_clock_us(&mut conn).await;
        assert_within(
            &format!("step {offset_s} s, same session"),
            stepped_us - base_us,
            offset_us,
        );
        assert_within(
            &format!("skew {offset_s} s, same session"),
            stepped_us - real_clock_us(),
            offset_us,
        );
        // ... and so does a new backend.
        let mut fresh = connect(&server.admin_url()).await;
        let fresh_us = server_clock_us(&mut fresh).await;
        assert_within(
            &format!("skew {offset_s} s, new session"),
            fresh_us - real_clock_us(),
            offset_us,
        );
        fresh.close().await.unwrap();
    }
    conn.close().await.unwrap();

    // The offset is in a file, so it survives a restart.
    let pid_before = server.pid().unwrap();
    server.stop().unwrap();
    server.start().unwrap();
    assert_ne!(server.pid().unwrap(), pid_before);
    assert_preloaded(server, true);
    let mut conn = connect(&server.admin_url()).await;
    assert_within(
        "skew after restart",
        server_clock_us(&mut conn).await - real_clock_us(),
        -HOUR_US,
    );
    server.set_clock_offset_ns(0).unwrap();
    assert_within(
        "skew back at offset 0",
        server_clock_us(&mut conn).await - real_clock_us(),
        0,
    );
    conn.close().await.unwrap();
}

/// A fresh pair on PostgreSQL `major`: the standby replays what the
/// primary writes and refuses writes itself; after the primary is killed
/// and the standby promoted, the standby is on the next timeline and takes
/// writes.
pub async fn check_pair(pair: &mut PgPair, major: u32) {
    assert_eq!(pair.primary().binaries().major_version().unwrap(), major);
    assert_ne!(pair.primary().port(), pair.standby().port());
    let mut primary = connect(&pair.primary().admin_url()).await;
    let mut standby = connect(&pair.standby().admin_url()).await;
    for conn in [&mut primary, &mut standby] {
        let version: String = scalar(conn, "SHOW server_version_num").await;
        assert!(version.starts_with(&major.to_string()), "{version}");
        for (setting, expected) in [
            ("wal_level", "replica"),
            ("max_wal_senders", "10"),
            ("max_replication_slots", "10"),
            ("hot_standby", "on"),
            ("fsync", "off"),
            ("synchronous_commit", "off"),
        ] {
            let value: String = scalar(conn, &format!("SHOW {setting}")).await;
            assert_eq!(value, expected, "{setting}");
        }
    }
    assert!(!scalar::<bool>(&mut primary, "SELECT pg_is_in_recovery()").await);
    assert!(scalar::<bool>(&mut standby, "SELECT pg_is_in_recovery()").await);

    let id_sql = "SELECT system_identifier FROM pg_control_system()";
    let primary_id: i64 = scalar(&mut primary, id_sql).await;
    let standby_id: i64 = scalar(&mut standby, id_sql).await;
    assert_eq!(standby_id, primary_id);
    sqlx::raw_sql("CHECKPOINT")
        .execute(&mut primary)
        .await
        .unwrap();
    let timeline_sql = "SELECT timeline_id FROM pg_control_checkpoint()";
    let primary_timeline: i32 = scalar(&mut primary, timeline_sql).await;
    assert_eq!(primary_timeline, 1);

    let slot =
        sqlx::query("SELECT slot_type, active FROM pg_replication_slots WHERE slot_name = $1")
            .bind(STANDBY_SLOT)
            .fetch_one(&mut primary)
            .await
            .unwrap();
    assert_eq!(slot.get::<String, _>(0), "physical");
    assert!(slot.get::<bool, _>(1));
    let receiver = sqlx::query("SELECT status, slot_name FROM pg_stat_wal_receiver")
        .fetch_one(&mut standby)
        .await
        .unwrap();
    assert_eq!(receiver.get::<String, _>(0), "streaming");
    assert_eq!(receiver.get::<String, _>(1), STANDBY_SLOT);

    sqlx::raw_sql(
        "CREATE TABLE leases (id bigint PRIMARY KEY, holder text NOT NULL); \
         INSERT INTO leases VALUES (1, 'alice'), (2, 'bob')",
    )
    .execute(&mut primary)
    .await
    .unwrap();
    // PostgreSQL's own arithmetic on pg_lsn is the oracle for the LSN.
    let before: i64 = scalar(
        &mut primary,
        "SELECT (pg_current_wal_lsn() - '0/0')::bigint",
    )
    .await;
    let lsn = pair.wait_replay_caught_up().await.expect("replay");
    let after: i64 = scalar(
        &mut primary,
        "SELECT (pg_current_wal_lsn() - '0/0')::bigint",
    )
    .await;
    let replayed: i64 = scalar(
        &mut standby,
        "SELECT (pg_last_wal_replay_lsn() - '0/0')::bigint",
    )
    .await;
    let lsn = i64::try_from(lsn).unwrap();
    assert!(
        before <= lsn && lsn <= after,
        "{before:#x} <= {lsn:#x} <= {after:#x}"
    );
    assert!(replayed >= lsn, "replayed {replayed:#x} < {lsn:#x}");
    assert_eq!(
        leases(&mut standby).await,
        [(1, "alice"), (2, "bob")].map(own)
    );

    let refused = sqlx::raw_sql("INSERT INTO leases VALUES (9, 'mallory')")
        .execute(&mut standby)
        .await
        .unwrap_err();
    let code = refused.as_database_error().and_then(|e| e.code());
    assert_eq!(code.as_deref(), Some("25006"), "{refused}");
    let err = pair.standby().try_fresh_database().await.unwrap_err();
    assert!(matches!(err, HarnessError::Sql { .. }), "{err}");

    // A failover: the primary crashes, the standby takes over.
    primary.close().await.unwrap();
    pair.kill_primary().unwrap();
    assert!(!pair.primary_mut().is_running());
    pair.promote_standby().await.expect("promote");
    assert!(!scalar::<bool>(&mut standby, "SELECT pg_is_in_recovery()").await);
    sqlx::raw_sql("CHECKPOINT")
        .execute(&mut standby)
        .await
        .unwrap();
    let promoted_timeline: i32 = scalar(&mut standby, timeline_sql).await;
    assert_eq!(promoted_timeline, primary_timeline + 1);
    sqlx::raw_sql("INSERT INTO leases VALUES (3, 'carol')")
        .execute(&mut standby)
        .await
        .unwrap();
    assert_eq!(
        leases(&mut standby).await,
        [(1, "alice"), (2, "bob"), (3, "carol")].map(own)
    );
    // Promoting twice is an error, not a hang.
    let again = pair.promote_standby().await.unwrap_err();
    assert!(
        again.to_string().contains("recovery is not in progress"),
        "{again}"
    );
    standby.close().await.unwrap();
}

fn own((id, holder): (i64, &str)) -> (i64, String) {
    (id, holder.to_owned())
}

async fn leases(conn: &mut PgConnection) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT id, holder FROM leases ORDER BY id")
        .fetch_all(conn)
        .await
        .unwrap()
}
