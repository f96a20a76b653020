//! Test databases.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::{Connection, Executor, PgConnection};

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

/// The future of [`PgCluster::fresh_database`](crate::PgCluster::fresh_database)
/// and its relatives: boxed, `Send` and `'static` (it owns what it needs and
/// borrows nothing from the server), so other crates can await it inside
/// `Send` futures (an `async_trait` method, a spawned task).
///
/// The `Send` bound is part of the signature on purpose. An `async fn`'s
/// future leaks its auto traits, and one that held sqlx's generic executor
/// across an await (`raw_sql(..).execute(&mut conn)`) could not be proved
/// `Send` from another crate ("implementation of `Executor` is not general
/// enough", rust-lang/rust#64552 and relatives) although nothing in it was
/// ever used across threads unsafely. With the bound in the type, such a
/// regression fails to compile here, not in a caller.
pub type DbFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

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
pub(crate) fn create_database(port: u16) -> DbFuture<Result<TestDb, HarnessError>> {
    Box::pin(create_database_at(port))
}

async fn create_database_at(port: u16) -> Result<TestDb, HarnessError> {
    let name = next_name();
    let admin = url(port, "postgres");
    let mut conn = PgConnection::connect(&admin)
        .await
        .map_err(|source| HarnessError::Sql {
            context: format!("connecting to {admin}"),
            source,
        })?;
    let sql = format!("CREATE DATABASE \"{name}\"");
    // `Executor::execute` on the connection returns sqlx's boxed `Send`
    // future; `raw_sql(..).execute(&mut conn)` would keep its generic
    // executor in this future's state, which defeats the `Send` proof.
    let created = conn.execute(sql.as_str()).await;
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
