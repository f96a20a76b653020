//! A streaming-replication pair: a primary and a hot standby copied from it.
//!
//! The primary is an ordinary dedicated server (`initdb -A trust`, whose
//! `pg_hba.conf` already lets `replication` connections from 127.0.0.1 in)
//! started with [`REPLICATION_SETTINGS`] on top of
//! [`SERVER_SETTINGS`](crate::SERVER_SETTINGS). The standby is made by
//! `pg_basebackup -R -X stream -C -S` [`STANDBY_SLOT`] run as the server
//! account, then started on its own port: it streams WAL from the primary
//! through the slot and answers read-only queries (hot standby).
//!
//! The speed settings do not get in the way: `synchronous_commit=off` only
//! delays the primary's local WAL flush (the WAL sender streams what is
//! written, and nothing waits for the standby), `fsync=off` only skips
//! flushes to disk, and the backup forces full-page writes while it runs
//! whatever `full_page_writes` says.
//!
//! Waiting is bounded: [`PgPair::wait_replay_caught_up`] for
//! [`REPLAY_TIMEOUT`], [`PgPair::promote_standby`] for [`PROMOTE_TIMEOUT`].

use std::time::{Duration, Instant};

use sqlx::{Connection, Executor, PgConnection, Row};

use crate::{DbFuture, HarnessError, PgBinaries, PgServer, db};

/// `-c` settings added to both servers of a pair. They are PostgreSQL 15's
/// defaults, stated so that a changed default cannot break replication.
pub const REPLICATION_SETTINGS: [&str; 4] = [
    "wal_level=replica",
    "max_wal_senders=10",
    "max_replication_slots=10",
    "hot_standby=on",
];

/// The physical replication slot the standby streams through, created on
/// the primary by `pg_basebackup -C`. It makes the primary keep WAL the
/// standby has not received, e.g. while the standby is stopped.
pub const STANDBY_SLOT: &str = "tollgate_standby";

/// How long [`PgPair::wait_replay_caught_up`] waits. Replay on an idle
/// loopback pair takes milliseconds; a minute means something is broken.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`PgPair::promote_standby`] waits for the standby to leave
/// recovery (also the `wait_seconds` passed to `pg_promote`).
pub const PROMOTE_TIMEOUT: Duration = Duration::from_secs(60);

/// Interval between the polls of the two waits.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A primary and a streaming hot standby, each a dedicated [`PgServer`]
/// (own temp directory, port and postmaster; see the module documentation
/// for how they are set up).
///
/// Both servers are reached through [`primary`](Self::primary) /
/// [`standby`](Self::standby) and their `_mut` forms, which give every
/// [`PgServer`] method (stop, start, kill, URLs, logs). The standby is read
/// only until [`promote_standby`](Self::promote_standby):
/// [`fresh_database`](PgServer::fresh_database) on it fails. Dropping the
/// pair drops the standby, then the primary.
///
/// ```no_run
/// # async fn demo() {
/// use sqlx::Connection;
/// let mut pair = tollgate_pg_harness::PgPair::start().unwrap();
/// let url = pair.primary().admin_url();
/// let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
/// sqlx::raw_sql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
///     .execute(&mut conn)
///     .await
///     .unwrap();
/// pair.wait_replay_caught_up().await.unwrap(); // the standby now has t
/// pair.kill_primary().unwrap();
/// pair.promote_standby().await.unwrap(); // the standby now takes writes
/// # }
/// ```
#[derive(Debug)]
pub struct PgPair {
    // Declared first so that it is dropped first.
    standby: PgServer,
    primary: PgServer,
}

impl PgPair {
    /// Starts a primary and a standby copied from it, with the binaries
    /// from [`PgBinaries::discover`].
    ///
    /// # Errors
    /// As for [`PgServer::start_dedicated`], for either server;
    /// [`HarnessError::BinariesNotFound`] if the binary directory lacks
    /// `pg_basebackup`; [`HarnessError::Basebackup`] if the copy fails or
    /// takes longer than [`BASEBACKUP_TIMEOUT`](crate::BASEBACKUP_TIMEOUT).
    /// On error nothing is left running.
    ///
    /// # Panics
    /// Never.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(PgBinaries::discover()?)
    }

    /// As [`start`](Self::start), with given binaries (both servers and
    /// `pg_basebackup` come from them).
    ///
    /// # Errors
    /// As for [`start`](Self::start).
    pub fn start_with(bins: PgBinaries) -> Result<Self, HarnessError> {
        // Checked before the primary's initdb, to fail fast.
        bins.pg_basebackup()?;
        let primary = PgServer::start_initdb(bins, &REPLICATION_SETTINGS, false)?;
        let standby = PgServer::start_standby_of(&primary, STANDBY_SLOT, &REPLICATION_SETTINGS)?;
        Ok(Self { standby, primary })
    }

    /// The primary.
    pub fn primary(&self) -> &PgServer {
        &self.primary
    }

    /// The primary, to stop, start or kill it.
    pub fn primary_mut(&mut self) -> &mut PgServer {
        &mut self.primary
    }

    /// The standby (still called so after a promotion).
    pub fn standby(&self) -> &PgServer {
        &self.standby
    }

    /// The standby, to stop, start or kill it.
    pub fn standby_mut(&mut self) -> &mut PgServer {
        &mut self.standby
    }

    /// [`PgServer::stop`] of the primary (fast shutdown). The standby keeps
    /// running, in recovery, retrying its connection.
    ///
    /// # Errors
    /// As for [`PgServer::stop`].
    pub fn stop_primary(&mut self) -> Result<(), HarnessError> {
        self.primary.stop()
    }

    /// [`PgServer::kill`] of the primary (SIGKILL, as a crash). The standby
    /// keeps running, in recovery, retrying its connection.
    ///
    /// # Errors
    /// As for [`PgServer::kill`].
    pub fn kill_primary(&mut self) -> Result<(), HarnessError> {
        self.primary.kill()
    }

    /// Flushes the primary's WAL and reads its `pg_current_wal_lsn()` once,
    /// then polls the standby's `pg_last_wal_replay_lsn()` until it is at or
    /// past that position, for at most [`REPLAY_TIMEOUT`]. Everything the
    /// primary committed before the call is then visible on the standby.
    /// Resolves to the LSN waited for, as a 64-bit WAL position
    /// (`"0/3000148"` is `0x3000148`).
    ///
    /// The flush is one tiny transaction of the harness's own on the
    /// primary, committed under `synchronous_commit = on` (a transactional
    /// `pg_logical_emit_message`, prefix `tollgate-pg-harness`; it uses up
    /// one transaction id): under [`SERVER_SETTINGS`]'
    /// `synchronous_commit=off` a commit can sit in the WAL buffers, neither
    /// streamed nor counted by `pg_current_wal_lsn()`, for up to
    /// `wal_writer_delay`.
    ///
    /// [`SERVER_SETTINGS`]: crate::SERVER_SETTINGS
    ///
    /// The future holds the two ports only (`Send + 'static`); it needs a
    /// tokio runtime with time enabled (`#[tokio::test]` has it).
    ///
    /// # Errors
    /// [`HarnessError::Sql`] if either server cannot be queried (the
    /// primary must be running and not in recovery),
    /// [`HarnessError::ReplayTimeout`] with both positions after
    /// [`REPLAY_TIMEOUT`].
    ///
    /// # Panics
    /// Never.
    pub fn wait_replay_caught_up(&self) -> DbFuture<Result<u64, HarnessError>> {
        Box::pin(wait_replay(self.primary.port(), self.standby.port()))
    }

    /// Promotes the standby (`SELECT pg_promote(true, 60)`), then polls
    /// until `pg_is_in_recovery()` is false, for at most
    /// [`PROMOTE_TIMEOUT`] in all. Afterwards the standby is a primary on a
    /// new timeline (the old one + 1) and accepts writes; the old primary is
    /// not touched (kill or stop it first, as a failover would).
    ///
    /// The future holds the standby's port only (`Send + 'static`); it
    /// needs a tokio runtime with time enabled.
    ///
    /// # Errors
    /// [`HarnessError::Sql`] if the standby cannot be queried or is not in
    /// recovery (already promoted), [`HarnessError::PromoteTimeout`] if it
    /// is still in recovery after [`PROMOTE_TIMEOUT`].
    ///
    /// # Panics
    /// Never.
    pub fn promote_standby(&self) -> DbFuture<Result<(), HarnessError>> {
        Box::pin(promote(self.standby.port()))
    }
}

/// `"16/B374D848"` → `0x16_B374_D848`; `None` unless two hex halves of at
/// most 32 bits each.
pub(crate) fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hex = |part: &str| {
        (!part.is_empty() && part.len() <= 8 && part.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(part, 16).ok())
            .flatten()
    };
    Some((hex(hi)? << 32) | hex(lo)?)
}

async fn connect(port: u16) -> Result<PgConnection, HarnessError> {
    let url = db::url(port, "postgres");
    PgConnection::connect(&url)
        .await
        .map_err(|source| HarnessError::Sql {
            context: format!("connecting to {url}"),
            source,
        })
}

/// One row, first column, through the connection's own (boxed, `Send`)
/// executor future; see [`DbFuture`] for why not `query_scalar`.
async fn scalar<T>(conn: &mut PgConnection, port: u16, sql: &str) -> Result<T, HarnessError>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let sql_error = |source| HarnessError::Sql {
        context: format!("{sql} on 127.0.0.1:{port}"),
        source,
    };
    let row = conn.fetch_one(sql).await.map_err(sql_error)?;
    row.try_get(0).map_err(sql_error)
}

async fn wait_replay(primary_port: u16, standby_port: u16) -> Result<u64, HarnessError> {
    let mut primary = connect(primary_port).await?;
    // With synchronous_commit=off a commit may still sit in the WAL
    // buffers: not streamed, and not yet counted by pg_current_wal_lsn()
    // (the write position). A synchronous commit of our own flushes all
    // WAL inserted before it; it must write WAL itself, or PostgreSQL
    // commits it asynchronously anyway (so `txid_current()` alone would not
    // do). A transactional logical message is such a write, and a physical
    // standby replays it as a no-op.
    let flush_sql = "SET synchronous_commit = on";
    primary
        .execute(flush_sql)
        .await
        .map_err(|source| HarnessError::Sql {
            context: format!("{flush_sql} on 127.0.0.1:{primary_port}"),
            source,
        })?;
    let _: String = scalar(
        &mut primary,
        primary_port,
        "SELECT pg_logical_emit_message(true, 'tollgate-pg-harness', 'flush')::text",
    )
    .await?;
    let target_text: String = scalar(
        &mut primary,
        primary_port,
        "SELECT pg_current_wal_lsn()::text",
    )
    .await?;
    let _ = primary.close().await;
    let target = parse_lsn(&target_text).ok_or_else(|| HarnessError::UnexpectedOutput {
        program: "pg_current_wal_lsn()".into(),
        detail: format!("not an LSN: {target_text:?}"),
    })?;
    let mut standby = connect(standby_port).await?;
    let deadline = Instant::now() + REPLAY_TIMEOUT;
    loop {
        let replayed: Option<String> = scalar(
            &mut standby,
            standby_port,
            "SELECT pg_last_wal_replay_lsn()::text",
        )
        .await?;
        if replayed.as_deref().and_then(parse_lsn) >= Some(target) {
            let _ = standby.close().await;
            return Ok(target);
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::ReplayTimeout {
                port: standby_port,
                target_lsn: target_text,
                replayed_lsn: replayed.unwrap_or_else(|| "NULL".to_owned()),
                timeout: REPLAY_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn promote(port: u16) -> Result<(), HarnessError> {
    let deadline = Instant::now() + PROMOTE_TIMEOUT;
    let mut conn = connect(port).await?;
    // `false` means "not promoted within wait_seconds"; the poll below
    // then reports the timeout.
    let sql = format!("SELECT pg_promote(true, {})", PROMOTE_TIMEOUT.as_secs());
    let _: bool = scalar(&mut conn, port, &sql).await?;
    loop {
        let in_recovery: bool = scalar(&mut conn, port, "SELECT pg_is_in_recovery()").await?;
        if !in_recovery {
            let _ = conn.close().await;
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::PromoteTimeout {
                port,
                timeout: PROMOTE_TIMEOUT,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_parse_exactly() {
        for (text, expected) in [
            ("0/0", Some(0)),
            ("0/3000148", Some(0x300_0148)),
            ("16/B374D848", Some(0x16_B374_D848)),
            ("FFFFFFFF/FFFFFFFF", Some(u64::MAX)),
            ("ffffffff/fffffffe", Some(u64::MAX - 1)),
            ("1/0", Some(1 << 32)),
            ("0/FFFFFFFF", Some(0xFFFF_FFFF)),
            ("100000000/0", None),
            ("0/100000000", None),
            ("0/", None),
            ("/0", None),
            ("0", None),
            ("0/+1", None),
            ("0/x", None),
            ("", None),
        ] {
            assert_eq!(parse_lsn(text), expected, "{text:?}");
        }
    }
}
