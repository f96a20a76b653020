//! Migration lines: one per subsystem, applied in a fixed order by one
//! entry point.
//!
//! # Design
//!
//! A [`MigrationLine`] is a subsystem's own sequence of embedded migrations
//! (usually from `sqlx::migrate!`, which checksums each file with SHA-384),
//! its own bookkeeping table, and so its own version fence. A binary knows
//! an ordered list of lines; [`migrate`] applies them in that order, so a
//! later line's migrations may use what the earlier lines created.
//!
//! **Bookkeeping.** Each line's table has exactly the columns of sqlx's
//! `_sqlx_migrations` (`version`, `description`, `installed_on`, `success`,
//! `checksum`, `execution_time`), and its rows are written as sqlx writes
//! them: a line whose table is `_sqlx_migrations` reads and continues a
//! database that sqlx's own migrator built, and sqlx's migrator accepts a
//! database this module built. sqlx 0.8 fixes that table's name, which is
//! why the runner is written here rather than borrowed.
//!
//! **Guarantees**, the same as sqlx's migrator gives:
//!
//! * *One runner at a time.* [`migrate`] holds a session advisory lock for
//!   its whole run, the very key sqlx's migrator uses
//!   ([`migration_lock_key`]), so it also excludes an older binary's
//!   migrator running at the same time.
//! * *Each migration in one transaction with its bookkeeping row*: the
//!   migration's SQL and the `INSERT` of its row commit together or not at
//!   all, so a migration is never recorded without having run, nor run
//!   twice. Only the `execution_time` is written after the commit (as sqlx
//!   does: `-1` until then).
//! * *Append-only and checksummed*: an applied migration is never run
//!   again, never reverted and never rewritten; a line refuses a database
//!   whose row for a known version has another checksum ([`fence`]).
//! * *Version fence*: a line refuses a database that has applied a version
//!   it does not know (a newer binary's), a migration recorded as failed,
//!   or (for [`check`], a store's startup) one it carries but the database
//!   has not applied yet.
//!
//! Before applying anything, [`migrate`] checks the fences of every line,
//! so a database refused by any line is left unchanged.
//!
//! **Dedicated connection.** The advisory lock is a session lock: a run
//! that fails mid-way (a migration's error, a lost connection) must not
//! leave it held on a pooled connection, where the next run, on another
//! connection, would wait for it forever. Run [`migrate`] on a connection
//! of its own and close it afterwards whatever happened; [`migrate_url`]
//! does exactly that.

use std::borrow::Cow;
use std::time::Instant;

use sqlx::migrate::{Migration, MigrationType};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection};

use crate::url::DatabaseUrl;

/// The most bookkeeping rows one line's table may hold. A line is one
/// subsystem's history of schema changes, a few dozen rows in a decade;
/// a table with more rows is not a bookkeeping table this code wrote.
pub const APPLIED_ROWS_MAX: usize = 10_000;

/// The longest table name PostgreSQL keeps (`NAMEDATALEN - 1` bytes).
pub const TABLE_NAME_MAX: usize = 63;

/// `bytes` as lower-case hex.
fn lower_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// One subsystem's migrations and their bookkeeping table. See the module
/// docs.
#[derive(Debug, Clone)]
pub struct MigrationLine {
    name: &'static str,
    table: &'static str,
    migrations: Cow<'static, [Migration]>,
    reworded: Vec<Reworded>,
}

/// An applied migration whose file was since changed in its comments only
/// (no statement changed): the checksum databases migrated before the
/// change have recorded, accepted beside the file's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reworded {
    version: i64,
    /// SHA-384, lower-case hex (96 digits).
    previous_checksum_hex: &'static str,
}

impl MigrationLine {
    /// A line named `name` (a short lower-case word for messages,
    /// `"tollgate"`) with bookkeeping table `table` (a plain lower-case SQL
    /// identifier, resolved through the `search_path` as sqlx's
    /// `_sqlx_migrations` is) and `migrations` in ascending version order,
    /// for example `MIGRATOR.migrations.clone()` of a `static MIGRATOR:
    /// Migrator = sqlx::migrate!("./migrations")`.
    ///
    /// The shape is checked by [`validate`](Self::validate), which every
    /// entry point of this module runs first.
    pub fn new(
        name: &'static str,
        table: &'static str,
        migrations: impl Into<Cow<'static, [Migration]>>,
    ) -> MigrationLine {
        MigrationLine {
            name,
            table,
            migrations: migrations.into(),
            reworded: Vec::new(),
        }
    }

    /// The same line, also accepting `previous_checksum_hex` (SHA-384 in
    /// lower-case hex, as databases recorded it) for migration `version`,
    /// whose file has since been changed in its comments only. Nothing is
    /// re-run and no recorded row changes; a database migrated afterwards
    /// records the file's new checksum.
    ///
    /// # Panics
    /// If the line has no migration `version`, or `previous_checksum_hex`
    /// is not 96 lower-case hex digits: both are programming errors in a
    /// line's declaration.
    pub fn with_reworded(mut self, version: i64, previous_checksum_hex: &'static str) -> Self {
        assert!(
            self.knows(version),
            "{} migrations: no version {version} to accept a reworded checksum for",
            self.name
        );
        assert!(
            previous_checksum_hex.len() == 96
                && previous_checksum_hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{} migrations: version {version}'s previous checksum must be 96 lower-case hex digits",
            self.name
        );
        self.reworded.push(Reworded {
            version,
            previous_checksum_hex,
        });
        self
    }

    /// Whether `recorded` is a checksum this line accepts for `known`: the
    /// file's own, or a previous one of a reworded migration.
    fn accepts_checksum(&self, known: &Migration, recorded: &[u8]) -> bool {
        recorded == &*known.checksum
            || self.reworded.iter().any(|r| {
                r.version == known.version && r.previous_checksum_hex == lower_hex(recorded)
            })
    }

    /// The line's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The line's bookkeeping table.
    pub fn table(&self) -> &'static str {
        self.table
    }

    /// The line's migrations, ascending.
    pub fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    /// The line's lowest and highest version, `None` for a line without
    /// migrations yet.
    pub fn versions(&self) -> Option<(i64, i64)> {
        let first = self.migrations.first()?.version;
        let last = self.migrations.last()?.version;
        Some((first, last))
    }

    /// The highest version the line knows, `None` for an empty line.
    pub fn latest_version(&self) -> Option<i64> {
        self.versions().map(|(_, last)| last)
    }

    /// Whether the line carries a migration `version`.
    pub fn knows(&self, version: i64) -> bool {
        self.migrations.iter().any(|m| m.version == version)
    }

    /// The same line with only the migrations of version `<= version`: the
    /// line as an older binary knew it. `None` if the line has no migration
    /// `version`.
    pub fn through(&self, version: i64) -> Option<MigrationLine> {
        if !self.knows(version) {
            return None;
        }
        Some(MigrationLine {
            name: self.name,
            table: self.table,
            reworded: self
                .reworded
                .iter()
                .filter(|r| r.version <= version)
                .copied()
                .collect(),
            migrations: self
                .migrations
                .iter()
                .filter(|m| m.version <= version)
                .cloned()
                .collect::<Vec<_>>()
                .into(),
        })
    }

    /// Every migration as `(version, description)`, ascending.
    pub fn known(&self) -> Vec<PendingMigration> {
        self.migrations.iter().map(PendingMigration::of).collect()
    }

    /// Checks the line's shape: a non-empty name; a table name of at most
    /// [`TABLE_NAME_MAX`] bytes of `[a-z_][a-z0-9_]*`; versions positive and
    /// strictly ascending; every migration a plain (not reversible) one
    /// that runs in a transaction.
    ///
    /// # Errors
    /// [`MigrationError::InvalidLine`] naming the first violation.
    pub fn validate(&self) -> Result<(), MigrationError> {
        let invalid = |reason: String| {
            Err(MigrationError::InvalidLine {
                line: self.name,
                reason,
            })
        };
        if self.name.is_empty() {
            return invalid("the line has no name".into());
        }
        if !is_plain_identifier(self.table) {
            return invalid(format!(
                "bookkeeping table {:?} is not a plain lower-case identifier of at most \
                 {TABLE_NAME_MAX} bytes",
                self.table
            ));
        }
        let mut previous = 0;
        for m in self.migrations.iter() {
            if m.version <= previous {
                return invalid(format!(
                    "migration version {} does not follow version {previous} (versions must \
                     be positive and strictly ascending)",
                    m.version
                ));
            }
            previous = m.version;
            if m.migration_type != MigrationType::Simple {
                return invalid(format!(
                    "migration version {} is reversible; lines are append-only",
                    m.version
                ));
            }
            if m.no_tx {
                return invalid(format!(
                    "migration version {} opts out of its transaction; each migration must \
                     run in one transaction with its bookkeeping row",
                    m.version
                ));
            }
        }
        Ok(())
    }
}

fn is_plain_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    s.len() <= TABLE_NAME_MAX
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A bookkeeping row: a migration the database has applied (or recorded
/// as failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMigration {
    /// Its version.
    pub version: i64,
    /// Its description, as recorded.
    pub description: String,
    /// Whether it is recorded as applied successfully. This module never
    /// writes `false`; sqlx's migrator did for migrations outside a
    /// transaction.
    pub success: bool,
    /// The SHA-384 of its SQL as recorded (48 bytes).
    pub checksum: Vec<u8>,
}

/// A migration by version and description (from its file name: `0017_exact_instants.sql`
/// is version 17, "exact instants").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMigration {
    /// Its version.
    pub version: i64,
    /// Its description.
    pub description: String,
}

impl PendingMigration {
    fn of(m: &Migration) -> PendingMigration {
        PendingMigration {
            version: m.version,
            description: m.description.to_string(),
        }
    }
}

/// Where one line of a database stands ([`status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineStatus {
    /// The line's name.
    pub line: &'static str,
    /// The highest applied version, `None` if the line has applied none
    /// (or has no bookkeeping table yet).
    pub applied_max: Option<i64>,
    /// The line's migrations the database has not applied, ascending.
    pub pending: Vec<PendingMigration>,
}

/// What [`migrate`] did to one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineReport {
    /// The line's name.
    pub line: &'static str,
    /// The highest applied version before the run (`None`: none).
    pub from_version: Option<i64>,
    /// The highest applied version after the run.
    pub to_version: Option<i64>,
    /// The versions this run applied, ascending.
    pub applied: Vec<i64>,
}

/// Why a line refused a database, or a run failed. No variant's text
/// contains the connection URL.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The line is malformed (see [`MigrationLine::validate`]), or two
    /// lines share a name or a table: a defect of the binary, found before
    /// touching the database.
    #[error("migration line {line} is invalid: {reason}")]
    InvalidLine {
        /// The line's name.
        line: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The database has applied a version the line does not know: a newer
    /// binary migrated it.
    #[error(
        "{line} migrations: the database has applied version {version} ({description}), \
         which this binary does not know"
    )]
    UnknownVersion {
        /// The line's name.
        line: &'static str,
        /// The unknown version (the lowest one).
        version: i64,
        /// Its description, as recorded.
        description: String,
        /// The versions the line knows, first and last; `None` for an empty
        /// line.
        known: Option<(i64, i64)>,
    },
    /// A migration is recorded as failed.
    #[error("{line} migrations: version {version} ({description}) is recorded as failed")]
    RecordedFailed {
        /// The line's name.
        line: &'static str,
        /// Its version.
        version: i64,
        /// Its description, as recorded.
        description: String,
    },
    /// An applied migration's checksum differs from the one the line
    /// carries: the migration was changed after it was applied.
    #[error("{line} migrations: version {version} ({description}) differs (checksum mismatch)")]
    Modified {
        /// The line's name.
        line: &'static str,
        /// Its version.
        version: i64,
        /// Its description, as recorded.
        description: String,
    },
    /// Migrations the line carries are not applied ([`check`] only).
    #[error(
        "{line} migrations: at version {at}, this binary requires {latest}; pending: {pending:?}"
    )]
    Pending {
        /// The line's name.
        line: &'static str,
        /// The highest applied version (0: none).
        at: i64,
        /// The line's latest version.
        latest: i64,
        /// The pending versions, ascending.
        pending: Vec<i64>,
    },
    /// A migration's SQL failed; its transaction rolled back, and it is
    /// not recorded.
    #[error("{line} migrations: migration {version} failed and was rolled back")]
    Apply {
        /// The line's name.
        line: &'static str,
        /// Its version.
        version: i64,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// The bookkeeping table holds more than [`APPLIED_ROWS_MAX`] rows.
    #[error("{line} migrations: table {table} holds more than {APPLIED_ROWS_MAX} rows")]
    TooManyRows {
        /// The line's name.
        line: &'static str,
        /// Its table.
        table: &'static str,
    },
    /// Any other database error (connecting, the lock, bookkeeping).
    #[error("migration bookkeeping failed")]
    Database(#[from] sqlx::Error),
}

/// Checks `lines` as a set: each valid, names and tables distinct.
///
/// # Errors
/// [`MigrationError::InvalidLine`].
pub fn validate_lines(lines: &[MigrationLine]) -> Result<(), MigrationError> {
    for (i, line) in lines.iter().enumerate() {
        line.validate()?;
        if let Some(other) = lines[..i]
            .iter()
            .find(|o| o.name == line.name || o.table == line.table)
        {
            return Err(MigrationError::InvalidLine {
                line: line.name,
                reason: format!(
                    "it shares its name or table with line {} (table {})",
                    other.name, other.table
                ),
            });
        }
    }
    Ok(())
}

/// The fence of one line: refuses `applied` (the line's bookkeeping rows,
/// ascending) if a row has a version the line does not know, is recorded as
/// failed, or has another checksum than the line's migration, the first
/// such row deciding; otherwise returns the line's migrations not applied,
/// ascending.
///
/// # Errors
/// [`MigrationError::UnknownVersion`], [`MigrationError::RecordedFailed`],
/// [`MigrationError::Modified`].
pub fn fence(
    line: &MigrationLine,
    applied: &[AppliedMigration],
) -> Result<Vec<PendingMigration>, MigrationError> {
    for row in applied {
        let Some(known) = line.migrations.iter().find(|m| m.version == row.version) else {
            return Err(MigrationError::UnknownVersion {
                line: line.name,
                version: row.version,
                description: row.description.clone(),
                known: line.versions(),
            });
        };
        if !row.success {
            return Err(MigrationError::RecordedFailed {
                line: line.name,
                version: row.version,
                description: row.description.clone(),
            });
        }
        if !line.accepts_checksum(known, &row.checksum) {
            return Err(MigrationError::Modified {
                line: line.name,
                version: row.version,
                description: row.description.clone(),
            });
        }
    }
    Ok(line
        .migrations
        .iter()
        .filter(|m| !applied.iter().any(|a| a.version == m.version))
        .map(PendingMigration::of)
        .collect())
}

/// The bookkeeping rows of `line`, ascending; empty when its table does not
/// exist (the line never ran here).
///
/// # Errors
/// [`MigrationError::TooManyRows`]; [`MigrationError::Database`].
pub async fn applied(
    conn: &mut PgConnection,
    line: &MigrationLine,
) -> Result<Vec<AppliedMigration>, MigrationError> {
    line.validate()?;
    if !table_exists(conn, line.table).await? {
        return Ok(Vec::new());
    }
    let rows: Vec<(i64, String, bool, Vec<u8>)> = sqlx::query_as(&format!(
        "SELECT version, description, success, checksum FROM {} ORDER BY version LIMIT {}",
        line.table,
        APPLIED_ROWS_MAX + 1
    ))
    .fetch_all(&mut *conn)
    .await?;
    if rows.len() > APPLIED_ROWS_MAX {
        return Err(MigrationError::TooManyRows {
            line: line.name,
            table: line.table,
        });
    }
    Ok(rows
        .into_iter()
        .map(
            |(version, description, success, checksum)| AppliedMigration {
                version,
                description,
                success,
                checksum,
            },
        )
        .collect())
}

async fn table_exists(conn: &mut PgConnection, table: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(&mut *conn)
        .await
}

/// Where every line stands, in order, after its fence passed. Changes
/// nothing (for `migrate --dry-run`).
///
/// # Errors
/// As [`fence`] for the first line that refuses; [`validate_lines`];
/// [`MigrationError::Database`].
pub async fn status(
    conn: &mut PgConnection,
    lines: &[MigrationLine],
) -> Result<Vec<LineStatus>, MigrationError> {
    validate_lines(lines)?;
    let mut out = Vec::with_capacity(lines.len());
    for line in lines {
        let rows = applied(conn, line).await?;
        let pending = fence(line, &rows)?;
        out.push(LineStatus {
            line: line.name,
            applied_max: rows.iter().map(|r| r.version).max(),
            pending,
        });
    }
    Ok(out)
}

/// The startup fence of a store: every line's fence passes and nothing is
/// pending.
///
/// # Errors
/// As [`status`]; then [`MigrationError::Pending`] for the first line, in
/// order, with pending migrations.
pub async fn check(conn: &mut PgConnection, lines: &[MigrationLine]) -> Result<(), MigrationError> {
    let statuses = status(conn, lines).await?;
    for (line, s) in lines.iter().zip(statuses) {
        if !s.pending.is_empty() {
            return Err(MigrationError::Pending {
                line: line.name,
                at: s.applied_max.unwrap_or(0),
                latest: line.latest_version().unwrap_or(0),
                pending: s.pending.iter().map(|p| p.version).collect(),
            });
        }
    }
    Ok(())
}

/// Applies every pending migration of `lines`, line by line in the given
/// order, on `conn`, which should be a connection of its own (see the
/// module docs; [`migrate_url`] opens and closes one). Waits for the
/// migration advisory lock, and for whatever locks a migration takes.
///
/// # Errors
/// As [`status`] (nothing is applied when any line's fence refuses);
/// [`MigrationError::Apply`] if a migration fails (it rolled back; the
/// migrations before it stay applied); [`MigrationError::Database`].
pub async fn migrate(
    conn: &mut PgConnection,
    lines: &[MigrationLine],
) -> Result<Vec<LineReport>, MigrationError> {
    validate_lines(lines)?;
    let key = migration_lock_key(&current_database(conn).await?);
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await?;
    let result = migrate_locked(conn, lines).await;
    // Best effort: after a failure the connection may be gone, which
    // releases the lock too; the caller closes the connection either way.
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await;
    result
}

async fn migrate_locked(
    conn: &mut PgConnection,
    lines: &[MigrationLine],
) -> Result<Vec<LineReport>, MigrationError> {
    // Every fence first: a database any line refuses stays unchanged.
    let mut before = Vec::with_capacity(lines.len());
    for line in lines {
        let rows = applied(conn, line).await?;
        fence(line, &rows)?;
        before.push(rows);
    }
    let mut reports = Vec::with_capacity(lines.len());
    for (line, rows) in lines.iter().zip(before) {
        ensure_table(conn, line).await?;
        for m in line.migrations.iter() {
            if !rows.iter().any(|r| r.version == m.version) {
                apply(conn, line, m).await?;
            }
        }
        let after = applied(conn, line).await?;
        reports.push(LineReport {
            line: line.name,
            from_version: rows.iter().map(|r| r.version).max(),
            to_version: after.iter().map(|r| r.version).max(),
            applied: after
                .iter()
                .map(|r| r.version)
                .filter(|v| !rows.iter().any(|r| r.version == *v))
                .collect(),
        });
    }
    Ok(reports)
}

/// Creates the line's bookkeeping table, with sqlx's columns, if it is
/// missing (checked first, so that an existing table draws no notice).
async fn ensure_table(conn: &mut PgConnection, line: &MigrationLine) -> Result<(), sqlx::Error> {
    if table_exists(conn, line.table).await? {
        return Ok(());
    }
    conn.execute(&*format!(
        "CREATE TABLE IF NOT EXISTS {} (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
)",
        line.table
    ))
    .await?;
    Ok(())
}

/// Runs one migration and records it, in one transaction; then records its
/// execution time (nanoseconds).
async fn apply(
    conn: &mut PgConnection,
    line: &MigrationLine,
    m: &Migration,
) -> Result<(), MigrationError> {
    let started = Instant::now();
    let mut tx = conn.begin().await?;
    tx.execute(&*m.sql)
        .await
        .map_err(|source| MigrationError::Apply {
            line: line.name,
            version: m.version,
            source,
        })?;
    sqlx::query(&format!(
        "INSERT INTO {} ( version, description, success, checksum, execution_time ) \
         VALUES ( $1, $2, TRUE, $3, -1 )",
        line.table
    ))
    .bind(m.version)
    .bind(&*m.description)
    .bind(&*m.checksum)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let elapsed_ns = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
    sqlx::query(&format!(
        "UPDATE {} SET execution_time = $1 WHERE version = $2",
        line.table
    ))
    .bind(elapsed_ns)
    .bind(m.version)
    .execute(&mut *conn)
    .await?;
    tracing::debug!(
        line = line.name,
        version = m.version,
        elapsed_ns,
        "migration applied"
    );
    Ok(())
}

async fn current_database(conn: &mut PgConnection) -> Result<String, sqlx::Error> {
    sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&mut *conn)
        .await
}

/// The key of the migration advisory lock for database `database_name`:
/// sqlx's, `0x3d32ad9e * crc32(name)` (CRC-32/ISO-HDLC of the UTF-8 name),
/// so that this runner and sqlx's migrator exclude each other.
pub fn migration_lock_key(database_name: &str) -> i64 {
    const CRC_32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    // At most 0x3d32ad9e * (2^32 - 1) < 2^62: no overflow.
    0x3d32_ad9e * i64::from(CRC_32.checksum(database_name.as_bytes()))
}

/// Opens a connection of its own to `url` with `application_name` (so that
/// operators can see it in `pg_stat_activity`), for [`migrate`].
///
/// # Errors
/// The connection's [`sqlx::Error`].
pub async fn connect_dedicated(
    url: &DatabaseUrl,
    application_name: &str,
) -> Result<PgConnection, sqlx::Error> {
    url.connect_options()
        .clone()
        .application_name(application_name)
        .connect()
        .await
}

/// [`migrate`] on a connection of its own ([`connect_dedicated`]), closed
/// afterwards whatever happened: closing ends the session, which releases
/// the advisory lock even after a failure.
///
/// # Errors
/// As [`migrate`]; [`MigrationError::Database`] if the database cannot be
/// reached.
pub async fn migrate_url(
    url: &DatabaseUrl,
    application_name: &str,
    lines: &[MigrationLine],
) -> Result<Vec<LineReport>, MigrationError> {
    validate_lines(lines)?;
    let mut conn = connect_dedicated(url, application_name).await?;
    let result = migrate(&mut conn, lines).await;
    close_dedicated(conn).await;
    result
}

/// Closes a dedicated connection so that its `application_name` is gone
/// from `pg_stat_activity` when this returns: the name is cleared first
/// (a backend exits asynchronously after the client closes, and readers
/// of the name, such as a readiness probe looking for a running
/// migration, would see it for a while). If either step fails the socket
/// is dropped, with the same effect on the server.
async fn close_dedicated(mut conn: PgConnection) {
    let _ = sqlx::query("SET application_name = ''")
        .execute(&mut conn)
        .await;
    let _ = conn.close().await;
}

/// [`status`] on a connection of its own, closed afterwards.
///
/// # Errors
/// As [`status`]; [`MigrationError::Database`] if the database cannot be
/// reached.
pub async fn status_url(
    url: &DatabaseUrl,
    application_name: &str,
    lines: &[MigrationLine],
) -> Result<Vec<LineStatus>, MigrationError> {
    validate_lines(lines)?;
    let mut conn = connect_dedicated(url, application_name).await?;
    let result = status(&mut conn, lines).await;
    close_dedicated(conn).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(version: i64, sql: &'static str) -> Migration {
        Migration::new(
            version,
            format!("m{version}").into(),
            MigrationType::Simple,
            sql.into(),
            false,
        )
    }

    fn line(migrations: Vec<Migration>) -> MigrationLine {
        MigrationLine::new("test", "_test_migrations", migrations)
    }

    fn row(version: i64, success: bool, sql: &'static str) -> AppliedMigration {
        AppliedMigration {
            version,
            description: format!("m{version}"),
            success,
            checksum: m(version, sql).checksum.to_vec(),
        }
    }

    #[test]
    fn lock_key_is_sqlx_s() {
        // CRC-32/ISO-HDLC check value.
        const CRC_32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
        assert_eq!(CRC_32.checksum(b"123456789"), 0xCBF4_3926);
        assert_eq!(migration_lock_key("123456789"), 0x3d32_ad9e * 0xCBF4_3926);
        assert_eq!(migration_lock_key(""), 0);
        assert_eq!(migration_lock_key("postgres"), 0x3d32_ad9e * 0x156A_8775);
    }

    fn check_invalid(l: &MigrationLine, reason: &str) {
        match l.validate() {
            Err(MigrationError::InvalidLine { reason: r, .. }) => assert_eq!(r, reason),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn line_shapes_table() {
        assert!(line(vec![]).validate().is_ok());
        assert!(
            line(vec![m(1, "a"), m(2, "b"), m(10, "c")])
                .validate()
                .is_ok()
        );
        check_invalid(
            &line(vec![m(0, "a")]),
            "migration version 0 does not follow version 0 (versions must be positive and \
             strictly ascending)",
        );
        check_invalid(
            &line(vec![m(2, "a"), m(1, "b")]),
            "migration version 1 does not follow version 2 (versions must be positive and \
             strictly ascending)",
        );
        check_invalid(
            &line(vec![m(1, "a"), m(1, "b")]),
            "migration version 1 does not follow version 1 (versions must be positive and \
             strictly ascending)",
        );
        let mut rev = m(1, "a");
        rev.migration_type = MigrationType::ReversibleUp;
        check_invalid(
            &line(vec![rev]),
            "migration version 1 is reversible; lines are append-only",
        );
        let mut no_tx = m(1, "a");
        no_tx.no_tx = true;
        check_invalid(
            &line(vec![no_tx]),
            "migration version 1 opts out of its transaction; each migration must run in one \
             transaction with its bookkeeping row",
        );
        check_invalid(
            &MigrationLine::new("", "_t", vec![]),
            "the line has no name",
        );
        for table in ["", "Upper", "1abc", "a-b", "a b", "x;drop", "public.t"] {
            check_invalid(
                &MigrationLine::new("t", table, vec![]),
                &format!(
                    "bookkeeping table {table:?} is not a plain lower-case identifier of at \
                     most 63 bytes"
                ),
            );
        }
        let long: &'static str = Box::leak("a".repeat(64).into_boxed_str());
        assert!(!is_plain_identifier(long));
        assert!(is_plain_identifier(&long[..63]));
        for table in ["_sqlx_migrations", "_safetime_migrations", "a", "_", "t1_2"] {
            assert!(is_plain_identifier(table), "{table}");
        }
    }

    #[test]
    fn lines_must_not_share_names_or_tables() {
        let a = MigrationLine::new("a", "_a", vec![]);
        let b = MigrationLine::new("b", "_b", vec![]);
        assert!(validate_lines(&[a.clone(), b.clone()]).is_ok());
        assert!(validate_lines(&[]).is_ok());
        for (dup, dup_name) in [
            (MigrationLine::new("a", "_c", vec![]), "a"),
            (MigrationLine::new("c", "_a", vec![]), "c"),
        ] {
            match validate_lines(&[a.clone(), b.clone(), dup]) {
                Err(MigrationError::InvalidLine { line, reason }) => {
                    assert_eq!(line, dup_name);
                    assert_eq!(reason, "it shares its name or table with line a (table _a)");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn through_and_versions() {
        let l = line(vec![m(1, "a"), m(2, "b"), m(5, "c")]);
        assert_eq!(l.versions(), Some((1, 5)));
        assert_eq!(l.latest_version(), Some(5));
        assert_eq!(l.through(2).unwrap().latest_version(), Some(2));
        assert_eq!(l.through(2).unwrap().migrations().len(), 2);
        assert!(l.through(3).is_none());
        assert!(l.through(6).is_none());
        assert_eq!(line(vec![]).versions(), None);
        assert_eq!(
            l.known(),
            vec![
                PendingMigration {
                    version: 1,
                    description: "m1".into()
                },
                PendingMigration {
                    version: 2,
                    description: "m2".into()
                },
                PendingMigration {
                    version: 5,
                    description: "m5".into()
                },
            ]
        );
        assert_eq!((l.name(), l.table()), ("test", "_test_migrations"));
    }

    /// A reworded migration's previous checksum is accepted for that
    /// version only (and kept by `through`); any other checksum is still a
    /// modified migration.
    #[test]
    fn reworded_checksums_are_accepted_exactly() {
        let old = row(2, true, "-- old comment\nb");
        let old_hex = lower_hex(&old.checksum);
        assert_eq!(old_hex.len(), 96);
        let previous: &'static str = Box::leak(old_hex.into_boxed_str());
        let plain = line(vec![m(1, "a"), m(2, "-- new comment\nb")]);
        let reworded = plain.clone().with_reworded(2, previous);
        let modified = |r: Result<Vec<PendingMigration>, MigrationError>| {
            matches!(r, Err(MigrationError::Modified { version: 2, .. }))
        };
        assert!(modified(fence(&plain, &[row(1, true, "a"), old.clone()])));
        assert_eq!(
            fence(&reworded, &[row(1, true, "a"), old.clone()]).unwrap(),
            vec![]
        );
        assert_eq!(
            fence(
                &reworded,
                &[row(1, true, "a"), row(2, true, "-- new comment\nb")]
            )
            .unwrap(),
            vec![]
        );
        assert!(modified(fence(
            &reworded,
            &[row(1, true, "a"), row(2, true, "-- another\nb")]
        )));
        // For version 2 only: the same bytes recorded as version 1 are not
        // accepted for it.
        let mut as_one = old.clone();
        as_one.version = 1;
        assert!(matches!(
            fence(&reworded, &[as_one]),
            Err(MigrationError::Modified { version: 1, .. })
        ));
        let kept = reworded.through(2).unwrap();
        assert_eq!(fence(&kept, &[row(1, true, "a"), old]).unwrap(), vec![]);
        assert_eq!(reworded.through(1).unwrap().reworded, vec![]);
    }

    #[test]
    #[should_panic(expected = "test migrations: no version 3 to accept a reworded checksum for")]
    fn a_reworded_checksum_names_a_known_version() {
        let _ = line(vec![m(1, "a")]).with_reworded(3, "0".repeat(96).leak());
    }

    #[test]
    #[should_panic(expected = "version 1's previous checksum must be 96 lower-case hex digits")]
    fn a_reworded_checksum_is_hex() {
        let _ = line(vec![m(1, "a")]).with_reworded(1, "ABC");
    }

    #[test]
    fn fence_table() {
        let l = line(vec![m(1, "a"), m(2, "b"), m(3, "c")]);
        let versions = |p: Vec<PendingMigration>| p.iter().map(|p| p.version).collect::<Vec<_>>();
        assert_eq!(versions(fence(&l, &[]).unwrap()), [1, 2, 3]);
        assert_eq!(
            versions(fence(&l, &[row(1, true, "a"), row(2, true, "b")]).unwrap()),
            [3]
        );
        assert_eq!(
            versions(
                fence(
                    &l,
                    &[row(1, true, "a"), row(2, true, "b"), row(3, true, "c")]
                )
                .unwrap()
            ),
            Vec::<i64>::new()
        );
        // A gap is pending too.
        assert_eq!(versions(fence(&l, &[row(2, true, "b")]).unwrap()), [1, 3]);
        match fence(
            &l,
            &[row(1, true, "a"), row(4, true, "d"), row(5, true, "e")],
        ) {
            Err(MigrationError::UnknownVersion {
                line,
                version,
                description,
                known,
            }) => assert_eq!(
                (line, version, description.as_str(), known),
                ("test", 4, "m4", Some((1, 3)))
            ),
            other => panic!("{other:?}"),
        }
        match fence(&line(vec![]), &[row(1, true, "a")]) {
            Err(MigrationError::UnknownVersion { version, known, .. }) => {
                assert_eq!((version, known), (1, None))
            }
            other => panic!("{other:?}"),
        }
        match fence(&l, &[row(1, true, "a"), row(2, false, "b")]) {
            Err(MigrationError::RecordedFailed { version, .. }) => assert_eq!(version, 2),
            other => panic!("{other:?}"),
        }
        match fence(&l, &[row(1, true, "a"), row(2, true, "b changed")]) {
            Err(MigrationError::Modified {
                version,
                description,
                ..
            }) => assert_eq!((version, description.as_str()), (2, "m2")),
            other => panic!("{other:?}"),
        }
        // The first offending row decides.
        match fence(&l, &[row(1, true, "a changed"), row(9, true, "z")]) {
            Err(MigrationError::Modified { version, .. }) => assert_eq!(version, 1),
            other => panic!("{other:?}"),
        }
    }
}
