//! Little Compute's side of the installation's database: its migrations,
//! the grant policy its Reservations (Tollgate leases) are written under,
//! and the built-in `base` runtime.

use std::sync::Arc;

use clock::Clock;
use jiff::SignedDuration;
use lc_core::store::ControlStore;
use lc_core::{CutReading, Digest, OperationKey};
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

/// The operation key under which the appliance registers `base` (a replay
/// at every start returns the first registration).
const BASE_OPERATION_KEY: &str = "appliance-register-base-runtime";

/// Applies Little Compute's migration line at `owner_url`.
///
/// # Errors
/// [`ApplianceError::Database`].
pub async fn migrate(owner_url: &str) -> Result<(), ApplianceError> {
    lc_pg::migrate(owner_url)
        .await
        .map_err(|e| ApplianceError::db("applying Little Compute's migrations", e))?;
    super::say(format_args!(
        "Little Compute's schema is at version {}",
        lc_pg::LC_VERSION
    ));
    Ok(())
}

/// Registers the built-in `base` runtime (the host's `/usr`, read-only) on
/// a certain cut; idempotent. Returns how many tenants the database holds
/// (0 on a first start).
///
/// # Errors
/// [`ApplianceError::Database`].
pub async fn register_base(owner_url: &str, secret: &[u8]) -> Result<i64, ApplianceError> {
    let key = tollgate::CapabilityKey::new(secret)
        .map_err(|e| ApplianceError::Setup(format!("server secret: {e}")))?;
    let config = lc_pg::LcConfig {
        max_connections: 2,
        ..lc_pg::LcConfig::default()
    };
    let store = lc_pg::LcStore::connect(owner_url, grant_policy(), key, config)
        .await
        .map_err(|e| ApplianceError::db("opening the store", e))?;
    let clock = Arc::new(clock::safe_cut::SafeCutClock::new(
        store.pool().clone(),
        safetime::DEFAULT_GAP_MAX,
    ));
    let r = clock
        .read()
        .await
        .map_err(|e| ApplianceError::db("reading the cut", e))?;
    let at = CutReading {
        cut: r.now,
        certain: r.uncertain.is_none(),
        retry_after_s: 1,
    };
    let manifest = lc_core::manifest::Manifest::base();
    let digest = Digest(manifest.digest());
    let manifest_json: serde_json::Value = serde_json::from_slice(&manifest.canonical())
        .map_err(|e| ApplianceError::Setup(format!("the base manifest: {e}")))?;
    let op = OperationKey::new(BASE_OPERATION_KEY, Digest::of(&manifest.canonical()))
        .map_err(|e| ApplianceError::Setup(e.to_string()))?;
    let registered = store
        .register_runtime(&op, at, "base", digest, manifest_json)
        .await;
    let tenants = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM lc_tenants")
        .fetch_one(store.pool())
        .await;
    store.pool().close().await;
    let rt = registered.map_err(|e| ApplianceError::db("registering the base runtime", e))?;
    let tenants = tenants.map_err(|e| ApplianceError::sqlx("counting tenants", &e))?;
    super::say(format_args!(
        "runtime base = {} (the host's /usr, read-only)",
        rt.digest.to_hex()
    ));
    Ok(tenants)
}
