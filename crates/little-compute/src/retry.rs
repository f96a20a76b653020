//! The one bounded wait every subcommand does at start-up: for the
//! database, for a provider.

use std::future::Future;
use std::time::Duration;

/// Runs `attempt` until it succeeds, fails in a way `retryable` rejects,
/// or `deadline` passes (the last error is then returned), pausing `pause`
/// between attempts and logging each retried error as waiting for `what`.
/// The deadline bounds the loop: at most `deadline / pause` + 1 attempts.
pub async fn until<T, E, F, Fut>(
    deadline: tokio::time::Instant,
    pause: Duration,
    what: &str,
    retryable: impl Fn(&E) -> bool,
    mut attempt: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    loop {
        match attempt().await {
            Err(e) if retryable(&e) && tokio::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "waiting for {what}");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}
