//! Configuration: flags, `TOLLGATE_*` environment variables and an optional
//! TOML file, merged and validated once at start-up.
//!
//! Precedence, highest first: command-line flag, environment variable
//! (`TOLLGATE_<NAME>`; the database URL also from `DATABASE_URL`), the TOML
//! file given by `--config` (keys are the flag names in snake_case), the
//! default. Every value is validated before anything starts; an invalid one
//! stops the process with a message naming it.
//!
//! Each setting is declared once, in `settings.rs` (its flag, environment
//! variable, help, TOML key, kind and rendering); `kinds.rs` has what each
//! kind of value parses, checks, defaults to and renders; [`Config::merge`]
//! adds the rules between settings. `tollgate serve --help` lists them.
//!
//! Durations are ISO 8601 (`PT30.000000001S`) or jiff's friendly format
//! (`30s 1ns`, `1h`).

mod kinds;
mod settings;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use jiff::SignedDuration;
use tollgate::{CapabilityKey, GrantPolicy};

use pgkit::UrlError;
pub use settings::{
    CONNECT_TIMEOUT_MAX, ClockArg, DATABASE_URL_ENV, DATABASE_URL_FALLBACK_ENV,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONNECTIONS_MAX, DEFAULT_HEADER_READ_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_LISTEN, DEFAULT_MAX_TTL, DEFAULT_RECLAIM_GRACE,
    DEFAULT_RECLAIM_INTERVAL, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SAFETIME_GAP_MAX,
    DEFAULT_SHUTDOWN_TIMEOUT, DatabaseSettings, FileConfig, KEYS, RECLAIM_BATCH_DEFAULT, RawConfig,
    ServiceSettings, StoreSettings,
};
use settings::{Layers, Lines};

use clock::ClockKind;

/// A configuration error, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

fn err(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// The duration checker and its examples, shared with the JSON API (one
/// wording for flags, configuration keys and body fields).
pub use tollgate_api::dto::{DURATION_EXAMPLES, parse_duration};

impl FileConfig {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// Unreadable file, invalid TOML, unknown keys, wrong types.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(format!("config file {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| err(format!("config file {}: {e}", path.display())))
    }
}

/// The effective, validated configuration.
#[derive(Clone)]
pub struct Config {
    /// Address to serve on.
    pub listen: SocketAddr,
    /// PostgreSQL URL; `None`: memory store.
    pub database_url: Option<String>,
    /// How long to wait for the database to accept connections (positive).
    pub connect_timeout: SignedDuration,
    /// The grant policy.
    pub policy: GrantPolicy,
    /// Whether `max_ttl` or `reclaim_grace` was given (flag, environment
    /// or file) rather than defaulted: a read-only operator command takes
    /// the recorded policy unless one was.
    pub policy_given: bool,
    /// Pause between worker passes (positive).
    pub reclaim_interval: SignedDuration,
    /// Leases per batch.
    pub reclaim_batch: usize,
    /// Whether `serve` runs the worker.
    pub reclaim_worker: bool,
    /// PostgreSQL: apply pending migrations at start-up.
    pub migrate_on_start: bool,
    /// Admin token, if configured.
    pub admin_token: Option<String>,
    /// Which clock.
    pub clock: ClockKind,
    /// Capability key file, if configured.
    pub secret_file: Option<PathBuf>,
    /// Bound on each request.
    pub request_timeout: SignedDuration,
    /// Bound on receiving a request head (positive).
    pub header_read_timeout: SignedDuration,
    /// Bound on a kept-alive connection on which nothing moves (positive).
    pub idle_timeout: SignedDuration,
    /// Connections served at once.
    pub connections_max: usize,
    /// Bound on graceful shutdown.
    pub shutdown_timeout: SignedDuration,
    /// Safe-cut clock: the sampling-gap bound after which an unchanged cut
    /// is stale (positive).
    pub safetime_gap_max: SignedDuration,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// Checks a PostgreSQL URL's shape with the parser every store uses
/// ([`pgkit::DatabaseUrl`]). Connection settings sqlx cannot use (an
/// unknown `sslmode`) pass here and are refused when the database is
/// opened, as "invalid database url".
///
/// # Errors
/// Not a URL, or a scheme other than `postgres`/`postgresql`; the message
/// does not repeat the URL.
pub fn check_database_url(url: &str) -> Result<(), ConfigError> {
    match pgkit::DatabaseUrl::parse(url) {
        Ok(_) | Err(UrlError::Settings) => Ok(()),
        Err(UrlError::NotAUrl { reason, .. }) => Err(err(format!(
            "database_url is not a URL ({reason}): {}",
            pgkit::url::UNPARSEABLE
        ))),
        Err(UrlError::NotPostgres { scheme }) => Err(err(format!(
            "database_url must be postgres:// or postgresql://, got {scheme}://"
        ))),
    }
}

/// `url` with any password (in the user part or a `password=` parameter)
/// replaced by `***`, for printing ([`pgkit::redact`]).
pub fn redact_url(url: &str) -> String {
    pgkit::redact(url)
}

impl Config {
    /// Merges flags/environment, `DATABASE_URL`, the config file and the
    /// defaults, and validates the result.
    ///
    /// # Errors
    /// The first invalid setting, named.
    pub fn resolve(raw: RawConfig) -> Result<Config, ConfigError> {
        let file = match &raw.config {
            Some(p) => FileConfig::load(p)?,
            None => FileConfig::default(),
        };
        Config::merge(raw, file, std::env::var(DATABASE_URL_FALLBACK_ENV).ok())
    }

    /// [`Config::resolve`] with the file and `DATABASE_URL` given.
    ///
    /// Each setting is resolved by its declaration (flag, else file, else
    /// default; then checked), in this order, so that of several invalid
    /// settings the first named here is reported; between them come the
    /// rules that span settings: the grant policy over `max_ttl` and
    /// `reclaim_grace`, and the safe-cut clock's need for a database.
    ///
    /// # Errors
    /// The first invalid setting, named.
    pub fn merge(
        mut raw: RawConfig,
        file: FileConfig,
        env_database_url: Option<String>,
    ) -> Result<Config, ConfigError> {
        raw.database_url = raw
            .database_url
            .or(env_database_url.filter(|u| !u.is_empty()));
        let policy_given = raw.max_ttl.is_some()
            || raw.reclaim_grace.is_some()
            || file.max_ttl.is_some()
            || file.reclaim_grace.is_some();
        let mut s = Layers::new(raw, file);
        let listen = s.listen()?;
        let database_url = s.database_url()?;
        let connect_timeout = s.connect_timeout()?;
        let policy =
            GrantPolicy::new(s.max_ttl()?, s.reclaim_grace()?).map_err(|e| err(e.to_string()))?;
        let reclaim_interval = s.reclaim_interval()?;
        let reclaim_batch = s.reclaim_batch()?;
        let reclaim_worker = s.reclaim_worker()?;
        let migrate_on_start = s.migrate_on_start()?;
        let admin_token = s.admin_token()?;
        let clock = s.clock()?;
        if clock == ClockKind::SafeCut && database_url.is_none() {
            return Err(err(
                "clock safe-cut reads the safe expiry cut from PostgreSQL: set database_url (--database-url); the memory store has no cut",
            ));
        }
        Ok(Config {
            listen,
            database_url,
            connect_timeout,
            policy,
            policy_given,
            reclaim_interval,
            reclaim_batch,
            reclaim_worker,
            migrate_on_start,
            admin_token,
            clock,
            safetime_gap_max: s.safetime_gap_max()?,
            secret_file: s.secret_file()?,
            request_timeout: s.request_timeout()?,
            header_read_timeout: s.header_read_timeout()?,
            idle_timeout: s.idle_timeout()?,
            connections_max: s.connections_max()?,
            shutdown_timeout: s.shutdown_timeout()?,
        })
    }

    /// Whether the PostgreSQL store is configured.
    pub fn is_postgres(&self) -> bool {
        self.database_url.is_some()
    }

    /// A nonnegative duration as `std::time::Duration`: every duration of
    /// a merged configuration is one ([`Config::merge`] checks each as
    /// positive or nonnegative).
    ///
    /// # Panics
    /// On a negative `d`, which no merged configuration holds.
    pub fn std(d: SignedDuration) -> std::time::Duration {
        std::time::Duration::try_from(d)
            .unwrap_or_else(|e| panic!("{d} is not a nonnegative duration: {e}"))
    }

    /// `line` of the unset setting `key` (flag `flag`), which only the
    /// memory store can do without: on PostgreSQL the comment says it is
    /// required instead of what the memory store would do.
    fn on_postgres(&self, line: String, key: &str, flag: &str) -> String {
        if self.database_url.is_some() && line.starts_with(&format!("# {key} unset:")) {
            format!(
                "# {key} unset: required with PostgreSQL (serve refuses to start without \
                 {flag})"
            )
        } else {
            line
        }
    }

    /// The effective configuration as TOML, secrets redacted (what
    /// `serve --print-config` prints; usable as a `--config` file once the
    /// redacted values are filled in): one line per setting, in this
    /// order.
    pub fn render(&self) -> String {
        let l = Lines(self);
        [
            l.listen(),
            l.database_url(),
            l.connect_timeout(),
            l.max_ttl(),
            l.reclaim_grace(),
            l.reclaim_interval(),
            l.reclaim_batch(),
            l.reclaim_worker(),
            l.migrate_on_start(),
            self.on_postgres(l.admin_token(), "admin_token", "--admin-token"),
            l.clock(),
            self.on_postgres(l.secret_file(), "secret_file", "--secret-file"),
            l.request_timeout(),
            l.header_read_timeout(),
            l.idle_timeout(),
            l.connections_max(),
            l.shutdown_timeout(),
            l.safetime_gap_max(),
        ]
        .into_iter()
        .map(|line| line + "\n")
        .collect()
    }
}

/// Reads the capability key from `path`: the file's bytes with trailing
/// ASCII whitespace removed, at least 32 bytes.
///
/// # Errors
/// Unreadable file or a key that is too short.
pub fn read_secret_file(path: &Path) -> Result<CapabilityKey, ConfigError> {
    let bytes =
        std::fs::read(path).map_err(|e| err(format!("secret_file {}: {e}", path.display())))?;
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    CapabilityKey::new(&bytes[..end])
        .map_err(|e| err(format!("secret_file {}: {e}", path.display())))
}

/// The root of the git work tree that holds `path` (the nearest ancestor
/// of its absolute, resolved path with a `.git` entry), if any: a secret
/// file there is one `git add .` away from being published.
pub fn git_work_tree_holding(path: &Path) -> Option<PathBuf> {
    let resolved = std::fs::canonicalize(path).ok()?;
    resolved
        .ancestors()
        .skip(1)
        .find(|dir| dir.join(".git").exists())
        .map(Path::to_path_buf)
}

/// Warns when the capability key file `path` lies inside a git work tree
/// ([`git_work_tree_holding`]), naming the tree and where to keep it.
pub fn warn_if_secret_in_work_tree(path: &Path) {
    if let Some(root) = git_work_tree_holding(path) {
        tracing::warn!(
            secret_file = %path.display(),
            work_tree = %root.display(),
            "the capability key file is inside a git work tree; keep secrets out of \
             repositories, e.g. in ~/.config/tollgate/capability.key (mode 600)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration with every optional setting set.
    fn full() -> Config {
        Config::merge(
            RawConfig {
                database_url: Some("postgres://u:pw@h/db".into()),
                admin_token: Some("an-admin-token-0123456789".into()),
                secret_file: Some("/k".into()),
                ..RawConfig::default()
            },
            FileConfig::default(),
            None,
        )
        .expect("valid")
    }

    /// The rendering has one line per declared setting, each under its
    /// TOML key, and reads back as a file.
    /// Unset, the key file and the admin token are the memory store's to
    /// make up; on PostgreSQL the printed configuration says they are
    /// required.
    #[test]
    fn render_says_postgres_requires_the_key_and_the_token() {
        let memory = Config::merge(RawConfig::default(), FileConfig::default(), None)
            .expect("memory config")
            .render();
        assert!(
            memory
                .lines()
                .any(|l| l == "# secret_file unset: a fresh random capability key (memory store)"),
            "{memory}"
        );
        let pg = Config::merge(
            RawConfig {
                database_url: Some("postgres://u@localhost/db".into()),
                ..RawConfig::default()
            },
            FileConfig::default(),
            None,
        )
        .expect("postgres config")
        .render();
        for line in [
            "# secret_file unset: required with PostgreSQL (serve refuses to start without \
             --secret-file)",
            "# admin_token unset: required with PostgreSQL (serve refuses to start without \
             --admin-token)",
        ] {
            assert!(pg.lines().any(|l| l == line), "{line} in\n{pg}");
        }
    }

    #[test]
    fn render_writes_every_setting_once() {
        let text = full().render();
        let mut keys: Vec<&str> = text
            .lines()
            .map(|l| l.split_once(" = ").expect("key = value").0)
            .collect();
        keys.sort_unstable();
        let mut declared = KEYS.to_vec();
        declared.sort_unstable();
        assert_eq!(keys, declared);
        toml::from_str::<FileConfig>(&text).expect("the rendering is a valid file");
    }

    /// The default each help text shows is the value a configuration
    /// without flags, environment or file gets.
    #[test]
    fn help_shows_the_defaults_merge_applies() {
        use clap::{Args as _, Command};
        let cmd = ServiceSettings::augment_args(StoreSettings::augment_args(
            DatabaseSettings::augment_args(Command::new("t")),
        ));
        let defaults = Config::merge(RawConfig::default(), FileConfig::default(), None)
            .expect("defaults")
            .render();
        let mut checked = 0;
        for arg in cmd.get_arguments() {
            let help = arg.get_help().expect("every setting has help").to_string();
            let Some((_, rest)) = help.split_once("[default: ") else {
                continue;
            };
            let shown = rest.split_once(']').expect("closed").0;
            let key = arg.get_id().as_str();
            let line = defaults
                .lines()
                .find(|l| l.starts_with(&format!("{key} = ")))
                .unwrap_or_else(|| panic!("no line for {key}"));
            assert!(
                line == format!("{key} = \"{shown}\"") || line == format!("{key} = {shown}"),
                "{key}: help shows {shown}, merge gives {line}"
            );
            checked += 1;
        }
        assert_eq!(checked, 13, "settings whose help shows a default");
    }

    /// A file under a directory with `.git` is in a work tree; one outside
    /// any is not.
    #[test]
    fn secret_files_in_a_work_tree_are_found() {
        let base = std::env::temp_dir().join(format!("tg-gitcheck-{}", std::process::id()));
        let repo = base.join("repo");
        std::fs::create_dir_all(repo.join(".git")).expect("repo");
        std::fs::create_dir_all(repo.join("sub")).expect("sub");
        let inside = repo.join("sub").join("tollgate.key");
        let outside = base.join("tollgate.key");
        std::fs::write(&inside, [1u8; 32]).expect("inside");
        std::fs::write(&outside, [1u8; 32]).expect("outside");
        assert_eq!(
            git_work_tree_holding(&inside),
            Some(std::fs::canonicalize(&repo).expect("repo path"))
        );
        assert_eq!(git_work_tree_holding(&outside), None);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// The connection defaults are the connection layer's.
    #[test]
    fn connection_defaults_are_httpkits() {
        use httpkit::server as s;
        assert_eq!(
            Config::std(DEFAULT_HEADER_READ_TIMEOUT),
            s::HEADER_READ_TIMEOUT_DEFAULT
        );
        assert_eq!(Config::std(DEFAULT_IDLE_TIMEOUT), s::IDLE_TIMEOUT_DEFAULT);
        assert_eq!(DEFAULT_CONNECTIONS_MAX, s::CONNECTIONS_MAX_DEFAULT);
    }
}
