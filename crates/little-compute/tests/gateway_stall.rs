//! A supervisor that stops answering, through the real processes: a real
//! PostgreSQL, a real sampler, a real `little-compute provider`, a real
//! `little-compute worker` and a real `little-compute gateway`. One
//! instance's supervisor is stopped with a real `SIGSTOP` (its socket still
//! accepts; no request is answered) before the gateway starts; another
//! exec streams output meanwhile. The gateway bounds each call to the
//! stopped supervisor and counts it `provider_timeout`; the other exec
//! keeps its first ownership (generation 1), gets every page once in order
//! and is released; after `SIGCONT` the stalled exec finishes too, under
//! its first ownership, and the tenant's units return exactly once.

mod support;

use std::time::Duration;

use clock::safe_cut::SafeCutClock;
use lc_core::page::SpoolStatus;
use lc_core::store::ControlStore as _;
use lc_core::{ExecId, ExecState, Generation, SandboxLeaseId, TerminalReason};
use lc_provider::{HttpProvider, Provider as _};
use support::{Plane, free_port, metric, reading};

/// The gateway's heartbeat TTL: 3 s, its provider call bound then the
/// default 1 s (a third of it at most). Without the bound each call to the
/// stopped supervisor took the provider's 10 s socket timeout, and every
/// other exec's heartbeat lapsed behind it.
const HEARTBEAT_TTL_MS: &str = "3000";
/// Units of the tenant (each exec of shape `small` holds one).
const UNITS: i64 = 2;
/// The longest any wait of this test polls for.
const WAIT_MAX: Duration = Duration::from_secs(90);

/// The pid of the one process whose `argv[0]` is the supervisor's path in
/// the sandbox and whose cgroup lies under `cgroup_parent`, once there is
/// exactly one (bounded by [`WAIT_MAX`]). Call it once the command has
/// ended, so the pid found is the supervisor's for good.
async fn the_supervisor(cgroup_parent: &str) -> i32 {
    let deadline = std::time::Instant::now() + WAIT_MAX;
    loop {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let is_supervisor = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).next() == Some(b"/.lc/supervisor"));
            let ours = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(cgroup_parent));
            if is_supervisor && ours {
                found.push(pid);
            }
        }
        // Two for a moment while the supervisor forks the command.
        if let [pid] = found[..] {
            return pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not one supervisor: {found:?}"
        );
        tokio::time::sleep(support::POLL).await;
    }
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) on the supervisor this test found by its cgroup.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_supervisor_costs_no_other_exec_its_ownership_through_the_processes() {
    support::ensure_supervisor();
    let db = tollgate_pg_harness::shared().await.fresh_database().await;
    let url = db.url().to_string();
    lc_pg::migrate(&url).await.unwrap();
    let (sampler_stop, _sampler) = support::start_sampler(&url);
    let store = support::connect_store(&url, support::store_config()).await;
    let clock = SafeCutClock::new(store.pool().clone(), support::GAP_MAX);
    support::wait_certain(&clock, WAIT_MAX, support::POLL).await;
    let dir = support::fresh_dir("lc-gw-stall");
    let secret = support::write_secret(&dir);
    let port = free_port();
    let provider_url = format!("http://127.0.0.1:{port}");
    let cgroup_parent = format!("little-compute-gw-stall-{}", std::process::id());
    let provider = support::spawn_provider(port, &dir, &cgroup_parent, "provider.log");
    let http: HttpProvider = support::connect_provider(&provider_url, WAIT_MAX).await;
    let tenant = support::register_base_provider_and_tenant(
        &store,
        reading(&clock).await,
        &http,
        &provider_url,
        UNITS,
    )
    .await;
    let worker = support::spawn_worker(&url, &secret, &provider_url, &dir.join("worker.log"));
    let plane = Plane {
        url,
        store,
        blob_dir: dir.join("blobs"),
        dir,
        secret,
        provider_url,
        cgroup_parent,
        tenant,
        wait_max: WAIT_MAX,
    };

    // The stalled exec: its output spooled, then its supervisor stopped.
    let stalled = plane
        .admit("stalled", reading(&clock).await, "printf stalled", false)
        .await;
    plane
        .wait_for("the stalled exec's Lease", async || {
            plane
                .scalar(
                    "SELECT count(*) FROM lc_sandbox_leases WHERE exec_id = $1 AND state = 'active'",
                    stalled,
                )
                .await
                == 1
        })
        .await;
    let lease_of = async |e: ExecId| {
        let sql = "SELECT lease_id FROM lc_sandbox_leases WHERE exec_id = $1";
        let lease = plane.scalar(sql, e).await;
        let sql = "SELECT generation FROM lc_sandbox_leases WHERE exec_id = $1";
        (
            SandboxLeaseId(lease),
            Generation(plane.scalar(sql, e).await),
        )
    };
    let (lease, generation) = lease_of(stalled).await;
    plane
        .wait_for("the stalled exec's output is spooled", async || {
            matches!(
                http.spool_status(lease, generation).await,
                Ok(Some(SpoolStatus {
                    terminal_seq: 2,
                    ..
                }))
            )
        })
        .await;
    let pid = the_supervisor(&plane.cgroup_parent).await;
    kill(pid, libc::SIGSTOP);

    // The other exec streams over several of the gateway's steps.
    let (script, want) = support::script(5, "0.3");
    let other = plane
        .admit("other", reading(&clock).await, &script, false)
        .await;
    let metrics_port = free_port();
    let gateway = support::spawn_gateway(&support::GatewayArgs {
        heartbeat_ttl_ms: Some(HEARTBEAT_TTL_MS),
        metrics_port: Some(metrics_port),
        ..plane.gateway_args("gateway")
    });
    plane
        .wait_for("the other exec is released", async || {
            plane.releases(other).await == 1
        })
        .await;
    assert_eq!(plane.output(other).await, (want, Some(3)));
    // The worker destroys its instance and proves it: the exec ends.
    plane
        .wait_for("the other exec is terminal", async || {
            let e = plane.store.exec(plane.tenant, other).await.unwrap();
            e.state == ExecState::Terminal
        })
        .await;
    assert_eq!(
        plane.settled(other).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(3),
            1,
            1
        )
    );
    let timeouts = metric(metrics_port, "lc_gateway_provider_timeouts_total")
        .await
        .expect("the gateway's metrics");
    assert!(timeouts >= 1, "the stalled exec's calls hit the bound");
    // Every failure was a call to the stopped supervisor at the bound;
    // nothing was refused or taken over.
    for (name, want) in [
        ("lc_gateway_failures_total", timeouts),
        ("lc_gateway_stale_refused_total", 0),
        ("lc_gateway_takeovers_total", 0),
        ("lc_gateway_claims_total", 2),
    ] {
        assert_eq!(metric(metrics_port, name).await, Some(want), "{name}");
    }
    // Nothing of the stalled exec was acked while it was stopped.
    assert_eq!(plane.acked_pages(stalled).await, 0);

    // Continued, it finishes under its first ownership.
    kill(pid, libc::SIGCONT);
    plane.wait_released(stalled).await;
    assert_eq!(plane.output(stalled).await, (b"stalled".to_vec(), Some(0)));
    assert_eq!(
        plane.settled(stalled).await,
        (
            ExecState::Terminal,
            Some(TerminalReason::Exited),
            Some(0),
            1,
            1
        )
    );
    assert_eq!(
        metric(metrics_port, "lc_gateway_stale_refused_total").await,
        Some(0)
    );
    support::assert_audit_clean(&plane.store, UNITS).await;

    drop(gateway);
    let _ = sampler_stop.send(true);
    drop(worker);
    drop(provider);
    let _ = std::fs::remove_dir_all(&plane.dir);
    support::remove_cgroup_parent(&plane.cgroup_parent);
}

/// `--provider-call-timeout-ms` outside 10 up to a third of
/// `--heartbeat-ttl-ms` is refused before anything is opened, exit 2.
#[test]
fn a_provider_call_bound_outside_its_range_is_refused() {
    for (ttl_ms, call_ms, max) in [("5000", "1667", 1666), ("3000", "9", 1000)] {
        let out = std::process::Command::new(support::exe())
            .args(["gateway", "--database-url", "postgres://127.0.0.1:9/none"])
            .args(["--secret-file", "/nonexistent/secret"])
            .args(["--blob-dir", "/nonexistent/blobs"])
            .args(["--heartbeat-ttl-ms", ttl_ms])
            .args(["--provider-call-timeout-ms", call_ms])
            .env_remove("LC_GATEWAY_CRASH_AT")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!(
                "little-compute gateway: --provider-call-timeout-ms must be in 10..={max} (at most a third of --heartbeat-ttl-ms), got {call_ms}\n"
            )
        );
    }
}
