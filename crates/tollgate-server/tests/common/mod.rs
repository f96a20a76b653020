//! The HTTP test kit of tollgate-api (re-exported whole) and what only the
//! PostgreSQL store adds: fresh databases on the shared harness cluster
//! and the factory over tollgate-server's PostgreSQL `StoreOps`.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Connection, PgConnection};
use tollgate::{CapabilityKey, GrantPolicy, LeaseId};
use tollgate_api::storage::ServiceStore;
pub use tollgate_api::testkit::*;

/// Test key of PostgreSQL stores.
pub const PG_KEY: [u8; 32] = [42u8; 32];

/// PostgreSQL stores: a fresh migrated database per store on the shared
/// harness cluster.
#[derive(Default)]
pub struct PgFactory {
    last: std::sync::Mutex<Option<tollgate::StoreId>>,
}

static DB_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh database on the shared cluster; returns its URL.
pub async fn fresh_pg_url() -> String {
    let cluster = tollgate_pg_harness::shared().await;
    let name = format!(
        "tgsrv_{}_{}",
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
    admin.close().await.expect("close");
    cluster.url_for(&name)
}

/// Small pools: many tests share one cluster.
pub const PG_OPTIONS: tollgate_pg::StoreOptions = tollgate_pg::StoreOptions {
    max_connections: 4,
    acquire_timeout: Duration::from_secs(30),
    on_safe_cut: false,
};

/// [`PG_OPTIONS`] for a store behind the safe-cut clock.
pub const PG_OPTIONS_ON_CUT: tollgate_pg::StoreOptions = tollgate_pg::StoreOptions {
    on_safe_cut: true,
    ..PG_OPTIONS
};

#[async_trait(?Send)]
impl ServiceStoreFactory for PgFactory {
    async fn store(&self, policy: GrantPolicy) -> ServiceStore {
        let url = fresh_pg_url().await;
        tollgate_pg::migrate(&url).await.expect("migrate");
        let store = tollgate_pg::PostgresStore::connect_with(
            &url,
            policy,
            CapabilityKey::new(&PG_KEY).expect("key"),
            PG_OPTIONS,
        )
        .await
        .expect("store");
        *self.last.lock().expect("lock") = Some(store.store_id());
        tollgate_server::pg::service_store(Arc::new(store))
    }
    fn derive_capability(&self, lease_id: i64) -> Option<String> {
        let store_id = (*self.last.lock().expect("lock"))?;
        let key = CapabilityKey::new(&PG_KEY).expect("key");
        Some(key.derive(store_id, LeaseId(lease_id)).expose().to_string())
    }
    fn kind(&self) -> &'static str {
        "postgres"
    }
    fn expected_schema_version(&self) -> Option<i64> {
        Some(tollgate_server::pg::expected_schema_version())
    }
}
