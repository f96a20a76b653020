//! What `lc` prints on stdout: with `--json` the server's JSON answer as
//! one line, as it came; otherwise `field: value` lines for one record and
//! a table for a list. A reader that went away (broken pipe) ends the
//! output quietly; any other write failure fails the command.

use std::io::Write as _;

use serde_json::Value;

use super::http::ClientError;

/// The fields shown for a tenant, in order.
pub const TENANT_FIELDS: &[&str] = &[
    "tenant_id",
    "name",
    "deposited",
    "available",
    "held",
    "consumed",
];

/// The fields shown for a runtime.
pub const RUNTIME_FIELDS: &[&str] = &["name", "digest"];

/// The fields shown for an exec.
pub const EXEC_FIELDS: &[&str] = &[
    "exec_id",
    "state",
    "terminal_reason",
    "exit_code",
    "runtime",
    "shape",
    "attempt",
    "command",
];

/// The fields shown for a worker's claim.
pub const CLAIM_FIELDS: &[&str] = &[
    "item_kind",
    "item_id",
    "holder_sha256",
    "generation",
    "expiry",
    "basis",
    "expired",
    "takeable",
];

/// The fields shown for an approval decision.
pub const APPROVAL_FIELDS: &[&str] = &[
    "exec_id",
    "decision",
    "approver",
    "decided_cut",
    "valid_until",
    "reason",
];

/// An exec's observation as `lc exec show` prints it: the name, then
/// where it is in the exec's `observation`. A value the provider did not
/// measure prints as `unknown`, never `0` or `false`.
pub const OBSERVATION_FIELDS: &[(&str, &str, &str)] = &[
    ("cost.cpu_time_ms", "cost", "cpuTimeMs"),
    ("cost.peak_memory_bytes", "cost", "peakMemoryBytes"),
    ("externality.network_writes", "externality", "networkWrites"),
    (
        "externality.database_commits",
        "externality",
        "databaseCommits",
    ),
    (
        "externality.external_api_calls",
        "externality",
        "externalApiCalls",
    ),
];

/// An exec: its [`EXEC_FIELDS`], its [`OBSERVATION_FIELDS`] and its
/// re-execution verdict (`eligible`, or `ineligible: REASON`), then, when
/// it awaited approval and was decided, its decision's fields prefixed
/// `approval.`.
///
/// # Errors
/// A failed write to stdout.
pub fn exec(v: &Value, json: bool) -> Result<(), ClientError> {
    if json {
        return record(v, json, EXEC_FIELDS);
    }
    out(&exec_text(v))
}

/// The `field: value` lines [`exec`] prints for the exec `v`.
pub fn exec_text(v: &Value) -> String {
    let mut flat = v.clone();
    let mut fields: Vec<&str> = EXEC_FIELDS.to_vec();
    flatten_observation(&mut flat, &v["observation"], &v["reexecution"]);
    fields.extend(OBSERVATION_FIELDS.iter().map(|(name, _, _)| *name));
    fields.push("reexecution");
    let names: Vec<String> = APPROVAL_FIELDS[1..]
        .iter()
        .map(|f| format!("approval.{f}"))
        .collect();
    if !v["approval"].is_null() {
        for (f, name) in APPROVAL_FIELDS[1..].iter().zip(&names) {
            flat[name.as_str()] = v["approval"][*f].clone();
        }
        fields.extend(names.iter().map(String::as_str));
    }
    record_text(&flat, &fields)
}

/// Sets `flat`'s [`OBSERVATION_FIELDS`] from `observation` (each value
/// not measured `unknown`) and its `reexecution` from `verdict`
/// (`eligible`, or `ineligible: REASON`).
fn flatten_observation(flat: &mut Value, observation: &Value, verdict: &Value) {
    for (name, group, key) in OBSERVATION_FIELDS {
        flat[*name] = observation[*group]
            .get(*key)
            .cloned()
            .unwrap_or_else(|| Value::from("unknown"));
    }
    flat["reexecution"] = match (verdict["eligible"].as_bool(), verdict["reason"].as_str()) {
        (Some(true), _) => Value::from("eligible"),
        (_, Some(reason)) => Value::from(format!("ineligible: {reason}")),
        _ => Value::from("unknown"),
    };
}

/// The columns `lc exec milestones` shows, besides the
/// [`OBSERVATION_FIELDS`] and `reexecution`, which follow them.
pub const MILESTONE_FIELDS: &[&str] = &["seq", "attempt", "generation", "source", "recorded_cut"];

/// `GET /v1/execs/{id}/milestones`: a table of the milestones, each with
/// its [`OBSERVATION_FIELDS`] (`unknown` where not measured), its
/// re-execution verdict and its head, or a line saying there is none
/// (with `--json`, the server's answer).
///
/// # Errors
/// A failed write to stdout.
pub fn milestones(v: &Value, json: bool) -> Result<(), ClientError> {
    if json {
        return record(v, true, &[]);
    }
    out(&milestones_text(v))
}

/// The table [`milestones`] prints for the page `v`.
pub fn milestones_text(v: &Value) -> String {
    let rows: Vec<Value> = v["milestones"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            let mut flat = m.clone();
            flatten_observation(&mut flat, &m, &m["reexecution"]);
            flat
        })
        .collect();
    if rows.is_empty() {
        return "no milestones (each committed hibernation records one)".into();
    }
    let mut fields = MILESTONE_FIELDS.to_vec();
    fields.extend(OBSERVATION_FIELDS.iter().map(|(name, _, _)| *name));
    fields.extend(["reexecution", "head"]);
    table_text(&rows, &fields)
}

/// `GET /v1/approvals`: a table of the execs awaiting approval, then one
/// of the decisions (with `--json`, the server's answer).
pub fn approvals(v: &Value, json: bool) -> Result<(), ClientError> {
    if json {
        return record(v, true, &[]);
    }
    let awaiting = v["awaiting"].as_array().cloned().unwrap_or_default();
    let decisions = v["decisions"].as_array().cloned().unwrap_or_default();
    let section = |title: &str, rows: &[Value], fields: &[&str]| {
        if rows.is_empty() {
            format!("{title}: none")
        } else {
            format!("{title}:\n{}", table_text(rows, fields))
        }
    };
    let text = format!(
        "{}\n{}",
        section("awaiting approval", &awaiting, EXEC_FIELDS),
        section("decisions", &decisions, APPROVAL_FIELDS)
    );
    out(&text)
}

/// The fields shown for a hibernation.
pub const HIBERNATION_FIELDS: &[&str] = &[
    "exec_id",
    "generation",
    "reason",
    "step",
    "sealed_cut",
    "head",
];

/// The fields shown for a resume request.
pub const RESUME_FIELDS: &[&str] = &[
    "exec_id",
    "op_key",
    "head",
    "from_generation",
    "recorded_cut",
];

/// The fields shown for a workspace.
pub const WORKSPACE_FIELDS: &[&str] = &["exec_id", "workspace_id", "head", "snapshots"];

/// The fields of a deletion of a workspace or output (`lc workspace
/// delete|undelete`, `lc exec output --delete|--undelete`).
pub const DELETION_FIELDS: &[&str] = &[
    "exec_id",
    "item",
    "state",
    "deleted_at",
    "purge_after",
    "purged_at",
    "undelete",
];

/// The fields shown for a snapshot.
pub const SNAPSHOT_FIELDS: &[&str] = &["seq", "digest", "generation", "committed_cut"];

/// The fields shown for a workspace download.
pub const DOWNLOAD_FIELDS: &[&str] = &[
    "exec_id", "head", "dir", "files", "dirs", "symlinks", "bytes",
];

/// The fields shown for a stdin input.
pub const INPUT_FIELDS: &[&str] = &["exec_id", "input_seq", "length", "eof", "state", "sha256"];

/// The fields shown for an operation key.
pub const OPERATION_FIELDS: &[&str] = &[
    "key",
    "kind",
    "created_cut",
    "floor",
    "receipt_attached",
    "gc_at",
    "result",
];

/// The fields shown for a scoped token (never its secret).
pub const TOKEN_FIELDS: &[&str] = &["token_id", "exec_id", "operations", "deadline", "revoked"];

/// Writes `text` and a newline to stdout.
fn out(text: &str) -> Result<(), ClientError> {
    let mut o = std::io::stdout().lock();
    match writeln!(o, "{text}").and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(ClientError::Failed(format!("writing to stdout: {e}"))),
    }
}

/// A value as a table cell: strings bare, `null` as `-`, anything else as
/// compact JSON. Control characters (a newline in a command, say) are
/// shown escaped (`\n`), so one value stays on one line of the table.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => printable(s),
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .map(printable)
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
}

/// `s` with each control character replaced by its Rust escape.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The `field: value` lines of `v` for `fields` (those present).
pub fn record_text(v: &Value, fields: &[&str]) -> String {
    let width = fields.iter().map(|f| f.len()).max().unwrap_or(0);
    fields
        .iter()
        .filter(|f| v.get(**f).is_some())
        .map(|f| format!("{f:<width$}  {}", cell(&v[*f])))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A table of `rows` with `fields` as columns (those present in any row).
pub fn table_text(rows: &[Value], fields: &[&str]) -> String {
    let cols: Vec<&str> = fields
        .iter()
        .copied()
        .filter(|f| rows.iter().any(|r| r.get(*f).is_some()))
        .collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| cols.iter().map(|c| cell(&r[*c])).collect())
        .collect();
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |items: Vec<String>| {
        items
            .iter()
            .zip(&widths)
            .map(|(s, w)| format!("{s:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut lines = vec![line(cols.iter().map(|c| c.to_uppercase()).collect())];
    lines.extend(cells.into_iter().map(line));
    lines.join("\n")
}

/// Prints one record.
///
/// # Errors
/// A failed write to stdout.
pub fn record(v: &Value, json: bool, fields: &[&str]) -> Result<(), ClientError> {
    if json {
        out(&v.to_string())
    } else {
        out(&record_text(v, fields))
    }
}

/// Prints the list under `member` of `v`.
///
/// # Errors
/// A failed write to stdout.
pub fn list(v: &Value, member: &str, json: bool, fields: &[&str]) -> Result<(), ClientError> {
    if json {
        return out(&v.to_string());
    }
    out(&list_text(v, member, fields))
}

/// [`list`]'s text: a table of the rows under `member`, or `no MEMBER`
/// when there are none (never an empty line).
pub fn list_text(v: &Value, member: &str, fields: &[&str]) -> String {
    let rows = v[member].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        format!("no {member}")
    } else {
        table_text(&rows, fields)
    }
}

/// Prints a created tenant: its id and its API key, which is shown only
/// on creation (and on a replay of it).
///
/// # Errors
/// A failed write to stdout.
pub fn tenant_created(v: &Value, json: bool) -> Result<(), ClientError> {
    if json {
        return out(&v.to_string());
    }
    out(&record_text(v, &["tenant_id", "name", "api_key"]))
}

/// Prints a minted token: its id, its secret (shown only in the answer
/// that minted it) and its deadline.
///
/// # Errors
/// A failed write to stdout.
pub fn token_minted(v: &Value, json: bool) -> Result<(), ClientError> {
    if json {
        return out(&v.to_string());
    }
    out(&record_text(
        v,
        &["token_id", "token", "exec_id", "operations", "deadline"],
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_empty_list_says_so() {
        assert_eq!(
            list_text(&json!({"execs": []}), "execs", EXEC_FIELDS),
            "no execs"
        );
        assert_eq!(list_text(&json!({}), "tokens", TOKEN_FIELDS), "no tokens");
        assert_eq!(
            list_text(&json!({"execs": [{"exec_id": 3}]}), "execs", &["exec_id"]),
            "EXEC_ID\n3"
        );
    }

    #[test]
    fn tables_and_records() {
        let rows = vec![
            json!({"exec_id": 1, "state": "terminal", "exit_code": 0, "command": ["echo", "hi"]}),
            json!({"exec_id": 12, "state": "running", "exit_code": null, "command": ["sleep", "9"]}),
        ];
        assert_eq!(
            table_text(&rows, EXEC_FIELDS),
            "EXEC_ID  STATE     EXIT_CODE  COMMAND\n\
             1        terminal  0          echo hi\n\
             12       running   -          sleep 9"
        );
        assert_eq!(
            record_text(
                &json!({"tenant_id": 3, "name": "blue", "held": 0}),
                TENANT_FIELDS
            ),
            "tenant_id  3\nname       blue\nheld       0"
        );
    }

    #[test]
    fn milestones_say_unknown_for_what_was_not_measured() {
        let page = json!({"milestones": [
            {"seq": 1, "attempt": 1, "generation": 1, "source": "hibernation", "head": "ab",
             "cost": {"cpuTimeMs": 0, "peakMemoryBytes": 4096},
             "externality": {"networkWrites": false, "databaseCommits": false, "externalApiCalls": false},
             "reexecution": {"eligible": true}, "recorded_cut": "2026-12-03T17:00:00Z"},
            {"seq": 2, "attempt": 1, "generation": 2, "source": "hibernation", "head": "cd",
             "reexecution": {"eligible": false, "reason": "externality_unobserved"},
             "recorded_cut": "2026-12-03T17:00:01Z"}
        ], "next_after_seq": null});
        let text = milestones_text(&page);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        assert_eq!(
            lines,
            vec![
                vec![
                    "SEQ",
                    "ATTEMPT",
                    "GENERATION",
                    "SOURCE",
                    "RECORDED_CUT",
                    "COST.CPU_TIME_MS",
                    "COST.PEAK_MEMORY_BYTES",
                    "EXTERNALITY.NETWORK_WRITES",
                    "EXTERNALITY.DATABASE_COMMITS",
                    "EXTERNALITY.EXTERNAL_API_CALLS",
                    "REEXECUTION",
                    "HEAD"
                ],
                vec![
                    "1",
                    "1",
                    "1",
                    "hibernation",
                    "2026-12-03T17:00:00Z",
                    "0",
                    "4096",
                    "false",
                    "false",
                    "false",
                    "eligible",
                    "ab"
                ],
                vec![
                    "2",
                    "1",
                    "2",
                    "hibernation",
                    "2026-12-03T17:00:01Z",
                    "unknown",
                    "unknown",
                    "unknown",
                    "unknown",
                    "unknown",
                    "ineligible: externality_unobserved",
                    "cd"
                ],
            ]
        );
    }

    #[test]
    fn an_exec_says_unknown_for_what_was_not_measured() {
        let measured = json!({
            "exec_id": 4, "state": "terminal", "terminal_reason": "exited", "exit_code": 0,
            "observation": {
                "cost": {"cpuTimeMs": 0, "peakMemoryBytes": 1048576},
                "externality": {"networkWrites": false, "databaseCommits": false, "externalApiCalls": false}
            },
            "reexecution": {"eligible": true}
        });
        assert_eq!(
            exec_text(&measured),
            "exec_id                         4\n\
             state                           terminal\n\
             terminal_reason                 exited\n\
             exit_code                       0\n\
             cost.cpu_time_ms                0\n\
             cost.peak_memory_bytes          1048576\n\
             externality.network_writes      false\n\
             externality.database_commits    false\n\
             externality.external_api_calls  false\n\
             reexecution                     eligible"
        );
        let unmeasured = json!({
            "exec_id": 5, "state": "running",
            "reexecution": {"eligible": false, "reason": "externality_unobserved"}
        });
        assert_eq!(
            exec_text(&unmeasured),
            "exec_id                         5\n\
             state                           running\n\
             cost.cpu_time_ms                unknown\n\
             cost.peak_memory_bytes          unknown\n\
             externality.network_writes      unknown\n\
             externality.database_commits    unknown\n\
             externality.external_api_calls  unknown\n\
             reexecution                     ineligible: externality_unobserved"
        );
        let network = json!({
            "exec_id": 6,
            "observation": {"externality": {}},
            "reexecution": {"eligible": false, "reason": "externality_incomplete"}
        });
        assert!(
            exec_text(&network).contains("externality.network_writes      unknown\n"),
            "{}",
            exec_text(&network)
        );
    }

    #[test]
    fn control_characters_stay_on_one_line() {
        assert_eq!(
            cell(&json!(["python3", "-c", "import os\nprint(1)\t\u{1b}"])),
            "python3 -c import os\\nprint(1)\\t\\u{1b}"
        );
        assert_eq!(cell(&json!("a\rb")), "a\\rb");
    }
}
