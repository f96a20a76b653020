//! The domain constants equal jiff's and the Coq model's.

use jiff::Timestamp;
use tollgate::{InstantPair, TIMESTAMP_MAX_NS, TIMESTAMP_MIN_NS};

#[test]
fn constants_equal_jiff_domain() {
    assert_eq!(Timestamp::MIN.as_nanosecond(), TIMESTAMP_MIN_NS);
    assert_eq!(Timestamp::MAX.as_nanosecond(), TIMESTAMP_MAX_NS);
    assert_eq!(
        InstantPair::MIN,
        InstantPair {
            floor_us: -377_705_023_201_000_000,
            submicro_ns: 0
        }
    );
    assert_eq!(
        InstantPair::MAX,
        InstantPair {
            floor_us: 253_402_207_200_999_999,
            submicro_ns: 999
        }
    );
}

fn coq_constant(source: &str, name: &str) -> i128 {
    let prefix = format!("Definition {name} : Z := ");
    let line = source
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("{name} not defined in the Coq model"));
    line[prefix.len()..]
        .trim_end_matches('.')
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn coq_model_uses_the_same_domain() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../formal/Tollgate/LeaseTiming.v"
    );
    let source = std::fs::read_to_string(path).expect("read the Coq model");
    assert_eq!(coq_constant(&source, "ts_min_ns"), TIMESTAMP_MIN_NS);
    assert_eq!(coq_constant(&source, "ts_max_ns"), TIMESTAMP_MAX_NS);
}
