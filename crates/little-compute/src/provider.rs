//! `little-compute provider`: one per host. Opens the provider's state
//! (key, fences, instances, workspaces, runtime store), prints its identity
//! as one JSON line on stdout, and serves the provider API on a loopback
//! address until SIGINT or SIGTERM.
//!
//! ```text
//! little-compute provider --state-dir D --listen 127.0.0.1:P --id ID [--runtime-dir R]
//!     [--supervisor PATH] [--cgroup-parent NAME] [--spool-bytes N]
//! ```
//!
//! stdout: `{"provider_id":"local","public_key_hex":"<64 hex>","listen":"127.0.0.1:P","cgroup":"v1"}`.
//! Exit status: 0 after a signal-initiated shutdown, 2 for bad arguments,
//! 1 when the state, the listener or the service fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use lc_core::ProviderId;
use lc_provider::cgroup::{CgroupRoot, CgroupVersion};
use lc_provider::{BwrapConfig, BwrapProvider, Provider};

/// `little-compute provider`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    /// The provider's state directory (created if missing).
    #[arg(long)]
    pub state_dir: PathBuf,
    /// The loopback address to serve on (`127.0.0.1:PORT`); the provider
    /// API has no credential of its own, so no other address is accepted.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The provider's id: 1 to 63 characters of `[a-z0-9-]`.
    #[arg(long)]
    pub id: String,
    /// The runtime store (default: `STATE_DIR/runtimes`).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
    /// The `lc-supervisor` binary bound into every instance (default: the
    /// `lc-supervisor` next to this executable).
    #[arg(long)]
    pub supervisor: Option<PathBuf>,
    /// The parent cgroup of every instance.
    #[arg(long, default_value = "little-compute")]
    pub cgroup_parent: String,
    /// The supervisor's spool bound in bytes.
    #[arg(long, default_value_t = lc_core::page::SPOOL_BYTES_DEFAULT)]
    pub spool_bytes: u64,
}

/// Why the provider could not run. Codes are stable.
#[derive(Debug, thiserror::Error)]
pub enum ProviderRunError {
    /// A bad argument. Code `usage_error`; exit status 2.
    #[error("usage_error: {0}")]
    Usage(String),
    /// The state, key, cgroups or supervisor are unusable. Code `provider_state`.
    #[error("provider_state: {0}")]
    State(String),
    /// The listener could not be bound or the service failed. Code `provider_listen`.
    #[error("provider_listen: {0}")]
    Listen(String),
}

/// Runs the provider until SIGINT or SIGTERM; the exit status of the
/// module docs.
pub async fn run(args: ProviderArgs) -> ExitCode {
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("little-compute provider: {e}");
            match e {
                ProviderRunError::Usage(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// The supervisor next to the current executable.
fn default_supervisor() -> Result<PathBuf, ProviderRunError> {
    let exe = std::env::current_exe()
        .map_err(|e| ProviderRunError::State(format!("current executable: {e}")))?;
    let dir = exe
        .parent()
        .ok_or_else(|| ProviderRunError::State("the executable has no directory".into()))?;
    Ok(dir.join("lc-supervisor"))
}

/// Opens the provider and serves it; see [`run`].
///
/// # Errors
/// [`ProviderRunError`].
pub async fn serve(args: ProviderArgs) -> Result<(), ProviderRunError> {
    if !args.listen.ip().is_loopback() {
        return Err(ProviderRunError::Usage(format!(
            "--listen {} is not a loopback address",
            args.listen
        )));
    }
    let id = ProviderId::new(args.id.clone())
        .map_err(|e| ProviderRunError::Usage(format!("--id: {e}")))?;
    let supervisor = match args.supervisor.clone() {
        Some(p) => p,
        None => default_supervisor()?,
    };
    let mut cfg = BwrapConfig::new(id, &args.state_dir, &supervisor);
    if let Some(r) = &args.runtime_dir {
        cfg.runtime_dir = r.clone();
    }
    cfg.cgroup_parent = args.cgroup_parent.clone();
    cfg.spool_bytes_max = args.spool_bytes;
    let cgroup = match CgroupRoot::detect(&cfg.cgroup_mount, &cfg.cgroup_parent)
        .map_err(|e| ProviderRunError::State(e.to_string()))?
        .version()
    {
        CgroupVersion::V1 => "v1",
        CgroupVersion::V2 => "v2",
    };
    let provider = BwrapProvider::open(cfg).map_err(|e| ProviderRunError::State(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| ProviderRunError::Listen(format!("{}: {e}", args.listen)))?;
    let local = listener
        .local_addr()
        .map_err(|e| ProviderRunError::Listen(e.to_string()))?;
    let identity = serde_json::json!({
        "provider_id": provider.id().as_str(),
        "public_key_hex": hex_of(provider.public_key().as_bytes()),
        "listen": local.to_string(),
        "cgroup": cgroup,
    });
    println!("{identity}");
    tracing::info!(provider_id = provider.id().as_str(), listen = %local, cgroup, "provider serving");
    let provider: Arc<dyn Provider> = Arc::new(provider);
    lc_provider::http::serve(listener, provider, shutdown_signal())
        .await
        .map_err(|e| ProviderRunError::Listen(e.to_string()))?;
    tracing::info!("provider stopped");
    Ok(())
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the service runs until killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
