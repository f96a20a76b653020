//! The reclaim worker: a loop around one [`ReclaimWorker::step`].
//!
//! A step reads the clock once and asks the store to settle at most `batch`
//! leases reclaimable at that instant ([`Allocator::reclaim`]); it returns
//! what it settled, logs it, and counts it in [`crate::metrics`] (with each
//! lease's lateness in the late-expiry histogram). Tests drive `step`
//! directly with a [`clock::TestClock`]: no sleeps.
//!
//! When the clock's reading is uncertain (the safe expiry cut) the step
//! settles nothing: it returns [`ApiError::TimeUncertain`] without calling
//! the store and counts a paused pass
//! ([`crate::metrics::SAFETIME_PAUSED`], `operation="reclaim"`). Reclaim
//! is the one irreversible time path, so it never runs on an instant the
//! clock does not vouch for.
//!
//! [`ReclaimWorker::run`] repeats steps: after a full batch it steps again at
//! once (at most [`DRAIN_PASSES_MAX`] times in a row, so one tick is
//! bounded), otherwise it sleeps `interval` or until shutdown. Several
//! workers (in several processes) may run at once: the store guarantees
//! each lease is settled exactly once.

use std::sync::Arc;
use std::time::Duration;

use clock::Clock;
use jiff::Timestamp;
use tokio::sync::watch;
use tollgate::{Allocator, ReclaimReport};

use crate::error::ApiError;
use crate::metrics::{self, Metrics};

/// Passes one tick may run back to back while batches come back full: with
/// the default batch of 1,000 that is 100,000 leases per tick, enough to
/// drain a backlog quickly without starving shutdown for long.
pub const DRAIN_PASSES_MAX: usize = 100;

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimPass {
    /// The supplied time of the pass.
    pub now: Timestamp,
    /// What the store settled.
    pub report: ReclaimReport,
}

/// The reclaim worker; see the module docs.
#[derive(Clone)]
pub struct ReclaimWorker {
    allocator: Arc<dyn Allocator>,
    clock: Arc<dyn Clock>,
    batch: usize,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for ReclaimWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReclaimWorker")
            .field("clock", &self.clock)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl ReclaimWorker {
    /// A worker settling at most `batch` leases per step.
    pub fn new(
        allocator: Arc<dyn Allocator>,
        clock: Arc<dyn Clock>,
        batch: usize,
        metrics: Arc<Metrics>,
    ) -> ReclaimWorker {
        ReclaimWorker {
            allocator,
            clock,
            batch,
            metrics,
        }
    }

    /// The batch size.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// One pass with the configured batch.
    ///
    /// # Errors
    /// [`ApiError::TimeUncertain`] when the clock's reading is uncertain
    /// (a paused pass), the clock's or the store's error; nothing changed.
    pub async fn step(&self) -> Result<ReclaimPass, ApiError> {
        self.step_with_limit(self.batch).await
    }

    /// One pass settling at most `limit` leases (the core checks `limit`).
    ///
    /// # Errors
    /// As [`ReclaimWorker::step`]; nothing changed.
    pub async fn step_with_limit(&self, limit: usize) -> Result<ReclaimPass, ApiError> {
        let result = self.pass(limit).await;
        match &result {
            Ok(p) => {
                self.metrics
                    .inc(metrics::RECLAIM_PASSES, &[("outcome", "ok")]);
                for late_by in &p.report.late_by {
                    self.metrics.observe_late(*late_by);
                }
                self.metrics.add(
                    metrics::RECLAIM_LEASES,
                    &[],
                    p.report.reclaimed.len() as u128,
                );
                self.metrics.add(
                    metrics::RECLAIM_UNITS,
                    &[],
                    u128::try_from(p.report.units_charged)
                        .expect("a reclaim charges a non-negative number of units"),
                );
                if p.report.reclaimed.is_empty() {
                    tracing::debug!(now = %p.now, "reclaim pass settled nothing");
                } else {
                    tracing::info!(
                        now = %p.now,
                        cutoff = ?p.report.cutoff.map(|c| c.to_string()),
                        leases = p.report.reclaimed.len(),
                        units = %p.report.units_charged,
                        "reclaim pass settled leases"
                    );
                }
            }
            Err(ApiError::TimeUncertain { reason, .. }) => {
                self.metrics
                    .inc(metrics::SAFETIME_PAUSED, &[("operation", "reclaim")]);
                tracing::debug!(
                    reason = reason.code(),
                    "reclaim pass paused: the safe expiry cut is uncertain"
                );
            }
            Err(e) => {
                self.metrics
                    .inc(metrics::RECLAIM_PASSES, &[("outcome", "error")]);
                tracing::warn!(code = e.code(), error = %e, "reclaim pass failed");
            }
        }
        result
    }

    async fn pass(&self, limit: usize) -> Result<ReclaimPass, ApiError> {
        let reading = self.clock.read().await?;
        if let Some(reason) = reading.uncertain {
            return Err(ApiError::TimeUncertain {
                reason,
                retry_after_secs: self.clock.retry_after_secs(),
            });
        }
        let now = reading.now;
        let report = self.allocator.reclaim(now, limit).await?;
        Ok(ReclaimPass { now, report })
    }

    /// Steps until a batch comes back short (or [`DRAIN_PASSES_MAX`] passes
    /// or an error); returns the leases settled.
    pub async fn drain(&self) -> usize {
        let mut settled = 0;
        for _ in 0..DRAIN_PASSES_MAX {
            match self.step().await {
                Ok(p) => {
                    settled += p.report.reclaimed.len();
                    if p.report.reclaimed.len() < self.batch {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        settled
    }

    /// Drains every `interval` until `shutdown` turns `true` (or its sender
    /// goes away). Returns after the pass in progress finishes.
    pub async fn run(&self, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(batch = self.batch, ?interval, "reclaim worker started");
        loop {
            if *shutdown.borrow() {
                break;
            }
            self.drain().await;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
        tracing::info!("reclaim worker stopped");
    }
}
