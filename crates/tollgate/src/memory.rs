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
use crate::error::StorageError;
use crate::model::{
    Account, AccountId, AcquireRequest, Actor, Balances, Fence, Grant, Lease, LeaseId, LeaseState,
    LedgerEntry, LedgerKind, NewAccount, ReclaimReport, Renewal, Settlement,
};
use crate::rules;
use crate::timing::GrantPolicy;

#[derive(Debug, Clone)]
struct IdempotencyRecord {
    units: i64,
    ttl: SignedDuration,
    lease_id: LeaseId,
    fence: Fence,
    expiry: Timestamp,
    granted_ttl: SignedDuration,
}

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

/// A ledger entry before the store assigns its sequence number.
struct Entry {
    account_id: AccountId,
    lease_id: Option<LeaseId>,
    kind: LedgerKind,
    actor: Actor,
    units: i64,
    consumed: i64,
    before: Balances,
    after: Balances,
    fence: Option<Fence>,
    expiry: Option<Timestamp>,
    at: Timestamp,
}

impl State {
    fn record(&mut self, e: Entry) {
        let seq = self.ledger.len() as i64 + 1;
        self.ledger.push(LedgerEntry {
            seq,
            account_id: e.account_id,
            lease_id: e.lease_id,
            kind: e.kind,
            actor: e.actor,
            units: e.units,
            consumed: e.consumed,
            before: e.before,
            after: e.after,
            fence: e.fence,
            expiry: e.expiry,
            at: e.at,
        });
    }

    fn account(&self, account_id: AccountId) -> Result<&Account, StorageError> {
        self.accounts
            .get(&account_id)
            .ok_or(StorageError::AccountNotFound { account_id })
    }

    fn lease(&self, lease_id: LeaseId) -> Result<&Lease, StorageError> {
        self.leases
            .get(&lease_id)
            .ok_or(StorageError::LeaseNotFound { lease_id })
    }

    fn next_fence(&mut self) -> Fence {
        self.last_fence += 1;
        Fence(self.last_fence)
    }

    fn set_balances(&mut self, account_id: AccountId, after: Balances) {
        if let Some(a) = self.accounts.get_mut(&account_id) {
            a.balances = after;
        }
    }

    /// Settles `lease_id` with an already computed plan.
    fn settle(
        &mut self,
        lease_id: LeaseId,
        state: LeaseState,
        plan: rules::SettlePlan,
        actor: Actor,
        now: Timestamp,
    ) -> Option<Settlement> {
        let lease = self.leases.get_mut(&lease_id)?;
        lease.state = state;
        lease.consumed = Some(plan.consumed);
        let lease = lease.clone();
        self.active.remove(&(lease.account_id, lease_id));
        let before = self.accounts.get(&lease.account_id)?.balances;
        self.set_balances(lease.account_id, plan.after);
        self.record(Entry {
            account_id: lease.account_id,
            lease_id: Some(lease_id),
            kind: if state == LeaseState::Reclaimed {
                LedgerKind::Reclaim
            } else {
                LedgerKind::Release
            },
            actor,
            units: lease.units,
            consumed: plan.consumed,
            before,
            after: plan.after,
            fence: Some(lease.fence),
            expiry: Some(lease.expiry),
            at: now,
        });
        Some(Settlement {
            lease_id,
            account_id: lease.account_id,
            state,
            units: lease.units,
            consumed: plan.consumed,
            returned: plan.returned,
            settled_at: now,
            balances: plan.after,
        })
    }

    /// Inserts a new active lease and returns it.
    fn insert_lease(
        &mut self,
        account_id: AccountId,
        units: i64,
        expiry: Timestamp,
    ) -> (LeaseId, Fence) {
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
        (lease_id, fence)
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

    fn lock(&self) -> Result<MutexGuard<'_, State>, StorageError> {
        // Plans are computed before any mutation and applied without fallible
        // steps, so a poisoned lock can only come from a bug; refuse service
        // rather than guess at the state.
        self.state.lock().map_err(|_| StorageError::Backend {
            message: "memory store lock poisoned".into(),
        })
    }
}

#[async_trait]
impl Allocator for MemoryStore {
    fn policy(&self) -> GrantPolicy {
        self.policy
    }

    async fn create_account(&self, new: NewAccount) -> Result<Account, StorageError> {
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

    async fn account(&self, account_id: AccountId) -> Result<Account, StorageError> {
        self.lock()?.account(account_id).cloned()
    }

    async fn account_key_digest(
        &self,
        account_id: AccountId,
    ) -> Result<Option<[u8; 32]>, StorageError> {
        let st = self.lock()?;
        st.account(account_id)?;
        Ok(st.key_digests.get(&account_id).copied())
    }

    async fn accounts(
        &self,
        after: Option<AccountId>,
        limit: usize,
    ) -> Result<Vec<Account>, StorageError> {
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
    ) -> Result<Account, StorageError> {
        rules::check_units(units)?;
        let mut st = self.lock()?;
        let before = st.account(account_id)?.balances;
        let after = rules::deposit(account_id, before, units)?;
        st.set_balances(account_id, after);
        st.record(Entry {
            account_id,
            lease_id: None,
            kind: LedgerKind::Deposit,
            actor: Actor::Operator,
            units,
            consumed: 0,
            before,
            after,
            fence: None,
            expiry: None,
            at: now,
        });
        st.account(account_id).cloned()
    }

    async fn acquire(&self, req: AcquireRequest, now: Timestamp) -> Result<Grant, StorageError> {
        rules::check_units(req.units)?;
        self.policy.clamp_ttl(req.ttl)?;
        if let Some(k) = &req.idempotency_key {
            rules::check_idempotency_key(k)?;
        }
        let mut st = self.lock()?;
        let before = st.account(req.account_id)?.balances;
        if let Some(k) = &req.idempotency_key
            && let Some(r) = st.idempotency.get(&(req.account_id, k.clone()))
        {
            if r.units != req.units || r.ttl != req.ttl {
                return Err(StorageError::IdempotencyConflict);
            }
            return Ok(self
                .caps
                .grant(r.lease_id, r.fence, r.units, r.expiry, r.granted_ttl));
        }
        let plan = rules::plan_acquire(
            &self.policy,
            req.account_id,
            before,
            req.units,
            req.ttl,
            now,
        )?;
        let (lease_id, fence) = st.insert_lease(req.account_id, req.units, plan.expiry);
        st.set_balances(req.account_id, plan.after);
        st.record(Entry {
            account_id: req.account_id,
            lease_id: Some(lease_id),
            kind: LedgerKind::Acquire,
            actor: Actor::Holder,
            units: req.units,
            consumed: 0,
            before,
            after: plan.after,
            fence: Some(fence),
            expiry: Some(plan.expiry),
            at: now,
        });
        if let Some(k) = req.idempotency_key {
            st.idempotency.insert(
                (req.account_id, k),
                IdempotencyRecord {
                    units: req.units,
                    ttl: req.ttl,
                    lease_id,
                    fence,
                    expiry: plan.expiry,
                    granted_ttl: plan.granted_ttl,
                },
            );
        }
        Ok(self
            .caps
            .grant(lease_id, fence, req.units, plan.expiry, plan.granted_ttl))
    }

    async fn lease(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
    ) -> Result<Lease, StorageError> {
        self.caps.check(lease_id, capability)?;
        self.lock()?.lease(lease_id).cloned()
    }

    async fn renew(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Renewal, StorageError> {
        self.caps.check(lease_id, capability)?;
        let mut st = self.lock()?;
        let lease = st.lease(lease_id)?.clone();
        let (expiry, granted_ttl) = rules::plan_renew(&self.policy, &lease, ttl, now)?;
        let balances = st.account(lease.account_id)?.balances;
        let fence = st.next_fence();
        let renewed = Lease {
            fence,
            expiry,
            ..lease
        };
        st.leases.insert(lease_id, renewed.clone());
        st.record(Entry {
            account_id: renewed.account_id,
            lease_id: Some(lease_id),
            kind: LedgerKind::Renew,
            actor: Actor::Holder,
            units: renewed.units,
            consumed: 0,
            before: balances,
            after: balances,
            fence: Some(fence),
            expiry: Some(expiry),
            at: now,
        });
        Ok(Renewal {
            lease: renewed,
            granted_ttl,
        })
    }

    async fn release(
        &self,
        lease_id: LeaseId,
        capability: &Capability,
        now: Timestamp,
        consumed: Option<i64>,
    ) -> Result<Settlement, StorageError> {
        self.caps.check(lease_id, capability)?;
        let mut st = self.lock()?;
        let lease = st.lease(lease_id)?.clone();
        let before = st.account(lease.account_id)?.balances;
        let plan = rules::plan_release(&self.policy, &lease, before, now, consumed)?;
        st.settle(lease_id, LeaseState::Released, plan, Actor::Holder, now)
            .ok_or(StorageError::LeaseNotFound { lease_id })
    }

    async fn consolidate(
        &self,
        account_id: AccountId,
        leases: &[(LeaseId, Capability)],
        ttl: SignedDuration,
        now: Timestamp,
    ) -> Result<Grant, StorageError> {
        let ids = self
            .caps
            .check_consolidation(&self.policy, leases, ttl, now)?;
        let mut st = self.lock()?;
        let balances = st.account(account_id)?.balances;
        let mut loaded = Vec::with_capacity(ids.len());
        for id in &ids {
            loaded.push(st.lease(*id)?.clone());
        }
        let plan = rules::plan_consolidate(&self.policy, account_id, &loaded, ttl, now)?;
        // Settle in lease order, then grant.
        loaded.sort_by_key(|l| l.lease_id);
        for old in &loaded {
            if let Some(l) = st.leases.get_mut(&old.lease_id) {
                l.state = LeaseState::Consolidated;
                l.consumed = Some(0);
            }
            st.active.remove(&(account_id, old.lease_id));
            st.record(Entry {
                account_id,
                lease_id: Some(old.lease_id),
                kind: LedgerKind::Consolidate,
                actor: Actor::Holder,
                units: old.units,
                consumed: 0,
                before: balances,
                after: balances,
                fence: Some(old.fence),
                expiry: Some(old.expiry),
                at: now,
            });
        }
        let (lease_id, fence) = st.insert_lease(account_id, plan.units, plan.expiry);
        st.record(Entry {
            account_id,
            lease_id: Some(lease_id),
            kind: LedgerKind::ConsolidatedGrant,
            actor: Actor::Holder,
            units: plan.units,
            consumed: 0,
            before: balances,
            after: balances,
            fence: Some(fence),
            expiry: Some(plan.expiry),
            at: now,
        });
        Ok(self
            .caps
            .grant(lease_id, fence, plan.units, plan.expiry, plan.granted_ttl))
    }

    async fn reclaim(&self, now: Timestamp, limit: usize) -> Result<ReclaimReport, StorageError> {
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
        let due: Vec<LeaseId> = st
            .active
            .iter()
            .filter(|(_, id)| {
                st.leases
                    .get(id)
                    .is_some_and(|l| self.policy.is_reclaimable(l.expiry, now))
            })
            .take(limit)
            .map(|(_, id)| *id)
            .collect();
        // Plan the whole batch against simulated balances first, so an error
        // (only possible on a corrupted store) changes nothing.
        let mut balances: BTreeMap<AccountId, Balances> = BTreeMap::new();
        let mut plans = Vec::with_capacity(due.len());
        for lease_id in due {
            let lease = st.lease(lease_id)?;
            let before = match balances.get(&lease.account_id) {
                Some(b) => *b,
                None => st.account(lease.account_id)?.balances,
            };
            if let Some(plan) = rules::plan_reclaim(&self.policy, lease, before, now)? {
                balances.insert(lease.account_id, plan.settle.after);
                plans.push((lease_id, plan));
            }
        }
        for (lease_id, plan) in plans {
            if st
                .settle(
                    lease_id,
                    LeaseState::Reclaimed,
                    plan.settle,
                    Actor::Reclaimer,
                    now,
                )
                .is_some()
            {
                report.reclaimed.push(lease_id);
                report.units_charged += i128::from(plan.settle.consumed);
                report.late_by.push(plan.late_by);
            }
        }
        Ok(report)
    }

    async fn ledger(&self, after_seq: i64, limit: usize) -> Result<Vec<LedgerEntry>, StorageError> {
        let limit = rules::check_limit(limit, AUDIT_PAGE_MAX)?;
        let st = self.lock()?;
        let start = usize::try_from(after_seq.max(0)).unwrap_or(usize::MAX);
        Ok(st.ledger.iter().skip(start).take(limit).cloned().collect())
    }
}
