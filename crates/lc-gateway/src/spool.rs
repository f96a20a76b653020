//! How the gateway reaches an exec's supervisor spool: through the exec's
//! provider ([`lc_provider::Provider`]), every call carrying the owner's
//! fence, and how it finds the provider for a URL ([`ProviderConnector`]).

use std::sync::Arc;

use async_trait::async_trait;
use lc_core::owner::OwnerFence;
use lc_core::page::Page;
use lc_core::{Generation, SandboxLeaseId};
use lc_provider::{Provider, ProviderError};

/// Whether `e` says that the presented fence is stale.
pub fn is_stale_fence(e: &ProviderError) -> bool {
    matches!(e, ProviderError::StaleFence { .. })
}

/// Finds the provider at a URL (the URL the store recorded for the exec).
#[async_trait]
pub trait ProviderConnector: Send + Sync {
    /// A client for the provider at `url`.
    ///
    /// # Errors
    /// The provider's error (typically `provider_unreachable`, retried at
    /// the next step).
    async fn connect(&self, url: &str) -> Result<Arc<dyn Provider>, ProviderError>;
}

/// Connects over HTTP ([`lc_provider::HttpProvider::connect`], which reads
/// the provider's identity), sending the bearer token when one is given:
/// the same client the worker builds.
#[derive(Debug, Clone, Default)]
pub struct HttpConnector {
    token: Option<String>,
}

impl HttpConnector {
    /// A connector sending `token` (the providers' API bearer token), if any.
    pub fn new(token: Option<String>) -> HttpConnector {
        HttpConnector { token }
    }
}

#[async_trait]
impl ProviderConnector for HttpConnector {
    async fn connect(&self, url: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        let p = lc_provider::HttpProvider::connect(url).await?;
        Ok(Arc::new(match &self.token {
            Some(t) => p.with_token(t.clone()),
            None => p,
        }))
    }
}

/// Pages of the spool with `seq > after_seq`, at most `max`, read under
/// `fence`.
pub(crate) async fn pages(
    p: &dyn Provider,
    lease: SandboxLeaseId,
    generation: Generation,
    fence: OwnerFence,
    after_seq: i64,
    max: usize,
) -> Result<Vec<Page>, ProviderError> {
    p.pages(lease, generation, fence, after_seq, max).await
}

/// Lets the supervisor drop the pages through `through_seq`, under `fence`.
pub(crate) async fn ack(
    p: &dyn Provider,
    lease: SandboxLeaseId,
    generation: Generation,
    fence: OwnerFence,
    through_seq: i64,
) -> Result<(), ProviderError> {
    p.ack(lease, generation, fence, through_seq).await
}

/// Asks the supervisor to stop the command, under `fence`.
pub(crate) async fn cancel(
    p: &dyn Provider,
    lease: SandboxLeaseId,
    generation: Generation,
    fence: OwnerFence,
) -> Result<(), ProviderError> {
    p.cancel(lease, generation, fence).await
}

/// Delivers input `input_seq` (its `bytes`, then stdin closes when `eof`)
/// to the command's stdin, under `fence`; the supervisor writes each input
/// seq once, so delivering a seq again answers ok without writing.
pub(crate) async fn send(
    p: &dyn Provider,
    lease: SandboxLeaseId,
    generation: Generation,
    fence: OwnerFence,
    input_seq: i64,
    bytes: Vec<u8>,
    eof: bool,
) -> Result<i64, ProviderError> {
    p.send(lease, generation, fence, input_seq, bytes, eof)
        .await
}
