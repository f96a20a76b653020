//! Output through the exec gateway against a bare pipe read, and the time
//! a successor gateway takes over, in one run.
//!
//! Per round, in this order:
//!
//! 1. **bare pipe**: `head -c BYTES /dev/urandom` spawned with its stdout
//!    on a pipe, read to EOF in 64 KiB reads: spawn to EOF. Random bytes,
//!    so every page of the gateway side has its own digest (pages of equal
//!    bytes would share one blob and skip its writes).
//! 2. **gateway**: an exec of the same command in a real bubblewrap
//!    instance (`base`, `small`), its output moved by an in-process
//!    `lc_gateway::Gateway` stepping back to back (each page: metadata
//!    committed, bytes fsynced into the sink, ACK result committed, the
//!    supervisor told), from the instance being up (`mark_active`) to the
//!    gateway's release of the Lease after its terminal page is acked.
//! 3. **takeover**: an exec writing 64 KiB of random bytes every 10 ms, owned by gateway A
//!    (1 s heartbeat TTL, the shortest); A stops stepping (as if killed)
//!    right after a step that acked pages; gateway B steps back to back from
//!    then until its first step that acks a page: kill to first new ACK.
//!
//! Needs root (cgroups) and `lc-supervisor` (`--supervisor-bin`, by
//! default next to this executable: `cargo build --release -p lc-supervisor`).

use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use clock::Clock;
use clock::safe_cut::SafeCutClock;
use jiff::{SignedDuration, Timestamp};
use lc_core::store::{ControlStore, ReconcileStore};
use lc_core::{CutReading, Digest, ExecId, ExecRequest, OperationKey, TenantId};
use lc_gateway::{Gateway, GatewayOptions, ProviderConnector};
use lc_pg::{LcConfig, LcStore};
use lc_provider::{AllocateRequest, BwrapConfig, BwrapProvider, Provider, ProviderError};
use safetime::SafeTimeConfig;
use safetime_pg::sampler::{Sampler, SamplerOptions};
use tokio::sync::watch;
use tollgate_bench::BenchServer;

const DB_NAME: &str = "tollgate_bench_lc_gateway";
/// The longest wait for a certain cut, an exec's end or a takeover.
const WAIT_MAX: Duration = Duration::from_secs(120);
/// The most rounds of one run.
const ROUNDS_MAX: u32 = 100;
/// The largest output of one exec.
const BYTES_MAX: u64 = 1 << 32;

#[derive(Parser, Debug)]
#[command(about = "Output through the exec gateway against a bare pipe read, and takeover time")]
struct Args {
    /// Bytes the command writes per round.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    bytes: u64,
    /// Rounds.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// The `lc-supervisor` binary (default: next to this executable).
    #[arg(long)]
    supervisor_bin: Option<PathBuf>,
    /// A PostgreSQL URL (its database `tollgate_bench_lc_gateway` is
    /// dropped and recreated) instead of a dedicated harness server.
    #[arg(long)]
    database_url: Option<String>,
}

struct InProcess(Arc<BwrapProvider>);

#[async_trait::async_trait]
impl ProviderConnector for InProcess {
    async fn connect(&self, _url: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(self.0.clone())
    }
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("lc_gateway_output: {e}");
        std::process::exit(1);
    }
}

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

struct Rig {
    store: Arc<LcStore>,
    clock: Arc<SafeCutClock>,
    provider: Arc<BwrapProvider>,
    sink: Arc<lc_blob::LocalBlobStore>,
    tenant: TenantId,
    dir: PathBuf,
}

impl Rig {
    async fn reading(&self) -> Result<CutReading, String> {
        let r = self.clock.read().await.map_err(e)?;
        Ok(CutReading {
            cut: r.now,
            certain: r.uncertain.is_none(),
            retry_after_s: 1,
        })
    }

    fn gateway(&self, ttl: SignedDuration) -> Result<Gateway, String> {
        Gateway::new(
            self.store.clone(),
            Arc::new(InProcess(self.provider.clone())),
            self.sink.clone(),
            self.clock.clone(),
            GatewayOptions {
                heartbeat_ttl: ttl,
                ..GatewayOptions::default()
            },
        )
        .map_err(e)
    }

    /// Admits `script`, allocates its instance and marks it active;
    /// returns once it is up.
    async fn start(&self, key: &str, script: &str) -> Result<ExecId, String> {
        let exec = self
            .store
            .admit_exec(
                &OperationKey::new(key, Digest::of(key.as_bytes())).map_err(e)?,
                self.reading().await?,
                self.tenant,
                &ExecRequest {
                    runtime: "base".into(),
                    shape: "small".into(),
                    command: vec!["sh".into(), "-c".into(), script.into()],
                    timeout_ms: None,
                    stdin_open: false,
                    idle_ttl_ms: None,
                    on_timeout: lc_core::OnTimeout::Terminate,
                },
            )
            .await
            .map_err(e)?
            .exec_id;
        let at = self.reading().await?;
        let w = self
            .store
            .due_work(at, 100)
            .await
            .map_err(e)?
            .into_iter()
            .find(|w| w.exec_id == exec)
            .ok_or("the exec's lease is not due")?;
        self.provider
            .allocate(AllocateRequest {
                lease_id: w.lease_id,
                generation: w.generation,
                exec_id: w.exec_id,
                attempt: w.attempt,
                runtime: w.runtime,
                shape: lc_core::Shape::by_name(&w.shape).map_err(e)?,
                command: lc_core::Command::new(w.command.clone()).map_err(e)?,
                workspace_id: w.workspace_id,
                stdin_open: false,
                first_seq: 1,
                first_input_seq: 1,
                restore: None,
            })
            .await
            .map_err(e)?;
        self.store
            .mark_active(w.lease_id, w.generation, at)
            .await
            .map_err(e)?;
        Ok(exec)
    }

    /// Destroys every lease the gateway released and commits the proofs,
    /// so the next round starts clean.
    async fn settle(&self) -> Result<(), String> {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let at = self.reading().await?;
            let work = self.store.due_work(at, 100).await.map_err(e)?;
            let pending: Vec<_> = work
                .into_iter()
                .filter(|w| w.state == lc_core::LeaseState::ReleasePending)
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            for w in pending {
                let env = self
                    .provider
                    .destroy(w.lease_id, w.generation)
                    .await
                    .map_err(e)?;
                if at.certain {
                    self.store
                        .commit_release(
                            w.lease_id,
                            w.generation,
                            &serde_json::to_value(&env).map_err(e)?,
                            at,
                        )
                        .await
                        .map_err(e)?;
                }
            }
            if Instant::now() > deadline {
                return Err("releases not committed in time".into());
            }
        }
    }
}

fn bare_pipe(bytes: u64) -> Result<Duration, String> {
    let started = Instant::now();
    let mut child = std::process::Command::new("head")
        .args(["-c", &bytes.to_string(), "/dev/urandom"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(e)?;
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = out.read(&mut buf).map_err(e)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    child.wait().map_err(e)?;
    if total != bytes {
        return Err(format!("read {total} of {bytes} bytes"));
    }
    Ok(started.elapsed())
}

async fn run(args: &Args) -> Result<(), String> {
    if !(1..=ROUNDS_MAX).contains(&args.rounds) || !(1..=BYTES_MAX).contains(&args.bytes) {
        return Err(format!(
            "--rounds in 1..={ROUNDS_MAX}, --bytes in 1..={BYTES_MAX}"
        ));
    }
    let supervisor = match &args.supervisor_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(e)?
            .with_file_name("lc-supervisor"),
    };
    let server = BenchServer::start(args.database_url.as_deref())?;
    let url = server.fresh_database(DB_NAME).await?;
    lc_pg::migrate(&url).await.map_err(e)?;
    let sampler = Sampler::new(
        &url,
        SamplerOptions {
            config: SafeTimeConfig::new(
                50,
                SignedDuration::from_millis(50),
                SignedDuration::from_secs(2),
                SignedDuration::from_millis(500),
                3,
                SignedDuration::from_millis(200),
            )
            .map_err(e)?,
            standby_poll: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(500),
        },
    )
    .map_err(e)?;
    let (stop_sampler, stop_rx) = watch::channel(false);
    let sampler_task = tokio::spawn(async move { sampler.run(stop_rx).await });
    let store = Arc::new(
        LcStore::connect(
            &url,
            tollgate::GrantPolicy::new(
                SignedDuration::from_hours(1),
                SignedDuration::from_secs(30),
            )
            .map_err(e)?,
            tollgate::CapabilityKey::new(&[7; 32]).map_err(e)?,
            LcConfig {
                max_connections: 4,
                ..LcConfig::default()
            },
        )
        .await
        .map_err(e)?,
    );
    let clock = Arc::new(SafeCutClock::new(
        store.pool().clone(),
        SignedDuration::from_secs(2),
    ));
    let dir = PathBuf::from(format!("/tmp/lc-bench-gw-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = BwrapConfig::new(
        lc_core::ProviderId::new("local").map_err(e)?,
        &dir.join("provider"),
        &supervisor,
    );
    cfg.cgroup_parent = format!("little-compute-bench-gw-{}", std::process::id());
    let provider = Arc::new(BwrapProvider::open(cfg).map_err(e)?);
    store
        .register_provider(
            provider.id(),
            "http://127.0.0.1:9",
            provider.public_key().to_bytes(),
        )
        .await
        .map_err(e)?;
    let sink = Arc::new(lc_blob::LocalBlobStore::open(dir.join("blobs")).map_err(e)?);
    let started = Instant::now();
    let at = loop {
        let r = clock.read().await.map_err(e)?;
        if r.uncertain.is_none() {
            break CutReading::certain(r.now);
        }
        if started.elapsed() > WAIT_MAX {
            return Err("no certain cut".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let base = lc_core::manifest::Manifest::base();
    store
        .register_runtime(
            &OperationKey::new("setup-base", Digest([1; 32])).map_err(e)?,
            at,
            "base",
            Digest(base.digest()),
            serde_json::from_slice(&base.canonical()).map_err(e)?,
        )
        .await
        .map_err(e)?;
    let tenant = store
        .create_tenant(
            &OperationKey::new("setup-tenant", Digest([2; 32])).map_err(e)?,
            at,
            "bench",
            Some(1000),
            &|t: TenantId| Digest::of(format!("k{}", t.0).as_bytes()),
        )
        .await
        .map_err(e)?
        .tenant_id;
    let rig = Rig {
        store,
        clock,
        provider,
        sink,
        tenant,
        dir,
    };

    println!("# Little Compute output through the gateway vs a bare pipe read");
    println!("date: {}", Timestamp::now());
    println!("bytes per exec: {}", args.bytes);
    println!();
    println!(
        "| round | bare pipe MB/s | gateway MB/s | gateway pages/s | pages | **ratio gateway/bare** | takeover ms (kill to first new ACK) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mb = args.bytes as f64 / 1e6;
    for round in 1..=args.rounds {
        let bare = bare_pipe(args.bytes)?;

        let g = rig.gateway(lc_core::owner::HEARTBEAT_TTL_DEFAULT)?;
        let exec = rig
            .start(
                &format!("out-{round}"),
                &format!("head -c {} /dev/urandom", args.bytes),
            )
            .await?;
        let t0 = Instant::now();
        let mut pages = 0usize;
        loop {
            let r = g.step().await;
            if let Some(f) = r.failures.first() {
                return Err(format!("gateway: {}: {}", f.code, f.message));
            }
            pages += r.pages_acked;
            if r.released == 1 {
                break;
            }
            if t0.elapsed() > WAIT_MAX {
                return Err(format!("exec {exec:?} not released in time"));
            }
        }
        let through = t0.elapsed();
        rig.settle().await?;

        let a = rig.gateway(lc_core::owner::HEARTBEAT_TTL_MIN)?;
        let exec = rig
            .start(
                &format!("takeover-{round}"),
                "while :; do head -c 65536 /dev/urandom; sleep 0.01; done",
            )
            .await?;
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if a.step().await.pages_acked > 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err("gateway A acked nothing".into());
            }
        }
        let killed = Instant::now();
        drop(a);
        let b = rig.gateway(lc_core::owner::HEARTBEAT_TTL_MIN)?;
        loop {
            let r = b.step().await;
            if r.pages_acked > 0 {
                break;
            }
            if killed.elapsed() > WAIT_MAX {
                return Err("no takeover in time".into());
            }
        }
        let takeover = killed.elapsed();
        rig.store
            .cancel(
                &OperationKey::new(format!("cancel-{round}"), Digest::of(b"c")).map_err(e)?,
                rig.reading().await?,
                rig.tenant,
                exec,
            )
            .await
            .map_err(e)?;
        let deadline = Instant::now() + WAIT_MAX;
        while b.step().await.released == 0 {
            if Instant::now() > deadline {
                return Err("the cancelled exec was not released".into());
            }
        }
        rig.settle().await?;

        println!(
            "| {round} | {:.0} | {:.1} | {:.0} | {pages} | **{:.3}** | {:.0} |",
            mb / bare.as_secs_f64(),
            mb / through.as_secs_f64(),
            pages as f64 / through.as_secs_f64(),
            bare.as_secs_f64() / through.as_secs_f64(),
            takeover.as_secs_f64() * 1e3,
        );
    }
    let _ = stop_sampler.send(true);
    let _ = sampler_task.await;
    let _ = std::fs::remove_dir_all(&rig.dir);
    Ok(())
}
