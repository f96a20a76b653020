//! # safetime-pg
//!
//! The time authority in PostgreSQL: the persisted *safe expiry cut* and the
//! sampler that publishes it. The rules are `safetime`'s (pure); this crate
//! is their I/O.
//!
//! * [`cut`]: reading the cut ([`read_cut`]; as a standby's sighting,
//!   [`read_sighting`]), the sampler's session-level lock ([`try_lock`]), observations ([`observe`]), epoch claims
//!   ([`claim`]), publishes ([`publish`]), the sealed horizon policy
//!   ([`load_policy`], [`seal_policy`]), the check that a process's
//!   deadlines fit every binding policy ([`check_bounds`]) and its evidence ([`evidence`]);
//!   every failure is a [`SafeTimeError`] with a stable code.
//! * [`sampler`]: the sampler's leadership loop ([`Sampler`]): one
//!   epoch-fenced leader per database, any number of standbys, each
//!   reading the published cut so that a takeover carries it across the
//!   new epoch.
//!
//! # Schema
//!
//! The safe-time tables and functions (`tollgate_safetime*`, role
//! `tollgate_sampler`) are created by migration `0018_safe_time.sql`, which
//! for now is one of `tollgate-pg`'s embedded migrations (`tollgate
//! migrate` applies it; existing databases have its checksum recorded, so
//! it stays byte-for-byte where it is). This crate runs no migration: on a
//! database without it every function fails with
//! [`SafeTimeError::SchemaMissing`].
//!
//! Invariants, stated as absences: no host clock decides anything about
//! the cut (the sampler's monotonic clock only bounds elapsed time, and
//! every statement that writes goes through a function of migration 0018
//! that caps the proposal by database time and re-checks leadership and
//! the epoch); no statement is sent on a pool by the sampler (its
//! leadership is its one pinned connection, and a standby's readings of
//! the cut go over one connection of their own); no error message
//! contains the connection URL.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cut;
pub mod sampler;

pub use cut::{
    BindingPolicy, Claim, CutRow, CutSighting, DbObservation, EVIDENCE_MAX, Evidence,
    HorizonCheckError, LOCK_KEY_CLASS, LOCK_KEY_OBJ, Published, SafeTimeError, binding_policies,
    check_bounds, claim, connect_options, evidence, load_policy, observe, publish, read_cut,
    read_sighting, seal_policy, try_lock,
};
pub use sampler::{Sampler, SamplerOptions, SamplerStatus};
