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

/// Sends `req` to the supervisor at `path` and returns its answer.
pub(crate) async fn call(
    path: PathBuf,
    req: SocketRequest,
) -> Result<SocketResponse, ProviderError> {
    tokio::task::spawn_blocking(move || {
        let mut s = UnixStream::connect(&path).map_err(unavailable)?;
        s.set_read_timeout(Some(SOCKET_TIMEOUT))
            .map_err(unavailable)?;
        s.set_write_timeout(Some(SOCKET_TIMEOUT))
            .map_err(unavailable)?;
        write_frame(&mut s, &req.encode()).map_err(unavailable)?;
        let body = read_frame(&mut s)
            .map_err(unavailable)?
            .ok_or_else(|| unavailable("the supervisor closed the connection"))?;
        SocketResponse::decode(&body).map_err(unavailable)
    })
    .await
    .map_err(unavailable)?
}
