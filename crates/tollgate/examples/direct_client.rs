//! A direct-store client: acquire, renew and release with nanosecond TTLs
//! against the in-memory store. Run with
//! `cargo run -p tollgate --example direct_client`.

use jiff::{SignedDuration, Timestamp};
use tollgate::{AcquireRequest, Allocator, CapabilityKey, GrantPolicy, MemoryStore, NewAccount};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Leases last at most 60 s; a lease becomes reclaimable 1.5 s + 1 ns
    // after its expiry.
    let policy = GrantPolicy::new(
        SignedDuration::from_secs(60),
        SignedDuration::new(1, 500_000_001),
    )?;
    let store = MemoryStore::new(policy, CapabilityKey::generate()?)?;

    // Time is supplied by the caller; here a fixed instant with nanoseconds.
    let now: Timestamp = "2026-11-29T12:00:00.123456789Z".parse()?;
    let account = store
        .create_account(NewAccount {
            name: "render-farm".into(),
            api_key_sha256: None,
        })
        .await?;
    store.deposit(account.account_id, 1_000, now).await?;

    let grant = store
        .acquire(
            AcquireRequest {
                account_id: account.account_id,
                units: 250,
                ttl: SignedDuration::new(30, 1), // 30.000000001 s
                idempotency_key: Some("job-42".into()),
            },
            now.into(),
        )
        .await?;
    println!(
        "lease {} fence {} expires {}",
        grant.lease_id, grant.fence, grant.expiry
    );
    assert_eq!(grant.expiry.to_string(), "2026-11-29T12:00:30.12345679Z");

    let later = now.checked_add(SignedDuration::from_secs(20))?;
    let renewal = store
        .renew(
            grant.lease_id,
            &grant.capability,
            SignedDuration::new(45, 999),
            later.into(),
        )
        .await?;
    println!(
        "renewed: fence {} expires {}",
        renewal.lease.fence, renewal.lease.expiry
    );

    let settlement = store
        .release(grant.lease_id, &grant.capability, later, Some(100))
        .await?;
    println!(
        "released: consumed {} returned {}; available now {}",
        settlement.consumed, settlement.returned, settlement.balances.available
    );
    assert_eq!(settlement.balances.available, 900);
    Ok(())
}
