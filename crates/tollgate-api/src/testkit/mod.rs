//! The HTTP test kit (feature `testkit`): a harness around the real router
//! (driven with `oneshot`, no sockets), the store factory every store's
//! HTTP cases run against ([`cases`], expanded by
//! [`all_http_cases!`](crate::all_http_cases)), the memory factory, and stub
//! stores and clocks for failure mapping. The PostgreSQL factory lives with
//! the PostgreSQL `StoreOps`, in tollgate-server's tests.

pub mod cases;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use clock::{Clock, ClockError, ClockKind, ClockReading, SystemClock, TestClock};
use http_body_util::BodyExt;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tollgate::{
    Account, AccountId, AcquireRequest, Allocator, AllocatorError, Capability, CapabilityKey,
    Grant, GrantPolicy, Lease, LeaseId, LedgerEntry, NewAccount, ReclaimReport, Renewal,
    Settlement, SuppliedTime,
};
use tower::ServiceExt;

use crate::api::{self, AppState, ServiceOptions};
use crate::metrics::Metrics;
use crate::storage::ServiceStore;

/// The admin token of every harness.
pub const ADMIN: &str = "tgadm1.test-admin-token-0123456789";

/// Where the test clock starts.
pub const T0: &str = "2026-11-29T12:00:00Z";

/// Parses an instant.
pub fn ts(s: &str) -> Timestamp {
    s.parse()
        .unwrap_or_else(|e| panic!("bad instant {s:?}: {e}"))
}

/// `SignedDuration::new`.
pub fn dur(secs: i64, nanos: i32) -> SignedDuration {
    SignedDuration::new(secs, nanos)
}

/// A policy.
pub fn policy(max_ttl: SignedDuration, grace: SignedDuration) -> GrantPolicy {
    GrantPolicy::new(max_ttl, grace).expect("policy")
}

/// The default test policy: max_ttl 1 minute, grace 5 seconds.
pub fn default_policy() -> GrantPolicy {
    policy(dur(60, 0), dur(5, 0))
}

/// Builds fresh, empty service stores.
#[async_trait(?Send)]
pub trait ServiceStoreFactory {
    /// A fresh store applying `policy`.
    async fn store(&self, policy: GrantPolicy) -> ServiceStore;
    /// A valid capability for `lease_id` in the store last built, when the
    /// factory can derive one (the PostgreSQL store exposes its identity;
    /// the memory store does not).
    fn derive_capability(&self, _lease_id: i64) -> Option<String> {
        None
    }
    /// `memory` or `postgres`.
    fn kind(&self) -> &'static str;
    /// The schema version readiness reports (`None` for the memory store).
    fn expected_schema_version(&self) -> Option<i64> {
        None
    }
}

/// Memory stores.
pub struct MemoryFactory;

#[async_trait(?Send)]
impl ServiceStoreFactory for MemoryFactory {
    async fn store(&self, policy: GrantPolicy) -> ServiceStore {
        ServiceStore::memory(policy, CapabilityKey::generate().expect("key")).expect("memory store")
    }
    fn kind(&self) -> &'static str {
        "memory"
    }
}

/// A response: status, headers, and the body as JSON (or as a JSON string
/// for non-JSON bodies).
#[derive(Debug, Clone)]
pub struct Resp {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body as JSON, or as a JSON string when it is not JSON.
    pub body: Value,
    /// The body as text (lossy UTF-8).
    pub text: String,
}

impl Resp {
    /// Asserts a problem response with `status` and `code`.
    #[track_caller]
    pub fn problem(&self, status: u16, code: &str) -> &Resp {
        assert_eq!(
            (self.status.as_u16(), self.body["code"].as_str()),
            (status, Some(code)),
            "body: {}",
            self.text
        );
        assert_eq!(
            self.headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
        assert_eq!(self.body["status"], json!(status));
        assert_eq!(
            self.body["type"],
            json!(format!("urn:tollgate:problem:{code}"))
        );
        assert!(self.body["title"].is_string() && self.body["detail"].is_string());
        // `time_uncertain` alone carries one extension member, `reason`.
        let members = if code == "time_uncertain" {
            assert!(self.body["reason"].is_string(), "{}", self.text);
            6
        } else {
            5
        };
        assert_eq!(
            self.body.as_object().map(|o| o.len()),
            Some(members),
            "{}",
            self.text
        );
        self
    }

    /// Asserts a `503 time_uncertain` with `reason` and `Retry-After`.
    #[track_caller]
    pub fn uncertain(&self, reason: &str, retry_after: &str) -> &Resp {
        self.problem(503, "time_uncertain");
        assert_eq!(self.body["reason"], json!(reason), "{}", self.text);
        assert_eq!(
            self.headers
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()),
            Some(retry_after)
        );
        self
    }

    /// Asserts `status` and returns the body.
    #[track_caller]
    pub fn ok(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text);
        &self.body
    }
}

/// A request to send.
pub struct Req {
    method: Method,
    path: String,
    token: Option<String>,
    body: Option<Vec<u8>>,
    content_type: Option<String>,
    headers: Vec<(String, String)>,
}

impl Req {
    /// A request without credential, body or extra headers.
    pub fn new(method: Method, path: impl Into<String>) -> Req {
        Req {
            method,
            path: path.into(),
            token: None,
            body: None,
            content_type: None,
            headers: Vec::new(),
        }
    }
    /// A `GET`.
    pub fn get(path: impl Into<String>) -> Req {
        Req::new(Method::GET, path)
    }
    /// A `POST`.
    pub fn post(path: impl Into<String>) -> Req {
        Req::new(Method::POST, path)
    }
    /// A `PUT`.
    pub fn put(path: impl Into<String>) -> Req {
        Req::new(Method::PUT, path)
    }
    /// With `Authorization: Bearer <t>`.
    pub fn token(mut self, t: &str) -> Req {
        self.token = Some(t.to_string());
        self
    }
    /// With `v` as an `application/json` body.
    pub fn json(mut self, v: Value) -> Req {
        self.body = Some(serde_json::to_vec(&v).expect("json"));
        self.content_type = Some("application/json".into());
        self
    }
    /// With `body` as is, sent with `content_type` (none: no header).
    pub fn raw(mut self, body: impl Into<Vec<u8>>, content_type: Option<&str>) -> Req {
        self.body = Some(body.into());
        self.content_type = content_type.map(str::to_string);
        self
    }
    /// With the header `k: v` (appended; repeat to send it twice).
    pub fn header(mut self, k: &str, v: &str) -> Req {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }
}

/// The real router over a store, with a test clock at [`T0`].
pub struct Harness {
    /// The router's state.
    pub state: AppState,
    /// The router ([`api::router`]).
    pub router: axum::Router,
    /// The state's test clock ([`Harness::over`]; a harness built by hand
    /// may hold an unused one).
    pub clock: Arc<TestClock>,
    /// The store under the state.
    pub store: ServiceStore,
}

impl Harness {
    /// A harness over a fresh store from `f`.
    pub async fn new(f: &dyn ServiceStoreFactory, policy: GrantPolicy) -> Harness {
        let store = f.store(policy).await;
        Harness::over(store)
    }

    /// A harness over `store` with a test clock at [`T0`].
    pub fn over(store: ServiceStore) -> Harness {
        let clock = Arc::new(TestClock::new(ts(T0)));
        let state = state(store.clone(), clock.clone(), Duration::from_secs(30));
        Harness {
            router: api::router(state.clone()),
            state,
            clock,
            store,
        }
    }

    /// Sends `req` through the router.
    pub async fn send(&self, req: Req) -> Resp {
        send(&self.router, req).await
    }

    /// Sets the test clock directly.
    pub fn set_now(&self, now: &str) {
        self.clock.set(ts(now));
    }

    /// Creates an account; returns `(account_id, api_key)`.
    pub async fn account(&self, name: &str, deposit: i64) -> (i64, String) {
        let r = self
            .send(
                Req::post("/v1/accounts")
                    .token(ADMIN)
                    .json(json!({ "name": name })),
            )
            .await;
        let b = r.ok(201);
        let id = b["account_id"].as_i64().expect("id");
        let key = b["api_key"].as_str().expect("key").to_string();
        if deposit > 0 {
            self.send(
                Req::post(format!("/v1/accounts/{id}/deposits"))
                    .token(ADMIN)
                    .json(json!({ "units": deposit })),
            )
            .await
            .ok(200);
        }
        (id, key)
    }

    /// Acquires; returns the grant body.
    pub async fn acquire(&self, account: i64, key: &str, units: i64, ttl: &str) -> Value {
        self.send(
            Req::post(format!("/v1/accounts/{account}/leases"))
                .token(key)
                .json(json!({ "units": units, "ttl": ttl })),
        )
        .await
        .ok(201)
        .clone()
    }

    /// Reads an account with the admin token.
    pub async fn account_view(&self, id: i64) -> Value {
        self.send(Req::get(format!("/v1/accounts/{id}")).token(ADMIN))
            .await
            .ok(200)
            .clone()
    }

    /// Ledger length (to prove that a refused request changed nothing).
    pub async fn ledger_len(&self) -> usize {
        self.store
            .allocator
            .ledger(0, tollgate::AUDIT_PAGE_MAX)
            .await
            .expect("ledger")
            .len()
    }

    /// The audit must be clean.
    pub async fn assert_audit_clean(&self) {
        let r = self.send(Req::get("/v1/admin/audit").token(ADMIN)).await;
        assert_eq!(r.ok(200)["clean"], json!(true), "{}", r.text);
    }
}

/// State over `store` and `clock`.
pub fn state(store: ServiceStore, clock: Arc<dyn Clock>, request_timeout: Duration) -> AppState {
    AppState::new(
        store,
        clock,
        Arc::new(Metrics::new()),
        ServiceOptions {
            admin_token: ADMIN.into(),
            reclaim_batch: 100,
            request_timeout,
        },
    )
}

/// Sends `req` through `router`.
pub async fn send(router: &axum::Router, req: Req) -> Resp {
    let mut b = Request::builder().method(req.method).uri(&req.path);
    if let Some(t) = &req.token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if let Some(ct) = &req.content_type {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    for (k, v) in &req.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    let request = b
        .body(req.body.map(Body::from).unwrap_or_else(Body::empty))
        .expect("request");
    let resp = router.clone().oneshot(request).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::String(text.clone()));
    Resp {
        status,
        headers,
        body,
        text,
    }
}

/// A store whose every operation fails with one error (after an optional
/// delay): maps store failures the healthy stores cannot produce.
pub struct FailingStore {
    /// The error of every operation.
    pub error: AllocatorError,
    /// How long every operation waits before failing.
    pub delay: Duration,
}

impl FailingStore {
    async fn fail<T>(&self) -> Result<T, AllocatorError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        Err(self.error.clone())
    }
}

#[async_trait]
impl Allocator for FailingStore {
    fn policy(&self) -> GrantPolicy {
        default_policy()
    }
    async fn create_account(&self, _: NewAccount) -> Result<Account, AllocatorError> {
        self.fail().await
    }
    async fn account(&self, _: AccountId) -> Result<Account, AllocatorError> {
        self.fail().await
    }
    async fn account_key_digest(&self, _: AccountId) -> Result<Option<[u8; 32]>, AllocatorError> {
        self.fail().await
    }
    async fn accounts(
        &self,
        _: Option<AccountId>,
        _: usize,
    ) -> Result<Vec<Account>, AllocatorError> {
        self.fail().await
    }
    async fn deposit(&self, _: AccountId, _: i64, _: Timestamp) -> Result<Account, AllocatorError> {
        self.fail().await
    }
    async fn acquire(&self, _: AcquireRequest, _: SuppliedTime) -> Result<Grant, AllocatorError> {
        self.fail().await
    }
    async fn lease(&self, _: LeaseId, _: &Capability) -> Result<Lease, AllocatorError> {
        self.fail().await
    }
    async fn renew(
        &self,
        _: LeaseId,
        _: &Capability,
        _: SignedDuration,
        _: SuppliedTime,
    ) -> Result<Renewal, AllocatorError> {
        self.fail().await
    }
    async fn release(
        &self,
        _: LeaseId,
        _: &Capability,
        _: Timestamp,
        _: Option<i64>,
    ) -> Result<Settlement, AllocatorError> {
        self.fail().await
    }
    async fn consolidate(
        &self,
        _: AccountId,
        _: &[(LeaseId, Capability)],
        _: SignedDuration,
        _: SuppliedTime,
    ) -> Result<Grant, AllocatorError> {
        self.fail().await
    }
    async fn reclaim(&self, _: Timestamp, _: usize) -> Result<ReclaimReport, AllocatorError> {
        self.fail().await
    }
    async fn ledger(&self, _: i64, _: usize) -> Result<Vec<LedgerEntry>, AllocatorError> {
        self.fail().await
    }
}

/// A service store over a [`FailingStore`] (readiness: the memory
/// store's).
pub fn failing_store(error: impl Into<AllocatorError>, delay: Duration) -> ServiceStore {
    let store: Arc<dyn Allocator> = Arc::new(FailingStore {
        error: error.into(),
        delay,
    });
    let memory = ServiceStore::memory(default_policy(), CapabilityKey::generate().expect("key"))
        .expect("memory");
    ServiceStore {
        allocator: store,
        ops: memory.ops,
    }
}

/// A clock that cannot be read at all (the safe cut's database is down).
#[derive(Debug)]
pub struct UnreadableClock;

#[async_trait]
impl Clock for UnreadableClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        Err(ClockError::Unavailable(
            "the safe expiry cut could not be read".into(),
        ))
    }
    fn kind(&self) -> ClockKind {
        ClockKind::System
    }
}

/// A test clock whose readings carry a settable uncertainty (the safe
/// cut's semantics without a database).
#[derive(Debug)]
pub struct UncertainTestClock {
    /// The instant of every reading.
    pub clock: TestClock,
    /// The uncertainty of every reading (`None`: certain).
    pub uncertain: std::sync::Mutex<Option<clock::UncertainReason>>,
}

#[async_trait]
impl Clock for UncertainTestClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        Ok(ClockReading {
            uncertain: *self.uncertain.lock().expect("lock"),
            ..ClockReading::certain(self.clock.get())
        })
    }
    fn kind(&self) -> ClockKind {
        ClockKind::Test
    }
    fn as_test(&self) -> Option<&TestClock> {
        Some(&self.clock)
    }
    fn retry_after_secs(&self) -> u64 {
        7
    }
}

/// The system clock, for harnesses where the test clock must be disabled.
pub fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// Generates one `#[tokio::test]` per case for a factory.
#[macro_export]
macro_rules! http_cases {
    ($factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let f = $factory;
                $crate::testkit::cases::$name(&f).await;
            }
        )*
    };
}

/// Every case of [`cases`], for one factory.
#[macro_export]
macro_rules! all_http_cases {
    ($factory:expr) => {
        $crate::http_cases!($factory;
            create_show_and_deposit,
            acquire_fractional_ttl_exact,
            ttl_clamped_and_friendly_input,
            renew_extends_and_never_shortens,
            release_settles_exactly,
            release_and_reclaim_boundary,
            reclaim_worker_steps_without_sleeps,
            consolidation,
            idempotent_acquire,
            audit_and_status,
            auth_missing_and_malformed,
            auth_admin_only_routes,
            auth_account_isolation,
            auth_capability_isolation,
            store_error_codes_over_http,
            malformed_inputs_change_nothing,
            integer_ranges,
            path_ids,
            routes_and_methods,
            timestamps_round_trip,
            durations_round_trip,
            unrepresentable_expiry,
            lease_not_found_with_valid_capability,
            readiness_and_metrics,
        );
    };
}
