//! Credentials and the authorization rule.
//!
//! Three kinds of credential travel in `Authorization: Bearer <token>`:
//!
//! * the **admin token** (configuration; generated and printed once in memory
//!   mode when none is configured), compared in constant time on SHA-256
//!   digests so neither content nor length leaks through timing;
//! * **account API keys**, `tga1.` followed by 64 hex digits (256 random
//!   bits), shown once at account creation. The store keeps only their
//!   SHA-256 digest ([`tollgate::NewAccount::api_key_sha256`]); a presented
//!   key is hashed and compared in constant time with
//!   [`tollgate::Allocator::account_key_digest`];
//! * **lease capabilities** (`tgc1.` ...), passed to the store unchanged as
//!   [`tollgate::Capability::from_presented`]; the store verifies them before
//!   any lookup.
//!
//! # The rule
//!
//! A credential authorizes nothing beyond its own account or lease, and a
//! refusal never reveals whether an object exists. In short: 401 when no
//! usable credential was presented, 403 when the presented credential does
//! not authorize *this* object or operation (the same answer whether the
//! object exists or not), 404 only to a caller entitled to know (the admin,
//! or the holder of a lease's valid capability).
//!
//! 1. No `Authorization` header, or not `Bearer <visible ASCII token>`:
//!    **401 `unauthenticated`**, on every protected route, before anything
//!    is looked up.
//! 2. Admin-only routes (account creation, deposits, `/v1/admin/*`): any
//!    token but the admin token gets **403 `forbidden`**. Nothing is looked
//!    up.
//! 3. Account routes (`/v1/accounts/{account_id}`, its leases and
//!    consolidations) need the key *of that account*; reading the account
//!    also accepts the admin token. Any other token gets **403
//!    `forbidden`**, byte for byte the same for an existing and a missing
//!    account: account A's key cannot tell whether B exists. The admin
//!    token on acquire or consolidation (holder operations) is also 403.
//!    Only the admin, who may know, gets 404 `account_not_found` for a
//!    missing account.
//! 4. Lease routes (`/v1/leases/{lease_id}`) need that lease's capability.
//!    A capability of another lease, or any other token, gets **403
//!    `capability_mismatch`**, identical for leases that exist and leases
//!    that do not: the store checks the capability before looking the lease
//!    up. A valid capability of a lease the store does not hold (possible
//!    only after data loss) gets 404 `lease_not_found`.
//!
//! Known limit: checking an account key takes one digest lookup, so the time
//! of a refusal may differ between existing and missing accounts; the body
//! and status do not.

use std::fmt;

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// The prefix of account API keys.
pub const API_KEY_PREFIX: &str = "tga1.";

/// Random bytes in an API key (256 bits).
pub const API_KEY_RANDOM_BYTES: usize = 32;

/// The prefix of generated admin tokens.
pub const ADMIN_TOKEN_PREFIX: &str = "tgadm1.";

/// The shortest admin token accepted from configuration, in bytes: a bound
/// that rules out guessable tokens like `admin`.
pub const ADMIN_TOKEN_MIN_BYTES: usize = 16;

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// 32 random bytes as lowercase hex after `prefix`.
///
/// # Errors
/// When the operating system's random source fails.
pub fn random_token(prefix: &str) -> Result<String, getrandom::Error> {
    let mut b = [0u8; API_KEY_RANDOM_BYTES];
    getrandom::fill(&mut b)?;
    Ok(format!("{prefix}{}", hex::encode(b)))
}

/// A fresh account API key and its SHA-256 digest (what the store keeps).
///
/// # Errors
/// When the operating system's random source fails.
pub fn new_api_key() -> Result<(String, [u8; 32]), getrandom::Error> {
    let key = random_token(API_KEY_PREFIX)?;
    let digest = sha256(key.as_bytes());
    Ok((key, digest))
}

/// Whether `presented` hashes to `digest`, compared in constant time.
pub fn key_matches(presented: &str, digest: &[u8; 32]) -> bool {
    bool::from(sha256(presented.as_bytes()).ct_eq(digest))
}

/// The admin token, kept as its digest. `Debug` is redacted.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

impl AdminToken {
    /// Keeps the digest of `token`.
    pub fn new(token: &str) -> AdminToken {
        AdminToken {
            digest: sha256(token.as_bytes()),
        }
    }

    /// Whether `presented` is the admin token (constant time).
    pub fn matches(&self, presented: &str) -> bool {
        key_matches(presented, &self.digest)
    }
}

/// The bearer token of a request.
///
/// # Errors
/// [`ApiError::Unauthenticated`] when the header is missing, repeated, not
/// `Bearer` (case-insensitive), empty, or not visible ASCII.
pub fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or(ApiError::Unauthenticated)?;
    if values.next().is_some() {
        return Err(ApiError::Unauthenticated);
    }
    let value = value.to_str().map_err(|_| ApiError::Unauthenticated)?;
    let (scheme, token) = value.split_once(' ').ok_or(ApiError::Unauthenticated)?;
    let token = token.trim_start_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::Unauthenticated);
    }
    Ok(token)
}
