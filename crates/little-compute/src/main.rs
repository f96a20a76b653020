//! The `little-compute` binary: serve, provider, worker, gateway, appliance.
//!
//! ```text
//! little-compute serve     --listen ADDR --admin-token-file F --secret-file F   # control plane
//! little-compute provider  --state-dir D --listen ADDR --id ID --runtime-dir R  # one per host
//! little-compute worker    --provider-url URL...                                # the reconciler
//! little-compute gateway   --blob-dir DIR --secret-file F                       # owns running execs, moves output
//! little-compute appliance up|down|status --data-dir DIR                        # all on one host
//! ```
//!
//! The database URL of `serve`, `worker` and `gateway` comes from
//! `--database-url` or `LC_DATABASE_URL` (prefer the variable: a command
//! line is visible to every local user). Logs go to stderr at the level of `LC_LOG` (default
//! `info`). Exit status: 0 after a clean shutdown, 2 for bad arguments, 1
//! for any other failure.

mod appliance;
mod gateway;
mod ports;
mod provider;
mod retry;
mod serve;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "little-compute",
    version,
    about = "Little Compute: a self-hosted sandbox control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The control plane's HTTP API.
    Serve(serve::ServeArgs),
    /// A provider: runs sandbox instances on this host.
    Provider(provider::ProviderArgs),
    /// The reconciler: allocates, renews, destroys and proves releases.
    Worker(worker::WorkerArgs),
    /// The exec gateway: owns running execs, moves their output into the
    /// sink exactly once, cancels and releases them.
    Gateway(gateway::GatewayArgs),
    /// The whole service on one host.
    #[command(subcommand)]
    Appliance(ApplianceCommand),
}

#[derive(Debug, Subcommand)]
enum ApplianceCommand {
    /// Create or reuse DIR and run everything until Ctrl-C.
    Up(appliance::UpArgs),
    /// Stop the appliance running on DIR.
    Down(appliance::DownArgs),
    /// Each process of the appliance on DIR, and the cut.
    Status(appliance::StatusArgs),
}

fn init_logging() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let filter = std::env::var("LC_LOG")
        .ok()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO))
        // sqlx's URL parser would log an unknown parameter's value.
        .with_target("sqlx_postgres::options::parse", tracing::Level::ERROR);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(false);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_logging();
    match cli.command {
        Command::Serve(args) => serve::command(args).await,
        Command::Provider(args) => provider::run(args).await,
        Command::Worker(args) => worker::run(args).await,
        Command::Gateway(args) => gateway::run(args).await,
        Command::Appliance(ApplianceCommand::Up(args)) => appliance::up(args).await,
        Command::Appliance(ApplianceCommand::Down(args)) => appliance::down(args).await,
        Command::Appliance(ApplianceCommand::Status(args)) => appliance::status(args).await,
    }
}
