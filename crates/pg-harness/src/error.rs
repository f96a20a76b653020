//! The harness's error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while providing a throwaway PostgreSQL server.
///
/// Messages are written for a person reading a failed test: they name the
/// path, port or command involved and, where the server itself is the
/// problem, carry the tail of its log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No directory with usable `initdb` and `postgres` executables was found
    /// (see [`PgBinaries::discover`](crate::PgBinaries::discover)).
    #[error("PostgreSQL binaries not found: {detail}")]
    BinariesNotFound {
        /// What was looked at and what was missing.
        detail: String,
    },

    /// Running as root, but the unprivileged account (or `setpriv`) needed
    /// to run `initdb`/`postgres` is not available.
    #[error("cannot run PostgreSQL as an unprivileged user: {detail}")]
    Privileges {
        /// What is missing.
        detail: String,
    },

    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// `initdb` failed or did not finish within
    /// [`INITDB_TIMEOUT`](crate::INITDB_TIMEOUT).
    #[error("initdb for {data_dir} failed ({status}); its output:\n{output}")]
    Initdb {
        /// Exit status, or a note that it timed out.
        status: String,
        /// The data directory that was being initialised.
        data_dir: PathBuf,
        /// The tail of initdb's combined stdout/stderr.
        output: String,
    },

    /// The postmaster exited before it accepted connections.
    #[error(
        "PostgreSQL on 127.0.0.1:{port} exited during startup ({status}); \
         server log {log} ends with:\n{log_tail}"
    )]
    ExitedDuringStartup {
        /// The port it was asked to listen on.
        port: u16,
        /// Its exit status.
        status: String,
        /// Path of the server log.
        log: PathBuf,
        /// The log lines written during this start attempt (last lines only).
        log_tail: String,
    },

    /// The postmaster did not accept connections within
    /// [`READY_TIMEOUT`](crate::READY_TIMEOUT); it has been killed.
    #[error(
        "PostgreSQL on 127.0.0.1:{port} was not accepting connections after {timeout:?}; \
         server log {log} ends with:\n{log_tail}"
    )]
    StartTimeout {
        /// The port it was asked to listen on.
        port: u16,
        /// How long the harness waited.
        timeout: Duration,
        /// Path of the server log.
        log: PathBuf,
        /// The log lines written during this start attempt (last lines only).
        log_tail: String,
    },

    /// Every one of [`PORT_ATTEMPTS`](crate::PORT_ATTEMPTS) freshly picked
    /// ports was taken by the time the server tried to bind it.
    #[error("no free port after {attempts} attempts; last failure: {last}")]
    PortsExhausted {
        /// How many ports were tried.
        attempts: u32,
        /// The failure of the last attempt.
        last: Box<HarnessError>,
    },

    /// A fast shutdown did not finish within
    /// [`STOP_TIMEOUT`](crate::STOP_TIMEOUT); the postmaster was SIGKILLed.
    #[error("PostgreSQL (pid {pid}) did not shut down within {timeout:?}; it was SIGKILLed")]
    StopTimeout {
        /// The postmaster's pid.
        pid: u32,
        /// How long the harness waited.
        timeout: Duration,
    },

    /// After a SIGKILL of the postmaster, its orphaned backends were still
    /// attached to the shared-memory interlock after
    /// [`STOP_TIMEOUT`](crate::STOP_TIMEOUT), so a new postmaster would
    /// refuse to start on the same data directory.
    #[error(
        "backends of the killed postmaster still hold shared memory segment {shmid} after {timeout:?}"
    )]
    BackendsLinger {
        /// The SysV shared memory id from `postmaster.pid`.
        shmid: i32,
        /// How long the harness waited.
        timeout: Duration,
    },

    /// A helper program answered in a way the harness does not understand.
    #[error("unexpected result from {program}: {detail}")]
    UnexpectedOutput {
        /// The program that was run.
        program: PathBuf,
        /// What it printed or returned.
        detail: String,
    },

    /// A SQL statement issued by the harness (e.g. `CREATE DATABASE`) failed.
    #[error("{context}: {source}")]
    Sql {
        /// What the harness was doing.
        context: String,
        /// The underlying sqlx error.
        #[source]
        source: sqlx::Error,
    },

    /// `libfaketime.so.1` was not found, so a server with a fake clock
    /// ([`PgServer::start_dedicated_faketime`](crate::PgServer::start_dedicated_faketime))
    /// cannot be started.
    #[error("libfaketime not found: {detail}")]
    FaketimeNotFound {
        /// What was looked at, and what to install.
        detail: String,
    },

    /// [`PgServer::set_clock_offset_ns`](crate::PgServer::set_clock_offset_ns)
    /// was called on a server started without a fake clock.
    #[error(
        "PostgreSQL on 127.0.0.1:{port} runs on the real clock; start it with \
         PgServer::start_dedicated_faketime to step its clock"
    )]
    ClockNotFaked {
        /// The server's port.
        port: u16,
    },

    /// `pg_basebackup` (making a standby of a
    /// [`PgPair`](crate::PgPair)) failed or did not finish within
    /// [`BASEBACKUP_TIMEOUT`](crate::BASEBACKUP_TIMEOUT).
    #[error("pg_basebackup into {data_dir} failed ({status}); its output:\n{output}")]
    Basebackup {
        /// Exit status, or a note that it timed out.
        status: String,
        /// The standby's data directory being written.
        data_dir: PathBuf,
        /// The tail of pg_basebackup's combined stdout/stderr.
        output: String,
    },

    /// The standby had not replayed up to the primary's WAL position within
    /// [`REPLAY_TIMEOUT`](crate::REPLAY_TIMEOUT).
    #[error(
        "standby on 127.0.0.1:{port} had replayed WAL up to {replayed_lsn} after {timeout:?}, \
         not up to the primary's {target_lsn}"
    )]
    ReplayTimeout {
        /// The standby's port.
        port: u16,
        /// The primary's `pg_current_wal_lsn()` that was waited for.
        target_lsn: String,
        /// The standby's last `pg_last_wal_replay_lsn()` (`"NULL"` if none).
        replayed_lsn: String,
        /// How long the harness waited.
        timeout: Duration,
    },

    /// The standby was still in recovery [`PROMOTE_TIMEOUT`](crate::PROMOTE_TIMEOUT)
    /// after it was asked to promote.
    #[error("standby on 127.0.0.1:{port} was still in recovery {timeout:?} after pg_promote")]
    PromoteTimeout {
        /// The standby's port.
        port: u16,
        /// How long the harness waited.
        timeout: Duration,
    },

    /// The shared cluster failed to start earlier in this process; every later
    /// call reports the same failure instead of retrying for another minute.
    #[error("the shared PostgreSQL cluster could not be started: {message}")]
    SharedClusterFailed {
        /// The rendered error of the first (and only) start attempt.
        message: String,
    },
}

impl HarnessError {
    /// Wraps an I/O error with a description of what was being done.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// True when a start failed because someone else bound the port between
    /// the harness picking it and the postmaster binding it.
    pub(crate) fn is_port_conflict(&self) -> bool {
        match self {
            Self::ExitedDuringStartup { log_tail, .. } => {
                log_tail.contains("Address already in use")
                    || log_tail.contains("could not create any TCP/IP sockets")
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_conflict_is_recognised_from_the_log_only() {
        let conflict = HarnessError::ExitedDuringStartup {
            port: 5555,
            status: "exit status: 1".into(),
            log: PathBuf::from("/tmp/x/server.log"),
            log_tail: "LOG:  could not bind IPv4 address \"127.0.0.1\": Address already in use\n\
                       FATAL:  could not create any TCP/IP sockets"
                .into(),
        };
        assert!(conflict.is_port_conflict());
        let other = HarnessError::ExitedDuringStartup {
            port: 5555,
            status: "exit status: 1".into(),
            log: PathBuf::from("/tmp/x/server.log"),
            log_tail: "FATAL:  data directory has wrong ownership".into(),
        };
        assert!(!other.is_port_conflict());
        assert_eq!(
            other.to_string(),
            "PostgreSQL on 127.0.0.1:5555 exited during startup (exit status: 1); \
             server log /tmp/x/server.log ends with:\nFATAL:  data directory has wrong ownership"
        );
    }
}
