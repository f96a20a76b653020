//! The PostgreSQL seam: connecting to, migrating and inspecting the
//! PostgreSQL store ([`tollgate_pg::PostgresStore`]).
//!
//! Start-up against PostgreSQL ([`connect`]): wait (bounded by
//! `--connect-timeout`, [`Config::connect_timeout`]) for the database to accept connections; apply pending
//! migrations unless told not to; then open the store, whose own fences
//! refuse a schema this binary does not know, pending migrations, and a
//! recorded policy different from the configured one
//! (`policy_mismatch`). The capability key must come from a stable
//! `--secret-file` (checked by [`crate::serve`]) so capabilities survive
//! restarts.
//!
//! [`PgOps`] answers readiness and status through `tollgate-pg`'s operator
//! accessors: [`tollgate_pg::schema_version`],
//! [`tollgate_pg::migration_in_progress`] (maintenance: the migrator's
//! dedicated session, [`tollgate_pg::MIGRATE_APPLICATION_NAME`], is
//! connected) and [`tollgate_pg::lease_counts`] (active leases, and those
//! whose expiry is a legacy upper bound).
//!
//! On the safe-cut clock ([`ClockKind::SafeCut`]) start-up also checks,
//! after migrating and *before* the store records or checks its grant
//! policy, that every deadline the service can admit fits inside the
//! owner-sealed horizon ([`check_horizon`]):
//! `max_ttl + reclaim_grace + safetime_gap_max` must not exceed the horizon
//! of the cut row's policy (the one in force for the current epoch) nor that
//! of the newest sealed policy (the one the next epoch takes). The gap bound
//! is there because a grant's expiry is counted from the cut plus the
//! reading's staleness bound, which is at most the gap bound for every
//! reading that admits a grant (a renewal on a staler reading whose deadline
//! would not fit is refused with `deadline_beyond_horizon`). Tollgate's idempotency records never expire (nothing
//! deletes them, so no retention can outlive the horizon); the grant
//! policy's bound ([`tollgate::LEASE_GRANT_DEADLINE`]) is the only
//! deadline kind this service has to check.
//!
//! The policy commands ([`show_policy`], [`set_policy`]) work on a plain
//! connection pool ([`open_pool`]) rather than a store, because opening a
//! store checks the recorded policy against the configured one, and
//! changing the recorded policy is exactly when they differ.
//!
//! No SQL is written in this crate's `src`: every statement lives in
//! `tollgate-pg`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use safetime::HorizonPolicy;
use safetime_pg::SafeTimeError;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tollgate::{Allocator, CapabilityKey, GrantPolicy, LeaseState, StorageError};
use tollgate_pg::{PolicyChange, PostgresStore, Schema};

use crate::config::Config;
use clock::ClockKind;
use tollgate_api::storage::{Readiness, ServiceStore, StatusCounts, StoreOps};

/// Pause between connection attempts while waiting for the database.
pub const DB_RETRY_PAUSE: Duration = Duration::from_millis(500);

/// While waiting for the database, how often a progress line is logged
/// (the first failure is logged at once, then one line per this interval,
/// never one per attempt).
pub const DB_WAIT_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Errors of the PostgreSQL seam.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// No database URL was configured.
    #[error("no database URL configured")]
    NoUrl,
    /// The database's leases are timed by the safe expiry cut (a sampler
    /// has claimed an epoch), but this process is configured with another
    /// clock: it would expire leases early by its own clock.
    #[error(
        "this database's leases are timed by the safe expiry cut (a safe-time sampler has claimed epoch {epoch}), but this process runs on the {clock} clock, which could reclaim leases early; run every process that serves or reclaims them with --clock safe-cut"
    )]
    ClockNotSafeCut {
        /// The configured clock.
        clock: ClockKind,
        /// The cut row's epoch.
        epoch: i64,
    },
    /// A store operation failed; `context` says which.
    #[error("{context}: {source}")]
    Storage {
        /// What was being done.
        context: &'static str,
        /// The store's error.
        source: StorageError,
    },
    /// Reading the safe-time tables failed.
    #[error("{context}: {source}")]
    SafeTime {
        /// What was being done.
        context: &'static str,
        /// The error.
        source: SafeTimeError,
    },
    /// On the safe-cut clock, the grant policy admits a deadline beyond the
    /// sealed horizon.
    #[error(
        "max_ttl {max_ttl} + reclaim_grace {reclaim_grace} + safetime_gap_max {gap_max} exceeds the sealed safe-time horizon of {horizon_ms} ms = {horizon} (policy version {version}, {which}): every deadline the service admits, counted from the cut plus its staleness (at most the gap bound), must fit inside it; lower --max-ttl/--reclaim-grace (tollgate policy set) or --safetime-gap-max, or seal a longer horizon with every sampler stopped"
    )]
    HorizonTooShort {
        /// The configured longest TTL.
        max_ttl: jiff::SignedDuration,
        /// The configured grace.
        reclaim_grace: jiff::SignedDuration,
        /// The configured sampling-gap bound (`--safetime-gap-max`).
        gap_max: jiff::SignedDuration,
        /// The policy's version.
        version: i64,
        /// Its horizon, milliseconds.
        horizon_ms: i64,
        /// Its horizon as a duration.
        horizon: jiff::SignedDuration,
        /// Which policy: the current epoch's or the newest sealed one.
        which: &'static str,
    },
}

fn ctx(context: &'static str) -> impl FnOnce(StorageError) -> PgError {
    move |source| PgError::Storage { context, source }
}

/// One migration as `tollgate migrate` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationInfo {
    /// Version number.
    pub version: i64,
    /// Description.
    pub description: String,
}

/// The schema version this binary expects.
pub fn expected_schema_version() -> i64 {
    Schema::current().latest_version()
}

/// Retries `attempt` while it fails with [`StorageError::Unavailable`], for
/// at most `wait` in all (`--connect-timeout`; each attempt is cut off at
/// what is left of it), pausing [`DB_RETRY_PAUSE`] between attempts. The
/// first failure is logged once as a warning naming the bound, then
/// progress every [`DB_WAIT_PROGRESS_EVERY`]; the last failure is returned
/// with how long was waited.
async fn with_wait<T, F, Fut>(wait: Duration, mut attempt: F) -> Result<T, StorageError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StorageError>>,
{
    let start = tokio::time::Instant::now();
    let deadline = start + wait;
    let mut attempts: u64 = 0;
    let mut next_progress = start + DB_WAIT_PROGRESS_EVERY;
    loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let result = match tokio::time::timeout(left, attempt()).await {
            Ok(r) => r,
            Err(_) => Err(StorageError::Unavailable {
                message: "the database did not answer".into(),
            }),
        };
        let message = match result {
            Err(StorageError::Unavailable { message }) => message,
            other => return other,
        };
        let now = tokio::time::Instant::now();
        if now + DB_RETRY_PAUSE >= deadline {
            return Err(StorageError::Unavailable {
                message: format!(
                    "{message} (gave up after {:.1} s and {attempts} attempt(s); \
                     --connect-timeout is {})",
                    now.duration_since(start).as_secs_f64(),
                    jiff::SignedDuration::try_from(wait).unwrap_or(jiff::SignedDuration::MAX)
                ),
            });
        }
        if attempts == 1 {
            tracing::warn!(
                %message,
                connect_timeout = ?wait,
                "database unavailable; retrying until it answers or --connect-timeout passes"
            );
        } else if now >= next_progress {
            next_progress = now + DB_WAIT_PROGRESS_EVERY;
            tracing::warn!(
                %message,
                waited_s = now.duration_since(start).as_secs(),
                connect_timeout = ?wait,
                attempts,
                "database still unavailable; retrying"
            );
        }
        tokio::time::sleep(DB_RETRY_PAUSE).await;
    }
}

/// Connects to the store at `cfg.database_url`: waits for the database,
/// applies pending migrations when `cfg.migrate_on_start`, and opens the
/// store (schema fence, policy check).
///
/// # Errors
/// [`PgError::NoUrl`]; [`PgError::Storage`] with the store's error
/// (`policy_mismatch`, unknown or pending migrations, unreachable).
pub async fn connect(cfg: &Config, key: CapabilityKey) -> Result<ServiceStore, PgError> {
    connect_for(cfg, key, Access::ReadWrite).await
}

/// What a process opening the store will do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Serves, reclaims or otherwise writes time-dependent state: on a
    /// database on the safe expiry cut it must run on the cut.
    ReadWrite,
    /// Only reads (`tollgate status`, `tollgate audit` run directly): no
    /// clock decides anything, so any clock may open it.
    ReadOnly,
}

/// [`connect`] for a process whose [`Access`] is given: a
/// [`Access::ReadOnly`] one skips the rule that a database on the cut
/// needs `--clock safe-cut` (nothing it does depends on time).
///
/// # Errors
/// As [`connect`].
pub async fn connect_for(
    cfg: &Config,
    key: CapabilityKey,
    access: Access,
) -> Result<ServiceStore, PgError> {
    let url = cfg.database_url.as_deref().ok_or(PgError::NoUrl)?;
    let wait = Config::std(cfg.connect_timeout);
    if cfg.migrate_on_start {
        let report = with_wait(wait, || tollgate_pg::migrate(url))
            .await
            .map_err(ctx("applying migrations"))?;
        if !report.applied.is_empty() {
            tracing::info!(applied = ?report.applied, to = ?report.to_version, "migrations applied");
        }
    }
    if cfg.clock != ClockKind::SafeCut && access == Access::ReadWrite {
        // Once a sampler has claimed, every process must be on the cut: a
        // system (or test) clock ahead of it would reclaim early.
        let pool = open_pool(url, wait).await?;
        let row = safetime_pg::read_cut(&pool).await;
        pool.close().await;
        match row {
            Ok(Some(row)) => {
                return Err(PgError::ClockNotSafeCut {
                    clock: cfg.clock,
                    epoch: row.epoch,
                });
            }
            Ok(None) => {}
            Err(source) => {
                return Err(PgError::SafeTime {
                    context: "reading the safe expiry cut",
                    source,
                });
            }
        }
    }
    if cfg.clock == ClockKind::SafeCut {
        let pool = open_pool(url, wait).await?;
        let checked = check_horizon(&pool, cfg.policy, cfg.safetime_gap_max).await;
        pool.close().await;
        let horizon = checked?;
        tracing::info!(
            version = horizon.version(),
            horizon_ms = horizon.horizon_ms(),
            "the sealed safe-time horizon covers max_ttl + reclaim_grace + safetime_gap_max"
        );
    }
    let options = store_options(cfg);
    let store = with_wait(wait, || {
        PostgresStore::connect_with(url, cfg.policy, key.clone(), options)
    })
    .await
    .map_err(ctx("opening the PostgreSQL store"))?;
    Ok(service_store(Arc::new(store)))
}

/// Checks that `policy` admits no deadline beyond the sealed horizon on a
/// cut whose certain readings are at most `gap_max` stale: the cut row's
/// policy (when a sampler has claimed an epoch) and the newest sealed
/// policy must both cover `max_ttl + reclaim_grace + gap_max`
/// ([`HorizonPolicy::covers`] over [`GrantPolicy::deadline_bound_after`]).
/// (The database's own checks of a grant policy against the horizon cover
/// `max_ttl + reclaim_grace`; this one is stricter by the gap bound.)
/// Returns the policy in force (the row's, or the newest before any claim).
///
/// # Errors
/// [`PgError::HorizonTooShort`] naming both values; [`PgError::SafeTime`]
/// when the tables cannot be read or a policy row fails verification.
pub async fn check_horizon(
    pool: &PgPool,
    policy: GrantPolicy,
    gap_max: jiff::SignedDuration,
) -> Result<HorizonPolicy, PgError> {
    let bounds = [policy.deadline_bound_after(gap_max)];
    safetime_pg::check_bounds(pool, &bounds)
        .await
        .map_err(|e| match e {
            safetime_pg::HorizonCheckError::Read { context, source } => {
                PgError::SafeTime { context, source }
            }
            safetime_pg::HorizonCheckError::TooShort { shortfall, which } => {
                PgError::HorizonTooShort {
                    max_ttl: policy.max_ttl(),
                    reclaim_grace: policy.reclaim_grace(),
                    gap_max,
                    version: shortfall.version,
                    horizon_ms: shortfall.horizon.as_millis() as i64,
                    horizon: shortfall.horizon,
                    which,
                }
            }
        })
}

/// The service's store (allocator and operator questions) over an open
/// PostgreSQL store.
pub fn service_store(store: Arc<PostgresStore>) -> ServiceStore {
    ServiceStore {
        allocator: store.clone() as Arc<dyn Allocator>,
        ops: Arc::new(PgOps {
            pool: store.pool().clone(),
        }),
    }
}

/// Applies pending migrations (or, with `dry_run`, lists them), waiting up
/// to `wait` for the database.
///
/// # Errors
/// [`PgError::Storage`].
pub async fn migrate(
    url: &str,
    dry_run: bool,
    wait: Duration,
) -> Result<Vec<MigrationInfo>, PgError> {
    if dry_run {
        let pending = with_wait(wait, || tollgate_pg::pending_migrations(url))
            .await
            .map_err(ctx("listing pending migrations"))?;
        return Ok(pending
            .into_iter()
            .map(|m| MigrationInfo {
                version: m.version,
                description: m.description,
            })
            .collect());
    }
    let report = with_wait(wait, || tollgate_pg::migrate(url))
        .await
        .map_err(ctx("applying migrations"))?;
    let known = Schema::current().known();
    Ok(report
        .applied
        .into_iter()
        .map(|version| {
            // The migrator applies only this binary's migrations.
            let m = known
                .iter()
                .find(|m| m.version == version)
                .unwrap_or_else(|| panic!("migration {version} applied but not known"));
            MigrationInfo {
                version,
                description: m.description.clone(),
            }
        })
        .collect())
}

/// Connections of the operator commands' pool: they run one statement at
/// a time.
const OPERATOR_POOL_CONNECTIONS: u32 = 2;

/// How long one attempt of an operator command waits for a connection
/// ([`with_wait`] retries an unavailable database for up to
/// `--connect-timeout`).
const OPERATOR_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// A small pool on `url` for the operator commands, once the schema fence
/// passes (the database has applied exactly this binary's migrations). It
/// checks no policy: see the module docs. Waits up to `wait` for the
/// database like [`connect`].
///
/// # Errors
/// [`PgError::Storage`]: an unparsable URL (not repeated in the message),
/// an unreachable database, an unknown or pending migration.
pub async fn open_pool(url: &str, wait: Duration) -> Result<PgPool, PgError> {
    // Neither the URL nor sqlx's message (which may quote it) is repeated.
    let options = pgkit::DatabaseUrl::parse(url)
        .map(pgkit::DatabaseUrl::into_connect_options)
        .map_err(|_| PgError::Storage {
            context: "opening the database",
            source: StorageError::Failure {
                message: "invalid database url".into(),
            },
        })?;
    // Lazy: the first statement connects, and `tollgate-pg` maps its errors.
    let pool = PgPoolOptions::new()
        .max_connections(OPERATOR_POOL_CONNECTIONS)
        .acquire_timeout(OPERATOR_ACQUIRE_TIMEOUT)
        .connect_lazy_with(options);
    let schema = Schema::current();
    if let Err(e) = with_wait(wait, || schema.check(&pool)).await {
        pool.close().await;
        return Err(ctx("checking the schema")(e));
    }
    Ok(pool)
}

/// The policy recorded in the database at `url` (`None` before any store
/// was opened on it or any `policy set`): what a read-only operator
/// command opens the store with, so that it need not repeat the service's
/// policy flags.
///
/// # Errors
/// As [`open_pool`]; database errors.
pub async fn recorded_policy(url: &str, wait: Duration) -> Result<Option<GrantPolicy>, PgError> {
    let pool = open_pool(url, wait).await?;
    let recorded = tollgate_pg::recorded_policy(&pool)
        .await
        .map_err(ctx("reading the recorded policy"));
    pool.close().await;
    recorded
}

/// A read-only view of a database on which no policy is recorded yet,
/// which records nothing (opening a [`PostgresStore`] would record
/// `policy`, which a sealed horizon may refuse and which a later `serve`
/// with other values would then be refused by). Its operator questions
/// (readiness, counts) are [`PgOps`] on a pool past the schema fence; its
/// allocator is an empty memory store applying `policy`: with no policy
/// recorded no store was ever opened on the database, and a store records
/// its policy before its first operation, so the database holds no
/// account, lease or ledger entry for it to show.
///
/// # Errors
/// As [`open_pool`]; [`PgError::Storage`] when the random source fails.
pub async fn unrecorded_view(
    url: &str,
    policy: GrantPolicy,
    wait: Duration,
) -> Result<ServiceStore, PgError> {
    let pool = open_pool(url, wait).await?;
    let key = CapabilityKey::generate().map_err(|e| PgError::Storage {
        context: "making a stand-in capability key",
        source: StorageError::Failure {
            message: e.to_string(),
        },
    })?;
    let memory = tollgate::MemoryStore::new(policy, key).map_err(ctx("opening the view"))?;
    Ok(ServiceStore {
        allocator: Arc::new(memory),
        ops: Arc::new(PgOps { pool }),
    })
}

/// The recorded policy (`None` before any process has started against
/// the database) and the most recent changes, oldest first (at most
/// [`tollgate_pg::POLICY_CHANGES_MAX`]).
///
/// # Errors
/// As [`open_pool`]; database errors.
pub async fn show_policy(
    url: &str,
    wait: Duration,
) -> Result<(Option<GrantPolicy>, Vec<PolicyChange>), PgError> {
    let pool = open_pool(url, wait).await?;
    let shown = async {
        let policy = tollgate_pg::recorded_policy(&pool)
            .await
            .map_err(ctx("reading the recorded policy"))?;
        let changes = tollgate_pg::policy_changes(&pool)
            .await
            .map_err(ctx("reading the policy changes"))?;
        Ok((policy, changes))
    }
    .await;
    pool.close().await;
    shown
}

/// Records `policy` as the database's policy, by `changed_by`: the
/// operator command [`tollgate_pg::set_policy`]. Running processes keep
/// theirs; see the README's "Changing the grant policy".
///
/// # Errors
/// As [`open_pool`]; an invalid `changed_by`; database errors.
pub async fn set_policy(
    url: &str,
    policy: GrantPolicy,
    changed_by: &str,
    wait: Duration,
) -> Result<PolicyChange, PgError> {
    let pool = open_pool(url, wait).await?;
    let change = tollgate_pg::set_policy(&pool, policy, changed_by)
        .await
        .map_err(ctx("recording the policy"));
    pool.close().await;
    change
}

/// The longest a readiness probe (`/readyz`, the readiness part of
/// `GET /v1/admin/status`) waits for the database before it answers "not
/// ready, storage unreachable".
pub const READINESS_PROBE_MAX: Duration = Duration::from_secs(2);

/// The longest any request waits for a connection of the service's pool
/// (for a free one, or for a new one to open) before it is answered 503
/// `storage_unavailable`: the bound of the readiness probe, so that with
/// the database down every request, whatever its route or clock, answers
/// within the same bound.
pub const STORE_ACQUIRE_MAX: Duration = READINESS_PROBE_MAX;

/// The store options of `cfg`: the default pool, connections bounded by
/// [`STORE_ACQUIRE_MAX`], declaring the safe-cut clock when it is
/// configured.
pub fn store_options(cfg: &Config) -> tollgate_pg::StoreOptions {
    tollgate_pg::StoreOptions {
        acquire_timeout: STORE_ACQUIRE_MAX,
        on_safe_cut: cfg.clock == ClockKind::SafeCut,
        ..tollgate_pg::StoreOptions::default()
    }
}

/// [`StoreOps`] of the PostgreSQL store; see the module docs.
#[derive(Debug)]
pub struct PgOps {
    pool: PgPool,
}

#[async_trait]
impl StoreOps for PgOps {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn readiness(&self) -> Readiness {
        let expected = Some(expected_schema_version());
        let pool = &self.pool;
        // Bounded: a probe must answer even while the database does not
        // (each query alone could wait the pool's acquire timeout).
        let probe = async {
            let version = tollgate_pg::schema_version(pool).await;
            let maintenance = tollgate_pg::migration_in_progress(pool).await;
            (version, maintenance)
        };
        let Ok((version, maintenance)) = tokio::time::timeout(READINESS_PROBE_MAX, probe).await
        else {
            return Readiness {
                store: "postgres",
                reachable: false,
                schema_version: None,
                expected_schema_version: expected,
                maintenance: false,
                detail: Some(format!(
                    "the database did not answer within {} s",
                    READINESS_PROBE_MAX.as_secs()
                )),
            };
        };
        match (version, maintenance) {
            (Ok(v), Ok(m)) => Readiness {
                store: "postgres",
                reachable: true,
                schema_version: v,
                expected_schema_version: expected,
                maintenance: m,
                detail: None,
            },
            // At least one failed: the first failure is the detail.
            (v, m) => Readiness {
                store: "postgres",
                reachable: false,
                schema_version: v.as_ref().ok().copied().flatten(),
                expected_schema_version: expected,
                maintenance: m.as_ref().ok().copied().unwrap_or(false),
                detail: v.err().or(m.err()).map(|e| e.to_string()),
            },
        }
    }

    fn pg_pool(&self) -> Option<&PgPool> {
        Some(&self.pool)
    }

    async fn counts(&self) -> Result<StatusCounts, StorageError> {
        let rows = tollgate_pg::lease_counts(&self.pool).await?;
        let mut counts = StatusCounts::default();
        for row in rows.iter().filter(|r| r.state == LeaseState::Active) {
            let n = u64::try_from(row.count).map_err(|_| StorageError::Failure {
                message: format!("lease_counts returned a negative count, {}", row.count),
            })?;
            counts.active_leases = counts.active_leases.saturating_add(n);
            if row.expiry_is_upper_bound {
                counts.active_legacy_bounds = counts.active_legacy_bounds.saturating_add(n);
            }
        }
        Ok(counts)
    }
}
