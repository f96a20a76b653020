//! `little-compute appliance up|down|status`: the whole service on one host.
//!
//! `up --data-dir DIR` makes (or reuses, with all its state) everything in
//! `DIR` ([`layout`]) and runs, in this order: PostgreSQL ([`cluster`]),
//! the database, roles and migrations, the grant policy of Little
//! Compute's Reservations and the sealed safe-time horizon, the safe-time
//! sampler (`tollgate-safetime run`, as its own unprivileged account
//! [`SAMPLER_USER`], started by the appliance directly: in no sandbox
//! namespace or cgroup, and no path of it is under the trees sandboxes see),
//! the control plane (`little-compute serve`), the provider (`little-compute
//! provider`), the worker (`little-compute worker`) and one exec gateway
//! (`little-compute gateway`, writing output to the sink `DIR/blobs`, which
//! the control plane reads). It waits (bounded,
//! printing progress) until the cut is certain, prints the URL, the admin
//! token and the next commands, and writes `DIR/appliance.json`. Then it
//! supervises: a gateway that exits on its own is started again (at most
//! [`GATEWAY_RESTARTS_MAX`] times; the new one takes the old one's execs
//! over once their heartbeat expires on a certain cut, and finishes their
//! output exactly once); SIGINT or SIGTERM, or any other child exiting on
//! its own, stops everything in the reverse order (gateway, worker, provider, control
//! plane, sampler, PostgreSQL), each within a bound, and removes
//! `appliance.json`.
//!
//! This is a single-host installation: the sampler's monotonic clock is
//! the time model's trusted leaf, and production runs samplers on separate
//! hardened hosts (`up --sampler external` starts none and waits for a cut
//! published by one elsewhere).
//!
//! `down --data-dir DIR` asks the running `up` (its pid in
//! `appliance.json`) to stop, and waits; if it is gone, it stops the
//! processes listed there itself, in the same order. `status` reports each
//! process and the cut.

pub mod child;
pub mod cluster;
pub mod layout;
pub mod lcdb;
pub mod sys;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use jiff::SignedDuration;
use sqlx::Connection;
use sqlx::postgres::PgConnectOptions;

use child::{Managed, Spec};
use cluster::Cluster;
use layout::{Layout, Running};

/// The unprivileged account the sampler runs as (created when missing).
pub const SAMPLER_USER: &str = "lc-sampler";
/// The database of the installation.
pub const DATABASE: &str = "little_compute";
/// The database role that owns it (services and migrations).
pub const OWNER_ROLE: &str = "lc_owner";
/// The sampler's login role (member of `tollgate_sampler`: it can only
/// observe and publish the cut).
pub const SAMPLER_ROLE: &str = "lc_sampler";
/// The provider's id in a single-host installation.
pub const PROVIDER_ID: &str = "local";
/// The longest wait for a certain cut after start-up: a new epoch needs
/// three consistent observations and a 5 s grace, so a minute is ample.
pub const CUT_WAIT: Duration = Duration::from_secs(120);
/// The longest wait for the control plane and provider to answer.
pub const SERVICE_WAIT: Duration = Duration::from_secs(60);
/// How long each process gets to stop gracefully before SIGKILL.
pub const STOP_BOUND: Duration = Duration::from_secs(20);
/// How long `down` waits for a running `up` to stop everything.
pub const DOWN_WAIT: Duration = Duration::from_secs(180);
/// How often the supervisor checks its children.
const SUPERVISE_POLL: Duration = Duration::from_millis(500);
/// How many times one `up` starts a gateway again after it exited on its
/// own: enough for any run of crashes an operator would sit through,
/// bounded so a gateway that cannot start stops the appliance instead of
/// looping.
pub const GATEWAY_RESTARTS_MAX: u32 = 100;
/// How often progress is printed while waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);
/// The sampling-gap bound the appliance judges certainty by (the sampler's default).
const GAP_MAX: SignedDuration = safetime::DEFAULT_GAP_MAX;
/// The admin token's prefix.
pub const ADMIN_TOKEN_PREFIX: &str = "lcadm_";
/// Environment variable that carries the database URL to the services.
pub const DATABASE_URL_ENV: &str = "LC_DATABASE_URL";
/// Environment variable naming the sampler binary (default: beside this one).
pub const SAFETIME_BIN_ENV: &str = "LC_SAFETIME_BIN";
/// Lines of a child's log shown when it fails.
const LOG_TAIL_LINES: usize = 20;

/// Why an appliance command failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplianceError {
    /// An I/O step failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// Something the appliance needs is missing or wrong.
    #[error("{0}")]
    Setup(String),
    /// A database step failed.
    #[error("{context}: {message}")]
    Database {
        /// What was being done.
        context: String,
        /// A message that never holds a credential.
        message: String,
    },
}

impl ApplianceError {
    /// An [`ApplianceError::Io`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> ApplianceError {
        ApplianceError::Io {
            context: context.into(),
            source,
        }
    }
    pub(crate) fn db(context: impl Into<String>, e: impl std::fmt::Display) -> ApplianceError {
        ApplianceError::Database {
            context: context.into(),
            message: e.to_string(),
        }
    }
    pub(crate) fn sqlx(context: impl Into<String>, e: &sqlx::Error) -> ApplianceError {
        ApplianceError::db(context, pgkit::classify(e).text())
    }
}

/// Where the cut comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplerMode {
    /// A sampler on this host, as its own unprivileged account.
    Local,
    /// Samplers elsewhere publish the cut; none is started here.
    External,
}

/// `appliance up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// The data directory (created when missing; reused with all its state).
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// The control plane's address: 127.0.0.1:PORT (PORT 0: a free one);
    /// default the port of the last `up`, or 7480 at the first.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// `local` starts a sampler here; `external` waits for a cut published
    /// by samplers elsewhere.
    #[arg(long, value_enum, default_value = "local")]
    pub sampler: SamplerMode,
}

/// `appliance down`.
#[derive(Debug, Clone, clap::Args)]
pub struct DownArgs {
    /// The data directory of the running appliance.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
}

/// `appliance status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The data directory of the appliance.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Print JSON instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// The single-host notice printed at every start.
pub const SINGLE_HOST_NOTICE: &str = "little-compute appliance: this is a single-host installation. \
The safe-time sampler runs on this host as its own unprivileged user, outside every sandbox; \
production runs samplers on separate hardened hosts (appliance up --sampler external).";

pub(crate) fn say(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{args}");
    let _ = out.flush();
}

/// The database URLs and passwords of one installation.
struct Credentials {
    superuser: String,
    owner: String,
    sampler: String,
}

fn url(role: &str, password: &str, port: u16) -> String {
    format!("postgres://{role}:{password}@127.0.0.1:{port}/{DATABASE}")
}

/// The owner's database URL of the installation in `data_dir` (for
/// `status`, and tests that inspect the database).
///
/// # Errors
/// Missing secrets or ports.
pub fn owner_url(data_dir: &Path) -> Result<String, ApplianceError> {
    let layout = Layout::new(data_dir)?;
    if !layout.ports_file().exists() {
        return Err(ApplianceError::Setup(format!(
            "{} holds no appliance (no appliance.conf.json)",
            layout.root.display()
        )));
    }
    let ports = layout.ports(None)?;
    let pw = layout.secret(&layout.password_file("owner"), "")?;
    Ok(url(OWNER_ROLE, &pw, ports.postgres))
}

/// Runs `appliance up` until SIGINT/SIGTERM or a child's exit.
pub async fn up(args: UpArgs) -> ExitCode {
    match up_inner(args).await {
        Ok(code) => code,
        Err(e) => {
            say(format_args!("little-compute appliance: {e}"));
            ExitCode::FAILURE
        }
    }
}

async fn up_inner(args: UpArgs) -> Result<ExitCode, ApplianceError> {
    say(format_args!("{SINGLE_HOST_NOTICE}"));
    if let Some(addr) = args.listen
        && !addr.ip().is_loopback()
    {
        return Err(ApplianceError::Setup(format!(
            "--listen {addr}: the appliance listens on loopback only (127.0.0.1:PORT)"
        )));
    }
    // Signals are caught from the start, so a Ctrl-C during start-up still
    // stops what was started, in order.
    let mut shutdown = Box::pin(shutdown_signal()?);
    let layout = Layout::new(&args.data_dir)?;
    let provider_bytes = layout.provider().as_os_str().len();
    let provider_bytes_max = lc_provider::bwrap::state_dir_bytes_max();
    if provider_bytes > provider_bytes_max {
        let slack = provider_bytes - provider_bytes_max;
        return Err(ApplianceError::Setup(format!(
            "the data directory {} is {slack} bytes too long: the sandboxes' sockets live below it and a unix socket path has at most 107 bytes; choose one of at most {} bytes",
            layout.root.display(),
            layout.root.as_os_str().len() - slack
        )));
    }
    let pg_account = cluster::pg_account()?;
    if let Some(running) = layout.read_running()?
        && let Some(pid) = running.pids.get("appliance")
        && sys::process_alive(*pid)
        && is_little_compute(*pid)
    {
        return Err(ApplianceError::Setup(format!(
            "an appliance (pid {pid}) is already up on {}; stop it with `little-compute appliance down --data-dir {}`",
            layout.root.display(),
            layout.root.display()
        )));
    }
    if let Some(stale) = layout.read_running()? {
        // A previous `up` that died without stopping (SIGKILL): its
        // children got their stop signal when it died; give them the stop
        // bound to finish (PostgreSQL's shutdown checkpoint first of all).
        for (name, &pid) in &stale.pids {
            if name != "appliance" && sys::process_alive(pid) {
                say(format_args!(
                    "waiting for {name} (pid {pid}) of a previous appliance to stop"
                ));
                if !child::wait_gone(pid, STOP_BOUND).await {
                    return Err(ApplianceError::Setup(format!(
                        "{name} (pid {pid}) of a previous appliance still runs; stop it with `little-compute appliance down --data-dir {}`",
                        layout.root.display()
                    )));
                }
            }
        }
        let _ = std::fs::remove_file(layout.running_file());
    }
    // A data directory PostgreSQL's account cannot reach is refused first:
    // no retry mends it, while a busy port may come free.
    layout.check_reachable(pg_account.is_some())?;
    // Every port this `up` will listen on must be free before anything
    // starts: another process answering on one would be taken for ours.
    check_ports_free(&layout, args.listen.map(|a| a.port()))?;
    // Only now, with no appliance up on this directory and its ports free,
    // are its directories (re)made and their modes set (the ancestors are
    // checked first): a refused `up` creates nothing and changes nothing
    // of a running one.
    layout.prepare(pg_account.is_some())?;
    let ports = layout.ports(args.listen.map(|a| a.port()))?;
    let admin_token = layout.secret(&layout.admin_token_file(), ADMIN_TOKEN_PREFIX)?;
    layout.secret(&layout.server_secret_file(), "")?;
    layout.secret(&layout.provider_token_file(), "")?;
    let creds = Credentials {
        superuser: layout.secret(&layout.password_file("superuser"), "")?,
        owner: layout.secret(&layout.password_file("owner"), "")?,
        sampler: layout.secret(&layout.password_file("sampler"), "")?,
    };
    let mut started: Vec<Managed> = Vec::new();
    let outcome = tokio::select! {
        r = start_all(&args, &layout, ports, pg_account, &creds, &admin_token, &mut started) => Some(r),
        () = &mut shutdown => None,
    };
    let code = match outcome {
        None => {
            say(format_args!("interrupted during start-up; stopping"));
            ExitCode::FAILURE
        }
        Some(Err(e)) => {
            say(format_args!("little-compute appliance: {e}"));
            ExitCode::FAILURE
        }
        Some(Ok(gateway)) => supervise(&mut started, &mut shutdown, &layout, &gateway).await,
    };
    stop_all(&mut started).await;
    let _ = std::fs::remove_file(layout.running_file());
    say(format_args!("little-compute appliance: stopped"));
    Ok(code)
}

/// Refuses when a port this `up` listens on is held by another process:
/// the control plane's (`--listen`'s, else the recorded one, else
/// [`layout::DEFAULT_CONTROL_PLANE_PORT`]; `--listen` port 0 picks a free
/// one later), and the recorded PostgreSQL and provider ports. Binding
/// each for a moment is the check; nothing is written.
fn check_ports_free(layout: &Layout, requested: Option<u16>) -> Result<(), ApplianceError> {
    let recorded = layout.recorded_ports()?;
    let control_plane = match (requested, recorded) {
        (Some(p), _) => p,
        (None, Some(r)) if r.control_plane != 0 => r.control_plane,
        (None, _) => layout::DEFAULT_CONTROL_PLANE_PORT,
    };
    let mut checks = vec![("the control plane's", control_plane)];
    if let Some(r) = recorded {
        checks.push(("PostgreSQL's recorded", r.postgres));
        checks.push(("the provider's recorded", r.provider));
    }
    for (what, port) in checks {
        if port == 0 {
            continue;
        }
        if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            if e.kind() != std::io::ErrorKind::AddrInUse {
                return Err(ApplianceError::io(
                    format!("checking that 127.0.0.1:{port} is free"),
                    e,
                ));
            }
            let hint = if what == "the control plane's" {
                "choose another port with --listen 127.0.0.1:PORT (0 picks a free one)".to_string()
            } else {
                format!(
                    "remove {} to choose new ports",
                    layout.ports_file().display()
                )
            };
            return Err(ApplianceError::Setup(format!(
                "{what} address 127.0.0.1:{port} is in use by another process; stop that process (another appliance: `little-compute appliance down --data-dir ITS_DIR`) or {hint}"
            )));
        }
    }
    Ok(())
}

/// Every start-up step; each started process is pushed onto `started` at
/// once, so a failure (or Ctrl-C) later stops it.
async fn start_all(
    args: &UpArgs,
    layout: &Layout,
    mut ports: layout::Ports,
    pg_account: Option<sys::Account>,
    creds: &Credentials,
    admin_token: &str,
    started: &mut Vec<Managed>,
) -> Result<Spec, ApplianceError> {
    let cluster = Cluster {
        root: layout.pg(),
        bin: cluster::discover_bin()?,
        run_as: pg_account,
        port: ports.postgres,
    };
    if cluster.ensure_initialized(&creds.superuser).await? {
        say(format_args!(
            "created a PostgreSQL cluster in {}",
            cluster.data_dir().display()
        ));
    } else {
        say(format_args!(
            "reusing the PostgreSQL cluster in {}",
            cluster.data_dir().display()
        ));
    }
    let postmaster = child::spawn(&cluster.postmaster_spec()?)?;
    let pg_pid = postmaster.pid;
    started.push(postmaster);
    let su = cluster.options(cluster::SUPERUSER, &creds.superuser, "postgres");
    cluster
        .wait_ready(&su, || sys::process_alive(pg_pid))
        .await?;
    say(format_args!(
        "PostgreSQL is up on 127.0.0.1:{}",
        ports.postgres
    ));
    bootstrap(&cluster, creds).await?;
    let owner_url = url(OWNER_ROLE, &creds.owner, ports.postgres);
    migrate(&owner_url).await?;
    grant_sampler_role(&cluster, creds).await?;
    record_policies(&owner_url).await?;

    let exe =
        std::env::current_exe().map_err(|e| ApplianceError::io("locating this executable", e))?;
    let mut pids = BTreeMap::new();
    pids.insert("appliance".to_owned(), std::process::id());
    pids.insert("postgres".to_owned(), pg_pid);
    let url_cp = format!("http://127.0.0.1:{}", ports.control_plane);
    let running = |pids: &BTreeMap<String, u32>| Running {
        url: url_cp.clone(),
        admin_token_file: layout.admin_token_file(),
        pids: pids.clone(),
    };
    if args.sampler == SamplerMode::Local {
        let spec = sampler_spec(
            layout,
            &exe,
            &url(SAMPLER_ROLE, &creds.sampler, ports.postgres),
        )?;
        let s = child::spawn(&spec)?;
        pids.insert("sampler".to_owned(), s.pid);
        say(format_args!(
            "safe-time sampler started (pid {}, user {})",
            s.pid,
            spec.run_as.as_ref().map_or("self", |a| a.name.as_str())
        ));
        started.push(s);
    }
    layout.write_running(&running(&pids))?;

    let db_env = vec![(DATABASE_URL_ENV.to_owned(), OsString::from(&owner_url))];
    // Only an answer carrying this start's instance id is this control
    // plane's: another process on the port is never taken for it.
    let instance = layout::random_b64url()?;
    let serve = Spec {
        name: "serve",
        program: exe.clone(),
        args: vec![
            "serve".into(),
            "--listen".into(),
            format!("127.0.0.1:{}", ports.control_plane).into(),
            "--admin-token-file".into(),
            layout.admin_token_file().into(),
            "--secret-file".into(),
            layout.server_secret_file().into(),
            "--runtime-dir".into(),
            layout.runtimes().into(),
            "--blob-dir".into(),
            layout.blobs().into(),
            crate::serve::instance_id_arg(&instance).into(),
        ],
        env: db_env.clone(),
        run_as: None,
        stop_signal: libc::SIGTERM,
        log: layout.logs().join("serve.log"),
        cwd: layout.root.clone(),
    };
    let s = child::spawn(&serve)?;
    pids.insert("serve".to_owned(), s.pid);
    started.push(s);
    layout.write_running(&running(&pids))?;
    wait_http(
        &format!("{url_cp}/healthz"),
        "the control plane",
        &serve.log,
        Some(&instance),
        started,
    )
    .await?;
    say(format_args!("control plane is up at {url_cp}"));

    let supervisor = supervisor_bin(layout, &exe)?;
    let provider_port = layout.provider_port(&mut ports)?;
    let provider_url = format!("http://127.0.0.1:{provider_port}");
    let provider = Spec {
        name: "provider",
        program: exe.clone(),
        args: vec![
            "provider".into(),
            "--state-dir".into(),
            layout.provider().into(),
            "--listen".into(),
            format!("127.0.0.1:{provider_port}").into(),
            "--id".into(),
            PROVIDER_ID.into(),
            "--runtime-dir".into(),
            layout.runtimes().into(),
            "--token-file".into(),
            layout.provider_token_file().into(),
            "--cgroup-parent".into(),
            cgroup_parent(&layout.root).into(),
            "--supervisor".into(),
            supervisor.into(),
            // The snapshots quiescence writes are the blobs the control
            // plane's file routes read: one directory, and the provider
            // runs as the same user as serve (`run_as: None`), so the
            // directory's 0700 lets both read and write it.
            "--blob-dir".into(),
            layout.blobs().into(),
        ],
        env: Vec::new(),
        run_as: None,
        stop_signal: libc::SIGTERM,
        log: layout.logs().join("provider.log"),
        cwd: layout.root.clone(),
    };
    let p = child::spawn(&provider)?;
    pids.insert("provider".to_owned(), p.pid);
    started.push(p);
    layout.write_running(&running(&pids))?;
    wait_http(
        &format!("{provider_url}/v1/identity"),
        "the provider",
        &provider.log,
        None,
        started,
    )
    .await?;
    say(format_args!(
        "provider {PROVIDER_ID:?} is up at {provider_url}"
    ));

    let worker = Spec {
        name: "worker",
        program: exe.clone(),
        args: vec![
            "worker".into(),
            "--provider-url".into(),
            provider_url.into(),
            "--provider-token-file".into(),
            layout.provider_token_file().into(),
            "--secret-file".into(),
            layout.server_secret_file().into(),
        ],
        env: db_env.clone(),
        run_as: None,
        stop_signal: libc::SIGTERM,
        log: layout.logs().join("worker.log"),
        cwd: layout.root.clone(),
    };
    let w = child::spawn(&worker)?;
    pids.insert("worker".to_owned(), w.pid);
    started.push(w);
    layout.write_running(&running(&pids))?;

    let gateway = Spec {
        name: "gateway",
        program: exe.clone(),
        args: vec![
            "gateway".into(),
            "--provider-token-file".into(),
            layout.provider_token_file().into(),
            "--secret-file".into(),
            layout.server_secret_file().into(),
            "--blob-dir".into(),
            layout.blobs().into(),
        ],
        env: db_env,
        run_as: None,
        stop_signal: libc::SIGTERM,
        log: layout.logs().join("gateway.log"),
        cwd: layout.root.clone(),
    };
    let g = child::spawn(&gateway)?;
    pids.insert("gateway".to_owned(), g.pid);
    started.push(g);
    layout.write_running(&running(&pids))?;

    wait_for_certain_cut(&owner_url, args.sampler, started).await?;
    let secret = layout.secret(&layout.server_secret_file(), "")?;
    let tenants = lcdb::register_base(&owner_url, secret.as_bytes()).await?;
    say(format_args!(""));
    say(format_args!("Little Compute is ready at {url_cp}"));
    say(format_args!("admin token: {admin_token}"));
    say(format_args!(
        "  (in {}; details in {})",
        layout.admin_token_file().display(),
        layout.running_file().display()
    ));
    let d = layout.root.display();
    if tenants == 0 {
        say(format_args!("next:"));
        say(format_args!(
            "  lc --data-dir {d} tenant create --name blue --units 8"
        ));
        say(format_args!(
            "  lc --data-dir {d} --tenant 1 exec create --runtime base --shape small --wait -- echo hello"
        ));
        say(format_args!("  lc --data-dir {d} --tenant 1 exec output 1"));
    } else {
        say(format_args!(
            "this data directory holds {tenants} tenant(s), their execs and workspaces; for example:"
        ));
        say(format_args!("  lc --data-dir {d} tenant show 1"));
        say(format_args!("  lc --data-dir {d} --tenant 1 exec list"));
    }
    say(format_args!(
        "stop with Ctrl-C, or `little-compute appliance down --data-dir {d}`"
    ));
    say(format_args!("appliance ready"));
    Ok(gateway)
}

/// Waits for SIGINT or SIGTERM, or for any child but the gateway to exit
/// on its own; a gateway that exits is started again from `gateway` (at
/// most [`GATEWAY_RESTARTS_MAX`] times) and `appliance.json` names the new
/// pid.
async fn supervise(
    started: &mut [Managed],
    shutdown: &mut std::pin::Pin<Box<impl std::future::Future<Output = ()>>>,
    layout: &Layout,
    gateway: &Spec,
) -> ExitCode {
    let mut restarts = 0u32;
    loop {
        tokio::select! {
            () = shutdown.as_mut() => {
                say(format_args!("stopping (gateway, worker, provider, control plane, sampler, PostgreSQL)"));
                return ExitCode::SUCCESS;
            }
            () = tokio::time::sleep(SUPERVISE_POLL) => {
                for c in started.iter_mut() {
                    let Some(status) = c.exited() else { continue };
                    if c.name == gateway.name && restarts < GATEWAY_RESTARTS_MAX {
                        restarts += 1;
                        match child::spawn(gateway) {
                            Ok(next) => {
                                say(format_args!(
                                    "gateway (pid {}) ended ({status}) without the appliance stopping it; started gateway pid {} ({restarts} of at most {GATEWAY_RESTARTS_MAX} restarts): it takes the execs over once their heartbeat expires",
                                    c.pid, next.pid
                                ));
                                *c = next;
                                if let Ok(Some(mut r)) = layout.read_running() {
                                    r.pids.insert(gateway.name.to_owned(), c.pid);
                                    if let Err(e) = layout.write_running(&r) {
                                        say(format_args!("cannot update appliance.json: {e}"));
                                    }
                                }
                                continue;
                            }
                            Err(e) => {
                                say(format_args!("gateway (pid {}) exited ({status}) and cannot be started again: {e}; stopping the appliance", c.pid));
                                return ExitCode::FAILURE;
                            }
                        }
                    }
                    say(format_args!("{} (pid {}) ended ({status}) without the appliance stopping it; stopping the appliance", c.name, c.pid));
                    return ExitCode::FAILURE;
                }
            }
        }
    }
}

/// Stops `started` in reverse start order (gateway, worker, provider,
/// control plane, sampler, PostgreSQL), each within [`STOP_BOUND`].
async fn stop_all(started: &mut Vec<Managed>) {
    while let Some(mut c) = started.pop() {
        let graceful = c.stop(STOP_BOUND).await;
        if graceful {
            say(format_args!("stopped {} (pid {})", c.name, c.pid));
        } else {
            say(format_args!(
                "{} (pid {}) did not stop within {} s; killed",
                c.name,
                c.pid,
                STOP_BOUND.as_secs()
            ));
        }
    }
}

fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, ApplianceError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| ApplianceError::io("listening for SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| ApplianceError::io("listening for SIGINT", e))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// The provider's parent cgroup: one per data directory, so two
/// appliances on one host (whose lease ids both start at 1) never share an
/// instance's group.
fn cgroup_parent(root: &Path) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let digest = lc_core::Digest::of(root.as_os_str().as_bytes()).to_hex();
    format!("little-compute-{}", &digest[..12])
}

fn is_little_compute(pid: u32) -> bool {
    sys::cmdline(pid).is_some_and(|c| c.first().is_some_and(|a| a.contains("little-compute")))
}

/// Creates the owner role and the database (once), sets the owner's
/// password from its secret, and lets only the owner and the sampler role
/// connect.
async fn bootstrap(cluster: &Cluster, creds: &Credentials) -> Result<(), ApplianceError> {
    let su = cluster.options(cluster::SUPERUSER, &creds.superuser, "postgres");
    let mut c = sqlx::PgConnection::connect_with(&su)
        .await
        .map_err(|e| ApplianceError::sqlx("connecting as the superuser", &e))?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(OWNER_ROLE)
            .fetch_one(&mut c)
            .await
            .map_err(|e| ApplianceError::sqlx("reading roles", &e))?;
    let verb = if exists { "ALTER" } else { "CREATE" };
    // Identifiers are constants; the password is a quoted literal of
    // base64url characters only.
    sqlx::raw_sql(&format!(
        "{verb} ROLE {OWNER_ROLE} LOGIN CREATEROLE PASSWORD '{}'",
        creds.owner
    ))
    .execute(&mut c)
    .await
    .map_err(|e| ApplianceError::sqlx("creating the owner role", &e))?;
    let db: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(DATABASE)
            .fetch_one(&mut c)
            .await
            .map_err(|e| ApplianceError::sqlx("reading databases", &e))?;
    if !db {
        sqlx::raw_sql(&format!("CREATE DATABASE {DATABASE} OWNER {OWNER_ROLE}"))
            .execute(&mut c)
            .await
            .map_err(|e| ApplianceError::sqlx("creating the database", &e))?;
        say(format_args!("created database {DATABASE}"));
    }
    sqlx::raw_sql(&format!(
        "REVOKE CONNECT ON DATABASE {DATABASE} FROM PUBLIC; GRANT CONNECT ON DATABASE {DATABASE} TO {OWNER_ROLE}"
    ))
    .execute(&mut c)
    .await
    .map_err(|e| ApplianceError::sqlx("restricting connections", &e))?;
    let _ = c.close().await;
    Ok(())
}

/// Applies Tollgate's and safe time's migrations, then Little Compute's.
async fn migrate(owner_url: &str) -> Result<(), ApplianceError> {
    let report = tollgate_pg::migrate(owner_url)
        .await
        .map_err(|e| ApplianceError::db("applying Tollgate's migrations", e))?;
    if !report.applied.is_empty() {
        say(format_args!(
            "applied Tollgate migrations {:?}",
            report.applied
        ));
    }
    lcdb::migrate(owner_url).await?;
    Ok(())
}

/// The sampler's login role: a member of `tollgate_sampler` (created by
/// migration 0018), allowed to connect.
async fn grant_sampler_role(cluster: &Cluster, creds: &Credentials) -> Result<(), ApplianceError> {
    let su = cluster.options(cluster::SUPERUSER, &creds.superuser, DATABASE);
    let mut c = sqlx::PgConnection::connect_with(&su)
        .await
        .map_err(|e| ApplianceError::sqlx("connecting as the superuser", &e))?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(SAMPLER_ROLE)
            .fetch_one(&mut c)
            .await
            .map_err(|e| ApplianceError::sqlx("reading roles", &e))?;
    let stmt = if exists {
        format!(
            "ALTER ROLE {SAMPLER_ROLE} LOGIN PASSWORD '{}'",
            creds.sampler
        )
    } else {
        format!(
            "CREATE ROLE {SAMPLER_ROLE} LOGIN PASSWORD '{}' IN ROLE tollgate_sampler",
            creds.sampler
        )
    };
    sqlx::raw_sql(&stmt)
        .execute(&mut c)
        .await
        .map_err(|e| ApplianceError::sqlx("creating the sampler role", &e))?;
    sqlx::raw_sql(&format!(
        "GRANT CONNECT ON DATABASE {DATABASE} TO {SAMPLER_ROLE}"
    ))
    .execute(&mut c)
    .await
    .map_err(|e| ApplianceError::sqlx("granting the sampler role", &e))?;
    let _ = c.close().await;
    Ok(())
}

/// Records the Reservations' grant policy (first start). The horizon is
/// the one sealed in the database (3,650 days unless an operator sealed
/// another), which must cover every deadline the services admit: each
/// service checks its settings against it at start.
async fn record_policies(owner_url: &str) -> Result<(), ApplianceError> {
    let options: PgConnectOptions = owner_url
        .parse()
        .map_err(|_| ApplianceError::Setup("invalid owner database url".into()))?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.clone())
        .await
        .map_err(|e| ApplianceError::sqlx("connecting as the owner", &e))?;
    let policy = lcdb::grant_policy();
    match tollgate_pg::recorded_policy(&pool)
        .await
        .map_err(|e| ApplianceError::db("reading the grant policy", e))?
    {
        None => {
            tollgate_pg::set_policy(&pool, policy, "little-compute appliance")
                .await
                .map_err(|e| ApplianceError::db("recording the grant policy", e))?;
            say(format_args!(
                "recorded the Reservation grant policy (max_ttl {}, reclaim_grace {})",
                policy.max_ttl(),
                policy.reclaim_grace()
            ));
        }
        Some(p) if p == policy => {}
        Some(p) => {
            return Err(ApplianceError::Setup(format!(
                "the database records grant policy max_ttl {} reclaim_grace {}, but this binary runs {} / {}",
                p.max_ttl(),
                p.reclaim_grace(),
                policy.max_ttl(),
                policy.reclaim_grace()
            )));
        }
    }
    pool.close().await;
    Ok(())
}

/// Copies the binary `source` to `DIR/bin/<name>` (mode 0755, through a
/// temporary name and a rename, so a running copy is never overwritten in
/// place) and returns the installed path: the accounts the appliance runs
/// things as (the sampler's, the sandboxes') can execute it there wherever
/// the build lives (a build under a home directory of mode 0700, say).
fn install_binary(layout: &Layout, source: &Path, name: &str) -> Result<PathBuf, ApplianceError> {
    use std::os::unix::fs::PermissionsExt as _;
    let bin_dir = layout.root.join("bin");
    std::fs::create_dir_all(&bin_dir).map_err(|e| ApplianceError::io("creating DIR/bin", e))?;
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| ApplianceError::io("chmod DIR/bin", e))?;
    let installed = bin_dir.join(name);
    let tmp = bin_dir.join(format!("{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::fs::copy(source, &tmp)
        .map_err(|e| ApplianceError::io(format!("copying {}", source.display()), e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| ApplianceError::io(format!("chmod DIR/bin/{name}"), e))?;
    std::fs::rename(&tmp, &installed)
        .map_err(|e| ApplianceError::io(format!("installing DIR/bin/{name}"), e))?;
    Ok(installed)
}

/// The supervisor binary bound into every sandbox: `lc-supervisor` beside
/// this executable, installed into `DIR/bin` ([`install_binary`]).
fn supervisor_bin(layout: &Layout, exe: &Path) -> Result<PathBuf, ApplianceError> {
    let source = exe
        .parent()
        .map(|d| d.join("lc-supervisor"))
        .ok_or_else(|| ApplianceError::Setup("this executable has no directory".into()))?;
    if !source.is_file() {
        return Err(ApplianceError::Setup(format!(
            "the supervisor binary {} is missing (build it: cargo build --release -p lc-supervisor)",
            source.display()
        )));
    }
    install_binary(layout, &source, "lc-supervisor")
}

/// The sampler's process: `tollgate-safetime run`, copied into `DIR/bin`
/// (so its account can execute it wherever this binary lives), as
/// [`SAMPLER_USER`] when we are root.
fn sampler_spec(layout: &Layout, exe: &Path, sampler_url: &str) -> Result<Spec, ApplianceError> {
    let source = match std::env::var_os(SAFETIME_BIN_ENV).filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => exe
            .parent()
            .map(|d| d.join("tollgate-safetime"))
            .ok_or_else(|| ApplianceError::Setup("this executable has no directory".into()))?,
    };
    if !source.is_file() {
        return Err(ApplianceError::Setup(format!(
            "the sampler binary {} is missing (build it: cargo build --release -p tollgate-safetime, or set {SAFETIME_BIN_ENV})",
            source.display()
        )));
    }
    let installed = install_binary(layout, &source, "tollgate-safetime")?;
    let run_as = if sys::is_root() {
        Some(
            sys::ensure_system_user(SAMPLER_USER)
                .map_err(|e| ApplianceError::io(format!("the sampler's user {SAMPLER_USER}"), e))?,
        )
    } else {
        None
    };
    Ok(Spec {
        name: "sampler",
        program: installed,
        args: vec!["run".into()],
        env: vec![(
            "TOLLGATE_DATABASE_URL".to_owned(),
            OsString::from(sampler_url),
        )],
        run_as,
        stop_signal: libc::SIGTERM,
        log: layout.logs().join("sampler.log"),
        cwd: PathBuf::from("/"),
    })
}

/// Waits (bounded by [`SERVICE_WAIT`]) until `url` answers 2xx, while every
/// started child runs.
/// Waits (within [`SERVICE_WAIT`]) for a success answer at `url`; with
/// `instance`, only one whose `Lc-Instance` header is that id counts (the
/// answer of the process this `up` started), and the failure then says
/// when another process answered instead.
async fn wait_http(
    url: &str,
    what: &str,
    log: &Path,
    instance: Option<&str>,
    started: &mut [Managed],
) -> Result<(), ApplianceError> {
    let mut foreign = false;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| ApplianceError::Setup(format!("http client: {e}")))?;
    let deadline = tokio::time::Instant::now() + SERVICE_WAIT;
    let mut next_progress = tokio::time::Instant::now() + PROGRESS_EVERY;
    loop {
        if let Ok(r) = client.get(url).send().await
            && r.status().is_success()
        {
            let ours = instance.is_none_or(|id| {
                r.headers()
                    .get(crate::serve::INSTANCE_HEADER)
                    .and_then(|v| v.to_str().ok())
                    == Some(id)
            });
            if ours {
                return Ok(());
            }
            foreign = true;
        }
        check_children(started)?;
        let now = tokio::time::Instant::now();
        if now >= deadline {
            let other = if foreign {
                " (another process answers there: its port is taken)"
            } else {
                ""
            };
            return Err(ApplianceError::Setup(format!(
                "{what} did not answer {url} within {} s{other}; its log:\n{}",
                SERVICE_WAIT.as_secs(),
                child::log_tail(log, LOG_TAIL_LINES)
            )));
        }
        if now >= next_progress {
            say(format_args!("waiting for {what} ({url})"));
            next_progress = now + PROGRESS_EVERY;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn check_children(started: &mut [Managed]) -> Result<(), ApplianceError> {
    for c in started.iter_mut() {
        if let Some(status) = c.exited() {
            return Err(ApplianceError::Setup(format!(
                "{} (pid {}) exited during start-up ({status}); the end of {}:\n{}",
                c.name,
                c.pid,
                c.log.display(),
                child::log_tail(&c.log, LOG_TAIL_LINES)
            )));
        }
    }
    Ok(())
}

/// What the cut looks like now, judged as every service judges it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CutStatus {
    /// The cut (RFC 3339), `None` before any sampler claimed.
    pub cut: Option<String>,
    /// Whether it may expire and admit.
    pub certain: bool,
    /// Why not, as a stable code.
    pub uncertain_reason: Option<String>,
    /// The epoch.
    pub epoch: Option<i64>,
}

/// Reads the cut at `owner_url`.
///
/// # Errors
/// [`ApplianceError::Database`].
pub async fn read_cut_status(owner_url: &str) -> Result<CutStatus, ApplianceError> {
    let options: PgConnectOptions = owner_url
        .parse()
        .map_err(|_| ApplianceError::Setup("invalid owner database url".into()))?;
    let mut c = sqlx::PgConnection::connect_with(&options)
        .await
        .map_err(|e| ApplianceError::sqlx("connecting as the owner", &e))?;
    let row = safetime_pg::read_cut(&mut c)
        .await
        .map_err(|e| ApplianceError::db("reading the cut", e))?;
    let _ = c.close().await;
    Ok(match row {
        None => CutStatus {
            cut: None,
            certain: false,
            uncertain_reason: Some("no_cut".into()),
            epoch: None,
        },
        Some(r) => {
            let judged = safetime::judge_reading(
                r.uncertain,
                r.db_now.duration_since(r.published_at),
                SignedDuration::ZERO,
                GAP_MAX,
            );
            CutStatus {
                cut: Some(r.cut.to_string()),
                certain: judged.is_none(),
                uncertain_reason: judged.map(|u| u.code().to_owned()),
                epoch: Some(r.epoch),
            }
        }
    })
}

async fn wait_for_certain_cut(
    owner_url: &str,
    mode: SamplerMode,
    started: &mut [Managed],
) -> Result<(), ApplianceError> {
    let deadline = tokio::time::Instant::now() + CUT_WAIT;
    let mut next_progress = tokio::time::Instant::now();
    let source = match mode {
        SamplerMode::Local => "the local sampler",
        SamplerMode::External => "a sampler elsewhere (--sampler external)",
    };
    loop {
        let status = read_cut_status(owner_url).await?;
        if status.certain {
            say(format_args!(
                "the safe-time cut is certain: {}",
                status.cut.as_deref().unwrap_or("-")
            ));
            return Ok(());
        }
        check_children(started)?;
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(ApplianceError::Setup(format!(
                "the cut did not become certain within {} s (last: {}); is {source} running?",
                CUT_WAIT.as_secs(),
                status.uncertain_reason.as_deref().unwrap_or("-")
            )));
        }
        if now >= next_progress {
            say(format_args!(
                "waiting for a certain cut from {source}: {}",
                status.uncertain_reason.as_deref().unwrap_or("-")
            ));
            next_progress = now + PROGRESS_EVERY;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The stop order of `down`: the reverse of the start order.
const STOP_ORDER: [&str; 6] = [
    "gateway", "worker", "provider", "serve", "sampler", "postgres",
];

/// Runs `appliance down`.
pub async fn down(args: DownArgs) -> ExitCode {
    let layout = match Layout::new(&args.data_dir) {
        Ok(l) => l,
        Err(e) => {
            say(format_args!("little-compute appliance down: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let running = match layout.read_running() {
        Ok(Some(r)) => r,
        Ok(None) => {
            say(format_args!(
                "no appliance is up on {} (no appliance.json)",
                layout.root.display()
            ));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            say(format_args!("little-compute appliance down: {e}"));
            return ExitCode::FAILURE;
        }
    };
    if let Some(&pid) = running.pids.get("appliance")
        && sys::process_alive(pid)
        && is_little_compute(pid)
    {
        say(format_args!("asking the appliance (pid {pid}) to stop"));
        let _ = sys::send_signal(pid, libc::SIGTERM);
        if child::wait_gone(pid, DOWN_WAIT).await {
            say(format_args!("the appliance stopped"));
            return ExitCode::SUCCESS;
        }
        say(format_args!(
            "the appliance did not stop within {} s; stopping its processes",
            DOWN_WAIT.as_secs()
        ));
    }
    for name in STOP_ORDER {
        if let Some(&pid) = running.pids.get(name)
            && sys::process_alive(pid)
        {
            let signal = if name == "postgres" {
                libc::SIGINT
            } else {
                libc::SIGTERM
            };
            let ok = child::stop_foreign(pid, signal, STOP_BOUND).await;
            say(format_args!(
                "{} {name} (pid {pid})",
                if ok { "stopped" } else { "killed" }
            ));
        }
    }
    let _ = std::fs::remove_file(layout.running_file());
    ExitCode::SUCCESS
}

/// Runs `appliance status`: each process (running or not) and the cut.
/// Exit 0 when every recorded process runs, 1 otherwise (3 when none is up).
pub async fn status(args: StatusArgs) -> ExitCode {
    let layout = match Layout::new(&args.data_dir) {
        Ok(l) => l,
        Err(e) => {
            say(format_args!("little-compute appliance status: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let running = match layout.read_running() {
        Ok(r) => r,
        Err(e) => {
            say(format_args!("little-compute appliance status: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let Some(running) = running else {
        if args.json {
            say(format_args!("{}", serde_json::json!({ "up": false })));
        } else {
            say(format_args!(
                "no appliance is up on {}",
                layout.root.display()
            ));
        }
        return ExitCode::from(3);
    };
    let procs: BTreeMap<String, serde_json::Value> = running
        .pids
        .iter()
        .map(|(name, &pid)| {
            (
                name.clone(),
                serde_json::json!({ "pid": pid, "running": sys::process_alive(pid) }),
            )
        })
        .collect();
    let all_up = running.pids.values().all(|&p| sys::process_alive(p));
    let cut = match owner_url(&layout.root) {
        Ok(u) => read_cut_status(&u).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if args.json {
        let cut_json = match &cut {
            Ok(c) => serde_json::to_value(c).unwrap_or(serde_json::Value::Null),
            Err(e) => serde_json::json!({ "error": e }),
        };
        say(format_args!(
            "{}",
            serde_json::json!({ "up": all_up, "url": running.url, "processes": procs, "cut": cut_json })
        ));
    } else {
        say(format_args!("url: {}", running.url));
        for (name, &pid) in &running.pids {
            say(format_args!(
                "{name:<10} pid {pid:<8} {}",
                if sys::process_alive(pid) {
                    "running"
                } else {
                    "not running"
                }
            ));
        }
        match &cut {
            Ok(c) => say(format_args!(
                "cut: {} ({})",
                c.cut.as_deref().unwrap_or("none"),
                if c.certain {
                    "certain".to_owned()
                } else {
                    format!(
                        "uncertain: {}",
                        c.uncertain_reason.as_deref().unwrap_or("-")
                    )
                }
            )),
            Err(e) => say(format_args!("cut: unreadable ({e})")),
        }
    }
    if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
