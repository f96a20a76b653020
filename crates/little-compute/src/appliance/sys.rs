//! The few operating-system calls the appliance needs: who we are, looking
//! up and creating system users, signalling and inspecting processes.
//!
//! Users are looked up and created by the provider's account rules
//! (`lc_provider::account`); nothing here parses `/etc/passwd`.

use std::io;

/// Whether the effective user is root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// An account: its name, uid and primary gid. The provider's account type
/// and rules serve every account the appliance runs something as (the
/// sandboxes', the sampler's, PostgreSQL's): one lookup through the user
/// database (`getpwnam_r`, so NSS sources count) and one way of creating a
/// system account.
pub use lc_provider::account::SandboxAccount as Account;

/// Looks `name` up: `Ok(None)` when there is no such account.
///
/// # Errors
/// A name the account rules refuse, or the user database failing.
pub fn lookup_user(name: &str) -> io::Result<Option<Account>> {
    lc_provider::account::lookup(name).map_err(io::Error::other)
}

/// The account `name`, created as a system user without a home directory
/// and without a login shell when it does not exist yet (root only).
///
/// # Errors
/// Not root and the account is missing; `useradd` fails; the account has
/// uid or gid 0.
pub fn ensure_system_user(name: &str) -> io::Result<Account> {
    lc_provider::account::ensure(name).map_err(io::Error::other)
}

/// Sends `signal` to `pid`; a process that is already gone is not an error.
///
/// # Errors
/// Any `kill(2)` failure other than `ESRCH`.
pub fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return Ok(());
    };
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: kill has no memory-safety preconditions; pid > 0 names one
    // process, never a group.
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

/// Whether a process with this pid exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state letter follows the parenthesised command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// The NUL-separated command line of `pid`, as its arguments.
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_looked_up_and_strangers_are_absent() {
        let root = lookup_user("root").unwrap().unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(lookup_user("no-such-user-little-compute").unwrap(), None);
    }

    #[test]
    fn own_process_is_alive_and_has_a_command_line() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX));
        assert!(!cmdline(std::process::id()).unwrap().is_empty());
        send_signal(u32::MAX, 0).unwrap();
    }
}
