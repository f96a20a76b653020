//! The allocator API: one async trait that every store implements.

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};

use crate::audit::{AuditReport, Auditor};
use crate::capability::Capability;
use crate::error::AllocatorError;
use crate::model::{
    Account, AccountId, AcquireRequest, Grant, Lease, LeaseId, LedgerEntry, NewAccount,
    ReclaimReport, Renewal, Settlement,
};
use crate::timing::{GrantPolicy, SuppliedTime};

/// Page size the default [`Allocator::audit`] reads the ledger and accounts
/// with: bounds memory per round trip.
pub const AUDIT_PAGE_MAX: usize = 1_000;

/// The lease and credit allocator. Every method is one all-or-nothing
/// operation: an `Err` means nothing changed. Its error,
/// [`AllocatorError`], is a refusal by the rules ([`crate::RuleError`],
/// named in each method's `# Errors`) or a storage failure
/// ([`crate::StorageError`], "storage errors"). Time is always *supplied*
/// (`now`, or for an operation that makes a deadline a [`SuppliedTime`]:
/// expiry judged at its `now`, the new deadline counted from its
/// `grant_base`); a store never reads a clock.
///
/// Implemented by [`crate::MemoryStore`] and by the PostgreSQL store; both
/// pass the same conformance suite (`testkit` feature).
#[async_trait]
pub trait Allocator: Send + Sync {
    /// The policy this store applies.
    fn policy(&self) -> GrantPolicy;

    /// Creates an account with zero balances.
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidAccountName`]; storage errors.
    async fn create_account(&self, new: NewAccount) -> Result<Account, AllocatorError>;

    /// Reads an account.
    ///
    /// # Errors
    /// [`crate::RuleError::AccountNotFound`]; storage errors.
    async fn account(&self, account_id: AccountId) -> Result<Account, AllocatorError>;

    /// The SHA-256 digest of the account's API key, if it has one.
    ///
    /// # Errors
    /// [`crate::RuleError::AccountNotFound`]; storage errors.
    async fn account_key_digest(
        &self,
        account_id: AccountId,
    ) -> Result<Option<[u8; 32]>, AllocatorError>;

    /// Accounts with id greater than `after`, ascending, at most `limit`
    /// (`1..=`[`AUDIT_PAGE_MAX`]).
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidLimit`]; storage errors.
    async fn accounts(
        &self,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Vec<Account>, AllocatorError>;

    /// Deposits `units` (`1..=i64::MAX`) at supplied time `now`.
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidUnits`], [`crate::RuleError::AccountNotFound`],
    /// [`crate::RuleError::UnitsOverflow`]; storage errors.
    async fn deposit(
        &self,
        account_id: AccountId,
        units: i64,
        now: Timestamp,
    ) -> Result<Account, AllocatorError>;

    /// Grants a lease: debits `units` from `available` into `held` until
    /// `at.grant_base() + clamp(ttl)`. With an idempotency key, a retry of
    /// the same request returns the original grant unchanged.
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidUnits`], [`crate::RuleError::InvalidTtl`],
    /// [`crate::RuleError::InvalidIdempotencyKey`],
    /// [`crate::RuleError::UnrepresentableExpiry`] and
    /// [`crate::RuleError::DeadlineBeyondHorizon`] (before any debit),
    /// [`crate::RuleError::AccountNotFound`], [`crate::RuleError::IdempotencyConflict`],
    /// [`crate::RuleError::InsufficientBalance`]; storage errors.
    async fn acquire(&self, req: AcquireRequest, at: SuppliedTime)
    -> Result<Grant, AllocatorError>;

    /// Reads a lease.
    ///
    /// # Errors
    /// [`crate::RuleError::CapabilityMismatch`] (also for an unknown lease id
    /// with a forged capability), [`crate::RuleError::LeaseNotFound`]; storage
    /// errors.
    async fn lease(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
    ) -> Result<Lease, AllocatorError>;

    /// Extends an active lease not yet reclaimable at `at.now()` to
    /// `max(expiry, at.grant_base() + clamp(ttl))` and issues a new fence.
    ///
    /// # Errors
    /// [`crate::RuleError::CapabilityMismatch`], [`crate::RuleError::LeaseNotFound`],
    /// [`crate::RuleError::InvalidTtl`], [`crate::RuleError::UnrepresentableExpiry`],
    /// [`crate::RuleError::DeadlineBeyondHorizon`],
    /// [`crate::RuleError::LeaseNotActive`], [`crate::RuleError::LeaseReclaimable`];
    /// storage errors.
    async fn renew(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        ttl: SignedDuration,
        at: SuppliedTime,
    ) -> Result<Renewal, AllocatorError>;

    /// Settles an active lease before its reclaim boundary
    /// (`now < expiry + grace`), charging `consumed` (default: all units) and
    /// returning the rest.
    ///
    /// # Errors
    /// [`crate::RuleError::CapabilityMismatch`], [`crate::RuleError::LeaseNotFound`],
    /// [`crate::RuleError::LeaseNotActive`], [`crate::RuleError::LeaseReclaimable`],
    /// [`crate::RuleError::InvalidConsumed`]; storage errors.
    async fn release(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        now: Timestamp,
        consumed: Option<i64>,
    ) -> Result<Settlement, AllocatorError>;

    /// Settles the named leases (each live at `at.now()`) as consolidated
    /// and grants one new lease of their summed units until
    /// `at.grant_base() + clamp(ttl)`.
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidLeaseCount`], [`crate::RuleError::DuplicateLease`],
    /// [`crate::RuleError::InvalidTtl`], [`crate::RuleError::UnrepresentableExpiry`],
    /// [`crate::RuleError::DeadlineBeyondHorizon`] (before anything settles), [`crate::RuleError::AccountNotFound`],
    /// [`crate::RuleError::CapabilityMismatch`], [`crate::RuleError::LeaseNotFound`],
    /// [`crate::RuleError::LeaseAccountMismatch`], [`crate::RuleError::LeaseNotActive`],
    /// [`crate::RuleError::LeaseReclaimable`], [`crate::RuleError::UnitsOverflow`];
    /// storage errors.
    async fn consolidate(
        &self,
        account_id: AccountId,
        leases: &[(LeaseId, Capability)],
        ttl: SignedDuration,
        at: SuppliedTime,
    ) -> Result<Grant, AllocatorError>;

    /// Settles up to `limit` (`1..=`[`crate::RECLAIM_BATCH_MAX`]) active
    /// leases reclaimable at `now`, in (account, lease) order, charging all
    /// of their units. Idempotent; safe to run from several workers.
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidLimit`]; storage errors.
    async fn reclaim(&self, now: Timestamp, limit: usize) -> Result<ReclaimReport, AllocatorError>;

    /// Ledger entries with `seq > after_seq`, ascending, at most `limit`
    /// (`1..=`[`AUDIT_PAGE_MAX`]).
    ///
    /// # Errors
    /// [`crate::RuleError::InvalidLimit`]; storage errors.
    async fn ledger(
        &self,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<LedgerEntry>, AllocatorError>;

    /// Recomputes every account from the ledger and checks conservation
    /// ([`crate::audit`]). Pages through the ledger with [`AUDIT_PAGE_MAX`].
    /// Concurrent writes may show as violations; audit a quiet store.
    ///
    /// # Errors
    /// Storage errors.
    async fn audit(&self) -> Result<AuditReport, AllocatorError> {
        let mut auditor = Auditor::new();
        let mut after_seq = 0;
        loop {
            let page = self.ledger(after_seq, AUDIT_PAGE_MAX).await?;
            for e in &page {
                auditor.observe(e);
                after_seq = e.seq;
            }
            if page.len() < AUDIT_PAGE_MAX {
                break;
            }
        }
        let mut after = None;
        loop {
            let page = self.accounts(after, AUDIT_PAGE_MAX).await?;
            for a in &page {
                auditor.check_account(a);
                after = Some(a.account_id);
            }
            if page.len() < AUDIT_PAGE_MAX {
                break;
            }
        }
        Ok(auditor.finish())
    }
}
