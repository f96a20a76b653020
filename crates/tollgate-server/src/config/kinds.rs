//! The kinds of setting: for each shape of value, how the flag's (or
//! environment variable's) value and the TOML file's value become the
//! checked value, which default stands in when neither is given, how help
//! shows that default, and how the value is written back as a TOML line.
//!
//! A kind checks one setting alone; rules between settings (the grant
//! policy over `max_ttl` and `reclaim_grace`, the safe-cut clock's need for
//! a database) are [`super::Config::merge`]'s.

use std::net::SocketAddr;
use std::path::PathBuf;

use jiff::SignedDuration;

use super::{ConfigError, check_database_url, err, parse_duration, redact_url};
use clock::ClockKind;

/// One kind of setting; see the module docs.
pub trait Kind {
    /// The value clap gives: the flag's, else its environment variable's.
    type Flag;
    /// The value in the TOML file.
    type File;
    /// The checked value.
    type Value;

    /// The flag's value, else the file's, else the default, checked.
    /// `key` (the TOML key) names the setting in messages.
    ///
    /// # Errors
    /// A value that does not parse or breaks the kind's bound, named.
    fn resolve(
        &self,
        key: &str,
        flag: Self::Flag,
        file: Option<Self::File>,
    ) -> Result<Self::Value, ConfigError>;

    /// The TOML line of `value` (without newline): `key = value`, or for an
    /// unset optional setting a `# key unset: ...` comment.
    fn render(&self, key: &str, value: &Self::Value) -> String;

    /// The default as help shows it (`PT1H`); `None`: no default.
    fn default_shown(&self) -> Option<String> {
        None
    }

    /// The help text: `template` with `{default}` replaced by `[default:
    /// X]` ([`Kind::default_shown`]).
    ///
    /// # Panics
    /// See [`with_default`].
    fn help(&self, template: &str) -> String {
        with_default(template, self.default_shown())
    }
}

/// `template` with `{default}` replaced by `[default: X]`.
///
/// # Panics
/// When `template` names `{default}` and there is none: a mistake in a
/// setting's declaration, which fails every run of the binary (clap builds
/// every help text at start-up) and so every test that runs it.
pub fn with_default(template: &str, default: Option<String>) -> String {
    if !template.contains("{default}") {
        return template.to_string();
    }
    let default = default
        .unwrap_or_else(|| panic!("the help {template:?} shows a default its setting lacks"));
    template.replace("{default}", &format!("[default: {default}]"))
}

/// What a duration setting must be, besides a duration.
#[derive(Debug, Clone, Copy)]
pub enum Bound {
    /// Checked together with another setting ([`tollgate::GrantPolicy::new`]
    /// for `max_ttl` and `reclaim_grace`).
    Policy,
    /// Greater than zero.
    Positive,
    /// Zero or more.
    NonNegative,
    /// Greater than zero and at most this.
    PositiveAtMost(SignedDuration),
}

/// A duration: ISO 8601 or jiff's friendly format, and with `keyword_max`
/// also `max` ([`SignedDuration::MAX`]). Every [`Bound`] but
/// [`Bound::Policy`] leaves a value that converts to
/// `std::time::Duration`.
#[derive(Debug, Clone, Copy)]
pub struct Duration {
    default: SignedDuration,
    keyword_max: bool,
    bound: Bound,
}

impl Duration {
    /// A half of the grant policy (no `max`).
    pub const fn policy(default: SignedDuration) -> Duration {
        Duration {
            default,
            keyword_max: false,
            bound: Bound::Policy,
        }
    }

    /// A half of the grant policy that also takes `max`.
    pub const fn policy_or_max(default: SignedDuration) -> Duration {
        Duration {
            keyword_max: true,
            ..Duration::policy(default)
        }
    }

    /// A positive duration.
    pub const fn positive(default: SignedDuration) -> Duration {
        Duration {
            default,
            keyword_max: false,
            bound: Bound::Positive,
        }
    }

    /// A positive duration of at most `max`.
    pub const fn positive_at_most(default: SignedDuration, max: SignedDuration) -> Duration {
        Duration {
            bound: Bound::PositiveAtMost(max),
            ..Duration::positive(default)
        }
    }

    /// A nonnegative duration.
    pub const fn nonnegative(default: SignedDuration) -> Duration {
        Duration {
            bound: Bound::NonNegative,
            ..Duration::positive(default)
        }
    }
}

impl Kind for Duration {
    type Flag = Option<String>;
    type File = String;
    type Value = SignedDuration;

    fn resolve(
        &self,
        key: &str,
        flag: Option<String>,
        file: Option<String>,
    ) -> Result<SignedDuration, ConfigError> {
        let d = match flag.or(file) {
            None => self.default,
            Some(s) => {
                parse_duration(&s, self.keyword_max).map_err(|e| err(format!("{key}: {e}")))?
            }
        };
        let positive = || {
            if d.is_positive() {
                Ok(d)
            } else {
                Err(err(format!("{key} must be positive, got {d}")))
            }
        };
        match self.bound {
            Bound::Policy => Ok(d),
            Bound::Positive => positive(),
            Bound::NonNegative if d.is_negative() => {
                Err(err(format!("{key} must be nonnegative, got {d}")))
            }
            Bound::NonNegative => Ok(d),
            Bound::PositiveAtMost(max) => {
                positive()?;
                if d > max {
                    return Err(err(format!("{key} must be at most {max}, got {d}")));
                }
                Ok(d)
            }
        }
    }

    fn render(&self, key: &str, value: &SignedDuration) -> String {
        format!("{key} = \"{value}\"")
    }

    fn default_shown(&self) -> Option<String> {
        Some(self.default.to_string())
    }
}

/// A socket address, `ADDR:PORT`.
#[derive(Debug, Clone, Copy)]
pub struct Address {
    default: &'static str,
}

impl Address {
    /// An address defaulting to `default` (which must parse).
    pub const fn with_default(default: &'static str) -> Address {
        Address { default }
    }
}

impl Kind for Address {
    type Flag = Option<String>;
    type File = String;
    type Value = SocketAddr;

    fn resolve(
        &self,
        key: &str,
        flag: Option<String>,
        file: Option<String>,
    ) -> Result<SocketAddr, ConfigError> {
        let s = flag.or(file).unwrap_or_else(|| self.default.to_string());
        s.parse()
            .map_err(|e| err(format!("{key}: {s:?} is not ADDR:PORT ({e})")))
    }

    fn render(&self, key: &str, value: &SocketAddr) -> String {
        format!("{key} = \"{value}\"")
    }

    fn default_shown(&self) -> Option<String> {
        Some(self.default.to_string())
    }
}

/// The PostgreSQL URL ([`check_database_url`]); unset: the memory store.
/// Rendered with its password redacted.
#[derive(Debug, Clone, Copy)]
pub struct PostgresUrl;

impl PostgresUrl {
    /// The database URL setting.
    pub const fn new() -> PostgresUrl {
        PostgresUrl
    }
}

impl Kind for PostgresUrl {
    type Flag = Option<String>;
    type File = String;
    type Value = Option<String>;

    fn resolve(
        &self,
        _key: &str,
        flag: Option<String>,
        file: Option<String>,
    ) -> Result<Option<String>, ConfigError> {
        let url = flag.or(file);
        if let Some(u) = &url {
            check_database_url(u)?;
        }
        Ok(url)
    }

    fn render(&self, key: &str, value: &Option<String>) -> String {
        match value {
            Some(u) => format!("{key} = \"{}\"", redact_url(u)),
            None => format!("# {key} unset: memory store"),
        }
    }
}

/// A secret token of at least `min_bytes` visible ASCII characters;
/// rendered as `<redacted>`.
#[derive(Debug, Clone, Copy)]
pub struct Token {
    min_bytes: usize,
    unset: &'static str,
}

impl Token {
    /// A token of at least `min_bytes`; `unset` says what happens without
    /// one.
    pub const fn at_least(min_bytes: usize, unset: &'static str) -> Token {
        Token { min_bytes, unset }
    }
}

impl Kind for Token {
    type Flag = Option<String>;
    type File = String;
    type Value = Option<String>;

    fn resolve(
        &self,
        key: &str,
        flag: Option<String>,
        file: Option<String>,
    ) -> Result<Option<String>, ConfigError> {
        let token = flag.or(file);
        if let Some(t) = &token
            && (t.len() < self.min_bytes || !t.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(err(format!(
                "{key} must be at least {} visible ASCII characters",
                self.min_bytes
            )));
        }
        Ok(token)
    }

    fn render(&self, key: &str, value: &Option<String>) -> String {
        match value {
            Some(_) => format!("{key} = \"<redacted>\""),
            None => format!("# {key} unset: {}", self.unset),
        }
    }
}

/// A file path, read when it is used.
#[derive(Debug, Clone, Copy)]
pub struct FilePath {
    unset: &'static str,
}

impl FilePath {
    /// A path; `unset` says what happens without one.
    pub const fn optional(unset: &'static str) -> FilePath {
        FilePath { unset }
    }
}

impl Kind for FilePath {
    type Flag = Option<PathBuf>;
    type File = PathBuf;
    type Value = Option<PathBuf>;

    fn resolve(
        &self,
        _key: &str,
        flag: Option<PathBuf>,
        file: Option<PathBuf>,
    ) -> Result<Option<PathBuf>, ConfigError> {
        Ok(flag.or(file))
    }

    fn render(&self, key: &str, value: &Option<PathBuf>) -> String {
        match value {
            Some(p) => format!("{key} = \"{}\"", p.display()),
            None => format!("# {key} unset: {}", self.unset),
        }
    }
}

/// The time source.
#[derive(Debug, Clone, Copy)]
pub struct TimeSource {
    default: ClockKind,
}

impl TimeSource {
    /// A clock setting defaulting to `default`.
    pub const fn with_default(default: ClockKind) -> TimeSource {
        TimeSource { default }
    }
}

impl Kind for TimeSource {
    type Flag = Option<ClockKind>;
    type File = ClockKind;
    type Value = ClockKind;

    fn resolve(
        &self,
        _key: &str,
        flag: Option<ClockKind>,
        file: Option<ClockKind>,
    ) -> Result<ClockKind, ConfigError> {
        Ok(flag.or(file).unwrap_or(self.default))
    }

    fn render(&self, key: &str, value: &ClockKind) -> String {
        format!("{key} = \"{value}\"")
    }

    fn default_shown(&self) -> Option<String> {
        Some(self.default.to_string())
    }
}

/// A count in `1..=max`. Help may show the range as `{range}`.
#[derive(Debug, Clone, Copy)]
pub struct Count {
    default: usize,
    max: usize,
}

impl Count {
    /// A count in `1..=max` defaulting to `default`.
    pub const fn up_to(default: usize, max: usize) -> Count {
        Count { default, max }
    }
}

impl Kind for Count {
    type Flag = Option<i64>;
    type File = i64;
    type Value = usize;

    fn resolve(
        &self,
        key: &str,
        flag: Option<i64>,
        file: Option<i64>,
    ) -> Result<usize, ConfigError> {
        let n = match flag.or(file) {
            None => self.default,
            // A negative count is refused as 0 is: `got 0`.
            Some(n) => usize::try_from(n).unwrap_or(0),
        };
        tollgate::rules::check_limit(n, self.max).map_err(|e| err(format!("{key}: {e}")))
    }

    fn render(&self, key: &str, value: &usize) -> String {
        format!("{key} = {value}")
    }

    fn default_shown(&self) -> Option<String> {
        Some(self.default.to_string())
    }

    fn help(&self, template: &str) -> String {
        let template = template.replace("{range}", &format!("1..={}", self.max));
        with_default(&template, self.default_shown())
    }
}

/// Something on by default: the flag (`--no-...`) turns it off, the file
/// key (the positive name) sets it either way.
#[derive(Debug, Clone, Copy)]
pub struct Switch;

impl Switch {
    /// On unless turned off.
    pub const fn on() -> Switch {
        Switch
    }
}

impl Kind for Switch {
    type Flag = bool;
    type File = bool;
    type Value = bool;

    fn resolve(&self, _key: &str, off: bool, file: Option<bool>) -> Result<bool, ConfigError> {
        Ok(!off && file.unwrap_or(true))
    }

    fn render(&self, key: &str, value: &bool) -> String {
        format!("{key} = {value}")
    }
}
