//! The provider's side of the supervisor socket: one connection per
//! request, each bounded by [`SOCKET_TIMEOUT`], run on the blocking pool.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use lc_core::page::{SocketRequest, SocketResponse, read_frame, write_frame};

use crate::ProviderError;

/// Bound on connecting to, writing to and reading from a supervisor.
pub(crate) const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);

fn unavailable(e: impl std::fmt::Display) -> ProviderError {
    ProviderError::SupervisorUnavailable {
        detail: e.to_string(),
    }
}

/// Connects to the socket at `path` without following a symlink in its
/// last component: the provider binds the socket itself in a directory
/// only it can write, and a symlink found at that name anyway (an operator's
/// mistake, a state directory from an older provider) must not make the
/// provider talk to whatever it points at. The name
/// is opened `O_PATH | O_NOFOLLOW`, checked to be a socket, and connected
/// through `/proc/self/fd`, so the checked inode is the one connected to.
fn connect_no_follow(path: &std::path::Path) -> std::io::Result<UnixStream> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::FileTypeExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid C string; the returned fd is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if !std::fs::metadata(&via)?.file_type().is_socket() {
        return Err(std::io::Error::other(format!(
            "{} is not a socket",
            path.display()
        )));
    }
    UnixStream::connect(via)
}

/// Sends `req` to the supervisor at `path` and returns its answer.
pub(crate) async fn call(
    path: PathBuf,
    req: SocketRequest,
) -> Result<SocketResponse, ProviderError> {
    call_within(path, req, SOCKET_TIMEOUT).await
}

/// [`call`] with each read and write bounded by `timeout` (not zero).
pub(crate) async fn call_within(
    path: PathBuf,
    req: SocketRequest,
    timeout: Duration,
) -> Result<SocketResponse, ProviderError> {
    let timeout = timeout.max(Duration::from_millis(1));
    tokio::task::spawn_blocking(move || {
        let mut s = connect_no_follow(&path).map_err(unavailable)?;
        s.set_read_timeout(Some(timeout)).map_err(unavailable)?;
        s.set_write_timeout(Some(timeout)).map_err(unavailable)?;
        write_frame(&mut s, &req.encode()).map_err(unavailable)?;
        let body = read_frame(&mut s)
            .map_err(unavailable)?
            .ok_or_else(|| unavailable("the supervisor closed the connection"))?;
        SocketResponse::decode(&body).map_err(unavailable)
    })
    .await
    .map_err(unavailable)?
}
