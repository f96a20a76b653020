//! A client generated from the served `/openapi.json` by a standard
//! generator (`openapi-python-client`, pinned in scripts/test.sh) drives
//! the real router over a loopback socket: create an account, deposit,
//! acquire with an `Idempotency-Key` (and its replay), renew (kept and
//! clamped), release, and the 409 problems parsed. The generated client
//! parses every `format: date-time` field into Python's microsecond
//! `datetime`, so the test also pins that the `_ns` companion carries the
//! exact nanoseconds that the date-time field loses.
//!
//! The generator lives in a venv (`TOLLGATE_OPENAPI_CLIENT_VENV`, default
//! `/var/tmp/tollgate-openapi-client-venv`, which scripts/test.sh creates);
//! without it the test fails, naming what to run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use httpkit::ConnectionLimits;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tollgate::CapabilityKey;
use tollgate_api::api;
use tollgate_api::storage::ServiceStore;
use tollgate_api::testkit::*;

/// Where the generator's venv is when `TOLLGATE_OPENAPI_CLIENT_VENV` is unset.
const DEFAULT_VENV: &str = "/var/tmp/tollgate-openapi-client-venv";

/// Longest the generator or the program may run (`timeout(1)` ends it).
const STEP_MAX_SECS: &str = "300";

/// The test clock's instant: nanoseconds a microsecond type cannot hold.
const NOW: &str = "2026-11-29T12:00:00.123456789Z";

/// The venv holding `openapi-python-client`, or a panic naming the fix.
fn venv() -> PathBuf {
    let dir = std::env::var_os("TOLLGATE_OPENAPI_CLIENT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_VENV));
    for exe in ["python", "openapi-python-client"] {
        let path = dir.join("bin").join(exe);
        assert!(
            path.is_file(),
            "{} is missing: run `bash scripts/test.sh` (it installs openapi-python-client \
             into {DEFAULT_VENV}) or point TOLLGATE_OPENAPI_CLIENT_VENV at a venv holding it",
            path.display()
        );
    }
    dir
}

/// Runs `program args` under `timeout`, with the venv first on `PATH`, in
/// `dir`; returns its standard output, or panics with both streams.
fn run(
    venv: &Path,
    dir: &Path,
    program: &Path,
    args: &[&str],
    pythonpath: Option<&Path>,
) -> String {
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("timeout");
    cmd.arg(STEP_MAX_SECS)
        .arg(program)
        .args(args)
        .current_dir(dir)
        .env("PATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    if let Some(p) = pythonpath {
        cmd.env("PYTHONPATH", p);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        program.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The program run through the generated client. It prints one JSON
/// object of what it observed; the Rust side asserts every value.
const PROGRAM: &str = r#"
import json, sys
from tollgate_client import AuthenticatedClient
from tollgate_client.api.accounts import create_account, deposit, get_account
from tollgate_client.api.leases import acquire, renew, release
from tollgate_client.models import (
    AccountView, AcquireBody, CreateAccountBody, CreatedAccount, DepositBody, GrantView,
    Problem, ReleaseBody, RenewBody, RenewalView, SettlementView,
)

base, admin = sys.argv[1], sys.argv[2]
out = {}
with AuthenticatedClient(base_url=base, token=admin, raise_on_unexpected_status=True) as c:
    created = create_account.sync(client=c, body=CreateAccountBody(name="team blue"))
    assert isinstance(created, CreatedAccount), created
    dep = deposit.sync(created.account_id, client=c, body=DepositBody(units=100))
    assert isinstance(dep, AccountView), dep
    out["account"] = [created.account_id, created.name, dep.deposited, dep.available]

with AuthenticatedClient(base_url=base, token=created.api_key) as k:
    body = AcquireBody(units=10, ttl="PT30.000000001S")
    g = acquire.sync(created.account_id, client=k, body=body, idempotency_key="job-42")
    assert isinstance(g, GrantView), g
    again = acquire.sync(created.account_id, client=k, body=body, idempotency_key="job-42")
    assert isinstance(again, GrantView), again
    other = acquire.sync(created.account_id, client=k,
                         body=AcquireBody(units=11, ttl="PT30.000000001S"),
                         idempotency_key="job-42")
    assert isinstance(other, Problem), other
    out["grant"] = {
        "lease_id": g.lease_id, "units": g.units,
        "expiry_datetime": g.expiry.isoformat(), "expiry_ns": g.expiry_ns,
        "expiry_ns_is_str": isinstance(g.expiry_ns, str),
        "granted_ttl": g.granted_ttl, "granted_ttl_ns": g.granted_ttl_ns,
        "expires_in_ns": g.expires_in_ns, "ttl_clamped": g.ttl_clamped,
        "replay_same_lease": again.lease_id == g.lease_id,
        "replay_expiry_ns": again.expiry_ns,
    }
    out["conflict"] = [other.status, other.code, other.type_, other.detail]

with AuthenticatedClient(base_url=base, token=g.capability) as cap:
    kept = renew.sync(g.lease_id, client=cap, body=RenewBody(ttl="PT10S"))
    assert isinstance(kept, RenewalView), kept
    clamped = renew.sync(g.lease_id, client=cap, body=RenewBody(ttl="PT2H"))
    assert isinstance(clamped, RenewalView), clamped
    out["renew_kept"] = [kept.extended, kept.ttl_clamped, kept.expiry_ns,
                         kept.expiry.isoformat(), kept.granted_ttl_ns, kept.expires_in_ns]
    out["renew_clamped"] = [clamped.extended, clamped.ttl_clamped, clamped.requested_ttl,
                            clamped.requested_ttl_ns, clamped.granted_ttl,
                            clamped.granted_ttl_ns, clamped.expiry_ns,
                            clamped.expiry.isoformat()]
    s = release.sync(g.lease_id, client=cap, body=ReleaseBody(consumed=4))
    assert isinstance(s, SettlementView), s
    out["release"] = [s.state.value, s.consumed, s.returned, s.settled_at_ns,
                      s.settled_at.isoformat(), s.balances.available, s.balances.consumed]
    late = renew.sync(g.lease_id, client=cap, body=RenewBody(ttl="PT10S"))
    assert isinstance(late, Problem), late
    out["renew_released"] = [late.status, late.code, late.detail]

print(json.dumps(out, sort_keys=True))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_python_client_end_to_end() {
    let venv = venv();
    let store = ServiceStore::memory(default_policy(), CapabilityKey::generate().expect("key"))
        .expect("memory store");
    let state = state(
        store,
        Arc::new(clock::TestClock::new(ts(NOW))),
        Duration::from_secs(30),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(httpkit::serve(
        listener,
        api::router(state.clone()),
        state,
        ConnectionLimits {
            connections_max: 64,
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
        },
        async move {
            let _ = stopped.await;
        },
    ));

    let dir = std::env::temp_dir().join(format!(
        "tollgate-generated-client-{}-{}",
        std::process::id(),
        addr.port()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work directory");
    std::fs::write(dir.join("check.py"), PROGRAM).expect("program");
    let base = format!("http://{addr}");
    let output = {
        let (venv, dir, base) = (venv.clone(), dir.clone(), base.clone());
        tokio::task::spawn_blocking(move || {
            run(
                &venv,
                &dir,
                &venv.join("bin/openapi-python-client"),
                &[
                    "generate",
                    "--url",
                    &format!("{base}/openapi.json"),
                    "--output-path",
                    "gen",
                ],
                None,
            );
            run(
                &venv,
                &dir,
                &venv.join("bin/python"),
                &["check.py", &base, ADMIN],
                Some(&dir.join("gen")),
            )
        })
        .await
        .expect("the client steps")
    };
    let _ = stop.send(());
    served.await.expect("served");
    let _ = std::fs::remove_dir_all(&dir);

    let seen: Value = serde_json::from_str(output.trim())
        .unwrap_or_else(|e| panic!("{e}: the program printed {output:?}"));
    assert_eq!(seen["account"], json!([1, "team blue", 100, 100]));
    // 12:00:00.123456789 + 30.000000001 s: the date-time field holds only
    // the microseconds (truncated), the companion every nanosecond.
    assert_eq!(
        seen["grant"],
        json!({
            "lease_id": 1, "units": 10,
            "expiry_datetime": "2026-11-29T12:00:30.123456+00:00",
            "expiry_ns": "1795953630123456790", "expiry_ns_is_str": true,
            "granted_ttl": "PT30.000000001S", "granted_ttl_ns": "30000000001",
            "expires_in_ns": "30000000001", "ttl_clamped": false,
            "replay_same_lease": true, "replay_expiry_ns": "1795953630123456790",
        })
    );
    assert_eq!(
        seen["conflict"],
        json!([
            409,
            "idempotency_conflict",
            "urn:tollgate:problem:idempotency_conflict",
            "idempotency key was used with a different request"
        ])
    );
    // now + 10 s does not pass the expiry: kept, and the answer says so.
    assert_eq!(
        seen["renew_kept"],
        json!([
            false,
            false,
            "1795953630123456790",
            "2026-11-29T12:00:30.123456+00:00",
            "10000000000",
            "30000000001"
        ])
    );
    // 2 h is clamped to max_ttl (1 min), which passes the expiry.
    assert_eq!(
        seen["renew_clamped"],
        json!([
            true,
            true,
            "PT2H",
            "7200000000000",
            "PT1M",
            "60000000000",
            "1795953660123456789",
            "2026-11-29T12:01:00.123456+00:00"
        ])
    );
    assert_eq!(
        seen["release"],
        json!([
            "released",
            4,
            6,
            "1795953600123456789",
            "2026-11-29T12:00:00.123456+00:00",
            96,
            4
        ])
    );
    assert_eq!(
        seen["renew_released"],
        json!([409, "lease_not_active", "lease 1 is released, not active"])
    );
}
