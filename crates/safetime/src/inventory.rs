//! The inventory of every kind of deadline the control plane admits, and
//! the one check that the sealed horizon covers all of them.
//!
//! # Design
//!
//! Tollgate and Little Compute issue deadlines of many kinds on cut time.
//! Each must fit inside `cut + horizon` when it is issued, or it could
//! outlive the proof the initial quarantine runs for (the proof lasts one
//! horizon). A process that admits deadlines therefore checks, before it
//! serves, that the longest deadline of **every** kind its settings allow
//! fits the horizon of the policy in force and of the newest sealed one.
//!
//! [`DeadlineInventory`] has one field per setting that bounds a deadline,
//! so the list is exhaustive by construction: a new kind is a new field,
//! and every place that builds an inventory stops compiling until it says
//! how long that kind may last. [`DeadlineInventory::bounds`] turns the
//! fields into one [`DeadlineBound`] per kind (a TTL and the grace after it
//! summed exactly), in the order of [`DeadlineInventory::KINDS`], and
//! [`DeadlineInventory::check`] is [`HorizonPolicy::covers`] over them.
//!
//! The database refuses, independently, any authority row whose deadline
//! lies beyond `cut + horizon` (Tollgate's lease guard and Little
//! Compute's deadline triggers), so a process that skipped this check (old
//! or misconfigured) still cannot write one.
//!
//! Tollgate's own idempotency records never expire (nothing deletes them),
//! so they are not a kind here; Little Compute's operation keys (its
//! idempotency keys) are, through their declared TTL.

use jiff::SignedDuration;

use crate::horizon::{DeadlineBound, DeadlineKind, HorizonPolicy, HorizonShortfall};

/// A Tollgate lease grant: authority ends at `expiry + reclaim_grace`.
pub const LEASE_GRANT: DeadlineKind = DeadlineKind::named("tollgate.lease_grant");
/// A Little Compute Reservation (a Tollgate grant of an attempt's units):
/// its TTL and Tollgate's reclaim grace.
pub const RESERVATION: DeadlineKind = DeadlineKind::named("lc.reservation");
/// A sandbox Lease's expiry.
pub const SANDBOX_LEASE: DeadlineKind = DeadlineKind::named("lc.sandbox_lease");
/// An exec owner's heartbeat expiry.
pub const OWNER_HEARTBEAT: DeadlineKind = DeadlineKind::named("lc.owner_heartbeat");
/// A worker's claim on a work item: its TTL and the grace before another
/// worker may take it.
pub const CLAIM: DeadlineKind = DeadlineKind::named("lc.claim");
/// An approval's validity.
pub const APPROVAL: DeadlineKind = DeadlineKind::named("lc.approval");
/// A scoped token's deadline.
pub const SCOPED_TOKEN: DeadlineKind = DeadlineKind::named("lc.scoped_token");
/// The end of an admission's rate window.
pub const RATE_WINDOW: DeadlineKind = DeadlineKind::named("lc.rate_window");
/// The purge instant of deleted data: deletion plus the deletion grace.
pub const DELETION_GRACE: DeadlineKind = DeadlineKind::named("lc.deletion_grace");
/// The retention deadline of terminal records.
pub const RETENTION: DeadlineKind = DeadlineKind::named("lc.retention");
/// An operation key's GC instant: its declared TTL after the later of its
/// creation and its terminal floor.
pub const OPERATION_KEY: DeadlineKind = DeadlineKind::named("lc.operation_key");
/// An exec's timeout deadline.
pub const EXEC_TIMEOUT: DeadlineKind = DeadlineKind::named("lc.exec_timeout");
/// An exec's idle-hibernation boundary.
pub const IDLE_HIBERNATION: DeadlineKind = DeadlineKind::named("lc.idle_hibernation");

/// The longest each deadline-bearing setting lets a deadline be, measured
/// from the cut-time instant the deadline is issued at; exact to the
/// nanosecond. Where a process is configured with a value (a Lease TTL),
/// the field is that value; where a request chooses one up to a maximum
/// (a token's TTL), the field is the maximum. No field may be negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineInventory {
    /// Tollgate's grant policy `max_ttl`.
    pub grant_ttl_max: SignedDuration,
    /// Tollgate's grant policy `reclaim_grace` (also a Reservation's
    /// grace: a Reservation is a Tollgate grant).
    pub reclaim_grace: SignedDuration,
    /// The TTL a Reservation's grant asks for.
    pub reservation_ttl: SignedDuration,
    /// A sandbox Lease's TTL.
    pub sandbox_lease_ttl: SignedDuration,
    /// The longest owner heartbeat TTL.
    pub owner_heartbeat_ttl_max: SignedDuration,
    /// The longest claim TTL.
    pub claim_ttl_max: SignedDuration,
    /// The grace after a claim's expiry before another worker may take it.
    pub claim_grace: SignedDuration,
    /// The longest approval validity.
    pub approval_validity_max: SignedDuration,
    /// The longest scoped-token TTL.
    pub token_ttl_max: SignedDuration,
    /// The longest rate window.
    pub rate_window_max: SignedDuration,
    /// The deletion grace.
    pub deletion_grace: SignedDuration,
    /// The retention of terminal records.
    pub retention: SignedDuration,
    /// The longest declared operation-key TTL.
    pub operation_key_ttl_max: SignedDuration,
    /// The longest exec timeout.
    pub exec_timeout_max: SignedDuration,
    /// The longest idle TTL.
    pub idle_ttl_max: SignedDuration,
}

/// The number of deadline kinds in the inventory.
pub const KIND_COUNT: usize = 13;

impl DeadlineInventory {
    /// Every kind, in the order [`DeadlineInventory::bounds`] lists them.
    pub const KINDS: [DeadlineKind; KIND_COUNT] = [
        LEASE_GRANT,
        RESERVATION,
        SANDBOX_LEASE,
        OWNER_HEARTBEAT,
        CLAIM,
        APPROVAL,
        SCOPED_TOKEN,
        RATE_WINDOW,
        DELETION_GRACE,
        RETENTION,
        OPERATION_KEY,
        EXEC_TIMEOUT,
        IDLE_HIBERNATION,
    ];

    /// One bound per kind, in [`DeadlineInventory::KINDS`] order: a TTL
    /// and its grace are summed exactly (unbounded when the sum exceeds
    /// [`SignedDuration::MAX`]).
    ///
    /// # Panics
    /// When a field is negative (a bug in the code that built the
    /// inventory: settings are validated positive before).
    pub fn bounds(&self) -> [DeadlineBound; KIND_COUNT] {
        let zero = SignedDuration::ZERO;
        let sum = DeadlineBound::sum;
        [
            sum(LEASE_GRANT, self.grant_ttl_max, self.reclaim_grace),
            sum(RESERVATION, self.reservation_ttl, self.reclaim_grace),
            sum(SANDBOX_LEASE, self.sandbox_lease_ttl, zero),
            sum(OWNER_HEARTBEAT, self.owner_heartbeat_ttl_max, zero),
            sum(CLAIM, self.claim_ttl_max, self.claim_grace),
            sum(APPROVAL, self.approval_validity_max, zero),
            sum(SCOPED_TOKEN, self.token_ttl_max, zero),
            sum(RATE_WINDOW, self.rate_window_max, zero),
            sum(DELETION_GRACE, self.deletion_grace, zero),
            sum(RETENTION, self.retention, zero),
            sum(OPERATION_KEY, self.operation_key_ttl_max, zero),
            sum(EXEC_TIMEOUT, self.exec_timeout_max, zero),
            sum(IDLE_HIBERNATION, self.idle_ttl_max, zero),
        ]
    }

    /// Checks that `policy`'s horizon covers every kind: each bound
    /// `<= horizon`, exactly (equal fits, one nanosecond more does not).
    ///
    /// ```
    /// use jiff::SignedDuration;
    /// use safetime::inventory::{DeadlineInventory, RETENTION};
    /// use safetime::{DEFAULT_HORIZON_MS, HorizonPolicy};
    /// let policy = HorizonPolicy::verified(1, DEFAULT_HORIZON_MS,
    ///     &HorizonPolicy::digest_of(1, DEFAULT_HORIZON_MS)).unwrap();
    /// let ten_years = SignedDuration::from_hours(3_650 * 24);
    /// let minute = SignedDuration::from_secs(60);
    /// let mut inv = DeadlineInventory::uniform(minute);
    /// inv.retention = ten_years;
    /// assert_eq!(inv.check(&policy), Ok(()));
    /// inv.retention = ten_years + SignedDuration::from_nanos(1);
    /// assert_eq!(inv.check(&policy).unwrap_err().kind, RETENTION);
    /// ```
    ///
    /// # Errors
    /// [`HorizonShortfall`] naming the first kind, in
    /// [`DeadlineInventory::KINDS`] order, that does not fit.
    pub fn check(&self, policy: &HorizonPolicy) -> Result<(), HorizonShortfall> {
        policy.covers(&self.bounds())
    }

    /// Every field `d`: a starting point for tests and examples.
    pub const fn uniform(d: SignedDuration) -> DeadlineInventory {
        DeadlineInventory {
            grant_ttl_max: d,
            reclaim_grace: d,
            reservation_ttl: d,
            sandbox_lease_ttl: d,
            owner_heartbeat_ttl_max: d,
            claim_ttl_max: d,
            claim_grace: d,
            approval_validity_max: d,
            token_ttl_max: d,
            rate_window_max: d,
            deletion_grace: d,
            retention: d,
            operation_key_ttl_max: d,
            exec_timeout_max: d,
            idle_ttl_max: d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::horizon::DEFAULT_HORIZON_MS;

    const NS: SignedDuration = SignedDuration::from_nanos(1);

    fn policy(horizon_ms: i64) -> HorizonPolicy {
        HorizonPolicy::verified(4, horizon_ms, &HorizonPolicy::digest_of(4, horizon_ms)).unwrap()
    }

    /// A setter per field, with the kind whose bound it moves.
    type Setter = fn(&mut DeadlineInventory, SignedDuration);

    fn setters() -> Vec<(&'static str, DeadlineKind, Setter)> {
        vec![
            ("grant_ttl_max", LEASE_GRANT, |i, d| i.grant_ttl_max = d),
            ("reservation_ttl", RESERVATION, |i, d| i.reservation_ttl = d),
            ("sandbox_lease_ttl", SANDBOX_LEASE, |i, d| {
                i.sandbox_lease_ttl = d
            }),
            ("owner_heartbeat_ttl_max", OWNER_HEARTBEAT, |i, d| {
                i.owner_heartbeat_ttl_max = d
            }),
            ("claim_ttl_max", CLAIM, |i, d| i.claim_ttl_max = d),
            ("claim_grace", CLAIM, |i, d| i.claim_grace = d),
            ("approval_validity_max", APPROVAL, |i, d| {
                i.approval_validity_max = d
            }),
            ("token_ttl_max", SCOPED_TOKEN, |i, d| i.token_ttl_max = d),
            ("rate_window_max", RATE_WINDOW, |i, d| i.rate_window_max = d),
            ("deletion_grace", DELETION_GRACE, |i, d| {
                i.deletion_grace = d
            }),
            ("retention", RETENTION, |i, d| i.retention = d),
            ("operation_key_ttl_max", OPERATION_KEY, |i, d| {
                i.operation_key_ttl_max = d
            }),
            ("exec_timeout_max", EXEC_TIMEOUT, |i, d| {
                i.exec_timeout_max = d
            }),
            ("idle_ttl_max", IDLE_HIBERNATION, |i, d| i.idle_ttl_max = d),
        ]
    }

    /// Every setting, alone, at the horizon exactly fits and one
    /// nanosecond over is refused naming its kind and the exact values;
    /// a TTL and its grace are summed (the grace at zero here, so the
    /// TTL alone reaches the horizon).
    #[test]
    fn each_setting_fits_at_the_horizon_and_not_a_nanosecond_over() {
        let horizon = SignedDuration::from_secs(3_600);
        let p = policy(3_600_000);
        for (field, kind, set) in setters() {
            let mut inv = DeadlineInventory::uniform(SignedDuration::ZERO);
            set(&mut inv, horizon);
            assert_eq!(inv.check(&p), Ok(()), "{field} at the horizon");
            set(&mut inv, horizon + NS);
            assert_eq!(
                inv.check(&p),
                Err(HorizonShortfall {
                    kind,
                    longest: Some(horizon + NS),
                    version: 4,
                    horizon,
                }),
                "{field} one nanosecond over"
            );
        }
        // Tollgate's reclaim grace is also a Reservation's: it moves both
        // kinds, and the first listed that does not fit is named.
        let mut inv = DeadlineInventory::uniform(SignedDuration::ZERO);
        inv.reclaim_grace = horizon + NS;
        assert_eq!(inv.check(&p).unwrap_err().kind, LEASE_GRANT);
        inv.grant_ttl_max = SignedDuration::ZERO;
        inv.reclaim_grace = SignedDuration::ZERO;
        inv.reservation_ttl = horizon - NS;
        assert_eq!(inv.check(&p), Ok(()));
        inv.reclaim_grace = NS;
        assert_eq!(inv.check(&p), Ok(()));
        // The grant itself still fits (2 ns); the Reservation does not.
        inv.reclaim_grace = NS + NS;
        assert_eq!(inv.check(&p).unwrap_err().kind, RESERVATION);
    }

    /// A TTL plus its grace is summed exactly: `horizon - 1 ns + 1 ns`
    /// fits, `+ 2 ns` does not, and a sum beyond any duration is
    /// unbounded.
    #[test]
    fn ttl_and_grace_sum_exactly() {
        let horizon = SignedDuration::from_secs(10);
        let p = policy(10_000);
        let mut inv = DeadlineInventory::uniform(SignedDuration::ZERO);
        inv.claim_ttl_max = horizon - NS;
        inv.claim_grace = NS;
        assert_eq!(inv.check(&p), Ok(()));
        inv.claim_grace = NS + NS;
        assert_eq!(
            inv.check(&p).unwrap_err().longest,
            Some(horizon + NS),
            "claim ttl + grace"
        );
        inv.claim_ttl_max = SignedDuration::MAX;
        let short = inv.check(&p).unwrap_err();
        assert_eq!((short.kind, short.longest), (CLAIM, None));
    }

    /// The default horizon (3,650 days = 315,360,000,000 ms) keeps the
    /// public ten-year retention and idempotency maximum: ten years of
    /// retention or operation-key TTL fit, one nanosecond more does not.
    #[test]
    fn the_default_horizon_covers_ten_years_exactly() {
        let p = policy(DEFAULT_HORIZON_MS);
        let ten_years = SignedDuration::from_hours(3_650 * 24);
        assert_eq!(ten_years.as_millis(), 315_360_000_000);
        let base = DeadlineInventory::uniform(SignedDuration::from_secs(60));
        for (kind, set) in [
            (RETENTION, (|i, d| i.retention = d) as Setter),
            (OPERATION_KEY, |i, d| i.operation_key_ttl_max = d),
        ] {
            let mut inv = base;
            set(&mut inv, ten_years);
            assert_eq!(inv.check(&p), Ok(()));
            set(&mut inv, ten_years + NS);
            assert_eq!(
                inv.check(&p),
                Err(HorizonShortfall {
                    kind,
                    longest: Some(ten_years + NS),
                    version: 4,
                    horizon: ten_years,
                })
            );
        }
    }

    /// `bounds` lists every kind once, in `KINDS` order, and every field
    /// reaches one of them.
    #[test]
    fn bounds_list_every_kind_once_in_order() {
        let kinds: Vec<DeadlineKind> = DeadlineInventory::uniform(NS)
            .bounds()
            .iter()
            .map(|b| b.kind())
            .collect();
        assert_eq!(kinds, DeadlineInventory::KINDS.to_vec());
        let mut names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KIND_COUNT);
        // 15 fields, each moving the bound of exactly one kind
        // (reclaim_grace moves two and is checked above).
        let s = setters();
        assert_eq!(s.len(), 14);
        for (field, kind, set) in s {
            let mut inv = DeadlineInventory::uniform(NS);
            set(&mut inv, SignedDuration::from_secs(7));
            let moved: Vec<DeadlineKind> = inv
                .bounds()
                .iter()
                .filter(|b| b.longest() != Some(NS + NS) && b.longest() != Some(NS))
                .map(|b| b.kind())
                .collect();
            assert_eq!(moved, vec![kind], "{field}");
        }
    }
}
