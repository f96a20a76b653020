//! The upgrade guide and the commands' help say what the binary does: the
//! schema version it expects, the migrations a dry run lists, and which
//! settings a direct `status` or `audit` does not need.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// `text` with every run of whitespace made one space.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn upgrade_guide() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/upgrade-0017.md");
    flat(&std::fs::read_to_string(path).expect("docs/upgrade-0017.md"))
}

/// The guide names the binary's expected schema version and every
/// migration after 0017 that the dry run lists.
#[test]
fn the_upgrade_guide_names_the_binarys_schema_version() {
    let version = tollgate_server::pg::expected_schema_version();
    let guide = upgrade_guide();
    let expected = format!("`expected_schema_version` ({version} for a binary of today");
    assert!(guide.contains(&expected), "{expected}");
    let later: Vec<String> = (18..=version).map(|v| format!("{v:04}")).collect();
    let (last, rest) = later.split_last().expect("migrations after 0017");
    let listed = format!(
        "# \"pending 0017 exact instants\", then {} and {last}",
        rest.join(", ")
    );
    assert!(guide.contains(&listed), "{listed}");
}

/// `tollgate <cmd> --help`, flattened.
fn help(cmd: &str) -> String {
    let out = Command::new(BIN)
        .args([cmd, "--help"])
        .env_clear()
        .output()
        .expect("run tollgate");
    assert_eq!(out.status.code(), Some(0), "{cmd} --help");
    flat(&String::from_utf8_lossy(&out.stdout))
}

/// The help of `status` and `audit` says the policy flags and the key file
/// are not needed (and are ignored); `serve`'s still gives their defaults
/// and that PostgreSQL needs the key.
#[test]
fn status_and_audit_help_say_the_policy_and_key_are_not_needed() {
    let policy = "Not needed: a direct status or audit only reads, with the policy recorded in \
                  the database (a different value is ignored, with a warning)";
    let key = "Not needed: a direct status or audit checks no capability (the file is not \
               read; given, it is ignored with a warning)";
    for cmd in ["status", "audit"] {
        let h = help(cmd);
        assert!(
            h.contains(&format!("--max-ttl <DURATION> {policy}")),
            "{cmd}: {h}"
        );
        assert!(
            h.contains(&format!("--reclaim-grace <DURATION> {policy}")),
            "{cmd}: {h}"
        );
        assert!(
            h.contains(&format!("--secret-file <PATH> {key}")),
            "{cmd}: {h}"
        );
        assert!(!h.contains("required with PostgreSQL"), "{cmd}: {h}");
        assert!(!h.contains("[default: PT1H]"), "{cmd}: {h}");
    }
    let serve = help("serve");
    assert!(serve.contains("required with PostgreSQL"), "{serve}");
}
