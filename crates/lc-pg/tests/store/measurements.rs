//! Measurements in the store: recorded only when signed by the Lease's
//! provider about exactly that Lease generation, stored value by value
//! with absence kept as NULL (never 0 or false), never losing a measured
//! value to a later unknown one, shown on the exec, refused once the Lease
//! is released; the database's guard on the table.

use lc_core::evidence::Statement;
use lc_core::observation::{AttemptObservation, CostObservation, ExternalityObservation};
use lc_core::{ControlStore, Generation, ReconcileStore, SandboxLeaseId, TerminalReason};
use sqlx::{Connection, PgConnection};

use crate::support::*;

type Columns = (
    Option<i64>,
    Option<i64>,
    Option<bool>,
    Option<bool>,
    Option<bool>,
);

async fn columns(url: &str, lease: SandboxLeaseId) -> Option<(Columns, serde_json::Value)> {
    let mut c = PgConnection::connect(url).await.unwrap();
    type Row = (
        Option<i64>,
        Option<i64>,
        Option<bool>,
        Option<bool>,
        Option<bool>,
        serde_json::Value,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT cpu_time_ms, peak_memory_bytes, network_writes, database_commits, \
                external_api_calls, evidence FROM lc_measurements WHERE lease_id = $1",
    )
    .bind(lease.0)
    .fetch_optional(&mut c)
    .await
    .unwrap();
    row.map(|(a, b, n, d, x, ev)| ((a, b, n, d, x), ev))
}

fn measurement(
    p: &TestProvider,
    lease: SandboxLeaseId,
    generation: i64,
    cost: Option<CostObservation>,
    network: bool,
) -> serde_json::Value {
    p.sign(Statement::Measurement {
        provider_id: p.id.to_string(),
        lease_id: lease.0,
        generation,
        cost,
        externality: ExternalityObservation::of_sandbox(network),
    })
}

#[tokio::test]
async fn a_measurement_is_stored_value_by_value_and_never_loses_what_was_measured() {
    let f = fixture(2).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("m", "m"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    let lease = e.canonical.lease_id;
    let g = Generation(1);
    f.store.mark_active(lease, g, at).await.unwrap();
    assert_eq!(
        f.store.exec(f.tenant, e.exec_id).await.unwrap().observation,
        None
    );

    // Refused, nothing written: another key, another generation, another
    // Lease, and a statement that is not a measurement.
    let cost = CostObservation {
        cpu_time_ms: 0,
        peak_memory_bytes: 1_048_576,
    };
    let before = snapshot(&f.db.url).await;
    let forger = TestProvider::new("p1", 9);
    let cases = [
        (
            measurement(&forger, lease, 1, Some(cost), false),
            "evidence_rejected",
        ),
        (
            measurement(&f.provider, lease, 2, Some(cost), false),
            "evidence_rejected",
        ),
        (
            measurement(
                &f.provider,
                SandboxLeaseId(lease.0 + 100),
                1,
                Some(cost),
                false,
            ),
            "evidence_rejected",
        ),
        (f.provider.absence(lease, 1), "evidence_rejected"),
        (serde_json::json!({"payloadType": "x"}), "evidence_rejected"),
    ];
    for (i, (ev, code)) in cases.iter().enumerate() {
        let err = f
            .store
            .record_measurement(lease, g, ev, at)
            .await
            .unwrap_err();
        assert_eq!(err.code(), *code, "case {i}: {err}");
    }
    let not_a_measurement = f
        .store
        .record_measurement(lease, g, &f.provider.absence(lease, 1), at)
        .await
        .unwrap_err();
    assert!(
        not_a_measurement
            .to_string()
            .contains("not_a_measurement: the statement is absence, not measurement"),
        "{not_a_measurement}"
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // A measured zero CPU time and a clean sandbox: stored as 0 and false.
    let first = measurement(&f.provider, lease, 1, Some(cost), false);
    let clean = AttemptObservation {
        cost: Some(cost),
        externality: ExternalityObservation::no_network_path(),
    };
    assert_eq!(
        f.store
            .record_measurement(lease, g, &first, at)
            .await
            .unwrap(),
        clean
    );
    let stored = (
        Some(0),
        Some(1_048_576),
        Some(false),
        Some(false),
        Some(false),
    );
    assert_eq!(
        columns(&f.db.url, lease).await,
        Some((stored, first.clone()))
    );
    assert_eq!(
        f.store.exec(f.tenant, e.exec_id).await.unwrap().observation,
        Some(clean)
    );

    // A later measurement without a cost (the groups are gone) keeps the
    // measured one, evidence and all.
    let later = certain(&f.clock).await;
    let unreadable = measurement(&f.provider, lease, 1, None, false);
    assert_eq!(
        f.store
            .record_measurement(lease, g, &unreadable, later)
            .await
            .unwrap(),
        clean
    );
    assert_eq!(
        columns(&f.db.url, lease).await,
        Some((stored, first.clone()))
    );
    // A later one with a cost replaces it.
    let grown = CostObservation {
        cpu_time_ms: 1_500,
        peak_memory_bytes: 2_097_152,
    };
    let second = measurement(&f.provider, lease, 1, Some(grown), false);
    assert_eq!(
        f.store
            .record_measurement(lease, g, &second, later)
            .await
            .unwrap()
            .cost,
        Some(grown)
    );
    assert_eq!(
        columns(&f.db.url, lease).await,
        Some((
            (
                Some(1_500),
                Some(2_097_152),
                Some(false),
                Some(false),
                Some(false)
            ),
            second.clone()
        ))
    );

    // The database refuses to drop a measured value (LCSM1), or to write
    // half a cost.
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    for (sql, code) in [
        (
            "UPDATE lc_measurements SET cpu_time_ms = NULL, peak_memory_bytes = NULL",
            "LCSM1",
        ),
        ("UPDATE lc_measurements SET network_writes = NULL", "LCSM1"),
        (
            "UPDATE lc_measurements SET cpu_time_ms = cpu_time_ms - 1",
            "LCSM1",
        ),
        (
            "UPDATE lc_measurements SET peak_memory_bytes = peak_memory_bytes - 1",
            "LCSM1",
        ),
        (
            "UPDATE lc_measurements SET external_api_calls = NULL",
            "LCSM1",
        ),
        (
            "UPDATE lc_measurements SET peak_memory_bytes = NULL",
            "23514",
        ),
        ("DELETE FROM lc_measurements", "LCS91"),
    ] {
        let err = sqlx::query(sql).execute(&mut c).await.unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|d| d.code()).as_deref(),
            Some(code),
            "{sql}: {err}"
        );
    }

    // A side effect once recorded stays: true never becomes false.
    sqlx::query("UPDATE lc_measurements SET database_commits = true")
        .execute(&mut c)
        .await
        .unwrap();
    let err = sqlx::query("UPDATE lc_measurements SET database_commits = false")
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("LCSM1"),
        "{err}"
    );
    // Nor does a clean measurement replace it through the store.
    assert_eq!(
        f.store
            .record_measurement(lease, g, &second, later)
            .await
            .unwrap()
            .externality
            .database_commits,
        Some(true)
    );

    // Released: its instance is gone, nothing more to measure.
    f.store
        .cancel(&op("mc", "cancel"), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    f.store
        .begin_release(lease, g, TerminalReason::Cancelled, later)
        .await
        .unwrap();
    let now = certain(&f.clock).await;
    f.store
        .commit_release(lease, g, &f.provider.absence(lease, 1), now)
        .await
        .unwrap();
    assert_eq!(
        f.store
            .record_measurement(lease, g, &unreadable, now)
            .await
            .unwrap_err()
            .code(),
        "illegal_transition"
    );
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_network_sandbox_s_side_effects_are_stored_unknown() {
    let f = fixture(1).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("n", "n"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    let lease = e.canonical.lease_id;
    let ev = measurement(&f.provider, lease, 1, None, true);
    let unknown = AttemptObservation {
        cost: None,
        externality: ExternalityObservation::absent(),
    };
    assert_eq!(
        f.store
            .record_measurement(lease, Generation(1), &ev, at)
            .await
            .unwrap(),
        unknown
    );
    assert_eq!(
        columns(&f.db.url, lease).await,
        Some(((None, None, None, None, None), ev))
    );
    assert_eq!(
        f.store.exec(f.tenant, e.exec_id).await.unwrap().observation,
        Some(unknown)
    );
    f.sampler.stop().await;
}
