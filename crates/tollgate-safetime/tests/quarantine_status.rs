//! `tollgate-safetime status` during a real initial quarantine says how
//! much trusted time the proof still needs and how to shorten it: a
//! populated installation, a sealed one-hour horizon, a running sampler.
//! The proof needs exactly the horizon plus the 50 ppm drift allowance
//! (`3600.180009001 s`), and what remains plus what was observed is that,
//! to the nanosecond. On PostgreSQL 15.

mod support;

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use support::{CutWatch, SamplerProc};
use tollgate::{CapabilityKey, GrantPolicy};
use tollgate_pg_harness::PgServer;

/// `tollgate-safetime status` with the sampler's recovery grace (`FAST`:
/// 500 ms), parsed.
fn status(url: &str) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-safetime"))
        .args([
            "status",
            "--gap-max",
            "2s",
            "--recovery-grace",
            "500ms",
            "--database-url",
            url,
        ])
        .env_remove("TOLLGATE_SAFETIME_GAP_MAX")
        .env_remove("TOLLGATE_SAFETIME_DRIFT_PPM")
        .env_remove("TOLLGATE_SAFETIME_RECOVERY_GRACE")
        .output()
        .expect("run tollgate-safetime status");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// `tollgate-safetime policy show` with standard output on a terminal (a
/// pseudo-terminal of `script`) or on a pipe: its raw output.
fn policy_show(url: &str, terminal: bool) -> String {
    let bin = env!("CARGO_BIN_EXE_tollgate-safetime");
    let mut cmd = if terminal {
        let mut c = std::process::Command::new("script");
        c.args([
            "-qec",
            &format!("'{bin}' policy show --database-url '{url}'"),
            "/dev/null",
        ]);
        c
    } else {
        let mut c = std::process::Command::new(bin);
        c.args(["policy", "show", "--database-url", url]);
        c
    };
    let out = cmd.output().expect("run tollgate-safetime policy show");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
}

fn ns(v: &Value) -> i128 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a decimal string: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_quarantine_progress() {
    let server = PgServer::start_dedicated_with(support::binaries(15)).unwrap();
    let db = server.fresh_database().await;
    tollgate_pg::migrate(db.url()).await.unwrap();
    // A lease before any sampler ran: the installation starts quarantined.
    let policy =
        GrantPolicy::new(SignedDuration::from_secs(1), SignedDuration::from_secs(1)).unwrap();
    let store =
        tollgate_pg::PostgresStore::connect(db.url(), policy, CapabilityKey::generate().unwrap())
            .await
            .unwrap();
    let t0 = Timestamp::now();
    let a = tollgate::testkit::new_account(&store, "q", 10, t0).await;
    tollgate::testkit::acquire(&store, a, 4, SignedDuration::from_secs(1), t0).await;
    let mut owner = sqlx::Connection::connect(db.url()).await.unwrap();
    safetime_pg::seal_policy(&mut owner, 3_600_000, "quarantine status")
        .await
        .unwrap();

    // Results print as `tollgate` prints them: indented on a terminal, one
    // line on a pipe, the same document either way.
    let pretty = policy_show(db.url(), true);
    let line = policy_show(db.url(), false);
    assert_eq!(line.lines().count(), 1, "{line}");
    assert_eq!(pretty.lines().count(), 5, "{pretty}");
    let doc: Value = serde_json::from_str(&line).expect("policy JSON");
    assert_eq!(doc["horizon_ms"], 3_600_000, "{doc}");
    assert_eq!(
        serde_json::from_str::<Value>(&pretty).expect("policy JSON"),
        doc
    );

    // Before any sampler: no row, no quarantine member at all.
    let before = status(db.url());
    assert_eq!(before["uncertain_reason"], "no_cut", "{before}");

    let sampler = SamplerProc::start(db.url(), "quarantine-status");
    let mut w = CutWatch::new(db.url()).await;
    w.until(30, "the quarantined cut", |r| r.epoch == 1 && r.quarantined)
        .await;
    let st = status(db.url());
    // Every instant and duration has its lossless companion, and each
    // instant is UTC with `Z`.
    for key in ["cut", "published_at", "database_time"] {
        let text = st[key].as_str().expect(key);
        assert!(text.ends_with('Z'), "{key}: {text}");
        let t: Timestamp = text.parse().expect(key);
        assert_eq!(
            ns(&st[format!("{key}_ns").as_str()]),
            t.as_nanosecond(),
            "{key}"
        );
    }
    for key in ["cut_lag", "gap_max"] {
        let d: SignedDuration = st[key].as_str().expect(key).parse().expect(key);
        assert_eq!(ns(&st[format!("{key}_ns").as_str()]), d.as_nanos(), "{key}");
    }
    assert_eq!(st["gap_max_ns"], "2000000000", "{st}");
    let started: Timestamp = st["quarantine"]["proof_started_at"]
        .as_str()
        .expect("proof_started_at")
        .parse()
        .expect("instant");
    assert_eq!(
        ns(&st["quarantine"]["proof_started_at_ns"]),
        started.as_nanosecond()
    );
    assert_eq!(
        (
            &st["quarantined"],
            &st["published_reason"],
            &st["horizon_ms"]
        ),
        (
            &Value::from(true),
            &Value::from("initial_quarantine"),
            &Value::from(3_600_000)
        ),
        "{st}"
    );
    let q = &st["quarantine"];
    // 1 h / (1 - 50 ppm), rounded up to the nanosecond.
    assert_eq!(
        (&q["required"], &q["required_ns"], &q["drift_ppm"]),
        (
            &Value::from("PT1H0.180009001S"),
            &Value::from("3600180009001"),
            &Value::from(50)
        ),
        "{st}"
    );
    let (observed, remaining) = (ns(&q["observed_ns"]), ns(&q["remaining_ns"]));
    assert_eq!(observed + remaining, 3_600_180_009_001, "{st}");
    // The sampler has run well under a minute of the hour.
    assert!((0..60_000_000_000).contains(&observed), "{st}");
    // The proof began at the database time of the epoch's first publish.
    let started: Timestamp = q["proof_started_at"].as_str().unwrap().parse().unwrap();
    let db_now: Timestamp = st["database_time"].as_str().unwrap().parse().unwrap();
    assert_eq!(db_now.duration_since(started).as_nanos(), observed, "{st}");
    let iso = |n: i128| SignedDuration::from_nanos_i128(n).to_string();
    assert_eq!(
        (&q["observed"], &q["remaining"]),
        (&Value::from(iso(observed)), &Value::from(iso(remaining))),
        "{st}"
    );
    assert_eq!(
        q["hint"],
        Value::from(format!(
            "the initial quarantine needs {} more of uninterrupted trusted time (a proof of \
             PT1H0.180009001S in all: the sealed horizon PT1H plus the 50 ppm drift allowance; \
             {} observed since it began; an anomaly, a sampler restart or a takeover restarts \
             it). To shorten it safely: stop every sampler, seal a shorter horizon (at least \
             the service's max_ttl + reclaim_grace + --safetime-gap-max, and no shorter than \
             any active lease's granted TTL plus grace; the database refuses one below the \
             recorded max_ttl + reclaim_grace) with `tollgate-safetime policy \
             seal --horizon-ms <ms> --sealed-by <name>`, then start the samplers again; the \
             next epoch's proof runs for the new horizon",
            iso(remaining),
            iso(observed)
        )),
        "{st}"
    );
    assert_eq!(sampler.terminate(), Some(0));
}
