//! Spawning server processes: as whom, and from which thread.
//!
//! Every long-lived child (initdb, postmaster) is forked by one dedicated,
//! never-ending thread and carries `PR_SET_PDEATHSIG = SIGKILL`; see the
//! crate documentation for why.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;

use crate::{HarnessError, sys};

/// Environment variable naming the unprivileged account that runs PostgreSQL
/// when the tests run as root (default [`DEFAULT_PG_USER`]).
pub const PG_USER_ENV: &str = "TOLLGATE_PG_USER";

/// The account that runs `initdb`/`postgres` when the tests run as root.
pub const DEFAULT_PG_USER: &str = "postgres";

/// Hands variables to a program across `setpriv` (coreutils, an essential
/// package on Debian); see [`RunAs::command_with_env`].
const ENV_PROGRAM: &str = "/usr/bin/env";

/// Places `setpriv` is looked for when running as root.
const SETPRIV_CANDIDATES: [&str; 3] = ["/usr/bin/setpriv", "/bin/setpriv", "/usr/sbin/setpriv"];

/// Who runs the server processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunAs {
    /// We are not root: run the binaries directly.
    CurrentUser,
    /// We are root: run them through `setpriv` as this account.
    Unprivileged {
        user: String,
        uid: u32,
        gid: u32,
        setpriv: PathBuf,
    },
}

impl RunAs {
    /// Decides from the effective uid.
    pub(crate) fn detect() -> Result<Self, HarnessError> {
        if !sys::is_root() {
            return Ok(Self::CurrentUser);
        }
        let user = std::env::var(PG_USER_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_PG_USER.to_owned());
        let (uid, gid) = sys::lookup_user(&user)
            .map_err(|e| HarnessError::io(format!("looking up user {user:?}"), e))?
            .ok_or_else(|| HarnessError::Privileges {
                detail: format!(
                    "running as root, and initdb refuses root, but there is no user {user:?} \
                     (install postgresql-common, or set {PG_USER_ENV})"
                ),
            })?;
        if uid == 0 {
            return Err(HarnessError::Privileges {
                detail: format!("user {user:?} has uid 0"),
            });
        }
        let setpriv = SETPRIV_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| HarnessError::Privileges {
                detail: format!(
                    "running as root but setpriv (util-linux) is not in any of {SETPRIV_CANDIDATES:?}"
                ),
            })?;
        Ok(Self::Unprivileged {
            user,
            uid,
            gid,
            setpriv,
        })
    }

    /// A command that runs `program` as the right user, with a scrubbed
    /// environment, a parent-death signal and `cwd` as working directory.
    pub(crate) fn command(&self, program: &Path, cwd: &Path) -> Command {
        self.command_with_env(program, cwd, &[])
    }

    /// As [`command`](Self::command), with `env` added to the environment
    /// of `program` only. When running as root the variables are *not* set
    /// on `setpriv` (an `LD_PRELOAD` would load into root's `setpriv` too):
    /// `setpriv ... -- /usr/bin/env K=V... program` hands them over after
    /// the uid switch, and `env` execs `program` in the same process, so
    /// the child's pid is still `program`'s.
    pub(crate) fn command_with_env(
        &self,
        program: &Path,
        cwd: &Path,
        env: &[(&str, OsString)],
    ) -> Command {
        let mut cmd = match self {
            Self::CurrentUser => {
                let mut cmd = Command::new(program);
                cmd.envs(env.iter().map(|(k, v)| (k, v)));
                cmd
            }
            Self::Unprivileged {
                user, gid, setpriv, ..
            } => {
                let mut cmd = Command::new(setpriv);
                // setpriv applies --pdeathsig *after* switching uid; a
                // pdeathsig set before the switch is cleared by the kernel on
                // the credential change. setpriv then execs (no fork), so the
                // postmaster's pid is the child's pid.
                cmd.arg(format!("--reuid={user}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--init-groups")
                    .arg("--pdeathsig=KILL")
                    .arg("--");
                if !env.is_empty() {
                    cmd.arg(ENV_PROGRAM);
                    for (key, value) in env {
                        let mut assignment = OsString::from(key);
                        assignment.push("=");
                        assignment.push(value);
                        cmd.arg(assignment);
                    }
                }
                cmd.arg(program);
                cmd
            }
        };
        scrub_env(&mut cmd);
        cmd.current_dir(cwd);
        let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
        // SAFETY: the closure only makes async-signal-safe system calls and
        // allocates nothing (the error is built from a raw errno).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // If we died between fork and prctl, nobody would kill us.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        cmd
    }

    /// Gives `path` to the account that runs the server (no-op when not root).
    pub(crate) fn chown(&self, path: &Path) -> Result<(), HarnessError> {
        match self {
            Self::CurrentUser => Ok(()),
            Self::Unprivileged { uid, gid, user, .. } => sys::chown(path, *uid, *gid)
                .map_err(|e| HarnessError::io(format!("chown {} to {user}", path.display()), e)),
        }
    }
}

/// Removes `PG*` variables (PGDATA, PGPORT, PGHOST, …) that would otherwise
/// steer initdb/pg_isready, and `FAKETIME*` variables (a `FAKETIME` takes
/// precedence over a fake clock's offset file), and forces C messages, which
/// the harness parses.
pub(crate) fn scrub_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        if key
            .to_str()
            .is_some_and(|k| k.starts_with("PG") || k.starts_with("FAKETIME"))
        {
            cmd.env_remove(key);
        }
    }
    cmd.env("LC_ALL", "C");
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The launcher thread's queue. The sender lives in a static, so the
/// thread's receive loop never ends and the thread lives as long as the
/// process.
fn launcher() -> &'static mpsc::Sender<Job> {
    static LAUNCHER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    LAUNCHER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("tollgate-pg-launcher".into())
            .spawn(move || {
                for job in rx {
                    // A panicking job must not end this thread: its death
                    // would SIGKILL every server it ever started.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .expect("tollgate-pg-harness: cannot spawn the launcher thread");
        tx
    })
}

/// Spawns `cmd` from the launcher thread and hands the child back.
pub(crate) fn spawn(mut cmd: Command) -> io::Result<Child> {
    let (reply_tx, reply_rx) = mpsc::sync_channel(1);
    launcher()
        .send(Box::new(move || {
            let _ = reply_tx.send(cmd.spawn());
        }))
        .map_err(|_| io::Error::other("tollgate-pg launcher thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("tollgate-pg launcher thread dropped the request"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    #[test]
    fn children_run_in_cwd_with_c_locale_as_our_children() {
        // /proc/<pid>/status has no pdeathsig field; the integration test
        // `killed_test_binary_leaves_no_postgres` checks that part.
        let run_as = RunAs::CurrentUser;
        let cwd = std::env::temp_dir().canonicalize().unwrap();
        let mut cmd = run_as.command(Path::new("/bin/sh"), &cwd);
        cmd.args(["-c", "pwd; echo $LC_ALL; echo $PPID"])
            .stdout(Stdio::piped());
        let child = spawn(cmd).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{}\nC\n{}\n", cwd.display(), std::process::id())
        );
    }

    #[test]
    fn extra_env_reaches_the_program_only() {
        let env = [
            ("LD_PRELOAD", OsString::from("/lib/f.so")),
            ("A", "1".into()),
        ];
        let root = RunAs::Unprivileged {
            user: "postgres".into(),
            uid: 101,
            gid: 102,
            setpriv: PathBuf::from("/usr/bin/setpriv"),
        };
        let cmd = root.command_with_env(Path::new("/pg/bin/postgres"), Path::new("/"), &env);
        assert_eq!(cmd.get_program(), "/usr/bin/setpriv");
        let args: Vec<&std::ffi::OsStr> = cmd.get_args().collect();
        assert_eq!(
            args,
            [
                "--reuid=postgres",
                "--regid=102",
                "--init-groups",
                "--pdeathsig=KILL",
                "--",
                "/usr/bin/env",
                "LD_PRELOAD=/lib/f.so",
                "A=1",
                "/pg/bin/postgres",
            ]
        );
        assert!(!cmd.get_envs().any(|(k, _)| k == "LD_PRELOAD"));
        let plain = root.command(Path::new("/pg/bin/postgres"), Path::new("/"));
        let args: Vec<&std::ffi::OsStr> = plain.get_args().collect();
        assert_eq!(args[4..], ["--", "/pg/bin/postgres"]);

        let me = RunAs::CurrentUser;
        let cmd = me.command_with_env(Path::new("/pg/bin/postgres"), Path::new("/"), &env);
        assert_eq!(cmd.get_program(), "/pg/bin/postgres");
        assert_eq!(cmd.get_args().count(), 0);
        let preload = cmd.get_envs().find(|(k, _)| *k == "LD_PRELOAD");
        assert_eq!(
            preload,
            Some(("LD_PRELOAD".as_ref(), Some("/lib/f.so".as_ref())))
        );
    }

    #[test]
    fn launcher_thread_is_shared_and_named() {
        let a = launcher() as *const _;
        let b = launcher() as *const _;
        assert_eq!(a, b);
        let (tx, rx) = mpsc::channel();
        launcher()
            .send(Box::new(move || {
                tx.send(thread::current().name().map(str::to_owned))
                    .unwrap();
            }))
            .unwrap();
        assert_eq!(rx.recv().unwrap().as_deref(), Some("tollgate-pg-launcher"));
    }
}
