//! Every setting, declared once.
//!
//! Each entry of the [`settings!`] table below is one setting:
//!
//! ```text
//! flag_field: ClapType => toml_key: TomlType,
//!     env "TOLLGATE_...",                 the environment variable
//!     Kind::constructor(default, ...),    default, validation, rendering
//!     help "... {default}",               the help text
//!     arg(value_name = "...", ...),       further clap attributes
//!     shown |c| c.field;                  its value in the merged `Config`
//! ```
//!
//! From it the macro makes: the clap argument `--flag-field` (with the
//! environment variable, the help text whose `{default}` shows the kind's
//! default, and the attributes) in its group's clap struct
//! ([`StoreSettings`] or [`ServiceSettings`]); the field of [`RawConfig`];
//! the TOML key of [`FileConfig`]; the resolver that merges flag, file and
//! default and checks the value ([`super::kinds::Kind::resolve`]); and the
//! line of the rendered configuration ([`super::kinds::Kind::render`]).
//! [`super::Config::merge`] calls the resolvers in its order and adds the
//! rules between settings; [`super::Config::render`] writes the lines in
//! the file's order.

use std::path::PathBuf;

use clap::ValueEnum;
use clap::builder::TypedValueParser as _;
use jiff::SignedDuration;
use serde::Deserialize;
use tollgate::RECLAIM_BATCH_MAX;

use super::kinds::{
    Address, Count, Duration, FilePath, Kind, PostgresUrl, Switch, TimeSource, Token,
};
use super::{Config, ConfigError};
use clock::ClockKind;
use tollgate_api::auth::ADMIN_TOKEN_MIN_BYTES;

/// Default `--listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default `--max-ttl`: one hour.
pub const DEFAULT_MAX_TTL: SignedDuration = SignedDuration::from_secs(3600);
/// Default `--reclaim-grace`: thirty seconds.
pub const DEFAULT_RECLAIM_GRACE: SignedDuration = SignedDuration::from_secs(30);
/// Default `--reclaim-interval`: one second.
pub const DEFAULT_RECLAIM_INTERVAL: SignedDuration = SignedDuration::from_secs(1);
/// Default `--reclaim-batch` and `reclaim --limit`: leases per reclaim
/// batch.
pub const RECLAIM_BATCH_DEFAULT: usize = tollgate::RECLAIM_BATCH_DEFAULT;
/// Default `--connect-timeout`: long enough for a database container
/// started alongside the service, short enough that a wrong URL fails
/// within a minute.
pub const DEFAULT_CONNECT_TIMEOUT: SignedDuration = SignedDuration::from_secs(30);
/// The largest `--connect-timeout`.
pub const CONNECT_TIMEOUT_MAX: SignedDuration = SignedDuration::from_secs(3600);
/// Default `--request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: SignedDuration = SignedDuration::from_secs(30);
/// Default `--shutdown-timeout`.
pub const DEFAULT_SHUTDOWN_TIMEOUT: SignedDuration = SignedDuration::from_secs(10);
/// Default `--header-read-timeout`: the connection layer's
/// ([`httpkit::server::HEADER_READ_TIMEOUT_DEFAULT`], which says why).
pub const DEFAULT_HEADER_READ_TIMEOUT: SignedDuration =
    SignedDuration::from_nanos(httpkit::server::HEADER_READ_TIMEOUT_DEFAULT.as_nanos() as i64);
/// Default `--idle-timeout`: the connection layer's
/// ([`httpkit::server::IDLE_TIMEOUT_DEFAULT`], which says why).
pub const DEFAULT_IDLE_TIMEOUT: SignedDuration =
    SignedDuration::from_nanos(httpkit::server::IDLE_TIMEOUT_DEFAULT.as_nanos() as i64);
/// Default `--connections-max`: the connection layer's
/// ([`httpkit::server::CONNECTIONS_MAX_DEFAULT`], which says why).
pub const DEFAULT_CONNECTIONS_MAX: usize = httpkit::server::CONNECTIONS_MAX_DEFAULT;
/// Default `--safetime-gap-max`: the sampler's own default sampling-gap
/// bound ([`safetime::DEFAULT_GAP_MAX`]).
pub const DEFAULT_SAFETIME_GAP_MAX: SignedDuration = safetime::DEFAULT_GAP_MAX;

/// The environment variable of `--database-url` (also read by the `policy`
/// subcommands' own `--database-url`).
pub const DATABASE_URL_ENV: &str = "TOLLGATE_DATABASE_URL";
/// The conventional variable read for the database URL when neither
/// `--database-url` nor [`DATABASE_URL_ENV`] is set (an empty value counts
/// as unset); below them, above the file.
pub const DATABASE_URL_FALLBACK_ENV: &str = "DATABASE_URL";

/// `--clock`: the time source.
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

/// The parser of `--clock`: the values of [`ClockArg`], as a [`ClockKind`].
fn clock_values() -> impl clap::builder::TypedValueParser<Value = ClockKind> {
    clap::builder::EnumValueParser::<ClockArg>::new().map(ClockKind::from)
}

/// The flag (or environment) and file values of each setting, taken by the
/// setting's resolver.
pub(super) struct Layers {
    raw: RawConfig,
    file: FileConfig,
}

impl Layers {
    /// Flags and environment over the file.
    pub(super) fn new(raw: RawConfig, file: FileConfig) -> Layers {
        Layers { raw, file }
    }
}

/// The TOML lines of a configuration, one method per setting.
pub(super) struct Lines<'a>(pub(super) &'a Config);

/// Declares the settings; see the module docs.
macro_rules! settings {
    (
        $(
            $(#[doc = $group_doc:literal])*
            $group:ident {
                $(
                    $flag:ident: $flag_ty:ty => $file:ident: $file_ty:ty,
                    env $env:expr,
                    $kind:ident :: $ctor:ident ($($kind_args:tt)*),
                    help $help:literal,
                    arg($($arg:tt)*),
                    shown |$c:ident| $shown:expr;
                )*
            }
        )*
    ) => {
        $(
            $(#[doc = $group_doc])*
            #[derive(Debug, Clone, clap::Args)]
            pub struct $group {
                $(
                    #[arg(
                        long,
                        env = $env,
                        help = $kind::$ctor($($kind_args)*).help($help),
                        $($arg)*
                    )]
                    $flag: $flag_ty,
                )*
            }

            impl $group {
                /// `raw` with this group's flag (or environment) values.
                pub fn apply(&self, raw: RawConfig) -> RawConfig {
                    RawConfig {
                        $($flag: self.$flag.clone(),)*
                        ..raw
                    }
                }
            }
        )*

        /// Raw values from flags and environment (clap), before merging.
        #[derive(Debug, Clone, Default)]
        pub struct RawConfig {
            /// `--config`: the TOML file to read.
            pub config: Option<PathBuf>,
            $($(
                #[doc = concat!(
                    "The flag `", stringify!($flag), "` or its environment variable (TOML key `",
                    stringify!($file), "`)."
                )]
                pub $flag: $flag_ty,
            )*)*
        }

        /// The optional TOML file. Keys are the flag names in snake_case
        /// (a switch's positive name: `reclaim_worker`, `migrate_on_start`);
        /// unknown keys are refused.
        #[derive(Debug, Clone, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct FileConfig {
            $($(
                #[doc = concat!("`", stringify!($file), "`.")]
                pub $file: Option<$file_ty>,
            )*)*
        }

        /// Every TOML key, in declaration order.
        pub const KEYS: &[&str] = &[$($(stringify!($file),)*)*];

        impl Layers {
            $($(
                pub(super) fn $file(&mut self) -> Result<<$kind as Kind>::Value, ConfigError> {
                    $kind::$ctor($($kind_args)*).resolve(
                        stringify!($file),
                        std::mem::take(&mut self.raw.$flag),
                        self.file.$file.take(),
                    )
                }
            )*)*
        }

        impl Lines<'_> {
            $($(
                pub(super) fn $file(&self) -> String {
                    let $c: &Config = self.0;
                    $kind::$ctor($($kind_args)*).render(stringify!($file), &$shown)
                }
            )*)*
        }
    };
}

settings! {
    /// The settings of every command that connects to the database: its
    /// URL and how long to wait for it.
    DatabaseSettings {
        database_url: Option<String> => database_url: String,
            env DATABASE_URL_ENV,
            PostgresUrl::new(),
            help "PostgreSQL URL (also DATABASE_URL)",
            arg(value_name = "URL", hide_env_values = true),
            shown |c| c.database_url;
        connect_timeout: Option<String> => connect_timeout: String,
            env "TOLLGATE_CONNECT_TIMEOUT",
            Duration::positive_at_most(DEFAULT_CONNECT_TIMEOUT, CONNECT_TIMEOUT_MAX),
            help "PostgreSQL: how long to wait for the database to accept connections before \
                  giving up (exit 1), at most PT1H {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.connect_timeout;
    }

    /// The settings of every command that opens the store besides the
    /// database's: its grant policy, the capability key and the clock.
    StoreSettings {
        max_ttl: Option<String> => max_ttl: String,
            env "TOLLGATE_MAX_TTL",
            Duration::policy(DEFAULT_MAX_TTL),
            help "Longest granted TTL {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.policy.max_ttl();
        reclaim_grace: Option<String> => reclaim_grace: String,
            env "TOLLGATE_RECLAIM_GRACE",
            Duration::policy_or_max(DEFAULT_RECLAIM_GRACE),
            help "Grace after expiry before a lease is reclaimable; `max` for the largest \
                  duration {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.policy.reclaim_grace();
        secret_file: Option<PathBuf> => secret_file: PathBuf,
            env "TOLLGATE_SECRET_FILE",
            FilePath::optional("a fresh random capability key (memory store)"),
            help "Capability key file (at least 32 bytes); required with PostgreSQL",
            arg(value_name = "PATH"),
            shown |c| c.secret_file;
        clock: Option<ClockKind> => clock: ClockKind,
            env "TOLLGATE_CLOCK",
            TimeSource::with_default(ClockKind::System),
            help "Time source {default}. `safe-cut`: the safe expiry cut published in \
                  PostgreSQL by the safe-time sampler",
            arg(value_parser = clock_values()),
            shown |c| c.clock;
        safetime_gap_max: Option<String> => safetime_gap_max: String,
            env "TOLLGATE_SAFETIME_GAP_MAX",
            // The samplers' own cap (`SafeTimeConfig::new`).
            Duration::positive_at_most(DEFAULT_SAFETIME_GAP_MAX, safetime::GAP_MAX_MAX),
            help "Safe-cut clock: a cut not republished for longer than this is stale, hence \
                  uncertain {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.safetime_gap_max;
    }

    /// The settings of `serve` beyond the store's: the listener, the
    /// reclaim worker, migrations at start-up, the admin token, the time
    /// bounds and the connection bounds.
    ServiceSettings {
        listen: Option<String> => listen: String,
            env "TOLLGATE_LISTEN",
            Address::with_default(DEFAULT_LISTEN),
            help "Address to listen on {default}",
            arg(value_name = "ADDR:PORT"),
            shown |c| c.listen;
        reclaim_interval: Option<String> => reclaim_interval: String,
            env "TOLLGATE_RECLAIM_INTERVAL",
            Duration::positive(DEFAULT_RECLAIM_INTERVAL),
            help "Pause between reclaim worker passes {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.reclaim_interval;
        reclaim_batch: Option<i64> => reclaim_batch: i64,
            env "TOLLGATE_RECLAIM_BATCH",
            Count::up_to(RECLAIM_BATCH_DEFAULT, RECLAIM_BATCH_MAX),
            help "Leases per reclaim batch, {range} {default}",
            arg(value_name = "N", allow_negative_numbers = true),
            shown |c| c.reclaim_batch;
        no_reclaim_worker: bool => reclaim_worker: bool,
            env "TOLLGATE_NO_RECLAIM_WORKER",
            Switch::on(),
            help "Do not run the reclaim worker inside the service",
            arg(),
            shown |c| c.reclaim_worker;
        no_migrate: bool => migrate_on_start: bool,
            env "TOLLGATE_NO_MIGRATE",
            Switch::on(),
            help "PostgreSQL: do not apply pending migrations at start-up",
            arg(),
            shown |c| c.migrate_on_start;
        admin_token: Option<String> => admin_token: String,
            env "TOLLGATE_ADMIN_TOKEN",
            Token::at_least(
                ADMIN_TOKEN_MIN_BYTES,
                "generated and printed once at start-up (memory store)"
            ),
            help "Admin bearer token (memory store: generated and printed when unset)",
            arg(value_name = "TOKEN", hide_env_values = true),
            shown |c| c.admin_token;
        request_timeout: Option<String> => request_timeout: String,
            env "TOLLGATE_REQUEST_TIMEOUT",
            Duration::positive(DEFAULT_REQUEST_TIMEOUT),
            help "Bound on each request {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.request_timeout;
        header_read_timeout: Option<String> => header_read_timeout: String,
            env "TOLLGATE_HEADER_READ_TIMEOUT",
            Duration::positive(DEFAULT_HEADER_READ_TIMEOUT),
            help "Bound on receiving a request's head (request line and headers), from the \
                  accept or the request's first byte; a connection that is slower is closed {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.header_read_timeout;
        idle_timeout: Option<String> => idle_timeout: String,
            env "TOLLGATE_IDLE_TIMEOUT",
            Duration::positive(DEFAULT_IDLE_TIMEOUT),
            help "Close a kept-alive connection on which nothing moves for this long between \
                  requests, or while its client does not read a response {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.idle_timeout;
        connections_max: Option<i64> => connections_max: i64,
            env "TOLLGATE_CONNECTIONS_MAX",
            Count::up_to(DEFAULT_CONNECTIONS_MAX, httpkit::server::CONNECTIONS_MAX_MAX),
            help "Connections served at once, {range}; at the bound the connection waiting \
                  longest for a request is closed to make room, and with every one busy a new \
                  one gets 503 too_many_connections; must fit under the open-file limit {default}",
            arg(value_name = "N", allow_negative_numbers = true),
            shown |c| c.connections_max;
        shutdown_timeout: Option<String> => shutdown_timeout: String,
            env "TOLLGATE_SHUTDOWN_TIMEOUT",
            Duration::nonnegative(DEFAULT_SHUTDOWN_TIMEOUT),
            help "Bound on finishing in-flight requests at shutdown {default}",
            arg(value_name = "DURATION", allow_hyphen_values = true),
            shown |c| c.shutdown_timeout;
    }
}
