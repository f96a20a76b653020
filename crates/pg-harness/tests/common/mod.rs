//! Checks shared by the PostgreSQL 15 tests and the PostgreSQL 18 ones
//! (`tests/pg18.rs`): one `check_*` per capability, so that both majors
//! are held to the same exact expectations.
#![allow(dead_code, reason = "each test binary uses a part of this module")]

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection};
use tollgate_pg_harness::PgServer;

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
