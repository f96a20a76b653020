//! The conservation audit: recompute every account from the ledger alone and
//! compare with the stored balances.
//!
//! The audit is independent of the stores' write paths: it replays each
//! entry's *delta* from zero, checks that the delta has the shape its kind
//! allows (a deposit only adds to `deposited` and `available`, a reclaim
//! charges all units, ...), that each entry's `before` equals the replayed
//! state, that conservation holds after every entry, and finally that the
//! replayed balances equal each account's stored balances. It consumes
//! entries one at a time so a store can page through a large ledger with
//! bounded memory per account.

use std::collections::BTreeMap;

use crate::model::{Account, AccountId, Balances, LedgerEntry, LedgerKind};

/// One broken rule found by the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditViolation {
    /// The account concerned.
    pub account_id: AccountId,
    /// The ledger sequence number, if an entry is at fault.
    pub seq: Option<i64>,
    /// What is wrong, for humans.
    pub detail: String,
}

/// The audit's result.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditReport {
    /// Accounts compared.
    pub accounts_checked: u64,
    /// Ledger entries replayed.
    pub entries_checked: u64,
    /// Everything that did not hold; empty means clean.
    pub violations: Vec<AuditViolation>,
    /// Sum of `deposited` over all accounts.
    pub total_deposited: i128,
    /// Sum of `available`.
    pub total_available: i128,
    /// Sum of `held`.
    pub total_held: i128,
    /// Sum of `consumed`.
    pub total_consumed: i128,
}

impl AuditReport {
    /// Whether no violation was found.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Replays ledger entries in sequence order; see the module docs.
#[derive(Debug, Default)]
pub struct Auditor {
    replayed: BTreeMap<AccountId, Balances>,
    last_seq: Option<i64>,
    report: AuditReport,
}

fn expected_delta(e: &LedgerEntry) -> Balances {
    match e.kind {
        LedgerKind::Deposit => Balances {
            deposited: e.units,
            available: e.units,
            held: 0,
            consumed: 0,
        },
        LedgerKind::Acquire => Balances {
            deposited: 0,
            available: -e.units,
            held: e.units,
            consumed: 0,
        },
        LedgerKind::Release | LedgerKind::Reclaim => Balances {
            deposited: 0,
            available: e.units - e.consumed,
            held: -e.units,
            consumed: e.consumed,
        },
        LedgerKind::Renew | LedgerKind::Consolidate | LedgerKind::ConsolidatedGrant => {
            Balances::default()
        }
    }
}

fn delta(before: &Balances, after: &Balances) -> Option<Balances> {
    Some(Balances {
        deposited: after.deposited.checked_sub(before.deposited)?,
        available: after.available.checked_sub(before.available)?,
        held: after.held.checked_sub(before.held)?,
        consumed: after.consumed.checked_sub(before.consumed)?,
    })
}

impl Auditor {
    /// A fresh audit.
    pub fn new() -> Auditor {
        Auditor::default()
    }

    fn violation(&mut self, account_id: AccountId, seq: Option<i64>, detail: String) {
        self.report.violations.push(AuditViolation {
            account_id,
            seq,
            detail,
        });
    }

    /// Replays one entry. Entries must come in increasing `seq`.
    pub fn observe(&mut self, e: &LedgerEntry) {
        self.report.entries_checked += 1;
        let seq = Some(e.seq);
        if let Some(last) = self.last_seq
            && e.seq <= last
        {
            self.violation(
                e.account_id,
                seq,
                format!("sequence {} after {last}", e.seq),
            );
        }
        self.last_seq = Some(e.seq);
        let replayed = self
            .replayed
            .get(&e.account_id)
            .copied()
            .unwrap_or_default();
        if e.before != replayed {
            self.violation(
                e.account_id,
                seq,
                format!("before {:?} differs from replayed {replayed:?}", e.before),
            );
        }
        let shape_ok = e.units > 0
            && match e.kind {
                LedgerKind::Reclaim => e.consumed == e.units,
                LedgerKind::Release => (0..=e.units).contains(&e.consumed),
                _ => e.consumed == 0,
            };
        if !shape_ok {
            self.violation(
                e.account_id,
                seq,
                format!(
                    "{} with units {} and consumed {} is not allowed",
                    e.kind.as_str(),
                    e.units,
                    e.consumed
                ),
            );
        }
        let expected = expected_delta(e);
        if delta(&e.before, &e.after) != Some(expected) {
            self.violation(
                e.account_id,
                seq,
                format!(
                    "{} moved {:?} -> {:?}, expected delta {expected:?}",
                    e.kind.as_str(),
                    e.before,
                    e.after
                ),
            );
        }
        if !e.after.is_conserved() {
            self.violation(
                e.account_id,
                seq,
                format!("conservation broken after entry: {:?}", e.after),
            );
        }
        // Continue from the recomputed state, not the recorded one, so a bad
        // entry is reported once and its effect stays visible at the end.
        let next = Balances {
            deposited: replayed.deposited.saturating_add(expected.deposited),
            available: replayed.available.saturating_add(expected.available),
            held: replayed.held.saturating_add(expected.held),
            consumed: replayed.consumed.saturating_add(expected.consumed),
        };
        self.replayed.insert(e.account_id, next);
    }

    /// Compares one stored account with its replayed balances.
    pub fn check_account(&mut self, account: &Account) {
        self.report.accounts_checked += 1;
        let b = account.balances;
        self.report.total_deposited += i128::from(b.deposited);
        self.report.total_available += i128::from(b.available);
        self.report.total_held += i128::from(b.held);
        self.report.total_consumed += i128::from(b.consumed);
        if !b.is_conserved() {
            self.violation(
                account.account_id,
                None,
                format!("stored balances break conservation: {b:?}"),
            );
        }
        let replayed = self
            .replayed
            .remove(&account.account_id)
            .unwrap_or_default();
        if replayed != b {
            self.violation(
                account.account_id,
                None,
                format!("stored {b:?} but the ledger gives {replayed:?}"),
            );
        }
    }

    /// Finishes: ledger entries of accounts never checked are violations.
    pub fn finish(mut self) -> AuditReport {
        let orphans: Vec<AccountId> = self.replayed.keys().copied().collect();
        for account_id in orphans {
            self.violation(account_id, None, "ledger names an unknown account".into());
        }
        self.report
    }
}
