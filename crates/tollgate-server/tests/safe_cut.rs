//! The service on the safe-cut clock (its time is the safe expiry cut),
//! through the real router on a PostgreSQL database migrated to the current
//! schema. No sampler runs: each test writes the cut row directly as the
//! database owner (the claim/publish functions are the sampler's), so every
//! state (no row, certain, uncertain, stale) is set up exactly.

mod common;

use std::sync::Arc;
use std::time::Duration;

use clock::safe_cut::SafeCutClock;
use clock::{Clock, ClockKind, TestClock};
use common::*;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use tollgate::CapabilityKey;
use tollgate::instant_pair::InstantPair;
use tollgate_api::api::{self, AppState};
use tollgate_api::error::ApiError;
use tollgate_api::storage::{ServiceStore, StatusCounts};
use tollgate_server::config::{Config, FileConfig, RawConfig};
use tollgate_server::pg::PgError;

/// A service over a fresh migrated database, on the safe-cut clock, and an
/// owner connection to drive the cut.
struct Cut {
    h: Harness,
    conn: PgConnection,
}

/// A harness over `store` whose clock is `clock` (the `clock` field of
/// [`Harness`] is an unused test clock).
fn harness(store: ServiceStore, clock: Arc<dyn Clock>) -> Harness {
    let state: AppState = state(store.clone(), clock, Duration::from_secs(30));
    Harness {
        router: api::router(state.clone()),
        state,
        clock: Arc::new(TestClock::new(ts(T0))),
        store,
    }
}

impl Cut {
    /// Grant policy: max_ttl 1 min, grace 5 s; sampling-gap bound `gap_max`.
    async fn new(gap_max: SignedDuration) -> Cut {
        let url = fresh_pg_url().await;
        tollgate_pg::migrate(&url).await.expect("migrate");
        let pg_store = tollgate_pg::PostgresStore::connect_with(
            &url,
            default_policy(),
            CapabilityKey::new(&PG_KEY).expect("key"),
            PG_OPTIONS_ON_CUT,
        )
        .await
        .expect("store");
        let store = tollgate_server::pg::service_store(Arc::new(pg_store));
        let pool = store.ops.pg_pool().expect("pool").clone();
        let h = harness(store, Arc::new(SafeCutClock::new(pool, gap_max)));
        let conn = PgConnection::connect(&url).await.expect("owner connection");
        Cut { h, conn }
    }

    /// Writes the cut as a publish would (the row on first use, epoch 1,
    /// policy 1): the cut `at`, certain or `uncertain`, `published_at` now
    /// in database time, `publish_seq` one higher.
    async fn publish(&mut self, at: &str, uncertain: Option<&str>) {
        let pair = InstantPair::encode(ts(at));
        let written = sqlx::query(
            "INSERT INTO tollgate_safetime AS s \
               (singleton, epoch, policy_version, cut_floor_us, cut_submicro_ns, certain, \
                uncertain_reason, quarantined, proof_started_at, leader_pid, \
                system_identifier, timeline_id, postmaster_start, claimed_at, published_at, \
                publish_seq) \
             VALUES (true, 1, 1, $1, $2, $3::text IS NULL, $3, false, clock_timestamp(), \
                pg_backend_pid(), 0, 1, clock_timestamp(), clock_timestamp(), \
                clock_timestamp(), 1) \
             ON CONFLICT (singleton) DO UPDATE SET \
                cut_floor_us = EXCLUDED.cut_floor_us, \
                cut_submicro_ns = EXCLUDED.cut_submicro_ns, \
                certain = EXCLUDED.certain, uncertain_reason = EXCLUDED.uncertain_reason, \
                published_at = clock_timestamp(), publish_seq = s.publish_seq + 1",
        )
        .bind(pair.floor_us)
        .bind(i32::from(pair.submicro_ns))
        .bind(uncertain)
        .execute(&mut self.conn)
        .await
        .expect("publish");
        assert_eq!(written.rows_affected(), 1);
    }

    /// Checks that the grant or renewal `g`, made at the cut `cut` for
    /// `ttl`, counts its expiry from the cut plus the reading's staleness
    /// bound: `expires_in` is `ttl` and `expiry - expires_in` (the grant
    /// base) lies at or after the cut, by less than a second (the rows this
    /// harness publishes are read within milliseconds). Returns the
    /// expiry.
    fn counted_from(g: &Value, cut: &str, ttl: &str) -> Timestamp {
        let expiry = ts(g["expiry"].as_str().expect("expiry"));
        assert_eq!(g["expires_in"], json!(ttl), "{g}");
        let ttl: SignedDuration = ttl.parse().expect("ttl");
        let base = expiry - ttl;
        let cut = ts(cut);
        assert!(
            base >= cut && base < cut + SignedDuration::from_secs(1),
            "grant base {base} for the cut {cut}: {g}"
        );
        expiry
    }

    async fn metrics(&self) -> String {
        self.h.send(Req::get("/metrics")).await.text
    }

    async fn status(&self) -> Value {
        self.h
            .send(Req::get("/v1/admin/status").token(ADMIN))
            .await
            .ok(200)
            .clone()
    }
}

#[track_caller]
fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.lines().any(|l| l == *line), "{line} in\n{text}");
    }
}

/// Every `tollgate_safetime_uncertain` series: 1 for `current`, 0 otherwise.
fn reason_lines(current: Option<&str>) -> Vec<String> {
    safetime::UncertainReason::ALL
        .iter()
        .map(|r| {
            let v = u8::from(Some(r.code()) == current);
            format!("tollgate_safetime_uncertain{{reason=\"{}\"}} {v}", r.code())
        })
        .collect()
}

fn id(g: &Value) -> i64 {
    g["lease_id"].as_i64().expect("lease_id")
}

fn cap(g: &Value) -> String {
    g["capability"].as_str().expect("capability").to_string()
}

/// (a) Before any sampler published: acquire is refused, 503
/// `time_uncertain`, reason `no_cut`, `Retry-After` the gap bound (5 s);
/// nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cut_refuses_acquire() {
    let c = Cut::new(safetime::DEFAULT_GAP_MAX).await;
    let (a, key) = c.h.account("a", 100).await;
    let entries = c.h.ledger_len().await;
    c.h.send(
        Req::post(format!("/v1/accounts/{a}/leases"))
            .token(&key)
            .json(json!({"units": 10, "ttl": "PT30S"})),
    )
    .await
    .uncertain("no_cut", "5");
    assert_eq!(c.h.ledger_len().await, entries);
    assert_eq!(
        c.status().await["safe_time"],
        json!({
            "certain": false, "uncertain_reason": "no_cut", "read_error": false,
            "read_errors": 0, "cut": null, "cut_ns": null, "db_now": null, "db_now_ns": null,
            "cut_lag": null, "cut_lag_ns": null, "epoch": null,
            "quarantined": null, "publish_seq": null, "published_at": null,
            "published_at_ns": null, "policy_version": null, "horizon": null,
            "horizon_ns": null, "gap_max": "PT5S", "gap_max_ns": "5000000000"
        })
    );
    let m = c.metrics().await;
    let mut lines = vec![
        "tollgate_safetime_certain 0".to_string(),
        "tollgate_safetime_read_errors_total 0".to_string(),
        "tollgate_safetime_paused_total{operation=\"acquire\"} 1".to_string(),
        "tollgate_errors_total{code=\"time_uncertain\"} 1".to_string(),
    ];
    lines.extend(reason_lines(Some("no_cut")));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
    // Without a row there is no epoch, lag or policy to show.
    assert!(!m.contains("tollgate_safetime_epoch"), "{m}");
    assert!(!m.contains("tollgate_safetime_cut_lag_seconds"), "{m}");
}

/// (b) A certain cut at T is the acquire instant: expiry exactly T + ttl.
/// Status and metrics show the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certain_cut_is_the_acquire_instant() {
    let mut c = Cut::new(SignedDuration::from_secs(60)).await;
    let (a, key) = c.h.account("a", 100).await;
    c.publish("2026-11-29T12:00:00.123456789Z", None).await;
    let g = c.h.acquire(a, &key, 10, "PT30.000000001S").await;
    Cut::counted_from(&g, "2026-11-29T12:00:00.123456789Z", "PT30.000000001S");
    assert_eq!(g["granted_ttl"], json!("PT30.000000001S"));
    let mut st = c.status().await;
    let safe = st["safe_time"].as_object_mut().expect("safe_time");
    // Database time: real, so only its shape is checked, and that the
    // lag's companion is exactly the difference of the instants' ones.
    let ns = |field: &str| -> i128 {
        safe[field]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{field}: {:?}", safe[field]))
    };
    assert_eq!(ns("cut_lag_ns"), ns("db_now_ns") - ns("cut_ns"));
    for field in [
        "db_now",
        "db_now_ns",
        "cut_lag",
        "cut_lag_ns",
        "published_at",
        "published_at_ns",
    ] {
        assert!(safe.remove(field).is_some_and(|v| v.is_string()), "{field}");
    }
    assert_eq!(
        st["safe_time"],
        json!({
            "certain": true, "uncertain_reason": null, "read_error": false, "read_errors": 0,
            "cut": "2026-11-29T12:00:00.123456789Z", "cut_ns": "1795953600123456789",
            "epoch": 1, "quarantined": false, "publish_seq": 1, "policy_version": 1,
            "horizon": "PT87600H", "horizon_ns": "315360000000000000",
            "gap_max": "PT1M", "gap_max_ns": "60000000000"
        })
    );
    assert_eq!(st["clock"], json!("safe-cut"));
    let m = c.metrics().await;
    let mut lines = vec![
        "tollgate_safetime_certain 1",
        "tollgate_safetime_epoch 1",
        "tollgate_safetime_quarantined 0",
        "tollgate_safetime_publish_seq 1",
        "tollgate_safetime_policy_version 1",
        "tollgate_safetime_horizon_seconds 315360000",
        "# TYPE tollgate_safetime_cut_lag_seconds gauge",
        "tollgate_safetime_paused_total{operation=\"acquire\"} 0",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    lines.extend(reason_lines(None));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
    c.h.assert_audit_clean().await;
}

/// (c) While the cut is uncertain (`clock_step_forward`): acquire and
/// consolidation are refused and write nothing; release works at the cut;
/// a renewal keeps max(old expiry, cut + ttl) exactly; reclaim settles
/// nothing even for a lease long past expiry + grace. Certain again with a
/// cut past that lease's expiry + grace: reclaim settles it, and the
/// late-expiry histogram shows exactly how late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncertain_cut_pauses_admission_and_reclaim() {
    let mut c = Cut::new(SignedDuration::from_secs(60)).await;
    let (a, key) = c.h.account("a", 100).await;
    c.publish("2026-11-29T12:00:00Z", None).await;
    let ga = c.h.acquire(a, &key, 10, "PT30S").await;
    let gb = c.h.acquire(a, &key, 20, "PT30S").await;
    // Expiry 12:00:01.000000001 plus the reading's staleness, reclaimable
    // 5 s later.
    let gc = c.h.acquire(a, &key, 5, "PT1.000000001S").await;
    Cut::counted_from(&gc, "2026-11-29T12:00:00Z", "PT1.000000001S");

    c.publish("2026-11-29T12:00:10Z", Some("clock_step_forward"))
        .await;
    refuses_admission_and_reclaim(&c, a, &key, [&ga, &gb, &gc]).await;
    settles_and_renews_at_the_cut(&c, &ga, &gb).await;
    reports_the_uncertain_cut(&c).await;
    reclaims_late_once_certain(&mut c, a, &key, &gc).await;
}

/// While the cut is uncertain: acquire, consolidation, the worker's step
/// and `POST /v1/admin/reclaim` are refused and write nothing; lease C
/// (past expiry + grace) stays active.
async fn refuses_admission_and_reclaim(c: &Cut, a: i64, key: &str, [ga, gb, gc]: [&Value; 3]) {
    let entries = c.h.ledger_len().await;
    c.h.send(
        Req::post(format!("/v1/accounts/{a}/leases"))
            .token(key)
            .json(json!({"units": 1, "ttl": "PT1S"})),
    )
    .await
    .uncertain("clock_step_forward", "60");
    c.h.send(
        Req::post(format!("/v1/accounts/{a}/consolidations"))
            .token(key)
            .json(json!({"ttl": "PT10S", "leases": [
                {"lease_id": id(ga), "capability": cap(ga)},
                {"lease_id": id(gb), "capability": cap(gb)}]})),
    )
    .await
    .uncertain("clock_step_forward", "60");
    // Lease C is past expiry + grace at the cut: nothing is settled.
    match c.h.state.worker().step().await {
        Err(ApiError::TimeUncertain {
            reason,
            retry_after_secs,
        }) => assert_eq!(
            (reason.code(), retry_after_secs),
            ("clock_step_forward", 60)
        ),
        other => panic!("expected a paused pass, got {other:?}"),
    }
    c.h.send(Req::post("/v1/admin/reclaim").token(ADMIN))
        .await
        .uncertain("clock_step_forward", "60");
    assert_eq!(c.h.ledger_len().await, entries);
    let lease_c =
        c.h.send(Req::get(format!("/v1/leases/{}", id(gc))).token(&cap(gc)))
            .await;
    assert_eq!(lease_c.ok(200)["state"], json!("active"));
}

/// While the cut is uncertain: release settles at the cut; a renewal keeps
/// max(old expiry, cut + ttl), never shorter.
async fn settles_and_renews_at_the_cut(c: &Cut, ga: &Value, gb: &Value) {
    // Release works, at the cut.
    let s =
        c.h.send(
            Req::post(format!("/v1/leases/{}/release", id(ga)))
                .token(&cap(ga))
                .json(json!({"consumed": 4})),
        )
        .await;
    assert_eq!(s.ok(200)["settled_at"], json!("2026-11-29T12:00:10Z"));
    assert_eq!(s.ok(200)["returned"], json!(6));
    // Renewal at the cut 12:00:10, expiry 12:00:30 (plus B's staleness):
    // PT10S would end at 12:00:20 (plus this reading's), so the expiry
    // stays; PT1M ends at 12:01:10 (plus), later, so it extends. Never
    // shortened.
    let renew = |ttl: &'static str| {
        c.h.send(
            Req::post(format!("/v1/leases/{}/renew", id(gb)))
                .token(&cap(gb))
                .json(json!({"ttl": ttl})),
        )
    };
    let r = renew("PT10S").await;
    assert_eq!(r.ok(200)["expiry"], gb["expiry"]);
    let r = renew("PT1M").await;
    let extended = Cut::counted_from(r.ok(200), "2026-11-29T12:00:10Z", "PT1M");
    let r = renew("PT1S").await;
    assert_eq!(r.ok(200)["expiry"], json!(extended.to_string()));
}

/// While the cut is uncertain: status and metrics show the reason and the
/// paused operations.
async fn reports_the_uncertain_cut(c: &Cut) {
    let st = c.status().await;
    assert_eq!(st["safe_time"]["certain"], json!(false));
    assert_eq!(
        st["safe_time"]["uncertain_reason"],
        json!("clock_step_forward")
    );
    assert_eq!(
        st["paused"],
        json!({"acquire": 1, "consolidate": 1, "reclaim": 2})
    );
    let m = c.metrics().await;
    let mut lines = vec![
        "tollgate_safetime_certain 0".to_string(),
        "tollgate_safetime_publish_seq 2".to_string(),
        "tollgate_safetime_paused_total{operation=\"acquire\"} 1".to_string(),
        "tollgate_safetime_paused_total{operation=\"consolidate\"} 1".to_string(),
        "tollgate_safetime_paused_total{operation=\"reclaim\"} 2".to_string(),
        "tollgate_reclaim_late_seconds_count 0".to_string(),
    ];
    lines.extend(reason_lines(Some("clock_step_forward")));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Certain again past lease C's expiry + grace: reclaim settles it, the
/// late-expiry histogram shows exactly how late, admission is back.
async fn reclaims_late_once_certain(c: &mut Cut, a: i64, key: &str, gc: &Value) {
    // Certain again at 12:00:20: C (due from 12:00:06.000000001 plus its
    // staleness) is reclaimed about 14 s late, exactly the cut less its
    // expiry and grace; B (12:01:10) is not due.
    c.publish("2026-11-29T12:00:20Z", None).await;
    let pass = c.h.state.worker().step().await.expect("pass");
    assert_eq!(pass.now, ts("2026-11-29T12:00:20Z"));
    assert_eq!(pass.report.reclaimed, vec![tollgate::LeaseId(id(gc))]);
    let due = ts(gc["expiry"].as_str().expect("expiry")) + SignedDuration::from_secs(5);
    let late = ts("2026-11-29T12:00:20Z").duration_since(due);
    assert!(late > SignedDuration::from_secs(13) && late <= SignedDuration::new(13, 999_999_999));
    assert_eq!(pass.report.late_by, vec![late]);
    assert_eq!(pass.report.units_charged, 5);
    let m = c.metrics().await;
    assert_lines(
        &m,
        &[
            "tollgate_safetime_certain 1",
            "tollgate_reclaim_late_seconds_bucket{le=\"0.001\"} 0",
            "tollgate_reclaim_late_seconds_bucket{le=\"0.01\"} 0",
            "tollgate_reclaim_late_seconds_bucket{le=\"0.1\"} 0",
            "tollgate_reclaim_late_seconds_bucket{le=\"1\"} 0",
            "tollgate_reclaim_late_seconds_bucket{le=\"10\"} 0",
            "tollgate_reclaim_late_seconds_bucket{le=\"60\"} 1",
            "tollgate_reclaim_late_seconds_bucket{le=\"600\"} 1",
            "tollgate_reclaim_late_seconds_bucket{le=\"+Inf\"} 1",
            "tollgate_reclaim_late_seconds_count 1",
            "tollgate_reclaim_leases_total 1",
            "tollgate_reclaim_passes_total{outcome=\"ok\"} 1",
        ],
    );
    let st = c.status().await;
    assert_eq!(
        st["late_expiry"],
        json!({"count": 1, "sum": late.to_string(),
               "sum_ns": late.as_nanos().to_string(), "buckets": [
            {"le": "PT0.001S", "le_ns": "1000000", "count": 0},
            {"le": "PT0.01S", "le_ns": "10000000", "count": 0},
            {"le": "PT0.1S", "le_ns": "100000000", "count": 0},
            {"le": "PT1S", "le_ns": "1000000000", "count": 0},
            {"le": "PT10S", "le_ns": "10000000000", "count": 0},
            {"le": "PT1M", "le_ns": "60000000000", "count": 1},
            {"le": "PT10M", "le_ns": "600000000000", "count": 1}
        ]})
    );
    // Admission is back, at the cut.
    let g = c.h.acquire(a, key, 1, "PT1S").await;
    Cut::counted_from(&g, "2026-11-29T12:00:20Z", "PT1S");
    c.h.assert_audit_clean().await;
}

/// (d) A certain cut whose `publish_seq` does not change for longer than
/// the gap bound (1 s here: short, yet long enough that the fresh readings
/// right after a publish cannot race it on a loaded machine) is stale: 503,
/// reason `stale`, Retry-After 1. A new publish makes it fresh again. A
/// reader that first sees a row already older than the bound (database
/// time) calls it stale at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_cut_is_uncertain() {
    let gap = SignedDuration::from_secs(1);
    let mut c = Cut::new(gap).await;
    let (a, key) = c.h.account("a", 100).await;
    c.publish("2026-11-29T12:00:00Z", None).await;
    let g = c.h.acquire(a, &key, 1, "PT10S").await;
    Cut::counted_from(&g, "2026-11-29T12:00:00Z", "PT10S");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let acquire = || {
        Req::post(format!("/v1/accounts/{a}/leases"))
            .token(&key)
            .json(json!({"units": 1, "ttl": "PT10S"}))
    };
    c.h.send(acquire()).await.uncertain("stale", "1");
    c.h.send(Req::post("/v1/admin/reclaim").token(ADMIN))
        .await
        .uncertain("stale", "1");
    let st = c.status().await;
    assert_eq!(st["safe_time"]["uncertain_reason"], json!("stale"));
    assert_eq!(st["safe_time"]["gap_max"], json!("PT1S"));
    let m = c.metrics().await;
    let lines = reason_lines(Some("stale"));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
    // The sampler publishes again: fresh.
    c.publish("2026-11-29T12:00:01Z", None).await;
    let g = c.h.acquire(a, &key, 1, "PT10S").await;
    Cut::counted_from(&g, "2026-11-29T12:00:01Z", "PT10S");
    // A row last published 2 s ago (database time), seen for the first
    // time by a new reader: stale at once.
    let aged = sqlx::query(
        "UPDATE tollgate_safetime SET published_at = clock_timestamp() - interval '2 seconds'",
    )
    .execute(&mut c.conn)
    .await
    .expect("age the row");
    assert_eq!(aged.rows_affected(), 1);
    let pool = c.h.store.ops.pg_pool().expect("pool").clone();
    let fresh_reader = harness(c.h.store.clone(), Arc::new(SafeCutClock::new(pool, gap)));
    fresh_reader.send(acquire()).await.uncertain("stale", "1");
}

/// A quiet service (no request, no worker) still reports the cut as it is
/// now: each scrape reads it afresh, so a cut the sampler stopped
/// publishing turns `stale` in `/metrics` within the gap bound, not only
/// after the next admission happens to read it. A reading that outlasts
/// the telemetry bound (2 s; here the row is locked) counts as a read
/// error, and the scrape still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_read_the_cut_at_each_scrape() {
    let mut c = Cut::new(SignedDuration::from_secs(1)).await;
    c.publish("2026-11-29T12:00:00Z", None).await;
    let m = c.metrics().await;
    let mut lines = vec![
        "tollgate_safetime_certain 1".to_string(),
        "tollgate_safetime_publish_seq 1".to_string(),
    ];
    lines.extend(reason_lines(None));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let m = c.metrics().await;
    let mut lines = vec![
        "tollgate_safetime_certain 0".to_string(),
        "tollgate_safetime_read_errors_total 0".to_string(),
    ];
    lines.extend(reason_lines(Some("stale")));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
    // Published again: the next scrape is certain again.
    c.publish("2026-11-29T12:00:01Z", None).await;
    let m = c.metrics().await;
    assert_lines(
        &m,
        &[
            "tollgate_safetime_certain 1",
            "tollgate_safetime_publish_seq 2",
        ],
    );
    // The row locked by an open transaction: the scrape's reading waits
    // 2 s, gives up, and reports it.
    sqlx::query("BEGIN")
        .execute(&mut c.conn)
        .await
        .expect("begin");
    sqlx::query("LOCK TABLE tollgate_safetime IN ACCESS EXCLUSIVE MODE")
        .execute(&mut c.conn)
        .await
        .expect("lock");
    let m = c.metrics().await;
    assert_lines(
        &m,
        &[
            "tollgate_safetime_certain 0",
            "tollgate_safetime_read_errors_total 1",
        ],
    );
    let st = c.status().await;
    assert_eq!(
        (
            &st["safe_time"]["certain"],
            &st["safe_time"]["read_error"],
            &st["safe_time"]["read_errors"]
        ),
        (&json!(false), &json!(true), &json!(2))
    );
    sqlx::query("ROLLBACK")
        .execute(&mut c.conn)
        .await
        .expect("rollback");
    // Readable again, but 4 s passed without a publish: stale, not an error.
    let m = c.metrics().await;
    let mut lines = vec![
        "tollgate_safetime_certain 0".to_string(),
        "tollgate_safetime_read_errors_total 2".to_string(),
    ];
    lines.extend(reason_lines(Some("stale")));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
    c.publish("2026-11-29T12:00:02Z", None).await;
    let m = c.metrics().await;
    let mut lines = vec![
        "tollgate_safetime_certain 1".to_string(),
        "tollgate_safetime_publish_seq 3".to_string(),
        "tollgate_safetime_read_errors_total 2".to_string(),
    ];
    lines.extend(reason_lines(None));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
}

/// A cut that cannot be read (here: a database without the safe-time
/// tables) is `503 clock_unavailable` for every time-dependent request,
/// never a guess; status and metrics count the failed reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_cut_is_clock_unavailable() {
    let url = fresh_pg_url().await; // not migrated: no tollgate_safetime
    let pool = sqlx::PgPool::connect(&url).await.expect("pool");
    let store = ServiceStore::memory(default_policy(), CapabilityKey::generate().expect("key"))
        .expect("memory");
    let h = harness(
        store,
        Arc::new(SafeCutClock::new(pool, SignedDuration::from_secs(5))),
    );
    let created = h
        .send(
            Req::post("/v1/accounts")
                .token(ADMIN)
                .json(json!({"name": "a"})),
        )
        .await;
    let key = created.ok(201)["api_key"]
        .as_str()
        .expect("key")
        .to_string();
    h.send(
        Req::post("/v1/accounts/1/leases")
            .token(&key)
            .json(json!({"units": 1, "ttl": "PT1S"})),
    )
    .await
    .problem(503, "clock_unavailable");
    h.send(Req::post("/v1/admin/reclaim").token(ADMIN))
        .await
        .problem(503, "clock_unavailable");
    let st = h
        .send(Req::get("/v1/admin/status").token(ADMIN))
        .await
        .ok(200)
        .clone();
    assert_eq!(st["safe_time"]["certain"], json!(false));
    assert_eq!(st["safe_time"]["read_error"], json!(true));
    assert_eq!(st["safe_time"]["uncertain_reason"], json!(null));
    assert_eq!(st["safe_time"]["read_errors"], json!(3));
    // The scrape reads the cut once more, and fails once more.
    let m = h.send(Req::get("/metrics")).await.text;
    let mut lines = vec![
        "tollgate_safetime_certain 0".to_string(),
        "tollgate_safetime_read_errors_total 4".to_string(),
        "tollgate_errors_total{code=\"clock_unavailable\"} 2".to_string(),
    ];
    lines.extend(reason_lines(None));
    assert_lines(&m, &lines.iter().map(String::as_str).collect::<Vec<_>>());
}

fn safe_cut_config(url: &str) -> Config {
    Config::merge(
        RawConfig {
            database_url: Some(url.to_string()),
            max_ttl: Some("PT1M".into()),
            reclaim_grace: Some("PT5S".into()),
            clock: Some(ClockKind::SafeCut),
            safetime_gap_max: Some("PT1M".into()),
            ..RawConfig::default()
        },
        FileConfig::default(),
        None,
    )
    .expect("config")
}

async fn seal(url: &str, horizon_ms: i64) -> i64 {
    let mut conn = PgConnection::connect(url).await.expect("connect");
    let p = safetime_pg::seal_policy(&mut conn, horizon_ms, "safe_cut test")
        .await
        .expect("seal");
    conn.close().await.expect("close");
    p.version()
}

/// (e) On the safe-cut clock the service refuses to start when
/// `max_ttl + reclaim_grace + safetime_gap_max` (1 min + 5 s + 1 min =
/// 125,000 ms) exceeds the sealed horizon, naming the values, and records
/// nothing (the grant policy is not recorded, so fixing either value needs
/// no `policy set`). Both the current epoch's policy and the newest sealed
/// one must cover it. The gap bound is part of it because a grant's expiry
/// is counted from the cut plus the reading's staleness bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn horizon_shorter_than_grant_policy_refuses_start() {
    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let cfg = safe_cut_config(&url);
    let key = || CapabilityKey::new(&PG_KEY).expect("key");
    // No row yet: the newest sealed policy decides.
    assert_eq!(seal(&url, 64_999).await, 2);
    let err = tollgate_server::pg::connect(&cfg, key())
        .await
        .expect_err("horizon too short");
    assert!(
        matches!(err, PgError::HorizonTooShort { version: 2, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "max_ttl PT1M + reclaim_grace PT5S + safetime_gap_max PT1M exceeds the sealed \
         safe-time horizon of 64999 ms = PT1M4.999S (policy version 2, the newest sealed): \
         every deadline the service admits, counted from the cut plus its staleness (at most \
         the gap bound), must fit inside it; lower --max-ttl/--reclaim-grace (tollgate policy \
         set) or --safetime-gap-max, or seal a longer horizon with every sampler stopped"
    );
    let pool = sqlx::PgPool::connect(&url).await.expect("pool");
    assert_eq!(
        tollgate_pg::recorded_policy(&pool).await.expect("read"),
        None
    );
    // A row of an epoch under policy 1 (3650 days) does not hide a shorter
    // newest policy: the next epoch would take it.
    let mut conn = PgConnection::connect(&url).await.expect("connect");
    claimed_row(&mut conn, 1).await;
    let err = tollgate_server::pg::connect(&cfg, key())
        .await
        .expect_err("newest too short");
    assert!(
        matches!(err, PgError::HorizonTooShort { version: 2, .. }),
        "{err:?}"
    );
    // max_ttl + grace alone is not enough: a certain reading may be up to
    // the gap bound stale, and the grant's expiry is counted from the cut
    // plus that.
    assert_eq!(seal(&url, 124_999).await, 3);
    let err = tollgate_server::pg::connect(&cfg, key())
        .await
        .expect_err("the gap bound does not fit");
    assert!(
        matches!(err, PgError::HorizonTooShort { version: 3, .. }),
        "{err:?}"
    );
    // Exactly max_ttl + grace + gap is enough: the service starts, on the cut.
    assert_eq!(seal(&url, 125_000).await, 4);
    let store = tollgate_server::pg::connect(&cfg, key())
        .await
        .expect("horizon covers the policy");
    let clock = tollgate_server::serve::build_clock(&cfg, &store).expect("clock");
    assert_eq!(clock.kind(), ClockKind::SafeCut);
    let reading = clock.read().await.expect("reading");
    assert_eq!(
        (reading.now, reading.uncertain),
        (
            Timestamp::UNIX_EPOCH,
            Some(safetime::UncertainReason::NewEpoch)
        )
    );
    assert_eq!(
        tollgate_pg::recorded_policy(&pool).await.expect("read"),
        Some(default_policy())
    );
    conn.close().await.expect("close");
    pool.close().await;
}

/// The safe-cut clock without PostgreSQL is a configuration error.
#[tokio::test]
async fn safe_cut_clock_needs_postgres() {
    let memory = ServiceStore::memory(default_policy(), CapabilityKey::generate().expect("key"))
        .expect("memory");
    let mut cfg = safe_cut_config("postgres://unused/db");
    cfg.database_url = None;
    let err = tollgate_server::serve::build_clock(&cfg, &memory).expect_err("no pool");
    assert_eq!(
        err.to_string(),
        "invalid configuration: clock safe-cut needs the PostgreSQL store (--database-url)"
    );
}

/// Once a sampler has claimed an epoch, a process on another clock refuses
/// to start against the database: a system clock ahead of the cut would
/// reclaim leases early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_clocks_refuse_a_database_on_the_cut() {
    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let mut system = safe_cut_config(&url);
    system.clock = ClockKind::System;
    let key = || CapabilityKey::new(&PG_KEY).expect("key");
    // No sampler has claimed yet: the system clock may start.
    tollgate_server::pg::connect(&system, key())
        .await
        .expect("no cut row yet");
    let mut conn = PgConnection::connect(&url).await.expect("connect");
    claimed_row(&mut conn, 3).await;
    for clock in [ClockKind::System, ClockKind::Test] {
        let mut cfg = system.clone();
        cfg.clock = clock;
        let err = tollgate_server::pg::connect(&cfg, key())
            .await
            .expect_err("refused");
        assert!(
            matches!(err, PgError::ClockNotSafeCut { epoch: 3, .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "this database's leases are timed by the safe expiry cut (a safe-time sampler \
                 has claimed epoch 3), but this process runs on the {clock} clock, which could \
                 reclaim leases early; run every process that serves or reclaims them with \
                 --clock safe-cut"
            )
        );
        // A read-only process (a direct `tollgate status` or `audit`)
        // decides nothing by its clock: it may open the database.
        let store =
            tollgate_server::pg::connect_for(&cfg, key(), tollgate_server::pg::Access::ReadOnly)
                .await
                .expect("read-only access on any clock");
        assert_eq!(
            store.ops.counts().await.expect("counts"),
            StatusCounts::default()
        );
    }
    conn.close().await.expect("close");
}

/// A process on another clock that was already running when the first
/// sampler claimed (the start-up check passed, so nothing stopped it) can
/// no longer write leases: the database refuses every lease write from a
/// session not declared on the cut (TGS10), so it cannot grant, release
/// or, above all, reclaim by its own clock. It answers 503
/// `storage_unavailable` with the reason, and nothing changes. Found by a
/// new user, whose system-clock service reclaimed a lease 16 s before the
/// cut reached its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_process_on_another_clock_cannot_write_leases_after_the_first_claim() {
    let url = fresh_pg_url().await;
    tollgate_pg::migrate(&url).await.expect("migrate");
    let mut cfg = safe_cut_config(&url);
    cfg.clock = ClockKind::Test;
    let store = tollgate_server::pg::connect(&cfg, CapabilityKey::new(&PG_KEY).expect("key"))
        .await
        .expect("no cut row yet: any clock may start");
    let clock = Arc::new(TestClock::new(ts(T0)));
    let h = harness(store, clock.clone());
    let (a, key) = h.account("a", 100).await;
    let g1 = h.acquire(a, &key, 10, "PT1S").await;
    let g2 = h.acquire(a, &key, 5, "PT1S").await;
    let mut conn = PgConnection::connect(&url).await.expect("connect");
    claimed_row(&mut conn, 1).await;
    // Still within the leases' life by this process's clock: the release
    // reaches the write, which the database refuses.
    h.send(
        Req::post(format!("/v1/leases/{}/release", id(&g1)))
            .token(&cap(&g1))
            .json(json!({"consumed": 1})),
    )
    .await
    .problem(503, "storage_unavailable");
    // An hour later by this process's clock, far past both expiries.
    clock.set(ts("2026-11-29T13:00:00Z"));
    let detail = "clock_not_safe_cut: this database's leases are timed by the safe expiry cut \
                  (a safe-time sampler has claimed an epoch), but this process does not run on \
                  it; restart it with --clock safe-cut (SQLSTATE TGS10)";
    // The API keeps storage details to itself (the log has them); the
    // store's error says exactly why.
    h.send(Req::post("/v1/admin/reclaim").token(ADMIN))
        .await
        .problem(503, "storage_unavailable");
    let err = h
        .store
        .allocator
        .reclaim(ts("2026-11-29T13:00:00Z"), 10)
        .await
        .expect_err("refused by the database");
    assert_eq!(err.code(), "storage_unavailable");
    assert!(err.to_string().contains(detail), "{err}");
    h.send(
        Req::post(format!("/v1/accounts/{a}/leases"))
            .token(&key)
            .json(json!({"units": 1, "ttl": "PT1S"})),
    )
    .await
    .problem(503, "storage_unavailable");
    // Nothing changed: both leases are active, the balance untouched.
    let states: Vec<(i64, String)> =
        sqlx::query_as("SELECT lease_id, state::text FROM tollgate_leases ORDER BY lease_id")
            .fetch_all(&mut conn)
            .await
            .expect("leases");
    assert_eq!(
        states,
        vec![
            (id(&g1), "active".to_string()),
            (id(&g2), "active".to_string())
        ]
    );
    conn.close().await.expect("close");
}

/// Writes the cut row a claim of `epoch` under policy 1 would leave (cut at
/// the Unix epoch, uncertain `new_epoch`), as the table owner.
async fn claimed_row(conn: &mut PgConnection, epoch: i64) {
    sqlx::query(
        "INSERT INTO tollgate_safetime (singleton, epoch, policy_version, cut_floor_us, \
            cut_submicro_ns, certain, uncertain_reason, quarantined, proof_started_at, \
            leader_pid, system_identifier, timeline_id, postmaster_start, claimed_at, \
            published_at, publish_seq) \
         VALUES (true, $1, 1, 0, 0, false, 'new_epoch', false, clock_timestamp(), 0, 0, 1, \
            clock_timestamp(), clock_timestamp(), clock_timestamp(), 0)",
    )
    .bind(epoch)
    .execute(conn)
    .await
    .expect("row");
}
