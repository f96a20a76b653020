//! [`ProviderPort`] over any [`lc_provider::Provider`] (the bubblewrap
//! provider in process, or [`lc_provider::HttpProvider`] over loopback).
//!
//! A provider error that retrying can cure (`destroy_incomplete`,
//! `supervisor_unavailable`, `provider_io`, `provider_unreachable`) or
//! that is the worker's own configuration (`unauthorized`) is
//! [`PortError::Unavailable`]; every other one is a refusal.

use std::sync::Arc;

use async_trait::async_trait;
use lc_core::{Command, Generation, LeaseWork, OutputPage, ProviderId, SandboxLeaseId, Shape};
use lc_provider::{AllocateRequest, Provider, ProviderError};

use crate::port::{PortError, ProviderPort};

/// A [`ProviderPort`] over `Arc<dyn Provider>`.
#[derive(Clone)]
pub struct ProviderAdapter {
    inner: Arc<dyn Provider>,
}

impl std::fmt::Debug for ProviderAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderAdapter")
            .field("id", self.inner.id())
            .finish()
    }
}

impl ProviderAdapter {
    /// Wraps `provider`.
    pub fn new(provider: Arc<dyn Provider>) -> ProviderAdapter {
        ProviderAdapter { inner: provider }
    }
}

fn port_error(e: ProviderError) -> PortError {
    // A refused credential is this worker's configuration, not the
    // instance's fault: retried, never a start failure.
    if e.is_transient() || matches!(e, ProviderError::Unauthorized) {
        PortError::Unavailable {
            message: format!("{} ({})", e, e.code()),
        }
    } else {
        PortError::Refused {
            code: e.code().to_owned(),
            message: e.to_string(),
        }
    }
}

fn refused(code: &str, e: impl std::fmt::Display) -> PortError {
    PortError::Refused {
        code: code.to_owned(),
        message: e.to_string(),
    }
}

#[async_trait]
impl ProviderPort for ProviderAdapter {
    fn id(&self) -> &ProviderId {
        self.inner.id()
    }

    fn public_key(&self) -> [u8; 32] {
        self.inner.public_key().to_bytes()
    }

    async fn allocate(&self, work: &LeaseWork) -> Result<(), PortError> {
        let shape = Shape::by_name(&work.shape).map_err(|e| refused("invalid_request", e))?;
        let command =
            Command::new(work.command.clone()).map_err(|e| refused("invalid_request", e))?;
        let req = AllocateRequest {
            lease_id: work.lease_id,
            generation: work.generation,
            exec_id: work.exec_id,
            attempt: work.attempt,
            runtime: work.runtime,
            shape,
            command,
            workspace_id: work.workspace_id,
        };
        self.inner.allocate(req).await.map_err(port_error)?;
        Ok(())
    }

    async fn pages(
        &self,
        work: &LeaseWork,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<OutputPage>, PortError> {
        let pages = self
            .inner
            .pages(work.lease_id, work.generation, after_seq, max)
            .await
            .map_err(port_error)?;
        Ok(pages
            .iter()
            .map(|p| OutputPage::from_page(work.exec_id, work.attempt, p))
            .collect())
    }

    async fn ack(&self, work: &LeaseWork, through_seq: i64) -> Result<(), PortError> {
        self.inner
            .ack(work.lease_id, work.generation, through_seq)
            .await
            .map_err(port_error)
    }

    async fn destroy(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
    ) -> Result<serde_json::Value, PortError> {
        let envelope = self
            .inner
            .destroy(lease, generation)
            .await
            .map_err(port_error)?;
        serde_json::to_value(&envelope).map_err(|e| refused("invalid_evidence", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_instance_faults_are_refusals() {
        let unavailable = [
            ProviderError::Unauthorized,
            ProviderError::Unreachable { detail: "x".into() },
            ProviderError::DestroyIncomplete { detail: "x".into() },
        ];
        for e in unavailable {
            assert!(matches!(port_error(e), PortError::Unavailable { .. }));
        }
        let refused = port_error(ProviderError::StartFailed {
            detail: "no sh".into(),
        });
        assert_eq!(refused.code(), "start_failed");
        let fenced = port_error(ProviderError::Fenced {
            lease_id: 1,
            generation: 1,
            fenced_through: 1,
        });
        assert_eq!(fenced.code(), "fenced");
    }
}
