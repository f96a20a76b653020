//! One classification of a [`sqlx::Error`], which every store maps from.
//!
//! [`classify`] sorts an error into a [`FailureKind`] (the database cannot
//! be reached, the transaction may be retried, a constraint refused the
//! write, the schema is missing, a privilege is missing, ...) and keeps
//! what a store needs to build its own error: the SQLSTATE and its class,
//! the server's message, the constraint's name, and a [`text`] that is
//! safe to show. The text never contains the connection URL or a
//! credential: an sqlx configuration error (whose own text may quote the
//! URL, password included) is reduced to a fixed sentence.
//!
//! [`text`]: DbFailure::text

use std::fmt;

/// SQLSTATE `serialization_failure`.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE `deadlock_detected`.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// SQLSTATE `undefined_table`.
pub const UNDEFINED_TABLE: &str = "42P01";
/// SQLSTATE `undefined_function`.
pub const UNDEFINED_FUNCTION: &str = "42883";
/// SQLSTATE `insufficient_privilege`.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
/// SQLSTATE `query_canceled` (also what `statement_timeout` raises).
pub const QUERY_CANCELED: &str = "57014";
/// SQLSTATE `lock_not_available` (what `lock_timeout` and `NOWAIT` raise).
pub const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The text of a [`FailureKind::Configuration`] failure: sqlx's own text
/// may quote the connection URL, so it is never shown.
pub const CONFIGURATION_TEXT: &str = "invalid database connection configuration";

/// What kind of failure a database error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The database cannot be reached or went away: an I/O, TLS or
    /// protocol error, a pool that timed out, was closed or lost its
    /// worker, SQLSTATE class 08 (connection exception), or 57P01..57P03
    /// (administrator shutdown, crash shutdown, cannot connect now).
    /// Nothing is known to have been written; trying later may succeed.
    Unavailable,
    /// SQLSTATE 40001 (`serialization_failure`): the transaction rolled
    /// back and may simply be run again.
    Serialization,
    /// SQLSTATE 40P01 (`deadlock_detected`): likewise.
    Deadlock,
    /// SQLSTATE class 23 (integrity constraint violation: unique, check,
    /// foreign key, not null, exclusion).
    Constraint,
    /// SQLSTATE 42P01 (`undefined_table`) or 42883 (`undefined_function`):
    /// the schema this code expects is not there (the database is not
    /// migrated far enough, or it is the wrong database).
    SchemaMissing,
    /// SQLSTATE 42501 (`insufficient_privilege`): the role lacks a grant.
    InsufficientPrivilege,
    /// SQLSTATE 57014 (`query_canceled`, including `statement_timeout`) or
    /// 55P03 (`lock_not_available`, including `lock_timeout`).
    Canceled,
    /// An sqlx configuration error: connection settings it cannot use.
    /// Its text is [`CONFIGURATION_TEXT`], never sqlx's.
    Configuration,
    /// Any other SQLSTATE, or any other sqlx error (decoding, a missing
    /// row or column, ...).
    Other,
}

/// A classified [`sqlx::Error`]: see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbFailure {
    kind: FailureKind,
    sqlstate: Option<String>,
    server_message: Option<String>,
    constraint: Option<String>,
    text: String,
}

impl DbFailure {
    /// The kind of failure.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// The five-character SQLSTATE of a database error (`"23505"`);
    /// `None` for an error that did not come from the server.
    pub fn sqlstate(&self) -> Option<&str> {
        self.sqlstate.as_deref()
    }

    /// The SQLSTATE's class, its first two characters (`"23"`).
    pub fn sqlstate_class(&self) -> Option<&str> {
        self.sqlstate.as_deref().and_then(|c| c.get(..2))
    }

    /// The server's message, as sent (`relation "x" does not exist`);
    /// `None` for an error that did not come from the server.
    pub fn server_message(&self) -> Option<&str> {
        self.server_message.as_deref()
    }

    /// The name of the violated constraint, for a constraint violation
    /// that names one.
    pub fn constraint(&self) -> Option<&str> {
        self.constraint.as_deref()
    }

    /// A text that is safe to show and log: `"<server message> (SQLSTATE
    /// <code>)"` for a database error, [`CONFIGURATION_TEXT`] for a
    /// configuration error, sqlx's own text otherwise. Never the URL or a
    /// credential.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the transaction that failed may simply be run again
    /// ([`FailureKind::Serialization`] or [`FailureKind::Deadlock`]).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            FailureKind::Serialization | FailureKind::Deadlock
        )
    }
}

impl fmt::Display for DbFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Classifies `e`: see [`FailureKind`] for the rules.
///
/// Never fails and never panics; the result's [`text`](DbFailure::text)
/// never contains the connection URL.
pub fn classify(e: &sqlx::Error) -> DbFailure {
    if let Some(db) = e.as_database_error() {
        let code = db.code().map(|c| c.into_owned());
        let message = db.message().to_owned();
        let text = match &code {
            Some(code) => format!("{message} (SQLSTATE {code})"),
            None => message.clone(),
        };
        return DbFailure {
            kind: code.as_deref().map_or(FailureKind::Other, kind_of_sqlstate),
            sqlstate: code,
            constraint: db.constraint().map(str::to_owned),
            server_message: Some(message),
            text,
        };
    }
    let (kind, text) = match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => (FailureKind::Unavailable, e.to_string()),
        sqlx::Error::Configuration(_) => (FailureKind::Configuration, CONFIGURATION_TEXT.into()),
        other => (FailureKind::Other, other.to_string()),
    };
    DbFailure {
        kind,
        sqlstate: None,
        server_message: None,
        constraint: None,
        text,
    }
}

/// The kind of a server error with SQLSTATE `code`.
pub fn kind_of_sqlstate(code: &str) -> FailureKind {
    match code {
        SERIALIZATION_FAILURE => FailureKind::Serialization,
        DEADLOCK_DETECTED => FailureKind::Deadlock,
        UNDEFINED_TABLE | UNDEFINED_FUNCTION => FailureKind::SchemaMissing,
        INSUFFICIENT_PRIVILEGE => FailureKind::InsufficientPrivilege,
        QUERY_CANCELED | LOCK_NOT_AVAILABLE => FailureKind::Canceled,
        "57P01" | "57P02" | "57P03" => FailureKind::Unavailable,
        c if c.starts_with("08") => FailureKind::Unavailable,
        c if c.starts_with("23") => FailureKind::Constraint,
        _ => FailureKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_code(code: &str, expected: FailureKind) {
        assert_eq!(kind_of_sqlstate(code), expected, "SQLSTATE {code}");
    }

    #[test]
    fn sqlstates_map_to_kinds() {
        for (code, kind) in [
            ("40001", FailureKind::Serialization),
            ("40P01", FailureKind::Deadlock),
            ("40000", FailureKind::Other),
            ("40002", FailureKind::Other),
            ("42P01", FailureKind::SchemaMissing),
            ("42883", FailureKind::SchemaMissing),
            ("42703", FailureKind::Other),
            ("42501", FailureKind::InsufficientPrivilege),
            ("57014", FailureKind::Canceled),
            ("55P03", FailureKind::Canceled),
            ("55000", FailureKind::Other),
            ("57P01", FailureKind::Unavailable),
            ("57P02", FailureKind::Unavailable),
            ("57P03", FailureKind::Unavailable),
            ("57P04", FailureKind::Other),
            ("57000", FailureKind::Other),
            ("08000", FailureKind::Unavailable),
            ("08006", FailureKind::Unavailable),
            ("08P01", FailureKind::Unavailable),
            ("23505", FailureKind::Constraint),
            ("23514", FailureKind::Constraint),
            ("23503", FailureKind::Constraint),
            ("23502", FailureKind::Constraint),
            ("23P01", FailureKind::Constraint),
            ("22003", FailureKind::Other),
            ("P0001", FailureKind::Other),
            ("TGS10", FailureKind::Other),
            ("", FailureKind::Other),
        ] {
            check_code(code, kind);
        }
    }

    fn check_plain(e: sqlx::Error, kind: FailureKind, text: &str) {
        let f = classify(&e);
        assert_eq!(f.kind(), kind, "{e:?}");
        assert_eq!(f.text(), text, "{e:?}");
        assert_eq!(f.to_string(), text);
        assert_eq!(
            (f.sqlstate(), f.sqlstate_class(), f.server_message()),
            (None, None, None)
        );
        assert_eq!(f.constraint(), None);
        assert!(!f.is_retryable());
    }

    #[test]
    fn errors_without_a_server_are_unavailable_other_or_redacted_configuration() {
        check_plain(
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "refused",
            )),
            FailureKind::Unavailable,
            "error communicating with database: refused",
        );
        check_plain(
            sqlx::Error::PoolTimedOut,
            FailureKind::Unavailable,
            "pool timed out while waiting for an open connection",
        );
        check_plain(
            sqlx::Error::PoolClosed,
            FailureKind::Unavailable,
            "attempted to acquire a connection on a closed pool",
        );
        check_plain(
            sqlx::Error::WorkerCrashed,
            FailureKind::Unavailable,
            "attempted to communicate with a crashed background worker",
        );
        check_plain(
            sqlx::Error::Protocol("unexpected message".into()),
            FailureKind::Unavailable,
            "encountered unexpected or invalid data: unexpected message",
        );
        check_plain(
            sqlx::Error::Configuration("postgres://u:s3cret@h/db is bad".into()),
            FailureKind::Configuration,
            "invalid database connection configuration",
        );
        check_plain(
            sqlx::Error::RowNotFound,
            FailureKind::Other,
            "no rows returned by a query that expected to return at least one row",
        );
    }
}
