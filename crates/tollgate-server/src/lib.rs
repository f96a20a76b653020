//! # tollgate-server
//!
//! The binary `tollgate`: Tollgate's command line, its HTTP client, the
//! configuration, the PostgreSQL seam and the process wiring around the
//! library half.
//!
//! * [`config`], [`cli`], [`client`], [`serve`], [`output`]: configuration,
//!   the command line, its HTTP client, the process wiring with graceful
//!   shutdown, and the CLI's output;
//! * [`pg`]: the PostgreSQL seam (connecting, migrating, the PostgreSQL
//!   `StoreOps`).
//!
//! The service itself is a library: the crate `tollgate-api` (router,
//! handlers, DTOs, authorization, error mapping, metrics, the storage seam
//! and the reclaim worker), on `httpkit` (problem documents, extractors,
//! limits) and `clock` (the time sources). Their modules are re-exported
//! here under their old paths ([`api`], [`auth`], [`dto`], [`error`],
//! [`metrics`], [`storage`], [`worker`], [`clock`], [`safe_cut`]) until
//! every user imports them directly.
//!
//! The core does no I/O and reads no clock; this crate and tollgate-api
//! are the ones that know HTTP.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// The time sources, moved to the crate `clock`; re-exported here under
/// the old path until every user imports `clock` directly.
pub mod clock {
    pub use ::clock::*;
}

/// The safe-cut clock, moved to `clock::safe_cut`; re-exported here under
/// the old path until every user imports `clock` directly.
pub mod safe_cut {
    pub use ::clock::safe_cut::*;
}

/// The library half, moved to the crate `tollgate-api`; re-exported here
/// under the old paths until every user imports `tollgate_api` directly.
pub use tollgate_api::{api, auth, dto, error, metrics, worker};

/// The storage seam, moved to `tollgate_api::storage`; re-exported here
/// under the old path, with `Backend` the old name of
/// [`tollgate_api::storage::ServiceStore`], until every user imports
/// `tollgate_api` directly.
pub mod storage {
    pub use tollgate_api::storage::ServiceStore as Backend;
    pub use tollgate_api::storage::*;
}

pub mod cli;
pub mod client;
pub mod config;
pub mod output;
pub mod pg;
pub mod serve;
