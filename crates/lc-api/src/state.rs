//! The state every handler shares: the store, the clock, the credentials,
//! the runtime directory and the metrics, with the service's bounds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use clock::{Clock, UncertainReason};
use httpkit::{RequestMetrics, ServiceState};
use lc_blob::BlobStore;
use lc_core::LcError;
use lc_core::model::CutReading;
use lc_core::store::ControlStore;

use crate::auth::{AdminDigest, ServerSecret};
use crate::error::ApiError;
use crate::metrics::{self, Metrics};

/// The largest JSON request body, in bytes: the largest command the rules
/// accept (64 KiB of argv) still fits when every byte is written as a
/// six-byte `\u00XX` escape, with room for the other members.
pub const JSON_BODY_MAX_BYTES: usize = 512 * 1024;

/// The largest runtime tarball accepted over HTTP, in bytes. The whole body
/// is held in memory while it is checked and unpacked, so this bounds the
/// memory one import can pin; larger trees are imported on the host from a
/// directory.
pub const RUNTIME_TAR_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Default bound on receiving a request's body and, separately, on handling
/// it.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// How the service is configured beyond its store and clock.
#[derive(Clone)]
pub struct ServiceOptions {
    /// Where imported runtimes are unpacked (shared with the provider on
    /// the same host); `None` refuses runtime import with
    /// `runtime_import_disabled`.
    pub runtime_dir: Option<PathBuf>,
    /// Bound on every request's body and, separately, its handling.
    pub request_timeout: Duration,
    /// The sink the gateways write output pages' bytes to (read-only
    /// here); `None` serves only pages whose bytes the store holds, and
    /// answers `sink_unavailable` for the others.
    pub sink: Option<Arc<dyn BlobStore>>,
}

impl std::fmt::Debug for ServiceOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceOptions")
            .field("runtime_dir", &self.runtime_dir)
            .field("request_timeout", &self.request_timeout)
            .field("sink", &self.sink.is_some())
            .finish()
    }
}

impl Default for ServiceOptions {
    fn default() -> ServiceOptions {
        ServiceOptions {
            runtime_dir: None,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            sink: None,
        }
    }
}

struct Inner {
    store: Arc<dyn ControlStore>,
    clock: Arc<dyn Clock>,
    admin: AdminDigest,
    secret: ServerSecret,
    metrics: Arc<Metrics>,
    options: ServiceOptions,
}

/// Shared state of every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("clock", &self.inner.clock)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// A reading of the cut as the store takes it, with the reason it is
/// uncertain when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// What the store is given.
    pub at: CutReading,
    /// Why it is uncertain (`None`: certain).
    pub uncertain: Option<UncertainReason>,
}

impl AppState {
    /// State over `store` with time from `clock`.
    pub fn new(
        store: Arc<dyn ControlStore>,
        clock: Arc<dyn Clock>,
        admin: AdminDigest,
        secret: ServerSecret,
        metrics: Arc<Metrics>,
        options: ServiceOptions,
    ) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                store,
                clock,
                admin,
                secret,
                metrics,
                options,
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &dyn ControlStore {
        &*self.inner.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The admin token's digest.
    pub(crate) fn admin(&self) -> &AdminDigest {
        &self.inner.admin
    }

    /// The server secret.
    pub(crate) fn secret(&self) -> &ServerSecret {
        &self.inner.secret
    }

    /// The options.
    pub(crate) fn options(&self) -> &ServiceOptions {
        &self.inner.options
    }

    /// One reading of the clock, certain or not, as the store takes it
    /// (`retry_after_s` from the clock, at least 1).
    ///
    /// # Errors
    /// [`ApiError::Clock`] when the clock cannot be read.
    pub(crate) async fn reading(&self) -> Result<Reading, ApiError> {
        let r = self.inner.clock.read().await?;
        let retry_after_s = self.inner.clock.retry_after_secs().max(1);
        Ok(Reading {
            at: CutReading {
                cut: r.now,
                certain: r.is_certain(),
                retry_after_s,
            },
            uncertain: r.uncertain,
        })
    }

    /// The API's answer to a refused admission made at `reading`: the
    /// store's `time_uncertain` becomes `503 time_uncertain` with the
    /// reading's reason and `Retry-After` (counted in
    /// [`metrics::ADMISSIONS_PAUSED`]); any other refusal is passed on.
    pub(crate) fn refused_admission(&self, e: LcError, reading: Reading) -> ApiError {
        match e {
            LcError::TimeUncertain { retry_after_s } => {
                self.inner.metrics.inc(metrics::ADMISSIONS_PAUSED, &[]);
                ApiError::TimeUncertain {
                    reason: reading.uncertain,
                    retry_after_secs: retry_after_s.max(reading.at.retry_after_s).max(1),
                }
            }
            other => ApiError::Store(other),
        }
    }
}

impl ServiceState for AppState {
    type Error = ApiError;

    /// The runtime tarball bound: the connection layer buffers bodies up
    /// to it; every route but runtime import then holds its body to
    /// [`JSON_BODY_MAX_BYTES`] ([`crate::api::router`]).
    fn body_max_bytes(&self) -> usize {
        RUNTIME_TAR_BYTES_MAX
    }

    fn request_timeout(&self) -> Duration {
        self.inner.options.request_timeout
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
