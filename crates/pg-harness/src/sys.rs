//! Thin, safe wrappers over the few libc calls the harness needs.

use std::ffi::CString;
use std::io;
use std::path::Path;

/// Whether the effective user is root.
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Looks `name` up in the user database: `Some((uid, primary gid))`.
pub(crate) fn lookup_user(name: &str) -> io::Result<Option<(u32, u32)>> {
    let cname = CString::new(name).map_err(io::Error::other)?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain old data; all-zero is a valid (if meaningless) value.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the duration of the call and `buf.len()`
    // is the true size of `buf`; getpwnam_r is the thread-safe variant.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok((!result.is_null()).then_some((pwd.pw_uid, pwd.pw_gid)))
}

/// Sends `signal` to `pid`. A process that is already gone is not an error.
pub(crate) fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    };
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

/// Whether a process with this pid exists (zombies included).
pub(crate) fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence and permission.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The NUL-separated command line of `pid`, joined with spaces.
pub(crate) fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        String::from_utf8_lossy(&raw)
            .split('\0')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Reaps `pid` if it is an exited child of ours. `true` once it is gone
/// (reaped now, or not our child / already reaped).
pub(crate) fn try_reap(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    rc != 0
}

/// State of a SysV shared memory segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShmState {
    /// The segment no longer exists.
    Gone,
    /// It exists; this many processes are attached; it has this key.
    Present { key: i32, attached: u64 },
}

/// Looks up a SysV shared memory segment by id.
pub(crate) fn shm_state(shmid: i32) -> ShmState {
    // SAFETY: shmid_ds is plain old data.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT writes into the valid `ds`.
    if unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) } != 0 {
        return ShmState::Gone;
    }
    ShmState::Present {
        key: ds.shm_perm.__key,
        attached: ds.shm_nattch as u64,
    }
}

/// Removes the segment if it still exists with `key` and nobody is attached
/// (this is the "interlock" segment a SIGKILLed postmaster leaves behind).
pub(crate) fn remove_shm_if_unused(key: i32, shmid: i32) {
    if shm_state(shmid) == (ShmState::Present { key, attached: 0 }) {
        // SAFETY: IPC_RMID takes no buffer.
        unsafe {
            libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

/// Changes the owner of `path` to `uid:gid`.
pub(crate) fn chown(path: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
}

/// What `postmaster.pid` (in the data directory) says about a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PostmasterPid {
    /// The postmaster's pid (first line).
    pub pid: u32,
    /// `(key, shmid)` of the SysV interlock segment (seventh line), once written.
    pub shm: Option<(i32, i32)>,
}

impl PostmasterPid {
    /// Reads `<data_dir>/postmaster.pid`; `None` if absent or unreadable.
    pub(crate) fn read(data_dir: &Path) -> Option<Self> {
        Self::parse(&std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?)
    }

    /// Parses the file's text.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let lines: Vec<&str> = text.lines().collect();
        let pid = lines.first()?.trim().parse().ok()?;
        let shm = lines.get(6).and_then(|line| {
            let mut parts = line.split_whitespace();
            // Written with %9lu: the key_t / int values as unsigned longs.
            let key: u64 = parts.next()?.parse().ok()?;
            let id: u64 = parts.next()?.parse().ok()?;
            Some((key as i32, i32::try_from(id).ok()?))
        });
        Some(Self { pid, shm })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postmaster_pid_file_parses() {
        let text = "4242\n/tmp/tollgate-pg-1-0/data\n1764455000\n54321\n/tmp/tollgate-pg-1-0\n\
                    127.0.0.1\n 54321001     32770\nready   \n";
        assert_eq!(
            PostmasterPid::parse(text),
            Some(PostmasterPid {
                pid: 4242,
                shm: Some((54_321_001, 32_770)),
            })
        );
        assert_eq!(
            PostmasterPid::parse("4243\n/data\n"),
            Some(PostmasterPid {
                pid: 4243,
                shm: None
            })
        );
        assert_eq!(PostmasterPid::parse(""), None);
    }

    #[test]
    fn own_process_exists_and_cmdline_is_readable() {
        assert!(process_exists(std::process::id()));
        assert!(!process_exists(u32::MAX));
        let own = cmdline(std::process::id()).unwrap();
        assert!(own.contains("tollgate_pg_harness"), "{own}");
    }

    #[test]
    fn users_are_looked_up() {
        assert_eq!(lookup_user("root").unwrap(), Some((0, 0)));
        assert_eq!(lookup_user("no-such-user-tollgate").unwrap(), None);
    }
}
