//! `lc`: the Little Compute client (see [`client`]).

#![forbid(unsafe_code)]

#[path = "../client/mod.rs"]
mod client;

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    let cli = client::args::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(client::run(cli))
}
