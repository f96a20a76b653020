//! The records the allocator keeps and returns: accounts, leases, grants,
//! settlements, reclaim reports and ledger entries.

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use crate::capability::Capability;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub i64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// An account's identity: positive, assigned by the store, never reused.
    AccountId
);
id_type!(
    /// A lease's identity: positive, assigned by the store, never reused.
    LeaseId
);
id_type!(
    /// A fencing token: strictly increasing across every grant of a store
    /// (acquire, renewal and consolidation each take a new one), so
    /// downstream resources can refuse a stale holder.
    Fence
);

/// An account's balances in integer units.
///
/// Invariant (conservation, ARCHITECTURE.md):
/// `deposited = available + held + consumed`, every field `>= 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Balances {
    /// Units ever deposited.
    pub deposited: i64,
    /// Units free to be acquired.
    pub available: i64,
    /// Units held by active leases.
    pub held: i64,
    /// Units charged by settlements.
    pub consumed: i64,
}

impl Balances {
    /// Whether the conservation invariant holds (with nonnegative fields).
    pub fn is_conserved(&self) -> bool {
        self.available >= 0
            && self.held >= 0
            && self.consumed >= 0
            && i128::from(self.deposited)
                == i128::from(self.available) + i128::from(self.held) + i128::from(self.consumed)
    }
}

/// An account: its identity, name and balances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// The account's identity.
    pub account_id: AccountId,
    /// Human-readable name (1..=[`crate::ACCOUNT_NAME_MAX_CHARS`] characters).
    pub name: String,
    /// Current balances.
    pub balances: Balances,
}

/// What a new account is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAccount {
    /// Human-readable name.
    pub name: String,
    /// SHA-256 digest of the account's API key, if it has one. The store keeps
    /// only the digest.
    pub api_key_sha256: Option<[u8; 32]>,
}

/// The life-cycle state of a lease. `Active` is the only non-terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Holding units until expiry.
    Active,
    /// Settled by its holder before the reclaim boundary.
    Released,
    /// Settled by reclaim after the boundary, charging all units.
    Reclaimed,
    /// Settled into a new lease by consolidation, charging nothing.
    Consolidated,
}

impl LeaseState {
    /// The stable lower-case name (`active`, `released`, `reclaimed`,
    /// `consolidated`), also used in PostgreSQL and JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            LeaseState::Active => "active",
            LeaseState::Released => "released",
            LeaseState::Reclaimed => "reclaimed",
            LeaseState::Consolidated => "consolidated",
        }
    }

    /// Parses [`LeaseState::as_str`]'s output; `None` for anything else.
    pub fn parse(s: &str) -> Option<LeaseState> {
        match s {
            "active" => Some(LeaseState::Active),
            "released" => Some(LeaseState::Released),
            "reclaimed" => Some(LeaseState::Reclaimed),
            "consolidated" => Some(LeaseState::Consolidated),
            _ => None,
        }
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Identity.
    pub lease_id: LeaseId,
    /// The account it holds units of.
    pub account_id: AccountId,
    /// Units held (positive).
    pub units: i64,
    /// The latest fence issued to this lease (changes on renewal).
    pub fence: Fence,
    /// The exact expiry (or, for a legacy lease, the latest instant consistent
    /// with its truncated microseconds).
    pub expiry: Timestamp,
    /// `true` for a lease written before migration 0017 whose expiry is a
    /// conservative upper bound; `false` for every exact grant.
    pub expiry_is_upper_bound: bool,
    /// Life-cycle state.
    pub state: LeaseState,
    /// Units charged at settlement (`None` while active).
    pub consumed: Option<i64>,
}

/// What acquire and consolidation return: everything a holder needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The new lease.
    pub lease_id: LeaseId,
    /// The secret that authorizes operations on the lease.
    pub capability: Capability,
    /// The fence issued with this grant.
    pub fence: Fence,
    /// Units held.
    pub units: i64,
    /// Exact expiry: `now + granted_ttl`.
    pub expiry: Timestamp,
    /// The TTL after clamping to `max_ttl`.
    pub granted_ttl: SignedDuration,
}

/// An acquire request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The account to debit.
    pub account_id: AccountId,
    /// Units to hold, `1..=i64::MAX`.
    pub units: i64,
    /// Requested TTL, positive; clamped to `max_ttl`.
    pub ttl: SignedDuration,
    /// Optional idempotency key (per account), 1..=[`crate::IDEMPOTENCY_KEY_MAX_BYTES`]
    /// visible ASCII bytes. A retry with the same key and the same `units` and
    /// `ttl` returns the original grant.
    pub idempotency_key: Option<String>,
}

/// The result of a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The lease after renewal (new fence, expiry never earlier than before).
    pub lease: Lease,
    /// The TTL after clamping.
    pub granted_ttl: SignedDuration,
    /// Whether the renewal moved the expiry later. `false` when the lease
    /// already expired at or after the grant base plus `granted_ttl`: the
    /// expiry is unchanged, because a renewal never shortens a lease.
    pub extended: bool,
}

/// The terminal accounting of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The settled lease.
    pub lease_id: LeaseId,
    /// Its account.
    pub account_id: AccountId,
    /// How it settled.
    pub state: LeaseState,
    /// Units the lease held.
    pub units: i64,
    /// Units charged.
    pub consumed: i64,
    /// Units returned to `available`.
    pub returned: i64,
    /// The supplied time of the settlement.
    pub settled_at: Timestamp,
    /// The account's balances afterwards.
    pub balances: Balances,
}

/// What one reclaim batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimReport {
    /// `now - reclaim_grace`, or `None` when that underflows (nothing due).
    pub cutoff: Option<Timestamp>,
    /// Leases settled as reclaimed, in settlement order (account, then lease).
    pub reclaimed: Vec<LeaseId>,
    /// Units charged in total (i128: a batch spans accounts, so the sum may
    /// exceed one balance's range).
    pub units_charged: i128,
    /// For each lease of `reclaimed`, in the same order: how long after
    /// `expiry + reclaim_grace` it was reclaimed (`now - (expiry + grace)`,
    /// exact, never negative). The service exports it as the late-expiry
    /// histogram.
    pub late_by: Vec<SignedDuration>,
}

/// Who caused a ledger entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Actor {
    /// An operator (deposits, account creation).
    Operator,
    /// The holder of an account key or lease capability.
    Holder,
    /// The reclaim worker.
    Reclaimer,
}

impl Actor {
    /// Stable lower-case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Actor::Operator => "operator",
            Actor::Holder => "holder",
            Actor::Reclaimer => "reclaimer",
        }
    }

    /// Parses [`Actor::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Actor> {
        match s {
            "operator" => Some(Actor::Operator),
            "holder" => Some(Actor::Holder),
            "reclaimer" => Some(Actor::Reclaimer),
            _ => None,
        }
    }
}

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LedgerKind {
    /// Units deposited: `deposited += units`, `available += units`.
    Deposit,
    /// A lease granted by acquire: `available -= units`, `held += units`.
    Acquire,
    /// A lease renewed: balances unchanged, new expiry and fence.
    Renew,
    /// A lease released: `held -= units`, `consumed += consumed`,
    /// `available += units - consumed`.
    Release,
    /// A lease reclaimed: `held -= units`, `consumed += units`.
    Reclaim,
    /// A lease settled into a consolidation: balances unchanged.
    Consolidate,
    /// The lease a consolidation created: balances unchanged.
    ConsolidatedGrant,
}

impl LedgerKind {
    /// Stable lower-case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            LedgerKind::Deposit => "deposit",
            LedgerKind::Acquire => "acquire",
            LedgerKind::Renew => "renew",
            LedgerKind::Release => "release",
            LedgerKind::Reclaim => "reclaim",
            LedgerKind::Consolidate => "consolidate",
            LedgerKind::ConsolidatedGrant => "consolidated_grant",
        }
    }

    /// Parses [`LedgerKind::as_str`]'s output.
    pub fn parse(s: &str) -> Option<LedgerKind> {
        Some(match s {
            "deposit" => LedgerKind::Deposit,
            "acquire" => LedgerKind::Acquire,
            "renew" => LedgerKind::Renew,
            "release" => LedgerKind::Release,
            "reclaim" => LedgerKind::Reclaim,
            "consolidate" => LedgerKind::Consolidate,
            "consolidated_grant" => LedgerKind::ConsolidatedGrant,
            _ => return None,
        })
    }
}

/// One recorded state change. The ledger alone suffices to recompute every
/// account (see [`crate::audit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// Store-assigned, strictly increasing sequence number.
    pub seq: i64,
    /// The account whose balances the entry concerns.
    pub account_id: AccountId,
    /// The lease, if any.
    pub lease_id: Option<LeaseId>,
    /// What happened.
    pub kind: LedgerKind,
    /// Who did it.
    pub actor: Actor,
    /// Units deposited, or the lease's units.
    pub units: i64,
    /// Units charged (release, reclaim), else 0.
    pub consumed: i64,
    /// The account's balances before.
    pub before: Balances,
    /// The account's balances after.
    pub after: Balances,
    /// The lease's fence after the change, if a lease is concerned.
    pub fence: Option<Fence>,
    /// The lease's expiry after the change, if a lease is concerned.
    pub expiry: Option<Timestamp>,
    /// The supplied time of the operation.
    pub at: Timestamp,
}

/// A ledger entry to append: every field of a [`LedgerEntry`] but the
/// sequence number, which the store assigns in append order. Built only by
/// the core's plans ([`crate::rules`]); stores write it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewLedgerEntry {
    /// The account whose balances the entry concerns.
    pub account_id: AccountId,
    /// The lease, if any.
    pub lease_id: Option<LeaseId>,
    /// What happened.
    pub kind: LedgerKind,
    /// Who did it.
    pub actor: Actor,
    /// Units deposited, or the lease's units.
    pub units: i64,
    /// Units charged (release, reclaim), else 0.
    pub consumed: i64,
    /// The account's balances before.
    pub before: Balances,
    /// The account's balances after.
    pub after: Balances,
    /// The lease's fence after the change, if a lease is concerned.
    pub fence: Option<Fence>,
    /// The lease's expiry after the change, if a lease is concerned.
    pub expiry: Option<Timestamp>,
    /// Whether `expiry` is a legacy upper bound (a lease written before
    /// migration 0017 whose expiry the change kept); `false` without expiry.
    pub expiry_is_upper_bound: bool,
    /// The supplied time of the operation.
    pub at: Timestamp,
}

impl NewLedgerEntry {
    /// The entry as stored with sequence number `seq`.
    pub fn with_seq(self, seq: i64) -> LedgerEntry {
        LedgerEntry {
            seq,
            account_id: self.account_id,
            lease_id: self.lease_id,
            kind: self.kind,
            actor: self.actor,
            units: self.units,
            consumed: self.consumed,
            before: self.before,
            after: self.after,
            fence: self.fence,
            expiry: self.expiry,
            at: self.at,
        }
    }
}

/// What a store assigns when it writes a grant or a renewal: the lease's
/// identity and its new fence (both from the store's sequences).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issued {
    /// The lease.
    pub lease_id: LeaseId,
    /// Its new fence.
    pub fence: Fence,
}

/// The record an acquire with an idempotency key leaves, per account and
/// key: the request (units and TTL) and the grant it produced, so that a
/// retry of the same request returns the same grant
/// ([`crate::rules::check_replay`]). The capability is not recorded: it is
/// derived again from the lease id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyRecord {
    /// Units requested (and granted).
    pub units: i64,
    /// The TTL requested, before clamping.
    pub request_ttl: SignedDuration,
    /// `true` for a record written before migration 0017: `request_ttl`
    /// holds the requested TTL truncated toward zero to whole microseconds.
    pub request_ttl_is_truncated: bool,
    /// The granted lease.
    pub lease_id: LeaseId,
    /// The fence issued with the grant.
    pub fence: Fence,
    /// The grant's exact expiry.
    pub expiry: Timestamp,
    /// The TTL after clamping.
    pub granted_ttl: SignedDuration,
}
