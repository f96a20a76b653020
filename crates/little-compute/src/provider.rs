//! `little-compute provider`: one per host. Opens the provider's state
//! (key, fences, instances, workspaces, runtime store, blob store), prints its identity
//! as one JSON line on stdout, and serves the provider API on a loopback
//! address until SIGINT or SIGTERM.
//!
//! ```text
//! little-compute provider --state-dir D --listen 127.0.0.1:P --id ID [--runtime-dir R]
//!     [--supervisor PATH] [--cgroup-parent NAME] [--spool-bytes N] [--spool-pages N] [--token-file F]
//!     [--sandbox-user NAME] [--connections-max N] [--blob-dir B]
//! ```
//!
//! The blob store (`--blob-dir`, default `STATE_DIR/blobs`) holds the file
//! bytes of workspace snapshots: a quiesce puts every file of a stopped
//! instance's workspace there before it signs the snapshot, and an
//! allocate that restores a snapshot reads them back (each verified).
//!
//! The provider runs as root; every sandbox runs as the unprivileged host
//! account `--sandbox-user` (default `lc-sandbox`, created as a system
//! account without home or login shell when missing), never as root: uid
//! 1000 inside is that account on the host, so what a sandbox writes is
//! that account's and every path bound into it is read with that
//! account's credentials (see `lc_provider::account`). The runtime store,
//! the supervisor binary and the state directory must be reachable
//! (searchable) by that account; the provider checks at start.
//!
//! The API is served through httpkit's connection layer: at most
//! `--connections-max` connections, a header-read and an idle timeout,
//! bodies and handling bounded (see `lc_provider::http`).
//!
//! With `--token-file`, every route but `/v1/identity` requires
//! `Authorization: Bearer <token>` (the file's content without its trailing
//! newline, at least 32 visible ASCII characters, mode `0600`); use it
//! whenever instances with the network run, since they share the host's
//! loopback.
//!
//! stdout: `{"cgroup":"v1","listen":"127.0.0.1:P","provider_id":"local","public_key_hex":"<64 hex>","sandbox_uid":995,"sandbox_user":"lc-sandbox","token":false}`.
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
    /// The blob store of workspace snapshots (default: `STATE_DIR/blobs`;
    /// created if missing).
    #[arg(long)]
    pub blob_dir: Option<PathBuf>,
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
    /// The supervisor's spool bound in pages (the terminal page's slot
    /// included), 2 to 1048576.
    #[arg(long, default_value_t = lc_core::page::SPOOL_PAGES_DEFAULT)]
    pub spool_pages: u64,
    /// A file holding the bearer token every route but `/v1/identity`
    /// requires (see the module docs).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The unprivileged host account every sandbox runs as (created as a
    /// system account when missing).
    #[arg(long, default_value = lc_provider::account::SANDBOX_USER_DEFAULT)]
    pub sandbox_user: String,
    /// Connections the provider API serves at once.
    #[arg(long, default_value_t = httpkit::server::CONNECTIONS_MAX_DEFAULT)]
    pub connections_max: usize,
}

/// Descriptors the provider holds besides connections: the state files
/// and each allocation's log and pipes, a few at a time under its lock.
const DESCRIPTORS_OTHER: usize = 64;

/// The shortest accepted token, in characters.
pub const TOKEN_CHARS_MIN: usize = 32;

/// The largest token file read, in bytes.
const TOKEN_FILE_BYTES_MAX: u64 = 4096;

/// Reads the token at `path`.
fn read_token(path: &std::path::Path) -> Result<String, ProviderRunError> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let bad =
        |why: String| ProviderRunError::Usage(format!("--token-file {}: {why}", path.display()));
    let f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let meta = f.metadata().map_err(|e| bad(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad("readable by group or others (want 0600)".into()));
    }
    let mut text = String::new();
    f.take(TOKEN_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .map_err(|e| bad(e.to_string()))?;
    let token = text.strip_suffix('\n').unwrap_or(&text);
    if token.len() < TOKEN_CHARS_MIN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(format!(
            "a token is at least {TOKEN_CHARS_MIN} visible ASCII characters"
        )));
    }
    Ok(token.to_owned())
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
    if !(1..=httpkit::server::CONNECTIONS_MAX_MAX).contains(&args.connections_max) {
        return Err(ProviderRunError::Usage(format!(
            "--connections-max must be 1..={}",
            httpkit::server::CONNECTIONS_MAX_MAX
        )));
    }
    let pages = lc_core::page::SPOOL_PAGES_MIN..=lc_core::page::SPOOL_PAGES_MAX;
    if !pages.contains(&args.spool_pages) {
        return Err(ProviderRunError::Usage(format!(
            "--spool-pages must be {}..={}, got {}",
            pages.start(),
            pages.end(),
            args.spool_pages
        )));
    }
    let token = args.token_file.as_deref().map(read_token).transpose()?;
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
    if let Some(b) = &args.blob_dir {
        cfg.blob_dir = b.clone();
    }
    cfg.cgroup_parent = args.cgroup_parent.clone();
    cfg.spool_bytes_max = args.spool_bytes;
    cfg.spool_pages_max = args.spool_pages;
    cfg.sandbox_user = args.sandbox_user.clone();
    let cgroup = match CgroupRoot::detect(&cfg.cgroup_mount, &cfg.cgroup_parent)
        .map_err(|e| ProviderRunError::State(e.to_string()))?
        .version()
    {
        CgroupVersion::V1 => "v1",
        CgroupVersion::V2 => "v2",
    };
    let provider = BwrapProvider::open(cfg).map_err(|e| ProviderRunError::State(e.to_string()))?;
    let fit = httpkit::server::fit_descriptor_limit(args.connections_max, DESCRIPTORS_OTHER)
        .map_err(|e| ProviderRunError::Usage(e.to_string()))?;
    if let Some(from) = fit.raised_from {
        tracing::info!(
            from,
            needed = fit.needed,
            "raised the soft limit on open files"
        );
    }
    let sandbox = provider.sandbox_account().clone();
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
        "token": token.is_some(),
        "sandbox_user": sandbox.name,
        "sandbox_uid": sandbox.uid,
    });
    println!("{identity}");
    tracing::info!(
        provider_id = provider.id().as_str(),
        listen = %local,
        cgroup,
        sandbox_user = sandbox.name,
        sandbox_uid = sandbox.uid,
        "provider serving"
    );
    let provider: Arc<dyn Provider> = Arc::new(provider);
    let limits = httpkit::ConnectionLimits {
        connections_max: args.connections_max,
        header_read_timeout: httpkit::server::HEADER_READ_TIMEOUT_DEFAULT,
        idle_timeout: httpkit::server::IDLE_TIMEOUT_DEFAULT,
    };
    lc_provider::http::serve(listener, provider, token, limits, shutdown_signal()).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `--blob-dir` reaches the provider's configuration: a blob directory
    /// that is a regular file is refused `provider_state` naming it, before
    /// anything is served.
    #[tokio::test]
    async fn a_blob_dir_that_is_a_file_is_refused_naming_it() {
        let dir = tempfile::Builder::new()
            .prefix("lcpb")
            .tempdir_in("/tmp")
            .unwrap();
        let blob_file = dir.path().join("blobs-file");
        std::fs::write(&blob_file, b"not a directory").unwrap();
        let parent = format!(
            "little-compute-test-{}",
            dir.path().file_name().unwrap().to_str().unwrap()
        );
        let args = ProviderArgs {
            state_dir: dir.path().join("s"),
            listen: "127.0.0.1:0".parse().unwrap(),
            id: "p-blob".into(),
            runtime_dir: None,
            blob_dir: Some(blob_file.clone()),
            supervisor: Some(PathBuf::from("/bin/true")),
            cgroup_parent: parent.clone(),
            spool_bytes: lc_core::page::SPOOL_BYTES_DEFAULT,
            spool_pages: lc_core::page::SPOOL_PAGES_DEFAULT,
            token_file: None,
            sandbox_user: lc_provider::account::SANDBOX_USER_DEFAULT.into(),
            connections_max: 4,
        };
        let err = serve(args).await.unwrap_err();
        for c in ["memory", "pids", "cpu", "cpuacct", ""] {
            let _ =
                std::fs::remove_dir(std::path::Path::new("/sys/fs/cgroup").join(c).join(&parent));
        }
        match err {
            ProviderRunError::State(msg) => assert_eq!(
                msg,
                format!(
                    "provider state: {b}: blob store I/O on {b}/sha256: Not a directory (os error 20)",
                    b = blob_file.display()
                )
            ),
            other => panic!("{other:?}"),
        }
    }
}
