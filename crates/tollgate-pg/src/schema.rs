//! The embedded migrations, one line per subsystem, and the startup fences.
//!
//! # Design
//!
//! The database schema is built by [`pgkit::MigrationLine`]s, each with its
//! own embedded migrations, bookkeeping table and version fence, applied
//! in a fixed order by one entry point ([`migrate`]) under one advisory
//! lock, each migration in one transaction with its bookkeeping row (see
//! [`pgkit::migrate`]). This binary's lines, in order:
//!
//! 1. **Tollgate's** ([`tollgate_line`]): `migrations/0001_*.sql` ..
//!    `0021_*.sql`, bookkeeping in `_sqlx_migrations`, where sqlx's own
//!    migrator recorded them before the lines existed; its rows and
//!    checksums are sqlx's, so databases migrated by older binaries carry
//!    on unchanged. Versions 1 to 16 are the schema as it stood before exact
//!    instants (lease expiry as `expires_at_us`, microseconds truncated
//!    toward zero); version 17 is the exact-instant migration (see
//!    `migrations/0017_exact_instants.sql` and `docs/upgrade-0017.md`);
//!    version 18 created safe time; version 19 guards lease writes (the
//!    recorded grant policy and the sealed horizon, see
//!    `migrations/0019_lease_write_guard.sql`); version 20 refuses a seal
//!    whose horizon does not cover every active lease
//!    (`migrations/0020_seal_covers_active_leases.sql`); version 21 dates
//!    each publish of the cut by the observation the cut came from
//!    (`migrations/0021_publish_at_observation.sql`).
//! 2. **Safe time's** ([`safe_time_line`]): `migrations-safetime/`,
//!    bookkeeping in `_safetime_migrations`. See [`safe_time_line`].
//!
//! A Tollgate-line [`Schema::through`] a version is exactly an older binary:
//! those migrations of Tollgate's line and no other line.
//!
//! **Dedicated connection.** A run that fails mid-way must not leave the
//! migration advisory lock (a session lock) held on a pooled connection,
//! where the next run, on another connection, would wait for it forever.
//! [`Schema::migrate`] therefore opens its own connection (application name
//! [`MIGRATE_APPLICATION_NAME`]) and always closes it, success or not.
//!
//! **Fences.** A database where any line has applied a version this binary
//! does not know belongs to a newer binary: [`Schema::check`] (run by every
//! [`crate::PostgresStore`] at startup), [`Schema::migrate`] and
//! [`Schema::pending`] refuse it, naming the version (and, for a line other
//! than Tollgate's, the line). After migration 0017 this stops an old
//! process from starting, while the column rename stops the old statements
//! of a process that is already running. A database with pending
//! migrations in any line is refused by the store too: it must be migrated
//! first.

use pgkit::DatabaseUrl;
use pgkit::migrate::{self as lines, LineReport, LineStatus, MigrationError, MigrationLine};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use tollgate::StorageError;

pub use pgkit::PendingMigration;

use crate::error::map_sqlx_error;

/// Tollgate's migrations.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Safe time's migrations (none yet; see [`safe_time_line`]).
static SAFE_TIME_MIGRATOR: Migrator = sqlx::migrate!("./migrations-safetime");

/// The name of Tollgate's migration line.
pub const TOLLGATE_LINE: &str = "tollgate";

/// The bookkeeping table of Tollgate's line: sqlx's, which older binaries
/// wrote.
pub const TOLLGATE_MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// The name of safe time's migration line.
pub const SAFE_TIME_LINE: &str = "safetime";

/// The bookkeeping table of safe time's line.
pub const SAFE_TIME_MIGRATIONS_TABLE: &str = "_safetime_migrations";

/// The version of migration 0017, the exact-instant migration.
pub const EXACT_INSTANTS_VERSION: i64 = 17;

/// The version of migration 0018, safe time (the persisted cut, its epoch,
/// the sealed horizon policy and the sampler's functions).
pub const SAFE_TIME_VERSION: i64 = 18;

/// The version of migration 0019, the lease-write guard: the database
/// refuses lease writes from a session that does not declare the recorded
/// grant policy, and active leases whose expiry plus grace lies beyond
/// the safe expiry cut plus the sealed horizon.
pub const LEASE_WRITE_GUARD_VERSION: i64 = 19;

/// The version of migration 0020, the seal guard: the database refuses to
/// seal a horizon shorter than an active lease still needs (its expiry
/// plus grace beyond the cut, or the database time before the first
/// claim, plus the new horizon).
pub const SEAL_GUARD_VERSION: i64 = 20;

/// The version of migration 0021: a publish of the cut is dated by the
/// database time of the observation the cut came from, and the cut is
/// capped at it, so a sampler paused between the two counts the pause in
/// every reader's staleness bound. The current version of Tollgate's line.
pub const PUBLISH_AT_OBSERVATION_VERSION: i64 = 21;

/// The `application_name` of the migration connection, so operators can see
/// it in `pg_stat_activity` (for example while it waits for table locks).
pub const MIGRATE_APPLICATION_NAME: &str = "tollgate-migrate";

/// Tollgate's line: the allocator's tables, migrations 1 through 21 in
/// `_sqlx_migrations` (see the module docs).
///
/// Migration 0018's opening comment was reworded after databases had
/// applied it (no statement changed), so the checksum they recorded,
/// [`SAFE_TIME_PREVIOUS_CHECKSUM`], is accepted beside the file's.
pub fn tollgate_line() -> MigrationLine {
    MigrationLine::new(
        TOLLGATE_LINE,
        TOLLGATE_MIGRATIONS_TABLE,
        MIGRATOR.migrations.clone(),
    )
    .with_reworded(SAFE_TIME_VERSION, SAFE_TIME_PREVIOUS_CHECKSUM)
}

/// The SHA-384 that databases migrated before migration 0018's opening
/// comment was reworded have recorded for it.
pub const SAFE_TIME_PREVIOUS_CHECKSUM: &str = "4ce3fa67a5e1aba4c35fefbdca593677436a762f83031715ee2817e91fe64e20f78392b0644b72e0d4c536a42a62fa31";

/// Safe time's line, applied after Tollgate's, in `_safetime_migrations`.
///
/// The safe-time schema in use today (the cut row, its epoch, the sealed
/// horizon policy and the sampler's functions) was created by migration
/// 0018 of *Tollgate's* line, before the lines existed, and stays there
/// (applied migrations are never moved or rewritten). This line holds the
/// safe-time migrations after it: they may rely on everything Tollgate's
/// line created, and their versions start again at 1. It has none yet
/// (a change to one of 0018's functions, such as 0021's dated publish,
/// replaces it in Tollgate's line beside the migration that created it);
/// its bookkeeping table is created empty by the first [`migrate`].
pub fn safe_time_line() -> MigrationLine {
    MigrationLine::new(
        SAFE_TIME_LINE,
        SAFE_TIME_MIGRATIONS_TABLE,
        SAFE_TIME_MIGRATOR.migrations.clone(),
    )
}

/// What a [`Schema::migrate`] run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The highest applied version of Tollgate's line before the run
    /// (`None`: never migrated).
    pub from_version: Option<i64>,
    /// The highest applied version of Tollgate's line after the run.
    pub to_version: Option<i64>,
    /// The versions of Tollgate's line this run applied, ascending.
    pub applied: Vec<i64>,
    /// What the run did to every line, Tollgate's first, in the order
    /// applied.
    pub lines: Vec<LineReport>,
}

/// The migration lines a binary knows: all of this one's
/// ([`Schema::current`]), or a prefix of Tollgate's line alone
/// ([`Schema::through`]), which behaves exactly like an older binary that
/// knew only those versions. Tollgate's line is always the first.
#[derive(Debug, Clone)]
pub struct Schema {
    lines: Vec<MigrationLine>,
}

impl Schema {
    /// Every line of this binary: Tollgate's (1 through 21), then safe
    /// time's.
    pub fn current() -> Schema {
        Schema {
            lines: vec![tollgate_line(), safe_time_line()],
        }
    }

    /// Tollgate's migrations with version `<= version` and no other line:
    /// the schema of an older binary. `Schema::through(16)` is the binary
    /// before exact instants, `Schema::through(18)` the binary before the
    /// lines and the lease-write guard; tests build old databases with them and check that they
    /// refuse a migrated one.
    ///
    /// # Errors
    /// [`StorageError::Failure`] if this binary has no migration `version`.
    pub fn through(version: i64) -> Result<Schema, StorageError> {
        let line = tollgate_line()
            .through(version)
            .ok_or_else(|| StorageError::Failure {
                message: format!("this binary has no migration version {version}"),
            })?;
        Ok(Schema { lines: vec![line] })
    }

    /// This schema with `line` applied after its lines (for a subsystem's
    /// new line, and for tests of the mechanism).
    pub fn with_line(mut self, line: MigrationLine) -> Schema {
        self.lines.push(line);
        self
    }

    /// The lines, in the order they are applied.
    pub fn lines(&self) -> &[MigrationLine] {
        &self.lines
    }

    /// The highest version of Tollgate's line this schema knows.
    pub fn latest_version(&self) -> i64 {
        self.lines[0].latest_version().unwrap_or(0)
    }

    /// Every known migration of Tollgate's line as `(version,
    /// description)`, ascending.
    pub fn known(&self) -> Vec<PendingMigration> {
        self.lines[0].known()
    }

    /// Applies every pending migration of every line, in order, to the
    /// database at `url`, on a dedicated connection that is closed
    /// afterwards whatever happened (see the module docs). Waits for the
    /// migration advisory lock and for the table locks migration 0017
    /// takes.
    ///
    /// # Errors
    /// [`StorageError::Failure`] for an unparsable URL ("invalid database
    /// url", not repeating it); [`StorageError::Unavailable`] if the
    /// database cannot be reached; [`StorageError::Failure`] if any line of
    /// the database has a version this schema does not know (the message
    /// names it, and the line unless it is Tollgate's: nothing is applied
    /// then), a known migration changed after it was applied, or a
    /// migration fails. A failed migration has rolled back entirely; the
    /// error carries its message (0017 names the offending rows).
    pub async fn migrate(&self, url: &str) -> Result<MigrationReport, StorageError> {
        crate::boxed(self.migrate_dedicated(url)).await
    }

    async fn migrate_dedicated(&self, url: &str) -> Result<MigrationReport, StorageError> {
        let url = parse_url(url)?;
        let reports = lines::migrate_url(&url, MIGRATE_APPLICATION_NAME, &self.lines)
            .await
            .map_err(|e| self.storage_error(e))?;
        let tollgate = reports
            .first()
            .cloned()
            .ok_or_else(|| StorageError::Failure {
                message: "migration reported no line".into(),
            })?;
        Ok(MigrationReport {
            from_version: tollgate.from_version,
            to_version: tollgate.to_version,
            applied: tollgate.applied,
            lines: reports,
        })
    }

    /// The migrations of Tollgate's line that the database at `url` has
    /// not applied yet, ascending (for `migrate --dry-run`). Changes
    /// nothing. Every line's fence is checked; [`Schema::pending_lines`]
    /// lists every line's pending migrations.
    ///
    /// # Errors
    /// As [`Schema::migrate`] for unparsable URLs, unreachable databases and
    /// unknown versions.
    pub async fn pending(&self, url: &str) -> Result<Vec<PendingMigration>, StorageError> {
        let mut statuses = self.pending_lines(url).await?;
        Ok(std::mem::take(&mut statuses[0].pending))
    }

    /// Where every line of the database at `url` stands, in order
    /// (Tollgate's first): its highest applied version and its pending
    /// migrations. Changes nothing.
    ///
    /// # Errors
    /// As [`Schema::pending`].
    pub async fn pending_lines(&self, url: &str) -> Result<Vec<LineStatus>, StorageError> {
        crate::boxed(self.pending_dedicated(url)).await
    }

    async fn pending_dedicated(&self, url: &str) -> Result<Vec<LineStatus>, StorageError> {
        let url = parse_url(url)?;
        let statuses = lines::status_url(&url, MIGRATE_APPLICATION_NAME, &self.lines)
            .await
            .map_err(|e| self.storage_error(e))?;
        if statuses.len() != self.lines.len() {
            return Err(StorageError::Failure {
                message: "migration status reported another number of lines".into(),
            });
        }
        Ok(statuses)
    }

    /// The startup fence: the database must have applied exactly this
    /// schema's migrations in every line, successfully and unchanged.
    ///
    /// # Errors
    /// [`StorageError::Failure`] naming the first unknown version ("a newer
    /// binary migrated this database"), a failed or modified migration, or
    /// the pending versions ("run the migrations first"), and the line
    /// unless it is Tollgate's; [`StorageError::Unavailable`] if the
    /// database cannot be reached.
    pub async fn check(&self, pool: &PgPool) -> Result<(), StorageError> {
        crate::boxed(self.check_pool(pool)).await
    }

    async fn check_pool(&self, pool: &PgPool) -> Result<(), StorageError> {
        let mut conn = pool.acquire().await.map_err(map_sqlx_error)?;
        lines::check(&mut conn, &self.lines)
            .await
            .map_err(|e| self.storage_error(e))
    }

    /// `"<line> migrations (table <table>): "` before a message about a line
    /// other than Tollgate's; nothing for Tollgate's, whose messages are
    /// those of the binaries before the lines.
    fn prefix(&self, line: &str) -> String {
        match self.lines.iter().find(|l| l.name() == line) {
            Some(l) if l.table() == TOLLGATE_MIGRATIONS_TABLE => String::new(),
            Some(l) => format!("{line} migrations (table {}): ", l.table()),
            None => format!("{line} migrations: "),
        }
    }

    fn storage_error(&self, e: MigrationError) -> StorageError {
        let backend = |line: &str, text: String| StorageError::Failure {
            message: format!("{}{text}", self.prefix(line)),
        };
        match e {
            MigrationError::UnknownVersion {
                line,
                version,
                description,
                known,
            } => backend(line, unknown_version(version, &description, known)),
            MigrationError::RecordedFailed {
                line,
                version,
                description,
            } => backend(
                line,
                format!(
                    "migration version {version} ({description}) is recorded as failed; \
                     repair the database before starting"
                ),
            ),
            MigrationError::Modified {
                line,
                version,
                description,
            } => backend(
                line,
                format!(
                    "migration version {version} ({description}) differs from the one this \
                     binary carries (checksum mismatch); refusing to start"
                ),
            ),
            MigrationError::Pending {
                line,
                at,
                latest,
                pending,
            } => backend(
                line,
                format!(
                    "database schema is at version {at} but this binary requires version \
                     {latest}; pending migrations: {}; run the migrations first",
                    pending
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            MigrationError::Apply {
                line,
                version,
                source,
            } => match map_sqlx_error(source) {
                StorageError::Failure { message } => backend(
                    line,
                    format!("migration {version} failed and was rolled back: {message}"),
                ),
                other => other,
            },
            MigrationError::Database(e) => map_sqlx_error(e),
            e @ (MigrationError::InvalidLine { .. } | MigrationError::TooManyRows { .. }) => {
                StorageError::Failure {
                    message: e.to_string(),
                }
            }
        }
    }
}

fn unknown_version(version: i64, description: &str, known: Option<(i64, i64)>) -> String {
    let knows = match known {
        Some((first, last)) => format!("it knows versions {first} through {last}"),
        None => "it knows none".to_owned(),
    };
    format!(
        "database has applied migration version {version} ({description}), which this binary \
         does not know ({knows}); refusing to start against a newer schema: run a binary that \
         carries version {version}"
    )
}

/// Parses a database URL for the store or a migration connection; the
/// error never repeats it.
pub(crate) fn parse_url(url: &str) -> Result<DatabaseUrl, StorageError> {
    DatabaseUrl::parse(url).map_err(|_| StorageError::Failure {
        message: "invalid database url".into(),
    })
}

/// Applies every pending migration of this binary to the database at `url`:
/// [`Schema::current`]`.`[`migrate`](Schema::migrate)`(url)`.
///
/// # Errors
/// As [`Schema::migrate`].
pub async fn migrate(url: &str) -> Result<MigrationReport, StorageError> {
    Schema::current().migrate(url).await
}

/// The migrations of Tollgate's line that the database at `url` has not
/// applied: [`Schema::current`]`.`[`pending`](Schema::pending)`(url)`.
///
/// # Errors
/// As [`Schema::pending`].
pub async fn pending_migrations(url: &str) -> Result<Vec<PendingMigration>, StorageError> {
    Schema::current().pending(url).await
}

/// The highest successfully applied migration version of Tollgate's line,
/// `None` for a database never migrated.
///
/// # Errors
/// [`StorageError::Unavailable`] or [`StorageError::Failure`] on database
/// failures.
pub async fn schema_version(pool: &PgPool) -> Result<Option<i64>, StorageError> {
    crate::boxed(schema_version_on(pool)).await
}

async fn schema_version_on(pool: &PgPool) -> Result<Option<i64>, StorageError> {
    let mut conn = pool.acquire().await.map_err(map_sqlx_error)?;
    let schema = Schema::current();
    let applied = lines::applied(&mut conn, &schema.lines[0])
        .await
        .map_err(|e| schema.storage_error(e))?;
    Ok(applied
        .iter()
        .filter(|r| r.success)
        .map(|r| r.version)
        .max())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The SHA-384 checksums databases have recorded for Tollgate's
    /// migrations: a changed byte in a file would make every migrated
    /// database refuse this binary.
    #[test]
    fn tollgate_migrations_are_byte_for_byte_those_databases_applied() {
        let line = tollgate_line();
        let got: Vec<(i64, String, String)> = line
            .migrations()
            .iter()
            .map(|m| (m.version, m.description.to_string(), hex(&m.checksum)))
            .collect();
        let expected: Vec<(i64, &str, &str)> = EXPECTED_CHECKSUMS.to_vec();
        assert_eq!(
            got.iter()
                .map(|(v, d, c)| (*v, d.as_str(), c.as_str()))
                .collect::<Vec<_>>(),
            expected
        );
    }

    const EXPECTED_CHECKSUMS: [(i64, &str, &str); 21] = [
        (
            1,
            "accounts",
            "71ceae16e4a4cbb78455ed14cb62982122fa25e98e01b46aaf7258628afe328e7224b02bcf90a6955b985ac91efac6ec",
        ),
        (
            2,
            "leases",
            "a721351ac7754eaf54a234b7e87231c696f05a6b5b4dab7a654bdc2fb45b31818da2c016aed08269eb19b83f04a0a339",
        ),
        (
            3,
            "leases active expiry index",
            "98dba5597b601a3d1b310a0250fd4c4f20a805a7090f8a90a6fb521942bcd1ecef08ca7b33b9d111558f0536cd6f6a3f",
        ),
        (
            4,
            "ledger",
            "3af3c74d20187e6c13de8b460ccbc8d6066efac17e113baf46c3fb1c659ee131d1f22b368c88de26b47ef74a8b78f744",
        ),
        (
            5,
            "store identity",
            "57db8e14123b0e6c4ab3282355b31d4caba11c1f22ac1aff5a8cb28c01e8efe737a315a47ca7467b511cb8ca93b87668",
        ),
        (
            6,
            "fence sequence",
            "2888435b7541246fe7b99aff41a5714d72ca819a39420c7ec9916404ba8a45cbef46321dd26efbd8f28dadd703c6f673",
        ),
        (
            7,
            "idempotency",
            "64789061d634c2f1106f10f4e10824a7677da1f10f64e44374005674b3783ee4b6dd1b0ae8e5e141ac60d62450afda7e",
        ),
        (
            8,
            "account keys",
            "27bf659f2248227cfef9e29e6e9a26f7a70552a567709188a4d2f6556c567f7756c142bd766131fb4e2b012f2c74aca9",
        ),
        (
            9,
            "lease consumed",
            "8fc7b699b13ef0bbd53c419b8f3133ba2f1de7f486a2f521d82838b0847204dbe9f3f784e222e440d3a6232c33577f97",
        ),
        (
            10,
            "account balance checks",
            "85a20ff206642a3b8a69247bdbeeb61f877fbae846a316007c906a580856506f0b0074cd681cfc2756d6e1a47ffc0890",
        ),
        (
            11,
            "ledger fence expiry",
            "beb3a43c02a7d423f96feae6eefa7acc1f41e788b1961efea7d1e038b3cc7fdcc6f9718b4282685bdaa03e12273b0ae1",
        ),
        (
            12,
            "idempotency grant snapshot",
            "aea85595046c8a6c03f4d1dfbf0d454185208c67907108485ca714b9d1157e9c446dde075380b11d536c8a4aa4fa0262",
        ),
        (
            13,
            "ledger actor",
            "06e3640b9eff29f621fdd4afcd722b55131d85c999737f54cd06d46db28b4c19207e56536c922a2e6b48d98511becb30",
        ),
        (
            14,
            "lease settlement checks",
            "cd9d6092544a54b63b4db0fedd6c8e4759f39d20242f8dda37753d085eb149bbf1c59143cfdfbf0c98f39f3f9e608460",
        ),
        (
            15,
            "leases account index",
            "5aaf137f1f4d587c47a06bb7d71ee997d7e61b119bfa93e140d2c13b16baf5dcfaa82e1d78a8ba85cf9d84da264bed89",
        ),
        (
            16,
            "policy record",
            "f6fbdf215aa36b155fc894fe67bddcb8b872d1c220b5692b0a881122d4c95ac1d462a3a89c9aec7f14fdf4e7cd59b560",
        ),
        (
            17,
            "exact instants",
            "14a65065864a1ca3dd4ef65a7891136cb39de118a7718c243a7fc075417cc18605f7c835b9565521934bbe53a3c8f11e",
        ),
        (
            18,
            "safe time",
            "2df485c0ea367e0aa835f15355430d783409ef4aa2adb034d2d835a992ea1ef275a8f7c0c5738fa6d0fe31a16ea0306d",
        ),
        (
            19,
            "lease write guard",
            "365ed69f9cff74bb602f919da5076d13ec3102d880f20930706fe689f27e08fb344418130e5945bceadff2604e8f4d77",
        ),
        (
            20,
            "seal covers active leases",
            "6a1509f38696b53adaeec6f16e6248ed04d851ee55033dc10d75d8cae084887c544e0b9d1629c736e4eb63d65a5352cb",
        ),
        (
            21,
            "publish at observation",
            "2f9329a8d73b42aa0b23eb6874b92f444edf2e669a78028b280cf7fc9bf85f2b5efc82ece6bca0aeae5c727fd01b84fc",
        ),
    ];

    #[test]
    fn this_binarys_lines() {
        let schema = Schema::current();
        pgkit::migrate::validate_lines(schema.lines()).unwrap();
        let names: Vec<(&str, &str)> = schema
            .lines()
            .iter()
            .map(|l| (l.name(), l.table()))
            .collect();
        assert_eq!(
            names,
            [
                ("tollgate", "_sqlx_migrations"),
                ("safetime", "_safetime_migrations")
            ]
        );
        assert_eq!(schema.latest_version(), PUBLISH_AT_OBSERVATION_VERSION);
        assert_eq!(tollgate_line().versions(), Some((1, 21)));
        let old = Schema::through(EXACT_INSTANTS_VERSION).unwrap();
        assert_eq!(
            old.lines().iter().map(|l| l.name()).collect::<Vec<_>>(),
            ["tollgate"]
        );
        assert_eq!(old.latest_version(), 17);
    }

    /// `tollgate migrate` and `--dry-run` list Tollgate's line only
    /// ([`MigrationReport::applied`], [`Schema::pending`]); the safe-time
    /// line's first migration must come with a listing of every line's
    /// migrations there (from [`MigrationReport::lines`] and
    /// [`Schema::pending_lines`]), or it would be applied unlisted.
    #[test]
    fn the_safe_time_line_is_empty_until_the_cli_lists_every_line() {
        assert_eq!(safe_time_line().migrations().len(), 0);
    }

    #[test]
    fn refusals_name_the_line_unless_it_is_tollgate_s() {
        let schema = Schema::current();
        let check = |e: MigrationError, message: &str| {
            assert_eq!(
                schema.storage_error(e),
                StorageError::Failure {
                    message: message.into()
                }
            );
        };
        check(
            MigrationError::UnknownVersion {
                line: "tollgate",
                version: 19,
                description: "future".into(),
                known: Some((1, 18)),
            },
            "database has applied migration version 19 (future), which this binary does not \
             know (it knows versions 1 through 18); refusing to start against a newer schema: \
             run a binary that carries version 19",
        );
        check(
            MigrationError::UnknownVersion {
                line: "safetime",
                version: 1,
                description: "cut history".into(),
                known: None,
            },
            "safetime migrations (table _safetime_migrations): database has applied migration \
             version 1 (cut history), which this binary does not know (it knows none); \
             refusing to start against a newer schema: run a binary that carries version 1",
        );
        check(
            MigrationError::Pending {
                line: "tollgate",
                at: 16,
                latest: 18,
                pending: vec![17, 18],
            },
            "database schema is at version 16 but this binary requires version 18; pending \
             migrations: 17, 18; run the migrations first",
        );
        check(
            MigrationError::Pending {
                line: "safetime",
                at: 0,
                latest: 2,
                pending: vec![1, 2],
            },
            "safetime migrations (table _safetime_migrations): database schema is at version 0 \
             but this binary requires version 2; pending migrations: 1, 2; run the migrations \
             first",
        );
        check(
            MigrationError::RecordedFailed {
                line: "tollgate",
                version: 3,
                description: "ledger".into(),
            },
            "migration version 3 (ledger) is recorded as failed; repair the database before \
             starting",
        );
        check(
            MigrationError::Modified {
                line: "safetime",
                version: 1,
                description: "x".into(),
            },
            "safetime migrations (table _safetime_migrations): migration version 1 (x) differs \
             from the one this binary carries (checksum mismatch); refusing to start",
        );
        check(
            MigrationError::InvalidLine {
                line: "x",
                reason: "bad".into(),
            },
            "migration line x is invalid: bad",
        );
        assert_eq!(
            schema.storage_error(MigrationError::Database(sqlx::Error::PoolTimedOut)),
            StorageError::Unavailable {
                message: "pool timed out while waiting for an open connection".into()
            }
        );
        assert_eq!(
            schema.storage_error(MigrationError::Apply {
                line: "tollgate",
                version: 17,
                source: sqlx::Error::PoolClosed,
            }),
            StorageError::Unavailable {
                message: "attempted to acquire a connection on a closed pool".into()
            }
        );
        assert_eq!(
            schema.storage_error(MigrationError::Apply {
                line: "tollgate",
                version: 17,
                source: sqlx::Error::RowNotFound,
            }),
            StorageError::Failure {
                message: "migration 17 failed and was rolled back: no rows returned by a query \
                          that expected to return at least one row"
                    .into()
            }
        );
    }

    #[test]
    fn an_unparsable_url_is_not_repeated() {
        for url in [
            "nope",
            "mysql://u:s3cret@h/db",
            "postgres://u:s3cret@h/db?port=x",
        ] {
            assert_eq!(
                parse_url(url).unwrap_err(),
                StorageError::Failure {
                    message: "invalid database url".into()
                },
                "{url}"
            );
        }
    }
}
