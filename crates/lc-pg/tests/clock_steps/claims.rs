//! Workers' claims across a clock step or a paused sampler.
//!
//! [`while_uncertain`], at the scenario's first uncertain reading `u`:
//! worker A claims both unreleased Leases at the last certain cut the
//! scenario admitted on (a 1 s claim TTL, no grace, on a second store of
//! its own); then, on `u`, worker B takes nothing (not A's claims, which
//! database time has passed), A's renewal is exactly
//! `max(current, cut + ttl)` and an earlier uncertain cut does not shorten
//! it, and nothing else is written.
//!
//! [`once_certain`], at the first certain reading after the fault: B does
//! not take A's claims at their expiry - 1 ns, takes them (generation 2)
//! at the expiry once a certain cut has reached it, and A's write under
//! its old claim is refused `claim_stale` with nothing changed.

use jiff::SignedDuration;
use lc_core::claim::{ClaimCredential, ClaimGeneration, ClaimHolder, ClaimItem, ClaimKind};
use lc_core::owner::TakeoverBasis;
use lc_core::{ControlStore, CutReading, LcError, ReconcileStore};
use lc_pg::{LcConfig, LcStore};

use super::{Execs, Fixture, G1};
use crate::support::{config, snapshot, store_on, wait_reading};

const TTL: SignedDuration = SignedDuration::from_secs(1);
const A: ClaimHolder = ClaimHolder::from_bytes([0xa1; 16]);
const B: ClaimHolder = ClaimHolder::from_bytes([0xb2; 16]);

/// A store on the scenario's database whose claims have the shortest TTL
/// and no grace.
async fn claims_store(f: &Fixture) -> LcStore {
    store_on(
        &f.db,
        LcConfig {
            claim_ttl: TTL,
            claim_grace: SignedDuration::ZERO,
            ..config()
        },
    )
    .await
}

/// `(lease id, generation, expiry)` of what a claim call returned for
/// the leases `only` (the scenario's two: other probes of the scenario
/// hold Leases of their own), sorted by lease id.
fn won(
    w: &[lc_core::claim::ClaimedWork],
    only: &[i64],
) -> Vec<(i64, ClaimGeneration, jiff::Timestamp)> {
    let mut got: Vec<_> = w
        .iter()
        .filter(|c| only.contains(&c.work.lease_id.0))
        .map(|c| (c.work.lease_id.0, c.claim.generation, c.expiry))
        .collect();
    got.sort();
    got
}

/// See the module docs.
pub(super) async fn while_uncertain(f: &Fixture, x: &Execs, u: CutReading) {
    assert!(!u.certain);
    let s = claims_store(f).await;
    let (running, releasing) = (
        x.running.canonical.lease_id.0,
        x.releasing.canonical.lease_id.0,
    );
    let base = CutReading::certain(x.running.admitted_cut);
    let mut leases = [running, releasing];
    leases.sort();
    let taken = s.claim_due_work(&A, base, 10).await.unwrap();
    let got = won(&taken, &leases);
    assert_eq!(got, leases.map(|l| (l, ClaimGeneration(1), base.cut + TTL)));
    // Uncertain: B takes nothing.
    let before = snapshot(&f.db.url).await;
    assert_eq!(s.claim_due_work(&B, u, 10).await.unwrap(), vec![]);
    assert_eq!(snapshot(&f.db.url).await, before);
    // A's renewal on u: max(current, cut + ttl), exactly.
    assert!(u.cut >= base.cut);
    let got = won(&s.claim_due_work(&A, u, 10).await.unwrap(), &leases);
    assert_eq!(got, leases.map(|l| (l, ClaimGeneration(1), u.cut + TTL)));
    // An earlier uncertain cut keeps it.
    let earlier = CutReading { cut: base.cut, ..u };
    let got = won(&s.claim_due_work(&A, earlier, 10).await.unwrap(), &leases);
    assert_eq!(got, leases.map(|l| (l, ClaimGeneration(1), u.cut + TTL)));
    s.pool().close().await;
}

/// See the module docs.
pub(super) async fn once_certain(f: &Fixture, x: &Execs, c: CutReading) {
    assert!(c.certain);
    let s = claims_store(f).await;
    let mut leases = [
        x.running.canonical.lease_id.0,
        x.releasing.canonical.lease_id.0,
    ];
    leases.sort();
    let mine = |l: &lc_core::claim::ClaimRecord| leases.contains(&l.claim.item.id);
    let listed: Vec<_> = s
        .claims(c, None, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(mine)
        .collect();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|r| r.claim.holder_sha256 == A.sha256()));
    let expiry = listed[0].claim.expiry;
    assert!(listed.iter().all(|r| r.claim.expiry == expiry));
    let reached = wait_reading(&f.clock, 30, "a certain cut at the claims' expiry", |r| {
        r.certain && r.cut >= expiry
    })
    .await;
    // One nanosecond before: still A's.
    let just_before = CutReading::certain(expiry - SignedDuration::from_nanos(1));
    assert_eq!(s.claim_due_work(&B, just_before, 10).await.unwrap(), vec![]);
    // At the expiry on a certain cut: B's, generation 2.
    let at = CutReading::certain(expiry);
    let got = won(&s.claim_due_work(&B, at, 10).await.unwrap(), &leases);
    assert_eq!(got, leases.map(|l| (l, ClaimGeneration(2), expiry + TTL)));
    let listed: Vec<_> = s
        .claims(reached, None, 10)
        .await
        .unwrap()
        .into_iter()
        .filter(mine)
        .collect();
    assert!(
        listed
            .iter()
            .all(|r| (r.claim.holder_sha256, r.claim.basis) == (B.sha256(), TakeoverBasis::Expired))
    );
    // A's write under its old claim: refused, nothing changed.
    let running = x.running.canonical.lease_id;
    let old = ClaimCredential {
        item: ClaimItem {
            kind: ClaimKind::Lease,
            id: running.0,
        },
        holder: A,
        generation: ClaimGeneration(1),
    };
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        s.claimed(old).renew(running, G1, at).await.unwrap_err(),
        LcError::ClaimStale {
            item: format!("lease {}", running.0),
            presented: ClaimGeneration(1),
            current: Some(ClaimGeneration(2)),
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    s.pool().close().await;
}
