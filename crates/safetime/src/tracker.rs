//! The cut tracker: how the *safe expiry cut* moves.
//!
//! The cut is the persisted instant before which no authority may be
//! treated as expired: every deadline of every subsystem is judged against
//! it, never against a host clock, so a clock that jumps cannot expire
//! anything early. A single leader (the sampler) proposes it from
//! [`Observation`]s: database time and topology read in one query,
//! bracketed by the sampler host's monotonic clock. This module is the pure
//! decision procedure ([`CutTracker`]); the database functions of migration
//! 0018 apply the same caps again (never backward, never past database
//! time, only from the current epoch) so a faulty proposal cannot move the
//! cut past what PostgreSQL observes.
//!
//! # How the cut moves
//!
//! Between two consecutive observations `p` and `o` of one epoch:
//!
//! * `lo = o.mono_before - p.mono_after` and `hi = o.mono_after -
//!   p.mono_before` bound the host monotonic time that passed between the
//!   two database reads (each read happened somewhere inside its own round
//!   trip).
//! * The observation is *consistent* when the database's elapsed time
//!   `db = o.db_now - p.db_now` lies in `[lo - slack, hi + slack]` with
//!   `slack = hi * drift_ppm / 10^6`: the drift allowance plus the round
//!   trip. Above that range is a forward clock step, below it a backward one.
//! * Consistent: the cut advances by `min(db, hi * (1 - drift))`, so it never
//!   gains on database time and never outruns the monotonic window less the
//!   drift allowance. Anything else (a step, a gap, a topology change, an
//!   implausible round trip): it advances by only `max(lo, 0) * (1 - drift)`,
//!   the elapsed time the monotonic clock vouches for.
//! * The proposal is capped at the observed database time and never goes
//!   below the current cut.
//!
//! Consequently a forward step of the database clock is never caught up:
//! the cut keeps advancing at the monotonic rate and stays behind database
//! time by the step (the *cut lag*). Availability may be late; acknowledged
//! authority never expires early. A backward step freezes the cut until
//! database time passes it again.
//!
//! # Certainty
//!
//! The cut is *uncertain* from the start of every epoch (a sampler restart
//! or leader change) and after any anomaly ([`UncertainReason`]). It becomes
//! certain again after [`SafeTimeConfig::stable_observations_min`]
//! consecutive consistent observations *and* at least
//! [`SafeTimeConfig::recovery_grace`] of monotonic time since the last
//! anomaly: one consistent observation right after an anomaly could be a
//! coincidence, and recovery needs both many samples and enough time.
//!
//! # Initial quarantine
//!
//! An installation that may already hold deadline-bearing authority starts
//! its cut at the Unix epoch, *quarantined* (uncertain, reason
//! [`UncertainReason::InitialQuarantine`]). Only an uninterrupted run of at
//! least the sealed horizon of trusted monotonic time (less the drift
//! allowance) within one epoch clears it; any anomaly, restart or takeover
//! restarts that proof from zero. At clearing the cut moves to database
//! time: every authority issued before the quarantine has a deadline within
//! one horizon of its issue, so it has expired by then, and while
//! quarantined nothing new was admitted and no renewal could extend past
//! its current expiry (the cut was far behind).

use std::fmt;

use jiff::{SignedDuration, Timestamp};

use crate::timestamp::{TIMESTAMP_MAX_NS, TIMESTAMP_MIN_NS};

/// Default maximum-deadline horizon: 3,650 days = 315,360,000,000 ms, long
/// enough for a lease that hibernates for years and is resumed.
pub const DEFAULT_HORIZON_MS: i64 = 315_360_000_000;

/// The owner-sealed maximum-deadline horizon policy: no deadline of any
/// kind may lie further than the horizon after its issue (the default is
/// [`DEFAULT_HORIZON_MS`], 3,650 days), which bounds how long the initial
/// quarantine must run to outlive every deadline issued before it. A version, the
/// horizon in milliseconds, and the hex SHA-256 digest of
/// [`HorizonPolicy::canonical_text`], verified on load so a row edited
/// behind the database's own check is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HorizonPolicy {
    version: i64,
    horizon_ms: i64,
    digest: String,
}

/// A horizon policy that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HorizonPolicyError {
    /// Version below 1 or horizon not positive.
    #[error("horizon policy version {version} with horizon {horizon_ms} ms is not valid")]
    Invalid {
        /// The version read.
        version: i64,
        /// The horizon read, milliseconds.
        horizon_ms: i64,
    },
    /// The stored digest is not the digest of the stored values.
    #[error(
        "horizon policy version {version}: digest {stored} does not match the sealed values (expected {expected})"
    )]
    DigestMismatch {
        /// The version read.
        version: i64,
        /// The digest stored.
        stored: String,
        /// The digest of the stored values.
        expected: String,
    },
}

impl HorizonPolicy {
    /// `tollgate-safetime-policy/v1;version=<v>;horizon_ms=<h>`: the text
    /// the digest covers (migration 0018 computes the same in SQL).
    pub fn canonical_text(version: i64, horizon_ms: i64) -> String {
        format!("tollgate-safetime-policy/v1;version={version};horizon_ms={horizon_ms}")
    }

    /// Hex SHA-256 of [`HorizonPolicy::canonical_text`].
    pub fn digest_of(version: i64, horizon_ms: i64) -> String {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(
            HorizonPolicy::canonical_text(version, horizon_ms).as_bytes(),
        ))
    }

    /// A policy read from storage, with its digest verified.
    ///
    /// # Errors
    /// [`HorizonPolicyError::Invalid`], [`HorizonPolicyError::DigestMismatch`].
    pub fn verified(
        version: i64,
        horizon_ms: i64,
        digest: &str,
    ) -> Result<HorizonPolicy, HorizonPolicyError> {
        if version < 1 || horizon_ms <= 0 {
            return Err(HorizonPolicyError::Invalid {
                version,
                horizon_ms,
            });
        }
        let expected = HorizonPolicy::digest_of(version, horizon_ms);
        if expected != digest {
            return Err(HorizonPolicyError::DigestMismatch {
                version,
                stored: digest.to_owned(),
                expected,
            });
        }
        Ok(HorizonPolicy {
            version,
            horizon_ms,
            digest: expected,
        })
    }

    /// The policy version.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// The horizon, milliseconds.
    pub fn horizon_ms(&self) -> i64 {
        self.horizon_ms
    }

    /// The verified digest (64 lower-case hex digits).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The horizon as a duration.
    pub fn horizon(&self) -> SignedDuration {
        SignedDuration::from_millis(self.horizon_ms)
    }

    /// Checks that every deadline of every kind in `bounds` fits inside
    /// the horizon: `longest <= horizon` for each, exactly (nanoseconds;
    /// equal fits). On a clock that reads the cut, a deadline beyond the
    /// horizon could outlive the initial quarantine's proof, so a
    /// subsystem must refuse to admit one.
    ///
    /// ```
    /// use jiff::SignedDuration;
    /// use safetime::{DeadlineBound, DeadlineKind, HorizonPolicy};
    /// let kind = DeadlineKind::named("example.job");
    /// let policy = HorizonPolicy::verified(1, 10_000, &HorizonPolicy::digest_of(1, 10_000)).unwrap();
    /// let fits = DeadlineBound::new(kind, SignedDuration::from_secs(10));
    /// assert_eq!(policy.covers(&[fits]), Ok(()));
    /// let over = DeadlineBound::new(kind, SignedDuration::new(10, 1));
    /// assert_eq!(policy.covers(&[fits, over]).unwrap_err().kind, kind);
    /// ```
    ///
    /// # Errors
    /// [`HorizonShortfall`] naming the first bound, in `bounds` order,
    /// that does not fit (an unbounded one never fits).
    pub fn covers(&self, bounds: &[DeadlineBound]) -> Result<(), HorizonShortfall> {
        let horizon = self.horizon();
        match bounds
            .iter()
            .find(|b| !b.longest.is_some_and(|longest| longest <= horizon))
        {
            None => Ok(()),
            Some(b) => Err(HorizonShortfall {
                kind: b.kind,
                longest: b.longest,
                version: self.version,
                horizon,
            }),
        }
    }
}

/// A named kind of deadline issued on cut time. Each subsystem names its
/// own kinds, prefixed with its name (`tollgate.lease_grant`); the name
/// appears in [`HorizonShortfall`]'s message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeadlineKind {
    name: &'static str,
}

impl DeadlineKind {
    /// The kind called `name`.
    pub const fn named(name: &'static str) -> DeadlineKind {
        DeadlineKind { name }
    }

    /// Its name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Display for DeadlineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// The longest deadline of one [`DeadlineKind`] a subsystem can admit,
/// measured from the cut-time instant it is issued at; exact to the
/// nanosecond. A setting whose longest deadline does not fit in a
/// [`SignedDuration`] is *unbounded*: no horizon covers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineBound {
    kind: DeadlineKind,
    longest: Option<SignedDuration>,
}

impl DeadlineBound {
    /// Deadlines of `kind` lie at most `longest` after their issue.
    ///
    /// # Panics
    /// If `longest` is negative: no deadline lies before its issue, so a
    /// negative bound is a bug in the subsystem that computed it.
    pub const fn new(kind: DeadlineKind, longest: SignedDuration) -> DeadlineBound {
        assert!(!longest.is_negative(), "a deadline bound is never negative");
        DeadlineBound {
            kind,
            longest: Some(longest),
        }
    }

    /// Deadlines of `kind` made of two parts, `first` then `second` (a TTL
    /// and the grace after it): the bound is `first + second`, exact, or
    /// unbounded when the sum exceeds [`SignedDuration::MAX`].
    ///
    /// # Panics
    /// If `first` or `second` is negative, as for [`DeadlineBound::new`].
    pub fn sum(kind: DeadlineKind, first: SignedDuration, second: SignedDuration) -> DeadlineBound {
        assert!(
            !first.is_negative() && !second.is_negative(),
            "a deadline's parts are never negative: {first}, {second}"
        );
        DeadlineBound {
            kind,
            longest: first.checked_add(second),
        }
    }

    /// The kind bounded.
    pub fn kind(&self) -> DeadlineKind {
        self.kind
    }

    /// The longest deadline; `None` when unbounded (beyond
    /// [`SignedDuration::MAX`]).
    pub fn longest(&self) -> Option<SignedDuration> {
        self.longest
    }
}

/// The first [`DeadlineBound`] a horizon policy does not cover, with the
/// exact values compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HorizonShortfall {
    /// The kind that does not fit.
    pub kind: DeadlineKind,
    /// Its longest deadline; `None` when unbounded.
    pub longest: Option<SignedDuration>,
    /// The horizon policy's version.
    pub version: i64,
    /// The horizon.
    pub horizon: SignedDuration,
}

impl fmt::Display for HorizonShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let HorizonShortfall {
            kind,
            version,
            horizon,
            ..
        } = self;
        match self.longest {
            Some(longest) => write!(
                f,
                "the longest {kind} deadline ({longest}) is beyond the horizon of policy \
                 version {version} ({horizon})"
            ),
            None => write!(
                f,
                "the longest {kind} deadline is beyond any duration, so beyond the horizon \
                 of policy version {version} ({horizon})"
            ),
        }
    }
}

impl std::error::Error for HorizonShortfall {}

/// Why the cut is uncertain. The string forms ([`UncertainReason::code`])
/// are stable: they are persisted, exported as metric labels and shown by
/// `tollgate status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UncertainReason {
    /// A new epoch began (sampler restart or leader change); no elapsed
    /// time can be vouched for across it.
    NewEpoch,
    /// The database's system identifier, timeline, recovery state or
    /// postmaster start time changed (failover, restart, promotion).
    PrimaryChange,
    /// The sampler is connected to a server in recovery (a standby).
    InRecovery,
    /// Database time advanced more than monotonic time plus the allowance.
    ClockStepForward,
    /// Database time advanced less than monotonic time less the allowance
    /// (or went back).
    ClockStepBackward,
    /// An observation that cannot be trusted: a round trip longer than the
    /// bound, or a monotonic reading that went backwards.
    ImplausibleObservation,
    /// More than the sampling-gap bound passed between samples.
    SamplingGap,
    /// Anomalies have stopped; waiting for enough stable observations and
    /// the grace period.
    Recovering,
    /// The installation started quarantined at the Unix epoch and the
    /// full-horizon proof has not finished.
    InitialQuarantine,
    /// (Readers only.) The newest published cut is older than the
    /// sampling-gap bound: the sampler is stopped, paused or cut off.
    Stale,
    /// (Readers only.) No sampler has ever published a cut.
    NoCut,
}

impl UncertainReason {
    /// Every reason, in declaration order.
    pub const ALL: [UncertainReason; 11] = [
        UncertainReason::NewEpoch,
        UncertainReason::PrimaryChange,
        UncertainReason::InRecovery,
        UncertainReason::ClockStepForward,
        UncertainReason::ClockStepBackward,
        UncertainReason::ImplausibleObservation,
        UncertainReason::SamplingGap,
        UncertainReason::Recovering,
        UncertainReason::InitialQuarantine,
        UncertainReason::Stale,
        UncertainReason::NoCut,
    ];

    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            UncertainReason::NewEpoch => "new_epoch",
            UncertainReason::PrimaryChange => "primary_change",
            UncertainReason::InRecovery => "in_recovery",
            UncertainReason::ClockStepForward => "clock_step_forward",
            UncertainReason::ClockStepBackward => "clock_step_backward",
            UncertainReason::ImplausibleObservation => "implausible_observation",
            UncertainReason::SamplingGap => "sampling_gap",
            UncertainReason::Recovering => "recovering",
            UncertainReason::InitialQuarantine => "initial_quarantine",
            UncertainReason::Stale => "stale",
            UncertainReason::NoCut => "no_cut",
        }
    }

    /// Parses a [`code`](UncertainReason::code); `None` for anything else.
    pub fn from_code(code: &str) -> Option<UncertainReason> {
        UncertainReason::ALL.into_iter().find(|r| r.code() == code)
    }

    /// Whether this reason is an anomaly: it resets the recovery count and
    /// restarts any quarantine proof. `Recovering` and `InitialQuarantine`
    /// describe waiting, not a new anomaly.
    pub fn is_anomaly(&self) -> bool {
        !matches!(
            self,
            UncertainReason::Recovering | UncertainReason::InitialQuarantine
        )
    }
}

impl fmt::Display for UncertainReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// How a reader judges one reading of the persisted cut: a cut older than
/// the sampling-gap bound counts as uncertain, because nobody vouches for
/// the time since. The one rule behind every reader of the cut (Tollgate's
/// safe-cut clock, `tollgate-safetime status`).
///
/// * `published`: the publisher's reason (`None`: it declared the cut
///   certain).
/// * `row_age`: the database's time at the read minus the database's time
///   of the last publish (`db_now - published_at`); both instants are the
///   database's, so no host clock enters.
/// * `unchanged_for`: how long this reader has seen the same
///   `(epoch, publish_seq)`, on its own monotonic clock (zero for a one-off
///   read).
/// * `gap_max`: the sampling-gap bound.
///
/// Returns [`UncertainReason::Stale`] when `row_age` or `unchanged_for`
/// exceeds `gap_max` (exactly `gap_max` is still fresh); stale takes
/// precedence over the publisher's reason, which describes a past state
/// nobody is updating. Otherwise returns `published`.
pub fn judge_reading(
    published: Option<UncertainReason>,
    row_age: SignedDuration,
    unchanged_for: SignedDuration,
    gap_max: SignedDuration,
) -> Option<UncertainReason> {
    if row_age > gap_max || unchanged_for > gap_max {
        Some(UncertainReason::Stale)
    } else {
        published
    }
}

/// Default drift allowance between the database and the sampler host's
/// monotonic clock, in parts per million: 50 ppm, 4.32 s a day.
pub const DEFAULT_DRIFT_PPM: u32 = 50;

/// Largest accepted drift allowance, in parts per million (10%): a larger
/// allowance would make the step detector meaningless.
pub const DRIFT_PPM_MAX: u32 = 100_000;

/// Default interval between samples.
pub const DEFAULT_SAMPLE_INTERVAL: SignedDuration = SignedDuration::from_secs(1);

/// Default sampling-gap bound: a longer gap between samples makes the cut
/// uncertain, and a published cut older than this is read as uncertain.
pub const DEFAULT_GAP_MAX: SignedDuration = SignedDuration::from_secs(5);

/// Largest accepted sampling-gap bound (one hour). The gap bound is also
/// how long a reader trusts a cut that is no longer republished: a larger
/// one would let a stopped sampler's cut read as certain (never `stale`)
/// for practically ever. An hour is far above any sane setting (the
/// default is 5 s) and still bounds that exposure.
pub const GAP_MAX_MAX: SignedDuration = SignedDuration::from_hours(1);

/// Default longest plausible round trip of one observation query.
pub const DEFAULT_ROUND_TRIP_MAX: SignedDuration = SignedDuration::from_secs(1);

/// Default number of consecutive consistent observations before recovery.
pub const DEFAULT_STABLE_OBSERVATIONS_MIN: u32 = 3;

/// Largest accepted number of consecutive consistent observations before
/// recovery (10,000: almost three hours at the default 1 s interval). A
/// larger count would keep the cut uncertain for so long that it is a
/// misconfiguration, not a policy.
pub const STABLE_OBSERVATIONS_MAX: u32 = 10_000;

/// Default grace period of monotonic time after the last anomaly before
/// recovery.
pub const DEFAULT_RECOVERY_GRACE: SignedDuration = SignedDuration::from_secs(5);

/// Largest accepted recovery grace (one hour): a longer grace would keep
/// the cut uncertain after every anomaly for longer than an outage is
/// worth, so it is read as a misconfiguration (the default is 5 s).
pub const RECOVERY_GRACE_MAX: SignedDuration = SignedDuration::from_hours(1);

/// A rejected [`SafeTimeConfig`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SafeTimeConfigError {
    /// The drift allowance is above [`DRIFT_PPM_MAX`].
    #[error("drift allowance must be at most {max} ppm, got {got}")]
    DriftTooLarge {
        /// The value given.
        got: u32,
        /// [`DRIFT_PPM_MAX`].
        max: u32,
    },
    /// A duration that must be positive was zero or negative.
    #[error("{name} must be positive, got {got}")]
    NonPositive {
        /// Which setting.
        name: &'static str,
        /// The value given.
        got: SignedDuration,
    },
    /// A duration above its upper bound ([`GAP_MAX_MAX`] for `gap_max`,
    /// [`RECOVERY_GRACE_MAX`] for `recovery_grace`).
    #[error("{name} must be at most {max}, got {got}")]
    TooLong {
        /// Which setting.
        name: &'static str,
        /// The value given.
        got: SignedDuration,
        /// Its upper bound.
        max: SignedDuration,
    },
    /// More stable observations than [`STABLE_OBSERVATIONS_MAX`].
    #[error("stable_observations_min must be at most {max}, got {got}")]
    TooManyStableObservations {
        /// The value given.
        got: u32,
        /// [`STABLE_OBSERVATIONS_MAX`].
        max: u32,
    },
    /// The round-trip bound is not below the sampling-gap bound.
    #[error("round_trip_max ({round_trip_max}) must be below gap_max ({gap_max})")]
    RoundTripNotBelowGap {
        /// The round-trip bound.
        round_trip_max: SignedDuration,
        /// The sampling-gap bound.
        gap_max: SignedDuration,
    },
    /// The sample interval is not below the sampling-gap bound, so every
    /// sample would be a gap.
    #[error("sample interval ({interval}) must be below gap_max ({gap_max})")]
    IntervalNotBelowGap {
        /// The sample interval.
        interval: SignedDuration,
        /// The sampling-gap bound.
        gap_max: SignedDuration,
    },
    /// Zero stable observations would make recovery instant.
    #[error("stable_observations_min must be at least 1")]
    NoStableObservations,
}

/// The sampler's tuning. Build with [`SafeTimeConfig::new`]; every field is
/// validated there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SafeTimeConfig {
    drift_ppm: u32,
    interval: SignedDuration,
    gap_max: SignedDuration,
    round_trip_max: SignedDuration,
    stable_observations_min: u32,
    recovery_grace: SignedDuration,
}

impl Default for SafeTimeConfig {
    fn default() -> Self {
        SafeTimeConfig {
            drift_ppm: DEFAULT_DRIFT_PPM,
            interval: DEFAULT_SAMPLE_INTERVAL,
            gap_max: DEFAULT_GAP_MAX,
            round_trip_max: DEFAULT_ROUND_TRIP_MAX,
            stable_observations_min: DEFAULT_STABLE_OBSERVATIONS_MIN,
            recovery_grace: DEFAULT_RECOVERY_GRACE,
        }
    }
}

impl SafeTimeConfig {
    /// A validated configuration.
    ///
    /// # Errors
    /// [`SafeTimeConfigError`]: drift above [`DRIFT_PPM_MAX`], a
    /// non-positive duration (`recovery_grace` may be zero), a gap bound
    /// above [`GAP_MAX_MAX`] or a recovery grace above
    /// [`RECOVERY_GRACE_MAX`], a round-trip bound or interval not below the
    /// gap bound (so both are below [`GAP_MAX_MAX`] too), or stable
    /// observations outside `1..=`[`STABLE_OBSERVATIONS_MAX`].
    pub fn new(
        drift_ppm: u32,
        interval: SignedDuration,
        gap_max: SignedDuration,
        round_trip_max: SignedDuration,
        stable_observations_min: u32,
        recovery_grace: SignedDuration,
    ) -> Result<SafeTimeConfig, SafeTimeConfigError> {
        let config = SafeTimeConfig {
            drift_ppm,
            interval,
            gap_max,
            round_trip_max,
            stable_observations_min,
            recovery_grace,
        };
        config.validate()?;
        Ok(config)
    }

    /// The checks of [`SafeTimeConfig::new`], in order. Apart from `new`
    /// because cargo-mutants (27.1) does not look inside functions named
    /// `new`, and these bounds are under the mutation gate.
    fn validate(&self) -> Result<(), SafeTimeConfigError> {
        let SafeTimeConfig {
            drift_ppm,
            interval,
            gap_max,
            round_trip_max,
            stable_observations_min,
            recovery_grace,
        } = *self;
        if drift_ppm > DRIFT_PPM_MAX {
            return Err(SafeTimeConfigError::DriftTooLarge {
                got: drift_ppm,
                max: DRIFT_PPM_MAX,
            });
        }
        for (name, got) in [
            ("interval", interval),
            ("gap_max", gap_max),
            ("round_trip_max", round_trip_max),
        ] {
            if !got.is_positive() {
                return Err(SafeTimeConfigError::NonPositive { name, got });
            }
        }
        if recovery_grace.is_negative() {
            return Err(SafeTimeConfigError::NonPositive {
                name: "recovery_grace",
                got: recovery_grace,
            });
        }
        for (name, got, max) in [
            ("gap_max", gap_max, GAP_MAX_MAX),
            ("recovery_grace", recovery_grace, RECOVERY_GRACE_MAX),
        ] {
            if got > max {
                return Err(SafeTimeConfigError::TooLong { name, got, max });
            }
        }
        if round_trip_max >= gap_max {
            return Err(SafeTimeConfigError::RoundTripNotBelowGap {
                round_trip_max,
                gap_max,
            });
        }
        if interval >= gap_max {
            return Err(SafeTimeConfigError::IntervalNotBelowGap { interval, gap_max });
        }
        if stable_observations_min == 0 {
            return Err(SafeTimeConfigError::NoStableObservations);
        }
        if stable_observations_min > STABLE_OBSERVATIONS_MAX {
            return Err(SafeTimeConfigError::TooManyStableObservations {
                got: stable_observations_min,
                max: STABLE_OBSERVATIONS_MAX,
            });
        }
        Ok(())
    }

    /// Drift allowance, parts per million.
    pub fn drift_ppm(&self) -> u32 {
        self.drift_ppm
    }
    /// Interval between samples.
    pub fn interval(&self) -> SignedDuration {
        self.interval
    }
    /// Sampling-gap bound.
    pub fn gap_max(&self) -> SignedDuration {
        self.gap_max
    }
    /// Longest plausible observation round trip.
    pub fn round_trip_max(&self) -> SignedDuration {
        self.round_trip_max
    }
    /// Consecutive consistent observations needed to recover.
    pub fn stable_observations_min(&self) -> u32 {
        self.stable_observations_min
    }
    /// Monotonic time after the last anomaly needed to recover.
    pub fn recovery_grace(&self) -> SignedDuration {
        self.recovery_grace
    }

    /// `elapsed_ns * (1 - drift)`, rounded down; never negative.
    pub(crate) fn trusted(&self, elapsed_ns: i128) -> i128 {
        let e = elapsed_ns.max(0);
        e * i128::from(1_000_000 - self.drift_ppm) / 1_000_000
    }

    /// `elapsed_ns * drift`, rounded up.
    pub(crate) fn slack(&self, elapsed_ns: i128) -> i128 {
        let e = elapsed_ns.max(0);
        (e * i128::from(self.drift_ppm) + 999_999) / 1_000_000
    }
}

/// Where the sampler's database is, as one observation sees it. Any change
/// between two observations is a [`UncertainReason::PrimaryChange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// `pg_control_system().system_identifier` (shared by a primary and its
    /// physical standbys).
    pub system_identifier: i64,
    /// The server's current WAL timeline (0 while in recovery).
    pub timeline_id: i64,
    /// `pg_is_in_recovery()`.
    pub in_recovery: bool,
    /// `pg_postmaster_start_time()`: changes on every server restart.
    pub postmaster_start: Timestamp,
}

/// One sample: database time and topology from a single query, bracketed by
/// the sampler host's monotonic clock (nanoseconds since an arbitrary
/// per-process origin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// `clock_timestamp()` inside the query.
    pub db_now: Timestamp,
    /// The database's topology at that moment.
    pub topology: Topology,
    /// Monotonic nanoseconds just before the query was sent.
    pub mono_before_ns: u64,
    /// Monotonic nanoseconds just after its answer arrived.
    pub mono_after_ns: u64,
}

/// What the sampler should publish after an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The proposed cut: never below the current cut, never above the
    /// observation's database time (unless the cut already is).
    pub proposal: Timestamp,
    /// `None` when certain; otherwise why not.
    pub uncertain: Option<UncertainReason>,
    /// This observation was an anomaly: the database restarts any
    /// quarantine proof from zero.
    pub anomaly: bool,
    /// The initial quarantine's full-horizon proof completed with this
    /// observation; the proposal is database time.
    pub clears_quarantine: bool,
    /// Whether the observation may be published at all (`false` while
    /// connected to a server in recovery, which cannot accept writes).
    pub publishable: bool,
}

/// The sampler's in-memory state for one epoch; see the module docs. It
/// starts uncertain ([`UncertainReason::NewEpoch`], or
/// [`UncertainReason::InitialQuarantine`] when quarantined) and is fed one
/// [`Observation`] at a time with [`CutTracker::observe`]; after each
/// publish the database's accepted cut is fed back with
/// [`CutTracker::accepted`].
#[derive(Debug, Clone)]
pub struct CutTracker {
    config: SafeTimeConfig,
    horizon_ns: i128,
    cut_ns: i128,
    last: Option<Observation>,
    stable: u32,
    recovery_since_mono_ns: Option<u64>,
    uncertain: Option<UncertainReason>,
    quarantine_since_mono_ns: Option<u64>,
    quarantined: bool,
    start_reason: UncertainReason,
}

impl CutTracker {
    /// A tracker for a new epoch starting from the persisted `cut`.
    /// `quarantined`: the installation is in its initial quarantine.
    /// `horizon`: the sealed maximum-deadline horizon (the length of the
    /// quarantine proof).
    pub fn new(
        config: SafeTimeConfig,
        cut: Timestamp,
        quarantined: bool,
        horizon: SignedDuration,
    ) -> CutTracker {
        CutTracker {
            config,
            horizon_ns: horizon.as_nanos().max(0),
            cut_ns: cut.as_nanosecond(),
            last: None,
            stable: 0,
            recovery_since_mono_ns: None,
            uncertain: Some(if quarantined {
                UncertainReason::InitialQuarantine
            } else {
                UncertainReason::NewEpoch
            }),
            quarantine_since_mono_ns: None,
            quarantined,
            start_reason: UncertainReason::NewEpoch,
        }
    }

    /// The same tracker, reporting `reason` (instead of
    /// [`UncertainReason::NewEpoch`]) for the epoch's first observation:
    /// the database's own finding at the claim, such as
    /// [`UncertainReason::PrimaryChange`] after a failover.
    pub fn with_start_reason(mut self, reason: UncertainReason) -> CutTracker {
        self.start_reason = reason;
        if !self.quarantined {
            self.uncertain = Some(reason);
        }
        self
    }

    /// The configuration.
    pub fn config(&self) -> &SafeTimeConfig {
        &self.config
    }

    /// The cut as last accepted.
    pub fn cut(&self) -> Timestamp {
        ns_to_timestamp(self.cut_ns)
    }

    /// Whether the initial quarantine is still in force.
    pub fn quarantined(&self) -> bool {
        self.quarantined
    }

    /// Why the cut is uncertain now (`None`: certain).
    pub fn uncertain(&self) -> Option<UncertainReason> {
        self.uncertain
    }

    /// Consecutive consistent observations so far.
    pub fn stable_observations(&self) -> u32 {
        self.stable
    }

    /// Records the cut the database accepted for the last proposal (it may
    /// be lower: capped by the database's own time). Never moves the
    /// tracker's cut backward.
    pub fn accepted(&mut self, cut: Timestamp) {
        self.cut_ns = self.cut_ns.max(cut.as_nanosecond());
    }

    /// Classifies `obs` against the previous observation and proposes the
    /// next cut; see the module docs for the rules.
    pub fn observe(&mut self, obs: Observation) -> Verdict {
        let cfg = self.config;
        let db_now_ns = obs.db_now.as_nanosecond();
        let rtt = i128::from(obs.mono_after_ns) - i128::from(obs.mono_before_ns);
        let prev = self.last.replace(obs);
        let (anomaly, advance_ns): (Option<UncertainReason>, i128) = match prev {
            None => (Some(self.start_reason), 0),
            Some(p) => {
                let lo = i128::from(obs.mono_before_ns) - i128::from(p.mono_after_ns);
                let hi = i128::from(obs.mono_after_ns) - i128::from(p.mono_before_ns);
                let trusted = cfg.trusted(lo);
                let anomaly = if obs.topology.system_identifier != p.topology.system_identifier
                    || obs.topology.timeline_id != p.topology.timeline_id
                    || obs.topology.postmaster_start != p.topology.postmaster_start
                    || obs.topology.in_recovery != p.topology.in_recovery
                {
                    Some(UncertainReason::PrimaryChange)
                } else if obs.topology.in_recovery {
                    Some(UncertainReason::InRecovery)
                } else if rtt < 0 || lo < 0 || rtt > cfg.round_trip_max().as_nanos() {
                    Some(UncertainReason::ImplausibleObservation)
                } else if lo > cfg.gap_max().as_nanos() {
                    Some(UncertainReason::SamplingGap)
                } else {
                    let db = db_now_ns - p.db_now.as_nanosecond();
                    let slack = cfg.slack(hi);
                    if db > hi + slack {
                        Some(UncertainReason::ClockStepForward)
                    } else if db < lo - slack {
                        Some(UncertainReason::ClockStepBackward)
                    } else {
                        None
                    }
                };
                match anomaly {
                    None => {
                        let db = db_now_ns - p.db_now.as_nanosecond();
                        (None, db.min(cfg.trusted(hi)).max(0))
                    }
                    Some(a) => (Some(a), trusted),
                }
            }
        };

        // Recovery bookkeeping.
        let mut clears_quarantine = false;
        match anomaly {
            Some(a) => {
                self.stable = 0;
                self.recovery_since_mono_ns = Some(obs.mono_after_ns);
                self.quarantine_since_mono_ns = Some(obs.mono_after_ns);
                self.uncertain = Some(if self.quarantined {
                    UncertainReason::InitialQuarantine
                } else {
                    a
                });
            }
            None => {
                self.stable = self.stable.saturating_add(1);
                let since = self.recovery_since_mono_ns.unwrap_or(obs.mono_after_ns);
                let calm_ns = i128::from(obs.mono_before_ns) - i128::from(since);
                let recovered = self.stable >= cfg.stable_observations_min()
                    && calm_ns >= cfg.recovery_grace().as_nanos();
                if self.quarantined {
                    let run_since = self.quarantine_since_mono_ns.unwrap_or(obs.mono_after_ns);
                    let run_ns =
                        cfg.trusted(i128::from(obs.mono_before_ns) - i128::from(run_since));
                    if recovered && run_ns >= self.horizon_ns {
                        self.quarantined = false;
                        clears_quarantine = true;
                        self.uncertain = None;
                    } else {
                        self.uncertain = Some(UncertainReason::InitialQuarantine);
                    }
                } else if recovered {
                    self.uncertain = None;
                } else if self.uncertain.is_some() {
                    self.uncertain = Some(UncertainReason::Recovering);
                }
            }
        }

        let proposal_ns = if clears_quarantine {
            self.cut_ns.max(db_now_ns)
        } else {
            self.cut_ns
                .max((self.cut_ns.saturating_add(advance_ns)).min(db_now_ns))
        };
        let proposal_ns = proposal_ns.clamp(TIMESTAMP_MIN_NS, TIMESTAMP_MAX_NS);
        Verdict {
            proposal: ns_to_timestamp(proposal_ns),
            uncertain: self.uncertain,
            anomaly: anomaly.is_some(),
            clears_quarantine,
            publishable: !obs.topology.in_recovery,
        }
    }
}

/// Nanoseconds to a timestamp, clamped to jiff's range (callers keep values
/// in range; the clamp makes the conversion total).
fn ns_to_timestamp(ns: i128) -> Timestamp {
    let ns = ns.clamp(TIMESTAMP_MIN_NS, TIMESTAMP_MAX_NS);
    Timestamp::from_nanosecond(ns).unwrap_or(Timestamp::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn cfg() -> SafeTimeConfig {
        SafeTimeConfig::new(
            50,
            SignedDuration::from_secs(1),
            SignedDuration::from_secs(5),
            SignedDuration::from_millis(500),
            3,
            SignedDuration::from_secs(2),
        )
        .unwrap()
    }

    fn topo() -> Topology {
        Topology {
            system_identifier: 7,
            timeline_id: 1,
            in_recovery: false,
            postmaster_start: Timestamp::from_second(1_000).unwrap(),
        }
    }

    fn ts(ns: i128) -> Timestamp {
        Timestamp::from_nanosecond(ns).unwrap()
    }

    /// An observation at monotonic `mono_s` seconds with a 1 ms round trip,
    /// database time read at the midpoint.
    fn obs(mono_s: u64, db_ns: i128) -> Observation {
        Observation {
            db_now: ts(db_ns),
            topology: topo(),
            mono_before_ns: mono_s * S,
            mono_after_ns: mono_s * S + 1_000_000,
        }
    }

    const T0: i128 = 1_800_000_000_000_000_000;

    #[test]
    fn steady_samples_track_database_time_and_recover() {
        let mut t = CutTracker::new(
            cfg(),
            ts(T0 - 10 * S as i128),
            false,
            SignedDuration::from_hours(1),
        );
        let v = t.observe(obs(100, T0));
        assert_eq!(v.uncertain, Some(UncertainReason::NewEpoch));
        assert_eq!(v.proposal, ts(T0 - 10 * S as i128));
        assert!(v.anomaly);
        t.accepted(v.proposal);
        // Each later sample: db advanced exactly 1 s; hi = 1.001 s, so the
        // advance is min(1 s, 1.001 s * (1 - 50e-6)) = 1 s.
        for k in 1..=3u64 {
            let v = t.observe(obs(100 + k, T0 + i128::from(k) * S as i128));
            assert_eq!(
                v.proposal,
                ts(T0 - 10 * S as i128 + i128::from(k) * S as i128)
            );
            t.accepted(v.proposal);
            // Three stable observations are needed (and 2 s of calm).
            let expected = if k < 3 {
                Some(UncertainReason::Recovering)
            } else {
                None
            };
            assert_eq!(v.uncertain, expected, "k = {k}");
        }
    }

    #[test]
    fn the_first_observation_reports_the_start_reason() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1))
            .with_start_reason(UncertainReason::PrimaryChange);
        assert_eq!(t.uncertain(), Some(UncertainReason::PrimaryChange));
        let v = t.observe(obs(10, T0));
        assert_eq!(
            (v.uncertain, v.anomaly),
            (Some(UncertainReason::PrimaryChange), true)
        );
        let v = t.observe(obs(11, T0 + S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::Recovering));
    }

    #[test]
    fn forward_step_is_not_caught_up() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        // Database jumps 1 hour forward within 1 s of monotonic time.
        let v = t.observe(obs(11, T0 + 3_601 * S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::ClockStepForward));
        // lo = 1 s - 1 ms = 0.999 s, less 50 ppm, rounded down.
        assert_eq!(v.proposal, ts(T0 + 998_950_050));
    }

    #[test]
    fn backward_step_freezes_the_cut() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        let v = t.observe(obs(11, T0 - 60 * S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::ClockStepBackward));
        assert_eq!(v.proposal, ts(T0));
    }

    #[test]
    fn gap_topology_and_round_trip_anomalies() {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        // 6 s gap (> 5 s bound), database consistent with it.
        let v = t.observe(obs(16, T0 + 6 * S as i128));
        assert_eq!(v.uncertain, Some(UncertainReason::SamplingGap));
        // lo = 5.999 s less 50 ppm.
        assert_eq!(v.proposal, ts(T0 + 5_998_700_050));
        t.accepted(v.proposal);
        let mut o = obs(17, T0 + 7 * S as i128);
        o.topology.timeline_id = 2;
        let v = t.observe(o);
        assert_eq!(v.uncertain, Some(UncertainReason::PrimaryChange));
        t.accepted(v.proposal);
        let mut o = obs(18, T0 + 8 * S as i128);
        o.topology.timeline_id = 2;
        o.mono_after_ns = o.mono_before_ns + 600_000_000;
        assert_eq!(
            t.observe(o).uncertain,
            Some(UncertainReason::ImplausibleObservation)
        );
        let mut o = obs(19, T0 + 9 * S as i128);
        o.topology.timeline_id = 2;
        o.topology.in_recovery = true;
        let v = t.observe(o);
        assert_eq!(v.uncertain, Some(UncertainReason::PrimaryChange));
        assert!(!v.publishable);
    }

    #[test]
    fn initial_quarantine_clears_only_after_a_full_horizon_run() {
        let horizon = SignedDuration::from_secs(10);
        let mut t = CutTracker::new(cfg(), Timestamp::UNIX_EPOCH, true, horizon);
        let v = t.observe(obs(100, T0));
        assert_eq!(v.uncertain, Some(UncertainReason::InitialQuarantine));
        assert_eq!(v.proposal, Timestamp::UNIX_EPOCH);
        t.accepted(v.proposal);
        // Proof runs from mono 100.001 s; 10 s of trusted time (less 50 ppm)
        // needs mono_before >= 100.001 + 10.0005 s, i.e. the sample at 111.
        for k in 101..=110u64 {
            let v = t.observe(obs(k, T0 + i128::from(k - 100) * S as i128));
            assert_eq!(
                v.uncertain,
                Some(UncertainReason::InitialQuarantine),
                "k = {k}"
            );
            assert!(!v.clears_quarantine);
            assert_eq!(v.proposal, ts(i128::from(k - 100) * S as i128));
            t.accepted(v.proposal);
        }
        let v = t.observe(obs(111, T0 + 11 * S as i128));
        assert!(v.clears_quarantine);
        assert_eq!(v.uncertain, None);
        assert_eq!(v.proposal, ts(T0 + 11 * S as i128));
        assert!(!t.quarantined());
    }

    #[test]
    fn an_anomaly_restarts_the_quarantine_proof() {
        let horizon = SignedDuration::from_secs(10);
        let mut t = CutTracker::new(cfg(), Timestamp::UNIX_EPOCH, true, horizon);
        t.observe(obs(100, T0));
        for k in 101..=105u64 {
            t.observe(obs(k, T0 + i128::from(k - 100) * S as i128));
        }
        // A backward step at 106 restarts the proof from 106.001 s.
        let v = t.observe(obs(106, T0));
        assert_eq!(v.uncertain, Some(UncertainReason::InitialQuarantine));
        assert!(v.anomaly);
        for k in 107..=116u64 {
            let v = t.observe(obs(k, T0 + i128::from(k - 106) * S as i128));
            assert!(!v.clears_quarantine, "k = {k}");
        }
        assert!(t.observe(obs(117, T0 + 11 * S as i128)).clears_quarantine);
    }

    /// A tracker that has seen one observation at monotonic 10 s (1 ms
    /// round trip) with database time T0, cut T0.
    fn primed() -> CutTracker {
        let mut t = CutTracker::new(cfg(), ts(T0), false, SignedDuration::from_hours(1));
        t.observe(obs(10, T0));
        t
    }

    /// An observation with explicit monotonic bracket and database offset
    /// from T0.
    fn raw(before: u64, after: u64, db_offset: i128) -> Observation {
        Observation {
            db_now: ts(T0 + db_offset),
            topology: topo(),
            mono_before_ns: before,
            mono_after_ns: after,
        }
    }

    #[test]
    fn consistency_window_boundaries_are_exact() {
        // prev: before 10 s, after 10.001 s. This: before 11 s, after
        // 11.001000001 s: lo = 0.999 s, hi = 1.001000001 s,
        // slack = ceil(hi * 50e-6) = 50_051 ns, trusted(hi) = 1_000_949_950,
        // trusted(lo) = 998_950_050.
        let before = 11 * S;
        let after = 11 * S + 1_000_001;
        let cases: [(i128, Option<UncertainReason>, i128); 5] = [
            // db at hi + slack: consistent, advance capped at trusted(hi).
            (1_001_050_052, None, 1_000_949_950),
            // one more: a forward step, advance trusted(lo).
            (
                1_001_050_053,
                Some(UncertainReason::ClockStepForward),
                998_950_050,
            ),
            // db at lo - slack: consistent, advance is the database's own.
            (998_949_949, None, 998_949_949),
            // one less: a backward step; trusted(lo) is capped by db time.
            (
                998_949_948,
                Some(UncertainReason::ClockStepBackward),
                998_949_948,
            ),
            // exactly one second: consistent, advance 1 s.
            (1_000_000_000, None, 1_000_000_000),
        ];
        for (db, reason, advance) in cases {
            let mut t = primed();
            let v = t.observe(raw(before, after, db));
            let expected = if reason.is_some() {
                reason
            } else {
                Some(UncertainReason::Recovering)
            };
            assert_eq!(
                (v.uncertain, v.anomaly, v.proposal),
                (expected, reason.is_some(), ts(T0 + advance)),
                "db offset {db}"
            );
            assert_eq!(t.stable_observations(), u32::from(reason.is_none()));
        }
    }

    #[test]
    fn round_trip_gap_and_ordering_boundaries_are_exact() {
        let p_after = 10 * S + 1_000_000;
        let cases: [(u64, u64, i128, Option<UncertainReason>); 8] = [
            // rtt exactly 500 ms (the bound): fine.
            (11 * S, 11 * S + 500_000_000, 1_000_000_000, None),
            // rtt one nanosecond more: implausible.
            (
                11 * S,
                11 * S + 500_000_001,
                1_000_000_000,
                Some(UncertainReason::ImplausibleObservation),
            ),
            // lo exactly 5 s (the gap bound): fine.
            (
                p_after + 5 * S,
                p_after + 5 * S + 1_000_000,
                5 * S as i128,
                None,
            ),
            // lo one nanosecond more: a gap.
            (
                p_after + 5 * S + 1,
                p_after + 5 * S + 1_000_001,
                5 * S as i128,
                Some(UncertainReason::SamplingGap),
            ),
            // answered in no measurable time (rtt = 0): fine.
            (11 * S, 11 * S, 999_500_000, None),
            // sent the instant the previous answer arrived (lo = 0): fine.
            (p_after, p_after + 1_000_000, 1_000_000, None),
            // sent before the previous answer arrived (lo < 0): implausible.
            (
                p_after - 1,
                p_after + 1_000_000,
                1_000_000,
                Some(UncertainReason::ImplausibleObservation),
            ),
            // answer before question (rtt < 0): implausible.
            (
                11 * S,
                11 * S - 1,
                1_000_000_000,
                Some(UncertainReason::ImplausibleObservation),
            ),
        ];
        for (before, after, db, reason) in cases {
            let mut t = primed();
            let v = t.observe(raw(before, after, db));
            assert_eq!(
                (v.anomaly, v.uncertain.filter(|_| v.anomaly)),
                (reason.is_some(), reason),
                "{before} {after}"
            );
        }
    }

    #[test]
    fn accessors_display_and_start_reason() {
        let c = cfg();
        assert_eq!(
            (
                c.drift_ppm(),
                c.interval(),
                c.gap_max(),
                c.round_trip_max(),
                c.stable_observations_min(),
                c.recovery_grace()
            ),
            (
                50,
                SignedDuration::from_secs(1),
                SignedDuration::from_secs(5),
                SignedDuration::from_millis(500),
                3,
                SignedDuration::from_secs(2)
            )
        );
        assert_eq!(SafeTimeConfig::default().drift_ppm(), DEFAULT_DRIFT_PPM);
        assert_eq!(
            UncertainReason::ClockStepForward.to_string(),
            "clock_step_forward"
        );
        let q = CutTracker::new(c, ts(5), true, SignedDuration::from_secs(1))
            .with_start_reason(UncertainReason::PrimaryChange);
        assert_eq!(
            (
                q.cut(),
                q.quarantined(),
                q.uncertain(),
                q.stable_observations(),
                *q.config()
            ),
            (ts(5), true, Some(UncertainReason::InitialQuarantine), 0, c)
        );
        let n = CutTracker::new(c, ts(5), false, SignedDuration::from_secs(1));
        assert_eq!(
            (n.quarantined(), n.uncertain()),
            (false, Some(UncertainReason::NewEpoch))
        );
        let mut a = n.clone();
        a.accepted(ts(9));
        a.accepted(ts(7));
        assert_eq!(a.cut(), ts(9), "accepted never moves the cut back");
    }

    #[test]
    fn recovery_needs_the_grace_period_as_well() {
        // Grace 2 s, samples every 0.5 s: 3 stable observations arrive at
        // 11.5 s, but calm (before - 10.001 s) reaches 2 s only at 12.5 s.
        let mut t = primed();
        let steps = [
            (105u64, false),
            (110, false),
            (115, false),
            (120, false),
            (125, true),
        ];
        for (tenths, certain) in steps {
            let before = tenths * S / 10;
            let v = t.observe(raw(
                before,
                before + 1_000_000,
                i128::from(before) - 10 * S as i128,
            ));
            assert_eq!(v.uncertain.is_none(), certain, "at {tenths} tenths");
        }
    }

    #[test]
    fn horizon_policy_digest_is_verified() {
        let d = HorizonPolicy::digest_of(1, DEFAULT_HORIZON_MS);
        assert_eq!(d.len(), 64);
        let p = HorizonPolicy::verified(1, DEFAULT_HORIZON_MS, &d).unwrap();
        assert_eq!(p.horizon(), SignedDuration::from_hours(3_650 * 24));
        assert_eq!(
            (p.version(), p.horizon_ms(), p.digest()),
            (1, 315_360_000_000, d.as_str())
        );
        let p7 = HorizonPolicy::verified(7, 5, &HorizonPolicy::digest_of(7, 5)).unwrap();
        assert_eq!((p7.version(), p7.horizon_ms()), (7, 5));
        assert_eq!(
            HorizonPolicy::canonical_text(7, 5),
            "tollgate-safetime-policy/v1;version=7;horizon_ms=5"
        );
        assert_eq!(
            HorizonPolicy::verified(1, 1_000, &d),
            Err(HorizonPolicyError::DigestMismatch {
                version: 1,
                stored: d.clone(),
                expected: HorizonPolicy::digest_of(1, 1_000)
            })
        );
        assert_eq!(
            HorizonPolicy::verified(1, 0, &d),
            Err(HorizonPolicyError::Invalid {
                version: 1,
                horizon_ms: 0
            })
        );
        // A bound of exactly 10 s fits 10,000 ms, not 9,999 ms.
        let ten_s = [DeadlineBound::new(KIND, SignedDuration::from_secs(10))];
        let ten = HorizonPolicy::verified(2, 10_000, &HorizonPolicy::digest_of(2, 10_000)).unwrap();
        assert!(ten.covers(&ten_s).is_ok());
        let short = HorizonPolicy::verified(2, 9_999, &HorizonPolicy::digest_of(2, 9_999)).unwrap();
        assert!(short.covers(&ten_s).is_err());
    }

    const KIND: DeadlineKind = DeadlineKind::named("test.job");
    const OTHER: DeadlineKind = DeadlineKind::named("test.other");

    fn policy(horizon_ms: i64) -> HorizonPolicy {
        HorizonPolicy::verified(3, horizon_ms, &HorizonPolicy::digest_of(3, horizon_ms)).unwrap()
    }

    /// `covers` at its boundaries: equal fits, one nanosecond over does
    /// not, an unbounded kind never fits, and the first kind that does not
    /// fit is named with the exact values.
    #[test]
    fn covers_boundaries_are_exact() {
        let ns = SignedDuration::from_nanos(1);
        let h = SignedDuration::from_secs(10);
        let bound = |kind, longest| DeadlineBound::new(kind, longest);
        let short = |kind, longest| {
            Err(HorizonShortfall {
                kind,
                longest,
                version: 3,
                horizon: h,
            })
        };
        let cases: Vec<(Vec<DeadlineBound>, Result<(), HorizonShortfall>)> = vec![
            (vec![], Ok(())),
            (vec![bound(KIND, SignedDuration::ZERO)], Ok(())),
            (vec![bound(KIND, h - ns)], Ok(())),
            (vec![bound(KIND, h)], Ok(())),
            (vec![bound(KIND, h + ns)], short(KIND, Some(h + ns))),
            (
                vec![bound(KIND, SignedDuration::MAX)],
                short(KIND, Some(SignedDuration::MAX)),
            ),
            (
                vec![DeadlineBound::sum(KIND, SignedDuration::MAX, ns)],
                short(KIND, None),
            ),
            (vec![bound(KIND, h), bound(OTHER, h)], Ok(())),
            (
                vec![bound(KIND, h), bound(OTHER, h + ns)],
                short(OTHER, Some(h + ns)),
            ),
            (
                vec![bound(KIND, h + ns), bound(OTHER, h + ns * 2)],
                short(KIND, Some(h + ns)),
            ),
        ];
        for (bounds, expected) in cases {
            assert_eq!(policy(10_000).covers(&bounds), expected, "{bounds:?}");
        }
    }

    #[test]
    fn sum_is_exact_up_to_the_largest_duration() {
        let ns = SignedDuration::from_nanos(1);
        let max = SignedDuration::MAX;
        let cases = [
            (
                SignedDuration::ZERO,
                SignedDuration::ZERO,
                Some(SignedDuration::ZERO),
            ),
            (
                SignedDuration::from_secs(9),
                SignedDuration::new(1, 1),
                Some(SignedDuration::new(10, 1)),
            ),
            (max - ns, ns, Some(max)),
            (max, SignedDuration::ZERO, Some(max)),
            (max, ns, None),
            (ns, max, None),
            (max, max, None),
        ];
        for (first, second, longest) in cases {
            let b = DeadlineBound::sum(KIND, first, second);
            assert_eq!(
                (b.kind(), b.longest()),
                (KIND, longest),
                "{first} + {second}"
            );
        }
        let b = DeadlineBound::new(OTHER, SignedDuration::from_secs(3));
        assert_eq!(
            (b.kind(), b.longest()),
            (OTHER, Some(SignedDuration::from_secs(3)))
        );
    }

    #[test]
    #[should_panic(expected = "a deadline's parts are never negative")]
    fn sum_refuses_a_negative_part() {
        DeadlineBound::sum(
            KIND,
            SignedDuration::from_secs(1),
            SignedDuration::from_nanos(-1),
        );
    }

    #[test]
    #[should_panic(expected = "a deadline's parts are never negative")]
    fn sum_refuses_a_negative_first_part() {
        DeadlineBound::sum(
            KIND,
            SignedDuration::from_nanos(-1),
            SignedDuration::from_secs(1),
        );
    }

    #[test]
    fn kinds_and_shortfalls_print_their_exact_values() {
        assert_eq!(
            (KIND.name(), KIND.to_string()),
            ("test.job", "test.job".to_owned())
        );
        let over = HorizonShortfall {
            kind: KIND,
            longest: Some(SignedDuration::new(10, 1)),
            version: 3,
            horizon: SignedDuration::from_secs(10),
        };
        assert_eq!(
            over.to_string(),
            "the longest test.job deadline (PT10.000000001S) is beyond the horizon of policy \
             version 3 (PT10S)"
        );
        let unbounded = HorizonShortfall {
            longest: None,
            ..over
        };
        assert_eq!(
            unbounded.to_string(),
            "the longest test.job deadline is beyond any duration, so beyond the horizon of \
             policy version 3 (PT10S)"
        );
    }

    #[test]
    fn reason_codes_round_trip() {
        for r in UncertainReason::ALL {
            assert_eq!(UncertainReason::from_code(r.code()), Some(r));
        }
        assert_eq!(UncertainReason::from_code("nope"), None);
        assert!(UncertainReason::NewEpoch.is_anomaly());
        assert!(!UncertainReason::Recovering.is_anomaly());
    }

    #[test]
    fn judge_reading_boundaries() {
        let gap = SignedDuration::from_secs(2);
        let ns = SignedDuration::from_nanos(1);
        let zero = SignedDuration::ZERO;
        let cases = [
            // (published, row_age, unchanged_for, expected)
            (None, zero, zero, None),
            (None, gap, gap, None),
            (None, gap + ns, zero, Some(UncertainReason::Stale)),
            (None, zero, gap + ns, Some(UncertainReason::Stale)),
            (
                Some(UncertainReason::SamplingGap),
                gap,
                zero,
                Some(UncertainReason::SamplingGap),
            ),
            (
                Some(UncertainReason::ClockStepForward),
                gap + ns,
                zero,
                Some(UncertainReason::Stale),
            ),
            (
                Some(UncertainReason::Recovering),
                zero,
                gap + ns,
                Some(UncertainReason::Stale),
            ),
            // A negative row age (clock stepped back since the publish).
            (None, -gap, zero, None),
        ];
        for (published, row_age, unchanged_for, expected) in cases {
            assert_eq!(
                judge_reading(published, row_age, unchanged_for, gap),
                expected,
                "{published:?} age {row_age} unchanged {unchanged_for}"
            );
        }
    }

    #[test]
    fn config_rejects_bad_values() {
        let one = SignedDuration::from_secs(1);
        assert_eq!(
            SafeTimeConfig::new(100_001, one, one * 5, one / 2, 1, one),
            Err(SafeTimeConfigError::DriftTooLarge {
                got: 100_001,
                max: DRIFT_PPM_MAX
            })
        );
        assert_eq!(
            SafeTimeConfig::new(50, one, one, one / 2, 1, one),
            Err(SafeTimeConfigError::IntervalNotBelowGap {
                interval: one,
                gap_max: one
            })
        );
        assert_eq!(
            SafeTimeConfig::new(50, one, one * 5, one / 2, 0, one),
            Err(SafeTimeConfigError::NoStableObservations)
        );
    }

    /// Every bound of `SafeTimeConfig::new`, exact: at a bound accepted,
    /// one nanosecond (one ppm, one observation) past it refused, with the
    /// value and the bound.
    #[test]
    fn config_boundaries_are_exact() {
        let one = SignedDuration::from_secs(1);
        let ns = SignedDuration::from_nanos(1);
        let zero = SignedDuration::ZERO;
        let hour = SignedDuration::from_hours(1);
        assert_eq!((GAP_MAX_MAX, RECOVERY_GRACE_MAX), (hour, hour));
        assert_eq!(STABLE_OBSERVATIONS_MAX, 10_000);
        type E = SafeTimeConfigError;
        let too_long = |name, got| {
            Err(E::TooLong {
                name,
                got,
                max: hour,
            })
        };
        let too_many = |got| {
            Err(E::TooManyStableObservations {
                got,
                max: STABLE_OBSERVATIONS_MAX,
            })
        };
        let non_positive = |name, got| Err(E::NonPositive { name, got });
        let huge = SignedDuration::from_secs(1_000_000_000_000);
        // (drift_ppm, interval, gap_max, round_trip_max, stable, recovery_grace, expected)
        let cases = [
            (DRIFT_PPM_MAX, one, one * 5, one / 2, 1, one, Ok(())),
            (
                DRIFT_PPM_MAX + 1,
                one,
                one * 5,
                one / 2,
                1,
                one,
                Err(E::DriftTooLarge {
                    got: DRIFT_PPM_MAX + 1,
                    max: DRIFT_PPM_MAX,
                }),
            ),
            (0, ns, ns * 3, ns, 1, zero, Ok(())),
            (
                0,
                zero,
                one * 5,
                one / 2,
                1,
                one,
                non_positive("interval", zero),
            ),
            (0, one, zero, one / 2, 1, one, non_positive("gap_max", zero)),
            (0, one, -one, one / 2, 1, one, non_positive("gap_max", -one)),
            (
                0,
                one,
                one * 5,
                zero,
                1,
                one,
                non_positive("round_trip_max", zero),
            ),
            (
                0,
                one,
                one * 5,
                one / 2,
                1,
                -ns,
                non_positive("recovery_grace", -ns),
            ),
            (0, one, hour, one / 2, 1, one, Ok(())),
            (
                0,
                one,
                hour + ns,
                one / 2,
                1,
                one,
                too_long("gap_max", hour + ns),
            ),
            (0, one, huge, one / 2, 1, one, too_long("gap_max", huge)),
            (0, one, one * 5, one / 2, 1, hour, Ok(())),
            (
                0,
                one,
                one * 5,
                one / 2,
                1,
                hour + ns,
                too_long("recovery_grace", hour + ns),
            ),
            (
                0,
                one,
                one * 5,
                one / 2,
                1,
                huge,
                too_long("recovery_grace", huge),
            ),
            (0, hour - ns, hour, hour - ns, 1, one, Ok(())),
            (
                0,
                one,
                hour,
                hour,
                1,
                one,
                Err(E::RoundTripNotBelowGap {
                    round_trip_max: hour,
                    gap_max: hour,
                }),
            ),
            (
                0,
                hour,
                hour,
                one,
                1,
                one,
                Err(E::IntervalNotBelowGap {
                    interval: hour,
                    gap_max: hour,
                }),
            ),
            (
                0,
                one,
                one * 5,
                one / 2,
                0,
                one,
                Err(E::NoStableObservations),
            ),
            (0, one, one * 5, one / 2, 10_000, one, Ok(())),
            (0, one, one * 5, one / 2, 10_001, one, too_many(10_001)),
            (0, one, one * 5, one / 2, u32::MAX, one, too_many(u32::MAX)),
        ];
        for (drift, interval, gap_max, round_trip_max, stable, grace, expected) in cases {
            assert_eq!(
                SafeTimeConfig::new(drift, interval, gap_max, round_trip_max, stable, grace)
                    .map(|_| ()),
                expected,
                "drift {drift} interval {interval} gap {gap_max} rtt {round_trip_max} \
                 stable {stable} grace {grace}"
            );
        }
        assert_eq!(
            too_long("gap_max", hour + ns).unwrap_err().to_string(),
            "gap_max must be at most PT1H, got PT1H0.000000001S"
        );
        assert_eq!(
            too_long("recovery_grace", huge).unwrap_err().to_string(),
            "recovery_grace must be at most PT1H, got PT277777777H46M40S"
        );
        assert_eq!(
            too_many(10_001).unwrap_err().to_string(),
            "stable_observations_min must be at most 10000, got 10001"
        );
    }
}
