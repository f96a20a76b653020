//! The `tollgate` binary; see [`tollgate_server::cli`].

#![forbid(unsafe_code)]

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    tollgate_server::cli::main().await
}
