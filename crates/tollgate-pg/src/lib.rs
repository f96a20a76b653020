//! # tollgate-pg
//!
//! Tollgate's PostgreSQL store: [`PostgresStore`] implements the
//! [`tollgate::Allocator`] API with the same rules as the
//! [`tollgate::MemoryStore`] (it calls the core's `plan_*` functions and
//! passes the same conformance suite), durably and safely shared by many
//! processes.
//!
//! * [`schema`]: the embedded migrations, one line per subsystem applied in
//!   order (Tollgate's: 0001..0016, the schema before exact instants; 0017,
//!   the exact-instant migration; 0018, safe time; 0019, the lease-write
//!   guard; then safe time's own line), and the startup fence that refuses a database migrated by a
//!   newer binary. The mechanism is [`pgkit::migrate`].
//! * [`persistence`]: every SQL statement, the transaction wrapper (over
//!   [`pgkit::transact`], with bounded retries), and what is stored and
//!   why.
//! * [`store`]: the allocator, policy records and operator commands.
//! * [`ops`]: the allocator's writing operations (deposit, acquire, renew,
//!   release, consolidate, reclaim) as steps of a caller's own
//!   transaction, so a caller's rows and a reservation commit together; the
//!   store's methods run exactly these, one transaction each.
//!
//! The safe expiry cut and its sampler live in `safetime-pg`; their schema
//! is migration 0018, which is embedded here with the others.
//!
//! Typical startup (a service's `main`):
//!
//! ```no_run
//! # async fn demo(url: &str, policy: tollgate::GrantPolicy, key: tollgate::CapabilityKey)
//! #     -> Result<(), tollgate::StorageError> {
//! let report = tollgate_pg::migrate(url).await?;          // dedicated connection
//! let store = tollgate_pg::PostgresStore::connect(url, policy, key).await?; // fences
//! # let _ = (report, store); Ok(()) }
//! ```
//!
//! Invariants, stated as absences: no SQL `now()` decides anything about
//! time (instants are bound as exact pairs computed in Rust); no grace or
//! TTL is ever converted to microseconds (the one truncation,
//! `tollgate::rules::check_replay`'s, only compares a retried request with a
//! pre-0017 idempotency record that was itself truncated); no accounting or timing rule is
//! written in SQL (every plan comes from `tollgate::rules`); no capability
//! or hash of one is stored; nothing panics on bad input or bad stored
//! data: every failure is a [`tollgate::AllocatorError`] (or, outside the
//! allocator, a [`tollgate::StorageError`]) with a stable code,
//! and its message never contains the database URL or credentials.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
pub mod ops;
pub mod persistence;
pub mod schema;
pub mod store;

pub use persistence::{
    LEASE_COUNTS_SQL, LeaseCount, Op, OpStats, POLICY_CHANGES_MAX, PolicyChange,
    RECLAIM_CANDIDATES_SQL, TX_ATTEMPTS_MAX,
};
pub use pgkit::OpMetrics;
pub use schema::{
    EXACT_INSTANTS_VERSION, LEASE_WRITE_GUARD_VERSION, MIGRATE_APPLICATION_NAME, MigrationReport,
    PUBLISH_AT_OBSERVATION_VERSION, PendingMigration, SAFE_TIME_LINE, SAFE_TIME_MIGRATIONS_TABLE,
    SAFE_TIME_VERSION, SEAL_GUARD_VERSION, Schema, TOLLGATE_LINE, TOLLGATE_MIGRATIONS_TABLE,
    migrate, pending_migrations, safe_time_line, schema_version, tollgate_line,
};
pub use store::{
    CHANGED_BY_MAX_CHARS, FIRST_START, GRANT_POLICY_SETTING, IDLE_IN_TRANSACTION_TIMEOUT,
    PostgresStore, RECLAIM_BATCH_DEFAULT, StoreOptions, declare_session, grant_policy_declaration,
    lease_counts, migration_in_progress, policy_changes, recorded_policy, set_policy,
};

/// Boxes a future as `Send` inside this crate, where its lifetimes are
/// known. Public `async fn`s whose futures hold the transaction wrapper's
/// higher-ranked closures (or sqlx's migrator) return through it: rustc
/// cannot prove such futures `Send` when another crate awaits them in a
/// `Send` context (rust-lang/rust#64552 and relatives).
fn boxed<'a, T>(
    f: impl std::future::Future<Output = T> + Send + 'a,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>> {
    Box::pin(f)
}
