//! The PostgreSQL seam: connecting to, migrating and inspecting the
//! PostgreSQL store ([`tollgate_pg::PostgresStore`]).
//!
//! Start-up against PostgreSQL ([`connect`]): wait (bounded by
//! [`DB_WAIT`]) for the database to accept connections; apply pending
//! migrations unless told not to; then open the store, whose own fences
//! refuse a schema this binary does not know, pending migrations, and a
//! recorded policy different from the configured one
//! (`policy_mismatch`). The capability key must come from a stable
//! `--secret-file` (checked by [`crate::serve`]) so capabilities survive
//! restarts.
//!
//! [`PgOps`] answers readiness and status through `tollgate-pg`'s operator
//! accessors: [`tollgate_pg::schema_version`],
//! [`tollgate_pg::migration_in_progress`] (maintenance: the migrator's
//! dedicated session, [`tollgate_pg::MIGRATE_APPLICATION_NAME`], is
//! connected) and [`tollgate_pg::lease_counts`] (active leases, and those
//! whose expiry is a legacy upper bound).
//!
//! The policy commands ([`show_policy`], [`set_policy`]) work on a plain
//! connection pool ([`open_pool`]) rather than a store, because opening a
//! store checks the recorded policy against the configured one, and
//! changing the recorded policy is exactly when they differ.
//!
//! No SQL is written in this crate's `src`: every statement lives in
//! `tollgate-pg`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tollgate::{Allocator, CapabilityKey, GrantPolicy, LeaseState, StorageError};
use tollgate_pg::{PolicyChange, PostgresStore, Schema};

use crate::config::Config;
use crate::storage::{Backend, Readiness, StatusCounts, StoreOps};

/// How long start-up waits for the database to accept connections: long
/// enough for a database container started alongside the service, short
/// enough that a wrong URL fails within a minute.
pub const DB_WAIT: Duration = Duration::from_secs(30);

/// Pause between connection attempts while waiting.
pub const DB_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Errors of the PostgreSQL seam.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// No database URL was configured.
    #[error("no database URL configured")]
    NoUrl,
    /// A store operation failed; `context` says which.
    #[error("{context}: {source}")]
    Storage {
        /// What was being done.
        context: &'static str,
        /// The store's error.
        source: StorageError,
    },
}

fn ctx(context: &'static str) -> impl FnOnce(StorageError) -> PgError {
    move |source| PgError::Storage { context, source }
}

/// One migration as `tollgate migrate` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationInfo {
    /// Version number.
    pub version: i64,
    /// Description.
    pub description: String,
}

/// The schema version this binary expects.
pub fn expected_schema_version() -> i64 {
    Schema::current().latest_version()
}

/// Retries `attempt` while it fails with [`StorageError::Unavailable`], for
/// at most [`DB_WAIT`].
async fn with_wait<T, F, Fut>(mut attempt: F) -> Result<T, StorageError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StorageError>>,
{
    let deadline = tokio::time::Instant::now() + DB_WAIT;
    loop {
        match attempt().await {
            Err(StorageError::Unavailable { message })
                if tokio::time::Instant::now() + DB_RETRY_PAUSE < deadline =>
            {
                tracing::warn!(%message, "database unavailable; retrying");
                tokio::time::sleep(DB_RETRY_PAUSE).await;
            }
            other => return other,
        }
    }
}

/// Connects to the store at `cfg.database_url`: waits for the database,
/// applies pending migrations when `cfg.migrate_on_start`, and opens the
/// store (schema fence, policy check).
///
/// # Errors
/// [`PgError::NoUrl`]; [`PgError::Storage`] with the store's error
/// (`policy_mismatch`, unknown or pending migrations, unreachable).
pub async fn connect(cfg: &Config, key: CapabilityKey) -> Result<Backend, PgError> {
    let url = cfg.database_url.as_deref().ok_or(PgError::NoUrl)?;
    if cfg.migrate_on_start {
        let report = with_wait(|| tollgate_pg::migrate(url))
            .await
            .map_err(ctx("applying migrations"))?;
        if !report.applied.is_empty() {
            tracing::info!(applied = ?report.applied, to = ?report.to_version, "migrations applied");
        }
    }
    let store = with_wait(|| PostgresStore::connect(url, cfg.policy, key.clone()))
        .await
        .map_err(ctx("opening the PostgreSQL store"))?;
    Ok(backend(Arc::new(store)))
}

/// The backend over an open store.
pub fn backend(store: Arc<PostgresStore>) -> Backend {
    Backend {
        allocator: store.clone() as Arc<dyn Allocator>,
        ops: Arc::new(PgOps { store }),
    }
}

/// Applies pending migrations (or, with `dry_run`, lists them).
///
/// # Errors
/// [`PgError::Storage`].
pub async fn migrate(url: &str, dry_run: bool) -> Result<Vec<MigrationInfo>, PgError> {
    let known = Schema::current().known();
    let describe = |version: i64| MigrationInfo {
        version,
        description: known
            .iter()
            .find(|m| m.version == version)
            .map(|m| m.description.clone())
            .unwrap_or_default(),
    };
    if dry_run {
        let pending = with_wait(|| tollgate_pg::pending_migrations(url))
            .await
            .map_err(ctx("listing pending migrations"))?;
        return Ok(pending.into_iter().map(|m| describe(m.version)).collect());
    }
    let report = with_wait(|| tollgate_pg::migrate(url))
        .await
        .map_err(ctx("applying migrations"))?;
    Ok(report.applied.into_iter().map(describe).collect())
}

/// Connections of the operator commands' pool: they run one statement at
/// a time.
const OPERATOR_POOL_CONNECTIONS: u32 = 2;

/// How long one attempt of an operator command waits for a connection
/// ([`with_wait`] retries an unavailable database for up to [`DB_WAIT`]).
const OPERATOR_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// A small pool on `url` for the operator commands, once the schema fence
/// passes (the database has applied exactly this binary's migrations). It
/// checks no policy: see the module docs. Waits for the database like
/// [`connect`].
///
/// # Errors
/// [`PgError::Storage`]: an unparsable URL (not repeated in the message),
/// an unreachable database, an unknown or pending migration.
pub async fn open_pool(url: &str) -> Result<PgPool, PgError> {
    let options = PgConnectOptions::from_str(url).map_err(|_| PgError::Storage {
        context: "opening the database",
        source: StorageError::Backend {
            message: "invalid database url".into(),
        },
    })?;
    // Lazy: the first statement connects, and `tollgate-pg` maps its errors.
    let pool = PgPoolOptions::new()
        .max_connections(OPERATOR_POOL_CONNECTIONS)
        .acquire_timeout(OPERATOR_ACQUIRE_TIMEOUT)
        .connect_lazy_with(options);
    let schema = Schema::current();
    if let Err(e) = with_wait(|| schema.check(&pool)).await {
        pool.close().await;
        return Err(ctx("checking the schema")(e));
    }
    Ok(pool)
}

/// The recorded policy (`None` before any process has started against
/// the database) and the most recent changes, oldest first (at most
/// [`tollgate_pg::POLICY_CHANGES_MAX`]).
///
/// # Errors
/// As [`open_pool`]; database errors.
pub async fn show_policy(url: &str) -> Result<(Option<GrantPolicy>, Vec<PolicyChange>), PgError> {
    let pool = open_pool(url).await?;
    let shown = async {
        let policy = tollgate_pg::recorded_policy(&pool)
            .await
            .map_err(ctx("reading the recorded policy"))?;
        let changes = tollgate_pg::policy_changes(&pool)
            .await
            .map_err(ctx("reading the policy changes"))?;
        Ok((policy, changes))
    }
    .await;
    pool.close().await;
    shown
}

/// Records `policy` as the database's policy, by `changed_by`: the
/// operator command [`tollgate_pg::set_policy`]. Running processes keep
/// theirs; see the README's "Changing the grant policy".
///
/// # Errors
/// As [`open_pool`]; an invalid `changed_by`; database errors.
pub async fn set_policy(
    url: &str,
    policy: GrantPolicy,
    changed_by: &str,
) -> Result<PolicyChange, PgError> {
    let pool = open_pool(url).await?;
    let change = tollgate_pg::set_policy(&pool, policy, changed_by)
        .await
        .map_err(ctx("recording the policy"));
    pool.close().await;
    change
}

/// [`StoreOps`] of the PostgreSQL store; see the module docs.
#[derive(Debug)]
pub struct PgOps {
    store: Arc<PostgresStore>,
}

#[async_trait]
impl StoreOps for PgOps {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn readiness(&self) -> Readiness {
        let expected = Some(expected_schema_version());
        let pool = self.store.pool();
        let version = tollgate_pg::schema_version(pool).await;
        let maintenance = tollgate_pg::migration_in_progress(pool).await;
        match (version, maintenance) {
            (Ok(v), Ok(m)) => Readiness {
                store: "postgres",
                reachable: true,
                schema_version: v,
                expected_schema_version: expected,
                maintenance: m,
                detail: None,
            },
            (v, m) => Readiness {
                store: "postgres",
                reachable: false,
                schema_version: v.as_ref().ok().copied().flatten(),
                expected_schema_version: expected,
                maintenance: m.as_ref().ok().copied().unwrap_or(false),
                detail: Some(match (v, m) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => String::new(),
                }),
            },
        }
    }

    async fn counts(&self) -> Result<StatusCounts, StorageError> {
        let rows = tollgate_pg::lease_counts(self.store.pool()).await?;
        let mut counts = StatusCounts::default();
        for row in rows.iter().filter(|r| r.state == LeaseState::Active) {
            let n = u64::try_from(row.count).unwrap_or(0);
            counts.active_leases = counts.active_leases.saturating_add(n);
            if row.expiry_is_upper_bound {
                counts.active_legacy_bounds = counts.active_legacy_bounds.saturating_add(n);
            }
        }
        Ok(counts)
    }
}
