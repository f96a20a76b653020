//! One PostgreSQL server: a data directory, a port and (while running) a postmaster.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::faketime::{self, FakeClock};
use crate::launcher::{self, RunAs};
use crate::sys::{self, PostmasterPid};
use crate::{DbFuture, HarnessError, PgBinaries, TestDb, cleanup, db};

/// How long a start (or restart) waits for the server to accept connections
/// before giving up, killing it and reporting the log tail.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a fast shutdown ([`PgServer::stop`]) may take before the
/// postmaster is SIGKILLed; also bounds the wait for orphaned backends after
/// [`PgServer::kill`].
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long `initdb` may take.
pub const INITDB_TIMEOUT: Duration = Duration::from_secs(120);

/// How long `pg_basebackup` (making the standby of a
/// [`PgPair`](crate::PgPair)) may take: a fresh cluster is about 40 MB, and
/// the backup starts with an immediate checkpoint.
pub const BASEBACKUP_TIMEOUT: Duration = Duration::from_secs(120);

/// How many freshly picked ports a new server tries before giving up, in
/// case another process takes a port between the harness picking it and the
/// postmaster binding it.
pub const PORT_ATTEMPTS: u32 = 5;

/// How long [`PgServer::start`] keeps retrying when its (fixed) port is
/// briefly held by another process.
pub const REBIND_TIMEOUT: Duration = Duration::from_secs(10);

/// The superuser created by `initdb -U` (authentication is `trust`).
pub const SUPERUSER: &str = "postgres";

/// The only TCP address servers listen on.
pub const LISTEN_HOST: &str = "127.0.0.1";

/// `-c` settings every server is started with. Durability is traded for
/// speed: data survives a clean restart and a postmaster SIGKILL (the OS
/// keeps written pages), but with `synchronous_commit=off` a commit may be
/// acknowledged before its WAL is written, see [`PgServer::kill`].
pub const SERVER_SETTINGS: [&str; 4] = [
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=200",
];

/// Interval between readiness probes and between checks while waiting for
/// a process to exit.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// How many log lines an error message carries.
const LOG_TAIL_LINES: usize = 40;

/// How long `Drop` gives an immediate shutdown before SIGKILL.
const DROP_GRACE: Duration = Duration::from_secs(10);

/// A PostgreSQL server owned by one test: its own temp directory, data
/// directory, port and postmaster, controllable with
/// [`stop`](Self::stop), [`start`](Self::start), [`restart`](Self::restart)
/// and [`kill`](Self::kill).
///
/// Use it for restart and crash tests, which must not disturb the
/// [shared cluster](crate::PgCluster::shared). The port stays the same for
/// the server's whole life, so URLs taken before a restart remain valid.
///
/// Dropping it shuts the server down (immediate mode) and deletes its
/// directory; if it is leaked, the same happens at process exit.
///
/// Lifecycle methods are synchronous and block the calling thread for up to
/// [`READY_TIMEOUT`]/[`STOP_TIMEOUT`]; that is acceptable inside
/// `#[tokio::test]`.
#[derive(Debug)]
pub struct PgServer {
    bins: PgBinaries,
    run_as: RunAs,
    dir: PathBuf,
    port: u16,
    postmaster: Option<Child>,
    registration: u64,
    /// `-c` settings after [`SERVER_SETTINGS`] (a later one wins).
    extra_settings: &'static [&'static str],
    /// `Some` for a server started with a fake clock.
    clock: Option<FakeClock>,
}

impl PgServer {
    /// Creates a temp directory `tollgate-pg-<pid>-<n>`, runs `initdb` in it
    /// and starts a postmaster on a free 127.0.0.1 port, with the binaries
    /// from [`PgBinaries::discover`].
    ///
    /// # Errors
    /// [`HarnessError::BinariesNotFound`] if no PostgreSQL is installed,
    /// [`HarnessError::Privileges`] when root but the `postgres` account or
    /// `setpriv` is missing, [`HarnessError::Initdb`], or any start error
    /// (see [`start`](Self::start)). On error nothing is left running and
    /// the directory is removed.
    pub fn start_dedicated() -> Result<Self, HarnessError> {
        Self::start_dedicated_with(PgBinaries::discover()?)
    }

    /// As [`start_dedicated`](Self::start_dedicated), with given binaries.
    ///
    /// # Errors
    /// As for [`start_dedicated`](Self::start_dedicated).
    pub fn start_dedicated_with(bins: PgBinaries) -> Result<Self, HarnessError> {
        Self::start_initdb(bins, &[], false)
    }

    /// As [`start_dedicated`](Self::start_dedicated), with a wall clock the
    /// test can step while the server runs:
    /// [`set_clock_offset_ns`](Self::set_clock_offset_ns). The offset starts
    /// at 0 (real time).
    ///
    /// The postmaster (only it: not `initdb` or `pg_isready`) runs with
    /// libfaketime preloaded, reading its offset from `<dir>/faketime.rc` on
    /// every clock call; the monotonic clock and file times are not faked.
    /// See [`libfaketime`](crate::libfaketime) for where the library is
    /// looked for, and the crate documentation for the design.
    ///
    /// # Errors
    /// [`HarnessError::FaketimeNotFound`] (saying to install the
    /// `libfaketime` package) before anything is created, or as for
    /// [`start_dedicated`](Self::start_dedicated).
    ///
    /// # Panics
    /// Never.
    ///
    /// ```no_run
    /// # async fn demo() {
    /// use sqlx::Connection;
    /// let mut server = tollgate_pg_harness::PgServer::start_dedicated_faketime().unwrap();
    /// server.set_clock_offset_ns(3_600 * 1_000_000_000).unwrap(); // one hour ahead
    /// let mut conn = sqlx::PgConnection::connect(&server.admin_url()).await.unwrap();
    /// let ahead: bool = sqlx::query_scalar("SELECT clock_timestamp() > now() + interval '59 min'")
    ///     .fetch_one(&mut conn)
    ///     .await
    ///     .unwrap();
    /// # }
    /// ```
    pub fn start_dedicated_faketime() -> Result<Self, HarnessError> {
        Self::start_dedicated_faketime_with(PgBinaries::discover()?)
    }

    /// As [`start_dedicated_faketime`](Self::start_dedicated_faketime), with
    /// given binaries.
    ///
    /// # Errors
    /// As for [`start_dedicated_faketime`](Self::start_dedicated_faketime).
    pub fn start_dedicated_faketime_with(bins: PgBinaries) -> Result<Self, HarnessError> {
        Self::start_initdb(bins, &[], true)
    }

    /// A new server from `initdb`, started on a fresh port.
    pub(crate) fn start_initdb(
        bins: PgBinaries,
        extra_settings: &'static [&'static str],
        faketime: bool,
    ) -> Result<Self, HarnessError> {
        let mut server = Self::create(bins, extra_settings, faketime)?;
        server.initdb()?;
        server.start_on_fresh_port()?;
        Ok(server)
    }

    /// A new standby of `primary` from `pg_basebackup`, started on a fresh
    /// port; see [`PgPair`](crate::PgPair).
    pub(crate) fn start_standby_of(
        primary: &PgServer,
        slot: &str,
        extra_settings: &'static [&'static str],
    ) -> Result<Self, HarnessError> {
        let basebackup = primary.bins.pg_basebackup()?;
        let mut server = Self::create(primary.bins.clone(), extra_settings, false)?;
        server.basebackup(&basebackup, primary.port, slot)?;
        server.start_on_fresh_port()?;
        Ok(server)
    }

    /// The temp directory, registered for cleanup, with no data directory
    /// and no postmaster yet; with the fake clock's offset file if asked.
    fn create(
        bins: PgBinaries,
        extra_settings: &'static [&'static str],
        faketime: bool,
    ) -> Result<Self, HarnessError> {
        // Look for the library before creating anything.
        let lib = faketime.then(faketime::libfaketime).transpose()?;
        let run_as = RunAs::detect()?;
        let dir = cleanup::create_instance_dir(&run_as)?;
        let registration = cleanup::register(dir.clone());
        // From here on `Drop` cleans up if anything fails.
        let mut server = Self {
            bins,
            run_as,
            dir,
            port: 0,
            postmaster: None,
            registration,
            extra_settings,
            clock: None,
        };
        if let Some(lib) = lib {
            server.clock = Some(FakeClock::create(lib, &server.dir)?);
        }
        Ok(server)
    }

    /// Sets the server's wall clock to real time plus `offset_ns`
    /// nanoseconds (negative: behind), by atomically replacing the offset
    /// file. Every server process sees the new offset at its next clock
    /// call, in open sessions too (`clock_timestamp()` steps at once; `now()`
    /// is fixed for the rest of a transaction, as always); no restart. The
    /// offset is absolute, not added to the previous one, and it persists
    /// across [`stop`](Self::stop)/[`start`](Self::start).
    ///
    /// Works whether or not the postmaster is running. The offset is
    /// written as `"+3600.000000000"` (libfaketime's relative format, in
    /// seconds); libfaketime parses it as a `double`, so whole seconds are
    /// exact and a fraction may be off by a few nanoseconds. Only the wall
    /// clock moves: deadlines the server derives from it
    /// (`statement_timeout`, `lock_timeout`, `pg_sleep`) move with a step.
    ///
    /// # Errors
    /// [`HarnessError::ClockNotFaked`] if the server was not started by
    /// [`start_dedicated_faketime`](Self::start_dedicated_faketime) (or its
    /// `_with` form); [`HarnessError::Io`] if the file cannot be written.
    ///
    /// # Panics
    /// Never.
    ///
    /// ```no_run
    /// let mut server = tollgate_pg_harness::PgServer::start_dedicated_faketime().unwrap();
    /// server.set_clock_offset_ns(-120 * 1_000_000_000).unwrap(); // two minutes behind
    /// assert_eq!(server.clock_offset_ns(), Some(-120_000_000_000));
    /// server.set_clock_offset_ns(0).unwrap(); // real time again
    /// ```
    pub fn set_clock_offset_ns(&mut self, offset_ns: i64) -> Result<(), HarnessError> {
        match self.clock.as_mut() {
            Some(clock) => clock.set_offset_ns(offset_ns),
            None => Err(HarnessError::ClockNotFaked { port: self.port }),
        }
    }

    /// The offset last set by [`set_clock_offset_ns`](Self::set_clock_offset_ns)
    /// (0 at start), in nanoseconds; `None` for a server on the real clock.
    pub fn clock_offset_ns(&self) -> Option<i64> {
        self.clock.as_ref().map(FakeClock::offset_ns)
    }

    /// The TCP port (on [`LISTEN_HOST`]); fixed for the server's life.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`. `db` is inserted as is:
    /// use plain identifiers.
    pub fn url_for(&self, db: &str) -> String {
        db::url(self.port, db)
    }

    /// URL of the `postgres` maintenance database.
    pub fn admin_url(&self) -> String {
        self.url_for("postgres")
    }

    /// The server's temp directory (`tollgate-pg-<pid>-<n>`): it holds
    /// `data/`, `server.log`, `initdb.log` and the Unix socket.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (`<dir>/data`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The Unix socket directory (the same as [`dir`](Self::dir)).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The server log (`<dir>/server.log`); every start appends to it.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The binaries this server runs.
    pub fn binaries(&self) -> &PgBinaries {
        &self.bins
    }

    /// The postmaster's pid while one was started and not yet stopped or
    /// killed through this handle (it may have died on its own since; see
    /// [`is_running`](Self::is_running)).
    pub fn pid(&self) -> Option<u32> {
        self.postmaster.as_ref().map(Child::id)
    }

    /// Whether the postmaster is alive. Reaps it if it has exited on its own.
    pub fn is_running(&mut self) -> bool {
        let Some(child) = self.postmaster.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(_)) | Err(_) => {
                self.postmaster = None;
                cleanup::set_postmaster(self.registration, None);
                false
            }
        }
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        read_tail(&self.log_path(), 0, lines)
    }

    /// Starts the postmaster on the existing data directory and port and
    /// waits until it accepts connections (after a [`kill`](Self::kill)
    /// that includes crash recovery). Does nothing if it is running.
    ///
    /// # Errors
    /// [`HarnessError::ExitedDuringStartup`] (e.g. the port was taken
    /// meanwhile) or [`HarnessError::StartTimeout`] after
    /// [`READY_TIMEOUT`], both with the log tail; [`HarnessError::Io`] if it
    /// cannot be spawned. The postmaster is not left running on error.
    ///
    /// While stopped, the port may be taken for a moment by some client's
    /// outgoing connection (it is in the ephemeral range); a start that
    /// fails to bind is therefore retried for up to [`REBIND_TIMEOUT`].
    pub fn start(&mut self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + REBIND_TIMEOUT;
        loop {
            match self.start_once() {
                Err(err) if err.is_port_conflict() && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }

    /// One start attempt on the current port.
    fn start_once(&mut self) -> Result<(), HarnessError> {
        if self.is_running() {
            return Ok(());
        }
        let log_path = self.log_path();
        let log_offset = fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| HarnessError::io(format!("opening {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| HarnessError::io("duplicating the log file handle", e))?;
        let clock_env = self.clock.as_ref().map(FakeClock::env).unwrap_or_default();
        let mut cmd = self
            .run_as
            .command_with_env(&self.bins.postgres(), &self.dir, &clock_env);
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-h")
            .arg(LISTEN_HOST)
            .arg("-k")
            .arg(&self.dir);
        for setting in SERVER_SETTINGS.iter().chain(self.extra_settings) {
            cmd.arg("-c").arg(setting);
        }
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        let child = launcher::spawn(cmd).map_err(|e| {
            HarnessError::io(format!("spawning {}", self.bins.postgres().display()), e)
        })?;
        cleanup::set_postmaster(self.registration, Some(child.id()));
        self.postmaster = Some(child);
        if let Err(err) = self.wait_until_ready(log_offset) {
            self.kill_quietly();
            return Err(err);
        }
        Ok(())
    }

    /// Fast shutdown (`-m fast`, i.e. SIGINT: roll back open transactions,
    /// checkpoint, exit) and wait for the postmaster to exit. Does nothing
    /// if it is not running.
    ///
    /// # Errors
    /// [`HarnessError::StopTimeout`] if it took longer than
    /// [`STOP_TIMEOUT`] (it has then been SIGKILLed), [`HarnessError::Io`]
    /// if it cannot be signalled.
    pub fn stop(&mut self) -> Result<(), HarnessError> {
        let Some(mut child) = self.postmaster.take() else {
            return Ok(());
        };
        let pid = child.id();
        let outcome = sys::send_signal(pid, libc::SIGINT)
            .and_then(|()| wait_timeout(&mut child, STOP_TIMEOUT));
        let result = match outcome {
            Ok(Some(_)) => Ok(()),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(HarnessError::StopTimeout {
                    pid,
                    timeout: STOP_TIMEOUT,
                })
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(HarnessError::io(format!("stopping postmaster {pid}"), e))
            }
        };
        cleanup::set_postmaster(self.registration, None);
        result
    }

    /// [`stop`](Self::stop), then [`start`](Self::start): same data
    /// directory, same port.
    ///
    /// # Errors
    /// As for [`stop`](Self::stop) and [`start`](Self::start).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop()?;
        self.start()
    }

    /// SIGKILLs the postmaster, as a crash would, and waits until it is
    /// reaped and its orphaned backends have let go of the shared memory
    /// interlock, so that [`start`](Self::start) (which then runs crash
    /// recovery) can follow at once. Does nothing if it is not running.
    ///
    /// Data committed before the kill survives it only if its WAL was
    /// written: the server runs with `synchronous_commit=off`, so a test
    /// that checks durability across `kill` should `SET synchronous_commit
    /// = on` in the writing session (`fsync=off` does not matter here: the
    /// machine does not crash, only the process).
    ///
    /// # Errors
    /// [`HarnessError::Io`] if the postmaster cannot be reaped,
    /// [`HarnessError::BackendsLinger`] if orphaned backends are still
    /// attached after [`STOP_TIMEOUT`].
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        let Some(mut child) = self.postmaster.take() else {
            return Ok(());
        };
        let interlock = PostmasterPid::read(&self.data_dir()).and_then(|p| p.shm);
        let _ = child.kill();
        let waited = child.wait();
        cleanup::set_postmaster(self.registration, None);
        waited.map_err(|e| HarnessError::io(format!("reaping postmaster {}", child.id()), e))?;
        if let Some((key, shmid)) = interlock {
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(sys::shm_state(shmid), sys::ShmState::Present { key: k, attached } if k == key && attached > 0)
            {
                if Instant::now() >= deadline {
                    return Err(HarnessError::BackendsLinger {
                        shmid,
                        timeout: STOP_TIMEOUT,
                    });
                }
                std::thread::sleep(POLL_INTERVAL);
            }
        }
        Ok(())
    }

    /// Creates a new, uniquely named database; see
    /// [`PgCluster::fresh_database`](crate::PgCluster::fresh_database).
    ///
    /// The future ([`DbFuture`]) takes the server's port at the call and
    /// borrows nothing (a restart keeps the port).
    ///
    /// # Panics
    /// If the server is not running or `CREATE DATABASE` fails.
    pub fn fresh_database(&self) -> DbFuture<TestDb> {
        let created = self.try_fresh_database();
        Box::pin(async move {
            created
                .await
                .unwrap_or_else(|e| panic!("tollgate-pg-harness: {e}"))
        })
    }

    /// Fallible [`fresh_database`](Self::fresh_database).
    ///
    /// # Errors
    /// [`HarnessError::Sql`] if connecting or `CREATE DATABASE` fails.
    pub fn try_fresh_database(&self) -> DbFuture<Result<TestDb, HarnessError>> {
        db::create_database(self.port)
    }

    fn initdb(&mut self) -> Result<(), HarnessError> {
        let data_dir = self.data_dir();
        let mut args: Vec<OsString> = vec!["-D".into(), data_dir.clone().into()];
        args.extend(
            [
                "-A",
                "trust",
                "-U",
                SUPERUSER,
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
            .map(OsString::from),
        );
        self.run_to_completion(&self.bins.initdb(), &args, "initdb.log", INITDB_TIMEOUT)?
            .map_err(|(status, output)| HarnessError::Initdb {
                status,
                data_dir,
                output,
            })
    }

    /// Copies the primary on `primary_port` into this server's data
    /// directory as a standby: `-R` writes `standby.signal` and
    /// `primary_conninfo`, `-X stream` streams the WAL needed to make the
    /// copy consistent, `-C -S <slot>` creates a replication slot so the
    /// primary keeps the WAL the standby has not received yet, and
    /// `-c fast` starts with an immediate checkpoint instead of a spread one.
    fn basebackup(
        &mut self,
        program: &Path,
        primary_port: u16,
        slot: &str,
    ) -> Result<(), HarnessError> {
        let data_dir = self.data_dir();
        let port = primary_port.to_string();
        let mut args: Vec<OsString> = [
            "-h",
            LISTEN_HOST,
            "-p",
            &port,
            "-U",
            SUPERUSER,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-C",
            "-S",
            slot,
            "--no-sync",
            "-D",
        ]
        .map(OsString::from)
        .to_vec();
        args.push(data_dir.clone().into());
        self.run_to_completion(program, &args, "basebackup.log", BASEBACKUP_TIMEOUT)?
            .map_err(|(status, output)| HarnessError::Basebackup {
                status,
                data_dir,
                output,
            })
    }

    /// Runs `program args` as the server account (no fake clock) with its
    /// output in `<dir>/<log_name>`, for at most `timeout`. `Ok(Err((status
    /// or timeout note, log tail)))` if it failed (it has been killed);
    /// `Err` if it could not be run.
    fn run_to_completion(
        &self,
        program: &Path,
        args: &[OsString],
        log_name: &str,
        timeout: Duration,
    ) -> Result<Result<(), (String, String)>, HarnessError> {
        let log_path = self.dir.join(log_name);
        let log = File::create(&log_path)
            .map_err(|e| HarnessError::io(format!("creating {}", log_path.display()), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| HarnessError::io("duplicating the log file handle", e))?;
        let mut cmd = self.run_as.command(program, &self.dir);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let mut child = launcher::spawn(cmd)
            .map_err(|e| HarnessError::io(format!("spawning {}", program.display()), e))?;
        let status = match wait_timeout(&mut child, timeout) {
            Ok(Some(status)) if status.success() => return Ok(Ok(())),
            Ok(Some(status)) => status.to_string(),
            Ok(None) => format!("still running after {timeout:?}"),
            Err(e) => format!("cannot wait for it: {e}"),
        };
        let _ = child.kill();
        let _ = child.wait();
        Ok(Err((status, read_tail(&log_path, 0, LOG_TAIL_LINES))))
    }

    fn start_on_fresh_port(&mut self) -> Result<(), HarnessError> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            self.port = pick_free_port()?;
            match self.start_once() {
                Ok(()) => return Ok(()),
                Err(err) if err.is_port_conflict() => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(HarnessError::PortsExhausted {
            attempts: PORT_ATTEMPTS,
            last: Box::new(last.expect("PORT_ATTEMPTS > 0")),
        })
    }

    fn wait_until_ready(&mut self, log_offset: u64) -> Result<(), HarnessError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let child = self
                .postmaster
                .as_mut()
                .expect("postmaster was just started");
            let exited = child
                .try_wait()
                .map_err(|e| HarnessError::io("checking on the postmaster", e))?;
            if let Some(status) = exited {
                self.postmaster = None;
                cleanup::set_postmaster(self.registration, None);
                return Err(HarnessError::ExitedDuringStartup {
                    port: self.port,
                    status: status.to_string(),
                    log: self.log_path(),
                    log_tail: read_tail(&self.log_path(), log_offset, LOG_TAIL_LINES),
                });
            }
            if self.accepting_connections()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::StartTimeout {
                    port: self.port,
                    timeout: READY_TIMEOUT,
                    log: self.log_path(),
                    log_tail: read_tail(&self.log_path(), log_offset, LOG_TAIL_LINES),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// One `pg_isready` probe over TCP.
    fn accepting_connections(&self) -> Result<bool, HarnessError> {
        let program = self.bins.pg_isready();
        let mut cmd = Command::new(&program);
        launcher::scrub_env(&mut cmd);
        let status = cmd
            .args(["-q", "-h", LISTEN_HOST, "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", "postgres", "-t", "2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| HarnessError::io(format!("running {}", program.display()), e))?;
        match status.code() {
            Some(0) => Ok(true),
            // 1: rejecting connections (starting up, recovering); 2: no answer yet.
            Some(1 | 2) => Ok(false),
            _ => Err(HarnessError::UnexpectedOutput {
                program,
                detail: status.to_string(),
            }),
        }
    }

    fn kill_quietly(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        cleanup::set_postmaster(self.registration, None);
    }
}

impl Drop for PgServer {
    /// Immediate shutdown (SIGQUIT; SIGKILL after a grace period), then the
    /// temp directory is deleted. Errors are ignored.
    fn drop(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            let _ = sys::send_signal(child.id(), libc::SIGQUIT);
            if !matches!(wait_timeout(&mut child, DROP_GRACE), Ok(Some(_))) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        cleanup::remove_instance_dir(&self.dir);
        cleanup::unregister(self.registration);
    }
}

/// A port that was free a moment ago on [`LISTEN_HOST`].
fn pick_free_port() -> Result<u16, HarnessError> {
    let listener = TcpListener::bind((LISTEN_HOST, 0))
        .map_err(|e| HarnessError::io("binding 127.0.0.1:0 to find a free port", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| HarnessError::io("reading the bound port", e))?
        .port();
    Ok(port)
}

/// Polls `child` until it exits or `timeout` passes (`Ok(None)`).
fn wait_timeout(child: &mut Child, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(POLL_INTERVAL.min(Duration::from_millis(10)));
    }
}

/// The last `lines` lines of `path` from byte `offset` on (lossy UTF-8).
fn read_tail(path: &Path, offset: u64, lines: usize) -> String {
    let mut text = Vec::new();
    let read = File::open(path).and_then(|mut f| {
        f.seek(SeekFrom::Start(offset))?;
        f.read_to_end(&mut text)
    });
    if let Err(e) = read {
        return format!("<cannot read {}: {e}>", path.display());
    }
    let text = String::from_utf8_lossy(&text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_reads_from_offset_and_keeps_last_lines() {
        let path =
            std::env::temp_dir().join(format!("tollgate-pg-unit-{}-tail", std::process::id()));
        fs::write(&path, "old 1\nold 2\nnew 1\nnew 2\nnew 3\n").unwrap();
        assert_eq!(read_tail(&path, 12, 2), "new 2\nnew 3");
        assert_eq!(read_tail(&path, 12, 10), "new 1\nnew 2\nnew 3");
        assert_eq!(read_tail(&path, 0, 1), "new 3");
        fs::remove_file(&path).unwrap();
        assert!(read_tail(&path, 0, 1).starts_with("<cannot read "));
    }

    #[test]
    fn free_ports_are_nonzero_and_bindable() {
        let port = pick_free_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((LISTEN_HOST, port)).unwrap();
    }
}
