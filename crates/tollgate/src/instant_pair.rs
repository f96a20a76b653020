//! The instant pair: the exact PostgreSQL encoding of a [`jiff::Timestamp`]
//! ([`InstantPair`], [`PairError`]; defined in `safetime`, re-exported here
//! so `tollgate::instant_pair::InstantPair` stays the path), and Tollgate's
//! legacy bound of migration 0017 ([`LegacyBound`]).
//!
//! Writers before migration 0017 stored lease instants as microseconds
//! truncated toward zero; the migration records the latest instant
//! consistent with such a value. That history is Tollgate's alone, so the
//! bound lives here, as an extension of the shared encoding, and not in
//! `safetime`.

pub use safetime::instant_pair::{InstantPair, PairError};

/// Migration 0017's conservative bound for a legacy instant, as an
/// associated function of [`InstantPair`]: `InstantPair::legacy_bound(u)`
/// with this trait in scope.
pub trait LegacyBound {
    /// The conservative bound migration 0017 records for a legacy expiry of
    /// `legacy_us` microseconds truncated toward zero: `(u, 999)` for
    /// `u >= 0`, `(u, 0)` for `u < 0`. It is the latest instant whose
    /// truncation is `u`, so it never makes an advertised expiry earlier and
    /// delays settlement by at most 999 ns (1,998 ns in the zero bucket).
    /// Proved as `legacy_bound_*` in the Coq model.
    ///
    /// The result may lie outside the timestamp domain; [`InstantPair::decode`]
    /// rejects such a bound (the migration refuses such rows).
    ///
    /// ```
    /// use tollgate::instant_pair::{InstantPair, LegacyBound};
    /// assert_eq!(InstantPair::legacy_bound(-1), InstantPair { floor_us: -1, submicro_ns: 0 });
    /// ```
    ///
    /// # Panics
    /// Never.
    fn legacy_bound(legacy_us: i64) -> InstantPair;
}

impl LegacyBound for InstantPair {
    fn legacy_bound(legacy_us: i64) -> InstantPair {
        InstantPair {
            floor_us: legacy_us,
            submicro_ns: if legacy_us >= 0 { 999 } else { 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    //! Exact-value tables at the boundaries; the i128 oracle comparison
    //! lives in `tests/oracle.rs`.

    use jiff::Timestamp;

    use super::*;

    fn pair(floor_us: i64, submicro_ns: i16) -> InstantPair {
        InstantPair {
            floor_us,
            submicro_ns,
        }
    }

    #[test]
    fn legacy_bound_table() {
        let check = |u: i64, want: InstantPair, want_ns: i128| {
            let b = InstantPair::legacy_bound(u);
            assert_eq!(b, want, "u {u}");
            assert_eq!(b.as_nanos(), want_ns, "u {u}");
        };
        check(0, pair(0, 999), 999);
        check(1, pair(1, 999), 1_999);
        check(-1, pair(-1, 0), -1_000);
        check(-2, pair(-2, 0), -2_000);
        check(i64::MAX, pair(i64::MAX, 999), 9_223_372_036_854_775_807_999);
        check(i64::MIN, pair(i64::MIN, 0), -9_223_372_036_854_775_808_000);
        // In-domain bounds decode; a bound past MAX is refused.
        assert_eq!(
            InstantPair::legacy_bound(-1).decode(),
            Ok(Timestamp::from_nanosecond(-1_000).unwrap())
        );
        let last_us = InstantPair::MAX.floor_us;
        assert_eq!(
            InstantPair::legacy_bound(last_us).decode(),
            Ok(Timestamp::MAX)
        );
        assert_eq!(
            InstantPair::legacy_bound(last_us + 1).decode(),
            Err(PairError::OutOfDomain {
                floor_us: last_us + 1,
                submicro_ns: 999
            })
        );
        let first_us = InstantPair::MIN.floor_us;
        assert_eq!(
            InstantPair::legacy_bound(first_us).decode(),
            Ok(Timestamp::MIN)
        );
        assert_eq!(
            InstantPair::legacy_bound(first_us - 1).decode(),
            Err(PairError::OutOfDomain {
                floor_us: first_us - 1,
                submicro_ns: 0
            })
        );
    }
}
