//! Logging of the `tollgate` binary: `tracing` on stderr, in the format of
//! `--log-format`, at the level of `TOLLGATE_LOG`.

use super::args::LogFormat;

/// Initialises logging on stderr. Level from `TOLLGATE_LOG` (tracing
/// targets syntax), default `default_level`.
pub fn init_logging(format: LogFormat, default_level: &str) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let spec = std::env::var("TOLLGATE_LOG").unwrap_or_else(|_| default_level.to_string());
    let filter = log_filter(&spec).unwrap_or_else(|| {
        say!(
            "warning: TOLLGATE_LOG={spec:?} is neither a level (error, warn, info, debug, \
             trace, off) nor target=level directives; logging at {default_level}"
        );
        log_filter(default_level)
            .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO))
    });
    let registry = tracing_subscriber::registry().with(filter);
    // Colour only for a terminal: a log file or journal gets plain text.
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // A log line that cannot be written is dropped: the default
        // reports it with `eprintln!`, which panics on that same stderr.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal());
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
