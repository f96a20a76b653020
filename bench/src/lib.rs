//! Shared helpers of the Tollgate benchmarks: latency summaries, a
//! deterministic per-task random source, and PostgreSQL plumbing (a
//! dedicated throwaway server or an operator's URL, fresh databases, the
//! server settings every report must name).
//!
//! Benchmarks measure and print; they never assert on speed. BENCHMARKS.md
//! at the repository root records the figures and the commands.

#![warn(missing_docs)]

use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tollgate_pg_harness::PgServer;

/// Latency percentiles of one operation, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest sample.
    pub max_us: u64,
}

impl LatencySummary {
    /// Summarizes `samples_us` (sorted in place). Percentiles use the
    /// nearest-rank method; an empty input gives all zeros.
    ///
    /// # Panics
    /// Never.
    ///
    /// ```
    /// let mut s = vec![5, 1, 3, 2, 4];
    /// let l = tollgate_bench::LatencySummary::of(&mut s);
    /// assert_eq!((l.count, l.p50_us, l.max_us), (5, 3, 5));
    /// ```
    pub fn of(samples_us: &mut [u64]) -> LatencySummary {
        samples_us.sort_unstable();
        LatencySummary {
            count: samples_us.len(),
            p50_us: nearest_rank(samples_us, 50),
            p90_us: nearest_rank(samples_us, 90),
            p99_us: nearest_rank(samples_us, 99),
            max_us: samples_us.last().copied().unwrap_or(0),
        }
    }
}

/// The nearest-rank `pct`-th percentile of sorted `samples`, 0 if empty.
fn nearest_rank(sorted: &[u64], pct: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (pct * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// A duration in whole microseconds, saturating.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A small xorshift64* generator: each load task owns one, seeded
/// differently, so picks are cheap, uncorrelated enough for load
/// spreading, and reproducible.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed` (any value: the state is scrambled and
    /// forced odd, so it is never the fixed point 0).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`; 0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Where a benchmark's PostgreSQL comes from: a dedicated throwaway server
/// of the test harness (with its speed settings), or a server the operator
/// names. Fresh databases are created on it by name.
#[derive(Debug)]
pub struct BenchServer {
    server: Option<PgServer>,
    admin_url: String,
}

impl BenchServer {
    /// Uses `database_url`'s server if given (its database is the admin
    /// database that `CREATE DATABASE` runs in), else starts a dedicated
    /// harness server (`fsync`, `synchronous_commit`, `full_page_writes`
    /// off; see `tollgate_pg_harness::SERVER_SETTINGS`).
    ///
    /// # Errors
    /// The harness error, as text.
    pub fn start(database_url: Option<&str>) -> Result<BenchServer, String> {
        match database_url {
            Some(url) => Ok(BenchServer {
                server: None,
                admin_url: url.to_owned(),
            }),
            None => {
                let server = PgServer::start_dedicated().map_err(|e| e.to_string())?;
                let admin_url = server.admin_url();
                Ok(BenchServer {
                    server: Some(server),
                    admin_url,
                })
            }
        }
    }

    /// Whether this is a harness server started by the benchmark.
    pub fn is_harness(&self) -> bool {
        self.server.is_some()
    }

    /// Drops and recreates database `name` and returns its URL.
    ///
    /// # Errors
    /// Database errors, as text.
    pub async fn fresh_database(&self, name: &str) -> Result<String, String> {
        let mut conn = PgConnection::connect(&self.admin_url)
            .await
            .map_err(|e| format!("connecting to {}: {e}", redact(&self.admin_url)))?;
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            sqlx::raw_sql(&sql)
                .execute(&mut conn)
                .await
                .map_err(|e| format!("{sql}: {e}"))?;
        }
        let _ = conn.close().await;
        Ok(with_database(&self.admin_url, name))
    }
}

/// `url` with its database path replaced by `db` (query string kept).
///
/// ```
/// assert_eq!(
///     tollgate_bench::with_database("postgres://u@h:5/postgres?x=1", "b"),
///     "postgres://u@h:5/b?x=1"
/// );
/// ```
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    let mut out = format!("{}/{db}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// `url` without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..s + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The server facts a report names: version and the settings that decide
/// commit cost, as `(name, value)` rows.
///
/// # Errors
/// Database errors.
pub async fn server_settings(
    conn: &mut PgConnection,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    const NAMES: [&str; 9] = [
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "wal_level",
        "shared_buffers",
        "max_connections",
        "work_mem",
        "checkpoint_timeout",
    ];
    let mut rows = Vec::with_capacity(NAMES.len());
    for name in NAMES {
        let v: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        rows.push((name.to_owned(), v));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(samples: &[u64], expected: (usize, u64, u64, u64, u64)) {
        let mut s = samples.to_vec();
        let l = LatencySummary::of(&mut s);
        assert_eq!((l.count, l.p50_us, l.p90_us, l.p99_us, l.max_us), expected);
    }

    #[test]
    fn percentiles() {
        check(&[], (0, 0, 0, 0, 0));
        check(&[7], (1, 7, 7, 7, 7));
        check(&[2, 1], (2, 1, 2, 2, 2));
        let hundred: Vec<u64> = (1..=100).rev().collect();
        check(&hundred, (100, 50, 90, 99, 100));
    }

    #[test]
    fn urls() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn rng_ranges() {
        let mut r = Rng::new(0);
        for _ in 0..1000 {
            assert!(r.below(7) < 7);
        }
        assert_eq!(r.below(0), 0);
    }
}
