//! The HTTP API: handlers, the router, and the OpenAPI document generated
//! from the same registrations.
//!
//! [`router`] builds the whole service (tests drive it with
//! `tower::ServiceExt::oneshot`, no sockets). Each handler's signature
//! lists its checks in order, as typed extractors: the path id
//! ([`httpkit::IdPath`]), the credential ([`crate::auth`]), any header,
//! then the body ([`httpkit::JsonBody`]). Its body reads the clock once,
//! calls exactly one [`tollgate::Allocator`] method and maps the result to
//! a DTO ([`crate::dto`]) or an [`ApiError`]. No handler parses a body or a
//! credential by hand, and none decides an accounting or timing rule; the
//! core does.
//!
//! Handlers that admit new deadline-bearing work (acquire, consolidation)
//! require a *certain* reading ([`clock::ClockReading`]) and answer
//! `503 time_uncertain` otherwise, before calling the store; every other
//! time-dependent handler (deposit, renew, release) uses the reading
//! whatever its certainty (on the safe-cut clock: the cut). Handlers that
//! make a deadline (acquire, consolidation, renew) supply the reading as a
//! [`tollgate::SuppliedTime`]: expiry judged at the reading's instant, the
//! new expiry counted from its grant base (the instant plus its staleness
//! bound), so the holder gets at least `granted_ttl + reclaim_grace` of
//! real time from the request. Their answers, and `GET /v1/leases/{id}`,
//! carry `expires_in`, the time the holder is guaranteed from the request.
//!
//! Every route and the OpenAPI document come from one list
//! ([`api_routes`]), so they cannot drift apart; a test checks both
//! against the service's route table.

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Json, Router};
use clock::{ClockError, TELEMETRY_READ_MAX};
use httpkit::{IdPath, IdempotencyKey, JsonBody, OptionalJsonBody};
use tollgate::{AccountId, AcquireRequest, Capability, LeaseId, NewAccount, StorageError};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{self, AccountHolder, AccountReader, Admin, LeaseCapability};
use crate::dto::*;
use crate::error::ApiError;
use crate::metrics::{self, Metrics};
pub use crate::state::{AppState, BODY_LIMIT_BYTES, ServiceOptions, SettableClock};
use crate::storage::{Readiness, ServiceStore, bounded_counts};
use clock::Clock;

// ---------------------------------------------------------------- handlers

/// Creates an account and its API key.
#[utoipa::path(post, path = "/v1/accounts", tag = "accounts",
    request_body = CreateAccountBody,
    responses((status = 201, description = "The account and its API key (shown once)", body = CreatedAccount)),
    security(("bearer" = [])))]
async fn create_account(
    State(s): State<AppState>,
    _: Admin,
    JsonBody(req): JsonBody<CreateAccountBody>,
) -> Result<(StatusCode, Json<CreatedAccount>), ApiError> {
    let (api_key, digest) = auth::new_api_key().map_err(|e| StorageError::Unavailable {
        message: format!("random source: {e}"),
    })?;
    let account = s
        .store()
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
    params(("account_id" = i64, Path, minimum = 1, description = "The account")),
    request_body = DepositBody,
    responses((status = 200, description = "The account after the deposit", body = AccountView)),
    security(("bearer" = [])))]
async fn deposit(
    State(s): State<AppState>,
    IdPath(account_id): IdPath,
    _: Admin,
    JsonBody(req): JsonBody<DepositBody>,
) -> Result<Json<AccountView>, ApiError> {
    let now = s.now().await?;
    let account = s
        .store()
        .allocator
        .deposit(AccountId(account_id), req.units, now)
        .await?;
    Ok(Json(account.into()))
}

/// Reads an account (admin token or the account's own key).
#[utoipa::path(get, path = "/v1/accounts/{account_id}", tag = "accounts",
    params(("account_id" = i64, Path, minimum = 1, description = "The account")),
    responses((status = 200, description = "The account", body = AccountView)),
    security(("bearer" = [])))]
async fn get_account(
    State(s): State<AppState>,
    AccountReader(account_id): AccountReader,
) -> Result<Json<AccountView>, ApiError> {
    let account = s.store().allocator.account(account_id).await?;
    Ok(Json(account.into()))
}

/// Acquires a lease (the account's key).
#[utoipa::path(post, path = "/v1/accounts/{account_id}/leases", tag = "leases",
    params(
        ("account_id" = i64, Path, minimum = 1, description = "The account"),
        ("Idempotency-Key" = Option<String>, Header, description = "Retry key: the same key with the same units and ttl returns the original grant"),
    ),
    request_body = AcquireBody,
    responses((status = 201, description = "The grant", body = GrantView)),
    security(("bearer" = [])))]
async fn acquire(
    State(s): State<AppState>,
    AccountHolder(account_id): AccountHolder,
    IdempotencyKey(idempotency_key): IdempotencyKey,
    JsonBody(req): JsonBody<AcquireBody>,
) -> Result<(StatusCode, Json<GrantView>), ApiError> {
    let at = s.admission("acquire").await?;
    let grant = s
        .store()
        .allocator
        .acquire(
            AcquireRequest {
                account_id,
                units: req.units,
                ttl: req.ttl,
                idempotency_key,
            },
            at,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(GrantView::new(grant, at, req.ttl)),
    ))
}

/// Settles several active leases of an account into one new lease.
#[utoipa::path(post, path = "/v1/accounts/{account_id}/consolidations", tag = "leases",
    params(("account_id" = i64, Path, minimum = 1, description = "The account")),
    request_body = ConsolidateBody,
    responses((status = 201, description = "The new grant", body = GrantView)),
    security(("bearer" = [])))]
async fn consolidate(
    State(s): State<AppState>,
    AccountHolder(account_id): AccountHolder,
    JsonBody(req): JsonBody<ConsolidateBody>,
) -> Result<(StatusCode, Json<GrantView>), ApiError> {
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
    let at = s.admission("consolidate").await?;
    let grant = s
        .store()
        .allocator
        .consolidate(account_id, &leases, req.ttl, at)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(GrantView::new(grant, at, req.ttl)),
    ))
}

/// Reads a lease (its capability).
#[utoipa::path(get, path = "/v1/leases/{lease_id}", tag = "leases",
    params(("lease_id" = i64, Path, minimum = 1, description = "The lease")),
    responses((status = 200, description = "The lease", body = LeaseView)),
    security(("bearer" = [])))]
async fn get_lease(
    State(s): State<AppState>,
    IdPath(lease_id): IdPath,
    LeaseCapability(cap): LeaseCapability,
) -> Result<Json<LeaseView>, ApiError> {
    // Read first, so the time remaining errs short. A clock that cannot be
    // read leaves `expires_in` null rather than failing a read of the lease,
    // except when its database does not answer: the store shares that
    // database, so the answer is `storage_unavailable` at once instead of a
    // second wait on the store (and before the capability is judged, as on
    // every other route of the safe-cut clock).
    let at = match s.supplied().await {
        Ok(at) => Some(at),
        Err(e @ ApiError::Clock(ClockError::StorageUnavailable(_))) => return Err(e),
        Err(_) => None,
    };
    let lease = s.store().allocator.lease(LeaseId(lease_id), &cap).await?;
    Ok(Json(LeaseView::new(lease, at)))
}

/// Renews a lease (its capability): new fence, expiry never earlier
/// (`extended` says whether it moved; `ttl_clamped` whether `max_ttl`
/// clamped the request).
#[utoipa::path(post, path = "/v1/leases/{lease_id}/renew", tag = "leases",
    params(("lease_id" = i64, Path, minimum = 1, description = "The lease")),
    request_body = RenewBody,
    responses((status = 200, description = "The renewed lease", body = RenewalView)),
    security(("bearer" = [])))]
async fn renew(
    State(s): State<AppState>,
    IdPath(lease_id): IdPath,
    LeaseCapability(cap): LeaseCapability,
    JsonBody(req): JsonBody<RenewBody>,
) -> Result<Json<RenewalView>, ApiError> {
    let at = s.supplied().await?;
    let renewal = s
        .store()
        .allocator
        .renew(LeaseId(lease_id), &cap, req.ttl, at)
        .await?;
    Ok(Json(RenewalView::new(renewal, at, req.ttl)))
}

/// Releases a lease (its capability), charging `consumed` (default: all).
#[utoipa::path(post, path = "/v1/leases/{lease_id}/release", tag = "leases",
    params(("lease_id" = i64, Path, minimum = 1, description = "The lease")),
    request_body(content = Option<ReleaseBody>, description = "Optional; an empty body charges all units"),
    responses((status = 200, description = "The settlement", body = SettlementView)),
    security(("bearer" = [])))]
async fn release(
    State(s): State<AppState>,
    IdPath(lease_id): IdPath,
    LeaseCapability(cap): LeaseCapability,
    OptionalJsonBody(req): OptionalJsonBody<ReleaseBody>,
) -> Result<Json<SettlementView>, ApiError> {
    // An empty body and `null` both mean "no usage report".
    let req = req.unwrap_or_default();
    let now = s.now().await?;
    let settlement = s
        .store()
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
    _: Admin,
    OptionalJsonBody(req): OptionalJsonBody<ReclaimBody>,
) -> Result<Json<ReclaimView>, ApiError> {
    let req = req.unwrap_or_default();
    let worker = s.worker();
    let pass = worker
        .step_with_limit(req.limit.unwrap_or(worker.batch()))
        .await?;
    Ok(Json(ReclaimView::new(pass.report, pass.now)))
}

/// Recomputes every account from the ledger and checks conservation.
#[utoipa::path(get, path = "/v1/admin/audit", tag = "admin",
    responses((status = 200, description = "The conservation report (`clean` false names violations)", body = AuditView)),
    security(("bearer" = [])))]
async fn admin_audit(State(s): State<AppState>, _: Admin) -> Result<Json<AuditView>, ApiError> {
    let report = s.store().allocator.audit().await?;
    Ok(Json(report.into()))
}

/// Readiness, counts of active leases and legacy bounds, policy, clock, and
/// the safe-time telemetry (a fresh reading of the cut on `--clock
/// safe-cut`), paused operations and late expiry.
#[utoipa::path(get, path = "/v1/admin/status", tag = "admin",
    responses((status = 200, description = "The service's status", body = StatusView)),
    security(("bearer" = [])))]
async fn admin_status(State(s): State<AppState>, _: Admin) -> Result<Json<StatusView>, ApiError> {
    Ok(Json(
        status_report(s.store(), &**s.clock(), Some(s.metrics())).await,
    ))
}

/// The status report of `GET /v1/admin/status`, and of `tollgate status`
/// run directly against a database: readiness, counts of active leases
/// and legacy bounds, the policy in force, the clock and, on the safe-cut
/// clock, one fresh reading of the cut (bounded by
/// [`TELEMETRY_READ_MAX`]; a failed read shows as `read_error`, not as a
/// failed report). `metrics`: the service's, for the operations paused by
/// an uncertain cut and the late-expiry histogram since it started;
/// `None` (a command outside the service) reports both as `null`.
///
/// Each part is bounded (readiness and counts by the store, the cut by
/// the clock) and they run together, so the report answers within about
/// 2 s even while the database does not.
pub async fn status_report(
    store: &ServiceStore,
    clock: &dyn Clock,
    metrics: Option<&Metrics>,
) -> StatusView {
    let ops = &*store.ops;
    let (readiness, counts, safe_time) = tokio::join!(
        ops.readiness(),
        bounded_counts(ops),
        clock.refresh_safe_time(TELEMETRY_READ_MAX)
    );
    let policy = store.allocator.policy();
    StatusView {
        readiness: ready_view(&readiness),
        active_leases: counts.map(|c| c.active_leases),
        active_legacy_bounds: counts.map(|c| c.active_legacy_bounds),
        policy: PolicyView::from(policy),
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
    _: Admin,
    settable: SettableClock,
    JsonBody(req): JsonBody<TestClockBody>,
) -> Result<Json<ClockView>, ApiError> {
    let now = req
        .instant()
        .map_err(|m| ApiError::Request(httpkit::Rejection::InvalidBody(m)))?;
    let clock = settable.test_clock();
    clock.set(now);
    tracing::info!(now = %now, "test clock set");
    let now = clock.get();
    Ok(Json(ClockView {
        now,
        now_ns: now,
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

fn ready_view(r: &Readiness) -> ReadyView {
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
    let r = s.store().ops.readiness().await;
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
    if let Some(st) = s.clock().refresh_safe_time(TELEMETRY_READ_MAX).await {
        s.metrics().set_safe_time(&st);
    }
    httpkit::middleware::metrics_response(s.metrics().render())
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
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
        title = "Tollgate",
        description = "Exact-time lease and credit allocator. Instants are RFC 3339 UTC, exact to the nanosecond; durations ISO 8601; every instant and duration of a response also has a lossless `_ns` companion, integer nanoseconds as a decimal string (instants since the Unix epoch), which clients whose date-time type is coarser than nanoseconds should use; errors RFC 9457 problem details with a stable `code`."
    ),
    modifiers(&BearerScheme)
)]
struct ApiDoc;

struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        httpkit::openapi::add_bearer_scheme(
            openapi,
            "The admin token, an account API key (`tga1.`...) or a lease capability (`tgc1.`...), per route.",
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

/// Statuses every operation of a route may answer with a problem document:
/// on every route the connection layer's (414 and 431 for a request head
/// too large, 503 at the connection bound), on `/v1/` routes also every
/// status of the service's errors.
fn problem_statuses(path: &str) -> &'static [u16] {
    if path.starts_with("/v1/") {
        &[400, 401, 403, 404, 409, 413, 414, 415, 422, 431, 500, 503]
    } else {
        &[414, 431, 503]
    }
}

/// The OpenAPI document of [`api_routes`], with the `Problem` schema and
/// the problem responses of its path added to every operation (every `/v1/`
/// status a problem can have; elsewhere the connection layer's 414, 431
/// and 503, which on `/readyz` is also `not_ready`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, mut doc) = api_routes().split_for_parts();
    httpkit::openapi::document_problems::<ApiError>(&mut doc, problem_statuses);
    doc
}

/// The whole service: every route, the fallbacks, the body limit, the
/// timeout and request tracking ([`httpkit::service_router`]). Tests call
/// it with `oneshot`.
pub fn router(state: AppState) -> Router {
    let (routes, _) = api_routes().split_for_parts();
    httpkit::service_router(routes, state)
}
