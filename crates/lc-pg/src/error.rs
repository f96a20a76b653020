//! Mapping failures to [`LcError`].
//!
//! Every database error is classified by [`pgkit::classify`]; this module
//! only decides which [`LcError`] each kind becomes: connection-level
//! failures `storage_unavailable`, every other one `storage_failure`,
//! except the refusals of this line's guards and of Tollgate's, which keep
//! their meaning. Messages carry the server's text, never the URL.

use lc_core::LcError;
use pgkit::FailureKind;
use tollgate::{RuleError, StorageError};

/// What a transaction body fails with: a refusal or storage failure found
/// in Rust (returned as it is), or a database error the wrapper classifies
/// (and retries when it is a serialization failure or deadlock).
#[derive(Debug)]
pub(crate) enum Fail {
    /// Refused or failed in Rust; nothing was written.
    Lc(LcError),
    /// A database error.
    Db(sqlx::Error),
}

impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Fail {
        Fail::Db(e)
    }
}

impl From<LcError> for Fail {
    fn from(e: LcError) -> Fail {
        Fail::Lc(e)
    }
}

impl From<safetime::PairError> for Fail {
    fn from(e: safetime::PairError) -> Fail {
        Fail::Lc(corrupt(e.to_string()))
    }
}

impl pgkit::TxBodyError for Fail {
    fn database_error(&self) -> Option<&sqlx::Error> {
        match self {
            Fail::Db(e) => Some(e),
            Fail::Lc(_) => None,
        }
    }
}

impl From<tollgate_pg::ops::TxError> for Fail {
    /// Tollgate's database errors stay database errors, so the wrapper
    /// retries the whole transaction on a serialization failure or
    /// deadlock; its refusals become Little Compute's.
    fn from(e: tollgate_pg::ops::TxError) -> Fail {
        match e {
            tollgate_pg::ops::TxError::Db(e) => Fail::Db(e),
            tollgate_pg::ops::TxError::Rule(r) => Fail::Lc(from_rule(r)),
            tollgate_pg::ops::TxError::Storage(s) => Fail::Lc(from_storage(s)),
        }
    }
}

/// SQLSTATE LCS01: a deadline beyond cut + horizon (this line's guard).
const DEADLINE_BEYOND_HORIZON: &str = "LCS01";
/// SQLSTATE TGS10: a lease write off the cut (Tollgate's 0018 guard).
const LEASE_WRITE_OFF_CUT: &str = "TGS10";

/// Stored data that does not decode.
pub(crate) fn corrupt(message: impl Into<String>) -> LcError {
    LcError::StorageFailure {
        message: format!("corrupt stored data: {}", message.into()),
    }
}

/// The error a database failure that is not retried becomes.
pub(crate) fn map_db(e: &sqlx::Error) -> LcError {
    let failure = pgkit::classify(e);
    let message = failure.text().to_owned();
    if failure.kind() == FailureKind::Unavailable || failure.sqlstate() == Some(LEASE_WRITE_OFF_CUT)
    {
        return LcError::StorageUnavailable { message };
    }
    // DEADLINE_BEYOND_HORIZON: the rules check every deadline against the
    // horizon before writing, so the guard firing means a horizon sealed
    // between the check and the write; the message names the deadline.
    let _ = DEADLINE_BEYOND_HORIZON;
    // LCS03 (a receipt rewritten), LCS04 (an ownership moved backward),
    // LCS05 (a page changed or un-acknowledged), LCS06 (an input out of
    // order or changed), LCS07 (a snapshot rewritten), LCS08 (a resume
    // receipt rewritten), LCS09 (an attempt made runnable without its
    // resume receipt), LCS70 (a token changed other than by its first
    // revocation) and LCSM1 (a measured value dropped): the store's rules refuse
    // all of these before writing, so the guard firing is a store fault,
    // and it stays `storage_failure` with the guard's message.
    LcError::StorageFailure { message }
}

/// The error a transaction's failure becomes.
pub(crate) fn from_failure(f: pgkit::TxFailure<Fail>) -> LcError {
    let fail = match f {
        pgkit::TxFailure::Failed(e) => e,
        pgkit::TxFailure::RetryExhausted { last, .. } => last,
    };
    match fail {
        Fail::Lc(e) => e,
        Fail::Db(e) => map_db(&e),
    }
}

/// A Tollgate rule refusal in Little Compute's terms.
pub(crate) fn from_rule(r: RuleError) -> LcError {
    match r {
        RuleError::InsufficientBalance {
            requested,
            available,
            ..
        } => LcError::InsufficientCapacity {
            requested,
            available,
        },
        RuleError::InvalidUnits { units, .. } => LcError::InvalidUnits { units },
        RuleError::AccountNotFound { account_id } => LcError::not_found("tenant", account_id.0),
        RuleError::InvalidAccountName { .. } => LcError::InvalidName {
            reason: r.to_string(),
        },
        other => LcError::StorageFailure {
            message: format!("tollgate refused: {} ({})", other, other.code()),
        },
    }
}

/// A Tollgate storage failure in Little Compute's terms.
pub(crate) fn from_storage(s: StorageError) -> LcError {
    match s {
        StorageError::Unavailable { message } => LcError::StorageUnavailable { message },
        other => LcError::StorageFailure {
            message: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insufficient_balance_is_insufficient_capacity() {
        let e = from_rule(RuleError::InsufficientBalance {
            account_id: tollgate::AccountId(3),
            requested: 2,
            available: 1,
        });
        assert_eq!(
            e,
            LcError::InsufficientCapacity {
                requested: 2,
                available: 1
            }
        );
        assert_eq!(
            map_db(&sqlx::Error::PoolTimedOut).code(),
            "storage_unavailable"
        );
        assert_eq!(map_db(&sqlx::Error::RowNotFound).code(), "storage_failure");
    }
}
