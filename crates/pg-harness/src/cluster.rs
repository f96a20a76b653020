//! The per-process shared cluster.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::{DbFuture, HarnessError, PgServer, TestDb};

/// The PostgreSQL server shared by all tests of one test binary.
///
/// Started lazily by the first [`PgCluster::shared`] / [`shared`](crate::shared)
/// call and never stopped by tests (it has no stop/restart methods on
/// purpose: use a [`PgServer`] for that). Tests isolate themselves by each
/// taking a [`fresh_database`](Self::fresh_database). At process exit the
/// server is shut down and its temp directory deleted.
#[derive(Debug)]
pub struct PgCluster {
    server: PgServer,
}

static SHARED: OnceLock<Result<PgCluster, String>> = OnceLock::new();

impl PgCluster {
    /// The shared cluster, started on first use (blocking the caller for
    /// the ~1-3 s of `initdb` and startup; concurrent callers wait for the
    /// same start).
    ///
    /// # Panics
    /// If it cannot be started (no PostgreSQL installed, startup failure,
    /// …), with the full reason. A test that needs PostgreSQL fails, it
    /// never skips. Once a start has failed, every later call in the process
    /// panics with the same reason at once.
    pub fn shared() -> &'static PgCluster {
        Self::try_shared().unwrap_or_else(|e| panic!("tollgate-pg-harness: {e}"))
    }

    /// Fallible [`shared`](Self::shared).
    ///
    /// # Errors
    /// [`HarnessError::SharedClusterFailed`] carrying the text of the start
    /// error (the same one for every call in the process).
    pub fn try_shared() -> Result<&'static PgCluster, HarnessError> {
        SHARED
            .get_or_init(|| {
                PgServer::start_dedicated()
                    .map(|server| PgCluster { server })
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|message| HarnessError::SharedClusterFailed {
                message: message.clone(),
            })
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`.
    pub fn url_for(&self, db: &str) -> String {
        self.server.url_for(db)
    }

    /// URL of the `postgres` maintenance database.
    pub fn admin_url(&self) -> String {
        self.server.admin_url()
    }

    /// The server log, for debugging a failing test.
    pub fn log_path(&self) -> PathBuf {
        self.server.log_path()
    }

    /// The PostgreSQL binaries in use.
    pub fn binaries(&self) -> &crate::PgBinaries {
        self.server.binaries()
    }

    /// Creates a new, uniquely named, empty database (`CREATE DATABASE`
    /// from `template1` through a short-lived admin connection made on the
    /// caller's runtime).
    ///
    /// # Panics
    /// If the database cannot be created, with the reason.
    pub fn fresh_database(&self) -> DbFuture<TestDb> {
        self.server.fresh_database()
    }

    /// Fallible [`fresh_database`](Self::fresh_database).
    ///
    /// # Errors
    /// [`HarnessError::Sql`] if connecting or `CREATE DATABASE` fails.
    pub fn try_fresh_database(&self) -> DbFuture<Result<TestDb, HarnessError>> {
        self.server.try_fresh_database()
    }
}

/// Async form of [`PgCluster::shared`]: the first start runs on tokio's
/// blocking pool, so the calling runtime's worker is not blocked. Must be
/// called within a tokio runtime (any flavour).
///
/// # Panics
/// As [`PgCluster::shared`].
pub async fn shared() -> &'static PgCluster {
    if let Some(Ok(cluster)) = SHARED.get() {
        return cluster;
    }
    match tokio::task::spawn_blocking(PgCluster::shared).await {
        Ok(cluster) => cluster,
        Err(join) => match join.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(join) => panic!("tollgate-pg-harness: starting the shared cluster: {join}"),
        },
    }
}
