//! The open-file budget: every connection is a file descriptor, so the
//! connection bound must fit under the process's `RLIMIT_NOFILE` with what
//! the service holds besides connections.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use super::REFUSALS_LINGERING_MAX;

/// Descriptors the process holds besides its connections and what the
/// caller names (its database pool): the standard streams, the runtime's
/// poller and wakers, the signal pipe, the listener, short-lived start-up
/// connections and name lookups, with room to spare: 64 covers each of
/// them several times over.
pub const DESCRIPTOR_RESERVE: u64 = 64;

/// The descriptors a service with `connections_max` connections and
/// `descriptors_other` descriptors of its own (pool connections, files)
/// needs: those, [`REFUSALS_LINGERING_MAX`] refused connections being
/// closed, and [`DESCRIPTOR_RESERVE`].
pub fn descriptors_needed(connections_max: usize, descriptors_other: usize) -> u64 {
    let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    as_u64(connections_max)
        .saturating_add(as_u64(descriptors_other))
        .saturating_add(as_u64(REFUSALS_LINGERING_MAX))
        .saturating_add(DESCRIPTOR_RESERVE)
}

/// How the open-file limit was made to fit ([`fit_descriptor_limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorFit {
    /// The descriptors needed ([`descriptors_needed`]).
    pub needed: u64,
    /// The soft limit now in force; `None`: unlimited.
    pub soft_limit: Option<u64>,
    /// The soft limit before it was raised, when it was.
    pub raised_from: Option<u64>,
}

/// Why the connection bound does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    /// The hard limit is below what the bound needs; `connections_fit` is
    /// the largest bound that would fit (0: none).
    #[error(
        "connections_max {connections_max} needs {needed} open files (with {other} for the service itself), \
         but the hard limit on open files (RLIMIT_NOFILE) is {hard_limit}: raise it (ulimit -Hn, systemd \
         LimitNOFILE=) or set connections_max to at most {connections_fit}"
    )]
    HardLimitTooLow {
        /// The configured bound.
        connections_max: usize,
        /// The descriptors it needs.
        needed: u64,
        /// The descriptors needed besides connections.
        other: u64,
        /// The hard limit.
        hard_limit: u64,
        /// The largest bound that fits under the hard limit.
        connections_fit: u64,
    },
    /// The soft limit could not be raised to the hard limit.
    #[error(
        "connections_max {connections_max} needs {needed} open files, above the soft limit {soft_limit}, \
         which could not be raised: {message}"
    )]
    CannotRaise {
        /// The configured bound.
        connections_max: usize,
        /// The descriptors it needs.
        needed: u64,
        /// The soft limit.
        soft_limit: u64,
        /// The operating system's refusal.
        message: String,
    },
}

/// What to do about a limit ([`plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// The soft limit already fits.
    Fits,
    /// Raise the soft limit to this (at most the hard limit).
    Raise(u64),
    /// Even the hard limit is too low.
    TooLow {
        /// The hard limit.
        hard: u64,
    },
}

/// The plan for `needed` descriptors under `soft` and `hard` (`None`:
/// unlimited): keep a soft limit that fits, else raise it to `needed`
/// when the hard limit allows.
fn plan(needed: u64, soft: Option<u64>, hard: Option<u64>) -> Plan {
    match (soft, hard) {
        (None, _) => Plan::Fits,
        (Some(s), _) if s >= needed => Plan::Fits,
        (Some(_), Some(h)) if h < needed => Plan::TooLow { hard: h },
        (Some(_), _) => Plan::Raise(needed),
    }
}

/// Makes `connections_max` connections fit under the process's open-file
/// limit: reads `RLIMIT_NOFILE`, raises the soft limit (never the hard
/// one, which needs privileges) to what is needed ([`descriptors_needed`])
/// when it is lower, and refuses when even the hard limit is too low.
///
/// # Errors
/// [`DescriptorError::HardLimitTooLow`], naming the largest bound that
/// fits; [`DescriptorError::CannotRaise`] when the system refuses to raise
/// the soft limit.
pub fn fit_descriptor_limit(
    connections_max: usize,
    descriptors_other: usize,
) -> Result<DescriptorFit, DescriptorError> {
    let needed = descriptors_needed(connections_max, descriptors_other);
    let limit = getrlimit(Resource::Nofile);
    match plan(needed, limit.current, limit.maximum) {
        Plan::Fits => Ok(DescriptorFit {
            needed,
            soft_limit: limit.current,
            raised_from: None,
        }),
        Plan::TooLow { hard } => {
            let other = needed - u64::try_from(connections_max).unwrap_or(u64::MAX);
            Err(DescriptorError::HardLimitTooLow {
                connections_max,
                needed,
                other,
                hard_limit: hard,
                connections_fit: hard.saturating_sub(other),
            })
        }
        Plan::Raise(to) => {
            let soft = limit.current.unwrap_or(u64::MAX);
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current: Some(to),
                    maximum: limit.maximum,
                },
            )
            .map_err(|e| DescriptorError::CannotRaise {
                connections_max,
                needed,
                soft_limit: soft,
                message: e.to_string(),
            })?;
            Ok(DescriptorFit {
                needed,
                soft_limit: Some(to),
                raised_from: Some(soft),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        for (needed, soft, hard, expected) in [
            (600, Some(1024), Some(4096), Plan::Fits),
            (1024, Some(1024), Some(1024), Plan::Fits),
            (1025, Some(1024), Some(4096), Plan::Raise(1025)),
            (1025, Some(1024), None, Plan::Raise(1025)),
            (4096, Some(1024), Some(4096), Plan::Raise(4096)),
            (4097, Some(1024), Some(4096), Plan::TooLow { hard: 4096 }),
            (u64::MAX, None, None, Plan::Fits),
            (u64::MAX, Some(1024), None, Plan::Raise(u64::MAX)),
        ] {
            assert_eq!(
                plan(needed, soft, hard),
                expected,
                "{needed} {soft:?} {hard:?}"
            );
        }
    }

    #[test]
    fn needed_counts_every_part() {
        assert_eq!(
            descriptors_needed(512, 10),
            512 + 10 + u64::try_from(REFUSALS_LINGERING_MAX).expect("fits") + DESCRIPTOR_RESERVE
        );
        assert_eq!(descriptors_needed(usize::MAX, usize::MAX), u64::MAX);
    }

    /// The process's own limit: the default bound fits here (the soft
    /// limit is raised if it must be), and a bound beyond the hard limit is
    /// refused with the largest that fits.
    #[test]
    fn fits_under_this_process_limit() {
        let fit = fit_descriptor_limit(super::super::CONNECTIONS_MAX_DEFAULT, 10);
        let hard = getrlimit(Resource::Nofile).maximum;
        match (fit, hard) {
            (Ok(fit), _) => assert!(fit.soft_limit.is_none_or(|s| s >= fit.needed)),
            (Err(e), Some(h)) => assert!(h < descriptors_needed(512, 10), "{e}"),
            (Err(e), None) => panic!("unlimited hard limit refused: {e}"),
        }
        if let Some(h) = hard
            && let Ok(huge) = usize::try_from(h)
        {
            match fit_descriptor_limit(huge, 10) {
                Err(DescriptorError::HardLimitTooLow {
                    hard_limit,
                    connections_fit,
                    ..
                }) => {
                    assert_eq!(hard_limit, h);
                    assert_eq!(
                        descriptors_needed(usize::try_from(connections_fit).expect("fits"), 10),
                        h
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
