//! What the commands print: results as JSON on stdout (through `out!`, so
//! a closed pipe ends the output quietly and a lost one fails the
//! command), findings on stderr, and the exit status a result implies.

use std::process::ExitCode;

use super::CliError;
use crate::dto::{AuditView, StatusView};

/// Prints `v` as pretty JSON.
pub(super) fn print_json(v: &impl serde::Serialize) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => out!("{s}"),
        Err(e) => say!("error: cannot print result: {e}"),
    }
}

/// Prints `v` as one line of JSON (one reclaim batch, so that `reclaim
/// --loop` is a stream of lines).
///
/// # Errors
/// [`CliError::Failed`] when `v` cannot be serialized.
pub(super) fn print_json_line(v: &impl serde::Serialize) -> Result<(), CliError> {
    out!(
        "{}",
        serde_json::to_string(v).map_err(|e| CliError::Failed(e.to_string()))?
    );
    Ok(())
}

/// Prints a status report; exit 0 when ready, 1 otherwise.
pub(super) fn status(view: &StatusView) -> ExitCode {
    print_json(view);
    if view.readiness.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Prints an audit report; a report with violations also names each on
/// stderr, then the accounts they are in, and exits 1.
pub(super) fn audit(view: &AuditView) -> ExitCode {
    print_json(view);
    if view.clean {
        return ExitCode::SUCCESS;
    }
    for v in &view.violations {
        match v.seq {
            Some(seq) => say!(
                "violation: account {} (ledger seq {seq}): {}",
                v.account_id,
                v.detail
            ),
            None => say!("violation: account {}: {}", v.account_id, v.detail),
        }
    }
    let mut accounts: Vec<i64> = view.violations.iter().map(|v| v.account_id).collect();
    accounts.sort_unstable();
    accounts.dedup();
    say!(
        "audit failed: {} violation(s) in account(s) {}",
        view.violations.len(),
        accounts
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    ExitCode::from(1)
}
