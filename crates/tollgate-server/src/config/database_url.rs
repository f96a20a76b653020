//! The one parser of database URLs in this crate ([`parse`]): the
//! configuration checks a URL's shape with it and prints it redacted, and
//! the operator commands' pool takes its connection options from it.
//!
//! A database URL may carry a password, so no error here repeats the URL.

use sqlx::ConnectOptions as _;
use sqlx::postgres::PgConnectOptions;

/// What a URL that does not parse is printed as.
pub const UNPARSEABLE: &str = "<unparseable>";

/// A parsed PostgreSQL URL: scheme `postgres` or `postgresql`.
#[derive(Clone)]
pub struct DatabaseUrl(url::Url);

/// Why a string is not a PostgreSQL URL. The messages never repeat it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatabaseUrlError {
    /// Not a URL at all.
    #[error("is not a URL ({0})")]
    NotAUrl(url::ParseError),
    /// A URL of another scheme, named.
    #[error("must be postgres:// or postgresql://, got {0}://")]
    Scheme(String),
}

/// Parses `url` as a PostgreSQL URL.
///
/// # Errors
/// [`DatabaseUrlError::NotAUrl`] for a string that is not a URL,
/// [`DatabaseUrlError::Scheme`] for a URL of another scheme.
pub fn parse(url: &str) -> Result<DatabaseUrl, DatabaseUrlError> {
    let parsed = url::Url::parse(url).map_err(DatabaseUrlError::NotAUrl)?;
    match parsed.scheme() {
        "postgres" | "postgresql" => Ok(DatabaseUrl(parsed)),
        other => Err(DatabaseUrlError::Scheme(other.to_string())),
    }
}

impl DatabaseUrl {
    /// The URL with any password replaced by `***`, for printing.
    pub fn redacted(&self) -> String {
        let mut u = self.0.clone();
        if u.password().is_some() {
            // A URL with a password has a host (the parser refuses
            // `postgres://u:pw@/db` as EmptyHost), so it takes another.
            let replaced = u.set_password(Some("***"));
            assert!(replaced.is_ok(), "a URL with a password takes another");
        }
        u.to_string()
    }

    /// The connection options sqlx reads from this URL.
    ///
    /// # Errors
    /// sqlx's error for a parameter it refuses (an unknown `sslmode`, say),
    /// which may quote the value: callers report it without the details.
    pub fn connect_options(&self) -> Result<PgConnectOptions, sqlx::Error> {
        PgConnectOptions::from_url(&self.0)
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DatabaseUrl")
            .field(&self.redacted())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, expected: Result<&str, &str>) {
        let got = parse(url).map(|u| u.redacted()).map_err(|e| e.to_string());
        assert_eq!(
            got,
            expected.map(str::to_string).map_err(str::to_string),
            "{url}"
        );
    }

    #[test]
    fn parse_and_redact() {
        check("postgres://h/db", Ok("postgres://h/db"));
        check(
            "postgresql://u:pw@h:5432/db?sslmode=disable",
            Ok("postgresql://u:***@h:5432/db?sslmode=disable"),
        );
        check("postgres://u@h/db", Ok("postgres://u@h/db"));
        check(
            "mysql://u:pw@h/db",
            Err("must be postgres:// or postgresql://, got mysql://"),
        );
        check(
            "not a url",
            Err("is not a URL (relative URL without a base)"),
        );
        check(
            "postgres://u:pw@h:99999/db",
            Err("is not a URL (invalid port number)"),
        );
        let u = parse("postgres://u:pw@h/db").expect("url");
        assert_eq!(format!("{u:?}"), "DatabaseUrl(\"postgres://u:***@h/db\")");
    }

    #[test]
    fn connect_options_refuse_what_sqlx_refuses() {
        let ok = parse("postgres://u:pw@h:5433/db").expect("url");
        let options = ok.connect_options().expect("options");
        assert_eq!(options.get_port(), 5433);
        let bad = parse("postgres://h/db?sslmode=bogus").expect("a URL");
        assert!(bad.connect_options().is_err());
    }
}
