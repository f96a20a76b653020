//! The JSON shapes of the HTTP API (field names are part of the contract).
//!
//! * Instants are RFC 3339 strings in UTC with `Z`, exact to the nanosecond
//!   on output (`2026-11-29T12:00:30.000000001Z`; as many fractional digits as
//!   needed, none when whole). On input any offset and 0 to 9 fractional
//!   digits are accepted (`2026-11-29T13:00:30.5+01:00`).
//! * Durations are ISO 8601 strings on output (`PT30.000000001S`); on input
//!   ISO 8601 or jiff's friendly format (`30s 1ns`, `1h`).
//! * Every instant and duration of a response also has a lossless
//!   companion named with `_ns`: integer nanoseconds as a decimal string
//!   (instants since the Unix epoch, `"1796000000034484123"`; durations
//!   `"30000000001"`), pattern `^-?[0-9]+$` in the OpenAPI document. A
//!   client whose date-time type holds microseconds (Python's `datetime`,
//!   what generated clients parse `format: date-time` into) loses the last
//!   three digits of the RFC 3339 form; the `_ns` string cannot be
//!   truncated, so programs should compute with it. `PUT
//!   /v1/admin/test-clock` takes either `now` or `now_ns`.
//! * Units, ids and fences are JSON integers. A value outside `i64` (or a
//!   fraction, or a string) is a 422 `invalid_body`, never wrapped or
//!   rounded; range rules (positive units, ...) are the core's.
//! * Request bodies reject unknown fields.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use tollgate::{
    Account, AuditReport, Balances, Grant, GrantPolicy, Lease, LeaseState, ReclaimReport, Renewal,
    Settlement, SuppliedTime,
};
use utoipa::ToSchema;

/// What a duration may look like, for messages.
pub const DURATION_EXAMPLES: &str = "e.g. PT30S, PT0.000000001S, 30s, 1h 30m or 250ms";

/// What an instant may look like, for messages.
pub const INSTANT_EXAMPLES: &str =
    "e.g. 2026-11-29T12:00:00Z or 2026-11-29T12:00:00.000000001+00:00";

/// Why `s` is not a duration, in the terms of whoever wrote it (a flag, a
/// configuration key or a JSON field prefixes its own name): the value and
/// the accepted forms ([`DURATION_EXAMPLES`]), not the parser's own text,
/// which speaks of its types. `allow_max` adds the keyword `max`.
pub fn not_a_duration(s: &str, allow_max: bool) -> String {
    let max = if allow_max { ", or max" } else { "" };
    format!("{s:?} is not an ISO 8601 or friendly duration: write {DURATION_EXAMPLES}{max}")
}

/// Parses a duration as every command line and configuration file of
/// Tollgate does: ISO 8601 or jiff's friendly format, surrounding spaces
/// ignored; with `allow_max` also the keyword `max` ([`SignedDuration::MAX`]).
///
/// # Errors
/// [`not_a_duration`]'s message.
pub fn parse_duration(s: &str, allow_max: bool) -> Result<SignedDuration, String> {
    let t = s.trim();
    if allow_max && t.eq_ignore_ascii_case("max") {
        return Ok(SignedDuration::MAX);
    }
    t.parse::<SignedDuration>()
        .map_err(|_| not_a_duration(s, allow_max))
}

/// Parses an RFC 3339 instant with any offset and 0 to 9 fractional
/// digits, as the JSON API and the command line read it.
///
/// # Errors
/// A message naming the value: not RFC 3339 at all (with
/// [`INSTANT_EXAMPLES`]), or well formed but outside the supported range
/// (`Timestamp::MIN` to `Timestamp::MAX`, which it names).
pub fn parse_instant(s: &str) -> Result<Timestamp, String> {
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    let well_formed = jiff::fmt::temporal::Pieces::parse(s)
        .is_ok_and(|p| p.time().is_some() && p.offset().is_some());
    if well_formed {
        Err(format!(
            "{s:?} is outside the supported range of instants, {} to {}",
            Timestamp::MIN,
            Timestamp::MAX
        ))
    } else {
        Err(format!(
            "{s:?} is not an RFC 3339 instant: write {INSTANT_EXAMPLES}"
        ))
    }
}

/// Serde for [`Timestamp`] as RFC 3339 (see the module docs).
pub mod ts {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes as RFC 3339 UTC with `Z`, nanosecond exact.
    pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(t)
    }

    /// Parses RFC 3339 with any offset.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_instant(&s).map_err(serde::de::Error::custom)
    }
}

/// Serde for `Option<Timestamp>` (`null` for `None`).
pub mod ts_opt {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes like [`super::ts`], or `null`.
    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(t),
            None => s.serialize_none(),
        }
    }

    /// Parses like [`super::ts`], or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => super::parse_instant(&s)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Serde for [`SignedDuration`]: ISO 8601 out, ISO 8601 or friendly in.
pub mod dur {
    use jiff::SignedDuration;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes as ISO 8601 (`PT30.000000001S`).
    pub fn serialize<S: Serializer>(d: &SignedDuration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(d)
    }

    /// Parses ISO 8601 or jiff's friendly format.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SignedDuration, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<SignedDuration>()
            .map_err(|_| serde::de::Error::custom(super::not_a_duration(&s, false)))
    }
}

/// Serde for `Option<SignedDuration>` (`null` for `None`).
pub mod dur_opt {
    use jiff::SignedDuration;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes like [`super::dur`], or `null`.
    pub fn serialize<S: Serializer>(d: &Option<SignedDuration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(d),
            None => s.serialize_none(),
        }
    }

    /// Parses like [`super::dur`], or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SignedDuration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => s
                .parse::<SignedDuration>()
                .map(Some)
                .map_err(|_| serde::de::Error::custom(super::not_a_duration(&s, false))),
        }
    }
}

/// Serde for the lossless companion of a [`Timestamp`]: integer
/// nanoseconds since the Unix epoch as a decimal string.
pub mod ts_ns {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes as `"1796000000034484123"` (negative before 1970).
    pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&t.as_nanosecond())
    }

    /// Parses a decimal string of nanoseconds since the Unix epoch.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(serde::de::Error::custom)
    }

    /// `s` as nanoseconds since the Unix epoch, or why not.
    pub(crate) fn parse(s: &str) -> Result<Timestamp, String> {
        super::decimal(s)
            .and_then(|ns| Timestamp::from_nanosecond(ns).ok())
            .ok_or_else(|| {
                format!(
                    "invalid instant in nanoseconds {s:?}: expected a decimal integer of nanoseconds since 1970-01-01T00:00:00Z within the years -9999..=9999"
                )
            })
    }
}

/// Serde for `Option<Timestamp>` as [`ts_ns`] (`null` for `None`).
pub mod ts_ns_opt {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes like [`super::ts_ns`], or `null`.
    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(&t.as_nanosecond()),
            None => s.serialize_none(),
        }
    }

    /// Parses like [`super::ts_ns`], or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => super::ts_ns::parse(&s)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Serde for the lossless companion of a [`SignedDuration`]: integer
/// nanoseconds as a decimal string.
pub mod dur_ns {
    use jiff::SignedDuration;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes as `"30000000001"`.
    pub fn serialize<S: Serializer>(d: &SignedDuration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&d.as_nanos())
    }

    /// Parses a decimal string of nanoseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SignedDuration, D::Error> {
        let s = String::deserialize(d)?;
        parse(&s).map_err(serde::de::Error::custom)
    }

    /// `s` as nanoseconds, or why not.
    pub(crate) fn parse(s: &str) -> Result<SignedDuration, String> {
        super::decimal(s)
            .and_then(SignedDuration::try_from_nanos_i128)
            .ok_or_else(|| {
                format!("invalid duration in nanoseconds {s:?}: expected a decimal integer of nanoseconds")
            })
    }
}

/// Serde for `Option<SignedDuration>` as [`dur_ns`] (`null` for `None`).
pub mod dur_ns_opt {
    use jiff::SignedDuration;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes like [`super::dur_ns`], or `null`.
    pub fn serialize<S: Serializer>(d: &Option<SignedDuration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(&d.as_nanos()),
            None => s.serialize_none(),
        }
    }

    /// Parses like [`super::dur_ns`], or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SignedDuration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => super::dur_ns::parse(&s)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// The pattern of every `_ns` companion in the OpenAPI document.
pub const NS_PATTERN: &str = "^-?[0-9]+$";

/// `s` as a decimal integer matching [`NS_PATTERN`] (at most 40 digits, so
/// parsing is bounded), or `None`.
fn decimal(s: &str) -> Option<i128> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || digits.len() > 40 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Schema of integers that may exceed `i64` (sums across accounts).
fn big_integer() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Integer)
        .description(Some(
            "An exact integer; sums across accounts may exceed the 64-bit range.",
        ))
        .build()
}

// ---------------------------------------------------------------- requests

/// `POST /v1/accounts`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAccountBody {
    /// Human-readable name (1..=200 characters, no control characters).
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
}

/// `POST /v1/accounts/{account_id}/deposits`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DepositBody {
    /// Units to deposit, `1..=9223372036854775807`.
    #[schema(minimum = 1)]
    pub units: i64,
}

/// `POST /v1/accounts/{account_id}/leases`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// Units to hold, `1..=9223372036854775807`.
    #[schema(minimum = 1)]
    pub units: i64,
    /// Requested TTL (positive; clamped to `max_ttl`), e.g. `PT30.000000001S`.
    #[serde(with = "dur")]
    #[schema(value_type = String, min_length = 1, example = "PT30.000000001S")]
    pub ttl: SignedDuration,
}

/// `POST /v1/leases/{lease_id}/renew`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// Requested TTL from now (positive; clamped to `max_ttl`). A renewal
    /// never shortens a lease.
    #[serde(with = "dur")]
    #[schema(value_type = String, min_length = 1, example = "PT30S")]
    pub ttl: SignedDuration,
}

/// `POST /v1/leases/{lease_id}/release` (the body is optional).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// Units to charge, `0..=units`; default: all of the lease's units.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub consumed: Option<i64>,
}

/// One lease named by a consolidation.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRef {
    /// The lease.
    pub lease_id: i64,
    /// Its capability.
    pub capability: String,
}

/// A list whose elements must be JSON objects (serde would otherwise
/// accept `[id, capability]` arrays for a struct).
fn objects<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let items = Vec::<serde_json::Map<String, serde_json::Value>>::deserialize(d)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            serde_json::from_value(serde_json::Value::Object(m))
                .map_err(|e| serde::de::Error::custom(format!("[{i}]: {e}")))
        })
        .collect()
}

/// `POST /v1/accounts/{account_id}/consolidations`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsolidateBody {
    /// The active leases of this account to settle into one (1..=1000,
    /// distinct).
    #[schema(min_items = 1, max_items = 1000)]
    #[serde(deserialize_with = "objects")]
    pub leases: Vec<LeaseRef>,
    /// Requested TTL of the new lease.
    #[serde(with = "dur")]
    #[schema(value_type = String, min_length = 1, example = "PT60S")]
    pub ttl: SignedDuration,
}

/// `POST /v1/admin/reclaim` (the body is optional).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReclaimBody {
    /// Most leases to settle in this batch (`1..=10000`); default: the
    /// configured `reclaim_batch`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 10000)]
    pub limit: Option<usize>,
}

/// `PUT /v1/admin/test-clock`: exactly one of `now` and `now_ns`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestClockBody {
    /// The instant the test clock stands at from now on (RFC 3339).
    #[serde(with = "ts_opt", default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime, example = "2026-11-29T12:00:00.000000001Z")]
    pub now: Option<Timestamp>,
    /// The same instant as integer nanoseconds since the Unix epoch, a
    /// decimal string (lossless where a client's date-time type is not).
    #[serde(with = "ts_ns_opt", default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$", example = "1796040000000000001")]
    pub now_ns: Option<Timestamp>,
}

impl TestClockBody {
    /// The instant the body names.
    ///
    /// # Errors
    /// A message for `invalid_body` when neither or both of `now` and
    /// `now_ns` are given (both, even when equal: one field, one meaning).
    pub fn instant(&self) -> Result<Timestamp, String> {
        match (self.now, self.now_ns) {
            (Some(t), None) | (None, Some(t)) => Ok(t),
            (None, None) => Err("give the instant as `now` (RFC 3339) or `now_ns` (nanoseconds since the Unix epoch)".into()),
            (Some(_), Some(_)) => Err("give `now` or `now_ns`, not both".into()),
        }
    }
}

// --------------------------------------------------------------- responses

/// A new account and its API key (shown only here, never again).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedAccount {
    /// The account's identity.
    pub account_id: i64,
    /// Its name.
    pub name: String,
    /// The account's API key (`tga1.` + 64 hex digits). Only its SHA-256
    /// digest is stored.
    pub api_key: String,
}

/// An account's balances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BalancesView {
    /// Units ever deposited.
    pub deposited: i64,
    /// Units free to be acquired.
    pub available: i64,
    /// Units held by active leases.
    pub held: i64,
    /// Units charged by settlements.
    pub consumed: i64,
}

impl From<Balances> for BalancesView {
    fn from(b: Balances) -> BalancesView {
        BalancesView {
            deposited: b.deposited,
            available: b.available,
            held: b.held,
            consumed: b.consumed,
        }
    }
}

/// An account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AccountView {
    /// The account's identity.
    pub account_id: i64,
    /// Its name.
    pub name: String,
    /// Units ever deposited.
    pub deposited: i64,
    /// Units free to be acquired.
    pub available: i64,
    /// Units held by active leases.
    pub held: i64,
    /// Units charged by settlements.
    pub consumed: i64,
}

impl From<Account> for AccountView {
    fn from(a: Account) -> AccountView {
        AccountView {
            account_id: a.account_id.0,
            name: a.name,
            deposited: a.balances.deposited,
            available: a.balances.available,
            held: a.balances.held,
            consumed: a.balances.consumed,
        }
    }
}

/// A new lease: everything its holder needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GrantView {
    /// The lease.
    pub lease_id: i64,
    /// The secret that authorizes operations on the lease (`tgc1.` ...).
    pub capability: String,
    /// The fencing token issued with this grant.
    pub fence: i64,
    /// Units held.
    pub units: i64,
    /// Exact expiry, on the server's clock: the grant base (the supplied
    /// time, on the safe expiry cut the cut plus its staleness bound) plus
    /// `granted_ttl`. Do not compare it with a local clock; use
    /// `expires_in`.
    #[serde(with = "ts")]
    #[schema(value_type = String, format = DateTime)]
    pub expiry: Timestamp,
    /// `expiry` as integer nanoseconds since the Unix epoch, a decimal
    /// string: exact in every client (use it, not `expiry`, to compute).
    #[serde(with = "ts_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "1796000000034484123")]
    pub expiry_ns: Timestamp,
    /// The TTL after clamping to `max_ttl` (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub granted_ttl: SignedDuration,
    /// `granted_ttl` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "30000000001")]
    pub granted_ttl_ns: SignedDuration,
    /// The TTL the request asked for (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub requested_ttl: SignedDuration,
    /// `requested_ttl` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "30000000001")]
    pub requested_ttl_ns: SignedDuration,
    /// `true` when `max_ttl` clamped the request: `granted_ttl` is then
    /// `max_ttl`, less than `requested_ttl`.
    pub ttl_clamped: bool,
    /// The time the holder is guaranteed from when the service received
    /// this request, before the reclaim grace: `expiry` minus this
    /// request's grant base (ISO 8601, never negative). The lease is never
    /// reclaimed, nor refused as `lease_reclaimable`, before
    /// `expires_in + reclaim_grace` of real time has passed since the
    /// request was sent. `granted_ttl` for a new grant; less for a replay
    /// of a recorded idempotency key.
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub expires_in: SignedDuration,
    /// `expires_in` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "30000000001")]
    pub expires_in_ns: SignedDuration,
}

impl GrantView {
    /// The view of `g` granted (or replayed) at supplied time `at` for a
    /// request that asked for `requested_ttl`.
    pub fn new(g: Grant, at: SuppliedTime, requested_ttl: SignedDuration) -> GrantView {
        let expires_in = at.remaining(g.expiry);
        GrantView {
            expires_in,
            expires_in_ns: expires_in,
            lease_id: g.lease_id.0,
            capability: g.capability.expose().to_string(),
            fence: g.fence.0,
            units: g.units,
            expiry: g.expiry,
            expiry_ns: g.expiry,
            granted_ttl: g.granted_ttl,
            granted_ttl_ns: g.granted_ttl,
            requested_ttl,
            requested_ttl_ns: requested_ttl,
            ttl_clamped: g.granted_ttl < requested_ttl,
        }
    }
}

/// A lease's life-cycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStateView {
    /// Holding units until expiry.
    Active,
    /// Settled by its holder.
    Released,
    /// Settled by reclaim, charging all units.
    Reclaimed,
    /// Settled into a consolidation.
    Consolidated,
}

impl From<LeaseState> for LeaseStateView {
    fn from(s: LeaseState) -> LeaseStateView {
        match s {
            LeaseState::Active => LeaseStateView::Active,
            LeaseState::Released => LeaseStateView::Released,
            LeaseState::Reclaimed => LeaseStateView::Reclaimed,
            LeaseState::Consolidated => LeaseStateView::Consolidated,
        }
    }
}

/// A lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LeaseView {
    /// The lease.
    pub lease_id: i64,
    /// The account it holds units of.
    pub account_id: i64,
    /// Life-cycle state.
    pub state: LeaseStateView,
    /// Units held.
    pub units: i64,
    /// The latest fence issued to this lease.
    pub fence: i64,
    /// The exact expiry (for a legacy lease: the latest instant consistent
    /// with its stored microseconds).
    #[serde(with = "ts")]
    #[schema(value_type = String, format = DateTime)]
    pub expiry: Timestamp,
    /// `expiry` as integer nanoseconds since the Unix epoch, a decimal
    /// string: exact in every client.
    #[serde(with = "ts_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "1796000000034484123")]
    pub expiry_ns: Timestamp,
    /// `true` only for a lease written before the exact-instant schema, whose
    /// expiry is a conservative upper bound.
    pub expiry_is_upper_bound: bool,
    /// Units charged at settlement; `null` while active.
    pub consumed: Option<i64>,
    /// For an active lease, the time its holder is still guaranteed from
    /// when the service received this request, before the reclaim grace:
    /// `expiry` minus this request's grant base (ISO 8601, zero once that
    /// is negative). `null` for a settled lease, or when the server's clock
    /// could not be read.
    #[serde(with = "dur_opt", default)]
    #[schema(value_type = Option<String>)]
    pub expires_in: Option<SignedDuration>,
    /// `expires_in` in nanoseconds, a decimal string (`null` like it).
    #[serde(with = "dur_ns_opt", default)]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$", example = "30000000001")]
    pub expires_in_ns: Option<SignedDuration>,
}

impl LeaseView {
    /// The view of `l` read at supplied time `at` (`None`: the clock could
    /// not be read).
    pub fn new(l: Lease, at: Option<SuppliedTime>) -> LeaseView {
        let expires_in = at
            .filter(|_| l.state == LeaseState::Active)
            .map(|at| at.remaining(l.expiry));
        LeaseView {
            expires_in,
            expires_in_ns: expires_in,
            lease_id: l.lease_id.0,
            account_id: l.account_id.0,
            state: l.state.into(),
            units: l.units,
            fence: l.fence.0,
            expiry: l.expiry,
            expiry_ns: l.expiry,
            expiry_is_upper_bound: l.expiry_is_upper_bound,
            consumed: l.consumed,
        }
    }
}

/// A renewed lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RenewalView {
    /// The lease.
    pub lease_id: i64,
    /// The account it holds units of.
    pub account_id: i64,
    /// Life-cycle state (`active`).
    pub state: LeaseStateView,
    /// Units held.
    pub units: i64,
    /// The new fence.
    pub fence: i64,
    /// The new expiry, on the server's clock: the later of the old one and
    /// the grant base plus `granted_ttl`. Do not compare it with a local
    /// clock; use `expires_in`.
    #[serde(with = "ts")]
    #[schema(value_type = String, format = DateTime)]
    pub expiry: Timestamp,
    /// `expiry` as integer nanoseconds since the Unix epoch, a decimal
    /// string: exact in every client.
    #[serde(with = "ts_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "1796000000034484123")]
    pub expiry_ns: Timestamp,
    /// Whether this renewal moved the expiry later. `false`: the lease
    /// already ran at least as long as the grant base plus `granted_ttl`,
    /// so its expiry is unchanged (a renewal never shortens a lease; the
    /// fence is new either way).
    pub extended: bool,
    /// See [`LeaseView::expiry_is_upper_bound`].
    pub expiry_is_upper_bound: bool,
    /// The requested TTL after clamping to `max_ttl` (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub granted_ttl: SignedDuration,
    /// `granted_ttl` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "30000000000")]
    pub granted_ttl_ns: SignedDuration,
    /// The TTL the request asked for (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub requested_ttl: SignedDuration,
    /// `requested_ttl` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "30000000000")]
    pub requested_ttl_ns: SignedDuration,
    /// `true` when `max_ttl` clamped the request: `granted_ttl` is then
    /// `max_ttl`, less than `requested_ttl`.
    pub ttl_clamped: bool,
    /// The time the holder is guaranteed from when the service received
    /// this request, before the reclaim grace: `expiry` minus this
    /// request's grant base (ISO 8601; at least `granted_ttl`, more when
    /// the expiry was not extended).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub expires_in: SignedDuration,
    /// `expires_in` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "30000000000")]
    pub expires_in_ns: SignedDuration,
}

impl RenewalView {
    /// The view of `r` renewed at supplied time `at` for a request that
    /// asked for `requested_ttl`.
    pub fn new(r: Renewal, at: SuppliedTime, requested_ttl: SignedDuration) -> RenewalView {
        let expires_in = at.remaining(r.lease.expiry);
        RenewalView {
            expires_in,
            expires_in_ns: expires_in,
            lease_id: r.lease.lease_id.0,
            account_id: r.lease.account_id.0,
            state: r.lease.state.into(),
            units: r.lease.units,
            fence: r.lease.fence.0,
            expiry: r.lease.expiry,
            expiry_ns: r.lease.expiry,
            extended: r.extended,
            expiry_is_upper_bound: r.lease.expiry_is_upper_bound,
            granted_ttl: r.granted_ttl,
            granted_ttl_ns: r.granted_ttl,
            requested_ttl,
            requested_ttl_ns: requested_ttl,
            ttl_clamped: r.granted_ttl < requested_ttl,
        }
    }
}

/// The terminal accounting of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SettlementView {
    /// The settled lease.
    pub lease_id: i64,
    /// Its account.
    pub account_id: i64,
    /// How it settled.
    pub state: LeaseStateView,
    /// Units the lease held.
    pub units: i64,
    /// Units charged.
    pub consumed: i64,
    /// Units returned to `available`.
    pub returned: i64,
    /// The supplied time of the settlement.
    #[serde(with = "ts")]
    #[schema(value_type = String, format = DateTime)]
    pub settled_at: Timestamp,
    /// `settled_at` as integer nanoseconds since the Unix epoch, a decimal
    /// string.
    #[serde(with = "ts_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$", example = "1796000000034484123")]
    pub settled_at_ns: Timestamp,
    /// The account's balances afterwards.
    pub balances: BalancesView,
}

impl From<Settlement> for SettlementView {
    fn from(s: Settlement) -> SettlementView {
        SettlementView {
            lease_id: s.lease_id.0,
            account_id: s.account_id.0,
            state: s.state.into(),
            units: s.units,
            consumed: s.consumed,
            returned: s.returned,
            settled_at: s.settled_at,
            settled_at_ns: s.settled_at,
            balances: s.balances.into(),
        }
    }
}

/// What one reclaim batch settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReclaimView {
    /// Leases settled as reclaimed, in settlement order.
    pub reclaimed: Vec<i64>,
    /// `now - reclaim_grace`: leases with expiry at or before it were due;
    /// `null` when that underflows (nothing can be due).
    #[serde(with = "ts_opt")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub cutoff: Option<Timestamp>,
    /// `cutoff` as integer nanoseconds since the Unix epoch, a decimal
    /// string (`null` like it).
    #[serde(with = "ts_ns_opt")]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$")]
    pub cutoff_ns: Option<Timestamp>,
    /// Units charged in total.
    #[schema(schema_with = big_integer)]
    pub units_charged: i128,
    /// The supplied time of the batch.
    #[serde(with = "ts")]
    #[schema(value_type = String, format = DateTime)]
    pub now: Timestamp,
    /// `now` as integer nanoseconds since the Unix epoch, a decimal string.
    #[serde(with = "ts_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$")]
    pub now_ns: Timestamp,
}

impl ReclaimView {
    /// The view of `r`, run at `now`.
    pub fn new(r: ReclaimReport, now: Timestamp) -> ReclaimView {
        ReclaimView {
            reclaimed: r.reclaimed.iter().map(|l| l.0).collect(),
            cutoff: r.cutoff,
            cutoff_ns: r.cutoff,
            units_charged: r.units_charged,
            now,
            now_ns: now,
        }
    }
}

/// One broken rule found by the audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ViolationView {
    /// The account concerned.
    pub account_id: i64,
    /// The ledger entry at fault, if any.
    pub seq: Option<i64>,
    /// What is wrong.
    pub detail: String,
}

/// The conservation audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditView {
    /// `true` when no violation was found.
    pub clean: bool,
    /// Accounts compared with the ledger.
    pub accounts_checked: u64,
    /// Ledger entries replayed.
    pub entries_checked: u64,
    /// Sum of `deposited` over all accounts.
    #[schema(schema_with = big_integer)]
    pub total_deposited: i128,
    /// Sum of `available`.
    #[schema(schema_with = big_integer)]
    pub total_available: i128,
    /// Sum of `held`.
    #[schema(schema_with = big_integer)]
    pub total_held: i128,
    /// Sum of `consumed`.
    #[schema(schema_with = big_integer)]
    pub total_consumed: i128,
    /// Every violation, naming its account.
    pub violations: Vec<ViolationView>,
}

impl From<AuditReport> for AuditView {
    fn from(r: AuditReport) -> AuditView {
        AuditView {
            clean: r.is_clean(),
            accounts_checked: r.accounts_checked,
            entries_checked: r.entries_checked,
            total_deposited: r.total_deposited,
            total_available: r.total_available,
            total_held: r.total_held,
            total_consumed: r.total_consumed,
            violations: r
                .violations
                .into_iter()
                .map(|v| ViolationView {
                    account_id: v.account_id.0,
                    seq: v.seq,
                    detail: v.detail,
                })
                .collect(),
        }
    }
}

/// The test clock's instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClockView {
    /// The instant the clock stands at.
    #[serde(with = "ts")]
    #[schema(value_type = String, format = DateTime)]
    pub now: Timestamp,
    /// `now` as integer nanoseconds since the Unix epoch, a decimal string.
    #[serde(with = "ts_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$")]
    pub now_ns: Timestamp,
    /// Which clock (`test`).
    pub clock: String,
}

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthView {
    /// Always `ok`: the process is serving.
    pub status: String,
}

/// `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadyView {
    /// Whether the service can take traffic.
    pub ready: bool,
    /// `memory` or `postgres`.
    pub store: String,
    /// Whether the storage answered.
    pub storage_reachable: bool,
    /// The schema version found (`null` for the memory store).
    pub schema_version: Option<i64>,
    /// The schema version this build expects (`null` for the memory store).
    pub expected_schema_version: Option<i64>,
    /// Whether a migration or other maintenance is in progress.
    pub maintenance: bool,
}

/// The store's policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PolicyView {
    /// Longest granted TTL (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub max_ttl: SignedDuration,
    /// `max_ttl` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$")]
    pub max_ttl_ns: SignedDuration,
    /// Grace after expiry before reclaim (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub reclaim_grace: SignedDuration,
    /// `reclaim_grace` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$")]
    pub reclaim_grace_ns: SignedDuration,
}

impl From<GrantPolicy> for PolicyView {
    fn from(p: GrantPolicy) -> PolicyView {
        PolicyView {
            max_ttl: p.max_ttl(),
            max_ttl_ns: p.max_ttl(),
            reclaim_grace: p.reclaim_grace(),
            reclaim_grace_ns: p.reclaim_grace(),
        }
    }
}

/// The grant policy as `tollgate policy show|set` prints it (ISO 8601
/// durations). Not an HTTP shape: HTTP answers carry [`PolicyView`], with
/// the lossless `_ns` companions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedPolicyView {
    /// Longest granted TTL (ISO 8601).
    #[serde(with = "dur")]
    pub max_ttl: SignedDuration,
    /// Grace after expiry before reclaim (ISO 8601).
    #[serde(with = "dur")]
    pub reclaim_grace: SignedDuration,
}

impl From<GrantPolicy> for RecordedPolicyView {
    fn from(p: GrantPolicy) -> RecordedPolicyView {
        RecordedPolicyView {
            max_ttl: p.max_ttl(),
            reclaim_grace: p.reclaim_grace(),
        }
    }
}

/// One recorded change of a database's policy (`tollgate policy set`
/// prints it; `tollgate policy show` lists them). Not an HTTP shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyChangeView {
    /// Database-assigned, increasing.
    pub change_id: i64,
    /// The operator's name, or `first start` for the process that found no
    /// recorded policy.
    pub changed_by: String,
    /// The database's transaction time of the change (RFC 3339).
    #[serde(with = "ts")]
    pub recorded_at: Timestamp,
    /// The policy before (`null` for the first record).
    pub old: Option<RecordedPolicyView>,
    /// The policy after.
    pub new: RecordedPolicyView,
}

/// `tollgate policy show`: the recorded policy (`null` before any process
/// started against the database) and its changes, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRecordView {
    /// The recorded policy.
    pub policy: Option<RecordedPolicyView>,
    /// The most recent changes (at most 1000), oldest first.
    pub changes: Vec<PolicyChangeView>,
}

/// `GET /v1/admin/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StatusView {
    /// Readiness, as `/readyz` reports it.
    pub readiness: ReadyView,
    /// Active leases (`null` when the store did not answer within 2 s;
    /// `readiness` then says why).
    pub active_leases: Option<u64>,
    /// Active leases whose expiry is a legacy upper bound (`null` like
    /// `active_leases`).
    pub active_legacy_bounds: Option<u64>,
    /// The policy in force.
    pub policy: PolicyView,
    /// `system`, `test` or `safe-cut`.
    pub clock: String,
    /// The safe expiry cut as this process last read it (`null` unless the
    /// clock is `safe-cut`).
    #[serde(default)]
    pub safe_time: Option<SafeTimeView>,
    /// Operations paused by an uncertain cut since the service started
    /// (`null` from `tollgate status` run directly against a database).
    #[serde(default)]
    pub paused: Option<PausedView>,
    /// The late-expiry histogram since the service started (`null` from
    /// `tollgate status` run directly against a database).
    #[serde(default)]
    pub late_expiry: Option<LateExpiryView>,
}

/// The safe expiry cut in `GET /v1/admin/status` (`--clock safe-cut`).
/// Fields read from the cut row are `null` while there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SafeTimeView {
    /// Whether the reading was certain (acquire, consolidation and reclaim
    /// allowed).
    pub certain: bool,
    /// Why not (`no_cut`, `stale`, `new_epoch`, ...); `null` when certain
    /// or when the cut could not be read.
    pub uncertain_reason: Option<String>,
    /// The last read of the cut failed (then `certain` is false).
    pub read_error: bool,
    /// Failed reads since the service started.
    pub read_errors: u64,
    /// The cut: the instant the service supplies (RFC 3339).
    #[serde(with = "ts_opt")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub cut: Option<Timestamp>,
    /// `cut` as integer nanoseconds since the Unix epoch, a decimal string.
    #[serde(with = "ts_ns_opt", default)]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$")]
    pub cut_ns: Option<Timestamp>,
    /// Database time at the reading.
    #[serde(with = "ts_opt")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub db_now: Option<Timestamp>,
    /// `db_now` as integer nanoseconds since the Unix epoch, a decimal
    /// string.
    #[serde(with = "ts_ns_opt", default)]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$")]
    pub db_now_ns: Option<Timestamp>,
    /// `db_now - cut` (ISO 8601).
    #[serde(with = "dur_opt")]
    #[schema(value_type = Option<String>)]
    pub cut_lag: Option<SignedDuration>,
    /// `cut_lag` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns_opt", default)]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$")]
    pub cut_lag_ns: Option<SignedDuration>,
    /// The sampler's durable epoch.
    pub epoch: Option<i64>,
    /// The initial quarantine is in force.
    pub quarantined: Option<bool>,
    /// Publishes so far.
    pub publish_seq: Option<i64>,
    /// Database time of the last publish.
    #[serde(with = "ts_opt")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub published_at: Option<Timestamp>,
    /// `published_at` as integer nanoseconds since the Unix epoch, a
    /// decimal string.
    #[serde(with = "ts_ns_opt", default)]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$")]
    pub published_at_ns: Option<Timestamp>,
    /// Version of the sealed horizon policy of the current epoch.
    pub policy_version: Option<i64>,
    /// The sealed maximum-deadline horizon (ISO 8601).
    #[serde(with = "dur_opt")]
    #[schema(value_type = Option<String>)]
    pub horizon: Option<SignedDuration>,
    /// `horizon` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns_opt", default)]
    #[schema(value_type = Option<String>, pattern = "^-?[0-9]+$")]
    pub horizon_ns: Option<SignedDuration>,
    /// The sampling-gap bound this service applies (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub gap_max: SignedDuration,
    /// `gap_max` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$")]
    pub gap_max_ns: SignedDuration,
}

impl From<&clock::SafeTimeStatus> for SafeTimeView {
    fn from(s: &clock::SafeTimeStatus) -> SafeTimeView {
        let row = s.row.as_ref();
        SafeTimeView {
            certain: s.is_certain(),
            uncertain_reason: if s.read_error {
                None
            } else {
                s.uncertain.map(|r| r.code().to_string())
            },
            read_error: s.read_error,
            read_errors: s.read_errors_total,
            cut: row.map(|r| r.cut),
            cut_ns: row.map(|r| r.cut),
            db_now: row.map(|r| r.db_now),
            db_now_ns: row.map(|r| r.db_now),
            cut_lag: row.map(|r| r.lag()),
            cut_lag_ns: row.map(|r| r.lag()),
            epoch: row.map(|r| r.epoch),
            quarantined: row.map(|r| r.quarantined),
            publish_seq: row.map(|r| r.publish_seq),
            published_at: row.map(|r| r.published_at),
            published_at_ns: row.map(|r| r.published_at),
            policy_version: row.map(|r| r.policy.version()),
            horizon: row.map(|r| r.policy.horizon()),
            horizon_ns: row.map(|r| r.policy.horizon()),
            gap_max: s.gap_max,
            gap_max_ns: s.gap_max,
        }
    }
}

/// Operations paused because the safe expiry cut was uncertain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PausedView {
    /// Acquires refused with `time_uncertain`.
    pub acquire: u64,
    /// Consolidations refused with `time_uncertain`.
    pub consolidate: u64,
    /// Reclaim passes skipped (worker and `POST /v1/admin/reclaim`).
    pub reclaim: u64,
}

/// One bucket of the late-expiry histogram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LateBucketView {
    /// Upper bound (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub le: SignedDuration,
    /// `le` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$")]
    pub le_ns: SignedDuration,
    /// Reclaimed leases at most this late (cumulative).
    pub count: u64,
}

/// How long after `expiry + reclaim_grace` leases were reclaimed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LateExpiryView {
    /// Reclaimed leases observed.
    pub count: u64,
    /// Their lateness summed (ISO 8601).
    #[serde(with = "dur")]
    #[schema(value_type = String)]
    pub sum: SignedDuration,
    /// `sum` in nanoseconds, a decimal string.
    #[serde(with = "dur_ns")]
    #[schema(value_type = String, pattern = "^-?[0-9]+$")]
    pub sum_ns: SignedDuration,
    /// Cumulative buckets (1 ms, 10 ms, 100 ms, 1 s, 10 s, 1 min, 10 min).
    pub buckets: Vec<LateBucketView>,
}

impl From<crate::metrics::LateExpiry> for LateExpiryView {
    fn from(l: crate::metrics::LateExpiry) -> LateExpiryView {
        LateExpiryView {
            count: l.count,
            sum: l.sum,
            sum_ns: l.sum,
            buckets: l
                .buckets
                .into_iter()
                .map(|(le, count)| LateBucketView {
                    le,
                    le_ns: le,
                    count,
                })
                .collect(),
        }
    }
}
