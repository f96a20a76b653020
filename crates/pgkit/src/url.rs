//! The one parser of database URLs, which never echoes a secret.
//!
//! [`DatabaseUrl::parse`] applies three checks in this order, and its
//! [`UrlError`] says which one failed:
//!
//! 1. the text is a URL (the URL standard's parser, as sqlx uses it);
//! 2. its scheme is `postgres` or `postgresql` (any case): sqlx alone
//!    would read `mysql://h/db` as PostgreSQL settings and connect;
//! 3. sqlx can turn it into [`PgConnectOptions`] (valid port, `sslmode`,
//!    ...); the socket forms `postgres:///db?host=/run/postgresql`,
//!    `postgresql://%2Frun%2Fpostgresql/db` and libpq's hostless form with
//!    a user, `postgresql://u@/db?host=/tmp` (which the URL standard alone
//!    refuses: an empty host after a user part), are accepted as sqlx
//!    reads them.
//!
//! Neither [`UrlError`]'s text nor [`DatabaseUrl`]'s `Display` and `Debug`
//! ever contain the password: the error repeats no part of the URL but its
//! scheme, and the URL is shown with its password, in the user-info part
//! and in a `password` query parameter, replaced by `***`.

use std::fmt;
use std::str::FromStr;

use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;

/// What stands in for a password in a shown URL.
pub const REDACTED: &str = "***";

/// What [`redact`] shows for a text that is not a URL.
pub const UNPARSEABLE: &str = "<unparseable>";

/// Why a database URL was refused. The text names what is wrong and never
/// repeats the URL or any part of it but the scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// The text is not a URL: `reason` is the URL parser's fixed phrase
    /// (`"relative URL without a base"`, `"invalid IPv6 address"`, ...).
    #[error("the database URL is not a URL ({reason}; the URL is not repeated here)")]
    NotAUrl {
        /// The URL parser's reason.
        reason: String,
        /// Whether the text before its first `://` is nevertheless
        /// `postgres` or `postgresql` (any case): a PostgreSQL URL with a
        /// typo, rather than something else.
        postgres_scheme: bool,
    },
    /// A URL of another scheme.
    #[error(
        "the database URL must start with postgres:// or postgresql://, got {scheme}:// \
         (the URL is not repeated here)"
    )]
    NotPostgres {
        /// Its scheme, lower-cased as the URL parser reads it (`"mysql"`).
        scheme: String,
    },
    /// A PostgreSQL URL whose settings sqlx cannot use (a port out of
    /// range, an unknown `sslmode`, ...). sqlx's own text may quote the
    /// URL, so it is not kept.
    #[error("the database URL's connection settings are not valid (the URL is not repeated here)")]
    Settings,
}

/// A parsed PostgreSQL connection URL: sqlx's connect options and the URL
/// as it may be shown (password redacted).
///
/// ```
/// let url = pgkit::DatabaseUrl::parse("postgres://tg:hunter2@db:5432/tg").unwrap();
/// assert_eq!(url.to_string(), "postgres://tg:***@db:5432/tg");
/// assert_eq!(url.connect_options().get_database(), Some("tg"));
/// ```
#[derive(Clone)]
pub struct DatabaseUrl {
    options: PgConnectOptions,
    redacted: String,
}

impl DatabaseUrl {
    /// Parses `url`: see the module docs for the checks and their order.
    ///
    /// sqlx fills settings the URL leaves out from the `PG*` environment
    /// variables and its defaults, as `PgConnectOptions::from_str` does.
    ///
    /// # Errors
    /// [`UrlError::NotAUrl`], [`UrlError::NotPostgres`] or
    /// [`UrlError::Settings`]; none of them repeats the URL.
    pub fn parse(url: &str) -> Result<DatabaseUrl, UrlError> {
        // The URL standard strips surrounding white space and tabs inside
        // the text, and reads `postgres:/host` as a path without a host: a
        // URL in either form is a typo, not a connection string.
        if let Some(reason) = malformed_text(url) {
            return Err(UrlError::NotAUrl {
                reason: reason.to_owned(),
                postgres_scheme: has_postgres_prefix(url),
            });
        }
        // `scheme://user@/db` (libpq's "no host": the default, or the
        // `host=` parameter's socket directory) has an empty host after a
        // user part, which the URL standard refuses; sqlx reads an absent
        // host as `localhost`, so the text is parsed with that host and
        // shown as written.
        let hostless = hostless_with_user(url);
        let text = match hostless {
            Some(at) => format!("{}localhost{}", &url[..at], &url[at..]),
            None => url.to_owned(),
        };
        let parsed = url::Url::parse(&text).map_err(|e| UrlError::NotAUrl {
            reason: e.to_string(),
            postgres_scheme: has_postgres_prefix(url),
        })?;
        if !is_postgres_scheme(parsed.scheme()) {
            return Err(UrlError::NotPostgres {
                scheme: parsed.scheme().to_owned(),
            });
        }
        let options = PgConnectOptions::from_url(&parsed).map_err(|_| UrlError::Settings)?;
        let mut redacted = redact_parsed(parsed);
        if hostless.is_some() {
            redacted = without_inserted_host(&redacted);
        }
        Ok(DatabaseUrl { options, redacted })
    }

    /// sqlx's connect options (they hold the password).
    pub fn connect_options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// sqlx's connect options, consuming the URL.
    pub fn into_connect_options(self) -> PgConnectOptions {
        self.options
    }

    /// The URL as it may be shown: the password, if any, is `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// Why `url` is refused before the URL parser sees it: white space or a
/// control character anywhere, or a PostgreSQL scheme without `://`.
fn malformed_text(url: &str) -> Option<&'static str> {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme);
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Some("white space or a control character")
    } else if scheme.is_some_and(is_postgres_scheme) && !url.contains("://") {
        Some("no // after postgres:")
    } else {
        None
    }
}

/// Where a host would go in `url` when its authority has a user part but
/// no host (`postgresql://u@/db?host=/tmp`, `postgres://u:pw@:5433/db`): the
/// byte index just after the `@`. `None` for any other text, including a
/// URL without a user part (`postgres:///db`, which the URL standard
/// already reads as an empty host).
fn hostless_with_user(url: &str) -> Option<usize> {
    let (scheme, rest) = url.split_once("://")?;
    if !is_postgres_scheme(scheme) {
        return None;
    }
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let at = authority.rfind('@')?;
    let after = &authority[at + 1..];
    (after.is_empty() || after.starts_with(':')).then_some(scheme.len() + 3 + at + 1)
}

/// A shown URL parsed with `localhost` inserted by [`DatabaseUrl::parse`]
/// for an empty host, with that host taken out again: the user sees the
/// form they wrote.
fn without_inserted_host(shown: &str) -> String {
    let Some((scheme, rest)) = shown.split_once("://") else {
        return shown.to_owned();
    };
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_len);
    match authority.rsplit_once("@localhost") {
        Some((user, port)) if port.is_empty() || port.starts_with(':') => {
            format!("{scheme}://{user}@{port}{tail}")
        }
        _ => shown.to_owned(),
    }
}

impl FromStr for DatabaseUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<DatabaseUrl, UrlError> {
        DatabaseUrl::parse(s)
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl").field(&self.redacted).finish()
    }
}

/// `url` as it may be shown, whatever its scheme: the password in the
/// user-info part and in a `password` query parameter replaced by `***`;
/// [`UNPARSEABLE`] for a text that is not a URL (which could be anything,
/// a bare password included).
///
/// ```
/// assert_eq!(pgkit::redact("postgres://u:pw@h/db?password=pw"), "postgres://u:***@h/db?password=***");
/// assert_eq!(pgkit::redact("not a url"), "<unparseable>");
/// ```
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => redact_parsed(parsed),
        Err(_) => UNPARSEABLE.to_owned(),
    }
}

/// Whether a URL query parameter carries a secret: `password` and
/// `sslpassword` (libpq's key passphrase), and their misspellings and
/// case variants that a user may have meant (`passwd`, `PASSWORD`).
fn is_secret_parameter(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    matches!(key.as_str(), "password" | "passwd" | "sslpassword" | "pwd")
}

fn redact_parsed(mut url: url::Url) -> String {
    if url.password().is_some() {
        // Only a URL that cannot be a base has no user-info part, and
        // such a URL has no password either.
        let _ = url.set_password(Some(REDACTED));
    }
    if url.query_pairs().any(|(k, _)| is_secret_parameter(&k)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_parameter(&k) {
                    REDACTED.to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

fn is_postgres_scheme(scheme: &str) -> bool {
    scheme.eq_ignore_ascii_case("postgres") || scheme.eq_ignore_ascii_case("postgresql")
}

/// Whether the text before the first `://` is `postgres` or `postgresql`.
fn has_postgres_prefix(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| is_postgres_scheme(scheme))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-Pw";

    /// Parses `url` and checks what it shows and what sqlx reads.
    fn check_ok(url: &str, shown: &str, host: &str, port: u16, db: Option<&str>) {
        check_ok_at(url, shown, (host, None), port, db);
    }

    /// As [`check_ok`], with the Unix socket directory sqlx reads, if any.
    fn check_ok_at(
        url: &str,
        shown: &str,
        (host, socket): (&str, Option<&str>),
        port: u16,
        db: Option<&str>,
    ) {
        let parsed = DatabaseUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(parsed.to_string(), shown, "{url}");
        assert_eq!(parsed.redacted(), shown, "{url}");
        assert_eq!(format!("{parsed:?}"), format!("DatabaseUrl({shown:?})"));
        assert!(!shown.contains(SECRET), "{url}");
        let o = parsed.connect_options();
        assert_eq!(
            (
                o.get_host(),
                o.get_socket().and_then(|p| p.to_str()),
                o.get_port(),
                o.get_database()
            ),
            (host, socket, port, db),
            "{url}"
        );
        let from_str: DatabaseUrl = url.parse().unwrap();
        assert_eq!(from_str.redacted(), shown);
    }

    #[test]
    fn accepted_urls_table() {
        check_ok(
            "postgres://tg:s3cr3t-Pw@db:5432/tg?sslmode=disable",
            "postgres://tg:***@db:5432/tg?sslmode=disable",
            "db",
            5432,
            Some("tg"),
        );
        check_ok(
            "postgresql://tg@db.example:6543/tg",
            "postgresql://tg@db.example:6543/tg",
            "db.example",
            6543,
            Some("tg"),
        );
        check_ok(
            "POSTGRES://tg:s3cr3t-Pw@db/tg",
            "postgres://tg:***@db/tg",
            "db",
            5432,
            Some("tg"),
        );
        check_ok(
            "PostgreSQL://db/tg",
            "postgresql://db/tg",
            "db",
            5432,
            Some("tg"),
        );
        check_ok(
            "postgres://127.0.0.1:5433/tg",
            "postgres://127.0.0.1:5433/tg",
            "127.0.0.1",
            5433,
            Some("tg"),
        );
        check_ok(
            "postgres://[::1]:5433/tg",
            "postgres://[::1]:5433/tg",
            "[::1]",
            5433,
            Some("tg"),
        );
        // A password in the query is redacted too; other parameters stay.
        check_ok(
            "postgres://tg@db/tg?password=s3cr3t-Pw&application_name=x",
            "postgres://tg@db/tg?password=***&application_name=x",
            "db",
            5432,
            Some("tg"),
        );
        // Percent-encoded passwords are redacted whole.
        check_ok(
            "postgres://tg:s3cr3t%2DPw%40x@db/tg",
            "postgres://tg:***@db/tg",
            "db",
            5432,
            Some("tg"),
        );
    }

    #[test]
    fn socket_forms_table() {
        check_ok_at(
            "postgres:///tg?host=/tmp",
            "postgres:///tg?host=/tmp",
            ("localhost", Some("/tmp")),
            5432,
            Some("tg"),
        );
        check_ok_at(
            "postgres:///tg?host=/run/postgresql&port=5433&user=tg&password=s3cr3t-Pw",
            "postgres:///tg?host=%2Frun%2Fpostgresql&port=5433&user=tg&password=***",
            ("localhost", Some("/run/postgresql")),
            5433,
            Some("tg"),
        );
        // libpq's hostless form with a user: the socket directory from
        // `host=`, the user and password from the user part.
        check_ok_at(
            "postgresql://u@/db?host=/tmp",
            "postgresql://u@/db?host=/tmp",
            ("localhost", Some("/tmp")),
            5432,
            Some("db"),
        );
        check_ok_at(
            "postgres://tg:s3cr3t-Pw@:5433/tg?host=/run/postgresql",
            "postgres://tg:***@:5433/tg?host=/run/postgresql",
            ("localhost", Some("/run/postgresql")),
            5433,
            Some("tg"),
        );
        assert_eq!(
            DatabaseUrl::parse("postgresql://u@/db?host=/tmp")
                .unwrap()
                .connect_options()
                .get_username(),
            "u"
        );
        // Without `host=`: sqlx's default host, as for `postgres:///tg`.
        check_ok_at(
            "postgres://tg@/tg",
            "postgres://tg@/tg",
            ("localhost", None),
            5432,
            Some("tg"),
        );
        check_ok_at(
            "postgresql://%2Fvar%2Frun%2Fpostgresql/tg",
            "postgresql://%2Fvar%2Frun%2Fpostgresql/tg",
            ("localhost", Some("/var/run/postgresql")),
            5432,
            Some("tg"),
        );
    }

    fn check_err(url: &str, expected: UrlError, text: &str) {
        let e = DatabaseUrl::parse(url).unwrap_err();
        assert_eq!(e, expected, "{url}");
        assert_eq!(e.to_string(), text, "{url}");
        assert!(!text.contains(SECRET), "{url}");
        assert!(!format!("{e:?}").contains(SECRET), "{url}");
    }

    #[test]
    fn refused_urls_table() {
        check_err(
            "mysql://u:s3cr3t-Pw@h/db",
            UrlError::NotPostgres {
                scheme: "mysql".into(),
            },
            "the database URL must start with postgres:// or postgresql://, got mysql:// \
             (the URL is not repeated here)",
        );
        check_err(
            "postgre://u:s3cr3t-Pw@h/db",
            UrlError::NotPostgres {
                scheme: "postgre".into(),
            },
            "the database URL must start with postgres:// or postgresql://, got postgre:// \
             (the URL is not repeated here)",
        );
        // White space anywhere, or a PostgreSQL scheme without `//`, is a
        // typo the URL standard would silently repair.
        for (text, postgres_scheme) in [
            (" postgres://u:s3cr3t-Pw@h/db", false),
            ("postgres://u:s3cr3t-Pw@h/db\n", true),
            ("post\tgres://h/db", false),
        ] {
            check_err(
                text,
                UrlError::NotAUrl {
                    reason: "white space or a control character".into(),
                    postgres_scheme,
                },
                "the database URL is not a URL (white space or a control character; the URL is \
                 not repeated here)",
            );
        }
        check_err(
            "postgres:/u:s3cr3t-Pw@h/db",
            UrlError::NotAUrl {
                reason: "no // after postgres:".into(),
                postgres_scheme: false,
            },
            "the database URL is not a URL (no // after postgres:; the URL is not repeated here)",
        );
        // No `://`: a cannot-be-a-base URL of scheme `u`.
        check_err(
            "u:s3cr3t-Pw@h/db",
            UrlError::NotPostgres { scheme: "u".into() },
            "the database URL must start with postgres:// or postgresql://, got u:// \
             (the URL is not repeated here)",
        );
        check_err(
            "nope",
            UrlError::NotAUrl {
                reason: "relative URL without a base".into(),
                postgres_scheme: false,
            },
            "the database URL is not a URL (relative URL without a base; the URL is not \
             repeated here)",
        );
        check_err(
            "s3cr3t-Pw",
            UrlError::NotAUrl {
                reason: "relative URL without a base".into(),
                postgres_scheme: false,
            },
            "the database URL is not a URL (relative URL without a base; the URL is not \
             repeated here)",
        );
        check_err(
            "",
            UrlError::NotAUrl {
                reason: "relative URL without a base".into(),
                postgres_scheme: false,
            },
            "the database URL is not a URL (relative URL without a base; the URL is not \
             repeated here)",
        );
        check_err(
            "postgres://[bad",
            UrlError::NotAUrl {
                reason: "invalid IPv6 address".into(),
                postgres_scheme: true,
            },
            "the database URL is not a URL (invalid IPv6 address; the URL is not repeated \
             here)",
        );
        check_err(
            "Postgresql://u:s3cr3t-Pw@h:99999/db",
            UrlError::NotAUrl {
                reason: "invalid port number".into(),
                postgres_scheme: true,
            },
            "the database URL is not a URL (invalid port number; the URL is not repeated \
             here)",
        );
        check_err(
            "mysql://u:s3cr3t-Pw@h:99999/db",
            UrlError::NotAUrl {
                reason: "invalid port number".into(),
                postgres_scheme: false,
            },
            "the database URL is not a URL (invalid port number; the URL is not repeated \
             here)",
        );
        check_err(
            "postgres://u:s3cr3t-Pw@h/db?sslmode=s3cr3t-Pw",
            UrlError::Settings,
            "the database URL's connection settings are not valid (the URL is not repeated \
             here)",
        );
        check_err(
            "postgres://u:s3cr3t-Pw@h/db?port=s3cr3t-Pw",
            UrlError::Settings,
            "the database URL's connection settings are not valid (the URL is not repeated \
             here)",
        );
    }

    #[test]
    fn redact_table() {
        for (url, shown) in [
            (
                "postgres://tg:hunter2@db:5432/tg?sslmode=disable",
                "postgres://tg:***@db:5432/tg?sslmode=disable",
            ),
            ("postgres://db/tg", "postgres://db/tg"),
            ("mysql://u:hunter2@h/db", "mysql://u:***@h/db"),
            (
                "postgres://h/db?password=hunter2&password=hunter3",
                "postgres://h/db?password=***&password=***",
            ),
            ("postgres://u:@h/db", "postgres://u@h/db"),
            (
                "postgres://h/db?sslpassword=hunter2&PASSWORD=hunter3&passwd=hunter4&pwd=hunter5&user=u",
                "postgres://h/db?sslpassword=***&PASSWORD=***&passwd=***&pwd=***&user=u",
            ),
            ("::", UNPARSEABLE),
            ("hunter2", UNPARSEABLE),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }
}
