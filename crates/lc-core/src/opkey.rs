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

    const MIN_NS: i128 = -377_705_023_201_000_000_000;
    const MAX_NS: i128 = 253_402_207_200_999_999_999;

    #[test]
    fn a_key_gives_back_its_text_and_digest() {
        let d = Digest([0xab; 32]);
        let k = OperationKey::new("exec-create-7f3a", d).unwrap();
        assert_eq!(k.key(), "exec-create-7f3a");
        assert_eq!(k.request_sha256(), Digest([0xab; 32]));
        // The ends of the visible range, and the longest key.
        let k = OperationKey::new("!~", Digest([0; 32])).unwrap();
        assert_eq!(k.key(), "!~");
        assert_eq!(k.request_sha256(), Digest([0; 32]));
        let long = "k".repeat(255);
        assert_eq!(OperationKey::new(long.clone(), d).unwrap().key(), long);
        assert_eq!(OPERATION_KEY_BYTES_MAX, 255);
        assert_eq!(
            OperationKey::new("a".repeat(256), d),
            Err(LcError::InvalidOperationKey {
                reason: "a key is 1 to 255 visible ASCII characters".into(),
            })
        );
    }

    #[test]
    fn ttl_boundaries_are_exact() {
        assert_eq!(
            OPERATION_TTL_DEFAULT,
            SignedDuration::from_nanos(86_400_000_000_000)
        );
        let h = SignedDuration::from_hours(48);
        let refused = Err(LcError::InvalidTimeout {
            reason: "an operation key's ttl must be positive and at most the horizon 48h".into(),
        });
        for (ttl, expect) in [
            (SignedDuration::MIN, refused.clone()),
            (-NS, refused.clone()),
            (SignedDuration::ZERO, refused.clone()),
            (NS, Ok(NS)),
            (h - NS, Ok(h - NS)),
            (h, Ok(h)),
            (h + NS, refused.clone()),
            (SignedDuration::MAX, refused.clone()),
        ] {
            assert_eq!(check_ttl(ttl, h), expect, "ttl {ttl:#}");
        }
        // The default fits a 24 h horizon exactly.
        assert_eq!(
            check_ttl(OPERATION_TTL_DEFAULT, SignedDuration::from_hours(24)),
            Ok(OPERATION_TTL_DEFAULT)
        );
    }

    #[test]
    fn floor_and_receipt_at_the_domain_ends() {
        for ns in [MIN_NS, MIN_NS + 1, -1, 0, 1, MAX_NS - 1, MAX_NS] {
            assert_eq!(terminal_floor(CutReading::certain(t(ns))), t(ns));
            assert_eq!(terminal_floor(CutReading::uncertain(t(ns), 0)), t(ns));
        }
        // (floor, cut, certain, attachable)
        for (floor, cut, certain, expect) in [
            (MIN_NS, MIN_NS, true, false),
            (MIN_NS, MIN_NS + 1, true, true),
            (MIN_NS, MIN_NS + 1, false, false),
            (MAX_NS - 1, MAX_NS, true, true),
            (MAX_NS - 1, MAX_NS, false, false),
            (MAX_NS, MAX_NS, true, false),
            (MIN_NS, MAX_NS, true, true),
            (MIN_NS, MAX_NS, false, false),
            (MAX_NS, MIN_NS, true, false),
        ] {
            let at = CutReading {
                cut: t(cut),
                certain,
                retry_after_s: 1,
            };
            assert_eq!(
                receipt_attachable(t(floor), at),
                expect,
                "floor {floor} cut {cut} certain {certain}"
            );
        }
    }

    #[test]
    fn gc_instant_at_the_domain_end() {
        let ttl = SignedDuration::from_secs(1);
        let ttl_ns = 1_000_000_000_i128;
        // (created, floor, gc_at)
        for (created, floor, expect) in [
            (BASE, BASE + 1, Some(BASE + 1 + ttl_ns)),
            (BASE + 1, BASE, Some(BASE + 1 + ttl_ns)),
            (MAX_NS - ttl_ns, MAX_NS - ttl_ns, Some(MAX_NS)),
            (MAX_NS - ttl_ns - 1, MAX_NS - ttl_ns, Some(MAX_NS)),
            // Either sum beyond the domain: never deletable.
            (MAX_NS - ttl_ns + 1, BASE, None),
            (BASE, MAX_NS - ttl_ns + 1, None),
            (MIN_NS, MIN_NS, Some(MIN_NS + ttl_ns)),
        ] {
            assert_eq!(
                gc_at(t(created), t(floor), ttl),
                expect.map(t),
                "created {created} floor {floor}"
            );
        }
        // Due at MAX exactly when gc_at is MAX.
        let due = |created, floor, cut| {
            gc_due(t(created), t(floor), ttl, true, CutReading::certain(t(cut)))
        };
        assert!(due(MAX_NS - ttl_ns, MAX_NS - ttl_ns, MAX_NS));
        assert!(!due(MAX_NS - ttl_ns, MAX_NS - ttl_ns, MAX_NS - 1));
        assert!(!due(MAX_NS - ttl_ns, MAX_NS - ttl_ns + 1, MAX_NS));
        // Creation after the floor: creation + ttl decides, at -1 / 0 / +1.
        for (offset, expect) in [(-1, false), (0, true), (1, true)] {
            assert_eq!(
                due(BASE + 1, BASE, BASE + 1 + ttl_ns + offset),
                expect,
                "offset {offset}"
            );
        }
        // Every condition is needed: receipt, certainty, the instant.
        for (receipt, certain, cut, expect) in [
            (true, true, BASE + ttl_ns, true),
            (false, true, BASE + ttl_ns, false),
            (true, false, BASE + ttl_ns, false),
            (true, true, BASE + ttl_ns - 1, false),
            (false, false, BASE + ttl_ns, false),
            (false, true, BASE + ttl_ns - 1, false),
            (true, false, BASE + ttl_ns - 1, false),
        ] {
            let at = CutReading {
                cut: t(cut),
                certain,
                retry_after_s: 1,
            };
            assert_eq!(
                gc_due(t(BASE), t(BASE), ttl, receipt, at),
                expect,
                "receipt {receipt} certain {certain} cut {cut}"
            );
        }
    }
}
