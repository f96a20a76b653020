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
//! limits) and `clock` (the time sources).
//!
//! The core does no I/O and reads no clock; this crate and tollgate-api
//! are the ones that know HTTP.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
pub mod client;
pub mod config;
pub mod output;
pub mod pg;
pub mod serve;
