//! The clap types of the `tollgate` command line: the top-level parser,
//! its subcommands and their arguments. Nothing here runs anything.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::client::{Client, ClientError};
use crate::clock::ClockKind;
use crate::config::RawConfig;

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
    pub(super) fn client(&self) -> Result<Client, ClientError> {
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

impl StoreArgs {
    pub(super) fn raw(&self) -> RawConfig {
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
