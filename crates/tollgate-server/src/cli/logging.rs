//! Logging of the `tollgate` binary: `tracing` on stderr, in the format of
//! `--log-format`, at the level of `--log-level` (`TOLLGATE_LOG_LEVEL`,
//! the name `tollgate-safetime` uses too; the former `TOLLGATE_LOG` is still
//! read, with a deprecation warning).

use super::args::{LOG_LEVEL_DEPRECATED_ENV, LOG_LEVEL_ENV, LogFormat};

/// Initialises logging on stderr. Level from `level` (`--log-level` or
/// `TOLLGATE_LOG_LEVEL`, tracing targets syntax), else from the deprecated
/// `TOLLGATE_LOG` (with a warning on stderr), default `default_level`; a
/// value that is neither a level nor directives is reported on stderr and
/// `default_level` applies. PostgreSQL's notices (`relation ... already
/// exists, skipping`) are logged at DEBUG, not INFO.
pub fn init_logging(format: LogFormat, level: Option<String>, default_level: tracing::Level) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let default = || Targets::new().with_default(default_level);
    let (name, spec) = match level {
        Some(spec) => ("--log-level (or TOLLGATE_LOG_LEVEL)", Some(spec)),
        None => match std::env::var(LOG_LEVEL_DEPRECATED_ENV) {
            Ok(spec) => {
                say!(
                    "warning: {LOG_LEVEL_DEPRECATED_ENV} is deprecated; set {LOG_LEVEL_ENV} \
                     (or --log-level) instead, the name both tollgate and tollgate-safetime read"
                );
                (LOG_LEVEL_DEPRECATED_ENV, Some(spec))
            }
            Err(_) => ("--log-level (or TOLLGATE_LOG_LEVEL)", None),
        },
    };
    let filter = match spec {
        None => default(),
        Some(spec) => log_filter(&spec).unwrap_or_else(|| {
            say!(
                "warning: {name} {spec:?} is neither a level (error, warn, info, debug, \
                 trace, off) nor target=level directives; logging at {}",
                default_level.as_str().to_ascii_lowercase()
            );
            default()
        }),
    };
    let registry =
        tracing_subscriber::registry().with(quiet_sqlx_url_warnings(quiet_notices(filter)));
    // Colour only for a terminal: a log file or journal gets plain text.
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A log line that cannot be written is dropped: the default
        // reports it with `eprintln!`, which panics on that same stderr.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal());
    // Only the first call installs a subscriber; a later one (a test that
    // runs two commands in one process) keeps the first.
    let _ = match format {
        LogFormat::Human => registry.with(layer).try_init(),
        LogFormat::Json => registry.with(layer.json()).try_init(),
    };
}

/// The filter for a `TOLLGATE_LOG` value: a bare level (`warn`), or
/// comma-separated `target=level` directives, optionally with a bare
/// default level among them (`info,tollgate_pg=debug`). `None` for
/// anything else, such as a bare word that is not a level, which the
/// directive syntax would read as "only target `word`" and so silence
/// every log.
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

/// PostgreSQL's notices, which sqlx logs at INFO for severity NOTICE
/// (`relation "_sqlx_migrations" already exists, skipping` on every start),
/// are routine: unless the filter names their target itself, they are
/// logged only from DEBUG up (warnings from the server still show at WARN).
pub(crate) fn quiet_notices(
    filter: tracing_subscriber::filter::Targets,
) -> tracing_subscriber::filter::Targets {
    if filter.iter().any(|(target, _)| target.starts_with("sqlx")) {
        return filter;
    }
    let debug = filter.would_enable(SQLX_NOTICE_TARGET, &tracing::Level::DEBUG);
    if debug {
        filter
    } else {
        filter.with_target(SQLX_NOTICE_TARGET, tracing::Level::WARN)
    }
}

/// The `tracing` target of the PostgreSQL notices sqlx logs.
pub(crate) const SQLX_NOTICE_TARGET: &str = "sqlx::postgres::notice";

/// sqlx warns about a connection-URL parameter it does not know with the
/// parameter's value (`?sslpassword=...` would be logged verbatim), so its
/// URL parser logs errors only, whatever the filter.
pub(crate) fn quiet_sqlx_url_warnings(
    filter: tracing_subscriber::filter::Targets,
) -> tracing_subscriber::filter::Targets {
    filter.with_target(SQLX_URL_PARSER_TARGET, tracing::Level::ERROR)
}

/// The `tracing` target of sqlx's connection-URL parser.
pub(crate) const SQLX_URL_PARSER_TARGET: &str = "sqlx_postgres::options::parse";

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;
    use tracing_subscriber::filter::Targets;

    /// Whatever level or directives `TOLLGATE_LOG` gives, sqlx's URL parser
    /// logs errors only; other targets keep their levels.
    #[test]
    fn sqlx_url_warnings_are_never_enabled() {
        for spec in ["trace", "debug", "info,sqlx_postgres=trace", "warn"] {
            let f = quiet_sqlx_url_warnings(log_filter(spec).expect(spec));
            assert!(
                !f.would_enable(SQLX_URL_PARSER_TARGET, &Level::WARN),
                "{spec}"
            );
            assert!(
                f.would_enable(SQLX_URL_PARSER_TARGET, &Level::ERROR),
                "{spec}"
            );
        }
        let f = quiet_sqlx_url_warnings(Targets::new().with_default(Level::DEBUG));
        assert!(f.would_enable("tollgate_api::worker", &Level::DEBUG));
        assert!(!f.would_enable(SQLX_URL_PARSER_TARGET, &Level::INFO));
    }

    /// At INFO, PostgreSQL's notices (sqlx logs NOTICE at INFO) are not
    /// logged, its warnings are; at DEBUG, or when the directives name
    /// sqlx's targets, the filter stays as given.
    #[test]
    fn postgres_notices_are_debug_only() {
        let info = quiet_notices(log_filter("info").expect("info"));
        assert!(!info.would_enable(SQLX_NOTICE_TARGET, &Level::INFO));
        assert!(info.would_enable(SQLX_NOTICE_TARGET, &Level::WARN));
        assert!(info.would_enable("tollgate_server::pg", &Level::INFO));
        let debug = quiet_notices(log_filter("debug").expect("debug"));
        assert!(debug.would_enable(SQLX_NOTICE_TARGET, &Level::DEBUG));
        let named = quiet_notices(log_filter("info,sqlx=info").expect("named"));
        assert!(named.would_enable(SQLX_NOTICE_TARGET, &Level::INFO));
    }
}
