//! Qualification of Tollgate on the cut: the real router on the safe-cut
//! clock, a PostgreSQL server whose wall clock steps (libfaketime), and the
//! real sampler process. At each irreversible time path — reclaim and
//! renewal (Tollgate's idempotency records never expire, so there is no
//! third) — a forward and a backward database clock step must not let a
//! lease be reclaimed before `ttl + reclaim_grace` of the test's own
//! monotonic time has passed since the cut its expiry was computed from was
//! published (the cut a request reads is up to one sample old, so that is
//! where the lease's time starts; see `TRUSTED_MIN`), new work is refused
//! while the cut is uncertain, and a renewal is never shortened. A paused
//! (SIGSTOPped) sampler makes the service refuse and pause reclaim. On
//! PostgreSQL 15 and 18.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use clock::Clock;
use clock::safe_cut::SafeCutClock;
use http_body_util::BodyExt;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use support::SamplerProc;
use tollgate::{CapabilityKey, GrantPolicy, LeaseId};
use tollgate_api::api::{self, AppState, ServiceOptions};
use tollgate_api::metrics::Metrics;
use tollgate_pg_harness::PgServer;
use tower::ServiceExt;

const ADMIN: &str = "tgadm1-qualification-admin-token";
const SECOND_NS: i64 = 1_000_000_000;
/// Lease TTL and the policy's reclaim grace: a lease may be reclaimed only
/// after TTL + GRACE = 3 s of trusted time.
const TTL: &str = "PT2S";
const TTL_PLUS_GRACE: Duration = Duration::from_secs(3);

struct Service {
    router: axum::Router,
    state: AppState,
}

struct Resp {
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
}

impl Service {
    async fn send(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> Resp {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {token}"));
        if body.is_some() {
            b = b.header(header::CONTENT_TYPE, "application/json");
        }
        let req = b
            .body(
                body.map(|v| Body::from(v.to_string()))
                    .unwrap_or_else(Body::empty),
            )
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Resp {
            status,
            retry_after,
            body,
        }
    }

    async fn acquire(&self, account: i64, key: &str, ttl: &str) -> Resp {
        self.send(
            "POST",
            &format!("/v1/accounts/{account}/leases"),
            key,
            Some(json!({"units": 1, "ttl": ttl})),
        )
        .await
    }

    /// Acquires until the service accepts (at most `secs` seconds); returns
    /// the grant and the instant just before the accepted request.
    async fn acquire_when_certain(&self, account: i64, key: &str, secs: u64) -> (Value, Instant) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let at = Instant::now();
            let r = self.acquire(account, key, TTL).await;
            if r.status == StatusCode::OK || r.status == StatusCode::CREATED {
                return (r.body, at);
            }
            assert_eq!(r.body["code"], json!("time_uncertain"), "{:?}", r.body);
            assert!(
                Instant::now() < deadline,
                "still refused after {secs} s: {:?}",
                r.body
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs reclaim passes every 50 ms until lease `id` is settled (at most
    /// `secs` seconds); returns when that happened.
    async fn reclaim_until(&self, id: i64, secs: u64) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Ok(pass) = self.state.worker().step().await
                && pass.report.reclaimed.contains(&LeaseId(id))
            {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("lease {id} not reclaimed within {secs} s");
    }
}

/// Every cut the test saw, with the monotonic instant taken just *before*
/// the read: a read that returns a cut below `c` proves the cut `c` was
/// published after that instant.
#[derive(Clone, Default)]
struct CutLog(Arc<std::sync::Mutex<Vec<(Instant, Timestamp)>>>);

impl CutLog {
    /// Polls the cut every 10 ms until the returned sender is dropped.
    async fn start(url: &str) -> (CutLog, tokio::sync::oneshot::Sender<()>) {
        use sqlx::Connection;
        let log = CutLog::default();
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let l = log.clone();
        tokio::spawn(async move {
            loop {
                let at = Instant::now();
                if let Ok(Some(row)) = safetime_pg::read_cut(&mut conn).await {
                    l.0.lock().unwrap().push((at, row.cut));
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                    _ = &mut stopped => return,
                }
            }
        });
        (log, stop)
    }

    /// The largest cut seen that is at most `at_most` (the cut a request
    /// with that grant base read, at the latest).
    fn last_cut_at_most(&self, at_most: Timestamp) -> Timestamp {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, c)| *c)
            .filter(|c| *c <= at_most)
            .max()
            .expect("a cut at most the grant base was seen")
    }

    /// The last instant at which the cut was still below `cut`.
    fn last_below(&self, cut: Timestamp) -> Instant {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, c)| *c < cut)
            .map(|(at, _)| *at)
            .max()
            .expect("the cut was seen below the lease's start")
    }
}

/// The trusted time a lease must live, measured from the last instant the
/// cut was seen below the cut its expiry was computed from: TTL + grace,
/// less 100 ms for the sampler's own observe-to-publish latency and round
/// trips (the cut may advance by the monotonic window spanning both
/// database reads). A cut that followed the database's 1 h step would be
/// reclaimed within about a second.
const TRUSTED_MIN: Duration = Duration::from_millis(2_900);

/// Asserts that lease `g` (TTL 2 s, expiry = its cut + 2 s) was reclaimed
/// at `reclaimed_at` no sooner than [`TRUSTED_MIN`] after its cut was
/// published.
///
/// The expiry is counted from the cut plus the reading's staleness bound
/// (the grant base, `expiry - expires_in`), so the cut itself is at most
/// that; the latest published cut not above the grant base is the one the
/// lease's time starts from at the latest.
fn assert_lived(log: &CutLog, g: &Value, reclaimed_at: Instant) {
    let expiry: Timestamp = g["expiry"].as_str().unwrap().parse().unwrap();
    let expires_in: SignedDuration = g["expires_in"].as_str().unwrap().parse().unwrap();
    assert_eq!(expires_in, SignedDuration::from_secs(2), "{g}");
    let base = expiry - expires_in;
    let cut = log.last_cut_at_most(base);
    let start = cut;
    let lived = reclaimed_at.duration_since(log.last_below(start));
    assert!(
        lived >= TRUSTED_MIN,
        "lease {} reclaimed after only {lived:?}",
        g["lease_id"]
    );
}

fn lease_id(g: &Value) -> i64 {
    g["lease_id"].as_i64().expect("lease_id")
}

async fn service_on(url: &str) -> Service {
    let policy =
        GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(1)).unwrap();
    let options = tollgate_pg::StoreOptions {
        on_safe_cut: true,
        ..tollgate_pg::StoreOptions::default()
    };
    let store = tollgate_pg::PostgresStore::connect_with(
        url,
        policy,
        CapabilityKey::generate().unwrap(),
        options,
    )
    .await
    .unwrap();
    let backend = tollgate_server::pg::service_store(Arc::new(store));
    let pool = backend.ops.pg_pool().expect("pool").clone();
    let clock = Arc::new(SafeCutClock::new(pool, SignedDuration::from_secs(2)));
    let state = AppState::new(
        backend,
        clock,
        Arc::new(Metrics::new()),
        ServiceOptions {
            admin_token: ADMIN.into(),
            reclaim_batch: 100,
            request_timeout: Duration::from_secs(30),
        },
    );
    Service {
        router: api::router(state.clone()),
        state,
    }
}

async fn qualify(major: u32) {
    let mut server = PgServer::start_dedicated_faketime_with(support::binaries(major)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    let s = service_on(db.url()).await;
    let r = s
        .send("POST", "/v1/accounts", ADMIN, Some(json!({"name": "q"})))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let account = r.body["account_id"].as_i64().unwrap();
    let key = r.body["api_key"].as_str().unwrap().to_owned();
    let r = s
        .send(
            "POST",
            &format!("/v1/accounts/{account}/deposits"),
            ADMIN,
            Some(json!({"units": 100})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);

    // No sampler yet: refused, reason no_cut, Retry-After = the 2 s gap bound.
    let r = s.acquire(account, &key, TTL).await;
    assert_eq!(
        (
            r.status,
            r.body["code"].clone(),
            r.body["reason"].clone(),
            r.retry_after.as_deref()
        ),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!("time_uncertain"),
            json!("no_cut"),
            Some("2")
        )
    );
    let (cuts, stop_cuts) = CutLog::start(db.url()).await;
    let sampler = SamplerProc::start(db.url(), &format!("service{major}"));

    // --- Forward step of one hour. ---
    let (l1, _) = s.acquire_when_certain(account, &key, 30).await;
    let r = s
        .send(
            "POST",
            &format!("/v1/accounts/{account}/leases"),
            &key,
            Some(json!({"units": 1, "ttl": "PT20S"})),
        )
        .await;
    let l2 = r.body.clone();
    let l2_expiry: Timestamp = l2["expiry"].as_str().unwrap().parse().unwrap();
    // The service's reader sees the sampler's latest row before the step.
    // A row first seen after a forward step counts the step into its age,
    // so its staleness bound, and a renewal's expiry counted from it, errs
    // an hour long (never short); the renewal below is the other case.
    sampler.signal("STOP");
    // A publish already sent when the signal landed commits within this.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before_step = s.state.clock().read().await.unwrap();
    assert!(before_step.staleness < SignedDuration::from_secs(2));
    server.set_clock_offset_ns(3_600 * SECOND_NS).unwrap();
    // A reader that first sees that same row now counts the whole step.
    let pool = s.state.store().ops.pg_pool().unwrap().clone();
    let first_sight_after_step = SafeCutClock::new(pool, SignedDuration::from_secs(2))
        .read()
        .await
        .unwrap();
    assert_eq!(first_sight_after_step.now, before_step.now);
    assert!(first_sight_after_step.staleness >= SignedDuration::from_secs(3_600));
    sampler.signal("CONT");
    // Within a few samples the service refuses new work.
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let r = s.acquire(account, &key, TTL).await;
        if r.status == StatusCode::SERVICE_UNAVAILABLE {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "acquire still admitted 5 s after a 1 h step"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.body["code"], json!("time_uncertain"));
    assert!(
        ["clock_step_forward", "stale", "recovering"]
            .contains(&refused.body["reason"].as_str().unwrap()),
        "{:?}",
        refused.body
    );
    // The worker settles nothing while uncertain.
    let pass = s.state.worker().step().await;
    assert_eq!(
        pass.map(|p| p.report.reclaimed.len()).map_err(|e| e.code()),
        Err("time_uncertain")
    );
    // A renewal while uncertain is never shortened: PT1S from the cut ends
    // before the current expiry, which stays.
    let r = s
        .send(
            "POST",
            &format!("/v1/leases/{}/renew", lease_id(&l2)),
            l2["capability"].as_str().unwrap(),
            Some(json!({"ttl": "PT1S"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.body["expiry"], json!(l2_expiry.to_string()));
    // Release still works while uncertain (it is not destructive expiry).
    let r = s
        .send(
            "POST",
            &format!("/v1/leases/{}/release", lease_id(&l2)),
            l2["capability"].as_str().unwrap(),
            Some(json!({"consumed": 1})),
        )
        .await;
    assert_eq!(
        (r.status, r.body["returned"].clone()),
        (StatusCode::OK, json!(0))
    );
    // L1 is reclaimed only after TTL + grace of trusted time since its
    // acquisition, although database time jumped an hour past its expiry.
    let reclaimed_at = s.reclaim_until(lease_id(&l1), 30).await;
    assert_lived(&cuts, &l1, reclaimed_at);

    // --- Backward step of 5 s (database time falls behind the cut). ---
    let (l3, _) = s.acquire_when_certain(account, &key, 30).await;
    server.set_clock_offset_ns(3_595 * SECOND_NS).unwrap();
    let reclaimed_at = s.reclaim_until(lease_id(&l3), 40).await;
    assert_lived(&cuts, &l3, reclaimed_at);

    // --- The sampler is paused longer than the gap bound. ---
    let (l4, l4_at) = s.acquire_when_certain(account, &key, 30).await;
    sampler.signal("STOP");
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let r = s.acquire(account, &key, TTL).await;
    assert_eq!(
        (r.status, r.body["reason"].clone()),
        (StatusCode::SERVICE_UNAVAILABLE, json!("stale"))
    );
    // L4 is due by now in real time (3.5 s > TTL + grace), yet nothing is
    // settled while the cut is stale.
    assert!(l4_at.elapsed() >= TTL_PLUS_GRACE);
    let pass = s.state.worker().step().await;
    assert_eq!(
        pass.map(|p| p.report.reclaimed.len()).map_err(|e| e.code()),
        Err("time_uncertain")
    );
    sampler.signal("CONT");
    let reclaimed_at = s.reclaim_until(lease_id(&l4), 30).await;
    assert_lived(&cuts, &l4, reclaimed_at);

    // Late expiry and paused work are visible at /metrics.
    let text = {
        let req = Request::builder()
            .uri("/metrics")
            .body(Body::empty())
            .unwrap();
        let resp = s.router.clone().oneshot(req).await.unwrap();
        String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap()
    };
    assert!(
        text.lines()
            .any(|l| l == "tollgate_reclaim_late_seconds_count 3"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            .starts_with("tollgate_safetime_paused_total{operation=\"reclaim\"} ")
            && l != "tollgate_safetime_paused_total{operation=\"reclaim\"} 0"),
        "{text}"
    );
    assert_eq!(sampler.terminate(), Some(0));
    drop(stop_cuts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_on_the_cut_on_postgresql_15() {
    qualify(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_on_the_cut_on_postgresql_18() {
    qualify(18).await;
}
