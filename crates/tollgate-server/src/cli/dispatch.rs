//! Dispatch: which code runs a parsed subcommand, and for the operator
//! commands (`status`, `audit`, `reclaim`) whether it goes to a server
//! ([`super::remote`]) or to the database ([`super::direct`]).

use std::process::ExitCode;
use std::time::Duration;

use tokio::sync::watch;

use super::CliError;
use super::args::{Command, OpsArgs, ReclaimArgs, ServeArgs};
use super::{direct, remote, report};
use crate::client::Client;
use crate::config::{self, Config, ConfigError};
use crate::serve;

/// Runs one subcommand.
///
/// # Errors
/// See [`CliError`].
pub async fn run(command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Serve(args) => serve(args).await,
        Command::Migrate(args) => direct::migrate(args).await,
        Command::Status(ops) => {
            let view = match target(&ops)? {
                Target::Http(c) => remote::status(&c).await?,
                Target::Direct(cfg) => direct::status(&cfg).await?,
            };
            report::status(&view)
        }
        Command::Audit(ops) => {
            let view = match target(&ops)? {
                Target::Http(c) => remote::audit(&c).await?,
                Target::Direct(cfg) => direct::audit(&cfg).await?,
            };
            report::audit(&view)
        }
        Command::Reclaim(args) => reclaim(args).await,
        Command::Policy(cmd) => direct::policy(cmd).await,
        Command::Account(cmd) => printed(remote::account(cmd).await?),
        Command::Lease(cmd) => printed(remote::lease(cmd).await?),
        Command::Clock(cmd) => printed(remote::clock(cmd).await?),
    }
}

/// Prints a client subcommand's response.
fn printed(v: serde_json::Value) -> Result<ExitCode, CliError> {
    report::print_json(&v)?;
    Ok(ExitCode::SUCCESS)
}

/// `serve`: the service, or with `--print-config` its configuration.
async fn serve(args: ServeArgs) -> Result<ExitCode, CliError> {
    let cfg = Config::resolve(args.raw())?;
    if args.print_config {
        // A closed pipe ends the output quietly, a full disk fails
        // the command (see `out!`).
        let text = cfg.render();
        out!("{}", text.trim_end_matches('\n'));
        return Ok(ExitCode::SUCCESS);
    }
    serve::serve(cfg).await?;
    Ok(ExitCode::SUCCESS)
}

/// How `reclaim` runs: batches of `limit` leases, once (`interval`
/// `None`) or with `--loop` every `interval` (at once after a full batch).
#[derive(Debug, Clone, Copy)]
pub(super) struct Reclaim {
    /// Leases per batch.
    pub(super) limit: usize,
    /// The pause between batches with `--loop`.
    pub(super) interval: Option<Duration>,
}

impl Reclaim {
    /// The plan of `args`: `--interval` positive, defaults from the
    /// service's settings.
    fn of(args: &ReclaimArgs) -> Result<Reclaim, CliError> {
        let interval = match &args.interval {
            Some(s) => config::parse_duration(s, false)
                .map_err(|e| CliError::Usage(format!("--interval: {e}")))?,
            None => config::DEFAULT_RECLAIM_INTERVAL,
        };
        if !interval.is_positive() {
            return Err(CliError::Usage(format!(
                "--interval must be positive, got {interval}"
            )));
        }
        Ok(Reclaim {
            limit: args.limit.unwrap_or(config::RECLAIM_BATCH_DEFAULT),
            interval: args.run_loop.then(|| Config::std(interval)),
        })
    }
}

/// `reclaim`: with `--loop`, until SIGTERM or SIGINT.
async fn reclaim(args: ReclaimArgs) -> Result<ExitCode, CliError> {
    let plan = Reclaim::of(&args)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    if plan.interval.is_some() {
        let signal = serve::listen_for_shutdown()?;
        tokio::spawn(async move {
            signal.await;
            let _ = stop_tx.send(true);
        });
    }
    match target(&args.ops)? {
        Target::Http(c) => remote::reclaim(&c, plan, stop_rx).await?,
        Target::Direct(cfg) => direct::reclaim(&cfg, plan, stop_rx).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether an operator command goes to a server (HTTP) or to the database.
enum Target {
    Http(Client),
    Direct(Config),
}

/// The target of an operator command: the database when one is configured,
/// otherwise the server (`--server`, default `http://127.0.0.1:8080`).
fn target(ops: &OpsArgs) -> Result<Target, CliError> {
    let cfg = Config::resolve(ops.store.raw())?;
    match (&ops.client.server, cfg.is_postgres()) {
        // Two targets: going to either one silently could act on the
        // wrong installation.
        (Some(_), true) => Err(ConfigError(
            "both a server (--server or TOLLGATE_SERVER) and a database (--database-url, \
             TOLLGATE_DATABASE_URL, DATABASE_URL or the config file) are given; give one"
                .into(),
        )
        .into()),
        (None, true) => Ok(Target::Direct(cfg)),
        _ => Ok(Target::Http(ops.client.client()?)),
    }
}
