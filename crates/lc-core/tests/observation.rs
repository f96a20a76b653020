//! The re-execution rule against an independent truth table, the v1
//! fixtures' byte-exact replay, and the rule that only the v1 parser names
//! the v1 cost field.

use std::path::{Path, PathBuf};

use lc_core::observation::{
    Eligibility, ExternalityObservation, Milestone, StoredRetryReceipt, reexecution_eligibility,
};
use proptest::prelude::*;

/// The v1 cost field, and its snake_case spelling (which `rename_all`
/// would turn into it), built so this file does not contain them.
const NEEDLES: [&str; 2] = [concat!("saved", "Cost"), concat!("saved", "_cost")];
const REGION_START: &str = "// region: legacy v1 receipts.";
const REGION_END: &str = "// endregion: legacy v1 receipts.";

/// The rule, as a table over (milestone?, observation? (n, d, a)).
fn oracle(
    milestone: bool,
    o: Option<(Option<bool>, Option<bool>, Option<bool>)>,
) -> Result<(), &'static str> {
    match (milestone, o) {
        (false, _) => Err("no_milestone"),
        (true, None) => Err("externality_unobserved"),
        (true, Some((Some(false), Some(false), Some(false)))) => Ok(()),
        (true, Some((Some(true), _, _) | (_, Some(true), _) | (_, _, Some(true)))) => {
            Err("externality_observed")
        }
        (true, Some(_)) => Err("externality_incomplete"),
    }
}

fn flag() -> impl Strategy<Value = Option<bool>> {
    prop_oneof![Just(None), Just(Some(false)), Just(Some(true))]
}

proptest! {
    #[test]
    fn eligibility_matches_the_truth_table(
        has_milestone in any::<bool>(),
        o in proptest::option::of((flag(), flag(), flag())),
    ) {
        let m = Milestone {
            head: "0".repeat(64),
            cost: None,
            externality: o.map(|(n, d, a)| ExternalityObservation {
                network_writes: n,
                database_commits: d,
                external_api_calls: a,
            }),
        };
        // Through JSON, as a stored milestone is read: absence survives.
        let m: Milestone = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        let got = match reexecution_eligibility(has_milestone.then_some(&m)) {
            Eligibility::Eligible => Ok(()),
            Eligibility::Ineligible(r) => Err(r.code()),
        };
        prop_assert_eq!(got, oracle(has_milestone, o));
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/retry_receipts")
}

#[test]
fn every_v1_fixture_replays_byte_identical() {
    let mut n = 0;
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let stored = StoredRetryReceipt::parse(&bytes).unwrap();
        assert!(matches!(stored, StoredRetryReceipt::V1(_)), "{path:?}");
        assert_eq!(stored.bytes(), bytes, "{path:?}");
        n += 1;
    }
    assert_eq!(n, 3);
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines of `text` that name a needle, 1-based.
fn naming_lines(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| NEEDLES.iter().any(|n| l.contains(n)))
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
fn only_the_v1_parser_names_the_v1_cost_field() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let observation = crates
        .join("lc-core/src/observation.rs")
        .canonicalize()
        .unwrap();
    assert!(files.len() > 20, "{} files", files.len());
    let mut in_region = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines = naming_lines(&text);
        if path.canonicalize().unwrap() != observation {
            assert_eq!(
                lines,
                Vec::<usize>::new(),
                "{path:?} names the v1 cost field"
            );
            continue;
        }
        let marker = |m: &str| {
            let at: Vec<usize> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| l.starts_with(m))
                .map(|(i, _)| i + 1)
                .collect();
            assert_eq!(at.len(), 1, "{m} must occur once");
            at[0]
        };
        let (start, end) = (marker(REGION_START), marker(REGION_END));
        assert!(start < end);
        for l in &lines {
            assert!(
                start < *l && *l < end,
                "observation.rs:{l} names the v1 cost field outside the v1 region"
            );
        }
        in_region = lines.len();
    }
    // The parser does name it (so the scan is not vacuous).
    assert!(in_region >= 1);
}
