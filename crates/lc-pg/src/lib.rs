//! # lc-pg
//!
//! Little Compute's PostgreSQL store: [`LcStore`] implements
//! [`lc_core::ControlStore`], [`lc_core::ReconcileStore`] and
//! [`lc_core::GatewayStore`] (exec ownership fenced on the cut, transition
//! receipts, page metadata whose bytes live in the sink), composing
//! Tollgate's transaction-composable operations (`tollgate_pg::ops`) so a
//! Reservation (a Tollgate grant) commits or rolls back with the exec,
//! attempt and Lease rows it belongs to.
//!
//! * [`schema`]: Little Compute's migration line (`migrations/`, table
//!   `_lc_migrations`), applied after Tollgate's and safe time's
//!   ([`schema()`], [`migrate`]).
//! * `persistence`: every SQL statement.
//! * [`store`]: the store and its transaction bodies.
//!
//! Typical startup:
//!
//! ```no_run
//! # async fn demo(url: &str, policy: tollgate::GrantPolicy, key: tollgate::CapabilityKey)
//! #     -> Result<(), lc_core::LcError> {
//! lc_pg::migrate(url).await?;
//! let store = lc_pg::LcStore::connect(url, policy, key, lc_pg::LcConfig::default()).await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! Invariants, stated as absences: no statement compares with SQL `now()`
//! and no host clock decides anything (time is the caller's
//! [`lc_core::CutReading`], checked against the persisted cut); no
//! capability or API key is stored; no failed operation leaves a partial
//! change; no query returns an unbounded number of rows.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod persistence;
pub mod schema;
pub mod store;

pub use schema::{LC_LINE, LC_MIGRATIONS_TABLE, LC_VERSION, lc_line, migrate, schema};
pub use store::{LcConfig, LcStore, Op, PROVIDER_URL_BYTES_MAX};
