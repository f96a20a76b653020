//! Hibernation and resume driven through the store's gateway and
//! reconciler steps with real signed envelopes, over a real blob
//! directory: a running exec, its owner, a workspace tree snapshotted
//! into the blobs the router reads, the quiescence and the destroy that
//! park it, and the prepare, attachment and commit that resume it.

use std::path::{Path, PathBuf};

use jiff::SignedDuration;
use lc_blob::LocalBlobStore;
use lc_core::evidence::Statement;
use lc_core::model::{
    AttemptNo, Digest, ExecId, Generation, OutputPage, PageExit, PageKind, SandboxLeaseId,
    TenantId, TerminalReason, WorkspaceId,
};
use lc_core::owner::{OwnerCredential, OwnerToken};
use lc_core::snapshot::Manifest;
use lc_core::store::{GatewayStore, ReconcileStore};
use serde_json::{Value, json};

use super::pg::{PgSvc, provider_key};
use super::{ADMIN, Req, send};

/// A fresh directory under the system's temporary directory, named for
/// `what` and this process (removed first when left over).
pub fn temp_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lc-ws-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Creates tenant `name` with `units` through the admin route; returns
/// (id, key).
pub async fn tenant(s: &PgSvc, name: &str, units: i64) -> (i64, String) {
    let r = send(
        &s.router,
        Req::post("/v1/tenants")
            .token(ADMIN)
            .key(&format!("create-{name}"))
            .json(json!({"name": name, "units": units})),
    )
    .await;
    let b = r.ok(201);
    (
        b["tenant_id"].as_i64().unwrap(),
        b["api_key"].as_str().unwrap().to_string(),
    )
}

/// A running exec: admitted through the route with `body` under `key`,
/// its Lease marked active through the store, an owner taken; its view
/// as admitted.
pub struct Running {
    pub exec_id: i64,
    pub tenant_id: i64,
    pub lease_id: SandboxLeaseId,
    pub workspace_id: i64,
    pub cred: OwnerCredential,
    pub admitted: Value,
}

pub async fn running(s: &PgSvc, tenant_id: i64, api_key: &str, key: &str, body: Value) -> Running {
    let admitted = send(
        &s.router,
        Req::post("/v1/execs").token(api_key).key(key).json(body),
    )
    .await
    .ok(201)
    .clone();
    let exec_id = admitted["exec_id"].as_i64().unwrap();
    let lease_id = SandboxLeaseId(admitted["canonical"]["lease_id"].as_i64().unwrap());
    let at = s.reading().await;
    s.store
        .mark_active(lease_id, Generation(1), at)
        .await
        .expect("active");
    let token = OwnerToken::from_bytes([0x42; 32]);
    let owned = s
        .store
        .take_over(
            &token,
            TenantId(tenant_id),
            ExecId(exec_id),
            at,
            SignedDuration::from_secs(600),
        )
        .await
        .expect("take over");
    Running {
        exec_id,
        tenant_id,
        lease_id,
        workspace_id: admitted["canonical"]["workspace_id"].as_i64().unwrap(),
        cred: OwnerCredential {
            token,
            generation: owned.ownership.generation,
            fence: owned.ownership.fence,
        },
        admitted,
    }
}

/// Writes the test workspace under `root`: `a.txt` (0644, `hello\n`),
/// `sub/` (0750), `sub/run.sh` (0755), `sub/empty` (0600, no bytes) and
/// the symlink `link -> a.txt`.
pub fn write_tree(root: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
    };
    std::fs::write(root.join("a.txt"), b"hello\n").unwrap();
    mode(&root.join("a.txt"), 0o644);
    std::fs::create_dir(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    mode(&root.join("sub/run.sh"), 0o755);
    std::fs::write(root.join("sub/empty"), b"").unwrap();
    mode(&root.join("sub/empty"), 0o600);
    mode(&root.join("sub"), 0o750);
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
}

/// Pages of generation `lease`/`generation` of exec `r` from `first_seq`,
/// appended through the reconciler's path (bytes in the store).
pub async fn append(
    s: &PgSvc,
    exec_id: i64,
    lease: SandboxLeaseId,
    generation: Generation,
    first_seq: i64,
    pages: &[(PageKind, &[u8], Option<PageExit>)],
) {
    let pages: Vec<OutputPage> = pages
        .iter()
        .enumerate()
        .map(|(i, (kind, bytes, exit))| OutputPage {
            exec_id: ExecId(exec_id),
            attempt: AttemptNo(1),
            seq: first_seq + i64::try_from(i).unwrap(),
            kind: *kind,
            bytes: bytes.to_vec(),
            sha256: Digest::of(bytes),
            exit: *exit,
        })
        .collect();
    s.store
        .append_pages(lease, generation, &pages)
        .await
        .expect("append pages");
}

/// The signed statement `st` of the test provider as JSON.
pub fn signed(st: &Statement) -> Value {
    serde_json::to_value(lc_core::evidence::sign(st, &provider_key())).expect("envelope json")
}

/// Commits the quiescence of the sealed generation 1 of `r`: snapshots
/// `tree` into `blobs`, commits it with the provider's signed statement,
/// then the destroy with its absence (the exec is parked). Returns the
/// manifest.
pub async fn quiesce(s: &PgSvc, r: &Running, tree: &Path, blobs: &LocalBlobStore) -> Manifest {
    quiesce_measured(s, r, tree, blobs, None).await
}

/// [`quiesce`] with the provider's signed measurement of generation 1
/// (`cost`, no network path) when `cost` is given: the milestone then
/// carries it.
pub async fn quiesce_measured(
    s: &PgSvc,
    r: &Running,
    tree: &Path,
    blobs: &LocalBlobStore,
    cost: Option<lc_core::observation::CostObservation>,
) -> Manifest {
    let measurement = cost.map(|c| {
        signed(&Statement::Measurement {
            provider_id: "local".into(),
            lease_id: r.lease_id.0,
            generation: 1,
            cost: Some(c),
            externality: lc_core::observation::ExternalityObservation::of_sandbox(false),
        })
    });
    let m = lc_blob::tree::snapshot_tree(tree, WorkspaceId(r.workspace_id), None, blobs)
        .expect("snapshot tree");
    let at = s.reading().await;
    let head = m.digest();
    s.store
        .commit_quiescence(
            &r.cred,
            ExecId(r.exec_id),
            at,
            Generation(1),
            &m.canonical_bytes(),
            head,
            &signed(&Statement::Quiescence {
                provider_id: "local".into(),
                lease_id: r.lease_id.0,
                generation: 1,
                workspace_id: r.workspace_id,
                head: head.to_hex(),
            }),
            measurement.as_ref(),
        )
        .await
        .expect("commit quiescence");
    s.store
        .commit_release(
            r.lease_id,
            Generation(1),
            &signed(&Statement::Absence {
                provider_id: "local".into(),
                lease_id: r.lease_id.0,
                generation: 1,
            }),
            at,
        )
        .await
        .expect("commit release");
    m
}

/// Carries out the resume recorded under `op_key` as the gateway and the
/// provider do: a new ownership (the quiescence released the old one),
/// prepare (generation 2), the signed attachment of `head`, the commit,
/// and generation 2's Lease active. Returns its Lease.
pub async fn resume(s: &PgSvc, r: &Running, op_key: &str, head: Digest) -> SandboxLeaseId {
    let at = s.reading().await;
    let cred = take_parked(s, r, at).await;
    let w = s
        .store
        .prepare_resume(&cred, ExecId(r.exec_id), at, op_key)
        .await
        .expect("prepare resume");
    s.store
        .record_attachment(
            w.lease_id,
            Generation(2),
            &signed(&Statement::Attachment {
                provider_id: "local".into(),
                lease_id: w.lease_id.0,
                generation: 2,
                workspace_id: r.workspace_id,
                head: head.to_hex(),
                writable: true,
            }),
            at,
        )
        .await
        .expect("attachment");
    s.store
        .commit_resume(&cred, ExecId(r.exec_id), at, op_key)
        .await
        .expect("commit resume");
    s.store
        .mark_active(w.lease_id, Generation(2), at)
        .await
        .expect("generation 2 active");
    w.lease_id
}

/// A new ownership of `r`'s parked exec (the quiescence released the old
/// one), as a gateway claims it for a resume request.
async fn take_parked(s: &PgSvc, r: &Running, at: lc_core::CutReading) -> OwnerCredential {
    let token = OwnerToken::from_bytes([0x43; 32]);
    let owned = s
        .store
        .take_over(
            &token,
            TenantId(r.tenant_id),
            ExecId(r.exec_id),
            at,
            SignedDuration::from_secs(600),
        )
        .await
        .expect("take over the parked exec");
    OwnerCredential {
        token,
        generation: owned.ownership.generation,
        fence: owned.ownership.fence,
    }
}

/// The provider's refusal to restore the resume recorded under `op_key`,
/// as the gateway and the reconciler carry it out: a new ownership, the
/// prepared Lease (generation 2), its release with the not-sent proof and
/// `refusal` recorded on the request, then its destroy proven (the exec
/// stays parked).
pub async fn refuse(
    s: &PgSvc,
    r: &Running,
    op_key: &str,
    refusal: &lc_core::hibernate::ResumeRefusal,
) {
    let at = s.reading().await;
    let cred = take_parked(s, r, at).await;
    let w = s
        .store
        .prepare_resume(&cred, ExecId(r.exec_id), at, op_key)
        .await
        .expect("prepare resume");
    let not_sent = signed(&Statement::NotSent {
        provider_id: "local".into(),
        lease_id: w.lease_id.0,
        generation: w.generation.0,
    });
    s.store
        .refuse_restore(w.lease_id, w.generation, &not_sent, at, refusal)
        .await
        .expect("refuse restore");
    let absence = signed(&Statement::Absence {
        provider_id: "local".into(),
        lease_id: w.lease_id.0,
        generation: w.generation.0,
    });
    s.store
        .commit_release(w.lease_id, w.generation, &absence, at)
        .await
        .expect("commit release");
}

/// Ends generation `generation` (Lease `lease`) of a command that exited:
/// begins the release (`exited`) and commits it with the signed absence.
pub async fn finish(s: &PgSvc, lease: SandboxLeaseId, generation: Generation) {
    let at = s.reading().await;
    s.store
        .begin_release(lease, generation, TerminalReason::Exited, at)
        .await
        .expect("begin release");
    s.store
        .commit_release(
            lease,
            generation,
            &signed(&Statement::Absence {
                provider_id: "local".into(),
                lease_id: lease.0,
                generation: generation.0,
            }),
            at,
        )
        .await
        .expect("commit release");
}
