//! The appliance's own PostgreSQL cluster in `DIR/pg`.
//!
//! Made from the machine's server binaries (`LC_PG_BIN`, else Debian's
//! `/usr/lib/postgresql/15/bin`, else the newest other installed major
//! version). `initdb` and `postgres` refuse to run as root, so when we are
//! root they run as the unprivileged account `postgres` (the Debian
//! package's; `LC_PG_USER` names another), which owns `DIR/pg`.
//!
//! The cluster listens on 127.0.0.1 only, on a port chosen once and kept in
//! `DIR/appliance.conf.json`, with its Unix socket in `DIR/pg/run`; every
//! connection authenticates with SCRAM-SHA-256 (`initdb --auth`), so a
//! sandbox whose shape allows the network still cannot log in. The
//! superuser's password is generated once into `DIR/secrets/`.
//!
//! A data directory that already holds `PG_VERSION` is reused as it is,
//! with all its state; a `postmaster.pid` naming a live postmaster means
//! another appliance runs on this directory, which is refused.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::PgConnectOptions;

use super::ApplianceError;
use super::child::{self, Spec};
use super::sys::{self, Account};

/// Environment variable naming the server binary directory.
pub const PG_BIN_ENV: &str = "LC_PG_BIN";
/// Environment variable naming the account that runs PostgreSQL as root.
pub const PG_USER_ENV: &str = "LC_PG_USER";
/// Debian's `postgresql-15` binaries.
pub const DEFAULT_PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// Where other installed major versions are looked for.
pub const PG_LIB_ROOT: &str = "/usr/lib/postgresql";
/// The account that runs PostgreSQL when we are root.
pub const DEFAULT_PG_USER: &str = "postgres";
/// The cluster's superuser (created by `initdb -U`).
pub const SUPERUSER: &str = "lc_superuser";
/// The only address the cluster listens on.
pub const LISTEN_HOST: &str = "127.0.0.1";
/// How long `initdb` may take.
pub const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a start waits for the server to accept connections (crash
/// recovery after a kill included).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between readiness probes.
const READY_POLL: Duration = Duration::from_millis(100);
/// How many lines of the server log an error carries.
const LOG_TAIL_LINES: usize = 30;

/// The cluster's directories, binaries and account.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// `DIR/pg`.
    pub root: PathBuf,
    /// The binary directory.
    pub bin: PathBuf,
    /// The account PostgreSQL runs as (`None`: ourselves, not root).
    pub run_as: Option<Account>,
    /// The TCP port on [`LISTEN_HOST`].
    pub port: u16,
}

/// The binary directory to use.
///
/// # Errors
/// [`ApplianceError::Setup`] naming what was tried and the package to
/// install.
pub fn discover_bin() -> Result<PathBuf, ApplianceError> {
    let usable = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Some(dir) = std::env::var_os(PG_BIN_ENV).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return if usable(&dir) {
            Ok(dir)
        } else {
            Err(ApplianceError::Setup(format!(
                "{PG_BIN_ENV}={} lacks initdb or postgres",
                dir.display()
            )))
        };
    }
    let preferred = PathBuf::from(DEFAULT_PG_BIN);
    if usable(&preferred) {
        return Ok(preferred);
    }
    let mut others: Vec<(u32, PathBuf)> = std::fs::read_dir(PG_LIB_ROOT)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| usable(d))
        .collect();
    others.sort_by_key(|o| std::cmp::Reverse(o.0));
    others.into_iter().next().map(|(_, d)| d).ok_or_else(|| {
        ApplianceError::Setup(format!(
            "no PostgreSQL server binaries in {DEFAULT_PG_BIN} or {PG_LIB_ROOT}/*/bin; \
             install them (Debian: apt-get install postgresql-15) or set {PG_BIN_ENV}"
        ))
    })
}

/// The account PostgreSQL runs as: `None` when we are not root.
///
/// # Errors
/// Root without the account (install `postgresql-common`, or set
/// [`PG_USER_ENV`]).
pub fn pg_account() -> Result<Option<Account>, ApplianceError> {
    if !sys::is_root() {
        return Ok(None);
    }
    let name = std::env::var(PG_USER_ENV)
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_PG_USER.to_owned());
    let account = sys::lookup_user(&name)
        .map_err(|e| ApplianceError::io(format!("looking up user {name:?}"), e))?
        .ok_or_else(|| {
            ApplianceError::Setup(format!(
                "running as root, and PostgreSQL refuses root, but there is no user {name:?} \
                 (install postgresql-15, or set {PG_USER_ENV})"
            ))
        })?;
    if account.uid == 0 {
        return Err(ApplianceError::Setup(format!("user {name:?} has uid 0")));
    }
    Ok(Some(account))
}

impl Cluster {
    /// The data directory, `DIR/pg/data`.
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The socket directory, `DIR/pg/run`.
    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    /// The server log, `DIR/pg/server.log`.
    pub fn log_path(&self) -> PathBuf {
        self.root.join("server.log")
    }

    /// Whether the data directory was initialised.
    pub fn initialized(&self) -> bool {
        self.data_dir().join("PG_VERSION").is_file()
    }

    fn chown(&self, path: &Path) -> Result<(), ApplianceError> {
        if let Some(a) = &self.run_as {
            std::os::unix::fs::chown(path, Some(a.uid), Some(a.gid)).map_err(|e| {
                ApplianceError::io(format!("chown {} to {}", path.display(), a.name), e)
            })?;
        }
        Ok(())
    }

    /// Creates `DIR/pg` (mode 0700, owned by the PostgreSQL account) and
    /// runs `initdb` with `superuser_password`, unless already initialised.
    /// Returns whether it initialised now.
    ///
    /// # Errors
    /// [`ApplianceError::Io`] for the directories, [`ApplianceError::Setup`]
    /// when `initdb` fails (with its output) or times out.
    pub async fn ensure_initialized(
        &self,
        superuser_password: &str,
    ) -> Result<bool, ApplianceError> {
        use std::os::unix::fs::PermissionsExt as _;
        for d in [self.root.clone(), self.socket_dir()] {
            std::fs::create_dir_all(&d)
                .map_err(|e| ApplianceError::io(format!("creating {}", d.display()), e))?;
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| ApplianceError::io(format!("chmod {}", d.display()), e))?;
            self.chown(&d)?;
        }
        if self.initialized() {
            return Ok(false);
        }
        let data = self.data_dir();
        if data.exists() {
            // A half-made directory from an interrupted initdb.
            std::fs::remove_dir_all(&data)
                .map_err(|e| ApplianceError::io(format!("removing {}", data.display()), e))?;
        }
        let pwfile = self.root.join("initdb.pw");
        super::layout::write_private(&pwfile, superuser_password.as_bytes())?;
        self.chown(&pwfile)?;
        let log = self.root.join("initdb.log");
        let spec = Spec {
            name: "initdb",
            program: self.bin.join("initdb"),
            args: [
                OsString::from("-D"),
                data.clone().into(),
                "-U".into(),
                SUPERUSER.into(),
                "--auth=scram-sha-256".into(),
                OsString::from(format!("--pwfile={}", pwfile.display())),
                "-E".into(),
                "UTF8".into(),
                "--locale=C".into(),
                "--no-instructions".into(),
            ]
            .into(),
            env: Vec::new(),
            run_as: self.run_as.clone(),
            stop_signal: libc::SIGTERM,
            log: log.clone(),
            cwd: self.root.clone(),
        };
        let mut proc = child::spawn(&spec)?;
        let deadline = tokio::time::Instant::now() + INITDB_TIMEOUT;
        let status = loop {
            if let Some(s) = proc.exited() {
                break s;
            }
            if tokio::time::Instant::now() >= deadline {
                proc.stop(Duration::from_secs(5)).await;
                let _ = std::fs::remove_file(&pwfile);
                return Err(ApplianceError::Setup(format!(
                    "initdb did not finish within {} s",
                    INITDB_TIMEOUT.as_secs()
                )));
            }
            tokio::time::sleep(READY_POLL).await;
        };
        let _ = std::fs::remove_file(&pwfile);
        if !status.success() {
            return Err(ApplianceError::Setup(format!(
                "initdb failed ({status}):\n{}",
                child::log_tail(&log, LOG_TAIL_LINES)
            )));
        }
        Ok(true)
    }

    /// The postmaster's process spec: `postgres -D DIR/pg/data -p PORT -h
    /// 127.0.0.1 -k DIR/pg/run`; SIGINT (fast shutdown) stops it.
    ///
    /// # Errors
    /// [`ApplianceError::Setup`] when a live postmaster already runs on the
    /// data directory.
    pub fn postmaster_spec(&self) -> Result<Spec, ApplianceError> {
        if let Some(pid) = postmaster_pid(&self.data_dir())
            && sys::process_alive(pid)
            && sys::cmdline(pid).is_some_and(|c| c.iter().any(|a| a.contains("postgres")))
        {
            return Err(ApplianceError::Setup(format!(
                "a PostgreSQL server (pid {pid}) already runs on {}; is another appliance up on this directory? (appliance down --data-dir ...)",
                self.data_dir().display()
            )));
        }
        Ok(Spec {
            name: "postgres",
            program: self.bin.join("postgres"),
            args: [
                OsString::from("-D"),
                self.data_dir().into(),
                "-p".into(),
                self.port.to_string().into(),
                "-h".into(),
                LISTEN_HOST.into(),
                "-k".into(),
                self.socket_dir().into(),
            ]
            .into(),
            env: Vec::new(),
            run_as: self.run_as.clone(),
            stop_signal: libc::SIGINT,
            log: self.log_path(),
            cwd: self.root.clone(),
        })
    }

    /// Connection options for `user`/`password` on database `db`.
    pub fn options(&self, user: &str, password: &str, db: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host(LISTEN_HOST)
            .port(self.port)
            .username(user)
            .password(password)
            .database(db)
    }

    /// Waits until the server accepts `options` (bounded by
    /// [`READY_TIMEOUT`]), while `alive` says the postmaster runs.
    ///
    /// # Errors
    /// [`ApplianceError::Setup`] with the log tail when the postmaster
    /// exited or the bound passed.
    pub async fn wait_ready(
        &self,
        options: &PgConnectOptions,
        mut alive: impl FnMut() -> bool,
    ) -> Result<(), ApplianceError> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            match sqlx::PgConnection::connect_with(options).await {
                Ok(c) => {
                    let _ = c.close().await;
                    return Ok(());
                }
                Err(e) => {
                    if !alive() {
                        return Err(ApplianceError::Setup(format!(
                            "PostgreSQL exited during start-up:\n{}",
                            child::log_tail(&self.log_path(), LOG_TAIL_LINES)
                        )));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(ApplianceError::Setup(format!(
                            "PostgreSQL did not accept connections within {} s ({}):\n{}",
                            READY_TIMEOUT.as_secs(),
                            pgkit::classify(&e).text(),
                            child::log_tail(&self.log_path(), LOG_TAIL_LINES)
                        )));
                    }
                }
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}

/// The pid in `data/postmaster.pid`, if any.
pub fn postmaster_pid(data: &Path) -> Option<u32> {
    std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}
