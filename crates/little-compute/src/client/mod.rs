//! `lc`, the client of the control plane's HTTP API.
//!
//! * [`args`]: the clap types;
//! * [`http`]: one request per call, problems as typed errors;
//! * [`output`]: human tables and `--json`;
//! * this module: resolving the server and the credential (flags, the
//!   environment, or an appliance's `appliance.json`) and running each
//!   command as requests of its routes.
//!
//! Exit status: 0 on success; 1 when the server refused (its problem is
//! printed on stderr as `error: <status> <code>: <detail>`) or the request
//! failed; `exec create --wait` and `exec output --follow` share one rule
//! ([`terminal_status`]): the command's own exit code, or `128 + signal`,
//! when it exited; 1 with a line naming the reason (`cancelled`,
//! `expired`, `start_failed`) and what to do otherwise; 124 when
//! `--wait` or `--follow` gave up, or `exec send` found the exec's input
//! queue full for its `--wait-timeout-s`. `exec hibernate --wait` and
//! `exec resume --wait` give 0 once the exec is hibernated or runs again
//! under that request, 1 when it ended instead, 124 when they gave up.
//! `workspace download` gives 0 once every entry is written, else 1 with
//! nothing left in the target.

pub mod args;
pub mod http;
pub mod output;
pub mod workspace;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine as _;
use reqwest::Method;
use serde_json::{Value, json};

use self::args::{
    ApprovalCmd, ClaimCmd, Cli, Command, ConnArgs, ExecCmd, OperationCmd, RuntimeCmd, TenantCmd,
    TokenCmd, WorkspaceCmd,
};
use self::http::{Body, Client, ClientError, fresh_idempotency_key};

/// Pause between two polls of `--wait` and `--follow`.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// The longest wait between two tries of `exec output --follow` while the
/// control plane does not answer: from [`POLL_INTERVAL`], doubled per
/// failure in a row ([`lc_core::rules::doubling_backoff`]), up to this.
pub const UNREACHABLE_RETRY_MAX: Duration = Duration::from_secs(5);

/// Pages asked for per output request (the server's own bound may be
/// lower).
pub const OUTPUT_PAGES_PER_REQUEST: u32 = 64;

/// The largest appliance.json read, in bytes (it holds a URL, a path and a
/// few pids).
pub const APPLIANCE_JSON_BYTES_MAX: u64 = 64 * 1024;

/// The exit status when `--wait` or `--follow` gave up.
pub const EXIT_TIMED_OUT: u8 = 124;

/// What an appliance publishes for scripts in `DIR/appliance.json`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ApplianceFile {
    /// The control plane's base URL.
    pub url: String,
    /// The file holding the admin token (relative paths are relative to
    /// the data directory).
    pub admin_token_file: PathBuf,
}

/// Reads `dir/appliance.json`.
///
/// # Errors
/// [`ClientError::Failed`] when it is missing, too large or malformed.
pub fn read_appliance(dir: &Path) -> Result<ApplianceFile, ClientError> {
    let path = dir.join("appliance.json");
    let fail = |e: String| ClientError::Failed(format!("{}: {e}", path.display()));
    let meta = std::fs::metadata(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ClientError::Failed(format!(
                "no appliance is up on {} (it has no appliance.json): start it with `little-compute appliance up --data-dir {}`, or name a server with --server and --token",
                dir.display(),
                dir.display()
            ))
        } else {
            fail(e.to_string())
        }
    })?;
    if meta.len() > APPLIANCE_JSON_BYTES_MAX {
        return Err(fail(format!(
            "larger than {APPLIANCE_JSON_BYTES_MAX} bytes"
        )));
    }
    let bytes = std::fs::read(&path).map_err(|e| fail(e.to_string()))?;
    let mut file: ApplianceFile =
        serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?;
    if file.admin_token_file.is_relative() {
        file.admin_token_file = dir.join(&file.admin_token_file);
    }
    Ok(file)
}

/// A credential file's content without trailing whitespace.
fn read_token_file(path: &Path) -> Result<String, ClientError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ClientError::Failed(format!("{}: {e}", path.display())))?;
    Ok(text.trim_end().to_string())
}

/// The client `conn` names: `--server`/`LC_SERVER` or the appliance's URL
/// (else [`args::DEFAULT_SERVER`]); `--token`/`LC_TOKEN` or the
/// appliance's admin token.
///
/// # Errors
/// An unreadable appliance file or token file; a bad URL.
pub fn connect(conn: &ConnArgs) -> Result<Client, ClientError> {
    let appliance = conn.data_dir.as_deref().map(read_appliance).transpose()?;
    let server = match (&conn.server, &appliance) {
        (Some(s), _) => s.clone(),
        (None, Some(a)) => a.url.clone(),
        (None, None) => args::DEFAULT_SERVER.to_string(),
    };
    let token = match (&conn.token, &appliance) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(a)) => Some(read_token_file(&a.admin_token_file)?),
        (None, None) => None,
    };
    Ok(Client::new(&server, token, conn.tenant)?.with_data_dir(conn.data_dir.clone()))
}

/// Runs the command line `cli`.
pub async fn run(cli: Cli) -> ExitCode {
    match dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {}", explain(&e));
            ExitCode::from(1)
        }
    }
}

/// The line `lc` prints for a failure: the server's problem as `<status>
/// <code>: <detail>`, with a detail in `lc`'s terms where the server's
/// names HTTP (`tenant_required` names the `Lc-Tenant` header, which `lc`
/// sends for `--tenant`).
pub fn explain(e: &ClientError) -> String {
    match e {
        ClientError::Problem(p) if p.code == "tenant_required" => format!(
            "{} tenant_required: the admin token acts for one tenant on this command: name it with --tenant N",
            p.status
        ),
        other => other.to_string(),
    }
}

async fn dispatch(cli: Cli) -> Result<ExitCode, ClientError> {
    let client = connect(&cli.conn)?;
    let json = cli.json;
    let op_key = || -> Result<String, ClientError> {
        match &cli.conn.idempotency_key {
            Some(k) => Ok(k.clone()),
            None => fresh_idempotency_key(),
        }
    };
    let tenant_of = |id: Option<i64>| {
        id.or(cli.conn.tenant).ok_or_else(|| {
            ClientError::Failed("name the tenant: an id argument or --tenant N".into())
        })
    };
    let v = match cli.command {
        Command::Tenant(TenantCmd::Create { name, units }) => {
            let mut body = json!({ "name": name });
            if let Some(u) = units {
                body["units"] = json!(u);
            }
            let v = client
                .call(
                    Method::POST,
                    "v1/tenants",
                    Body::Json(body),
                    Some(&op_key()?),
                )
                .await?;
            output::tenant_created(&v, json)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Tenant(TenantCmd::Deposit { id, units }) => {
            let id = tenant_of(id)?;
            let v = client
                .call(
                    Method::POST,
                    &format!("v1/tenants/{id}/deposits"),
                    Body::Json(json!({ "units": units })),
                    Some(&op_key()?),
                )
                .await?;
            output::record(&v, json, output::TENANT_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Tenant(TenantCmd::ApprovalPolicy { id, require, shape }) => {
            let id = tenant_of(id)?;
            let body = match require {
                Some(r) => json!({ "require": r }),
                None => json!({ "require": "shapes", "shapes": shape }),
            };
            let v = client
                .call(
                    Method::PUT,
                    &format!("v1/tenants/{id}/approval-policy"),
                    Body::Json(body),
                    Some(&op_key()?),
                )
                .await?;
            if json {
                output::record(&v, json, output::TENANT_FIELDS)?;
            } else {
                let mut flat = v.clone();
                flat["approval_policy"] = match v["approval_policy"]["require"].as_str() {
                    Some("shapes") => v["approval_policy"]["shapes"].clone(),
                    _ => v["approval_policy"]["require"].clone(),
                };
                let mut fields = output::TENANT_FIELDS.to_vec();
                fields.push("approval_policy");
                output::record(&flat, false, &fields)?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Approval(ApprovalCmd::List { limit }) => {
            let path = match limit {
                Some(l) => format!("v1/approvals?limit={l}"),
                None => "v1/approvals".to_string(),
            };
            let v = client.call(Method::GET, &path, Body::None, None).await?;
            output::approvals(&v, json)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Approval(ApprovalCmd::Approve { exec, valid_for }) => {
            let body = match valid_for {
                Some(ms) => Body::Json(json!({ "validity_ms": ms })),
                None => Body::None,
            };
            client
                .call(
                    Method::POST,
                    &format!("v1/execs/{exec}/approve"),
                    body,
                    Some(&op_key()?),
                )
                .await?
        }
        Command::Approval(ApprovalCmd::Deny { exec, reason }) => {
            let body = match reason {
                Some(r) => Body::Json(json!({ "reason": r })),
                None => Body::None,
            };
            client
                .call(
                    Method::POST,
                    &format!("v1/execs/{exec}/deny"),
                    body,
                    Some(&op_key()?),
                )
                .await?
        }
        Command::Tenant(TenantCmd::Show { id }) => {
            let id = tenant_of(id)?;
            let v = client
                .call(Method::GET, &format!("v1/tenants/{id}"), Body::None, None)
                .await?;
            output::record(&v, json, output::TENANT_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Runtime(RuntimeCmd::Import { name, path }) => {
            let tar = tarball(&path)?;
            let v = client
                .call(
                    Method::POST,
                    &format!("v1/runtimes?name={}", query_escape(&name)),
                    Body::Raw(tar, "application/x-tar"),
                    Some(&op_key()?),
                )
                .await?;
            output::record(&v, json, output::RUNTIME_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Runtime(RuntimeCmd::List) => {
            let v = client
                .call(Method::GET, "v1/runtimes", Body::None, None)
                .await?;
            output::list(&v, "runtimes", json, output::RUNTIME_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Exec(ExecCmd::Create {
            runtime,
            shape,
            timeout_ms,
            stdin_open,
            idle_ttl_ms,
            on_timeout,
            wait,
            wait_timeout_s,
            command,
        }) => {
            let mut body = json!({ "runtime": runtime, "shape": shape, "command": command });
            if let Some(t) = timeout_ms {
                body["timeout_ms"] = json!(t);
            }
            if stdin_open {
                body["stdin_open"] = json!(true);
            }
            if let Some(t) = idle_ttl_ms {
                body["idle_ttl_ms"] = json!(t);
            }
            if let Some(t) = on_timeout {
                body["on_timeout"] = json!(t);
            }
            let v = client
                .call(Method::POST, "v1/execs", Body::Json(body), Some(&op_key()?))
                .await?;
            if !wait {
                output::record(&v, json, output::EXEC_FIELDS)?;
                return Ok(ExitCode::SUCCESS);
            }
            let id = v["exec_id"]
                .as_i64()
                .ok_or_else(|| ClientError::Failed(format!("no exec_id in {v}")))?;
            let Some(done) = wait_terminal(&client, id, wait_timeout_s).await? else {
                let _ = writeln!(
                    std::io::stderr(),
                    "exec {id}: not terminal after {wait_timeout_s} s"
                );
                return Ok(ExitCode::from(EXIT_TIMED_OUT));
            };
            output::record(&done, json, output::EXEC_FIELDS)?;
            let signal = if done["terminal_reason"] == "exited" && done["exit_code"].is_null() {
                terminal_signal(&client, id).await?
            } else {
                None
            };
            return Ok(finish(&done, signal, &client.data_dir_text()));
        }
        Command::Exec(ExecCmd::Show { id }) => {
            client
                .call(Method::GET, &format!("v1/execs/{id}"), Body::None, None)
                .await?
        }
        Command::Exec(ExecCmd::Milestones {
            id,
            after_seq,
            limit,
        }) => {
            let path = page_path(
                &format!("v1/execs/{id}/milestones"),
                ("after_seq", after_seq.map(i64::from)),
                limit,
            );
            let v = client.call(Method::GET, &path, Body::None, None).await?;
            output::milestones(&v, json)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Exec(ExecCmd::List { after, limit }) => {
            let path = page_path("v1/execs", ("after", after), limit);
            let v = client.call(Method::GET, &path, Body::None, None).await?;
            output::list(&v, "execs", json, output::EXEC_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Exec(ExecCmd::Output {
            id,
            stderr,
            follow,
            after_seq,
            wait_timeout_s,
            delete,
            undelete,
        }) => {
            if delete || undelete {
                let path = if delete {
                    format!("v1/execs/{id}/output")
                } else {
                    format!("v1/execs/{id}/output/undelete")
                };
                let method = if delete { Method::DELETE } else { Method::POST };
                let v = client
                    .call(method, &path, Body::None, Some(&op_key()?))
                    .await?;
                output::record(&v, json, output::DELETION_FIELDS)?;
                return Ok(ExitCode::SUCCESS);
            }
            return exec_output(&client, id, stderr, follow, after_seq, wait_timeout_s).await;
        }
        Command::Exec(ExecCmd::Send {
            id,
            stdin,
            data,
            file,
            eof,
            wait_timeout_s,
        }) => {
            let bytes = send_bytes(stdin.as_deref(), data, file.as_deref(), eof)?;
            let base = op_key()?;
            let given = cli.conn.idempotency_key.is_some();
            return exec_send(&client, id, &bytes, eof, &base, given, wait_timeout_s, json).await;
        }
        Command::Exec(ExecCmd::Cancel { id }) => {
            client
                .call(
                    Method::POST,
                    &format!("v1/execs/{id}/cancel"),
                    Body::None,
                    Some(&op_key()?),
                )
                .await?
        }
        Command::Exec(ExecCmd::Hibernate {
            id,
            wait,
            wait_timeout_s,
        }) => {
            let v = client
                .call(
                    Method::POST,
                    &format!("v1/execs/{id}/hibernate"),
                    Body::None,
                    Some(&op_key()?),
                )
                .await?;
            output::record(&v, json, output::HIBERNATION_FIELDS)?;
            if !wait {
                return Ok(ExitCode::SUCCESS);
            }
            return wait_exec(&client, id, wait_timeout_s, json, Until::Hibernated).await;
        }
        Command::Exec(ExecCmd::Resume {
            id,
            head,
            wait,
            wait_timeout_s,
        }) => {
            let key = op_key()?;
            let v = request_resume(&client, id, head.as_deref(), &key).await?;
            output::record(&v, json, output::RESUME_FIELDS)?;
            if !wait {
                return Ok(ExitCode::SUCCESS);
            }
            let until = Until::Resumed { key, head };
            return wait_exec(&client, id, wait_timeout_s, json, until).await;
        }
        Command::Workspace(WorkspaceCmd::Show { id }) => {
            let v = client
                .call(
                    Method::GET,
                    &format!("v1/execs/{id}/workspace"),
                    Body::None,
                    None,
                )
                .await?;
            output::record(&v, json, output::WORKSPACE_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Workspace(WorkspaceCmd::Snapshots {
            id,
            after_seq,
            limit,
        }) => {
            let path = page_path(
                &format!("v1/execs/{id}/snapshots"),
                ("after_seq", after_seq),
                limit,
            );
            let v = client.call(Method::GET, &path, Body::None, None).await?;
            output::list(&v, "snapshots", json, output::SNAPSHOT_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Workspace(WorkspaceCmd::Download { id, head, to }) => {
            let head = match head {
                Some(h) => lc_core::model::Digest::from_hex(&h)
                    .map_err(|e| ClientError::Failed(format!("--head {h:?}: {e}")))?,
                None => {
                    let w = client
                        .call(
                            Method::GET,
                            &format!("v1/execs/{id}/workspace"),
                            Body::None,
                            None,
                        )
                        .await?;
                    let h = w["head"].as_str().ok_or_else(|| {
                        ClientError::Failed(format!(
                            "exec {id} has no snapshot yet: its workspace is snapshotted when it hibernates (lc exec hibernate {id})"
                        ))
                    })?;
                    lc_core::model::Digest::from_hex(h)
                        .map_err(|e| ClientError::Failed(format!("the server's head: {e}")))?
                }
            };
            let tree = client
                .call(
                    Method::GET,
                    &format!("v1/execs/{id}/snapshots/{}/tree", head.to_hex()),
                    Body::None,
                    None,
                )
                .await?;
            let d = workspace::download(&client, id, head, &tree, &to).await?;
            let summary = workspace::summary(id, head, &to, &d);
            output::record(&summary, json, output::DOWNLOAD_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Claim(ClaimCmd::List { after_lease, limit }) => {
            let path = page_path("v1/claims", ("after_lease", after_lease), limit);
            let v = client.call(Method::GET, &path, Body::None, None).await?;
            output::list(&v, "claims", json, output::CLAIM_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Token(TokenCmd::Mint { exec, ops, ttl }) => {
            let mut body = json!({ "operations": ops, "ttl_ms": ttl });
            if let Some(e) = exec {
                body["exec_id"] = json!(e);
            }
            let v = client
                .call(
                    Method::POST,
                    "v1/tokens",
                    Body::Json(body),
                    Some(&op_key()?),
                )
                .await?;
            output::token_minted(&v, json)?;
            if v["token"].is_null() {
                return Err(ClientError::Failed(format!(
                    "token {} was minted by an earlier use of this --idempotency-key, and its secret is shown only once: revoke it (lc token revoke {}) and mint another under a new key",
                    v["token_id"], v["token_id"]
                )));
            }
            return Ok(ExitCode::SUCCESS);
        }
        Command::Token(TokenCmd::List { after, limit }) => {
            let path = page_path("v1/tokens", ("after", after), limit);
            let v = client.call(Method::GET, &path, Body::None, None).await?;
            output::list(&v, "tokens", json, output::TOKEN_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Token(TokenCmd::Revoke { id }) => {
            let v = client
                .call(Method::DELETE, &format!("v1/tokens/{id}"), Body::None, None)
                .await?;
            output::record(&v, json, output::TOKEN_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Workspace(WorkspaceCmd::Delete { id }) => {
            let v = client
                .call(
                    Method::DELETE,
                    &format!("v1/execs/{id}/workspace"),
                    Body::None,
                    Some(&op_key()?),
                )
                .await?;
            output::record(&v, json, output::DELETION_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Workspace(WorkspaceCmd::Undelete { id }) => {
            let v = client
                .call(
                    Method::POST,
                    &format!("v1/execs/{id}/workspace/undelete"),
                    Body::None,
                    Some(&op_key()?),
                )
                .await?;
            output::record(&v, json, output::DELETION_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        Command::Operation(OperationCmd::Show { key }) => {
            let v = client
                .call(
                    Method::GET,
                    &format!("v1/operations/{}", path_escape(&key)),
                    Body::None,
                    None,
                )
                .await?;
            output::record(&v, json, output::OPERATION_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    output::exec(&v, json)?;
    Ok(ExitCode::SUCCESS)
}

/// How `lc` ends for a terminal exec, the one rule of `exec create --wait`
/// and `exec output --follow`: an exec that `exited` gives its command's
/// exit code (0..=255), or `128 + signal` when a signal ended it; any
/// other end (`cancelled`, `expired`, `start_failed`), or an exit with
/// neither, gives 1 and a line for stderr naming the reason and what to
/// do. `reason` is the exec's `terminal_reason` (`None`: not yet recorded,
/// when the terminal page alone is known, which only a command that ended
/// writes); `expired_by` its `expired_by` (`timeout` or `lease`, which
/// the line for `expired` names); `code` and `signal` are its exit status
/// as far as known; `data_dir` the appliance data directory the hints
/// name (`DIR` when unknown).
pub fn terminal_status(
    id: i64,
    reason: Option<&str>,
    expired_by: Option<&str>,
    code: Option<i64>,
    signal: Option<i64>,
    data_dir: &str,
) -> (u8, Option<String>) {
    match reason {
        None | Some("exited") => {
            if let Some(c) = code {
                return (u8::try_from(c.rem_euclid(256)).unwrap_or(1), None);
            }
            if let Some(s) = signal {
                return (u8::try_from(128 + s.clamp(1, 127)).unwrap_or(1), None);
            }
            (
                1,
                Some(format!(
                    "exec {id} ended without an exit status; its output is kept (lc exec output {id})"
                )),
            )
        }
        Some("cancelled") => (
            1,
            Some(format!(
                "exec {id} ended cancelled: it was cancelled before its command exited; the output it wrote is kept (lc exec output {id})"
            )),
        ),
        Some("expired") => (
            1,
            Some(match expired_by {
                Some("timeout") => format!(
                    "exec {id} ended expired: its --timeout-ms passed before its command exited; the output it wrote is kept (lc exec output {id}); run it again with a larger --timeout-ms (or none) with lc exec create"
                ),
                Some("lease") => format!(
                    "exec {id} ended expired: its sandbox's Lease ran out unrenewed before its command exited: the sandbox was lost or stopped answering, or no worker renewed it (little-compute appliance status; the provider's log says whether the sandbox died: {data_dir}/logs/provider.log of the appliance); the output it wrote is kept (lc exec output {id}); run it again with lc exec create"
                ),
                _ => format!(
                    "exec {id} ended expired: its Lease or its --timeout-ms ran out before its command exited (check that a worker and a gateway run: little-compute appliance status); the output it wrote is kept (lc exec output {id}); run it again with lc exec create"
                ),
            }),
        ),
        Some("start_failed") => (
            1,
            Some(format!(
                "exec {id} ended start_failed: the provider could not start its sandbox (a runtime must carry the C library; the provider's log says why: {data_dir}/logs/provider.log of the appliance); fix the runtime and run it again with lc exec create"
            )),
        ),
        Some(other) => (
            1,
            Some(format!(
                "exec {id} ended {other} without an exit status; lc exec show {id} tells more"
            )),
        ),
    }
}

/// Applies [`terminal_status`] to a terminal exec (`GET /v1/execs/{id}`)
/// and the signal of its terminal page when known: prints the line, if
/// any, on stderr and returns the status; its hints name `data_dir`
/// ([`Client::data_dir_text`]).
fn finish(exec: &Value, signal: Option<i64>, data_dir: &str) -> ExitCode {
    let id = exec["exec_id"].as_i64().unwrap_or(0);
    let (code, note) = terminal_status(
        id,
        exec["terminal_reason"].as_str(),
        exec["expired_by"].as_str(),
        exec["exit_code"].as_i64(),
        signal,
        data_dir,
    );
    if let Some(note) = note {
        let _ = writeln!(std::io::stderr(), "{note}");
    }
    ExitCode::from(code)
}

/// The most output requests made to find a terminal page's signal (64
/// pages each): an exec with more output than that gives no signal, and
/// `--wait` exits 1 for it.
pub const SIGNAL_SCAN_REQUESTS_MAX: u32 = 16_384;

/// The signal of the terminal page of exec `id` (already terminal), read
/// through its output within [`SIGNAL_SCAN_REQUESTS_MAX`] requests; `None`
/// when it has no terminal page or none with a signal.
async fn terminal_signal(client: &Client, id: i64) -> Result<Option<i64>, ClientError> {
    let mut after_seq = 0i64;
    for _ in 0..SIGNAL_SCAN_REQUESTS_MAX {
        let v = client
            .call(
                Method::GET,
                &format!(
                    "v1/execs/{id}/output?after_seq={after_seq}&limit={OUTPUT_PAGES_PER_REQUEST}"
                ),
                Body::None,
                None,
            )
            .await?;
        let pages = v["pages"].as_array().cloned().unwrap_or_default();
        if let Some(t) = pages.iter().find(|p| p["kind"] == "terminal") {
            return Ok(t["exit"]["signal"].as_i64());
        }
        let Some(next) = v["next_seq"].as_i64() else {
            return Ok(None);
        };
        if pages.is_empty() || v["terminal"] == true {
            return Ok(None);
        }
        after_seq = next - 1;
    }
    Ok(None)
}

/// The instant `wait_s` seconds from now on the monotonic clock.
///
/// # Errors
/// [`ClientError::Failed`] when it is not representable (clap bounds
/// `--wait-timeout-s` to [`args::WAIT_SECS_MAX`], so only a platform whose
/// clock cannot hold a year ahead gets it).
fn deadline_after(wait_s: u64) -> Result<tokio::time::Instant, ClientError> {
    tokio::time::Instant::now()
        .checked_add(Duration::from_secs(wait_s))
        .ok_or_else(|| {
            ClientError::Failed(format!(
                "--wait-timeout-s {wait_s} lies beyond this system's clock; give a smaller one"
            ))
        })
}

/// Polls `GET /v1/execs/{id}` until its state is `terminal` (the exec) or
/// `wait_s` passed (`None`).
async fn wait_terminal(
    client: &Client,
    id: i64,
    wait_s: u64,
) -> Result<Option<Value>, ClientError> {
    let deadline = deadline_after(wait_s)?;
    loop {
        let v = client
            .call(Method::GET, &format!("v1/execs/{id}"), Body::None, None)
            .await?;
        if v["state"] == "terminal" {
            return Ok(Some(v));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// What [`wait_exec`] waits for.
enum Until {
    /// The exec is `hibernated`.
    Hibernated,
    /// The exec runs again under the resume of this idempotency key (the
    /// request named `head`, or the workspace's head when `None`).
    Resumed { key: String, head: Option<String> },
}

/// `POST /v1/execs/{id}/resume` under the idempotency key `key` (from
/// `head`, or the workspace's head when `None`): the recorded request, also
/// on a replay of `key`, whose `refused` says why the provider could not
/// restore it.
async fn request_resume(
    client: &Client,
    id: i64,
    head: Option<&str>,
    key: &str,
) -> Result<serde_json::Value, ClientError> {
    let body = match head {
        Some(h) => Body::Json(json!({ "head": h })),
        None => Body::None,
    };
    client
        .call(
            Method::POST,
            &format!("v1/execs/{id}/resume"),
            body,
            Some(key),
        )
        .await
}

/// Polls `GET /v1/execs/{id}` every [`POLL_INTERVAL`] until `until` holds
/// (prints the exec, exit 0), the exec is terminal (prints it and a line
/// saying so, exit 1), or `wait_s` passed (a line, [`EXIT_TIMED_OUT`]).
async fn wait_exec(
    client: &Client,
    id: i64,
    wait_s: u64,
    json: bool,
    until: Until,
) -> Result<ExitCode, ClientError> {
    let deadline = deadline_after(wait_s)?;
    loop {
        let v = client
            .call(Method::GET, &format!("v1/execs/{id}"), Body::None, None)
            .await?;
        let done = match &until {
            Until::Hibernated => v["state"] == "hibernated",
            Until::Resumed { key, .. } => {
                v["state"] == "running" && v["resume"]["op_key"] == key.as_str()
            }
        };
        if done {
            output::record(&v, json, output::EXEC_FIELDS)?;
            return Ok(ExitCode::SUCCESS);
        }
        if v["state"] == "terminal" {
            output::record(&v, json, output::EXEC_FIELDS)?;
            let refusal = &v["hibernation"]["refusal"];
            let _ = if refusal.is_object() {
                writeln!(
                    std::io::stderr(),
                    "exec {id}: hibernation refused ({}) at {:?}: {}; the command was stopped and the exec ended {}; its workspace head did not move and its units are returned once its sandbox is destroyed; the provider's advice is for a new exec: keep such entries out of a workspace that hibernates",
                    refusal["reason"].as_str().unwrap_or("unknown"),
                    refusal["path"].as_str().unwrap_or(""),
                    refusal["message"].as_str().unwrap_or(""),
                    v["terminal_reason"].as_str().unwrap_or("without a reason")
                )
            } else {
                writeln!(
                    std::io::stderr(),
                    "exec {id} ended {} instead; lc exec show {id} tells more",
                    v["terminal_reason"].as_str().unwrap_or("without a reason")
                )
            };
            return Ok(ExitCode::from(1));
        }
        // A restore the provider refused ends this request for good: its
        // replay says so (the exec stays hibernated; a new request retries).
        if let Until::Resumed { key, head } = &until
            && v["state"] == "hibernated"
        {
            let r = request_resume(client, id, head.as_deref(), key).await?;
            if let Some(refused) = r.get("refused").filter(|x| x.is_object()) {
                let _ = writeln!(
                    std::io::stderr(),
                    "exec {id}: resume refused ({}): {}; the exec stays hibernated on its head; after fixing the cause, lc exec resume {id} again (a new request)",
                    refused["code"].as_str().unwrap_or("unknown"),
                    refused["message"].as_str().unwrap_or("")
                );
                return Ok(ExitCode::from(1));
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let what = match until {
                Until::Hibernated => "hibernated",
                Until::Resumed { .. } => "running again",
            };
            let _ = writeln!(
                std::io::stderr(),
                "exec {id}: not {what} after {wait_s} s (state {}); check that a gateway and the provider run (little-compute appliance status)",
                v["state"].as_str().unwrap_or("unknown")
            );
            return Ok(ExitCode::from(EXIT_TIMED_OUT));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// `exec output`: pages after `after_seq` in order, stdout bytes to
/// stdout exactly and (with `stderr`) stderr bytes to stderr, each seq
/// written once (a page at or below the last written seq is skipped, a gap
/// is an error; a stopped page, the end of a generation that hibernated,
/// is named on stderr and passed). With `follow`: until the terminal page
/// (past any stopped page, into the resumed generation's pages; or, for
/// an exec that ended without one, the answer's `terminal`), then the
/// status of
/// [`terminal_status`]; a dropped
/// connection or a server error is retried from the last written seq, from
/// [`POLL_INTERVAL`] doubling to [`UNREACHABLE_RETRY_MAX`] while it fails
/// in a row; both bounded by `wait_s` (then [`EXIT_TIMED_OUT`]).
async fn exec_output(
    client: &Client,
    id: i64,
    stderr: bool,
    follow: bool,
    mut after_seq: i64,
    wait_s: u64,
) -> Result<ExitCode, ClientError> {
    let deadline = deadline_after(wait_s)?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let timed_out = || {
        let _ = writeln!(
            std::io::stderr(),
            "exec {id}: no terminal page after {wait_s} s"
        );
        Ok(ExitCode::from(EXIT_TIMED_OUT))
    };
    let mut failures: u32 = 0;
    loop {
        let answer = client
            .call(
                Method::GET,
                &format!(
                    "v1/execs/{id}/output?after_seq={after_seq}&limit={OUTPUT_PAGES_PER_REQUEST}"
                ),
                Body::None,
                None,
            )
            .await;
        let v = match answer {
            Ok(v) => {
                failures = 0;
                v
            }
            Err(e) if follow && resumable(&e) => {
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return timed_out();
                }
                failures = failures.saturating_add(1);
                let wait = lc_core::rules::doubling_backoff(
                    failures,
                    POLL_INTERVAL,
                    UNREACHABLE_RETRY_MAX,
                )
                .min(deadline - now);
                let _ = writeln!(
                    std::io::stderr(),
                    "exec {id}: {e}; resuming after seq {after_seq} in {} ms",
                    wait.as_millis()
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let pages = v["pages"]
            .as_array()
            .ok_or_else(|| ClientError::Failed(format!("no pages in {v}")))?;
        let mut exit = None;
        for p in pages {
            let seq = p["seq"]
                .as_i64()
                .ok_or_else(|| ClientError::Failed(format!("a page without a seq in {v}")))?;
            if seq <= after_seq {
                continue;
            }
            if seq != after_seq + 1 {
                return Err(ClientError::Failed(format!(
                    "exec {id}: page {seq} follows page {after_seq}; the server skipped pages"
                )));
            }
            let data = p["data_b64"].as_str().unwrap_or("");
            let bytes = b64.decode(data).map_err(|e| {
                ClientError::Failed(format!("page {}: bad data_b64: {e}", p["seq"]))
            })?;
            let written = match p["kind"].as_str() {
                Some("stdout") => write_all(&mut std::io::stdout().lock(), &bytes),
                Some("stderr") if stderr => write_all(&mut std::io::stderr().lock(), &bytes),
                Some("terminal") => {
                    exit = Some(p["exit"].clone());
                    Ok(())
                }
                // Pages after a stopped page are a resumed run's; only
                // a stopped page with none after it is still waiting,
                // unless the exec ended after it (the answer's
                // `terminal`): nothing resumes it then.
                Some("stopped") => {
                    let text = if !std::ptr::eq(p, pages.last().unwrap_or(p)) {
                        format!(
                            "exec {id}: hibernated at page {seq}, then resumed: the pages after it are the resumed run's"
                        )
                    } else if v["terminal"] == true {
                        format!(
                            "exec {id}: its command was stopped at page {seq} for a hibernation, and the exec ended without resuming; lc exec show {id} tells why"
                        )
                    } else {
                        format!(
                            "exec {id}: hibernated at page {seq}: its command was stopped and its workspace kept; the output goes on after lc exec resume {id}"
                        )
                    };
                    let _ = writeln!(std::io::stderr(), "{text}");
                    Ok(())
                }
                _ => Ok(()),
            };
            if let Err(e) = written {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(ExitCode::SUCCESS);
                }
                return Err(ClientError::Failed(format!("writing output: {e}")));
            }
            after_seq = seq;
        }
        let next_seq = v["next_seq"]
            .as_i64()
            .ok_or_else(|| ClientError::Failed(format!("no next_seq in {v}")))?;
        let progressed = next_seq - 1 > after_seq || !pages.is_empty();
        if follow && (exit.is_some() || v["terminal"] == true) {
            // The exec's record says how it ended; the terminal page (when
            // there is one) adds the signal. A terminal page seen before
            // the record is terminal is a command that ended on its own.
            let exec = client
                .call(Method::GET, &format!("v1/execs/{id}"), Body::None, None)
                .await?;
            let page = exit.unwrap_or(Value::Null);
            let reason = exec["terminal_reason"].as_str();
            let data_dir = client.data_dir_text();
            let (code, note) = match reason {
                Some(_) => terminal_status(
                    id,
                    reason,
                    exec["expired_by"].as_str(),
                    exec["exit_code"].as_i64().or(page["code"].as_i64()),
                    page["signal"].as_i64(),
                    &data_dir,
                ),
                None => terminal_status(
                    id,
                    None,
                    None,
                    page["code"].as_i64(),
                    page["signal"].as_i64(),
                    &data_dir,
                ),
            };
            if let Some(note) = note {
                let _ = writeln!(std::io::stderr(), "{note}");
            }
            return Ok(ExitCode::from(code));
        }
        if v["terminal"] == true || (!follow && !progressed) {
            return Ok(ExitCode::SUCCESS);
        }
        if !progressed {
            if tokio::time::Instant::now() >= deadline {
                return timed_out();
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// The most bytes one `exec send` reads and sends: they are held in memory
/// at once, and 64 MiB is 1024 inputs, minutes of delivery at the input
/// queue's bound.
pub const SEND_BYTES_MAX: u64 = 64 << 20;

/// Pause before sending an input again while the exec's input queue is
/// full (the server's `Retry-After` for it).
pub const INPUT_QUEUE_PAUSE: Duration = Duration::from_secs(1);

/// The bytes `exec send` sends: `--data`, `--file`, or stdin (`-`), at most
/// [`SEND_BYTES_MAX`]; none with `--eof` alone.
fn send_bytes(
    stdin: Option<&str>,
    data: Option<String>,
    file: Option<&Path>,
    eof: bool,
) -> Result<Vec<u8>, ClientError> {
    use std::io::Read as _;
    let too_large = |what: &str| {
        ClientError::Failed(format!(
            "{what} holds more than {SEND_BYTES_MAX} bytes, the most one `lc exec send` sends; split it into several commands"
        ))
    };
    let bytes = match (stdin, data, file) {
        (Some("-"), None, None) => {
            let mut b = Vec::new();
            std::io::stdin()
                .lock()
                .take(SEND_BYTES_MAX + 1)
                .read_to_end(&mut b)
                .map_err(|e| ClientError::Failed(format!("reading stdin: {e}")))?;
            if b.len() as u64 > SEND_BYTES_MAX {
                return Err(too_large("stdin"));
            }
            b
        }
        (Some(other), _, _) => {
            return Err(ClientError::Failed(format!(
                "unexpected argument {other:?}: name the bytes with --data TEXT, --file PATH, or - for stdin"
            )));
        }
        (None, Some(d), None) => d.into_bytes(),
        (None, None, Some(path)) => {
            let fail = |e: std::io::Error| ClientError::Failed(format!("{}: {e}", path.display()));
            let len = std::fs::metadata(path).map_err(fail)?.len();
            if len > SEND_BYTES_MAX {
                return Err(too_large(&path.display().to_string()));
            }
            std::fs::read(path).map_err(fail)?
        }
        (None, None, None) if eof => Vec::new(),
        (None, None, None) => {
            return Err(ClientError::Failed(
                "nothing to send: name the bytes with --data TEXT, --file PATH or - for stdin, or close stdin with --eof alone".into(),
            ));
        }
        (None, Some(_), Some(_)) => {
            return Err(ClientError::Failed(
                "--data and --file both name the bytes; give one".into(),
            ));
        }
    };
    if bytes.is_empty() && !eof {
        return Err(ClientError::Failed(
            "nothing to send: the bytes are empty; add --eof to close stdin".into(),
        ));
    }
    Ok(bytes)
}

/// The idempotency key of input `n` (from 1) of one `exec send`:
/// `BASE-n`.
///
/// # Errors
/// [`ClientError::Failed`] when it would exceed the longest key the server
/// accepts.
pub fn input_key(base: &str, n: usize) -> Result<String, ClientError> {
    let key = format!("{base}-{n}");
    if key.len() > lc_core::opkey::OPERATION_KEY_BYTES_MAX {
        return Err(ClientError::Failed(format!(
            "--idempotency-key is too long to derive the input keys ({key:?} is over {} bytes); use a shorter one",
            lc_core::opkey::OPERATION_KEY_BYTES_MAX
        )));
    }
    Ok(key)
}

/// `exec send`: `bytes` in inputs of at most
/// [`lc_core::page::INPUT_BYTES_MAX`], in order, input `n` under
/// [`input_key`]`(base, n)`; `eof` on the last (an empty `eof` input when
/// there are no bytes). While the input queue is full the same input is
/// sent again after [`INPUT_QUEUE_PAUSE`], for at most `wait_s` (then
/// [`EXIT_TIMED_OUT`]). Any other failure names the base key to run the
/// command again with, which sends nothing twice.
#[allow(clippy::too_many_arguments)]
async fn exec_send(
    client: &Client,
    id: i64,
    bytes: &[u8],
    eof: bool,
    base: &str,
    key_given: bool,
    wait_s: u64,
    json: bool,
) -> Result<ExitCode, ClientError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let deadline = deadline_after(wait_s)?;
    let chunks: Vec<&[u8]> = if bytes.is_empty() {
        vec![&[]]
    } else {
        bytes.chunks(lc_core::page::INPUT_BYTES_MAX).collect()
    };
    let n = chunks.len();
    let again = |done: usize| {
        if key_given {
            format!(
                "{done} of {n} inputs were accepted; run the same command again to send the rest (nothing is sent twice)"
            )
        } else {
            format!(
                "{done} of {n} inputs were accepted; run the same command again with --idempotency-key {base} to send the rest (nothing is sent twice)"
            )
        }
    };
    let mut inputs = Vec::with_capacity(n);
    for (i, chunk) in chunks.iter().enumerate() {
        let key = input_key(base, i + 1)?;
        let body = json!({ "data_b64": b64.encode(chunk), "eof": eof && i + 1 == n });
        let v = loop {
            match client
                .call(
                    Method::POST,
                    &format!("v1/execs/{id}/input"),
                    Body::Json(body.clone()),
                    Some(&key),
                )
                .await
            {
                Ok(v) => break v,
                Err(ClientError::Problem(p)) if p.code == "input_queue_full" => {
                    if tokio::time::Instant::now() >= deadline {
                        let _ = writeln!(
                            std::io::stderr(),
                            "exec {id}: the input queue stayed full for {wait_s} s (is a gateway running?); {}",
                            again(i)
                        );
                        return Ok(ExitCode::from(EXIT_TIMED_OUT));
                    }
                    tokio::time::sleep(INPUT_QUEUE_PAUSE).await;
                }
                Err(e) if i > 0 || matches!(e, ClientError::Failed(_)) => {
                    return Err(ClientError::Failed(format!("{e}; {}", again(i))));
                }
                Err(e) => return Err(e),
            }
        };
        inputs.push(v);
    }
    output::list(
        &json!({ "inputs": inputs }),
        "inputs",
        json,
        output::INPUT_FIELDS,
    )?;
    Ok(ExitCode::SUCCESS)
}

/// Whether a failed output request is worth sending again from the same
/// seq: the connection failed, or the server answered 5xx.
fn resumable(e: &ClientError) -> bool {
    match e {
        ClientError::Failed(_) => true,
        ClientError::Problem(p) => p.status >= 500,
    }
}

fn write_all(w: &mut impl std::io::Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes)?;
    w.flush()
}

/// The tarball at `path`, or a directory packed as one (entries relative
/// to it, symlinks kept as symlinks).
fn tarball(path: &Path) -> Result<Vec<u8>, ClientError> {
    let fail = |e: std::io::Error| ClientError::Failed(format!("{}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(fail)?;
    if !meta.is_dir() {
        return std::fs::read(path).map_err(fail);
    }
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", path).map_err(fail)?;
    b.into_inner().map_err(fail)
}

/// `s` with every byte outside the URL-safe set percent-encoded.
fn percent_encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn query_escape(s: &str) -> String {
    percent_encode(s, b"-._~")
}

fn path_escape(s: &str) -> String {
    percent_encode(s, b"-._~")
}

/// `base`, with the page's query: `after_name=after` and `limit=limit`,
/// each only when given, in that order.
fn page_path(
    base: &str,
    (after_name, after): (&str, Option<i64>),
    limit: Option<impl std::fmt::Display>,
) -> String {
    let q: Vec<String> = after
        .map(|a| format!("{after_name}={a}"))
        .into_iter()
        .chain(limit.map(|l| format!("limit={l}")))
        .collect();
    if q.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", q.join("&"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_page_path_carries_only_the_given_bounds() {
        use super::page_path;
        assert_eq!(
            page_path("v1/execs", ("after", None), None::<u32>),
            "v1/execs"
        );
        assert_eq!(
            page_path("v1/claims", ("after_lease", Some(7)), None::<u32>),
            "v1/claims?after_lease=7"
        );
        assert_eq!(
            page_path("v1/tokens", ("after", None), Some(3)),
            "v1/tokens?limit=3"
        );
        assert_eq!(
            page_path("v1/execs/2/snapshots", ("after_seq", Some(-1)), Some(1000)),
            "v1/execs/2/snapshots?after_seq=-1&limit=1000"
        );
    }

    use super::*;

    #[test]
    fn one_status_rule_for_wait_and_follow() {
        assert_eq!(
            terminal_status(4, Some("exited"), None, Some(0), None, "DIR"),
            (0, None)
        );
        assert_eq!(
            terminal_status(4, Some("exited"), None, Some(3), None, "DIR"),
            (3, None)
        );
        assert_eq!(
            terminal_status(4, Some("exited"), None, Some(-1), None, "DIR"),
            (255, None)
        );
        assert_eq!(
            terminal_status(4, Some("exited"), None, None, Some(9), "DIR"),
            (137, None)
        );
        assert_eq!(
            terminal_status(4, None, None, None, Some(15), "DIR"),
            (143, None)
        );
        assert_eq!(
            terminal_status(4, None, None, Some(0), None, "DIR"),
            (0, None)
        );
        assert_eq!(
            terminal_status(4, Some("exited"), None, None, None, "DIR"),
            (
                1,
                Some(
                    "exec 4 ended without an exit status; its output is kept (lc exec output 4)"
                        .into()
                )
            )
        );
        // A cancel or an expiry that killed the command is not its exit.
        assert_eq!(
            terminal_status(4, Some("cancelled"), None, None, Some(9), "DIR"),
            (
                1,
                Some("exec 4 ended cancelled: it was cancelled before its command exited; the output it wrote is kept (lc exec output 4)".into())
            )
        );
        assert_eq!(
            terminal_status(4, Some("expired"), None, None, None, "DIR"),
            (
                1,
                Some("exec 4 ended expired: its Lease or its --timeout-ms ran out before its command exited (check that a worker and a gateway run: little-compute appliance status); the output it wrote is kept (lc exec output 4); run it again with lc exec create".into())
            )
        );
        // Why it expired, when the exec says.
        assert_eq!(
            terminal_status(4, Some("expired"), Some("timeout"), None, Some(9), "DIR"),
            (
                1,
                Some("exec 4 ended expired: its --timeout-ms passed before its command exited; the output it wrote is kept (lc exec output 4); run it again with a larger --timeout-ms (or none) with lc exec create".into())
            )
        );
        assert_eq!(
            terminal_status(4, Some("expired"), Some("lease"), None, None, "DIR"),
            (
                1,
                Some("exec 4 ended expired: its sandbox's Lease ran out unrenewed before its command exited: the sandbox was lost or stopped answering, or no worker renewed it (little-compute appliance status; the provider's log says whether the sandbox died: DIR/logs/provider.log of the appliance); the output it wrote is kept (lc exec output 4); run it again with lc exec create".into())
            )
        );
        // With the data directory known, the hint names it.
        assert_eq!(
            terminal_status(4, Some("start_failed"), None, None, None, "/var/lib/lc"),
            (
                1,
                Some("exec 4 ended start_failed: the provider could not start its sandbox (a runtime must carry the C library; the provider's log says why: /var/lib/lc/logs/provider.log of the appliance); fix the runtime and run it again with lc exec create".into())
            )
        );
        assert_eq!(
            terminal_status(4, Some("start_failed"), None, None, None, "DIR"),
            (
                1,
                Some("exec 4 ended start_failed: the provider could not start its sandbox (a runtime must carry the C library; the provider's log says why: DIR/logs/provider.log of the appliance); fix the runtime and run it again with lc exec create".into())
            )
        );
    }

    #[test]
    fn input_keys_derive_from_the_base_within_the_bound() {
        assert_eq!(input_key("k", 1).unwrap(), "k-1");
        assert_eq!(input_key("run.7", 12).unwrap(), "run.7-12");
        let base = "a".repeat(253);
        assert_eq!(input_key(&base, 9).unwrap().len(), 255);
        assert_eq!(
            input_key(&base, 10).unwrap_err().to_string(),
            format!(
                "--idempotency-key is too long to derive the input keys (\"{base}-10\" is over 255 bytes); use a shorter one"
            )
        );
    }

    #[test]
    fn token_ttls_are_a_number_and_one_unit() {
        for (text, ms) in [
            ("1ms", 1),
            ("500ms", 500),
            ("90s", 90_000),
            ("15m", 900_000),
            ("1h", 3_600_000),
            ("30d", 2_592_000_000),
        ] {
            assert_eq!(args::parse_ttl_ms(text), Ok(ms), "{text}");
        }
        for bad in [
            "",
            "1",
            "h",
            "0s",
            "1.5h",
            "-1s",
            "1y",
            "1 h",
            "18446744073709551615d",
        ] {
            assert!(args::parse_ttl_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn escapes() {
        assert_eq!(query_escape("a b&c"), "a%20b%26c");
        assert_eq!(path_escape("k/1?x"), "k%2F1%3Fx");
        assert_eq!(path_escape("run-1.2_x~"), "run-1.2_x~");
    }

    #[test]
    fn appliance_file_paths_are_relative_to_the_directory() {
        let dir = std::env::temp_dir().join(format!("lc-appliance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("appliance.json"),
            r#"{"url":"http://127.0.0.1:1","admin_token_file":"admin.token","pids":{"serve":1}}"#,
        )
        .unwrap();
        let a = read_appliance(&dir).expect("appliance");
        assert_eq!(a.url, "http://127.0.0.1:1");
        assert_eq!(a.admin_token_file, dir.join("admin.token"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
