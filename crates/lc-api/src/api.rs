//! The HTTP API: handlers, the router, and the OpenAPI document generated
//! from the same registrations.
//!
//! [`router`] builds the whole service (tests drive it with
//! `tower::ServiceExt::oneshot`, no sockets). Each handler's signature
//! lists its checks in order, as typed extractors: the path id
//! ([`httpkit::IdPath`]), the credential ([`crate::auth`]), the
//! `Idempotency-Key` ([`RequiredKey`]), the query, then the body
//! ([`httpkit::JsonBody`]). Its body reads the clock once, calls the one
//! [`ControlStore`](lc_core::store::ControlStore) method of its operation
//! (after a read where the route needs one: the exec before its output,
//! the workspace's head before a resume that names none, a snapshot's
//! manifest before its file) and maps the result to a DTO
//! ([`crate::dto`]) or an [`ApiError`]. No handler decides a rule; the
//! core and the store do.
//!
//! Time: every mutating call reads the cut once and hands the store that
//! reading, certain or not. Exec admission needs a *certain* one: the store
//! answers a replay of a recorded admission with its result whatever the
//! certainty, and refuses a new one on an uncertain reading inside the
//! admitting transaction, which then writes nothing; the API answers that
//! refusal `503 time_uncertain` with `Retry-After` and the reason it read.
//!
//! Idempotency: every POST carries an `Idempotency-Key`; the store records
//! it with the SHA-256 of the canonical request ([`RequiredKey::operation`])
//! and the result, returns that result on a replay and refuses the key
//! with another request (`409 idempotency_conflict`). A replayed tenant
//! creation re-derives the same API key from the server secret.

use std::sync::OnceLock;

use axum::body::{Bytes, HttpBody as _};
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use clock::TELEMETRY_READ_MAX;
use httpkit::{IdPath, JsonBody, OptionalJsonBody, Rejection};
use lc_blob::{BlobError, BlobStore};
use lc_core::LcError;
use lc_core::OutputPage;
use lc_core::approval::{ApprovalPolicy, ApprovalRequire};
use lc_core::deletion::DeletedItem;
use lc_core::model::{Digest, ExecId, ExecRequest, OnTimeout, TenantId};
use lc_core::opkey::OperationKey;
use lc_core::owner::StoredPage;
use lc_core::snapshot::{EntryKind, Manifest};
use lc_core::token::{TokenId, TokenScope};
use serde::de::DeserializeOwned;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{Acting, Admin, Approver, RequiredKey, Scope, TenantReader};
use crate::dto::*;
use crate::error::ApiError;
use crate::runtime;
pub use crate::state::{
    AppState, JSON_BODY_MAX_BYTES, REQUEST_TIMEOUT_DEFAULT, RUNTIME_TAR_BYTES_MAX, ServiceOptions,
};

/// Default `limit` of `GET /v1/execs`.
pub const EXEC_LIST_DEFAULT: usize = 100;

/// Default and largest `limit` of `GET /v1/execs/{id}/output`: 64 pages of
/// at most 64 KiB are at most 4 MiB of bytes (5.4 MiB as base64) per
/// answer.
pub const OUTPUT_PAGES_MAX: usize = 64;

/// The media type of a runtime tarball.
pub const TAR_CONTENT_TYPE: &str = "application/x-tar";

/// A query string of shape `T`; anything else is 400 `invalid_query`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Q<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<AppState> for Q<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Q<T>, ApiError> {
        match Query::<T>::from_request_parts(parts, s).await {
            Ok(Query(v)) => Ok(Q(v)),
            Err(e) => Err(ApiError::InvalidQuery(e.body_text())),
        }
    }
}

// ---------------------------------------------------------------- handlers

/// Creates a tenant (admin): its Tollgate account, `units` deposited when
/// given, and its API key.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants",
    params(("Idempotency-Key" = String, Header, description = "Required: a replay with the same body returns the same tenant and key")),
    request_body = CreateTenantBody,
    responses((status = 201, description = "The tenant and its API key", body = CreatedTenant)),
    security(("bearer" = [])))]
async fn create_tenant(
    State(s): State<AppState>,
    _: Admin,
    key: RequiredKey,
    JsonBody(req): JsonBody<CreateTenantBody>,
) -> Result<(StatusCode, Json<CreatedTenant>), ApiError> {
    let op = key.operation("create_tenant", None, &req)?;
    let at = s.reading().await?.at;
    let secret = s.secret().clone();
    let derive = move |id: TenantId| Digest(secret.tenant_api_key_sha256(id));
    let tenant = s
        .store()
        .create_tenant(&op, at, &req.name, req.units, &derive)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedTenant {
            tenant_id: tenant.tenant_id.0,
            api_key: s.secret().tenant_api_key(tenant.tenant_id),
            name: tenant.name,
        }),
    ))
}

/// Deposits units into a tenant (admin).
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/deposits", tag = "tenants",
    params(
        ("tenant_id" = i64, Path, minimum = 1, description = "The tenant"),
        ("Idempotency-Key" = String, Header, description = "Required"),
    ),
    request_body = DepositBody,
    responses((status = 200, description = "The tenant after the deposit", body = TenantView)),
    security(("bearer" = [])))]
async fn deposit(
    State(s): State<AppState>,
    _: Admin,
    IdPath(tenant_id): IdPath,
    key: RequiredKey,
    JsonBody(req): JsonBody<DepositBody>,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = TenantId(tenant_id);
    let op = key.operation("deposit", Some(tenant), &req)?;
    let at = s.reading().await?.at;
    let t = s.store().deposit(&op, at, tenant, req.units).await?;
    Ok(Json(t.into()))
}

/// A tenant and its balances (admin, or the tenant's own key).
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}", tag = "tenants",
    params(("tenant_id" = i64, Path, minimum = 1, description = "The tenant")),
    responses((status = 200, description = "The tenant", body = TenantView)),
    security(("bearer" = [])))]
async fn get_tenant(
    State(s): State<AppState>,
    TenantReader(tenant): TenantReader,
) -> Result<Json<TenantView>, ApiError> {
    Ok(Json(s.store().tenant(tenant).await?.into()))
}

/// Sets a tenant's approval policy (admin): which of its later execs wait
/// in `awaiting_approval`, holding no units, until an approver approves
/// them. `require` is `off`, `network`, `all` or `shapes` (with the shape
/// names). Execs already awaiting keep waiting.
#[utoipa::path(put, path = "/v1/tenants/{tenant_id}/approval-policy", tag = "approvals",
    params(
        ("tenant_id" = i64, Path, minimum = 1, description = "The tenant"),
        ("Idempotency-Key" = String, Header, description = "Required"),
    ),
    request_body = ApprovalPolicyView,
    responses((status = 200, description = "The tenant with its policy", body = TenantView)),
    security(("bearer" = [])))]
async fn set_approval_policy(
    State(s): State<AppState>,
    _: Admin,
    IdPath(tenant_id): IdPath,
    key: RequiredKey,
    JsonBody(req): JsonBody<ApprovalPolicyView>,
) -> Result<Json<TenantView>, ApiError> {
    let tenant = TenantId(tenant_id);
    let require =
        ApprovalRequire::parse(&req.require).ok_or_else(|| LcError::InvalidApprovalPolicy {
            reason: format!(
                "require is `off`, `network`, `all` or `shapes`, not {:?}",
                req.require.chars().take(64).collect::<String>()
            ),
        })?;
    let policy = ApprovalPolicy::new(require, &req.shapes)?;
    let op = key.operation("set_approval_policy", Some(tenant), &req)?;
    let at = s.reading().await?.at;
    let t = s
        .store()
        .set_approval_policy(&op, at, tenant, &policy)
        .await?;
    Ok(Json(t.into()))
}

/// The acting tenant's execs awaiting approval (oldest first) and its
/// newest approval decisions.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals",
    params(
        ApprovalListQuery,
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "Awaiting execs and decisions", body = ApprovalList)),
    security(("bearer" = [])))]
async fn list_approvals(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    Q(q): Q<ApprovalListQuery>,
) -> Result<Json<ApprovalList>, ApiError> {
    let limit = q.limit.unwrap_or(EXEC_LIST_DEFAULT);
    let limit = lc_core::rules::check_limit(limit, lc_core::rules::LIST_LIMIT_MAX)?;
    Ok(Json(s.store().approvals(tenant, limit).await?.into()))
}

/// Approves an exec of the acting tenant awaiting approval (the admin
/// token with `Lc-Tenant`, or the tenant's own key), on the certain cut
/// read now: the rest of its admission (its Reservation and its Lease)
/// happens at once, and it may start only while a certain cut is below
/// `valid_until` (decided cut + `validity_ms`), else it ends
/// `approval_expired`. A replay of the key returns the same exec.
/// Refusals (nothing written): `503 time_uncertain`, `409
/// exec_not_awaiting_approval`, `409 insufficient_capacity` (it keeps
/// awaiting), `422 invalid_validity`, `404 not_found`.
#[utoipa::path(post, path = "/v1/execs/{exec_id}/approve", tag = "approvals",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same exec"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    request_body(content = Option<ApproveBody>, description = "Optional: the approval's validity"),
    responses((status = 200, description = "The admitted exec with its approval", body = ExecView)),
    security(("bearer" = [])))]
async fn approve_exec(
    State(s): State<AppState>,
    approver: Approver,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
    OptionalJsonBody(req): OptionalJsonBody<ApproveBody>,
) -> Result<Json<ExecView>, ApiError> {
    let validity_ms = req.and_then(|r| r.validity_ms);
    let op = key.operation(
        "approve_exec",
        Some(approver.tenant),
        &serde_json::json!({ "exec_id": exec_id, "validity_ms": validity_ms }),
    )?;
    let reading = s.reading().await?;
    let exec = s
        .store()
        .approve(
            &op,
            reading.at,
            approver.tenant,
            ExecId(exec_id),
            approver.kind,
            validity_ms,
        )
        .await
        .map_err(|e| s.refused_admission(e, reading))?;
    Ok(Json(exec.into()))
}

/// Denies an exec of the acting tenant awaiting approval: it ends
/// `denied`, having held no units. A replay of the key returns the same
/// exec. Refusals (nothing written): `503 time_uncertain`, `409
/// exec_not_awaiting_approval`, `422 invalid_name` (a reason over 512
/// bytes), `404 not_found`.
#[utoipa::path(post, path = "/v1/execs/{exec_id}/deny", tag = "approvals",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same exec"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    request_body(content = Option<DenyBody>, description = "Optional: why"),
    responses((status = 200, description = "The denied exec", body = ExecView)),
    security(("bearer" = [])))]
async fn deny_exec(
    State(s): State<AppState>,
    approver: Approver,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
    OptionalJsonBody(req): OptionalJsonBody<DenyBody>,
) -> Result<Json<ExecView>, ApiError> {
    let reason = req.and_then(|r| r.reason);
    let op = key.operation(
        "deny_exec",
        Some(approver.tenant),
        &serde_json::json!({ "exec_id": exec_id, "reason": reason }),
    )?;
    let at = s.reading().await?.at;
    let exec = s
        .store()
        .deny(
            &op,
            at,
            approver.tenant,
            ExecId(exec_id),
            approver.kind,
            reason.as_deref(),
        )
        .await?;
    Ok(Json(exec.into()))
}

/// Imports a runtime from a tarball (admin): validated, unpacked into the
/// content-addressed runtime directory, registered under `name`.
#[utoipa::path(post, path = "/v1/runtimes", tag = "runtimes",
    params(
        RuntimeQuery,
        ("Idempotency-Key" = String, Header, description = "Required"),
    ),
    request_body(content = Vec<u8>, content_type = "application/x-tar", description = "The root filesystem tree as a tar archive"),
    responses((status = 201, description = "The runtime", body = RuntimeView)),
    security(("bearer" = [])))]
async fn import_runtime(
    State(s): State<AppState>,
    _: Admin,
    key: RequiredKey,
    Q(q): Q<RuntimeQuery>,
    req: Request,
) -> Result<(StatusCode, Json<RuntimeView>), ApiError> {
    let is_tar = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|e| e.trim().eq_ignore_ascii_case(TAR_CONTENT_TYPE))
        });
    if !is_tar {
        return Err(ApiError::TarRequired);
    }
    let body = Bytes::from_request(req, &s)
        .await
        .map_err(|_| Rejection::PayloadTooLarge {
            limit_bytes: RUNTIME_TAR_BYTES_MAX,
        })?;
    lc_core::rules::check_runtime_name(&q.name)?;
    let tar_sha256 = hex::encode(crate::auth::sha256(&body));
    let op = key.operation(
        "register_runtime",
        None,
        &serde_json::json!({ "name": q.name, "tar_sha256": tar_sha256 }),
    )?;
    let dir = s
        .options()
        .runtime_dir
        .clone()
        .ok_or(ApiError::RuntimeImportDisabled)?;
    let at = s.reading().await?.at;
    let imported = runtime::import_tar(&dir, body).await?;
    let r = s
        .store()
        .register_runtime(&op, at, &q.name, imported.digest, imported.manifest)
        .await?;
    Ok((StatusCode::CREATED, Json(r.into())))
}

/// Every registered runtime (any credential).
#[utoipa::path(get, path = "/v1/runtimes", tag = "runtimes",
    responses((status = 200, description = "The runtimes, by name", body = RuntimeList)),
    security(("bearer" = [])))]
async fn list_runtimes(
    State(s): State<AppState>,
    _: crate::auth::Caller,
) -> Result<Json<RuntimeList>, ApiError> {
    let runtimes = s.store().runtimes().await?;
    Ok(Json(RuntimeList {
        runtimes: runtimes.into_iter().map(Into::into).collect(),
    }))
}

/// Admits an exec for the acting tenant: in one transaction the exec with
/// its canonical identity, attempt 1, a Reservation of the shape's units
/// and Lease generation 1. Needs a certain cut (503 `time_uncertain`
/// otherwise; a replay of a recorded admission still answers its result);
/// `409 insufficient_capacity` when the units are not available; `429
/// rate_limited` with `Retry-After` when the tenant already made its most
/// admissions in the current window. Nothing is written on any refusal.
#[utoipa::path(post, path = "/v1/execs", tag = "execs",
    params(
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same exec"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    request_body = CreateExecBody,
    responses((status = 201, description = "The admitted exec", body = ExecView)),
    security(("bearer" = [])))]
async fn create_exec(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    key: RequiredKey,
    JsonBody(req): JsonBody<CreateExecBody>,
) -> Result<(StatusCode, Json<ExecView>), ApiError> {
    let on_timeout = match req.on_timeout.as_deref() {
        None => OnTimeout::Terminate,
        Some(t) => OnTimeout::parse(t).ok_or_else(|| LcError::InvalidTimeout {
            reason: format!("on_timeout is `terminate` or `hibernate`, not {t:?}"),
        })?,
    };
    let op = key.operation("admit_exec", Some(tenant), &req)?;
    let reading = s.reading().await?;
    let exec = s
        .store()
        .admit_exec(
            &op,
            reading.at,
            tenant,
            &ExecRequest {
                runtime: req.runtime,
                shape: req.shape,
                command: req.command,
                timeout_ms: req.timeout_ms,
                stdin_open: req.stdin_open,
                idle_ttl_ms: req.idle_ttl_ms,
                on_timeout,
            },
        )
        .await
        .map_err(|e| match e {
            // A runtime the body names but the store lacks is a bad body,
            // not a missing resource of this route.
            LcError::NotFound {
                what: "runtime",
                id,
            } => LcError::InvalidRuntime {
                reason: format!("no runtime is registered as {id}"),
            },
            other => other,
        })
        .map_err(|e| s.refused_admission(e, reading))?;
    Ok((StatusCode::CREATED, Json(exec.into())))
}

/// One exec of the acting tenant (404 for another tenant's).
#[utoipa::path(get, path = "/v1/execs/{exec_id}", tag = "execs",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The exec", body = ExecView)),
    security(("bearer" = [])))]
async fn get_exec(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
) -> Result<Json<ExecView>, ApiError> {
    Ok(Json(s.store().exec(tenant, ExecId(exec_id)).await?.into()))
}

/// The acting tenant's execs, ascending by id.
#[utoipa::path(get, path = "/v1/execs", tag = "execs",
    params(
        ExecListQuery,
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "A page of execs", body = ExecList)),
    security(("bearer" = [])))]
async fn list_execs(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    Q(q): Q<ExecListQuery>,
) -> Result<Json<ExecList>, ApiError> {
    let limit = q.limit.unwrap_or(EXEC_LIST_DEFAULT);
    let limit = lc_core::rules::check_limit(limit, lc_core::rules::LIST_LIMIT_MAX)?;
    let after = match q.after {
        Some(a) if a < 0 => {
            return Err(ApiError::InvalidQuery(format!(
                "after must be at least 0, got {a}"
            )));
        }
        a => a.map(ExecId),
    };
    let execs = s.store().execs(tenant, after, limit).await?;
    let next_after = (execs.len() == limit)
        .then(|| execs.last().map(|e| e.exec_id.0))
        .flatten();
    Ok(Json(ExecList {
        execs: execs.into_iter().map(Into::into).collect(),
        next_after,
    }))
}

/// Output pages of the exec's current attempt after `after_seq`, readable
/// while it runs. A stopped page ends one generation (the exec
/// hibernated), not the exec: `terminal` stays `false`, `stopped` says so
/// while it is parked, and the resumed generation's pages follow it in
/// seq order. `terminal` is exact: [`lc_core::rules::output_end`].
#[utoipa::path(get, path = "/v1/execs/{exec_id}/output", tag = "execs",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        OutputQuery,
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "Pages, in order", body = OutputView)),
    security(("bearer" = [])))]
async fn exec_output(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    Q(q): Q<OutputQuery>,
) -> Result<Json<OutputView>, ApiError> {
    let after_seq = q.after_seq.unwrap_or(0);
    // The answer's `next_seq` is at most `after_seq + 1`, so that must be
    // an i64 too.
    if !(0..i64::MAX).contains(&after_seq) {
        return Err(ApiError::InvalidQuery(format!(
            "after_seq must be in 0..={}, got {after_seq}",
            i64::MAX - 1
        )));
    }
    let limit = lc_core::rules::check_limit(q.limit.unwrap_or(OUTPUT_PAGES_MAX), OUTPUT_PAGES_MAX)?;
    // The exec first: 404 for another tenant's, and its state says whether
    // an empty answer is the end.
    let exec = s.store().exec(tenant, ExecId(exec_id)).await?;
    // One page past the limit says whether pages follow the answer.
    let mut pages = s
        .store()
        .output(tenant, ExecId(exec_id), after_seq, limit + 1)
        .await?;
    let more = pages.len() > limit;
    pages.truncate(limit);
    let next_seq = pages.last().map_or(after_seq, |p| p.meta.seq) + 1;
    // The exec was read first: once it is terminal no page is added, so a
    // page set read after it is final.
    let end = lc_core::rules::output_end(exec.state, pages.last().map(|p| p.meta.kind), more);
    let (terminal, stopped) = (end.terminal, end.stopped);
    let sink = s.options().sink.clone();
    let pages = tokio::task::spawn_blocking(move || {
        pages
            .into_iter()
            .map(|p| page_bytes(sink.as_deref(), p).map(PageView::from))
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the output reader failed: {e}")))??;
    Ok(Json(OutputView {
        pages,
        terminal,
        stopped,
        next_seq,
    }))
}

/// The page with its bytes: the store's (rows written before the sink held
/// output), else the sink's under the page's SHA-256, verified by the sink
/// and checked against the page's length. Blocking file I/O.
fn page_bytes(sink: Option<&dyn BlobStore>, p: StoredPage) -> Result<OutputPage, ApiError> {
    let seq = p.meta.seq;
    let bytes = match p.bytes {
        Some(bytes) => bytes,
        None => {
            let sink = sink.ok_or_else(|| ApiError::Sink {
                code: "sink_unavailable",
                seq,
                message: "this server was started without --blob-dir".into(),
            })?;
            match sink.get(&p.meta.sha256) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => {
                    return Err(ApiError::Sink {
                        code: "blob_missing",
                        seq,
                        message: format!("no blob {} in the sink", p.meta.sha256),
                    });
                }
                Err(e @ BlobError::Corrupt { .. }) => {
                    return Err(ApiError::Sink {
                        code: "blob_corrupt",
                        seq,
                        message: e.to_string(),
                    });
                }
                Err(e) => {
                    return Err(ApiError::Sink {
                        code: "sink_unavailable",
                        seq,
                        message: e.to_string(),
                    });
                }
            }
        }
    };
    if usize::try_from(p.meta.length).ok() != Some(bytes.len())
        || Digest::of(&bytes) != p.meta.sha256
    {
        return Err(ApiError::Sink {
            code: "blob_corrupt",
            seq,
            message: format!(
                "{} bytes hashing to {} do not match the page's {} bytes and digest {}",
                bytes.len(),
                Digest::of(&bytes),
                p.meta.length,
                p.meta.sha256
            ),
        });
    }
    Ok(OutputPage {
        exec_id: p.meta.exec_id,
        attempt: p.meta.attempt,
        seq,
        kind: p.meta.kind,
        bytes,
        sha256: p.meta.sha256,
        exit: p.meta.exit,
    })
}

/// Asks to cancel an exec of the acting tenant (a terminal one is returned
/// as it is).
#[utoipa::path(post, path = "/v1/execs/{exec_id}/cancel", tag = "execs",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The exec", body = ExecView)),
    security(("bearer" = [])))]
async fn cancel_exec(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
) -> Result<Json<ExecView>, ApiError> {
    let op = key.operation(
        "cancel",
        Some(tenant),
        &serde_json::json!({ "exec_id": exec_id }),
    )?;
    let at = s.reading().await?.at;
    let exec = s.store().cancel(&op, at, tenant, ExecId(exec_id)).await?;
    Ok(Json(exec.into()))
}

/// Asks to hibernate a running exec of the acting tenant: seals a
/// hibernation of its current generation (reason `requested`) at the
/// certain cut read now; its gateway then stops the command (a `stopped`
/// page ends the generation's output), the provider snapshots the
/// workspace, and the exec becomes `hibernated` with its units returned.
/// A replay of the key returns the record as it is now. Refusals (nothing
/// written): `503 time_uncertain`, `409 exec_terminal`, `409
/// exec_not_hibernatable` (not running with an active Lease), `409
/// hibernation_in_progress` (another key sealed one of this generation),
/// `404 not_found`.
#[utoipa::path(post, path = "/v1/execs/{exec_id}/hibernate", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same hibernation, as it is now"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 202, description = "The sealed hibernation", body = HibernationView)),
    security(("bearer" = [])))]
async fn hibernate_exec(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
) -> Result<(StatusCode, Json<HibernationView>), ApiError> {
    let op = key.operation(
        "hibernate",
        Some(tenant),
        &serde_json::json!({ "exec_id": exec_id }),
    )?;
    let at = s.reading().await?.at;
    let h = s
        .store()
        .request_hibernation(&op, at, tenant, ExecId(exec_id))
        .await?;
    Ok((StatusCode::ACCEPTED, Json(h.into())))
}

/// Asks to resume a hibernated exec of the acting tenant from `head`
/// (absent: the workspace's current head): records the request, which the
/// exec's gateway carries out (a new generation restores the snapshot and
/// the exec runs again; its `resume` then shows the receipt). The request
/// digest is the SHA-256 of the JCS of `{"exec_id", "head"}` (`head` null
/// when the body names none); a replay of the key with the same body
/// returns the recorded request, whatever the workspace's head is by
/// then. Refusals (nothing written): `409 exec_not_parked` (not
/// hibernated, or its sandbox not yet destroyed), `409 exec_terminal`,
/// `409 workspace_head_mismatch` (`head` is not the workspace's head),
/// `409 resume_in_progress` (another request is pending: one resume at a
/// time), `409 insufficient_capacity` (the tenant's available units are
/// fewer than the exec's), `422 invalid_digest`, `404 not_found`.
#[utoipa::path(post, path = "/v1/execs/{exec_id}/resume", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same request"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    request_body(content = Option<ResumeBody>, description = "Optional: the head to resume from"),
    responses((status = 202, description = "The recorded resume request", body = ResumeIntentView)),
    security(("bearer" = [])))]
async fn resume_exec(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
    OptionalJsonBody(req): OptionalJsonBody<ResumeBody>,
) -> Result<(StatusCode, Json<ResumeIntentView>), ApiError> {
    let exec = ExecId(exec_id);
    let head = req
        .and_then(|r| r.head)
        .map(|h| Digest::from_hex(&h))
        .transpose()?;
    let op = OperationKey::new(
        key.0.clone(),
        lc_core::hibernate::resume_request_sha256(exec, head),
    )?;
    let at = s.reading().await?.at;
    let intent = s
        .store()
        .request_resume(&op, at, tenant, exec, head)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(intent.into())))
}

/// The workspace of the acting tenant's exec: its head and how many
/// snapshots its chain holds.
#[utoipa::path(get, path = "/v1/execs/{exec_id}/workspace", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The workspace", body = WorkspaceView)),
    security(("bearer" = [])))]
async fn get_workspace(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
) -> Result<Json<WorkspaceView>, ApiError> {
    Ok(Json(
        s.store().workspace(tenant, ExecId(exec_id)).await?.into(),
    ))
}

/// Deletes or undeletes `item` of the acting tenant's exec: one store call
/// on one reading of the cut, under the request's key.
async fn deletion_call(
    s: &AppState,
    tenant: TenantId,
    exec_id: i64,
    key: RequiredKey,
    item: DeletedItem,
    undo: bool,
) -> Result<Json<DeletionView>, ApiError> {
    let kind = match (item, undo) {
        (DeletedItem::Workspace, false) => "delete_workspace",
        (DeletedItem::Workspace, true) => "undelete_workspace",
        (DeletedItem::Output, false) => "delete_output",
        (DeletedItem::Output, true) => "undelete_output",
    };
    let op = key.operation(
        kind,
        Some(tenant),
        &serde_json::json!({ "exec_id": exec_id }),
    )?;
    let at = s.reading().await?.at;
    let d = if undo {
        s.store()
            .undelete_item(&op, at, tenant, ExecId(exec_id), item)
            .await?
    } else {
        s.store()
            .delete_item(&op, at, tenant, ExecId(exec_id), item)
            .await?
    };
    Ok(Json(d.into()))
}

/// Deletes the workspace of the acting tenant's terminal exec: its
/// snapshots are kept for the deletion grace (`purge_after` = the certain
/// cut read now + the grace) and restorable with `POST
/// .../workspace/undelete` until a worker purges them once a certain cut
/// reaches `purge_after`. Meanwhile its reads answer `410
/// workspace_deleted`. A workspace already deleted answers its deletion
/// unchanged. Refusals (nothing written): `409 exec_not_terminal` (cancel
/// the exec and wait for it to end), `503 time_uncertain`, `410
/// workspace_purged`, `404 not_found`.
#[utoipa::path(delete, path = "/v1/execs/{exec_id}/workspace", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same deletion"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The deletion", body = DeletionView)),
    security(("bearer" = [])))]
async fn delete_workspace(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
) -> Result<Json<DeletionView>, ApiError> {
    deletion_call(&s, tenant, exec_id, key, DeletedItem::Workspace, false).await
}

/// Restores the deleted workspace of the acting tenant's exec before its
/// purge, exactly as it was (any reading of the cut: it admits no
/// deadline). Refusals (nothing written): `409 not_deleted`, `410
/// workspace_purged`, `404 not_found`.
#[utoipa::path(post, path = "/v1/execs/{exec_id}/workspace/undelete", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same answer"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The undone deletion (state restored)", body = DeletionView)),
    security(("bearer" = [])))]
async fn undelete_workspace(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
) -> Result<Json<DeletionView>, ApiError> {
    deletion_call(&s, tenant, exec_id, key, DeletedItem::Workspace, true).await
}

/// Deletes the output (every page) of the acting tenant's terminal exec,
/// as `DELETE .../workspace` does its workspace: restorable with `POST
/// .../output/undelete` until purged; meanwhile `GET .../output` answers
/// `410 output_deleted`. Refusals (nothing written): `409
/// exec_not_terminal`, `503 time_uncertain`, `410 output_purged`, `404
/// not_found`.
#[utoipa::path(delete, path = "/v1/execs/{exec_id}/output", tag = "execs",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same deletion"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The deletion", body = DeletionView)),
    security(("bearer" = [])))]
async fn delete_output(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
) -> Result<Json<DeletionView>, ApiError> {
    deletion_call(&s, tenant, exec_id, key, DeletedItem::Output, false).await
}

/// Restores the deleted output of the acting tenant's exec before its
/// purge, bytes unchanged. Refusals (nothing written): `409 not_deleted`,
/// `410 output_purged`, `404 not_found`.
#[utoipa::path(post, path = "/v1/execs/{exec_id}/output/undelete", tag = "execs",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same answer"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The undone deletion (state restored)", body = DeletionView)),
    security(("bearer" = [])))]
async fn undelete_output(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
) -> Result<Json<DeletionView>, ApiError> {
    deletion_call(&s, tenant, exec_id, key, DeletedItem::Output, true).await
}

/// The snapshots of the acting tenant's exec's workspace after
/// `after_seq`, ascending by chain seq.
#[utoipa::path(get, path = "/v1/execs/{exec_id}/snapshots", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        SnapshotsQuery,
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "A page of snapshots", body = SnapshotList)),
    security(("bearer" = [])))]
async fn list_snapshots(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    Q(q): Q<SnapshotsQuery>,
) -> Result<Json<SnapshotList>, ApiError> {
    let after_seq = q.after_seq.unwrap_or(0);
    if after_seq < 0 {
        return Err(ApiError::InvalidQuery(format!(
            "after_seq must be at least 0, got {after_seq}"
        )));
    }
    let limit = lc_core::rules::check_limit(
        q.limit.unwrap_or(EXEC_LIST_DEFAULT),
        lc_core::rules::LIST_LIMIT_MAX,
    )?;
    let snaps = s
        .store()
        .snapshots(tenant, ExecId(exec_id), after_seq, limit)
        .await?;
    let next_after_seq = (snaps.len() == limit)
        .then(|| snaps.last().map(|m| m.seq))
        .flatten();
    Ok(Json(SnapshotList {
        snapshots: snaps.into_iter().map(Into::into).collect(),
        next_after_seq,
    }))
}

/// The milestones of the acting tenant's exec after `after_seq`,
/// ascending by seq: each saved point's snapshot head, the attempt's
/// observation up to it (every value not observed absent) and whether
/// re-executing from it would be safe.
#[utoipa::path(get, path = "/v1/execs/{exec_id}/milestones", tag = "execs",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        MilestonesQuery,
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "A page of milestones", body = MilestoneList)),
    security(("bearer" = [])))]
async fn list_milestones(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    Q(q): Q<MilestonesQuery>,
) -> Result<Json<MilestoneList>, ApiError> {
    let limit = lc_core::rules::check_limit(
        q.limit.unwrap_or(EXEC_LIST_DEFAULT),
        lc_core::rules::LIST_LIMIT_MAX,
    )?;
    let milestones = s
        .store()
        .milestones(tenant, ExecId(exec_id), q.after_seq.unwrap_or(0), limit)
        .await?;
    let next_after_seq = (milestones.len() == limit)
        .then(|| milestones.last().map(|m| m.seq))
        .flatten();
    Ok(Json(MilestoneList {
        milestones: milestones.into_iter().map(Into::into).collect(),
        next_after_seq,
    }))
}

/// The exec and snapshot digest of a snapshot route, and its file path
/// (the wildcard segment, percent-decoded) on the file route.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SnapshotPath {
    exec_id: ExecId,
    digest: Digest,
    path: Option<String>,
}

impl FromRequestParts<AppState> for SnapshotPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<SnapshotPath, ApiError> {
        let axum::extract::Path(params) =
            axum::extract::Path::<Vec<(String, String)>>::from_request_parts(parts, s)
                .await
                .map_err(|e| Rejection::InvalidPath(format!("invalid path parameter: {e}")))?;
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let raw_id = get("exec_id").unwrap_or("");
        let exec_id = httpkit::extract::parse_id(raw_id).ok_or_else(|| {
            Rejection::InvalidPath(format!(
                "path id {raw_id:?} is not a positive integer in canonical decimal \
                 (1..=9223372036854775807, no sign or leading zero)"
            ))
        })?;
        let digest = Digest::from_hex(get("digest").unwrap_or(""))?;
        Ok(SnapshotPath {
            exec_id: ExecId(exec_id),
            digest,
            path: get("path").map(str::to_string),
        })
    }
}

/// The manifest of snapshot `digest` of the tenant's exec, parsed and
/// checked (its stored bytes are canonical and hash to `digest`).
async fn manifest_of(
    s: &AppState,
    tenant: TenantId,
    exec: ExecId,
    digest: Digest,
) -> Result<Manifest, ApiError> {
    let bytes = s.store().snapshot_manifest(tenant, exec, digest).await?;
    if Digest::of(&bytes) != digest {
        return Err(ApiError::Internal(format!(
            "the stored manifest of snapshot {digest} hashes to {}",
            Digest::of(&bytes)
        )));
    }
    Manifest::from_canonical(&bytes).map_err(|e| {
        ApiError::Internal(format!(
            "the stored manifest of snapshot {digest} is refused: {e}"
        ))
    })
}

/// The tree of one snapshot of the acting tenant's exec: every entry with
/// its path, kind, mode, and a file's size and SHA-256 or a symlink's
/// target.
#[utoipa::path(get, path = "/v1/execs/{exec_id}/snapshots/{digest}/tree", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("digest" = String, Path, pattern = "^[0-9a-fA-F]{64}$", description = "The snapshot's digest, 64 hex digits"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The snapshot's entries", body = TreeView)),
    security(("bearer" = [])))]
async fn snapshot_tree(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    p: SnapshotPath,
) -> Result<Json<TreeView>, ApiError> {
    let m = manifest_of(&s, tenant, p.exec_id, p.digest).await?;
    Ok(Json(TreeView {
        digest: p.digest.to_hex(),
        workspace_id: m.workspace_id.0,
        parent: m.parent.map(|d| d.to_hex()),
        entries: m.entries.iter().map(Into::into).collect(),
    }))
}

/// Chunks of a snapshot file queued between the blob reader and the
/// response (each at most [`lc_blob::STREAM_BUFFER_BYTES`]).
pub const FILE_STREAM_CHUNKS_MAX: usize = 4;

/// The response header carrying a snapshot file's SHA-256 (64 hex
/// digits), for the client to verify the bytes against.
pub const SHA256_HEADER: &str = "lc-sha256";

/// The bytes of one file of a snapshot of the acting tenant's exec,
/// streamed from the blob store as `application/octet-stream` with
/// `Content-Length` and `Lc-Sha256`. The blob is verified (length and
/// SHA-256 against the manifest) before the first byte is sent; a blob
/// that does not verify is refused `500 blob_corrupt` naming the path and
/// digest, and never served. Refusals: `400 invalid_path` (a path that is
/// absolute, has `..`, `.` or empty components), `404 not_found` (no such
/// entry), `409 entry_not_file` (a directory or a symlink: read the tree),
/// `500 blob_missing`, `503 sink_unavailable`.
#[utoipa::path(get, path = "/v1/execs/{exec_id}/snapshots/{digest}/files/{*path}", tag = "workspaces",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("digest" = String, Path, pattern = "^[0-9a-fA-F]{64}$", description = "The snapshot's digest, 64 hex digits"),
        ("path" = String, Path, description = "The file's path in the snapshot, relative, `/`-separated"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The file's bytes", body = Vec<u8>, content_type = "application/octet-stream")),
    security(("bearer" = [])))]
async fn snapshot_file(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    p: SnapshotPath,
) -> Result<Response, ApiError> {
    let path = p.path.clone().unwrap_or_default();
    lc_core::snapshot::check_path(&path).map_err(|e| Rejection::InvalidPath(e.to_string()))?;
    let m = manifest_of(&s, tenant, p.exec_id, p.digest).await?;
    let entry = m
        .entry(&path)
        .ok_or_else(|| LcError::not_found("snapshot entry", &path))?;
    let (size, sha256) = match &entry.kind {
        EntryKind::File { size, sha256 } => (*size, *sha256),
        EntryKind::Dir => {
            return Err(ApiError::EntryNotFile {
                path,
                kind: "directory",
                digest: p.digest,
            });
        }
        EntryKind::Symlink { .. } => {
            return Err(ApiError::EntryNotFile {
                path,
                kind: "symlink",
                digest: p.digest,
            });
        }
    };
    let file_err = |code: &'static str| ApiError::SnapshotFile {
        code,
        path: path.clone(),
        digest: sha256,
    };
    let sink = s.options().sink.clone().ok_or_else(|| {
        tracing::warn!("snapshot file {path:?}: this server was started without --blob-dir");
        file_err("sink_unavailable")
    })?;
    // Verify the whole blob before sending any of it.
    let verify = {
        let sink = sink.clone();
        tokio::task::spawn_blocking(move || sink.copy_to(&sha256, size, &mut std::io::sink()))
            .await
            .map_err(|e| ApiError::Internal(format!("the blob reader failed: {e}")))?
    };
    match verify {
        Ok(Some(_)) => {}
        Ok(None) => return Err(file_err("blob_missing")),
        Err(e @ (BlobError::Corrupt { .. } | BlobError::WrongSize { .. })) => {
            tracing::error!("snapshot file {path:?}: {e}");
            return Err(file_err("blob_corrupt"));
        }
        Err(e) => {
            tracing::error!("snapshot file {path:?}: {e}");
            return Err(file_err("sink_unavailable"));
        }
    }
    let (tx, rx) = tokio::sync::mpsc::channel(FILE_STREAM_CHUNKS_MAX);
    tokio::task::spawn_blocking(move || {
        let mut w = ChunkWriter { tx };
        // A blob that changed since it was verified ends the body short
        // with an error: the client never receives a whole wrong file.
        let failure = match sink.copy_to(&sha256, size, &mut w) {
            Ok(Some(_)) => None,
            Ok(None) => Some(format!("blob {sha256} vanished while it was sent")),
            // The client went away: nothing to tell it.
            Err(BlobError::Output { .. }) => return,
            Err(e) => Some(e.to_string()),
        };
        if let Some(f) = failure {
            tracing::error!("snapshot file {path:?}: {f}");
            let _ = w.tx.blocking_send(Err(std::io::Error::other(f)));
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .header(SHA256_HEADER, sha256.to_hex())
        .body(axum::body::Body::new(ChunkBody { rx, size }))
        .map_err(|e| ApiError::Internal(format!("building the file response: {e}")))
}

/// The writing end of a snapshot file's body: each write is one chunk,
/// waiting while [`FILE_STREAM_CHUNKS_MAX`] are queued; a client gone
/// away is a broken pipe, which ends the copy.
struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The reading end: the chunks in order, `size` bytes in all.
struct ChunkBody {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    size: u64,
}

impl axum::body::HttpBody for ChunkBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|c| c.map(|r| r.map(http_body::Frame::data)))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.size)
    }
}

/// Queues input for the stdin of an exec of the acting tenant admitted with
/// `stdin_open`: the bytes get the exec's next input seq and the exec's
/// gateway delivers them in seq order, each exactly once; `eof` closes
/// stdin after them. A replay of the key returns the input as it is now
/// (`queued` or `sent`); the key with other bytes or another `eof` is `409
/// idempotency_conflict`. Refusals: `422 invalid_input` (not base64, more
/// than 65536 bytes, or none without `eof`), `409 stdin_not_open`, `409
/// input_closed` (an `eof` input was accepted), `409 exec_terminal`, `429
/// input_queue_full` with `Retry-After` (16 inputs or 256 KiB queued).
/// Nothing is written on any refusal.
#[utoipa::path(post, path = "/v1/execs/{exec_id}/input", tag = "execs",
    params(
        ("exec_id" = i64, Path, minimum = 1, description = "The exec"),
        ("Idempotency-Key" = String, Header, description = "Required: a replay returns the same input, as it is now"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    request_body = SendInputBody,
    responses(
        (status = 201, description = "The input, queued (or sent, on a replay)", body = InputView),
        (status = 429, description = "input_queue_full: retry after Retry-After seconds", body = httpkit::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = [])))]
async fn send_input(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(exec_id): IdPath,
    key: RequiredKey,
    JsonBody(req): JsonBody<SendInputBody>,
) -> Result<(StatusCode, Json<InputView>), ApiError> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(req.data_b64.as_bytes())
        .map_err(|e| LcError::InvalidInput {
            reason: format!("data_b64 is not standard base64 ({e}); encode the bytes with padding"),
        })?;
    let op = key.operation(
        "send_input",
        Some(tenant),
        &serde_json::json!({
            "exec_id": exec_id,
            "sha256": Digest::of(&bytes).to_hex(),
            "eof": req.eof,
        }),
    )?;
    let at = s.reading().await?.at;
    let input = s
        .store()
        .send_input(&op, at, tenant, ExecId(exec_id), &bytes, req.eof)
        .await?;
    Ok((StatusCode::CREATED, Json(input.into())))
}

/// Mints a scoped token of the acting tenant (its API key, or the admin
/// token with `Lc-Tenant`; never a scoped token): limited to
/// `operations`, bound to `exec_id` when given, accepted while a certain
/// cut is below its deadline `cut + ttl_ms`. The answer carries the
/// secret once; only its SHA-256 is stored, so a replay of the key
/// answers the record without it (`replay: true`). Refusals (nothing
/// written): `503 time_uncertain` (no token is minted on an uncertain
/// cut), `422 invalid_token_scope`, `422 invalid_timeout` (`ttl_ms`
/// outside `1..=` the longest token TTL), `404 not_found` (an exec not the
/// tenant's), `403 forbidden` (a scoped token), `503
/// deadline_beyond_horizon`.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens",
    params(
        ("Idempotency-Key" = String, Header, description = "Required: a replay answers the same token, without its secret"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    request_body = MintTokenBody,
    responses((status = 201, description = "The token, with its secret unless a replay", body = MintedTokenView)),
    security(("bearer" = [])))]
async fn mint_token(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    key: RequiredKey,
    JsonBody(req): JsonBody<MintTokenBody>,
) -> Result<(StatusCode, Json<MintedTokenView>), ApiError> {
    let scope = TokenScope::parse(req.exec_id.map(ExecId), &req.operations)?;
    let op = key.operation(
        "mint_token",
        Some(tenant),
        &serde_json::json!({
            "exec_id": req.exec_id,
            "operations": scope.operations().names(),
            "ttl_ms": req.ttl_ms,
        }),
    )?;
    let secret = crate::auth::new_token_secret()?;
    let reading = s.reading().await?;
    let minted = s
        .store()
        .mint_token(
            &op,
            reading.at,
            tenant,
            scope,
            req.ttl_ms,
            Digest(crate::auth::sha256(secret.as_bytes())),
        )
        .await
        .map_err(|e| s.refused_admission(e, reading))?;
    Ok((
        StatusCode::CREATED,
        Json(MintedTokenView {
            record: minted.token.into(),
            token: (!minted.replay).then_some(secret),
            replay: minted.replay,
        }),
    ))
}

/// The acting tenant's scoped tokens, ascending by id, without secrets
/// (revoked and expired ones included; never for a scoped token).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens",
    params(
        TokenListQuery,
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "A page of tokens", body = TokenList)),
    security(("bearer" = [])))]
async fn list_tokens(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    Q(q): Q<TokenListQuery>,
) -> Result<Json<TokenList>, ApiError> {
    let limit = lc_core::rules::check_limit(
        q.limit.unwrap_or(EXEC_LIST_DEFAULT),
        lc_core::rules::LIST_LIMIT_MAX,
    )?;
    let after = match q.after {
        Some(a) if a < 0 => {
            return Err(ApiError::InvalidQuery(format!(
                "after must be at least 0, got {a}"
            )));
        }
        a => a.map(TokenId),
    };
    let tokens = s.store().tokens(tenant, after, limit).await?;
    let next_after = (tokens.len() == limit)
        .then(|| tokens.last().map(|t| t.token_id.0))
        .flatten();
    Ok(Json(TokenList {
        tokens: tokens.into_iter().map(Into::into).collect(),
        next_after,
    }))
}

/// Revokes a scoped token of the acting tenant, on any cut (from then on
/// it is refused `401 token_revoked`). Idempotent: revoking it again
/// answers the same record. Another tenant's token is `404 not_found`;
/// a scoped token may not revoke (`403 forbidden`).
#[utoipa::path(delete, path = "/v1/tokens/{token_id}", tag = "tokens",
    params(
        ("token_id" = i64, Path, minimum = 1, description = "The token"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant to act for"),
    ),
    responses((status = 200, description = "The revoked token", body = TokenView)),
    security(("bearer" = [])))]
async fn revoke_token(
    State(s): State<AppState>,
    Acting(tenant): Acting,
    IdPath(token_id): IdPath,
) -> Result<Json<TokenView>, ApiError> {
    let at = s.reading().await?.at;
    let t = s
        .store()
        .revoke_token(at, tenant, TokenId(token_id))
        .await?;
    Ok(Json(t.into()))
}

/// Default `limit` of `GET /v1/claims`.
pub const CLAIM_LIST_DEFAULT: usize = 100;

/// Workers' claims on work items (admin only), by item, each judged at one
/// reading of the cut: expired (a certain cut at or past its expiry) and
/// takeable by another worker (a certain cut at or past expiry + grace).
#[utoipa::path(get, path = "/v1/claims", tag = "claims",
    params(ClaimListQuery),
    responses((status = 200, description = "A page of claims", body = ClaimList)),
    security(("bearer" = [])))]
async fn list_claims(
    State(s): State<AppState>,
    _: Admin,
    Q(q): Q<ClaimListQuery>,
) -> Result<Json<ClaimList>, ApiError> {
    let limit = q.limit.unwrap_or(CLAIM_LIST_DEFAULT);
    let limit = lc_core::rules::check_limit(limit, lc_core::rules::LIST_LIMIT_MAX)?;
    let after = match q.after_lease {
        Some(a) if a < 0 => {
            return Err(ApiError::InvalidQuery(format!(
                "after_lease must be at least 0, got {a}"
            )));
        }
        a => a.map(|id| lc_core::claim::ClaimItem {
            kind: lc_core::claim::ClaimKind::Lease,
            id,
        }),
    };
    let reading = s.reading().await?;
    let claims = s.store().claims(reading.at, after, limit).await?;
    let next_after_lease = (claims.len() == limit)
        .then(|| claims.last().map(|c| c.claim.item.id))
        .flatten();
    Ok(Json(ClaimList {
        cut: reading.at.cut,
        certain: reading.at.certain,
        claims: claims.into_iter().map(Into::into).collect(),
        next_after_lease,
    }))
}

/// An operation key and its recorded result: the admin's own keys without
/// `Lc-Tenant`, else the acting tenant's.
#[utoipa::path(get, path = "/v1/operations/{key}", tag = "operations",
    params(
        ("key" = String, Path, description = "The idempotency key"),
        ("Lc-Tenant" = Option<i64>, Header, description = "With the admin token: the tenant whose key"),
    ),
    responses((status = 200, description = "The operation", body = OperationView)),
    security(("bearer" = [])))]
async fn get_operation(
    State(s): State<AppState>,
    axum::extract::Path(key): axum::extract::Path<String>,
    Scope(scope): Scope,
) -> Result<Json<OperationView>, ApiError> {
    lc_core::opkey::OperationKey::new(key.clone(), Digest([0; 32]))
        .map_err(|e| Rejection::InvalidPath(e.to_string()))?;
    Ok(Json(s.store().operation(scope, &key).await?.into()))
}

/// Liveness: the process is serving.
#[utoipa::path(get, path = "/healthz", tag = "service",
    responses((status = 200, description = "Serving", body = HealthView)))]
async fn healthz() -> Json<HealthView> {
    Json(HealthView {
        status: "ok".into(),
    })
}

/// Readiness: a store read succeeds and the cut is certain (503
/// `not_ready` otherwise, naming what is missing).
#[utoipa::path(get, path = "/readyz", tag = "service",
    responses((status = 200, description = "Ready", body = ReadyView)))]
async fn readyz(State(s): State<AppState>) -> Response {
    let (db, reading) = tokio::join!(
        tokio::time::timeout(TELEMETRY_READ_MAX, s.store().runtimes()),
        tokio::time::timeout(TELEMETRY_READ_MAX, s.reading())
    );
    let database_reachable = matches!(db, Ok(Ok(_)));
    let reading = reading.ok().and_then(Result::ok);
    let view = ReadyView {
        ready: database_reachable && reading.is_some_and(|r| r.at.certain),
        database_reachable,
        cut: reading.map(|r| r.at.cut),
        cut_certain: reading.is_some_and(|r| r.at.certain),
        uncertain_reason: reading.and_then(|r| r.uncertain.map(|u| u.code().to_string())),
    };
    if view.ready {
        return Json(view).into_response();
    }
    let mut missing = Vec::new();
    if !database_reachable {
        missing.push("the database is unreachable".to_string());
    }
    match (&reading, &view.uncertain_reason) {
        (None, _) => missing.push("the cut cannot be read".to_string()),
        (Some(_), Some(r)) => missing.push(format!("the cut is uncertain ({r})")),
        (Some(_), None) => {}
    }
    ApiError::NotReady(format!("not ready: {}", missing.join("; "))).into_response()
}

/// Counters and the cut's certainty in the Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain")))]
async fn metrics_text(State(s): State<AppState>) -> Response {
    if let Some(st) = s.clock().refresh_safe_time(TELEMETRY_READ_MAX).await {
        s.metrics().set_safe_time(&st);
    }
    httpkit::middleware::metrics_response(s.metrics().render())
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "service",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
async fn openapi_json() -> Response {
    static DOC: OnceLock<String> = OnceLock::new();
    httpkit::openapi::document_response(&DOC, || {
        openapi()
            .to_json()
            .expect("the OpenAPI document (strings, maps and lists) serializes")
    })
}

// ------------------------------------------------------------------ router

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Little Compute",
        description = "The sandbox control plane. JSON under /v1; errors are RFC 9457 problem documents with a stable `code`; every POST takes an Idempotency-Key; instants are RFC 3339 UTC on the safe expiry cut."
    ),
    modifiers(&BearerScheme)
)]
struct ApiDoc;

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        httpkit::openapi::add_bearer_scheme(
            openapi,
            "The admin token, a tenant API key (`lc_...`), or a scoped token (`lct_...`) on the routes of its operations, per route.",
        );
    }
}

/// Every route of the service, registered once for both the router and the
/// OpenAPI document.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_tenant))
        .routes(routes!(deposit))
        .routes(routes!(get_tenant))
        .routes(routes!(set_approval_policy))
        .routes(routes!(list_approvals))
        .routes(routes!(approve_exec))
        .routes(routes!(deny_exec))
        .routes(routes!(import_runtime, list_runtimes))
        .routes(routes!(create_exec, list_execs))
        .routes(routes!(get_exec))
        .routes(routes!(exec_output, delete_output))
        .routes(routes!(undelete_output))
        .routes(routes!(cancel_exec))
        .routes(routes!(hibernate_exec))
        .routes(routes!(resume_exec))
        .routes(routes!(get_workspace, delete_workspace))
        .routes(routes!(undelete_workspace))
        .routes(routes!(list_snapshots))
        .routes(routes!(list_milestones))
        .routes(routes!(snapshot_tree))
        .routes(routes!(snapshot_file))
        .routes(routes!(send_input))
        .routes(routes!(get_operation))
        .routes(routes!(mint_token, list_tokens))
        .routes(routes!(revoke_token))
        .routes(routes!(list_claims))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_text))
        .routes(routes!(openapi_json))
}

/// Statuses every operation of a route may answer with a problem document.
fn problem_statuses(path: &str) -> &'static [u16] {
    if path.starts_with("/v1/") {
        &[
            400, 401, 403, 404, 409, 410, 413, 414, 415, 422, 431, 500, 503,
        ]
    } else {
        &[414, 431, 503]
    }
}

/// The OpenAPI document of [`api_routes`], with the `Problem` schema and
/// the problem responses of each path added to every operation.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = api_routes().split_for_parts();
    // The router's wildcard segment is an ordinary path parameter to
    // OpenAPI.
    let wildcard: Vec<String> = doc
        .paths
        .paths
        .keys()
        .filter(|k| k.contains("{*"))
        .cloned()
        .collect();
    for k in wildcard {
        if let Some(item) = doc.paths.paths.remove(&k) {
            doc.paths.paths.insert(k.replace("{*", "{"), item);
        }
    }
    httpkit::openapi::document_problems::<ApiError>(&mut doc, problem_statuses);
    doc
}

/// Holds every request body but a runtime import's to
/// [`JSON_BODY_MAX_BYTES`] (413 `payload_too_large` beyond it). The
/// connection layer has already buffered the body within
/// [`RUNTIME_TAR_BYTES_MAX`], so its size is exact here.
async fn json_body_limit(req: Request, next: Next) -> Response {
    let is_import = req.method() == Method::POST
        && req
            .extensions()
            .get::<MatchedPath>()
            .is_some_and(|p| p.as_str() == "/v1/runtimes");
    let size = req.body().size_hint().upper().unwrap_or(u64::MAX);
    if !is_import && size > JSON_BODY_MAX_BYTES as u64 {
        return ApiError::from(Rejection::PayloadTooLarge {
            limit_bytes: JSON_BODY_MAX_BYTES,
        })
        .into_response();
    }
    next.run(req).await
}

/// The whole service over `state`: every route, the JSON body bound, the
/// fallbacks, the buffering body limit, the timeout and request tracking
/// ([`httpkit::service_router`]). Tests call it with `oneshot`.
pub fn router(state: AppState) -> Router {
    let (routes, _) = api_routes().split_for_parts();
    let routes = routes.route_layer(middleware::from_fn(json_body_limit));
    httpkit::service_router(routes, state)
}

/// The router of a service on `store`, reading the cut from `clock`,
/// accepting the admin token of `admin` and deriving tenant keys from
/// `secret` ([`router`] over a fresh [`AppState`] with fresh metrics).
pub fn build(
    store: std::sync::Arc<dyn lc_core::store::ControlStore>,
    clock: std::sync::Arc<dyn clock::Clock>,
    admin: crate::auth::AdminDigest,
    secret: crate::auth::ServerSecret,
    options: ServiceOptions,
) -> (Router, AppState) {
    let state = AppState::new(
        store,
        clock,
        admin,
        secret,
        std::sync::Arc::new(crate::metrics::Metrics::new()),
        options,
    );
    (router(state.clone()), state)
}
