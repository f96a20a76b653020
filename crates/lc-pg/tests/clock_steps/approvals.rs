//! Approvals across a clock step or a paused sampler, on a tenant of their
//! own (its units apart from the scenario's): while the cut is uncertain
//! no approval is decided and no approved exec starts, and nothing is
//! written; once it is certain, an approval whose `valid_until` database
//! time passed (a forward step) but the cut did not is still valid, and a
//! decision goes through.

use std::sync::atomic::{AtomicBool, Ordering};

use jiff::{SignedDuration, Timestamp};
use lc_core::approval::{
    ApprovalDecision, ApprovalPolicy, ApprovalRequire, ApprovalStart, ApproverKind,
    check_approval_start,
};
use lc_core::{
    ControlStore, CutReading, ExecId, ExecRecord, ExecState, Generation, LcError, LeaseAction,
    LeaseState, ReconcileStore, TenantId, TerminalReason,
};
use sqlx::{Connection, PgConnection};

use super::Fixture;
use super::support::{api_key_of, op, snapshot};

/// The validity of the approval decided before the fault: 60 s on the
/// cut, less than the forward step's 120 s of database time.
const VALIDITY_MS: u64 = 60_000;

/// The approvals of one scenario.
pub struct Steps {
    tenant: TenantId,
    /// Awaiting approval through the fault.
    awaiting: ExecId,
    /// Approved at the last certain reading before the fault, not started.
    approved: ExecRecord,
    valid_until: Timestamp,
    /// Whether database time was seen at or past `valid_until` while the
    /// cut was uncertain.
    db_passed: AtomicBool,
}

impl Steps {
    /// Whether database time passed the approval's `valid_until` during
    /// the fault.
    pub fn db_passed(&self) -> bool {
        self.db_passed.load(Ordering::SeqCst)
    }
}

/// Database time (`now()`, the faked wall clock), to the microsecond.
async fn db_now(url: &str) -> Timestamp {
    let mut c = PgConnection::connect(url).await.unwrap();
    let us: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM now()) * 1000000)::bigint")
        .fetch_one(&mut c)
        .await
        .unwrap();
    Timestamp::from_microsecond(us).unwrap()
}

/// At `pre`, the last certain reading before the fault: a tenant whose
/// every exec needs an approval, one exec awaiting and one approved for
/// [`VALIDITY_MS`].
pub async fn before_fault(f: &Fixture, pre: CutReading) -> Steps {
    let tenant = f
        .store
        .create_tenant(&op("ap-t", "ap-t"), pre, "approvals", Some(2), &api_key_of)
        .await
        .unwrap()
        .tenant_id;
    let all = ApprovalPolicy::new(ApprovalRequire::All, &[]).unwrap();
    f.store
        .set_approval_policy(&op("ap-p", "ap-p"), pre, tenant, &all)
        .await
        .unwrap();
    let admit = |key: &'static str| {
        let r = super::req("small", &["true"]);
        async move {
            f.store
                .admit_exec(&op(key, key), pre, tenant, &r)
                .await
                .unwrap()
        }
    };
    let awaiting = admit("ap-a").await;
    let approved = admit("ap-b").await;
    assert_eq!(awaiting.state, ExecState::AwaitingApproval);
    let approved = f
        .store
        .approve(
            &op("ap-ok", "ap-ok"),
            pre,
            tenant,
            approved.exec_id,
            ApproverKind::Tenant,
            Some(VALIDITY_MS),
        )
        .await
        .unwrap();
    let valid_until = pre.cut + SignedDuration::from_millis(VALIDITY_MS as i64);
    assert_eq!(
        approved.approval.as_ref().and_then(|a| a.valid_until),
        Some(valid_until)
    );
    Steps {
        tenant,
        awaiting: awaiting.exec_id,
        approved,
        valid_until,
        db_passed: AtomicBool::new(false),
    }
}

/// While `u` is uncertain: no decision (approve and deny refused
/// `time_uncertain`), no start (the approved exec's unstarted Lease is not
/// planned, its `approval_expired` release refused), nothing written.
pub async fn while_uncertain(f: &Fixture, s: &Steps, u: CutReading) {
    assert!(!u.certain);
    let before = snapshot(&f.db.url).await;
    let uncertain = LcError::TimeUncertain {
        retry_after_s: u.retry_after_s.max(1),
    };
    assert_eq!(
        f.store
            .approve(
                &op("ap-u", "ap-u"),
                u,
                s.tenant,
                s.awaiting,
                ApproverKind::Admin,
                None
            )
            .await
            .unwrap_err(),
        uncertain
    );
    assert_eq!(
        f.store
            .deny(
                &op("ap-d", "ap-d"),
                u,
                s.tenant,
                s.awaiting,
                ApproverKind::Admin,
                None
            )
            .await
            .unwrap_err(),
        uncertain
    );
    let lease = s.approved.canonical.lease_id;
    let work = f.store.due_work(u, 100).await.unwrap();
    assert!(!work.iter().any(|w| w.lease_id == lease), "{work:?}");
    assert_eq!(check_approval_start(s.valid_until, u), ApprovalStart::Wait);
    assert_eq!(
        f.store
            .begin_release(lease, Generation(1), TerminalReason::ApprovalExpired, u)
            .await
            .unwrap_err()
            .code(),
        "time_uncertain"
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    if db_now(&f.db.url).await >= s.valid_until {
        s.db_passed.store(true, Ordering::SeqCst);
    }
    let t = f.store.tenant(s.tenant).await.unwrap();
    assert_eq!((t.available, t.held), (1, 1));
}

/// Once `c` is certain: the approval is still valid while the cut is
/// below `valid_until` (whatever database time did), so its Lease is
/// allocated; the awaiting exec is approved on `c`.
pub async fn once_certain(f: &Fixture, s: &Steps, c: CutReading) {
    assert!(c.certain);
    let lease = s.approved.canonical.lease_id;
    let w = f
        .store
        .due_work(c, 100)
        .await
        .unwrap()
        .into_iter()
        .find(|w| w.lease_id == lease)
        .expect("the approved exec's Lease is planned on a certain cut");
    if c.cut < s.valid_until {
        // Still valid: allocated, unless its Lease's own (shorter) expiry
        // passed on the cut meanwhile, which releases it as any Lease.
        let want = if c.cut >= w.expiry {
            LeaseAction::BeginRelease(TerminalReason::Expired)
        } else {
            LeaseAction::Allocate
        };
        assert_eq!(w.action, want);
        assert_eq!(
            f.store
                .begin_release(lease, Generation(1), TerminalReason::ApprovalExpired, c)
                .await
                .unwrap_err()
                .code(),
            "illegal_transition"
        );
    } else {
        assert_eq!(
            w.action,
            LeaseAction::BeginRelease(TerminalReason::ApprovalExpired)
        );
    }
    let ok = f
        .store
        .approve(
            &op("ap-c", "ap-c"),
            c,
            s.tenant,
            s.awaiting,
            ApproverKind::Admin,
            None,
        )
        .await
        .unwrap();
    let a = ok.approval.unwrap();
    assert_eq!(
        (
            ok.state,
            ok.lease_state,
            a.decision,
            a.decided_cut,
            a.valid_until
        ),
        (
            ExecState::Admitted,
            Some(LeaseState::Allocating),
            ApprovalDecision::Approved,
            c.cut,
            Some(c.cut + f.store.config().approval_validity)
        )
    );
    let t = f.store.tenant(s.tenant).await.unwrap();
    assert_eq!((t.available, t.held), (0, 2));
}
