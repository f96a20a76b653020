//! The CLI's output to a closed pipe (`tollgate ... | head -1`) ends quietly:
//! exit status as usual, no panic. Found by a new user's trial, where
//! `tollgate audit | head -3` panicked with "failed printing to stdout".

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

#[test]
fn output_to_a_closed_pipe_does_not_panic() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    // Close the reading end first: every write the CLI makes gets EPIPE.
    drop(reader);
    let out = Command::new(BIN)
        .args([
            "serve",
            "--print-config",
            "--admin-token",
            "tgadm1.pipe-test-token-0123",
        ])
        .env_remove("DATABASE_URL")
        .env_remove("TOLLGATE_DATABASE_URL")
        .stdout(writer)
        .output()
        .expect("run tollgate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}
