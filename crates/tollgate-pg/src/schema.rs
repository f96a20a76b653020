//! The embedded migrations and the startup fences.
//!
//! # Design
//!
//! Migrations `migrations/0001_*.sql` .. `0017_*.sql` are embedded in the
//! binary with `sqlx::migrate!`, checksummed, and applied by sqlx's migrator
//! under its session advisory lock, each in one transaction together with
//! its bookkeeping row in `_sqlx_migrations`. Versions 1 to 16 are the
//! schema as it stood before exact instants (lease expiry as
//! `expires_at_us`, microseconds truncated toward zero); version 17 is the
//! exact-instant migration (see `migrations/0017_exact_instants.sql` and
//! `docs/upgrade-0017.md`).
//!
//! **Dedicated connection.** sqlx's migrator returns early on a failed
//! migration without releasing its session advisory lock. On a pooled
//! connection that lock would stay held and the next migration run, on
//! another connection, would wait for it forever. [`Schema::migrate`]
//! therefore opens its own connection (application name
//! [`MIGRATE_APPLICATION_NAME`]) and always closes it, success or not.
//!
//! **Fences.** A database that has applied a version this binary does not
//! know belongs to a newer binary: [`Schema::check`] (run by every
//! [`crate::PostgresStore`] at startup) and [`Schema::migrate`] refuse it,
//! naming the version. After migration 0017 this stops an old process from
//! starting, while the column rename stops the old statements of a process
//! that is already running. A database with pending migrations is refused
//! by the store too: it must be migrated first.

use std::borrow::Cow;
use std::str::FromStr;

use sqlx::migrate::{Migration, Migrator};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tollgate::StorageError;

use crate::error::map_sqlx_error;
use crate::persistence::{self, AppliedRow};

/// Every migration this binary carries.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The version of migration 0017, the exact-instant migration.
pub const EXACT_INSTANTS_VERSION: i64 = 17;

/// The version of migration 0018, safe time (the persisted cut, its epoch,
/// the sealed horizon policy and the sampler's functions).
pub const SAFE_TIME_VERSION: i64 = 18;

/// The `application_name` of the migration connection, so operators can see
/// it in `pg_stat_activity` (for example while it waits for table locks).
pub const MIGRATE_APPLICATION_NAME: &str = "tollgate-migrate";

/// A migration that a database has not applied yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMigration {
    /// Its version (the number its file name starts with).
    pub version: i64,
    /// Its description (the rest of the file name).
    pub description: String,
}

/// What a [`Schema::migrate`] run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The highest applied version before the run (`None`: never migrated).
    pub from_version: Option<i64>,
    /// The highest applied version after the run.
    pub to_version: Option<i64>,
    /// The versions this run applied, ascending.
    pub applied: Vec<i64>,
}

/// A set of known migrations: all of this binary's ([`Schema::current`]),
/// or a prefix of them ([`Schema::through`]), which behaves exactly like an
/// older binary that knew only those versions.
#[derive(Debug, Clone)]
pub struct Schema {
    migrations: Cow<'static, [Migration]>,
}

impl Schema {
    /// Every migration of this binary (1 through 18).
    pub fn current() -> Schema {
        Schema {
            migrations: MIGRATOR.migrations.clone(),
        }
    }

    /// The migrations with version `<= version`: the schema of an older
    /// binary. `Schema::through(16)` is the binary before exact instants;
    /// tests build version-16 databases with it and check that it refuses a
    /// migrated database.
    ///
    /// # Errors
    /// [`StorageError::Failure`] if this binary has no migration `version`.
    pub fn through(version: i64) -> Result<Schema, StorageError> {
        if !MIGRATOR.migrations.iter().any(|m| m.version == version) {
            return Err(StorageError::Failure {
                message: format!("this binary has no migration version {version}"),
            });
        }
        Ok(Schema {
            migrations: MIGRATOR
                .migrations
                .iter()
                .filter(|m| m.version <= version)
                .cloned()
                .collect::<Vec<_>>()
                .into(),
        })
    }

    /// The highest version this schema knows.
    pub fn latest_version(&self) -> i64 {
        self.migrations.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// Every known migration as `(version, description)`, ascending.
    pub fn known(&self) -> Vec<PendingMigration> {
        self.migrations
            .iter()
            .map(|m| PendingMigration {
                version: m.version,
                description: m.description.to_string(),
            })
            .collect()
    }

    fn migrator(&self) -> Migrator {
        // sqlx 0.8 builds a migrator from a directory or with `migrate!`
        // only; its fields are public for the macro. Keep locking and
        // per-migration transactions on, and refuse unknown versions.
        Migrator {
            migrations: self.migrations.clone(),
            ignore_missing: false,
            locking: true,
            no_tx: false,
        }
    }

    /// Applies every pending migration to the database at `url`, on a
    /// dedicated connection that is closed afterwards whatever happened (see
    /// the module docs). Waits for sqlx's migration advisory lock and for
    /// the table locks migration 0017 takes.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] if the database cannot be reached;
    /// [`StorageError::Failure`] if the database has a version this schema
    /// does not know (the message names it), a known migration changed
    /// after it was applied, or a migration fails. A failed migration has
    /// rolled back entirely; the error carries its message (0017 names the
    /// offending rows).
    pub async fn migrate(&self, url: &str) -> Result<MigrationReport, StorageError> {
        crate::boxed(self.migrate_dedicated(url)).await
    }

    async fn migrate_dedicated(&self, url: &str) -> Result<MigrationReport, StorageError> {
        let mut conn = connect_dedicated(url).await?;
        let result = self.migrate_on(&mut conn).await;
        // Closing ends the session, which releases the advisory lock a
        // failed run leaves behind. If closing fails the socket is dropped,
        // with the same effect on the server.
        let _ = conn.close().await;
        result
    }

    async fn migrate_on(&self, conn: &mut PgConnection) -> Result<MigrationReport, StorageError> {
        let before = persistence::applied_migrations(conn)
            .await
            .map_err(map_sqlx_error)?;
        self.refuse_unknown(&before)?;
        let migrator = self.migrator();
        // `run_direct` is `run` without the generic `Acquire` parameter,
        // whose future rustc cannot prove `Send`.
        migrator
            .run_direct(&mut *conn)
            .await
            .map_err(|e| self.map_migrate_error(e))?;
        let after = persistence::applied_migrations(conn)
            .await
            .map_err(map_sqlx_error)?;
        let applied = after
            .iter()
            .map(|r| r.version)
            .filter(|v| !before.iter().any(|b| b.version == *v))
            .collect();
        Ok(MigrationReport {
            from_version: before.iter().map(|r| r.version).max(),
            to_version: after.iter().map(|r| r.version).max(),
            applied,
        })
    }

    /// The migrations the database at `url` has not applied yet, ascending
    /// (for `migrate --dry-run`). Changes nothing.
    ///
    /// # Errors
    /// As [`Schema::migrate`] for unreachable databases and unknown versions.
    pub async fn pending(&self, url: &str) -> Result<Vec<PendingMigration>, StorageError> {
        crate::boxed(self.pending_dedicated(url)).await
    }

    async fn pending_dedicated(&self, url: &str) -> Result<Vec<PendingMigration>, StorageError> {
        let mut conn = connect_dedicated(url).await?;
        let result = persistence::applied_migrations(&mut conn)
            .await
            .map_err(map_sqlx_error);
        let _ = conn.close().await;
        let applied = result?;
        self.refuse_unknown(&applied)?;
        Ok(self
            .migrations
            .iter()
            .filter(|m| !applied.iter().any(|a| a.version == m.version))
            .map(|m| PendingMigration {
                version: m.version,
                description: m.description.to_string(),
            })
            .collect())
    }

    /// The startup fence: the database must have applied exactly this
    /// schema's migrations, successfully and unchanged.
    ///
    /// # Errors
    /// [`StorageError::Failure`] naming the first unknown version ("a newer
    /// binary migrated this database"), a failed or modified migration, or
    /// the pending versions ("run the migrations first");
    /// [`StorageError::Unavailable`] if the database cannot be reached.
    pub async fn check(&self, pool: &PgPool) -> Result<(), StorageError> {
        crate::boxed(self.check_pool(pool)).await
    }

    async fn check_pool(&self, pool: &PgPool) -> Result<(), StorageError> {
        let mut conn = pool.acquire().await.map_err(map_sqlx_error)?;
        let applied = persistence::applied_migrations(&mut conn)
            .await
            .map_err(map_sqlx_error)?;
        drop(conn);
        self.refuse_unknown(&applied)?;
        let pending: Vec<String> = self
            .migrations
            .iter()
            .filter(|m| !applied.iter().any(|a| a.version == m.version))
            .map(|m| m.version.to_string())
            .collect();
        if !pending.is_empty() {
            let at = applied.iter().map(|a| a.version).max().unwrap_or(0);
            return Err(StorageError::Failure {
                message: format!(
                    "database schema is at version {at} but this binary requires version {}; \
                     pending migrations: {}; run the migrations first",
                    self.latest_version(),
                    pending.join(", ")
                ),
            });
        }
        Ok(())
    }

    /// Refuses unknown, failed and modified migrations.
    fn refuse_unknown(&self, applied: &[AppliedRow]) -> Result<(), StorageError> {
        for row in applied {
            let Some(known) = self.migrations.iter().find(|m| m.version == row.version) else {
                return Err(unknown_version(
                    row.version,
                    &row.description,
                    self.latest_version(),
                ));
            };
            if !row.success {
                return Err(StorageError::Failure {
                    message: format!(
                        "migration version {} ({}) is recorded as failed; repair the database \
                         before starting",
                        row.version, row.description
                    ),
                });
            }
            if row.checksum.as_slice() != &*known.checksum {
                return Err(StorageError::Failure {
                    message: format!(
                        "migration version {} ({}) differs from the one this binary carries \
                         (checksum mismatch); refusing to start",
                        row.version, row.description
                    ),
                });
            }
        }
        Ok(())
    }

    fn map_migrate_error(&self, e: sqlx::migrate::MigrateError) -> StorageError {
        use sqlx::migrate::MigrateError;
        match e {
            MigrateError::VersionMissing(v) => unknown_version(v, "unknown", self.latest_version()),
            MigrateError::Execute(db) => map_sqlx_error(db),
            MigrateError::ExecuteMigration(db, version) => match map_sqlx_error(db) {
                StorageError::Failure { message } => StorageError::Failure {
                    message: format!("migration {version} failed and was rolled back: {message}"),
                },
                other => other,
            },
            other => StorageError::Failure {
                message: format!("migration failed: {other}"),
            },
        }
    }
}

fn unknown_version(version: i64, description: &str, latest: i64) -> StorageError {
    StorageError::Failure {
        message: format!(
            "database has applied migration version {version} ({description}), which this \
             binary does not know (it knows versions 1 through {latest}); refusing to start \
             against a newer schema: run a binary that carries version {version}"
        ),
    }
}

/// Opens the dedicated migration connection.
async fn connect_dedicated(url: &str) -> Result<PgConnection, StorageError> {
    let options = PgConnectOptions::from_str(url)
        .map_err(|_| StorageError::Failure {
            message: "invalid database url".into(),
        })?
        .application_name(MIGRATE_APPLICATION_NAME);
    options.connect().await.map_err(map_sqlx_error)
}

/// Applies every pending migration of this binary to the database at `url`:
/// [`Schema::current`]`.`[`migrate`](Schema::migrate)`(url)`.
///
/// # Errors
/// As [`Schema::migrate`].
pub async fn migrate(url: &str) -> Result<MigrationReport, StorageError> {
    Schema::current().migrate(url).await
}

/// The migrations of this binary that the database at `url` has not
/// applied: [`Schema::current`]`.`[`pending`](Schema::pending)`(url)`.
///
/// # Errors
/// As [`Schema::pending`].
pub async fn pending_migrations(url: &str) -> Result<Vec<PendingMigration>, StorageError> {
    Schema::current().pending(url).await
}

/// The highest successfully applied migration version, `None` for a
/// database never migrated.
///
/// # Errors
/// [`StorageError::Unavailable`] or [`StorageError::Failure`] on database
/// failures.
pub async fn schema_version(pool: &PgPool) -> Result<Option<i64>, StorageError> {
    crate::boxed(schema_version_on(pool)).await
}

async fn schema_version_on(pool: &PgPool) -> Result<Option<i64>, StorageError> {
    let mut conn = pool.acquire().await.map_err(map_sqlx_error)?;
    let applied = persistence::applied_migrations(&mut conn)
        .await
        .map_err(map_sqlx_error)?;
    Ok(applied
        .iter()
        .filter(|r| r.success)
        .map(|r| r.version)
        .max())
}
