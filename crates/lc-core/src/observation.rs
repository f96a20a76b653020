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
    /// The peak memory charged to the instance, in bytes (what its memory
    /// cgroup counts: resident pages, page cache and tmpfs files).
    pub peak_memory_bytes: u64,
}

/// Nanoseconds per millisecond, the unit [`CostObservation::cpu_time_ms`]
/// is counted in.
pub const NANOS_PER_MILLI: u64 = 1_000_000;

impl CostObservation {
    /// The cost of an instance from its own accounting: `cpu_time_ns` of
    /// CPU time (user + system, as the kernel counts it for the instance's
    /// cgroup) and a peak of `peak_memory_bytes`. The CPU time is counted
    /// in whole milliseconds, rounded down (999_999 ns is 0 ms).
    ///
    /// `None` when `peak_memory_bytes` is above [`JSON_SAFE_INTEGER_MAX`]:
    /// an observation that canonical JSON cannot hold exactly is not made.
    /// (Every `u64` of nanoseconds is at most 18_446_744_073_709 ms, far
    /// below that bound.)
    pub fn from_accounting(cpu_time_ns: u64, peak_memory_bytes: u64) -> Option<CostObservation> {
        (peak_memory_bytes <= JSON_SAFE_INTEGER_MAX).then_some(CostObservation {
            cpu_time_ms: cpu_time_ns / NANOS_PER_MILLI,
            peak_memory_bytes,
        })
    }
}

/// What the trusted provider observed of an instance's side effects
/// outside its sandbox. `None` means not observed, never "did not happen".
///
/// JSON: `{"networkWrites":B,"databaseCommits":B,"externalApiCalls":B}`,
/// each field omitted when `None`; an explicit `null` and unknown fields
/// are refused.
///
/// It has no `Default`: [`ExternalityObservation::absent`] names the value
/// with nothing observed, so no code reaches it by accident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

    /// What the sandbox itself proves of an instance: for a shape without
    /// network (`network == false`) there is no path out, so all three
    /// flags are observed `false` ([`ExternalityObservation::no_network_path`]);
    /// with network, nothing in the sandbox sees the egress, so nothing is
    /// observed ([`ExternalityObservation::absent`]).
    pub const fn of_sandbox(network: bool) -> ExternalityObservation {
        if network {
            ExternalityObservation::absent()
        } else {
            ExternalityObservation::no_network_path()
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
        capture.filter(|c| self.trusts(&c.key_id)).map(|c| &c.value)
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

impl Milestone {
    /// The milestone at snapshot `head` of an attempt observed so far as
    /// `observation` (`None`: some generation of it was not measured):
    /// its cost copied when measured, its externality when any flag was
    /// observed (an observation of no flag at all is no externality
    /// observation). Nothing unmeasured becomes a zero or a `false`.
    pub fn at(head: crate::model::Digest, observation: Option<AttemptObservation>) -> Milestone {
        Milestone {
            head: head.to_hex(),
            cost: observation.and_then(|o| o.cost),
            externality: observation
                .map(|o| o.externality)
                .filter(|x| *x != ExternalityObservation::absent()),
        }
    }
}

/// What recorded a milestone. Codes are stable: [`MilestoneSource::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MilestoneSource {
    /// A hibernation's committed quiescence. Code `hibernation`.
    Hibernation,
}

impl MilestoneSource {
    /// The stable snake_case code.
    pub fn as_str(&self) -> &'static str {
        match self {
            MilestoneSource::Hibernation => "hibernation",
        }
    }

    /// The source of code `s`; `None` for an unknown code.
    pub fn parse(s: &str) -> Option<MilestoneSource> {
        match s {
            "hibernation" => Some(MilestoneSource::Hibernation),
            _ => None,
        }
    }
}

/// One recorded milestone of an exec: which attempt generation it saved,
/// what recorded it, and the [`Milestone`] itself (head and what was
/// observed up to it). Immutable once recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MilestoneRecord {
    /// The exec.
    pub exec_id: ExecId,
    /// Its number among the exec's milestones, from 1 in recording order
    /// (unique within the exec, across attempts).
    pub seq: u32,
    /// The attempt it belongs to.
    pub attempt: crate::model::AttemptNo,
    /// The Lease generation whose workspace it saved.
    pub generation: crate::model::Generation,
    /// What recorded it.
    pub source: MilestoneSource,
    /// The head and the observations up to it.
    pub milestone: Milestone,
    /// The certain cut it was recorded at.
    pub recorded_cut: jiff::Timestamp,
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
    match milestone {
        None => Eligibility::Ineligible(IneligibleReason::NoMilestone),
        Some(m) => judge_externality(m.externality.as_ref()),
    }
}

/// Eligible only for a complete observation with all three flags `false`;
/// otherwise unobserved, a flag observed `true`, or a flag missing, in
/// that order.
fn judge_externality(externality: Option<&ExternalityObservation>) -> Eligibility {
    let reason = match externality {
        None => IneligibleReason::ExternalityUnobserved,
        Some(x) if x.any_observed() => IneligibleReason::ExternalityObserved,
        Some(x) if !x.is_complete() => IneligibleReason::ExternalityIncomplete,
        Some(_) => return Eligibility::Eligible,
    };
    Eligibility::Ineligible(reason)
}

/// What the trusted provider measured of one Lease generation as a whole,
/// from the instance's start to the moment it signed: the terminal
/// observation when it is taken just before the destroy.
///
/// JSON: `{"cost":{...},"externality":{...}}`, `cost` omitted when the
/// accounting was not readable; `null` and unknown fields refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttemptObservation {
    /// The measured cost, if the instance's accounting was readable.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub cost: Option<CostObservation>,
    /// The side effects observed (each flag omitted when not observed).
    pub externality: ExternalityObservation,
}

impl AttemptObservation {
    /// Whether `self`, a later measurement of the same generation, may
    /// replace the `stored` one without losing anything measured: a cost
    /// is never replaced by an unknown one nor by a smaller one (the
    /// accounting only grows, and is gone once the instance is destroyed:
    /// a smaller cost is an older measurement replayed), a flag once
    /// observed is never replaced by an unobserved one, and a side effect
    /// once observed (`true`) never becomes `false`.
    pub fn supersedes(&self, stored: &AttemptObservation) -> bool {
        let kept = |new: Option<bool>, old: Option<bool>| match old {
            None => true,
            Some(false) => new.is_some(),
            Some(true) => new == Some(true),
        };
        let grown = match (self.cost, stored.cost) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(new), Some(old)) => {
                new.cpu_time_ms >= old.cpu_time_ms && new.peak_memory_bytes >= old.peak_memory_bytes
            }
        };
        grown
            && kept(
                self.externality.network_writes,
                stored.externality.network_writes,
            )
            && kept(
                self.externality.database_commits,
                stored.externality.database_commits,
            )
            && kept(
                self.externality.external_api_calls,
                stored.externality.external_api_calls,
            )
    }
}

impl AttemptObservation {
    /// The observation of a whole attempt from those of its generations
    /// (`None`: that generation was not measured), in any order: `None`
    /// when there are none or any generation is unmeasured; otherwise the
    /// CPU time summed and the peak memory the largest (the cost unknown
    /// when any generation's is, or when the sum passes
    /// [`JSON_SAFE_INTEGER_MAX`]), and each flag `true` when any
    /// generation observed it, else unknown when any did not observe it,
    /// else `false`.
    pub fn of_generations<I>(generations: I) -> Option<AttemptObservation>
    where
        I: IntoIterator<Item = Option<AttemptObservation>>,
    {
        let mut parts = generations.into_iter();
        let mut whole = parts.next()??;
        for part in parts {
            let part = part?;
            whole.cost = match (whole.cost, part.cost) {
                (Some(a), Some(b)) => a
                    .cpu_time_ms
                    .checked_add(b.cpu_time_ms)
                    .filter(|cpu| *cpu <= JSON_SAFE_INTEGER_MAX)
                    .map(|cpu_time_ms| CostObservation {
                        cpu_time_ms,
                        peak_memory_bytes: a.peak_memory_bytes.max(b.peak_memory_bytes),
                    }),
                _ => None,
            };
            let flag = |a: Option<bool>, b: Option<bool>| match (a, b) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            };
            let (w, p) = (&mut whole.externality, part.externality);
            w.network_writes = flag(w.network_writes, p.network_writes);
            w.database_commits = flag(w.database_commits, p.database_commits);
            w.external_api_calls = flag(w.external_api_calls, p.external_api_calls);
        }
        Some(whole)
    }
}

/// Whether re-executing a whole attempt from its start is safe, judged on
/// the trusted observation of its Lease generation (`None`: nothing was
/// measured, e.g. the provider died first): the rule of
/// [`reexecution_eligibility`] applied to an observation covering the
/// attempt from start to end. Never eligible without one.
///
/// # Panics
/// Never.
pub fn attempt_reexecution_eligibility(observation: Option<&AttemptObservation>) -> Eligibility {
    judge_externality(observation.map(|o| &o.externality))
}

/// The milestone a retry restarts from: its sequence number within the
/// attempt and its file snapshot head.
///
/// JSON: `{"milestoneSeq":N,"head":S}`, unknown fields refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AncestorRef {
    /// The milestone's sequence number within its exec
    /// ([`MilestoneRecord::seq`]).
    pub milestone_seq: u32,
    /// Its file snapshot head digest.
    pub head: String,
}

/// The version [`RetryReceipt`] serializes.
pub const RETRY_RECEIPT_VERSION: u32 = 2;

/// The largest magnitude of an integer in a [`RetryReceipt`]: `2^53 - 1`.
/// Canonical JSON (JCS) writes numbers as IEEE 754 doubles, which hold
/// every integer up to this exactly and round those above it, so a larger
/// one would be stored as a different number.
pub const JSON_SAFE_INTEGER_MAX: u64 = 9_007_199_254_740_991;

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
    /// # Errors
    /// [`ReceiptError::NumberOutOfRange`] for an exec id, generation or
    /// prefix cost whose magnitude is over [`JSON_SAFE_INTEGER_MAX`] (its
    /// canonical bytes could not hold it exactly).
    ///
    /// # Panics
    /// Never.
    pub fn new(
        exec_id: ExecId,
        attempt: u32,
        from_generation: u64,
        ancestor: Option<(u32, &Milestone)>,
    ) -> Result<RetryReceipt, ReceiptError> {
        let r = RetryReceipt {
            version: RETRY_RECEIPT_VERSION,
            exec_id,
            attempt,
            from_generation,
            ancestor: ancestor.map(|(seq, m)| AncestorRef {
                milestone_seq: seq,
                head: m.head.clone(),
            }),
            reused_prefix_cost: ancestor.and_then(|(_, m)| m.cost),
        };
        r.check_numbers()?;
        Ok(r)
    }

    /// Every integer field's magnitude is at most [`JSON_SAFE_INTEGER_MAX`]
    /// (`attempt` and `milestoneSeq`, `u32`s, always are).
    fn check_numbers(&self) -> Result<(), ReceiptError> {
        let cost = self.reused_prefix_cost;
        for (field, value) in [
            ("execId", i128::from(self.exec_id.0)),
            ("fromGeneration", i128::from(self.from_generation)),
            (
                "reusedPrefixCost.cpuTimeMs",
                cost.map_or(0, |c| i128::from(c.cpu_time_ms)),
            ),
            (
                "reusedPrefixCost.peakMemoryBytes",
                cost.map_or(0, |c| i128::from(c.peak_memory_bytes)),
            ),
        ] {
            if value.unsigned_abs() > u128::from(JSON_SAFE_INTEGER_MAX) {
                return Err(ReceiptError::NumberOutOfRange { field, value });
            }
        }
        Ok(())
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
        r.check_numbers()?;
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
    /// `null` among them), [`ReceiptError::PrefixCostWithoutAncestor`],
    /// [`ReceiptError::NumberOutOfRange`] and
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
    /// A version 2 receipt's integer over [`JSON_SAFE_INTEGER_MAX`] in
    /// magnitude. Code `receipt_number_out_of_range`.
    #[error(
        "retry receipt field {field} is {value}; canonical JSON holds integers exactly only up to {JSON_SAFE_INTEGER_MAX} in magnitude"
    )]
    NumberOutOfRange {
        /// The field's JSON path.
        field: &'static str,
        /// Its value.
        value: i128,
    },
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
            ReceiptError::NumberOutOfRange { .. } => "receipt_number_out_of_range",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// SHA-256 of `test`: a head digest's shape.
    const HEAD: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    const V1_COMPACT: &[u8] = include_bytes!("../tests/fixtures/retry_receipts/v1_compact.json");
    const V1_ODD: &[u8] = include_bytes!("../tests/fixtures/retry_receipts/v1_odd_whitespace.json");
    const V1_PRETTY: &[u8] = include_bytes!("../tests/fixtures/retry_receipts/v1_pretty_max.json");

    const FLAG: [Option<bool>; 3] = [None, Some(false), Some(true)];

    #[test]
    fn a_milestone_keeps_what_was_observed_and_nothing_else() {
        let head = crate::model::Digest::from_hex(HEAD).unwrap();
        let cost = CostObservation {
            cpu_time_ms: 0,
            peak_memory_bytes: 4096,
        };
        let partial = ExternalityObservation {
            network_writes: None,
            database_commits: Some(false),
            external_api_calls: None,
        };
        let at =
            |cost, externality| Milestone::at(head, Some(AttemptObservation { cost, externality }));
        let m = |cost, externality| Milestone {
            head: HEAD.to_string(),
            cost,
            externality,
        };
        assert_eq!(Milestone::at(head, None), m(None, None));
        assert_eq!(
            at(Some(cost), ExternalityObservation::no_network_path()),
            m(Some(cost), Some(ExternalityObservation::no_network_path()))
        );
        assert_eq!(at(Some(cost), partial), m(Some(cost), Some(partial)));
        // No flag observed is no externality observation, whatever the cost.
        assert_eq!(
            at(Some(cost), ExternalityObservation::absent()),
            m(Some(cost), None)
        );
        assert_eq!(at(None, ExternalityObservation::absent()), m(None, None));
    }

    #[test]
    fn milestone_sources_have_stable_codes() {
        assert_eq!(MilestoneSource::Hibernation.as_str(), "hibernation");
        assert_eq!(
            MilestoneSource::parse("hibernation"),
            Some(MilestoneSource::Hibernation)
        );
        assert_eq!(MilestoneSource::parse("Hibernation"), None);
        assert_eq!(MilestoneSource::parse(""), None);
    }

    #[test]
    fn accounting_counts_whole_milliseconds_and_refuses_unsafe_integers() {
        let c = |cpu_time_ms, peak_memory_bytes| {
            Some(CostObservation {
                cpu_time_ms,
                peak_memory_bytes,
            })
        };
        assert_eq!(CostObservation::from_accounting(0, 0), c(0, 0));
        assert_eq!(CostObservation::from_accounting(999_999, 4096), c(0, 4096));
        assert_eq!(CostObservation::from_accounting(1_000_000, 1), c(1, 1));
        assert_eq!(
            CostObservation::from_accounting(2_999_999_999, 268_435_456),
            c(2_999, 268_435_456)
        );
        assert_eq!(
            CostObservation::from_accounting(u64::MAX, 7),
            c(18_446_744_073_709, 7)
        );
        assert_eq!(
            CostObservation::from_accounting(0, JSON_SAFE_INTEGER_MAX),
            c(0, JSON_SAFE_INTEGER_MAX)
        );
        assert_eq!(
            CostObservation::from_accounting(0, JSON_SAFE_INTEGER_MAX + 1),
            None
        );
        assert_eq!(CostObservation::from_accounting(0, u64::MAX), None);
    }

    #[test]
    fn the_sandbox_proves_no_side_effects_only_without_network() {
        assert_eq!(
            ExternalityObservation::of_sandbox(false),
            x(Some(false), Some(false), Some(false))
        );
        assert!(ExternalityObservation::of_sandbox(false).is_clean());
        assert_eq!(
            ExternalityObservation::of_sandbox(true),
            x(None, None, None)
        );
        assert!(!ExternalityObservation::of_sandbox(true).is_complete());
    }

    fn x(n: Option<bool>, d: Option<bool>, a: Option<bool>) -> ExternalityObservation {
        ExternalityObservation {
            network_writes: n,
            database_commits: d,
            external_api_calls: a,
        }
    }

    fn milestone(
        cost: Option<CostObservation>,
        externality: Option<ExternalityObservation>,
    ) -> Milestone {
        Milestone {
            head: HEAD.to_owned(),
            cost,
            externality,
        }
    }

    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    /// Deserializes `s` and gives the error's text (or `ok` and the value
    /// serialized back).
    fn check<T: Serialize + for<'de> Deserialize<'de>>(s: &str) -> String {
        match serde_json::from_str::<T>(s) {
            Ok(v) => format!("ok {}", json(&v)),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_cost_is_both_numbers_and_a_measured_zero_is_kept() {
        let zero = CostObservation {
            cpu_time_ms: 0,
            peak_memory_bytes: 0,
        };
        assert_eq!(json(&zero), r#"{"cpuTimeMs":0,"peakMemoryBytes":0}"#);
        let max = CostObservation {
            cpu_time_ms: u64::MAX,
            peak_memory_bytes: 1,
        };
        assert_eq!(
            json(&max),
            r#"{"cpuTimeMs":18446744073709551615,"peakMemoryBytes":1}"#
        );
        for (input, out) in [
            (
                r#"{"peakMemoryBytes":0,"cpuTimeMs":0}"#,
                r#"ok {"cpuTimeMs":0,"peakMemoryBytes":0}"#,
            ),
            (
                r#"{"cpuTimeMs":0}"#,
                "missing field `peakMemoryBytes` at line 1 column 15",
            ),
            (
                r#"{"cpuTimeMs":null,"peakMemoryBytes":0}"#,
                "invalid type: null, expected u64 at line 1 column 17",
            ),
            (
                r#"{"cpuTimeMs":1,"peakMemoryBytes":2,"wallMs":3}"#,
                "unknown field `wallMs`, expected `cpuTimeMs` or `peakMemoryBytes` at line 1 column 43",
            ),
        ] {
            assert_eq!(check::<CostObservation>(input), out, "{input}");
        }
    }

    #[test]
    fn an_absent_flag_is_omitted_and_a_null_is_refused() {
        assert_eq!(json(&ExternalityObservation::absent()), "{}");
        assert_eq!(
            json(&ExternalityObservation::no_network_path()),
            r#"{"networkWrites":false,"databaseCommits":false,"externalApiCalls":false}"#
        );
        assert_eq!(
            json(&x(Some(true), None, Some(false))),
            r#"{"networkWrites":true,"externalApiCalls":false}"#
        );
        assert_eq!(
            json(&x(None, Some(true), None)),
            r#"{"databaseCommits":true}"#
        );
        for (input, out) in [
            ("{}", "ok {}"),
            (
                r#"{"externalApiCalls":true,"networkWrites":false}"#,
                r#"ok {"networkWrites":false,"externalApiCalls":true}"#,
            ),
            (
                r#"{"databaseCommits":false}"#,
                r#"ok {"databaseCommits":false}"#,
            ),
            (
                r#"{"networkWrites":null}"#,
                "invalid type: null, expected a boolean at line 1 column 21",
            ),
            (
                r#"{"databaseCommits":null}"#,
                "invalid type: null, expected a boolean at line 1 column 23",
            ),
            (
                r#"{"externalApiCalls":null}"#,
                "invalid type: null, expected a boolean at line 1 column 24",
            ),
            (
                r#"{"networkWrites":0}"#,
                "invalid type: integer `0`, expected a boolean at line 1 column 18",
            ),
            (
                r#"{"diskWrites":false}"#,
                "unknown field `diskWrites`, expected one of `networkWrites`, `databaseCommits`, `externalApiCalls` at line 1 column 13",
            ),
        ] {
            assert_eq!(check::<ExternalityObservation>(input), out, "{input}");
        }
    }

    #[test]
    fn completeness_and_cleanliness_over_every_combination() {
        assert_eq!(
            ExternalityObservation::no_network_path(),
            x(Some(false), Some(false), Some(false))
        );
        assert_eq!(ExternalityObservation::absent(), x(None, None, None));
        let mut complete = 0;
        let mut clean = 0;
        for n in FLAG {
            for d in FLAG {
                for a in FLAG {
                    let o = x(n, d, a);
                    let nones = [n, d, a].iter().filter(|f| f.is_none()).count();
                    let trues = [n, d, a].iter().filter(|f| **f == Some(true)).count();
                    assert_eq!(o.is_complete(), nones == 0, "{o:?}");
                    assert_eq!(o.is_clean(), nones == 0 && trues == 0, "{o:?}");
                    assert_eq!(o.any_observed(), trues > 0, "{o:?}");
                    complete += usize::from(o.is_complete());
                    clean += usize::from(o.is_clean());
                }
            }
        }
        assert_eq!((complete, clean), (8, 1));
    }

    #[test]
    fn a_milestone_omits_what_was_not_observed() {
        let zero = CostObservation {
            cpu_time_ms: 0,
            peak_memory_bytes: 0,
        };
        assert_eq!(
            json(&milestone(None, None)),
            format!(r#"{{"head":"{HEAD}"}}"#)
        );
        assert_eq!(
            json(&milestone(
                Some(zero),
                Some(ExternalityObservation::absent())
            )),
            format!(
                r#"{{"head":"{HEAD}","cost":{{"cpuTimeMs":0,"peakMemoryBytes":0}},"externality":{{}}}}"#
            )
        );
        for (input, out) in [
            (r#"{"head":"h"}"#, r#"ok {"head":"h"}"#),
            (
                r#"{"head":"h","externality":{"networkWrites":false},"cost":{"cpuTimeMs":5,"peakMemoryBytes":6}}"#,
                r#"ok {"head":"h","cost":{"cpuTimeMs":5,"peakMemoryBytes":6},"externality":{"networkWrites":false}}"#,
            ),
            (
                r#"{"head":"h","cost":null}"#,
                "invalid type: null, expected struct CostObservation at line 1 column 23",
            ),
            (
                r#"{"head":"h","externality":null}"#,
                "invalid type: null, expected struct ExternalityObservation at line 1 column 30",
            ),
            (r#"{}"#, "missing field `head` at line 1 column 2"),
            (
                r#"{"head":"h","seq":1}"#,
                "unknown field `seq`, expected one of `head`, `cost`, `externality` at line 1 column 17",
            ),
        ] {
            assert_eq!(check::<Milestone>(input), out, "{input}");
        }
    }

    #[test]
    fn only_a_trusted_key_s_capture_is_an_observation() {
        let trusted = TrustedCaptures::new(["provider-a", "", "provider-b", "provider-a"]);
        assert!(trusted.trusts("provider-a"));
        assert!(trusted.trusts("provider-b"));
        assert!(!trusted.trusts(""));
        assert!(!trusted.trusts("tenant"));
        let by = |key: &str| Captured {
            key_id: key.to_owned(),
            value: ExternalityObservation::no_network_path(),
        };
        let clean = ExternalityObservation::no_network_path();
        assert_eq!(trusted.admit(Some(&by("provider-b"))), Some(&clean));
        assert_eq!(trusted.admit(Some(&by("tenant"))), None);
        // An empty id on a capture is never trusted, even from a list that
        // named it.
        assert_eq!(trusted.admit(Some(&by(""))), None);
        assert_eq!(trusted.admit::<ExternalityObservation>(None), None);
        // Nothing is trusted by an empty list.
        let none = TrustedCaptures::default();
        assert_eq!(none.admit(Some(&by("provider-a"))), None);
        let collected: TrustedCaptures = vec![String::from("k")].into_iter().collect();
        assert_eq!(collected, TrustedCaptures::new(["k"]));
        assert!(collected.trusts("k"));
        assert_eq!(
            json(&by("k")),
            r#"{"keyId":"k","value":{"networkWrites":false,"databaseCommits":false,"externalApiCalls":false}}"#
        );
        assert_eq!(
            check::<Captured<CostObservation>>(
                r#"{"keyId":"k","value":{"cpuTimeMs":1,"peakMemoryBytes":2},"sig":"x"}"#
            ),
            "unknown field `sig`, expected `keyId` or `value` at line 1 column 62"
        );
    }

    /// The rule as a table: how many flags are missing and how many are
    /// `true` decide it, for a milestone that has an observation.
    fn expected(m: bool, o: Option<ExternalityObservation>) -> Result<(), &'static str> {
        let Some(o) = o.filter(|_| m) else {
            return Err(if m {
                "externality_unobserved"
            } else {
                "no_milestone"
            });
        };
        let f = [o.network_writes, o.database_commits, o.external_api_calls];
        let trues = f.iter().filter(|v| **v == Some(true)).count();
        let nones = f.iter().filter(|v| v.is_none()).count();
        match (trues, nones) {
            (0, 0) => Ok(()),
            (0, _) => Err("externality_incomplete"),
            _ => Err("externality_observed"),
        }
    }

    #[test]
    fn reexecution_needs_a_complete_all_false_observation() {
        let mut eligible = 0;
        for m in [false, true] {
            for o in std::iter::once(None).chain(FLAG.iter().flat_map(|n| {
                FLAG.iter()
                    .flat_map(move |d| FLAG.iter().map(move |a| Some(x(*n, *d, *a))))
            })) {
                let ms = milestone(None, o);
                let got = reexecution_eligibility(m.then_some(&ms));
                let got = match got {
                    Eligibility::Eligible => Ok(()),
                    Eligibility::Ineligible(r) => Err(r.code()),
                };
                assert_eq!(got, expected(m, o), "{m} {o:?}");
                eligible += usize::from(got.is_ok());
            }
        }
        assert_eq!(eligible, 1);
        // A measured cost does not make a milestone eligible.
        let cost = CostObservation {
            cpu_time_ms: 0,
            peak_memory_bytes: 0,
        };
        let m = milestone(Some(cost), None);
        assert_eq!(
            reexecution_eligibility(Some(&m)),
            Eligibility::Ineligible(IneligibleReason::ExternalityUnobserved)
        );
        let m = milestone(None, Some(ExternalityObservation::no_network_path()));
        assert!(reexecution_eligibility(Some(&m)).is_eligible());
        assert!(!reexecution_eligibility(None).is_eligible());
        for (r, code) in [
            (IneligibleReason::NoMilestone, "no_milestone"),
            (
                IneligibleReason::ExternalityUnobserved,
                "externality_unobserved",
            ),
            (
                IneligibleReason::ExternalityIncomplete,
                "externality_incomplete",
            ),
            (
                IneligibleReason::ExternalityObserved,
                "externality_observed",
            ),
        ] {
            assert_eq!(r.code(), code);
            assert!(!Eligibility::Ineligible(r).is_eligible());
        }
    }

    #[test]
    fn a_whole_attempt_is_judged_on_its_own_observation() {
        let cost = CostObservation {
            cpu_time_ms: 0,
            peak_memory_bytes: 0,
        };
        let mut eligible = 0;
        for o in std::iter::once(None).chain(FLAG.iter().flat_map(|n| {
            FLAG.iter()
                .flat_map(move |d| FLAG.iter().map(move |a| Some(x(*n, *d, *a))))
        })) {
            for c in [None, Some(cost)] {
                let obs = o.map(|externality| AttemptObservation {
                    cost: c,
                    externality,
                });
                let got = match attempt_reexecution_eligibility(obs.as_ref()) {
                    Eligibility::Eligible => Ok(()),
                    Eligibility::Ineligible(r) => Err(r.code()),
                };
                assert_eq!(got, expected(true, o), "{o:?} {c:?}");
                eligible += usize::from(got.is_ok());
            }
        }
        // All false, with or without a cost; nothing else.
        assert_eq!(eligible, 2);
        assert_eq!(
            attempt_reexecution_eligibility(None),
            Eligibility::Ineligible(IneligibleReason::ExternalityUnobserved)
        );
    }

    #[test]
    fn an_attempt_observation_omits_what_was_not_measured() {
        let cost = CostObservation {
            cpu_time_ms: 0,
            peak_memory_bytes: 4096,
        };
        let o = AttemptObservation {
            cost: Some(cost),
            externality: ExternalityObservation::no_network_path(),
        };
        assert_eq!(
            check::<AttemptObservation>(&json(&o)),
            r#"ok {"cost":{"cpuTimeMs":0,"peakMemoryBytes":4096},"externality":{"networkWrites":false,"databaseCommits":false,"externalApiCalls":false}}"#
        );
        let o = AttemptObservation {
            cost: None,
            externality: ExternalityObservation::absent(),
        };
        assert_eq!(json(&o), r#"{"externality":{}}"#);
        for bad in [
            r#"{"cost":null,"externality":{}}"#,
            r#"{"cost":{"cpuTimeMs":1,"peakMemoryBytes":1}}"#,
            r#"{"externality":{},"unknownField":1}"#,
        ] {
            assert!(
                serde_json::from_str::<AttemptObservation>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_attempt_is_measured_only_when_every_generation_is() {
        let o = |cpu_time_ms, peak_memory_bytes, externality| {
            Some(AttemptObservation {
                cost: Some(CostObservation {
                    cpu_time_ms,
                    peak_memory_bytes,
                }),
                externality,
            })
        };
        let clean = ExternalityObservation::no_network_path();
        assert_eq!(AttemptObservation::of_generations([]), None);
        assert_eq!(
            AttemptObservation::of_generations([o(3, 7, clean)]),
            o(3, 7, clean)
        );
        // CPU time adds up, the peak is the largest.
        assert_eq!(
            AttemptObservation::of_generations([o(3, 7, clean), o(5, 4, clean), o(1, 9, clean)]),
            o(9, 9, clean)
        );
        // One unmeasured generation leaves the whole attempt unmeasured,
        // wherever it is.
        for i in 0..3 {
            let mut g = [o(1, 1, clean), o(1, 1, clean), o(1, 1, clean)];
            g[i] = None;
            assert_eq!(AttemptObservation::of_generations(g), None, "{i}");
        }
        // An unknown cost, or a sum past 2^53 - 1, is an unknown cost.
        let no_cost = Some(AttemptObservation {
            cost: None,
            externality: clean,
        });
        assert_eq!(
            AttemptObservation::of_generations([o(3, 7, clean), no_cost]),
            no_cost
        );
        assert_eq!(
            AttemptObservation::of_generations([no_cost, o(3, 7, clean)]),
            no_cost
        );
        assert_eq!(
            AttemptObservation::of_generations([
                o(JSON_SAFE_INTEGER_MAX, 1, clean),
                o(1, 1, clean)
            ]),
            no_cost
        );
        assert_eq!(
            AttemptObservation::of_generations([
                o(JSON_SAFE_INTEGER_MAX - 1, 1, clean),
                o(1, 1, clean)
            ]),
            o(JSON_SAFE_INTEGER_MAX, 1, clean)
        );
        assert_eq!(
            AttemptObservation::of_generations([o(u64::MAX, 1, clean), o(1, 1, clean)]),
            no_cost
        );
        // Flags: true wins, then unknown, then false; against a table of
        // every pair.
        for a in FLAG {
            for b in FLAG {
                let want = if a == Some(true) || b == Some(true) {
                    Some(true)
                } else if a.is_none() || b.is_none() {
                    None
                } else {
                    Some(false)
                };
                for (first, second) in [(a, b), (b, a)] {
                    let got = AttemptObservation::of_generations([
                        o(1, 1, x(first, Some(false), None)),
                        o(1, 1, x(second, Some(false), None)),
                    ])
                    .unwrap()
                    .externality;
                    assert_eq!(got, x(want, Some(false), None), "{first:?} {second:?}");
                    let got = AttemptObservation::of_generations([
                        o(1, 1, x(None, first, Some(true))),
                        o(1, 1, x(None, second, Some(false))),
                    ])
                    .unwrap()
                    .externality;
                    assert_eq!(got, x(None, want, Some(true)), "{first:?} {second:?}");
                    let got = AttemptObservation::of_generations([
                        o(1, 1, x(Some(false), Some(false), first)),
                        o(1, 1, x(Some(false), Some(false), second)),
                    ])
                    .unwrap()
                    .externality;
                    assert_eq!(
                        got,
                        x(Some(false), Some(false), want),
                        "{first:?} {second:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_later_measurement_never_drops_what_was_measured() {
        let cost = |cpu_time_ms| {
            Some(CostObservation {
                cpu_time_ms,
                peak_memory_bytes: 1,
            })
        };
        let o = |cost, externality| AttemptObservation { cost, externality };
        let clean = ExternalityObservation::no_network_path();
        let none = ExternalityObservation::absent();
        // A cost replaces a cost or an unknown one; an unknown one replaces
        // only an unknown one.
        assert!(o(cost(9), clean).supersedes(&o(cost(5), clean)));
        assert!(o(cost(5), clean).supersedes(&o(None, clean)));
        assert!(o(None, clean).supersedes(&o(None, clean)));
        assert!(!o(None, clean).supersedes(&o(cost(5), clean)));
        // A smaller cost is an older measurement: it never replaces a
        // larger one, in either number.
        let c = |cpu_time_ms, peak_memory_bytes| {
            Some(CostObservation {
                cpu_time_ms,
                peak_memory_bytes,
            })
        };
        assert!(o(c(9, 5), clean).supersedes(&o(c(9, 5), clean)));
        assert!(o(c(10, 6), clean).supersedes(&o(c(9, 5), clean)));
        assert!(!o(c(8, 6), clean).supersedes(&o(c(9, 5), clean)));
        assert!(!o(c(10, 4), clean).supersedes(&o(c(9, 5), clean)));
        // A side effect once observed stays observed.
        let wrote = x(Some(true), Some(false), Some(false));
        assert!(!o(cost(5), clean).supersedes(&o(cost(5), wrote)));
        assert!(o(cost(5), wrote).supersedes(&o(cost(5), wrote)));
        assert!(o(cost(5), wrote).supersedes(&o(cost(5), clean)));
        for i in 0..3 {
            let mut flags = [None; 3];
            flags[i] = Some(true);
            let stored = x(flags[0], flags[1], flags[2]);
            assert!(!o(cost(5), clean).supersedes(&o(cost(5), stored)), "{i}");
            assert!(!o(cost(5), none).supersedes(&o(cost(5), stored)), "{i}");
            assert!(
                o(cost(5), x(Some(true), Some(true), Some(true))).supersedes(&o(cost(5), stored)),
                "{i}"
            );
        }
        // Each flag observed false: observed replaces it, unobserved does not.
        for (i, stored) in [
            x(Some(false), None, None),
            x(None, Some(false), None),
            x(None, None, Some(false)),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(!o(cost(5), none).supersedes(&o(cost(5), stored)), "{i}");
            assert!(o(cost(5), clean).supersedes(&o(cost(5), stored)), "{i}");
            assert!(o(cost(5), stored).supersedes(&o(cost(5), none)), "{i}");
        }
    }

    #[test]
    fn a_retry_from_a_measured_ancestor_reports_its_prefix_cost() {
        let cost = CostObservation {
            cpu_time_ms: 1500,
            peak_memory_bytes: 0,
        };
        let m = milestone(Some(cost), None);
        let r = RetryReceipt::new(ExecId(7), 3, 2, Some((4, &m))).unwrap();
        let bytes = format!(
            r#"{{"ancestor":{{"head":"{HEAD}","milestoneSeq":4}},"attempt":3,"execId":7,"fromGeneration":2,"reusedPrefixCost":{{"cpuTimeMs":1500,"peakMemoryBytes":0}},"version":2}}"#
        );
        assert_eq!(String::from_utf8(r.canonical_bytes()).unwrap(), bytes);
        assert_eq!(r.exec_id(), ExecId(7));
        assert_eq!(r.attempt(), 3);
        assert_eq!(r.from_generation(), 2);
        assert_eq!(
            r.ancestor(),
            Some(&AncestorRef {
                milestone_seq: 4,
                head: HEAD.to_owned()
            })
        );
        assert_eq!(r.reused_prefix_cost(), Some(cost));
        let stored = StoredRetryReceipt::parse(bytes.as_bytes()).unwrap();
        assert_eq!(stored, StoredRetryReceipt::V2(r));
        assert_eq!(stored.bytes(), bytes.as_bytes());
    }

    #[test]
    fn unknown_cost_and_base_fallback_omit_the_prefix_cost() {
        // The ancestor's cost was not observed: the field is omitted.
        let m = milestone(None, Some(ExternalityObservation::no_network_path()));
        let r = RetryReceipt::new(ExecId(1), 2, 1, Some((0, &m))).unwrap();
        let bytes = format!(
            r#"{{"ancestor":{{"head":"{HEAD}","milestoneSeq":0}},"attempt":2,"execId":1,"fromGeneration":1,"version":2}}"#
        );
        assert_eq!(r.canonical_bytes(), bytes.as_bytes());
        assert_eq!(r.reused_prefix_cost(), None);
        assert_eq!(
            StoredRetryReceipt::parse(bytes.as_bytes()),
            Ok(StoredRetryReceipt::V2(r))
        );
        // Base-generation fallback: no ancestor, no prefix cost.
        let r = RetryReceipt::new(ExecId(-5), u32::MAX, JSON_SAFE_INTEGER_MAX, None).unwrap();
        let bytes =
            r#"{"attempt":4294967295,"execId":-5,"fromGeneration":9007199254740991,"version":2}"#;
        assert_eq!(r.canonical_bytes(), bytes.as_bytes());
        assert_eq!((r.ancestor(), r.reused_prefix_cost()), (None, None));
        let stored = StoredRetryReceipt::parse(bytes.as_bytes()).unwrap();
        assert_eq!(stored.bytes(), bytes.as_bytes());
        assert_eq!(stored, StoredRetryReceipt::V2(r));
    }

    fn refusal(bytes: &[u8]) -> (&'static str, String) {
        let e = StoredRetryReceipt::parse(bytes).unwrap_err();
        (e.code(), e.to_string())
    }

    #[test]
    fn a_v2_receipt_is_read_only_in_its_canonical_bytes() {
        let base = r#"{"attempt":2,"execId":1,"fromGeneration":1,"version":2}"#;
        assert!(StoredRetryReceipt::parse(base.as_bytes()).is_ok());
        let not_canonical = (
            "receipt_not_canonical",
            "a version 2 retry receipt is stored in its canonical (JCS) bytes".to_owned(),
        );
        for b in [
            format!("{base}\n"),
            format!(" {base}"),
            r#"{"execId":1,"attempt":2,"fromGeneration":1,"version":2}"#.to_owned(),
        ] {
            assert_eq!(refusal(b.as_bytes()), not_canonical, "{b}");
        }
        for (b, code, text) in [
            (
                r#"{"ancestor":null,"attempt":2,"execId":1,"fromGeneration":1,"version":2}"#,
                "receipt_malformed",
                "retry receipt version 2 is malformed: invalid type: null, expected struct AncestorRef at line 1 column 16",
            ),
            (
                r#"{"attempt":2,"execId":1,"fromGeneration":1,"reusedPrefixCost":null,"version":2}"#,
                "receipt_malformed",
                "retry receipt version 2 is malformed: invalid type: null, expected struct CostObservation at line 1 column 66",
            ),
            (
                r#"{"attempt":2,"execId":1,"fromGeneration":1,"reusedPrefixCost":{"cpuTimeMs":1,"peakMemoryBytes":2},"version":2}"#,
                "receipt_prefix_cost_without_ancestor",
                "a retry receipt without an ancestor has no reusedPrefixCost",
            ),
            (
                r#"{"attempt":2,"execId":1,"version":2}"#,
                "receipt_malformed",
                "retry receipt version 2 is malformed: missing field `fromGeneration` at line 1 column 36",
            ),
            (
                r#"{"attempt":2,"execId":1,"fromGeneration":1,"note":"x","version":2}"#,
                "receipt_malformed",
                "retry receipt version 2 is malformed: unknown field `note`, expected one of `version`, `execId`, `attempt`, `fromGeneration`, `ancestor`, `reusedPrefixCost` at line 1 column 49",
            ),
        ] {
            assert_eq!(refusal(b.as_bytes()), (code, text.to_owned()), "{b}");
        }
        // With an ancestor, a prefix cost is read back as written.
        let m = milestone(
            Some(CostObservation {
                cpu_time_ms: 9,
                peak_memory_bytes: 8,
            }),
            None,
        );
        let r = RetryReceipt::new(ExecId(2), 5, 4, Some((1, &m))).unwrap();
        let back = StoredRetryReceipt::parse(&r.canonical_bytes()).unwrap();
        assert_eq!(back, StoredRetryReceipt::V2(r));
    }

    #[test]
    fn v1_receipts_replay_their_exact_bytes() {
        for (bytes, exec, attempt, generation, cpu, mem) in [
            (V1_COMPACT, 7, 2, 1, 1500, 268_435_456),
            (V1_ODD, 9, 3, 2, 0, 0),
            (V1_PRETTY, 12, 4, 3, u64::MAX, 1),
        ] {
            let v1 = LegacyRetryReceiptV1::parse(bytes).unwrap();
            assert_eq!(v1.bytes(), bytes);
            assert_eq!(
                (v1.exec_id(), v1.attempt(), v1.from_generation()),
                (ExecId(exec), attempt, generation)
            );
            assert_eq!(
                v1.legacy_cost(),
                CostObservation {
                    cpu_time_ms: cpu,
                    peak_memory_bytes: mem
                }
            );
            let stored = StoredRetryReceipt::parse(bytes).unwrap();
            assert_eq!(stored.bytes(), bytes);
            assert_eq!(stored, StoredRetryReceipt::V1(v1));
        }
        // The odd fixture really is odd: its bytes are not a re-serialization.
        assert!(V1_ODD.starts_with(b"\r\n  {\t"));
        assert!(V1_ODD.ends_with(b"}  \n\n"));
    }

    #[test]
    fn a_v1_receipt_needs_its_version_and_cost_field() {
        let f = LEGACY_COST_FIELD;
        let cost = r#"{"cpuTimeMs":1,"peakMemoryBytes":2}"#;
        let ok =
            format!(r#"{{"version":1,"execId":1,"attempt":2,"fromGeneration":1,"{f}":{cost}}}"#);
        assert!(LegacyRetryReceiptV1::parse(ok.as_bytes()).is_ok());
        let v1 = |e: ReceiptError| (e.code(), e.to_string());
        for (b, code, text) in [
            (
                r#"{"version":1,"execId":1,"attempt":2,"fromGeneration":1}"#.to_owned(),
                "receipt_malformed",
                format!("retry receipt version 1 is malformed: missing field `{f}` at line 1 column 55"),
            ),
            (
                format!(r#"{{"version":1,"execId":1,"attempt":2,"fromGeneration":1,"{f}":null}}"#),
                "receipt_malformed",
                "retry receipt version 1 is malformed: invalid type: null, expected struct CostObservation at line 1 column 71".to_owned(),
            ),
            (
                format!(r#"{{"version":1,"execId":1,"attempt":2,"fromGeneration":1,"{f}":{cost},"ancestor":{{}}}}"#),
                "receipt_malformed",
                format!("retry receipt version 1 is malformed: unknown field `ancestor`, expected one of `version`, `execId`, `attempt`, `fromGeneration`, `{f}` at line 1 column 113"),
            ),
            (
                format!(r#"{{"execId":1,"attempt":2,"fromGeneration":1,"{f}":{cost}}}"#),
                "receipt_version_unknown",
                "retry receipt version missing is not a known version (1 or 2)".to_owned(),
            ),
            (
                format!(r#"{{"version":"1","execId":1,"attempt":2,"fromGeneration":1,"{f}":{cost}}}"#),
                "receipt_version_unknown",
                "retry receipt version \"1\" is not a known version (1 or 2)".to_owned(),
            ),
            (
                r#"{"attempt":2,"execId":1,"fromGeneration":1,"version":2}"#.to_owned(),
                "receipt_version_unknown",
                "retry receipt version 2 is not a known version (1 or 2)".to_owned(),
            ),
            (
                "[1]".to_owned(),
                "receipt_not_object",
                "a retry receipt is a JSON object".to_owned(),
            ),
            (
                "{".to_owned(),
                "receipt_not_json",
                "a retry receipt is JSON: EOF while parsing an object at line 1 column 1".to_owned(),
            ),
        ] {
            assert_eq!(
                v1(LegacyRetryReceiptV1::parse(b.as_bytes()).unwrap_err()),
                (code, text),
                "{b}"
            );
        }
    }

    #[test]
    fn a_stored_receipt_of_another_version_is_refused() {
        for (b, code, text) in [
            (
                r#"{"version":3}"#,
                "receipt_version_unknown",
                "retry receipt version 3 is not a known version (1 or 2)",
            ),
            (
                r#"{"version":0}"#,
                "receipt_version_unknown",
                "retry receipt version 0 is not a known version (1 or 2)",
            ),
            (
                r#"{"version":4294967297}"#,
                "receipt_version_unknown",
                "retry receipt version 4294967297 is not a known version (1 or 2)",
            ),
            (
                r#"{"version":-1}"#,
                "receipt_version_unknown",
                "retry receipt version -1 is not a known version (1 or 2)",
            ),
            (
                r#"{"version":2.0}"#,
                "receipt_version_unknown",
                "retry receipt version 2.0 is not a known version (1 or 2)",
            ),
            (
                "null",
                "receipt_not_object",
                "a retry receipt is a JSON object",
            ),
            (
                "",
                "receipt_not_json",
                "a retry receipt is JSON: EOF while parsing a value at line 1 column 0",
            ),
            (
                r#"{"version":1} x"#,
                "receipt_not_json",
                "a retry receipt is JSON: trailing characters at line 1 column 15",
            ),
        ] {
            assert_eq!(refusal(b.as_bytes()), (code, text.to_owned()), "{b}");
        }
        // Every code is distinct and snake_case.
        let codes = [
            ReceiptError::NotJson {
                reason: String::new(),
            }
            .code(),
            ReceiptError::NotObject.code(),
            ReceiptError::VersionUnknown {
                version: String::new(),
            }
            .code(),
            ReceiptError::Malformed {
                version: 1,
                reason: String::new(),
            }
            .code(),
            ReceiptError::NotCanonical.code(),
            ReceiptError::PrefixCostWithoutAncestor.code(),
            ReceiptError::NumberOutOfRange {
                field: "",
                value: 0,
            }
            .code(),
        ];
        assert_eq!(
            codes,
            [
                "receipt_not_json",
                "receipt_not_object",
                "receipt_version_unknown",
                "receipt_malformed",
                "receipt_not_canonical",
                "receipt_prefix_cost_without_ancestor",
                "receipt_number_out_of_range"
            ]
        );
        assert_eq!(RETRY_RECEIPT_VERSION, 2);
        assert_eq!(JSON_SAFE_INTEGER_MAX, 9_007_199_254_740_991);
        assert_eq!(LEGACY_RETRY_RECEIPT_VERSION, 1);
    }

    #[test]
    fn every_integer_fits_canonical_json_exactly() {
        const MAX: u64 = JSON_SAFE_INTEGER_MAX;
        let max = i64::try_from(MAX).unwrap();
        let cost = |cpu_time_ms, peak_memory_bytes| {
            milestone(
                Some(CostObservation {
                    cpu_time_ms,
                    peak_memory_bytes,
                }),
                None,
            )
        };
        let ok = cost(MAX, MAX);
        let r = RetryReceipt::new(ExecId(max), 1, MAX, Some((u32::MAX, &ok))).unwrap();
        assert_eq!(
            StoredRetryReceipt::parse(&r.canonical_bytes()),
            Ok(StoredRetryReceipt::V2(r))
        );
        assert!(RetryReceipt::new(ExecId(-max), 1, 0, None).is_ok());
        let over = |e: Result<RetryReceipt, ReceiptError>| e.unwrap_err().to_string();
        let text = |f: &str, v: &str| {
            format!(
                "retry receipt field {f} is {v}; canonical JSON holds integers exactly only up to 9007199254740991 in magnitude"
            )
        };
        let two53 = "9007199254740992";
        assert_eq!(
            over(RetryReceipt::new(ExecId(max + 1), 1, 0, None)),
            text("execId", two53)
        );
        assert_eq!(
            over(RetryReceipt::new(ExecId(-max - 1), 1, 0, None)),
            text("execId", "-9007199254740992")
        );
        assert_eq!(
            over(RetryReceipt::new(ExecId(1), 1, MAX + 1, None)),
            text("fromGeneration", two53)
        );
        assert_eq!(
            over(RetryReceipt::new(
                ExecId(1),
                1,
                0,
                Some((0, &cost(MAX + 1, 0)))
            )),
            text("reusedPrefixCost.cpuTimeMs", two53)
        );
        assert_eq!(
            over(RetryReceipt::new(
                ExecId(1),
                1,
                0,
                Some((0, &cost(0, u64::MAX)))
            )),
            text("reusedPrefixCost.peakMemoryBytes", "18446744073709551615")
        );
        // Read back, a number JCS would round is refused by name, not as
        // merely non-canonical.
        let e = StoredRetryReceipt::parse(
            br#"{"attempt":1,"execId":1,"fromGeneration":9007199254740993,"version":2}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.code(), e.to_string()),
            (
                "receipt_number_out_of_range",
                text("fromGeneration", "9007199254740993")
            )
        );
    }
}
