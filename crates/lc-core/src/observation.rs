//! Observations of an attempt's cost and side effects, the re-execution
//! rule built on them, and retry receipts.
//!
//! # Design
//!
//! A terminal control-plane row proves neither what the provider billed
//! nor what the sandbox did to the outside world. So both observations are
//! optional, and their absence is kept as absence all the way through:
//!
//! * a [`CostObservation`] is either present with both numbers measured
//!   (a measured `0` is a real value, serialized `"cpuTimeMs":0`) or
//!   absent; cost is never estimated from wall-clock time and never
//!   defaulted to zero;
//! * an [`ExternalityObservation`] holds one `Option<bool>` per kind of
//!   side effect; a missing flag is `None`, omitted from its JSON, and
//!   never read as `false`. An explicit JSON `null` is refused: the only
//!   spelling of "not observed" is the field's absence.
//!
//! An observation counts only when the provider that made it is trusted:
//! [`TrustedCaptures::admit`] yields a [`Captured`] value only when its
//! signing key is on the operator's list, and treats any other capture
//! exactly like a missing one (a tenant's own claim is never an
//! observation).
//!
//! [`reexecution_eligibility`] is the one rule: re-executing from a saved
//! [`Milestone`] is eligible only when the milestone exists and carries a
//! complete externality observation whose three flags are all `false`.
//! Every other case is ineligible with a stable [`IneligibleReason`];
//! recovery may still restore the workspace bytes, but it cannot claim a
//! safe re-execution.
//!
//! A retry records a [`RetryReceipt`] (version 2). Its `reusedPrefixCost`
//! is the selected ancestor milestone's measured cost, copied by
//! [`RetryReceipt::new`], and is omitted when that cost is unknown or no
//! milestone was selected (base-generation fallback). Version 1 receipts
//! carried a different cost field; they stay parse-only
//! ([`LegacyRetryReceiptV1`]) and are replayed byte for byte, never
//! re-serialized, and no type here can serialize that field.
//!
//! Nothing here does I/O, reads a clock or panics on any input.

use std::collections::BTreeSet;

use serde::{Deserialize, Deserializer, Serialize};

use crate::model::ExecId;

/// What the trusted provider measured an instance to cost: CPU time and
/// peak memory. Both are required when the observation is present; a
/// measured `0` is a real value, distinct from an absent observation.
///
/// JSON: `{"cpuTimeMs":N,"peakMemoryBytes":N}`, unknown fields refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CostObservation {
    /// CPU time consumed, in milliseconds (user + system).
    pub cpu_time_ms: u64,
    /// The peak resident memory, in bytes.
    pub peak_memory_bytes: u64,
}

/// What the trusted provider observed of an instance's side effects
/// outside its sandbox. `None` means not observed, never "did not happen".
///
/// JSON: `{"networkWrites":B,"databaseCommits":B,"externalApiCalls":B}`,
/// each field omitted when `None`; an explicit `null` and unknown fields
/// are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExternalityObservation {
    /// Whether the instance wrote to the network.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub network_writes: Option<bool>,
    /// Whether the instance committed to a database.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub database_commits: Option<bool>,
    /// Whether the instance called an external API.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub external_api_calls: Option<bool>,
}

impl ExternalityObservation {
    /// What the trusted provider observes for an instance whose shape has
    /// no network path: all three flags `Some(false)`.
    pub const fn no_network_path() -> ExternalityObservation {
        ExternalityObservation {
            network_writes: Some(false),
            database_commits: Some(false),
            external_api_calls: Some(false),
        }
    }

    /// Nothing observed: all three flags `None`.
    pub const fn absent() -> ExternalityObservation {
        ExternalityObservation {
            network_writes: None,
            database_commits: None,
            external_api_calls: None,
        }
    }

    /// Whether all three flags were observed (whatever their values).
    pub fn is_complete(&self) -> bool {
        self.network_writes.is_some()
            && self.database_commits.is_some()
            && self.external_api_calls.is_some()
    }

    /// Whether all three flags were observed and all are `false`.
    pub fn is_clean(&self) -> bool {
        self.flags() == [Some(false); 3]
    }

    /// Whether any observed flag is `true` (a side effect that happened,
    /// whatever the missing flags would say).
    fn any_observed(&self) -> bool {
        self.flags().contains(&Some(true))
    }

    fn flags(&self) -> [Option<bool>; 3] {
        [
            self.network_writes,
            self.database_commits,
            self.external_api_calls,
        ]
    }
}

/// An observation together with the id of the provider key that signed
/// it. Only [`TrustedCaptures::admit`] turns it into an observation.
///
/// JSON: `{"keyId":S,"value":...}`, unknown fields refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Captured<T> {
    /// The id of the provider key that signed the capture.
    pub key_id: String,
    /// What was observed.
    pub value: T,
}

/// The operator's list of trusted provider key ids. An empty id is never
/// trusted (it is dropped when the list is built).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedCaptures {
    key_ids: BTreeSet<String>,
}

impl TrustedCaptures {
    /// The list of `key_ids` (duplicates count once, empty ids are
    /// dropped).
    pub fn new<I, S>(key_ids: I) -> TrustedCaptures
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TrustedCaptures {
            key_ids: key_ids
                .into_iter()
                .map(Into::into)
                .filter(|k: &String| !k.is_empty())
                .collect(),
        }
    }

    /// Whether `key_id` is on the list.
    pub fn trusts(&self, key_id: &str) -> bool {
        self.key_ids.contains(key_id)
    }

    /// The captured value when `capture` is present and signed by a
    /// trusted key; `None` otherwise. An untrusted capture is the same as
    /// an absent one.
    pub fn admit<'a, T>(&self, capture: Option<&'a Captured<T>>) -> Option<&'a T> {
        capture
            .filter(|c| self.trusts(&c.key_id))
            .map(|c| &c.value)
    }
}

impl<S: Into<String>> FromIterator<S> for TrustedCaptures {
    fn from_iter<I: IntoIterator<Item = S>>(key_ids: I) -> TrustedCaptures {
        TrustedCaptures::new(key_ids)
    }
}

/// A saved point of an attempt that a retry can restart from: the file
/// snapshot head it saved and what the trusted provider observed up to it.
///
/// JSON: `{"head":S,"cost":{...},"externality":{...}}`, `cost` and
/// `externality` omitted when absent; `null` and unknown fields refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Milestone {
    /// The digest of the file snapshot head (64 lower-case hex digits).
    pub head: String,
    /// The measured cost of the attempt up to this milestone, if observed.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub cost: Option<CostObservation>,
    /// The side effects observed up to this milestone, if observed.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub externality: Option<ExternalityObservation>,
}

/// Whether re-execution from a milestone is safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Eligibility {
    /// Re-execution from the milestone is safe.
    Eligible,
    /// It is not, for this reason.
    Ineligible(IneligibleReason),
}

impl Eligibility {
    /// Whether this is [`Eligibility::Eligible`].
    pub fn is_eligible(&self) -> bool {
        matches!(self, Eligibility::Eligible)
    }
}

/// Why re-execution is ineligible. Codes are stable:
/// [`IneligibleReason::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IneligibleReason {
    /// No milestone was saved. Code `no_milestone`.
    NoMilestone,
    /// The milestone has no externality observation. Code
    /// `externality_unobserved`.
    ExternalityUnobserved,
    /// Some flag was not observed and none observed is `true`. Code
    /// `externality_incomplete`.
    ExternalityIncomplete,
    /// A side effect was observed (a flag is `true`). Code
    /// `externality_observed`.
    ExternalityObserved,
}

impl IneligibleReason {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            IneligibleReason::NoMilestone => "no_milestone",
            IneligibleReason::ExternalityUnobserved => "externality_unobserved",
            IneligibleReason::ExternalityIncomplete => "externality_incomplete",
            IneligibleReason::ExternalityObserved => "externality_observed",
        }
    }
}

/// Whether re-executing from `milestone` is safe: only when it exists and
/// its externality observation is complete with all three flags `false`.
///
/// Otherwise, in this order: no milestone; no externality observation; a
/// flag observed `true` (whatever the missing ones); a flag missing.
/// Missing is never read as `false`.
///
/// # Panics
/// Never.
pub fn reexecution_eligibility(milestone: Option<&Milestone>) -> Eligibility {
    let reason = match milestone.map(|m| m.externality) {
        None => IneligibleReason::NoMilestone,
        Some(None) => IneligibleReason::ExternalityUnobserved,
        Some(Some(x)) if x.any_observed() => IneligibleReason::ExternalityObserved,
        Some(Some(x)) if !x.is_complete() => IneligibleReason::ExternalityIncomplete,
        Some(Some(_)) => return Eligibility::Eligible,
    };
    Eligibility::Ineligible(reason)
}

/// The milestone a retry restarts from: its sequence number within the
/// attempt and its file snapshot head.
///
/// JSON: `{"milestoneSeq":N,"head":S}`, unknown fields refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AncestorRef {
    /// The milestone's sequence number within its attempt.
    pub milestone_seq: u32,
    /// Its file snapshot head digest.
    pub head: String,
}

/// The version [`RetryReceipt`] serializes.
pub const RETRY_RECEIPT_VERSION: u32 = 2;

/// What a retry records (version 2): the exec, the new attempt, the
/// generation it retries from, the ancestor milestone selected (`None`:
/// base-generation fallback, no milestone) and `reusedPrefixCost`.
///
/// `reusedPrefixCost` is the measured historical cost of the reused prefix
/// (the selected ancestor milestone's [`CostObservation`]); it is NOT an
/// exact counterfactual saving. It is omitted when that cost is unknown,
/// and always on base-generation fallback.
///
/// Canonical JSON (JCS, keys sorted), absent fields omitted:
/// ```text
/// {"ancestor":{"head":S,"milestoneSeq":N},"attempt":N,"execId":N,
///  "fromGeneration":N,"reusedPrefixCost":{"cpuTimeMs":N,"peakMemoryBytes":N},
///  "version":2}
/// ```
/// The fields are private, so every value came from [`RetryReceipt::new`]
/// or from canonical bytes ([`StoredRetryReceipt::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryReceipt {
    version: u32,
    exec_id: ExecId,
    attempt: u32,
    from_generation: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    ancestor: Option<AncestorRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reused_prefix_cost: Option<CostObservation>,
}

impl RetryReceipt {
    /// The receipt of retrying `exec_id` as `attempt` from
    /// `from_generation`, restarting from `ancestor` (the milestone's
    /// sequence number and the milestone) or from the base generation
    /// (`None`). The ancestor's head and measured cost are copied from the
    /// milestone; its cost is omitted when the milestone has none.
    ///
    /// # Panics
    /// Never.
    pub fn new(
        exec_id: ExecId,
        attempt: u32,
        from_generation: u64,
        ancestor: Option<(u32, &Milestone)>,
    ) -> RetryReceipt {
        RetryReceipt {
            version: RETRY_RECEIPT_VERSION,
            exec_id,
            attempt,
            from_generation,
            ancestor: ancestor.map(|(seq, m)| AncestorRef {
                milestone_seq: seq,
                head: m.head.clone(),
            }),
            reused_prefix_cost: ancestor.and_then(|(_, m)| m.cost),
        }
    }

    /// The exec retried.
    pub fn exec_id(&self) -> ExecId {
        self.exec_id
    }

    /// The new attempt.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The generation the retry starts from.
    pub fn from_generation(&self) -> u64 {
        self.from_generation
    }

    /// The ancestor milestone selected; `None` on base-generation fallback.
    pub fn ancestor(&self) -> Option<&AncestorRef> {
        self.ancestor.as_ref()
    }

    /// The measured historical cost of the reused prefix (not an exact
    /// counterfactual saving); `None` when unknown or on base fallback.
    pub fn reused_prefix_cost(&self) -> Option<CostObservation> {
        self.reused_prefix_cost
    }

    /// The canonical bytes (JCS): what is stored and signed.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        serde_jcs::to_vec(self).unwrap_or_default()
    }

    /// The receipt of `bytes`, which must be its canonical form; their
    /// version was read as 2 by [`version_of`].
    fn from_canonical(bytes: &[u8]) -> Result<RetryReceipt, ReceiptError> {
        let w: WireV2 = serde_json::from_slice(bytes).map_err(|e| ReceiptError::Malformed {
            version: RETRY_RECEIPT_VERSION,
            reason: e.to_string(),
        })?;
        if w.ancestor.is_none() && w.reused_prefix_cost.is_some() {
            return Err(ReceiptError::PrefixCostWithoutAncestor);
        }
        let r = RetryReceipt {
            version: w.version,
            exec_id: w.exec_id,
            attempt: w.attempt,
            from_generation: w.from_generation,
            ancestor: w.ancestor,
            reused_prefix_cost: w.reused_prefix_cost,
        };
        if r.canonical_bytes() != bytes {
            return Err(ReceiptError::NotCanonical);
        }
        Ok(r)
    }
}

/// The JSON of a version 2 receipt, as read back.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireV2 {
    version: u32,
    exec_id: ExecId,
    attempt: u32,
    from_generation: u64,
    #[serde(default, deserialize_with = "present")]
    ancestor: Option<AncestorRef>,
    #[serde(default, deserialize_with = "present")]
    reused_prefix_cost: Option<CostObservation>,
}

// region: legacy v1 receipts. The only place the v1 cost field is named;
// a test checks that no other source names it, so nothing else can emit it.

/// The version [`LegacyRetryReceiptV1`] holds.
pub const LEGACY_RETRY_RECEIPT_VERSION: u32 = 1;

/// The v1 cost field's JSON name (for the tests, which name it only
/// through this constant).
#[cfg(test)]
const LEGACY_COST_FIELD: &str = "savedCost";

/// A version 1 retry receipt: parse-only, replayed byte for byte.
///
/// Its shape (all fields required, unknown fields refused, keys in any
/// order, any JSON whitespace):
/// ```text
/// {"version":1,"execId":N,"attempt":N,"fromGeneration":N,
///  "savedCost":{"cpuTimeMs":N,"peakMemoryBytes":N}}
/// ```
/// The type has no `Serialize`: [`LegacyRetryReceiptV1::bytes`] gives back
/// the exact bytes it was parsed from, and nothing writes a new v1 receipt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LegacyRetryReceiptV1 {
    exec_id: ExecId,
    attempt: u32,
    from_generation: u64,
    cost: CostObservation,
    bytes: Vec<u8>,
}

/// The JSON of a version 1 receipt.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireV1 {
    /// Checked by [`version_of`] before this shape is read.
    #[serde(rename = "version")]
    _version: u32,
    exec_id: ExecId,
    attempt: u32,
    from_generation: u64,
    #[serde(rename = "savedCost")]
    cost: CostObservation,
}

impl LegacyRetryReceiptV1 {
    /// Parses a v1 receipt, keeping `bytes` exactly.
    ///
    /// # Errors
    /// [`ReceiptError::NotJson`] for bytes that are not JSON,
    /// [`ReceiptError::NotObject`] for JSON that is not an object,
    /// [`ReceiptError::VersionUnknown`] unless `"version":1`,
    /// [`ReceiptError::Malformed`] for any other departure from the shape
    /// (a missing `savedCost` among them).
    pub fn parse(bytes: &[u8]) -> Result<LegacyRetryReceiptV1, ReceiptError> {
        let version = version_of(bytes)?;
        if version != LEGACY_RETRY_RECEIPT_VERSION {
            return Err(ReceiptError::VersionUnknown {
                version: version.to_string(),
            });
        }
        let w: WireV1 = serde_json::from_slice(bytes).map_err(|e| ReceiptError::Malformed {
            version,
            reason: e.to_string(),
        })?;
        Ok(LegacyRetryReceiptV1 {
            exec_id: w.exec_id,
            attempt: w.attempt,
            from_generation: w.from_generation,
            cost: w.cost,
            bytes: bytes.to_vec(),
        })
    }

    /// The exec retried.
    pub fn exec_id(&self) -> ExecId {
        self.exec_id
    }

    /// The new attempt.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The generation the retry started from.
    pub fn from_generation(&self) -> u64 {
        self.from_generation
    }

    /// The cost the v1 receipt recorded (its `savedCost`), as recorded.
    pub fn legacy_cost(&self) -> CostObservation {
        self.cost
    }

    /// The exact bytes it was parsed from, never re-serialized.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

// endregion: legacy v1 receipts.

/// A stored retry receipt of either version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoredRetryReceipt {
    /// A legacy version 1 receipt (parse-only).
    V1(LegacyRetryReceiptV1),
    /// A version 2 receipt.
    V2(RetryReceipt),
}

impl StoredRetryReceipt {
    /// Parses stored bytes, dispatching on their `version`: 1 as
    /// [`LegacyRetryReceiptV1::parse`] (any formatting), 2 only in its
    /// canonical form.
    ///
    /// # Errors
    /// As [`LegacyRetryReceiptV1::parse`] for version 1; for version 2,
    /// [`ReceiptError::Malformed`] for a departure from the shape (a
    /// `null` among them), [`ReceiptError::PrefixCostWithoutAncestor`] and
    /// [`ReceiptError::NotCanonical`]; [`ReceiptError::VersionUnknown`]
    /// for any other version or none.
    pub fn parse(bytes: &[u8]) -> Result<StoredRetryReceipt, ReceiptError> {
        match version_of(bytes)? {
            LEGACY_RETRY_RECEIPT_VERSION => LegacyRetryReceiptV1::parse(bytes).map(Self::V1),
            RETRY_RECEIPT_VERSION => RetryReceipt::from_canonical(bytes).map(Self::V2),
            version => Err(ReceiptError::VersionUnknown {
                version: version.to_string(),
            }),
        }
    }

    /// The stored bytes: a v1 receipt's exact input, a v2 receipt's
    /// canonical bytes.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            StoredRetryReceipt::V1(r) => r.bytes().to_vec(),
            StoredRetryReceipt::V2(r) => r.canonical_bytes(),
        }
    }
}

/// A refused retry receipt. Codes are stable: [`ReceiptError::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    /// Bytes that are not one JSON value. Code `receipt_not_json`.
    #[error("a retry receipt is JSON: {reason}")]
    NotJson {
        /// The parser's message.
        reason: String,
    },
    /// JSON that is not an object. Code `receipt_not_object`.
    #[error("a retry receipt is a JSON object")]
    NotObject,
    /// A `version` missing or other than 1 or 2 (or other than the one
    /// the parser reads). Code `receipt_version_unknown`.
    #[error("retry receipt version {version} is not a known version (1 or 2)")]
    VersionUnknown {
        /// The version's JSON text, or `missing`.
        version: String,
    },
    /// A receipt that departs from its version's shape. Code
    /// `receipt_malformed`.
    #[error("retry receipt version {version} is malformed: {reason}")]
    Malformed {
        /// The receipt's version.
        version: u32,
        /// What is wrong.
        reason: String,
    },
    /// A version 2 receipt in other than its canonical (JCS) bytes. Code
    /// `receipt_not_canonical`.
    #[error("a version 2 retry receipt is stored in its canonical (JCS) bytes")]
    NotCanonical,
    /// A version 2 receipt with `reusedPrefixCost` but no ancestor (a base
    /// fallback reuses no prefix). Code
    /// `receipt_prefix_cost_without_ancestor`.
    #[error("a retry receipt without an ancestor has no reusedPrefixCost")]
    PrefixCostWithoutAncestor,
}

impl ReceiptError {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            ReceiptError::NotJson { .. } => "receipt_not_json",
            ReceiptError::NotObject => "receipt_not_object",
            ReceiptError::VersionUnknown { .. } => "receipt_version_unknown",
            ReceiptError::Malformed { .. } => "receipt_malformed",
            ReceiptError::NotCanonical => "receipt_not_canonical",
            ReceiptError::PrefixCostWithoutAncestor => "receipt_prefix_cost_without_ancestor",
        }
    }
}

/// The `version` of a receipt's bytes, when it is a `u32`.
fn version_of(bytes: &[u8]) -> Result<u32, ReceiptError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ReceiptError::NotJson {
            reason: e.to_string(),
        })?;
    let version = value
        .as_object()
        .ok_or(ReceiptError::NotObject)?
        .get("version");
    version
        .and_then(serde_json::Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| ReceiptError::VersionUnknown {
            version: version.map_or_else(|| "missing".to_owned(), ToString::to_string),
        })
}

/// Deserializes a field that may be absent (with `#[serde(default)]`) but,
/// when present, holds a value: an explicit `null` is refused.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}
