//! Operation keys: the idempotency keys of control-plane operations, and
//! the rules of their life on the cut.
//!
//! # Design
//!
//! Every creating or state-changing request carries a key. The first use
//! records the request's SHA-256 and, once the operation reaches its
//! terminal transition, its result; a replay with the same key and digest
//! returns that result, a different digest is `idempotency_conflict`.
//!
//! Three instants decide what may happen to a key, all on the cut:
//!
//! * **floor**: the cut captured at the operation's terminal transition,
//!   certain or not ([`terminal_floor`]). It is a lower bound on the true
//!   time of that transition.
//! * **receipt**: the terminal receipt attaches only once a *certain* cut
//!   is strictly later than the floor ([`receipt_attachable`]): only then
//!   is the transition known to lie in the past of a vouched-for instant.
//! * **GC**: a key becomes deletable at
//!   `max(created_cut + ttl, floor + ttl)` ([`gc_at`]), judged on a
//!   certain cut and only once its receipt is attached ([`gc_due`]).
//!   Before that it is undeletable. There is no `terminal_at` from a host
//!   clock anywhere: a host clock that jumps cannot shorten a key's life.
//!
//! The TTL is declared per key (default [`OPERATION_TTL_DEFAULT`], 24 h)
//! and must fit the sealed horizon ([`check_ttl`]), so a key's GC instant
//! is a deadline inside `cut + horizon` like every other.
//!
//! Failure modes prevented: a replay after GC that runs an operation twice
//! because the key was deleted early (a forward clock step, an uncertain
//! cut), and a receipt that vouches for a transition the cut has not yet
//! certainly passed.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::model::{CutReading, Digest};

/// The longest key, in bytes.
pub const OPERATION_KEY_BYTES_MAX: usize = 255;

/// The declared TTL of a key unless configured otherwise: 24 hours.
pub const OPERATION_TTL_DEFAULT: SignedDuration = SignedDuration::from_hours(24);

/// An operation key as a request presents it: the key and the SHA-256 of
/// the request (the caller's canonical form of the body and target).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OperationKey {
    key: String,
    request_sha256: Digest,
}

impl OperationKey {
    /// Checks `key`: 1..=[`OPERATION_KEY_BYTES_MAX`] visible ASCII bytes
    /// (`!`..=`~`).
    ///
    /// # Errors
    /// [`LcError::InvalidOperationKey`].
    pub fn new(key: impl Into<String>, request_sha256: Digest) -> Result<OperationKey, LcError> {
        let key = key.into();
        let ok = !key.is_empty()
            && key.len() <= OPERATION_KEY_BYTES_MAX
            && key.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(LcError::InvalidOperationKey {
                reason: format!("a key is 1 to {OPERATION_KEY_BYTES_MAX} visible ASCII characters"),
            });
        }
        Ok(OperationKey {
            key,
            request_sha256,
        })
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The request's digest.
    pub fn request_sha256(&self) -> Digest {
        self.request_sha256
    }
}

/// Checks a declared TTL: positive and at most `horizon`.
///
/// # Errors
/// [`LcError::InvalidTimeout`] naming the bound.
pub fn check_ttl(ttl: SignedDuration, horizon: SignedDuration) -> Result<SignedDuration, LcError> {
    if ttl <= SignedDuration::ZERO || ttl > horizon {
        return Err(LcError::InvalidTimeout {
            reason: format!(
                "an operation key's ttl must be positive and at most the horizon {horizon:#}"
            ),
        });
    }
    Ok(ttl)
}

/// The floor a terminal transition captures: the reading's cut, certain
/// or not.
pub fn terminal_floor(at: CutReading) -> Timestamp {
    at.cut
}

/// Whether the terminal receipt may attach at `at`: a certain cut strictly
/// later than `floor`.
pub fn receipt_attachable(floor: Timestamp, at: CutReading) -> bool {
    at.certain && at.cut > floor
}

/// The instant from which GC may delete a key:
/// `max(created_cut + ttl, floor + ttl)`; `None` when that lies beyond
/// [`Timestamp::MAX`] (never deletable).
pub fn gc_at(created_cut: Timestamp, floor: Timestamp, ttl: SignedDuration) -> Option<Timestamp> {
    let created = created_cut.checked_add(ttl).ok()?;
    let floored = floor.checked_add(ttl).ok()?;
    Some(created.max(floored))
}

/// Whether GC may delete a key at `at`: its receipt is attached, the cut
/// is certain and has reached [`gc_at`].
pub fn gc_due(
    created_cut: Timestamp,
    floor: Timestamp,
    ttl: SignedDuration,
    receipt_attached: bool,
    at: CutReading,
) -> bool {
    receipt_attached
        && at.certain
        && gc_at(created_cut, floor, ttl).is_some_and(|due| at.cut >= due)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }
    const NS: SignedDuration = SignedDuration::from_nanos(1);
    const BASE: i128 = 1_800_000_000_123_456_789;

    #[test]
    fn keys_are_visible_ascii_up_to_255_bytes() {
        let d = Digest([1; 32]);
        OperationKey::new("a".repeat(255), d).unwrap();
        for bad in [
            String::new(),
            "a".repeat(256),
            "a b".into(),
            "é".into(),
            "a\n".into(),
        ] {
            assert_eq!(
                OperationKey::new(bad, d).unwrap_err().code(),
                "invalid_operation_key"
            );
        }
    }

    #[test]
    fn the_floor_is_the_cut_certain_or_not() {
        assert_eq!(terminal_floor(CutReading::uncertain(t(BASE), 1)), t(BASE));
        assert_eq!(terminal_floor(CutReading::certain(t(BASE))), t(BASE));
    }

    #[test]
    fn the_receipt_needs_a_certain_cut_strictly_past_the_floor() {
        let floor = t(BASE);
        assert!(!receipt_attachable(floor, CutReading::certain(t(BASE - 1))));
        assert!(!receipt_attachable(floor, CutReading::certain(t(BASE))));
        assert!(receipt_attachable(floor, CutReading::certain(t(BASE + 1))));
        // Uncertain: never, however late.
        assert!(!receipt_attachable(
            floor,
            CutReading::uncertain(t(BASE + 1), 1)
        ));
        assert!(!receipt_attachable(
            floor,
            CutReading::uncertain(t(BASE + 10_i128.pow(15)), 1)
        ));
    }

    #[test]
    fn gc_is_at_the_later_of_creation_and_floor_plus_ttl() {
        let ttl = SignedDuration::from_hours(24);
        let ttl_ns = 86_400_000_000_000_i128;
        // Floor after creation: floor + ttl decides.
        let created = t(BASE);
        let floor = t(BASE + 5_000);
        let due = t(BASE + 5_000 + ttl_ns);
        assert_eq!(gc_at(created, floor, ttl), Some(due));
        for (offset, expect) in [(-1, false), (0, true), (1, true)] {
            let at = CutReading::certain(t(BASE + 5_000 + ttl_ns + offset));
            assert_eq!(
                gc_due(created, floor, ttl, true, at),
                expect,
                "offset {offset}"
            );
        }
        // Floor equal to creation: the same instant either way.
        assert_eq!(gc_at(created, created, ttl), Some(t(BASE + ttl_ns)));
        // A floor before creation (cannot happen on a cut that never goes
        // backward, but the rule still takes the later one).
        assert_eq!(gc_at(t(BASE), t(BASE - 7), ttl), Some(t(BASE + ttl_ns)));
        for (offset, expect) in [(-1, false), (0, true), (1, true)] {
            let at = CutReading::certain(t(BASE + ttl_ns + offset));
            assert_eq!(gc_due(t(BASE), t(BASE - 7), ttl, true, at), expect);
        }
    }

    #[test]
    fn gc_never_happens_without_receipt_or_certainty() {
        let ttl = SignedDuration::from_secs(1);
        let late = t(BASE + 10_i128.pow(12));
        assert!(!gc_due(
            t(BASE),
            t(BASE),
            ttl,
            false,
            CutReading::certain(late)
        ));
        assert!(!gc_due(
            t(BASE),
            t(BASE),
            ttl,
            true,
            CutReading::uncertain(late, 1)
        ));
        assert!(gc_due(
            t(BASE),
            t(BASE),
            ttl,
            true,
            CutReading::certain(late)
        ));
        // Beyond the timestamp domain: never deletable.
        assert_eq!(gc_at(Timestamp::MAX, Timestamp::MAX, NS), None);
        assert!(!gc_due(
            Timestamp::MAX,
            Timestamp::MAX,
            NS,
            true,
            CutReading::certain(Timestamp::MAX)
        ));
    }

    #[test]
    fn the_ttl_fits_the_horizon() {
        let h = SignedDuration::from_hours(48);
        assert_eq!(check_ttl(h, h).unwrap(), h);
        assert_eq!(check_ttl(h + NS, h).unwrap_err().code(), "invalid_timeout");
        assert_eq!(
            check_ttl(SignedDuration::ZERO, h).unwrap_err().code(),
            "invalid_timeout"
        );
        assert_eq!(check_ttl(NS, h).unwrap(), NS);
    }
}
