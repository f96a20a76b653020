//! The network of a network shape: its own network namespace, given
//! outbound-only NAT by `slirp4netns`.
//!
//! Bubblewrap unshares the network namespace of every instance. For a
//! network shape it also reports the sandbox's pid and namespaces on an
//! info descriptor (`--info-fd`) and waits, after its setup and before it
//! executes the supervisor, until a byte arrives on a block descriptor
//! (`--block-fd`). Meanwhile the provider opens the sandbox's network
//! namespace (checked to be the one bubblewrap reported) and its owning
//! user namespace, and starts `slirp4netns` against them: in the
//! instance's cgroups with its rlimits, as the sandbox account, with
//! `no_new_privs`, its seccomp filter, and a private mount namespace whose
//! `/dev/net` holds only a `tun` node of its own (the host's may be root's
//! `0600`). Once it reports the network configured (`--ready-fd`) the
//! sandbox is released. It ends when the instance does: the provider kills
//! it when bubblewrap exits, it exits by itself when the provider dies (its
//! `--exit-fd` is a pipe only the provider writes), and destroy kills it
//! with the rest of the instance's cgroups.
//!
//! Inside, the sandbox has `lo` and `tap0` (`10.0.2.100/24`, gateway
//! `10.0.2.2`, DNS forwarder `10.0.2.3`) and nothing else.
//! `--disable-host-loopback` makes connections to the gateway (the host's
//! loopback, in slirp's terms) fail with "Network is unreachable"; the
//! sandbox's own `127.0.0.1` is its own loopback. Every other connection
//! is made by slirp4netns from the host's network namespace, as the
//! sandbox account: whatever the host itself can reach, its own addresses
//! other than loopback included. Nothing can connect in.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// The interface slirp4netns creates in the sandbox.
pub const TAP_NAME: &str = "tap0";

/// The MTU of `tap0`: slirp4netns's largest, the fastest.
pub const MTU: u32 = 65520;

/// The most bytes of bubblewrap's info accepted: it is a few hundred.
const INFO_BYTES_MAX: usize = 64 * 1024;

/// `ioctl` on a namespace descriptor that opens its owning user namespace
/// (`NS_GET_USERNS`, `_IO(0xb7, 0x1)`).
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// A pipe, both ends close-on-exec: (read end, write end).
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Waits until `fd` is readable or `deadline` passes.
fn wait_readable(fd: &OwnedFd, deadline: Instant, what: &str) -> Result<(), String> {
    // Each pass waits at most until the deadline; EINTR retries.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("{what}: nothing within the start bound"));
        }
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `p` is one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc > 0 {
            return Ok(());
        }
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("{what}: poll: {e}"));
            }
        }
    }
}

/// Reads once from `fd` into `buf` (EINTR retried).
fn read_some(fd: &OwnedFd, buf: &mut [u8], what: &str) -> Result<usize, String> {
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(format!("{what}: {e}"));
        }
    }
}

/// The sandbox's pid and network namespace inode, from bubblewrap's info
/// (`{"child-pid": N, "net-namespace": I, ...}`), read from `info` until it
/// is one whole JSON object, by `deadline`.
pub(crate) fn read_info(info: &OwnedFd, deadline: Instant) -> Result<(i32, u64), String> {
    #[derive(serde::Deserialize)]
    struct Info {
        #[serde(rename = "child-pid")]
        child_pid: i32,
        #[serde(rename = "net-namespace")]
        net_namespace: u64,
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // Each pass reads at least one byte or ends: bounded by INFO_BYTES_MAX.
    loop {
        wait_readable(info, deadline, "bubblewrap's info")?;
        let n = read_some(info, &mut buf, "bubblewrap's info")?;
        if n == 0 {
            return Err("bubblewrap ended before it reported the sandbox".into());
        }
        got.extend_from_slice(&buf[..n]);
        if let Ok(i) = serde_json::from_slice::<Info>(&got) {
            return Ok((i.child_pid, i.net_namespace));
        }
        if got.len() > INFO_BYTES_MAX {
            return Err(format!(
                "bubblewrap's info is over {INFO_BYTES_MAX} bytes and not the expected JSON"
            ));
        }
    }
}

/// Opens the network namespace of `pid`, refusing one whose inode is not
/// `net_ino` (the pid was reused), and its owning user namespace:
/// (network namespace, user namespace), both close-on-exec.
pub(crate) fn open_namespaces(pid: i32, net_ino: u64) -> Result<(OwnedFd, OwnedFd), String> {
    use std::os::unix::fs::MetadataExt as _;
    let path = format!("/proc/{pid}/ns/net");
    let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let ino = file.metadata().map_err(|e| format!("{path}: {e}"))?.ino();
    let net = OwnedFd::from(file);
    if ino != net_ino {
        return Err(format!(
            "{path} is namespace {ino}, bubblewrap reported {net_ino}: the sandbox is gone"
        ));
    }
    // SAFETY: ioctl NS_GET_USERNS takes no argument and returns a new
    // close-on-exec descriptor.
    let user = unsafe { libc::ioctl(net.as_raw_fd(), NS_GET_USERNS as _) };
    if user < 0 {
        return Err(format!(
            "{path}: its user namespace: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `user` was just opened and is owned by nothing else.
    Ok((net, unsafe { OwnedFd::from_raw_fd(user) }))
}

/// The arguments of slirp4netns for the namespaces open in it as `net_fd`
/// and `user_fd`, reporting on `ready_fd`, ending when `exit_fd` closes.
pub(crate) fn args(net_fd: RawFd, user_fd: RawFd, ready_fd: RawFd, exit_fd: RawFd) -> Vec<String> {
    vec![
        "--configure".into(),
        format!("--mtu={MTU}"),
        "--disable-host-loopback".into(),
        "--enable-seccomp".into(),
        format!("--ready-fd={ready_fd}"),
        format!("--exit-fd={exit_fd}"),
        "--netns-type=path".into(),
        format!("--userns-path=/proc/self/fd/{user_fd}"),
        format!("/proc/self/fd/{net_fd}"),
        TAP_NAME.into(),
    ]
}

/// Gives the calling process (root, between fork and exec of
/// slirp4netns) a private mount namespace whose `/dev/net` is a tmpfs
/// holding only a `tun` node (`10:200`) owned by `uid:gid`, mode `0600`.
/// Async-signal-safe: system calls on static strings only.
pub(crate) fn private_tun(uid: u32, gid: u32) -> std::io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc != 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: every call takes static C strings or plain integers.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"tmpfs".as_ptr(),
            c"/dev/net".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            c"mode=0755,size=4k".as_ptr().cast(),
        ))?;
        check(libc::mknod(
            c"/dev/net/tun".as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(10, 200),
        ))?;
        check(libc::chown(c"/dev/net/tun".as_ptr(), uid, gid))?;
    }
    Ok(())
}

/// Waits (by `deadline`) until slirp4netns writes its ready byte on `ready`.
pub(crate) fn wait_ready(ready: &OwnedFd, deadline: Instant) -> Result<(), String> {
    wait_readable(ready, deadline, "slirp4netns")?;
    let mut b = [0u8; 1];
    match read_some(ready, &mut b, "slirp4netns")? {
        0 => Err("slirp4netns ended before the network was up".into()),
        _ => Ok(()),
    }
}

/// Releases a sandbox bubblewrap holds at `--block-fd`.
pub(crate) fn release(block: OwnedFd) -> Result<(), String> {
    // SAFETY: writes one byte from a static buffer.
    let n = unsafe { libc::write(block.as_raw_fd(), b"1".as_ptr().cast(), 1) };
    if n != 1 {
        return Err(format!(
            "releasing the sandbox: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// How long the provider waits for a killed slirp4netns to exit before it
/// stops waiting (the cgroup kill of destroy remains).
pub(crate) const KILL_WAIT_MAX: Duration = Duration::from_secs(5);
