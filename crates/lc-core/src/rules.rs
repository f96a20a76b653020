//! The rules of Little Compute on the safe expiry cut, as pure functions.
//!
//! # Design
//!
//! Every decision that hands out or ends authority is judged on a
//! [`CutReading`]: the persisted cut (a lower bound on true time) and
//! whether the clock vouches for it. Three rules follow:
//!
//! * **Expiry** ([`is_expired`]): a deadline `d` has passed at `at` exactly
//!   when `at` is certain and `at.cut >= d` (the same boundary as
//!   Tollgate's reclaim: at the deadline itself it is due). An uncertain
//!   cut never expires anything, however late it reads.
//! * **Admission** ([`check_admission`]): new deadline-bearing work needs a
//!   certain cut and every deadline `<= cut + horizon` (the sealed
//!   horizon). While uncertain: `time_uncertain` with `Retry-After`.
//! * **Renewal** ([`renewed_expiry`]): `max(current, cut + ttl)`, on any
//!   cut, certain or not: a renewal never shortens, so a frozen cut cannot
//!   cut a holder short, and an uncertain cut still keeps a live lease.
//!
//! The state machines ([`plan_lease_transition`], [`plan_attempt_transition`],
//! [`plan_exec_transition`]) name every legal step and refuse the others
//! with `illegal_transition`; asking for the state a record is already in
//! is a replay ([`Step::Unchanged`]) that writes nothing.
//!
//! [`plan_lease_action`] tells the reconciler what one lease needs now.
//!
//! No function here reads a clock or does I/O.

use jiff::{SignedDuration, Timestamp};

use crate::error::LcError;
use crate::model::{
    AttemptState, CutReading, ExecState, ExpiryCause, LeaseAction, LeaseState, PageKind,
    TerminalReason,
};

/// The longest timeout an exec may ask for, in milliseconds: 24 hours.
/// It must fit the sealed horizon too ([`check_admission`]).
pub const TIMEOUT_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// The longest tenant or runtime name, in bytes.
pub const NAME_BYTES_MAX: usize = 200;

/// The most bytes one output page carries.
pub use crate::page::PAGE_BYTES_MAX;

/// The most pages one `append_pages` call stores: 64 pages of at most
/// 64 KiB are 4 MiB, one transaction's worth.
pub const APPEND_PAGES_MAX: usize = 64;

/// The most rows one listing returns (execs, pages, runtimes, due work):
/// one page of an HTTP answer.
pub const LIST_LIMIT_MAX: usize = 1_000;

/// The default sandbox Lease TTL: 60 s, renewed by the reconciler while
/// the exec lives.
pub const LEASE_TTL_DEFAULT: SignedDuration = SignedDuration::from_secs(60);

/// Whether deadline `deadline` has passed at `at`: certain and
/// `at.cut >= deadline`.
pub fn is_expired(deadline: Timestamp, at: CutReading) -> bool {
    at.certain && at.cut >= deadline
}

/// `at.cut + horizon`, the latest admissible deadline; `None` beyond
/// [`Timestamp::MAX`] (every representable deadline fits).
pub fn deadline_bound(at: CutReading, horizon: SignedDuration) -> Option<Timestamp> {
    at.cut.checked_add(horizon).ok()
}

/// Checks that `at` may admit work whose deadlines are `deadlines`: the
/// cut is certain and each deadline `<= at.cut + horizon`.
///
/// # Errors
/// [`LcError::TimeUncertain`] (with the reading's `retry_after_s`, at
/// least 1) for an uncertain reading, checked first;
/// [`LcError::DeadlineBeyondHorizon`] for the first deadline beyond.
pub fn check_admission(
    at: CutReading,
    horizon: SignedDuration,
    deadlines: &[Timestamp],
) -> Result<(), LcError> {
    if !at.certain {
        return Err(LcError::TimeUncertain {
            retry_after_s: at.retry_after_s.max(1),
        });
    }
    let Some(bound) = deadline_bound(at, horizon) else {
        return Ok(());
    };
    match deadlines.iter().find(|d| **d > bound) {
        Some(d) => Err(LcError::DeadlineBeyondHorizon {
            deadline: *d,
            bound,
        }),
        None => Ok(()),
    }
}

/// `at.cut + ttl`, checked.
///
/// # Errors
/// [`LcError::InvalidTimeout`] when it lies beyond [`Timestamp::MAX`] or
/// `ttl` is not positive.
pub fn deadline_after(at: CutReading, ttl: SignedDuration) -> Result<Timestamp, LcError> {
    if ttl <= SignedDuration::ZERO {
        return Err(LcError::InvalidTimeout {
            reason: "a ttl must be positive".into(),
        });
    }
    at.cut
        .checked_add(ttl)
        .map_err(|_| LcError::InvalidTimeout {
            reason: format!("cut {} + {ttl:#} is not representable", at.cut),
        })
}

/// The expiry after a renewal at `at`: `max(current, at.cut + ttl)`, on
/// any cut. Never earlier than `current`.
///
/// # Errors
/// As [`deadline_after`].
pub fn renewed_expiry(
    current: Timestamp,
    at: CutReading,
    ttl: SignedDuration,
) -> Result<Timestamp, LcError> {
    Ok(current.max(deadline_after(at, ttl)?))
}

/// Checks an exec timeout: `1..=`[`TIMEOUT_MS_MAX`] ms.
///
/// # Errors
/// [`LcError::InvalidTimeout`].
pub fn check_timeout_ms(timeout_ms: u64) -> Result<SignedDuration, LcError> {
    if timeout_ms == 0 || timeout_ms > TIMEOUT_MS_MAX {
        return Err(LcError::InvalidTimeout {
            reason: format!("timeout_ms must be in 1..={TIMEOUT_MS_MAX}"),
        });
    }
    // <= 86_400_000, so the cast is lossless.
    Ok(SignedDuration::from_millis(timeout_ms as i64))
}

/// Checks a tenant name: 1..=[`NAME_BYTES_MAX`] bytes, no control
/// characters, not only spaces.
///
/// # Errors
/// [`LcError::InvalidName`].
pub fn check_tenant_name(name: &str) -> Result<&str, LcError> {
    let ok = !name.trim().is_empty()
        && name.len() <= NAME_BYTES_MAX
        && !name.chars().any(char::is_control);
    if ok {
        Ok(name)
    } else {
        Err(LcError::InvalidName {
            reason: format!(
                "a tenant name is 1 to {NAME_BYTES_MAX} bytes without control characters"
            ),
        })
    }
}

/// Checks a runtime name: `[a-z0-9][a-z0-9._-]*`, at most 63 bytes, and
/// not 64 hex digits (that spelling means a digest).
///
/// # Errors
/// [`LcError::InvalidName`].
pub fn check_runtime_name(name: &str) -> Result<&str, LcError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c));
    if ok {
        Ok(name)
    } else {
        Err(LcError::InvalidName {
            reason: "a runtime name is 1 to 63 characters of [a-z0-9._-], starting with a \
                     letter or digit"
                .into(),
        })
    }
}

/// Checks a listing limit: `1..=max`.
///
/// # Errors
/// [`LcError::InvalidLimit`].
pub fn check_limit(limit: usize, max: usize) -> Result<usize, LcError> {
    if limit == 0 || limit > max {
        return Err(LcError::InvalidLimit { limit, max });
    }
    Ok(limit)
}

/// Checks a unit amount: `1..=i64::MAX`.
///
/// # Errors
/// [`LcError::InvalidUnits`].
pub fn check_units(units: i64) -> Result<i64, LcError> {
    if units < 1 {
        return Err(LcError::InvalidUnits { units });
    }
    Ok(units)
}

/// Whether a transition changes the record or finds it already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The record moves to the new state.
    Changed,
    /// The record is already in that state: a replay, nothing to write.
    Unchanged,
}

fn step<S: Copy + PartialEq>(
    what: &'static str,
    from: S,
    to: S,
    name: fn(&S) -> &'static str,
    legal: bool,
) -> Result<Step, LcError> {
    if from == to {
        Ok(Step::Unchanged)
    } else if legal {
        Ok(Step::Changed)
    } else {
        Err(LcError::IllegalTransition {
            what,
            from: name(&from),
            to: name(&to),
        })
    }
}

/// A sandbox Lease step: `allocating -> active`, `allocating ->
/// release_pending`, `active -> release_pending`, `release_pending ->
/// released`. Never back, never skipping the proof.
///
/// # Errors
/// [`LcError::IllegalTransition`] for any other change.
pub fn plan_lease_transition(from: LeaseState, to: LeaseState) -> Result<Step, LcError> {
    use LeaseState::*;
    let legal = matches!(
        (from, to),
        (Allocating, Active)
            | (Allocating, ReleasePending)
            | (Active, ReleasePending)
            | (ReleasePending, Released)
    );
    step("lease", from, to, LeaseState::as_str, legal)
}

/// An attempt step: `runnable -> running | parked | terminal`,
/// `running -> parked | terminal`, `parked -> runnable | terminal`.
///
/// # Errors
/// [`LcError::IllegalTransition`] for any other change (nothing leaves
/// `terminal`).
pub fn plan_attempt_transition(from: AttemptState, to: AttemptState) -> Result<Step, LcError> {
    use AttemptState::*;
    let legal = matches!(
        (from, to),
        (Runnable, Running)
            | (Runnable, Parked)
            | (Runnable, Terminal)
            | (Running, Parked)
            | (Running, Terminal)
            | (Parked, Runnable)
            | (Parked, Terminal)
    );
    step("attempt", from, to, AttemptState::as_str, legal)
}

/// An exec step: `awaiting_approval -> admitted | terminal`, `admitted ->
/// running | terminal`, `running -> hibernated | terminal`, `hibernated ->
/// running | terminal`.
///
/// # Errors
/// [`LcError::IllegalTransition`] for any other change.
pub fn plan_exec_transition(from: ExecState, to: ExecState) -> Result<Step, LcError> {
    use ExecState::*;
    let legal = matches!(
        (from, to),
        (AwaitingApproval, Admitted)
            | (AwaitingApproval, Terminal)
            | (Admitted, Running)
            | (Admitted, Terminal)
            | (Running, Hibernated)
            | (Running, Terminal)
            | (Hibernated, Running)
            | (Hibernated, Terminal)
    );
    step("exec", from, to, ExecState::as_str, legal)
}

/// What the reconciler knows about one lease when it plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseView {
    /// The lease's state.
    pub state: LeaseState,
    /// The lease's expiry on the cut.
    pub expiry: Timestamp,
    /// Whether the tenant asked to cancel the exec.
    pub cancel_requested: bool,
    /// The exec's timeout deadline on the cut, if it has one.
    pub timeout_deadline: Option<Timestamp>,
    /// Whether the attempt's terminal page is stored.
    pub terminal_page: bool,
}

/// What the reconciler should do with a lease at `at`, `None` for a
/// released one. In order: `release_pending` -> destroy; a stored terminal
/// page -> release as exited; a cancel -> release as cancelled; the
/// timeout or the lease's expiry passed on a certain cut -> release as
/// expired; otherwise allocate (`allocating`) or maintain (`active`).
pub fn plan_lease_action(view: LeaseView, at: CutReading) -> Option<LeaseAction> {
    match view.state {
        LeaseState::Released => return None,
        LeaseState::ReleasePending => return Some(LeaseAction::Destroy),
        LeaseState::Allocating | LeaseState::Active => {}
    }
    if view.terminal_page {
        return Some(LeaseAction::BeginRelease(TerminalReason::Exited));
    }
    if view.cancel_requested {
        return Some(LeaseAction::BeginRelease(TerminalReason::Cancelled));
    }
    if expiry_cause(view.timeout_deadline, view.expiry, at).is_some() {
        return Some(LeaseAction::BeginRelease(TerminalReason::Expired));
    }
    Some(match view.state {
        LeaseState::Allocating => LeaseAction::Allocate,
        _ => LeaseAction::Maintain,
    })
}

/// Why a Lease of expiry `expiry`, of an exec whose timeout deadline is
/// `timeout_deadline`, has expired at `at`: [`ExpiryCause::Timeout`] when
/// the timeout passed, else [`ExpiryCause::Lease`] when the Lease's
/// expiry did, both only on a certain cut ([`is_expired`]); `None` when
/// nothing expired.
pub fn expiry_cause(
    timeout_deadline: Option<Timestamp>,
    expiry: Timestamp,
    at: CutReading,
) -> Option<ExpiryCause> {
    if timeout_deadline.is_some_and(|d| is_expired(d, at)) {
        Some(ExpiryCause::Timeout)
    } else if is_expired(expiry, at) {
        Some(ExpiryCause::Lease)
    } else {
        None
    }
}

/// Checks that `at` may expire or release anything: certain.
///
/// # Errors
/// [`LcError::TimeUncertain`] for an uncertain reading.
pub fn require_certain(at: CutReading) -> Result<(), LcError> {
    if at.certain {
        Ok(())
    } else {
        Err(LcError::TimeUncertain {
            retry_after_s: at.retry_after_s.max(1),
        })
    }
}

/// The wait before the next try of something whose last `failures` (at
/// least 1; 0 counts as 1) tries failed: `min`, doubled per further
/// failure, at most `max`. Saturating: never overflows, whatever
/// `failures`.
pub fn doubling_backoff(
    failures: u32,
    min: std::time::Duration,
    max: std::time::Duration,
) -> std::time::Duration {
    let doublings = failures.saturating_sub(1).min(31);
    min.saturating_mul(1u32 << doublings).min(max)
}

/// Whether the `consecutive`th failure in a row of one thing is logged at
/// warning level: the 1st, 2nd, 4th, 8th, ... (a power of two), so a
/// failure that repeats at every step logs a line count logarithmic in
/// its duration, and its first occurrence always.
pub fn logs_failure(consecutive: u32) -> bool {
    consecutive.is_power_of_two()
}

/// Failures in a row of many things at once (keys `K`), for
/// [`logs_failure`]: at most `max` keys are counted (past that the counts
/// start afresh, which only logs a warning again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureCounts<K: Ord> {
    counts: std::collections::BTreeMap<K, u32>,
    max: usize,
}

impl<K: Ord> FailureCounts<K> {
    /// No failures, counting at most `max` keys (at least 1).
    pub fn new(max: usize) -> FailureCounts<K> {
        FailureCounts {
            counts: std::collections::BTreeMap::new(),
            max: max.max(1),
        }
    }

    /// Records whether the latest try of `key` `failed`; returns its
    /// failures in a row (0 after a success, which forgets the key).
    pub fn record(&mut self, key: K, failed: bool) -> u32 {
        if !failed {
            self.counts.remove(&key);
            return 0;
        }
        if self.counts.len() >= self.max && !self.counts.contains_key(&key) {
            self.counts.clear();
        }
        let n = self.counts.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// How many keys are counted now.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether no key is counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

/// How an answer of output pages ends: `terminal` when no page of the exec
/// follows it, `stopped` when it ends at a generation's stopped page of a
/// hibernated exec (a resume's pages follow later).
///
/// Its `Default` is an answer that ends nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputEnd {
    /// No page follows this answer, ever.
    pub terminal: bool,
    /// The exec is parked and the answer ends at its stopped page (or,
    /// empty, after it): pages follow only after a resume.
    pub stopped: bool,
}

/// The end of an answer whose last page is of kind `last` (`None`: no
/// page), read after the exec was seen in state `exec`; `more` says
/// whether stored pages follow the answer (it was cut short by its limit).
///
/// A terminal page ends the output. So does every answer of a terminal
/// exec with no page after it: once the exec is terminal no page is
/// added, whether or not its last page is a terminal one (an instance lost
/// before its terminal page, a parked exec cancelled after its stopped
/// page). An answer with pages after it is never the end unless its last
/// page is the terminal page, and never `stopped`: a stopped page followed
/// by pages is a generation that was resumed.
pub fn output_end(exec: ExecState, last: Option<PageKind>, more: bool) -> OutputEnd {
    let ended = exec == ExecState::Terminal;
    OutputEnd {
        terminal: last == Some(PageKind::Terminal) || (ended && !more),
        stopped: exec == ExecState::Hibernated
            && !more
            && matches!(last, None | Some(PageKind::Stopped)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: i128 = 1_800_000_000_000_000_500;

    fn t(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    #[test]
    fn expiry_needs_a_certain_cut_at_or_past_the_deadline() {
        let d = t(BASE);
        assert!(!is_expired(d, CutReading::certain(t(BASE - 1))));
        assert!(is_expired(d, CutReading::certain(t(BASE))));
        assert!(is_expired(d, CutReading::certain(t(BASE + 1))));
        for off in [-1, 0, 1, 10_i128.pow(15)] {
            assert!(!is_expired(d, CutReading::uncertain(t(BASE + off), 1)));
        }
    }

    #[test]
    fn admission_needs_certainty_and_the_horizon() {
        let h = SignedDuration::from_hours(1);
        let h_ns = 3_600_000_000_000_i128;
        let at = CutReading::certain(t(BASE));
        check_admission(at, h, &[t(BASE + h_ns - 1)]).unwrap();
        check_admission(at, h, &[t(BASE + h_ns)]).unwrap();
        assert_eq!(
            check_admission(at, h, &[t(BASE), t(BASE + h_ns + 1)]).unwrap_err(),
            LcError::DeadlineBeyondHorizon {
                deadline: t(BASE + h_ns + 1),
                bound: t(BASE + h_ns)
            }
        );
        assert_eq!(
            check_admission(CutReading::uncertain(t(BASE), 3), h, &[t(BASE)]).unwrap_err(),
            LcError::TimeUncertain { retry_after_s: 3 }
        );
        assert_eq!(
            check_admission(CutReading::uncertain(t(BASE), 0), h, &[]).unwrap_err(),
            LcError::TimeUncertain { retry_after_s: 1 }
        );
        // A horizon beyond the domain admits every representable deadline.
        check_admission(
            CutReading::certain(Timestamp::MAX),
            SignedDuration::from_secs(1),
            &[Timestamp::MAX],
        )
        .unwrap();
    }

    #[test]
    fn renewal_never_shortens() {
        let ttl = SignedDuration::from_secs(60);
        let ttl_ns = 60_000_000_000_i128;
        // current later than cut + ttl by 1 ns: kept.
        let current = t(BASE + ttl_ns + 1);
        assert_eq!(
            renewed_expiry(current, CutReading::certain(t(BASE)), ttl).unwrap(),
            current
        );
        // Equal: the same instant.
        assert_eq!(
            renewed_expiry(t(BASE + ttl_ns), CutReading::certain(t(BASE)), ttl).unwrap(),
            t(BASE + ttl_ns)
        );
        // Earlier by 1 ns: extended to cut + ttl.
        assert_eq!(
            renewed_expiry(t(BASE + ttl_ns - 1), CutReading::certain(t(BASE)), ttl).unwrap(),
            t(BASE + ttl_ns)
        );
        // Uncertain cuts renew too, by the same rule.
        assert_eq!(
            renewed_expiry(t(BASE), CutReading::uncertain(t(BASE + 7), 1), ttl).unwrap(),
            t(BASE + 7 + ttl_ns)
        );
        assert_eq!(
            renewed_expiry(t(BASE), CutReading::certain(Timestamp::MAX), ttl)
                .unwrap_err()
                .code(),
            "invalid_timeout"
        );
        assert_eq!(
            deadline_after(CutReading::certain(t(BASE)), SignedDuration::ZERO)
                .unwrap_err()
                .code(),
            "invalid_timeout"
        );
    }

    #[test]
    fn lease_transitions() {
        use LeaseState::*;
        let all = [Allocating, Active, ReleasePending, Released];
        let legal = [
            (Allocating, Active),
            (Allocating, ReleasePending),
            (Active, ReleasePending),
            (ReleasePending, Released),
        ];
        for from in all {
            for to in all {
                let got = plan_lease_transition(from, to);
                if from == to {
                    assert_eq!(got, Ok(Step::Unchanged));
                } else if legal.contains(&(from, to)) {
                    assert_eq!(got, Ok(Step::Changed), "{from} -> {to}");
                } else {
                    assert_eq!(
                        got,
                        Err(LcError::IllegalTransition {
                            what: "lease",
                            from: from.as_str(),
                            to: to.as_str()
                        })
                    );
                }
            }
        }
    }

    #[test]
    fn attempt_and_exec_transitions() {
        use AttemptState as A;
        use ExecState as E;
        assert_eq!(
            plan_attempt_transition(A::Runnable, A::Running),
            Ok(Step::Changed)
        );
        assert_eq!(
            plan_attempt_transition(A::Parked, A::Runnable),
            Ok(Step::Changed)
        );
        assert_eq!(
            plan_attempt_transition(A::Terminal, A::Terminal),
            Ok(Step::Unchanged)
        );
        for to in [A::Runnable, A::Running, A::Parked] {
            assert_eq!(
                plan_attempt_transition(A::Terminal, to).unwrap_err().code(),
                "illegal_transition"
            );
        }
        assert_eq!(
            plan_attempt_transition(A::Running, A::Runnable)
                .unwrap_err()
                .code(),
            "illegal_transition"
        );
        assert_eq!(
            plan_exec_transition(E::Admitted, E::Running),
            Ok(Step::Changed)
        );
        assert_eq!(
            plan_exec_transition(E::Admitted, E::Terminal),
            Ok(Step::Changed)
        );
        assert_eq!(
            plan_exec_transition(E::Running, E::Terminal),
            Ok(Step::Changed)
        );
        assert_eq!(
            plan_exec_transition(E::Terminal, E::Running)
                .unwrap_err()
                .code(),
            "illegal_transition"
        );
        assert_eq!(
            plan_exec_transition(E::Running, E::Admitted)
                .unwrap_err()
                .code(),
            "illegal_transition"
        );
    }

    #[test]
    fn lease_actions() {
        let view = LeaseView {
            state: LeaseState::Active,
            expiry: t(BASE),
            cancel_requested: false,
            timeout_deadline: Some(t(BASE + 1_000)),
            terminal_page: false,
        };
        let c = |ns| CutReading::certain(t(ns));
        assert_eq!(
            plan_lease_action(view, c(BASE - 1)),
            Some(LeaseAction::Maintain)
        );
        assert_eq!(
            plan_lease_action(view, c(BASE)),
            Some(LeaseAction::BeginRelease(TerminalReason::Expired))
        );
        // Uncertain: nothing expires.
        assert_eq!(
            plan_lease_action(view, CutReading::uncertain(t(BASE + 5_000), 1)),
            Some(LeaseAction::Maintain)
        );
        let later = LeaseView {
            expiry: t(BASE + 10_000),
            ..view
        };
        assert_eq!(
            plan_lease_action(later, c(BASE + 999)),
            Some(LeaseAction::Maintain)
        );
        assert_eq!(
            plan_lease_action(later, c(BASE + 1_000)),
            Some(LeaseAction::BeginRelease(TerminalReason::Expired))
        );
        assert_eq!(
            plan_lease_action(
                LeaseView {
                    cancel_requested: true,
                    ..later
                },
                c(BASE)
            ),
            Some(LeaseAction::BeginRelease(TerminalReason::Cancelled))
        );
        assert_eq!(
            plan_lease_action(
                LeaseView {
                    terminal_page: true,
                    cancel_requested: true,
                    ..later
                },
                c(BASE)
            ),
            Some(LeaseAction::BeginRelease(TerminalReason::Exited))
        );
        assert_eq!(
            plan_lease_action(
                LeaseView {
                    state: LeaseState::Allocating,
                    ..later
                },
                c(BASE)
            ),
            Some(LeaseAction::Allocate)
        );
        assert_eq!(
            plan_lease_action(
                LeaseView {
                    state: LeaseState::ReleasePending,
                    ..view
                },
                CutReading::uncertain(t(BASE), 1)
            ),
            Some(LeaseAction::Destroy)
        );
        assert_eq!(
            plan_lease_action(
                LeaseView {
                    state: LeaseState::Released,
                    ..view
                },
                c(BASE)
            ),
            None
        );
    }

    #[test]
    fn names_limits_and_units() {
        check_tenant_name("blue team").unwrap();
        for bad in ["", "   ", "a\nb"] {
            assert_eq!(check_tenant_name(bad).unwrap_err().code(), "invalid_name");
        }
        assert_eq!(
            check_tenant_name(&"x".repeat(NAME_BYTES_MAX + 1))
                .unwrap_err()
                .code(),
            "invalid_name"
        );
        check_runtime_name("base").unwrap();
        check_runtime_name("py3.12-slim").unwrap();
        for bad in ["", "Base", "-x", "a/b", &"a".repeat(64)] {
            assert_eq!(check_runtime_name(bad).unwrap_err().code(), "invalid_name");
        }
        assert_eq!(check_limit(0, 10).unwrap_err().code(), "invalid_limit");
        assert_eq!(check_limit(11, 10).unwrap_err().code(), "invalid_limit");
        assert_eq!(check_limit(10, 10).unwrap(), 10);
        assert_eq!(check_units(0).unwrap_err().code(), "invalid_units");
        assert_eq!(check_units(1).unwrap(), 1);
        assert_eq!(check_timeout_ms(0).unwrap_err().code(), "invalid_timeout");
        assert_eq!(
            check_timeout_ms(TIMEOUT_MS_MAX + 1).unwrap_err().code(),
            "invalid_timeout"
        );
        assert_eq!(check_timeout_ms(1).unwrap(), SignedDuration::from_millis(1));
    }

    const NS: SignedDuration = SignedDuration::from_nanos(1);
    const MIN_NS: i128 = -377_705_023_201_000_000_000;
    const MAX_NS: i128 = 253_402_207_200_999_999_999;

    #[test]
    fn bounds_are_the_documented_numbers() {
        assert_eq!(TIMEOUT_MS_MAX, 86_400_000);
        assert_eq!(NAME_BYTES_MAX, 200);
        assert_eq!(APPEND_PAGES_MAX, 64);
        assert_eq!(LIST_LIMIT_MAX, 1_000);
        assert_eq!(
            LEASE_TTL_DEFAULT,
            SignedDuration::from_nanos(60_000_000_000)
        );
        assert_eq!(t(MIN_NS), Timestamp::MIN);
        assert_eq!(t(MAX_NS), Timestamp::MAX);
    }

    #[test]
    fn expiry_at_the_domain_ends() {
        // (deadline, cut, certain, expired)
        let rows = [
            (MIN_NS, MIN_NS, true, true),
            (MIN_NS, MIN_NS, false, false),
            (MIN_NS + 1, MIN_NS, true, false),
            (MAX_NS, MAX_NS - 1, true, false),
            (MAX_NS, MAX_NS, true, true),
            (MAX_NS, MAX_NS, false, false),
            (MIN_NS, MAX_NS, true, true),
            (MIN_NS, MAX_NS, false, false),
        ];
        for (deadline, cut, certain, expect) in rows {
            let at = CutReading {
                cut: t(cut),
                certain,
                retry_after_s: 1,
            };
            assert_eq!(
                is_expired(t(deadline), at),
                expect,
                "deadline {deadline} cut {cut} certain {certain}"
            );
        }
    }

    #[test]
    fn deadline_bound_is_cut_plus_horizon_exactly() {
        // (cut, horizon, bound); the reading's certainty plays no part.
        let rows = [
            (
                BASE,
                SignedDuration::from_hours(1),
                Some(BASE + 3_600_000_000_000),
            ),
            (BASE, SignedDuration::ZERO, Some(BASE)),
            (BASE, NS, Some(BASE + 1)),
            (BASE, -NS, Some(BASE - 1)),
            (MAX_NS - 1, NS, Some(MAX_NS)),
            (MAX_NS, SignedDuration::ZERO, Some(MAX_NS)),
            (MAX_NS, NS, None),
            (MIN_NS, -NS, None),
            (MIN_NS, SignedDuration::MAX, None),
        ];
        for (cut, horizon, bound) in rows {
            let expect = bound.map(t);
            assert_eq!(
                deadline_bound(CutReading::certain(t(cut)), horizon),
                expect,
                "cut {cut} horizon {horizon:#}"
            );
            assert_eq!(
                deadline_bound(CutReading::uncertain(t(cut), 1), horizon),
                expect
            );
        }
    }

    fn check_admit(
        at: CutReading,
        horizon: SignedDuration,
        deadlines: &[i128],
        expect: Result<(), LcError>,
    ) {
        let deadlines: Vec<Timestamp> = deadlines.iter().map(|d| t(*d)).collect();
        assert_eq!(
            check_admission(at, horizon, &deadlines),
            expect,
            "at {at:?} horizon {horizon:#} deadlines {deadlines:?}"
        );
    }

    #[test]
    fn admission_boundaries_are_exact() {
        let h = SignedDuration::from_secs(30);
        let bound = BASE + 30_000_000_000;
        let at = CutReading::certain(t(BASE));
        let beyond = |d: i128| {
            Err(LcError::DeadlineBeyondHorizon {
                deadline: t(d),
                bound: t(bound),
            })
        };
        check_admit(at, h, &[], Ok(()));
        check_admit(at, h, &[bound - 1], Ok(()));
        check_admit(at, h, &[bound], Ok(()));
        check_admit(at, h, &[bound + 1], beyond(bound + 1));
        // Deadlines before the cut are within the bound too.
        check_admit(at, h, &[MIN_NS, BASE - 1, BASE, bound], Ok(()));
        // The first deadline beyond is named, not the latest.
        check_admit(at, h, &[BASE, bound + 2, bound + 1], beyond(bound + 2));
        check_admit(at, h, &[bound + 1, bound + 2], beyond(bound + 1));
        // A zero horizon admits exactly the cut.
        check_admit(at, SignedDuration::ZERO, &[BASE], Ok(()));
        check_admit(
            at,
            SignedDuration::ZERO,
            &[BASE + 1],
            Err(LcError::DeadlineBeyondHorizon {
                deadline: t(BASE + 1),
                bound: t(BASE),
            }),
        );
        // At the end of the domain: MAX - 1 ns + 1 ns is the last bound.
        check_admit(CutReading::certain(t(MAX_NS - 1)), NS, &[MAX_NS], Ok(()));
        check_admit(
            CutReading::certain(t(MAX_NS - 2)),
            NS,
            &[MAX_NS],
            Err(LcError::DeadlineBeyondHorizon {
                deadline: t(MAX_NS),
                bound: t(MAX_NS - 1),
            }),
        );
        check_admit(CutReading::certain(t(MAX_NS)), NS, &[MAX_NS], Ok(()));
    }

    #[test]
    fn admission_on_an_uncertain_cut_is_refused_first() {
        let h = SignedDuration::from_secs(30);
        // (retry_after_s read, retry_after_s told): at least 1.
        for (read, told) in [(0, 1), (1, 1), (2, 2), (7, 7), (u64::MAX, u64::MAX)] {
            let at = CutReading::uncertain(t(BASE), read);
            let expect = Err(LcError::TimeUncertain {
                retry_after_s: told,
            });
            check_admit(at, h, &[], expect.clone());
            check_admit(at, h, &[BASE], expect.clone());
            // Checked before the horizon: a deadline beyond is not named.
            check_admit(at, h, &[MAX_NS], expect.clone());
            assert_eq!(require_certain(at), expect);
        }
        // Certain readings carry no wait of their own.
        for read in [0, 1, u64::MAX] {
            let at = CutReading {
                cut: t(BASE),
                certain: true,
                retry_after_s: read,
            };
            check_admit(at, h, &[BASE], Ok(()));
            assert_eq!(require_certain(at), Ok(()));
        }
    }

    #[test]
    fn deadline_after_boundaries_are_exact() {
        let at = CutReading::certain(t(BASE));
        let not_positive = Err(LcError::InvalidTimeout {
            reason: "a ttl must be positive".into(),
        });
        assert_eq!(deadline_after(at, -NS), not_positive);
        assert_eq!(deadline_after(at, SignedDuration::MIN), not_positive);
        assert_eq!(deadline_after(at, SignedDuration::ZERO), not_positive);
        assert_eq!(deadline_after(at, NS), Ok(t(BASE + 1)));
        assert_eq!(
            deadline_after(CutReading::uncertain(t(BASE), 1), NS),
            Ok(t(BASE + 1))
        );
        assert_eq!(
            deadline_after(CutReading::certain(t(MIN_NS)), NS),
            Ok(t(MIN_NS + 1))
        );
        assert_eq!(
            deadline_after(CutReading::certain(t(MAX_NS - 1)), NS),
            Ok(t(MAX_NS))
        );
        assert_eq!(
            deadline_after(CutReading::certain(t(MAX_NS)), NS),
            Err(LcError::InvalidTimeout {
                reason: "cut 9999-12-30T22:00:00.999999999Z + 1ns is not representable".into(),
            })
        );
        assert_eq!(
            deadline_after(CutReading::certain(t(MIN_NS)), SignedDuration::MAX),
            Err(LcError::InvalidTimeout {
                reason: "cut -009999-01-02T01:59:59Z + 2562047788015215h 30m 7s 999ms 999µs \
                         999ns is not representable"
                    .into(),
            })
        );
    }

    #[test]
    fn renewal_boundaries_are_exact() {
        let ttl = SignedDuration::from_secs(60);
        let ttl_ns = 60_000_000_000_i128;
        // (current, cut, certain, renewed)
        let rows = [
            (BASE + ttl_ns + 1, BASE, true, BASE + ttl_ns + 1),
            (BASE + ttl_ns, BASE, true, BASE + ttl_ns),
            (BASE + ttl_ns - 1, BASE, true, BASE + ttl_ns),
            (BASE + ttl_ns + 1, BASE, false, BASE + ttl_ns + 1),
            (BASE + ttl_ns - 1, BASE, false, BASE + ttl_ns),
            (MIN_NS, BASE, true, BASE + ttl_ns),
            (MAX_NS, BASE, true, MAX_NS),
            (MAX_NS, BASE, false, MAX_NS),
            (MIN_NS, MAX_NS - ttl_ns, true, MAX_NS),
            (MAX_NS - 1, MAX_NS - ttl_ns, false, MAX_NS),
        ];
        for (current, cut, certain, renewed) in rows {
            let at = CutReading {
                cut: t(cut),
                certain,
                retry_after_s: 1,
            };
            assert_eq!(
                renewed_expiry(t(current), at, ttl),
                Ok(t(renewed)),
                "current {current} cut {cut} certain {certain}"
            );
        }
        // A ttl that is not positive is refused even when current is later.
        assert_eq!(
            renewed_expiry(
                t(MAX_NS),
                CutReading::certain(t(BASE)),
                SignedDuration::ZERO
            ),
            Err(LcError::InvalidTimeout {
                reason: "a ttl must be positive".into(),
            })
        );
        // Past the end of the domain: refused, not clamped to current.
        assert_eq!(
            renewed_expiry(t(MAX_NS), CutReading::certain(t(MAX_NS - ttl_ns + 1)), ttl),
            Err(LcError::InvalidTimeout {
                reason: "cut 9999-12-30T21:59:01Z + 1m is not representable".into(),
            })
        );
    }

    #[test]
    fn timeout_boundaries_are_exact() {
        let refused = Err(LcError::InvalidTimeout {
            reason: "timeout_ms must be in 1..=86400000".into(),
        });
        for (ms, expect) in [
            (0, refused.clone()),
            (1, Ok(SignedDuration::from_nanos(1_000_000))),
            (2, Ok(SignedDuration::from_nanos(2_000_000))),
            (
                86_399_999,
                Ok(SignedDuration::from_nanos(86_399_999_000_000)),
            ),
            (
                86_400_000,
                Ok(SignedDuration::from_nanos(86_400_000_000_000)),
            ),
            (86_400_001, refused.clone()),
            (u64::MAX, refused.clone()),
        ] {
            assert_eq!(check_timeout_ms(ms), expect, "timeout_ms {ms}");
        }
    }

    #[test]
    fn name_boundaries_are_exact() {
        let tenant_refused = Err(LcError::InvalidName {
            reason: "a tenant name is 1 to 200 bytes without control characters".into(),
        });
        let at_max = "x".repeat(200);
        let over = "x".repeat(201);
        // 199 bytes of ASCII and one 2-byte character: 201 bytes, 200 chars.
        let over_in_bytes = format!("{}é", "x".repeat(199));
        for (name, ok) in [
            ("blue team", true),
            ("x", true),
            (" x ", true),
            ("é", true),
            (at_max.as_str(), true),
            (over.as_str(), false),
            (over_in_bytes.as_str(), false),
            ("", false),
            (" ", false),
            ("\u{3000}", false),
            ("a\tb", false),
            ("a\u{7f}", false),
            ("\u{85}x", false),
        ] {
            let expect = if ok { Ok(name) } else { tenant_refused.clone() };
            assert_eq!(check_tenant_name(name), expect, "tenant {name:?}");
        }

        let runtime_refused = Err(LcError::InvalidName {
            reason: "a runtime name is 1 to 63 characters of [a-z0-9._-], starting with a \
                     letter or digit"
                .into(),
        });
        let r63 = "a".repeat(63);
        let r64 = "a".repeat(64);
        let hex64 = "0".repeat(64);
        for (name, ok) in [
            ("base", true),
            ("b", true),
            ("0", true),
            ("9x", true),
            ("z._-09", true),
            ("py3.12-slim", true),
            (r63.as_str(), true),
            (r64.as_str(), false),
            (hex64.as_str(), false),
            ("", false),
            (".x", false),
            ("_x", false),
            ("-x", false),
            ("Base", false),
            ("baSe", false),
            ("a/b", false),
            ("a b", false),
            ("a+b", false),
            ("é", false),
        ] {
            let expect = if ok {
                Ok(name)
            } else {
                runtime_refused.clone()
            };
            assert_eq!(check_runtime_name(name), expect, "runtime {name:?}");
        }
    }

    #[test]
    fn limit_and_unit_boundaries_are_exact() {
        for (limit, max, ok) in [
            (0, 10, false),
            (1, 10, true),
            (9, 10, true),
            (10, 10, true),
            (11, 10, false),
            (0, 0, false),
            (1, 1, true),
            (2, 1, false),
            (usize::MAX, usize::MAX, true),
            (usize::MAX, usize::MAX - 1, false),
        ] {
            let expect = if ok {
                Ok(limit)
            } else {
                Err(LcError::InvalidLimit { limit, max })
            };
            assert_eq!(check_limit(limit, max), expect, "limit {limit} max {max}");
        }
        for (units, ok) in [
            (i64::MIN, false),
            (-1, false),
            (0, false),
            (1, true),
            (2, true),
            (i64::MAX, true),
        ] {
            let expect = if ok {
                Ok(units)
            } else {
                Err(LcError::InvalidUnits { units })
            };
            assert_eq!(check_units(units), expect, "units {units}");
        }
    }

    /// Checks a state machine against its full list of legal changes:
    /// every pair of states, the same state being a replay.
    fn check_machine<S: Copy + PartialEq + std::fmt::Debug>(
        what: &'static str,
        all: &[S],
        legal: &[(S, S)],
        name: fn(&S) -> &'static str,
        plan: fn(S, S) -> Result<Step, LcError>,
    ) {
        for &from in all {
            for &to in all {
                let expect = if from == to {
                    Ok(Step::Unchanged)
                } else if legal.contains(&(from, to)) {
                    Ok(Step::Changed)
                } else {
                    Err(LcError::IllegalTransition {
                        what,
                        from: name(&from),
                        to: name(&to),
                    })
                };
                assert_eq!(plan(from, to), expect, "{what} {from:?} -> {to:?}");
            }
        }
    }

    #[test]
    fn every_pair_of_states_of_every_machine() {
        use AttemptState as A;
        use ExecState as E;
        use LeaseState as L;
        check_machine(
            "lease",
            &[L::Allocating, L::Active, L::ReleasePending, L::Released],
            &[
                (L::Allocating, L::Active),
                (L::Allocating, L::ReleasePending),
                (L::Active, L::ReleasePending),
                (L::ReleasePending, L::Released),
            ],
            LeaseState::as_str,
            plan_lease_transition,
        );
        check_machine(
            "attempt",
            &[A::Runnable, A::Running, A::Parked, A::Terminal],
            &[
                (A::Runnable, A::Running),
                (A::Runnable, A::Parked),
                (A::Runnable, A::Terminal),
                (A::Running, A::Parked),
                (A::Running, A::Terminal),
                (A::Parked, A::Runnable),
                (A::Parked, A::Terminal),
            ],
            AttemptState::as_str,
            plan_attempt_transition,
        );
        check_machine(
            "exec",
            &[E::Admitted, E::Running, E::Hibernated, E::Terminal],
            &[
                (E::Admitted, E::Running),
                (E::Admitted, E::Terminal),
                (E::Running, E::Hibernated),
                (E::Running, E::Terminal),
                (E::Hibernated, E::Running),
                (E::Hibernated, E::Terminal),
            ],
            ExecState::as_str,
            plan_exec_transition,
        );
        // The refusal names both states by their stored names.
        assert_eq!(
            plan_attempt_transition(A::Terminal, A::Runnable),
            Err(LcError::IllegalTransition {
                what: "attempt",
                from: "terminal",
                to: "runnable"
            })
        );
    }

    #[test]
    fn lease_action_boundaries_are_exact() {
        use LeaseAction::*;
        use TerminalReason as R;
        let expiry = BASE + 10_000;
        let timeout = BASE + 1_000;
        let view = |state, timeout_deadline: Option<i128>| LeaseView {
            state,
            expiry: t(expiry),
            cancel_requested: false,
            timeout_deadline: timeout_deadline.map(t),
            terminal_page: false,
        };
        let c = |ns| CutReading::certain(t(ns));
        let u = |ns| CutReading::uncertain(t(ns), 1);
        for (state, live) in [
            (LeaseState::Allocating, Allocate),
            (LeaseState::Active, Maintain),
        ] {
            let rows = [
                // The timeout, at -1 / 0 / +1 ns, before the expiry.
                (Some(timeout), c(timeout - 1), Some(live)),
                (Some(timeout), c(timeout), Some(BeginRelease(R::Expired))),
                (
                    Some(timeout),
                    c(timeout + 1),
                    Some(BeginRelease(R::Expired)),
                ),
                // No timeout: the expiry decides, at -1 / 0 / +1 ns.
                (None, c(expiry - 1), Some(live)),
                (None, c(expiry), Some(BeginRelease(R::Expired))),
                (None, c(expiry + 1), Some(BeginRelease(R::Expired))),
                // A timeout after the expiry: the expiry still decides.
                (Some(expiry + 5), c(expiry - 1), Some(live)),
                (Some(expiry + 5), c(expiry), Some(BeginRelease(R::Expired))),
                // Uncertain: nothing expires, however late.
                (Some(timeout), u(timeout), Some(live)),
                (Some(timeout), u(MAX_NS), Some(live)),
                (None, u(MAX_NS), Some(live)),
                // At the domain ends.
                (Some(MIN_NS), c(MIN_NS), Some(BeginRelease(R::Expired))),
                (None, c(MAX_NS), Some(BeginRelease(R::Expired))),
            ];
            for (timeout_deadline, at, expect) in rows {
                assert_eq!(
                    plan_lease_action(view(state, timeout_deadline), at),
                    expect,
                    "{state} timeout {timeout_deadline:?} at {at:?}"
                );
            }
            // A stored terminal page comes before a cancel, and a cancel
            // before the timeout or the expiry, certain or not.
            for at in [c(BASE), c(expiry), u(expiry)] {
                let cancelled = LeaseView {
                    cancel_requested: true,
                    ..view(state, Some(timeout))
                };
                assert_eq!(
                    plan_lease_action(cancelled, at),
                    Some(BeginRelease(R::Cancelled))
                );
                let exited = LeaseView {
                    terminal_page: true,
                    ..cancelled
                };
                assert_eq!(plan_lease_action(exited, at), Some(BeginRelease(R::Exited)));
                let exited_only = LeaseView {
                    terminal_page: true,
                    ..view(state, Some(timeout))
                };
                assert_eq!(
                    plan_lease_action(exited_only, at),
                    Some(BeginRelease(R::Exited))
                );
            }
        }
        // release_pending is destroyed and released is left alone, whatever
        // the reading and the flags say.
        for at in [c(BASE), c(MAX_NS), u(BASE)] {
            let flags = LeaseView {
                cancel_requested: true,
                terminal_page: true,
                ..view(LeaseState::Active, Some(timeout))
            };
            assert_eq!(
                plan_lease_action(
                    LeaseView {
                        state: LeaseState::ReleasePending,
                        ..flags
                    },
                    at
                ),
                Some(Destroy)
            );
            assert_eq!(
                plan_lease_action(
                    LeaseView {
                        state: LeaseState::Released,
                        ..flags
                    },
                    at
                ),
                None
            );
        }
    }

    #[test]
    fn output_ends_at_a_terminal_page_or_a_terminal_exec_s_last_answer() {
        use ExecState::{Admitted, Hibernated, Running, Terminal as Ended};
        use PageKind::{Stdout, Stopped, Terminal};
        let end = |terminal, stopped| OutputEnd { terminal, stopped };
        // A terminal page ends the output, pages after it or not.
        assert_eq!(output_end(Running, Some(Terminal), false), end(true, false));
        assert_eq!(output_end(Ended, Some(Terminal), false), end(true, false));
        assert_eq!(output_end(Ended, Some(Terminal), true), end(true, false));
        // A running exec's answer never ends it.
        assert_eq!(output_end(Running, Some(Stdout), false), end(false, false));
        assert_eq!(output_end(Running, None, false), end(false, false));
        assert_eq!(output_end(Admitted, None, false), end(false, false));
        // A terminal exec without a terminal page (its instance was lost):
        // the last answer ends it, one with pages after it does not.
        assert_eq!(output_end(Ended, Some(Stdout), false), end(true, false));
        assert_eq!(output_end(Ended, Some(Stdout), true), end(false, false));
        assert_eq!(output_end(Ended, None, false), end(true, false));
        // A parked exec's answer ends at its stopped page, or after it.
        assert_eq!(
            output_end(Hibernated, Some(Stopped), false),
            end(false, true)
        );
        assert_eq!(output_end(Hibernated, None, false), end(false, true));
        // Still reading up to it: not stopped yet.
        assert_eq!(
            output_end(Hibernated, Some(Stdout), true),
            end(false, false)
        );
        assert_eq!(
            output_end(Hibernated, Some(Stdout), false),
            end(false, false)
        );
        // An ended exec's stopped page is its last page when nothing
        // follows it; with pages after it, a resumed generation's follow.
        assert_eq!(output_end(Ended, Some(Stopped), false), end(true, false));
        assert_eq!(output_end(Ended, Some(Stopped), true), end(false, false));
        // A resumed exec running again reads its earlier stopped page.
        assert_eq!(output_end(Running, Some(Stopped), true), end(false, false));
        assert_eq!(output_end(Running, Some(Stopped), false), end(false, false));
    }

    #[test]
    fn backoff_doubles_from_min_to_max_and_never_overflows() {
        use std::time::Duration;
        let ms = |n: u32| {
            doubling_backoff(n, Duration::from_millis(200), Duration::from_secs(5)).as_millis()
        };
        let waits: Vec<u128> = [0, 1, 2, 3, 4, 5, 6, 31, 32, u32::MAX]
            .into_iter()
            .map(ms)
            .collect();
        assert_eq!(
            waits,
            vec![200, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000]
        );
        // A max below min is the max.
        assert_eq!(
            doubling_backoff(3, Duration::from_secs(2), Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        // A min so large that doubling saturates.
        assert_eq!(
            doubling_backoff(40, Duration::MAX / 2, Duration::MAX),
            Duration::MAX
        );
    }

    #[test]
    fn an_expiry_is_the_timeout_s_when_both_passed_and_only_on_a_certain_cut() {
        let deadline = t(BASE);
        let expiry = t(BASE + 1_000);
        let at = |ns: i128| CutReading::certain(t(ns));
        let before = |ns: i128| CutReading::certain(t(ns - 1));
        // Nothing passed.
        assert_eq!(expiry_cause(Some(deadline), expiry, before(BASE)), None);
        assert_eq!(expiry_cause(None, expiry, before(BASE + 1_000)), None);
        // The timeout at its deadline exactly; the Lease at its expiry.
        assert_eq!(
            expiry_cause(Some(deadline), expiry, at(BASE)),
            Some(ExpiryCause::Timeout)
        );
        assert_eq!(
            expiry_cause(None, expiry, at(BASE + 1_000)),
            Some(ExpiryCause::Lease)
        );
        // Both passed: the timeout is named.
        assert_eq!(
            expiry_cause(Some(deadline), expiry, at(BASE + 1_000)),
            Some(ExpiryCause::Timeout)
        );
        // A timeout after the Lease's expiry: the Lease ran out first.
        assert_eq!(
            expiry_cause(Some(t(BASE + 5_000)), expiry, at(BASE + 1_000)),
            Some(ExpiryCause::Lease)
        );
        // Uncertain: nothing expires.
        let mut uncertain = at(BASE + 10_000);
        uncertain.certain = false;
        assert_eq!(expiry_cause(Some(deadline), expiry, uncertain), None);
    }

    #[test]
    fn failure_counts_run_per_key_reset_on_success_and_stay_bounded() {
        let mut c = FailureCounts::new(2);
        assert_eq!(
            (
                c.record("a", true),
                c.record("a", true),
                c.record("b", true)
            ),
            (1, 2, 1)
        );
        assert_eq!(c.record("a", true), 3);
        // A success forgets the key; the next failure is the first again.
        assert_eq!(c.record("a", false), 0);
        assert_eq!((c.len(), c.record("a", true)), (1, 1));
        // A third key past the bound starts afresh: only it is counted.
        assert_eq!(c.record("c", true), 1);
        assert_eq!((c.len(), c.record("a", true), c.len()), (1, 1, 2));
        assert!(!c.is_empty());
        let mut one: FailureCounts<u8> = FailureCounts::new(0);
        assert_eq!(
            (
                one.record(1, true),
                one.record(1, true),
                one.record(2, true)
            ),
            (1, 2, 1)
        );
        assert_eq!(one.record(2, false), 0);
        assert!(one.is_empty());
    }

    #[test]
    fn failures_are_logged_at_powers_of_two() {
        let logged: Vec<u32> = (0..=70).filter(|&n| logs_failure(n)).collect();
        assert_eq!(logged, vec![1, 2, 4, 8, 16, 32, 64]);
        assert!(logs_failure(1 << 31));
        assert!(!logs_failure(u32::MAX));
    }
}
