//! The host identity every sandbox runs as.
//!
//! The provider runs as root (it writes cgroups and signs with a key only
//! root reads); nothing of a sandbox does. Each instance's bubblewrap is
//! started as one unprivileged system account, `lc-sandbox` by default
//! ([`SANDBOX_USER_DEFAULT`]): between fork and exec the child joins the
//! instance's cgroups and sets its rlimits while still root, then drops
//! every supplementary group, sets its gid and uid to the account's and
//! sets `no_new_privs` (`drop_to`). bubblewrap then builds the user
//! namespace itself, unprivileged, so uid and gid 1000 inside map to the
//! account's uid and gid on the host, never to root: a file the sandbox
//! writes into its workspace is owned by the account, and every host path
//! bound into the sandbox is accessed with the account's credentials, so a
//! root-owned `0600` file (the provider's key) stays unreadable even if it
//! were bound. A process that escaped every namespace would be that
//! account: no capability, no group, no access to the provider's state
//! beyond what the provider gave it (see [`crate::bwrap`] for the modes).
//!
//! The account is looked up with `getpwnam_r` (so every NSS source
//! counts) and, when it is missing and the provider is root, created with
//! `useradd --system --no-create-home --home-dir /nonexistent --shell
//! /usr/sbin/nologin`. An account with uid or gid 0 is refused.

use std::ffi::{CStr, CString};
use std::sync::Mutex;
use std::time::Duration;

use crate::ProviderError;

/// The default sandbox account.
pub const SANDBOX_USER_DEFAULT: &str = "lc-sandbox";

/// The longest account name (`useradd`'s limit on Debian).
pub const USER_NAME_BYTES_MAX: usize = 32;

/// The largest buffer offered to `getpwnam_r`: a passwd entry is a few
/// hundred bytes; 1 MiB covers any NSS source while bounding the doubling.
const PASSWD_BUF_BYTES_MAX: usize = 1 << 20;

/// Attempts at creating a missing account: a concurrent `useradd` (another
/// provider starting) holds the passwd lock for a moment; three attempts
/// a [`USERADD_RETRY_PAUSE`] apart outlast it.
const USERADD_ATTEMPTS_MAX: u32 = 3;

/// The pause between two attempts at creating the account.
const USERADD_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Serializes account creation within this process.
static CREATING: Mutex<()> = Mutex::new(());

/// A host account: its name, uid and primary gid. One that [`ensure`] returns
/// is unprivileged (uid and gid never 0); [`lookup`] reports any account
/// as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxAccount {
    /// The login name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

fn io(what: impl std::fmt::Display, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::io(what, e)
}

/// Checks `name` is a portable account name: `[a-z_][a-z0-9_-]*`, at most
/// [`USER_NAME_BYTES_MAX`] bytes.
///
/// # Errors
/// [`ProviderError::Io`] naming the rule.
pub fn check_name(name: &str) -> Result<(), ProviderError> {
    let b = name.as_bytes();
    let first_ok = b
        .first()
        .is_some_and(|c| c.is_ascii_lowercase() || *c == b'_');
    let rest_ok = b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-');
    if !first_ok || !rest_ok || b.len() > USER_NAME_BYTES_MAX {
        return Err(io(
            format!("sandbox user {name:?}"),
            format!("want [a-z_][a-z0-9_-]*, at most {USER_NAME_BYTES_MAX} bytes"),
        ));
    }
    Ok(())
}

/// Looks `name` up: `Ok(None)` when there is no such account.
///
/// # Errors
/// [`ProviderError::Io`] for a bad name or a failing user database.
pub fn lookup(name: &str) -> Result<Option<SandboxAccount>, ProviderError> {
    check_name(name)?;
    let c = CString::new(name).map_err(|e| io(format!("sandbox user {name:?}"), e))?;
    let mut len = 4096usize;
    loop {
        let mut buf = vec![0 as libc::c_char; len];
        // SAFETY: passwd is plain data; getpwnam_r fills it with pointers
        // into `buf`, which outlives every read below.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe {
            libc::getpwnam_r(
                c.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && len < PASSWD_BUF_BYTES_MAX {
            len *= 2;
            continue;
        }
        if result.is_null() {
            // No entry is rc 0 (or one of these, by NSS module).
            return match rc {
                0 | libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => Ok(None),
                e => Err(io(
                    format!("looking up user {name:?}"),
                    std::io::Error::from_raw_os_error(e),
                )),
            };
        }
        // SAFETY: a non-null result points at `pwd`, whose name is a C
        // string in `buf`.
        let found = unsafe { CStr::from_ptr(pwd.pw_name) };
        if found.to_bytes() != name.as_bytes() {
            return Err(io(
                format!("looking up user {name:?}"),
                "the user database answered another name",
            ));
        }
        return Ok(Some(SandboxAccount {
            name: name.to_owned(),
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        }));
    }
}

/// The account `name`, created as a system account (no home, no login
/// shell) when it is missing and the caller is root; see the module docs.
///
/// # Errors
/// [`ProviderError::Io`]: a bad name, not root and the account missing,
/// `useradd` failing, or an account with uid or gid 0.
pub fn ensure(name: &str) -> Result<SandboxAccount, ProviderError> {
    let account = match lookup(name)? {
        Some(a) => a,
        None => create(name)?,
    };
    if account.uid == 0 || account.gid == 0 {
        return Err(io(
            format!("sandbox user {name:?}"),
            format!(
                "has uid {} gid {}: a sandbox never runs as root or group root",
                account.uid, account.gid
            ),
        ));
    }
    Ok(account)
}

fn create(name: &str) -> Result<SandboxAccount, ProviderError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(io(
            format!("sandbox user {name:?}"),
            "no such account, and only root can create it",
        ));
    }
    let _one = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    let mut last = String::new();
    for attempt in 0..USERADD_ATTEMPTS_MAX {
        if let Some(a) = lookup(name)? {
            return Ok(a);
        }
        if attempt > 0 {
            std::thread::sleep(USERADD_RETRY_PAUSE);
        }
        let out = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(name)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| io(format!("useradd {name}"), e))?;
        if out.status.success() {
            return lookup(name)?.ok_or_else(|| {
                io(
                    format!("useradd {name}"),
                    "succeeded but the account is missing",
                )
            });
        }
        last = format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    // Another process may have created it meanwhile.
    lookup(name)?.ok_or_else(|| io(format!("useradd {name}"), last))
}

/// Drops the calling process to `uid` and `gid` for good: no supplementary
/// group, real, effective and saved ids all the account's, and
/// `no_new_privs` (no set-id binary or file capability raises it again).
/// Checks the result. Async-signal-safe (system calls only, no
/// allocation): meant for a child between fork and exec, after the steps
/// that need root.
///
/// # Errors
/// The OS error of the step that failed; `EPERM` when an id did not
/// change.
pub(crate) fn drop_to(uid: u32, gid: u32) -> std::io::Result<()> {
    let fail = || Err(std::io::Error::last_os_error());
    // SAFETY: plain system calls on integers and out-pointers to locals.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return fail();
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return fail();
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return fail();
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return fail();
        }
        let (mut r, mut e, mut s) = (0, 0, 0);
        let (mut rg, mut eg, mut sg) = (0, 0, 0);
        if libc::getresuid(&mut r, &mut e, &mut s) != 0
            || libc::getresgid(&mut rg, &mut eg, &mut sg) != 0
        {
            return fail();
        }
        let groups = libc::getgroups(0, std::ptr::null_mut());
        if [r, e, s] != [uid; 3] || [rg, eg, sg] != [gid; 3] || groups != 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["lc-sandbox", "_x", "a", "a1_-", &"a".repeat(32)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1a", "-a", "A", "a.b", "a b", "a\0", &"a".repeat(33)] {
            assert_eq!(check_name(bad).unwrap_err().code(), "provider_io", "{bad}");
        }
    }

    #[test]
    fn root_is_found_and_refused_and_a_missing_name_is_none() {
        assert_eq!(
            lookup("root").unwrap(),
            Some(SandboxAccount {
                name: "root".into(),
                uid: 0,
                gid: 0
            })
        );
        assert_eq!(
            ensure("root").unwrap_err().to_string(),
            "provider state: sandbox user \"root\": has uid 0 gid 0: a sandbox never runs as root or group root"
        );
        assert_eq!(lookup("lc-no-such-user-x").unwrap(), None);
    }
}
