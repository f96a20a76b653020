//! A small HTTP client for the CLI's client subcommands.
//!
//! Every call sends one request with `Authorization: Bearer <token>` and
//! returns the response's JSON, or the server's problem document as
//! [`ClientError::Problem`]. Each error says what to do next: a server
//! that does not answer names the URL tried and `--server`
//! (`TOLLGATE_SERVER`); a 401 or a 403 `forbidden` names `--token`
//! (`TOLLGATE_TOKEN`) and its aliases `--api-key` and `--capability`.

use std::time::Duration;

use serde_json::Value;

use tollgate_api::error::Problem;

/// Bound on one client request, connection included.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a 401 adds to the server's problem: which flag carries the
/// credential and which one each kind of route takes.
pub const CREDENTIAL_HINT: &str = "give the credential with --token (or TOLLGATE_TOKEN; aliases \
     --api-key and --capability): the admin token for account creation, deposits and admin \
     commands, the account's API key for its leases, the lease capability for renew, release \
     and show";

/// A failed client call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a problem; a 401 (no or an unknown
    /// credential) and a 403 `forbidden` (a credential of the wrong kind)
    /// also say how to give one ([`CREDENTIAL_HINT`]).
    #[error("{}", problem_text(.0))]
    Problem(Box<Problem>),
    /// `--server` is not an `http://HOST:PORT` URL (a usage error, exit 2).
    #[error(
        "--server {server:?} {reason}: give the service's base URL, e.g. http://127.0.0.1:8080 \
         (--server or TOLLGATE_SERVER)"
    )]
    BadServer {
        /// The value given.
        server: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The credential cannot be a bearer token: empty, or with a character
    /// outside printable ASCII (a usage error, exit 2). The value itself is
    /// not repeated.
    #[error(
        "--token (or TOLLGATE_TOKEN; aliases --api-key and --capability) {reason}: admin \
         tokens, API keys and capabilities are printable ASCII without spaces; copy it again \
         from the answer that issued it"
    )]
    BadToken {
        /// What is wrong with it.
        reason: String,
    },
    /// Nothing answered at the server's URL (refused, unresolvable host,
    /// timed out).
    #[error(
        "the server is unreachable at {url} ({reason}); start it (tollgate serve) or point \
         --server (or TOLLGATE_SERVER) at the running service"
    )]
    Unreachable {
        /// The URL tried.
        url: String,
        /// The innermost cause (`Connection refused (os error 111)`).
        reason: String,
    },
    /// The server answered something unexpected.
    #[error("{0}")]
    Transport(String),
}

fn problem_text(p: &Problem) -> String {
    let text = format!("{} {}: {}", p.status, p.code, p.detail);
    if p.status == 401 || p.code == "forbidden" {
        format!("{text}; {CREDENTIAL_HINT}")
    } else {
        text
    }
}

/// The innermost cause of `e`: reqwest's own text (`error sending request
/// for url (...)`) says nothing a user can act on.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// Whether `token` can be sent as `Authorization: Bearer <token>`: not
/// empty, every character printable ASCII other than a space.
///
/// # Errors
/// [`ClientError::BadToken`] naming the first offending character by its
/// position (1-based), not the token.
fn check_token(token: &str) -> Result<(), ClientError> {
    if token.is_empty() {
        return Err(ClientError::BadToken {
            reason: "is empty".into(),
        });
    }
    match token.chars().position(|c| !c.is_ascii_graphic()) {
        None => Ok(()),
        Some(i) => Err(ClientError::BadToken {
            reason: format!(
                "has a character that is not printable ASCII (character {} of {})",
                i + 1,
                token.chars().count()
            ),
        }),
    }
}

/// The client; see the module docs.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: url::Url,
    token: Option<String>,
}

impl Client {
    /// A client for the server at `server` (`http://HOST:PORT`).
    ///
    /// # Errors
    /// [`ClientError::BadServer`] for a value that is not an `http://` URL
    /// with a host (`localhost:8080` without the scheme included).
    pub fn new(server: &str, token: Option<String>) -> Result<Client, ClientError> {
        let bad = |reason: String| ClientError::BadServer {
            server: server.to_string(),
            reason,
        };
        let base = url::Url::parse(server).map_err(|e| bad(format!("is not a URL ({e})")))?;
        if base.scheme() != "http" {
            return Err(bad(format!(
                "must start with http:// (read as scheme {:?})",
                base.scheme()
            )));
        }
        if base.host_str().is_none_or(str::is_empty) {
            return Err(bad("has no host".into()));
        }
        if let Some(t) = &token {
            check_token(t)?;
        }
        let http = reqwest::Client::builder()
            .timeout(CLIENT_TIMEOUT)
            .build()
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Client { http, base, token })
    }

    /// Sends `method path` with an optional JSON body and extra headers.
    ///
    /// # Errors
    /// [`ClientError::Problem`] for an error response,
    /// [`ClientError::Unreachable`] when nothing answers at the URL,
    /// [`ClientError::Transport`] otherwise.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, ClientError> {
        let url = self
            .base
            .join(path)
            .map_err(|e| ClientError::Transport(format!("bad path {path:?}: {e}")))?;
        let mut req = self.http.request(method, url.clone());
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| {
            if e.is_connect() || e.is_timeout() {
                ClientError::Unreachable {
                    url: self.base.to_string(),
                    reason: root_cause(&e),
                }
            } else {
                ClientError::Transport(format!("{url}: {}", root_cause(&e)))
            }
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Transport(format!("{url}: {}", root_cause(&e))))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| ClientError::Transport(format!("{url}: response is not JSON: {e}")));
        }
        match serde_json::from_slice::<Problem>(&bytes) {
            Ok(p) => Err(ClientError::Problem(Box::new(p))),
            Err(_) => Err(ClientError::Transport(format!(
                "{url}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `--server` without `http://` is a usage error naming the flag.
    #[test]
    fn a_server_without_a_scheme_is_refused_with_what_to_give() {
        for (server, reason) in [
            (
                "localhost:8080",
                "must start with http:// (read as scheme \"localhost\")",
            ),
            (
                "127.0.0.1:8080",
                "is not a URL (relative URL without a base)",
            ),
            (
                "https://h:1",
                "must start with http:// (read as scheme \"https\")",
            ),
        ] {
            let e = Client::new(server, None).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "--server {server:?} {reason}: give the service's base URL, e.g. \
                     http://127.0.0.1:8080 (--server or TOLLGATE_SERVER)"
                )
            );
            assert!(matches!(e, ClientError::BadServer { .. }), "{server}");
        }
    }
}
