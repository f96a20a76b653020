//! What the reconciler asks of one provider.
//!
//! A provider runs the instance of a (lease, generation): it allocates it
//! (idempotent for the same pair; refused once that generation is fenced),
//! serves its output pages from a bounded spool until they are acked, and
//! destroys it (idempotent, generation-scoped) returning signed evidence of
//! absence or a fence. The reconciler never trusts a provider's clock and
//! never decides anything from a provider's answer alone: the store checks
//! the evidence's signature against the provider's registered key.

use async_trait::async_trait;
use lc_core::{Generation, LeaseWork, OutputPage, ProviderId, SandboxLeaseId};

/// Why a provider call failed. `code` is the provider's stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// The provider could not be reached or did not answer in time: nothing
    /// is known, so the call is retried at the next step.
    #[error("provider unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
    },
    /// The provider answered with a refusal (`fenced`, `invalid_runtime`,
    /// `start_failed`, ...): retrying the same call cannot succeed.
    #[error("provider refused ({code}): {message}")]
    Refused {
        /// The provider's stable code.
        code: String,
        /// Its message.
        message: String,
    },
}

impl PortError {
    /// The stable code: `provider_unavailable` or the refusal's code.
    pub fn code(&self) -> &str {
        match self {
            PortError::Unavailable { .. } => "provider_unavailable",
            PortError::Refused { code, .. } => code,
        }
    }
}

/// One provider, as the reconciler uses it.
#[async_trait]
pub trait ProviderPort: Send + Sync {
    /// The provider's id (the key of [`LeaseWork::provider_id`]).
    fn id(&self) -> &ProviderId;

    /// The provider's Ed25519 public key (32 bytes), registered in the store.
    fn public_key(&self) -> [u8; 32];

    /// Allocates the instance of `work` (its lease and generation, exec,
    /// attempt, runtime, shape, command and workspace) and starts its
    /// command. Idempotent for the same (lease, generation).
    ///
    /// # Errors
    /// [`PortError::Refused`] when the instance cannot start (a fenced
    /// generation, a missing runtime, a failed start);
    /// [`PortError::Unavailable`] when nothing is known.
    async fn allocate(&self, work: &LeaseWork) -> Result<(), PortError>;

    /// Pages of the instance of `work` (its lease and generation) with seq
    /// `> after_seq`, ascending, at most `max`, as pages of its exec's attempt.
    ///
    /// # Errors
    /// As [`ProviderPort::allocate`].
    async fn pages(
        &self,
        work: &LeaseWork,
        after_seq: i64,
        max: usize,
    ) -> Result<Vec<OutputPage>, PortError>;

    /// Lets the spool drop every page with seq `<= through_seq`: called
    /// only once those pages are committed in the store.
    ///
    /// # Errors
    /// As [`ProviderPort::allocate`].
    async fn ack(&self, work: &LeaseWork, through_seq: i64) -> Result<(), PortError>;

    /// Destroys the instance of (lease, generation): kills every process,
    /// removes its cgroup, persists the fence, and returns the signed
    /// evidence (a DSSE envelope as JSON: absence or fence). Idempotent.
    ///
    /// # Errors
    /// As [`ProviderPort::allocate`].
    async fn destroy(
        &self,
        lease: SandboxLeaseId,
        generation: Generation,
    ) -> Result<serde_json::Value, PortError>;
}
