//! What the service needs from storage beyond the [`Allocator`] trait:
//! readiness (reachable, schema version, maintenance) and status counts.
//!
//! A [`ServiceStore`] pairs the allocator every request uses with a
//! [`StoreOps`] for those operator questions. The memory store's
//! [`MemoryOps`] is here; the PostgreSQL one lives in tollgate-server's
//! `pg`, so the rest of the service is the same for both stores.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tollgate::{Allocator, CapabilityKey, GrantPolicy, MemoryStore, StorageError};

/// What `/readyz` reports about storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// `memory` or `postgres`.
    pub store: &'static str,
    /// Whether the storage answered a trivial query.
    pub reachable: bool,
    /// The schema version found (`None` for the memory store, or when
    /// unreachable).
    pub schema_version: Option<i64>,
    /// The schema version this build expects (`None` for the memory store).
    pub expected_schema_version: Option<i64>,
    /// Whether a migration or other maintenance is in progress.
    pub maintenance: bool,
    /// Why the store is not ready, for operators (no secrets).
    pub detail: Option<String>,
}

impl Readiness {
    /// Reachable, at the expected schema version, and not in maintenance.
    pub fn is_ready(&self) -> bool {
        self.reachable && !self.maintenance && self.schema_version == self.expected_schema_version
    }
}

/// Counts for `tollgate status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusCounts {
    /// Active leases.
    pub active_leases: u64,
    /// Active leases whose expiry is a legacy upper bound.
    pub active_legacy_bounds: u64,
}

/// The longest `GET /v1/admin/status` (and a direct `tollgate status`)
/// waits for the store's counts before it reports them as unknown.
pub const STATUS_COUNTS_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// The store's counts for a status report, or `None` when the store fails
/// or does not answer within [`STATUS_COUNTS_MAX`] (logged as a warning): a
/// status report answers even while the database does not, and its
/// readiness part says why.
pub async fn bounded_counts(ops: &dyn StoreOps) -> Option<StatusCounts> {
    match tokio::time::timeout(STATUS_COUNTS_MAX, ops.counts()).await {
        Ok(Ok(counts)) => Some(counts),
        Ok(Err(e)) => {
            tracing::warn!(code = e.code(), error = %e, "status: counting leases failed");
            None
        }
        Err(_) => {
            tracing::warn!(
                bound = ?STATUS_COUNTS_MAX,
                "status: counting leases did not finish in time"
            );
            None
        }
    }
}

/// Store operations only the service needs; see the module docs.
#[async_trait]
pub trait StoreOps: Send + Sync + fmt::Debug {
    /// `memory` or `postgres`.
    fn kind(&self) -> &'static str;

    /// Whether the store can take traffic. Never fails: an unreachable store
    /// is reported as such.
    async fn readiness(&self) -> Readiness;

    /// Active leases and active legacy bounds.
    ///
    /// # Errors
    /// The store's errors.
    async fn counts(&self) -> Result<StatusCounts, StorageError>;

    /// The PostgreSQL pool of the store (`None` for the memory store): the
    /// safe-cut clock reads the cut through it.
    fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        None
    }
}

/// The store a service runs on: the allocator and its operator questions.
#[derive(Clone)]
pub struct ServiceStore {
    /// Every allocator operation goes here.
    pub allocator: Arc<dyn Allocator>,
    /// Readiness and counts.
    pub ops: Arc<dyn StoreOps>,
}

impl fmt::Debug for ServiceStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceStore")
            .field("ops", &self.ops)
            .finish_non_exhaustive()
    }
}

impl ServiceStore {
    /// A fresh [`MemoryStore`] applying `policy`.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] if the random source fails.
    pub fn memory(policy: GrantPolicy, key: CapabilityKey) -> Result<ServiceStore, StorageError> {
        let store = Arc::new(MemoryStore::new(policy, key)?);
        Ok(ServiceStore {
            allocator: store.clone(),
            ops: Arc::new(MemoryOps { store }),
        })
    }
}

/// [`StoreOps`] of the memory store: always at "no schema", never in
/// maintenance; counts come from the store ([`MemoryStore::active_leases`];
/// a memory store has no legacy bounds).
pub struct MemoryOps {
    store: Arc<MemoryStore>,
}

impl fmt::Debug for MemoryOps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MemoryOps")
    }
}

#[async_trait]
impl StoreOps for MemoryOps {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn readiness(&self) -> Readiness {
        let probe = self.store.accounts(None, 1).await;
        Readiness {
            store: "memory",
            reachable: probe.is_ok(),
            schema_version: None,
            expected_schema_version: None,
            maintenance: false,
            detail: probe.err().map(|e| e.to_string()),
        }
    }

    async fn counts(&self) -> Result<StatusCounts, StorageError> {
        Ok(StatusCounts {
            active_leases: self.store.active_leases()?,
            active_legacy_bounds: 0,
        })
    }
}
