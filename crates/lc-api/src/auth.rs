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
//!    without it; **404 `not_found`**, `tenant N not found`, for a tenant
//!    that does not exist, so a mistyped id never reads as an empty
//!    tenant). A tenant key with an `Lc-Tenant` of another tenant is
//!    **403 `forbidden`**. Another tenant's exec is **404 `not_found`**
//!    (`exec N not found`), byte for byte as for an exec that does not
//!    exist.
//! 4. `GET /v1/tenants/{id}`: the admin token, or the key of that tenant;
//!    another tenant's key is **403 `forbidden`**, the same for existing
//!    and missing tenants.
//! 5. A scoped token is judged on each request, before anything else of
//!    it, on one reading of the cut ([`lc_core::token::check_accepted`]):
//!    revoked, **401 `token_revoked`**; the cut uncertain, **503
//!    `time_uncertain`** with `Retry-After` (it cannot be proven
//!    unexpired); a certain cut at or past its deadline, **401
//!    `token_expired`** (its detail says to mint a new one). Accepted, it
//!    acts for its own tenant only (an `Lc-Tenant` of another is 403, as
//!    for a tenant key) and only on the routes [`route_operation`] maps to
//!    an operation it holds: any other route, a missing operation, or a
//!    token bound to exec A on a route of exec B (existing or not) or on
//!    a route across execs (create, list, operation keys) is **403
//!    `forbidden`**, its detail naming the missing operation or the bound
//!    exec. It never mints, lists or revokes tokens, deletes or restores
//!    an exec's workspace or output, reads no tenant and calls no admin
//!    route. The tenant's API key and the admin token hold
//!    every operation ([`Principal::may`]).
//! 6. Approval decisions (`POST /v1/execs/{id}/approve|deny`) act for one
//!    tenant as rule 3, and the credential must be allowed to decide
//!    approvals ([`approval_decider`]): the admin token, the tenant's
//!    own API key, or a scoped token holding `approval.decide` (checked
//!    by rule 5 on these routes; it decides as its tenant).

use std::fmt;

use axum::extract::FromRequestParts;
use axum::extract::MatchedPath;
use axum::http::Method;
use axum::http::request::Parts;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use httpkit::extract::parse_id;
use httpkit::{IdPath, IdempotencyKey, Rejection, bearer};
use lc_core::LcError;
use lc_core::approval::ApproverKind;
use lc_core::model::{Digest, ExecId, OpScope, TenantId};
use lc_core::opkey::OperationKey;
use lc_core::token::{Operation, TokenId, TokenScope};
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

/// A fresh scoped token secret: `lct_` + 43 base64url characters of 32
/// bytes from the operating system's random source.
///
/// # Errors
/// [`ApiError::Internal`] when the random source fails.
pub fn new_token_secret() -> Result<String, ApiError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| ApiError::Internal(format!("random source: {e}")))?;
    Ok(format!(
        "{}{}",
        lc_core::token::TOKEN_PREFIX,
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    ))
}

/// An accepted scoped token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopedToken {
    /// The token.
    pub token_id: TokenId,
    /// Its tenant.
    pub tenant: TenantId,
    /// What it may do.
    pub scope: TokenScope,
}

/// Who presented the credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The admin token.
    Admin,
    /// A tenant's API key.
    Tenant(TenantId),
    /// A scoped token, accepted on the cut (rule 5).
    Token(ScopedToken),
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    /// Any accepted credential; a scoped token only on a route of an
    /// operation it holds.
    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Caller, ApiError> {
        let who = caller(parts, s).await?;
        if let Caller::Token(t) = who {
            check_route(parts, s, &t).await?;
        }
        Ok(who)
    }
}

/// Rule 1 for routes open to tenants: the admin token, a tenant key the
/// store knows, or a scoped token the store knows and accepts at a reading
/// of the cut (rule 5); anything else is 401.
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
    if lc_core::token::looks_like_token(token) {
        let reading = s.reading().await?;
        let accepted = s
            .store()
            .accept_token(Digest(sha256(token.as_bytes())), reading.at)
            .await
            .map_err(|e| match e {
                LcError::TimeUncertain { retry_after_s } => ApiError::TimeUncertain {
                    reason: reading.uncertain,
                    retry_after_secs: retry_after_s.max(reading.at.retry_after_s).max(1),
                },
                other => ApiError::Store(other),
            })?;
        if let Some(t) = accepted {
            return Ok(Caller::Token(ScopedToken {
                token_id: t.token_id,
                tenant: t.tenant_id,
                scope: t.scope()?,
            }));
        }
    }
    Err(ApiError::CredentialRefused)
}

/// The operation a route performs, for scoped tokens: `method` and the
/// router's path template (`/v1/execs/{exec_id}`). `None`: no scoped
/// token may call it (tenants, runtimes import, tokens, service routes).
/// A route added for tenants is closed to tokens until it is listed here.
pub fn route_operation(method: &Method, path: &str) -> Option<Operation> {
    use Operation as O;
    let op = match (method.as_str(), path) {
        ("POST", "/v1/execs") | ("GET", "/v1/runtimes") => O::ExecCreate,
        (
            "GET",
            "/v1/execs"
            | "/v1/execs/{exec_id}"
            | "/v1/execs/{exec_id}/output"
            | "/v1/execs/{exec_id}/milestones",
        ) => O::ExecRead,
        ("GET", "/v1/operations/{key}") => O::ExecRead,
        ("POST", "/v1/execs/{exec_id}/input") => O::ExecInput,
        ("POST", "/v1/execs/{exec_id}/cancel") => O::ExecCancel,
        ("POST", "/v1/execs/{exec_id}/hibernate") => O::ExecHibernate,
        ("POST", "/v1/execs/{exec_id}/resume") => O::ExecResume,
        ("POST", "/v1/execs/{exec_id}/approve" | "/v1/execs/{exec_id}/deny")
        | ("GET", "/v1/approvals") => O::ApprovalDecide,
        ("GET", p)
            if p == "/v1/execs/{exec_id}/workspace"
                || p.starts_with("/v1/execs/{exec_id}/snapshots") =>
        {
            O::WorkspaceRead
        }
        _ => return None,
    };
    Some(op)
}

/// Rule 5's scope check of an accepted token on this request's route: its
/// operation ([`route_operation`]) and the exec the path names. A path
/// exec id that does not parse is left to the route's own 400.
async fn check_route(parts: &mut Parts, s: &AppState, t: &ScopedToken) -> Result<(), ApiError> {
    let path = parts
        .extensions
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let Some(op) = route_operation(&parts.method, &path) else {
        let why = if path.starts_with("/v1/tokens") {
            "tokens are minted, listed and revoked only with the tenant's API key"
        } else {
            "it calls only the routes of its operations"
        };
        return Err(LcError::TokenScope {
            reason: format!("a scoped token may not call {} {path}: {why}", parts.method),
        }
        .into());
    };
    let exec = if path.contains("{exec_id}") {
        let raw = axum::extract::RawPathParams::from_request_parts(parts, s)
            .await
            .ok()
            .and_then(|p| {
                p.iter()
                    .find(|(k, _)| *k == "exec_id")
                    .and_then(|(_, v)| parse_id(v))
            });
        match raw {
            Some(id) => Some(ExecId(id)),
            // Not an id: the route answers 400 invalid_path; only the
            // operation is judged here.
            None => t.scope.exec(),
        }
    } else {
        None
    };
    t.scope.permits(op, exec)?;
    Ok(())
}

/// Who acts for which tenant, with what credential: the tenant a request
/// acts for (as [`Acting`]) without any route check, for a handler that
/// decides the operation itself with [`Principal::may`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Principal {
    /// The tenant acted for.
    pub tenant: TenantId,
    /// The credential presented (`Caller::Admin` acting for `tenant`,
    /// `Caller::Tenant(tenant)`, or a token of `tenant`).
    pub caller: Caller,
}

impl Principal {
    /// Whether this principal may perform `op` on `exec` (`None` for an
    /// operation that names no exec): the admin token and the tenant's API
    /// key always; a scoped token per its scope.
    ///
    /// # Errors
    /// `403 forbidden` naming the missing operation or the bound exec.
    pub fn may(&self, op: Operation, exec: Option<ExecId>) -> Result<(), ApiError> {
        match self.caller {
            Caller::Admin | Caller::Tenant(_) => Ok(()),
            Caller::Token(t) => Ok(t.scope.permits(op, exec)?),
        }
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Principal, ApiError> {
        let who = caller(parts, s).await?;
        let tenant = acting_existing(s, who, tenant_header(parts)?).await?;
        Ok(Principal {
            tenant,
            caller: who,
        })
    }
}

/// Rule 3's tenant of `who` given the `Lc-Tenant` header `named`, which
/// must exist when the admin names it (a tenant key or a token names its
/// own, which exists).
///
/// # Errors
/// As [`acting_tenant`]; `not_found` (`tenant N not found`) for an admin's
/// `Lc-Tenant` of no tenant; storage errors.
async fn acting_existing(
    s: &AppState,
    who: Caller,
    named: Option<TenantId>,
) -> Result<TenantId, ApiError> {
    let tenant = acting_tenant(who, named)?;
    if who == Caller::Admin {
        s.store().tenant(tenant).await?;
    }
    Ok(tenant)
}

/// Rule 3's tenant of `who` given the `Lc-Tenant` header `named`.
fn acting_tenant(who: Caller, named: Option<TenantId>) -> Result<TenantId, ApiError> {
    match (who, named) {
        (Caller::Admin, Some(t)) => Ok(t),
        (Caller::Admin, None) => Err(ApiError::TenantRequired),
        (Caller::Tenant(t), None) => Ok(t),
        (Caller::Tenant(t), Some(n)) if n == t => Ok(t),
        (Caller::Token(t), None) => Ok(t.tenant),
        (Caller::Token(t), Some(n)) if n == t.tenant => Ok(t.tenant),
        (Caller::Tenant(_) | Caller::Token(_), Some(_)) => Err(ApiError::Forbidden),
    }
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

/// Rule 3: the tenant a request acts for (a tenant key's own, a scoped
/// token's own, or the admin's `Lc-Tenant`); a scoped token only on a
/// route of an operation it holds (rule 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acting(pub TenantId);

impl FromRequestParts<AppState> for Acting {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Acting, ApiError> {
        let who = caller(parts, s).await?;
        let tenant = acting_existing(s, who, tenant_header(parts)?).await?;
        if let Caller::Token(t) = who {
            check_route(parts, s, &t).await?;
        }
        Ok(Acting(tenant))
    }
}

/// Rule 6: whether `who`, acting for `tenant`, may decide approvals, and
/// as which kind of approver. The admin token, a tenant's own API key and
/// a scoped token of the tenant (whose `approval.decide` rule 5 already
/// checked on the route) may; [`acting_tenant`] already refused another
/// tenant's credential.
///
/// # Errors
/// [`ApiError::Forbidden`] for a credential of another tenant.
pub fn approval_decider(who: Caller, tenant: TenantId) -> Result<ApproverKind, ApiError> {
    match who {
        Caller::Admin => Ok(ApproverKind::Admin),
        Caller::Tenant(t) if t == tenant => Ok(ApproverKind::Tenant),
        Caller::Token(t) if t.tenant == tenant => Ok(ApproverKind::Tenant),
        Caller::Tenant(_) | Caller::Token(_) => Err(ApiError::Forbidden),
    }
}

/// Rule 6: the tenant an approval decision acts for and who decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Approver {
    /// The tenant acted for.
    pub tenant: TenantId,
    /// Which credential decides.
    pub kind: ApproverKind,
}

impl FromRequestParts<AppState> for Approver {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Approver, ApiError> {
        let who = caller(parts, s).await?;
        let tenant = acting_existing(s, who, tenant_header(parts)?).await?;
        if let Caller::Token(t) = who {
            check_route(parts, s, &t).await?;
        }
        let kind = approval_decider(who, tenant)?;
        Ok(Approver { tenant, kind })
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
        if (who, named) == (Caller::Admin, None) {
            return Ok(Scope(OpScope::Admin));
        }
        let tenant = acting_existing(s, who, named).await?;
        if let Caller::Token(t) = who {
            check_route(parts, s, &t).await?;
        }
        Ok(Scope(OpScope::Tenant(tenant)))
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
            Caller::Token(_) => Err(LcError::TokenScope {
                reason: "a scoped token reads no tenant: its tenant's API key does".into(),
            }
            .into()),
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
    fn scoped_tokens_reach_exactly_the_exec_routes_and_their_runtimes() {
        let doc = crate::api::openapi();
        let mut open = 0;
        for (path, item) in &doc.paths.paths {
            for (method, op) in [
                (Method::GET, &item.get),
                (Method::POST, &item.post),
                (Method::DELETE, &item.delete),
            ] {
                if op.is_none() {
                    continue;
                }
                // Deleting and restoring an exec's data is no operation
                // of the vocabulary: only the tenant's own key does it.
                let deletion = method == Method::DELETE || path.ends_with("/undelete");
                let want = (path.starts_with("/v1/execs") && !deletion)
                    || path.starts_with("/v1/operations/")
                    || (path == "/v1/approvals" && method == Method::GET)
                    || (path == "/v1/runtimes" && method == Method::GET);
                let router_path = path.replace("/files/{path}", "/files/{*path}");
                assert_eq!(
                    route_operation(&method, &router_path).is_some(),
                    want,
                    "{method} {path}"
                );
                open += usize::from(want);
            }
        }
        assert_eq!(open, 18);
        assert_eq!(
            route_operation(&Method::GET, "/v1/execs/{exec_id}/milestones"),
            Some(Operation::ExecRead)
        );
        assert_eq!(
            route_operation(&Method::POST, "/v1/execs/{exec_id}/resume"),
            Some(Operation::ExecResume)
        );
        assert_eq!(
            route_operation(&Method::GET, "/v1/approvals"),
            Some(Operation::ApprovalDecide)
        );
        assert_eq!(
            route_operation(&Method::POST, "/v1/execs/{exec_id}/approve"),
            Some(Operation::ApprovalDecide)
        );
        assert_eq!(route_operation(&Method::POST, "/v1/tokens"), None);
    }

    #[test]
    fn token_secrets_are_shaped() {
        let a = new_token_secret().unwrap();
        assert!(lc_core::token::looks_like_token(&a), "{a}");
        assert!(!looks_like_api_key(&a));
        assert_ne!(a, new_token_secret().unwrap());
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
