//! The operator commands that work on the PostgreSQL database directly:
//! `migrate`, `policy show|set`, and `status`, `audit`, `reclaim` when a
//! database URL is configured (and no `--server`).
//!
//! `status` builds the same report as `GET /v1/admin/status`
//! ([`tollgate_api::api::status_report`]), without the service's counters.
//! `status` and `audit` only read, so they open the store whatever the
//! clock ([`pg::Access::ReadOnly`]) with the policy recorded in the
//! database (they need not repeat the service's policy flags, and ignore
//! them and `--secret-file`, with a warning, when given); `reclaim` writes, so
//! it runs with the configured policy and, on a database on the safe
//! expiry cut, with `--clock safe-cut` (and then pauses while the cut is
//! uncertain, like the service's worker). The test clock exists only
//! inside `serve`: `--clock test` is refused here (exit 2).

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::watch;
use tollgate::CapabilityKey;

use super::CliError;
use super::args::{MigrateArgs, PolicyCmd};
use super::dispatch::Reclaim;
use super::report;
use crate::config::{self, Config, ConfigError, RawConfig};
use crate::pg;
use crate::serve::{self, ServeError};
use clock::{Clock, ClockKind, SystemClock};
use tollgate_api::dto::{AuditView, PolicyChangeView, PolicyRecordView, ReclaimView, StatusView};
use tollgate_api::metrics::Metrics;
use tollgate_api::storage::ServiceStore;
use tollgate_api::worker::ReclaimWorker;

/// `migrate [--dry-run]`: applies (or lists) the pending migrations, one
/// line each.
///
/// # Errors
/// A configuration without a database URL (exit 2); the migrator's error.
pub(super) async fn migrate(args: MigrateArgs) -> Result<ExitCode, CliError> {
    let cfg = Config::resolve(args.raw())?;
    let Some(url) = &cfg.database_url else {
        return Err(ConfigError(
            "migrate needs --database-url (or TOLLGATE_DATABASE_URL, DATABASE_URL): only \
             PostgreSQL has a schema"
                .into(),
        )
        .into());
    };
    let list = pg::migrate(url, args.dry_run, Config::std(cfg.connect_timeout))
        .await
        .map_err(ServeError::from)?;
    let verb = if args.dry_run { "pending" } else { "applied" };
    if list.is_empty() {
        out!("no migrations {verb}");
    }
    for m in list {
        out!("{verb} {:04} {}", m.version, m.description);
    }
    Ok(ExitCode::SUCCESS)
}

/// `status` against the database: the status report, with a fresh reading
/// of the cut on `--clock safe-cut`.
///
/// # Errors
/// The store cannot be opened.
pub(super) async fn status(cfg: &Config) -> Result<StatusView, CliError> {
    let backend = open(cfg, pg::Access::ReadOnly).await?;
    let clock = clock(cfg, &backend)?;
    Ok(tollgate_api::api::status_report(&backend, &*clock, None).await)
}

/// `audit` against the database: every account recomputed from the ledger.
///
/// # Errors
/// The store cannot be opened or read.
pub(super) async fn audit(cfg: &Config) -> Result<AuditView, CliError> {
    let backend = open(cfg, pg::Access::ReadOnly).await?;
    Ok(backend
        .allocator
        .audit()
        .await
        .map_err(|e| CliError::Failed(format!("audit: {e}")))?
        .into())
}

/// `reclaim` against the database: one worker pass, printed as JSON
/// ([`report::JsonStyle`]); with `plan.interval`, the worker's loop until `stop` turns true.
///
/// # Errors
/// The store cannot be opened; the pass fails.
pub(super) async fn reclaim(
    cfg: &Config,
    plan: Reclaim,
    stop: watch::Receiver<bool>,
) -> Result<(), CliError> {
    let backend = open(cfg, pg::Access::ReadWrite).await?;
    let clock = clock(cfg, &backend)?;
    let worker = ReclaimWorker::new(
        backend.allocator.clone(),
        clock,
        plan.limit,
        Arc::new(Metrics::new()),
    );
    if let Some(interval) = plan.interval {
        worker.run(interval, stop).await;
        return Ok(());
    }
    let pass = worker
        .step()
        .await
        .map_err(|e| CliError::Failed(format!("reclaim: {e}")))?;
    report::print_json(&ReclaimView::new(pass.report, pass.now))
}

/// `policy show|set`: the grant policy recorded in the database.
///
/// # Errors
/// No database URL or an invalid value (exit 2); the database's error.
pub(super) async fn policy(cmd: PolicyCmd) -> Result<ExitCode, CliError> {
    match cmd {
        PolicyCmd::Show { db } => {
            let cfg = Config::resolve(db.database.apply(RawConfig::default()))?;
            let (policy, changes) =
                pg::show_policy(policy_url(&cfg)?, Config::std(cfg.connect_timeout))
                    .await
                    .map_err(ServeError::from)?;
            report::print_json(&PolicyRecordView {
                policy: policy.map(Into::into),
                changes: changes.into_iter().map(change_view).collect(),
            })?;
        }
        PolicyCmd::Set {
            db,
            max_ttl,
            reclaim_grace,
            changed_by,
        } => {
            // The same parsing and validation as `serve` (`max` for grace).
            let cfg = Config::resolve(db.database.apply(RawConfig {
                max_ttl: Some(max_ttl),
                reclaim_grace: Some(reclaim_grace),
                ..RawConfig::default()
            }))?;
            check_changed_by(&changed_by)?;
            let change = pg::set_policy(
                policy_url(&cfg)?,
                cfg.policy,
                &changed_by,
                Config::std(cfg.connect_timeout),
            )
            .await
            .map_err(ServeError::from)?;
            report::print_json(&change_view(change))?;
            say!(
                "policy recorded; restart every process sharing this database with \
                 --max-ttl {} --reclaim-grace {}",
                cfg.policy.max_ttl(),
                cfg.policy.reclaim_grace()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The warning of a read-only command (`status`, `audit`) given a policy
/// that differs from the recorded one: it is not applied.
pub const READ_ONLY_IGNORES_POLICY: &str = "warning: status and audit only read, so they \
     ignore --max-ttl and --reclaim-grace (and TOLLGATE_MAX_TTL, TOLLGATE_RECLAIM_GRACE, the \
     config file's max_ttl and reclaim_grace) and use the policy recorded in the database";

/// The warning of a read-only command (`status`, `audit`) given a
/// capability key file: it is not read.
pub const READ_ONLY_IGNORES_SECRET_FILE: &str = "warning: status and audit only read and \
     check no capability, so they ignore --secret-file (and TOLLGATE_SECRET_FILE, the config \
     file's secret_file)";

/// The PostgreSQL store for a direct operator command (dispatch sends only
/// a configuration with a database URL here), opened without migrating:
/// the capability key does not matter for status, audit and reclaim, so a
/// random one stands in when no `--secret-file` is given. A
/// [`pg::Access::ReadOnly`] command ignores `--secret-file` and any policy
/// flags (one warning line each, [`READ_ONLY_IGNORES_SECRET_FILE`],
/// [`READ_ONLY_IGNORES_POLICY`]) and opens it with the
/// recorded policy ([`pg::recorded_policy`]), or, before any is recorded,
/// reads through a view that records none ([`pg::unrecorded_view`]: its
/// status shows the configured policy, the one a first start records).
///
/// # Errors
/// [`CliError::Usage`] for `--clock test`; the store's errors.
async fn open(cfg: &Config, access: pg::Access) -> Result<ServiceStore, CliError> {
    if cfg.clock == ClockKind::Test {
        return Err(CliError::Usage(
            "--clock test exists only inside `tollgate serve` (it is set over its HTTP API); \
             run status, audit and reclaim directly with --clock system or --clock safe-cut, \
             or against the test server with --server"
                .into(),
        ));
    }
    let mut cfg = Config {
        migrate_on_start: false,
        ..cfg.clone()
    };
    if access == pg::Access::ReadOnly {
        if cfg.secret_file.is_some() {
            // Only reads: no capability is issued or checked, so the key
            // file is neither needed nor read.
            say!("{}", READ_ONLY_IGNORES_SECRET_FILE);
            cfg.secret_file = None;
        }
        let url = cfg.database_url.as_deref().unwrap_or_default();
        let wait = Config::std(cfg.connect_timeout);
        match pg::recorded_policy(url, wait)
            .await
            .map_err(ServeError::from)?
        {
            Some(recorded) => {
                if cfg.policy_given && cfg.policy != recorded {
                    say!("{}", READ_ONLY_IGNORES_POLICY);
                }
                cfg.policy = recorded;
            }
            None => {
                return Ok(pg::unrecorded_view(url, cfg.policy, wait)
                    .await
                    .map_err(ServeError::from)?);
            }
        }
    }
    let cfg = &cfg;
    let key = match &cfg.secret_file {
        Some(p) => config::read_secret_file(p)?,
        None => CapabilityKey::generate().map_err(|e| ConfigError(e.to_string()))?,
    };
    Ok(pg::connect_for(cfg, key, access)
        .await
        .map_err(ServeError::from)?)
}

/// The clock of a direct operator command: the safe-cut clock with
/// `--clock safe-cut`; otherwise the system clock (`--clock test` was
/// refused by [`open`]).
fn clock(cfg: &Config, backend: &ServiceStore) -> Result<Arc<dyn Clock>, CliError> {
    if cfg.clock != ClockKind::SafeCut {
        return Ok(Arc::new(SystemClock));
    }
    Ok(serve::build_clock(cfg, backend)?)
}

/// The database URL of a `policy` subcommand, validated like `serve`'s.
fn policy_url(cfg: &Config) -> Result<&str, CliError> {
    cfg.database_url.as_deref().ok_or_else(|| {
        ConfigError(
            "policy needs --database-url (or DATABASE_URL): only PostgreSQL records a policy"
                .into(),
        )
        .into()
    })
}

/// The rule `tollgate_pg::set_policy` applies to `changed_by`
/// ([`tollgate::rules::check_changed_by`]), checked first so that a bad
/// name is a usage error (exit 2).
fn check_changed_by(name: &str) -> Result<(), ConfigError> {
    tollgate::rules::check_changed_by(name).map_err(|e| ConfigError(e.to_string()))?;
    Ok(())
}

fn change_view(c: tollgate_pg::PolicyChange) -> PolicyChangeView {
    PolicyChangeView {
        change_id: c.change_id,
        changed_by: c.changed_by,
        recorded_at: c.recorded_at,
        old: c.old.map(Into::into),
        new: c.new.into(),
    }
}
