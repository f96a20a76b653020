//! The `tollgate` command line (clap).
//!
//! * `serve`: the HTTP service (and, by default, the reclaim worker).
//! * `migrate [--dry-run]`: apply (or list) pending PostgreSQL migrations.
//! * `status`, `audit`, `reclaim [--once|--loop]`: operator commands. With
//!   `--server URL` (or when no database URL is configured) they call the
//!   HTTP API with the admin `--token`; with a database URL they open the
//!   PostgreSQL store directly. Directly, `reclaim` runs on the system clock,
//!   or on the safe expiry cut with `--clock safe-cut` (and then pauses
//!   while the cut is uncertain, like the service's worker); `status` with
//!   `--clock safe-cut` shows one fresh reading of the cut.
//! * `policy show|set`: the grant policy recorded in a PostgreSQL database,
//!   its change history, and the explicit, recorded command that changes it.
//! * `account create|deposit|show`, `lease acquire|renew|release|show`,
//!   `clock set`: HTTP clients of the API (`--server`, default
//!   `http://127.0.0.1:8080`; `--token`: the admin token, an account key or
//!   a lease capability, as the route needs).
//!
//! Results are printed as JSON on stdout; errors go to stderr. Exit status:
//! 0 success, 1 a refused or failed operation (or an audit with
//! violations), 2 invalid usage or configuration.

/// Prints a line on stderr like `eprintln!`, but a stderr that cannot be
/// written (a closed pipe, a full disk) is ignored instead of panicking:
/// there is nowhere left to report it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Prints a line on stdout like `println!`, but a closed pipe (`tollgate
/// audit | head -1`) ends the output quietly instead of panicking, and any
/// other lost output makes the command exit 1 ([`crate::output`]).
macro_rules! out {
    ($($arg:tt)*) => {
        crate::output::print(format_args!($($arg)*))
    };
}

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::watch;
use tollgate::CapabilityKey;

use crate::client::{Client, ClientError};
use crate::clock::{Clock, ClockKind, SystemClock};
use crate::config::{self, Config, ConfigError, RawConfig};
use crate::dto::{AuditView, PolicyChangeView, PolicyRecordView, ReclaimView, StatusView};
use crate::metrics::Metrics;
use crate::pg;
use crate::serve::{self, ServeError};
use crate::storage::Backend;
use crate::worker::ReclaimWorker;

/// Default `--server` of the client subcommands.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// Tollgate: an exact-time lease and credit allocator.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, max_term_width = 100)]
pub struct Cli {
    /// Log format (logs go to stderr; level from TOLLGATE_LOG, e.g. `debug`
    /// or `tollgate_server=debug,info`).
    #[arg(
        long,
        env = "TOLLGATE_LOG_FORMAT",
        value_enum,
        default_value = "human",
        global = true
    )]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service.
    Serve(ServeArgs),
    /// Apply pending PostgreSQL migrations.
    Migrate(MigrateArgs),
    /// Schema version, readiness, counts of active leases and legacy bounds.
    Status(OpsArgs),
    /// Recompute every account from the ledger; exit 1 on any violation.
    Audit(OpsArgs),
    /// Settle reclaimable leases.
    Reclaim(ReclaimArgs),
    /// The grant policy recorded in a PostgreSQL database.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Accounts (HTTP client).
    #[command(subcommand)]
    Account(AccountCmd),
    /// Leases (HTTP client).
    #[command(subcommand)]
    Lease(LeaseCmd),
    /// The test clock of a server started with `--clock test` (HTTP client).
    #[command(subcommand)]
    Clock(ClockCmd),
}

/// Settings that name the store and its policy.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// TOML configuration file (keys: the flag names in snake_case).
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// PostgreSQL URL (also DATABASE_URL); absent: the memory store.
    #[arg(
        long,
        env = "TOLLGATE_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,
    /// Longest granted TTL [default: PT1H].
    #[arg(
        long,
        env = "TOLLGATE_MAX_TTL",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub max_ttl: Option<String>,
    /// Grace after expiry before a lease is reclaimable; `max` for the
    /// largest duration [default: PT30S].
    #[arg(
        long,
        env = "TOLLGATE_RECLAIM_GRACE",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub reclaim_grace: Option<String>,
    /// Capability key file (at least 32 bytes); required with PostgreSQL.
    #[arg(long, env = "TOLLGATE_SECRET_FILE", value_name = "PATH")]
    pub secret_file: Option<PathBuf>,
    /// Time source [default: system]. `safe-cut`: the safe expiry cut
    /// published in PostgreSQL by the safe-time sampler.
    #[arg(long, env = "TOLLGATE_CLOCK", value_enum)]
    pub clock: Option<ClockArg>,
    /// Safe-cut clock: a cut not republished for longer than this is stale,
    /// hence uncertain [default: PT5S].
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_GAP_MAX",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub safetime_gap_max: Option<String>,
}

/// `tollgate serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    /// Store settings.
    pub store: StoreArgs,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "TOLLGATE_LISTEN", value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Pause between reclaim worker passes [default: PT1S].
    #[arg(
        long,
        env = "TOLLGATE_RECLAIM_INTERVAL",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub reclaim_interval: Option<String>,
    /// Leases per reclaim batch, 1..=10000 [default: 1000].
    #[arg(
        long,
        env = "TOLLGATE_RECLAIM_BATCH",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub reclaim_batch: Option<i64>,
    /// Do not run the reclaim worker inside the service.
    #[arg(long, env = "TOLLGATE_NO_RECLAIM_WORKER")]
    pub no_reclaim_worker: bool,
    /// PostgreSQL: do not apply pending migrations at start-up.
    #[arg(long, env = "TOLLGATE_NO_MIGRATE")]
    pub no_migrate: bool,
    /// Admin bearer token (memory store: generated and printed when unset).
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Bound on each request [default: PT30S].
    #[arg(
        long,
        env = "TOLLGATE_REQUEST_TIMEOUT",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub request_timeout: Option<String>,
    /// Bound on finishing in-flight requests at shutdown [default: PT10S].
    #[arg(
        long,
        env = "TOLLGATE_SHUTDOWN_TIMEOUT",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub shutdown_timeout: Option<String>,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// `--clock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClockArg {
    /// The operating system's clock.
    System,
    /// A clock set over HTTP (tests only).
    Test,
    /// The safe expiry cut in PostgreSQL (PostgreSQL only).
    SafeCut,
}

impl From<ClockArg> for ClockKind {
    fn from(c: ClockArg) -> ClockKind {
        match c {
            ClockArg::System => ClockKind::System,
            ClockArg::Test => ClockKind::Test,
            ClockArg::SafeCut => ClockKind::SafeCut,
        }
    }
}

/// Where a client subcommand sends its requests.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The service's base URL [default: http://127.0.0.1:8080].
    #[arg(long, env = "TOLLGATE_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// Bearer credential: the admin token, an account API key or a lease
    /// capability, as the operation needs.
    #[arg(
        long,
        env = "TOLLGATE_TOKEN",
        value_name = "TOKEN",
        visible_aliases = ["api-key", "capability"],
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl ClientArgs {
    fn client(&self) -> Result<Client, ClientError> {
        Client::new(
            self.server.as_deref().unwrap_or(DEFAULT_SERVER),
            self.token.clone(),
        )
    }
}

/// `tollgate migrate`.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    /// Store settings.
    pub store: StoreArgs,
    /// List pending migrations without applying them.
    #[arg(long)]
    pub dry_run: bool,
}

/// `status` and `audit`: against a server (`--server`) or a database.
#[derive(Debug, Clone, Args)]
pub struct OpsArgs {
    #[command(flatten)]
    /// Store settings (direct mode).
    pub store: StoreArgs,
    #[command(flatten)]
    /// Server settings (HTTP mode).
    pub client: ClientArgs,
}

/// `tollgate reclaim`.
#[derive(Debug, Clone, Args)]
pub struct ReclaimArgs {
    #[command(flatten)]
    /// Where to reclaim.
    pub ops: OpsArgs,
    /// Run one batch and exit (the default).
    #[arg(long, conflicts_with = "run_loop")]
    pub once: bool,
    /// Keep reclaiming every `--interval` until SIGTERM/SIGINT.
    #[arg(long = "loop")]
    pub run_loop: bool,
    /// Leases per batch [default: 1000].
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Pause between batches with `--loop` [default: PT1S].
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub interval: Option<String>,
}

/// The database of a `policy` subcommand.
#[derive(Debug, Clone, Args)]
pub struct PolicyDbArgs {
    /// PostgreSQL URL (also DATABASE_URL).
    #[arg(
        long,
        env = "TOLLGATE_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,
}

/// `tollgate policy ...`.
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Print the recorded policy and its change history.
    Show {
        #[command(flatten)]
        /// The database.
        db: PolicyDbArgs,
    },
    /// Record a new policy, with who changed it. Restart every process
    /// sharing the database with the new values afterwards.
    Set {
        #[command(flatten)]
        /// The database.
        db: PolicyDbArgs,
        /// The new longest granted TTL (positive).
        #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
        max_ttl: String,
        /// The new grace after expiry (nonnegative; `max` for the largest
        /// duration).
        #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
        reclaim_grace: String,
        /// Who makes the change (recorded; 1..=200 characters, no control
        /// characters).
        #[arg(long, value_name = "NAME")]
        changed_by: String,
    },
}

/// `tollgate account ...`.
#[derive(Debug, Subcommand)]
pub enum AccountCmd {
    /// Create an account (admin token); prints its id and API key.
    Create {
        /// The account's name.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
    /// Deposit units (admin token).
    Deposit {
        /// The account.
        account_id: i64,
        /// Units to deposit.
        #[arg(long, allow_negative_numbers = true)]
        units: i64,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
    /// Show an account (admin token or its API key).
    Show {
        /// The account.
        account_id: i64,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
}

/// `tollgate lease ...`.
#[derive(Debug, Subcommand)]
pub enum LeaseCmd {
    /// Acquire a lease (the account's API key).
    Acquire {
        /// The account.
        account_id: i64,
        /// Units to hold.
        #[arg(long, allow_negative_numbers = true)]
        units: i64,
        /// Requested TTL (ISO 8601 or friendly, e.g. PT30.000000001S).
        #[arg(long, allow_hyphen_values = true)]
        ttl: String,
        /// Idempotency key: a retry with the same key returns the same grant.
        #[arg(long)]
        idempotency_key: Option<String>,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
    /// Renew a lease (its capability).
    Renew {
        /// The lease.
        lease_id: i64,
        /// Requested TTL from now.
        #[arg(long, allow_hyphen_values = true)]
        ttl: String,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
    /// Release a lease (its capability).
    Release {
        /// The lease.
        lease_id: i64,
        /// Units consumed [default: all].
        #[arg(long, allow_negative_numbers = true)]
        consumed: Option<i64>,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
    /// Show a lease (its capability).
    Show {
        /// The lease.
        lease_id: i64,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
}

/// `tollgate clock ...`.
#[derive(Debug, Subcommand)]
pub enum ClockCmd {
    /// Set the test clock (admin token; server started with `--clock test`).
    Set {
        /// The instant, RFC 3339.
        now: String,
        #[command(flatten)]
        /// Server settings.
        client: ClientArgs,
    },
}

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Invalid configuration or usage (exit 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The service or store refused or failed (exit 1).
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// An HTTP call failed (exit 1).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Anything else (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Config(_) | CliError::Serve(ServeError::Config(_)) => ExitCode::from(2),
            _ => ExitCode::from(1),
        }
    }
}

impl StoreArgs {
    fn raw(&self) -> RawConfig {
        RawConfig {
            config: self.config.clone(),
            database_url: self.database_url.clone(),
            max_ttl: self.max_ttl.clone(),
            reclaim_grace: self.reclaim_grace.clone(),
            secret_file: self.secret_file.clone(),
            clock: self.clock.map(Into::into),
            safetime_gap_max: self.safetime_gap_max.clone(),
            ..RawConfig::default()
        }
    }
}

impl ServeArgs {
    /// The raw configuration of these flags.
    pub fn raw(&self) -> RawConfig {
        RawConfig {
            listen: self.listen.clone(),
            reclaim_interval: self.reclaim_interval.clone(),
            reclaim_batch: self.reclaim_batch,
            no_reclaim_worker: self.no_reclaim_worker,
            no_migrate: self.no_migrate,
            admin_token: self.admin_token.clone(),
            request_timeout: self.request_timeout.clone(),
            shutdown_timeout: self.shutdown_timeout.clone(),
            ..self.store.raw()
        }
    }
}

fn print_json(v: &impl serde::Serialize) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => out!("{s}"),
        Err(e) => say!("error: cannot print result: {e}"),
    }
}

/// Initialises logging on stderr. Level from `TOLLGATE_LOG` (tracing
/// targets syntax), default `default_level`.
pub fn init_logging(format: LogFormat, default_level: &str) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let spec = std::env::var("TOLLGATE_LOG").unwrap_or_else(|_| default_level.to_string());
    let filter = log_filter(&spec).unwrap_or_else(|| {
        say!(
            "warning: TOLLGATE_LOG={spec:?} is neither a level (error, warn, info, debug, \
             trace, off) nor target=level directives; logging at {default_level}"
        );
        log_filter(default_level)
            .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO))
    });
    let registry = tracing_subscriber::registry().with(filter);
    // Colour only for a terminal: a log file or journal gets plain text.
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A log line that cannot be written is dropped: the default
        // reports it with `eprintln!`, which panics on that same stderr.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Human => registry.with(layer).try_init(),
        LogFormat::Json => registry.with(layer.json()).try_init(),
    };
}

/// The filter for a `TOLLGATE_LOG` value: a bare level (`warn`), or
/// comma-separated `target=level` directives, optionally with a bare
/// default level among them (`info,tollgate_pg=debug`). `None` for
/// anything else, such as a bare word that is not a level, which the
/// directive syntax would read as "only target `word`" and so silence
/// every log.
fn log_filter(spec: &str) -> Option<tracing_subscriber::filter::Targets> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let valid = !spec.trim().is_empty()
        && spec.split(',').all(|d| {
            let d = d.trim();
            match d.split_once('=') {
                Some((target, level)) => {
                    !target.is_empty() && LEVELS.contains(&level.to_ascii_lowercase().as_str())
                }
                None => LEVELS.contains(&d.to_ascii_lowercase().as_str()),
            }
        });
    if !valid {
        return None;
    }
    spec.parse().ok()
}

/// Parses the command line and runs it.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match &cli.command {
        Command::Serve(_) | Command::Reclaim(_) | Command::Migrate(_) => "info",
        _ => "warn",
    };
    init_logging(cli.log_format, level);
    let code = match run(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            say!("error: {e}");
            e.exit_code()
        }
    };
    match crate::output::failure() {
        // The result was lost: never exit 0 for it.
        Some(e) if code == ExitCode::SUCCESS => {
            say!("error: cannot write the output: {e}");
            ExitCode::FAILURE
        }
        _ => code,
    }
}

/// Whether an operator command goes to a server (HTTP) or to the database.
enum Target {
    Http(Client),
    Direct(Config),
}

fn target(ops: &OpsArgs) -> Result<Target, CliError> {
    let cfg = Config::resolve(ops.store.raw())?;
    match (&ops.client.server, cfg.is_postgres()) {
        // Two targets: going to either one silently could act on the
        // wrong installation.
        (Some(_), true) => Err(ConfigError(
            "both a server (--server or TOLLGATE_SERVER) and a database (--database-url, \
             TOLLGATE_DATABASE_URL, DATABASE_URL or the config file) are given; give one"
                .into(),
        )
        .into()),
        (None, true) => Ok(Target::Direct(cfg)),
        _ => Ok(Target::Http(ops.client.client()?)),
    }
}

/// The store for a direct operator command: the capability key does not
/// matter for status, audit and reclaim, so a random one stands in when no
/// `--secret-file` is given.
async fn direct_backend(cfg: &Config, access: pg::Access) -> Result<Backend, CliError> {
    let cfg = &Config {
        migrate_on_start: false,
        ..cfg.clone()
    };
    let key = match &cfg.secret_file {
        Some(p) => config::read_secret_file(p)?,
        None => CapabilityKey::generate().map_err(|e| ConfigError(e.to_string()))?,
    };
    if cfg.is_postgres() {
        return Ok(pg::connect_for(cfg, key, access)
            .await
            .map_err(ServeError::from)?);
    }
    Ok(serve::build_backend(cfg).await?)
}

/// The safe-cut clock of a direct operator command (`None` unless
/// `--clock safe-cut`; the test clock exists only inside `serve`, so any
/// other clock is the system clock there).
fn direct_clock(cfg: &Config, backend: &Backend) -> Result<Option<Arc<dyn Clock>>, CliError> {
    if cfg.clock != ClockKind::SafeCut {
        return Ok(None);
    }
    Ok(Some(serve::build_clock(cfg, backend)?))
}

/// Runs one subcommand.
///
/// # Errors
/// See [`CliError`].
pub async fn run(command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Serve(args) => {
            let cfg = Config::resolve(args.raw())?;
            if args.print_config {
                // A closed pipe ends the output quietly, a full disk fails
                // the command (see `out!`).
                let text = cfg.render();
                out!("{}", text.trim_end_matches('\n'));
                return Ok(ExitCode::SUCCESS);
            }
            serve::serve(cfg).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate(args) => {
            let cfg = Config::resolve(args.store.raw())?;
            let Some(url) = &cfg.database_url else {
                return Err(ConfigError(
                    "migrate needs --database-url (or DATABASE_URL): the memory store has no schema"
                        .into(),
                )
                .into());
            };
            let list = pg::migrate(url, args.dry_run)
                .await
                .map_err(ServeError::from)?;
            let verb = if args.dry_run { "pending" } else { "applied" };
            if list.is_empty() {
                out!("no migrations {verb}");
            }
            for m in list {
                out!("{verb} {:04} {}", m.version, m.description);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status(ops) => {
            let view: StatusView = match target(&ops)? {
                Target::Http(c) => {
                    from_value(c.call(Method::GET, "v1/admin/status", None, &[]).await?)?
                }
                Target::Direct(cfg) => {
                    let backend = direct_backend(&cfg, pg::Access::ReadOnly).await?;
                    let (r, counts) = tokio::join!(
                        backend.ops.readiness(),
                        crate::storage::bounded_counts(&*backend.ops)
                    );
                    let p = backend.allocator.policy();
                    // The safe-cut clock: one fresh reading (the stale
                    // rule's database-age check applies; a failed read is
                    // shown as `read_error`).
                    let safe_time = match direct_clock(&cfg, &backend)? {
                        Some(clock) => clock
                            .refresh_safe_time(crate::clock::TELEMETRY_READ_MAX)
                            .await
                            .as_ref()
                            .map(crate::dto::SafeTimeView::from),
                        None => None,
                    };
                    StatusView {
                        readiness: crate::dto::ReadyView {
                            ready: r.is_ready(),
                            store: r.store.into(),
                            storage_reachable: r.reachable,
                            schema_version: r.schema_version,
                            expected_schema_version: r.expected_schema_version,
                            maintenance: r.maintenance,
                        },
                        active_leases: counts.map(|c| c.active_leases),
                        active_legacy_bounds: counts.map(|c| c.active_legacy_bounds),
                        policy: p.into(),
                        clock: if safe_time.is_some() {
                            ClockKind::SafeCut
                        } else {
                            ClockKind::System
                        }
                        .to_string(),
                        safe_time,
                        paused: None,
                        late_expiry: None,
                    }
                }
            };
            print_json(&view);
            Ok(if view.readiness.ready {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Audit(ops) => {
            let view: AuditView = match target(&ops)? {
                Target::Http(c) => {
                    from_value(c.call(Method::GET, "v1/admin/audit", None, &[]).await?)?
                }
                Target::Direct(cfg) => {
                    let backend = direct_backend(&cfg, pg::Access::ReadOnly).await?;
                    backend
                        .allocator
                        .audit()
                        .await
                        .map_err(|e| CliError::Failed(format!("audit: {e}")))?
                        .into()
                }
            };
            print_json(&view);
            if view.clean {
                return Ok(ExitCode::SUCCESS);
            }
            for v in &view.violations {
                match v.seq {
                    Some(seq) => say!(
                        "violation: account {} (ledger seq {seq}): {}",
                        v.account_id,
                        v.detail
                    ),
                    None => say!("violation: account {}: {}", v.account_id, v.detail),
                }
            }
            let mut accounts: Vec<i64> = view.violations.iter().map(|v| v.account_id).collect();
            accounts.sort_unstable();
            accounts.dedup();
            say!(
                "audit failed: {} violation(s) in account(s) {}",
                view.violations.len(),
                accounts
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ok(ExitCode::from(1))
        }
        Command::Reclaim(args) => reclaim(args).await,
        Command::Policy(cmd) => policy(cmd).await,
        Command::Account(cmd) => {
            let v = match cmd {
                AccountCmd::Create { name, client } => {
                    client
                        .client()?
                        .call(
                            Method::POST,
                            "v1/accounts",
                            Some(&json!({"name": name})),
                            &[],
                        )
                        .await?
                }
                AccountCmd::Deposit {
                    account_id,
                    units,
                    client,
                } => {
                    client
                        .client()?
                        .call(
                            Method::POST,
                            &format!("v1/accounts/{account_id}/deposits"),
                            Some(&json!({"units": units})),
                            &[],
                        )
                        .await?
                }
                AccountCmd::Show { account_id, client } => {
                    client
                        .client()?
                        .call(Method::GET, &format!("v1/accounts/{account_id}"), None, &[])
                        .await?
                }
            };
            print_json(&v);
            Ok(ExitCode::SUCCESS)
        }
        Command::Lease(cmd) => {
            let v = match cmd {
                LeaseCmd::Acquire {
                    account_id,
                    units,
                    ttl,
                    idempotency_key,
                    client,
                } => {
                    let headers: Vec<(&str, &str)> = idempotency_key
                        .as_deref()
                        .map(|k| vec![("Idempotency-Key", k)])
                        .unwrap_or_default();
                    client
                        .client()?
                        .call(
                            Method::POST,
                            &format!("v1/accounts/{account_id}/leases"),
                            Some(&json!({"units": units, "ttl": ttl})),
                            &headers,
                        )
                        .await?
                }
                LeaseCmd::Renew {
                    lease_id,
                    ttl,
                    client,
                } => {
                    client
                        .client()?
                        .call(
                            Method::POST,
                            &format!("v1/leases/{lease_id}/renew"),
                            Some(&json!({"ttl": ttl})),
                            &[],
                        )
                        .await?
                }
                LeaseCmd::Release {
                    lease_id,
                    consumed,
                    client,
                } => {
                    let body = match consumed {
                        Some(c) => json!({"consumed": c}),
                        None => json!({}),
                    };
                    client
                        .client()?
                        .call(
                            Method::POST,
                            &format!("v1/leases/{lease_id}/release"),
                            Some(&body),
                            &[],
                        )
                        .await?
                }
                LeaseCmd::Show { lease_id, client } => {
                    client
                        .client()?
                        .call(Method::GET, &format!("v1/leases/{lease_id}"), None, &[])
                        .await?
                }
            };
            print_json(&v);
            Ok(ExitCode::SUCCESS)
        }
        Command::Clock(ClockCmd::Set { now, client }) => {
            let v = client
                .client()?
                .call(
                    Method::PUT,
                    "v1/admin/test-clock",
                    Some(&json!({"now": now})),
                    &[],
                )
                .await?;
            print_json(&v);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The database URL of a `policy` subcommand, validated like `serve`'s.
fn policy_url(cfg: &Config) -> Result<&str, CliError> {
    cfg.database_url.as_deref().ok_or_else(|| {
        ConfigError(
            "policy needs --database-url (or DATABASE_URL): only PostgreSQL records a policy"
                .into(),
        )
        .into()
    })
}

/// The rule `tollgate_pg::set_policy` applies to `changed_by`, checked
/// first so that a bad name is a usage error (exit 2).
fn check_changed_by(name: &str) -> Result<(), ConfigError> {
    let max = tollgate_pg::CHANGED_BY_MAX_CHARS;
    if name.trim().is_empty() || name.chars().count() > max || name.chars().any(char::is_control) {
        return Err(ConfigError(format!(
            "changed_by must be 1..={max} characters without control characters"
        )));
    }
    Ok(())
}

fn change_view(c: tollgate_pg::PolicyChange) -> PolicyChangeView {
    PolicyChangeView {
        change_id: c.change_id,
        changed_by: c.changed_by,
        recorded_at: c.recorded_at,
        old: c.old.map(Into::into),
        new: c.new.into(),
    }
}

async fn policy(cmd: PolicyCmd) -> Result<ExitCode, CliError> {
    match cmd {
        PolicyCmd::Show { db } => {
            let cfg = Config::resolve(RawConfig {
                database_url: db.database_url,
                ..RawConfig::default()
            })?;
            let (policy, changes) = pg::show_policy(policy_url(&cfg)?)
                .await
                .map_err(ServeError::from)?;
            print_json(&PolicyRecordView {
                policy: policy.map(Into::into),
                changes: changes.into_iter().map(change_view).collect(),
            });
        }
        PolicyCmd::Set {
            db,
            max_ttl,
            reclaim_grace,
            changed_by,
        } => {
            // The same parsing and validation as `serve` (`max` for grace).
            let cfg = Config::resolve(RawConfig {
                database_url: db.database_url,
                max_ttl: Some(max_ttl),
                reclaim_grace: Some(reclaim_grace),
                ..RawConfig::default()
            })?;
            check_changed_by(&changed_by)?;
            let change = pg::set_policy(policy_url(&cfg)?, cfg.policy, &changed_by)
                .await
                .map_err(ServeError::from)?;
            print_json(&change_view(change));
            say!(
                "policy recorded; restart every process sharing this database with \
                 --max-ttl {} --reclaim-grace {}",
                cfg.policy.max_ttl(),
                cfg.policy.reclaim_grace()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn from_value<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, CliError> {
    serde_json::from_value(v).map_err(|e| CliError::Failed(format!("unexpected response: {e}")))
}

async fn reclaim(args: ReclaimArgs) -> Result<ExitCode, CliError> {
    let interval = match &args.interval {
        Some(s) => config::parse_duration(s, false).map_err(ConfigError)?,
        None => config::DEFAULT_RECLAIM_INTERVAL,
    };
    if !interval.is_positive() {
        return Err(ConfigError(format!("--interval must be positive, got {interval}")).into());
    }
    let interval = Config::std(interval);
    let limit = args.limit.unwrap_or(config::DEFAULT_RECLAIM_BATCH);
    let (stop_tx, mut stop_rx) = watch::channel(false);
    if args.run_loop {
        let signal = serve::listen_for_shutdown();
        tokio::spawn(async move {
            signal.await;
            let _ = stop_tx.send(true);
        });
    }
    match target(&args.ops)? {
        Target::Http(c) => loop {
            let v: ReclaimView = from_value(
                c.call(
                    Method::POST,
                    "v1/admin/reclaim",
                    Some(&json!({"limit": limit})),
                    &[],
                )
                .await?,
            )?;
            out!(
                "{}",
                serde_json::to_string(&v).map_err(|e| CliError::Failed(e.to_string()))?
            );
            if !args.run_loop {
                return Ok(ExitCode::SUCCESS);
            }
            if v.reclaimed.len() >= limit {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop_rx.wait_for(|s| *s) => return Ok(ExitCode::SUCCESS),
            }
        },
        Target::Direct(cfg) => {
            let backend = direct_backend(&cfg, pg::Access::ReadWrite).await?;
            let clock: Arc<dyn Clock> = match direct_clock(&cfg, &backend)? {
                Some(c) => c,
                None => Arc::new(SystemClock),
            };
            let worker = ReclaimWorker::new(
                backend.allocator.clone(),
                clock,
                limit,
                Arc::new(Metrics::new()),
            );
            if args.run_loop {
                worker.run(interval, stop_rx).await;
                return Ok(ExitCode::SUCCESS);
            }
            let pass = worker
                .step()
                .await
                .map_err(|e| CliError::Failed(format!("reclaim: {e}")))?;
            out!(
                "{}",
                serde_json::to_string(&ReclaimView::new(pass.report, pass.now))
                    .map_err(|e| CliError::Failed(e.to_string()))?
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
