//! The state every handler shares: the store, the clock, the admin token,
//! the metrics and the reclaim worker, with the service's time bounds.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use clock::{Clock, ClockReading, TestClock, UncertainReason};
use httpkit::{RequestMetrics, ServiceState};
use jiff::SignedDuration;
use safetime::SafeTimeConfig;
use tollgate::{GrantPolicy, SuppliedTime};

use crate::auth::AdminToken;
use crate::error::ApiError;
use crate::metrics::{self, Metrics};
use crate::storage::ServiceStore;
use crate::worker::ReclaimWorker;

/// The largest accepted request body: 64 KiB holds a consolidation of
/// several hundred leases and bounds the memory one request can pin.
pub const BODY_LIMIT_BYTES: usize = 64 * 1024;

/// How the service is configured beyond its storage and clock.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// The admin bearer token.
    pub admin_token: String,
    /// Leases per reclaim batch (worker and `POST /v1/admin/reclaim` default).
    pub reclaim_batch: usize,
    /// Bound on every request's handling time.
    pub request_timeout: Duration,
}

struct Inner {
    store: ServiceStore,
    clock: Arc<dyn Clock>,
    admin: AdminToken,
    metrics: Arc<Metrics>,
    worker: ReclaimWorker,
    request_timeout: Duration,
}

/// Shared state of every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("store", &self.inner.store)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// State over `store` with time from `clock`.
    pub fn new(
        store: ServiceStore,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        options: ServiceOptions,
    ) -> AppState {
        let worker = ReclaimWorker::new(
            store.allocator.clone(),
            clock.clone(),
            options.reclaim_batch,
            metrics.clone(),
        );
        AppState {
            inner: Arc::new(Inner {
                store,
                clock,
                admin: AdminToken::new(&options.admin_token),
                metrics,
                worker,
                request_timeout: options.request_timeout,
            }),
        }
    }

    /// The reclaim worker sharing this state's store, clock and metrics.
    pub fn worker(&self) -> &ReclaimWorker {
        &self.inner.worker
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The store.
    pub fn store(&self) -> &ServiceStore {
        &self.inner.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The admin token.
    pub(crate) fn admin(&self) -> &AdminToken {
        &self.inner.admin
    }

    /// The clock's instant, certain or not (deposit, release).
    pub(crate) async fn now(&self) -> Result<jiff::Timestamp, ApiError> {
        Ok(self.inner.clock.read().await?.now)
    }

    /// The clock's reading as supplied time, certain or not (renew, and the
    /// `expires_in` of `GET /v1/leases/{id}`): judged at the reading's
    /// instant, deadlines counted from its grant base.
    pub(crate) async fn supplied(&self) -> Result<SuppliedTime, ApiError> {
        Ok(supplied_time(&self.inner.clock.read().await?))
    }

    /// The clock's reading as supplied time for an operation that admits
    /// new deadline-bearing work (`operation`: `acquire` or `consolidate`):
    /// refused with [`ApiError::TimeUncertain`] ([`ApiError::Quarantined`]
    /// in the initial quarantine, saying what it still needs), and counted
    /// as paused, when the reading is uncertain.
    pub(crate) async fn admission(
        &self,
        operation: &'static str,
    ) -> Result<SuppliedTime, ApiError> {
        let reading = self.inner.clock.read().await?;
        match reading.uncertain {
            None => Ok(supplied_time(&reading)),
            Some(reason) => {
                self.inner
                    .metrics
                    .inc(metrics::SAFETIME_PAUSED, &[("operation", operation)]);
                let retry_after_secs = self.inner.clock.retry_after_secs();
                if reason == UncertainReason::InitialQuarantine
                    && let Some(progress) = self.quarantine_progress()
                {
                    return Err(ApiError::Quarantined {
                        progress,
                        retry_after_secs,
                    });
                }
                Err(ApiError::TimeUncertain {
                    reason,
                    retry_after_secs,
                })
            }
        }
    }

    /// What the initial quarantine still needs and how to shorten it, from
    /// the clock's last reading of the cut ([`quarantine_progress`]);
    /// `None` when that reading shows no quarantine (another request's read
    /// saw it clear) or the clock keeps no cut.
    fn quarantine_progress(&self) -> Option<String> {
        let status = self.inner.clock.safe_time()?;
        let row = status.row.as_ref()?;
        quarantine_progress(row, self.inner.store.allocator.policy(), status.gap_max)
    }
}

/// The detail of a `time_uncertain` answer in the initial quarantine read
/// from `row`: how much uninterrupted trusted time its proof still needs,
/// computed with the samplers' default tuning
/// ([`SafeTimeConfig::default`]: 50 ppm drift allowance, 5 s recovery
/// grace), and how to shorten it safely: with every sampler stopped, seal a
/// shorter horizon, at least `max_ttl + reclaim_grace + gap_max` of this
/// service (in whole milliseconds, rounded up; the service refuses to start
/// on a shorter one) and at least the longest deadline a still-active
/// lease was granted with (one granted under an earlier, longer policy is
/// covered only by a horizon that long). `None` when `row` is not
/// quarantined.
pub(crate) fn quarantine_progress(
    row: &clock::CutRow,
    policy: GrantPolicy,
    gap_max: SignedDuration,
) -> Option<String> {
    let progress = row.quarantine_progress(&SafeTimeConfig::default())?;
    let least = policy
        .max_ttl()
        .checked_add(policy.reclaim_grace())
        .and_then(|d| d.checked_add(gap_max))
        .map(|d| {
            let ms = d.as_nanos().div_euclid(1_000_000);
            if d.as_nanos().rem_euclid(1_000_000) == 0 {
                ms
            } else {
                ms + 1
            }
        });
    let least = match least {
        Some(ms) => format!("{ms} ms, "),
        None => String::new(),
    };
    let bound = format!(
        "at least {least}this service's max_ttl + reclaim_grace + safetime_gap_max, \
         and no shorter than any active lease's granted TTL plus grace"
    );
    Some(format!(
        "{progress}. To shorten it safely: stop every sampler, seal a shorter horizon \
         ({bound}) with `tollgate-safetime policy seal --horizon-ms <ms> --sealed-by <name>`, \
         then start the samplers again; the next epoch's proof runs for the new horizon"
    ))
}

/// The supplied time of a reading: expiry judged at `reading.now`, new
/// deadlines counted from [`ClockReading::grant_base`] and limited to the
/// reading's deadline limit.
pub fn supplied_time(reading: &ClockReading) -> SuppliedTime {
    let at = SuppliedTime::new(reading.now, reading.grant_base());
    match reading.deadline_limit {
        Some(limit) => at.with_deadline_limit(limit),
        None => at,
    }
}

impl ServiceState for AppState {
    type Error = ApiError;

    fn body_max_bytes(&self) -> usize {
        BODY_LIMIT_BYTES
    }

    fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }
}

impl RequestMetrics for AppState {
    fn count_request(
        &self,
        method: &Method,
        route: &str,
        status: StatusCode,
        error_code: Option<&'static str>,
    ) {
        let m = &self.inner.metrics;
        m.inc(
            metrics::HTTP_REQUESTS,
            &[
                ("method", method.as_str()),
                ("route", route),
                ("status", status.as_str()),
            ],
        );
        if let Some(code) = error_code {
            m.inc(metrics::ERRORS, &[("code", code)]);
        }
    }

    fn count_refusal(&self, _status: StatusCode, error_code: &'static str) {
        self.inner
            .metrics
            .inc(metrics::ERRORS, &[("code", error_code)]);
    }
}

/// The clock of a service started with `--clock test`, which
/// `PUT /v1/admin/test-clock` sets; any other clock is refused with 409
/// [`ApiError::TestClockDisabled`].
#[derive(Debug, Clone)]
pub struct SettableClock(Arc<dyn Clock>);

impl SettableClock {
    /// The test clock.
    ///
    /// # Panics
    /// Never: extraction admits only a clock that is a test clock.
    pub fn test_clock(&self) -> &TestClock {
        self.0
            .as_test()
            .expect("a SettableClock is extracted only from a test clock")
    }
}

impl FromRequestParts<AppState> for SettableClock {
    type Rejection = ApiError;

    async fn from_request_parts(_: &mut Parts, s: &AppState) -> Result<SettableClock, ApiError> {
        match s.clock().as_test() {
            Some(_) => Ok(SettableClock(s.clock().clone())),
            None => Err(ApiError::TestClockDisabled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;
    use safetime::HorizonPolicy;

    fn row(quarantined: bool) -> clock::CutRow {
        let t: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
        clock::CutRow {
            epoch: 1,
            cut: Timestamp::UNIX_EPOCH,
            uncertain: Some(UncertainReason::InitialQuarantine),
            quarantined,
            publish_seq: 1,
            published_at: t,
            proof_started_at: t,
            db_now: t,
            policy: HorizonPolicy::verified(2, 80_000, &HorizonPolicy::digest_of(2, 80_000))
                .unwrap(),
        }
    }

    /// The least horizon is rounded up to the millisecond; a row that is
    /// not quarantined has no progress.
    #[test]
    fn quarantine_progress_rounds_the_least_horizon_up() {
        let s = SignedDuration::from_secs;
        let policy = GrantPolicy::new(s(60) + SignedDuration::from_nanos(1), s(5)).unwrap();
        let detail = quarantine_progress(&row(true), policy, s(5)).unwrap();
        assert!(
            detail.starts_with(
                "the initial quarantine needs PT1M20.004000201S more of uninterrupted trusted \
                 time (a proof of PT1M20.004000201S in all: the sealed horizon PT1M20S plus the \
                 50 ppm drift allowance; PT0S observed since it began;"
            ),
            "{detail}"
        );
        assert!(
            detail.contains("(at least 70001 ms, this service's max_ttl"),
            "{detail}"
        );
        let whole = GrantPolicy::new(s(60), s(5)).unwrap();
        let detail = quarantine_progress(&row(true), whole, s(5)).unwrap();
        assert!(detail.contains("(at least 70000 ms, "), "{detail}");
        // A sum beyond the duration range: no number, the rule in words.
        let huge = GrantPolicy::new(s(60), SignedDuration::MAX).unwrap();
        let detail = quarantine_progress(&row(true), huge, s(5)).unwrap();
        assert!(
            detail.contains("(at least this service's max_ttl + reclaim_grace"),
            "{detail}"
        );
        assert_eq!(quarantine_progress(&row(false), whole, s(5)), None);
    }
}
