//! Temp directories, the at-exit registry and the stale-directory sweep.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use crate::HarnessError;
use crate::launcher::RunAs;
use crate::sys::{self, PostmasterPid};

/// Prefix of every harness temp directory: `tollgate-pg-<pid>-<n>`, where
/// `<pid>` is the test process that owns it.
pub const DIR_PREFIX: &str = "tollgate-pg-";

/// Environment variable overriding where harness temp directories are made
/// (default: [`std::env::temp_dir`]). When running as root it must be
/// traversable by the unprivileged PostgreSQL account.
pub const TMPDIR_ENV: &str = "TOLLGATE_PG_TMPDIR";

/// How long the at-exit hook and `Drop` give a postmaster to finish an
/// immediate shutdown (SIGQUIT) before SIGKILLing it.
const QUIT_GRACE: Duration = Duration::from_secs(5);

/// The directory in which harness temp directories are created.
pub fn base_dir() -> PathBuf {
    std::env::var_os(TMPDIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// Creates a fresh `tollgate-pg-<pid>-<n>` directory (mode 0700, owned by
/// the server account). The first call in a process also runs
/// [`sweep_stale_dirs`].
pub(crate) fn create_instance_dir(run_as: &RunAs) -> Result<PathBuf, HarnessError> {
    static SWEEP: Once = Once::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    SWEEP.call_once(|| {
        sweep_stale_dirs();
    });
    let base = base_dir();
    let pid = std::process::id();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("{DIR_PREFIX}{pid}-{n}"));
        match fs::create_dir(&dir) {
            Ok(()) => {
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))
                    .map_err(|e| HarnessError::io(format!("chmod {}", dir.display()), e))?;
                if let Err(err) = run_as.chown(&dir) {
                    let _ = fs::remove_dir(&dir);
                    return Err(err);
                }
                return Ok(dir);
            }
            // Left behind by an earlier process with our (reused) pid.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100_000 => continue,
            Err(e) => return Err(HarnessError::io(format!("creating {}", dir.display()), e)),
        }
    }
}

/// `tollgate-pg-<pid>-<n>` → `(pid, n)`.
fn parse_instance_name(name: &str) -> Option<(u32, u64)> {
    let (pid, n) = name.strip_prefix(DIR_PREFIX)?.split_once('-')?;
    Some((pid.parse().ok()?, n.parse().ok()?))
}

/// Removes harness temp directories in [`base_dir`] whose owning process is
/// gone (left by a test binary that was SIGKILLed), first SIGKILLing any
/// postmaster still running from one and removing the SysV shared-memory
/// interlock segment a killed postmaster leaves behind. Directories of live
/// processes, including this one, are left alone.
///
/// Runs automatically once per process before the first server starts;
/// returns how many directories were removed.
pub fn sweep_stale_dirs() -> usize {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir(base_dir()) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(Result::ok) {
        let Some((owner, _)) = entry.file_name().to_str().and_then(parse_instance_name) else {
            continue;
        };
        if owner == me || sys::process_exists(owner) {
            continue;
        }
        let path = entry.path();
        remove_instance_dir(&path);
        if !path.exists() {
            removed += 1;
        }
    }
    removed
}

/// Deletes an instance directory whose server should no longer run: kills a
/// postmaster that still runs from it, frees its orphaned shared memory
/// interlock, then removes the directory tree. Best effort; never panics.
pub(crate) fn remove_instance_dir(dir: &Path) {
    let data_dir = dir.join("data");
    if let Some(pm) = PostmasterPid::read(&data_dir) {
        let ours =
            sys::cmdline(pm.pid).is_some_and(|cmd| cmd.contains(&*data_dir.to_string_lossy()));
        if ours {
            let _ = sys::send_signal(pm.pid, libc::SIGKILL);
            let deadline = Instant::now() + QUIT_GRACE;
            loop {
                // Reaps it if it is our child; otherwise init reaps it.
                sys::try_reap(pm.pid);
                if !sys::process_exists(pm.pid) || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some((key, shmid)) = pm.shm {
            // Orphaned backends detach within moments of postmaster death.
            let deadline = Instant::now() + QUIT_GRACE;
            while matches!(sys::shm_state(shmid), sys::ShmState::Present { key: k, attached } if k == key && attached > 0)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            sys::remove_shm_if_unused(key, shmid);
        }
    }
    let _ = fs::remove_dir_all(dir);
}

/// A server directory (and postmaster, while one runs) to clean up at exit.
struct Registered {
    dir: PathBuf,
    postmaster: Option<u32>,
}

static REGISTRY: Mutex<BTreeMap<u64, Registered>> = Mutex::new(BTreeMap::new());

/// Registers `dir` for removal at process exit; returns a handle for
/// [`set_postmaster`] and [`unregister`]. Installs the at-exit hook once.
pub(crate) fn register(dir: PathBuf) -> u64 {
    static HOOK: Once = Once::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    HOOK.call_once(|| {
        // SAFETY: `cleanup_at_exit` is an `extern "C" fn()` that never unwinds.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    });
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    lock_registry().insert(
        id,
        Registered {
            dir,
            postmaster: None,
        },
    );
    id
}

/// Records the pid of the postmaster now running for `id` (or `None`).
pub(crate) fn set_postmaster(id: u64, pid: Option<u32>) {
    if let Some(entry) = lock_registry().get_mut(&id) {
        entry.postmaster = pid;
    }
}

/// Forgets `id` (its owner cleaned up itself).
pub(crate) fn unregister(id: u64) {
    lock_registry().remove(&id);
}

fn lock_registry() -> std::sync::MutexGuard<'static, BTreeMap<u64, Registered>> {
    REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs from `exit()`, i.e. when the test harness's `main` returns or calls
/// `process::exit`: statics are never dropped, so this is where the shared
/// cluster (and any leaked dedicated server) is shut down and its directory
/// removed.
extern "C" fn cleanup_at_exit() {
    let _ = std::panic::catch_unwind(cleanup_registered);
}

fn cleanup_registered() {
    // Never block at exit: if another thread holds the lock, give up; the
    // pdeathsig still kills the servers and the next sweep removes the dirs.
    let entries = {
        let mut guard = match REGISTRY.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        std::mem::take(&mut *guard)
    };
    // Immediate shutdown: the postmaster stops its children and removes its
    // shared memory, then exits. Signal all first, then wait for all.
    for entry in entries.values() {
        if let Some(pid) = entry.postmaster {
            let _ = sys::send_signal(pid, libc::SIGQUIT);
        }
    }
    let deadline = Instant::now() + QUIT_GRACE;
    for entry in entries.values() {
        if let Some(pid) = entry.postmaster {
            while !sys::try_reap(pid) {
                if Instant::now() >= deadline {
                    let _ = sys::send_signal(pid, libc::SIGKILL);
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    for entry in entries.values() {
        remove_instance_dir(&entry.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names_parse() {
        assert_eq!(parse_instance_name("tollgate-pg-123-4"), Some((123, 4)));
        assert_eq!(parse_instance_name("tollgate-pg-123"), None);
        assert_eq!(parse_instance_name("tollgate-pg-unit-1-x"), None);
        assert_eq!(parse_instance_name("other-123-4"), None);
    }

    #[test]
    fn sweep_removes_dirs_of_dead_processes_only() {
        let base = base_dir();
        // A pid that cannot exist (above the kernel's pid_max limit of 2^22).
        let dead = base.join(format!("{DIR_PREFIX}{}-7", 5_000_000));
        let mine = base.join(format!("{DIR_PREFIX}{}-999999", std::process::id()));
        fs::create_dir_all(dead.join("data")).unwrap();
        fs::write(dead.join("server.log"), "x").unwrap();
        fs::create_dir_all(&mine).unwrap();
        assert!(sweep_stale_dirs() >= 1);
        assert!(!dead.exists());
        assert!(mine.exists());
        fs::remove_dir_all(&mine).unwrap();
    }
}
