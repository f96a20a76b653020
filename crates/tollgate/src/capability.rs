//! Lease capabilities: unforgeable, derived, never stored.
//!
//! A capability is `tgc1.` followed by the lowercase hex of
//! `HMAC-SHA-256(key, "tollgate/capability/v1" || store_id || lease_id)`,
//! 256 bits of secret. The store keeps neither the capability nor a hash of
//! it: it recomputes the expected value from the configured key and the
//! lease identity, and compares in constant time. Hence a capability issued
//! before a restart still verifies afterwards when the key is stable (the
//! PostgreSQL mode refuses to start without one), and verification happens
//! *before* any lookup, so a wrong capability reveals nothing about whether
//! the lease exists.
//!
//! `store_id` is a random 128-bit identity of the store (persisted by durable
//! stores) so that a capability from one store never verifies in another
//! store that shares the key.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::model::LeaseId;

/// The shortest accepted key, in bytes.
pub const CAPABILITY_KEY_MIN_BYTES: usize = 32;

const DOMAIN: &[u8] = b"tollgate/capability/v1";
const PREFIX: &str = "tgc1.";

/// A lease capability. Its `Debug` output is redacted; [`Capability::expose`]
/// gives the secret string for handing to the holder.
#[derive(Clone, PartialEq, Eq)]
pub struct Capability(String);

impl Capability {
    /// Wraps a presented capability string (as received from a holder).
    pub fn from_presented(s: impl Into<String>) -> Capability {
        Capability(s.into())
    }

    /// The secret string.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Capability(<redacted>)")
    }
}

/// A random 128-bit identity of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreId(pub [u8; 16]);

impl StoreId {
    /// A fresh random identity.
    ///
    /// # Errors
    /// When the operating system's random source fails.
    pub fn generate() -> Result<StoreId, getrandom::Error> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b)?;
        Ok(StoreId(b))
    }
}

/// Errors building a [`CapabilityKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The key was shorter than [`CAPABILITY_KEY_MIN_BYTES`].
    #[error("capability key must be at least {min} bytes, got {len}")]
    TooShort {
        /// Bytes given.
        len: usize,
        /// Bytes required.
        min: usize,
    },
    /// The operating system's random source failed.
    #[error("random source failed: {0}")]
    Random(String),
}

/// The server secret capabilities are derived from. `Debug` is redacted.
#[derive(Clone)]
pub struct CapabilityKey(Vec<u8>);

impl fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CapabilityKey(<redacted>)")
    }
}

impl CapabilityKey {
    /// Uses `secret` as the key.
    ///
    /// # Errors
    /// [`KeyError::TooShort`] below [`CAPABILITY_KEY_MIN_BYTES`] bytes.
    pub fn new(secret: &[u8]) -> Result<CapabilityKey, KeyError> {
        if secret.len() < CAPABILITY_KEY_MIN_BYTES {
            return Err(KeyError::TooShort {
                len: secret.len(),
                min: CAPABILITY_KEY_MIN_BYTES,
            });
        }
        Ok(CapabilityKey(secret.to_vec()))
    }

    /// A fresh random 32-byte key (for processes whose capabilities need not
    /// survive a restart, such as an in-memory store).
    ///
    /// # Errors
    /// [`KeyError::Random`] when the random source fails.
    pub fn generate() -> Result<CapabilityKey, KeyError> {
        let mut b = [0u8; CAPABILITY_KEY_MIN_BYTES];
        getrandom::fill(&mut b).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(CapabilityKey(b.to_vec()))
    }

    /// The capability of lease `lease_id` in store `store_id`.
    ///
    /// ```
    /// use tollgate::{CapabilityKey, LeaseId, StoreId};
    /// let key = CapabilityKey::new(&[7u8; 32]).unwrap();
    /// let cap = key.derive(StoreId([1; 16]), LeaseId(5));
    /// assert!(key.verify(StoreId([1; 16]), LeaseId(5), &cap));
    /// assert!(!key.verify(StoreId([1; 16]), LeaseId(6), &cap));
    /// ```
    pub fn derive(&self, store_id: StoreId, lease_id: LeaseId) -> Capability {
        // HMAC accepts keys of any length; `new` guarantees at least 32 bytes.
        let mut mac = match Hmac::<Sha256>::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        mac.update(DOMAIN);
        mac.update(&store_id.0);
        mac.update(&lease_id.0.to_be_bytes());
        let tag = mac.finalize().into_bytes();
        Capability(format!("{PREFIX}{}", hex::encode(tag)))
    }

    /// Whether `presented` is the capability of `lease_id`, compared in
    /// constant time.
    pub fn verify(&self, store_id: StoreId, lease_id: LeaseId, presented: &Capability) -> bool {
        let expected = self.derive(store_id, lease_id);
        bool::from(expected.0.as_bytes().ct_eq(presented.0.as_bytes()))
    }
}

/// The capabilities of one store: its key and identity together. Both stores
/// check and issue capabilities through it, so the rule "verify before any
/// lookup, never reveal existence" lives in one place.
#[derive(Debug, Clone)]
pub struct LeaseCapabilities {
    key: CapabilityKey,
    store_id: StoreId,
}

impl LeaseCapabilities {
    /// Capabilities of store `store_id` derived with `key`.
    pub fn new(key: CapabilityKey, store_id: StoreId) -> LeaseCapabilities {
        LeaseCapabilities { key, store_id }
    }

    /// The store identity.
    pub fn store_id(&self) -> StoreId {
        self.store_id
    }

    /// Checks `presented` for `lease_id` (constant time, no lookup).
    ///
    /// # Errors
    /// [`crate::RuleError::CapabilityMismatch`] when it does not verify,
    /// whether or not the lease exists.
    pub fn check(&self, lease_id: LeaseId, presented: &Capability) -> Result<(), crate::RuleError> {
        if self.key.verify(self.store_id, lease_id, presented) {
            Ok(())
        } else {
            Err(crate::RuleError::CapabilityMismatch)
        }
    }

    /// The checks every store makes on a consolidation request before it
    /// touches storage, in the contract's order: the lease set's shape
    /// ([`crate::rules::check_consolidation_ids`]), the TTL and the
    /// representability of the new expiry, then each capability. Returns the
    /// lease ids in request order.
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidLeaseCount`],
    /// [`crate::RuleError::DuplicateLease`],
    /// [`crate::RuleError::InvalidTtl`],
    /// [`crate::RuleError::UnrepresentableExpiry`],
    /// [`crate::RuleError::DeadlineBeyondHorizon`],
    /// [`crate::RuleError::CapabilityMismatch`].
    pub fn check_consolidation(
        &self,
        policy: &crate::GrantPolicy,
        leases: &[(LeaseId, Capability)],
        ttl: jiff::SignedDuration,
        at: crate::SuppliedTime,
    ) -> Result<Vec<LeaseId>, crate::RuleError> {
        let ids: Vec<LeaseId> = leases.iter().map(|(id, _)| *id).collect();
        crate::rules::check_consolidation_ids(&ids)?;
        policy.grant_expiry(at, ttl)?;
        for (id, cap) in leases {
            self.check(*id, cap)?;
        }
        Ok(ids)
    }

    /// The grant handed to a holder: the lease's fields plus its capability.
    pub fn grant(
        &self,
        lease_id: LeaseId,
        fence: crate::Fence,
        units: i64,
        expiry: jiff::Timestamp,
        granted_ttl: jiff::SignedDuration,
    ) -> crate::Grant {
        crate::Grant {
            lease_id,
            capability: self.key.derive(self.store_id, lease_id),
            fence,
            units,
            expiry,
            granted_ttl,
        }
    }
}
