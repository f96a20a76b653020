//! Workspace programs a test runs as processes (the `lc-supervisor`
//! binary, an example), built fresh by cargo before first use.
//!
//! `cargo test` builds a package's own binaries for its integration tests,
//! but not another package's, nor examples as programs. A test that finds
//! an old build at `target/<profile>/<name>` and runs it would test
//! yesterday's code: so [`cargo_built`] always runs `cargo build` (a no-op
//! when the program is fresh) once per test process and path, in the test's
//! own profile and target directory, then returns the path.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// `target/<profile>/<relative>` (the profile and target directory of the
/// running test binary), after `cargo build <args>` (plus `--release` in
/// the release profile) brought it up to date; built once per process and
/// `relative`, later calls return the same path.
///
/// # Panics
/// When cargo cannot be run or fails, or the program is still missing
/// afterwards: a test that needs it must fail, never skip.
pub fn cargo_built(relative: &str, args: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let map = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = map.get(relative) {
        return p.clone();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test binary>
    let profile = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("the test binary lives in target/<profile>/deps")
        .to_path_buf();
    let target_dir = profile
        .parent()
        .expect("target/<profile> has a parent")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.arg("build")
        .args(args)
        .env("CARGO_TARGET_DIR", &target_dir);
    if profile.ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "cargo build {args:?} failed: {status}");
    let bin = profile.join(relative);
    assert!(bin.is_file(), "{} missing after cargo build", bin.display());
    map.insert(relative.to_owned(), bin.clone());
    bin
}
