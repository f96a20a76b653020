//! The responses the connection layer writes itself, outside the router:
//! the refusal over the connection bound, and the answers to a request
//! head the HTTP parser refused (malformed, target too long, head too
//! large). Each is the service's own problem response for a
//! [`Rejection`], rendered once at start-up, sent with `Connection:
//! close` and a fresh `Date`.

use std::time::SystemTime;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use crate::{ErrorCode, Rejection, ServiceState};

/// One prepared response: its head without `Date` and the blank line, and
/// its body.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    /// The status the service gave the rejection.
    pub(crate) status: StatusCode,
    /// The problem code the service gave it.
    pub(crate) code: &'static str,
    head: Vec<u8>,
    body: Vec<u8>,
}

impl Prepared {
    /// `rejection` as the service `S` answers it, with `Retry-After` when
    /// the rejection gives one, `Content-Length`, `Connection: close`.
    pub(crate) async fn of<S: ServiceState>(rejection: Rejection) -> Prepared {
        let retry_after_secs = rejection.retry_after_secs();
        let fallback_code = rejection.code();
        // Rendered once, not answered: the service's own log line for the
        // problem would say a request failed; the refusals are logged when
        // they happen ([`super::throttle::Logs`]).
        let resp =
            tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::new(), || {
                S::Error::from(rejection).into_response()
            });
        let code = resp
            .extensions()
            .get::<ErrorCode>()
            .map_or(fallback_code, |c| c.0);
        let (parts, body) = resp.into_parts();
        // A problem response's body is one buffer; a body that cannot be
        // read is sent empty rather than failing the start.
        let body = axum::body::to_bytes(body, usize::MAX)
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        let mut head = format!(
            "HTTP/1.1 {} {}\r\n",
            parts.status.as_str(),
            parts.status.canonical_reason().unwrap_or("")
        )
        .into_bytes();
        for (name, value) in &parts.headers {
            let set_here = [
                header::CONTENT_LENGTH,
                header::CONNECTION,
                header::DATE,
                header::RETRY_AFTER,
            ];
            if set_here.contains(name)
                && (name != header::RETRY_AFTER || retry_after_secs.is_some())
            {
                continue;
            }
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        if let Some(secs) = retry_after_secs {
            head.extend_from_slice(format!("retry-after: {secs}\r\n").as_bytes());
        }
        head.extend_from_slice(
            format!("content-length: {}\r\nconnection: close\r\n", body.len()).as_bytes(),
        );
        Prepared {
            status: parts.status,
            code,
            head,
            body,
        }
    }

    /// The whole response, dated `now`.
    pub(crate) fn bytes(&self, now: SystemTime) -> Vec<u8> {
        let date = httpdate::fmt_http_date(now);
        let mut out = Vec::with_capacity(self.head.len() + date.len() + 12 + self.body.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(date.as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(&self.body);
        out
    }
}

/// Every response the connection layer writes itself.
#[derive(Debug, Clone)]
pub(crate) struct Canned {
    /// Over the connection bound with no connection to close instead.
    pub(crate) too_many_connections: Prepared,
    /// The parser's 400: a malformed request line or header.
    malformed_request: Prepared,
    /// The parser's 414: a request target over its limit.
    uri_too_long: Prepared,
    /// The parser's 431: too many header fields or too many bytes.
    header_fields_too_large: Prepared,
}

impl Canned {
    /// The service `S`'s answers; `retry_after_secs` for the refusal over
    /// the bound.
    pub(crate) async fn of<S: ServiceState>(retry_after_secs: u64) -> Canned {
        Canned {
            too_many_connections: Prepared::of::<S>(Rejection::TooManyConnections {
                retry_after_secs,
            })
            .await,
            malformed_request: Prepared::of::<S>(Rejection::MalformedRequest).await,
            uri_too_long: Prepared::of::<S>(Rejection::UriTooLong).await,
            header_fields_too_large: Prepared::of::<S>(Rejection::HeaderFieldsTooLarge).await,
        }
    }

    /// The answer replacing the HTTP parser's own, bodiless one whose
    /// status line starts `written` (`HTTP/1.1 431 ...`); `None` for any
    /// other status (or bytes that are no status line), which is sent as
    /// the parser wrote it.
    pub(crate) fn replacing(&self, written: &[u8]) -> Option<&Prepared> {
        match parser_status(written)? {
            400 => Some(&self.malformed_request),
            414 => Some(&self.uri_too_long),
            431 => Some(&self.header_fields_too_large),
            _ => None,
        }
    }
}

/// The length of `HTTP/1.1 NNN`, all [`parser_status`] reads.
pub(crate) const STATUS_PREFIX_LEN: usize = 12;

/// The status of a response whose first bytes are `written`: `HTTP/1.x`,
/// a space and three digits; `None` otherwise.
fn parser_status(written: &[u8]) -> Option<u16> {
    let prefix = written.get(..STATUS_PREFIX_LEN)?;
    let digits = prefix.strip_prefix(b"HTTP/1.")?.get(2..)?;
    if prefix[8] != b' ' || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_statuses() {
        for (written, expected) in [
            (
                &b"HTTP/1.1 431 Request Header Fields Too Large\r\n"[..],
                Some(431),
            ),
            (b"HTTP/1.1 414 URI Too Long\r\n", Some(414)),
            (b"HTTP/1.0 400 Bad Request\r\n", Some(400)),
            (b"HTTP/1.1 400", Some(400)),
            (b"HTTP/1.1 40", None),
            (b"HTTP/2.0 400 ", None),
            (b"HTTP/1.1-400 ", None),
            (b"HTTP/1.1 4x0 ", None),
            (b"{\"status\":400}", None),
            (b"", None),
        ] {
            assert_eq!(
                parser_status(written),
                expected,
                "{}",
                String::from_utf8_lossy(written)
            );
        }
    }
}
