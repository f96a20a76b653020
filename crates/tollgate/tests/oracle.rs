//! Oracle property tests: the exact lease timing and the accounting rules
//! against an independent model.
//!
//! The production timing arithmetic ([`GrantPolicy`], [`InstantPair`]) and
//! the accounting rules ([`tollgate::rules`]) are compared with an
//! independent model written here from the rules' text, not from the code:
//! instants and durations are plain `i128` nanoseconds, the domain bounds are
//! literal numbers (checked once against the crate and jiff), and nothing in
//! the `oracle` module calls a production helper. Production values are
//! converted to nanoseconds only at the comparison.
//!
//! Every strategy is edge-biased (`prop_oneof!` over the exact domain ends,
//! their neighbours, zero and its neighbours, small values, values near both
//! ends, and a uniform draw), and the boundary-sensitive properties also draw
//! inputs *relative to* the boundary under test (for example
//! `now = MAX - ttl + d` with `d` in `-3..=3`), so each run crosses every
//! boundary many times. Shrinking is on (proptest's default).
//!
//! Run: `cargo test -p tollgate --test oracle`. `PROPTEST_CASES=100000`
//! overrides the per-test case counts below for a long soak.

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use tollgate::instant_pair::LegacyBound;
use tollgate::rules;
use tollgate::{
    AccountId, Balances, GrantPolicy, InstantPair, PairError, PolicyError, RuleError, TimingError,
};

/// Cases for the cheap arithmetic properties: each is a handful of integer
/// operations, so 2,048 cases run in well under a second and still hit each
/// explicit edge of a strategy roughly a hundred times.
const CASES_CHEAP: u32 = 2_048;

/// Cases for the accounting sequences: each case runs up to
/// `OPS_PER_SEQUENCE_MAX` operations.
const CASES_SEQUENCES: u32 = 512;

/// The longest operation sequence of one accounting case; long enough to
/// fill, drain and overflow an account several times.
const OPS_PER_SEQUENCE_MAX: usize = 64;

/// `cases` unless `PROPTEST_CASES` is set, which then wins (proptest's own
/// default would ignore it once `cases` is set explicitly). The mutation
/// gate lowers it; a soak raises it.
fn config(cases: u32) -> ProptestConfig {
    let from_env = std::env::var("PROPTEST_CASES")
        .ok()
        .map(|v| v.parse::<u32>().expect("PROPTEST_CASES is a case count"));
    ProptestConfig {
        cases: from_env.unwrap_or(cases),
        ..ProptestConfig::default()
    }
}

/// The independent model. Nothing here calls `tollgate`.
mod oracle {
    /// `Timestamp::MIN`, -009999-01-02T01:59:59Z, in ns since the epoch.
    pub const MIN_NS: i128 = -377_705_023_201_000_000_000;
    /// `Timestamp::MAX`, 9999-12-30T22:00:00.999999999Z, in ns since the epoch.
    pub const MAX_NS: i128 = 253_402_207_200_999_999_999;
    /// `SignedDuration::MAX`: i64::MAX seconds and 999,999,999 ns.
    pub const DUR_MAX_NS: i128 = 9_223_372_036_854_775_807_999_999_999;
    /// `SignedDuration::MIN`: i64::MIN seconds and -999,999,999 ns.
    pub const DUR_MIN_NS: i128 = -9_223_372_036_854_775_808_999_999_999;

    pub fn in_domain(ns: i128) -> bool {
        (MIN_NS..=MAX_NS).contains(&ns)
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Expiry {
        InvalidTtl,
        Unrepresentable { ttl_ns: i128 },
        Ok { expiry_ns: i128, ttl_ns: i128 },
    }

    /// The requested TTL clamped to `max_ttl`; `None` for `requested <= 0`.
    pub fn clamp(requested_ns: i128, max_ttl_ns: i128) -> Option<i128> {
        if requested_ns <= 0 {
            None
        } else if requested_ns < max_ttl_ns {
            Some(requested_ns)
        } else {
            Some(max_ttl_ns)
        }
    }

    pub fn expiry(now_ns: i128, requested_ns: i128, max_ttl_ns: i128) -> Expiry {
        match clamp(requested_ns, max_ttl_ns) {
            None => Expiry::InvalidTtl,
            Some(ttl_ns) => {
                let expiry_ns = now_ns + ttl_ns;
                if in_domain(expiry_ns) {
                    Expiry::Ok { expiry_ns, ttl_ns }
                } else {
                    Expiry::Unrepresentable { ttl_ns }
                }
            }
        }
    }

    /// `n - grace`, `None` when it falls below the domain.
    pub fn cutoff(n_ns: i128, grace_ns: i128) -> Option<i128> {
        let c = n_ns - grace_ns;
        if c < MIN_NS { None } else { Some(c) }
    }

    pub fn reclaimable(expiry_ns: i128, grace_ns: i128, n_ns: i128) -> bool {
        expiry_ns + grace_ns <= n_ns
    }

    /// `(floor(ns / 1000), ns - 1000 * floor(ns / 1000))`, with floor written
    /// out from truncating division.
    pub fn encode(ns: i128) -> (i128, i128) {
        let mut q = ns / 1000;
        let mut r = ns % 1000;
        if r < 0 {
            q -= 1;
            r += 1000;
        }
        (q, r)
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Decode {
        SubmicroOutOfRange,
        OutOfDomain,
        Ok(i128),
    }

    pub fn decode(floor_us: i128, submicro_ns: i128) -> Decode {
        if !(0..=999).contains(&submicro_ns) {
            return Decode::SubmicroOutOfRange;
        }
        let ns = floor_us * 1000 + submicro_ns;
        if in_domain(ns) {
            Decode::Ok(ns)
        } else {
            Decode::OutOfDomain
        }
    }

    /// Migration 0017's bound for a legacy value of `u` microseconds
    /// truncated toward zero: `1000u + 999` for `u >= 0`, `1000u` for `u < 0`.
    pub fn legacy_bound(u: i128) -> i128 {
        if u >= 0 { 1000 * u + 999 } else { 1000 * u }
    }

    /// The instants whose truncation toward zero to microseconds is `u`:
    /// `[1000u, 1000u + 999]` above zero, `[1000u - 999, 1000u]` below it,
    /// `[-999, 999]` for `u = 0`.
    pub fn bucket(u: i128) -> (i128, i128) {
        if u > 0 {
            (1000 * u, 1000 * u + 999)
        } else if u < 0 {
            (1000 * u - 999, 1000 * u)
        } else {
            (-999, 999)
        }
    }

    /// Balances in i128, so the model itself never overflows.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Account {
        pub deposited: i128,
        pub available: i128,
        pub held: i128,
        pub consumed: i128,
    }

    pub const UNITS_MAX: i128 = i64::MAX as i128;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum AccountError {
        InvalidUnits { units: i128 },
        UnitsOverflow,
        InsufficientBalance { requested: i128, available: i128 },
        InvalidConsumed { consumed: i128, units: i128 },
        HeldBelowUnits { held: i128, units: i128 },
    }

    pub fn deposit(a: Account, units: i128) -> Result<Account, AccountError> {
        if units <= 0 {
            return Err(AccountError::InvalidUnits { units });
        }
        if a.deposited + units > UNITS_MAX || a.available + units > UNITS_MAX {
            return Err(AccountError::UnitsOverflow);
        }
        Ok(Account {
            deposited: a.deposited + units,
            available: a.available + units,
            ..a
        })
    }

    pub fn hold(a: Account, units: i128) -> Result<Account, AccountError> {
        if units <= 0 {
            return Err(AccountError::InvalidUnits { units });
        }
        if a.available < units {
            return Err(AccountError::InsufficientBalance {
                requested: units,
                available: a.available,
            });
        }
        Ok(Account {
            available: a.available - units,
            held: a.held + units,
            ..a
        })
    }

    pub fn settle(a: Account, units: i128, consumed: i128) -> Result<Account, AccountError> {
        if consumed < 0 || consumed > units {
            return Err(AccountError::InvalidConsumed { consumed, units });
        }
        if a.held < units {
            return Err(AccountError::HeldBelowUnits {
                held: a.held,
                units,
            });
        }
        Ok(Account {
            held: a.held - units,
            consumed: a.consumed + consumed,
            available: a.available + units - consumed,
            ..a
        })
    }
}

// ---------------------------------------------------------------------------
// Conversions between the model and jiff (test plumbing, not under test).

/// Splits ns into jiff's `(secs, nanos)` with truncation toward zero, both
/// parts carrying the sign.
fn dur(ns: i128) -> SignedDuration {
    let secs = i64::try_from(ns / 1_000_000_000).expect("duration seconds fit i64");
    let nanos = i32::try_from(ns % 1_000_000_000).expect("subsecond nanos fit i32");
    let d = SignedDuration::new(secs, nanos);
    assert_eq!(d.as_nanos(), ns, "test plumbing: duration round trip");
    d
}

fn ts(ns: i128) -> Timestamp {
    let t = Timestamp::from_nanosecond(ns).expect("strategy yields in-domain instants");
    assert_eq!(t.as_nanosecond(), ns, "test plumbing: timestamp round trip");
    t
}

fn policy(max_ttl_ns: i128, grace_ns: i128) -> GrantPolicy {
    GrantPolicy::new(dur(max_ttl_ns), dur(grace_ns)).expect("strategy yields a valid policy")
}

// ---------------------------------------------------------------------------
// Edge-biased strategies.

/// An instant in the domain, in ns.
fn instant_ns() -> impl Strategy<Value = i128> {
    use oracle::{MAX_NS, MIN_NS};
    prop_oneof![
        1 => Just(MIN_NS),
        1 => Just(MIN_NS + 1),
        1 => Just(-1i128),
        1 => Just(0i128),
        1 => Just(1i128),
        1 => Just(MAX_NS - 1),
        1 => Just(MAX_NS),
        3 => -3_000i128..=3_000,
        2 => MIN_NS..=MIN_NS + 3_000_000,
        2 => MAX_NS - 3_000_000..=MAX_NS,
        4 => MIN_NS..=MAX_NS,
    ]
}

/// A duration over the whole `SignedDuration` range, in ns.
fn any_duration_ns() -> impl Strategy<Value = i128> {
    use oracle::{DUR_MAX_NS, DUR_MIN_NS, MAX_NS, MIN_NS};
    let span = MAX_NS - MIN_NS;
    prop_oneof![
        1 => Just(DUR_MIN_NS),
        1 => Just(DUR_MIN_NS + 1),
        1 => Just(-1i128),
        1 => Just(0i128),
        1 => Just(1i128),
        1 => Just(DUR_MAX_NS - 1),
        1 => Just(DUR_MAX_NS),
        3 => -3_000i128..=3_000,
        2 => span - 3_000..=span + 3_000,
        2 => -span - 3_000..=-span + 3_000,
        2 => DUR_MAX_NS - 3_000_000..=DUR_MAX_NS,
        4 => -2 * span..=2 * span,
        4 => DUR_MIN_NS..=DUR_MAX_NS,
    ]
}

/// A nonnegative duration (a valid grace), in ns.
fn grace_ns() -> impl Strategy<Value = i128> {
    use oracle::{DUR_MAX_NS, MAX_NS, MIN_NS};
    let span = MAX_NS - MIN_NS;
    prop_oneof![
        2 => Just(0i128),
        1 => Just(1i128),
        1 => Just(DUR_MAX_NS - 1),
        2 => Just(DUR_MAX_NS),
        1 => Just(span),
        3 => 0i128..=3_000,
        2 => span - 3_000..=span + 3_000,
        2 => DUR_MAX_NS - 3_000_000..=DUR_MAX_NS,
        3 => 0..=2 * span,
        3 => 0..=DUR_MAX_NS,
    ]
}

/// A positive duration (a valid `max_ttl`), in ns.
fn max_ttl_ns() -> impl Strategy<Value = i128> {
    (grace_ns(), any::<bool>()).prop_map(|(g, bump)| if g == 0 || bump { g.max(1) } else { g })
}

/// `(now, requested)`: independent draws, or a request that lands `now + req`
/// within 3 ns of either domain end.
fn now_and_request_ns() -> impl Strategy<Value = (i128, i128)> {
    use oracle::{MAX_NS, MIN_NS};
    prop_oneof![
        2 => (instant_ns(), any_duration_ns()),
        1 => (instant_ns(), -3i128..=3).prop_map(|(now, d)| (now, MAX_NS - now + d)),
        1 => (instant_ns(), -3i128..=3).prop_map(|(now, d)| (now, MIN_NS - now + d)),
    ]
}

/// `(expiry, grace, n)`: independent draws, or `n` within 3 ns of
/// `expiry + grace` (clamped into the domain).
fn reclaim_case_ns() -> impl Strategy<Value = (i128, i128, i128)> {
    use oracle::{MAX_NS, MIN_NS};
    prop_oneof![
        2 => (instant_ns(), grace_ns(), instant_ns()),
        2 => (instant_ns(), grace_ns(), -3i128..=3)
            .prop_map(|(e, g, d)| (e, g, (e + g + d).clamp(MIN_NS, MAX_NS))),
        1 => (instant_ns(), -3i128..=3, -3i128..=3)
            .prop_map(|(e, g, d)| (e, g.abs(), (e + g.abs() + d).clamp(MIN_NS, MAX_NS))),
    ]
}

/// `(n, grace)`: independent draws, or a grace that puts `n - grace` within
/// 3 ns of the domain's lower end.
fn cutoff_case_ns() -> impl Strategy<Value = (i128, i128)> {
    use oracle::MIN_NS;
    prop_oneof![
        2 => (instant_ns(), grace_ns()),
        1 => (instant_ns(), -3i128..=3).prop_map(|(n, d)| (n, (n - MIN_NS + d).max(0))),
    ]
}

/// Two instants: independent, or within 2,000 ns of each other (same and
/// adjacent microseconds).
fn instant_pair_ns() -> impl Strategy<Value = (i128, i128)> {
    use oracle::{MAX_NS, MIN_NS};
    prop_oneof![
        1 => (instant_ns(), instant_ns()),
        1 => (instant_ns(), -2_000i128..=2_000)
            .prop_map(|(a, d)| (a, (a + d).clamp(MIN_NS, MAX_NS))),
    ]
}

/// A raw `floor_us` for decoding: around zero, around both domain ends in
/// microseconds, and the ends of i64.
fn floor_us_raw() -> impl Strategy<Value = i64> {
    // Domain ends in microseconds: MIN_NS / 1000 and floor(MAX_NS / 1000).
    const MIN_US: i64 = -377_705_023_201_000_000;
    const MAX_US: i64 = 253_402_207_200_999_999;
    prop_oneof![
        1 => Just(i64::MIN),
        1 => Just(i64::MIN + 1),
        1 => Just(i64::MAX - 1),
        1 => Just(i64::MAX),
        1 => Just(-1i64),
        1 => Just(0i64),
        1 => Just(1i64),
        3 => -3_000i64..=3_000,
        3 => MIN_US - 3..=MIN_US + 3,
        3 => MAX_US - 3..=MAX_US + 3,
        3 => MIN_US..=MAX_US,
        2 => any::<i64>(),
    ]
}

fn submicro_raw() -> impl Strategy<Value = i16> {
    prop_oneof![
        1 => Just(i16::MIN),
        1 => Just(-1i16),
        2 => Just(0i16),
        1 => Just(1i16),
        1 => Just(998i16),
        2 => Just(999i16),
        1 => Just(1_000i16),
        1 => Just(i16::MAX),
        6 => 0i16..=999,
        2 => any::<i16>(),
    ]
}

/// A legacy microsecond value: around zero, around the domain ends in
/// microseconds, and the whole i64 range (the bound is pure arithmetic and
/// must not overflow anywhere).
fn legacy_us() -> impl Strategy<Value = i64> {
    floor_us_raw()
}

// ---------------------------------------------------------------------------
// Timing properties.

#[test]
fn literal_domain_bounds_equal_the_crates_and_jiffs() {
    assert_eq!(oracle::MIN_NS, tollgate::TIMESTAMP_MIN_NS);
    assert_eq!(oracle::MAX_NS, tollgate::TIMESTAMP_MAX_NS);
    assert_eq!(oracle::MIN_NS, Timestamp::MIN.as_nanosecond());
    assert_eq!(oracle::MAX_NS, Timestamp::MAX.as_nanosecond());
    assert_eq!(oracle::DUR_MAX_NS, SignedDuration::MAX.as_nanos());
    assert_eq!(oracle::DUR_MIN_NS, SignedDuration::MIN.as_nanos());
    // One past each end is outside jiff's domain.
    assert!(Timestamp::from_nanosecond(oracle::MIN_NS - 1).is_err());
    assert!(Timestamp::from_nanosecond(oracle::MAX_NS + 1).is_err());
}

proptest! {
    #![proptest_config(config(CASES_CHEAP))]

    /// `GrantPolicy::new` accepts exactly `max_ttl > 0` and `grace >= 0`,
    /// reporting `max_ttl` first.
    #[test]
    fn policy_new_validates(max in any_duration_ns(), grace in any_duration_ns()) {
        let got = GrantPolicy::new(dur(max), dur(grace));
        if max <= 0 {
            prop_assert_eq!(got, Err(PolicyError::NonPositiveMaxTtl { max_ttl: dur(max) }));
        } else if grace < 0 {
            prop_assert_eq!(
                got,
                Err(PolicyError::NegativeReclaimGrace { reclaim_grace: dur(grace) })
            );
        } else {
            let p = got.expect("valid policy");
            prop_assert_eq!(p.max_ttl().as_nanos(), max);
            prop_assert_eq!(p.reclaim_grace().as_nanos(), grace);
        }
    }

    /// Clamping: `InvalidTtl` exactly for `req <= 0`, else `min(req, max_ttl)`.
    #[test]
    fn clamp_matches_oracle(
        req in any_duration_ns(),
        max in max_ttl_ns(),
        grace in grace_ns(),
    ) {
        let got = policy(max, grace).clamp_ttl(dur(req));
        match oracle::clamp(req, max) {
            None => prop_assert_eq!(got, Err(TimingError::InvalidTtl { ttl: dur(req) })),
            Some(ttl) => prop_assert_eq!(got.map(|d| d.as_nanos()), Ok(ttl)),
        }
    }

    /// Clamping right at `max_ttl`: `req` within 2 ns of it.
    #[test]
    fn clamp_at_max_ttl(max in max_ttl_ns(), d in -2i128..=2) {
        let req = max + d;
        prop_assume!(req <= oracle::DUR_MAX_NS);
        let got = policy(max, 0).clamp_ttl(dur(req)).map(|t| t.as_nanos());
        let want = if req <= 0 {
            Err(TimingError::InvalidTtl { ttl: dur(req) })
        } else {
            Ok(if d < 0 { req } else { max })
        };
        prop_assert_eq!(got, want);
    }

    /// Expiry: `UnrepresentableExpiry` exactly when
    /// `now + min(req, max_ttl)` leaves `[MIN_NS, MAX_NS]`; otherwise the
    /// exact sum and the clamped TTL.
    #[test]
    fn expiry_matches_oracle(
        (now, req) in now_and_request_ns(),
        max in max_ttl_ns(),
        grace in grace_ns(),
    ) {
        let got = policy(max, grace).expiry(ts(now), dur(req));
        match oracle::expiry(now, req, max) {
            oracle::Expiry::InvalidTtl => {
                prop_assert_eq!(got, Err(TimingError::InvalidTtl { ttl: dur(req) }));
            }
            oracle::Expiry::Unrepresentable { ttl_ns } => prop_assert_eq!(
                got,
                Err(TimingError::UnrepresentableExpiry { now: ts(now), ttl: dur(ttl_ns) })
            ),
            oracle::Expiry::Ok { expiry_ns, ttl_ns } => {
                let (e, t) = got.expect("representable expiry");
                prop_assert_eq!((e.as_nanosecond(), t.as_nanos()), (expiry_ns, ttl_ns));
            }
        }
    }

    /// Expiry with an unclamped request landing within 3 ns of `MAX`.
    #[test]
    fn expiry_at_domain_max(now in instant_ns(), d in -3i128..=3) {
        let req = oracle::MAX_NS - now + d;
        let got = policy(oracle::DUR_MAX_NS, 0).expiry(ts(now), dur(req));
        if req <= 0 {
            prop_assert_eq!(got, Err(TimingError::InvalidTtl { ttl: dur(req) }));
        } else if d > 0 {
            prop_assert_eq!(
                got,
                Err(TimingError::UnrepresentableExpiry { now: ts(now), ttl: dur(req) })
            );
        } else {
            let (e, t) = got.expect("representable expiry");
            prop_assert_eq!((e.as_nanosecond(), t.as_nanos()), (oracle::MAX_NS + d, req));
        }
    }

    /// Cutoff: `None` exactly when `n - grace < MIN`, else the exact
    /// difference.
    #[test]
    fn cutoff_matches_oracle((n, grace) in cutoff_case_ns(), max in max_ttl_ns()) {
        let got = policy(max, grace).reclaim_cutoff(ts(n)).map(|c| c.as_nanosecond());
        prop_assert_eq!(got, oracle::cutoff(n, grace));
    }

    /// Reclaimability both ways: `e + g <= n`, and `e <= cutoff(n)` (false
    /// when the cutoff underflows).
    #[test]
    fn reclaimable_matches_oracle_and_cutoff(
        (e, grace, n) in reclaim_case_ns(),
        max in max_ttl_ns(),
    ) {
        let p = policy(max, grace);
        let want = oracle::reclaimable(e, grace, n);
        prop_assert_eq!(p.is_reclaimable(ts(e), ts(n)), want);
        let via_cutoff = p.reclaim_cutoff(ts(n)).is_some_and(|c| ts(e) <= c);
        prop_assert_eq!(via_cutoff, want);
        // The oracle's own cutoff agrees with its predicate (the theorem the
        // Coq model proves, restated on these inputs).
        prop_assert_eq!(oracle::cutoff(n, grace).is_some_and(|c| e <= c), want);
        // Lateness: exactly `n - e - g` when reclaimable, never negative.
        let late = p.reclaim_late_by(ts(e), ts(n)).map(|d| d.as_nanos());
        prop_assert_eq!(late, want.then(|| n - e - grace));
    }

    /// A deadline beyond `MAX` has not elapsed even at `MAX`.
    #[test]
    fn deadline_beyond_max_never_elapses(e in instant_ns(), extra in 1i128..=3_000) {
        let grace = oracle::MAX_NS - e + extra;
        let p = policy(1, grace);
        prop_assert!(!p.is_reclaimable(ts(e), Timestamp::MAX));
        prop_assert!(!p.is_reclaimable(ts(e), ts(oracle::MAX_NS - 1)));
    }

    // -----------------------------------------------------------------------
    // Instant-pair properties.

    /// Encoding equals the model's floor division, decodes back exactly, and
    /// `as_nanos` is the instant.
    #[test]
    fn pair_round_trip(ns in instant_ns()) {
        let pair = InstantPair::encode(ts(ns));
        let (q, r) = oracle::encode(ns);
        prop_assert_eq!((i128::from(pair.floor_us), i128::from(pair.submicro_ns)), (q, r));
        prop_assert!((0..=999).contains(&pair.submicro_ns));
        prop_assert_eq!(pair.as_nanos(), ns);
        prop_assert_eq!(pair.decode().map(|t| t.as_nanosecond()), Ok(ns));
    }

    /// Lexicographic pair order equals instant order.
    #[test]
    fn pair_order_equals_instant_order((a, b) in instant_pair_ns()) {
        let (pa, pb) = (InstantPair::encode(ts(a)), InstantPair::encode(ts(b)));
        prop_assert_eq!(pa.cmp(&pb), a.cmp(&b));
        prop_assert_eq!(
            (pa.floor_us, pa.submicro_ns).cmp(&(pb.floor_us, pb.submicro_ns)),
            a.cmp(&b)
        );
        prop_assert_eq!(oracle::encode(a).cmp(&oracle::encode(b)), a.cmp(&b));
    }

    /// Decoding any raw pair: submicro outside `0..=999` first, then the
    /// domain, else the exact instant.
    #[test]
    fn pair_decode_matches_oracle(floor_us in floor_us_raw(), submicro_ns in submicro_raw()) {
        let pair = InstantPair { floor_us, submicro_ns };
        let got = pair.decode();
        match oracle::decode(i128::from(floor_us), i128::from(submicro_ns)) {
            oracle::Decode::SubmicroOutOfRange => {
                prop_assert_eq!(got, Err(PairError::SubmicroOutOfRange { submicro_ns }));
            }
            oracle::Decode::OutOfDomain => {
                prop_assert_eq!(got, Err(PairError::OutOfDomain { floor_us, submicro_ns }));
            }
            oracle::Decode::Ok(ns) => {
                prop_assert_eq!(got.map(|t| t.as_nanosecond()), Ok(ns));
            }
        }
    }

    /// The legacy bound equals `1000u + 999` (u >= 0) or `1000u` (u < 0),
    /// and decodes exactly when it lies in the domain.
    #[test]
    fn legacy_bound_matches_oracle(u in legacy_us()) {
        let b = InstantPair::legacy_bound(u);
        let want = oracle::legacy_bound(i128::from(u));
        prop_assert_eq!(b.as_nanos(), want);
        prop_assert_eq!(b.floor_us, u);
        prop_assert_eq!(b.submicro_ns, if u >= 0 { 999 } else { 0 });
        let decoded = b.decode().map(|t| t.as_nanosecond());
        if oracle::in_domain(want) {
            prop_assert_eq!(decoded, Ok(want));
        } else {
            prop_assert_eq!(
                decoded,
                Err(PairError::OutOfDomain { floor_us: u, submicro_ns: b.submicro_ns })
            );
        }
        // Never earlier than the stored instant (u microseconds).
        prop_assert!(want >= 1000 * i128::from(u));
    }

    /// For every true expiry `t` that truncates toward zero to `u`: `t <=
    /// bound(u)`, `bound(u) - t <= 999` (1,998 in the zero bucket), and the
    /// bound is the latest such instant.
    #[test]
    fn legacy_bound_is_conservative_and_tight(u in legacy_us(), k in 0i128..=1_998) {
        let u128 = i128::from(u);
        let (lo, hi) = oracle::bucket(u128);
        let t = (lo + k).min(hi);
        // Generator check: t really truncates (Rust's `/` rounds toward zero)
        // to u.
        prop_assert_eq!(t / 1000, u128);
        let b = InstantPair::legacy_bound(u).as_nanos();
        prop_assert!(t <= b);
        let slack = if u == 0 { 1_998 } else { 999 };
        prop_assert!(b - t <= slack);
        prop_assert_eq!(b, hi);
        prop_assert_ne!((b + 1) / 1000, u128);
    }
}

// ---------------------------------------------------------------------------
// Accounting properties: deposit, hold and settle against the i128 model.

const ACCOUNT: AccountId = AccountId(7);

/// A unit amount: the ends of i64, zero and its neighbours, small values.
fn units_raw() -> impl Strategy<Value = i64> {
    prop_oneof![
        1 => Just(i64::MIN),
        1 => Just(-1i64),
        1 => Just(0i64),
        2 => Just(1i64),
        1 => Just(i64::MAX - 1),
        2 => Just(i64::MAX),
        6 => 1i64..=100,
        2 => -100i64..=100,
        2 => i64::MAX - 100..=i64::MAX,
        2 => any::<i64>(),
    ]
}

#[derive(Debug, Clone)]
enum ConsumedPick {
    Zero,
    All,
    OneMore,
    MinusOne,
    /// `units * n / 8`: some part of the lease.
    Part(u8),
    Raw(i64),
}

#[derive(Debug, Clone)]
enum Op {
    Deposit(i64),
    Hold(i64),
    /// Settle one of the model's active leases.
    Settle(prop::sample::Index, ConsumedPick),
    /// Settle more units than the account holds (`held + excess`).
    SettleUnheld {
        excess: i64,
        consumed: i64,
    },
}

fn consumed_pick() -> impl Strategy<Value = ConsumedPick> {
    prop_oneof![
        2 => Just(ConsumedPick::Zero),
        2 => Just(ConsumedPick::All),
        1 => Just(ConsumedPick::OneMore),
        1 => Just(ConsumedPick::MinusOne),
        3 => (0u8..=8).prop_map(ConsumedPick::Part),
        1 => any::<i64>().prop_map(ConsumedPick::Raw),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => units_raw().prop_map(Op::Deposit),
        3 => units_raw().prop_map(Op::Hold),
        4 => (any::<prop::sample::Index>(), consumed_pick())
            .prop_map(|(i, c)| Op::Settle(i, c)),
        1 => (prop_oneof![Just(1i64), 1i64..=100, Just(i64::MAX)], units_raw())
            .prop_map(|(excess, consumed)| Op::SettleUnheld { excess, consumed }),
    ]
}

fn to_model(b: Balances) -> oracle::Account {
    oracle::Account {
        deposited: i128::from(b.deposited),
        available: i128::from(b.available),
        held: i128::from(b.held),
        consumed: i128::from(b.consumed),
    }
}

fn narrow(v: i128) -> i64 {
    i64::try_from(v).expect("model error values come from i64 inputs")
}

/// The production error the model's error stands for, field by field.
fn expected_error(e: oracle::AccountError) -> RuleError {
    match e {
        oracle::AccountError::InvalidUnits { units } => RuleError::InvalidUnits {
            units: narrow(units),
            max: i64::MAX,
        },
        oracle::AccountError::UnitsOverflow => RuleError::UnitsOverflow {
            account_id: ACCOUNT,
        },
        oracle::AccountError::InsufficientBalance {
            requested,
            available,
        } => RuleError::InsufficientBalance {
            account_id: ACCOUNT,
            requested: narrow(requested),
            available: narrow(available),
        },
        oracle::AccountError::InvalidConsumed { consumed, units } => RuleError::InvalidConsumed {
            consumed: narrow(consumed),
            units: narrow(units),
        },
        oracle::AccountError::HeldBelowUnits { held, units } => RuleError::CorruptHolding {
            held: narrow(held),
            units: narrow(units),
        },
    }
}

fn pick_consumed(units: i64, pick: &ConsumedPick) -> i64 {
    match pick {
        ConsumedPick::Zero => 0,
        ConsumedPick::All => units,
        ConsumedPick::OneMore => units.saturating_add(1),
        ConsumedPick::MinusOne => -1,
        ConsumedPick::Part(n) => {
            i64::try_from(i128::from(units) * i128::from(*n) / 8).expect("part of units fits")
        }
        ConsumedPick::Raw(c) => *c,
    }
}

proptest! {
    #![proptest_config(config(CASES_SEQUENCES))]

    /// Any sequence of deposit, hold and settle agrees with the model after
    /// every step (same balances, same error with the same fields), keeps
    /// conservation and every field nonnegative, keeps `held` equal to the
    /// sum of active leases, and an error leaves the balances as they were.
    #[test]
    fn accounting_sequences_match_oracle(
        ops in prop::collection::vec(op(), 1..=OPS_PER_SEQUENCE_MAX),
    ) {
        let mut balances = Balances::default();
        let mut model = oracle::Account::default();
        let mut active: Vec<i64> = Vec::new();
        for op in &ops {
            let before = balances;
            let (got, want, settled) = match op {
                Op::Deposit(units) => (
                    rules::deposit(ACCOUNT, balances, *units),
                    oracle::deposit(model, i128::from(*units)),
                    None,
                ),
                Op::Hold(units) => (
                    rules::hold(ACCOUNT, balances, *units),
                    oracle::hold(model, i128::from(*units)),
                    None,
                ),
                Op::Settle(index, pick) => {
                    let (slot, units) = if active.is_empty() {
                        (None, 1)
                    } else {
                        let i = index.index(active.len());
                        (Some(i), active[i])
                    };
                    let consumed = pick_consumed(units, pick);
                    (
                        rules::settle(balances, units, consumed),
                        oracle::settle(model, i128::from(units), i128::from(consumed)),
                        slot,
                    )
                }
                Op::SettleUnheld { excess, consumed } => {
                    // Past i64::MAX there is no amount the account does not
                    // hold; nothing to try.
                    let Some(units) = balances.held.checked_add(*excess) else {
                        continue;
                    };
                    (
                        rules::settle(balances, units, *consumed),
                        oracle::settle(model, i128::from(units), i128::from(*consumed)),
                        None,
                    )
                }
            };
            match (got, want) {
                (Ok(after), Ok(model_after)) => {
                    prop_assert_eq!(to_model(after), model_after);
                    balances = after;
                    model = model_after;
                    match op {
                        Op::Hold(units) => active.push(*units),
                        Op::Settle(..) => {
                            if let Some(i) = settled {
                                active.swap_remove(i);
                            }
                        }
                        _ => {}
                    }
                }
                (Err(e), Err(model_e)) => {
                    prop_assert_eq!(e, expected_error(model_e));
                    prop_assert_eq!(balances, before);
                }
                (got, want) => prop_assert!(false, "{:?}: got {:?}, model {:?}", op, got, want),
            }
            prop_assert!(balances.is_conserved(), "{:?}", balances);
            prop_assert!(balances.deposited >= 0 && balances.available >= 0);
            prop_assert!(balances.held >= 0 && balances.consumed >= 0);
            prop_assert_eq!(
                i128::from(balances.held),
                active.iter().map(|u| i128::from(*u)).sum::<i128>()
            );
        }
    }
}
