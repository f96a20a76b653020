//! [`MemoryStore`]: the in-process allocator.
//!
//! All state sits behind one mutex; every operation takes it once, computes a
//! plan with the core rules ([`crate::rules`]) while nothing has changed, and
//! then applies the plan without any fallible step, so an error leaves the
//! store exactly as before. Nothing survives the process: a memory store
//! generates its own [`StoreId`] at start, so capabilities of an earlier
//! process never verify against it.
//!
//! Memory grows with leases, ledger entries and idempotency records, all of
//! which are kept for the life of the process (the audit needs the ledger);
//! the memory store is meant for development, tests and single-process use.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};

use crate::allocator::{AUDIT_PAGE_MAX, Allocator};
use crate::capability::{Capability, CapabilityKey, LeaseCapabilities, StoreId};
use crate::error::{AllocatorError, RuleError, StorageError};
use crate::model::{
    Account, AccountId, AcquireRequest, Balances, Fence, Grant, IdempotencyRecord, Issued, Lease,
    LeaseId, LeaseState, LedgerEntry, NewAccount, NewLedgerEntry, ReclaimReport, Renewal,
    Settlement,
};
use crate::rules;
use crate::timing::GrantPolicy;
use crate::timing::SuppliedTime;

#[derive(Debug, Default)]
struct State {
    accounts: BTreeMap<AccountId, Account>,
    key_digests: HashMap<AccountId, [u8; 32]>,
    leases: BTreeMap<LeaseId, Lease>,
    /// Active leases in reclaim order.
    active: BTreeSet<(AccountId, LeaseId)>,
    ledger: Vec<LedgerEntry>,
    idempotency: HashMap<(AccountId, String), IdempotencyRecord>,
    last_account_id: i64,
    last_lease_id: i64,
    last_fence: i64,
}

impl State {
    /// Appends `e` with the next sequence number.
    fn record(&mut self, e: NewLedgerEntry) {
        let seq = self.ledger.len() as i64 + 1;
        self.ledger.push(e.with_seq(seq));
    }

    fn account(&self, account_id: AccountId) -> Result<&Account, RuleError> {
        self.accounts
            .get(&account_id)
            .ok_or(RuleError::AccountNotFound { account_id })
    }

    fn lease(&self, lease_id: LeaseId) -> Result<&Lease, RuleError> {
        self.leases
            .get(&lease_id)
            .ok_or(RuleError::LeaseNotFound { lease_id })
    }

    fn next_fence(&mut self) -> Fence {
        self.last_fence += 1;
        Fence(self.last_fence)
    }

    /// Sets the balances of an account a plan was made for.
    fn set_balances(&mut self, account_id: AccountId, after: Balances) {
        let account = self
            .accounts
            .get_mut(&account_id)
            .unwrap_or_else(|| panic!("planned account {account_id} is not in the store"));
        account.balances = after;
    }

    /// Marks a lease a plan was made for as settled in `state`.
    fn settle_lease(&mut self, lease_id: LeaseId, state: LeaseState, consumed: i64) {
        let lease = self
            .leases
            .get_mut(&lease_id)
            .unwrap_or_else(|| panic!("planned lease {lease_id} is not in the store"));
        lease.state = state;
        lease.consumed = Some(consumed);
        let account_id = lease.account_id;
        self.active.remove(&(account_id, lease_id));
    }

    /// Applies a release or reclaim plan.
    fn apply_settle(&mut self, plan: &rules::SettlePlan) {
        self.settle_lease(plan.lease_id, plan.state, plan.consumed);
        self.set_balances(plan.entry.account_id, plan.after);
        self.record(plan.entry);
    }

    /// Inserts a new active, exact lease and returns what it was issued.
    fn insert_lease(&mut self, account_id: AccountId, units: i64, expiry: Timestamp) -> Issued {
        self.last_lease_id += 1;
        let lease_id = LeaseId(self.last_lease_id);
        let fence = self.next_fence();
        self.leases.insert(
            lease_id,
            Lease {
                lease_id,
                account_id,
                units,
                fence,
                expiry,
                expiry_is_upper_bound: false,
                state: LeaseState::Active,
                consumed: None,
            },
        );
        self.active.insert((account_id, lease_id));
        Issued { lease_id, fence }
    }
}

/// The in-memory allocator; see the module docs. Cheap to share behind an
/// `Arc`; all methods take `&self`.
#[derive(Debug)]
pub struct MemoryStore {
    policy: GrantPolicy,
    caps: LeaseCapabilities,
    state: Mutex<State>,
}

impl MemoryStore {
    /// A fresh, empty store applying `policy`, deriving capabilities with
    /// `key`.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] if the random source for the store
    /// identity fails.
    pub fn new(policy: GrantPolicy, key: CapabilityKey) -> Result<MemoryStore, StorageError> {
        let store_id = StoreId::generate().map_err(|e| StorageError::Unavailable {
            message: format!("random source: {e}"),
        })?;
        Ok(MemoryStore {
            policy,
            caps: LeaseCapabilities::new(key, store_id),
            state: Mutex::new(State::default()),
        })
    }

    /// How many leases are active (granted and not yet settled).
    ///
    /// # Errors
    /// [`StorageError::Failure`] if the store's lock is poisoned.
    pub fn active_leases(&self) -> Result<u64, StorageError> {
        Ok(self.lock()?.active.len() as u64)
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>, StorageError> {
        // Plans are computed before any mutation and applied without fallible
        // steps, so a poisoned lock can only come from a bug; refuse service
        // rather than guess at the state.
        self.state.lock().map_err(|_| StorageError::Failure {
            message: "memory store lock poisoned".into(),
        })
    }
}

#[async_trait]
impl Allocator for MemoryStore {
    fn policy(&self) -> GrantPolicy {
        self.policy
    }

    async fn create_account(&self, new: NewAccount) -> Result<Account, AllocatorError> {
        rules::check_account_name(&new.name)?;
        let mut st = self.lock()?;
        st.last_account_id += 1;
        let account = Account {
            account_id: AccountId(st.last_account_id),
            name: new.name,
            balances: Balances::default(),
        };
        if let Some(d) = new.api_key_sha256 {
            st.key_digests.insert(account.account_id, d);
        }
        st.accounts.insert(account.account_id, account.clone());
        Ok(account)
    }

    async fn account(&self, account_id: AccountId) -> Result<Account, AllocatorError> {
        Ok(self.lock()?.account(account_id).cloned()?)
    }

    async fn account_key_digest(
        &self,
        account_id: AccountId,
    ) -> Result<Option<[u8; 32]>, AllocatorError> {
        let st = self.lock()?;
        st.account(account_id)?;
        Ok(st.key_digests.get(&account_id).copied())
    }

    async fn accounts(
        &self,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Vec<Account>, AllocatorError> {
        let limit = rules::check_limit(limit, AUDIT_PAGE_MAX)?;
        let st = self.lock()?;
        let start = after.map_or(i64::MIN, |a| a.0.saturating_add(1));
        Ok(st
            .accounts
            .range(AccountId(start)..)
            .filter(|(id, _)| after.is_none_or(|a| **id > a))
            .take(limit)
            .map(|(_, a)| a.clone())
            .collect())
    }

    async fn deposit(
        &self,
        account_id: AccountId,
        units: i64,
        now: Timestamp,
    ) -> Result<Account, AllocatorError> {
        rules::check_units(units)?;
        let mut st = self.lock()?;
        let before = st.account(account_id)?.balances;
        let plan = rules::plan_deposit(account_id, before, units, now)?;
        st.set_balances(account_id, plan.after);
        st.record(plan.entry);
        Ok(st.account(account_id)?.clone())
    }

    async fn acquire(
        &self,
        req: AcquireRequest,
        at: SuppliedTime,
    ) -> Result<Grant, AllocatorError> {
        rules::check_acquire(
            &self.policy,
            req.units,
            req.ttl,
            req.idempotency_key.as_deref(),
        )?;
        let mut st = self.lock()?;
        let before = st.account(req.account_id)?.balances;
        if let Some(k) = &req.idempotency_key
            && let Some(r) = st.idempotency.get(&(req.account_id, k.clone()))
        {
            rules::check_replay(r, req.units, req.ttl)?;
            return Ok(self
                .caps
                .grant(r.lease_id, r.fence, r.units, r.expiry, r.granted_ttl));
        }
        let plan =
            rules::plan_acquire(&self.policy, req.account_id, before, req.units, req.ttl, at)?;
        let issued = st.insert_lease(plan.account_id, plan.units, plan.expiry);
        st.set_balances(plan.account_id, plan.after);
        st.record(plan.entry(issued));
        if let Some(k) = req.idempotency_key {
            st.idempotency
                .insert((req.account_id, k), plan.idempotency_record(issued));
        }
        Ok(self.caps.grant(
            issued.lease_id,
            issued.fence,
            plan.units,
            plan.expiry,
            plan.granted_ttl,
        ))
    }

    async fn lease(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
    ) -> Result<Lease, AllocatorError> {
        self.caps.check(lease_id, capability)?;
        Ok(self.lock()?.lease(lease_id).cloned()?)
    }

    async fn renew(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        ttl: SignedDuration,
        at: SuppliedTime,
    ) -> Result<Renewal, AllocatorError> {
        self.caps.check(lease_id, capability)?;
        let mut st = self.lock()?;
        let lease = st.lease(lease_id)?.clone();
        let balances = st.account(lease.account_id)?.balances;
        let plan = rules::plan_renew(&self.policy, &lease, balances, ttl, at)?;
        let fence = st.next_fence();
        let renewed = plan.renewed(&lease, fence);
        st.leases.insert(lease_id, renewed.clone());
        st.record(plan.entry(fence));
        Ok(Renewal {
            lease: renewed,
            granted_ttl: plan.granted_ttl,
            extended: plan.extended,
        })
    }

    async fn release(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        now: Timestamp,
        consumed: Option<i64>,
    ) -> Result<Settlement, AllocatorError> {
        self.caps.check(lease_id, capability)?;
        let mut st = self.lock()?;
        let lease = st.lease(lease_id)?.clone();
        let before = st.account(lease.account_id)?.balances;
        let plan = rules::plan_release(&self.policy, &lease, before, now, consumed)?;
        st.apply_settle(&plan);
        Ok(plan.settlement())
    }

    async fn consolidate(
        &self,
        account_id: AccountId,
        leases: &[(LeaseId, Capability)],
        ttl: SignedDuration,
        at: SuppliedTime,
    ) -> Result<Grant, AllocatorError> {
        let ids = self
            .caps
            .check_consolidation(&self.policy, leases, ttl, at)?;
        let mut st = self.lock()?;
        let balances = st.account(account_id)?.balances;
        let mut loaded = Vec::with_capacity(ids.len());
        for id in &ids {
            loaded.push(st.lease(*id)?.clone());
        }
        let plan = rules::plan_consolidate(&self.policy, account_id, balances, &loaded, ttl, at)?;
        for (lease_id, entry) in plan.settled_ids.iter().zip(&plan.settled) {
            st.settle_lease(*lease_id, LeaseState::Consolidated, 0);
            st.record(*entry);
        }
        let issued = st.insert_lease(account_id, plan.units, plan.expiry);
        st.record(plan.grant_entry(issued));
        Ok(self.caps.grant(
            issued.lease_id,
            issued.fence,
            plan.units,
            plan.expiry,
            plan.granted_ttl,
        ))
    }

    async fn reclaim(&self, now: Timestamp, limit: usize) -> Result<ReclaimReport, AllocatorError> {
        let limit = rules::check_limit(limit, rules::RECLAIM_BATCH_MAX)?;
        let cutoff = self.policy.reclaim_cutoff(now);
        let mut report = ReclaimReport {
            cutoff,
            reclaimed: Vec::new(),
            units_charged: 0,
            late_by: Vec::new(),
        };
        if cutoff.is_none() {
            return Ok(report);
        }
        let mut st = self.lock()?;
        let mut due: Vec<Lease> = Vec::new();
        for (_, lease_id) in &st.active {
            let lease = st.lease(*lease_id)?;
            if self.policy.is_reclaimable(lease.expiry, now) {
                due.push(lease.clone());
                if due.len() == limit {
                    break;
                }
            }
        }
        let mut balances: BTreeMap<AccountId, Balances> = BTreeMap::new();
        for lease in &due {
            balances.insert(lease.account_id, st.account(lease.account_id)?.balances);
        }
        // The whole batch is planned before anything changes, so an error
        // (only possible on a corrupted store) changes nothing.
        let plan = rules::plan_reclaim_batch(&self.policy, &due, &balances, now)?;
        for reclaim in &plan.settled {
            st.apply_settle(&reclaim.settle);
            report.reclaimed.push(reclaim.settle.lease_id);
            report.units_charged += i128::from(reclaim.settle.consumed);
            report.late_by.push(reclaim.late_by);
        }
        Ok(report)
    }

    async fn ledger(
        &self,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<LedgerEntry>, AllocatorError> {
        let limit = rules::check_limit(limit, AUDIT_PAGE_MAX)?;
        let st = self.lock()?;
        // Entry `seq` sits at index `seq - 1`; a cursor past every index
        // (only possible where usize is narrower than i64) starts past the end.
        let start = usize::try_from(after_seq.max(0)).unwrap_or(usize::MAX);
        Ok(st.ledger.iter().skip(start).take(limit).cloned().collect())
    }
}
