//! Mapping database errors to [`StorageError`].
//!
//! Every database error is classified by [`pgkit::classify`]; this module
//! only decides which [`StorageError`] each kind becomes. Connection-level
//! failures become [`StorageError::Unavailable`]; the refusals of the
//! lease-write guards (migrations 0018 and 0019) their own variants (see
//! the SQLSTATE constants below); every other database failure
//! [`StorageError::Failure`]. Messages carry the server's error
//! text and SQLSTATE but never the connection URL or credentials:
//! configuration errors (which may echo the URL) are reduced to a fixed
//! sentence.

use pgkit::error::FailureKind;
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

impl pgkit::TxBodyError for TxError {
    fn database_error(&self) -> Option<&sqlx::Error> {
        match self {
            TxError::Db(e) => Some(e),
            TxError::Rule(_) | TxError::Storage(_) => None,
        }
    }
}

/// SQLSTATE TGS10: the database is on the safe expiry cut and this session
/// is not (migration 0018's lease trigger); nothing was written, and only a
/// restart on the cut helps.
const LEASE_WRITE_OFF_CUT: &str = "TGS10";

/// SQLSTATE TGS11: the session's declared grant policy differs from the
/// recorded one, or it declares none (migration 0019's lease trigger):
/// [`StorageError::PolicyMismatch`]. Nothing was written; the process must
/// be restarted with the recorded policy.
const LEASE_POLICY_MISMATCH: &str = "TGS11";

/// SQLSTATE TGS12: an active lease's expiry plus the recorded reclaim grace
/// lies beyond the safe expiry cut plus the sealed horizon (migration
/// 0019's lease trigger): [`StorageError::HorizonExceeded`]. Nothing was
/// written.
const LEASE_BEYOND_HORIZON: &str = "TGS12";

/// Whether the transaction that failed with `e` is run again by the
/// wrapper (a serialization failure or deadlock).
pub(crate) fn is_retryable(e: &sqlx::Error) -> bool {
    pgkit::classify(e).is_retryable()
}

/// Maps a database error that is not retried.
pub(crate) fn map_sqlx_error(e: sqlx::Error) -> StorageError {
    let failure = pgkit::classify(&e);
    match failure.sqlstate() {
        Some(LEASE_POLICY_MISMATCH) => {
            return StorageError::PolicyMismatch(failure.text().to_owned());
        }
        Some(LEASE_BEYOND_HORIZON) => {
            return StorageError::HorizonExceeded {
                message: failure.text().to_owned(),
            };
        }
        _ => {}
    }
    // pgkit classifies the connection-level SQLSTATEs (class 08,
    // 57P01..57P03) and client-side connection failures as unavailable.
    let unavailable = failure.kind() == FailureKind::Unavailable
        || failure.sqlstate() == Some(LEASE_WRITE_OFF_CUT);
    let message = failure.text().to_owned();
    if unavailable {
        StorageError::Unavailable { message }
    } else {
        StorageError::Failure { message }
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
        let unavailable = |code: &'static str| {
            matches!(
                map_sqlx_error(pgkit::testkit::database_error(code, "m")),
                StorageError::Unavailable { .. }
            )
        };
        for code in ["08000", "08006", "57P01", "57P02", "57P03"] {
            assert!(unavailable(code), "{code}");
        }
        for code in ["40001", "40P01", "23514", "42703", "57014"] {
            assert!(!unavailable(code), "{code}");
        }
    }

    #[test]
    fn server_errors_carry_their_text_and_sqlstate() {
        for (code, text, expected) in [
            (
                "TGS10",
                "lease writes need the safe cut",
                StorageError::Unavailable {
                    message: "lease writes need the safe cut (SQLSTATE TGS10)".into(),
                },
            ),
            (
                "TGS11",
                "lease_policy_mismatch: restart this process",
                StorageError::PolicyMismatch(
                    "lease_policy_mismatch: restart this process (SQLSTATE TGS11)".into(),
                ),
            ),
            (
                "TGS12",
                "lease_beyond_horizon: the new lease's expiry",
                StorageError::HorizonExceeded {
                    message: "lease_beyond_horizon: the new lease's expiry (SQLSTATE TGS12)".into(),
                },
            ),
            (
                "TGS13",
                "not ours",
                StorageError::Failure {
                    message: "not ours (SQLSTATE TGS13)".into(),
                },
            ),
            (
                "57P01",
                "terminating connection due to administrator command",
                StorageError::Unavailable {
                    message: "terminating connection due to administrator command (SQLSTATE \
                              57P01)"
                        .into(),
                },
            ),
            (
                "08006",
                "connection failure",
                StorageError::Unavailable {
                    message: "connection failure (SQLSTATE 08006)".into(),
                },
            ),
            (
                "23514",
                "new row violates check constraint \"c\"",
                StorageError::Failure {
                    message: "new row violates check constraint \"c\" (SQLSTATE 23514)".into(),
                },
            ),
            (
                "40001",
                "could not serialize access due to concurrent update",
                StorageError::Failure {
                    message: "could not serialize access due to concurrent update (SQLSTATE \
                              40001)"
                        .into(),
                },
            ),
            (
                "42P01",
                "relation \"tollgate_leases\" does not exist",
                StorageError::Failure {
                    message: "relation \"tollgate_leases\" does not exist (SQLSTATE 42P01)".into(),
                },
            ),
        ] {
            let e = pgkit::testkit::database_error(code, text);
            assert_eq!(is_retryable(&e), code == "40001", "{code}");
            assert_eq!(map_sqlx_error(e), expected, "{code}");
        }
        assert_eq!(
            map_sqlx_error(sqlx::Error::RowNotFound),
            StorageError::Failure {
                message: "no rows returned by a query that expected to return at least one row"
                    .into()
            }
        );
    }
}
