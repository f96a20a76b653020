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
//!
//! # Extractors
//!
//! The rule is applied by typed extractors, before the body is read, so a
//! refused credential never meets a body error: [`Admin`] (rule 2),
//! [`AccountHolder`] and [`AccountReader`] (rule 3), [`LeaseCapability`]
//! (rule 4, checked by the store). Rule 1 is [`bearer`], which each uses.

use std::fmt;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use httpkit::IdPath;
pub use httpkit::bearer;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tollgate::{AccountId, AllocatorError, Capability, RuleError};

use crate::error::ApiError;
use crate::state::AppState;

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

/// Rule 2: the admin token. Anything else is 403 `forbidden`; nothing is
/// looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Admin, ApiError> {
        if s.admin().matches(bearer(&parts.headers)?) {
            Ok(Admin)
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// Rule 3 for a holder operation (acquire, consolidation): the path's
/// account, authorized by that account's key alone (the admin token too is
/// 403).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountHolder(pub AccountId);

impl FromRequestParts<AppState> for AccountHolder {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        s: &AppState,
    ) -> Result<AccountHolder, ApiError> {
        authorize_account(parts, s, false).await.map(AccountHolder)
    }
}

/// Rule 3 for reading an account: the path's account, authorized by its
/// key or the admin token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountReader(pub AccountId);

impl FromRequestParts<AppState> for AccountReader {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        s: &AppState,
    ) -> Result<AccountReader, ApiError> {
        authorize_account(parts, s, true).await.map(AccountReader)
    }
}

/// Rule 3: the path's account id (400 `invalid_path` first), then the key
/// of that account (or, when `allow_admin`, the admin token). Anything else
/// is 403, the same for an existing and a missing account.
async fn authorize_account(
    parts: &mut Parts,
    s: &AppState,
    allow_admin: bool,
) -> Result<AccountId, ApiError> {
    let IdPath(id) = IdPath::parse(parts).await?;
    let account_id = AccountId(id);
    let token = bearer(&parts.headers)?;
    if s.admin().matches(token) {
        return if allow_admin {
            Ok(account_id)
        } else {
            Err(ApiError::Forbidden)
        };
    }
    match s.store().allocator.account_key_digest(account_id).await {
        Ok(Some(digest)) if key_matches(token, &digest) => Ok(account_id),
        Ok(_) | Err(AllocatorError::Rule(RuleError::AccountNotFound { .. })) => {
            Err(ApiError::Forbidden)
        }
        Err(e) => Err(e.into()),
    }
}

/// Rule 4: the bearer credential as a lease capability, unverified: the
/// store verifies it before any lookup (403 `capability_mismatch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCapability(pub Capability);

impl FromRequestParts<AppState> for LeaseCapability {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &AppState,
    ) -> Result<LeaseCapability, ApiError> {
        Ok(LeaseCapability(Capability::from_presented(bearer(
            &parts.headers,
        )?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_and_admin_tokens() {
        let (key, digest) = new_api_key().expect("random");
        assert!(key.starts_with("tga1.") && key.len() == 69);
        assert!(key_matches(&key, &digest));
        assert!(!key_matches(&key[..68], &digest));
        let (key2, _) = new_api_key().expect("random");
        assert_ne!(key, key2);
        let admin = AdminToken::new("tgadm1.some-admin-token");
        assert!(admin.matches("tgadm1.some-admin-token"));
        assert!(!admin.matches("tgadm1.some-admin-toke"));
        assert_eq!(format!("{admin:?}"), "AdminToken(<redacted>)");
    }
}
