//! The conformance suite every [`Allocator`] must pass (feature `testkit`).
//!
//! Each test is a public async function taking a [`StoreFactory`]; the
//! [`conformance_tests!`](crate::conformance_tests) macro expands them into
//! one `#[tokio::test]` per function, so every store runs the identical
//! tests:
//!
//! ```text
//! tollgate::conformance_tests!(MyFactory::new());
//! ```
//!
//! Every check asserts exact values: nanoseconds, balances, ledger entries
//! and error codes, never merely "no error".

use std::sync::Arc;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};

use crate::{
    Account, AccountId, AcquireRequest, Allocator, AllocatorError, Balances, Grant, GrantPolicy,
    LedgerKind, NewAccount, RuleError,
};

mod cases;
pub use cases::*;

/// Builds fresh, empty stores for the conformance tests.
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// A fresh, empty store applying `policy` (PostgreSQL: a fresh, migrated
    /// database).
    async fn store(&self, policy: GrantPolicy) -> Arc<dyn Allocator>;
}

/// Parses an RFC 3339 instant; panics on a typo in a test.
pub fn ts(s: &str) -> Timestamp {
    s.parse()
        .unwrap_or_else(|e| panic!("bad test timestamp {s:?}: {e}"))
}

/// `SignedDuration::new(secs, nanos)`.
pub fn dur(secs: i64, nanos: i32) -> SignedDuration {
    SignedDuration::new(secs, nanos)
}

/// A valid policy; panics on invalid test input.
pub fn policy(max_ttl: SignedDuration, grace: SignedDuration) -> GrantPolicy {
    GrantPolicy::new(max_ttl, grace).unwrap_or_else(|e| panic!("bad test policy: {e}"))
}

/// A fresh store with one account holding `deposit` units (deposited at
/// `now`).
pub async fn setup(
    f: &dyn StoreFactory,
    policy: GrantPolicy,
    deposit: i64,
    now: Timestamp,
) -> (Arc<dyn Allocator>, AccountId) {
    let store = f.store(policy).await;
    let a = new_account(&*store, "primary", deposit, now).await;
    (store, a)
}

/// Creates an account and deposits `deposit` units if positive.
pub async fn new_account(
    store: &dyn Allocator,
    name: &str,
    deposit: i64,
    now: Timestamp,
) -> AccountId {
    let a = store
        .create_account(NewAccount {
            name: name.into(),
            api_key_sha256: None,
        })
        .await
        .expect("create account");
    if deposit > 0 {
        store
            .deposit(a.account_id, deposit, now)
            .await
            .expect("deposit");
    }
    a.account_id
}

/// Acquires and unwraps.
pub async fn acquire(
    store: &dyn Allocator,
    account_id: AccountId,
    units: i64,
    ttl: SignedDuration,
    now: Timestamp,
) -> Grant {
    store
        .acquire(
            AcquireRequest {
                account_id,
                units,
                ttl,
                idempotency_key: None,
            },
            now.into(),
        )
        .await
        .unwrap_or_else(|e| panic!("acquire failed: {e} ({})", e.code()))
}

/// Asserts `result` failed with `code`.
pub fn expect_code<T: std::fmt::Debug>(result: Result<T, AllocatorError>, code: &str) {
    match result {
        Ok(v) => panic!("expected error {code}, got Ok({v:?})"),
        Err(e) => assert_eq!(e.code(), code, "wrong error: {e}"),
    }
}

/// Asserts the account's exact balances `(deposited, available, held,
/// consumed)`.
pub async fn assert_balances(store: &dyn Allocator, a: AccountId, expected: (i64, i64, i64, i64)) {
    let acct: Account = store.account(a).await.expect("read account");
    let (deposited, available, held, consumed) = expected;
    assert_eq!(
        acct.balances,
        Balances {
            deposited,
            available,
            held,
            consumed
        },
        "balances of account {a}"
    );
}

/// The kinds of the whole ledger, in order.
pub async fn ledger_kinds(store: &dyn Allocator) -> Vec<LedgerKind> {
    let mut kinds = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .ledger(after, crate::AUDIT_PAGE_MAX)
            .await
            .expect("ledger");
        for e in &page {
            kinds.push(e.kind);
            after = e.seq;
        }
        if page.len() < crate::AUDIT_PAGE_MAX {
            return kinds;
        }
    }
}

/// Asserts the audit is clean and its totals are exactly
/// `(deposited, available, held, consumed)` over all accounts.
pub async fn assert_audit(store: &dyn Allocator, totals: (i128, i128, i128, i128)) {
    let r = store.audit().await.expect("audit");
    assert!(r.is_clean(), "audit violations: {:?}", r.violations);
    assert_eq!(
        (
            r.total_deposited,
            r.total_available,
            r.total_held,
            r.total_consumed
        ),
        totals,
        "audit totals"
    );
}

/// Expands to one `#[tokio::test]` per conformance test, each calling the
/// test with a reference to the factory expression `$factory` (evaluated
/// per test).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@each $factory;
            fractional_ttl_precision,
            ttl_is_clamped_to_max_ttl_only,
            invalid_input_changes_nothing,
            negative_timestamps,
            domain_endpoints,
            exact_reclaim_boundary,
            grace_zero_boundary,
            grace_max_never_reclaims,
            renew_each_side_of_boundary,
            renew_never_shortens_and_fences_increase,
            consolidate_each_side_of_boundary,
            consolidate_unrepresentable_expiry_settles_nothing,
            consolidate_rejects_bad_sets,
            release_accounting,
            reclaim_is_idempotent_and_charges_all,
            reclaim_order_and_batch_limit,
            release_vs_reclaim_race,
            concurrent_acquires_never_overdraw,
            idempotent_acquire,
            capabilities_are_checked,
            deposit_overflow_and_unknown_account,
            ledger_records_every_change,
        );
    };
    (@each $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let factory = $factory;
                $crate::testkit::$name(&factory).await;
            }
        )*
    };
}
