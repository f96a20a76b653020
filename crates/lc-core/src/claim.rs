//! Claims: which worker activation may act on a work item, until when, and
//! which of its writes the store still accepts.
//!
//! # Rules
//!
//! * **Claim.** One worker activation holds a claim on an item (today a
//!   sandbox Lease, [`ClaimKind::Lease`]) at a time. It names itself by a
//!   random [`ClaimHolder`] (128 bits, drawn once per activation; the store
//!   keeps only its SHA-256), and the store gives each take a
//!   [`ClaimGeneration`]: 1 for the first holder of the item, one more for
//!   every take by another holder. The claim's expiry is on the cut.
//! * **Take** ([`plan_claim`]): an item another holder claimed may be
//!   taken only when a certain cut has passed that holder's expiry plus
//!   [`CLAIM_GRACE_DEFAULT`] (the store's configured grace):
//!   `cut >= expiry + grace`, so at `expiry + grace - 1 ns` it is still the
//!   holder's.
//!   While the cut is uncertain nothing is taken from a holder, whatever
//!   the claim's age. An item never claimed is claimed at generation 1 on
//!   any cut: it ends nobody's authority, and its expiry `cut + ttl` is
//!   never later than a certain cut's would be (the cut is a lower bound
//!   on true time), so a worker keeps allocating and renewing while the
//!   cut is uncertain, as it did before claims.
//! * **Renewal** ([`renewed_claim_expiry`]): the holder renews to
//!   `max(current, cut + ttl)` on any cut, certain or not: a renewal never
//!   shortens, and an uncertain cut still keeps the holder serving.
//! * **Fenced writes** ([`check_claim`]): a write on a claimed item is
//!   accepted only from its current claim (holder digest and generation
//!   both equal); anything else is `claim_stale` and changes nothing. The
//!   store checks it under the claim row's lock in the same transaction as
//!   the write, so a write and a take never interleave.
//!
//! Claims mirror exec ownership ([`crate::owner`]): the same takeover
//! bases ([`TakeoverBasis`]), the same expiry and renewal rules
//! ([`crate::rules::is_expired`], [`crate::rules::renewed_expiry`]); a claim
//! adds the grace, because a worker's step can outlast a heartbeat-sized
//! TTL while it waits on a provider, and a take that comes a little later
//! costs only latency.
//!
//! No function here reads a clock or does I/O.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::model::{CutReading, Digest, LeaseWork};
use crate::owner::TakeoverBasis;
use crate::rules::{is_expired, renewed_expiry};

/// Bytes of a claim holder id: 16 random bytes (128 bits).
pub const CLAIM_HOLDER_BYTES: usize = 16;

/// The claim TTL when none is configured: 10 s. A worker renews its claims
/// at every step (250 ms by default), so a claim outlives dozens of missed
/// steps, and a killed worker's items are taken within `ttl + grace` of a
/// certain cut.
pub const CLAIM_TTL_DEFAULT: SignedDuration = SignedDuration::from_secs(10);

/// The shortest claim TTL accepted: 1 s (the cut advances in steps of the
/// sampler's interval; a shorter TTL would expire between samples).
pub const CLAIM_TTL_MIN: SignedDuration = SignedDuration::from_secs(1);

/// The longest claim TTL accepted: 10 minutes. It must also fit the sealed
/// horizon, which the store checks at every take and renewal.
pub const CLAIM_TTL_MAX: SignedDuration = SignedDuration::from_secs(600);

/// The claim grace when none is configured: 2 s past the expiry before
/// another worker may take the item, room for a holder whose renewal is in
/// flight when its expiry passes.
pub const CLAIM_GRACE_DEFAULT: SignedDuration = SignedDuration::from_secs(2);

/// The longest claim grace accepted: 10 minutes (zero is accepted).
pub const CLAIM_GRACE_MAX: SignedDuration = SignedDuration::from_secs(600);

/// A worker activation's id: [`CLAIM_HOLDER_BYTES`] random bytes. `Debug`
/// shows only the first bytes of its SHA-256; the store keeps only
/// [`ClaimHolder::sha256`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ClaimHolder([u8; CLAIM_HOLDER_BYTES]);

impl ClaimHolder {
    /// Wraps `bytes`, which the caller drew from a cryptographic random
    /// source once per worker activation.
    pub const fn from_bytes(bytes: [u8; CLAIM_HOLDER_BYTES]) -> ClaimHolder {
        ClaimHolder(bytes)
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8; CLAIM_HOLDER_BYTES] {
        &self.0
    }

    /// SHA-256 of the id's bytes: what the store keeps, compares and lists.
    pub fn sha256(&self) -> Digest {
        Digest::of(&self.0)
    }
}

impl fmt::Debug for ClaimHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.sha256().to_hex();
        write!(f, "ClaimHolder(sha256 {}..)", &hex[..12])
    }
}

/// The generation of a claim: 1 for the item's first holder, one more for
/// each take by another holder; a renewal keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClaimGeneration(pub i64);

impl fmt::Display for ClaimGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The kind of a claimed item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimKind {
    /// A sandbox Lease, by its id: the reconciler's work item.
    Lease,
}

impl ClaimKind {
    /// The kind's wire name: `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Lease => "lease",
        }
    }

    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<ClaimKind> {
        match s {
            "lease" => Some(ClaimKind::Lease),
            _ => None,
        }
    }
}

/// A claimed item: its kind and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClaimItem {
    /// What kind of item.
    pub kind: ClaimKind,
    /// Its id within its kind (a sandbox Lease id).
    pub id: i64,
}

impl fmt::Display for ClaimItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.id)
    }
}

/// A claim as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The item.
    pub item: ClaimItem,
    /// SHA-256 of the holder's id.
    pub holder_sha256: Digest,
    /// Its generation.
    pub generation: ClaimGeneration,
    /// Its expiry on the cut.
    pub expiry: Timestamp,
    /// Why the current holder could take it.
    pub basis: TakeoverBasis,
}

/// What a worker presents with every write on a claimed item: the item,
/// its activation id and the generation its claim was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimCredential {
    /// The item.
    pub item: ClaimItem,
    /// The worker activation.
    pub holder: ClaimHolder,
    /// The claim's generation.
    pub generation: ClaimGeneration,
}

/// A due Lease the caller now holds a claim on
/// ([`crate::store::ReconcileStore::claim_due_work`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedWork {
    /// The Lease and its planned action, as `due_work` lists it.
    pub work: LeaseWork,
    /// What every write on it presents
    /// ([`crate::store::ReconcileStore::claimed`]).
    pub claim: ClaimCredential,
    /// The claim's expiry on the cut after this take or renewal.
    pub expiry: Timestamp,
}

/// A claim as the operators' listing shows it, judged at one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// The claim.
    pub claim: Claim,
    /// Whether the reading is certain and its cut has reached the expiry.
    pub expired: bool,
    /// Whether another worker may take it at the reading: certain and
    /// `cut >= expiry + grace` ([`is_takeable`]).
    pub takeable: bool,
}

impl ClaimRecord {
    /// `claim` judged at `at` with `grace`.
    pub fn judge(claim: Claim, grace: SignedDuration, at: CutReading) -> ClaimRecord {
        ClaimRecord {
            claim,
            expired: is_expired(claim.expiry, at),
            takeable: is_takeable(claim.expiry, grace, at),
        }
    }
}

/// What [`plan_claim`] decided: the claim to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimPlan {
    /// A take: the holder changes (or the item had none); the generation
    /// is the previous one plus 1 (1 when unclaimed).
    Take {
        /// Why it may be taken.
        basis: TakeoverBasis,
        /// The new generation.
        generation: ClaimGeneration,
        /// The new expiry, `cut + ttl`.
        expiry: Timestamp,
    },
    /// The caller holds it already: its expiry becomes
    /// `max(current, cut + ttl)`, the generation stays.
    Renew {
        /// The generation, unchanged.
        generation: ClaimGeneration,
        /// The renewed expiry (never earlier than the current one).
        expiry: Timestamp,
    },
}

impl ClaimPlan {
    /// The generation the plan writes.
    pub fn generation(&self) -> ClaimGeneration {
        match *self {
            ClaimPlan::Take { generation, .. } | ClaimPlan::Renew { generation, .. } => generation,
        }
    }

    /// The expiry the plan writes.
    pub fn expiry(&self) -> Timestamp {
        match *self {
            ClaimPlan::Take { expiry, .. } | ClaimPlan::Renew { expiry, .. } => expiry,
        }
    }
}

/// Checks a claim TTL against its bounds.
///
/// # Errors
/// [`LcError::InvalidTimeout`] outside [`CLAIM_TTL_MIN`]`..=`[`CLAIM_TTL_MAX`].
pub fn check_claim_ttl(ttl: SignedDuration) -> Result<SignedDuration, LcError> {
    if (CLAIM_TTL_MIN..=CLAIM_TTL_MAX).contains(&ttl) {
        Ok(ttl)
    } else {
        Err(LcError::InvalidTimeout {
            reason: format!("claim TTL {ttl:#} must be in {CLAIM_TTL_MIN:#}..={CLAIM_TTL_MAX:#}"),
        })
    }
}

/// Checks a claim grace against its bounds.
///
/// # Errors
/// [`LcError::InvalidTimeout`] outside `0s..=`[`CLAIM_GRACE_MAX`].
pub fn check_claim_grace(grace: SignedDuration) -> Result<SignedDuration, LcError> {
    if (SignedDuration::ZERO..=CLAIM_GRACE_MAX).contains(&grace) {
        Ok(grace)
    } else {
        Err(LcError::InvalidTimeout {
            reason: format!("claim grace {grace:#} must be in 0s..={CLAIM_GRACE_MAX:#}"),
        })
    }
}

/// Whether another holder may take a claim whose expiry is `expiry` at
/// `at`: `at` certain and `at.cut >= expiry + grace`. An `expiry + grace`
/// beyond [`Timestamp::MAX`] never passes.
pub fn is_takeable(expiry: Timestamp, grace: SignedDuration, at: CutReading) -> bool {
    expiry
        .checked_add(grace)
        .is_ok_and(|deadline| is_expired(deadline, at))
}

/// The latest expiry another holder may take at `at`: `at.cut - grace` on
/// a certain `at` (`expiry <= cutoff` is exactly [`is_takeable`]); `None`
/// while uncertain or when it lies before [`Timestamp::MIN`] (nothing is
/// takeable). The store selects candidates with it; [`plan_claim`] decides.
pub fn take_cutoff(grace: SignedDuration, at: CutReading) -> Option<Timestamp> {
    if !at.certain {
        return None;
    }
    at.cut.checked_sub(grace).ok()
}

/// The expiry after the holder renews a claim expiring at `current` at
/// `at` with `ttl`: `max(current, cut + ttl)` on any cut.
///
/// # Errors
/// [`LcError::InvalidTimeout`] for a TTL outside its bounds or a `cut +
/// ttl` that is not representable.
pub fn renewed_claim_expiry(
    current: Timestamp,
    at: CutReading,
    ttl: SignedDuration,
) -> Result<Timestamp, LcError> {
    renewed_expiry(current, at, check_claim_ttl(ttl)?)
}

/// What `holder_sha256` may write for an item whose claim is `current` at
/// `at`, with `ttl` and `grace`.
///
/// * Held by the caller: a renewal (on any cut, never shortening).
/// * Unclaimed: a take of generation 1, on any cut (see the module docs).
/// * Held by another, and a certain cut has reached its expiry + grace: a
///   take of the next generation.
///
/// # Errors
/// [`LcError::TimeUncertain`] for a take from another holder on an
/// uncertain cut;
/// [`LcError::ClaimLive`] when another holder's claim is not takeable at
/// `at`; [`LcError::InvalidTimeout`] for a TTL or grace outside its bounds.
pub fn plan_claim(
    current: Option<&Claim>,
    holder_sha256: Digest,
    at: CutReading,
    ttl: SignedDuration,
    grace: SignedDuration,
) -> Result<ClaimPlan, LcError> {
    let ttl = check_claim_ttl(ttl)?;
    let grace = check_claim_grace(grace)?;
    if let Some(c) = current
        && c.holder_sha256 == holder_sha256
    {
        return Ok(ClaimPlan::Renew {
            generation: c.generation,
            expiry: renewed_expiry(c.expiry, at, ttl)?,
        });
    }
    let expiry = crate::rules::deadline_after(at, ttl)?;
    if current.is_some() && !at.certain {
        return Err(LcError::TimeUncertain {
            retry_after_s: at.retry_after_s.max(1),
        });
    }
    match current {
        None => Ok(ClaimPlan::Take {
            basis: TakeoverBasis::Unowned,
            generation: ClaimGeneration(1),
            expiry,
        }),
        Some(c) if is_takeable(c.expiry, grace, at) => Ok(ClaimPlan::Take {
            basis: TakeoverBasis::Expired,
            generation: ClaimGeneration(c.generation.0 + 1),
            expiry,
        }),
        Some(c) => Err(LcError::ClaimLive {
            item: c.item.to_string(),
            generation: c.generation,
            expiry: c.expiry,
        }),
    }
}

/// Checks that `cred` may write on the item whose claim is `current`
/// (`None`: never claimed).
///
/// # Errors
/// [`LcError::ClaimStale`] when `cred` is not the current claim: another
/// holder took the item, the generation moved, or the item was never
/// claimed. Expiry alone does not refuse a write: until another holder
/// takes the item (which locks the claim row, as every fenced write does),
/// nobody else acts on it.
pub fn check_claim(current: Option<&Claim>, cred: &ClaimCredential) -> Result<(), LcError> {
    match current {
        Some(c)
            if c.item == cred.item
                && c.holder_sha256 == cred.holder.sha256()
                && c.generation == cred.generation =>
        {
            Ok(())
        }
        _ => Err(LcError::ClaimStale {
            item: cred.item.to_string(),
            presented: cred.generation,
            current: current.map(|c| c.generation),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: SignedDuration = SignedDuration::from_nanos(1);
    const TTL: SignedDuration = SignedDuration::from_secs(10);
    const GRACE: SignedDuration = SignedDuration::from_secs(2);

    fn t(ns: i64) -> Timestamp {
        Timestamp::from_nanosecond(i128::from(ns)).unwrap()
    }

    fn at(ns: i64, certain: bool) -> CutReading {
        CutReading {
            cut: t(ns),
            certain,
            retry_after_s: 3,
        }
    }

    fn holder(b: u8) -> ClaimHolder {
        ClaimHolder::from_bytes([b; CLAIM_HOLDER_BYTES])
    }

    const ITEM: ClaimItem = ClaimItem {
        kind: ClaimKind::Lease,
        id: 7,
    };

    fn claim(by: u8, generation: i64, expiry_ns: i64) -> Claim {
        Claim {
            item: ITEM,
            holder_sha256: holder(by).sha256(),
            generation: ClaimGeneration(generation),
            expiry: t(expiry_ns),
            basis: TakeoverBasis::Unowned,
        }
    }

    const S: i64 = 1_000_000_000;

    #[test]
    fn a_free_item_is_claimed_at_generation_one_on_any_cut() {
        for certain in [true, false] {
            assert_eq!(
                plan_claim(None, holder(1).sha256(), at(100 * S, certain), TTL, GRACE),
                Ok(ClaimPlan::Take {
                    basis: TakeoverBasis::Unowned,
                    generation: ClaimGeneration(1),
                    expiry: t(110 * S),
                })
            );
        }
    }

    #[test]
    fn another_holder_s_claim_is_takeable_exactly_at_expiry_plus_grace() {
        let c = claim(1, 4, 50 * S);
        let me = holder(2).sha256();
        let boundary = 52 * S;
        // One nanosecond before expiry + grace: still the holder's.
        assert_eq!(
            plan_claim(Some(&c), me, at(boundary - 1, true), TTL, GRACE),
            Err(LcError::ClaimLive {
                item: "lease 7".into(),
                generation: ClaimGeneration(4),
                expiry: t(50 * S),
            })
        );
        assert!(!is_takeable(c.expiry, GRACE, at(boundary - 1, true)));
        // At expiry + grace on a certain cut: the next generation.
        assert_eq!(
            plan_claim(Some(&c), me, at(boundary, true), TTL, GRACE),
            Ok(ClaimPlan::Take {
                basis: TakeoverBasis::Expired,
                generation: ClaimGeneration(5),
                expiry: t(boundary) + TTL,
            })
        );
        // The same cut, uncertain: nothing is taken, however late.
        assert_eq!(
            plan_claim(Some(&c), me, at(boundary + 3600 * S, false), TTL, GRACE),
            Err(LcError::TimeUncertain { retry_after_s: 3 })
        );
        // take_cutoff is the same boundary.
        assert_eq!(take_cutoff(GRACE, at(boundary, true)), Some(t(50 * S)));
        assert_eq!(
            take_cutoff(GRACE, at(boundary - 1, true)),
            Some(t(50 * S) - NS)
        );
        assert_eq!(take_cutoff(GRACE, at(boundary, false)), None);
        let min = CutReading {
            cut: Timestamp::MIN,
            ..at(0, true)
        };
        assert_eq!(take_cutoff(GRACE, min), None);
    }

    #[test]
    fn the_holder_renews_to_the_max_on_any_cut_and_keeps_its_generation() {
        let c = claim(1, 3, 50 * S);
        let me = holder(1).sha256();
        // A later cut extends it.
        assert_eq!(
            plan_claim(Some(&c), me, at(45 * S, true), TTL, GRACE),
            Ok(ClaimPlan::Renew {
                generation: ClaimGeneration(3),
                expiry: t(55 * S),
            })
        );
        // An uncertain (frozen, earlier) cut never shortens it.
        assert_eq!(
            plan_claim(Some(&c), me, at(30 * S, false), TTL, GRACE),
            Ok(ClaimPlan::Renew {
                generation: ClaimGeneration(3),
                expiry: t(50 * S),
            })
        );
        // Past expiry + grace, not taken: still the holder's to renew.
        assert_eq!(
            plan_claim(Some(&c), me, at(90 * S, true), TTL, GRACE),
            Ok(ClaimPlan::Renew {
                generation: ClaimGeneration(3),
                expiry: t(100 * S),
            })
        );
        assert_eq!(
            renewed_claim_expiry(t(50 * S), at(30 * S, false), TTL),
            Ok(t(50 * S))
        );
    }

    #[test]
    fn ttl_and_grace_bounds() {
        for (ttl, ok) in [
            (CLAIM_TTL_MIN - NS, false),
            (CLAIM_TTL_MIN, true),
            (CLAIM_TTL_MAX, true),
            (CLAIM_TTL_MAX + NS, false),
        ] {
            assert_eq!(check_claim_ttl(ttl).is_ok(), ok, "{ttl:?}");
        }
        for (grace, ok) in [
            (-NS, false),
            (SignedDuration::ZERO, true),
            (CLAIM_GRACE_MAX, true),
            (CLAIM_GRACE_MAX + NS, false),
        ] {
            assert_eq!(check_claim_grace(grace).is_ok(), ok, "{grace:?}");
        }
        assert_eq!(
            check_claim_ttl(SignedDuration::from_millis(999))
                .unwrap_err()
                .to_string(),
            "invalid timeout: claim TTL 999ms must be in 1s..=10m"
        );
        assert!(CLAIM_TTL_DEFAULT >= CLAIM_TTL_MIN && CLAIM_TTL_DEFAULT <= CLAIM_TTL_MAX);
        assert!(CLAIM_GRACE_DEFAULT <= CLAIM_GRACE_MAX);
        // A grace past Timestamp::MAX never passes.
        let max = CutReading {
            cut: Timestamp::MAX,
            ..at(0, true)
        };
        assert!(!is_takeable(Timestamp::MAX, NS, max));
        assert!(is_takeable(Timestamp::MAX, SignedDuration::ZERO, max));
    }

    #[test]
    fn only_the_current_claim_writes() {
        let c = claim(1, 3, 50 * S);
        let mine = ClaimCredential {
            item: ITEM,
            holder: holder(1),
            generation: ClaimGeneration(3),
        };
        assert_eq!(check_claim(Some(&c), &mine), Ok(()));
        let old = ClaimCredential {
            generation: ClaimGeneration(2),
            ..mine
        };
        let other = ClaimCredential {
            holder: holder(2),
            ..mine
        };
        for cred in [old, other] {
            assert_eq!(
                check_claim(Some(&c), &cred),
                Err(LcError::ClaimStale {
                    item: "lease 7".into(),
                    presented: cred.generation,
                    current: Some(ClaimGeneration(3)),
                })
            );
        }
        let e = check_claim(None, &mine).unwrap_err();
        assert_eq!(e.code(), "claim_stale");
        assert_eq!(
            e.to_string(),
            "lease 7: claim generation 3 is stale (current generation none); stop acting on it"
        );
        assert_eq!(
            format!("{:?}", holder(1)),
            format!(
                "ClaimHolder(sha256 {}..)",
                &holder(1).sha256().to_hex()[..12]
            )
        );
    }

    #[test]
    fn names_bytes_and_plan_accessors_are_exact() {
        assert_eq!(holder(3).as_bytes(), &[3u8; CLAIM_HOLDER_BYTES]);
        assert_eq!(ClaimKind::Lease.as_str(), "lease");
        assert_eq!(ClaimKind::parse("lease"), Some(ClaimKind::Lease));
        assert_eq!(ClaimKind::parse("Lease"), None);
        let take = plan_claim(None, holder(1).sha256(), at(100 * S, true), TTL, GRACE).unwrap();
        assert_eq!(
            (take.generation(), take.expiry()),
            (ClaimGeneration(1), t(110 * S))
        );
        let c = claim(1, 3, 50 * S);
        let renew = plan_claim(Some(&c), holder(1).sha256(), at(45 * S, true), TTL, GRACE).unwrap();
        assert_eq!(
            (renew.generation(), renew.expiry()),
            (ClaimGeneration(3), t(55 * S))
        );
    }

    #[test]
    fn a_holder_s_digest_and_a_judged_record_are_exact() {
        // SHA-256 of sixteen 0x01 bytes.
        assert_eq!(
            holder(1).sha256().to_hex(),
            "cc8cd41cef907c4d216069122c4b89936211361f9050a717a1e37ad1862e952f"
        );
        let c = claim(1, 4, 50 * S);
        // (cut, certain, expired, takeable)
        for (cut, certain, expired, takeable) in [
            (50 * S - 1, true, false, false),
            (50 * S, true, true, false),
            (52 * S, true, true, true),
            (52 * S, false, false, false),
        ] {
            assert_eq!(
                ClaimRecord::judge(c, GRACE, at(cut, certain)),
                ClaimRecord {
                    claim: c,
                    expired,
                    takeable
                },
                "{cut} {certain}"
            );
        }
    }
}
