//! The timestamp domain: the instants every subsystem can represent, in
//! nanoseconds since the Unix epoch. A deadline or cut outside it is
//! unrepresentable, never saturated.

/// The smallest instant of the domain, in nanoseconds since the Unix epoch
/// (`Timestamp::MIN`, -009999-01-02T01:59:59Z). Equal to `ts_min_ns` in the
/// Coq model (`formal/Tollgate/LeaseTiming.v`).
pub const TIMESTAMP_MIN_NS: i128 = -377_705_023_201_000_000_000;

/// The largest instant of the domain, in nanoseconds since the Unix epoch
/// (`Timestamp::MAX`, 9999-12-30T22:00:00.999999999Z). Equal to `ts_max_ns` in
/// the Coq model.
pub const TIMESTAMP_MAX_NS: i128 = 253_402_207_200_999_999_999;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ends_are_jiffs() {
        assert_eq!(jiff::Timestamp::MIN.as_nanosecond(), TIMESTAMP_MIN_NS);
        assert_eq!(jiff::Timestamp::MAX.as_nanosecond(), TIMESTAMP_MAX_NS);
    }
}
