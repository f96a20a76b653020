//! End-to-end tests against real PostgreSQL servers.

use sqlx::{Connection, PgConnection, Row};
use tollgate_pg_harness::{PgCluster, PgServer, shared};

async fn connect(url: &str) -> PgConnection {
    PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

#[tokio::test]
async fn shared_cluster_gives_distinct_working_databases() {
    let cluster = shared().await;
    assert!(std::ptr::eq(cluster, PgCluster::shared()));

    let a = cluster.fresh_database().await;
    let b = cluster.fresh_database().await;
    assert_ne!(a.name(), b.name());
    assert_eq!(
        a.url(),
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            cluster.port(),
            a.name()
        )
    );
    assert_eq!(a.url(), cluster.url_for(a.name()));

    for db in [&a, &b] {
        let mut conn = connect(db.url()).await;
        let two: i32 = sqlx::query_scalar("SELECT 1+1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(two, 2);
        let current: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(current, db.name());
        let version: String = sqlx::query_scalar("SHOW server_version_num")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(version.starts_with("15"), "server_version_num = {version}");
        assert_eq!(version.len(), 6, "server_version_num = {version}");
        conn.close().await.unwrap();
    }
}

#[tokio::test]
async fn shared_cluster_runs_with_the_documented_settings() {
    let cluster = shared().await;
    let db = cluster.fresh_database().await;
    let mut conn = connect(db.url()).await;
    for (setting, expected) in [
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("max_connections", "200"),
        ("listen_addresses", "127.0.0.1"),
        ("port", &cluster.port().to_string()),
    ] {
        let value: String = sqlx::query_scalar(&format!("SHOW {setting}"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(value, expected, "{setting}");
    }
    let user: String = sqlx::query_scalar("SELECT current_user")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(user, "postgres");
    let major = cluster.binaries().major_version().unwrap();
    assert_eq!(major, 15);
}

#[tokio::test]
async fn databases_are_isolated_from_each_other() {
    let cluster = shared().await;
    let a = cluster.fresh_database().await;
    let b = cluster.fresh_database().await;
    let mut conn_a = connect(a.url()).await;
    sqlx::raw_sql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
        .execute(&mut conn_a)
        .await
        .unwrap();
    let mut conn_b = connect(b.url()).await;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('public.t') IS NOT NULL")
        .fetch_one(&mut conn_b)
        .await
        .unwrap();
    assert!(!exists);
}

/// Several tests (each on its own runtime) share one server process.
#[test]
fn sync_shared_is_usable_without_a_runtime_in_scope() {
    let cluster = PgCluster::shared();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let name = rt.block_on(async {
        let db = cluster.fresh_database().await;
        let mut conn = connect(db.url()).await;
        let got: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(got, db.name());
        got
    });
    assert!(
        name.starts_with(&format!("tg_{}_", std::process::id())),
        "{name}"
    );
}

#[tokio::test]
async fn dedicated_server_survives_restart_with_data_intact() {
    let mut server = PgServer::start_dedicated().expect("start dedicated server");
    let shared_port = shared().await.port();
    assert_ne!(server.port(), shared_port);
    let port = server.port();
    let db = server.fresh_database().await;
    assert_eq!(db.url(), server.url_for(db.name()));

    let mut conn = connect(db.url()).await;
    sqlx::raw_sql("CREATE TABLE leases (id bigint PRIMARY KEY, holder text NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO leases VALUES ($1, $2)")
        .bind(42_i64)
        .bind("alice")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();

    let pid_before = server.pid().unwrap();
    server.restart().expect("restart");
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid().unwrap(), pid_before);

    let mut conn = connect(db.url()).await;
    let rows = sqlx::query("SELECT id, holder FROM leases ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let rows: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(rows, vec![(42, "alice".to_owned())]);

    let log = server.log_tail(200);
    assert!(log.contains("database system is shut down"), "{log}");
    assert!(
        log.contains("database system is ready to accept connections"),
        "{log}"
    );
}

#[tokio::test]
async fn dedicated_server_kill_then_start_recovers() {
    let mut server = PgServer::start_dedicated().expect("start dedicated server");
    let db = server.fresh_database().await;
    let mut conn = connect(db.url()).await;
    // The server runs with synchronous_commit=off; make this commit's WAL
    // reach the OS before the crash (see PgServer::kill).
    sqlx::raw_sql(
        "SET synchronous_commit = on; CREATE TABLE credits (id int PRIMARY KEY, amount bigint); \
         INSERT INTO credits VALUES (1, 1000), (2, -250)",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    let pid = server.pid().unwrap();
    server.kill().expect("kill");
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    // The old connection is dead.
    assert!(sqlx::query("SELECT 1").execute(&mut conn).await.is_err());
    assert!(PgConnection::connect(db.url()).await.is_err());

    server.start().expect("start after kill");
    assert!(server.is_running());
    let mut conn = connect(db.url()).await;
    let rows: Vec<(i32, i64)> = sqlx::query_as("SELECT id, amount FROM credits ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, vec![(1, 1000), (2, -250)]);
    let log = server.log_tail(200);
    assert!(log.contains("database system was interrupted"), "{log}");

    // kill twice / stop when stopped are no-ops
    server.kill().unwrap();
    server.kill().unwrap();
    server.stop().unwrap();
    server.start().unwrap();
    server.start().unwrap();
    assert!(server.is_running());
}

#[tokio::test]
async fn dropping_a_dedicated_server_stops_it_and_removes_its_dir() {
    let server = PgServer::start_dedicated().expect("start dedicated server");
    let dir = server.dir().to_owned();
    let pid = server.pid().unwrap();
    let name = dir.file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        name.starts_with(&format!("tollgate-pg-{}-", std::process::id())),
        "{name}"
    );
    assert!(server.data_dir().join("PG_VERSION").is_file());
    assert_eq!(
        std::fs::read_to_string(server.data_dir().join("PG_VERSION")).unwrap(),
        "15\n"
    );
    drop(server);
    assert!(!dir.exists());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn stopped_dedicated_server_refuses_connections_until_started() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut server = PgServer::start_dedicated().expect("start dedicated server");
    server.stop().unwrap();
    assert!(!server.is_running());
    let url = server.admin_url();
    assert!(rt.block_on(PgConnection::connect(&url)).is_err());
    server.start().unwrap();
    let one: i32 = rt.block_on(async {
        let mut conn = connect(&url).await;
        sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    });
    assert_eq!(one, 1);
}

#[test]
fn start_waits_out_a_briefly_taken_port() {
    let mut server = PgServer::start_dedicated().expect("start dedicated server");
    let port = server.port();
    server.stop().unwrap();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(1));
        drop(squatter);
    });
    let started = std::time::Instant::now();
    server.start().expect("start once the port is free again");
    release.join().unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    let log = server.log_tail(400);
    assert!(log.contains("Address already in use"), "{log}");
}

/// The `fresh_database` futures are `Send` as seen from another crate, so
/// they can be awaited inside `Send` futures (an `async_trait` method, a
/// `tokio::spawn`ed task). This is a compile-time test first: it does not
/// build if any of the four futures stops being provably `Send`.
#[tokio::test]
async fn fresh_database_futures_are_send() {
    fn assert_send<T: Send>(_: &T) {}

    let cluster = shared().await;
    let f = cluster.fresh_database();
    assert_send(&f);
    let a = f.await;
    let f = cluster.try_fresh_database();
    assert_send(&f);
    let b = f.await.expect("try_fresh_database");

    let server = PgServer::start_dedicated().expect("start dedicated server");
    let f = server.fresh_database();
    assert_send(&f);
    let c = f.await;
    let f = server.try_fresh_database();
    assert_send(&f);
    let d = f.await.expect("try_fresh_database");

    // Awaited inside a spawned task, which must be `Send + 'static`: the
    // futures borrow nothing from the server either.
    let e = tokio::spawn(server.fresh_database()).await.expect("task");

    let names = [&a, &b, &c, &d, &e].map(|db| db.name().to_string());
    for (i, x) in names.iter().enumerate() {
        assert_eq!(
            names.iter().filter(|y| *y == x).count(),
            1,
            "{i}: {names:?}"
        );
    }
    for db in [&a, &b] {
        assert_eq!(db.url(), cluster.url_for(db.name()));
    }
    for db in [&c, &d, &e] {
        assert_eq!(db.url(), server.url_for(db.name()));
    }
    for db in [&a, &e] {
        let mut conn = connect(db.url()).await;
        let current: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(current, db.name());
        conn.close().await.unwrap();
    }
}
