//! Approvals: a tenant's approval policy (set by the administrator), the
//! decision an approver records on an exec awaiting approval, and the
//! start gate of an approved exec, all on the cut.
//!
//! # Rules
//!
//! * A tenant's [`ApprovalPolicy`] says which shapes need an approval:
//!   none (`off`, the default), those whose network is on (`network`),
//!   every shape (`all`) or the shapes it names (`shapes`).
//! * An exec whose shape needs one is admitted `awaiting_approval`: it
//!   holds no capacity (no Reservation, no Lease) until an approver
//!   approves it on a certain cut; the approval is valid until
//!   `valid_until = decided cut + validity`, validity in
//!   `1..=`[`APPROVAL_VALIDITY_MAX`] ([`APPROVAL_VALIDITY_DEFAULT`] when
//!   the approver names none), and `valid_until` is a deadline on the cut
//!   like any other (within `cut + horizon`).
//! * The start gate ([`check_approval_start`]): the first Lease of an
//!   approved exec is allocated only while a certain cut is below
//!   `valid_until`; a certain cut at or past it ends the exec
//!   `approval_expired` ([`plan_gated_start`]); an uncertain cut waits.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::model::{CutReading, ExecId, LeaseAction, TenantId, TerminalReason};
use crate::shape::{SHAPES, Shape};

/// The validity of an approval when its approver names none: 15 min.
pub const APPROVAL_VALIDITY_DEFAULT: SignedDuration = SignedDuration::from_mins(15);

/// The longest validity of an approval: 1 h. An approval is a deadline on
/// the cut, so it also fits within `cut + horizon`.
pub const APPROVAL_VALIDITY_MAX: SignedDuration = SignedDuration::from_hours(1);

/// The longest reason of a denial, in bytes.
pub const DENY_REASON_BYTES_MAX: usize = 512;

/// Which shapes of a tenant need an approval before they hold capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApprovalRequire {
    /// None (the default).
    #[serde(rename = "off")]
    Off,
    /// Shapes whose network is on ([`Shape::network`]).
    #[serde(rename = "network")]
    Network,
    /// Every shape.
    #[serde(rename = "all")]
    All,
    /// The shapes the policy names ([`ApprovalPolicy::shapes`]).
    #[serde(rename = "shapes")]
    Shapes,
}

impl ApprovalRequire {
    /// The stable snake_case name (as stored and shown).
    pub fn as_str(&self) -> &'static str {
        match self {
            ApprovalRequire::Off => "off",
            ApprovalRequire::Network => "network",
            ApprovalRequire::All => "all",
            ApprovalRequire::Shapes => "shapes",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s text.
    pub fn parse(s: &str) -> Option<ApprovalRequire> {
        match s {
            "off" => Some(ApprovalRequire::Off),
            "network" => Some(ApprovalRequire::Network),
            "all" => Some(ApprovalRequire::All),
            "shapes" => Some(ApprovalRequire::Shapes),
            _ => None,
        }
    }
}

impl fmt::Display for ApprovalRequire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tenant's approval policy: `require`, and with
/// [`ApprovalRequire::Shapes`] the shape names (1 to
/// [`SHAPES`]`.len()` known names, sorted in [`SHAPES`]' order, no
/// duplicates; empty otherwise). Built by [`ApprovalPolicy::new`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ApprovalPolicy {
    /// Which shapes need an approval.
    pub require: ApprovalRequire,
    /// The shapes named, with [`ApprovalRequire::Shapes`].
    #[serde(default)]
    pub shapes: Vec<String>,
}

impl Default for ApprovalPolicy {
    fn default() -> ApprovalPolicy {
        ApprovalPolicy {
            require: ApprovalRequire::Off,
            shapes: Vec::new(),
        }
    }
}

impl ApprovalPolicy {
    /// Checks and builds a policy: `shapes` must be empty unless `require`
    /// is [`ApprovalRequire::Shapes`], then non-empty known shape names;
    /// duplicates collapse and the names are kept in [`SHAPES`]' order.
    ///
    /// # Errors
    /// [`LcError::InvalidApprovalPolicy`] for shapes with another
    /// `require` or none with `shapes`; [`LcError::InvalidShape`] for an
    /// unknown name.
    pub fn new(require: ApprovalRequire, shapes: &[String]) -> Result<ApprovalPolicy, LcError> {
        if require != ApprovalRequire::Shapes {
            if !shapes.is_empty() {
                return Err(LcError::InvalidApprovalPolicy {
                    reason: format!(
                        "shape names are given only with require = shapes, not {require}"
                    ),
                });
            }
            return Ok(ApprovalPolicy {
                require,
                shapes: Vec::new(),
            });
        }
        if shapes.is_empty() {
            return Err(LcError::InvalidApprovalPolicy {
                reason: "require = shapes names at least one shape".into(),
            });
        }
        for name in shapes {
            Shape::by_name(name)?;
        }
        let shapes = SHAPES
            .iter()
            .filter(|s| shapes.iter().any(|n| n == s.name))
            .map(|s| s.name.to_owned())
            .collect();
        Ok(ApprovalPolicy { require, shapes })
    }

    /// Whether an exec of `shape` needs an approval under this policy.
    pub fn requires(&self, shape: &Shape) -> bool {
        match self.require {
            ApprovalRequire::Off => false,
            ApprovalRequire::Network => shape.network,
            ApprovalRequire::All => true,
            ApprovalRequire::Shapes => self.shapes.iter().any(|n| n == shape.name),
        }
    }
}

/// An approver's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApprovalDecision {
    /// Approved: the exec was admitted with its Reservation and Lease.
    #[serde(rename = "approved")]
    Approved,
    /// Denied: the exec is terminal (`denied`).
    #[serde(rename = "denied")]
    Denied,
}

impl ApprovalDecision {
    /// The stable snake_case name (as stored and shown).
    pub fn as_str(&self) -> &'static str {
        match self {
            ApprovalDecision::Approved => "approved",
            ApprovalDecision::Denied => "denied",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s text.
    pub fn parse(s: &str) -> Option<ApprovalDecision> {
        match s {
            "approved" => Some(ApprovalDecision::Approved),
            "denied" => Some(ApprovalDecision::Denied),
            _ => None,
        }
    }
}

/// Which credential decided an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApproverKind {
    /// The administrator's token (acting for the tenant).
    #[serde(rename = "admin")]
    Admin,
    /// The tenant's own API key.
    #[serde(rename = "tenant")]
    Tenant,
}

impl ApproverKind {
    /// The stable snake_case name (as stored and shown).
    pub fn as_str(&self) -> &'static str {
        match self {
            ApproverKind::Admin => "admin",
            ApproverKind::Tenant => "tenant",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s text.
    pub fn parse(s: &str) -> Option<ApproverKind> {
        match s {
            "admin" => Some(ApproverKind::Admin),
            "tenant" => Some(ApproverKind::Tenant),
            _ => None,
        }
    }
}

/// A recorded decision on an exec that awaited approval. Immutable once
/// written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The exec.
    pub exec_id: ExecId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Approved or denied.
    pub decision: ApprovalDecision,
    /// Who decided.
    pub approver: ApproverKind,
    /// The certain cut the decision was made at.
    pub decided_cut: Timestamp,
    /// The validity asked for, in milliseconds (approved only).
    pub validity_ms: Option<u64>,
    /// `decided_cut + validity` on the cut (approved only): the exec's
    /// first Lease is allocated only while a certain cut is below it.
    pub valid_until: Option<Timestamp>,
    /// The denial's reason (denied only; at most
    /// [`DENY_REASON_BYTES_MAX`] bytes).
    pub reason: Option<String>,
}

/// A tenant's approvals: the execs awaiting approval and the newest
/// decisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalsPage {
    /// Execs awaiting approval, oldest first.
    pub awaiting: Vec<crate::model::ExecRecord>,
    /// Recorded decisions, newest first.
    pub decisions: Vec<ApprovalRecord>,
}

/// The validity of an approval: `validity_ms` when given (`1..=`
/// [`APPROVAL_VALIDITY_MAX`] in ms), else `default`.
///
/// # Errors
/// [`LcError::InvalidValidity`] for 0 or more than the maximum.
pub fn check_validity(
    validity_ms: Option<u64>,
    default: SignedDuration,
) -> Result<SignedDuration, LcError> {
    let Some(ms) = validity_ms else {
        return Ok(default);
    };
    let max_ms = APPROVAL_VALIDITY_MAX.as_millis() as u64;
    if ms == 0 || ms > max_ms {
        return Err(LcError::InvalidValidity {
            reason: format!("validity_ms {ms} is outside 1..={max_ms}"),
        });
    }
    Ok(SignedDuration::from_millis(ms as i64))
}

/// Checks a configured default validity: positive and at most
/// [`APPROVAL_VALIDITY_MAX`].
///
/// # Errors
/// [`LcError::InvalidValidity`].
pub fn check_default_validity(validity: SignedDuration) -> Result<SignedDuration, LcError> {
    if validity <= SignedDuration::ZERO || validity > APPROVAL_VALIDITY_MAX {
        return Err(LcError::InvalidValidity {
            reason: format!(
                "the default approval validity {validity:#} is outside (0, {APPROVAL_VALIDITY_MAX:#}]"
            ),
        });
    }
    Ok(validity)
}

/// Checks a denial's reason: at most [`DENY_REASON_BYTES_MAX`] bytes, no
/// control character.
///
/// # Errors
/// [`LcError::InvalidName`] naming the bound.
pub fn check_deny_reason(reason: Option<&str>) -> Result<Option<&str>, LcError> {
    match reason {
        Some(r) if r.len() > DENY_REASON_BYTES_MAX || r.chars().any(char::is_control) => {
            Err(LcError::InvalidName {
                reason: format!(
                    "a denial's reason is at most {DENY_REASON_BYTES_MAX} bytes without control characters"
                ),
            })
        }
        r => Ok(r),
    }
}

/// What the start gate says of an approved exec's first Lease at a
/// reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStart {
    /// A certain cut below `valid_until`: it may start.
    Start,
    /// The reading is uncertain: nothing starts and nothing expires.
    Wait,
    /// A certain cut at or past `valid_until`: it never starts.
    Expired,
}

/// The start gate: [`ApprovalStart::Start`] when `at` is certain and
/// `at.cut < valid_until`, [`ApprovalStart::Expired`] when certain and
/// `at.cut >= valid_until`, [`ApprovalStart::Wait`] while uncertain.
pub fn check_approval_start(valid_until: Timestamp, at: CutReading) -> ApprovalStart {
    if !at.certain {
        ApprovalStart::Wait
    } else if at.cut < valid_until {
        ApprovalStart::Start
    } else {
        ApprovalStart::Expired
    }
}

/// The reconciler's action for an approved exec's unstarted first Lease
/// (still `allocating`, nothing attached) whose approval is valid until
/// `valid_until`, given the `planned` action
/// ([`crate::rules::plan_lease_action`]): an allocation goes ahead only on
/// [`ApprovalStart::Start`] and waits (`None`) while uncertain; an expired
/// approval releases it as `approval_expired`, ahead of the Lease's own
/// expiry (the more specific reason: it never started). Any other plan
/// (a cancel, a destroy) is kept.
pub fn plan_gated_start(
    planned: LeaseAction,
    valid_until: Timestamp,
    at: CutReading,
) -> Option<LeaseAction> {
    match (planned, check_approval_start(valid_until, at)) {
        (
            LeaseAction::Allocate | LeaseAction::BeginRelease(TerminalReason::Expired),
            ApprovalStart::Expired,
        ) => Some(LeaseAction::BeginRelease(TerminalReason::ApprovalExpired)),
        (LeaseAction::Allocate, ApprovalStart::Wait) => None,
        (planned, _) => Some(planned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::{MEDIUM, SMALL, SMALL_NET};

    const BASE: i128 = 1_800_000_000_000_000_500;

    fn t(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    #[test]
    fn the_start_gate_is_exact_on_a_certain_cut() {
        let vu = t(BASE);
        assert_eq!(
            check_approval_start(vu, CutReading::certain(t(BASE - 1))),
            ApprovalStart::Start
        );
        assert_eq!(
            check_approval_start(vu, CutReading::certain(t(BASE))),
            ApprovalStart::Expired
        );
        assert_eq!(
            check_approval_start(vu, CutReading::certain(t(BASE + 1))),
            ApprovalStart::Expired
        );
        for off in [-1_000_000_000, -1, 0, 1, 10_i128.pow(15)] {
            assert_eq!(
                check_approval_start(vu, CutReading::uncertain(t(BASE + off), 1)),
                ApprovalStart::Wait
            );
        }
    }

    #[test]
    fn the_gated_plan_allocates_waits_or_ends_approval_expired() {
        let vu = t(BASE);
        let before = CutReading::certain(t(BASE - 1));
        let at = CutReading::certain(t(BASE));
        let unsure = CutReading::uncertain(t(BASE + 5), 2);
        let expired = LeaseAction::BeginRelease(TerminalReason::ApprovalExpired);
        assert_eq!(
            plan_gated_start(LeaseAction::Allocate, vu, before),
            Some(LeaseAction::Allocate)
        );
        assert_eq!(
            plan_gated_start(LeaseAction::Allocate, vu, at),
            Some(expired)
        );
        assert_eq!(plan_gated_start(LeaseAction::Allocate, vu, unsure), None);
        assert_eq!(
            plan_gated_start(LeaseAction::BeginRelease(TerminalReason::Expired), vu, at),
            Some(expired)
        );
        let cancel = LeaseAction::BeginRelease(TerminalReason::Cancelled);
        assert_eq!(plan_gated_start(cancel, vu, at), Some(cancel));
        assert_eq!(
            plan_gated_start(LeaseAction::Destroy, vu, unsure),
            Some(LeaseAction::Destroy)
        );
    }

    #[test]
    fn policies_name_their_shapes() {
        let off = ApprovalPolicy::default();
        let net = ApprovalPolicy::new(ApprovalRequire::Network, &[]).unwrap();
        let all = ApprovalPolicy::new(ApprovalRequire::All, &[]).unwrap();
        let named = ApprovalPolicy::new(
            ApprovalRequire::Shapes,
            &["medium".into(), "small".into(), "medium".into()],
        )
        .unwrap();
        assert_eq!(named.shapes, ["small", "medium"]);
        let needs = |p: &ApprovalPolicy| {
            [SMALL, MEDIUM, SMALL_NET]
                .iter()
                .map(|s| p.requires(s))
                .collect::<Vec<_>>()
        };
        assert_eq!(needs(&off), [false, false, false]);
        assert_eq!(needs(&net), [false, false, true]);
        assert_eq!(needs(&all), [true, true, true]);
        assert_eq!(needs(&named), [true, true, false]);
        assert_eq!(
            ApprovalPolicy::new(ApprovalRequire::Shapes, &[])
                .unwrap_err()
                .code(),
            "invalid_approval_policy"
        );
        assert_eq!(
            ApprovalPolicy::new(ApprovalRequire::All, &["small".into()])
                .unwrap_err()
                .code(),
            "invalid_approval_policy"
        );
        assert_eq!(
            ApprovalPolicy::new(ApprovalRequire::Shapes, &["huge".into()])
                .unwrap_err()
                .code(),
            "invalid_shape"
        );
    }

    #[test]
    fn validity_is_bounded() {
        let d = APPROVAL_VALIDITY_DEFAULT;
        assert_eq!(
            check_validity(None, d).unwrap(),
            SignedDuration::from_mins(15)
        );
        assert_eq!(
            check_validity(Some(1), d).unwrap(),
            SignedDuration::from_millis(1)
        );
        assert_eq!(
            check_validity(Some(3_600_000), d).unwrap(),
            SignedDuration::from_hours(1)
        );
        for bad in [0, 3_600_001, u64::MAX] {
            assert_eq!(
                check_validity(Some(bad), d).unwrap_err().code(),
                "invalid_validity"
            );
        }
        assert!(check_default_validity(APPROVAL_VALIDITY_MAX).is_ok());
        assert!(check_default_validity(SignedDuration::ZERO).is_err());
        assert!(
            check_default_validity(APPROVAL_VALIDITY_MAX + SignedDuration::from_nanos(1)).is_err()
        );
    }

    #[test]
    fn names_round_trip_exactly_and_unknown_names_are_none() {
        let requires = [
            (ApprovalRequire::Off, "off"),
            (ApprovalRequire::Network, "network"),
            (ApprovalRequire::All, "all"),
            (ApprovalRequire::Shapes, "shapes"),
        ];
        for (r, name) in requires {
            assert_eq!(r.as_str(), name);
            assert_eq!(r.to_string(), name);
            assert_eq!(ApprovalRequire::parse(name), Some(r));
        }
        let decisions = [
            (ApprovalDecision::Approved, "approved"),
            (ApprovalDecision::Denied, "denied"),
        ];
        for (d, name) in decisions {
            assert_eq!(d.as_str(), name);
            assert_eq!(ApprovalDecision::parse(name), Some(d));
        }
        let approvers = [
            (ApproverKind::Admin, "admin"),
            (ApproverKind::Tenant, "tenant"),
        ];
        for (k, name) in approvers {
            assert_eq!(k.as_str(), name);
            assert_eq!(ApproverKind::parse(name), Some(k));
        }
        for unknown in ["", "Off", "approve", "xyzzy"] {
            assert_eq!(ApprovalRequire::parse(unknown), None);
            assert_eq!(ApprovalDecision::parse(unknown), None);
            assert_eq!(ApproverKind::parse(unknown), None);
        }
    }

    #[test]
    fn a_deny_reason_is_bounded_to_the_byte() {
        let at_max = "r".repeat(DENY_REASON_BYTES_MAX);
        assert_eq!(check_deny_reason(Some(&at_max)), Ok(Some(at_max.as_str())));
        assert_eq!(check_deny_reason(Some("no")), Ok(Some("no")));
        assert_eq!(check_deny_reason(None), Ok(None));
        assert_eq!(DENY_REASON_BYTES_MAX, 512);
        let over = "r".repeat(DENY_REASON_BYTES_MAX + 1);
        for bad in [over.as_str(), "tab\there", "a\nb"] {
            assert_eq!(
                check_deny_reason(Some(bad)).map_err(|e| e.code()),
                Err("invalid_name"),
                "{bad}"
            );
        }
    }
}
