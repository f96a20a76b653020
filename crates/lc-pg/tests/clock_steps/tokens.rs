//! Scoped tokens across the clock-step scenarios: a token minted on a
//! certain cut before the fault whose deadline database time passes
//! during a forward step is refused `time_uncertain` while the cut is
//! uncertain (never `token_expired`: no certain cut passed its deadline),
//! and accepted again once a certain cut returns below its deadline; no
//! token is minted while uncertain and the refusal writes nothing; a
//! revocation takes effect on an uncertain cut and nothing brings the
//! token back, not a certain cut nor a replay of its mint key.

use jiff::SignedDuration;
use lc_core::token::{Operation, TokenRecord, TokenScope};
use lc_core::{ControlStore, CutReading, Digest, LcError, TenantId};
use lc_pg::LcStore;

use super::support::{op, snapshot};

/// The TTL of the live token: shorter than the forward step (120 s), so
/// database time passes its deadline while the cut does not.
const LIVE_TTL_MS: u64 = 60_000;

/// The tokens a scenario carries through its fault.
pub struct Tokens {
    live: TokenRecord,
    revoked: TokenRecord,
}

fn secret(n: &str) -> Digest {
    Digest::of(format!("lct_clock_steps_{n}").as_bytes())
}

fn read_scope() -> TokenScope {
    TokenScope::new(None, &[Operation::ExecRead]).unwrap()
}

/// Mints the two tokens at the certain reading `at`.
pub async fn start(store: &LcStore, tenant: TenantId, at: CutReading) -> Tokens {
    assert!(at.certain);
    let mut minted = Vec::new();
    for name in ["live", "revoked"] {
        let t = store
            .mint_token(
                &op(name, name),
                at,
                tenant,
                read_scope(),
                LIVE_TTL_MS,
                secret(name),
            )
            .await
            .unwrap()
            .token;
        assert_eq!(
            (t.minted_cut, t.deadline),
            (at.cut, at.cut + SignedDuration::from_millis(60_000))
        );
        minted.push(t);
    }
    let revoked = minted.pop().unwrap();
    let live = minted.pop().unwrap();
    Tokens { live, revoked }
}

/// At `u`, a fresh uncertain reading: the live token is refused
/// `time_uncertain` (even though database time may be past its
/// deadline), a mint is refused and writes nothing; a revocation commits.
pub async fn while_uncertain(
    store: &LcStore,
    url: &str,
    t: &Tokens,
    u: CutReading,
    retry_after_s: u64,
) {
    assert!(!u.certain);
    let refused = LcError::TimeUncertain { retry_after_s };
    let before = snapshot(url).await;
    assert_eq!(
        store.accept_token(secret("live"), u).await.unwrap_err(),
        refused
    );
    assert_eq!(
        store
            .mint_token(
                &op("late-token", "late"),
                u,
                t.live.tenant_id,
                read_scope(),
                1_000,
                secret("late")
            )
            .await
            .unwrap_err(),
        refused
    );
    assert_eq!(snapshot(url).await, before);
    let r = store
        .revoke_token(u, t.revoked.tenant_id, t.revoked.token_id)
        .await
        .unwrap();
    assert_eq!(r.revoked_cut, Some(u.cut));
    assert_eq!(
        store.accept_token(secret("revoked"), u).await.unwrap_err(),
        LcError::TokenRevoked {
            token_id: t.revoked.token_id
        }
    );
}

/// At `c`, certain again (below the live token's deadline): the live
/// token is accepted, the revoked one stays refused (a replay of its mint
/// key shows it revoked), and the refused mint goes through under its key
/// with its deadline at exactly `c.cut + 1 s`.
pub async fn once_certain(store: &LcStore, t: &Tokens, c: CutReading) {
    assert!(c.certain);
    assert!(c.cut < t.live.deadline, "{} >= {}", c.cut, t.live.deadline);
    assert_eq!(
        store.accept_token(secret("live"), c).await.unwrap(),
        Some(t.live.clone())
    );
    assert_eq!(
        store.accept_token(secret("revoked"), c).await.unwrap_err(),
        LcError::TokenRevoked {
            token_id: t.revoked.token_id
        }
    );
    let replay = store
        .mint_token(
            &op("revoked", "revoked"),
            c,
            t.revoked.tenant_id,
            read_scope(),
            LIVE_TTL_MS,
            secret("x"),
        )
        .await
        .unwrap();
    assert!(replay.replay && replay.token.revoked_cut.is_some());
    let late = store
        .mint_token(
            &op("late-token", "late"),
            c,
            t.live.tenant_id,
            read_scope(),
            1_000,
            secret("late"),
        )
        .await
        .unwrap()
        .token;
    assert_eq!(
        (late.minted_cut, late.deadline),
        (c.cut, c.cut + SignedDuration::from_secs(1))
    );
}
