//! # Tollgate
//!
//! An exact-time lease and credit allocator. Accounts hold integer units;
//! work runs under leases (grants) that hold units until an exact expiry;
//! leases are released by their holders or, once `expiry + reclaim_grace`
//! has passed, reclaimed and charged in full. Every instant is a
//! [`jiff::Timestamp`] with full nanosecond precision, and time is always
//! *supplied* to an operation: nothing here reads a clock.
//!
//! This crate holds the domain core (no I/O):
//! [`timing`] (policy, expiry, reclaim predicate, the grant's deadline
//! bound), [`instant_pair`] (the exact PostgreSQL encoding, from
//! `safetime`, and migration 0017's legacy bound), [`rules`] (accounting
//! and life-cycle),
//! [`audit`] (conservation audit from the ledger), [`capability`]; the
//! [`Allocator`] trait every store implements; and the [`MemoryStore`].
//! With the `testkit` feature it also exports the conformance suite every
//! store must pass.
//!
//! ```
//! # tokio_test_block_on(async {
//! use jiff::{SignedDuration, Timestamp};
//! use tollgate::{AcquireRequest, Allocator, CapabilityKey, GrantPolicy, MemoryStore, NewAccount};
//!
//! let policy = GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_nanos(1)).unwrap();
//! let store = MemoryStore::new(policy, CapabilityKey::generate().unwrap()).unwrap();
//! let now: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
//! let a = store.create_account(NewAccount { name: "team".into(), api_key_sha256: None }).await.unwrap();
//! store.deposit(a.account_id, 100, now).await.unwrap();
//! let g = store.acquire(AcquireRequest {
//!     account_id: a.account_id, units: 10,
//!     ttl: SignedDuration::new(30, 1), idempotency_key: None,
//! }, now.into()).await.unwrap();
//! assert_eq!(g.expiry.to_string(), "2026-11-29T12:00:30.000000001Z");
//! let s = store.release(g.lease_id, &g.capability, now, Some(4)).await.unwrap();
//! assert_eq!((s.consumed, s.returned, s.balances.available), (4, 6, 96));
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod allocator;
pub mod audit;
pub mod capability;
pub mod error;
pub mod instant_pair;
pub mod memory;
pub mod model;
pub mod rules;
pub mod timing;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use allocator::{AUDIT_PAGE_MAX, Allocator};
pub use audit::{AuditReport, AuditViolation, Auditor};
pub use capability::{Capability, CapabilityKey, KeyError, LeaseCapabilities, StoreId};
pub use error::{AllocatorError, InvalidChangedBy, RuleError, StorageError};
pub use instant_pair::{InstantPair, PairError};
pub use memory::MemoryStore;
pub use model::{
    Account, AccountId, AcquireRequest, Actor, Balances, Fence, Grant, IdempotencyRecord, Issued,
    Lease, LeaseId, LeaseState, LedgerEntry, LedgerKind, NewAccount, NewLedgerEntry, ReclaimReport,
    Renewal, Settlement,
};
pub use rules::{
    ACCOUNT_NAME_MAX_CHARS, CHANGED_BY_MAX_CHARS, CONSOLIDATE_LEASES_MAX,
    IDEMPOTENCY_KEY_MAX_BYTES, RECLAIM_BATCH_DEFAULT, RECLAIM_BATCH_MAX,
};
pub use timing::{
    GrantPolicy, LEASE_GRANT_DEADLINE, PolicyError, SuppliedTime, TIMESTAMP_MAX_NS,
    TIMESTAMP_MIN_NS, TimingError,
};
