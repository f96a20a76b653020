//! The HTTP client of `lc`: one request per call with the credential, the
//! acting tenant and, on POSTs, the idempotency key; the response's JSON,
//! or the server's problem document as [`ClientError::Problem`]. A `503
//! time_uncertain` is retried after its `Retry-After`, a bounded number of
//! times ([`UNCERTAIN_ATTEMPTS_MAX`]).

use std::time::Duration;

use httpkit::Problem;
use serde_json::Value;

/// Bound on one request, connection and body included: a runtime tarball
/// of the server's largest accepted size uploads well within it over a
/// local link.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Bound on opening the connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a problem document.
    #[error("{} {}: {}", .0.status, .0.code, .0.detail)]
    Problem(Box<Problem>),
    /// The server could not be reached or answered something unexpected;
    /// or the command was used wrongly.
    #[error("{0}")]
    Failed(String),
}

/// Attempts of one call while the server answers `503 time_uncertain`:
/// the same request (with the same `Idempotency-Key`, so a retry can never
/// act twice) is sent again after its `Retry-After`, for about a minute
/// at most, so a script started while the cut becomes certain (right after
/// `appliance up`) proceeds instead of failing.
pub const UNCERTAIN_ATTEMPTS_MAX: u32 = 12;

/// The longest pause between two such attempts, seconds.
pub const UNCERTAIN_PAUSE_MAX_S: u64 = 5;

/// Whether a failed request may be sent again.
enum Retry {
    /// `503 time_uncertain`: after this many seconds.
    After(u64, Box<Problem>),
    /// Any other failure.
    No(ClientError),
}

/// A request body.
#[derive(Debug, Clone)]
pub enum Body {
    /// No body.
    None,
    /// A JSON body.
    Json(Value),
    /// Raw bytes with a content type.
    Raw(Vec<u8>, &'static str),
}

/// The client of one server with one credential.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: url::Url,
    token: Option<String>,
    tenant: Option<i64>,
    /// The appliance data directory `--data-dir` named, for the hints
    /// that point into it (`DIR` when none was named).
    data_dir: Option<std::path::PathBuf>,
}

impl Client {
    /// A client of `server` (`http://HOST:PORT`), sending `token` as the
    /// bearer credential and `tenant` as `Lc-Tenant`.
    ///
    /// # Errors
    /// [`ClientError::Failed`] for a URL that is not `http://`.
    pub fn new(
        server: &str,
        token: Option<String>,
        tenant: Option<i64>,
    ) -> Result<Client, ClientError> {
        let mut base = url::Url::parse(server)
            .map_err(|e| ClientError::Failed(format!("server URL {server:?}: {e}")))?;
        if base.scheme() != "http" {
            return Err(ClientError::Failed(format!(
                "the server URL must be http://HOST:PORT, got {server:?}"
            )));
        }
        if !base.path().ends_with('/') {
            let p = format!("{}/", base.path());
            base.set_path(&p);
        }
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| ClientError::Failed(e.to_string()))?;
        Ok(Client {
            http,
            base,
            token,
            tenant,
            data_dir: None,
        })
    }

    /// The same client, naming `dir` as the appliance data directory in
    /// its hints.
    pub fn with_data_dir(self, dir: Option<std::path::PathBuf>) -> Client {
        Client {
            data_dir: dir,
            ..self
        }
    }

    /// The appliance data directory as the hints write it: the one
    /// `--data-dir` named, else `DIR`.
    pub fn data_dir_text(&self) -> String {
        self.data_dir
            .as_deref()
            .map_or_else(|| "DIR".to_string(), |d| d.display().to_string())
    }

    /// Sends `method path` (relative, `v1/...`, query included) with
    /// `body`; an `Idempotency-Key` header when `idempotency_key` is given.
    ///
    /// # Errors
    /// [`ClientError::Problem`] for an error response with a problem
    /// document, [`ClientError::Failed`] for anything else that failed.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Body,
        idempotency_key: Option<&str>,
    ) -> Result<Value, ClientError> {
        let mut attempt = 1;
        loop {
            match self
                .call_once(method.clone(), path, body.clone(), idempotency_key)
                .await
            {
                Err(Retry::After(secs, p)) if attempt < UNCERTAIN_ATTEMPTS_MAX => {
                    let wait = Duration::from_secs(secs.clamp(1, UNCERTAIN_PAUSE_MAX_S));
                    let reason = p.reason.as_deref().unwrap_or("unknown");
                    eprintln!(
                        "the safe expiry cut is uncertain ({reason}); retrying in {} s",
                        wait.as_secs()
                    );
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(Retry::After(_, p)) => return Err(ClientError::Problem(p)),
                Err(Retry::No(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    /// One request; a `503 time_uncertain` answer as [`Retry::After`].
    async fn call_once(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Body,
        idempotency_key: Option<&str>,
    ) -> Result<Value, Retry> {
        let url = self
            .base
            .join(path)
            .map_err(|e| Retry::No(ClientError::Failed(format!("bad path {path:?}: {e}"))))?;
        let mut req = self.http.request(method, url.clone());
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(t) = self.tenant {
            req = req.header("Lc-Tenant", t.to_string());
        }
        if let Some(k) = idempotency_key {
            req = req.header("Idempotency-Key", k);
        }
        req = match body {
            Body::None => req,
            Body::Json(v) => req.json(&v),
            Body::Raw(bytes, content_type) => req
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes),
        };
        let fail = |m: String| Retry::No(ClientError::Failed(m));
        let resp = req
            .send()
            .await
            .map_err(|e| fail(self.unreachable(&url, &e)))?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| fail(format!("{url}: {e}")))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("{url}: response is not JSON: {e}")));
        }
        match serde_json::from_slice::<Problem>(&bytes) {
            Ok(p) if p.code == "time_uncertain" => {
                Err(Retry::After(retry_after.unwrap_or(1), Box::new(p)))
            }
            Ok(p) => Err(Retry::No(ClientError::Problem(Box::new(p)))),
            Err(_) => Err(fail(format!(
                "{url}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            ))),
        }
    }
}

/// Bound on one file download of `lc workspace download`, connection and
/// body included: the largest snapshot file (8 GiB) at about 30 MB/s.
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300 * 60);

impl Client {
    /// `GET path` (relative, `v1/...`) of raw bytes, written to `out` as
    /// they arrive; gives how many bytes were written and their SHA-256.
    /// The bytes are unverified here: the caller compares both with what
    /// it expects and discards `out` when they differ. Bounded by
    /// [`DOWNLOAD_TIMEOUT`].
    ///
    /// # Errors
    /// [`ClientError::Problem`] for an error response with a problem
    /// document, [`ClientError::Failed`] for anything else that failed
    /// (the connection, a body cut short, writing `out`).
    pub async fn download(
        &self,
        path: &str,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<(u64, [u8; 32]), ClientError> {
        use sha2::Digest as _;
        let url = self
            .base
            .join(path)
            .map_err(|e| ClientError::Failed(format!("bad path {path:?}: {e}")))?;
        let mut req = self
            .http
            .request(reqwest::Method::GET, url.clone())
            .timeout(DOWNLOAD_TIMEOUT);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(t) = self.tenant {
            req = req.header("Lc-Tenant", t.to_string());
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| ClientError::Failed(self.unreachable(&url, &e)))?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| ClientError::Failed(format!("{url}: {e}")))?;
            return Err(match serde_json::from_slice::<Problem>(&bytes) {
                Ok(p) => ClientError::Problem(Box::new(p)),
                Err(_) => ClientError::Failed(format!(
                    "{url}: HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes)
                )),
            });
        }
        let mut hasher = sha2::Sha256::new();
        let mut written: u64 = 0;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ClientError::Failed(format!("{url}: the body was cut short: {e}")))?
        {
            hasher.update(&chunk);
            out.write_all(&chunk)
                .map_err(|e| ClientError::Failed(format!("writing {path}: {e}")))?;
            written += chunk.len() as u64;
        }
        Ok((written, hasher.finalize().into()))
    }

    /// What a request that got no answer says: for a connection that
    /// could not be opened (or timed out), that the control plane is not
    /// reachable at the base URL and how to check; else the URL and the
    /// error.
    fn unreachable(&self, url: &url::Url, e: &reqwest::Error) -> String {
        if !e.is_connect() && !e.is_timeout() {
            return format!("{url}: {e}");
        }
        let cause = if e.is_timeout() {
            format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())
        } else {
            io_cause(e).unwrap_or_else(|| "the connection failed".into())
        };
        format!(
            "the control plane is not reachable at {} ({cause}); check that it runs (little-compute appliance status --data-dir {}) and that --server, LC_SERVER or --data-dir names it",
            self.base,
            self.data_dir_text()
        )
    }
}

/// The I/O error at the root of `e`, in words: `connection refused` for
/// the common case, else the error's own text.
fn io_cause(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return Some(match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
                _ => io.to_string(),
            });
        }
        source = s.source();
    }
    None
}

/// A fresh idempotency key: 128 random bits in the UUID text layout
/// (version 4, variant 1), `xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`.
///
/// # Errors
/// [`ClientError::Failed`] when the operating system's random source
/// fails.
pub fn fresh_idempotency_key() -> Result<String, ClientError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| ClientError::Failed(format!("random source: {e}")))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_fresh_and_shaped() {
        let a = fresh_idempotency_key().expect("key");
        let b = fresh_idempotency_key().expect("key");
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'), "{a}");
        assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "{a}");
    }
}
