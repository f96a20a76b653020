//! A small HTTP client for the CLI's client subcommands.
//!
//! Every call sends one request with `Authorization: Bearer <token>` and
//! returns the response's JSON, or the server's problem document as
//! [`ClientError::Problem`].

use std::time::Duration;

use serde_json::Value;

use tollgate_api::error::Problem;

/// Bound on one client request, connection included.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A failed client call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a problem.
    #[error("{} {}: {}", .0.status, .0.code, .0.detail)]
    Problem(Box<Problem>),
    /// The server could not be reached or answered something unexpected.
    #[error("{0}")]
    Transport(String),
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
    /// [`ClientError::Transport`] for an unusable URL.
    pub fn new(server: &str, token: Option<String>) -> Result<Client, ClientError> {
        let base = url::Url::parse(server)
            .map_err(|e| ClientError::Transport(format!("--server {server:?}: {e}")))?;
        if base.scheme() != "http" {
            return Err(ClientError::Transport(format!(
                "--server must be an http:// URL, got {server:?}"
            )));
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
        let resp = req
            .send()
            .await
            .map_err(|e| ClientError::Transport(format!("{url}: {e}")))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Transport(format!("{url}: {e}")))?;
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
