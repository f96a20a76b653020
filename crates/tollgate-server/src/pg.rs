//! The PostgreSQL seam: connecting, migrating and inspecting the
//! PostgreSQL store (`tollgate-pg`).
//!
//! Until the PostgreSQL store crate exists, every function here refuses with
//! [`PgError::NotBuilt`], so the service runs on the memory store only and a
//! `--database-url` fails at start-up with a clear message instead of
//! silently falling back.

use tollgate::CapabilityKey;

use crate::config::Config;
use crate::storage::Backend;

/// Errors of the PostgreSQL seam.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// This build has no PostgreSQL store.
    #[error(
        "this build has no PostgreSQL store yet (crate tollgate-pg); run without --database-url"
    )]
    NotBuilt,
}

/// One migration as `tollgate migrate` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationInfo {
    /// Version number.
    pub version: i64,
    /// Description.
    pub description: String,
}

/// Connects to the store at `cfg.database_url`, verifies the schema and the
/// recorded policy, and returns the backend.
///
/// # Errors
/// [`PgError::NotBuilt`].
pub async fn connect(_cfg: &Config, _key: CapabilityKey) -> Result<Backend, PgError> {
    Err(PgError::NotBuilt)
}

/// Applies pending migrations (or, with `dry_run`, lists them).
///
/// # Errors
/// [`PgError::NotBuilt`].
pub async fn migrate(_url: &str, _dry_run: bool) -> Result<Vec<MigrationInfo>, PgError> {
    Err(PgError::NotBuilt)
}
