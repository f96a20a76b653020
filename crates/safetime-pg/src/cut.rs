//! The safe expiry cut in PostgreSQL (migration 0018): reading it (also as
//! a standby sighting to carry across a takeover), the sampler's
//! leadership lock, observations, epoch claims, publishes, the sealed
//! horizon policy and its evidence.
//!
//! Every writing statement here goes through a database function of
//! migration 0018 that re-checks leadership (its own backend holds the
//! advisory lock), the epoch, and caps the proposal by database time; see
//! that file for the rules and the SQLSTATEs mapped by [`SafeTimeError`].
//! Besides the errors each function lists, any of them fails with
//! [`SafeTimeError::SchemaMissing`] on a database without migration 0018
//! and [`SafeTimeError::PermissionDenied`] for a role without the grants
//! it needs.
//!
//! Timestamps cross the wire as whole microseconds (`timestamptz` has no
//! finer precision) or as the cut's exact instant pair; this crate enables
//! no sqlx time feature.

use jiff::{SignedDuration, Timestamp};
use pgkit::{FailureKind, UrlError};
use safetime::{
    HorizonPolicy, HorizonPolicyError, InstantPair, QuarantineProgress, SafeTimeConfig, Topology,
    UncertainReason, Verdict,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::{PgConnection, Row};

/// First key of the sampler's session-level advisory lock: `'toll'`.
pub const LOCK_KEY_CLASS: i32 = 0x746f_6c6c;
/// Second key of the sampler's session-level advisory lock: `'safe'`.
pub const LOCK_KEY_OBJ: i32 = 0x7361_6665;

/// Why a safe-time statement failed. [`SafeTimeError::code`] is stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SafeTimeError {
    /// This backend does not hold the sampler lock (SQLSTATE TGS01), or the
    /// leadership checks found another backend or no lock.
    #[error("not the safe-time leader: {0}")]
    NotLeader(String),
    /// The caller's epoch is not the current one (TGS02): a stale leader.
    #[error("stale epoch: {0}")]
    StaleEpoch(String),
    /// The sampler loaded another horizon policy than the newest sealed one
    /// (TGS03). Code `horizon_policy_mismatch`: `policy_mismatch` is
    /// Tollgate's grant-policy mismatch.
    #[error("horizon policy mismatch: {0}")]
    HorizonPolicyMismatch(String),
    /// A policy change while a sampler runs (TGS04).
    #[error("a safe-time sampler is running: {0}")]
    SamplerRunning(String),
    /// A malformed proposal (TGS05).
    #[error("invalid cut proposal: {0}")]
    InvalidProposal(String),
    /// The database refused to clear the quarantine (TGS06).
    #[error("quarantine clearing refused: {0}")]
    QuarantineRefused(String),
    /// A horizon shorter than `max_ttl + reclaim_grace` (TGS07).
    #[error("horizon below the grant policy: {0}")]
    HorizonBelowPolicy(String),
    /// Publish before any claim (TGS08).
    #[error("no epoch claimed yet: {0}")]
    NoClaim(String),
    /// A stored policy row failed verification.
    #[error(transparent)]
    Policy(#[from] HorizonPolicyError),
    /// Stored data that does not decode (an out-of-range instant pair, an
    /// unknown reason code).
    #[error("corrupt safe-time row: {0}")]
    Corrupt(String),
    /// The safe-time tables or functions do not exist: SQLSTATE 42P01
    /// (`undefined_table`) or 42883 (`undefined_function`). The database
    /// is not migrated to schema 18 (migration 0018 creates them).
    #[error("the safe-time schema is missing: {0}; {SCHEMA_MISSING_HINT}")]
    SchemaMissing(String),
    /// The role lacks a privilege: SQLSTATE 42501
    /// (`insufficient_privilege`). A sampler's login role needs the grants
    /// of role `tollgate_sampler`; sealing a policy needs the owner.
    #[error("permission denied: {0}; {PERMISSION_DENIED_HINT}")]
    PermissionDenied(String),
    /// The database URL does not parse, its scheme is not `postgres://` or
    /// `postgresql://`, or its connection settings cannot be used (an sqlx
    /// configuration error). The message never repeats the URL (it may
    /// hold a password).
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// Anything else from the database or the connection. The message
    /// never contains the connection URL.
    #[error("database error: {0}")]
    Backend(String),
}

/// What to do about [`SafeTimeError::SchemaMissing`] (part of its message).
const SCHEMA_MISSING_HINT: &str = "run `tollgate migrate` against this database \
     (migration 0018 creates the safe-time tables and functions)";

/// What to do about [`SafeTimeError::PermissionDenied`] (part of its
/// message).
const PERMISSION_DENIED_HINT: &str = "the sampler's login role needs the grants of role \
     tollgate_sampler (GRANT tollgate_sampler TO <role>; see README), and sealing a policy \
     needs the database owner";

impl SafeTimeError {
    /// The operator hint the message ends with (after "; "), if it has
    /// one: [`SafeTimeError::SchemaMissing`] and
    /// [`SafeTimeError::PermissionDenied`].
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            SafeTimeError::SchemaMissing(_) => Some(SCHEMA_MISSING_HINT),
            SafeTimeError::PermissionDenied(_) => Some(PERMISSION_DENIED_HINT),
            _ => None,
        }
    }

    /// The message without its [`hint`](SafeTimeError::hint), for a log
    /// line that carries the hint in a field of its own.
    pub fn without_hint(&self) -> String {
        match self {
            SafeTimeError::SchemaMissing(m) => format!("the safe-time schema is missing: {m}"),
            SafeTimeError::PermissionDenied(m) => format!("permission denied: {m}"),
            other => other.to_string(),
        }
    }

    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            SafeTimeError::NotLeader(_) => "not_leader",
            SafeTimeError::StaleEpoch(_) => "stale_epoch",
            SafeTimeError::HorizonPolicyMismatch(_) => "horizon_policy_mismatch",
            SafeTimeError::SamplerRunning(_) => "sampler_running",
            SafeTimeError::InvalidProposal(_) => "invalid_proposal",
            SafeTimeError::QuarantineRefused(_) => "quarantine_refused",
            SafeTimeError::HorizonBelowPolicy(_) => "horizon_below_policy",
            SafeTimeError::NoClaim(_) => "no_claim",
            SafeTimeError::Policy(_) => "policy_corrupt",
            SafeTimeError::Corrupt(_) => "corrupt",
            SafeTimeError::SchemaMissing(_) => "schema_missing",
            SafeTimeError::PermissionDenied(_) => "permission_denied",
            SafeTimeError::InvalidUrl(_) => "invalid_url",
            SafeTimeError::Backend(_) => "backend",
        }
    }

    /// The code migration 0018's message for this error starts with
    /// (`"<code>: ..."`): [`SafeTimeError::code`], except `policy_mismatch`
    /// for [`SafeTimeError::HorizonPolicyMismatch`], whose SQL text predates
    /// the rename and stays as it is (existing databases have the
    /// migration's checksum recorded).
    fn migration_code(&self) -> &'static str {
        match self {
            SafeTimeError::HorizonPolicyMismatch(_) => "policy_mismatch",
            other => other.code(),
        }
    }
}

impl From<sqlx::Error> for SafeTimeError {
    fn from(e: sqlx::Error) -> Self {
        let failure = pgkit::classify(&e);
        if let (Some(code), Some(msg)) = (failure.sqlstate(), failure.server_message()) {
            // Migration 0018's messages start with a code ("not_leader:
            // ..."), which the code and the variant's text already say.
            let tgs = |variant: fn(String) -> SafeTimeError| {
                let code = variant(String::new()).migration_code();
                variant(strip_code(msg, code).to_owned())
            };
            match code {
                "TGS01" => return tgs(SafeTimeError::NotLeader),
                "TGS02" => return tgs(SafeTimeError::StaleEpoch),
                "TGS03" => return tgs(SafeTimeError::HorizonPolicyMismatch),
                "TGS04" => return tgs(SafeTimeError::SamplerRunning),
                "TGS05" => return tgs(SafeTimeError::InvalidProposal),
                "TGS06" => return tgs(SafeTimeError::QuarantineRefused),
                "TGS07" => return tgs(SafeTimeError::HorizonBelowPolicy),
                "TGS08" => return tgs(SafeTimeError::NoClaim),
                _ => {}
            }
        }
        let text = failure.text().to_owned();
        match failure.kind() {
            FailureKind::SchemaMissing => SafeTimeError::SchemaMissing(text),
            FailureKind::InsufficientPrivilege => SafeTimeError::PermissionDenied(text),
            // pgkit never keeps sqlx's configuration text: it may quote
            // the URL, password included.
            FailureKind::Configuration => SafeTimeError::InvalidUrl(INVALID_URL_TEXT.to_owned()),
            _ => SafeTimeError::Backend(text),
        }
    }
}

/// The message of [`SafeTimeError::InvalidUrl`] for an sqlx configuration
/// error (whose own text may quote the URL).
const INVALID_URL_TEXT: &str = "the URL or its connection settings are not valid \
     (postgres://USER:PASSWORD@HOST:PORT/DATABASE; the URL is not repeated here)";

/// The message of [`SafeTimeError::InvalidUrl`] for a URL of another
/// scheme (sqlx would read `mysql://...` as PostgreSQL settings and
/// connect).
const NOT_POSTGRES_URL_TEXT: &str = "the URL must start with postgres:// or postgresql:// \
     (the URL is not repeated here)";

/// Parses a PostgreSQL connection URL: the one place the sampler and the
/// `tollgate-safetime` commands turn a URL into connection settings.
///
/// # Errors
/// [`SafeTimeError::InvalidUrl`] if the scheme is not `postgres://` or
/// `postgresql://` (any case), or if sqlx cannot parse it. The message
/// never repeats the URL or any part of it.
pub fn connect_options(url: &str) -> Result<PgConnectOptions, SafeTimeError> {
    match pgkit::DatabaseUrl::parse(url) {
        Ok(parsed) => Ok(parsed.into_connect_options()),
        Err(
            UrlError::NotPostgres { .. }
            | UrlError::NotAUrl {
                postgres_scheme: false,
                ..
            },
        ) => Err(SafeTimeError::InvalidUrl(NOT_POSTGRES_URL_TEXT.to_owned())),
        Err(UrlError::NotAUrl { .. } | UrlError::Settings) => {
            Err(SafeTimeError::InvalidUrl(INVALID_URL_TEXT.to_owned()))
        }
    }
}

/// `msg` without a leading `"<code>: "`, if it has exactly that prefix.
fn strip_code<'m>(msg: &'m str, code: &str) -> &'m str {
    msg.strip_prefix(code)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(msg)
}

fn us_to_timestamp(us: i64) -> Result<Timestamp, SafeTimeError> {
    Timestamp::from_microsecond(us)
        .map_err(|e| SafeTimeError::Corrupt(format!("{us} microseconds: {e}")))
}

fn pair_to_timestamp(floor_us: i64, submicro_ns: i32) -> Result<Timestamp, SafeTimeError> {
    let submicro_ns = i16::try_from(submicro_ns)
        .map_err(|_| SafeTimeError::Corrupt(format!("submicro_ns {submicro_ns}")))?;
    InstantPair {
        floor_us,
        submicro_ns,
    }
    .decode()
    .map_err(|e| SafeTimeError::Corrupt(e.to_string()))
}

fn reason_from(code: Option<String>) -> Result<Option<UncertainReason>, SafeTimeError> {
    match code {
        None => Ok(None),
        Some(c) => UncertainReason::from_code(&c)
            .map(Some)
            .ok_or_else(|| SafeTimeError::Corrupt(format!("unknown uncertain_reason {c:?}"))),
    }
}

/// The cut in a row's `cut_floor_us` and `cut_submicro_ns` columns.
fn cut_from(row: &sqlx::postgres::PgRow) -> Result<Timestamp, SafeTimeError> {
    pair_to_timestamp(
        row.try_get("cut_floor_us")?,
        row.try_get("cut_submicro_ns")?,
    )
}

/// The verified policy in a row's `version`, `horizon_ms` and `digest`
/// columns.
fn policy_from(row: &sqlx::postgres::PgRow) -> Result<HorizonPolicy, SafeTimeError> {
    Ok(HorizonPolicy::verified(
        row.try_get("version")?,
        row.try_get("horizon_ms")?,
        row.try_get::<String, _>("digest")?.as_str(),
    )?)
}

/// The persisted cut as a reader sees it, with the database's own time at
/// the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutRow {
    /// The durable epoch of the leader that last claimed.
    pub epoch: i64,
    /// The safe expiry cut (exact instant pair).
    pub cut: Timestamp,
    /// `None` when the publisher declared the cut certain.
    pub uncertain: Option<UncertainReason>,
    /// The initial quarantine is in force.
    pub quarantined: bool,
    /// Publishes so far; a reader that sees it unchanged for longer than
    /// the sampling-gap bound treats the cut as stale.
    pub publish_seq: i64,
    /// Database time of the last publish (microseconds).
    pub published_at: Timestamp,
    /// Database time of the last anomaly, where the initial quarantine's
    /// proof (re)began (microseconds; kept after the quarantine cleared).
    pub proof_started_at: Timestamp,
    /// Database time of this read (microseconds).
    pub db_now: Timestamp,
    /// The horizon policy in force for the current epoch.
    pub policy: HorizonPolicy,
}

impl CutRow {
    /// Database time minus the cut: how far behind the cut is (the *cut
    /// lag*). Negative never happens for a cut written through the
    /// database functions.
    pub fn lag(&self) -> SignedDuration {
        self.db_now.duration_since(self.cut)
    }

    /// How far the initial quarantine's proof has come at this read, for
    /// samplers tuned as `config` (its drift allowance and recovery
    /// grace); `None` once the quarantine cleared (or never began).
    pub fn quarantine_progress(&self, config: &SafeTimeConfig) -> Option<QuarantineProgress> {
        self.quarantined.then(|| {
            QuarantineProgress::new(
                config,
                self.policy.horizon(),
                self.proof_started_at,
                self.db_now,
            )
        })
    }
}

/// Reads the cut; `Ok(None)` before any sampler claimed an epoch.
///
/// # Errors
/// [`SafeTimeError::SchemaMissing`] (a schema without migration 0018),
/// [`SafeTimeError::PermissionDenied`], [`SafeTimeError::Backend`],
/// [`SafeTimeError::Corrupt`], [`SafeTimeError::Policy`].
pub async fn read_cut<'c, E>(executor: E) -> Result<Option<CutRow>, SafeTimeError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let row = sqlx::query(
        "SELECT s.epoch, s.cut_floor_us, s.cut_submicro_ns, s.uncertain_reason, s.quarantined, \
                s.publish_seq, tollgate_safetime_pair_us(s.published_at) AS published_us, \
                tollgate_safetime_pair_us(s.proof_started_at) AS proof_started_us, \
                tollgate_safetime_pair_us(clock_timestamp()) AS db_now_us, \
                p.version, p.horizon_ms, p.digest \
           FROM tollgate_safetime s \
           JOIN tollgate_safetime_policy p ON p.version = s.policy_version",
    )
    .fetch_optional(executor)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(CutRow {
        epoch: row.try_get("epoch")?,
        cut: cut_from(&row)?,
        uncertain: reason_from(row.try_get("uncertain_reason")?)?,
        quarantined: row.try_get("quarantined")?,
        publish_seq: row.try_get("publish_seq")?,
        published_at: us_to_timestamp(row.try_get("published_us")?)?,
        proof_started_at: us_to_timestamp(row.try_get("proof_started_us")?)?,
        db_now: us_to_timestamp(row.try_get("db_now_us")?)?,
        policy: policy_from(&row)?,
    }))
}

/// The newest sealed horizon policy, digest verified (what a sampler loads
/// at start).
///
/// # Errors
/// [`SafeTimeError::Policy`] if the row fails verification;
/// [`SafeTimeError::Backend`].
pub async fn load_policy<'c, E>(executor: E) -> Result<HorizonPolicy, SafeTimeError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let row = sqlx::query(
        "SELECT version, horizon_ms, digest FROM tollgate_safetime_policy \
          ORDER BY version DESC LIMIT 1",
    )
    .fetch_one(executor)
    .await?;
    policy_from(&row)
}

/// A horizon policy a new deadline must fit, and which one it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingPolicy {
    /// The policy, digest verified.
    pub policy: HorizonPolicy,
    /// `"in force for the current epoch"` (the cut row's) or `"the newest
    /// sealed"` (the one the next epoch takes).
    pub which: &'static str,
}

/// Why [`check_bounds`] refused.
#[derive(Debug, thiserror::Error)]
pub enum HorizonCheckError {
    /// The cut row or the policy table could not be read or verified.
    #[error("{context}: {source}")]
    Read {
        /// What was being read.
        context: &'static str,
        /// The failure.
        source: SafeTimeError,
    },
    /// A bound does not fit a binding policy.
    #[error(
        "{shortfall} ({which}); seal a longer horizon (tollgate-safetime policy) or lower the setting"
    )]
    TooShort {
        /// The first bound that does not fit, with the exact values.
        shortfall: safetime::HorizonShortfall,
        /// Which policy: see [`BindingPolicy::which`].
        which: &'static str,
    },
}

/// The horizon policies every new deadline must fit: first the one in
/// force (the cut row's once a sampler has claimed, else the newest
/// sealed), then the newest sealed one when it is another version (the
/// next epoch takes it).
///
/// # Errors
/// [`HorizonCheckError::Read`].
pub async fn binding_policies(
    pool: &sqlx::PgPool,
) -> Result<(BindingPolicy, Option<BindingPolicy>), HorizonCheckError> {
    let read = |context| move |source| HorizonCheckError::Read { context, source };
    let row = read_cut(pool)
        .await
        .map_err(read("reading the safe expiry cut"))?;
    let newest = load_policy(pool)
        .await
        .map_err(read("reading the sealed horizon policy"))?;
    let newest = BindingPolicy {
        policy: newest,
        which: "the newest sealed",
    };
    Ok(match row {
        Some(r) if r.policy.version() != newest.policy.version() => (
            BindingPolicy {
                policy: r.policy,
                which: "in force for the current epoch",
            },
            Some(newest),
        ),
        Some(r) => (
            BindingPolicy {
                policy: r.policy,
                which: "in force for the current epoch",
            },
            None,
        ),
        None => (newest, None),
    })
}

/// Checks, before a process admits deadlines, that every one of `bounds`
/// fits every binding policy ([`binding_policies`], the one in force
/// first). Returns the policy in force.
///
/// # Errors
/// [`HorizonCheckError::TooShort`] naming the first bound and policy that
/// do not fit; [`HorizonCheckError::Read`].
pub async fn check_bounds(
    pool: &sqlx::PgPool,
    bounds: &[safetime::DeadlineBound],
) -> Result<HorizonPolicy, HorizonCheckError> {
    let (in_force, next) = binding_policies(pool).await?;
    for b in std::iter::once(&in_force).chain(next.as_ref()) {
        b.policy
            .covers(bounds)
            .map_err(|shortfall| HorizonCheckError::TooShort {
                shortfall,
                which: b.which,
            })?;
    }
    Ok(in_force.policy)
}

/// Seals a new horizon policy version (owner only; refused while any
/// sampler holds the lock). It takes effect at the next claimed epoch.
///
/// # Errors
/// [`SafeTimeError::SamplerRunning`], [`SafeTimeError::HorizonBelowPolicy`],
/// [`SafeTimeError::Backend`].
pub async fn seal_policy(
    conn: &mut PgConnection,
    horizon_ms: i64,
    sealed_by: &str,
) -> Result<HorizonPolicy, SafeTimeError> {
    let row = sqlx::query(
        "SELECT version, horizon_ms, digest FROM tollgate_safetime_seal_policy($1, $2)",
    )
    .bind(horizon_ms)
    .bind(sealed_by)
    .fetch_one(conn)
    .await?;
    policy_from(&row)
}

/// One immutable evidence row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// Ascending id.
    pub evidence_id: i64,
    /// `initial_cut`, `initial_quarantine`, `quarantine_cleared` or
    /// `policy_change`.
    pub kind: String,
    /// The epoch it was recorded in (`None` before the first claim).
    pub epoch: Option<i64>,
    /// Its detail, as JSON text.
    pub detail: String,
}

/// Most evidence rows [`evidence`] returns.
pub const EVIDENCE_MAX: i64 = 1_000;

/// The evidence rows, oldest first, at most `limit` (capped at
/// [`EVIDENCE_MAX`]).
///
/// # Errors
/// [`SafeTimeError::Backend`].
pub async fn evidence<'c, E>(executor: E, limit: i64) -> Result<Vec<Evidence>, SafeTimeError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let rows = sqlx::query(
        "SELECT evidence_id, kind, epoch, detail::text AS detail FROM tollgate_safetime_evidence \
          ORDER BY evidence_id LIMIT $1",
    )
    .bind(limit.clamp(0, EVIDENCE_MAX))
    .fetch_all(executor)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(Evidence {
                evidence_id: r.try_get("evidence_id")?,
                kind: r.try_get("kind")?,
                epoch: r.try_get("epoch")?,
                detail: r.try_get("detail")?,
            })
        })
        .collect()
}

/// Tries once to take the sampler's session-level advisory lock on `conn`
/// (never waits, so a standby can be stopped between attempts).
///
/// # Errors
/// [`SafeTimeError::Backend`].
pub async fn try_lock(conn: &mut PgConnection) -> Result<bool, SafeTimeError> {
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
        .bind(LOCK_KEY_CLASS)
        .bind(LOCK_KEY_OBJ)
        .fetch_one(conn)
        .await?)
}

/// What one observation query returned: database time, topology, and the
/// leadership facts of the backend that ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbObservation {
    /// `clock_timestamp()` (microseconds).
    pub db_now: Timestamp,
    /// Topology.
    pub topology: Topology,
    /// `pg_backend_pid()` of the backend that answered.
    pub backend_pid: i32,
    /// Whether that backend holds exactly the sampler lock.
    pub lock_held: bool,
}

/// Runs the observation function once on `conn`.
///
/// # Errors
/// [`SafeTimeError::Backend`], [`SafeTimeError::Corrupt`].
pub async fn observe(conn: &mut PgConnection) -> Result<DbObservation, SafeTimeError> {
    let row = sqlx::query(
        "SELECT tollgate_safetime_pair_us(db_now) AS db_now_us, backend_pid, lock_held, \
                system_identifier, timeline_id, in_recovery, \
                tollgate_safetime_pair_us(postmaster_start) AS postmaster_us \
           FROM tollgate_safetime_observe()",
    )
    .fetch_one(conn)
    .await?;
    Ok(DbObservation {
        db_now: us_to_timestamp(row.try_get("db_now_us")?)?,
        topology: Topology {
            system_identifier: row.try_get("system_identifier")?,
            timeline_id: row.try_get("timeline_id")?,
            in_recovery: row.try_get("in_recovery")?,
            postmaster_start: us_to_timestamp(row.try_get("postmaster_us")?)?,
        },
        backend_pid: row.try_get("backend_pid")?,
        lock_held: row.try_get("lock_held")?,
    })
}

/// The published cut as a standby sees it, with database time and topology
/// read by the same statement: what a sampler process carries across its
/// next epoch ([`safetime::CutReading`], once bracketed by its monotonic
/// clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutSighting {
    /// The epoch of the row read.
    pub epoch: i64,
    /// Its publish sequence number.
    pub publish_seq: i64,
    /// The persisted cut (exact instant pair).
    pub cut: Timestamp,
    /// `clock_timestamp()` in the same statement (microseconds).
    pub db_now: Timestamp,
    /// The topology of the server that answered.
    pub topology: Topology,
}

/// Reads the published cut with database time and topology in one
/// statement; `Ok(None)` before any claim. Read-only and without the lock,
/// so any sampler may run it, a standby on a connection of its own. The
/// statement is unnamed (not prepared), so it takes nothing from the
/// connection's prepared-statement cache and runs behind any proxy.
///
/// # Errors
/// [`SafeTimeError::SchemaMissing`], [`SafeTimeError::PermissionDenied`]
/// (it needs `tollgate_sampler`'s grants: reading the cut, executing the
/// observation function), [`SafeTimeError::Backend`],
/// [`SafeTimeError::Corrupt`].
pub async fn read_sighting(conn: &mut PgConnection) -> Result<Option<CutSighting>, SafeTimeError> {
    let row = sqlx::query(
        "SELECT s.epoch, s.publish_seq, s.cut_floor_us, s.cut_submicro_ns, \
                tollgate_safetime_pair_us(o.db_now) AS db_now_us, \
                o.system_identifier, o.timeline_id, o.in_recovery, \
                tollgate_safetime_pair_us(o.postmaster_start) AS postmaster_us \
           FROM tollgate_safetime s CROSS JOIN tollgate_safetime_observe() o",
    )
    .persistent(false)
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(CutSighting {
        epoch: row.try_get("epoch")?,
        publish_seq: row.try_get("publish_seq")?,
        cut: cut_from(&row)?,
        db_now: us_to_timestamp(row.try_get("db_now_us")?)?,
        topology: Topology {
            system_identifier: row.try_get("system_identifier")?,
            timeline_id: row.try_get("timeline_id")?,
            in_recovery: row.try_get("in_recovery")?,
            postmaster_start: us_to_timestamp(row.try_get("postmaster_us")?)?,
        },
    }))
}

/// What a claim returned: the new epoch and where its cut starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The new durable epoch.
    pub epoch: i64,
    /// The persisted cut the epoch starts from.
    pub cut: Timestamp,
    /// The initial quarantine is in force.
    pub quarantined: bool,
    /// The reason the database recorded for the epoch's uncertainty.
    pub uncertain: Option<UncertainReason>,
}

/// Claims the next epoch (the caller must hold the lock on `conn` and pass
/// the policy it loaded).
///
/// # Errors
/// [`SafeTimeError::NotLeader`], [`SafeTimeError::HorizonPolicyMismatch`],
/// [`SafeTimeError::Backend`].
pub async fn claim(
    conn: &mut PgConnection,
    policy: &HorizonPolicy,
) -> Result<Claim, SafeTimeError> {
    let row = sqlx::query(
        "SELECT epoch, cut_floor_us, cut_submicro_ns, quarantined, uncertain_reason \
           FROM tollgate_safetime_claim($1, $2)",
    )
    .bind(policy.version())
    .bind(policy.digest())
    .fetch_one(conn)
    .await?;
    Ok(Claim {
        epoch: row.try_get("epoch")?,
        cut: cut_from(&row)?,
        quarantined: row.try_get("quarantined")?,
        uncertain: reason_from(row.try_get("uncertain_reason")?)?,
    })
}

/// What the database accepted from a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The cut now persisted (capped by database time, never backward).
    pub cut: Timestamp,
    /// `None` when the persisted cut is certain.
    pub uncertain: Option<UncertainReason>,
    /// The initial quarantine is still in force.
    pub quarantined: bool,
    /// The publish sequence number after this publish.
    pub publish_seq: i64,
}

/// Publishes `verdict` for `epoch`, dated by its observation
/// (`verdict.observed_at`, never later than the publish's own database
/// time), which also caps the cut.
///
/// # Errors
/// [`SafeTimeError::NotLeader`], [`SafeTimeError::StaleEpoch`],
/// [`SafeTimeError::QuarantineRefused`], [`SafeTimeError::Backend`].
pub async fn publish(
    conn: &mut PgConnection,
    epoch: i64,
    verdict: &Verdict,
) -> Result<Published, SafeTimeError> {
    let pair = InstantPair::encode(verdict.proposal);
    // Whole microseconds toward the past (the database's resolution): the
    // row is dated no later than the observation.
    let observed_us = verdict.observed_at.as_microsecond();
    let row = sqlx::query(
        "SELECT cut_floor_us, cut_submicro_ns, uncertain_reason, quarantined, publish_seq \
           FROM tollgate_safetime_publish($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(epoch)
    .bind(pair.floor_us)
    .bind(i32::from(pair.submicro_ns))
    .bind(verdict.uncertain.map(|r| r.code()))
    .bind(verdict.anomaly)
    .bind(verdict.clears_quarantine)
    .bind(observed_us)
    .fetch_one(conn)
    .await?;
    Ok(Published {
        cut: cut_from(&row)?,
        uncertain: reason_from(row.try_get("uncertain_reason")?)?,
        quarantined: row.try_get("quarantined")?,
        publish_seq: row.try_get("publish_seq")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sqlstate: &'static str, message: &'static str, expected: SafeTimeError) {
        let e = SafeTimeError::from(pgkit::testkit::database_error(sqlstate, message));
        assert_eq!(e, expected, "SQLSTATE {sqlstate}");
    }

    #[test]
    fn sqlstates_map_to_stable_codes() {
        check(
            "42P01",
            "relation \"tollgate_safetime_policy\" does not exist",
            SafeTimeError::SchemaMissing(
                "relation \"tollgate_safetime_policy\" does not exist (SQLSTATE 42P01)".into(),
            ),
        );
        check(
            "42883",
            "function tollgate_safetime_pair_us(timestamp with time zone) does not exist",
            SafeTimeError::SchemaMissing(
                "function tollgate_safetime_pair_us(timestamp with time zone) does not exist \
                 (SQLSTATE 42883)"
                    .into(),
            ),
        );
        check(
            "42501",
            "permission denied for table tollgate_safetime_policy",
            SafeTimeError::PermissionDenied(
                "permission denied for table tollgate_safetime_policy (SQLSTATE 42501)".into(),
            ),
        );
        check(
            "TGS01",
            "not_leader: x",
            SafeTimeError::NotLeader("x".into()),
        );
        check(
            "42703",
            "column \"x\" does not exist",
            SafeTimeError::Backend("column \"x\" does not exist (SQLSTATE 42703)".into()),
        );
    }

    /// Migration 0018's messages (verbatim, with the values a run fills
    /// in) lose their leading code, which the variant's text and code
    /// already give; only that variant's exact code and ": " is stripped.
    #[test]
    fn migration_messages_lose_their_leading_code_once() {
        let cases = [
            (
                "TGS01",
                "not_leader: this backend does not hold the safe-time sampler lock",
                SafeTimeError::NotLeader(
                    "this backend does not hold the safe-time sampler lock".into(),
                ),
            ),
            (
                "TGS02",
                "stale_epoch: epoch 1 is not the current epoch 2",
                SafeTimeError::StaleEpoch("epoch 1 is not the current epoch 2".into()),
            ),
            (
                "TGS03",
                "policy_mismatch: the sealed policy is version 2 (digest ab), the sampler \
                 loaded version 1 (digest cd)",
                SafeTimeError::HorizonPolicyMismatch(
                    "the sealed policy is version 2 (digest ab), the sampler loaded version 1 \
                     (digest cd)"
                        .into(),
                ),
            ),
            (
                "TGS04",
                "sampler_running: stop every safe-time sampler before changing the horizon policy",
                SafeTimeError::SamplerRunning(
                    "stop every safe-time sampler before changing the horizon policy".into(),
                ),
            ),
            (
                "TGS05",
                "invalid_proposal: (1, 1000) is not an instant pair",
                SafeTimeError::InvalidProposal("(1, 1000) is not an instant pair".into()),
            ),
            (
                "TGS06",
                "quarantine_refused: 00:00:01.5 of database time since the proof began is \
                 less than the 3000 ms horizon",
                SafeTimeError::QuarantineRefused(
                    "00:00:01.5 of database time since the proof began is less than the 3000 \
                     ms horizon"
                        .into(),
                ),
            ),
            (
                "TGS07",
                "horizon_below_policy: horizon 1000 ms must be positive and cover max_ttl + \
                 reclaim_grace (3630000 ms)",
                SafeTimeError::HorizonBelowPolicy(
                    "horizon 1000 ms must be positive and cover max_ttl + reclaim_grace \
                     (3630000 ms)"
                        .into(),
                ),
            ),
            (
                "TGS08",
                "no_claim: no epoch has been claimed",
                SafeTimeError::NoClaim("no epoch has been claimed".into()),
            ),
            // Another code, no space, or no prefix at all: left as sent.
            (
                "TGS01",
                "stale_epoch: x",
                SafeTimeError::NotLeader("stale_epoch: x".into()),
            ),
            (
                "TGS04",
                "sampler_running:x",
                SafeTimeError::SamplerRunning("sampler_running:x".into()),
            ),
            (
                "TGS04",
                "sampler_running",
                SafeTimeError::SamplerRunning("sampler_running".into()),
            ),
            (
                "TGS04",
                "x sampler_running: y",
                SafeTimeError::SamplerRunning("x sampler_running: y".into()),
            ),
            // Stripped once.
            (
                "TGS08",
                "no_claim: no_claim: z",
                SafeTimeError::NoClaim("no_claim: z".into()),
            ),
        ];
        for (sqlstate, message, expected) in cases {
            check(sqlstate, message, expected);
        }
        assert_eq!(
            SafeTimeError::from(pgkit::testkit::database_error(
                "TGS04",
                "sampler_running: stop every safe-time sampler before changing the horizon policy"
            ))
            .to_string(),
            "a safe-time sampler is running: stop every safe-time sampler before changing the \
             horizon policy"
        );
    }

    /// Only postgres:// and postgresql:// (in any case) get to sqlx; the
    /// refusal repeats nothing of the URL.
    #[test]
    fn connect_options_refuses_other_schemes() {
        for url in [
            "postgres://u:pw@h/db",
            "postgresql://u:pw@h:5433/db",
            "POSTGRES://u:pw@h/db",
            "PostgreSQL://h/db",
        ] {
            assert!(connect_options(url).is_ok(), "{url}");
        }
        for url in [
            "mysql://u:s3cret@h/db",
            "postgre://u:s3cret@h/db",
            "postgres:/u:s3cret@h/db",
            "u:s3cret@h/db",
            " postgres://u:s3cret@h/db",
            "",
        ] {
            let e = connect_options(url).unwrap_err();
            assert_eq!(
                (e.code(), e.to_string()),
                (
                    "invalid_url",
                    "invalid database URL: the URL must start with postgres:// or \
                     postgresql:// (the URL is not repeated here)"
                        .to_owned()
                ),
                "{url:?}"
            );
        }
        let e = connect_options("postgres://u:s3cret@[bad").unwrap_err();
        assert_eq!(
            (e.code(), e.to_string().contains("s3cret")),
            ("invalid_url", false)
        );
    }

    #[test]
    fn the_hint_is_the_end_of_the_message_and_can_be_left_out() {
        let schema = SafeTimeError::SchemaMissing("m".into());
        assert_eq!(schema.without_hint(), "the safe-time schema is missing: m");
        assert_eq!(
            schema.hint(),
            Some(
                "run `tollgate migrate` against this database (migration 0018 creates the \
                 safe-time tables and functions)"
            )
        );
        let denied = SafeTimeError::PermissionDenied("m".into());
        assert_eq!(denied.without_hint(), "permission denied: m");
        for e in [schema, denied] {
            assert_eq!(
                format!("{}; {}", e.without_hint(), e.hint().unwrap()),
                e.to_string()
            );
        }
        let other = SafeTimeError::NoClaim("m".into());
        assert_eq!(
            (other.hint(), other.without_hint()),
            (None, "no epoch claimed yet: m".to_owned())
        );
    }

    #[test]
    fn a_configuration_error_is_invalid_url_and_never_repeats_it() {
        let e = SafeTimeError::from(sqlx::Error::Configuration(
            "postgres://u:s3cret@h/db is bad".into(),
        ));
        assert_eq!(e.code(), "invalid_url");
        assert_eq!(
            e.to_string(),
            "invalid database URL: the URL or its connection settings are not valid \
             (postgres://USER:PASSWORD@HOST:PORT/DATABASE; the URL is not repeated here)"
        );
    }

    #[test]
    fn the_new_codes_and_their_operator_hints() {
        let schema = SafeTimeError::SchemaMissing("m".into());
        assert_eq!(schema.code(), "schema_missing");
        assert_eq!(
            schema.to_string(),
            "the safe-time schema is missing: m; run `tollgate migrate` against this database \
             (migration 0018 creates the safe-time tables and functions)"
        );
        let denied = SafeTimeError::PermissionDenied("m".into());
        assert_eq!(denied.code(), "permission_denied");
        assert_eq!(
            denied.to_string(),
            "permission denied: m; the sampler's login role needs the grants of role \
             tollgate_sampler (GRANT tollgate_sampler TO <role>; see README), and sealing a \
             policy needs the database owner"
        );
        assert_eq!(SafeTimeError::InvalidUrl("m".into()).code(), "invalid_url");
    }

    /// One term, one meaning: `policy_mismatch` is Tollgate's grant-policy
    /// mismatch, so the horizon's is `horizon_policy_mismatch`, although
    /// migration 0018's message for it still starts with `policy_mismatch:`
    /// (which is stripped, as every code prefix is).
    #[test]
    fn the_horizon_policy_mismatch_has_its_own_code() {
        let e = SafeTimeError::from(pgkit::testkit::database_error(
            "TGS03",
            "policy_mismatch: the sealed policy is version 2 (digest ab), the sampler loaded \
             version 1 (digest cd)",
        ));
        assert_eq!(
            (e.code(), e.to_string()),
            (
                "horizon_policy_mismatch",
                "horizon policy mismatch: the sealed policy is version 2 (digest ab), the \
                 sampler loaded version 1 (digest cd)"
                    .to_owned()
            )
        );
    }
}
