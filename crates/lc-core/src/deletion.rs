//! Deletion grace and retention deadlines, on the cut.
//!
//! # Deletion grace
//!
//! A tenant deletes a terminal exec's workspace (its snapshot chain) or
//! its output (its pages). Nothing goes at once: the deletion records
//! `deleted_at` (a **certain** cut: the deletion admits a deadline) and
//! `purge_after = deleted_at + grace` ([`DELETION_GRACE_DEFAULT`], at most
//! [`DELETION_GRACE_MAX`]). While deleted the item's reads are refused
//! (`workspace_deleted`, `output_deleted`, naming the undelete command and
//! the purge instant) and an undelete restores it unchanged: the rows were
//! never touched. The purge removes the item's rows only once a certain
//! cut has passed `purge_after` ([`is_purgeable`]: `cut >= purge_after`;
//! `purge_after - 1 ns` is not purgeable), exactly once; after it the item
//! answers `workspace_purged` / `output_purged` for good.
//!
//! # Retention
//!
//! A terminal exec's records (the exec, its attempts, Leases,
//! Reservations, pages, transition and resume receipts, evidence) are kept
//! until `retain_until = terminal cut + retention` ([`RETENTION_DEFAULT`],
//! at most [`RETENTION_MAX`], the ten-year horizon). They are purged only
//! once a certain cut has passed `retain_until` ([`is_retention_passed`])
//! and no deletion of the exec's workspace or output is still waiting for
//! its own purge ([`plan_exec_purge`]).
//!
//! Failure modes: an uncertain cut purges nothing and admits no deletion
//! (`time_uncertain`); a cut that stops advancing only delays purges; a
//! deletion undone and done again starts a new grace from its new cut.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::model::{CutReading, ExecId, ExecState};
use crate::rules;

/// The default deletion grace: 7 days between a deletion and its purge.
pub const DELETION_GRACE_DEFAULT: SignedDuration = SignedDuration::from_hours(7 * 24);

/// The longest deletion grace: 365 days (well inside the ten-year
/// horizon, so a deletion's `purge_after` always fits it).
pub const DELETION_GRACE_MAX: SignedDuration = SignedDuration::from_hours(365 * 24);

/// The default retention of a terminal exec's records: 30 days after its
/// terminal cut.
pub const RETENTION_DEFAULT: SignedDuration = SignedDuration::from_hours(30 * 24);

/// The longest retention: 3,650 days, the default sealed horizon
/// (`safetime::horizon::DEFAULT_HORIZON_MS`).
pub const RETENTION_MAX: SignedDuration = SignedDuration::from_hours(3_650 * 24);

/// The default purge batch: items (deletions or retained execs) purged per
/// worker step, each in its own transaction, so one step's work is bounded
/// by this many short transactions.
pub const PURGE_BATCH_DEFAULT: usize = 100;

/// What a deletion names: an exec's workspace or its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeletedItem {
    /// The workspace: its snapshot chain (the manifests) and head.
    Workspace,
    /// The output: every page of every attempt.
    Output,
}

impl DeletedItem {
    /// The stored and wire name: `workspace` or `output`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeletedItem::Workspace => "workspace",
            DeletedItem::Output => "output",
        }
    }

    /// The item of a stored name.
    pub fn parse(s: &str) -> Option<DeletedItem> {
        match s {
            "workspace" => Some(DeletedItem::Workspace),
            "output" => Some(DeletedItem::Output),
            _ => None,
        }
    }

    /// The `lc` command that undoes a deletion of this item of `exec`.
    pub fn undelete_command(self, exec: ExecId) -> String {
        match self {
            DeletedItem::Workspace => format!("lc workspace undelete {exec}"),
            DeletedItem::Output => format!("lc exec output {exec} --undelete"),
        }
    }
}

impl std::fmt::Display for DeletedItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a deletion stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeletionState {
    /// Deleted, restorable until the purge.
    Deleted,
    /// Undeleted: the item is readable again (the state an undelete
    /// answers; no stored deletion is in this state).
    Restored,
    /// Purged: the rows are gone; nothing restores them.
    Purged,
}

impl DeletionState {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeletionState::Deleted => "deleted",
            DeletionState::Restored => "restored",
            DeletionState::Purged => "purged",
        }
    }

    /// The state of a stored name.
    pub fn parse(s: &str) -> Option<DeletionState> {
        match s {
            "deleted" => Some(DeletionState::Deleted),
            "restored" => Some(DeletionState::Restored),
            "purged" => Some(DeletionState::Purged),
            _ => None,
        }
    }
}

/// A deletion of one item of one exec, instants on the cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletionRecord {
    /// The exec.
    pub exec_id: ExecId,
    /// What was deleted.
    pub item: DeletedItem,
    /// Where it stands.
    pub state: DeletionState,
    /// The certain cut of the deletion.
    pub deleted_at: Timestamp,
    /// The earliest cut at which it may be purged: `deleted_at + grace`.
    pub purge_after: Timestamp,
    /// The cut of the purge, once purged.
    pub purged_at: Option<Timestamp>,
}

/// What one purge step did (counts of this step only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeReport {
    /// Deleted workspaces purged (their snapshots removed).
    pub workspaces_purged: usize,
    /// Deleted outputs purged (their pages removed).
    pub outputs_purged: usize,
    /// Rows of snapshots and pages removed by those purges.
    pub rows_purged: u64,
    /// Terminal execs whose records were purged after their retention.
    pub execs_purged: usize,
}

/// Checks a configured deletion grace: positive and at most
/// [`DELETION_GRACE_MAX`].
///
/// # Errors
/// [`LcError::InvalidTimeout`] naming the bound.
pub fn check_grace(grace: SignedDuration) -> Result<SignedDuration, LcError> {
    if grace <= SignedDuration::ZERO || grace > DELETION_GRACE_MAX {
        return Err(LcError::InvalidTimeout {
            reason: format!(
                "the deletion grace {grace:#} must be positive and at most {DELETION_GRACE_MAX:#}"
            ),
        });
    }
    Ok(grace)
}

/// Checks a configured retention: positive and at most [`RETENTION_MAX`].
///
/// # Errors
/// [`LcError::InvalidTimeout`] naming the bound.
pub fn check_retention(retention: SignedDuration) -> Result<SignedDuration, LcError> {
    if retention <= SignedDuration::ZERO || retention > RETENTION_MAX {
        return Err(LcError::InvalidTimeout {
            reason: format!(
                "the retention {retention:#} must be positive and at most {RETENTION_MAX:#}"
            ),
        });
    }
    Ok(retention)
}

/// What a delete request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletePlan {
    /// Record a new deletion (state `deleted`).
    Record(DeletionRecord),
    /// The item is already deleted: answer that deletion unchanged (its
    /// grace is not extended).
    Already(DeletionRecord),
}

/// Decides a delete of `item` of `exec` (in state `exec_state`) at `at`,
/// given its current deletion `current` (none, or a stored `deleted` or
/// `purged` one), with grace `grace` inside `horizon`.
///
/// Checked in this order: the exec is terminal, the item is not purged, an
/// existing deletion is answered as it is, the cut is certain, and
/// `purge_after = at.cut + grace` fits `at.cut + horizon`.
///
/// # Errors
/// [`LcError::ExecNotTerminal`]; [`LcError::ItemPurged`];
/// [`LcError::TimeUncertain`] on an uncertain reading;
/// [`LcError::InvalidTimeout`] for a grace outside
/// [`check_grace`] or an unrepresentable instant;
/// [`LcError::DeadlineBeyondHorizon`].
pub fn plan_delete(
    exec: ExecId,
    exec_state: ExecState,
    item: DeletedItem,
    current: Option<&DeletionRecord>,
    at: CutReading,
    grace: SignedDuration,
    horizon: SignedDuration,
) -> Result<DeletePlan, LcError> {
    if exec_state != ExecState::Terminal {
        return Err(LcError::ExecNotTerminal {
            exec_id: exec,
            state: exec_state.as_str(),
            item,
        });
    }
    match current {
        Some(d) if d.state == DeletionState::Purged => return Err(purged(d)),
        Some(d) => return Ok(DeletePlan::Already(*d)),
        None => {}
    }
    let grace = check_grace(grace)?;
    rules::check_admission(at, horizon, &[])?;
    let purge_after = rules::deadline_after(at, grace)?;
    rules::check_admission(at, horizon, &[purge_after])?;
    Ok(DeletePlan::Record(DeletionRecord {
        exec_id: exec,
        item,
        state: DeletionState::Deleted,
        deleted_at: at.cut,
        purge_after,
        purged_at: None,
    }))
}

/// Decides an undelete of `item` of `exec` given its current deletion:
/// a `deleted` one is restored (the answer, state `restored`; the store
/// removes the deletion). Allowed on an uncertain cut: it admits no
/// deadline and only takes one away, and the purge, which needs a certain
/// cut, serializes with it on the deletion's row.
///
/// # Errors
/// [`LcError::ItemPurged`] once purged; [`LcError::NotDeleted`] when the
/// item is not deleted.
pub fn plan_undelete(
    exec: ExecId,
    item: DeletedItem,
    current: Option<&DeletionRecord>,
) -> Result<DeletionRecord, LcError> {
    match current {
        None => Err(LcError::NotDeleted {
            exec_id: exec,
            item,
        }),
        Some(d) if d.state == DeletionState::Purged => Err(purged(d)),
        Some(d) => Ok(DeletionRecord {
            state: DeletionState::Restored,
            ..*d
        }),
    }
}

/// Checks that `item` of `exec` may be read given its current deletion.
///
/// # Errors
/// [`LcError::ItemDeleted`] (naming the undelete command and the purge
/// instant) or [`LcError::ItemPurged`].
pub fn check_readable(current: Option<&DeletionRecord>) -> Result<(), LcError> {
    match current {
        None => Ok(()),
        Some(d) if d.state == DeletionState::Purged => Err(purged(d)),
        Some(d) => Err(LcError::ItemDeleted {
            exec_id: d.exec_id,
            item: d.item,
            purge_after: d.purge_after,
            undelete: d.item.undelete_command(d.exec_id),
        }),
    }
}

fn purged(d: &DeletionRecord) -> LcError {
    LcError::ItemPurged {
        exec_id: d.exec_id,
        item: d.item,
        purged_at: d.purged_at,
    }
}

/// Whether a deletion with `purge_after` may be purged at `at`: only on a
/// certain cut that has reached it (`at.cut >= purge_after`).
pub fn is_purgeable(purge_after: Timestamp, at: CutReading) -> bool {
    at.certain && at.cut >= purge_after
}

/// The deletions of `candidates` to purge at `at`, in their order: those
/// still `deleted` and [`is_purgeable`]; none on an uncertain cut.
pub fn plan_purge(candidates: &[DeletionRecord], at: CutReading) -> Vec<DeletionRecord> {
    candidates
        .iter()
        .filter(|d| d.state == DeletionState::Deleted && is_purgeable(d.purge_after, at))
        .map(|d| DeletionRecord {
            state: DeletionState::Purged,
            purged_at: Some(at.cut),
            ..*d
        })
        .collect()
}

/// `terminal + retention`: the retain-until instant of an exec that ended
/// at cut `terminal`.
///
/// # Errors
/// [`LcError::InvalidTimeout`] for a retention outside [`check_retention`]
/// or an unrepresentable instant.
pub fn retain_until(terminal: Timestamp, retention: SignedDuration) -> Result<Timestamp, LcError> {
    let retention = check_retention(retention)?;
    terminal
        .checked_add(retention)
        .map_err(|_| LcError::InvalidTimeout {
            reason: format!("terminal cut {terminal} + {retention:#} is not representable"),
        })
}

/// The retain-until of an exec that ends at cut `terminal` with
/// `retention`, inside `horizon`: `terminal + retention`, or `None` when
/// that lies beyond `terminal + horizon` (a horizon sealed shorter than
/// the retention): the exec is then kept until an operator sets one,
/// because its end (a release returning units) must never fail on its
/// retention and nothing may be purged before the retention it was
/// promised.
///
/// # Errors
/// As [`retain_until`].
pub fn plan_retain_until(
    terminal: Timestamp,
    retention: SignedDuration,
    horizon: SignedDuration,
) -> Result<Option<Timestamp>, LcError> {
    let until = retain_until(terminal, retention)?;
    Ok(match terminal.checked_add(horizon) {
        Ok(bound) if until > bound => None,
        _ => Some(until),
    })
}

/// Whether a terminal exec retained until `retain_until` may have its
/// records purged at `at`: only on a certain cut that has reached it.
pub fn is_retention_passed(retain_until: Timestamp, at: CutReading) -> bool {
    at.certain && at.cut >= retain_until
}

/// Whether the terminal exec retained until `retain_until`, whose
/// deletions are `deletions`, is purged at `at`: its retention has passed
/// and no deletion of it waits for its own purge (a `deleted` one is
/// restorable until then, so the exec's records stay with it).
pub fn plan_exec_purge(
    retain_until: Timestamp,
    deletions: &[DeletionRecord],
    at: CutReading,
) -> bool {
    is_retention_passed(retain_until, at)
        && deletions.iter().all(|d| d.state == DeletionState::Purged)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Timestamp = Timestamp::constant(1_800_000_000, 0);
    const NS: SignedDuration = SignedDuration::from_nanos(1);
    const HORIZON: SignedDuration = SignedDuration::from_hours(3_650 * 24);

    fn deleted(purge_after: Timestamp) -> DeletionRecord {
        DeletionRecord {
            exec_id: ExecId(7),
            item: DeletedItem::Workspace,
            state: DeletionState::Deleted,
            deleted_at: BASE,
            purge_after,
            purged_at: None,
        }
    }

    #[test]
    fn purge_is_due_exactly_at_purge_after_on_a_certain_cut() {
        let p = BASE + DELETION_GRACE_DEFAULT;
        // (cut, certain, purgeable)
        let rows = [
            (p - NS, true, false),
            (p, true, true),
            (p + NS, true, true),
            (p, false, false),
            (p + DELETION_GRACE_MAX, false, false),
        ];
        for (cut, certain, want) in rows {
            let at = CutReading {
                cut,
                certain,
                retry_after_s: 1,
            };
            assert_eq!(is_purgeable(p, at), want, "{cut} {certain}");
            let planned = plan_purge(&[deleted(p)], at);
            assert_eq!(planned.len(), usize::from(want), "{cut} {certain}");
        }
        let planned = plan_purge(&[deleted(p)], CutReading::certain(p));
        assert_eq!(planned[0].state, DeletionState::Purged);
        assert_eq!(planned[0].purged_at, Some(p));
    }

    #[test]
    fn a_delete_records_the_cut_plus_the_grace_to_the_nanosecond() {
        let at = CutReading::certain(BASE + NS);
        let plan = plan_delete(
            ExecId(7),
            ExecState::Terminal,
            DeletedItem::Output,
            None,
            at,
            DELETION_GRACE_DEFAULT,
            HORIZON,
        )
        .unwrap();
        let DeletePlan::Record(d) = plan else {
            panic!("{plan:?}")
        };
        assert_eq!(d.deleted_at, BASE + NS);
        assert_eq!(
            d.purge_after.as_nanosecond(),
            BASE.as_nanosecond() + 1 + 7 * 86_400_000_000_000
        );
        // Already deleted: the same record, grace not extended.
        let again = plan_delete(
            ExecId(7),
            ExecState::Terminal,
            DeletedItem::Output,
            Some(&d),
            CutReading::certain(BASE + SignedDuration::from_hours(1)),
            DELETION_GRACE_DEFAULT,
            HORIZON,
        );
        assert_eq!(again, Ok(DeletePlan::Already(d)));
    }

    #[test]
    fn a_delete_is_refused_while_running_uncertain_or_beyond_the_horizon() {
        let del = |state, at, grace, horizon| {
            plan_delete(
                ExecId(7),
                state,
                DeletedItem::Workspace,
                None,
                at,
                grace,
                horizon,
            )
            .map_err(|e| e.code())
        };
        let c = CutReading::certain(BASE);
        let u = CutReading::uncertain(BASE, 3);
        let g = DELETION_GRACE_DEFAULT;
        assert_eq!(
            del(ExecState::Running, c, g, HORIZON),
            Err("exec_not_terminal")
        );
        assert_eq!(
            del(ExecState::Hibernated, c, g, HORIZON),
            Err("exec_not_terminal")
        );
        assert_eq!(
            del(ExecState::Terminal, u, g, HORIZON),
            Err("time_uncertain")
        );
        assert_eq!(
            del(ExecState::Terminal, c, g, g - NS),
            Err("deadline_beyond_horizon")
        );
        assert!(del(ExecState::Terminal, c, g, g).is_ok());
        assert_eq!(
            del(ExecState::Terminal, c, DELETION_GRACE_MAX + NS, HORIZON),
            Err("invalid_timeout")
        );
        assert_eq!(
            del(ExecState::Terminal, c, SignedDuration::ZERO, HORIZON),
            Err("invalid_timeout")
        );
    }

    #[test]
    fn undelete_restores_a_deleted_item_and_refuses_a_purged_one() {
        let d = deleted(BASE + DELETION_GRACE_DEFAULT);
        let r = plan_undelete(ExecId(7), DeletedItem::Workspace, Some(&d)).unwrap();
        assert_eq!(r.state, DeletionState::Restored);
        assert_eq!(r.purge_after, d.purge_after);
        assert_eq!(
            plan_undelete(ExecId(7), DeletedItem::Workspace, None).map_err(|e| e.code()),
            Err("not_deleted")
        );
        let p = plan_purge(&[d], CutReading::certain(d.purge_after)).remove(0);
        assert_eq!(
            plan_undelete(ExecId(7), DeletedItem::Workspace, Some(&p)).map_err(|e| e.code()),
            Err("workspace_purged")
        );
        assert_eq!(check_readable(None), Ok(()));
        let e = check_readable(Some(&d)).unwrap_err();
        assert_eq!(e.code(), "workspace_deleted");
        assert_eq!(
            e.to_string(),
            format!(
                "the workspace of exec 7 is deleted and is purged once a certain cut reaches {}; until then `lc workspace undelete 7` restores it",
                d.purge_after
            )
        );
        let out = DeletionRecord {
            item: DeletedItem::Output,
            ..p
        };
        assert_eq!(
            check_readable(Some(&out)).map_err(|e| e.code()),
            Err("output_purged")
        );
    }

    #[test]
    fn retention_passes_exactly_at_retain_until_and_waits_for_deletions() {
        let r = retain_until(BASE, RETENTION_DEFAULT).unwrap();
        assert_eq!(
            r.as_nanosecond(),
            BASE.as_nanosecond() + 30 * 86_400_000_000_000
        );
        assert!(!plan_exec_purge(r, &[], CutReading::certain(r - NS)));
        assert!(plan_exec_purge(r, &[], CutReading::certain(r)));
        assert!(!plan_exec_purge(r, &[], CutReading::uncertain(r + NS, 1)));
        let d = deleted(BASE);
        assert!(!plan_exec_purge(r, &[d], CutReading::certain(r)));
        let p = plan_purge(&[d], CutReading::certain(r)).remove(0);
        assert!(plan_exec_purge(r, &[p], CutReading::certain(r)));
        assert_eq!(
            retain_until(BASE, RETENTION_MAX + NS).map_err(|e| e.code()),
            Err("invalid_timeout")
        );
        assert!(retain_until(BASE, RETENTION_MAX).is_ok());
        let day = SignedDuration::from_hours(24);
        assert_eq!(
            plan_retain_until(BASE, RETENTION_DEFAULT, RETENTION_DEFAULT),
            Ok(Some(BASE + RETENTION_DEFAULT))
        );
        assert_eq!(
            plan_retain_until(BASE, RETENTION_DEFAULT, RETENTION_DEFAULT - NS),
            Ok(None)
        );
        assert_eq!(plan_retain_until(BASE, day, HORIZON), Ok(Some(BASE + day)));
    }

    #[test]
    fn names_and_bounds_are_exact() {
        assert_eq!(DELETION_GRACE_MAX.as_secs(), 365 * 86_400);
        assert_eq!(RETENTION_MAX.as_secs(), 3_650 * 86_400);
        for (item, name) in [
            (DeletedItem::Workspace, "workspace"),
            (DeletedItem::Output, "output"),
        ] {
            assert_eq!(item.as_str(), name);
            assert_eq!(DeletedItem::parse(name), Some(item));
        }
        for (state, name) in [
            (DeletionState::Deleted, "deleted"),
            (DeletionState::Restored, "restored"),
            (DeletionState::Purged, "purged"),
        ] {
            assert_eq!(state.as_str(), name);
            assert_eq!(DeletionState::parse(name), Some(state));
        }
        for unknown in ["", "Deleted", "xyzzy"] {
            assert_eq!(DeletedItem::parse(unknown), None);
            assert_eq!(DeletionState::parse(unknown), None);
        }
        assert_eq!(check_grace(DELETION_GRACE_MAX), Ok(DELETION_GRACE_MAX));
        assert_eq!(check_grace(NS), Ok(NS));
        for bad in [DELETION_GRACE_MAX + NS, SignedDuration::ZERO] {
            assert_eq!(
                check_grace(bad).map_err(|e| e.code()),
                Err("invalid_timeout"),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_purged_item_cannot_be_deleted_again() {
        let p = BASE + DELETION_GRACE_DEFAULT;
        let gone = DeletionRecord {
            state: DeletionState::Purged,
            purged_at: Some(p),
            ..deleted(p)
        };
        let plan = plan_delete(
            ExecId(7),
            ExecState::Terminal,
            DeletedItem::Workspace,
            Some(&gone),
            CutReading::certain(p + NS),
            DELETION_GRACE_DEFAULT,
            HORIZON,
        );
        assert_eq!(
            plan,
            Err(LcError::ItemPurged {
                exec_id: ExecId(7),
                item: DeletedItem::Workspace,
                purged_at: Some(p),
            })
        );
    }
}
