//! # clock
//!
//! The time sources of a service whose deadlines live on the safe expiry
//! cut. Every allocator operation takes a *supplied* instant; a service
//! gets it from exactly one [`Clock`] per process, chosen at start-up.
//! Clients never supply `now`. This crate knows no HTTP.
//!
//! * [`SystemClock`]: the operating system's wall clock (the default).
//! * [`TestClock`]: an instant an administrator sets (Tollgate's
//!   `PUT /v1/admin/test-clock`, enabled only by `--clock test`), so tests
//!   and demonstrations can drive the reclaim boundary to the nanosecond. It
//!   does not advance on its own.
//! * [`safe_cut::SafeCutClock`] (`--clock safe-cut`): the *safe expiry
//!   cut* persisted in PostgreSQL by the safe-time sampler. Its reading may
//!   be *uncertain*.
//!
//! A reading ([`Clock::read`]) is an instant plus its certainty, its
//! staleness bound and the latest deadline its source admits
//! ([`ClockReading`]). The system and test clocks are always certain and
//! never stale. A reading's instant `now` is where expiry is *judged*; a
//! deadline made from the reading is *counted from* its
//! [`ClockReading::grant_base`], `now` plus the staleness bound: the safe
//! expiry cut a request reads was observed up to that long before the
//! request, so `now` is a lower bound on the cut at the request and the
//! grant base an upper bound. A deadline counted from `now` and judged
//! later at a fresher cut would end early in real time by the reading's
//! staleness. While
//! a reading is uncertain the service still has an instant (the cut, a
//! lower bound on true time) but admits no new deadline-bearing work: acquire
//! and consolidation are refused with `503 time_uncertain`, the reclaim
//! worker settles nothing, while release and renewal proceed at the cut
//! (a renewal keeps the later of its expiry and `cut + ttl`, so it is never
//! shortened). A clock that cannot be read at all returns
//! [`ClockError::Unavailable`] and every time-dependent request fails with
//! `503 clock_unavailable`: the service never acts on a guessed instant.
//!
//! The module graph is one-way: this root defines the trait, the readings
//! and the status a safe-cut reading leaves; [`safe_cut`] implements the
//! trait on the cut and imports from here, never the reverse.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use jiff::{SignedDuration, Timestamp};
// The crate's only imports of the cut's rules and its reader; `safe_cut`
// reaches them through here. The two types are part of every reading and
// status, so they are re-exported: users of this crate need not import the
// safe-time crates for them.
pub use safetime::UncertainReason;
use safetime::judge_reading;
pub use safetime_pg::CutRow;
use safetime_pg::read_cut;

pub mod safe_cut;

/// Which clock a process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockKind {
    /// The operating system's wall clock.
    System,
    /// An instant set by an administrator (tests and demonstrations only).
    Test,
    /// The safe expiry cut persisted in PostgreSQL (PostgreSQL storage
    /// only). Spelled `safe-cut` (also accepted: `safe_cut`).
    #[serde(rename = "safe-cut", alias = "safe_cut")]
    SafeCut,
}

impl ClockKind {
    /// The stable lower-case name (`system`, `test`, `safe-cut`).
    pub fn as_str(&self) -> &'static str {
        match self {
            ClockKind::System => "system",
            ClockKind::Test => "test",
            ClockKind::SafeCut => "safe-cut",
        }
    }
}

impl fmt::Display for ClockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An instant, whether the clock vouches for it, how stale it may be, and
/// the latest deadline the clock admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReading {
    /// The instant to supply, where expiry is judged. For the safe-cut
    /// clock: the cut as read (a lower bound on true time and on the cut at
    /// the request), also while uncertain.
    pub now: Timestamp,
    /// `None`: certain. Otherwise why the clock cannot vouch that `now` is
    /// close enough to true time to admit new deadlines.
    pub uncertain: Option<UncertainReason>,
    /// An upper bound on how far the clock's instant can have advanced, in
    /// real time, from the observation that produced `now` to the moment
    /// this read began (so also to the moment the request arrived, which
    /// came first). Never negative; zero for the system and test clocks.
    /// For the safe-cut clock at most the sampling-gap bound while certain
    /// (a larger one makes the reading `stale`).
    pub staleness: SignedDuration,
    /// The latest deadline (`expiry + reclaim_grace`) a grant made from
    /// this reading may have: on the safe-cut clock `cut + horizon` of the
    /// policy in force; `None` (no limit) for the other clocks and before
    /// any cut.
    pub deadline_limit: Option<Timestamp>,
}

impl ClockReading {
    /// A certain reading at `now`: no staleness, no deadline limit.
    pub fn certain(now: Timestamp) -> ClockReading {
        ClockReading {
            now,
            uncertain: None,
            staleness: SignedDuration::ZERO,
            deadline_limit: None,
        }
    }

    /// The instant a deadline made from this reading is counted from:
    /// `now + staleness` (an upper bound on the clock's instant at the
    /// request), at least `now`. A sum beyond [`Timestamp::MAX`] gives
    /// `Timestamp::MAX` (every expiry counted from it is then
    /// unrepresentable, so nothing is granted from it).
    pub fn grant_base(&self) -> Timestamp {
        self.now
            .checked_add(self.staleness.max(SignedDuration::ZERO))
            .unwrap_or(Timestamp::MAX)
    }

    /// Whether the clock vouches for this reading.
    pub fn is_certain(&self) -> bool {
        self.uncertain.is_none()
    }
}

/// Why a clock could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    /// The time source did not answer (the safe-cut clock: the database
    /// read failed). No operation may act on a guessed instant.
    #[error("time source unavailable: {0}")]
    Unavailable(String),
    /// The database the time source reads did not answer (the safe-cut
    /// clock: the connection or the query failed, not the cut row): the
    /// same outage every store operation meets, answered as such.
    #[error("the database of the time source is unavailable: {0}")]
    StorageUnavailable(String),
}

/// What the last reading of a [`safe_cut::SafeCutClock`] found; exported
/// at `/metrics` and in `GET /v1/admin/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeTimeStatus {
    /// Why the last successful reading was uncertain (`None`: certain).
    pub uncertain: Option<UncertainReason>,
    /// The last read attempt failed (the cut could not be read at all).
    pub read_error: bool,
    /// Failed read attempts since the process started.
    pub read_errors_total: u64,
    /// The row of the last successful reading (`None`: no row yet, or no
    /// successful reading).
    pub row: Option<CutRow>,
    /// The sampling-gap bound this reader applies.
    pub gap_max: SignedDuration,
}

impl SafeTimeStatus {
    /// Whether the last read attempt succeeded and was certain.
    pub fn is_certain(&self) -> bool {
        !self.read_error && self.uncertain.is_none()
    }
}

/// The longest a telemetry request (`/metrics`, `GET /v1/admin/status`,
/// `tollgate status`) waits for its fresh reading of the cut before it
/// reports a read error instead.
pub const TELEMETRY_READ_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// A source of supplied time; see the module docs.
#[async_trait]
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant and its certainty.
    ///
    /// # Errors
    /// [`ClockError::Unavailable`] when the clock cannot be read at all.
    async fn read(&self) -> Result<ClockReading, ClockError>;

    /// Which clock this is.
    fn kind(&self) -> ClockKind;

    /// The test clock, if this is one (so `PUT /v1/admin/test-clock` can set
    /// it); `None` for every production clock.
    fn as_test(&self) -> Option<&TestClock> {
        None
    }

    /// Seconds a client should wait before retrying an operation refused
    /// because a reading was uncertain (the `Retry-After` of
    /// `time_uncertain`). At least 1.
    fn retry_after_secs(&self) -> u64 {
        1
    }

    /// What the last reading of a safe-cut clock found (`None` for every
    /// other clock).
    fn safe_time(&self) -> Option<SafeTimeStatus> {
        None
    }

    /// Takes one fresh reading, waiting at most `bound`, and returns what
    /// it found: for `/metrics`, `GET /v1/admin/status` and `tollgate
    /// status`, so telemetry never shows a certainty older than the
    /// request (a quiet service would otherwise keep its last reading). A
    /// read that fails or outlasts `bound` shows as a read error. `None`
    /// for every clock other than the safe-cut clock.
    async fn refresh_safe_time(&self, bound: std::time::Duration) -> Option<SafeTimeStatus> {
        let _ = bound;
        None
    }
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        Ok(ClockReading::certain(Timestamp::now()))
    }

    fn kind(&self) -> ClockKind {
        ClockKind::System
    }
}

/// A clock that stands still at an instant set by [`TestClock::set`].
#[derive(Debug)]
pub struct TestClock {
    now: Mutex<Timestamp>,
}

impl TestClock {
    /// A test clock standing at `start`.
    pub fn new(start: Timestamp) -> TestClock {
        TestClock {
            now: Mutex::new(start),
        }
    }

    /// Moves the clock to `now` (forwards or backwards).
    pub fn set(&self, now: Timestamp) {
        // A poisoned lock only means another thread panicked while holding a
        // plain `Timestamp`; the value is still whole.
        let mut guard = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *guard = now;
    }

    /// The instant the clock stands at.
    pub fn get(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl Clock for TestClock {
    async fn read(&self) -> Result<ClockReading, ClockError> {
        Ok(ClockReading::certain(self.get()))
    }

    fn kind(&self) -> ClockKind {
        ClockKind::Test
    }

    fn as_test(&self) -> Option<&TestClock> {
        Some(self)
    }
}
