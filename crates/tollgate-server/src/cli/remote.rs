//! The commands that go over HTTP, through [`crate::client`]: the client
//! subcommands (`account`, `lease`, `clock`) and the HTTP side of the
//! operator commands (`status`, `audit`, `reclaim` with `--server`).
//!
//! Each sends the request of its route and hands back the response; the
//! caller prints it.

use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::CliError;
use super::args::{AccountCmd, ClockCmd, LeaseCmd};
use super::dispatch::Reclaim;
use super::report;
use crate::client::Client;
use crate::config;
use tollgate_api::dto::{AuditView, ReclaimView, StatusView};

/// `account create|deposit|show`: the response of the account route.
///
/// # Errors
/// [`CliError::Client`]: an unusable `--server`, a transport failure or
/// the server's problem document.
pub(super) async fn account(cmd: AccountCmd) -> Result<Value, CliError> {
    Ok(match cmd {
        AccountCmd::Create { name, client } => {
            // The core's rule, checked before sending: a name the service
            // refuses (or a body over its limit) is a usage error here.
            tollgate::rules::check_account_name(&name)
                .map_err(|e| CliError::Usage(format!("--name: {e}")))?;
            client
                .client()?
                .call(
                    Method::POST,
                    "v1/accounts",
                    Some(&json!({"name": name})),
                    &[],
                )
                .await?
        }
        AccountCmd::Deposit {
            account_id,
            units,
            client,
        } => {
            client
                .client()?
                .call(
                    Method::POST,
                    &format!("v1/accounts/{account_id}/deposits"),
                    Some(&json!({"units": units})),
                    &[],
                )
                .await?
        }
        AccountCmd::Show { account_id, client } => {
            client
                .client()?
                .call(Method::GET, &format!("v1/accounts/{account_id}"), None, &[])
                .await?
        }
    })
}

/// `lease acquire|renew|release|show`: the response of the lease route.
///
/// # Errors
/// As [`account`].
pub(super) async fn lease(cmd: LeaseCmd) -> Result<Value, CliError> {
    Ok(match cmd {
        LeaseCmd::Acquire {
            account_id,
            units,
            ttl,
            idempotency_key,
            client,
        } => {
            let headers: Vec<(&str, &str)> = idempotency_key
                .as_deref()
                .map(|k| vec![("Idempotency-Key", k)])
                .unwrap_or_default();
            client
                .client()?
                .call(
                    Method::POST,
                    &format!("v1/accounts/{account_id}/leases"),
                    Some(&json!({"units": units, "ttl": ttl_arg(&ttl)?})),
                    &headers,
                )
                .await?
        }
        LeaseCmd::Renew {
            lease_id,
            ttl,
            client,
        } => {
            client
                .client()?
                .call(
                    Method::POST,
                    &format!("v1/leases/{lease_id}/renew"),
                    Some(&json!({"ttl": ttl_arg(&ttl)?})),
                    &[],
                )
                .await?
        }
        LeaseCmd::Release {
            lease_id,
            consumed,
            client,
        } => {
            let body = match consumed {
                Some(c) => json!({"consumed": c}),
                None => json!({}),
            };
            client
                .client()?
                .call(
                    Method::POST,
                    &format!("v1/leases/{lease_id}/release"),
                    Some(&body),
                    &[],
                )
                .await?
        }
        LeaseCmd::Show { lease_id, client } => {
            client
                .client()?
                .call(Method::GET, &format!("v1/leases/{lease_id}"), None, &[])
                .await?
        }
    })
}

/// `clock set`: the test clock's new instant.
///
/// # Errors
/// As [`account`].
pub(super) async fn clock(cmd: ClockCmd) -> Result<Value, CliError> {
    let ClockCmd::Set { now, client } = cmd;
    let now = tollgate_api::dto::parse_instant(now.trim())
        .map_err(|e| CliError::Usage(format!("clock set: {e}")))?;
    Ok(client
        .client()?
        .call(
            Method::PUT,
            "v1/admin/test-clock",
            Some(&json!({"now": now.to_string()})),
            &[],
        )
        .await?)
}

/// `status --server`: `GET /v1/admin/status`.
///
/// # Errors
/// As [`account`]; [`CliError::Failed`] for a response of another shape.
pub(super) async fn status(c: &Client) -> Result<StatusView, CliError> {
    from_value(c.call(Method::GET, "v1/admin/status", None, &[]).await?)
}

/// `audit --server`: `GET /v1/admin/audit`.
///
/// # Errors
/// As [`status`].
pub(super) async fn audit(c: &Client) -> Result<AuditView, CliError> {
    from_value(c.call(Method::GET, "v1/admin/audit", None, &[]).await?)
}

/// `reclaim --server`: `POST /v1/admin/reclaim` with `limit`, printing
/// each batch as JSON ([`report::JsonStyle`]); with `plan.interval`, again after each
/// pause (at once after a full batch) until `stop` turns true.
///
/// # Errors
/// As [`status`]; the first failed batch ends the loop.
pub(super) async fn reclaim(
    c: &Client,
    plan: Reclaim,
    mut stop: watch::Receiver<bool>,
) -> Result<(), CliError> {
    loop {
        let v: ReclaimView = from_value(
            c.call(
                Method::POST,
                "v1/admin/reclaim",
                Some(&json!({"limit": plan.limit})),
                &[],
            )
            .await?,
        )?;
        report::print_json(&v)?;
        let Some(interval) = plan.interval else {
            return Ok(());
        };
        if v.reclaimed.len() >= plan.limit {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    }
}

/// The `--ttl` of `lease acquire|renew`, checked before anything is sent:
/// a positive duration, ISO 8601 or friendly; sent in ISO 8601.
///
/// # Errors
/// [`CliError::Usage`] naming `--ttl` and the accepted forms.
fn ttl_arg(ttl: &str) -> Result<String, CliError> {
    let d =
        config::parse_duration(ttl, false).map_err(|e| CliError::Usage(format!("--ttl: {e}")))?;
    if !d.is_positive() {
        return Err(CliError::Usage(format!("--ttl must be positive, got {d}")));
    }
    Ok(d.to_string())
}

/// A JSON response read as `T`.
fn from_value<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, CliError> {
    serde_json::from_value(v).map_err(|e| CliError::Failed(format!("unexpected response: {e}")))
}
