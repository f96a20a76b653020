//! Little Compute's migration line and the schema that carries it.
//!
//! The line (`migrations/`, bookkeeping in [`LC_MIGRATIONS_TABLE`]) is
//! applied after Tollgate's and safe time's, because its tables refer to
//! Tollgate's accounts and leases and its guards read the cut and the
//! sealed horizon. [`schema`] is Tollgate's current schema with this line
//! appended: migrate with it, and every Little Compute store checks it at
//! start.

use lc_core::LcError;
use pgkit::MigrationLine;
use sqlx::migrate::Migrator;
use tollgate_pg::{MigrationReport, Schema};

use crate::error::from_storage;

static LC_MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The name of Little Compute's migration line.
pub const LC_LINE: &str = "lc";

/// The bookkeeping table of Little Compute's line.
pub const LC_MIGRATIONS_TABLE: &str = "_lc_migrations";

/// The current version of Little Compute's line.
pub const LC_VERSION: i64 = 14;

/// Little Compute's line: its tables, the deadline guard (LCS01), the
/// canonical-identity guard (LCS02), its part of the initial-cut
/// inventory, and (0002) exec ownership, transition receipts (immutable,
/// LCS03), ownership that only moves forward (LCS04) and pages whose
/// state only moves from pending to acked (LCS05), and (0003) inputs for
/// a command's stdin, queued then sent in seq order (LCS06), and (0004)
/// workspaces with immutable snapshots (LCS07), hibernations, resume
/// requests and immutable resume receipts (LCS08), the attempt's resume
/// guard (LCS09), and (0005) the provider's refusal of a resume's restore
/// recorded on its intent, and (0006) the provider's refusal of a
/// hibernation's snapshot recorded on the hibernation, and (0007) scoped tokens: their
/// secrets' digests, scopes and Scope deadlines (LCS01), changed only by
/// their first revocation (LCS70), and (0010) workers'
/// claims on work items, with an expiry on the cut (LCS01) and a
/// generation that only moves forward (LCSC1), and (0009) deletion
/// grace (deletions of a terminal exec's workspace or output with their
/// `purge_after` on the cut, under LCS01; a purge only once a certain
/// persisted cut passed it, LCS90) and the retention of terminal execs'
/// records (`retain_until` on the cut, under LCS01), and (0008)
/// tenants' approval policies, execs awaiting approval and immutable
/// approval decisions whose `valid_until` is a deadline on the cut
/// (LCS01), and (0011) every one of these authorities in the initial-cut
/// inventory (any of them quarantines a first claim), and (0012) the
/// provider's verified measurement of each Lease generation, whose
/// measured values are never dropped (LCSM1), and (0013) the milestones
/// of execs' attempts, each with its snapshot head and the observation up
/// to it, never changed (LCSM2), and (0014) why an exec expired (its
/// timeout or its Lease).
pub fn lc_line() -> MigrationLine {
    MigrationLine::new(LC_LINE, LC_MIGRATIONS_TABLE, LC_MIGRATOR.migrations.clone())
}

/// Every line a Little Compute binary knows: Tollgate's, safe time's, then
/// Little Compute's.
pub fn schema() -> Schema {
    Schema::current().with_line(lc_line())
}

/// Applies every pending migration of [`schema`] to the database at `url`
/// on a dedicated connection.
///
/// # Errors
/// `storage_unavailable` when the database cannot be reached;
/// `storage_failure` for an unparsable URL, an unknown (newer) version in
/// any line, a changed migration, or a failed one (rolled back).
pub async fn migrate(url: &str) -> Result<MigrationReport, LcError> {
    schema().migrate(url).await.map_err(from_storage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_follows_tollgate_s_and_safe_time_s() {
        let s = schema();
        pgkit::migrate::validate_lines(s.lines()).unwrap();
        let names: Vec<(&str, &str)> = s.lines().iter().map(|l| (l.name(), l.table())).collect();
        assert_eq!(
            names,
            [
                ("tollgate", "_sqlx_migrations"),
                ("safetime", "_safetime_migrations"),
                ("lc", "_lc_migrations")
            ]
        );
        assert_eq!(lc_line().versions(), Some((1, LC_VERSION)));
    }
}
