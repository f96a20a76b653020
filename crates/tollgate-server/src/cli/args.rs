//! The clap types of the `tollgate` command line: the top-level parser,
//! its subcommands and their arguments. Nothing here runs anything.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::client::{Client, ClientError};
use crate::config::{self, DatabaseSettings, RawConfig, ServiceSettings, StoreSettings};

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

/// The environment variable of `--log-level`, the same for both binaries.
pub const LOG_LEVEL_ENV: &str = "TOLLGATE_LOG_LEVEL";

/// The former name of [`LOG_LEVEL_ENV`], still read (with a deprecation
/// warning) when neither `--log-level` nor [`LOG_LEVEL_ENV`] is set.
pub const LOG_LEVEL_DEPRECATED_ENV: &str = "TOLLGATE_LOG";

/// What `--database-url` means for `serve`.
pub(crate) const DATABASE_URL_HELP_SERVE: &str =
    "PostgreSQL URL (also DATABASE_URL); absent: the in-memory store";
/// What `--database-url` means for `status`, `audit` and `reclaim`.
pub(crate) const DATABASE_URL_HELP_OPS: &str = "PostgreSQL URL (also DATABASE_URL): run against \
     the database directly; absent: ask the service at --server over HTTP";
/// What `--max-ttl` and `--reclaim-grace` mean for `status` and `audit`.
pub(crate) const READ_ONLY_POLICY_HELP: &str = "Not needed: a direct status or audit only reads, \
     with the policy recorded in the database (a different value is ignored, with a warning)";
/// What `--secret-file` means for `status` and `audit`.
pub(crate) const READ_ONLY_SECRET_FILE_HELP: &str = "Not needed: a direct status or audit checks \
     no capability (the file is not read; given, it is ignored with a warning)";
/// What `--database-url` means for `migrate` and `policy`.
pub(crate) const DATABASE_URL_HELP_REQUIRED: &str = "PostgreSQL URL (also DATABASE_URL); required";

/// Tollgate: an exact-time lease and credit allocator.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about, max_term_width = 100)]
pub struct Cli {
    /// Log level (logs go to stderr): a level (`error`, `warn`, `info`,
    /// `debug`, `trace`, `off`) or `target=level` directives
    /// (`info,tollgate_pg=debug`; targets are crate names:
    /// `tollgate_api`, `httpkit`, `clock`, `tollgate_pg`,
    /// `tollgate_server`). Default: `info` for serve, migrate and reclaim,
    /// `warn` otherwise. The former variable TOLLGATE_LOG is still read,
    /// with a warning.
    #[arg(long, env = LOG_LEVEL_ENV, value_name = "LEVEL", global = true)]
    pub log_level: Option<String>,
    /// Log format (logs go to stderr).
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
    #[command(mut_arg("database_url", |a| a.help(DATABASE_URL_HELP_SERVE)))]
    Serve(ServeArgs),
    /// Apply pending PostgreSQL migrations.
    #[command(mut_arg("database_url", |a| a.help(DATABASE_URL_HELP_REQUIRED)))]
    Migrate(MigrateArgs),
    /// Schema version, readiness, counts of active leases and legacy bounds.
    #[command(
        mut_arg("database_url", |a| a.help(DATABASE_URL_HELP_OPS)),
        mut_arg("max_ttl", |a| a.help(READ_ONLY_POLICY_HELP)),
        mut_arg("reclaim_grace", |a| a.help(READ_ONLY_POLICY_HELP)),
        mut_arg("secret_file", |a| a.help(READ_ONLY_SECRET_FILE_HELP))
    )]
    Status(OpsArgs),
    /// Recompute every account from the ledger; exit 1 on any violation.
    #[command(
        mut_arg("database_url", |a| a.help(DATABASE_URL_HELP_OPS)),
        mut_arg("max_ttl", |a| a.help(READ_ONLY_POLICY_HELP)),
        mut_arg("reclaim_grace", |a| a.help(READ_ONLY_POLICY_HELP)),
        mut_arg("secret_file", |a| a.help(READ_ONLY_SECRET_FILE_HELP))
    )]
    Audit(OpsArgs),
    /// Settle reclaimable leases.
    #[command(mut_arg("database_url", |a| a.help(DATABASE_URL_HELP_OPS)))]
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

/// Settings that name the store and its policy: the configuration file,
/// the database's settings ([`DatabaseSettings`]) and the store's
/// ([`StoreSettings`]).
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// TOML configuration file (keys: the flag names in snake_case).
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    /// The database's settings.
    pub database: DatabaseSettings,
    #[command(flatten)]
    /// The store's settings.
    pub settings: StoreSettings,
}

impl StoreArgs {
    /// The raw configuration of these flags.
    pub fn raw(&self) -> RawConfig {
        self.settings.apply(self.database.apply(RawConfig {
            config: self.config.clone(),
            ..RawConfig::default()
        }))
    }
}

/// `tollgate serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    /// Store settings.
    pub store: StoreArgs,
    #[command(flatten)]
    /// The service's own settings.
    pub service: ServiceSettings,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl ServeArgs {
    /// The raw configuration of these flags.
    pub fn raw(&self) -> RawConfig {
        self.service.apply(self.store.raw())
    }
}

/// Where a client subcommand sends its requests.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// The service's base URL (default: [`DEFAULT_SERVER`]).
    #[arg(
        long,
        env = "TOLLGATE_SERVER",
        value_name = "URL",
        help = format!("The service's base URL [default: {DEFAULT_SERVER}]")
    )]
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

/// `tollgate migrate`: only the database's settings (the store's policy,
/// key and clock do not matter to the schema).
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// TOML configuration file (keys: the flag names in snake_case).
    #[arg(long, env = "TOLLGATE_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    /// The database's settings.
    pub database: DatabaseSettings,
    /// List pending migrations without applying them.
    #[arg(long)]
    pub dry_run: bool,
}

impl MigrateArgs {
    /// The raw configuration of these flags.
    pub fn raw(&self) -> RawConfig {
        self.database.apply(RawConfig {
            config: self.config.clone(),
            ..RawConfig::default()
        })
    }
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
    /// Leases per batch (default: `--reclaim-batch`'s).
    #[arg(
        long,
        value_name = "N",
        help = format!("Leases per batch [default: {}]", config::RECLAIM_BATCH_DEFAULT)
    )]
    pub limit: Option<usize>,
    /// Pause between batches with `--loop` (default: `--reclaim-interval`'s).
    #[arg(
        long,
        value_name = "DURATION",
        allow_hyphen_values = true,
        help = format!(
            "Pause between batches with `--loop` [default: {}]",
            config::DEFAULT_RECLAIM_INTERVAL
        )
    )]
    pub interval: Option<String>,
}

/// The database of a `policy` subcommand.
#[derive(Debug, Clone, Args)]
pub struct PolicyDbArgs {
    #[command(flatten)]
    /// The database's settings.
    pub database: DatabaseSettings,
}

/// `tollgate policy ...`.
#[derive(Debug, Subcommand)]
pub enum PolicyCmd {
    /// Print the recorded policy and its change history.
    #[command(mut_arg("database_url", |a| a.help(DATABASE_URL_HELP_REQUIRED)))]
    Show {
        #[command(flatten)]
        /// The database.
        db: PolicyDbArgs,
    },
    /// Record a new policy, with who changed it. Restart every process
    /// sharing the database with the new values afterwards.
    #[command(mut_arg("database_url", |a| a.help(DATABASE_URL_HELP_REQUIRED)))]
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
        /// Who makes the change (recorded; 1..=[`tollgate_pg::CHANGED_BY_MAX_CHARS`]
        /// characters, no control characters).
        #[arg(
            long,
            value_name = "NAME",
            help = format!(
                "Who makes the change (recorded; 1..={} characters, no control characters)",
                tollgate_pg::CHANGED_BY_MAX_CHARS
            )
        )]
        changed_by: String,
    },
}

/// A path id of the command line (`account show 1`): read as the service
/// reads its path ids ([`httpkit::extract::parse_id`]), so `01`, `+1` and `0` are
/// refused here as the service would refuse them.
///
/// # Errors
/// The value and the accepted form.
fn id_arg(raw: &str) -> Result<i64, String> {
    httpkit::extract::parse_id(raw).ok_or_else(|| {
        format!(
            "{raw:?} is not a positive integer in canonical decimal \
             (1..=9223372036854775807, no sign or leading zero)"
        )
    })
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
        /// The account: a positive integer in canonical decimal.
        #[arg(value_parser = id_arg)]
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
        /// The account: a positive integer in canonical decimal.
        #[arg(value_parser = id_arg)]
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
        /// The account: a positive integer in canonical decimal.
        #[arg(value_parser = id_arg)]
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
        /// The lease: a positive integer in canonical decimal.
        #[arg(value_parser = id_arg)]
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
        /// The lease: a positive integer in canonical decimal.
        #[arg(value_parser = id_arg)]
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
        /// The lease: a positive integer in canonical decimal.
        #[arg(value_parser = id_arg)]
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
