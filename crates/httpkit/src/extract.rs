//! Typed extractors: the body, the credential, the path id and the
//! idempotency key of a request, each refused as a [`Rejection`] converted
//! into the service's error ([`ServiceState::Error`]).
//!
//! Extractors run in the order of the handler's arguments, so a handler
//! states its refusal order in its signature: the path id (400), then the
//! credential (401, then the service's own 403 extractors), then any header,
//! then the body (415, 400, 422) last.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::{Rejection, ServiceState};

/// The request header carrying an idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// A path id (`account_id`, `lease_id`): a positive integer in `i64`'s
/// range written in canonical decimal (`1`, `42`; no sign, no leading
/// zero), else [`Rejection::InvalidPath`]. Ids are issued from 1, so `0`,
/// `-1`, `+1` and `01` are malformed, not missing: one id has one
/// spelling. For routes with exactly one path parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdPath(pub i64);

impl IdPath {
    /// The id of `parts`' path.
    ///
    /// # Errors
    /// [`Rejection::InvalidPath`] when the route has no single path
    /// parameter or it is not a canonical positive decimal in `i64`'s
    /// range ([`parse_id`]).
    pub async fn parse(parts: &mut Parts) -> Result<IdPath, Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, &())
            .await
            .map_err(|e| Rejection::InvalidPath(format!("invalid path parameter: {e}")))?;
        parse_id(&raw).map(IdPath).ok_or_else(|| {
            Rejection::InvalidPath(format!(
                "path id {raw:?} is not a positive integer in canonical decimal \
                 (1..=9223372036854775807, no sign or leading zero)"
            ))
        })
    }
}

/// `raw` as an id: ASCII digits, the first not `0`, at most
/// [`i64::MAX`]; `None` otherwise.
pub fn parse_id(raw: &str) -> Option<i64> {
    match raw.as_bytes() {
        [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => raw.parse().ok(),
        _ => None,
    }
}

impl<S: ServiceState> FromRequestParts<S> for IdPath {
    type Rejection = S::Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<IdPath, S::Error> {
        Ok(IdPath::parse(parts).await?)
    }
}

/// The token of the request's `Authorization: Bearer <token>` header.
///
/// # Errors
/// [`Rejection::Unauthenticated`] when the header is missing, repeated, not
/// `Bearer` (case-insensitive), empty, or not visible ASCII.
pub fn bearer(headers: &HeaderMap) -> Result<&str, Rejection> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or(Rejection::Unauthenticated)?;
    if values.next().is_some() {
        return Err(Rejection::Unauthenticated);
    }
    let value = value.to_str().map_err(|_| Rejection::Unauthenticated)?;
    let (scheme, token) = value.split_once(' ').ok_or(Rejection::Unauthenticated)?;
    let token = token.trim_start_matches(' ');
    if !scheme.eq_ignore_ascii_case("bearer")
        || token.is_empty()
        || !token.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(Rejection::Unauthenticated);
    }
    Ok(token)
}

/// The bearer credential ([`bearer`]), whatever it is: the service decides
/// what it authorizes.
#[derive(Clone, PartialEq, Eq)]
pub struct Bearer(pub String);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

impl<S: ServiceState> FromRequestParts<S> for Bearer {
    type Rejection = S::Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Bearer, S::Error> {
        Ok(Bearer(bearer(&parts.headers)?.to_string()))
    }
}

/// The `Idempotency-Key` header, if sent. Its content is the domain's to
/// judge: a non-ASCII value is passed on lossily decoded, to be refused
/// there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub Option<String>);

impl<S: ServiceState> FromRequestParts<S> for IdempotencyKey {
    type Rejection = S::Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<IdempotencyKey, S::Error> {
        let mut values = parts.headers.get_all(IDEMPOTENCY_KEY_HEADER).iter();
        let Some(v) = values.next() else {
            return Ok(IdempotencyKey(None));
        };
        if values.next().is_some() {
            return Err(
                Rejection::InvalidHeader("Idempotency-Key may be sent only once".into()).into(),
            );
        }
        Ok(IdempotencyKey(Some(
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        )))
    }
}

/// A required JSON object body of type `T`.
///
/// # Rejections
/// [`Rejection::PayloadTooLarge`] (413) over the service's limit,
/// [`Rejection::UnsupportedMediaType`] (415) for a non-empty body that is
/// not `application/json` (or `application/*+json`) in UTF-8 (no `charset`
/// or `charset=utf-8`),
/// [`Rejection::InvalidJson`] (400) for an empty body or bad syntax,
/// [`Rejection::InvalidBody`] (422) for JSON of the wrong shape (an array
/// for an object, unknown or missing fields, wrong types), naming the field
/// path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonBody<T>(pub T);

impl<S: ServiceState, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = S::Error;

    async fn from_request(req: Request, state: &S) -> Result<JsonBody<T>, S::Error> {
        match read_json::<S, T>(req, state).await? {
            Some(value) => Ok(JsonBody(value)),
            None => Err(Rejection::InvalidJson("a JSON request body is required".into()).into()),
        }
    }
}

/// An optional JSON object body: an empty body and `null` are both `None`.
/// Otherwise as [`JsonBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionalJsonBody<T>(pub Option<T>);

impl<S: ServiceState, T: DeserializeOwned> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = S::Error;

    async fn from_request(req: Request, state: &S) -> Result<OptionalJsonBody<T>, S::Error> {
        let value = read_json::<S, Option<T>>(req, state).await?;
        Ok(OptionalJsonBody(value.flatten()))
    }
}

/// Reads the body within the service's limit and parses it ([`parse_json`]).
async fn read_json<S: ServiceState, T: DeserializeOwned>(
    req: Request,
    state: &S,
) -> Result<Option<T>, Rejection> {
    let is_json = is_json_content_type(req.headers());
    let body = match Bytes::from_request(req, state).await {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(Rejection::PayloadTooLarge {
                limit_bytes: state.body_max_bytes(),
            });
        }
        Err(e) => {
            return Err(Rejection::InvalidJson(format!(
                "could not read the request body: {e}"
            )));
        }
    };
    parse_json(is_json, &body)
}

/// Whether the request's `Content-Type` is JSON: `application/json` or
/// `application/*+json` (case-insensitive), with no `charset` parameter or
/// only `charset=utf-8` (case-insensitive, quoted or not). JSON is UTF-8
/// (RFC 8259); a body declared in another charset would be read as UTF-8
/// anyway, so it is refused instead.
fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(ct) = ct.to_str() else { return false };
    let mut parts = ct.split(';');
    let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let is_json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    is_json
        && parts.all(|param| {
            let (name, value) = param.split_once('=').unwrap_or((param, ""));
            !name.trim().eq_ignore_ascii_case("charset") || {
                let value = value.trim();
                let value = value
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or(value);
                value.eq_ignore_ascii_case("utf-8")
            }
        })
}

/// Parses a body sent with a JSON content type (`is_json`) or not. An empty
/// body is `None` (the extractor decides whether that is allowed); a
/// non-empty one must be JSON.
fn parse_json<T: DeserializeOwned>(is_json: bool, body: &[u8]) -> Result<Option<T>, Rejection> {
    if body.is_empty() {
        return Ok(None);
    }
    if !is_json {
        return Err(Rejection::UnsupportedMediaType);
    }
    // serde accepts a JSON array for a struct (fields by position); request
    // bodies are objects only.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(Rejection::InvalidBody(
            "the request body must be a JSON object, not an array".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let message = with_integer_hint(inner.to_string());
                if path == "." {
                    Rejection::InvalidBody(message)
                } else {
                    Rejection::InvalidBody(format!("{path}: {message}"))
                }
            }
            _ => Rejection::InvalidJson(format!("request body is not valid JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| Rejection::InvalidJson(format!("request body is not valid JSON: {e}")))?;
    Ok(Some(value))
}

/// serde's `message` for a number that an integer field cannot take, with
/// what to write instead: a floating-point number (`1.5`, `1e20`: JSON
/// numbers with a fraction or an exponent) or an integer outside the
/// field's type. Every other message is returned as it is.
/// The hint goes before serde_json's position (` at line L column C`).
fn with_integer_hint(message: String) -> String {
    let integer_field = [", expected i", ", expected u"]
        .iter()
        .any(|p| message.contains(p));
    let hint = if !integer_field {
        return message;
    } else if message.starts_with("invalid type: floating point") {
        "write a whole number, without a fraction or an exponent"
    } else if message.starts_with("invalid value: integer") {
        "the number is outside the range of this field"
    } else {
        return message;
    };
    let (what, position) = message.split_at(message.rfind(" at line ").unwrap_or(message.len()));
    format!("{what}: {hint}{position}")
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn check_bearer(values: &[&str], expected: Option<&str>) {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                header::AUTHORIZATION,
                HeaderValue::from_str(v).expect("header"),
            );
        }
        assert_eq!(bearer(&h).ok(), expected, "{values:?}");
    }

    #[test]
    fn bearer_parsing() {
        check_bearer(&[], None);
        check_bearer(&["Bearer abc"], Some("abc"));
        check_bearer(&["bearer abc"], Some("abc"));
        check_bearer(&["BEARER  abc"], Some("abc"));
        check_bearer(&["Bearer"], None);
        check_bearer(&["Bearer "], None);
        check_bearer(&["Bearer a b"], None);
        check_bearer(&["Basic abc"], None);
        check_bearer(&["Bearer abc", "Bearer abc"], None);
        check_bearer(&["Bearer tga1.0f"], Some("tga1.0f"));
    }

    #[test]
    fn path_ids() {
        for (raw, expected) in [
            ("1", Some(1)),
            ("42", Some(42)),
            ("10", Some(10)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("99999999999999999999", None),
            ("0", None),
            ("00", None),
            ("01", None),
            ("+1", None),
            ("-1", None),
            ("-9223372036854775808", None),
            ("", None),
            (" 1", None),
            ("1 ", None),
            ("1.0", None),
            ("0x10", None),
            ("1e3", None),
            ("\u{0661}", None),
        ] {
            assert_eq!(parse_id(raw), expected, "{raw:?}");
        }
    }

    fn check_content_type(value: Option<&str>, expected: bool) {
        let mut h = HeaderMap::new();
        if let Some(v) = value {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(v).expect("header"),
            );
        }
        assert_eq!(is_json_content_type(&h), expected, "{value:?}");
    }

    #[test]
    fn json_content_types() {
        check_content_type(None, false);
        check_content_type(Some("application/json"), true);
        check_content_type(Some("Application/JSON; charset=utf-8"), true);
        check_content_type(Some("application/merge-patch+json"), true);
        check_content_type(Some("text/json"), false);
        check_content_type(Some("text/plain"), false);
        check_content_type(Some("application/jsonx"), false);
        check_content_type(Some("application/json;charset=UTF-8"), true);
        check_content_type(Some("application/json; charset=\"utf-8\""), true);
        check_content_type(Some("application/json; CHARSET=Utf-8 ; x=y"), true);
        check_content_type(Some("application/json; x=y"), true);
        check_content_type(Some("application/json; charset=utf-16"), false);
        check_content_type(Some("application/json; charset=UTF-16LE"), false);
        check_content_type(Some("application/json; charset=iso-8859-1"), false);
        check_content_type(Some("application/json; charset=utf8"), false);
        check_content_type(Some("application/json; charset="), false);
        check_content_type(Some("application/json; charset"), false);
        check_content_type(
            Some("application/json; charset=utf-8; charset=utf-16"),
            false,
        );
        check_content_type(Some("application/merge-patch+json; charset=utf-16"), false);
    }

    #[derive(Debug, PartialEq, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Units {
        units: i64,
    }

    #[test]
    fn parse_table() {
        let parse = |is_json: bool, body: &str| parse_json::<Units>(is_json, body.as_bytes());
        assert_eq!(parse(false, ""), Ok(None));
        assert_eq!(parse(true, r#"{"units":1}"#), Ok(Some(Units { units: 1 })));
        assert_eq!(
            parse(false, r#"{"units":1}"#),
            Err(Rejection::UnsupportedMediaType)
        );
        assert_eq!(
            parse(true, " [1]"),
            Err(Rejection::InvalidBody(
                "the request body must be a JSON object, not an array".into()
            ))
        );
        let code = |r: Result<Option<Units>, Rejection>| r.map_err(|e| e.code());
        assert_eq!(code(parse(true, "{")), Err("invalid_json"));
        assert_eq!(code(parse(true, r#"{"units":1} x"#)), Err("invalid_json"));
        assert_eq!(code(parse(true, r#"{"units":"1"}"#)), Err("invalid_body"));
        assert_eq!(
            code(parse(true, r#"{"units":1,"x":2}"#)),
            Err("invalid_body")
        );
        match parse(true, r#"{"units":"1"}"#) {
            Err(Rejection::InvalidBody(m)) => {
                assert!(m.starts_with("units: invalid type: string"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // A number an integer field cannot take says what to write.
        let detail = |body: &str| match parse(true, body) {
            Err(Rejection::InvalidBody(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            detail(r#"{"units":1e20}"#),
            "units: invalid type: floating point `1e+20`, expected i64: write a whole number, without a fraction or an exponent at line 1 column 13"
        );
        assert_eq!(
            detail(r#"{"units":2.5}"#),
            "units: invalid type: floating point `2.5`, expected i64: write a whole number, without a fraction or an exponent at line 1 column 12"
        );
        assert_eq!(
            detail(r#"{"units":9223372036854775808}"#),
            "units: invalid value: integer `9223372036854775808`, expected i64: the number is outside the range of this field at line 1 column 28"
        );
        // Other shapes keep serde's message.
        assert_eq!(
            detail(r#"{"units":true}"#),
            "units: invalid type: boolean `true`, expected i64 at line 1 column 13"
        );
        assert_eq!(
            parse_json::<Option<Units>>(true, b"null"),
            Ok(Some(None)),
            "null is a present, empty value"
        );
    }
}
