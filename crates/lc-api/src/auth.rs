//! Credentials and the authorization rule.
//!
//! Two kinds of credential travel in `Authorization: Bearer <token>`:
//!
//! * the **admin token** (read from a file at start-up; the service keeps
//!   only its SHA-256 digest), compared in constant time on digests so
//!   neither content nor length leaks through timing;
//! * **tenant API keys**, `lc_` followed by 43 base64url characters (256
//!   bits), derived, never stored: `lc_` + base64url(HMAC-SHA-256(server
//!   secret, `"tenant-api-key"` || tenant id as 8 big-endian bytes)). The
//!   creating transaction records the key's digest once the store
//!   assigned the id (the store is handed the derivation). The store
//!   keeps only that SHA-256 digest, to find the tenant of a
//!   presented key; a replayed tenant creation re-derives the same key, so
//!   the service can answer it again without holding any secret per
//!   tenant.
//!
//! # The rule
//!
//! A credential authorizes nothing beyond its own tenant, and a refusal
//! never reveals whether another tenant's object exists:
//!
//! 1. No `Authorization` header, or not `Bearer <visible ASCII token>`:
//!    **401 `unauthenticated`** on every protected route, before anything
//!    is looked up ("a bearer credential is required"); on routes open to
//!    tenants also a token that is neither the admin token nor a known
//!    tenant key, whose detail says the credential was not accepted and
//!    what to check.
//! 2. Admin-only routes (tenant creation, deposits, runtime import): any
//!    token but the admin token gets **403 `forbidden`**; nothing is
//!    looked up.
//! 3. Tenant routes (`/v1/execs...`, `/v1/operations/...`) act for one
//!    tenant: a tenant key for its own tenant; the admin token for the
//!    tenant named by the `Lc-Tenant: N` header (400 `tenant_required`
//!    without it). A tenant key with an `Lc-Tenant` of another tenant is
//!    **403 `forbidden`**. Another tenant's exec is **404 `not_found`**
//!    (`exec N not found`), byte for byte as for an exec that does not
//!    exist.
//! 4. `GET /v1/tenants/{id}`: the admin token, or the key of that tenant;
//!    another tenant's key is **403 `forbidden`**, the same for existing
//!    and missing tenants.

use std::fmt;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use httpkit::extract::parse_id;
use httpkit::{IdPath, IdempotencyKey, Rejection, bearer};
use lc_core::model::{Digest, OpScope, TenantId};
use lc_core::opkey::OperationKey;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::AppState;

/// The prefix of tenant API keys.
pub const API_KEY_PREFIX: &str = "lc_";

/// Characters after the prefix: 32 bytes in unpadded base64url.
pub const API_KEY_BODY_CHARS: usize = 43;

/// The header with which the admin token acts for a tenant.
pub const TENANT_HEADER: &str = "lc-tenant";

/// The shortest admin token accepted, in bytes: rules out guessable tokens
/// such as `admin`.
pub const ADMIN_TOKEN_MIN_BYTES: usize = 16;

/// The shortest server secret accepted, in bytes (256 bits).
pub const SERVER_SECRET_MIN_BYTES: usize = 32;

/// The domain separator of the tenant-key derivation.
const TENANT_KEY_DOMAIN: &[u8] = b"tenant-api-key";

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Whether `presented` hashes to `digest`, compared in constant time.
pub fn key_matches(presented: &str, digest: &[u8; 32]) -> bool {
    bool::from(sha256(presented.as_bytes()).ct_eq(digest))
}

/// Why a credential file's content was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The admin token is shorter than [`ADMIN_TOKEN_MIN_BYTES`] or not
    /// visible ASCII.
    #[error(
        "the admin token must be at least {ADMIN_TOKEN_MIN_BYTES} bytes of visible ASCII, got {len} bytes"
    )]
    AdminToken {
        /// Bytes given (after trailing whitespace was removed).
        len: usize,
    },
    /// The server secret is shorter than [`SERVER_SECRET_MIN_BYTES`].
    #[error("the server secret must be at least {SERVER_SECRET_MIN_BYTES} bytes, got {len}")]
    ServerSecret {
        /// Bytes given (after trailing whitespace was removed).
        len: usize,
    },
}

/// The admin token, kept as its SHA-256 digest. `Debug` is redacted.
#[derive(Clone, Copy)]
pub struct AdminDigest([u8; 32]);

impl fmt::Debug for AdminDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminDigest(<redacted>)")
    }
}

impl AdminDigest {
    /// The digest of an admin token: at least [`ADMIN_TOKEN_MIN_BYTES`] of
    /// visible ASCII (a bearer token cannot carry anything else).
    ///
    /// # Errors
    /// [`CredentialError::AdminToken`] otherwise.
    pub fn of_token(token: &str) -> Result<AdminDigest, CredentialError> {
        if token.len() < ADMIN_TOKEN_MIN_BYTES || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(CredentialError::AdminToken { len: token.len() });
        }
        Ok(AdminDigest(sha256(token.as_bytes())))
    }

    /// A digest computed elsewhere (SHA-256 of the token).
    pub fn from_sha256(digest: [u8; 32]) -> AdminDigest {
        AdminDigest(digest)
    }

    /// Whether `presented` is the admin token (constant time).
    pub fn matches(&self, presented: &str) -> bool {
        key_matches(presented, &self.0)
    }
}

/// The server secret tenant API keys are derived from. `Debug` is
/// redacted.
#[derive(Clone)]
pub struct ServerSecret(Vec<u8>);

impl fmt::Debug for ServerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerSecret(<redacted>)")
    }
}

impl ServerSecret {
    /// A secret of at least [`SERVER_SECRET_MIN_BYTES`] bytes.
    ///
    /// # Errors
    /// [`CredentialError::ServerSecret`] when shorter.
    pub fn new(bytes: &[u8]) -> Result<ServerSecret, CredentialError> {
        if bytes.len() < SERVER_SECRET_MIN_BYTES {
            return Err(CredentialError::ServerSecret { len: bytes.len() });
        }
        Ok(ServerSecret(bytes.to_vec()))
    }

    /// The API key of tenant `tenant_id`: `lc_` + base64url (no padding)
    /// of HMAC-SHA-256(secret, `"tenant-api-key"` || `tenant_id` as 8
    /// big-endian bytes); 46 characters.
    pub fn tenant_api_key(&self, tenant_id: TenantId) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .expect("HMAC accepts a key of any length");
        mac.update(TENANT_KEY_DOMAIN);
        mac.update(&tenant_id.0.to_be_bytes());
        let tag = mac.finalize().into_bytes();
        format!(
            "{API_KEY_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// SHA-256 of [`ServerSecret::tenant_api_key`]: what the store keeps.
    pub fn tenant_api_key_sha256(&self, tenant_id: TenantId) -> [u8; 32] {
        sha256(self.tenant_api_key(tenant_id).as_bytes())
    }
}

/// Whether `token` has the shape of a tenant API key (`lc_` + 43 base64url
/// characters), so that only such tokens cost a store lookup.
pub fn looks_like_api_key(token: &str) -> bool {
    token.strip_prefix(API_KEY_PREFIX).is_some_and(|body| {
        body.len() == API_KEY_BODY_CHARS
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// Content of a credential file: its bytes without trailing ASCII
/// whitespace (so a file written by `echo` works).
pub fn trim_credential(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    &bytes[..end]
}

/// Who presented the credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The admin token.
    Admin,
    /// A tenant's API key.
    Tenant(TenantId),
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Caller, ApiError> {
        caller(parts, s).await
    }
}

/// Rule 1 for routes open to tenants: the admin token, or a tenant key the
/// store knows; anything else is 401.
async fn caller(parts: &Parts, s: &AppState) -> Result<Caller, ApiError> {
    let token = bearer(&parts.headers)?;
    if s.admin().matches(token) {
        return Ok(Caller::Admin);
    }
    if looks_like_api_key(token)
        && let Some(t) = s
            .store()
            .tenant_by_key(Digest(sha256(token.as_bytes())))
            .await?
    {
        return Ok(Caller::Tenant(t));
    }
    Err(ApiError::CredentialRefused)
}

/// The `Lc-Tenant` header, if sent: once, a canonical positive decimal id.
fn tenant_header(parts: &Parts) -> Result<Option<TenantId>, ApiError> {
    let mut values = parts.headers.get_all(TENANT_HEADER).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::InvalidHeader("Lc-Tenant may be sent only once".into()).into());
    }
    let id = v.to_str().ok().and_then(parse_id).ok_or_else(|| {
        Rejection::InvalidHeader(
            "Lc-Tenant must be a tenant id in canonical decimal (1..=9223372036854775807)".into(),
        )
    })?;
    Ok(Some(TenantId(id)))
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

/// Rule 3: the tenant a request acts for (a tenant key's own, or the
/// admin's `Lc-Tenant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acting(pub TenantId);

impl FromRequestParts<AppState> for Acting {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Acting, ApiError> {
        let who = caller(parts, s).await?;
        let named = tenant_header(parts)?;
        match (who, named) {
            (Caller::Admin, Some(t)) => Ok(Acting(t)),
            (Caller::Admin, None) => Err(ApiError::TenantRequired),
            (Caller::Tenant(t), None) => Ok(Acting(t)),
            (Caller::Tenant(t), Some(n)) if n == t => Ok(Acting(t)),
            (Caller::Tenant(_), Some(_)) => Err(ApiError::Forbidden),
        }
    }
}

/// Whose operation keys a request reads: the admin's own without
/// `Lc-Tenant`, else as [`Acting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope(pub OpScope);

impl FromRequestParts<AppState> for Scope {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Scope, ApiError> {
        let who = caller(parts, s).await?;
        let named = tenant_header(parts)?;
        match (who, named) {
            (Caller::Admin, Some(t)) => Ok(Scope(OpScope::Tenant(t))),
            (Caller::Admin, None) => Ok(Scope(OpScope::Admin)),
            (Caller::Tenant(t), None) => Ok(Scope(OpScope::Tenant(t))),
            (Caller::Tenant(t), Some(n)) if n == t => Ok(Scope(OpScope::Tenant(t))),
            (Caller::Tenant(_), Some(_)) => Err(ApiError::Forbidden),
        }
    }
}

/// Rule 4: the path's tenant (400 `invalid_path` first), readable by the
/// admin token or that tenant's key; another tenant's key is 403, the
/// same whether the tenant exists or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantReader(pub TenantId);

impl FromRequestParts<AppState> for TenantReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<TenantReader, ApiError> {
        let IdPath(id) = IdPath::parse(parts).await?;
        match caller(parts, s).await? {
            Caller::Admin => Ok(TenantReader(TenantId(id))),
            Caller::Tenant(t) if t.0 == id => Ok(TenantReader(t)),
            Caller::Tenant(_) => Err(ApiError::Forbidden),
        }
    }
}

/// The required `Idempotency-Key` of a POST: 400
/// `idempotency_key_required` when missing, 400 `invalid_operation_key`
/// when not 1 to 255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequiredKey(pub String);

impl RequiredKey {
    /// The operation key of this request: the key with the SHA-256 of the
    /// JCS canonical JSON of `{"op": op, "tenant": tenant, "request":
    /// request}` (the parsed request, so spelling, member order and
    /// whitespace of the body do not matter).
    ///
    /// # Errors
    /// [`ApiError::Internal`] when the request cannot be serialized (none
    /// of the service's request shapes can fail).
    pub fn operation<T: serde::Serialize>(
        &self,
        op: &str,
        tenant: Option<TenantId>,
        request: &T,
    ) -> Result<OperationKey, ApiError> {
        let canonical = serde_jcs::to_vec(&serde_json::json!({
            "op": op,
            "tenant": tenant.map(|t| t.0),
            "request": request,
        }))
        .map_err(|e| ApiError::Internal(format!("canonical request: {e}")))?;
        Ok(OperationKey::new(
            self.0.clone(),
            Digest(sha256(&canonical)),
        )?)
    }
}

impl FromRequestParts<AppState> for RequiredKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<RequiredKey, ApiError> {
        let IdempotencyKey(key) = IdempotencyKey::from_request_parts(parts, s).await?;
        let key = key.ok_or(ApiError::IdempotencyKeyRequired)?;
        OperationKey::new(key.clone(), Digest([0; 32]))?;
        Ok(RequiredKey(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_keys_are_derived_and_shaped() {
        let s = ServerSecret::new(&[7u8; 32]).expect("secret");
        let k1 = s.tenant_api_key(TenantId(1));
        assert_eq!(k1.len(), 46);
        assert!(looks_like_api_key(&k1), "{k1}");
        assert_eq!(k1, s.tenant_api_key(TenantId(1)));
        assert_ne!(k1, s.tenant_api_key(TenantId(2)));
        let other = ServerSecret::new(&[8u8; 32]).expect("secret");
        assert_ne!(k1, other.tenant_api_key(TenantId(1)));
        assert_eq!(s.tenant_api_key_sha256(TenantId(1)), sha256(k1.as_bytes()));
        assert!(key_matches(&k1, &s.tenant_api_key_sha256(TenantId(1))));
        // The exact derivation, recomputed independently.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&[7u8; 32]).unwrap();
        mac.update(b"tenant-api-key\0\0\0\0\0\0\0\x01");
        let want =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        assert_eq!(k1, format!("lc_{want}"));
    }

    #[test]
    fn key_shapes() {
        assert!(!looks_like_api_key("lc_"));
        assert!(!looks_like_api_key(&format!("lc_{}", "a".repeat(42))));
        assert!(looks_like_api_key(&format!("lc_{}", "a".repeat(43))));
        assert!(!looks_like_api_key(&format!("lc_{}", "a".repeat(44))));
        assert!(!looks_like_api_key(&format!("lc_{}=", "a".repeat(42))));
        assert!(!looks_like_api_key(&format!("tga1.{}", "a".repeat(43))));
    }

    #[test]
    fn credentials_are_checked() {
        assert_eq!(
            ServerSecret::new(&[1u8; 31]).unwrap_err(),
            CredentialError::ServerSecret { len: 31 }
        );
        assert_eq!(
            AdminDigest::of_token("short").unwrap_err(),
            CredentialError::AdminToken { len: 5 }
        );
        assert!(AdminDigest::of_token("has a space in it!!").is_err());
        let a = AdminDigest::of_token("lcadm-0123456789abcdef").expect("token");
        assert!(a.matches("lcadm-0123456789abcdef"));
        assert!(!a.matches("lcadm-0123456789abcde"));
        assert_eq!(format!("{a:?}"), "AdminDigest(<redacted>)");
        assert_eq!(trim_credential(b"tok\n \r\n"), b"tok");
        assert_eq!(trim_credential(b" \n"), b"");
    }
}
