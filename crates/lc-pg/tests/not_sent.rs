//! A start failure releases a Lease only on the provider's signed proof
//! that the command never reached a supervisor (`not_sent`), against a real
//! PostgreSQL: without it `release_not_proven`, with a bad one
//! `evidence_rejected`, and either refusal writes nothing.

mod support;

use lc_core::evidence::{InstanceState, Statement};
use lc_core::{
    ControlStore, ExecState, Generation, LcError, LeaseState, ReconcileStore, SandboxLeaseId,
    TerminalReason,
};
use support::*;

fn not_sent(provider: &str, lease: SandboxLeaseId, generation: i64) -> Statement {
    Statement::NotSent {
        provider_id: provider.into(),
        lease_id: lease.0,
        generation,
    }
}

fn rejected(e: LcError) -> String {
    match e {
        LcError::EvidenceRejected { reason } => reason,
        other => panic!("expected evidence_rejected, got {other:?}"),
    }
}

#[tokio::test]
async fn a_start_failure_is_released_only_on_a_verified_not_sent_proof_of_its_own_generation() {
    let f = fixture(2).await;
    let at = certain(&f.clock).await;
    let e = f
        .store
        .admit_exec(&op("s", "s"), at, f.tenant, &req("small", &["true"]))
        .await
        .unwrap();
    let (lease, g) = (e.canonical.lease_id, Generation(1));
    let before = snapshot(&f.db.url).await;

    // No proof: a start failure alone never releases.
    let err = f
        .store
        .begin_release(lease, g, TerminalReason::StartFailed, at)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "release_not_proven");
    assert_eq!(err, LcError::ReleaseNotProven { exec_id: e.exec_id });

    // Bad proofs, each refused with its reason.
    let other = TestProvider::new("p2", 8);
    other.register(&f.store).await;
    let before = {
        // Registering p2 is the only write so far.
        let after = snapshot(&f.db.url).await;
        assert_ne!(after, before);
        after
    };
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (
            serde_json::json!({"payload": "x"}),
            "malformed_evidence: not a DSSE envelope",
        ),
        // Signed by another provider's key.
        (
            other.sign(not_sent("p1", lease, 1)),
            "wrong_key: the evidence is signed by key",
        ),
        // About another provider, lease or generation.
        (
            f.provider.sign(not_sent("p2", lease, 1)),
            "evidence_mismatch: the evidence is about not_sent of provider \"p2\"",
        ),
        (
            f.provider
                .sign(not_sent("p1", SandboxLeaseId(lease.0 + 1), 1)),
            "evidence_mismatch: the evidence is about not_sent of provider \"p1\" lease",
        ),
        (
            f.provider.sign(not_sent("p1", lease, 2)),
            "evidence_mismatch: the evidence is about not_sent of provider \"p1\"",
        ),
        // Signed by the right key about the right generation, but no
        // statement that the command was never sent.
        (
            f.provider.absence(lease, 1),
            "not_a_proof: the statement is absence, not not_sent: only the provider's not_sent proves the command never reached a supervisor",
        ),
        (
            f.provider.sign(Statement::Fence {
                provider_id: "p1".into(),
                lease_id: lease.0,
                generation: 5,
            }),
            "not_a_proof: the statement is fence, not not_sent: only the provider's not_sent proves the command never reached a supervisor",
        ),
        (
            f.provider.sign(Statement::Observation {
                provider_id: "p1".into(),
                lease_id: lease.0,
                generation: 1,
                state: InstanceState::Absent,
            }),
            "not_a_proof: the statement is observation, not not_sent: only the provider's not_sent proves the command never reached a supervisor",
        ),
    ];
    for (evidence, reason) in cases {
        let err = f
            .store
            .begin_release_not_sent(lease, g, &evidence, at)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "evidence_rejected");
        let got = rejected(err);
        assert!(
            got.starts_with(reason),
            "{got:?} does not start with {reason:?}"
        );
    }
    // A signature of another statement.
    let mut tampered = f.provider.sign(not_sent("p1", lease, 1));
    tampered["signatures"][0]["sig"] =
        f.provider.sign(not_sent("p1", lease, 2))["signatures"][0]["sig"].clone();
    assert_eq!(
        rejected(
            f.store
                .begin_release_not_sent(lease, g, &tampered, at)
                .await
                .unwrap_err()
        ),
        "bad_signature: the evidence signature does not verify"
    );
    // The wrong lease generation is fenced before any evidence is read.
    assert_eq!(
        f.store
            .begin_release_not_sent(
                lease,
                Generation(2),
                &f.provider.sign(not_sent("p1", lease, 2)),
                at
            )
            .await
            .unwrap_err()
            .code(),
        "fenced"
    );
    // Every refusal wrote nothing.
    assert_eq!(snapshot(&f.db.url).await, before);
    let rec = f.store.exec(f.tenant, e.exec_id).await.unwrap();
    assert_eq!(
        (rec.state, rec.lease_state, rec.terminal_reason),
        (ExecState::Admitted, Some(LeaseState::Allocating), None)
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (2, 1, 1, 0)
    );

    // The proof: allocating -> release_pending with start_failed; a replay
    // is the same and writes nothing more.
    let proof = f.provider.sign(not_sent("p1", lease, 1));
    let w = f
        .store
        .begin_release_not_sent(lease, g, &proof, at)
        .await
        .unwrap();
    assert_eq!(
        (w.state, w.terminal_reason),
        (
            LeaseState::ReleasePending,
            Some(TerminalReason::StartFailed)
        )
    );
    let pending = snapshot(&f.db.url).await;
    let again = f
        .store
        .begin_release_not_sent(lease, g, &proof, at)
        .await
        .unwrap();
    assert_eq!(again, w);
    assert_eq!(snapshot(&f.db.url).await, pending);
    // A bad proof stays refused on a release_pending lease.
    assert_eq!(
        f.store
            .begin_release_not_sent(lease, g, &f.provider.absence(lease, 1), at)
            .await
            .unwrap_err()
            .code(),
        "evidence_rejected"
    );
    assert_eq!(snapshot(&f.db.url).await, pending);

    // A not-sent proof is no destroy proof: the release needs the destroy's.
    let now = certain(&f.clock).await;
    assert_eq!(
        rejected(
            f.store
                .commit_release(lease, g, &proof, now)
                .await
                .unwrap_err()
        ),
        "not_a_proof: an not_sent does not prove the instance destroyed"
    );
    let out = f
        .store
        .commit_release(lease, g, &f.provider.absence(lease, 1), now)
        .await
        .unwrap();
    assert_eq!((out.units_returned, out.replay), (1, false));
    let done = f.store.exec(f.tenant, e.exec_id).await.unwrap();
    assert_eq!(
        (done.state, done.terminal_reason, done.exit_code),
        (ExecState::Terminal, Some(TerminalReason::StartFailed), None)
    );
    assert_eq!(
        balances(&f.store.tenant(f.tenant).await.unwrap()),
        (2, 2, 0, 0)
    );
    // A released lease takes no proof any more.
    assert_eq!(
        f.store
            .begin_release_not_sent(lease, g, &proof, now)
            .await
            .unwrap_err(),
        LcError::IllegalTransition {
            what: "lease",
            from: "released",
            to: "release_pending"
        }
    );
    assert_audit_clean(&f.store).await;
    f.sampler.stop().await;
}
