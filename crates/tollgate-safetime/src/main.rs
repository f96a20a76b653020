//! `tollgate-safetime`: the safe-time sampler process
//! ([`safetime_pg::Sampler`]) and its operator commands.
//!
//! ```text
//! tollgate-safetime run      --database-url URL   # lead or stand by, until SIGINT/SIGTERM
//! tollgate-safetime status   --database-url URL   # the persisted cut, its certainty (stale rule) and any quarantine's progress, as JSON
//! tollgate-safetime policy show|seal              # the sealed horizon policy
//! tollgate-safetime evidence --database-url URL   # immutable evidence rows, as JSON lines
//! ```
//!
//! Run it beside the service, on a host that runs no untrusted code: its
//! monotonic clock is the trusted leaf of the whole time model. Connect
//! directly to PostgreSQL (or through a proxy in *session* pooling mode);
//! transaction and statement pooling are unsupported, and the per-sample
//! PID and lock checks end leadership if a statement reaches another
//! backend. Exit status: 0 after a clean shutdown, 2 for bad arguments
//! (a value out of its bounds, below; a database URL that does not parse
//! or whose scheme is not `postgres://` or `postgresql://`, code
//! `invalid_url`, checked before connecting and never echoed), 1 for any
//! other failure (with a message naming its stable code, e.g.
//! `schema_missing` for a database without migration 0018, or
//! `permission_denied` for a role without the grants of `tollgate_sampler`).
//!
//! Bounds, all checked before connecting (exit 2, the value in the
//! message, durations in ISO 8601): `--gap-max` positive and at most one
//! hour (`GAP_MAX_MAX`; for `run` and `status` alike); `--interval` and
//! `--round-trip-max` positive and below `--gap-max`; `--recovery-grace`
//! 0 to one hour; `--stable-observations` 1..=10000; `--drift-ppm` at most
//! 100000; `--standby-poll` positive and at most one hour
//! (`STANDBY_POLL_MAX`); `evidence --limit` 1..=1000; `policy seal
//! --horizon-ms` positive and at most 100 years (`HORIZON_MS_MAX`,
//! 3153600000000), `--sealed-by` 1..=200 characters without control
//! characters; `--command-timeout` 1 s to 1 h
//! (default 30 s: how long a one-shot command, `status`, `policy` or
//! `evidence`, waits for a database that does not answer, then exit 1).
//! A negative value is the value of
//! its flag, not another flag: `--interval -1s` is refused as "--interval
//! must be positive, got -PT1S". Every duration flag is read by
//! `tollgate`'s own checker: ISO 8601 (`PT30S`) or the friendly format
//! (`30s`, `1h 30m`); anything else is refused naming the flag, the value
//! and the accepted forms.
//! A `run` that cannot take leadership because of such a misconfiguration
//! does not exit: it logs "cannot take safe-time leadership" with the code
//! and retries with back-off (up to 5 s), so it starts leading once the
//! database is fixed.

#![forbid(unsafe_code)]

mod shared;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use jiff::SignedDuration;
use safetime::{
    DEFAULT_DRIFT_PPM, DEFAULT_GAP_MAX, DEFAULT_RECOVERY_GRACE, DEFAULT_ROUND_TRIP_MAX,
    DEFAULT_SAMPLE_INTERVAL, DEFAULT_STABLE_OBSERVATIONS_MIN, GAP_MAX_MAX, QuarantineProgress,
    SafeTimeConfig, SafeTimeConfigError, judge_reading,
};
use safetime_pg::sampler::{DEFAULT_RECONNECT_MAX, DEFAULT_STANDBY_POLL, Sampler, SamplerOptions};
use safetime_pg::{EVIDENCE_MAX, SafeTimeError};
use sqlx::{Connection, PgConnection};
use tokio::sync::watch;

#[derive(Debug, Parser)]
#[command(
    name = "tollgate-safetime",
    version,
    about = "Tollgate's safe-time sampler: publishes the safe expiry cut"
)]
struct Cli {
    /// PostgreSQL URL of the Tollgate database, migrated with `tollgate
    /// migrate` (the sampler needs migration 0018, safe time, or later).
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
    /// Log level (logs go to stderr), the same setting and grammar as
    /// `tollgate`'s: a level (`error`, `warn`, `info`, `debug`, `trace`,
    /// `off`) or `target=level` directives (`info,safetime_pg=debug`).
    /// Default: `info`. The former variable TOLLGATE_LOG is still read,
    /// with a warning.
    #[arg(long, global = true, env = "TOLLGATE_LOG_LEVEL", value_name = "LEVEL")]
    log_level: Option<String>,
    /// Longest wait for the database of a one-shot command (`status`,
    /// `policy`, `evidence`), connection included; `run` waits as long as
    /// it runs. 1 s to 1 h.
    #[arg(
        long,
        global = true,
        env = "TOLLGATE_SAFETIME_COMMAND_TIMEOUT",
        default_value = "30s",
        allow_hyphen_values = true,
        value_name = "DURATION"
    )]
    command_timeout: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the sampler: wait for leadership, then publish the cut every
    /// interval until SIGINT or SIGTERM.
    Run(RunArgs),
    /// Print the persisted cut and its certainty as JSON. `certain` and
    /// `uncertain_reason` are judged as the service judges them: a cut not
    /// republished within `--gap-max` (database time since its last
    /// publish) is `stale`; `published_reason` is what the publisher said.
    /// While the initial quarantine is in force, `quarantine` says how much
    /// uninterrupted trusted time its proof still needs (`remaining`, of
    /// `required`: the horizon plus the drift allowance; `observed` since
    /// `proof_started_at`) and, in `hint`, how to shorten it safely (seal a
    /// shorter horizon with every sampler stopped); `null` otherwise.
    Status {
        /// Sampling-gap bound to judge staleness by, at most one hour; give
        /// the service's `--safetime-gap-max` (the same default and cap).
        #[arg(
            long,
            env = "TOLLGATE_SAFETIME_GAP_MAX",
            default_value_t = DEFAULT_GAP_MAX.to_string(),
            allow_hyphen_values = true,
            value_name = "DURATION",
        )]
        gap_max: String,
        /// The samplers' drift allowance, parts per million (at most
        /// 100000): with `--recovery-grace`, what the initial quarantine's
        /// proof needs (`quarantine`); give the samplers' `run` value.
        #[arg(
            long,
            env = "TOLLGATE_SAFETIME_DRIFT_PPM",
            default_value_t = DEFAULT_DRIFT_PPM,
            allow_negative_numbers = true,
        )]
        drift_ppm: u32,
        /// The samplers' recovery grace (zero to one hour); give the
        /// samplers' `run` value.
        #[arg(
            long,
            env = "TOLLGATE_SAFETIME_RECOVERY_GRACE",
            default_value_t = DEFAULT_RECOVERY_GRACE.to_string(),
            allow_hyphen_values = true,
            value_name = "DURATION",
        )]
        recovery_grace: String,
    },
    /// Show or seal the maximum-deadline horizon policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Print the immutable evidence rows as JSON lines (oldest first).
    Evidence {
        /// At most this many rows, 1..=1000.
        #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
        limit: i64,
    },
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Print the newest sealed policy (version, horizon, digest) as JSON.
    Show,
    /// Seal a new horizon (owner role only). Refused while any sampler
    /// runs and when shorter than max_ttl + reclaim_grace; takes effect at
    /// the next epoch a sampler claims.
    Seal {
        /// The new horizon in milliseconds, 1..=3153600000000 (100 years;
        /// default policy: 315360000000 = 3650 days).
        #[arg(long, allow_negative_numbers = true)]
        horizon_ms: i64,
        /// Who seals it (recorded in the evidence), 1..=200 characters, no
        /// control characters.
        #[arg(long)]
        sealed_by: String,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Interval between samples (e.g. `1s`, `250ms`, `PT1S`; below `--gap-max`).
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_INTERVAL",
        default_value_t = DEFAULT_SAMPLE_INTERVAL.to_string(),
        allow_hyphen_values = true,
        value_name = "DURATION",
    )]
    interval: String,
    /// Drift allowance between database and monotonic time, parts per million.
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_DRIFT_PPM",
        default_value_t = DEFAULT_DRIFT_PPM,
        allow_negative_numbers = true,
    )]
    drift_ppm: u32,
    /// Sampling-gap bound (at most one hour): a longer gap between samples
    /// makes the cut uncertain.
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_GAP_MAX",
        default_value_t = DEFAULT_GAP_MAX.to_string(),
        allow_hyphen_values = true,
        value_name = "DURATION",
    )]
    gap_max: String,
    /// Longest plausible round trip of one observation (below `--gap-max`).
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_ROUND_TRIP_MAX",
        default_value_t = DEFAULT_ROUND_TRIP_MAX.to_string(),
        allow_hyphen_values = true,
        value_name = "DURATION",
    )]
    round_trip_max: String,
    /// Consecutive consistent observations needed to become certain again
    /// (1..=10000).
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_STABLE_OBSERVATIONS",
        default_value_t = DEFAULT_STABLE_OBSERVATIONS_MIN,
        allow_negative_numbers = true,
    )]
    stable_observations: u32,
    /// Monotonic time after the last anomaly needed to become certain again
    /// (zero to one hour).
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_RECOVERY_GRACE",
        default_value_t = DEFAULT_RECOVERY_GRACE.to_string(),
        allow_hyphen_values = true,
        value_name = "DURATION",
    )]
    recovery_grace: String,
    /// Interval between a standby's attempts to take leadership (positive,
    /// at most one hour).
    #[arg(
        long,
        env = "TOLLGATE_SAFETIME_STANDBY_POLL",
        default_value_t = STANDBY_POLL_DEFAULT.to_string(),
        allow_hyphen_values = true,
        value_name = "DURATION",
    )]
    standby_poll: String,
}

/// The largest `--standby-poll`: a standby that polls less often than
/// this would leave the cut unpublished, hence uncertain, for that long
/// after its leader stops.
const STANDBY_POLL_MAX: Duration = Duration::from_secs(3_600);

/// The largest `policy seal --horizon-ms`: 100 years (36,500 days), ten
/// times the default policy's. A longer horizon only lengthens the
/// initial quarantine, and the cut plus the horizon must stay a
/// representable instant.
const HORIZON_MS_MAX: i64 = 36_500 * 86_400 * 1_000;

/// The most characters of `policy seal --sealed-by`.
const SEALED_BY_MAX_CHARS: usize = 200;

/// The sampler's [`DEFAULT_STANDBY_POLL`] as the `--standby-poll` default,
/// converted at compile time (a value beyond `SignedDuration` would fail
/// the build, never a run).
const STANDBY_POLL_DEFAULT: SignedDuration = {
    let ns = DEFAULT_STANDBY_POLL.as_nanos();
    assert!(ns <= i128::MAX as u128);
    SignedDuration::from_nanos_i128(ns as i128)
};

fn main() -> ExitCode {
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
    // One logging setup for both binaries: the same variable, grammar,
    // deprecated alias and quieting of sqlx's routine lines.
    shared::init_logging(cli.log_level.clone(), tracing::Level::INFO);
    let Some(url) = cli.database_url.clone() else {
        say(format_args!(
            "tollgate-safetime: --database-url (or TOLLGATE_DATABASE_URL) is required"
        ));
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say(format_args!(
                "tollgate-safetime: cannot start the runtime: {e}"
            ));
            return ExitCode::FAILURE;
        }
    };
    let command_timeout = match flag_duration("--command-timeout", &cli.command_timeout) {
        Ok(d) => d,
        Err(Failure::Usage(msg)) => {
            say(format_args!("tollgate-safetime: {msg}"));
            return ExitCode::from(2);
        }
        Err(_) => return ExitCode::from(2),
    };
    let bound = match Duration::try_from(command_timeout) {
        Ok(d) if (Duration::from_secs(1)..=Duration::from_secs(3_600)).contains(&d) => d,
        _ => {
            say(format_args!(
                "tollgate-safetime: --command-timeout must be in 1s..=1h, got {command_timeout}"
            ));
            return ExitCode::from(2);
        }
    };
    let one_shot = !matches!(cli.command, Command::Run(_));
    let outcome = runtime.block_on(async {
        if one_shot {
            // A database that accepts the connection but never answers
            // (a frozen server) must not hang an operator's command.
            tokio::time::timeout(bound, dispatch(cli.command, &url))
                .await
                .unwrap_or_else(|_| {
                    Err(Failure::SafeTime(SafeTimeError::Backend(format!(
                        "the database did not answer within {command_timeout}"
                    ))))
                })
        } else {
            dispatch(cli.command, &url).await
        }
    });
    match outcome {
        Ok(code) => code,
        Err(Failure::Closed) => ExitCode::SUCCESS,
        Err(Failure::Output(e)) => {
            say(format_args!(
                "tollgate-safetime: cannot write the output: {e}"
            ));
            ExitCode::FAILURE
        }
        Err(Failure::Usage(msg)) => {
            say(format_args!("tollgate-safetime: {msg}"));
            ExitCode::from(2)
        }
        Err(Failure::SafeTime(e)) => {
            say(format_args!("tollgate-safetime: {e} (code {})", e.code()));
            match e {
                // A URL that does not parse is a bad argument, like a
                // missing one.
                SafeTimeError::InvalidUrl(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// Writes one line to standard error, ignoring a closed or full stream
/// (there is nowhere left to report it).
fn say(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// Writes one line of output to standard output. A reader that went away
/// (broken pipe) ends the command quietly; any other write failure (a full
/// disk) is an error, so lost output never exits 0.
/// Prints `v` as `tollgate` prints a result
/// ([`shared::render_json`]): indented on a terminal, one line
/// otherwise (a pipe or a file gets one JSON document per line).
fn emit_json(v: &serde_json::Value) -> Result<(), Failure> {
    let text = shared::render_json(v).map_err(|e| Failure::Output(e.to_string()))?;
    emit(&text)
}

fn emit(line: &str) -> Result<(), Failure> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(Failure::Closed),
        Err(e) => Err(Failure::Output(e.to_string())),
    }
}

#[derive(Debug)]
enum Failure {
    /// Standard output was closed by its reader: stop quietly.
    Closed,
    /// Standard output could not be written (exit 1).
    Output(String),
    Usage(String),
    SafeTime(SafeTimeError),
}

impl From<SafeTimeError> for Failure {
    fn from(e: SafeTimeError) -> Self {
        Failure::SafeTime(e)
    }
}

/// Connects to `url`.
///
/// # Errors
/// [`SafeTimeError::InvalidUrl`] (exit 2) if `url` is not a PostgreSQL URL
/// or does not parse ([`safetime_pg::connect_options`]); what the
/// server refuses keeps its code (`permission_denied`, ...); anything else
/// is `backend`. No message repeats the URL.
async fn connect(url: &str) -> Result<PgConnection, Failure> {
    let options = safetime_pg::connect_options(url)?;
    PgConnection::connect_with(&options).await.map_err(|e| {
        Failure::SafeTime(match SafeTimeError::from(e) {
            SafeTimeError::Backend(m) => SafeTimeError::Backend(format!("cannot connect: {m}")),
            other => other,
        })
    })
}

/// The duration of flag `flag` (e.g. `--gap-max`) written `value`: ISO
/// 8601 or the friendly format, read by the same checker as `tollgate`'s
/// flags ([`shared::parse_duration`]).
///
/// # Errors
/// [`Failure::Usage`] naming the flag, the value and the accepted forms.
fn flag_duration(flag: &str, value: &str) -> Result<SignedDuration, Failure> {
    shared::parse_duration(value).map_err(|e| Failure::Usage(format!("{flag}: {e}")))
}

/// The sampler's settings error `e` in the terms of `run`'s flags
/// (`gap_max` is `--gap-max`, `stable_observations_min` is
/// `--stable-observations`).
fn run_flags_error(e: &SafeTimeConfigError) -> String {
    let flag = |name: &str| format!("--{}", name.replace('_', "-"));
    match e {
        SafeTimeConfigError::DriftTooLarge { got, max } => {
            format!("--drift-ppm must be at most {max}, got {got}")
        }
        SafeTimeConfigError::NonPositive { name, got } => {
            format!("{} must be positive, got {got}", flag(name))
        }
        SafeTimeConfigError::TooLong { name, got, max } => {
            format!("{} must be at most {max}, got {got}", flag(name))
        }
        SafeTimeConfigError::TooManyStableObservations { got, max } => {
            format!("--stable-observations must be at most {max}, got {got}")
        }
        SafeTimeConfigError::RoundTripNotBelowGap {
            round_trip_max,
            gap_max,
        } => format!("--round-trip-max ({round_trip_max}) must be below --gap-max ({gap_max})"),
        SafeTimeConfigError::IntervalNotBelowGap { interval, gap_max } => {
            format!("--interval ({interval}) must be below --gap-max ({gap_max})")
        }
        SafeTimeConfigError::NoStableObservations => {
            "--stable-observations must be at least 1".to_string()
        }
    }
}

fn std_duration(name: &str, d: SignedDuration) -> Result<Duration, Failure> {
    Duration::try_from(d)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Failure::Usage(format!("{name} must be positive, got {d}")))
}

async fn dispatch(command: Command, url: &str) -> Result<ExitCode, Failure> {
    match command {
        Command::Run(args) => run(args, url).await,
        Command::Status {
            gap_max,
            drift_ppm,
            recovery_grace,
        } => {
            let gap_max = flag_duration("--gap-max", &gap_max)?;
            let recovery_grace = flag_duration("--recovery-grace", &recovery_grace)?;
            if gap_max <= SignedDuration::ZERO {
                return Err(Failure::Usage(format!(
                    "--gap-max must be positive, got {gap_max}"
                )));
            }
            // The sampler's own cap (SafeTimeConfig::new): a larger bound
            // would call a stopped sampler's cut certain for practically
            // ever.
            if gap_max > GAP_MAX_MAX {
                return Err(Failure::Usage(format!(
                    "--gap-max must be at most {GAP_MAX_MAX}, got {gap_max}"
                )));
            }
            // Only the drift allowance and the recovery grace enter the
            // quarantine's run; the other settings are the defaults, valid
            // with each other.
            let tuning = SafeTimeConfig::new(
                drift_ppm,
                DEFAULT_SAMPLE_INTERVAL,
                DEFAULT_GAP_MAX,
                DEFAULT_ROUND_TRIP_MAX,
                DEFAULT_STABLE_OBSERVATIONS_MIN,
                recovery_grace,
            )
            .map_err(|e| Failure::Usage(run_flags_error(&e)))?;
            let mut c = connect(url).await?;
            let row = safetime_pg::read_cut(&mut c).await?;
            let json = match row {
                None => {
                    serde_json::json!({ "cut": null, "certain": false, "uncertain_reason": "no_cut" })
                }
                Some(r) => {
                    // One read: the row's own age is all the staleness
                    // evidence there is (the service also counts how long
                    // it has seen the same publish).
                    let judged = judge_reading(
                        r.uncertain,
                        r.db_now.duration_since(r.published_at),
                        SignedDuration::ZERO,
                        gap_max,
                    );
                    serde_json::json!({
                    "epoch": r.epoch,
                    "cut": r.cut.to_string(),
                    "cut_ns": r.cut.as_nanosecond().to_string(),
                    "certain": judged.is_none(),
                    "uncertain_reason": judged.map(|u| u.code()),
                    "published_reason": r.uncertain.map(|u| u.code()),
                    "gap_max": gap_max.to_string(),
                    "gap_max_ns": gap_max.as_nanos().to_string(),
                    "quarantined": r.quarantined,
                    "publish_seq": r.publish_seq,
                    "published_at": r.published_at.to_string(),
                    "published_at_ns": r.published_at.as_nanosecond().to_string(),
                    "database_time": r.db_now.to_string(),
                    "database_time_ns": r.db_now.as_nanosecond().to_string(),
                    "cut_lag": r.lag().to_string(),
                    "cut_lag_ns": r.lag().as_nanos().to_string(),
                    "policy_version": r.policy.version(),
                    "horizon_ms": r.policy.horizon_ms(),
                    "policy_digest": r.policy.digest(),
                    "quarantine": r.quarantine_progress(&tuning).map(|q| quarantine_json(&q, r.proof_started_at)),
                    })
                }
            };
            emit_json(&json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy(PolicyCommand::Show) => {
            let mut c = connect(url).await?;
            let p = safetime_pg::load_policy(&mut c).await?;
            emit_json(
                &serde_json::json!({ "version": p.version(), "horizon_ms": p.horizon_ms(), "digest": p.digest() }),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Policy(PolicyCommand::Seal {
            horizon_ms,
            sealed_by,
        }) => {
            check_seal(horizon_ms, &sealed_by)?;
            let mut c = connect(url).await?;
            let p = safetime_pg::seal_policy(&mut c, horizon_ms, &sealed_by).await?;
            emit_json(
                &serde_json::json!({ "version": p.version(), "horizon_ms": p.horizon_ms(), "digest": p.digest() }),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Evidence { limit } => {
            if !(1..=EVIDENCE_MAX).contains(&limit) {
                return Err(Failure::Usage(format!(
                    "--limit must be in 1..={EVIDENCE_MAX}, got {limit}"
                )));
            }
            let mut c = connect(url).await?;
            for e in safetime_pg::evidence(&mut c, limit).await? {
                let mut detail: serde_json::Value = serde_json::from_str(&e.detail)
                    .unwrap_or(serde_json::Value::String(e.detail.clone()));
                evidence_instants(&mut detail);
                emit_json(
                    &serde_json::json!({ "evidence_id": e.evidence_id, "kind": e.kind, "epoch": e.epoch, "detail": detail }),
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Rewrites the instants of an evidence row's `detail` (as PostgreSQL
/// wrote them, `2026-12-01T15:25:09.43013+00:00`) in the form of every
/// other instant Tollgate prints, UTC with `Z`, each with its lossless
/// `_ns` companion (nanoseconds since the Unix epoch, a decimal string).
/// An instant is a string member named `cut` or ending in `_at` or `_time`
/// that parses as RFC 3339, at any depth; everything else is left as is.
fn evidence_instants(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            let mut companions = Vec::new();
            for (key, member) in map.iter_mut() {
                let named = key == "cut" || key.ends_with("_at") || key.ends_with("_time");
                match member {
                    serde_json::Value::String(text) if named => {
                        if let Ok(t) = text.parse::<jiff::Timestamp>() {
                            *text = t.to_string();
                            companions.push((format!("{key}_ns"), t.as_nanosecond().to_string()));
                        }
                    }
                    other => evidence_instants(other),
                }
            }
            for (key, ns) in companions {
                map.entry(key).or_insert(serde_json::Value::String(ns));
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(evidence_instants),
        _ => {}
    }
}

/// The bounds of `policy seal`, checked before connecting: `horizon_ms`
/// in `1..=HORIZON_MS_MAX`, `sealed_by` 1..=[`SEALED_BY_MAX_CHARS`]
/// characters without control characters (it is recorded in the evidence
/// and printed by `evidence`).
///
/// # Errors
/// [`Failure::Usage`] naming the flag, the bound and the value.
fn check_seal(horizon_ms: i64, sealed_by: &str) -> Result<(), Failure> {
    let n = sealed_by.chars().count();
    if !(1..=SEALED_BY_MAX_CHARS).contains(&n) {
        return Err(Failure::Usage(format!(
            "--sealed-by must be 1..={SEALED_BY_MAX_CHARS} characters, got {n}"
        )));
    }
    if let Some(c) = sealed_by.chars().find(|c| c.is_control()) {
        return Err(Failure::Usage(format!(
            "--sealed-by must not contain control characters, got {:?} at character {}",
            c,
            sealed_by.chars().position(|x| x == c).unwrap_or(0) + 1
        )));
    }
    if !(1..=HORIZON_MS_MAX).contains(&horizon_ms) {
        return Err(Failure::Usage(format!(
            "--horizon-ms must be 1..={HORIZON_MS_MAX} (100 years), got {horizon_ms}"
        )));
    }
    Ok(())
}

/// `--standby-poll` as a `Duration`: positive and at most
/// [`STANDBY_POLL_MAX`].
///
/// # Errors
/// [`Failure::Usage`] naming the flag, the bound and the value.
fn standby_poll(d: SignedDuration) -> Result<Duration, Failure> {
    let poll = std_duration("--standby-poll", d)?;
    if poll > STANDBY_POLL_MAX {
        return Err(Failure::Usage(format!(
            "--standby-poll must be at most PT1H, got {d}"
        )));
    }
    Ok(poll)
}

/// The `quarantine` member of `status` while the initial quarantine is in
/// force: what its proof still needs (`remaining`), needs in all
/// (`required`: the horizon plus the drift allowance, at least the recovery
/// grace) and has observed (`observed`: database time since
/// `proof_started_at`), each in ISO 8601 and as integer nanoseconds in a
/// decimal string, and `hint`, one sentence of the same with how to
/// shorten it safely.
fn quarantine_json(q: &QuarantineProgress, proof_started_at: jiff::Timestamp) -> serde_json::Value {
    serde_json::json!({
        "remaining": q.remaining.to_string(),
        "remaining_ns": q.remaining.as_nanos().to_string(),
        "required": q.required.to_string(),
        "required_ns": q.required.as_nanos().to_string(),
        "observed": q.observed.to_string(),
        "observed_ns": q.observed.as_nanos().to_string(),
        "drift_ppm": q.drift_ppm,
        "proof_started_at": proof_started_at.to_string(),
        "proof_started_at_ns": proof_started_at.as_nanosecond().to_string(),
        "hint": format!(
            "{q}. To shorten it safely: stop every sampler, seal a shorter horizon (at least \
             the service's max_ttl + reclaim_grace + --safetime-gap-max, and no shorter than \
             any active lease's granted TTL plus grace; the database refuses one below the \
             recorded max_ttl + reclaim_grace) with `tollgate-safetime policy \
             seal --horizon-ms <ms> --sealed-by <name>`, then start the samplers again; the \
             next epoch's proof runs for the new horizon"
        ),
    })
}

async fn run(args: RunArgs, url: &str) -> Result<ExitCode, Failure> {
    let config = SafeTimeConfig::new(
        args.drift_ppm,
        flag_duration("--interval", &args.interval)?,
        flag_duration("--gap-max", &args.gap_max)?,
        flag_duration("--round-trip-max", &args.round_trip_max)?,
        args.stable_observations,
        flag_duration("--recovery-grace", &args.recovery_grace)?,
    )
    .map_err(|e| Failure::Usage(run_flags_error(&e)))?;
    let options = SamplerOptions {
        config,
        standby_poll: standby_poll(flag_duration("--standby-poll", &args.standby_poll)?)?,
        reconnect_max: DEFAULT_RECONNECT_MAX,
    };
    let sampler = Sampler::new(url, options)?;
    let (stop, rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested; releasing leadership");
        let _ = stop.send(true);
    });
    tracing::info!(
        interval = %config.interval(),
        drift_ppm = config.drift_ppm(),
        gap_max = %config.gap_max(),
        "safe-time sampler starting"
    );
    sampler.run(rx).await;
    tracing::info!("safe-time sampler stopped");
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(r: Result<(), Failure>) -> String {
        match r {
            Err(Failure::Usage(m)) => m,
            other => panic!("not a usage error: {other:?}"),
        }
    }

    /// `policy seal` bounds its horizon and refuses control characters in
    /// `--sealed-by`, naming the flag and the value.
    #[test]
    fn evidence_instants_are_z_with_ns_companions() {
        let mut detail = serde_json::json!({
            "database_time": "2026-12-01T15:25:09.43013+00:00",
            "proof_started_at": "2026-12-01T16:25:09.000001+01:00",
            "cut": "database_time",
            "sealed_by": "2026-12-01T15:25:09Z",
            "nested": [{"database_time": "2026-12-01T15:25:09+00:00"}],
        });
        evidence_instants(&mut detail);
        assert_eq!(
            detail,
            serde_json::json!({
                "database_time": "2026-12-01T15:25:09.43013Z",
                "database_time_ns": "1796138709430130000",
                "proof_started_at": "2026-12-01T15:25:09.000001Z",
                "proof_started_at_ns": "1796138709000001000",
                "cut": "database_time",
                "sealed_by": "2026-12-01T15:25:09Z",
                "nested": [{
                    "database_time": "2026-12-01T15:25:09Z",
                    "database_time_ns": "1796138709000000000",
                }],
            })
        );
    }

    #[test]
    fn seal_bounds() {
        assert!(check_seal(1, "ops: alice").is_ok());
        assert!(check_seal(HORIZON_MS_MAX, &"a".repeat(200)).is_ok());
        assert_eq!(
            usage(check_seal(i64::MAX, "ops")),
            format!(
                "--horizon-ms must be 1..=3153600000000 (100 years), got {}",
                i64::MAX
            )
        );
        assert_eq!(
            usage(check_seal(HORIZON_MS_MAX + 1, "ops")),
            "--horizon-ms must be 1..=3153600000000 (100 years), got 3153600000001"
        );
        assert_eq!(
            usage(check_seal(0, "ops")),
            "--horizon-ms must be 1..=3153600000000 (100 years), got 0"
        );
        assert_eq!(
            usage(check_seal(1, "ops\u{1b}[2J")),
            "--sealed-by must not contain control characters, got '\\u{1b}' at character 4"
        );
        assert_eq!(
            usage(check_seal(1, "a\nb")),
            "--sealed-by must not contain control characters, got '\\n' at character 2"
        );
        assert_eq!(
            usage(check_seal(1, "")),
            "--sealed-by must be 1..=200 characters, got 0"
        );
    }

    /// `--standby-poll` is positive and at most an hour.
    #[test]
    fn standby_poll_bounds() {
        assert_eq!(
            standby_poll(SignedDuration::from_secs(3_600)).ok(),
            Some(Duration::from_secs(3_600))
        );
        let over = standby_poll(SignedDuration::from_secs(3_601)).map(|_| ());
        assert_eq!(
            usage(over),
            "--standby-poll must be at most PT1H, got PT1H1S"
        );
        let zero = standby_poll(SignedDuration::ZERO).map(|_| ());
        assert_eq!(usage(zero), "--standby-poll must be positive, got PT0S");
    }
}
