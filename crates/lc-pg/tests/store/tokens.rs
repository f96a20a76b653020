//! Scoped tokens in the store: mint, list, revoke and replay with exact
//! records; acceptance to the nanosecond before the Scope deadline, never
//! on an uncertain cut nor after a revocation; refusals that write
//! nothing; the database's guards on the table.

use jiff::SignedDuration;
use lc_core::token::{MintedToken, Operation, TokenId, TokenRecord, TokenScope};
use lc_core::{ControlStore, CutReading, Digest, ExecId, LcError};
use sqlx::{Connection, PgConnection};

use crate::support::*;

const NS: SignedDuration = SignedDuration::from_nanos(1);

fn scope(exec: Option<ExecId>, ops: &[Operation]) -> TokenScope {
    TokenScope::new(exec, ops).unwrap()
}

fn secret(n: u8) -> Digest {
    Digest::of(format!("lct_test_secret_{n}").as_bytes())
}

#[tokio::test]
async fn tokens_are_minted_listed_revoked_and_replayed_exactly() {
    let f = fixture(2).await;
    let at = certain(&f.clock).await;
    let exec = f
        .store
        .admit_exec(&op("e", "e"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    let read_cancel = scope(None, &[Operation::ExecCancel, Operation::ExecRead]);
    let m = f
        .store
        .mint_token(
            &op("k1", "read+cancel"),
            at,
            f.tenant,
            read_cancel,
            60_000,
            secret(1),
        )
        .await
        .unwrap();
    let first = TokenRecord {
        token_id: m.token.token_id,
        tenant_id: f.tenant,
        exec_id: None,
        operations: vec!["exec.read".into(), "exec.cancel".into()],
        minted_cut: at.cut,
        deadline: at.cut + SignedDuration::from_secs(60),
        revoked_cut: None,
    };
    assert_eq!(
        m,
        MintedToken {
            token: first.clone(),
            replay: false
        }
    );
    // A replay of the key answers the same record and writes nothing.
    let before = snapshot(&f.db.url).await;
    let later = certain(&f.clock).await;
    let again = f
        .store
        .mint_token(
            &op("k1", "read+cancel"),
            later,
            f.tenant,
            read_cancel,
            60_000,
            secret(2),
        )
        .await
        .unwrap();
    assert_eq!(
        again,
        MintedToken {
            token: first.clone(),
            replay: true
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    // The key with another request: a conflict, nothing written.
    assert_eq!(
        f.store
            .mint_token(
                &op("k1", "other"),
                later,
                f.tenant,
                read_cancel,
                60_000,
                secret(2)
            )
            .await
            .unwrap_err(),
        LcError::IdempotencyConflict { key: "k1".into() }
    );
    assert_eq!(snapshot(&f.db.url).await, before);

    // Bound to the tenant's exec.
    let bound = f
        .store
        .mint_token(
            &op("k2", "bound"),
            later,
            f.tenant,
            scope(
                Some(exec.exec_id),
                &[Operation::WorkspaceRead, Operation::ExecRead],
            ),
            1,
            secret(3),
        )
        .await
        .unwrap()
        .token;
    assert_eq!(
        (bound.exec_id, bound.operations.clone(), bound.deadline),
        (
            Some(exec.exec_id),
            vec!["exec.read".to_string(), "workspace.read".to_string()],
            later.cut + SignedDuration::from_millis(1)
        )
    );
    assert_eq!(bound.token_id, TokenId(first.token_id.0 + 1));

    // Refusals write nothing: a missing exec, another tenant's exec, a TTL
    // out of bounds, a missing tenant.
    let green = f
        .store
        .create_tenant(
            &op("t-green", "green"),
            later,
            "green",
            Some(1),
            &api_key_of,
        )
        .await
        .unwrap()
        .tenant_id;
    let theirs = f
        .store
        .admit_exec(&op("g", "g"), later, green, &req("small", &["true"]))
        .await
        .unwrap();
    let before = snapshot(&f.db.url).await;
    let read = [Operation::ExecRead];
    for (exec, ttl_ms, tenant, want) in [
        (Some(ExecId(9_999)), 1_000, f.tenant, "not_found"),
        (Some(theirs.exec_id), 1_000, f.tenant, "not_found"),
        (None, 0, f.tenant, "invalid_timeout"),
        (None, 30 * 86_400_000 + 1, f.tenant, "invalid_timeout"),
        (None, 1_000, lc_core::TenantId(9_999), "not_found"),
    ] {
        let e = f
            .store
            .mint_token(
                &op("bad", "bad"),
                later,
                tenant,
                scope(exec, &read),
                ttl_ms,
                secret(4),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), want, "{exec:?} {ttl_ms} {tenant:?}: {e}");
    }
    assert_eq!(
        f.store
            .mint_token(
                &op("bad", "bad"),
                later,
                f.tenant,
                scope(Some(theirs.exec_id), &read),
                1_000,
                secret(4)
            )
            .await
            .unwrap_err(),
        LcError::not_found("exec", theirs.exec_id)
    );
    // The longest TTL is accepted.
    assert_eq!(snapshot(&f.db.url).await, before);
    let longest = f
        .store
        .mint_token(
            &op("k3", "longest"),
            later,
            f.tenant,
            scope(None, &read),
            30 * 86_400_000,
            secret(5),
        )
        .await
        .unwrap()
        .token;
    assert_eq!(
        longest.deadline,
        later.cut + SignedDuration::from_hours(720)
    );

    // Listed by id, without other tenants' tokens.
    let all = f.store.tokens(f.tenant, None, 10).await.unwrap();
    assert_eq!(
        all.iter().map(|t| t.token_id).collect::<Vec<_>>(),
        [first.token_id, bound.token_id, longest.token_id]
    );
    assert_eq!(all[0], first);
    assert_eq!(
        f.store
            .tokens(f.tenant, Some(first.token_id), 1)
            .await
            .unwrap(),
        std::slice::from_ref(&bound)
    );
    assert_eq!(f.store.tokens(green, None, 10).await.unwrap(), []);
    assert_eq!(
        f.store.tokens(f.tenant, None, 0).await.unwrap_err().code(),
        "invalid_limit"
    );

    // Accepted by its secret's digest; an unknown digest is no token.
    let now = certain(&f.clock).await;
    assert_eq!(
        f.store.accept_token(secret(1), now).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(f.store.accept_token(secret(2), now).await.unwrap(), None);

    // Revoked once; again answers the same record; another tenant's token
    // and a missing one are not found; nothing else changes.
    let revoked = f
        .store
        .revoke_token(now, f.tenant, first.token_id)
        .await
        .unwrap();
    assert_eq!(
        revoked,
        TokenRecord {
            revoked_cut: Some(now.cut),
            ..first.clone()
        }
    );
    let before = snapshot(&f.db.url).await;
    let after = certain(&f.clock).await;
    assert_eq!(
        f.store
            .revoke_token(after, f.tenant, first.token_id)
            .await
            .unwrap(),
        revoked
    );
    for (tenant, id) in [(green, first.token_id), (f.tenant, TokenId(9_999))] {
        assert_eq!(
            f.store.revoke_token(after, tenant, id).await.unwrap_err(),
            LcError::not_found("token", id)
        );
    }
    assert_eq!(snapshot(&f.db.url).await, before);
    // A revoked token is refused whatever the cut, and a replay of its
    // mint key shows it revoked: nothing brings it back.
    for at in [after, CutReading::uncertain(after.cut, 2)] {
        assert_eq!(
            f.store.accept_token(secret(1), at).await.unwrap_err(),
            LcError::TokenRevoked {
                token_id: first.token_id
            }
        );
    }
    assert_eq!(
        f.store
            .mint_token(
                &op("k1", "read+cancel"),
                after,
                f.tenant,
                read_cancel,
                60_000,
                secret(6)
            )
            .await
            .unwrap(),
        MintedToken {
            token: revoked,
            replay: true
        }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    f.sampler.stop().await;
}

#[tokio::test]
async fn a_token_is_accepted_until_one_nanosecond_before_its_deadline_and_never_while_uncertain() {
    let f = fixture(0).await;
    let at = certain(&f.clock).await;
    let read = scope(None, &[Operation::ExecRead]);
    // Nothing is minted on an uncertain cut.
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .mint_token(
                &op("u", "u"),
                CutReading::uncertain(at.cut, 3),
                f.tenant,
                read,
                5,
                secret(1)
            )
            .await
            .unwrap_err(),
        LcError::TimeUncertain { retry_after_s: 3 }
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    let t = f
        .store
        .mint_token(&op("u", "u"), at, f.tenant, read, 5, secret(1))
        .await
        .unwrap()
        .token;
    let deadline = at.cut + SignedDuration::from_millis(5);
    assert_eq!(t.deadline, deadline);
    // Wait until the persisted cut passed the deadline, so readings at
    // and before it are not ahead of it.
    let past = wait_reading(&f.clock, 10, "a certain cut past the deadline", |r| {
        r.certain && r.cut > deadline
    })
    .await;
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        f.store
            .accept_token(secret(1), CutReading::certain(deadline - NS))
            .await
            .unwrap(),
        Some(t.clone())
    );
    let expired = LcError::TokenExpired {
        token_id: t.token_id,
        deadline,
    };
    for at in [CutReading::certain(deadline), past] {
        assert_eq!(
            f.store.accept_token(secret(1), at).await.unwrap_err(),
            expired
        );
    }
    // Uncertain: refused, however early the cut reads.
    for cut in [deadline - NS, at.cut] {
        assert_eq!(
            f.store
                .accept_token(secret(1), CutReading::uncertain(cut, 4))
                .await
                .unwrap_err(),
            LcError::TimeUncertain { retry_after_s: 4 }
        );
    }
    // No caller invents time: a reading ahead of the persisted cut.
    let ahead = past.cut + SignedDuration::from_hours(1);
    assert_eq!(
        f.store
            .accept_token(secret(1), CutReading::certain(ahead))
            .await
            .unwrap_err()
            .code(),
        "invalid_cut_reading"
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    f.sampler.stop().await;
}

#[tokio::test]
async fn the_database_keeps_token_deadlines_within_the_horizon_and_changes_a_token_only_by_its_revocation()
 {
    let f = fixture(0).await;
    let at = certain(&f.clock).await;
    let t = f
        .store
        .mint_token(
            &op("d", "d"),
            at,
            f.tenant,
            scope(None, &[Operation::ExecRead]),
            1_000,
            secret(1),
        )
        .await
        .unwrap()
        .token;
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    // A deadline 3651 days after the cut (the horizon is 3650).
    let err = sqlx::query(
        "INSERT INTO lc_tokens (tenant_id, secret_sha256, operations, minted_floor_us, \
             minted_submicro_ns, deadline_floor_us, deadline_submicro_ns) \
         SELECT $1, $2, ARRAY['exec.read'], s.cut_floor_us, 0, \
                s.cut_floor_us + 3651::bigint * 86400 * 1000000, 0 FROM tollgate_safetime s",
    )
    .bind(f.tenant.0)
    .bind(&secret(2).0[..])
    .execute(&mut c)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("LCS01")
    );
    for sql in [
        "UPDATE lc_tokens SET deadline_floor_us = deadline_floor_us + 1 WHERE token_id = $1",
        "UPDATE lc_tokens SET operations = ARRAY['exec.read', 'exec.create'] WHERE token_id = $1",
        "UPDATE lc_tokens SET tenant_id = tenant_id WHERE token_id = $1",
    ] {
        let err = sqlx::query(sql)
            .bind(t.token_id.0)
            .execute(&mut c)
            .await
            .unwrap_err();
        assert_eq!(
            err.as_database_error().unwrap().code().as_deref(),
            Some("LCS70"),
            "{sql}"
        );
    }
    f.store
        .revoke_token(at, f.tenant, t.token_id)
        .await
        .unwrap();
    let err = sqlx::query(
        "UPDATE lc_tokens SET revoked_floor_us = NULL, revoked_submicro_ns = NULL WHERE token_id = $1",
    )
    .bind(t.token_id.0)
    .execute(&mut c)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("LCS70")
    );
    // Only the vocabulary's operations are stored, whoever writes them.
    let err = sqlx::query(
        "INSERT INTO lc_tokens (tenant_id, secret_sha256, exec_id, operations, minted_floor_us, \
             minted_submicro_ns, deadline_floor_us, deadline_submicro_ns) \
         SELECT $1, $2, NULL, ARRAY['exec.write'], s.cut_floor_us, 0, s.cut_floor_us + 1, 0 \
           FROM tollgate_safetime s",
    )
    .bind(f.tenant.0)
    .bind(&secret(3).0[..])
    .execute(&mut c)
    .await
    .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().code().as_deref(),
        Some("23514")
    );
    f.sampler.stop().await;
}
