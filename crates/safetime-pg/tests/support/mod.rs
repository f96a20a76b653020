//! Shared test support: fresh databases migrated to Tollgate's schema
//! (which includes migration 0018, the safe-time schema) on the harness
//! cluster, and Tollgate stores on them.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tollgate::{CapabilityKey, GrantPolicy};
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

static DB_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh database `stpg_<pid>_<n>` on the shared cluster, not migrated.
pub async fn fresh_db() -> Db {
    let cluster = tollgate_pg_harness::shared().await;
    let name = format!(
        "stpg_{}_{}",
        std::process::id(),
        DB_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let mut admin = PgConnection::connect(&cluster.admin_url())
        .await
        .expect("admin connection");
    sqlx::query(&format!("CREATE DATABASE \"{name}\""))
        .execute(&mut admin)
        .await
        .expect("create database");
    admin.close().await.expect("close admin connection");
    Db {
        url: cluster.url_for(&name),
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
