//! Configuration: flags, `TOLLGATE_*` environment variables and an optional
//! TOML file, merged and validated once at start-up.
//!
//! Precedence, highest first: command-line flag, environment variable
//! (`TOLLGATE_<NAME>`; the database URL also from `DATABASE_URL`), the TOML
//! file given by `--config` (keys are the flag names in snake_case), the
//! default. Every value is validated before anything starts; an invalid one
//! stops the process with a message naming it.
//!
//! | flag | env | default | meaning |
//! |---|---|---|---|
//! | `--listen` | `TOLLGATE_LISTEN` | `127.0.0.1:8080` | address to serve HTTP on |
//! | `--database-url` | `TOLLGATE_DATABASE_URL`, `DATABASE_URL` | none: memory store | PostgreSQL URL |
//! | `--max-ttl` | `TOLLGATE_MAX_TTL` | `PT1H` | longest granted TTL (positive) |
//! | `--reclaim-grace` | `TOLLGATE_RECLAIM_GRACE` | `PT30S` | grace after expiry (nonnegative; `max` = the largest duration) |
//! | `--reclaim-interval` | `TOLLGATE_RECLAIM_INTERVAL` | `PT1S` | pause between worker passes (positive) |
//! | `--reclaim-batch` | `TOLLGATE_RECLAIM_BATCH` | `1000` | leases per reclaim batch (1..=10000) |
//! | `--no-migrate` | `TOLLGATE_NO_MIGRATE` | migrate on | PostgreSQL: do not apply pending migrations at start-up (the store then refuses to start while any is pending) |
//! | `--no-reclaim-worker` | `TOLLGATE_NO_RECLAIM_WORKER` | worker on | do not run the worker inside `serve` |
//! | `--admin-token` | `TOLLGATE_ADMIN_TOKEN` | memory: generated and printed once; PostgreSQL: required | admin bearer token (at least 16 visible ASCII bytes) |
//! | `--clock` | `TOLLGATE_CLOCK` | `system` | `system`, `test` or `safe-cut` (PostgreSQL only: the safe expiry cut published by the sampler) |
//! | `--safetime-gap-max` | `TOLLGATE_SAFETIME_GAP_MAX` | `PT5S` | safe-cut clock: a cut not republished for longer than this is stale, hence uncertain (positive) |
//! | `--secret-file` | `TOLLGATE_SECRET_FILE` | memory: a fresh random key; PostgreSQL: required | capability key file (at least 32 bytes; trailing newlines ignored) |
//! | `--request-timeout` | `TOLLGATE_REQUEST_TIMEOUT` | `PT30S` | bound on each request (positive) |
//! | `--shutdown-timeout` | `TOLLGATE_SHUTDOWN_TIMEOUT` | `PT10S` | bound on finishing in-flight requests after SIGTERM/SIGINT |
//!
//! Durations are ISO 8601 (`PT30.000000001S`) or jiff's friendly format
//! (`30s 1ns`, `1h`).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use jiff::SignedDuration;
use serde::Deserialize;
use tollgate::{CapabilityKey, GrantPolicy, RECLAIM_BATCH_MAX, rules, safe_time};

use crate::auth::ADMIN_TOKEN_MIN_BYTES;
use crate::clock::ClockKind;

/// Default `--listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default `--max-ttl`: one hour.
pub const DEFAULT_MAX_TTL: SignedDuration = SignedDuration::from_secs(3600);
/// Default `--reclaim-grace`: thirty seconds.
pub const DEFAULT_RECLAIM_GRACE: SignedDuration = SignedDuration::from_secs(30);
/// Default `--reclaim-interval`: one second.
pub const DEFAULT_RECLAIM_INTERVAL: SignedDuration = SignedDuration::from_secs(1);
/// Default `--reclaim-batch`.
pub const DEFAULT_RECLAIM_BATCH: usize = 1_000;
/// Default `--request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: SignedDuration = SignedDuration::from_secs(30);
/// Default `--shutdown-timeout`.
pub const DEFAULT_SHUTDOWN_TIMEOUT: SignedDuration = SignedDuration::from_secs(10);
/// Default `--safetime-gap-max`: the sampler's own default sampling-gap
/// bound ([`safe_time::DEFAULT_GAP_MAX`]).
pub const DEFAULT_SAFETIME_GAP_MAX: SignedDuration = safe_time::DEFAULT_GAP_MAX;

/// A configuration error, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

fn err(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// Parses a duration: ISO 8601 or jiff's friendly format; with `allow_max`
/// also the keyword `max` ([`SignedDuration::MAX`]).
///
/// # Errors
/// A message naming the value.
pub fn parse_duration(s: &str, allow_max: bool) -> Result<SignedDuration, String> {
    let t = s.trim();
    if allow_max && t.eq_ignore_ascii_case("max") {
        return Ok(SignedDuration::MAX);
    }
    t.parse::<SignedDuration>()
        .map_err(|e| format!("{s:?} is not an ISO 8601 or friendly duration: {e}"))
}

/// The optional TOML file. Keys are the flag names in snake_case; unknown
/// keys are refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `listen`.
    pub listen: Option<String>,
    /// `database_url`.
    pub database_url: Option<String>,
    /// `max_ttl`.
    pub max_ttl: Option<String>,
    /// `reclaim_grace`.
    pub reclaim_grace: Option<String>,
    /// `reclaim_interval`.
    pub reclaim_interval: Option<String>,
    /// `reclaim_batch`.
    pub reclaim_batch: Option<i64>,
    /// `reclaim_worker` (default true).
    pub reclaim_worker: Option<bool>,
    /// `migrate_on_start` (default true).
    pub migrate_on_start: Option<bool>,
    /// `admin_token`.
    pub admin_token: Option<String>,
    /// `clock`.
    pub clock: Option<ClockKind>,
    /// `secret_file`.
    pub secret_file: Option<PathBuf>,
    /// `request_timeout`.
    pub request_timeout: Option<String>,
    /// `shutdown_timeout`.
    pub shutdown_timeout: Option<String>,
    /// `safetime_gap_max`.
    pub safetime_gap_max: Option<String>,
}

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

/// Raw values from flags and environment (clap), before merging.
#[derive(Debug, Clone, Default)]
pub struct RawConfig {
    /// `--config`.
    pub config: Option<PathBuf>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--database-url` / `TOLLGATE_DATABASE_URL`.
    pub database_url: Option<String>,
    /// `--max-ttl`.
    pub max_ttl: Option<String>,
    /// `--reclaim-grace`.
    pub reclaim_grace: Option<String>,
    /// `--reclaim-interval`.
    pub reclaim_interval: Option<String>,
    /// `--reclaim-batch`.
    pub reclaim_batch: Option<i64>,
    /// `--no-reclaim-worker`.
    pub no_reclaim_worker: bool,
    /// `--no-migrate`.
    pub no_migrate: bool,
    /// `--admin-token`.
    pub admin_token: Option<String>,
    /// `--clock`.
    pub clock: Option<ClockKind>,
    /// `--secret-file`.
    pub secret_file: Option<PathBuf>,
    /// `--request-timeout`.
    pub request_timeout: Option<String>,
    /// `--shutdown-timeout`.
    pub shutdown_timeout: Option<String>,
    /// `--safetime-gap-max`.
    pub safetime_gap_max: Option<String>,
}

/// The effective, validated configuration.
#[derive(Clone)]
pub struct Config {
    /// Address to serve on.
    pub listen: SocketAddr,
    /// PostgreSQL URL; `None`: memory store.
    pub database_url: Option<String>,
    /// The grant policy.
    pub policy: GrantPolicy,
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

fn positive(name: &str, d: SignedDuration) -> Result<SignedDuration, ConfigError> {
    if d.is_positive() {
        Ok(d)
    } else {
        Err(err(format!("{name} must be positive, got {d}")))
    }
}

fn duration_setting(
    name: &str,
    flag: Option<String>,
    file: Option<String>,
    default: SignedDuration,
    allow_max: bool,
) -> Result<SignedDuration, ConfigError> {
    match flag.or(file) {
        None => Ok(default),
        Some(s) => parse_duration(&s, allow_max).map_err(|e| err(format!("{name}: {e}"))),
    }
}

/// Checks a PostgreSQL URL's shape.
///
/// # Errors
/// Unparseable, or a scheme other than `postgres`/`postgresql`.
pub fn check_database_url(url: &str) -> Result<(), ConfigError> {
    let parsed = url::Url::parse(url).map_err(|e| {
        err(format!(
            "database_url is not a URL ({e}): {}",
            redact_url(url)
        ))
    })?;
    match parsed.scheme() {
        "postgres" | "postgresql" => Ok(()),
        other => Err(err(format!(
            "database_url must be postgres:// or postgresql://, got {other}://"
        ))),
    }
}

/// `url` with any password replaced by `***` (for printing).
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "<unparseable>".into(),
    }
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
        Config::merge(raw, file, std::env::var("DATABASE_URL").ok())
    }

    /// [`Config::resolve`] with the file and `DATABASE_URL` given.
    ///
    /// # Errors
    /// The first invalid setting, named.
    pub fn merge(
        raw: RawConfig,
        file: FileConfig,
        env_database_url: Option<String>,
    ) -> Result<Config, ConfigError> {
        let listen_s = raw
            .listen
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_s
            .parse()
            .map_err(|e| err(format!("listen: {listen_s:?} is not ADDR:PORT ({e})")))?;
        let database_url = raw
            .database_url
            .or(env_database_url.filter(|u| !u.is_empty()))
            .or(file.database_url);
        if let Some(u) = &database_url {
            check_database_url(u)?;
        }
        let max_ttl =
            duration_setting("max_ttl", raw.max_ttl, file.max_ttl, DEFAULT_MAX_TTL, false)?;
        let reclaim_grace = duration_setting(
            "reclaim_grace",
            raw.reclaim_grace,
            file.reclaim_grace,
            DEFAULT_RECLAIM_GRACE,
            true,
        )?;
        let policy = GrantPolicy::new(max_ttl, reclaim_grace).map_err(|e| err(e.to_string()))?;
        let reclaim_interval = positive(
            "reclaim_interval",
            duration_setting(
                "reclaim_interval",
                raw.reclaim_interval,
                file.reclaim_interval,
                DEFAULT_RECLAIM_INTERVAL,
                false,
            )?,
        )?;
        let batch = raw
            .reclaim_batch
            .or(file.reclaim_batch)
            .unwrap_or(DEFAULT_RECLAIM_BATCH as i64);
        let batch = usize::try_from(batch).unwrap_or(0);
        let reclaim_batch = rules::check_limit(batch, RECLAIM_BATCH_MAX)
            .map_err(|e| err(format!("reclaim_batch: {e}")))?;
        let reclaim_worker = !raw.no_reclaim_worker && file.reclaim_worker.unwrap_or(true);
        let migrate_on_start = !raw.no_migrate && file.migrate_on_start.unwrap_or(true);
        let admin_token = raw.admin_token.or(file.admin_token);
        if let Some(t) = &admin_token
            && (t.len() < ADMIN_TOKEN_MIN_BYTES || !t.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(err(format!(
                "admin_token must be at least {ADMIN_TOKEN_MIN_BYTES} visible ASCII characters"
            )));
        }
        let clock = raw.clock.or(file.clock).unwrap_or(ClockKind::System);
        if clock == ClockKind::SafeCut && database_url.is_none() {
            return Err(err(
                "clock safe-cut reads the safe expiry cut from PostgreSQL: set database_url (--database-url); the memory store has no cut",
            ));
        }
        let safetime_gap_max = positive(
            "safetime_gap_max",
            duration_setting(
                "safetime_gap_max",
                raw.safetime_gap_max,
                file.safetime_gap_max,
                DEFAULT_SAFETIME_GAP_MAX,
                false,
            )?,
        )?;
        // The samplers' own cap (SafeTimeConfig::new).
        if safetime_gap_max > safe_time::GAP_MAX_MAX {
            return Err(err(format!(
                "safetime_gap_max must be at most {}, got {safetime_gap_max}",
                safe_time::GAP_MAX_MAX
            )));
        }
        let secret_file = raw.secret_file.or(file.secret_file);
        let request_timeout = positive(
            "request_timeout",
            duration_setting(
                "request_timeout",
                raw.request_timeout,
                file.request_timeout,
                DEFAULT_REQUEST_TIMEOUT,
                false,
            )?,
        )?;
        let shutdown_timeout = duration_setting(
            "shutdown_timeout",
            raw.shutdown_timeout,
            file.shutdown_timeout,
            DEFAULT_SHUTDOWN_TIMEOUT,
            false,
        )?;
        if shutdown_timeout.is_negative() {
            return Err(err(format!(
                "shutdown_timeout must be nonnegative, got {shutdown_timeout}"
            )));
        }
        for (name, d) in [
            ("reclaim_interval", reclaim_interval),
            ("request_timeout", request_timeout),
            ("shutdown_timeout", shutdown_timeout),
            ("safetime_gap_max", safetime_gap_max),
        ] {
            std::time::Duration::try_from(d)
                .map_err(|e| err(format!("{name}: {d} is out of range ({e})")))?;
        }
        Ok(Config {
            listen,
            database_url,
            policy,
            reclaim_interval,
            reclaim_batch,
            reclaim_worker,
            migrate_on_start,
            admin_token,
            clock,
            secret_file,
            request_timeout,
            shutdown_timeout,
            safetime_gap_max,
        })
    }

    /// Whether the PostgreSQL store is configured.
    pub fn is_postgres(&self) -> bool {
        self.database_url.is_some()
    }

    /// A positive duration as `std::time::Duration` (validated at merge).
    pub fn std(d: SignedDuration) -> std::time::Duration {
        std::time::Duration::try_from(d).unwrap_or(std::time::Duration::MAX)
    }

    /// The effective configuration as TOML, secrets redacted (what
    /// `serve --print-config` prints; usable as a `--config` file once the
    /// redacted values are filled in).
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "listen = \"{}\"", self.listen);
        match &self.database_url {
            Some(u) => {
                let _ = writeln!(s, "database_url = \"{}\"", redact_url(u));
            }
            None => {
                let _ = writeln!(s, "# database_url unset: memory store");
            }
        }
        let _ = writeln!(s, "max_ttl = \"{}\"", self.policy.max_ttl());
        let _ = writeln!(s, "reclaim_grace = \"{}\"", self.policy.reclaim_grace());
        let _ = writeln!(s, "reclaim_interval = \"{}\"", self.reclaim_interval);
        let _ = writeln!(s, "reclaim_batch = {}", self.reclaim_batch);
        let _ = writeln!(s, "reclaim_worker = {}", self.reclaim_worker);
        let _ = writeln!(s, "migrate_on_start = {}", self.migrate_on_start);
        match &self.admin_token {
            Some(_) => {
                let _ = writeln!(s, "admin_token = \"<redacted>\"");
            }
            None => {
                let _ = writeln!(
                    s,
                    "# admin_token unset: generated and printed once at start-up (memory store)"
                );
            }
        }
        let _ = writeln!(s, "clock = \"{}\"", self.clock);
        match &self.secret_file {
            Some(p) => {
                let _ = writeln!(s, "secret_file = \"{}\"", p.display());
            }
            None => {
                let _ = writeln!(
                    s,
                    "# secret_file unset: a fresh random capability key (memory store)"
                );
            }
        }
        let _ = writeln!(s, "request_timeout = \"{}\"", self.request_timeout);
        let _ = writeln!(s, "shutdown_timeout = \"{}\"", self.shutdown_timeout);
        let _ = writeln!(s, "safetime_gap_max = \"{}\"", self.safetime_gap_max);
        s
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
