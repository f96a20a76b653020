//! Sandbox instance start latency: Little Compute's bubblewrap provider
//! against bare `bwrap ... true`, interleaved in one run.
//!
//! Per sample, in this order (so load drifts hit every variant alike):
//!
//! 1. **bare**: `bwrap --ro-bind /usr /usr --symlink usr/bin /bin
//!    --symlink usr/lib /lib --symlink usr/lib64 /lib64 -- true`, spawn to
//!    exit: the least bubblewrap needs to run a host binary.
//! 2. **provider flags**: `bwrap` with the provider's command line for an
//!    instance of the `base` runtime and the `small` shape (as
//!    `lc_provider::bwrap` builds it: every namespace unshared, uid/gid
//!    1000, `--cap-drop ALL`, `--die-with-parent`, `--new-session`, a clean
//!    environment, a tmpfs root remounted read-only, `/usr` read-only with
//!    the `/bin`, `/lib*`, `/sbin` links, `/proc`, a read-only `/dev`,
//!    `/dev/shm` and `/tmp` as tmpfs of a quarter of the shape's memory
//!    each, the workspace and the supervisor binary bound),
//!    but exec'ing `true` where the provider execs the supervisor, and with
//!    no cgroups or rlimits; spawn to exit.
//! 3. **provider**: `BwrapProvider::allocate` of `true` (lease `i`,
//!    generation 1, `small`): to `allocate`'s return (the supervisor's
//!    socket exists: the instance is up), and to the terminal page read
//!    through `pages` (polled every millisecond); then `destroy`, timed
//!    on its own (kill, cgroup removal, fence, signed evidence).
//!
//! The provider runs with its own parent cgroup (`little-compute-bench-<pid>`)
//! and state directory under `/tmp`, both removed at the end. Needs root
//! (cgroups) and the `lc-supervisor` binary (`--supervisor-bin`, by
//! default next to this executable: `cargo build --release -p lc-supervisor`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use jiff::Timestamp;
use lc_core::shape::SMALL;
use lc_core::{AttemptNo, Command, ExecId, Generation, ProviderId, SandboxLeaseId, WorkspaceId};
use lc_provider::bwrap::tmpfs_bytes_max;
use lc_provider::runtime::base_digest;
use lc_provider::{AllocateRequest, BwrapConfig, BwrapProvider, Provider};
use tollgate_bench::{LatencySummary, micros};

/// The longest wait for one instance's terminal page.
const TERMINAL_WAIT_MAX: Duration = Duration::from_secs(30);

/// How often `pages` is polled for the terminal page.
const PAGES_POLL: Duration = Duration::from_millis(1);

/// The most samples of one run (each starts three sandboxes).
const SAMPLES_MAX: u32 = 10_000;

#[derive(Parser, Debug)]
#[command(about = "Sandbox instance start: the bubblewrap provider against bare bwrap true")]
struct Args {
    /// Measured samples per variant.
    #[arg(long, default_value_t = 100)]
    samples: u32,
    /// Unmeasured samples first.
    #[arg(long, default_value_t = 5)]
    warmup: u32,
    /// The `lc-supervisor` binary (default: next to this executable).
    #[arg(long)]
    supervisor_bin: Option<PathBuf>,
    /// The bubblewrap binary.
    #[arg(long, default_value = "/usr/bin/bwrap")]
    bwrap: PathBuf,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("lc_instance_start: {e}");
        std::process::exit(1);
    }
}

fn bare_args() -> Vec<String> {
    [
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--",
        "true",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The provider's command line for a `base`, `small` instance, with `true`
/// in place of the supervisor and its arguments.
fn provider_flag_args(workspace: &Path, supervisor: &Path) -> Vec<String> {
    let p = |p: &Path| p.to_string_lossy().into_owned();
    let mut a: Vec<String> = [
        "--unshare-all",
        "--unshare-user",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "--setenv",
        "HOME",
        "/workspace",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--tmpfs",
        "/",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let tmpfs_bytes = tmpfs_bytes_max(SMALL.memory_bytes).to_string();
    a.extend([
        "--size".into(),
        tmpfs_bytes.clone(),
        "--tmpfs".into(),
        "/dev/shm".into(),
        "--remount-ro".into(),
        "/dev".into(),
        "--size".into(),
        tmpfs_bytes,
        "--tmpfs".into(),
        "/tmp".into(),
        "--bind".into(),
        p(workspace),
        "/workspace".into(),
        "--ro-bind".into(),
        p(supervisor),
        "/.lc/supervisor".into(),
    ]);
    a.extend(
        ["--remount-ro", "/", "--chdir", "/workspace", "--", "true"]
            .iter()
            .map(|s| s.to_string()),
    );
    a
}

/// Runs `bwrap args` to its exit; returns the time from spawn to exit.
async fn bwrap_true(bwrap: &Path, args: &[String]) -> Result<Duration, String> {
    let t0 = Instant::now();
    let out = tokio::process::Command::new(bwrap)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("bwrap: {e}"))?;
    let took = t0.elapsed();
    if !out.status.success() {
        return Err(format!(
            "bwrap {args:?} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(took)
}

/// `(to allocate's return, to the terminal page, destroy)` of one
/// provider instance of `true`.
async fn provider_true(
    p: &BwrapProvider,
    lease: i64,
) -> Result<(Duration, Duration, Duration), String> {
    let (l, g) = (SandboxLeaseId(lease), Generation(1));
    let req = AllocateRequest {
        lease_id: l,
        generation: g,
        exec_id: ExecId(lease),
        attempt: AttemptNo(1),
        runtime: base_digest(),
        shape: SMALL,
        command: Command::new(vec!["true".into()]).map_err(|e| e.to_string())?,
        workspace_id: WorkspaceId(1),
        stdin_open: false,
        first_seq: 1,
        first_input_seq: 1,
        restore: None,
    };
    let t0 = Instant::now();
    p.allocate(req)
        .await
        .map_err(|e| format!("allocate: {e}"))?;
    let up = t0.elapsed();
    let mut after = 0;
    let terminal = loop {
        let pages = p
            .pages(l, g, lc_core::owner::OwnerFence(1), after, 64)
            .await
            .map_err(|e| format!("pages: {e}"))?;
        if let Some(last) = pages.last() {
            after = last.seq();
            if last.is_terminal() {
                break t0.elapsed();
            }
        }
        if t0.elapsed() > TERMINAL_WAIT_MAX {
            return Err(format!("no terminal page within {TERMINAL_WAIT_MAX:?}"));
        }
        tokio::time::sleep(PAGES_POLL).await;
    };
    let t1 = Instant::now();
    p.destroy(l, g).await.map_err(|e| format!("destroy: {e}"))?;
    Ok((up, terminal, t1.elapsed()))
}

struct Variant {
    name: &'static str,
    samples_us: Vec<u64>,
}

impl Variant {
    fn new(name: &'static str) -> Variant {
        Variant {
            name,
            samples_us: Vec::new(),
        }
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let samples = args.samples.clamp(1, SAMPLES_MAX);
    let supervisor = match &args.supervisor_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("lc-supervisor"),
    };
    if !supervisor.is_file() {
        return Err(format!(
            "{} missing: cargo build --release -p lc-supervisor, or pass --supervisor-bin",
            supervisor.display()
        ));
    }
    let dir = PathBuf::from(format!("/tmp/lc-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = BwrapConfig::new(
        ProviderId::new("bench").map_err(|e| e.to_string())?,
        &dir,
        &supervisor,
    );
    cfg.bwrap_bin = args.bwrap.clone();
    cfg.cgroup_parent = format!("little-compute-bench-{}", std::process::id());
    let provider = BwrapProvider::open(cfg).map_err(|e| e.to_string())?;
    let scratch = dir.join("scratch");
    let workspace = scratch.join("workspace");
    std::fs::create_dir_all(&workspace).map_err(|e| format!("{}: {e}", workspace.display()))?;
    let bare = bare_args();
    let flags = provider_flag_args(&workspace, &supervisor);

    println!("# Sandbox instance start: bubblewrap provider vs bare bwrap true");
    println!("date: {}", Timestamp::now());
    let version = std::process::Command::new(&args.bwrap)
        .arg("--version")
        .output()
        .map_err(|e| format!("bwrap --version: {e}"))?;
    println!("bwrap: {}", String::from_utf8_lossy(&version.stdout).trim());
    println!("bare: bwrap {}", bare.join(" "));
    println!("provider flags: bwrap {}", flags.join(" "));

    let mut v = [
        Variant::new("bare `bwrap --ro-bind /usr /usr ... true`, spawn to exit"),
        Variant::new("the provider's bwrap flags, `true` for the supervisor, spawn to exit"),
        Variant::new("`BwrapProvider::allocate` of `true`, to its return (instance up)"),
        Variant::new("`BwrapProvider::allocate` of `true`, to the terminal page"),
        Variant::new("`BwrapProvider::destroy` afterwards (fence + evidence)"),
    ];
    let result = async {
        for i in 0..args.warmup + samples {
            let b = bwrap_true(&args.bwrap, &bare).await?;
            let f = bwrap_true(&args.bwrap, &flags).await?;
            let (up, term, destroy) = provider_true(&provider, i64::from(i) + 1).await?;
            if i >= args.warmup {
                for (k, d) in [b, f, up, term, destroy].into_iter().enumerate() {
                    v[k].samples_us.push(micros(d));
                }
            }
        }
        Ok::<(), String>(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let parent = &provider.config().cgroup_parent;
    for c in ["memory", "pids", "cpu", "cpu,cpuacct", ""] {
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(c).join(parent));
    }
    result?;

    let bare_p50 = LatencySummary::of(&mut v[0].samples_us.clone()).p50_us as f64;
    println!();
    println!("| variant | samples | p50 ms | p90 ms | p99 ms | max ms | **p50 / bare p50** |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for x in &mut v {
        let l = LatencySummary::of(&mut x.samples_us);
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | **{:.2}** |",
            x.name,
            l.count,
            ms(l.p50_us),
            ms(l.p90_us),
            ms(l.p99_us),
            ms(l.max_us),
            l.p50_us as f64 / bare_p50
        );
    }
    Ok(())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
