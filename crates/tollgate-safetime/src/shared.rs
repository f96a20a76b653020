//! The command-line conventions this binary shares with `tollgate`, kept
//! here because the sampler depends on no crate of the service: the same
//! log setting (`TOLLGATE_LOG_LEVEL`, its grammar, the deprecated
//! `TOLLGATE_LOG`), the same duration checker and wording, and the same
//! JSON output style. The tests of both binaries pin the same texts.

/// The environment variable of `--log-level`, the same for both binaries.
pub const LOG_LEVEL_ENV: &str = "TOLLGATE_LOG_LEVEL";

/// The former name of [`LOG_LEVEL_ENV`], still read (with a deprecation
/// warning) when neither `--log-level` nor [`LOG_LEVEL_ENV`] is set.
pub const LOG_LEVEL_DEPRECATED_ENV: &str = "TOLLGATE_LOG";

/// What a duration may look like, for messages.
pub const DURATION_EXAMPLES: &str = "e.g. PT30S, PT0.000000001S, 30s, 1h 30m or 250ms";

/// Parses a duration as `tollgate` does: ISO 8601 or jiff's friendly
/// format, surrounding spaces ignored.
///
/// # Errors
/// A message naming the value and showing the accepted forms
/// ([`DURATION_EXAMPLES`]), not the parser's own text.
pub fn parse_duration(s: &str) -> Result<jiff::SignedDuration, String> {
    s.trim().parse::<jiff::SignedDuration>().map_err(|_| {
        format!("{s:?} is not an ISO 8601 or friendly duration: write {DURATION_EXAMPLES}")
    })
}

/// Writes one line to standard error, ignoring a failure (there is
/// nowhere left to report it).
fn warn(text: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Initialises logging on stderr as `tollgate` does. Level from `level`
/// (`--log-level` or `TOLLGATE_LOG_LEVEL`: a level or `target=level`
/// directives), else from the deprecated `TOLLGATE_LOG` (with a warning),
/// default `default_level`; a value that is neither a level nor directives
/// is reported and `default_level` applies. PostgreSQL's notices are
/// logged from DEBUG only, and sqlx's URL parser (which would echo a URL
/// parameter's value) only at ERROR.
pub fn init_logging(level: Option<String>, default_level: tracing::Level) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let default = || Targets::new().with_default(default_level);
    let (name, spec) = match level {
        Some(spec) => ("--log-level (or TOLLGATE_LOG_LEVEL)", Some(spec)),
        None => match std::env::var(LOG_LEVEL_DEPRECATED_ENV) {
            Ok(spec) => {
                warn(&format!(
                    "warning: {LOG_LEVEL_DEPRECATED_ENV} is deprecated; set {LOG_LEVEL_ENV} \
                     (or --log-level) instead, the name both tollgate and tollgate-safetime read"
                ));
                (LOG_LEVEL_DEPRECATED_ENV, Some(spec))
            }
            Err(_) => ("--log-level (or TOLLGATE_LOG_LEVEL)", None),
        },
    };
    let filter = match spec {
        None => default(),
        Some(spec) => log_filter(&spec).unwrap_or_else(|| {
            warn(&format!(
                "warning: {name} {spec:?} is neither a level (error, warn, info, debug, \
                 trace, off) nor target=level directives; logging at {}",
                default_level.as_str().to_ascii_lowercase()
            ));
            default()
        }),
    };
    let filter = quiet_notices(filter).with_target(SQLX_URL_PARSER_TARGET, tracing::Level::ERROR);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A log that cannot be written (a full disk, a closed pipe) is
        // dropped: the default would report it with `eprintln!`, which
        // panics on that same stderr and would kill the sampler.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
}

/// The filter for a log setting: a bare level (`warn`), or comma-separated
/// `target=level` directives, optionally with a bare default level among
/// them (`info,safetime_pg=debug`). `None` for anything else, such as a
/// bare word that is not a level, which the directive syntax would read as
/// "only target `word`" and so silence every log.
fn log_filter(spec: &str) -> Option<tracing_subscriber::filter::Targets> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let valid = !spec.trim().is_empty()
        && spec.split(',').all(|d| {
            let d = d.trim();
            match d.split_once('=') {
                Some((target, level)) => {
                    !target.is_empty() && LEVELS.contains(&level.to_ascii_lowercase().as_str())
                }
                None => LEVELS.contains(&d.to_ascii_lowercase().as_str()),
            }
        });
    if !valid {
        return None;
    }
    spec.parse().ok()
}

/// PostgreSQL's notices, which sqlx logs at INFO, are logged only from
/// DEBUG up unless the filter names sqlx's targets itself.
fn quiet_notices(
    filter: tracing_subscriber::filter::Targets,
) -> tracing_subscriber::filter::Targets {
    if filter.iter().any(|(target, _)| target.starts_with("sqlx")) {
        return filter;
    }
    if filter.would_enable(SQLX_NOTICE_TARGET, &tracing::Level::DEBUG) {
        filter
    } else {
        filter.with_target(SQLX_NOTICE_TARGET, tracing::Level::WARN)
    }
}

/// The `tracing` target of the PostgreSQL notices sqlx logs.
const SQLX_NOTICE_TARGET: &str = "sqlx::postgres::notice";

/// The `tracing` target of sqlx's connection-URL parser.
const SQLX_URL_PARSER_TARGET: &str = "sqlx_postgres::options::parse";

/// `v` as `tollgate` prints a result: indented when standard output is a
/// terminal, otherwise one line (a pipe or a file gets one JSON document
/// per line).
///
/// # Errors
/// serde_json's, when `v` cannot be serialized.
pub fn render_json(v: &serde_json::Value) -> serde_json::Result<String> {
    use std::io::IsTerminal as _;
    if std::io::stdout().is_terminal() {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    /// The grammar: levels, `off` and directives are filters; a bare word
    /// that is not a level is not.
    #[test]
    fn log_filter_grammar() {
        for spec in [
            "info",
            "off",
            "info,tollgate_pg=debug",
            "safetime_pg=trace",
            "WARN",
        ] {
            assert!(log_filter(spec).is_some(), "{spec}");
        }
        for spec in ["", "loud", "info,", "=debug", "tollgate_pg=loud"] {
            assert!(log_filter(spec).is_none(), "{spec}");
        }
        let info = quiet_notices(log_filter("info").expect("info"));
        assert!(!info.would_enable(SQLX_NOTICE_TARGET, &Level::INFO));
        assert!(info.would_enable(SQLX_NOTICE_TARGET, &Level::WARN));
    }

    /// The copies agree with `tollgate`'s own (a dev-dependency only: the
    /// sampler does not depend on the service's crate).
    #[test]
    fn the_conventions_are_tollgates() {
        assert_eq!(LOG_LEVEL_ENV, tollgate_server::cli::LOG_LEVEL_ENV);
        assert_eq!(
            LOG_LEVEL_DEPRECATED_ENV,
            tollgate_server::cli::LOG_LEVEL_DEPRECATED_ENV
        );
        assert_eq!(
            DURATION_EXAMPLES,
            tollgate_server::config::DURATION_EXAMPLES
        );
        for s in [
            "PT30S",
            " 1h 30m ",
            "250ms",
            "-5s",
            "10 parsecs",
            "",
            "P1D",
            "max",
        ] {
            assert_eq!(
                parse_duration(s),
                tollgate_server::config::parse_duration(s, false),
                "{s:?}"
            );
        }
    }

    #[test]
    fn durations_are_worded_like_tollgates() {
        assert_eq!(
            parse_duration(" PT1.5S "),
            Ok(jiff::SignedDuration::from_millis(1500))
        );
        assert_eq!(
            parse_duration("10 parsecs"),
            Err(
                "\"10 parsecs\" is not an ISO 8601 or friendly duration: write e.g. PT30S, \
                 PT0.000000001S, 30s, 1h 30m or 250ms"
                    .to_string()
            )
        );
    }
}
