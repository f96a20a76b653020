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

#[cfg(test)]
mod tests {
    use jiff::Timestamp;

    use super::*;
    use crate::model::{Actor, LeaseId};

    const A: AccountId = AccountId(1);
    const B: AccountId = AccountId(2);

    fn bal(deposited: i64, available: i64, held: i64, consumed: i64) -> Balances {
        Balances {
            deposited,
            available,
            held,
            consumed,
        }
    }

    fn entry(
        seq: i64,
        account_id: AccountId,
        kind: LedgerKind,
        units: i64,
        consumed: i64,
        before: Balances,
        after: Balances,
    ) -> LedgerEntry {
        LedgerEntry {
            seq,
            account_id,
            lease_id: Some(LeaseId(seq)),
            kind,
            actor: Actor::Holder,
            units,
            consumed,
            before,
            after,
            fence: None,
            expiry: None,
            at: Timestamp::UNIX_EPOCH,
        }
    }

    fn account(account_id: AccountId, balances: Balances) -> Account {
        Account {
            account_id,
            name: format!("acct-{account_id}"),
            balances,
        }
    }

    fn violation(account_id: AccountId, seq: Option<i64>, detail: &str) -> AuditViolation {
        AuditViolation {
            account_id,
            seq,
            detail: detail.to_string(),
        }
    }

    /// Runs the audit over `entries` then `accounts`.
    fn check(entries: &[LedgerEntry], accounts: &[Account]) -> AuditReport {
        let mut auditor = Auditor::new();
        for e in entries {
            auditor.observe(e);
        }
        for a in accounts {
            auditor.check_account(a);
        }
        auditor.finish()
    }

    /// A clean history of every kind over two accounts.
    fn clean_ledger() -> Vec<LedgerEntry> {
        use LedgerKind::*;
        vec![
            entry(1, A, Deposit, 10, 0, bal(0, 0, 0, 0), bal(10, 10, 0, 0)),
            entry(2, A, Acquire, 4, 0, bal(10, 10, 0, 0), bal(10, 6, 4, 0)),
            entry(3, B, Deposit, 7, 0, bal(0, 0, 0, 0), bal(7, 7, 0, 0)),
            entry(4, A, Renew, 4, 0, bal(10, 6, 4, 0), bal(10, 6, 4, 0)),
            entry(5, A, Release, 4, 1, bal(10, 6, 4, 0), bal(10, 9, 0, 1)),
            entry(6, A, Acquire, 3, 0, bal(10, 9, 0, 1), bal(10, 6, 3, 1)),
            entry(7, A, Reclaim, 3, 3, bal(10, 6, 3, 1), bal(10, 6, 0, 4)),
            entry(8, B, Acquire, 2, 0, bal(7, 7, 0, 0), bal(7, 5, 2, 0)),
            entry(9, B, Acquire, 3, 0, bal(7, 5, 2, 0), bal(7, 2, 5, 0)),
            entry(10, B, Consolidate, 2, 0, bal(7, 2, 5, 0), bal(7, 2, 5, 0)),
            entry(11, B, Consolidate, 3, 0, bal(7, 2, 5, 0), bal(7, 2, 5, 0)),
            entry(
                12,
                B,
                ConsolidatedGrant,
                5,
                0,
                bal(7, 2, 5, 0),
                bal(7, 2, 5, 0),
            ),
            entry(13, B, Release, 5, 0, bal(7, 2, 5, 0), bal(7, 7, 0, 0)),
            entry(20, B, Acquire, 6, 0, bal(7, 7, 0, 0), bal(7, 1, 6, 0)),
        ]
    }

    fn clean_accounts() -> Vec<Account> {
        vec![account(A, bal(10, 6, 0, 4)), account(B, bal(7, 1, 6, 0))]
    }

    #[test]
    fn clean_ledger_gives_exact_totals() {
        let report = check(&clean_ledger(), &clean_accounts());
        assert_eq!(
            report,
            AuditReport {
                accounts_checked: 2,
                entries_checked: 14,
                violations: vec![],
                total_deposited: 17,
                total_available: 7,
                total_held: 6,
                total_consumed: 4,
            }
        );
        assert!(report.is_clean());
    }

    #[test]
    fn empty_audit_is_clean_and_zero() {
        let report = Auditor::new().finish();
        assert_eq!(report, AuditReport::default());
        assert!(report.is_clean());
    }

    #[test]
    fn sequence_must_increase() {
        let mut ledger = clean_ledger();
        ledger[3].seq = 3; // a repeat of 3
        ledger[5].seq = 2; // going back
        let report = check(&ledger, &clean_accounts());
        assert_eq!(
            report.violations,
            vec![
                violation(A, Some(3), "sequence 3 after 3"),
                violation(A, Some(2), "sequence 2 after 5"),
            ]
        );
        assert!(!report.is_clean());
        assert_eq!(report.entries_checked, 14);
    }

    #[test]
    fn recorded_before_must_match_the_replay() {
        let mut ledger = clean_ledger();
        ledger[1].before = bal(10, 9, 1, 0);
        ledger[1].after = bal(10, 5, 5, 0);
        let report = check(&ledger, &clean_accounts());
        assert_eq!(
            report.violations,
            vec![violation(
                A,
                Some(2),
                "before Balances { deposited: 10, available: 9, held: 1, consumed: 0 } \
                 differs from replayed Balances { deposited: 10, available: 10, held: 0, consumed: 0 }"
            )]
        );
    }

    /// Deposit 3 and hold 3 on account A: the history a settlement needs.
    fn funded() -> Vec<LedgerEntry> {
        use LedgerKind::*;
        vec![
            entry(1, A, Deposit, 3, 0, bal(0, 0, 0, 0), bal(3, 3, 0, 0)),
            entry(2, A, Acquire, 3, 0, bal(3, 3, 0, 0), bal(3, 0, 3, 0)),
        ]
    }

    #[test]
    fn settlement_shapes_are_checked() {
        use LedgerKind::*;
        // A reclaim that charges less than all units (delta and conservation
        // are consistent, so the shape is the only fault).
        let mut ledger = funded();
        ledger.push(entry(3, A, Reclaim, 3, 2, bal(3, 0, 3, 0), bal(3, 1, 0, 2)));
        assert_eq!(
            check(&ledger, &[account(A, bal(3, 1, 0, 2))]).violations,
            vec![violation(
                A,
                Some(3),
                "reclaim with units 3 and consumed 2 is not allowed"
            )]
        );
        // A release charging more than its units drives `available` negative.
        let mut ledger = funded();
        ledger.push(entry(
            3,
            A,
            Release,
            3,
            4,
            bal(3, 0, 3, 0),
            bal(3, -1, 0, 4),
        ));
        assert_eq!(
            check(&ledger, &[account(A, bal(3, -1, 0, 4))]).violations,
            vec![
                violation(
                    A,
                    Some(3),
                    "release with units 3 and consumed 4 is not allowed"
                ),
                violation(
                    A,
                    Some(3),
                    "conservation broken after entry: \
                     Balances { deposited: 3, available: -1, held: 0, consumed: 4 }"
                ),
                violation(
                    A,
                    None,
                    "stored balances break conservation: \
                     Balances { deposited: 3, available: -1, held: 0, consumed: 4 }"
                ),
            ]
        );
        // A release charging a negative amount.
        let mut ledger = funded();
        ledger.push(entry(
            3,
            A,
            Release,
            3,
            -1,
            bal(3, 0, 3, 0),
            bal(3, 4, 0, -1),
        ));
        let report = check(&ledger, &[account(A, bal(3, 4, 0, -1))]);
        assert_eq!(
            report.violations[0],
            violation(
                A,
                Some(3),
                "release with units 3 and consumed -1 is not allowed"
            )
        );
        assert_eq!(report.violations.len(), 3);
        // Releases at both ends of 0..=units are fine.
        for consumed in [0, 3] {
            let mut ledger = funded();
            let after = bal(3, 3 - consumed, 0, consumed);
            ledger.push(entry(3, A, Release, 3, consumed, bal(3, 0, 3, 0), after));
            assert_eq!(check(&ledger, &[account(A, after)]).violations, vec![]);
        }
    }

    #[test]
    fn other_shapes_are_checked() {
        use LedgerKind::*;
        let z = bal(0, 0, 0, 0);
        // Units must be positive for every kind; other kinds charge nothing.
        let cases = [
            (
                entry(1, A, Deposit, 0, 0, z, z),
                "deposit with units 0 and consumed 0",
            ),
            (
                entry(1, A, Renew, -1, 0, z, z),
                "renew with units -1 and consumed 0",
            ),
            (
                entry(1, A, Renew, 1, 1, z, z),
                "renew with units 1 and consumed 1",
            ),
            (
                entry(1, A, Deposit, 2, 1, z, bal(2, 2, 0, 0)),
                "deposit with units 2 and consumed 1",
            ),
            (
                entry(1, A, ConsolidatedGrant, 0, 0, z, z),
                "consolidated_grant with units 0 and consumed 0",
            ),
        ];
        for (e, want) in cases {
            let report = check(std::slice::from_ref(&e), &[account(A, e.after)]);
            assert_eq!(
                report.violations,
                vec![violation(A, Some(1), &format!("{want} is not allowed"))],
                "{e:?}"
            );
        }
    }

    #[test]
    fn deltas_must_match_the_kind() {
        use LedgerKind::*;
        // A renew that moved units, an acquire that moved too few, a deposit
        // that forgot `available`: each is reported once, and the replay
        // continues from the recomputed state, so the stored account then
        // differs from the ledger.
        let ledger = vec![
            entry(1, A, Deposit, 5, 0, bal(0, 0, 0, 0), bal(5, 5, 0, 0)),
            entry(2, A, Renew, 1, 0, bal(5, 5, 0, 0), bal(5, 4, 1, 0)),
        ];
        assert_eq!(
            check(&ledger, &[account(A, bal(5, 4, 1, 0))]).violations,
            vec![
                violation(
                    A,
                    Some(2),
                    "renew moved Balances { deposited: 5, available: 5, held: 0, consumed: 0 } \
                     -> Balances { deposited: 5, available: 4, held: 1, consumed: 0 }, \
                     expected delta Balances { deposited: 0, available: 0, held: 0, consumed: 0 }"
                ),
                violation(
                    A,
                    None,
                    "stored Balances { deposited: 5, available: 4, held: 1, consumed: 0 } \
                     but the ledger gives Balances { deposited: 5, available: 5, held: 0, consumed: 0 }"
                ),
            ]
        );
        let ledger = vec![entry(1, A, Deposit, 5, 0, bal(0, 0, 0, 0), bal(5, 0, 0, 0))];
        let report = check(&ledger, &[account(A, bal(5, 5, 0, 0))]);
        assert_eq!(
            report.violations,
            vec![
                violation(
                    A,
                    Some(1),
                    "deposit moved Balances { deposited: 0, available: 0, held: 0, consumed: 0 } \
                     -> Balances { deposited: 5, available: 0, held: 0, consumed: 0 }, \
                     expected delta Balances { deposited: 5, available: 5, held: 0, consumed: 0 }"
                ),
                violation(
                    A,
                    Some(1),
                    "conservation broken after entry: \
                     Balances { deposited: 5, available: 0, held: 0, consumed: 0 }"
                ),
            ]
        );
        // A delta that overflows i64 (after.held - before.held) is a
        // mismatch, not a panic.
        let ledger = vec![entry(
            1,
            A,
            Deposit,
            1,
            0,
            bal(0, 0, -1, 0),
            bal(1, 1, i64::MAX, 0),
        )];
        let report = check(&ledger, &[account(A, bal(1, 1, 0, 0))]);
        assert_eq!(
            report.violations,
            vec![
                violation(
                    A,
                    Some(1),
                    "before Balances { deposited: 0, available: 0, held: -1, consumed: 0 } \
                     differs from replayed Balances { deposited: 0, available: 0, held: 0, consumed: 0 }"
                ),
                violation(
                    A,
                    Some(1),
                    "deposit moved Balances { deposited: 0, available: 0, held: -1, consumed: 0 } \
                     -> Balances { deposited: 1, available: 1, held: 9223372036854775807, consumed: 0 }, \
                     expected delta Balances { deposited: 1, available: 1, held: 0, consumed: 0 }"
                ),
                violation(
                    A,
                    Some(1),
                    "conservation broken after entry: \
                     Balances { deposited: 1, available: 1, held: 9223372036854775807, consumed: 0 }"
                ),
            ]
        );
    }

    #[test]
    fn stored_accounts_are_compared() {
        // Stored balances that differ from the ledger, and stored balances
        // that break conservation.
        let mut accounts = clean_accounts();
        accounts[1].balances = bal(7, 2, 5, 0);
        accounts[0].balances = bal(11, 6, 0, 4);
        let report = check(&clean_ledger(), &accounts);
        assert_eq!(
            report.violations,
            vec![
                violation(
                    A,
                    None,
                    "stored balances break conservation: \
                     Balances { deposited: 11, available: 6, held: 0, consumed: 4 }"
                ),
                violation(
                    A,
                    None,
                    "stored Balances { deposited: 11, available: 6, held: 0, consumed: 4 } \
                     but the ledger gives Balances { deposited: 10, available: 6, held: 0, consumed: 4 }"
                ),
                violation(
                    B,
                    None,
                    "stored Balances { deposited: 7, available: 2, held: 5, consumed: 0 } \
                     but the ledger gives Balances { deposited: 7, available: 1, held: 6, consumed: 0 }"
                ),
            ]
        );
        assert_eq!((report.total_deposited, report.total_available), (18, 8));
        assert_eq!((report.total_held, report.total_consumed), (5, 4));
        // An account without entries must hold nothing.
        let report = check(
            &[],
            &[account(A, bal(0, 0, 0, 0)), account(B, bal(1, 1, 0, 0))],
        );
        assert_eq!(
            report.violations,
            vec![violation(
                B,
                None,
                "stored Balances { deposited: 1, available: 1, held: 0, consumed: 0 } \
                 but the ledger gives Balances { deposited: 0, available: 0, held: 0, consumed: 0 }"
            )]
        );
        assert_eq!(report.accounts_checked, 2);
    }

    #[test]
    fn ledger_of_an_unknown_account_is_reported() {
        let report = check(&clean_ledger(), &clean_accounts()[..1]);
        assert_eq!(
            report.violations,
            vec![violation(B, None, "ledger names an unknown account")]
        );
        assert_eq!(report.accounts_checked, 1);
        assert_eq!(report.entries_checked, 14);
    }
}
