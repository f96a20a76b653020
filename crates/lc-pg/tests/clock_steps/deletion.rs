//! Deletion grace across clock steps and a paused sampler: a terminal
//! exec's workspace is deleted on the last certain cut with a short grace;
//! while the cut is uncertain nothing purges it (the purge step and a raw
//! SQL purge are both refused, the latter LCS90), even once database time
//! has passed its purge_after; once a certain cut passes purge_after it is
//! purged exactly once, two purgers racing included.

use lc_core::deletion::{DeletedItem, DeletionRecord, PurgeReport};

use super::*;

/// The grace of a deletion in a scenario whose fault lets database time
/// run on in real time (a paused sampler, a backward step): short enough
/// that database time passes it within the 10 s wait while uncertain.
pub(super) const GRACE_REAL_TIME: SignedDuration = SignedDuration::from_secs(2);

/// The grace of a deletion before a 120 s forward step: database time
/// passes it at the step, and no cut does before the checks while
/// uncertain, however slowly a loaded machine runs the scenario's phases
/// (the cut advances no faster than monotonic time).
pub(super) const GRACE_FORWARD_STEP: SignedDuration = SignedDuration::from_secs(20);

/// What the checks carry between the scenario's phases.
pub(super) struct Held {
    store: LcStore,
    exec: ExecRecord,
    deletion: DeletionRecord,
}

/// On a certain cut, before the fault: ends a small exec (cancel, release
/// with signed absence, its unit returned) and deletes its workspace with
/// `grace`.
pub(super) async fn before_fault(f: &Fixture, grace: SignedDuration) -> Held {
    let store = store_on(
        &f.db,
        LcConfig {
            deletion_grace: grace,
            ..config()
        },
    )
    .await;
    let at = certain(&f.clock).await;
    let e = store
        .admit_exec(
            &op("del-x", "del-x"),
            at,
            f.tenant,
            &req("small", &["true"]),
        )
        .await
        .unwrap();
    let lease = e.canonical.lease_id;
    store.mark_active(lease, G1, at).await.unwrap();
    ControlStore::cancel(&store, &op("del-c", "del-c"), at, f.tenant, e.exec_id)
        .await
        .unwrap();
    store
        .begin_release(lease, G1, TerminalReason::Cancelled, at)
        .await
        .unwrap();
    let out = store
        .commit_release(lease, G1, &f.provider.absence(lease, 1), at)
        .await
        .unwrap();
    assert_eq!(out.units_returned, 1);
    let exec = store.exec(f.tenant, e.exec_id).await.unwrap();
    assert_eq!(exec.state, ExecState::Terminal);
    let deletion = store
        .delete_item(
            &op("del-d", "del-d"),
            at,
            f.tenant,
            e.exec_id,
            DeletedItem::Workspace,
        )
        .await
        .unwrap();
    assert_eq!(
        (deletion.deleted_at, deletion.purge_after),
        (at.cut, at.cut + grace)
    );
    Held {
        store,
        exec,
        deletion,
    }
}

/// While `u` is uncertain: no purge (with `db_past`, first waiting, while
/// still uncertain, until database time has passed purge_after), a raw
/// SQL purge refused LCS90, a new delete refused `time_uncertain`, and
/// nothing written.
pub(super) async fn while_uncertain(f: &mut Fixture, h: &Held, u: CutReading, db_past: bool) {
    assert!(!u.certain);
    let purge_after = h.deletion.purge_after;
    if db_past {
        let row = f
            .cuts
            .until(10, "database time past purge_after", |r| {
                r.db_now >= purge_after
            })
            .await;
        assert!(row.cut < purge_after, "{} >= {purge_after}", row.cut);
    }
    let (u, _) = uncertain(&f.clock, UNCERTAIN_WAIT_S).await;
    let before = snapshot(&f.db.url).await;
    assert_eq!(
        h.store.purge_due(u, 10).await.unwrap(),
        PurgeReport::default()
    );
    assert_eq!(
        h.store
            .delete_item(
                &op("del-o", "del-o"),
                u,
                f.tenant,
                h.exec.exec_id,
                DeletedItem::Output
            )
            .await
            .unwrap_err(),
        LcError::TimeUncertain {
            retry_after_s: RETRY_AFTER_S
        }
    );
    let mut c = PgConnection::connect(&f.db.url).await.unwrap();
    let e = sqlx::query(
        "UPDATE lc_deletions SET state = 'purged', purged_floor_us = 0, purged_submicro_ns = 0 \
          WHERE exec_id = $1",
    )
    .bind(h.exec.exec_id.0)
    .execute(&mut c)
    .await
    .unwrap_err();
    assert_eq!(
        e.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("LCS90")
    );
    assert_eq!(snapshot(&f.db.url).await, before);
    assert_eq!(
        h.store
            .workspace(f.tenant, h.exec.exec_id)
            .await
            .unwrap_err()
            .code(),
        "workspace_deleted"
    );
}

/// Once certain again: at a certain cut past purge_after, two purgers
/// racing purge the workspace exactly once; after that it reads
/// `workspace_purged`.
pub(super) async fn once_certain(f: &Fixture, h: Held) {
    let purge_after = h.deletion.purge_after;
    let c = wait_reading(&f.clock, 30, "a certain cut past purge_after", |r| {
        r.certain && r.cut >= purge_after
    })
    .await;
    let (a, b) = tokio::join!(h.store.purge_due(c, 10), f.store.purge_due(c, 10));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.workspaces_purged + b.workspaces_purged, 1, "{a:?} {b:?}");
    assert_eq!(
        (
            a.outputs_purged,
            b.outputs_purged,
            a.rows_purged,
            b.rows_purged
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(
        h.store.purge_due(c, 10).await.unwrap(),
        PurgeReport::default()
    );
    assert_eq!(
        h.store
            .workspace(f.tenant, h.exec.exec_id)
            .await
            .unwrap_err(),
        LcError::ItemPurged {
            exec_id: h.exec.exec_id,
            item: DeletedItem::Workspace,
            purged_at: Some(c.cut),
        }
    );
    h.store.pool().close().await;
}
