//! The HTTP API: handlers, the router, and the OpenAPI document generated
//! from the same registrations.
//!
//! [`router`] builds the whole service (tests drive it with
//! `tower::ServiceExt::oneshot`, no sockets). Each handler: parses the path
//! id, checks the credential ([`crate::auth`]), parses the body, reads the
//! clock once, calls exactly one [`tollgate::Allocator`] method and maps the
//! result to a DTO ([`crate::dto`]) or an [`ApiError`]. No handler decides
//! an accounting or timing rule; the core does.
//!
//! Handlers that admit new deadline-bearing work (acquire, consolidation)
//! require a *certain* reading ([`crate::clock::ClockReading`]) and answer
//! `503 time_uncertain` otherwise, before calling the store; every other
//! time-dependent handler (deposit, renew, release) uses the reading's
//! instant whatever its certainty (on the safe-cut clock: the cut).
//!
//! Every route and the OpenAPI document come from one list
//! ([`api_routes`]), so they cannot drift apart; a test checks both
//! against the route table.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use tollgate::{AccountId, AcquireRequest, Capability, LeaseId, NewAccount, StorageError};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{self, AdminToken};
use crate::clock::Clock;
use crate::dto::*;
use crate::error::{ApiError, ErrorCode, PROBLEM_JSON, Problem};
use crate::metrics::{self, Metrics};
use crate::storage::Backend;
use crate::worker::ReclaimWorker;

/// The largest accepted request body: 64 KiB holds a consolidation of
/// several hundred leases and bounds the memory one request can pin.
pub const BODY_LIMIT_BYTES: usize = 64 * 1024;

/// The request header carrying an acquire's idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// How the service is configured beyond its storage and clock.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// The admin bearer token.
    pub admin_token: String,
    /// Leases per reclaim batch (worker and `POST /v1/admin/reclaim` default).
    pub reclaim_batch: usize,
    /// Bound on every request's handling time.
    pub request_timeout: Duration,
}

struct Inner {
    backend: Backend,
    clock: Arc<dyn Clock>,
    admin: AdminToken,
    metrics: Arc<Metrics>,
    worker: ReclaimWorker,
    request_timeout: Duration,
}

/// Shared state of every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("backend", &self.inner.backend)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// State over `backend` with time from `clock`.
    pub fn new(
        backend: Backend,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        options: ServiceOptions,
    ) -> AppState {
        let worker = ReclaimWorker::new(
            backend.allocator.clone(),
            clock.clone(),
            options.reclaim_batch,
            metrics.clone(),
        );
        AppState {
            inner: Arc::new(Inner {
                backend,
                clock,
                admin: AdminToken::new(&options.admin_token),
                metrics,
                worker,
                request_timeout: options.request_timeout,
            }),
        }
    }

    /// The reclaim worker sharing this state's store, clock and metrics.
    pub fn worker(&self) -> &ReclaimWorker {
        &self.inner.worker
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The storage backend.
    pub fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The clock's instant, certain or not (deposit, renew, release).
    async fn now(&self) -> Result<jiff::Timestamp, ApiError> {
        Ok(self.inner.clock.read().await?.now)
    }

    /// The clock's instant for an operation that admits new deadline-bearing
    /// work (`operation`: `acquire` or `consolidate`): refused with
    /// [`ApiError::TimeUncertain`], and counted as paused, when the reading
    /// is uncertain.
    async fn admission_now(&self, operation: &'static str) -> Result<jiff::Timestamp, ApiError> {
        let reading = self.inner.clock.read().await?;
        match reading.uncertain {
            None => Ok(reading.now),
            Some(reason) => {
                self.inner
                    .metrics
                    .inc(metrics::SAFETIME_PAUSED, &[("operation", operation)]);
                Err(ApiError::TimeUncertain {
                    reason,
                    retry_after_secs: self.inner.clock.retry_after_secs(),
                })
            }
        }
    }

    fn require_admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let token = auth::bearer(headers)?;
        if self.inner.admin.matches(token) {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }

    /// Rule 3 of [`crate::auth`]: the key of `account_id` (or, when
    /// `allow_admin`, the admin token). Anything else is 403, the same for
    /// an existing and a missing account.
    async fn authorize_account(
        &self,
        headers: &HeaderMap,
        account_id: AccountId,
        allow_admin: bool,
    ) -> Result<(), ApiError> {
        let token = auth::bearer(headers)?;
        if self.inner.admin.matches(token) {
            return if allow_admin {
                Ok(())
            } else {
                Err(ApiError::Forbidden)
            };
        }
        match self
            .inner
            .backend
            .allocator
            .account_key_digest(account_id)
            .await
        {
            Ok(Some(digest)) if auth::key_matches(token, &digest) => Ok(()),
            Ok(_) | Err(StorageError::AccountNotFound { .. }) => Err(ApiError::Forbidden),
            Err(e) => Err(e.into()),
        }
    }
}

// -------------------------------------------------------------- extractors

/// A path id (`account_id` or `lease_id`): a decimal `i64`, else 400
/// `invalid_path`.
#[derive(Debug, Clone, Copy)]
pub struct IdPath(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<IdPath, ApiError> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::InvalidPath(format!("invalid path parameter: {e}")))?;
        raw.parse::<i64>().map(IdPath).map_err(|_| {
            ApiError::InvalidPath(format!(
                "path id {raw:?} is not an integer in -9223372036854775808..=9223372036854775807"
            ))
        })
    }
}

/// The raw request body, size-limited, with its rejection mapped to a
/// problem (413 `payload_too_large`, else 400 `invalid_json`).
#[derive(Debug, Clone)]
pub struct RawBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<RawBody, ApiError> {
        match Bytes::from_request(req, state).await {
            Ok(b) => Ok(RawBody(b)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge {
                    limit: BODY_LIMIT_BYTES,
                })
            }
            Err(e) => Err(ApiError::InvalidJson(format!(
                "could not read the request body: {e}"
            ))),
        }
    }
}

fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(ct) = ct.to_str() else { return false };
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Parses a JSON body. An empty body is `None` (the caller decides whether
/// that is allowed); a non-empty one must be `application/json`.
///
/// # Errors
/// 415 `unsupported_media_type`, 400 `invalid_json` (syntax), 422
/// `invalid_body` (shape, naming the field path).
pub fn parse_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Option<T>, ApiError> {
    if body.is_empty() {
        return Ok(None);
    }
    if !is_json_content_type(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    // serde accepts a JSON array for a struct (fields by position); the API
    // takes objects only.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::InvalidBody(
            "the request body must be a JSON object, not an array".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                if path == "." {
                    ApiError::InvalidBody(inner.to_string())
                } else {
                    ApiError::InvalidBody(format!("{path}: {inner}"))
                }
            }
            _ => ApiError::InvalidJson(format!("request body is not valid JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::InvalidJson(format!("request body is not valid JSON: {e}")))?;
    Ok(Some(value))
}

fn require_body<T: DeserializeOwned>(headers: &HeaderMap, body: &Bytes) -> Result<T, ApiError> {
    parse_json(headers, body)?
        .ok_or_else(|| ApiError::InvalidJson("a JSON request body is required".into()))
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::InvalidHeader(
            "Idempotency-Key may be sent only once".into(),
        ));
    }
    // The core decides what a valid key is; a non-ASCII header reaches it
    // lossily decoded and is refused there.
    Ok(Some(String::from_utf8_lossy(v.as_bytes()).into_owned()))
}

// ---------------------------------------------------------------- handlers

/// Creates an account and its API key.
#[utoipa::path(post, path = "/v1/accounts", tag = "accounts",
    request_body = CreateAccountBody,
    responses((status = 201, description = "The account and its API key (shown once)", body = CreatedAccount)),
    security(("bearer" = [])))]
async fn create_account(
    State(s): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<CreatedAccount>), ApiError> {
    s.require_admin(&headers)?;
    let req: CreateAccountBody = require_body(&headers, &body)?;
    let (api_key, digest) = auth::new_api_key().map_err(|e| StorageError::Unavailable {
        message: format!("random source: {e}"),
    })?;
    let account = s
        .inner
        .backend
        .allocator
        .create_account(NewAccount {
            name: req.name,
            api_key_sha256: Some(digest),
        })
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedAccount {
            account_id: account.account_id.0,
            name: account.name,
            api_key,
        }),
    ))
}

/// Deposits units into an account.
#[utoipa::path(post, path = "/v1/accounts/{account_id}/deposits", tag = "accounts",
    params(("account_id" = i64, Path, description = "The account")),
    request_body = DepositBody,
    responses((status = 200, description = "The account after the deposit", body = AccountView)),
    security(("bearer" = [])))]
async fn deposit(
    State(s): State<AppState>,
    IdPath(account_id): IdPath,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<AccountView>, ApiError> {
    s.require_admin(&headers)?;
    let req: DepositBody = require_body(&headers, &body)?;
    let now = s.now().await?;
    let account = s
        .inner
        .backend
        .allocator
        .deposit(AccountId(account_id), req.units, now)
        .await?;
    Ok(Json(account.into()))
}

/// Reads an account (admin token or the account's own key).
#[utoipa::path(get, path = "/v1/accounts/{account_id}", tag = "accounts",
    params(("account_id" = i64, Path, description = "The account")),
    responses((status = 200, description = "The account", body = AccountView)),
    security(("bearer" = [])))]
async fn get_account(
    State(s): State<AppState>,
    IdPath(account_id): IdPath,
    headers: HeaderMap,
) -> Result<Json<AccountView>, ApiError> {
    let account_id = AccountId(account_id);
    s.authorize_account(&headers, account_id, true).await?;
    let account = s.inner.backend.allocator.account(account_id).await?;
    Ok(Json(account.into()))
}

/// Acquires a lease (the account's key).
#[utoipa::path(post, path = "/v1/accounts/{account_id}/leases", tag = "leases",
    params(
        ("account_id" = i64, Path, description = "The account"),
        ("Idempotency-Key" = Option<String>, Header, description = "Retry key: the same key with the same units and ttl returns the original grant"),
    ),
    request_body = AcquireBody,
    responses((status = 201, description = "The grant", body = GrantView)),
    security(("bearer" = [])))]
async fn acquire(
    State(s): State<AppState>,
    IdPath(account_id): IdPath,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<GrantView>), ApiError> {
    let account_id = AccountId(account_id);
    s.authorize_account(&headers, account_id, false).await?;
    let idempotency_key = idempotency_key(&headers)?;
    let req: AcquireBody = require_body(&headers, &body)?;
    let now = s.admission_now("acquire").await?;
    let grant = s
        .inner
        .backend
        .allocator
        .acquire(
            AcquireRequest {
                account_id,
                units: req.units,
                ttl: req.ttl,
                idempotency_key,
            },
            now,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(grant.into())))
}

/// Settles several active leases of an account into one new lease.
#[utoipa::path(post, path = "/v1/accounts/{account_id}/consolidations", tag = "leases",
    params(("account_id" = i64, Path, description = "The account")),
    request_body = ConsolidateBody,
    responses((status = 201, description = "The new grant", body = GrantView)),
    security(("bearer" = [])))]
async fn consolidate(
    State(s): State<AppState>,
    IdPath(account_id): IdPath,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<GrantView>), ApiError> {
    let account_id = AccountId(account_id);
    s.authorize_account(&headers, account_id, false).await?;
    let req: ConsolidateBody = require_body(&headers, &body)?;
    let leases: Vec<(LeaseId, Capability)> = req
        .leases
        .into_iter()
        .map(|l| {
            (
                LeaseId(l.lease_id),
                Capability::from_presented(l.capability),
            )
        })
        .collect();
    let now = s.admission_now("consolidate").await?;
    let grant = s
        .inner
        .backend
        .allocator
        .consolidate(account_id, &leases, req.ttl, now)
        .await?;
    Ok((StatusCode::CREATED, Json(grant.into())))
}

/// Reads a lease (its capability).
#[utoipa::path(get, path = "/v1/leases/{lease_id}", tag = "leases",
    params(("lease_id" = i64, Path, description = "The lease")),
    responses((status = 200, description = "The lease", body = LeaseView)),
    security(("bearer" = [])))]
async fn get_lease(
    State(s): State<AppState>,
    IdPath(lease_id): IdPath,
    headers: HeaderMap,
) -> Result<Json<LeaseView>, ApiError> {
    let cap = Capability::from_presented(auth::bearer(&headers)?);
    let lease = s
        .inner
        .backend
        .allocator
        .lease(LeaseId(lease_id), &cap)
        .await?;
    Ok(Json(lease.into()))
}

/// Renews a lease (its capability): new fence, expiry never earlier.
#[utoipa::path(post, path = "/v1/leases/{lease_id}/renew", tag = "leases",
    params(("lease_id" = i64, Path, description = "The lease")),
    request_body = RenewBody,
    responses((status = 200, description = "The renewed lease", body = RenewalView)),
    security(("bearer" = [])))]
async fn renew(
    State(s): State<AppState>,
    IdPath(lease_id): IdPath,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<RenewalView>, ApiError> {
    let cap = Capability::from_presented(auth::bearer(&headers)?);
    let req: RenewBody = require_body(&headers, &body)?;
    let now = s.now().await?;
    let renewal = s
        .inner
        .backend
        .allocator
        .renew(LeaseId(lease_id), &cap, req.ttl, now)
        .await?;
    Ok(Json(renewal.into()))
}

/// Releases a lease (its capability), charging `consumed` (default: all).
#[utoipa::path(post, path = "/v1/leases/{lease_id}/release", tag = "leases",
    params(("lease_id" = i64, Path, description = "The lease")),
    request_body(content = Option<ReleaseBody>, description = "Optional; an empty body charges all units"),
    responses((status = 200, description = "The settlement", body = SettlementView)),
    security(("bearer" = [])))]
async fn release(
    State(s): State<AppState>,
    IdPath(lease_id): IdPath,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<SettlementView>, ApiError> {
    let cap = Capability::from_presented(auth::bearer(&headers)?);
    // An empty body and `null` both mean "no usage report".
    let req: ReleaseBody = parse_json::<Option<ReleaseBody>>(&headers, &body)?
        .flatten()
        .unwrap_or_default();
    let now = s.now().await?;
    let settlement = s
        .inner
        .backend
        .allocator
        .release(LeaseId(lease_id), &cap, now, req.consumed)
        .await?;
    Ok(Json(settlement.into()))
}

/// Runs one reclaim batch at the server's current time (503
/// `time_uncertain`, settling nothing, while the safe expiry cut is
/// uncertain).
#[utoipa::path(post, path = "/v1/admin/reclaim", tag = "admin",
    request_body(content = Option<ReclaimBody>, description = "Optional; default limit: the configured reclaim batch"),
    responses((status = 200, description = "What the batch settled", body = ReclaimView)),
    security(("bearer" = [])))]
async fn admin_reclaim(
    State(s): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<ReclaimView>, ApiError> {
    s.require_admin(&headers)?;
    let req: ReclaimBody = parse_json::<Option<ReclaimBody>>(&headers, &body)?
        .flatten()
        .unwrap_or_default();
    let worker = &s.inner.worker;
    let pass = worker
        .step_with_limit(req.limit.unwrap_or(worker.batch()))
        .await?;
    Ok(Json(ReclaimView::new(pass.report, pass.now)))
}

/// Recomputes every account from the ledger and checks conservation.
#[utoipa::path(get, path = "/v1/admin/audit", tag = "admin",
    responses((status = 200, description = "The conservation report (`clean` false names violations)", body = AuditView)),
    security(("bearer" = [])))]
async fn admin_audit(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<AuditView>, ApiError> {
    s.require_admin(&headers)?;
    let report = s.inner.backend.allocator.audit().await?;
    Ok(Json(report.into()))
}

/// Readiness, counts of active leases and legacy bounds, policy, clock, and
/// the safe-time telemetry (a fresh reading of the cut on `--clock
/// safe-cut`), paused operations and late expiry.
#[utoipa::path(get, path = "/v1/admin/status", tag = "admin",
    responses((status = 200, description = "The service's status", body = StatusView)),
    security(("bearer" = [])))]
async fn admin_status(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<StatusView>, ApiError> {
    s.require_admin(&headers)?;
    let i = &s.inner;
    Ok(Json(
        status_report(&i.backend, &*i.clock, Some(&i.metrics)).await,
    ))
}

/// The status report of `GET /v1/admin/status`, and of `tollgate status`
/// run directly against a database: readiness, counts of active leases
/// and legacy bounds, the policy in force, the clock and, on the safe-cut
/// clock, one fresh reading of the cut (bounded by
/// [`crate::clock::TELEMETRY_READ_MAX`]; a failed read shows as
/// `read_error`, not as a failed report). `metrics`: the service's, for
/// the operations paused by an uncertain cut and the late-expiry
/// histogram since it started; `None` (a command outside the service)
/// reports both as `null`.
///
/// Each part is bounded (readiness and counts by the store, the cut by
/// the clock) and they run together, so the report answers within about
/// 2 s even while the database does not.
pub async fn status_report(
    backend: &Backend,
    clock: &dyn Clock,
    metrics: Option<&Metrics>,
) -> StatusView {
    let ops = &*backend.ops;
    let (readiness, counts, safe_time) = tokio::join!(
        ops.readiness(),
        crate::storage::bounded_counts(ops),
        clock.refresh_safe_time(crate::clock::TELEMETRY_READ_MAX)
    );
    let policy = backend.allocator.policy();
    StatusView {
        readiness: ready_view(&readiness),
        active_leases: counts.map(|c| c.active_leases),
        active_legacy_bounds: counts.map(|c| c.active_legacy_bounds),
        policy: PolicyView {
            max_ttl: policy.max_ttl(),
            reclaim_grace: policy.reclaim_grace(),
        },
        clock: clock.kind().to_string(),
        safe_time: safe_time.as_ref().map(SafeTimeView::from),
        paused: metrics.map(paused_view),
        late_expiry: metrics.map(|m| m.late_expiry().into()),
    }
}

/// Operations refused because the safe expiry cut was uncertain, by kind.
fn paused_view(m: &Metrics) -> PausedView {
    let paused = |op: &'static str| {
        u64::try_from(m.get(metrics::SAFETIME_PAUSED, &[("operation", op)])).unwrap_or(u64::MAX)
    };
    PausedView {
        acquire: paused("acquire"),
        consolidate: paused("consolidate"),
        reclaim: paused("reclaim"),
    }
}

/// Sets the test clock (only with `--clock test`).
#[utoipa::path(put, path = "/v1/admin/test-clock", tag = "admin",
    request_body = TestClockBody,
    responses((status = 200, description = "The clock's new instant", body = ClockView)),
    security(("bearer" = [])))]
async fn admin_test_clock(
    State(s): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Json<ClockView>, ApiError> {
    s.require_admin(&headers)?;
    let clock = s.inner.clock.as_test().ok_or(ApiError::TestClockDisabled)?;
    let req: TestClockBody = require_body(&headers, &body)?;
    clock.set(req.now);
    tracing::info!(now = %req.now, "test clock set");
    Ok(Json(ClockView {
        now: clock.get(),
        clock: "test".into(),
    }))
}

/// Liveness: the process is serving.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Serving", body = HealthView)))]
async fn healthz() -> Json<HealthView> {
    Json(HealthView {
        status: "ok".into(),
    })
}

fn ready_view(r: &crate::storage::Readiness) -> ReadyView {
    ReadyView {
        ready: r.is_ready(),
        store: r.store.to_string(),
        storage_reachable: r.reachable,
        schema_version: r.schema_version,
        expected_schema_version: r.expected_schema_version,
        maintenance: r.maintenance,
    }
}

/// Readiness: storage reachable, schema at the expected version, no
/// maintenance in progress (503 `not_ready` otherwise).
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready", body = ReadyView)))]
async fn readyz(State(s): State<AppState>) -> Result<Json<ReadyView>, ApiError> {
    let r = s.inner.backend.ops.readiness().await;
    if r.is_ready() {
        return Ok(Json(ready_view(&r)));
    }
    let mut reasons = Vec::new();
    if !r.reachable {
        reasons.push("storage unreachable".to_string());
    }
    if r.schema_version != r.expected_schema_version {
        let show = |v: Option<i64>| v.map_or_else(|| "none".to_string(), |v| v.to_string());
        reasons.push(format!(
            "schema version {}, expected {}",
            show(r.schema_version),
            show(r.expected_schema_version)
        ));
    }
    if r.maintenance {
        reasons.push("maintenance in progress".to_string());
    }
    if let Some(d) = &r.detail {
        tracing::warn!(detail = %d, "not ready");
    }
    Err(ApiError::NotReady(format!(
        "not ready: {}",
        reasons.join("; ")
    )))
}

/// Counters, safe-time gauges and the late-expiry histogram in the
/// Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain")))]
async fn metrics_text(State(s): State<AppState>) -> Response {
    // One fresh, bounded reading: the gauges describe the cut as of this
    // scrape, not as of the last request that happened to read it.
    if let Some(st) = s
        .inner
        .clock
        .refresh_safe_time(crate::clock::TELEMETRY_READ_MAX)
        .await
    {
        s.inner.metrics.set_safe_time(&st);
    }
    let mut resp = s.inner.metrics.render().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json")))]
async fn openapi_json() -> Response {
    static DOC: OnceLock<String> = OnceLock::new();
    let doc = DOC.get_or_init(|| openapi().to_json().unwrap_or_else(|_| "{}".into()));
    let mut resp = doc.clone().into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

// ------------------------------------------------------------------ router

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tollgate",
        description = "Exact-time lease and credit allocator. Instants are RFC 3339 UTC, exact to the nanosecond; durations ISO 8601; errors RFC 9457 problem details with a stable `code`."
    ),
    components(schemas(Problem)),
    modifiers(&BearerScheme)
)]
struct ApiDoc;

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token, an account API key (`tga1.`...) or a lease capability (`tgc1.`...), per route.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Every route of the service, registered once for both the router and the
/// OpenAPI document.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_account))
        .routes(routes!(get_account))
        .routes(routes!(deposit))
        .routes(routes!(acquire))
        .routes(routes!(consolidate))
        .routes(routes!(get_lease))
        .routes(routes!(renew))
        .routes(routes!(release))
        .routes(routes!(admin_reclaim))
        .routes(routes!(admin_audit))
        .routes(routes!(admin_status))
        .routes(routes!(admin_test_clock))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_text))
        .routes(routes!(openapi_json))
}

/// Statuses every operation of a route may answer with a problem document.
fn problem_statuses(path: &str) -> &'static [u16] {
    if path.starts_with("/v1/") {
        &[400, 401, 403, 404, 409, 413, 415, 422, 500, 503]
    } else if path == "/readyz" {
        &[503]
    } else {
        &[]
    }
}

/// The OpenAPI document of [`api_routes`], with the problem responses and
/// content type added to every operation.
pub fn openapi() -> utoipa::openapi::OpenApi {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    let (_, mut doc) = api_routes().split_for_parts();
    for (path, item) in doc.paths.paths.iter_mut() {
        let statuses = problem_statuses(path);
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            for status in statuses {
                let reason = StatusCode::from_u16(*status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("Error");
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| {
                        RefOr::T(
                            ResponseBuilder::new()
                                .description(format!("{reason} (problem details)"))
                                .content(
                                    PROBLEM_JSON,
                                    ContentBuilder::new()
                                        .schema(Some(Ref::from_schema_name("Problem")))
                                        .build(),
                                )
                                .build(),
                        )
                    });
            }
        }
    }
    doc
}

/// Counts and logs every request; labels by the matched route template.
async fn track(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    let status = resp.status();
    s.inner.metrics.inc(
        metrics::HTTP_REQUESTS,
        &[
            ("method", method.as_str()),
            ("route", &route),
            ("status", status.as_str()),
        ],
    );
    if let Some(code) = resp.extensions().get::<ErrorCode>() {
        s.inner.metrics.inc(metrics::ERRORS, &[("code", code.0)]);
    }
    tracing::info!(
        %method, route = %route, status = status.as_u16(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "request"
    );
    resp
}

/// Bounds each request's time: first the client's part, receiving the body
/// (at most `request_timeout`, else 408 [`ApiError::BodyTimeout`]: a slow or
/// truncated body is the client's fault, never a 5xx), then the service's
/// part, handling it (at most `request_timeout` again, else 503
/// [`ApiError::Timeout`]). The body is buffered here, within
/// [`BODY_LIMIT_BYTES`], and handed on whole.
async fn timeout(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let bound = s.inner.request_timeout;
    let (parts, body) = req.into_parts();
    let bytes =
        match tokio::time::timeout(bound, axum::body::to_bytes(body, BODY_LIMIT_BYTES)).await {
            Err(_) => return ApiError::BodyTimeout(bound).into_response(),
            Ok(Err(_)) => {
                // `to_bytes` fails on a body over the limit or a broken stream;
                // both are the client's.
                return ApiError::PayloadTooLarge {
                    limit: BODY_LIMIT_BYTES,
                }
                .into_response();
            }
            Ok(Ok(bytes)) => bytes,
        };
    let req = Request::from_parts(parts, axum::body::Body::from(bytes));
    match tokio::time::timeout(bound, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::Timeout(bound).into_response(),
    }
}

/// The whole service: every route, the fallbacks, the body limit, the
/// timeout and request tracking. Tests call it with `oneshot`.
pub fn router(state: AppState) -> Router {
    let (router, _) = api_routes().split_for_parts();
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), timeout))
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}
