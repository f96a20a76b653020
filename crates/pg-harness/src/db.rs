//! Test databases.

use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::{Connection, PgConnection};

use crate::HarnessError;
use crate::server::{LISTEN_HOST, SUPERUSER};

/// A database created for one test by
/// [`PgCluster::fresh_database`](crate::PgCluster::fresh_database) or
/// [`PgServer::fresh_database`](crate::PgServer::fresh_database).
///
/// It is never dropped explicitly: it dies with its server at the end of the
/// test binary. Cloning it only copies the name and URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TestDb {
    name: String,
    url: String,
}

impl TestDb {
    /// The database name, `tg_<pid>_<n>`: unique within the server (and
    /// across test processes).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection URL: `postgres://postgres@127.0.0.1:<port>/<name>`
    /// (superuser `postgres`, no password: authentication is `trust`).
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// `postgres://postgres@127.0.0.1:<port>/<db>`.
pub(crate) fn url(port: u16, db: &str) -> String {
    format!("postgres://{SUPERUSER}@{LISTEN_HOST}:{port}/{db}")
}

/// `tg_<pid>_<n>` with a process-wide counter.
fn next_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "tg_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates a fresh database on the server at `port` through a short-lived
/// admin connection (no pool: each `#[tokio::test]` has its own runtime, and
/// a connection must not outlive the runtime it was made on).
pub(crate) async fn create_database(port: u16) -> Result<TestDb, HarnessError> {
    let name = next_name();
    let admin = url(port, "postgres");
    let mut conn = PgConnection::connect(&admin)
        .await
        .map_err(|source| HarnessError::Sql {
            context: format!("connecting to {admin}"),
            source,
        })?;
    let sql = format!("CREATE DATABASE \"{name}\"");
    let created = sqlx::raw_sql(&sql).execute(&mut conn).await;
    let _ = conn.close().await;
    created.map_err(|source| HarnessError::Sql {
        context: format!("{sql} on {admin}"),
        source,
    })?;
    Ok(TestDb {
        url: url(port, &name),
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_urls_well_formed() {
        let a = next_name();
        let b = next_name();
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("tg_{}_", std::process::id())));
        assert_eq!(
            url(5433, "tg_1_2"),
            "postgres://postgres@127.0.0.1:5433/tg_1_2"
        );
    }
}
