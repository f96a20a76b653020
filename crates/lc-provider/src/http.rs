//! The provider's HTTP service (loopback) and its client.
//!
//! Routes (JSON; errors are `application/problem+json` documents with the
//! stable `code` and the typed error itself in the `error` member):
//!
//! | route | body | answer |
//! |---|---|---|
//! | `GET /v1/identity` | | `{ "provider_id", "public_key_hex" }` |
//! | `POST /v1/instances` | [`AllocateBody`] | [`Allocation`] |
//! | `GET /v1/instances` | | `{ "instances": [InstanceSummary] }` |
//! | `POST /v1/instances/{lease}/{generation}/destroy` | | evidence [`Envelope`] |
//! | `POST /v1/instances/{lease}/{generation}/not_sent` | | evidence [`Envelope`] (`not_sent`), or 409 `command_sent` |
//! | `GET /v1/instances/{lease}/{generation}/observation` | | evidence [`Envelope`] |
//! | `GET /v1/instances/{lease}/{generation}/measurement` | | evidence [`Envelope`] (a measurement) |
//! | `GET /v1/instances/{lease}/{generation}/pages?fence=F&after_seq=N&max=M` | | `{ "pages": [JsonPage] }` |
//! | `POST /v1/instances/{lease}/{generation}/ack` | `{ "fence": F, "through_seq": N }` | `{}` |
//! | `POST /v1/instances/{lease}/{generation}/cancel` | `{ "fence": F }` | `{}` |
//! | `POST /v1/instances/{lease}/{generation}/stop` | `{ "fence": F }` | `{ "outcome": "killed" \| "already_stopped" \| "ended" \| null }` |
//! | `POST /v1/instances/{lease}/{generation}/quiesce` | `{ "fence": F }` | [`QuiescedBody`] |
//! | `POST /v1/instances/{lease}/{generation}/input` | `{ "fence": F, "input_seq": S, "data_b64": "...", "eof": false }` | `{ "input_seq": S }` |
//! | `GET /v1/instances/{lease}/{generation}/spool` | | `{ "spool": SpoolStatus or null }` |
//!
//! `F` is the caller's owner fence (>= 1); a fence below the highest the
//! instance's supervisor was shown is refused 409 `stale_fence` and changes
//! nothing.
//!
//! [`HttpProvider`] implements [`Provider`] over these routes, so a worker
//! treats a remote provider exactly like a local one. The service listens on
//! loopback only. An instance whose shape has the network shares the host's
//! network namespace and so reaches loopback too: a provider that runs such
//! shapes should be served with a token ([`provider_router_with_token`]),
//! which every route but `/v1/identity` then requires as
//! `Authorization: Bearer <token>` ([`HttpProvider::with_token`]).
//!
//! Bounds, as the control plane's: [`serve`] serves through httpkit's
//! connection layer ([`httpkit::serve`]: a header-read timeout, an idle
//! timeout, a connection bound answered `503 too_many_connections` with
//! `Retry-After` when every connection is busy), and the routers are
//! [`httpkit::service_router`]s: bodies up to [`BODY_MAX_BYTES`], each
//! request's body and its handling bounded by [`REQUEST_TIMEOUT`], and
//! problem documents for unknown routes and methods. Refusals of that
//! layer carry no `error` member; [`HttpProvider`] reports them as
//! [`ProviderError::Unreachable`] with the status and body.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ed25519_dalek::VerifyingKey;
use httpkit::{ConnectionLimits, Rejection, RequestMetrics, ServiceState};
use serde::{Deserialize, Serialize};

use lc_core::evidence::Envelope;
use lc_core::owner::OwnerFence;
use lc_core::page::{JsonPage, Page, SpoolStatus, StopOutcome};
use lc_core::{
    AttemptNo, Command, Digest, ExecId, Generation, ProviderId, SandboxLeaseId, Shape, WorkspaceId,
};

use crate::{
    AllocateRequest, Allocation, InstanceSummary, Provider, ProviderError, Quiesced, Restore,
};

/// Bound on one client request, connection included: above the slowest
/// provider call (a destroy's kill bound plus an allocate's start wait)
/// and above the service's own [`REQUEST_TIMEOUT`], so a client hears the
/// service's `503 request_timeout` rather than its own timeout.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest request body the service accepts, bytes (else 413
/// `payload_too_large`): an allocate body's argv is at most 64 KiB, which
/// JSON escaping grows at most six-fold (`\u001f`), and its restore
/// manifest at most [`crate::MANIFEST_BYTES_MAX`] in base64 (4/3 of it);
/// 24 MiB holds both and the other fields.
pub const BODY_MAX_BYTES: usize = 24 * 1024 * 1024;

/// Bound on receiving a request's body and, separately, on handling it
/// (else 408 `body_timeout` or 503 `request_timeout`): above the slowest
/// call, an allocate (its 10 s start wait, then a failed start's kill
/// bound of 5 s), and below [`CLIENT_TIMEOUT`].
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(45);

/// The JSON body of `POST /v1/instances`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocateBody {
    /// The sandbox lease.
    pub lease_id: i64,
    /// Its generation.
    pub generation: i64,
    /// The exec.
    pub exec_id: i64,
    /// The attempt.
    pub attempt: i32,
    /// The runtime digest, 64 hex.
    pub runtime: String,
    /// The shape's name (`small`, `medium`, `small-net`).
    pub shape: String,
    /// The argv.
    pub command: Vec<String>,
    /// The workspace.
    pub workspace_id: i64,
    /// Whether the command's stdin is a pipe `.../input` writes to
    /// (absent: `false`).
    #[serde(default)]
    pub stdin_open: bool,
    /// The first page's seq (absent: 1).
    #[serde(default = "one")]
    pub first_seq: i64,
    /// The first input's seq (absent: 1).
    #[serde(default = "one")]
    pub first_input_seq: i64,
    /// The snapshot to restore the workspace from (absent: none).
    #[serde(default)]
    pub restore: Option<RestoreBody>,
}

fn one() -> i64 {
    1
}

/// The `restore` member of [`AllocateBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    /// The manifest's canonical bytes, standard base64 with padding.
    pub manifest_b64: String,
}

/// `POST .../quiesce` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuiescedBody {
    /// The manifest's canonical bytes, standard base64 with padding.
    pub manifest_b64: String,
    /// The signed quiescence statement.
    pub evidence: Envelope,
}

/// `POST .../stop` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopAnswer {
    /// What the stop did; `null` once the supervisor has finished.
    pub outcome: Option<StopOutcome>,
}

fn b64_decode(what: &str, s: &str) -> Result<Vec<u8>, ProviderError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s.as_bytes())
        .map_err(|_| ProviderError::InvalidRequest {
            detail: format!("{what} is not standard base64"),
        })
}

fn b64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl AllocateBody {
    /// The body of `req`.
    pub fn of(req: &AllocateRequest) -> AllocateBody {
        AllocateBody {
            lease_id: req.lease_id.0,
            generation: req.generation.0,
            exec_id: req.exec_id.0,
            attempt: req.attempt.0,
            runtime: req.runtime.to_hex(),
            shape: req.shape.name.to_owned(),
            command: req.command.argv().to_vec(),
            workspace_id: req.workspace_id.0,
            stdin_open: req.stdin_open,
            first_seq: req.first_seq,
            first_input_seq: req.first_input_seq,
            restore: req.restore.as_ref().map(|r| RestoreBody {
                manifest_b64: b64_encode(&r.manifest),
            }),
        }
    }

    /// The checked request.
    ///
    /// # Errors
    /// [`ProviderError::InvalidRequest`] for a bad digest, shape, command
    /// or restore manifest encoding.
    pub fn into_request(self) -> Result<AllocateRequest, ProviderError> {
        let bad = |e: lc_core::LcError| ProviderError::InvalidRequest {
            detail: e.to_string(),
        };
        Ok(AllocateRequest {
            lease_id: SandboxLeaseId(self.lease_id),
            generation: Generation(self.generation),
            exec_id: ExecId(self.exec_id),
            attempt: AttemptNo(self.attempt),
            runtime: Digest::from_hex(&self.runtime).map_err(bad)?,
            shape: Shape::by_name(&self.shape).map_err(bad)?,
            command: Command::new(self.command).map_err(bad)?,
            workspace_id: WorkspaceId(self.workspace_id),
            stdin_open: self.stdin_open,
            first_seq: self.first_seq,
            first_input_seq: self.first_input_seq,
            restore: self
                .restore
                .map(|r| {
                    b64_decode("restore.manifest_b64", &r.manifest_b64)
                        .map(|manifest| Restore { manifest })
                })
                .transpose()?,
        })
    }
}

/// `GET /v1/identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The provider's id.
    pub provider_id: String,
    /// Its Ed25519 public key, 64 lowercase hex.
    pub public_key_hex: String,
}

/// `GET .../pages` query.
#[derive(Debug, Clone, Copy, Deserialize)]
struct PagesQuery {
    fence: i64,
    after_seq: i64,
    max: Option<usize>,
}

/// `GET .../pages` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PagesBody {
    /// The pages, in order.
    pub pages: Vec<JsonPage>,
}

/// `POST .../ack` body.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// The caller's owner fence, >= 1.
    pub fence: i64,
    /// Drop every page with `seq <= through_seq`.
    pub through_seq: i64,
}

/// `POST .../cancel`, `.../stop` and `.../quiesce` body.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// The caller's owner fence, >= 1.
    pub fence: i64,
}

/// `POST .../input` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    /// The caller's owner fence, >= 1.
    pub fence: i64,
    /// The input's seq, >= 1.
    pub input_seq: i64,
    /// The bytes, standard base64 with padding (at most 64 KiB decoded).
    pub data_b64: String,
    /// Close the command's stdin after these bytes.
    pub eof: bool,
}

/// `POST .../input` answer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct InputAnswer {
    /// The highest input seq accepted.
    pub input_seq: i64,
}

/// `GET .../spool` answer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SpoolBody {
    /// The spool's status; `null` once the supervisor has finished.
    pub spool: Option<SpoolStatus>,
}

/// A provider error, or a refusal of the request layer, as an HTTP answer.
#[derive(Debug)]
enum ApiError {
    /// The provider's own error, sent whole in the `error` member.
    Provider(ProviderError),
    /// A refusal of httpkit's request or connection layer.
    Request(Rejection),
}

/// The problem `type` prefix of every provider answer.
const TYPE_PREFIX: &str = "urn:little-compute:provider:problem:";

impl ApiError {
    fn status(&self) -> StatusCode {
        let e = match self {
            ApiError::Request(r) => return r.status(),
            ApiError::Provider(e) => e,
        };
        match e {
            ProviderError::Fenced { .. }
            | ProviderError::AllocationConflict { .. }
            | ProviderError::StaleFence { .. }
            | ProviderError::InputRefused { .. }
            | ProviderError::CommandSent { .. }
            | ProviderError::CommandRunning { .. } => StatusCode::CONFLICT,
            ProviderError::NoInstance { .. } => StatusCode::NOT_FOUND,
            ProviderError::InstanceLost { .. } => StatusCode::GONE,
            ProviderError::UnknownRuntime { .. }
            | ProviderError::RuntimeRefused { .. }
            | ProviderError::RestoreFailed { .. }
            | ProviderError::SnapshotRefused { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ProviderError::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            ProviderError::StartFailed { .. } | ProviderError::Unreachable { .. } => {
                StatusCode::BAD_GATEWAY
            }
            ProviderError::DestroyIncomplete { .. }
            | ProviderError::SupervisorUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProviderError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ProviderError::Unauthorized => StatusCode::UNAUTHORIZED,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::Provider(e) => e.code(),
            ApiError::Request(r) => r.code(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let code = self.code();
        let (detail, retry_after_secs) = match &self {
            ApiError::Provider(e) => (e.to_string(), None),
            ApiError::Request(r) => (r.to_string(), r.retry_after_secs()),
        };
        if status.is_server_error() {
            tracing::error!(code, error = %detail, "provider request failed");
        }
        let mut body = serde_json::json!({
            "type": format!("{TYPE_PREFIX}{code}"),
            "title": httpkit::title_of(code),
            "status": status.as_u16(),
            "detail": detail,
            "code": code,
        });
        if let ApiError::Provider(e) = &self {
            body["error"] = serde_json::json!(e);
        }
        let mut resp = (status, Json(body)).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(httpkit::PROBLEM_JSON),
        );
        if let Some(secs) = retry_after_secs {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"little-compute-provider\""),
            );
        }
        resp.extensions_mut().insert(httpkit::ErrorCode(code));
        resp
    }
}

impl From<ProviderError> for ApiError {
    fn from(e: ProviderError) -> ApiError {
        ApiError::Provider(e)
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> ApiError {
        ApiError::Request(r)
    }
}

/// The routers' state: the provider, and the bounds of httpkit.
#[derive(Clone)]
struct Shared {
    provider: Arc<dyn Provider>,
}

impl ServiceState for Shared {
    type Error = ApiError;

    fn body_max_bytes(&self) -> usize {
        BODY_MAX_BYTES
    }

    fn request_timeout(&self) -> Duration {
        REQUEST_TIMEOUT
    }
}

impl RequestMetrics for Shared {
    /// The provider keeps no metrics; httpkit logs every request once.
    fn count_request(
        &self,
        _method: &axum::http::Method,
        _route: &str,
        _status: StatusCode,
        _error_code: Option<&'static str>,
    ) {
    }
}

fn ids(raw: (String, String)) -> Result<(SandboxLeaseId, Generation), ApiError> {
    let parse = |s: &str| {
        s.parse::<i64>()
            .ok()
            .filter(|n| *n >= 1 && n.to_string() == s)
    };
    match (parse(&raw.0), parse(&raw.1)) {
        (Some(l), Some(g)) => Ok((SandboxLeaseId(l), Generation(g))),
        _ => Err(ApiError::Provider(ProviderError::InvalidRequest {
            detail: "lease and generation are positive integers in canonical decimal".into(),
        })),
    }
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    b.map(|Json(t)| t).map_err(|e| {
        ApiError::Provider(ProviderError::InvalidRequest {
            detail: e.body_text(),
        })
    })
}

async fn identity(State(Shared { provider: p }): State<Shared>) -> Json<Identity> {
    Json(Identity {
        provider_id: p.id().as_str().to_owned(),
        public_key_hex: hex::encode(p.public_key().as_bytes()),
    })
}

async fn allocate(
    State(Shared { provider: p }): State<Shared>,
    b: Result<Json<AllocateBody>, JsonRejection>,
) -> Result<Json<Allocation>, ApiError> {
    let req = body(b)?.into_request()?;
    Ok(Json(p.allocate(req).await?))
}

/// `GET /v1/instances` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InventoryBody {
    /// Every instance, ordered by lease and generation.
    pub instances: Vec<InstanceSummary>,
}

async fn inventory(
    State(Shared { provider: p }): State<Shared>,
) -> Result<Json<InventoryBody>, ApiError> {
    Ok(Json(InventoryBody {
        instances: p.inventory().await?,
    }))
}

async fn destroy(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
) -> Result<Json<Envelope>, ApiError> {
    let (l, g) = ids(raw)?;
    Ok(Json(p.destroy(l, g).await?))
}

async fn prove_not_sent(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
) -> Result<Json<Envelope>, ApiError> {
    let (l, g) = ids(raw)?;
    Ok(Json(p.prove_not_sent(l, g).await?))
}

async fn observe(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
) -> Result<Json<Envelope>, ApiError> {
    let (l, g) = ids(raw)?;
    Ok(Json(p.observe(l, g).await?))
}

async fn measure(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
) -> Result<Json<Envelope>, ApiError> {
    let (l, g) = ids(raw)?;
    Ok(Json(p.measure(l, g).await?))
}

async fn pages(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
    q: Result<Query<PagesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<PagesBody>, ApiError> {
    let (l, g) = ids(raw)?;
    let Query(q) = q.map_err(|e| {
        ApiError::Provider(ProviderError::InvalidRequest {
            detail: e.body_text(),
        })
    })?;
    let max = q
        .max
        .unwrap_or(lc_core::page::PAGES_PER_REQUEST_MAX as usize);
    let got = p.pages(l, g, OwnerFence(q.fence), q.after_seq, max).await?;
    Ok(Json(PagesBody {
        pages: got.iter().map(Page::to_json).collect(),
    }))
}

async fn ack(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
    b: Result<Json<AckBody>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (l, g) = ids(raw)?;
    let b = body(b)?;
    p.ack(l, g, OwnerFence(b.fence), b.through_seq).await?;
    Ok(Json(serde_json::json!({})))
}

async fn cancel(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
    b: Result<Json<CancelBody>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (l, g) = ids(raw)?;
    let b = body(b)?;
    p.cancel(l, g, OwnerFence(b.fence)).await?;
    Ok(Json(serde_json::json!({})))
}

async fn stop(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
    b: Result<Json<CancelBody>, JsonRejection>,
) -> Result<Json<StopAnswer>, ApiError> {
    let (l, g) = ids(raw)?;
    let b = body(b)?;
    Ok(Json(StopAnswer {
        outcome: p.stop(l, g, OwnerFence(b.fence)).await?,
    }))
}

async fn quiesce(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
    b: Result<Json<CancelBody>, JsonRejection>,
) -> Result<Json<QuiescedBody>, ApiError> {
    let (l, g) = ids(raw)?;
    let b = body(b)?;
    let q = p.quiesce(l, g, OwnerFence(b.fence)).await?;
    Ok(Json(QuiescedBody {
        manifest_b64: b64_encode(&q.manifest),
        evidence: q.evidence,
    }))
}

async fn input(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
    b: Result<Json<InputBody>, JsonRejection>,
) -> Result<Json<InputAnswer>, ApiError> {
    use base64::Engine as _;
    let (l, g) = ids(raw)?;
    let b = body(b)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b.data_b64.as_bytes())
        .map_err(|_| {
            ApiError::Provider(ProviderError::InvalidRequest {
                detail: "data_b64 is not standard base64".into(),
            })
        })?;
    let input_seq = p
        .send(l, g, OwnerFence(b.fence), b.input_seq, bytes, b.eof)
        .await?;
    Ok(Json(InputAnswer { input_seq }))
}

async fn spool(
    State(Shared { provider: p }): State<Shared>,
    Path(raw): Path<(String, String)>,
) -> Result<Json<SpoolBody>, ApiError> {
    let (l, g) = ids(raw)?;
    Ok(Json(SpoolBody {
        spool: p.spool_status(l, g).await?,
    }))
}

/// The provider's router over `provider`, without a credential (see the
/// module docs).
pub fn provider_router(provider: Arc<dyn Provider>) -> axum::Router {
    router(provider, None)
}

/// Every route but `/v1/identity`.
fn instance_routes() -> axum::Router<Shared> {
    axum::Router::new()
        .route("/v1/instances", post(allocate).get(inventory))
        .route("/v1/instances/{lease}/{generation}/destroy", post(destroy))
        .route(
            "/v1/instances/{lease}/{generation}/not_sent",
            post(prove_not_sent),
        )
        .route(
            "/v1/instances/{lease}/{generation}/observation",
            get(observe),
        )
        .route(
            "/v1/instances/{lease}/{generation}/measurement",
            get(measure),
        )
        .route("/v1/instances/{lease}/{generation}/pages", get(pages))
        .route("/v1/instances/{lease}/{generation}/ack", post(ack))
        .route("/v1/instances/{lease}/{generation}/cancel", post(cancel))
        .route("/v1/instances/{lease}/{generation}/stop", post(stop))
        .route("/v1/instances/{lease}/{generation}/quiesce", post(quiesce))
        .route("/v1/instances/{lease}/{generation}/input", post(input))
        .route("/v1/instances/{lease}/{generation}/spool", get(spool))
}

/// Whether `a` and `b` are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The provider's router over `provider` requiring `Authorization: Bearer
/// <token>` on every route but `GET /v1/identity`; a missing or wrong
/// credential is 401 `unauthorized`.
pub fn provider_router_with_token(provider: Arc<dyn Provider>, token: String) -> axum::Router {
    router(provider, Some(token))
}

/// The routes, guarded by `token` when given, inside httpkit's service
/// layers (see the module docs).
fn router(provider: Arc<dyn Provider>, token: Option<String>) -> axum::Router {
    let mut routes = instance_routes();
    if let Some(token) = token {
        let token: Arc<[u8]> = Arc::from(token.into_bytes());
        let check = move |req: axum::extract::Request, next: axum::middleware::Next| {
            let token = token.clone();
            async move {
                let ok = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
                    .is_some_and(|t| same(t, &token));
                if ok {
                    next.run(req).await
                } else {
                    ApiError::Provider(ProviderError::Unauthorized).into_response()
                }
            }
        };
        routes = routes.layer(axum::middleware::from_fn(check));
    }
    httpkit::service_router(
        routes.route("/v1/identity", get(identity)),
        Shared { provider },
    )
}

/// Serves `provider` (guarded by `token` when given) on `listener` through
/// httpkit's connection layer under `limits` until `shutdown` completes,
/// then lets open requests finish (see [`httpkit::serve`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    provider: Arc<dyn Provider>,
    token: Option<String>,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let state = Shared {
        provider: provider.clone(),
    };
    httpkit::serve(listener, router(provider, token), state, limits, shutdown).await
}

/// A [`Provider`] reached over HTTP.
#[derive(Debug, Clone)]
pub struct HttpProvider {
    http: reqwest::Client,
    base: String,
    id: ProviderId,
    key: VerifyingKey,
    token: Option<String>,
}

fn unreachable(e: impl std::fmt::Display) -> ProviderError {
    ProviderError::Unreachable {
        detail: e.to_string(),
    }
}

impl HttpProvider {
    /// A client for the provider at `url` (`http://127.0.0.1:PORT`) whose
    /// identity is already known (for example registered in the database).
    ///
    /// # Errors
    /// [`ProviderError::Unreachable`] for a URL that is not `http://`.
    pub fn with_identity(
        url: &str,
        id: ProviderId,
        key: VerifyingKey,
    ) -> Result<HttpProvider, ProviderError> {
        if !url.starts_with("http://") {
            return Err(unreachable(format!(
                "provider URL must be http://, got {url:?}"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(CLIENT_TIMEOUT)
            .build()
            .map_err(unreachable)?;
        Ok(HttpProvider {
            http,
            base: url.trim_end_matches('/').to_owned(),
            id,
            key,
            token: None,
        })
    }

    /// A client for the provider at `url`, its identity read from
    /// `GET /v1/identity`.
    ///
    /// # Errors
    /// [`ProviderError::Unreachable`] when the provider cannot be reached
    /// or its identity is malformed.
    pub async fn connect(url: &str) -> Result<HttpProvider, ProviderError> {
        let placeholder = HttpProvider::with_identity(
            url,
            ProviderId::new("unknown").map_err(unreachable)?,
            VerifyingKey::from_bytes(&[0u8; 32]).map_err(unreachable)?,
        )?;
        let ident: Identity = placeholder
            .call(reqwest::Method::GET, "/v1/identity", None::<&()>)
            .await?;
        let id = ProviderId::new(ident.provider_id).map_err(unreachable)?;
        let mut raw = [0u8; 32];
        hex::decode_to_slice(&ident.public_key_hex, &mut raw).map_err(unreachable)?;
        let key = VerifyingKey::from_bytes(&raw).map_err(unreachable)?;
        Ok(HttpProvider {
            id,
            key,
            ..placeholder
        })
    }

    /// The same client sending `Authorization: Bearer <token>` on every
    /// request (for a provider served by [`provider_router_with_token`]).
    pub fn with_token(self, token: String) -> HttpProvider {
        HttpProvider {
            token: Some(token),
            ..self
        }
    }

    /// The provider's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn call<B: Serialize + ?Sized, T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ProviderError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| unreachable(format!("{url}: {e}")))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| unreachable(format!("{url}: {e}")))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| unreachable(format!("{url}: answer is not the expected JSON: {e}")));
        }
        #[derive(Deserialize)]
        struct ProblemWithError {
            error: ProviderError,
        }
        match serde_json::from_slice::<ProblemWithError>(&bytes) {
            Ok(p) => Err(p.error),
            Err(_) => Err(unreachable(format!(
                "{url}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(512)])
            ))),
        }
    }

    fn instance_path(lease_id: SandboxLeaseId, generation: Generation, tail: &str) -> String {
        format!("/v1/instances/{}/{}/{tail}", lease_id.0, generation.0)
    }
}

#[async_trait]
impl Provider for HttpProvider {
    fn id(&self) -> &ProviderId {
        &self.id
    }

    fn public_key(&self) -> VerifyingKey {
        self.key
    }

    async fn allocate(&self, req: AllocateRequest) -> Result<Allocation, ProviderError> {
        self.call(
            reqwest::Method::POST,
            "/v1/instances",
            Some(&AllocateBody::of(&req)),
        )
        .await
    }

    async fn destroy(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        self.call(
            reqwest::Method::POST,
            &Self::instance_path(lease_id, generation, "destroy"),
            None::<&()>,
        )
        .await
    }

    async fn prove_not_sent(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        self.call(
            reqwest::Method::POST,
            &Self::instance_path(lease_id, generation, "not_sent"),
            None::<&()>,
        )
        .await
    }

    async fn observe(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        self.call(
            reqwest::Method::GET,
            &Self::instance_path(lease_id, generation, "observation"),
            None::<&()>,
        )
        .await
    }

    async fn measure(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Envelope, ProviderError> {
        self.call(
            reqwest::Method::GET,
            &Self::instance_path(lease_id, generation, "measurement"),
            None::<&()>,
        )
        .await
    }

    async fn pages(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<Page>, ProviderError> {
        let path = Self::instance_path(
            lease_id,
            generation,
            &format!("pages?fence={fence}&after_seq={after_seq}&max={max}"),
        );
        let body: PagesBody = self.call(reqwest::Method::GET, &path, None::<&()>).await?;
        body.pages
            .into_iter()
            .map(|j| {
                Page::try_from(j).map_err(|e| unreachable(format!("provider sent a bad page: {e}")))
            })
            .collect()
    }

    async fn inventory(&self) -> Result<Vec<InstanceSummary>, ProviderError> {
        let body: InventoryBody = self
            .call(reqwest::Method::GET, "/v1/instances", None::<&()>)
            .await?;
        Ok(body.instances)
    }

    async fn ack(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        through_seq: i64,
    ) -> Result<(), ProviderError> {
        let _: serde_json::Value = self
            .call(
                reqwest::Method::POST,
                &Self::instance_path(lease_id, generation, "ack"),
                Some(&AckBody {
                    fence: fence.0,
                    through_seq,
                }),
            )
            .await?;
        Ok(())
    }

    async fn cancel(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<(), ProviderError> {
        let _: serde_json::Value = self
            .call(
                reqwest::Method::POST,
                &Self::instance_path(lease_id, generation, "cancel"),
                Some(&CancelBody { fence: fence.0 }),
            )
            .await?;
        Ok(())
    }

    async fn stop(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<Option<StopOutcome>, ProviderError> {
        let answer: StopAnswer = self
            .call(
                reqwest::Method::POST,
                &Self::instance_path(lease_id, generation, "stop"),
                Some(&CancelBody { fence: fence.0 }),
            )
            .await?;
        Ok(answer.outcome)
    }

    async fn quiesce(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
    ) -> Result<Quiesced, ProviderError> {
        let answer: QuiescedBody = self
            .call(
                reqwest::Method::POST,
                &Self::instance_path(lease_id, generation, "quiesce"),
                Some(&CancelBody { fence: fence.0 }),
            )
            .await?;
        let manifest = b64_decode("manifest_b64", &answer.manifest_b64)
            .map_err(|e| unreachable(format!("provider sent a bad quiescence: {e}")))?;
        Ok(Quiesced {
            manifest,
            evidence: answer.evidence,
        })
    }

    async fn send(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
        fence: OwnerFence,
        input_seq: i64,
        bytes: Vec<u8>,
        eof: bool,
    ) -> Result<i64, ProviderError> {
        use base64::Engine as _;
        let body = InputBody {
            fence: fence.0,
            input_seq,
            data_b64: base64::engine::general_purpose::STANDARD.encode(&bytes),
            eof,
        };
        let answer: InputAnswer = self
            .call(
                reqwest::Method::POST,
                &Self::instance_path(lease_id, generation, "input"),
                Some(&body),
            )
            .await?;
        Ok(answer.input_seq)
    }

    async fn spool_status(
        &self,
        lease_id: SandboxLeaseId,
        generation: Generation,
    ) -> Result<Option<SpoolStatus>, ProviderError> {
        let body: SpoolBody = self
            .call(
                reqwest::Method::GET,
                &Self::instance_path(lease_id, generation, "spool"),
                None::<&()>,
            )
            .await?;
        Ok(body.spool)
    }
}
