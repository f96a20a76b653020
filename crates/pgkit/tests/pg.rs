//! pgkit on real PostgreSQL: the classification of errors the server really
//! sends, the transaction wrapper's retries and counters, the URL parser's
//! socket form, and migration lines (order, fences, the lock shared with
//! sqlx's migrator, compatibility of the bookkeeping with sqlx's).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use pgkit::migrate::{self, migration_lock_key};
use pgkit::{
    DatabaseUrl, FailureKind, MigrationError, MigrationLine, OpCounters, OpMetrics, TxError,
    TxFailure, classify, transact,
};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Executor, PgConnection, PgPool};

/// Bound on every wait for another session in these tests.
const WAIT_MAX: Duration = Duration::from_secs(20);

async fn fresh() -> tollgate_pg_harness::TestDb {
    tollgate_pg_harness::shared().await.fresh_database().await
}

async fn connect(url: &str) -> PgConnection {
    let mut c = PgConnection::connect(url).await.expect("connect");
    c.execute("SET statement_timeout = '60s'").await.unwrap();
    c
}

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .expect("pool")
}

// ---------------------------------------------------------------------------
// Classification.

/// Runs `sql` on `conn`, expecting the server to refuse it, and checks the
/// classification.
async fn check_refused(
    conn: &mut PgConnection,
    sql: &str,
    kind: FailureKind,
    sqlstate: &str,
    text: &str,
) {
    let e = conn.execute(sql).await.expect_err(sql);
    let f = classify(&e);
    assert_eq!(
        (f.kind(), f.sqlstate(), f.text()),
        (kind, Some(sqlstate), text),
        "{sql}"
    );
    assert_eq!(f.sqlstate_class(), Some(&sqlstate[..2]));
    assert_eq!(
        f.is_retryable(),
        matches!(kind, FailureKind::Serialization | FailureKind::Deadlock)
    );
}

#[tokio::test]
async fn the_servers_errors_are_classified() {
    let db = fresh().await;
    let mut c = connect(db.url()).await;
    c.execute(
        "CREATE TABLE parent (id int PRIMARY KEY, n int CHECK (n >= 0) NOT NULL); \
         CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent); \
         INSERT INTO parent VALUES (1, 1); \
         CREATE ROLE pgkit_nobody NOLOGIN",
    )
    .await
    .unwrap();
    check_refused(
        &mut c,
        "SELECT * FROM nope",
        FailureKind::SchemaMissing,
        "42P01",
        "relation \"nope\" does not exist (SQLSTATE 42P01)",
    )
    .await;
    check_refused(
        &mut c,
        "SELECT nope_fn(1)",
        FailureKind::SchemaMissing,
        "42883",
        "function nope_fn(integer) does not exist (SQLSTATE 42883)",
    )
    .await;
    check_refused(
        &mut c,
        "SELECT nope FROM parent",
        FailureKind::Other,
        "42703",
        "column \"nope\" does not exist (SQLSTATE 42703)",
    )
    .await;
    check_refused(
        &mut c,
        "SELECT 1/0",
        FailureKind::Other,
        "22012",
        "division by zero (SQLSTATE 22012)",
    )
    .await;
    check_refused(
        &mut c,
        "INSERT INTO parent VALUES (1, 1)",
        FailureKind::Constraint,
        "23505",
        "duplicate key value violates unique constraint \"parent_pkey\" (SQLSTATE 23505)",
    )
    .await;
    check_refused(
        &mut c,
        "INSERT INTO parent VALUES (2, -1)",
        FailureKind::Constraint,
        "23514",
        "new row for relation \"parent\" violates check constraint \"parent_n_check\" \
         (SQLSTATE 23514)",
    )
    .await;
    check_refused(
        &mut c,
        "INSERT INTO parent VALUES (3, NULL)",
        FailureKind::Constraint,
        "23502",
        "null value in column \"n\" of relation \"parent\" violates not-null constraint \
         (SQLSTATE 23502)",
    )
    .await;
    check_refused(
        &mut c,
        "INSERT INTO child VALUES (1, 99)",
        FailureKind::Constraint,
        "23503",
        "insert or update on table \"child\" violates foreign key constraint \
         \"child_parent_id_fkey\" (SQLSTATE 23503)",
    )
    .await;
    let e = c
        .execute("INSERT INTO parent VALUES (1, 1)")
        .await
        .unwrap_err();
    assert_eq!(classify(&e).constraint(), Some("parent_pkey"));
    assert_eq!(
        classify(&e).server_message(),
        Some("duplicate key value violates unique constraint \"parent_pkey\"")
    );
    check_refused(
        &mut c,
        "RAISE_ME",
        FailureKind::Other,
        "42601",
        "syntax error at or near \"RAISE_ME\" (SQLSTATE 42601)",
    )
    .await;
    check_refused(
        &mut c,
        "DO $$ BEGIN RAISE EXCEPTION 'custom: x' USING ERRCODE = 'TGS10'; END $$",
        FailureKind::Other,
        "TGS10",
        "custom: x (SQLSTATE TGS10)",
    )
    .await;
    c.execute("SET statement_timeout = '20ms'").await.unwrap();
    check_refused(
        &mut c,
        "SELECT pg_sleep(5)",
        FailureKind::Canceled,
        "57014",
        "canceling statement due to statement timeout (SQLSTATE 57014)",
    )
    .await;
    c.execute("SET statement_timeout = '60s'").await.unwrap();
    c.execute("SET ROLE pgkit_nobody").await.unwrap();
    check_refused(
        &mut c,
        "SELECT * FROM parent",
        FailureKind::InsufficientPrivilege,
        "42501",
        "permission denied for table parent (SQLSTATE 42501)",
    )
    .await;
    c.execute("RESET ROLE").await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn serialization_failures_deadlocks_and_lock_timeouts_are_classified() {
    let db = fresh().await;
    let mut a = connect(db.url()).await;
    let mut b = connect(db.url()).await;
    a.execute("CREATE TABLE t (id int PRIMARY KEY, n int); INSERT INTO t VALUES (1, 0), (2, 0)")
        .await
        .unwrap();

    // 40001: a REPEATABLE READ transaction updates a row changed since
    // its snapshot.
    a.execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM t")
        .await
        .unwrap();
    b.execute("UPDATE t SET n = n + 1 WHERE id = 1")
        .await
        .unwrap();
    check_refused(
        &mut a,
        "UPDATE t SET n = n + 1 WHERE id = 1",
        FailureKind::Serialization,
        "40001",
        "could not serialize access due to concurrent update (SQLSTATE 40001)",
    )
    .await;
    a.execute("ROLLBACK").await.unwrap();

    // 55P03: a row lock not granted within lock_timeout.
    b.execute("BEGIN; SELECT * FROM t WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    a.execute("SET lock_timeout = '20ms'").await.unwrap();
    check_refused(
        &mut a,
        "SELECT * FROM t WHERE id = 1 FOR UPDATE",
        FailureKind::Canceled,
        "55P03",
        "canceling statement due to lock timeout (SQLSTATE 55P03)",
    )
    .await;
    a.execute("RESET lock_timeout").await.unwrap();
    b.execute("ROLLBACK").await.unwrap();

    // 40P01: each waits for the other's row.
    a.execute("SET deadlock_timeout = '10ms'; BEGIN; UPDATE t SET n = 1 WHERE id = 1")
        .await
        .unwrap();
    b.execute("SET deadlock_timeout = '10s'; BEGIN; UPDATE t SET n = 1 WHERE id = 2")
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        let r = b
            .execute("UPDATE t SET n = 2 WHERE id = 1")
            .await
            .map(|_| ());
        (b, r)
    });
    wait_until(
        &mut a,
        "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted",
    )
    .await;
    check_refused(
        &mut a,
        "UPDATE t SET n = 2 WHERE id = 2",
        FailureKind::Deadlock,
        "40P01",
        "deadlock detected (SQLSTATE 40P01)",
    )
    .await;
    a.execute("ROLLBACK").await.unwrap();
    let (mut b, r) = tokio::time::timeout(WAIT_MAX, waiter)
        .await
        .unwrap()
        .unwrap();
    r.unwrap();
    b.execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_lost_server_is_unavailable() {
    let db = fresh().await;
    let mut admin = connect(db.url()).await;
    let mut victim = connect(db.url()).await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut victim)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&mut admin)
        .await
        .unwrap();
    let e = victim.execute("SELECT 1").await.unwrap_err();
    let f = classify(&e);
    assert_eq!(f.kind(), FailureKind::Unavailable, "{e:?}");
    // The server either reports the termination (57P01) before closing,
    // or the client only sees the closed socket.
    match f.sqlstate() {
        Some(code) => assert_eq!(
            (code, f.text()),
            (
                "57P01",
                "terminating connection due to administrator command (SQLSTATE 57P01)"
            )
        ),
        None => assert!(matches!(e, sqlx::Error::Io(_) | sqlx::Error::Protocol(_))),
    }

    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = DatabaseUrl::parse(&format!("postgres://u:s3cret@127.0.0.1:{port}/db")).unwrap();
    let e = PgConnection::connect_with(url.connect_options())
        .await
        .unwrap_err();
    let f = classify(&e);
    assert_eq!(f.kind(), FailureKind::Unavailable);
    assert!(!f.text().contains("s3cret"), "{}", f.text());

    // A database that does not exist: the server refuses (3D000).
    let mut wrong = db.url().rsplit_once('/').unwrap().0.to_owned();
    wrong.push_str("/pgkit_no_such_db");
    let e = PgConnection::connect(&wrong).await.unwrap_err();
    let f = classify(&e);
    assert_eq!(
        (f.kind(), f.sqlstate(), f.text()),
        (
            FailureKind::Other,
            Some("3D000"),
            "database \"pgkit_no_such_db\" does not exist (SQLSTATE 3D000)"
        )
    );
}

#[test]
fn the_socket_form_connects() {
    let mut server = tollgate_pg_harness::PgServer::start_dedicated().expect("server");
    let socket = server.socket_dir().to_str().unwrap().to_owned();
    let port = server.port();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for text in [
            format!("postgres:///postgres?host={socket}&port={port}&user=postgres"),
            // libpq's hostless form with the user in the user part.
            format!("postgresql://postgres@/postgres?host={socket}&port={port}"),
        ] {
            let url = DatabaseUrl::parse(&text).unwrap();
            assert_eq!(url.connect_options().get_username(), "postgres", "{text}");
            assert_eq!(
                url.connect_options()
                    .get_socket()
                    .map(|p| p.to_str().unwrap()),
                Some(socket.as_str())
            );
            let mut c = PgConnection::connect_with(url.connect_options())
                .await
                .expect("connect over the socket");
            // A Unix-socket session has no client address.
            let addr: Option<String> = sqlx::query_scalar("SELECT inet_client_addr()::text")
                .fetch_one(&mut c)
                .await
                .unwrap();
            assert_eq!(addr, None);
            c.close().await.unwrap();
        }
    });
    server.stop().unwrap();
}

/// Polls `query` (a boolean) on `conn` until it is true.
async fn wait_until(conn: &mut PgConnection, query: &str) {
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    loop {
        let done: bool = sqlx::query_scalar(query)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        if done {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {query}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------
// The transaction wrapper.

/// How many attempts the next body fails with a raised SQLSTATE.
struct Script {
    fail_times: u32,
    code: &'static str,
    attempts: AtomicU32,
}

fn raising(code: &'static str, fail_times: u32) -> Script {
    Script {
        fail_times,
        code,
        attempts: AtomicU32::new(0),
    }
}

async fn body(c: &mut PgConnection, s: &Script) -> Result<i64, TxError<String>> {
    let n = s.attempts.fetch_add(1, Ordering::SeqCst);
    sqlx::query("INSERT INTO log (attempt) VALUES ($1)")
        .bind(i64::from(n))
        .execute(&mut *c)
        .await?;
    if n < s.fail_times {
        c.execute(&*format!(
            "DO $$ BEGIN RAISE EXCEPTION 'scripted' USING ERRCODE = '{}'; END $$",
            s.code
        ))
        .await?;
    }
    if s.code == "rule" {
        return Err(TxError::Rule("refused by a rule".into()));
    }
    Ok(i64::from(n))
}

async fn logged(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT attempt FROM log ORDER BY attempt")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn run(
    pool: &PgPool,
    counters: &OpCounters,
    s: &Script,
) -> Result<i64, TxFailure<TxError<String>>> {
    transact(pool, counters, s, |c, s| Box::pin(body(c, s))).await
}

/// The counters without their latencies, which are checked apart.
fn counts(m: OpMetrics) -> (u64, u64, u64, u64) {
    (m.attempts, m.committed, m.retried, m.failed)
}

#[tokio::test]
async fn retryable_failures_are_retried_then_exhausted_and_others_are_not() {
    let db = fresh().await;
    let pool = pool(db.url()).await;
    pool.execute("CREATE TABLE log (attempt bigint PRIMARY KEY)")
        .await
        .unwrap();

    // Commits at once.
    let counters = OpCounters::new("once");
    assert_eq!(
        run(&pool, &counters, &raising("40001", 0)).await.unwrap(),
        0
    );
    assert_eq!(counts(counters.snapshot()), (1, 1, 0, 0));
    assert_eq!(logged(&pool).await, [0]);
    pool.execute("TRUNCATE log").await.unwrap();

    // Two serialization failures then a deadlock are retried; only the
    // last attempt's row is written.
    for code in ["40001", "40P01"] {
        let counters = OpCounters::new("retried");
        let s = raising(code, 3);
        assert_eq!(run(&pool, &counters, &s).await.unwrap(), 3);
        assert_eq!(counts(counters.snapshot()), (4, 1, 3, 0), "{code}");
        // Back-offs of 2 + 4 + 8 ms at least.
        assert!(counters.snapshot().latency_ns_total >= 14_000_000);
        assert_eq!(logged(&pool).await, [3]);
        pool.execute("TRUNCATE log").await.unwrap();
    }

    // Always failing: exhausted after exactly TX_ATTEMPTS_MAX attempts.
    let counters = OpCounters::new("exhausted");
    let s = raising("40001", u32::MAX);
    match run(&pool, &counters, &s).await {
        Err(TxFailure::RetryExhausted { attempts, last }) => {
            assert_eq!(attempts, pgkit::TX_ATTEMPTS_MAX);
            assert_eq!(attempts, 8);
            let TxError::Db(e) = last else {
                panic!("not a database error")
            };
            assert_eq!(classify(&e).sqlstate(), Some("40001"));
        }
        other => panic!("{other:?}"),
    }
    let m = counters.snapshot();
    assert_eq!(counts(m), (8, 0, 7, 1));
    // The seven back-offs: 190 ms.
    assert!(m.latency_ns_total >= 190_000_000, "{m:?}");
    assert_eq!(m.latency_ns_max, m.latency_ns_total);
    assert_eq!(s.attempts.load(Ordering::SeqCst), 8);
    assert_eq!(logged(&pool).await, Vec::<i64>::new());

    // Not retryable: a constraint violation, a rule error.
    for (s, expect) in [(raising("23505", 1), "23505"), (raising("rule", 0), "rule")] {
        let counters = OpCounters::new("failed");
        match run(&pool, &counters, &s).await {
            Err(TxFailure::Failed(TxError::Db(e))) => {
                assert_eq!(classify(&e).sqlstate(), Some(expect))
            }
            Err(TxFailure::Failed(TxError::Rule(r))) => {
                assert_eq!((expect, r.as_str()), ("rule", "refused by a rule"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(counts(counters.snapshot()), (1, 0, 0, 1));
        assert_eq!(logged(&pool).await, Vec::<i64>::new());
    }

    // A closed pool: BEGIN fails, not retried.
    pool.close().await;
    let counters = OpCounters::new("closed");
    match run(&pool, &counters, &raising("40001", 0)).await {
        Err(TxFailure::Failed(TxError::Db(sqlx::Error::PoolClosed))) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(counts(counters.snapshot()), (1, 0, 0, 1));
}

#[tokio::test]
async fn a_serialization_failure_at_commit_is_retried() {
    let db = fresh().await;
    let pool = pool(db.url()).await;
    // A deferred constraint trigger raises 40001 at COMMIT while the table
    // `fail_commits` has rows, deleting one each time.
    pool.execute(
        "CREATE TABLE log (attempt bigint PRIMARY KEY); \
         CREATE TABLE fail_commits (n int); INSERT INTO fail_commits VALUES (1), (2); \
         CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF EXISTS (SELECT 1 FROM fail_commits) THEN \
             RAISE EXCEPTION 'at commit' USING ERRCODE = '40001'; \
           END IF; \
           RETURN NULL; \
         END $$; \
         CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON log \
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_commit()",
    )
    .await
    .unwrap();
    // The failed commit rolls its transaction back, so the trigger cannot
    // consume `fail_commits` itself: the body does, outside the
    // transaction, before each attempt.
    let counters = OpCounters::new("commit");
    let s = raising("40001", 0);
    let result = transact(&pool, &counters, &(s, pool.clone()), |c, (s, p)| {
        Box::pin(async move {
            let n = s.attempts.load(Ordering::SeqCst);
            if n > 0 {
                sqlx::query("DELETE FROM fail_commits WHERE n = $1")
                    .bind(i32::try_from(n).unwrap())
                    .execute(p)
                    .await?;
            }
            body(c, s).await
        })
    })
    .await;
    assert_eq!(result.unwrap(), 2);
    assert_eq!(counts(counters.snapshot()), (3, 1, 2, 0));
    assert_eq!(logged(&pool).await, [2]);
}

// ---------------------------------------------------------------------------
// Migration lines.

fn mig(version: i64, description: &'static str, sql: &'static str) -> Migration {
    Migration::new(
        version,
        description.into(),
        MigrationType::Simple,
        sql.into(),
        false,
    )
}

fn line_a() -> MigrationLine {
    MigrationLine::new(
        "a",
        "_a_migrations",
        vec![
            mig(1, "parents", "CREATE TABLE a_parent (id int PRIMARY KEY)"),
            mig(2, "a row", "INSERT INTO a_parent VALUES (7)"),
        ],
    )
}

/// Line `b` uses line `a`'s table: it only applies after `a`.
fn line_b() -> MigrationLine {
    MigrationLine::new(
        "b",
        "_b_migrations",
        vec![mig(
            1,
            "children",
            "CREATE TABLE b_child (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES a_parent); \
             INSERT INTO b_child VALUES (1, 7)",
        )],
    )
}

async fn rows(conn: &mut PgConnection, table: &str) -> Vec<(i64, String, bool, Vec<u8>, i64)> {
    sqlx::query_as(&format!(
        "SELECT version, description, success, checksum, execution_time FROM {table} ORDER BY version"
    ))
    .fetch_all(conn)
    .await
    .unwrap()
}

fn report(
    line: &'static str,
    from: Option<i64>,
    to: Option<i64>,
    applied: Vec<i64>,
) -> pgkit::LineReport {
    pgkit::LineReport {
        line,
        from_version: from,
        to_version: to,
        applied,
    }
}

#[tokio::test]
async fn lines_apply_in_order_each_with_its_own_bookkeeping_and_fence() {
    let db = fresh().await;
    let url = DatabaseUrl::parse(db.url()).unwrap();
    let a1 = line_a().through(1).unwrap();
    // A binary that knows only a's first migration.
    let reports = migrate::migrate_url(&url, "pgkit-test", std::slice::from_ref(&a1))
        .await
        .unwrap();
    assert_eq!(reports, [report("a", None, Some(1), vec![1])]);

    let mut c = connect(db.url()).await;
    // `b` is pending, and `a`'s second migration.
    match migrate::check(&mut c, &[line_a(), line_b()]).await {
        Err(MigrationError::Pending {
            line,
            at,
            latest,
            pending,
        }) => assert_eq!((line, at, latest, pending), ("a", 1, 2, vec![2])),
        other => panic!("{other:?}"),
    }
    let statuses = migrate::status(&mut c, &[line_a(), line_b()])
        .await
        .unwrap();
    assert_eq!(
        statuses
            .iter()
            .map(|s| (
                s.line,
                s.applied_max,
                s.pending.iter().map(|p| p.version).collect()
            ))
            .collect::<Vec<(&str, Option<i64>, Vec<i64>)>>(),
        [("a", Some(1), vec![2]), ("b", None, vec![1])]
    );
    // A line listed before the one it depends on fails (its SQL needs
    // a_parent's row 7), rolls back, and records nothing.
    let err = migrate::migrate_url(&url, "pgkit-test", &[line_b(), a1.clone()])
        .await
        .unwrap_err();
    match err {
        MigrationError::Apply {
            line,
            version,
            source,
        } => assert_eq!(
            (line, version, classify(&source).sqlstate()),
            ("b", 1, Some("23503"))
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(rows(&mut c, "_b_migrations").await, vec![]);
    let b_exists: bool = sqlx::query_scalar("SELECT to_regclass('b_child') IS NOT NULL")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert!(!b_exists);

    // In order, every line applies; again, nothing.
    let reports = migrate::migrate_url(&url, "pgkit-test", &[line_a(), line_b()])
        .await
        .unwrap();
    assert_eq!(
        reports,
        [
            report("a", Some(1), Some(2), vec![2]),
            report("b", None, Some(1), vec![1])
        ]
    );
    let again = migrate::migrate_url(&url, "pgkit-test", &[line_a(), line_b()])
        .await
        .unwrap();
    assert_eq!(
        again,
        [
            report("a", Some(2), Some(2), vec![]),
            report("b", Some(1), Some(1), vec![])
        ]
    );
    migrate::check(&mut c, &[line_a(), line_b()]).await.unwrap();
    let a_rows = rows(&mut c, "_a_migrations").await;
    assert_eq!(
        a_rows
            .iter()
            .map(|r| (r.0, r.1.as_str(), r.2, r.3.clone()))
            .collect::<Vec<_>>(),
        [
            (
                1,
                "parents",
                true,
                line_a().migrations()[0].checksum.to_vec()
            ),
            (2, "a row", true, line_a().migrations()[1].checksum.to_vec()),
        ]
    );
    assert!(a_rows.iter().all(|r| r.4 >= 0), "{a_rows:?}");
    let b_rows = rows(&mut c, "_b_migrations").await;
    assert_eq!(
        b_rows
            .iter()
            .map(|r| (r.0, r.1.as_str()))
            .collect::<Vec<_>>(),
        [(1, "children")]
    );

    // The older binary refuses `a` at version 2 on every path, and does
    // not look at `b` (it does not know it).
    for result in [
        migrate::check(&mut c, std::slice::from_ref(&a1))
            .await
            .map(|_| ()),
        migrate::status(&mut c, std::slice::from_ref(&a1))
            .await
            .map(|_| ()),
        migrate::migrate_url(&url, "pgkit-test", std::slice::from_ref(&a1))
            .await
            .map(|_| ()),
    ] {
        match result {
            Err(MigrationError::UnknownVersion {
                line,
                version,
                description,
                known,
            }) => assert_eq!(
                (line, version, description.as_str(), known),
                ("a", 2, "a row", Some((1, 1)))
            ),
            other => panic!("{other:?}"),
        }
    }

    // A changed migration, or one recorded as failed, is refused; a fence
    // refusal in a later line leaves the earlier lines' pending migrations
    // unapplied.
    let a3 = MigrationLine::new(
        "a",
        "_a_migrations",
        vec![
            line_a().migrations()[0].clone(),
            line_a().migrations()[1].clone(),
            mig(3, "another row", "INSERT INTO a_parent VALUES (8)"),
        ],
    );
    let b_changed = MigrationLine::new("b", "_b_migrations", vec![mig(1, "children", "SELECT 1")]);
    match migrate::migrate_url(&url, "pgkit-test", &[a3.clone(), b_changed]).await {
        Err(MigrationError::Modified {
            line,
            version,
            description,
        }) => assert_eq!((line, version, description.as_str()), ("b", 1, "children")),
        other => panic!("{other:?}"),
    }
    sqlx::query("UPDATE _b_migrations SET success = false")
        .execute(&mut c)
        .await
        .unwrap();
    match migrate::migrate_url(&url, "pgkit-test", &[a3.clone(), line_b()]).await {
        Err(MigrationError::RecordedFailed { line, version, .. }) => {
            assert_eq!((line, version), ("b", 1))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rows(&mut c, "_a_migrations").await.len(), 2);
    let parents: Vec<i32> = sqlx::query_scalar("SELECT id FROM a_parent ORDER BY id")
        .fetch_all(&mut c)
        .await
        .unwrap();
    assert_eq!(parents, [7]);
    c.close().await.unwrap();
}

#[tokio::test]
async fn invalid_line_sets_touch_nothing() {
    let db = fresh().await;
    let url = DatabaseUrl::parse(db.url()).unwrap();
    let dup = MigrationLine::new("a2", "_a_migrations", vec![]);
    match migrate::migrate_url(&url, "pgkit-test", &[line_a(), dup]).await {
        Err(MigrationError::InvalidLine { line, reason }) => assert_eq!(
            (line, reason.as_str()),
            (
                "a2",
                "it shares its name or table with line a (table _a_migrations)"
            )
        ),
        other => panic!("{other:?}"),
    }
    let mut c = connect(db.url()).await;
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(tables, 0);
}

#[tokio::test]
async fn concurrent_runs_apply_each_migration_once() {
    let db = fresh().await;
    let url = DatabaseUrl::parse(db.url()).unwrap();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                migrate::migrate_url(&url, "pgkit-test", &[line_a(), line_b()]).await
            })
        })
        .collect();
    let mut applied = Vec::new();
    for r in runs {
        let reports = tokio::time::timeout(WAIT_MAX, r)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        applied.push(
            reports
                .iter()
                .map(|r| r.applied.clone())
                .collect::<Vec<_>>(),
        );
    }
    applied.sort();
    assert_eq!(
        applied,
        [
            vec![vec![], vec![]],
            vec![vec![], vec![]],
            vec![vec![], vec![]],
            vec![vec![1, 2], vec![1]]
        ]
    );
}

/// sqlx's own migrator over the same migrations and `_sqlx_migrations`.
fn sqlx_migrator(migrations: Vec<Migration>) -> Migrator {
    Migrator {
        migrations: Cow::Owned(migrations),
        ignore_missing: false,
        locking: true,
        no_tx: false,
    }
}

fn sqlx_line(migrations: Vec<Migration>) -> MigrationLine {
    MigrationLine::new("legacy", "_sqlx_migrations", migrations)
}

#[tokio::test]
async fn the_bookkeeping_and_the_lock_are_sqlx_s() {
    let all = vec![
        mig(1, "one", "CREATE TABLE one (id int)"),
        mig(2, "two", "CREATE TABLE two (id int)"),
        mig(3, "three", "CREATE TABLE three (id int)"),
    ];
    let db = fresh().await;
    let url = DatabaseUrl::parse(db.url()).unwrap();
    let mut c = connect(db.url()).await;

    // sqlx applies 1 and 2; this runner continues with 3.
    sqlx_migrator(all[..2].to_vec())
        .run_direct(&mut c)
        .await
        .unwrap();
    let by_sqlx = rows(&mut c, "_sqlx_migrations").await;
    let installed_before: Vec<String> =
        sqlx::query_scalar("SELECT installed_on::text FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut c)
            .await
            .unwrap();
    let reports = migrate::migrate_url(&url, "pgkit-test", &[sqlx_line(all.clone())])
        .await
        .unwrap();
    assert_eq!(reports, [report("legacy", Some(2), Some(3), vec![3])]);
    let after = rows(&mut c, "_sqlx_migrations").await;
    assert_eq!(after[..2], by_sqlx[..], "sqlx's rows are untouched");
    let installed_after: Vec<String> = sqlx::query_scalar(
        "SELECT installed_on::text FROM _sqlx_migrations WHERE version <= 2 ORDER BY version",
    )
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(installed_after, installed_before);
    assert_eq!(
        (
            after[2].0,
            after[2].1.as_str(),
            after[2].2,
            after[2].3.clone()
        ),
        (3, "three", true, all[2].checksum.to_vec())
    );
    // sqlx's migrator accepts what this runner wrote: nothing to do.
    sqlx_migrator(all.clone()).run_direct(&mut c).await.unwrap();
    assert_eq!(rows(&mut c, "_sqlx_migrations").await, after);

    // The same lock: while this runner's key is held, sqlx's migrator
    // waits for it.
    let db2 = fresh().await;
    let mut holder = connect(db2.url()).await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(migration_lock_key(db2.name()))
        .execute(&mut holder)
        .await
        .unwrap();
    let mut sqlx_conn = connect(db2.url()).await;
    let migrations = all.clone();
    let waiting = tokio::spawn(async move {
        let r = sqlx_migrator(migrations).run_direct(&mut sqlx_conn).await;
        (sqlx_conn, r)
    });
    wait_until(
        &mut holder,
        "SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
    )
    .await;
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            .fetch_one(&mut holder)
            .await
            .unwrap();
    assert_eq!(tables, 0, "sqlx's migrator ran while the lock was held");
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(migration_lock_key(db2.name()))
        .execute(&mut holder)
        .await
        .unwrap();
    let (_, r) = tokio::time::timeout(WAIT_MAX, waiting)
        .await
        .unwrap()
        .unwrap();
    r.unwrap();
    // And the other way round: sqlx's lock makes this runner wait.
    let db3 = fresh().await;
    let mut holder = connect(db3.url()).await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(migration_lock_key(db3.name()))
        .execute(&mut holder)
        .await
        .unwrap();
    let url3 = DatabaseUrl::parse(db3.url()).unwrap();
    let migrations = all.clone();
    let waiting = tokio::spawn(async move {
        migrate::migrate_url(&url3, "pgkit-test", &[sqlx_line(migrations)]).await
    });
    wait_until(
        &mut holder,
        "SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = 'pgkit-test'",
    )
    .await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(migration_lock_key(db3.name()))
        .execute(&mut holder)
        .await
        .unwrap();
    let reports = tokio::time::timeout(WAIT_MAX, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reports, [report("legacy", None, Some(3), vec![1, 2, 3])]);
}

#[tokio::test]
async fn a_failed_run_leaves_no_lock_and_a_retry_proceeds() {
    let db = fresh().await;
    let url = DatabaseUrl::parse(db.url()).unwrap();
    let bad = MigrationLine::new(
        "a",
        "_a_migrations",
        vec![
            mig(1, "ok", "CREATE TABLE ok (id int)"),
            mig(2, "bad", "CREATE TABLE bad (id int); SELECT 1/0"),
        ],
    );
    for _ in 0..2 {
        let r = tokio::time::timeout(
            WAIT_MAX,
            migrate::migrate_url(&url, "pgkit-test", std::slice::from_ref(&bad)),
        )
        .await
        .expect("hung on the lock a failed run left");
        match r {
            Err(MigrationError::Apply {
                line,
                version,
                source,
            }) => assert_eq!(
                (line, version, classify(&source).text()),
                ("a", 2, "division by zero (SQLSTATE 22012)")
            ),
            other => panic!("{other:?}"),
        }
    }
    let mut c = connect(db.url()).await;
    assert_eq!(
        rows(&mut c, "_a_migrations")
            .await
            .iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        [1]
    );
    let bad_exists: bool = sqlx::query_scalar("SELECT to_regclass('bad') IS NOT NULL")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert!(!bad_exists);
    wait_until(
        &mut c,
        "SELECT count(*) = 0 FROM pg_locks WHERE locktype = 'advisory'",
    )
    .await;
}
