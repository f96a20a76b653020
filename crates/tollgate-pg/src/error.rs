//! Mapping database errors to [`StorageError`].
//!
//! Connection-level failures become [`StorageError::Unavailable`], every
//! other database failure [`StorageError::Failure`]. Messages carry the
//! server's error text and SQLSTATE but never the connection URL or
//! credentials: configuration errors (which may echo the URL) are reduced
//! to a fixed sentence.

use sqlx::error::DatabaseError;
use tollgate::{RuleError, StorageError};

/// What a transaction body fails with: a refusal by the rules or a storage
/// failure found in Rust, both returned as they are, or a database error
/// that the wrapper classifies (retry, unavailable, failure). After any of
/// them the transaction must roll back.
#[derive(Debug)]
pub enum TxError {
    /// The rules refused the operation; nothing was written.
    Rule(RuleError),
    /// A storage failure found in Rust (stored data that does not decode, a
    /// write that changed an unexpected number of rows).
    Storage(StorageError),
    /// A database error.
    Db(sqlx::Error),
}

impl From<RuleError> for TxError {
    fn from(e: RuleError) -> TxError {
        TxError::Rule(e)
    }
}

impl From<StorageError> for TxError {
    fn from(e: StorageError) -> TxError {
        TxError::Storage(e)
    }
}

impl From<sqlx::Error> for TxError {
    fn from(e: sqlx::Error) -> TxError {
        TxError::Db(e)
    }
}

impl From<tollgate::PairError> for TxError {
    fn from(e: tollgate::PairError) -> TxError {
        TxError::Storage(StorageError::InvalidStoredInstant(e))
    }
}

/// SQLSTATE `serialization_failure`.
pub(crate) const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE `deadlock_detected`.
pub(crate) const DEADLOCK_DETECTED: &str = "40P01";

fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(DatabaseError::code)
        .map(|c| c.into_owned())
}

/// Whether the transaction that failed with `e` may simply be run again.
pub(crate) fn is_retryable(e: &sqlx::Error) -> bool {
    matches!(
        sqlstate(e).as_deref(),
        Some(SERIALIZATION_FAILURE | DEADLOCK_DETECTED)
    )
}

/// Whether `code` means the connection or the server went away (class 08
/// connection exception; 57P01..57P03 shutdown and cannot-connect-now).
fn is_connection_state(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
}

/// Maps a database error that is not retried.
pub(crate) fn map_sqlx_error(e: sqlx::Error) -> StorageError {
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => StorageError::Unavailable {
            message: e.to_string(),
        },
        sqlx::Error::Configuration(_) => StorageError::Failure {
            message: "invalid database connection configuration".into(),
        },
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            let message = format!("{} (SQLSTATE {code})", db.message());
            // TGS10: the database is on the safe expiry cut and this
            // session is not (migration 0018's lease trigger); nothing
            // was written, and only a restart on the cut helps.
            if is_connection_state(&code) || code == "TGS10" {
                StorageError::Unavailable { message }
            } else {
                StorageError::Failure { message }
            }
        }
        _ => StorageError::Failure {
            message: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_unavailable_and_configuration_is_redacted() {
        let io = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(map_sqlx_error(io).code(), "storage_unavailable");
        assert_eq!(
            map_sqlx_error(sqlx::Error::PoolTimedOut).code(),
            "storage_unavailable"
        );
        assert_eq!(
            map_sqlx_error(sqlx::Error::PoolClosed).code(),
            "storage_unavailable"
        );
        let config = sqlx::Error::Configuration("postgres://u:s3cret@h/db is bad".into());
        assert_eq!(
            map_sqlx_error(config),
            StorageError::Failure {
                message: "invalid database connection configuration".into()
            }
        );
        assert!(!is_retryable(&sqlx::Error::PoolTimedOut));
    }

    #[test]
    fn connection_state_codes() {
        for code in ["08000", "08006", "57P01", "57P02", "57P03"] {
            assert!(is_connection_state(code), "{code}");
        }
        for code in ["40001", "40P01", "23514", "42703", "57014"] {
            assert!(!is_connection_state(code), "{code}");
        }
    }
}
