//! The owner-sealed maximum-deadline horizon ([`HorizonPolicy`]) and its
//! digest.

use std::fmt;

use jiff::SignedDuration;

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
            .find(|b| b.longest.is_none_or(|longest| longest > horizon))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
