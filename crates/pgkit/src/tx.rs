//! The one transaction wrapper, with bounded retry and per-operation
//! metrics.
//!
//! [`transact`] runs a body in one transaction on a pooled connection. A
//! serialization failure (40001) or deadlock (40P01) from the body, or from
//! the commit, rolls the attempt back and runs the body again from scratch,
//! after a back-off, up to [`TX_ATTEMPTS_MAX`] attempts in all; any other
//! failure rolls back and is returned at once. Every operation counts its
//! attempts, commits, retries, failures and latency in the [`OpCounters`]
//! the caller passes, which carry the operation's label.
//!
//! The body's error type `E` is the store's own ([`TxBodyError`]): a rule
//! error of the store, or a database error the wrapper inspects for retry.
//! [`TxError`] is a ready-made one for stores that need nothing more.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use crate::error::classify;

/// How many times one operation's transaction is attempted before it fails
/// with [`TxFailure::RetryExhausted`]. With READ COMMITTED and a fixed lock
/// order a serialization failure or deadlock needs an unusual interleaving,
/// so a handful of attempts rides out a burst; eight attempts with the
/// back-off of [`backoff_ms`] wait at most about a quarter of a second in
/// total (2 + 4 + 8 + 16 + 32 + 64 + 64 = 190 ms), which bounds a request's
/// added latency.
pub const TX_ATTEMPTS_MAX: u32 = 8;

/// The longest back-off between two attempts, in milliseconds: long enough
/// for the winning transaction to commit, short against request timeouts.
pub const TX_BACKOFF_MAX_MS: u64 = 64;

/// The back-off before attempt `failed + 1` after `failed` failed ones:
/// `2^failed` ms, capped at [`TX_BACKOFF_MAX_MS`] (2, 4, 8, 16, 32, 64, 64,
/// ... ms for `failed` = 1, 2, 3, ...).
pub fn backoff_ms(failed: u32) -> u64 {
    (1u64 << failed.min(6)).min(TX_BACKOFF_MAX_MS)
}

/// A label type for operations: a store's own enum of operations, or a
/// plain `&'static str`.
pub trait OpLabel: Copy {
    /// The operation's stable lower-case name, for metrics labels and logs
    /// (`"acquire"`).
    fn as_str(&self) -> &'static str;
}

impl OpLabel for &'static str {
    fn as_str(&self) -> &'static str {
        self
    }
}

/// The transaction counters of one operation since they were created, all
/// relaxed atomics (each counter is exact; a [`snapshot`](Self::snapshot)
/// taken while operations run may mix counts from slightly different
/// moments).
#[derive(Debug)]
pub struct OpCounters {
    label: &'static str,
    attempts: AtomicU64,
    committed: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
    latency_ns_total: AtomicU64,
    latency_ns_max: AtomicU64,
}

impl OpCounters {
    /// Zeroed counters labelled `label`; usable in a `static`.
    pub const fn new(label: &'static str) -> OpCounters {
        OpCounters {
            label,
            attempts: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latency_ns_total: AtomicU64::new(0),
            latency_ns_max: AtomicU64::new(0),
        }
    }

    /// Zeroed counters labelled with `op`'s name.
    pub fn of(op: impl OpLabel) -> OpCounters {
        OpCounters::new(op.as_str())
    }

    /// The operation's label.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// The counters now.
    pub fn snapshot(&self) -> OpMetrics {
        OpMetrics {
            attempts: self.attempts.load(Ordering::Relaxed),
            committed: self.committed.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            latency_ns_total: self.latency_ns_total.load(Ordering::Relaxed),
            latency_ns_max: self.latency_ns_max.load(Ordering::Relaxed),
        }
    }

    fn finish(&self, outcome: &AtomicU64, started: Instant) {
        outcome.fetch_add(1, Ordering::Relaxed);
        // Saturating: 2^64 ns is 584 years.
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.latency_ns_total.fetch_add(ns, Ordering::Relaxed);
        self.latency_ns_max.fetch_max(ns, Ordering::Relaxed);
    }
}

/// A snapshot of an operation's [`OpCounters`].
///
/// Every operation ends exactly once, as committed or failed, so
/// `committed + failed` operations have ended and their latencies are
/// summed in `latency_ns_total`; `attempts = committed + failed + retried`
/// once no operation is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpMetrics {
    /// Transactions started (first attempts and retries).
    pub attempts: u64,
    /// Operations whose transaction committed.
    pub committed: u64,
    /// Attempts that failed with a serialization failure or deadlock and
    /// were run again.
    pub retried: u64,
    /// Operations that ended in an error: a rule error of the body (after
    /// which nothing was written), a database error, or retries exhausted.
    pub failed: u64,
    /// The summed latency of the ended operations, in nanoseconds, from
    /// the first attempt's start to the result (back-offs included).
    pub latency_ns_total: u64,
    /// The longest latency of one ended operation, in nanoseconds.
    pub latency_ns_max: u64,
}

/// What a transaction body can fail with, as the wrapper sees it: a
/// database error (which it may retry) or anything else (which it returns
/// as is). `From<sqlx::Error>` wraps the errors of `BEGIN` and `COMMIT`.
pub trait TxBodyError: From<sqlx::Error> {
    /// The database error this is, if it is one.
    fn database_error(&self) -> Option<&sqlx::Error>;
}

/// A ready-made body error: a store's rule error `E`, or a database error.
#[derive(Debug)]
pub enum TxError<E> {
    /// A rule or invariant of the store refused the operation.
    Rule(E),
    /// A statement, `BEGIN` or `COMMIT` failed.
    Db(sqlx::Error),
}

impl<E> From<sqlx::Error> for TxError<E> {
    fn from(e: sqlx::Error) -> TxError<E> {
        TxError::Db(e)
    }
}

impl<E> TxBodyError for TxError<E> {
    fn database_error(&self) -> Option<&sqlx::Error> {
        match self {
            TxError::Db(e) => Some(e),
            TxError::Rule(_) => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for TxError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxError::Rule(e) => e.fmt(f),
            TxError::Db(e) => classify(e).fmt(f),
        }
    }
}

/// How an operation run by [`transact`] failed.
#[derive(Debug)]
pub enum TxFailure<E> {
    /// The body, `BEGIN` or `COMMIT` failed with an error that is not
    /// retried; the transaction rolled back.
    Failed(E),
    /// All `attempts` ([`TX_ATTEMPTS_MAX`]) attempts failed with a
    /// serialization failure or deadlock; `last` is the last one's error.
    RetryExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// The last attempt's error.
        last: E,
    },
}

/// The future a transaction body returns: it borrows the transaction's
/// connection and the arguments for `'c`.
pub type TxFuture<'c, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>;

/// Runs `body` in one transaction on a connection of `pool`, retrying
/// serialization failures and deadlocks up to [`TX_ATTEMPTS_MAX`] attempts
/// in all, and counts the operation in `counters`.
///
/// `body` gets the transaction's connection and `args`; it must keep no
/// state across attempts (each attempt starts from scratch, on a possibly
/// different connection). The transaction runs at the pool's default
/// isolation (READ COMMITTED unless the server is configured otherwise).
///
/// # Errors
/// [`TxFailure::Failed`] with the body's error, or the error of `BEGIN`
/// (including an exhausted pool) or `COMMIT`, converted with
/// `E::from(sqlx::Error)`; [`TxFailure::RetryExhausted`] after
/// [`TX_ATTEMPTS_MAX`] retryable failures. Either way the transaction has
/// rolled back and nothing of it was written.
pub async fn transact<A, T, E, F>(
    pool: &PgPool,
    counters: &OpCounters,
    args: &A,
    body: F,
) -> Result<T, TxFailure<E>>
where
    A: Sync + ?Sized,
    E: TxBodyError,
    F: for<'c> Fn(&'c mut PgConnection, &'c A) -> TxFuture<'c, T, E>,
{
    let started = Instant::now();
    let mut attempts: u32 = 0;
    loop {
        attempts += 1;
        counters.attempts.fetch_add(1, Ordering::Relaxed);
        let err = match attempt(pool, args, &body).await {
            Ok(v) => {
                counters.finish(&counters.committed, started);
                return Ok(v);
            }
            Err(e) => e,
        };
        let retryable = err
            .database_error()
            .map(classify)
            .filter(|f| f.is_retryable());
        let failure = match retryable {
            Some(f) if attempts < TX_ATTEMPTS_MAX => {
                counters.retried.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    op = counters.label,
                    attempt = attempts,
                    sqlstate = f.sqlstate(),
                    "transaction failed with a serialization failure or deadlock; retrying"
                );
                tokio::time::sleep(Duration::from_millis(backoff_ms(attempts))).await;
                continue;
            }
            Some(_) => {
                tracing::debug!(
                    op = counters.label,
                    attempts,
                    "transaction retries exhausted"
                );
                TxFailure::RetryExhausted {
                    attempts,
                    last: err,
                }
            }
            None => TxFailure::Failed(err),
        };
        counters.finish(&counters.failed, started);
        return Err(failure);
    }
}

async fn attempt<A, T, E, F>(pool: &PgPool, args: &A, body: &F) -> Result<T, E>
where
    A: Sync + ?Sized,
    E: TxBodyError,
    F: for<'c> Fn(&'c mut PgConnection, &'c A) -> TxFuture<'c, T, E>,
{
    let mut tx = pool.begin().await?;
    match body(&mut tx, args).await {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            // An explicit rollback returns the connection clean; if it fails
            // the connection is closed by sqlx and the server rolls back.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_2_ms_and_caps_at_64_ms() {
        let table: Vec<u64> = (1..=10).map(backoff_ms).collect();
        assert_eq!(table, [2, 4, 8, 16, 32, 64, 64, 64, 64, 64]);
        assert_eq!(backoff_ms(0), 1);
        assert_eq!(backoff_ms(u32::MAX), 64);
        // The whole retry budget: the back-offs between 8 attempts.
        let total: u64 = (1..TX_ATTEMPTS_MAX).map(backoff_ms).sum();
        assert_eq!(total, 190);
    }

    #[test]
    fn counters_start_at_zero_and_carry_their_label() {
        static C: OpCounters = OpCounters::new("publish");
        assert_eq!(C.label(), "publish");
        assert_eq!(C.snapshot(), OpMetrics::default());
        #[derive(Clone, Copy)]
        struct Op;
        impl OpLabel for Op {
            fn as_str(&self) -> &'static str {
                "op"
            }
        }
        assert_eq!(OpCounters::of(Op).label(), "op");
        assert_eq!(OpCounters::of("x").label(), "x");
    }

    #[test]
    fn finishing_sums_latency_and_keeps_the_maximum() {
        let c = OpCounters::new("t");
        let long_ago = Instant::now() - Duration::from_millis(5);
        c.finish(&c.committed, long_ago);
        let first = c.snapshot();
        assert_eq!((first.committed, first.failed), (1, 0));
        assert!(first.latency_ns_total >= 5_000_000, "{first:?}");
        assert_eq!(first.latency_ns_max, first.latency_ns_total);
        c.finish(&c.failed, Instant::now());
        let second = c.snapshot();
        assert_eq!((second.committed, second.failed), (1, 1));
        assert_eq!(second.latency_ns_max, first.latency_ns_max);
        assert!(second.latency_ns_total >= first.latency_ns_total);
    }

    #[test]
    fn tx_error_exposes_only_database_errors() {
        let rule: TxError<&str> = TxError::Rule("insufficient");
        assert!(rule.database_error().is_none());
        assert_eq!(rule.to_string(), "insufficient");
        let db: TxError<&str> = sqlx::Error::PoolClosed.into();
        assert!(matches!(db.database_error(), Some(sqlx::Error::PoolClosed)));
        assert_eq!(
            db.to_string(),
            "attempted to acquire a connection on a closed pool"
        );
        let config: TxError<&str> = sqlx::Error::Configuration("postgres://u:pw@h".into()).into();
        assert_eq!(
            config.to_string(),
            "invalid database connection configuration"
        );
    }
}
