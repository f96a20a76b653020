//! What the commands print: results as JSON on stdout (through `out!`, so
//! a closed pipe ends the output quietly and a lost one fails the
//! command), findings on stderr, and the exit status a result implies.

use std::process::ExitCode;

use super::CliError;
use tollgate_api::dto::{AuditView, StatusView};

/// How every command prints a JSON result: indented for a person when
/// standard output is a terminal, otherwise one line per result (a pipe or
/// a file gets one JSON document per line, so `reclaim --loop` is a stream
/// of lines and `jq` or a line reader takes each result whole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStyle {
    /// Indented, several lines.
    Pretty,
    /// One line.
    Line,
}

impl JsonStyle {
    /// The style for this process's standard output.
    pub fn of_stdout() -> JsonStyle {
        use std::io::IsTerminal as _;
        if std::io::stdout().is_terminal() {
            JsonStyle::Pretty
        } else {
            JsonStyle::Line
        }
    }

    /// `v` in this style.
    ///
    /// # Errors
    /// serde_json's, when `v` cannot be serialized.
    pub fn render(self, v: &impl serde::Serialize) -> serde_json::Result<String> {
        match self {
            JsonStyle::Pretty => serde_json::to_string_pretty(v),
            JsonStyle::Line => serde_json::to_string(v),
        }
    }
}

/// Prints `v` as JSON in the style of standard output ([`JsonStyle`]).
///
/// # Errors
/// [`CliError::Failed`] when `v` cannot be serialized (none of the
/// service's shapes can fail: their maps have string keys).
pub(super) fn print_json(v: &impl serde::Serialize) -> Result<(), CliError> {
    let text = JsonStyle::of_stdout()
        .render(v)
        .map_err(|e| CliError::Failed(format!("cannot print result: {e}")))?;
    out!("{text}");
    Ok(())
}

/// Prints a status report; exit 0 when ready, 1 otherwise.
///
/// # Errors
/// As [`print_json`].
pub(super) fn status(view: &StatusView) -> Result<ExitCode, CliError> {
    print_json(view)?;
    Ok(if view.readiness.ready {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Prints an audit report; a report with violations also names each on
/// stderr, then the accounts they are in, and exits 1.
///
/// # Errors
/// As [`print_json`].
pub(super) fn audit(view: &AuditView) -> Result<ExitCode, CliError> {
    print_json(view)?;
    if view.clean {
        return Ok(ExitCode::SUCCESS);
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
    Ok(ExitCode::from(1))
}
