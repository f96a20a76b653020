//! Scoped tokens: a tenant's credential limited to a set of operations,
//! optionally to one exec, until a deadline on the cut (its Scope
//! deadline), to hand to an agent.
//!
//! # Design
//!
//! A token is minted by its tenant (its API key, or the admin acting for
//! it) with a set of [`Operation`]s, an optional exec it is bound to, and
//! a TTL. Its deadline is `cut + ttl` of the **certain** cut it was minted
//! at ([`check_ttl_ms`], then the usual admission rule: a certain cut and
//! `deadline <= cut + horizon`); while the cut is uncertain no token is
//! minted (`time_uncertain`).
//!
//! Each request presenting the token is judged by [`check_accepted`]:
//!
//! * revoked: `token_revoked`, whatever the cut (a revocation never
//!   waits for time);
//! * an uncertain cut: `time_uncertain` (the token cannot be proven
//!   unexpired, so it is not honoured);
//! * a certain cut `>= deadline`: `token_expired` (at `deadline - 1 ns`
//!   it is still accepted), the same boundary as every deadline.
//!
//! Then [`TokenScope::permits`] decides the operation: one outside the set
//! is refused `forbidden` naming it; a token bound to an exec acts only on
//! that exec's routes (never create, list or another exec). A token never
//! mints, lists or revokes tokens, and never acts outside its tenant.
//!
//! The secret is `lct_` + 43 base64url characters (256 random bits); the
//! store keeps only its SHA-256. Nothing here reads a clock.

use std::fmt;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::error::LcError;
use crate::model::{CutReading, ExecId, TenantId};

/// The prefix of a scoped token's secret.
pub const TOKEN_PREFIX: &str = "lct_";

/// Characters after [`TOKEN_PREFIX`]: 32 random bytes in unpadded
/// base64url.
pub const TOKEN_BODY_CHARS: usize = 43;

/// The longest TTL a mint may ask for unless configured otherwise: 30 days.
pub const TOKEN_TTL_MAX_DEFAULT: SignedDuration = SignedDuration::from_hours(30 * 24);

/// The largest value the longest-TTL setting may take: 365 days (it must
/// also fit the sealed horizon, which the admission rule checks on every
/// mint).
pub const TOKEN_TTL_MAX_CEILING: SignedDuration = SignedDuration::from_hours(365 * 24);

/// A token, from a database sequence (`>= 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TokenId(pub i64);

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

macro_rules! operations {
    ($($(#[$doc:meta])* $variant:ident = $text:literal),+ $(,)?) => {
        /// What a request does, as a scoped token's scope names it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum Operation {
            $($(#[$doc])* #[serde(rename = $text)] $variant),+
        }

        /// Every operation, in the order of their bits in an
        /// [`OperationSet`].
        pub const OPERATIONS: &[Operation] = &[$(Operation::$variant),+];

        impl Operation {
            /// The stable dotted name (`exec.read`, ...), as stored and shown.
            pub fn as_str(&self) -> &'static str {
                match self { $(Operation::$variant => $text),+ }
            }

            /// Parses [`as_str`](Self::as_str)'s text.
            pub fn parse(s: &str) -> Option<Operation> {
                match s { $($text => Some(Operation::$variant),)+ _ => None }
            }
        }
    };
}

operations! {
    /// Admit an exec (`POST /v1/execs`; the runtimes it may name).
    ExecCreate = "exec.create",
    /// Read execs: one exec, the list, its output, operation keys.
    ExecRead = "exec.read",
    /// Send stdin input to an exec.
    ExecInput = "exec.input",
    /// Cancel an exec.
    ExecCancel = "exec.cancel",
    /// Hibernate an exec.
    ExecHibernate = "exec.hibernate",
    /// Resume a hibernated exec.
    ExecResume = "exec.resume",
    /// Read an exec's workspace, snapshots, trees and files.
    WorkspaceRead = "workspace.read",
    /// Decide an approval of a gated exec.
    ApprovalDecide = "approval.decide",
}

impl Operation {
    /// Whether the operation acts on one exec named by the request (so a
    /// token bound to an exec may hold it): every operation but
    /// [`Operation::ExecCreate`].
    pub fn on_one_exec(&self) -> bool {
        !matches!(self, Operation::ExecCreate)
    }

    fn bit(&self) -> u16 {
        let i = OPERATIONS.iter().position(|o| o == self).unwrap_or(0);
        1 << i
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// Every operation has its bit in an `OperationSet`'s `u16`.
const _: () = assert!(OPERATIONS.len() < 16);

/// A set of operations (a bit per [`OPERATIONS`] entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OperationSet(u16);

impl OperationSet {
    /// Every operation: what a tenant's own API key may do.
    pub fn all() -> OperationSet {
        OperationSet((1 << OPERATIONS.len()) - 1)
    }

    /// Whether `op` is in the set.
    pub fn contains(&self, op: Operation) -> bool {
        self.0 & op.bit() != 0
    }

    /// The operations in the set, in [`OPERATIONS`] order.
    pub fn iter(&self) -> impl Iterator<Item = Operation> + '_ {
        OPERATIONS.iter().copied().filter(|o| self.contains(*o))
    }

    /// The stable names, in [`OPERATIONS`] order (the canonical form a
    /// request digest and the store use).
    pub fn names(&self) -> Vec<&'static str> {
        self.iter().map(|o| o.as_str()).collect()
    }
}

/// What a token may do: its operations and, when bound, its one exec. The
/// fields are private, so every value passed [`TokenScope::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenScope {
    exec: Option<ExecId>,
    operations: OperationSet,
}

impl TokenScope {
    /// The scope of `operations` (at least one, each once), bound to `exec`
    /// when given (then without [`Operation::ExecCreate`]: a bound token
    /// acts only on its exec).
    ///
    /// # Errors
    /// [`LcError::InvalidTokenScope`] for no operation, one named twice,
    /// an exec id below 1, or `exec.create` on a bound token.
    pub fn new(exec: Option<ExecId>, operations: &[Operation]) -> Result<TokenScope, LcError> {
        let invalid = |reason: String| Err(LcError::InvalidTokenScope { reason });
        if operations.is_empty() {
            return invalid(format!(
                "a token needs at least one operation of: {}",
                OperationSet::all().names().join(", ")
            ));
        }
        if let Some(e) = exec
            && e.0 < 1
        {
            return invalid(format!("exec id {e} is not a positive id"));
        }
        let mut set = OperationSet::default();
        for op in operations {
            if set.contains(*op) {
                return invalid(format!("operation {op} is named twice"));
            }
            if exec.is_some() && !op.on_one_exec() {
                return invalid(format!(
                    "a token bound to an exec acts only on that exec: {op} cannot be granted with exec_id"
                ));
            }
            set.0 |= op.bit();
        }
        Ok(TokenScope {
            exec,
            operations: set,
        })
    }

    /// [`TokenScope::new`] from the stable names.
    ///
    /// # Errors
    /// [`LcError::InvalidTokenScope`] for an unknown name, and as
    /// [`TokenScope::new`].
    pub fn parse(exec: Option<ExecId>, names: &[String]) -> Result<TokenScope, LcError> {
        let ops = names
            .iter()
            .map(|n| {
                Operation::parse(n).ok_or_else(|| LcError::InvalidTokenScope {
                    reason: format!(
                        "unknown operation {n:?}; the operations are: {}",
                        OperationSet::all().names().join(", ")
                    ),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        TokenScope::new(exec, &ops)
    }

    /// The exec the token is bound to, if any.
    pub fn exec(&self) -> Option<ExecId> {
        self.exec
    }

    /// Its operations.
    pub fn operations(&self) -> OperationSet {
        self.operations
    }

    /// Whether the token may perform `op` on `exec` (the exec the request
    /// names; `None` for a request that names none: create, list,
    /// operation keys).
    ///
    /// # Errors
    /// [`LcError::TokenScope`] (`forbidden`) naming the operation missing
    /// from the scope, or the exec the token is bound to.
    pub fn permits(&self, op: Operation, exec: Option<ExecId>) -> Result<(), LcError> {
        if !self.operations.contains(op) {
            return Err(LcError::TokenScope {
                reason: format!(
                    "this token does not hold the operation {op} (it holds {})",
                    self.operations.names().join(", ")
                ),
            });
        }
        match (self.exec, exec) {
            (None, _) => Ok(()),
            (Some(bound), Some(e)) if bound == e => Ok(()),
            (Some(bound), Some(e)) => Err(LcError::TokenScope {
                reason: format!(
                    "this token is bound to exec {bound}; exec {e} is outside its scope"
                ),
            }),
            (Some(bound), None) => Err(LcError::TokenScope {
                reason: format!(
                    "this token is bound to exec {bound}: it acts only on that exec's routes, not on {op} across execs"
                ),
            }),
        }
    }
}

/// A token as the store reports it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// The token.
    pub token_id: TokenId,
    /// Its tenant: it never acts for another.
    pub tenant_id: TenantId,
    /// The exec it is bound to, if any.
    pub exec_id: Option<ExecId>,
    /// Its operations' stable names, in [`OPERATIONS`] order.
    pub operations: Vec<String>,
    /// The certain cut it was minted at.
    pub minted_cut: Timestamp,
    /// Its Scope deadline: `minted_cut + ttl`, on the cut.
    pub deadline: Timestamp,
    /// The cut read when it was revoked (certain or not); `None` while it
    /// is not revoked.
    pub revoked_cut: Option<Timestamp>,
}

impl TokenRecord {
    /// Its scope, re-checked.
    ///
    /// # Errors
    /// [`LcError::InvalidTokenScope`] for a stored scope the rules refuse.
    pub fn scope(&self) -> Result<TokenScope, LcError> {
        TokenScope::parse(self.exec_id, &self.operations)
    }
}

/// What a mint returned: the record, and whether it was a replay of its
/// operation key (then the secret is not shown again: it is not stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MintedToken {
    /// The token.
    pub token: TokenRecord,
    /// `true` when the key had minted it before and nothing was written.
    pub replay: bool,
}

/// Checks a requested TTL: `1..=ttl_max` milliseconds.
///
/// # Errors
/// [`LcError::InvalidTimeout`] naming the bound.
pub fn check_ttl_ms(ttl_ms: u64, ttl_max: SignedDuration) -> Result<SignedDuration, LcError> {
    let ttl = i64::try_from(ttl_ms)
        .ok()
        .map(SignedDuration::from_millis)
        .filter(|t| *t > SignedDuration::ZERO && *t <= ttl_max);
    ttl.ok_or_else(|| LcError::InvalidTimeout {
        reason: format!(
            "a token's ttl_ms must be 1..={} ({ttl_max:#}), not {ttl_ms}",
            ttl_max.as_millis()
        ),
    })
}

/// Checks the longest-TTL setting: positive and at most
/// [`TOKEN_TTL_MAX_CEILING`].
///
/// # Errors
/// [`LcError::InvalidTimeout`] naming the bound.
pub fn check_ttl_max(ttl_max: SignedDuration) -> Result<SignedDuration, LcError> {
    if ttl_max <= SignedDuration::ZERO || ttl_max > TOKEN_TTL_MAX_CEILING {
        return Err(LcError::InvalidTimeout {
            reason: format!(
                "the longest token TTL must be positive and at most {TOKEN_TTL_MAX_CEILING:#}, not {ttl_max:#}"
            ),
        });
    }
    Ok(ttl_max)
}

/// Whether `token` is honoured at `at`: not revoked, `at` certain, and
/// `at.cut < deadline`.
///
/// # Errors
/// [`LcError::TokenRevoked`] first (whatever the cut);
/// [`LcError::TimeUncertain`] for an uncertain `at`;
/// [`LcError::TokenExpired`] when `at.cut >= deadline`.
pub fn check_accepted(token: &TokenRecord, at: CutReading) -> Result<(), LcError> {
    if token.revoked_cut.is_some() {
        return Err(LcError::TokenRevoked {
            token_id: token.token_id,
        });
    }
    if !at.certain {
        return Err(LcError::TimeUncertain {
            retry_after_s: at.retry_after_s.max(1),
        });
    }
    if crate::rules::is_expired(token.deadline, at) {
        return Err(LcError::TokenExpired {
            token_id: token.token_id,
            deadline: token.deadline,
        });
    }
    Ok(())
}

/// Whether `s` has the shape of a scoped token's secret (`lct_` + 43
/// base64url characters), so only such strings cost a store lookup.
pub fn looks_like_token(s: &str) -> bool {
    s.strip_prefix(TOKEN_PREFIX).is_some_and(|body| {
        body.len() == TOKEN_BODY_CHARS
            && body
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(deadline: Timestamp, revoked: bool) -> TokenRecord {
        TokenRecord {
            token_id: TokenId(3),
            tenant_id: TenantId(1),
            exec_id: None,
            operations: vec!["exec.read".into()],
            minted_cut: Timestamp::UNIX_EPOCH,
            deadline,
            revoked_cut: revoked.then_some(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn acceptance_is_exact_on_the_cut() {
        let d = Timestamp::from_second(1_000).unwrap();
        let ns = SignedDuration::from_nanos(1);
        let t = record(d, false);
        assert_eq!(check_accepted(&t, CutReading::certain(d - ns)), Ok(()));
        assert_eq!(
            check_accepted(&t, CutReading::certain(d)),
            Err(LcError::TokenExpired {
                token_id: TokenId(3),
                deadline: d
            })
        );
        // Uncertain: never honoured, however early the cut reads.
        assert_eq!(
            check_accepted(&t, CutReading::uncertain(d - ns * 5, 0)),
            Err(LcError::TimeUncertain { retry_after_s: 1 })
        );
        // Revoked: refused first, whatever the cut.
        let r = record(d, true);
        for at in [CutReading::certain(d - ns), CutReading::uncertain(d, 2)] {
            assert_eq!(
                check_accepted(&r, at),
                Err(LcError::TokenRevoked {
                    token_id: TokenId(3)
                })
            );
        }
    }

    #[test]
    fn scopes_refuse_what_they_do_not_hold() {
        let s = TokenScope::new(None, &[Operation::ExecRead, Operation::ExecCancel]).unwrap();
        assert_eq!(s.operations().names(), ["exec.read", "exec.cancel"]);
        assert_eq!(s.permits(Operation::ExecRead, None), Ok(()));
        assert_eq!(s.permits(Operation::ExecCancel, Some(ExecId(9))), Ok(()));
        assert_eq!(
            s.permits(Operation::ExecCreate, None)
                .unwrap_err()
                .to_string(),
            "this token does not hold the operation exec.create (it holds exec.read, exec.cancel)"
        );
        let b = TokenScope::new(Some(ExecId(4)), &[Operation::ExecRead]).unwrap();
        assert_eq!(b.permits(Operation::ExecRead, Some(ExecId(4))), Ok(()));
        assert_eq!(
            b.permits(Operation::ExecRead, Some(ExecId(5)))
                .unwrap_err()
                .to_string(),
            "this token is bound to exec 4; exec 5 is outside its scope"
        );
        assert_eq!(
            b.permits(Operation::ExecRead, None).unwrap_err().code(),
            "forbidden"
        );
    }

    #[test]
    fn a_scope_is_checked_when_made() {
        for (exec, names, reason) in [
            (None, vec![], "a token needs at least one operation"),
            (
                None,
                vec!["exec.read", "exec.read"],
                "operation exec.read is named twice",
            ),
            (None, vec!["exec.write"], "unknown operation \"exec.write\""),
            (
                Some(ExecId(1)),
                vec!["exec.create"],
                "a token bound to an exec acts only on that exec",
            ),
            (
                Some(ExecId(0)),
                vec!["exec.read"],
                "exec id 0 is not a positive id",
            ),
        ] {
            let names: Vec<String> = names.into_iter().map(String::from).collect();
            let e = TokenScope::parse(exec, &names).unwrap_err();
            assert_eq!(e.code(), "invalid_token_scope");
            assert!(e.to_string().contains(reason), "{e}");
        }
        // The canonical order is the vocabulary's, whatever the request's.
        let s = TokenScope::parse(None, &["workspace.read".into(), "exec.create".into()]).unwrap();
        assert_eq!(s.operations().names(), ["exec.create", "workspace.read"]);
        assert_eq!(OperationSet::all().iter().count(), OPERATIONS.len());
        for o in OPERATIONS {
            assert_eq!(Operation::parse(o.as_str()), Some(*o));
        }
    }

    #[test]
    fn ttls_and_shapes_have_bounds() {
        let max = TOKEN_TTL_MAX_DEFAULT;
        assert_eq!(check_ttl_ms(1, max), Ok(SignedDuration::from_millis(1)));
        let max_ms = u64::try_from(max.as_millis()).unwrap();
        assert_eq!(check_ttl_ms(max_ms, max), Ok(max));
        assert_eq!(check_ttl_ms(0, max).unwrap_err().code(), "invalid_timeout");
        assert_eq!(
            check_ttl_ms(max_ms + 1, max).unwrap_err().code(),
            "invalid_timeout"
        );
        assert_eq!(
            check_ttl_ms(u64::MAX, max).unwrap_err().code(),
            "invalid_timeout"
        );
        assert_eq!(
            check_ttl_max(TOKEN_TTL_MAX_CEILING),
            Ok(TOKEN_TTL_MAX_CEILING)
        );
        assert!(check_ttl_max(TOKEN_TTL_MAX_CEILING + SignedDuration::from_nanos(1)).is_err());
        assert!(check_ttl_max(SignedDuration::ZERO).is_err());
        assert!(looks_like_token(&format!("lct_{}", "a".repeat(43))));
        assert!(!looks_like_token(&format!("lct_{}", "a".repeat(42))));
        assert!(!looks_like_token(&format!("lct_{}", "a".repeat(44))));
        assert!(!looks_like_token(&format!("lc_{}", "a".repeat(43))));
        // The body is base64url: letters, digits, `-` and `_`, nothing else.
        let body = format!("Az09-_{}", "x".repeat(37));
        assert!(looks_like_token(&format!("lct_{body}")));
        for c in ['+', '/', '=', '.', ' ', 'é'] {
            let bad = format!("lct_{c}{}", "x".repeat(43 - c.len_utf8()));
            assert_eq!(bad.len(), 4 + 43, "{bad}");
            assert!(!looks_like_token(&bad), "{bad}");
        }
    }

    #[test]
    fn the_ttl_bounds_are_thirty_and_three_hundred_sixty_five_days() {
        assert_eq!(
            TOKEN_TTL_MAX_DEFAULT,
            SignedDuration::from_secs(30 * 86_400)
        );
        assert_eq!(
            TOKEN_TTL_MAX_CEILING,
            SignedDuration::from_secs(365 * 86_400)
        );
        assert_eq!(TokenId(42).to_string(), "42");
    }

    #[test]
    fn the_full_set_holds_every_operation_once_and_a_bound_scope_its_exec() {
        let all = OperationSet::all();
        assert_eq!(
            all.names(),
            [
                "exec.create",
                "exec.read",
                "exec.input",
                "exec.cancel",
                "exec.hibernate",
                "exec.resume",
                "workspace.read",
                "approval.decide"
            ]
        );
        for o in OPERATIONS {
            assert!(all.contains(*o), "{o}");
        }
        assert_eq!(OperationSet::default().names(), Vec::<&str>::new());
        let b = TokenScope::new(Some(ExecId(4)), &[Operation::ExecRead]).unwrap();
        assert_eq!(b.exec(), Some(ExecId(4)));
        let u = TokenScope::new(None, &[Operation::ExecRead]).unwrap();
        assert_eq!(u.exec(), None);
        assert!(!Operation::ExecCreate.on_one_exec());
        assert!(
            OPERATIONS
                .iter()
                .filter(|o| **o != Operation::ExecCreate)
                .all(Operation::on_one_exec)
        );
    }
}
