//! `little-compute worker`: the reconciler in a loop.

use std::process::ExitCode;

/// `little-compute worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// PostgreSQL URL of the installation's database.
    #[arg(
        long,
        env = "LC_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    /// A provider's base URL (`http://127.0.0.1:PORT`); repeat for several.
    #[arg(long = "provider-url", value_name = "URL")]
    pub provider_urls: Vec<String>,
}

/// Runs the worker until SIGINT/SIGTERM.
pub async fn run(_args: WorkerArgs) -> ExitCode {
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
