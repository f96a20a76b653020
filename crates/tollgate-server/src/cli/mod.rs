//! The `tollgate` command line (clap).
//!
//! * `serve`: the HTTP service (and, by default, the reclaim worker).
//! * `migrate [--dry-run]`: apply (or list) pending PostgreSQL migrations.
//! * `status`, `audit`, `reclaim [--once|--loop]`: operator commands. With
//!   `--server URL` (or when no database URL is configured) they call the
//!   HTTP API with the admin `--token`; with a database URL they open the
//!   PostgreSQL store directly. Directly, `reclaim` runs on the system clock,
//!   or on the safe expiry cut with `--clock safe-cut` (and then pauses
//!   while the cut is uncertain, like the service's worker); `status` with
//!   `--clock safe-cut` shows one fresh reading of the cut.
//! * `policy show|set`: the grant policy recorded in a PostgreSQL database,
//!   its change history, and the explicit, recorded command that changes it.
//! * `account create|deposit|show`, `lease acquire|renew|release|show`,
//!   `clock set`: HTTP clients of the API (`--server`, default
//!   `http://127.0.0.1:8080`; `--token`: the admin token, an account key or
//!   a lease capability, as the route needs).
//!
//! Results are printed as JSON on stdout: indented on a terminal, one line
//! per result otherwise (a pipe, a file), for every command alike; errors
//! go to stderr. Exit status:
//! 0 success, 1 a refused or failed operation (or an audit with
//! violations), 2 invalid usage or configuration.
//!
//! The parts: `args` (the clap types), `dispatch` ([`run`]: which code
//! runs a subcommand, and whether an operator command goes to a server or
//! to the database), `remote` (the commands that go over HTTP), `direct`
//! (the commands on the database: `migrate`, `policy`, and `status`,
//! `audit`, `reclaim` given a database URL), `report` (what is printed
//! and the exit status it implies) and `logging`.

/// Prints a line on stderr like `eprintln!`, but a stderr that cannot be
/// written (a closed pipe, a full disk) is ignored instead of panicking:
/// there is nowhere left to report it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Prints a line on stdout like `println!`, but a closed pipe (`tollgate
/// audit | head -1`) ends the output quietly instead of panicking, and any
/// other lost output makes the command exit 1 ([`crate::output`]).
macro_rules! out {
    ($($arg:tt)*) => {
        crate::output::print(format_args!($($arg)*))
    };
}

mod args;
mod direct;
mod dispatch;
mod logging;
mod remote;
mod report;

use std::process::ExitCode;

use clap::Parser as _;

pub use crate::config::ClockArg;
pub use args::{
    AccountCmd, Cli, ClientArgs, ClockCmd, Command, DEFAULT_SERVER, LOG_LEVEL_DEPRECATED_ENV,
    LOG_LEVEL_ENV, LeaseCmd, LogFormat, MigrateArgs, OpsArgs, PolicyCmd, PolicyDbArgs, ReclaimArgs,
    ServeArgs, StoreArgs,
};
pub use direct::{READ_ONLY_IGNORES_POLICY, READ_ONLY_IGNORES_SECRET_FILE};
pub use dispatch::run;
pub use logging::init_logging;

use crate::client::ClientError;
use crate::config::ConfigError;
use crate::serve::ServeError;

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Invalid configuration or usage (exit 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The service or store refused or failed (exit 1).
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// An HTTP call failed (exit 1), or `--server` is unusable (exit 2).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A flag's value is unusable (exit 2): the message names the flag and
    /// what it takes.
    #[error("{0}")]
    Usage(String),
    /// Anything else (exit 1).
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Config(_)
            | CliError::Serve(ServeError::Config(_))
            | CliError::Client(ClientError::BadServer { .. } | ClientError::BadToken { .. })
            | CliError::Usage(_) => ExitCode::from(2),
            _ => ExitCode::from(1),
        }
    }
}

/// Parses the command line and runs it.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match &cli.command {
        Command::Serve(_) | Command::Reclaim(_) | Command::Migrate(_) => tracing::Level::INFO,
        _ => tracing::Level::WARN,
    };
    init_logging(cli.log_format, cli.log_level.clone(), level);
    let code = match run(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            say!("error: {e}");
            e.exit_code()
        }
    };
    match crate::output::failure() {
        // The result was lost: never exit 0 for it.
        Some(e) if code == ExitCode::SUCCESS => {
            say!("error: cannot write the output: {e}");
            ExitCode::FAILURE
        }
        _ => code,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// clap's own consistency checks over every subcommand and argument.
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
