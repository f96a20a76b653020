//! Shared test support: fresh migrated databases on the harness cluster and
//! stores on them.
#![allow(dead_code)] // each test binary uses a different part

pub mod legacy;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Connection, PgConnection};
use tollgate::testkit::StoreFactory;
use tollgate::{Allocator, CapabilityKey, GrantPolicy};
use tollgate_pg::{PostgresStore, StoreOptions};

/// Pool settings for tests: several test binaries and threads share one
/// cluster, so each store keeps few connections.
pub const TEST_OPTIONS: StoreOptions = StoreOptions {
    max_connections: 8,
    acquire_timeout: Duration::from_secs(30),
    on_safe_cut: false,
};

/// A test database: its name and URL.
#[derive(Debug, Clone)]
pub struct Db {
    pub name: String,
    pub url: String,
}

impl Db {
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// A fresh database on the shared cluster, not migrated.
///
/// Created here rather than with the harness's `fresh_database`, whose
/// future rustc cannot prove `Send` from this crate (sqlx `Executor`
/// higher-ranked lifetimes), which the `StoreFactory` trait requires.
pub async fn fresh_db() -> Db {
    let cluster = tollgate_pg_harness::shared().await;
    create_db(&cluster.admin_url(), |name| cluster.url_for(name)).await
}

static DB_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Creates a database `tgpg_<pid>_<n>` through `admin_url` and returns its
/// URL (built by `url_for`).
pub async fn create_db(admin_url: &str, url_for: impl Fn(&str) -> String) -> Db {
    let name = format!(
        "tgpg_{}_{}",
        std::process::id(),
        DB_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let mut admin = PgConnection::connect(admin_url)
        .await
        .expect("admin connection");
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut admin)
        .await
        .expect("create database");
    admin.close().await.expect("close admin connection");
    Db {
        url: url_for(&name),
        name,
    }
}

/// A fresh database migrated to the current schema.
pub async fn migrated_db() -> Db {
    let db = fresh_db().await;
    tollgate_pg::migrate(db.url()).await.expect("migrate");
    db
}

/// A store on `db` (already migrated).
pub async fn store_on(db: &Db, policy: GrantPolicy, key: CapabilityKey) -> PostgresStore {
    PostgresStore::connect_with(db.url(), policy, key, TEST_OPTIONS)
        .await
        .expect("connect store")
}

/// A fixed 32-byte capability key for tests that re-derive capabilities.
pub fn test_key() -> CapabilityKey {
    CapabilityKey::new(&[0x5a; 32]).expect("key")
}

/// Bound on any one statement of a test's own connections, so that a test
/// that would wait forever on a lock fails instead of hanging CI.
pub const TEST_STATEMENT_TIMEOUT: &str = "60s";

/// A plain connection (not a pool) to `db`.
pub async fn connect(db: &Db) -> PgConnection {
    let mut conn = PgConnection::connect(db.url()).await.expect("connect");
    sqlx::query(&format!(
        "SET statement_timeout = '{TEST_STATEMENT_TIMEOUT}'"
    ))
    .execute(&mut conn)
    .await
    .expect("set statement_timeout");
    conn
}

/// Every row of every table and every sequence value of the `public`
/// schema, as text, except the tables named in `except`.
pub async fn data(conn: &mut PgConnection, except: &[&str]) -> Vec<(String, Vec<String>)> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let mut out = Vec::new();
    for t in tables.iter().filter(|t| !except.contains(&t.as_str())) {
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT to_jsonb(t)::text FROM \"{t}\" t ORDER BY 1"
        ))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        out.push((t.clone(), rows));
    }
    let sequences: Vec<String> = sqlx::query_scalar(
        "SELECT sequencename::text || '=' || coalesce(last_value::text, 'unset') \
         FROM pg_sequences WHERE schemaname = 'public' ORDER BY 1",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    out.push(("(sequences)".into(), sequences));
    out
}

/// The schema's objects: tables with their columns, indexes, functions,
/// triggers and constraints, as text.
pub async fn catalog(conn: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type \
           FROM information_schema.columns WHERE table_schema = 'public' \
         UNION ALL SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public' \
         UNION ALL SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc) \
           FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace \
         UNION ALL SELECT 'trigger ' || tgname || ' ' || tgrelid::regclass::text \
           FROM pg_trigger WHERE NOT tgisinternal \
         UNION ALL SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) \
           FROM pg_constraint WHERE connamespace = 'public'::regnamespace \
         ORDER BY 1",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

/// The conformance suite's factory: fresh database, all migrations,
/// a store with a fresh random key.
pub struct PgFactory;

#[async_trait]
impl StoreFactory for PgFactory {
    async fn store(&self, policy: GrantPolicy) -> Arc<dyn Allocator> {
        let db = migrated_db().await;
        let key = CapabilityKey::generate().expect("key");
        Arc::new(store_on(&db, policy, key).await)
    }
}
