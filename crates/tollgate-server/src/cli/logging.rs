//! Logging of the `tollgate` binary: `tracing` on stderr, in the format of
//! `--log-format`, at the level of `TOLLGATE_LOG`.

use super::args::LogFormat;

/// Initialises logging on stderr. Level from `TOLLGATE_LOG` (tracing
/// targets syntax), default `default_level`; a `TOLLGATE_LOG` that is
/// neither a level nor directives is reported on stderr and
/// `default_level` applies.
pub fn init_logging(format: LogFormat, default_level: tracing::Level) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let default = || Targets::new().with_default(default_level);
    let filter = match std::env::var("TOLLGATE_LOG") {
        Err(_) => default(),
        Ok(spec) => log_filter(&spec).unwrap_or_else(|| {
            say!(
                "warning: TOLLGATE_LOG={spec:?} is neither a level (error, warn, info, debug, \
                 trace, off) nor target=level directives; logging at {}",
                default_level.as_str().to_ascii_lowercase()
            );
            default()
        }),
    };
    let registry = tracing_subscriber::registry().with(quiet_sqlx_url_warnings(filter));
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
}
