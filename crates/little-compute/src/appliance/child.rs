//! The appliance's child processes: how each is started and stopped.
//!
//! Every child is started through `setpriv` (util-linux), which sets its
//! parent-death signal (after switching to an unprivileged account, when
//! one is given: the kernel clears a parent-death signal on a credential
//! change) and then execs the program, so the child's pid is the
//! program's. If the appliance itself dies, even by SIGKILL, each child
//! receives its graceful stop signal, so nothing lingers. Each child runs
//! in its own process group: a terminal's Ctrl-C reaches the appliance
//! only, which then stops the children in order.
//!
//! Children get a scrubbed environment (`PG*` variables, which would steer
//! libpq-style clients, are removed; `LC_ALL=C`) plus the variables the
//! appliance hands them; secrets travel only in the environment, which only
//! the process's own account and root can read, never on the command line.
//! Standard output and error go to the child's log file under
//! `DIR/logs/`, appended.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::ApplianceError;
use super::sys::{self, Account};

/// Places `setpriv` is looked for.
const SETPRIV_CANDIDATES: [&str; 3] = ["/usr/bin/setpriv", "/bin/setpriv", "/usr/sbin/setpriv"];

/// Poll interval while waiting for a child to exit.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// The path of `setpriv`.
///
/// # Errors
/// [`ApplianceError::Setup`] when it is in none of the usual places.
pub fn setpriv() -> Result<PathBuf, ApplianceError> {
    SETPRIV_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            ApplianceError::Setup(format!(
                "setpriv (util-linux) is not in any of {SETPRIV_CANDIDATES:?}"
            ))
        })
}

/// What to start: a program, its arguments, extra environment, the account
/// to run it as (`None`: our own), the signal it gets when the appliance
/// dies, and its log file.
#[derive(Debug, Clone)]
pub struct Spec {
    /// A short name for messages and `appliance.json` (`postgres`, `sampler`, ...).
    pub name: &'static str,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables.
    pub env: Vec<(String, OsString)>,
    /// Run as this account (root only), or as ourselves.
    pub run_as: Option<Account>,
    /// Sent when the appliance dies and on a graceful stop.
    pub stop_signal: libc::c_int,
    /// Appended standard output and error.
    pub log: PathBuf,
    /// Working directory.
    pub cwd: PathBuf,
}

/// A started child.
#[derive(Debug)]
pub struct Managed {
    /// Its [`Spec::name`].
    pub name: &'static str,
    /// Its pid.
    pub pid: u32,
    /// Its log file.
    pub log: PathBuf,
    stop_signal: libc::c_int,
    child: Child,
}

fn signal_name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGINT => "INT",
        libc::SIGKILL => "KILL",
        _ => "TERM",
    }
}

/// Starts `spec`.
///
/// # Errors
/// [`ApplianceError::Io`] when the log cannot be opened or the program
/// cannot be started.
pub fn spawn(spec: &Spec) -> Result<Managed, ApplianceError> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .map_err(|e| ApplianceError::io(format!("opening {}", spec.log.display()), e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| ApplianceError::io("duplicating a log handle", e))?;
    let mut cmd = Command::new(setpriv()?);
    if let Some(a) = &spec.run_as {
        cmd.arg(format!("--reuid={}", a.uid))
            .arg(format!("--regid={}", a.gid))
            .arg("--init-groups");
    }
    cmd.arg(format!("--pdeathsig={}", signal_name(spec.stop_signal)))
        .arg("--")
        .arg(&spec.program)
        .args(&spec.args);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("PG")) {
            cmd.env_remove(key);
        }
    }
    cmd.env("LC_ALL", "C");
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    cmd.current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0)
        .kill_on_drop(false);
    let child = cmd.spawn().map_err(|e| {
        ApplianceError::io(
            format!("starting {} ({})", spec.name, spec.program.display()),
            e,
        )
    })?;
    let pid = child.id().ok_or_else(|| {
        ApplianceError::Setup(format!("{} exited before its pid was read", spec.name))
    })?;
    Ok(Managed {
        name: spec.name,
        pid,
        log: spec.log.clone(),
        stop_signal: spec.stop_signal,
        child,
    })
}

impl Managed {
    /// `Some(status)` once the child has exited (reaped), `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends the stop signal and waits up to `bound`; then SIGKILL and a
    /// reap. Returns whether it stopped gracefully within `bound`.
    pub async fn stop(&mut self, bound: Duration) -> bool {
        if self.exited().is_some() {
            return true;
        }
        let _ = sys::send_signal(self.pid, self.stop_signal);
        if tokio::time::timeout(bound, self.child.wait()).await.is_ok() {
            return true;
        }
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        false
    }
}

/// Stops the process `pid` that is not our child (a previous appliance's):
/// the stop signal, up to `bound`, then SIGKILL; waits until it is gone
/// (bounded by `bound` again). Returns whether it was gone within the
/// first bound.
pub async fn stop_foreign(pid: u32, signal: libc::c_int, bound: Duration) -> bool {
    if !sys::process_alive(pid) {
        return true;
    }
    let _ = sys::send_signal(pid, signal);
    if wait_gone(pid, bound).await {
        return true;
    }
    let _ = sys::send_signal(pid, libc::SIGKILL);
    wait_gone(pid, bound).await;
    false
}

/// Waits up to `bound` until `pid` is gone.
pub async fn wait_gone(pid: u32, bound: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + bound;
    while sys::process_alive(pid) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
    true
}

/// The last `lines` lines of `path` (for error messages).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
