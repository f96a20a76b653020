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
