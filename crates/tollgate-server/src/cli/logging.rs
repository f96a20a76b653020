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
    let registry = tracing_subscriber::registry().with(filter);
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
