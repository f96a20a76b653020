//! The service's time source.
//!
//! Every allocator operation takes a *supplied* instant; the service gets it
//! from exactly one [`Clock`] per process, chosen at start-up. Clients never
//! supply `now`.
//!
//! * [`SystemClock`]: the operating system's wall clock (the default).
//! * [`TestClock`]: an instant an administrator sets over HTTP
//!   (`PUT /v1/admin/test-clock`), enabled only by `--clock test`, so tests
//!   and demonstrations can drive the reclaim boundary to the nanosecond. It
//!   does not advance on its own.
//! * The seam for a third clock: the *safe expiry cut* (DESIGN.md), which may
//!   be *uncertain* and then must refuse to supply time. That is why
//!   [`Clock::now`] is async and fallible: a clock that cannot vouch for the
//!   current instant returns [`ClockError::Uncertain`], and the request fails
//!   with `503 clock_unavailable` instead of acting on an untrusted instant.

use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use jiff::Timestamp;

/// Which clock a process uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockKind {
    /// The operating system's wall clock.
    System,
    /// An instant set by an administrator (tests and demonstrations only).
    Test,
}

impl ClockKind {
    /// The stable lower-case name (`system`, `test`).
    pub fn as_str(&self) -> &'static str {
        match self {
            ClockKind::System => "system",
            ClockKind::Test => "test",
        }
    }
}

impl fmt::Display for ClockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a clock could not supply an instant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    /// The clock cannot currently vouch for the time (the safe expiry cut is
    /// uncertain). No operation may act on a guessed instant.
    #[error("time source is uncertain: {0}")]
    Uncertain(String),
}

/// A source of supplied time; see the module docs.
#[async_trait]
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant, as this clock vouches for it.
    ///
    /// # Errors
    /// [`ClockError::Uncertain`] when the clock cannot vouch for any instant.
    async fn now(&self) -> Result<Timestamp, ClockError>;

    /// Which clock this is.
    fn kind(&self) -> ClockKind;

    /// The test clock, if this is one (so `PUT /v1/admin/test-clock` can set
    /// it); `None` for every production clock.
    fn as_test(&self) -> Option<&TestClock> {
        None
    }
}

/// The operating system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    async fn now(&self) -> Result<Timestamp, ClockError> {
        Ok(Timestamp::now())
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
    async fn now(&self) -> Result<Timestamp, ClockError> {
        Ok(self.get())
    }

    fn kind(&self) -> ClockKind {
        ClockKind::Test
    }

    fn as_test(&self) -> Option<&TestClock> {
        Some(self)
    }
}
