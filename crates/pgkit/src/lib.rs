//! # pgkit
//!
//! What every PostgreSQL store of the workspace shares, so that each store
//! holds only its own SQL and rules:
//!
//! * [`tx`]: the one transaction wrapper, [`transact`], with bounded retry
//!   of serialization failures and deadlocks ([`TX_ATTEMPTS_MAX`] attempts,
//!   a doubling back-off) and per-operation metrics ([`OpCounters`]: attempts,
//!   commits, retries, failures, latency) labelled by the caller's operation
//!   name ([`OpLabel`]).
//! * [`error`]: the one classification of an [`sqlx::Error`], [`classify`],
//!   which every store maps to its own error type.
//! * [`url`]: the one database-URL parser, [`DatabaseUrl::parse`], whose
//!   errors and `Display` never contain the password.
//! * [`migrate`]: migration lines, one per subsystem, each with its own
//!   bookkeeping table and version fence, applied in a fixed order under
//!   one advisory lock by [`migrate()`](migrate::migrate).
//!
//! Invariants, stated as absences: no text this crate produces (error,
//! `Display`, `Debug`, log event) contains a connection URL's password; no
//! transaction is attempted more than [`TX_ATTEMPTS_MAX`] times; no
//! applied migration is run twice, reverted or rewritten; nothing panics
//! on bad input or a failing database.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod migrate;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tx;
pub mod url;

pub use error::{DbFailure, FailureKind, classify};
pub use migrate::{
    AppliedMigration, LineReport, LineStatus, MigrationError, MigrationLine, PendingMigration,
};
pub use tx::{
    OpCounters, OpLabel, OpMetrics, TX_ATTEMPTS_MAX, TxBodyError, TxError, TxFailure, TxFuture,
    transact,
};
pub use url::{DatabaseUrl, UrlError, redact};
