//! Every SQL statement of Little Compute's store, and what is stored and
//! why.
//!
//! Each function runs on a connection inside a transaction the store's
//! wrapper opened ([`crate::store`]); none commits. Instants cross as exact
//! instant pairs computed in Rust; no statement reads `now()`. Rows are
//! locked in one order everywhere: the sandbox Lease, then the exec, then
//! its ownership, then its Reservation, then (through `tollgate_pg::ops`)
//! the Tollgate account and lease; operation keys are taken before any of
//! them.
//! No statement here writes a Tollgate table: Tollgate's rows are written
//! only through `tollgate_pg::ops`, in the same transaction.

use std::collections::BTreeMap;

use jiff::Timestamp;
use lc_core::approval::{
    ApprovalDecision, ApprovalPolicy, ApprovalRecord, ApprovalRequire, ApproverKind,
};
use lc_core::claim::{Claim, ClaimGeneration, ClaimItem, ClaimKind};
use lc_core::deletion::{DeletedItem, DeletionRecord, DeletionState};
use lc_core::hibernate::{
    HibernationRecord, QuiescenceRefusal, ResumeIntent, ResumeReceipt, ResumeRefusal, SnapshotMeta,
    WorkspaceRecord,
};
use lc_core::input::{InputQueue, InputRecord, InputState};
use lc_core::observation::{
    AttemptObservation, CostObservation, ExternalityObservation, Milestone, MilestoneRecord,
    MilestoneSource,
};
use lc_core::owner::{
    OwnerFence, OwnerGeneration, Ownership, PageMeta, StoredPage, TakeoverBasis, TransitionKind,
    TransitionReceipt,
};
use lc_core::page::ExitStatus;
use lc_core::token::{TokenId, TokenRecord};
use lc_core::{
    AttemptNo, AttemptState, CanonicalIdentity, Digest, ExecId, ExecRecord, ExecState, ExpiryCause,
    Generation, HibernationReason, HibernationStep, LeaseState, OnTimeout, OpScope,
    OperationRecord, OutputPage, PageKind, Provider, ProviderId, ReservationState, Runtime,
    SandboxLeaseId, Tenant, TenantId, TerminalReason, WorkspaceId,
};
use safetime::InstantPair;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::error::{Fail, corrupt};

/// `(floor_us, submicro_ns)` of `t`, as bound.
pub(crate) fn pair(t: Timestamp) -> (i64, i32) {
    let p = InstantPair::encode(t);
    (p.floor_us, i32::from(p.submicro_ns))
}

/// The instant of a stored pair.
pub(crate) fn instant(floor_us: i64, submicro_ns: i32) -> Result<Timestamp, Fail> {
    let submicro_ns =
        i16::try_from(submicro_ns).map_err(|_| corrupt(format!("submicro_ns {submicro_ns}")))?;
    Ok(InstantPair {
        floor_us,
        submicro_ns,
    }
    .decode()?)
}

fn instant_at(row: &PgRow, floor: &str, sub: &str) -> Result<Timestamp, Fail> {
    instant(row.try_get(floor)?, row.try_get(sub)?)
}

fn opt_instant_at(row: &PgRow, floor: &str, sub: &str) -> Result<Option<Timestamp>, Fail> {
    let f: Option<i64> = row.try_get(floor)?;
    let s: Option<i32> = row.try_get(sub)?;
    match (f, s) {
        (Some(f), Some(s)) => Ok(Some(instant(f, s)?)),
        (None, None) => Ok(None),
        _ => Err(corrupt(format!("half an instant pair in {floor}/{sub}")).into()),
    }
}

/// Checks that a write changed exactly one row.
fn one_row(done: sqlx::postgres::PgQueryResult, what: &str) -> Result<(), Fail> {
    match done.rows_affected() {
        1 => Ok(()),
        n => Err(corrupt(format!("{what} changed {n} rows, not 1")).into()),
    }
}

fn opt_digest_at(row: &PgRow, col: &str) -> Result<Option<Digest>, Fail> {
    let b: Option<Vec<u8>> = row.try_get(col)?;
    b.map(|b| {
        let a: [u8; 32] = b
            .as_slice()
            .try_into()
            .map_err(|_| corrupt(format!("{col} is {} bytes, not 32", b.len())))?;
        Ok(Digest(a))
    })
    .transpose()
}

fn digest_at(row: &PgRow, col: &str) -> Result<Digest, Fail> {
    let b: Vec<u8> = row.try_get(col)?;
    let a: [u8; 32] = b
        .as_slice()
        .try_into()
        .map_err(|_| corrupt(format!("{col} is {} bytes, not 32", b.len())))?;
    Ok(Digest(a))
}

fn json_at(row: &PgRow, col: &str) -> Result<serde_json::Value, Fail> {
    let text: String = row.try_get(col)?;
    serde_json::from_str(&text).map_err(|e| corrupt(format!("{col}: {e}")).into())
}

fn parse_enum<T>(row: &PgRow, col: &str, parse: fn(&str) -> Option<T>) -> Result<T, Fail> {
    let text: String = row.try_get(col)?;
    parse(&text).ok_or_else(|| corrupt(format!("{col} {text:?}")).into())
}

fn provider_id_at(row: &PgRow, col: &str) -> Result<ProviderId, Fail> {
    let text: String = row.try_get(col)?;
    ProviderId::new(text).map_err(|e| corrupt(format!("{col}: {e}")).into())
}

/// The page kind stored as `s`, by its wire name (every kind the page
/// module knows, so a kind it gains is read without a change here).
fn page_kind(s: &str) -> Option<PageKind> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
}

/// The scope column of an operation key: 0 for the administrator, the
/// tenant id otherwise.
pub(crate) fn scope_value(scope: OpScope) -> i64 {
    match scope {
        OpScope::Admin => 0,
        OpScope::Tenant(t) => t.0,
    }
}

fn scope_of(v: i64) -> OpScope {
    if v == 0 {
        OpScope::Admin
    } else {
        OpScope::Tenant(TenantId(v))
    }
}

// ---------------------------------------------------------------------------
// The cut.

/// The persisted cut and the horizon in force for new deadlines: the
/// smaller of the newest sealed policy's and the current epoch's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CutState {
    pub cut: Timestamp,
    pub horizon_ms: i64,
}

/// The persisted cut; `None` before any sampler claimed an epoch.
pub(crate) async fn read_cut_state(conn: &mut PgConnection) -> Result<Option<CutState>, Fail> {
    let row = sqlx::query(
        "SELECT s.cut_floor_us, s.cut_submicro_ns, \
                least(p.horizon_ms, (SELECT n.horizon_ms FROM tollgate_safetime_policy n \
                                      ORDER BY n.version DESC LIMIT 1)) AS horizon_ms \
           FROM tollgate_safetime s \
           JOIN tollgate_safetime_policy p ON p.version = s.policy_version",
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(CutState {
        cut: instant_at(&row, "cut_floor_us", "cut_submicro_ns")?,
        horizon_ms: row.try_get("horizon_ms")?,
    }))
}

// ---------------------------------------------------------------------------
// Operation keys.

/// A new operation key's row.
pub(crate) struct NewOperation<'a> {
    pub scope: OpScope,
    pub key: &'a str,
    pub kind: &'a str,
    pub request_sha256: Digest,
    pub created: Timestamp,
    pub floor: Timestamp,
    pub ttl_ns: i64,
    pub gc: Timestamp,
}

/// Inserts the key with a `null` result unless it exists; `false` when it
/// did (after waiting for a concurrent insert of it to end).
pub(crate) async fn insert_operation(
    conn: &mut PgConnection,
    op: &NewOperation<'_>,
) -> Result<bool, Fail> {
    let (cf, cs) = pair(op.created);
    let (ff, fs) = pair(op.floor);
    let (gf, gs) = pair(op.gc);
    let done = sqlx::query(
        "INSERT INTO lc_operations (scope, op_key, kind, request_sha256, result, \
             created_floor_us, created_submicro_ns, floor_floor_us, floor_submicro_ns, ttl_ns, \
             gc_floor_us, gc_submicro_ns) \
         VALUES ($1, $2, $3, $4, 'null'::jsonb, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT (scope, op_key) DO NOTHING",
    )
    .bind(scope_value(op.scope))
    .bind(op.key)
    .bind(op.kind)
    .bind(&op.request_sha256.0[..])
    .bind(cf)
    .bind(cs)
    .bind(ff)
    .bind(fs)
    .bind(op.ttl_ns)
    .bind(gf)
    .bind(gs)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

const OPERATION_COLUMNS: &str = "scope, op_key, kind, request_sha256, result::text AS result, \
     created_floor_us, created_submicro_ns, floor_floor_us, floor_submicro_ns, ttl_ns, \
     gc_floor_us, gc_submicro_ns, receipt_attached";

fn operation_from(row: &PgRow) -> Result<OperationRecord, Fail> {
    Ok(OperationRecord {
        scope: scope_of(row.try_get("scope")?),
        key: row.try_get("op_key")?,
        request_sha256: digest_at(row, "request_sha256")?,
        kind: row.try_get("kind")?,
        result: json_at(row, "result")?,
        created_cut: instant_at(row, "created_floor_us", "created_submicro_ns")?,
        floor: instant_at(row, "floor_floor_us", "floor_submicro_ns")?,
        ttl_ns: row.try_get("ttl_ns")?,
        receipt_attached: row.try_get("receipt_attached")?,
        gc_at: instant_at(row, "gc_floor_us", "gc_submicro_ns")?,
    })
}

/// The key's row.
pub(crate) async fn read_operation(
    conn: &mut PgConnection,
    scope: OpScope,
    key: &str,
) -> Result<Option<OperationRecord>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {OPERATION_COLUMNS} FROM lc_operations WHERE scope = $1 AND op_key = $2"
    ))
    .bind(scope_value(scope))
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(operation_from).transpose()
}

/// Records the key's result (in the transaction that inserted it).
pub(crate) async fn set_operation_result(
    conn: &mut PgConnection,
    scope: OpScope,
    key: &str,
    result: &serde_json::Value,
) -> Result<(), Fail> {
    sqlx::query("UPDATE lc_operations SET result = $3::jsonb WHERE scope = $1 AND op_key = $2")
        .bind(scope_value(scope))
        .bind(key)
        .bind(result.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Up to `limit` keys without a receipt whose floor is before `cut`,
/// oldest floor first, locked (`SKIP LOCKED`: another worker's are
/// skipped).
pub(crate) async fn receipt_candidates(
    conn: &mut PgConnection,
    cut: Timestamp,
    limit: usize,
) -> Result<Vec<OperationRecord>, Fail> {
    let (f, s) = pair(cut);
    let rows = sqlx::query(&format!(
        "SELECT {OPERATION_COLUMNS} FROM lc_operations \
          WHERE NOT receipt_attached AND (floor_floor_us, floor_submicro_ns) < ($1, $2) \
          ORDER BY floor_floor_us, floor_submicro_ns LIMIT $3 FOR UPDATE SKIP LOCKED"
    ))
    .bind(f)
    .bind(s)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(operation_from).collect()
}

/// Up to `limit` keys with a receipt whose GC instant is at or before
/// `cut`, locked (`SKIP LOCKED`).
pub(crate) async fn gc_candidates(
    conn: &mut PgConnection,
    cut: Timestamp,
    limit: usize,
) -> Result<Vec<OperationRecord>, Fail> {
    let (f, s) = pair(cut);
    let rows = sqlx::query(&format!(
        "SELECT {OPERATION_COLUMNS} FROM lc_operations \
          WHERE receipt_attached AND (gc_floor_us, gc_submicro_ns) <= ($1, $2) \
          ORDER BY gc_floor_us, gc_submicro_ns LIMIT $3 FOR UPDATE SKIP LOCKED"
    ))
    .bind(f)
    .bind(s)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(operation_from).collect()
}

/// Attaches the receipt of one key.
pub(crate) async fn attach_receipt(
    conn: &mut PgConnection,
    scope: OpScope,
    key: &str,
) -> Result<(), Fail> {
    sqlx::query(
        "UPDATE lc_operations SET receipt_attached = true WHERE scope = $1 AND op_key = $2",
    )
    .bind(scope_value(scope))
    .bind(key)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Deletes one key (GC).
pub(crate) async fn delete_operation(
    conn: &mut PgConnection,
    scope: OpScope,
    key: &str,
) -> Result<(), Fail> {
    sqlx::query("DELETE FROM lc_operations WHERE scope = $1 AND op_key = $2 AND receipt_attached")
        .bind(scope_value(scope))
        .bind(key)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Tenants.

/// Whether a tenant has `name`.
pub(crate) async fn tenant_name_taken(conn: &mut PgConnection, name: &str) -> Result<bool, Fail> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM lc_tenants WHERE name = $1)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?,
    )
}

/// Inserts the tenant row of account `tenant`.
pub(crate) async fn insert_tenant(
    conn: &mut PgConnection,
    tenant: TenantId,
    name: &str,
    api_key_sha256: Digest,
) -> Result<(), Fail> {
    sqlx::query("INSERT INTO lc_tenants (tenant_id, name, api_key_sha256) VALUES ($1, $2, $3)")
        .bind(tenant.0)
        .bind(name)
        .bind(&api_key_sha256.0[..])
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The tenant with its account's balances.
pub(crate) async fn read_tenant(
    conn: &mut PgConnection,
    tenant: TenantId,
) -> Result<Option<Tenant>, Fail> {
    let row = sqlx::query(
        "SELECT t.tenant_id, t.name, a.deposited, a.available, a.held, a.consumed, \
                t.approval_require, t.approval_shapes \
           FROM lc_tenants t JOIN tollgate_accounts a ON a.account_id = t.tenant_id \
          WHERE t.tenant_id = $1",
    )
    .bind(tenant.0)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Tenant {
        tenant_id: TenantId(row.try_get("tenant_id")?),
        name: row.try_get("name")?,
        deposited: row.try_get("deposited")?,
        available: row.try_get("available")?,
        held: row.try_get("held")?,
        consumed: row.try_get("consumed")?,
        approval_policy: policy_from(&row)?,
    }))
}

fn policy_from(row: &PgRow) -> Result<ApprovalPolicy, Fail> {
    let require = parse_enum(row, "approval_require", ApprovalRequire::parse)?;
    let shapes: Vec<String> = row.try_get("approval_shapes")?;
    ApprovalPolicy::new(require, &shapes)
        .map_err(|e| corrupt(format!("approval policy: {e}")).into())
}

/// The approval policy of the locked tenant `tenant`.
pub(crate) async fn approval_policy(
    conn: &mut PgConnection,
    tenant: TenantId,
) -> Result<ApprovalPolicy, Fail> {
    let row = sqlx::query(
        "SELECT approval_require, approval_shapes FROM lc_tenants WHERE tenant_id = $1",
    )
    .bind(tenant.0)
    .fetch_one(&mut *conn)
    .await?;
    policy_from(&row)
}

/// Sets the approval policy of `tenant`; whether the tenant exists.
pub(crate) async fn set_approval_policy(
    conn: &mut PgConnection,
    tenant: TenantId,
    policy: &ApprovalPolicy,
) -> Result<bool, Fail> {
    let done = sqlx::query(
        "UPDATE lc_tenants SET approval_require = $2, approval_shapes = $3 WHERE tenant_id = $1",
    )
    .bind(tenant.0)
    .bind(policy.require.as_str())
    .bind(&policy.shapes)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Locks the tenant row of `tenant` for the rest of the transaction, so
/// admissions of one tenant judge its rate one at a time. `false` when it
/// does not exist.
pub(crate) async fn lock_tenant(conn: &mut PgConnection, tenant: TenantId) -> Result<bool, Fail> {
    Ok(
        sqlx::query("SELECT 1 FROM lc_tenants WHERE tenant_id = $1 FOR UPDATE")
            .bind(tenant.0)
            .fetch_optional(&mut *conn)
            .await?
            .is_some(),
    )
}

/// The admission cuts of `tenant`'s execs admitted strictly after `start`,
/// newest first, at most `limit`.
pub(crate) async fn recent_admissions(
    conn: &mut PgConnection,
    tenant: TenantId,
    start: Timestamp,
    limit: u32,
) -> Result<Vec<Timestamp>, Fail> {
    let (floor_us, submicro_ns) = pair(start);
    let rows = sqlx::query(
        "SELECT admitted_floor_us, admitted_submicro_ns FROM lc_execs \
          WHERE tenant_id = $1 AND (admitted_floor_us, admitted_submicro_ns) > ($2, $3) \
          ORDER BY admitted_floor_us DESC, admitted_submicro_ns DESC LIMIT $4",
    )
    .bind(tenant.0)
    .bind(floor_us)
    .bind(submicro_ns)
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| instant_at(r, "admitted_floor_us", "admitted_submicro_ns"))
        .collect()
}

/// The tenant whose API key has this digest.
pub(crate) async fn tenant_by_key(
    conn: &mut PgConnection,
    api_key_sha256: Digest,
) -> Result<Option<TenantId>, Fail> {
    let id: Option<i64> =
        sqlx::query_scalar("SELECT tenant_id FROM lc_tenants WHERE api_key_sha256 = $1")
            .bind(&api_key_sha256.0[..])
            .fetch_optional(&mut *conn)
            .await?;
    Ok(id.map(TenantId))
}

// ---------------------------------------------------------------------------
// Runtimes and providers.

fn runtime_from(row: &PgRow) -> Result<Runtime, Fail> {
    Ok(Runtime {
        name: row.try_get("name")?,
        digest: digest_at(row, "digest")?,
        manifest: json_at(row, "manifest")?,
    })
}

/// The runtime named `name`.
pub(crate) async fn runtime_by_name(
    conn: &mut PgConnection,
    name: &str,
) -> Result<Option<Runtime>, Fail> {
    let row = sqlx::query(
        "SELECT name, digest, manifest::text AS manifest FROM lc_runtimes WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(runtime_from).transpose()
}

/// A runtime with `digest` (the first by name).
pub(crate) async fn runtime_by_digest(
    conn: &mut PgConnection,
    digest: Digest,
) -> Result<Option<Runtime>, Fail> {
    let row = sqlx::query(
        "SELECT name, digest, manifest::text AS manifest FROM lc_runtimes WHERE digest = $1 \
          ORDER BY name LIMIT 1",
    )
    .bind(&digest.0[..])
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(runtime_from).transpose()
}

/// Inserts a runtime; `false` when the name was taken meanwhile.
pub(crate) async fn insert_runtime(conn: &mut PgConnection, rt: &Runtime) -> Result<bool, Fail> {
    let done = sqlx::query(
        "INSERT INTO lc_runtimes (name, digest, manifest) VALUES ($1, $2, $3::jsonb) \
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(&rt.name)
    .bind(&rt.digest.0[..])
    .bind(rt.manifest.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Up to `limit` runtimes by name.
pub(crate) async fn list_runtimes(
    conn: &mut PgConnection,
    limit: usize,
) -> Result<Vec<Runtime>, Fail> {
    let rows = sqlx::query(
        "SELECT name, digest, manifest::text AS manifest FROM lc_runtimes ORDER BY name LIMIT $1",
    )
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(runtime_from).collect()
}

fn provider_from(row: &PgRow) -> Result<Provider, Fail> {
    let key: Vec<u8> = row.try_get("public_key")?;
    Ok(Provider {
        provider_id: provider_id_at(row, "provider_id")?,
        url: row.try_get("url")?,
        public_key: key
            .as_slice()
            .try_into()
            .map_err(|_| corrupt("provider public key is not 32 bytes"))?,
    })
}

/// Registers a provider or updates its URL when the key is the same;
/// `None` when a provider of that id has another key.
pub(crate) async fn upsert_provider(
    conn: &mut PgConnection,
    id: &ProviderId,
    url: &str,
    public_key: &[u8; 32],
) -> Result<Option<Provider>, Fail> {
    let row = sqlx::query(
        "INSERT INTO lc_providers (provider_id, url, public_key) VALUES ($1, $2, $3) \
         ON CONFLICT (provider_id) DO UPDATE SET url = EXCLUDED.url \
          WHERE lc_providers.public_key = EXCLUDED.public_key \
         RETURNING provider_id, url, public_key",
    )
    .bind(id.as_str())
    .bind(url)
    .bind(&public_key[..])
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(provider_from).transpose()
}

/// The provider `id`.
pub(crate) async fn read_provider(
    conn: &mut PgConnection,
    id: &str,
) -> Result<Option<Provider>, Fail> {
    let row =
        sqlx::query("SELECT provider_id, url, public_key FROM lc_providers WHERE provider_id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    row.as_ref().map(provider_from).transpose()
}

/// The provider a new exec runs on: the one with the fewest unreleased
/// Leases, then by id.
pub(crate) async fn pick_provider(conn: &mut PgConnection) -> Result<Option<ProviderId>, Fail> {
    let row = sqlx::query(
        "SELECT p.provider_id FROM lc_providers p \
          ORDER BY (SELECT count(*) FROM lc_sandbox_leases l \
                     WHERE l.provider_id = p.provider_id AND l.state <> 'released'), \
                   p.provider_id \
          LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref()
        .map(|r| provider_id_at(r, "provider_id"))
        .transpose()
}

// ---------------------------------------------------------------------------
// Execs, attempts, Reservations, Leases.

/// The next sandbox Lease id and workspace id.
pub(crate) async fn next_ids(
    conn: &mut PgConnection,
) -> Result<(SandboxLeaseId, WorkspaceId), Fail> {
    let row = sqlx::query(
        "SELECT nextval('lc_sandbox_lease_ids') AS lease_id, nextval('lc_workspace_ids') AS workspace_id",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((
        SandboxLeaseId(row.try_get("lease_id")?),
        WorkspaceId(row.try_get("workspace_id")?),
    ))
}

/// A new exec's row.
pub(crate) struct NewExec<'a> {
    pub tenant: TenantId,
    pub lease_id: SandboxLeaseId,
    pub provider_id: &'a ProviderId,
    pub runtime: Digest,
    pub workspace_id: WorkspaceId,
    pub shape: &'a str,
    pub units: i64,
    pub command: &'a [String],
    pub timeout_ms: Option<i64>,
    pub timeout_deadline: Option<Timestamp>,
    pub admitted: Timestamp,
    pub stdin_open: bool,
    pub idle_ttl_ms: Option<i64>,
    pub on_timeout: OnTimeout,
    /// `admitted`, or `awaiting_approval` (then without a timeout
    /// deadline).
    pub state: ExecState,
}

/// Inserts the exec (in `e.state`) and returns its id.
pub(crate) async fn insert_exec(conn: &mut PgConnection, e: &NewExec<'_>) -> Result<ExecId, Fail> {
    let (tf, ts) = match e.timeout_deadline.map(pair) {
        Some((f, s)) => (Some(f), Some(s)),
        None => (None, None),
    };
    let (af, asub) = pair(e.admitted);
    let command = serde_json::to_string(e.command).map_err(|e| corrupt(e.to_string()))?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO lc_execs (tenant_id, lease_id, provider_id, runtime_digest, workspace_id, \
             shape, units, command, timeout_ms, timeout_floor_us, timeout_submicro_ns, \
             admitted_floor_us, admitted_submicro_ns, state, stdin_open, idle_ttl_ms, on_timeout, \
             last_activity_floor_us, last_activity_submicro_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11, $12, $13, $17, $14, \
                 $15, $16, $12, $13) \
         RETURNING exec_id",
    )
    .bind(e.tenant.0)
    .bind(e.lease_id.0)
    .bind(e.provider_id.as_str())
    .bind(&e.runtime.0[..])
    .bind(e.workspace_id.0)
    .bind(e.shape)
    .bind(e.units)
    .bind(command)
    .bind(e.timeout_ms)
    .bind(tf)
    .bind(ts)
    .bind(af)
    .bind(asub)
    .bind(e.stdin_open)
    .bind(e.idle_ttl_ms)
    .bind(e.on_timeout.as_str())
    .bind(e.state.as_str())
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query("INSERT INTO lc_workspaces (workspace_id, exec_id) VALUES ($1, $2)")
        .bind(e.workspace_id.0)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(ExecId(id))
}

/// Inserts attempt `attempt` of `exec` at `generation`.
pub(crate) async fn insert_attempt(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
) -> Result<(), Fail> {
    sqlx::query(
        "INSERT INTO lc_attempts (exec_id, attempt, state, generation) VALUES ($1, $2, 'runnable', $3)",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Inserts a `held` Reservation.
pub(crate) async fn insert_reservation(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
    tollgate_lease_id: i64,
    units: i64,
    expiry: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(expiry);
    sqlx::query(
        "INSERT INTO lc_reservations (exec_id, attempt, generation, tollgate_lease_id, units, \
             expiry_floor_us, expiry_submicro_ns, state) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'held')",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .bind(tollgate_lease_id)
    .bind(units)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A new sandbox Lease's row.
pub(crate) struct NewLease<'a> {
    pub lease: SandboxLeaseId,
    pub exec: ExecId,
    pub attempt: AttemptNo,
    pub generation: Generation,
    pub provider: &'a ProviderId,
    pub expiry: Timestamp,
    /// The head it restores (a resumed generation).
    pub restore_head: Option<Digest>,
}

/// Inserts an `allocating` sandbox Lease.
pub(crate) async fn insert_lease(conn: &mut PgConnection, n: &NewLease<'_>) -> Result<(), Fail> {
    let NewLease {
        lease,
        exec,
        attempt,
        generation,
        provider,
        expiry,
        restore_head,
    } = *n;
    let (f, s) = pair(expiry);
    sqlx::query(
        "INSERT INTO lc_sandbox_leases (lease_id, exec_id, attempt, generation, provider_id, state, \
             expiry_floor_us, expiry_submicro_ns, restore_head) \
         VALUES ($1, $2, $3, $4, $5, 'allocating', $6, $7, $8)",
    )
    .bind(lease.0)
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .bind(provider.as_str())
    .bind(f)
    .bind(s)
    .bind(restore_head.map(|d| d.0.to_vec()))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The measurement of each Lease `ll` (joined with its measurement `mm`,
/// if any) as a JSON array in generation order: the shape
/// [`attempt_observation`] reads.
macro_rules! generation_measurements {
    () => {
        "jsonb_agg(jsonb_build_object( \
             'measured', mm.lease_id IS NOT NULL, \
             'cpu_time_ms', mm.cpu_time_ms, \
             'peak_memory_bytes', mm.peak_memory_bytes, \
             'network_writes', mm.network_writes, \
             'database_commits', mm.database_commits, \
             'external_api_calls', mm.external_api_calls) \
         ORDER BY ll.generation)::text"
    };
}

/// An exec's row with its current generation's Lease state, the trusted
/// measurement of each generation of its current attempt (`m_generations`,
/// a JSON array in generation order, NULL without any Lease), its
/// workspace head, the newest hibernation of its current attempt (columns
/// `hib_*`, NULL when none) and its newest resume receipt (columns `rr_*`,
/// NULL when none).
const EXEC_SELECT: &str = concat!(
    "SELECT e.exec_id, e.tenant_id, e.lease_id, e.provider_id, \
        e.runtime_digest, e.workspace_id, e.shape, e.units, e.command::text AS command, \
        e.timeout_ms, e.timeout_floor_us, e.timeout_submicro_ns, e.admitted_floor_us, \
        e.admitted_submicro_ns, e.state, e.terminal_reason, e.expired_by, e.exit_code, \
        e.cancel_requested, e.current_attempt, e.stdin_open, e.idle_ttl_ms, e.on_timeout, l.state AS lease_state, \
        w.head AS workspace_head, \
        ap.decision AS ap_decision, ap.approver AS ap_approver, \
        ap.decided_floor_us AS ap_decided_floor_us, ap.decided_submicro_ns AS ap_decided_submicro_ns, \
        ap.validity_ms AS ap_validity_ms, ap.valid_until_floor_us AS ap_valid_until_floor_us, \
        ap.valid_until_submicro_ns AS ap_valid_until_submicro_ns, ap.reason AS ap_reason, \
        h.attempt AS hib_attempt, h.generation AS hib_generation, h.lease_id AS hib_lease_id, \
        h.reason AS hib_reason, h.sealed_floor_us AS hib_sealed_floor_us, \
        h.sealed_submicro_ns AS hib_sealed_submicro_ns, h.step AS hib_step, h.head AS hib_head, \
        h.refused_reason AS hib_refused_reason, h.refused_path AS hib_refused_path, \
        h.refused_message AS hib_refused_message, \
        r.op_key AS rr_op_key, r.attempt AS rr_attempt, r.from_generation AS rr_from_generation, \
        r.to_generation AS rr_to_generation, r.lease_id AS rr_lease_id, r.head AS rr_head, \
        r.request_sha256 AS rr_request_sha256, r.token_sha256 AS rr_token_sha256, \
        r.owner_generation AS rr_owner_generation, r.owner_fence AS rr_owner_fence, \
        r.committed_floor_us AS rr_committed_floor_us, \
        r.committed_submicro_ns AS rr_committed_submicro_ns, \
        ms.generations AS m_generations \
   FROM lc_execs e \
   JOIN lc_attempts a ON a.exec_id = e.exec_id AND a.attempt = e.current_attempt \
   LEFT JOIN lc_sandbox_leases l ON l.exec_id = e.exec_id AND l.attempt = a.attempt \
                                AND l.generation = a.generation \
   LEFT JOIN lc_workspaces w ON w.exec_id = e.exec_id \
   LEFT JOIN lc_approvals ap ON ap.exec_id = e.exec_id \
   LEFT JOIN LATERAL (SELECT * FROM lc_hibernations hh \
                       WHERE hh.exec_id = e.exec_id AND hh.attempt = e.current_attempt \
                       ORDER BY hh.generation DESC LIMIT 1) h ON true \
   LEFT JOIN LATERAL (SELECT * FROM lc_resume_receipts rr WHERE rr.exec_id = e.exec_id \
                       ORDER BY rr.attempt DESC, rr.to_generation DESC LIMIT 1) r ON true \
   LEFT JOIN LATERAL (SELECT ",
    generation_measurements!(),
    " AS generations \
                        FROM lc_sandbox_leases ll \
                        LEFT JOIN lc_measurements mm ON mm.lease_id = ll.lease_id \
                       WHERE ll.exec_id = e.exec_id AND ll.attempt = a.attempt) ms ON true"
);

/// The `hib_*` columns of [`EXEC_SELECT`] as the exec's hibernation.
fn exec_hibernation(row: &PgRow, exec_id: ExecId) -> Result<Option<HibernationRecord>, Fail> {
    let Some(generation) = row.try_get::<Option<i64>, _>("hib_generation")? else {
        return Ok(None);
    };
    Ok(Some(HibernationRecord {
        exec_id,
        attempt: AttemptNo(row.try_get("hib_attempt")?),
        generation: Generation(generation),
        lease_id: SandboxLeaseId(row.try_get("hib_lease_id")?),
        reason: parse_enum(row, "hib_reason", HibernationReason::parse)?,
        sealed_cut: instant_at(row, "hib_sealed_floor_us", "hib_sealed_submicro_ns")?,
        step: parse_enum(row, "hib_step", HibernationStep::parse)?,
        head: opt_digest_at(row, "hib_head")?,
        refusal: refusal_at(row, "hib_")?,
    }))
}

/// The `rr_*` columns of [`EXEC_SELECT`] as the exec's newest resume
/// receipt.
fn exec_resume(row: &PgRow, exec_id: ExecId) -> Result<Option<ResumeReceipt>, Fail> {
    let Some(op_key) = row.try_get::<Option<String>, _>("rr_op_key")? else {
        return Ok(None);
    };
    Ok(Some(ResumeReceipt {
        exec_id,
        op_key,
        attempt: AttemptNo(row.try_get("rr_attempt")?),
        from_generation: Generation(row.try_get("rr_from_generation")?),
        to_generation: Generation(row.try_get("rr_to_generation")?),
        lease_id: SandboxLeaseId(row.try_get("rr_lease_id")?),
        head: digest_at(row, "rr_head")?,
        request_sha256: digest_at(row, "rr_request_sha256")?,
        token_sha256: digest_at(row, "rr_token_sha256")?,
        owner_generation: row.try_get("rr_owner_generation")?,
        owner_fence: row.try_get("rr_owner_fence")?,
        committed_cut: instant_at(row, "rr_committed_floor_us", "rr_committed_submicro_ns")?,
    }))
}

fn exec_from(row: &PgRow) -> Result<ExecRecord, Fail> {
    let exec_id = ExecId(row.try_get("exec_id")?);
    let command: Vec<String> = serde_json::from_str(&row.try_get::<String, _>("command")?)
        .map_err(|e| corrupt(format!("command of exec {exec_id}: {e}")))?;
    let timeout_ms: Option<i64> = row.try_get("timeout_ms")?;
    Ok(ExecRecord {
        exec_id,
        tenant_id: TenantId(row.try_get("tenant_id")?),
        state: parse_enum(row, "state", ExecState::parse)?,
        terminal_reason: row
            .try_get::<Option<String>, _>("terminal_reason")?
            .map(|r| {
                TerminalReason::parse(&r).ok_or_else(|| corrupt(format!("terminal_reason {r:?}")))
            })
            .transpose()?,
        expired_by: row
            .try_get::<Option<String>, _>("expired_by")?
            .map(|r| ExpiryCause::parse(&r).ok_or_else(|| corrupt(format!("expired_by {r:?}"))))
            .transpose()?,
        exit_code: row.try_get("exit_code")?,
        canonical: CanonicalIdentity {
            exec_id,
            lease_id: SandboxLeaseId(row.try_get("lease_id")?),
            provider_id: provider_id_at(row, "provider_id")?,
            runtime: digest_at(row, "runtime_digest")?,
            workspace_id: WorkspaceId(row.try_get("workspace_id")?),
        },
        attempt: AttemptNo(row.try_get("current_attempt")?),
        shape: row.try_get("shape")?,
        units: row.try_get("units")?,
        lease_state: row
            .try_get::<Option<String>, _>("lease_state")?
            .map(|s| LeaseState::parse(&s).ok_or_else(|| corrupt(format!("lease_state {s:?}"))))
            .transpose()?,
        command,
        timeout_ms: timeout_ms
            .map(|t| u64::try_from(t).map_err(|_| corrupt(format!("timeout_ms {t}"))))
            .transpose()?,
        timeout_deadline: opt_instant_at(row, "timeout_floor_us", "timeout_submicro_ns")?,
        admitted_cut: instant_at(row, "admitted_floor_us", "admitted_submicro_ns")?,
        cancel_requested: row.try_get("cancel_requested")?,
        stdin_open: row.try_get("stdin_open")?,
        idle_ttl_ms: row
            .try_get::<Option<i64>, _>("idle_ttl_ms")?
            .map(|t| u64::try_from(t).map_err(|_| corrupt(format!("idle_ttl_ms {t}"))))
            .transpose()?,
        on_timeout: parse_enum(row, "on_timeout", OnTimeout::parse)?,
        workspace_head: opt_digest_at(row, "workspace_head")?,
        hibernation: exec_hibernation(row, exec_id)?,
        resume: exec_resume(row, exec_id)?,
        approval: exec_approval(row, exec_id, TenantId(row.try_get("tenant_id")?))?,
        observation: attempt_observation(row)?,
    })
}

/// The `ap_*` columns of [`EXEC_SELECT`] as the exec's approval decision.
fn exec_approval(
    row: &PgRow,
    exec_id: ExecId,
    tenant_id: TenantId,
) -> Result<Option<ApprovalRecord>, Fail> {
    if row.try_get::<Option<String>, _>("ap_decision")?.is_none() {
        return Ok(None);
    }
    approval_from(row, "ap_", exec_id, tenant_id).map(Some)
}

/// An approval's columns, each named `prefix` + its column name.
fn approval_from(
    row: &PgRow,
    prefix: &str,
    exec_id: ExecId,
    tenant_id: TenantId,
) -> Result<ApprovalRecord, Fail> {
    let col = |c: &str| format!("{prefix}{c}");
    let validity_ms: Option<i64> = row.try_get(col("validity_ms").as_str())?;
    Ok(ApprovalRecord {
        exec_id,
        tenant_id,
        decision: parse_enum(row, &col("decision"), ApprovalDecision::parse)?,
        approver: parse_enum(row, &col("approver"), ApproverKind::parse)?,
        decided_cut: instant_at(row, &col("decided_floor_us"), &col("decided_submicro_ns"))?,
        validity_ms: validity_ms
            .map(|v| u64::try_from(v).map_err(|_| corrupt(format!("validity_ms {v}"))))
            .transpose()?,
        valid_until: opt_instant_at(
            row,
            &col("valid_until_floor_us"),
            &col("valid_until_submicro_ns"),
        )?,
        reason: row.try_get(col("reason").as_str())?,
    })
}

/// A new approval decision's row.
pub(crate) struct NewApproval<'a> {
    pub exec: ExecId,
    pub tenant: TenantId,
    pub decision: ApprovalDecision,
    pub approver: ApproverKind,
    pub decided: Timestamp,
    /// With `valid_until` (approved only).
    pub validity_ms: Option<i64>,
    pub valid_until: Option<Timestamp>,
    pub reason: Option<&'a str>,
}

/// Inserts an approval decision (the database refuses a `valid_until`
/// beyond the horizon, LCS01; the caller checks it first).
pub(crate) async fn insert_approval(
    conn: &mut PgConnection,
    a: &NewApproval<'_>,
) -> Result<(), Fail> {
    let (df, ds) = pair(a.decided);
    let (vf, vs) = match a.valid_until.map(pair) {
        Some((f, s)) => (Some(f), Some(s)),
        None => (None, None),
    };
    sqlx::query(
        "INSERT INTO lc_approvals (exec_id, tenant_id, decision, approver, decided_floor_us, \
             decided_submicro_ns, validity_ms, valid_until_floor_us, valid_until_submicro_ns, reason) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(a.exec.0)
    .bind(a.tenant.0)
    .bind(a.decision.as_str())
    .bind(a.approver.as_str())
    .bind(df)
    .bind(ds)
    .bind(a.validity_ms)
    .bind(vf)
    .bind(vs)
    .bind(a.reason)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// `tenant`'s execs awaiting approval, oldest first, at most `limit`.
pub(crate) async fn awaiting_execs(
    conn: &mut PgConnection,
    tenant: TenantId,
    limit: usize,
) -> Result<Vec<ExecRecord>, Fail> {
    let rows = sqlx::query(&format!(
        "{EXEC_SELECT} WHERE e.tenant_id = $1 AND e.state = 'awaiting_approval' \
          ORDER BY e.exec_id LIMIT $2"
    ))
    .bind(tenant.0)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(exec_from).collect()
}

/// `tenant`'s newest approval decisions (by decided cut, then exec),
/// at most `limit`.
pub(crate) async fn recent_approvals(
    conn: &mut PgConnection,
    tenant: TenantId,
    limit: usize,
) -> Result<Vec<ApprovalRecord>, Fail> {
    let rows = sqlx::query(
        "SELECT exec_id, decision, approver, decided_floor_us, decided_submicro_ns, validity_ms, \
                valid_until_floor_us, valid_until_submicro_ns, reason \
           FROM lc_approvals WHERE tenant_id = $1 \
          ORDER BY decided_floor_us DESC, decided_submicro_ns DESC, exec_id DESC LIMIT $2",
    )
    .bind(tenant.0)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| approval_from(r, "", ExecId(r.try_get("exec_id")?), tenant))
        .collect()
}

/// The `valid_until` of exec `exec`'s approval, `None` when it has none
/// (it needed none, or was denied).
pub(crate) async fn approval_valid_until(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Option<Timestamp>, Fail> {
    let row = sqlx::query(
        "SELECT valid_until_floor_us, valid_until_submicro_ns FROM lc_approvals \
          WHERE exec_id = $1 AND decision = 'approved'",
    )
    .bind(exec.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref()
        .map(|r| instant_at(r, "valid_until_floor_us", "valid_until_submicro_ns"))
        .transpose()
}

/// Exec `exec` of `tenant`.
pub(crate) async fn read_exec(
    conn: &mut PgConnection,
    tenant: TenantId,
    exec: ExecId,
) -> Result<Option<ExecRecord>, Fail> {
    let row = sqlx::query(&format!(
        "{EXEC_SELECT} WHERE e.exec_id = $1 AND e.tenant_id = $2"
    ))
    .bind(exec.0)
    .bind(tenant.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(exec_from).transpose()
}

/// `tenant`'s execs after `after`, ascending, at most `limit`.
pub(crate) async fn list_execs(
    conn: &mut PgConnection,
    tenant: TenantId,
    after: Option<ExecId>,
    limit: usize,
) -> Result<Vec<ExecRecord>, Fail> {
    let rows = sqlx::query(&format!(
        "{EXEC_SELECT} WHERE e.tenant_id = $1 AND e.exec_id > $2 ORDER BY e.exec_id LIMIT $3"
    ))
    .bind(tenant.0)
    .bind(after.map_or(0, |a| a.0))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(exec_from).collect()
}

/// Locks exec `exec` of `tenant` (`FOR UPDATE`); whether it exists.
pub(crate) async fn lock_exec(
    conn: &mut PgConnection,
    tenant: TenantId,
    exec: ExecId,
) -> Result<bool, Fail> {
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT exec_id FROM lc_execs WHERE exec_id = $1 AND tenant_id = $2 FOR UPDATE",
    )
    .bind(exec.0)
    .bind(tenant.0)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(found.is_some())
}

/// Marks a cancel request.
pub(crate) async fn set_cancel_requested(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<(), Fail> {
    sqlx::query("UPDATE lc_execs SET cancel_requested = true WHERE exec_id = $1")
        .bind(exec.0)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A sandbox Lease with what the store decides by.
#[derive(Debug, Clone)]
pub(crate) struct LeaseRow {
    pub lease_id: SandboxLeaseId,
    pub exec_id: ExecId,
    pub tenant_id: TenantId,
    pub attempt: AttemptNo,
    pub generation: Generation,
    pub provider_id: ProviderId,
    pub state: LeaseState,
    pub expiry: Timestamp,
    pub released: Option<Timestamp>,
    pub exec_state: ExecState,
    pub attempt_state: AttemptState,
    pub terminal_reason: Option<TerminalReason>,
    pub cancel_requested: bool,
    pub timeout_deadline: Option<Timestamp>,
    pub on_timeout: OnTimeout,
    pub restore_head: Option<Digest>,
    pub attachment: Option<serde_json::Value>,
    pub workspace_id: WorkspaceId,
}

const LEASE_SELECT: &str = "SELECT l.lease_id, l.exec_id, e.tenant_id, l.attempt, l.generation, \
        l.provider_id, l.state, l.expiry_floor_us, l.expiry_submicro_ns, l.released_floor_us, \
        l.released_submicro_ns, e.state AS exec_state, a.state AS attempt_state, \
        e.terminal_reason, e.cancel_requested, e.timeout_floor_us, e.timeout_submicro_ns, \
        e.on_timeout, l.restore_head, l.attachment::text AS attachment, e.workspace_id \
   FROM lc_sandbox_leases l \
   JOIN lc_execs e ON e.exec_id = l.exec_id \
   JOIN lc_attempts a ON a.exec_id = l.exec_id AND a.attempt = l.attempt";

fn lease_from(row: &PgRow) -> Result<LeaseRow, Fail> {
    Ok(LeaseRow {
        lease_id: SandboxLeaseId(row.try_get("lease_id")?),
        exec_id: ExecId(row.try_get("exec_id")?),
        tenant_id: TenantId(row.try_get("tenant_id")?),
        attempt: AttemptNo(row.try_get("attempt")?),
        generation: Generation(row.try_get("generation")?),
        provider_id: provider_id_at(row, "provider_id")?,
        state: parse_enum(row, "state", LeaseState::parse)?,
        expiry: instant_at(row, "expiry_floor_us", "expiry_submicro_ns")?,
        released: opt_instant_at(row, "released_floor_us", "released_submicro_ns")?,
        exec_state: parse_enum(row, "exec_state", ExecState::parse)?,
        attempt_state: parse_enum(row, "attempt_state", AttemptState::parse)?,
        terminal_reason: row
            .try_get::<Option<String>, _>("terminal_reason")?
            .map(|r| {
                TerminalReason::parse(&r).ok_or_else(|| corrupt(format!("terminal_reason {r:?}")))
            })
            .transpose()?,
        cancel_requested: row.try_get("cancel_requested")?,
        timeout_deadline: opt_instant_at(row, "timeout_floor_us", "timeout_submicro_ns")?,
        on_timeout: parse_enum(row, "on_timeout", OnTimeout::parse)?,
        restore_head: opt_digest_at(row, "restore_head")?,
        attachment: row
            .try_get::<Option<String>, _>("attachment")?
            .map(|t| serde_json::from_str(&t).map_err(|e| corrupt(format!("attachment: {e}"))))
            .transpose()?,
        workspace_id: WorkspaceId(row.try_get("workspace_id")?),
    })
}

/// Locks sandbox Lease `lease` (`FOR UPDATE OF l`) and reads it with its
/// exec and attempt.
pub(crate) async fn lock_lease(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
) -> Result<Option<LeaseRow>, Fail> {
    let row = sqlx::query(&format!(
        "{LEASE_SELECT} WHERE l.lease_id = $1 FOR UPDATE OF l"
    ))
    .bind(lease.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(lease_from).transpose()
}

/// A due lease with what the reconciler needs to act on it.
pub(crate) struct DueRow {
    pub lease: LeaseRow,
    pub provider_url: String,
    pub runtime: Digest,
    pub shape: String,
    pub command: Vec<String>,
    pub workspace_id: WorkspaceId,
    pub last_seq: i64,
    /// Whether the attempt's terminal page is acknowledged (a staged but
    /// unacknowledged one does not count: it releases nothing).
    pub terminal_page: bool,
    pub reservation_expiry: Timestamp,
    pub stdin_open: bool,
    /// The exec's highest input seq recorded `sent`, 0 if none.
    pub last_sent_input_seq: i64,
    /// The `valid_until` of the exec's approval, when it was approved.
    pub approval_valid_until: Option<Timestamp>,
}

const DUE_SELECT: &str = "SELECT l.lease_id, l.exec_id, e.tenant_id, l.attempt, l.generation, \
        l.provider_id, l.state, l.expiry_floor_us, l.expiry_submicro_ns, l.released_floor_us, \
        l.released_submicro_ns, e.state AS exec_state, a.state AS attempt_state, \
        e.terminal_reason, e.cancel_requested, e.timeout_floor_us, e.timeout_submicro_ns, \
        e.on_timeout, l.restore_head, l.attachment::text AS attachment, \
        p.url, e.runtime_digest, e.shape, e.command::text AS command, e.workspace_id, e.stdin_open, \
        r.expiry_floor_us AS reservation_floor_us, r.expiry_submicro_ns AS reservation_submicro_ns, \
        coalesce((SELECT max(o.seq) FROM lc_output_pages o \
                   WHERE o.exec_id = l.exec_id AND o.attempt = l.attempt), 0) AS last_seq, \
        EXISTS (SELECT 1 FROM lc_output_pages o WHERE o.exec_id = l.exec_id \
                   AND o.attempt = l.attempt AND o.kind = 'terminal' \
                   AND o.state = 'acked') AS terminal_page, \
        coalesce((SELECT max(i.input_seq) FROM lc_exec_inputs i \
                   WHERE i.exec_id = l.exec_id AND i.state = 'sent'), 0) AS last_sent_input_seq, \
        ap.valid_until_floor_us AS approval_floor_us, \
        ap.valid_until_submicro_ns AS approval_submicro_ns \
   FROM lc_sandbox_leases l \
   JOIN lc_execs e ON e.exec_id = l.exec_id \
   JOIN lc_attempts a ON a.exec_id = l.exec_id AND a.attempt = l.attempt \
   JOIN lc_providers p ON p.provider_id = l.provider_id \
   JOIN lc_reservations r ON r.exec_id = l.exec_id AND r.attempt = l.attempt \
                         AND r.generation = l.generation \
   LEFT JOIN lc_approvals ap ON ap.exec_id = l.exec_id AND ap.decision = 'approved'";

fn due_from(row: &PgRow) -> Result<DueRow, Fail> {
    let lease = lease_from(row)?;
    Ok(DueRow {
        command: serde_json::from_str(&row.try_get::<String, _>("command")?)
            .map_err(|e| corrupt(format!("command of exec {}: {e}", lease.exec_id)))?,
        lease,
        provider_url: row.try_get("url")?,
        runtime: digest_at(row, "runtime_digest")?,
        shape: row.try_get("shape")?,
        workspace_id: WorkspaceId(row.try_get("workspace_id")?),
        last_seq: row.try_get("last_seq")?,
        terminal_page: row.try_get("terminal_page")?,
        reservation_expiry: instant_at(row, "reservation_floor_us", "reservation_submicro_ns")?,
        stdin_open: row.try_get("stdin_open")?,
        last_sent_input_seq: row.try_get("last_sent_input_seq")?,
        approval_valid_until: opt_instant_at(row, "approval_floor_us", "approval_submicro_ns")?,
    })
}

/// Up to `limit` unreleased Leases, soonest expiry first (then by id): a
/// renewal moves a Lease back, and a Lease whose release is pending keeps
/// its expiry, so a bounded batch never starves any Lease for good.
pub(crate) async fn due_leases(conn: &mut PgConnection, limit: usize) -> Result<Vec<DueRow>, Fail> {
    let rows = sqlx::query(&format!(
        "{DUE_SELECT} WHERE l.state <> 'released' \
          ORDER BY l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id LIMIT $1"
    ))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(due_from).collect()
}

/// One Lease as [`due_leases`] reads it, released or not.
pub(crate) async fn due_lease(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
) -> Result<Option<DueRow>, Fail> {
    let row = sqlx::query(&format!("{DUE_SELECT} WHERE l.lease_id = $1"))
        .bind(lease.0)
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(due_from).transpose()
}

/// Sets a Lease's state.
pub(crate) async fn set_lease_state(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    state: LeaseState,
) -> Result<(), Fail> {
    sqlx::query("UPDATE lc_sandbox_leases SET state = $2 WHERE lease_id = $1")
        .bind(lease.0)
        .bind(state.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Sets a Lease's expiry.
pub(crate) async fn set_lease_expiry(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    expiry: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(expiry);
    sqlx::query(
        "UPDATE lc_sandbox_leases SET expiry_floor_us = $2, expiry_submicro_ns = $3 WHERE lease_id = $1",
    )
    .bind(lease.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Marks a Lease released with its validated evidence at `at`.
pub(crate) async fn release_lease(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    evidence: &serde_json::Value,
    at: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(at);
    sqlx::query(
        "UPDATE lc_sandbox_leases SET state = 'released', evidence = $2::jsonb, \
                released_floor_us = $3, released_submicro_ns = $4 WHERE lease_id = $1",
    )
    .bind(lease.0)
    .bind(evidence.to_string())
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A Reservation.
#[derive(Debug, Clone)]
pub(crate) struct ReservationRow {
    pub tollgate_lease_id: i64,
    pub units: i64,
    pub expiry: Timestamp,
    pub state: ReservationState,
}

/// Locks the Reservation of (exec, attempt, generation).
pub(crate) async fn lock_reservation(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
) -> Result<Option<ReservationRow>, Fail> {
    let row = sqlx::query(
        "SELECT tollgate_lease_id, units, expiry_floor_us, expiry_submicro_ns, state \
           FROM lc_reservations WHERE exec_id = $1 AND attempt = $2 AND generation = $3 FOR UPDATE",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(ReservationRow {
        tollgate_lease_id: row.try_get("tollgate_lease_id")?,
        units: row.try_get("units")?,
        expiry: instant_at(&row, "expiry_floor_us", "expiry_submicro_ns")?,
        state: parse_enum(&row, "state", ReservationState::parse)?,
    }))
}

/// Sets a Reservation's expiry (after the Tollgate renewal).
pub(crate) async fn set_reservation_expiry(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
    expiry: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(expiry);
    sqlx::query(
        "UPDATE lc_reservations SET expiry_floor_us = $4, expiry_submicro_ns = $5 \
          WHERE exec_id = $1 AND attempt = $2 AND generation = $3",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Marks a Reservation returned at `at`.
pub(crate) async fn return_reservation(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
    at: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(at);
    sqlx::query(
        "UPDATE lc_reservations SET state = 'returned', returned_floor_us = $4, returned_submicro_ns = $5 \
          WHERE exec_id = $1 AND attempt = $2 AND generation = $3 AND state = 'held'",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sets an attempt's state.
pub(crate) async fn set_attempt_state(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    state: AttemptState,
) -> Result<(), Fail> {
    sqlx::query("UPDATE lc_attempts SET state = $3 WHERE exec_id = $1 AND attempt = $2")
        .bind(exec.0)
        .bind(attempt.0)
        .bind(state.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// An exec's timeout in milliseconds, `None` without one.
pub(crate) async fn exec_timeout_ms(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Option<i64>, Fail> {
    Ok(
        sqlx::query_scalar("SELECT timeout_ms FROM lc_execs WHERE exec_id = $1")
            .bind(exec.0)
            .fetch_one(&mut *conn)
            .await?,
    )
}

/// Sets an exec's timeout deadline (the database refuses one beyond the
/// horizon; the caller checks it first, with its code).
pub(crate) async fn set_timeout_deadline(
    conn: &mut PgConnection,
    exec: ExecId,
    deadline: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(deadline);
    sqlx::query(
        "UPDATE lc_execs SET timeout_floor_us = $2, timeout_submicro_ns = $3 WHERE exec_id = $1",
    )
    .bind(exec.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sets an exec's state (and its exit code, when given).
pub(crate) async fn set_exec_state(
    conn: &mut PgConnection,
    exec: ExecId,
    state: ExecState,
    exit_code: Option<i32>,
) -> Result<(), Fail> {
    sqlx::query(
        "UPDATE lc_execs SET state = $2, exit_code = coalesce($3, exit_code) WHERE exec_id = $1",
    )
    .bind(exec.0)
    .bind(state.as_str())
    .bind(exit_code)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Records why the exec goes terminal, unless a reason is recorded.
pub(crate) async fn set_terminal_reason(
    conn: &mut PgConnection,
    exec: ExecId,
    reason: TerminalReason,
    expired_by: Option<ExpiryCause>,
) -> Result<(), Fail> {
    sqlx::query(
        "UPDATE lc_execs SET terminal_reason = $2, expired_by = $3 \
         WHERE exec_id = $1 AND terminal_reason IS NULL",
    )
    .bind(exec.0)
    .bind(reason.as_str())
    .bind(expired_by.map(|c| c.as_str()))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Output pages.

const PAGE_COLUMNS: &str =
    "exec_id, attempt, seq, kind, bytes, sha256, length, exit_code, exit_signal";

fn meta_from(row: &PgRow) -> Result<PageMeta, Fail> {
    let code: Option<i32> = row.try_get("exit_code")?;
    let signal: Option<i32> = row.try_get("exit_signal")?;
    let kind = parse_enum(row, "kind", page_kind)?;
    let length: i32 = row.try_get("length")?;
    Ok(PageMeta {
        exec_id: ExecId(row.try_get("exec_id")?),
        attempt: AttemptNo(row.try_get("attempt")?),
        seq: row.try_get("seq")?,
        kind,
        length: u32::try_from(length).map_err(|_| corrupt(format!("page length {length}")))?,
        sha256: digest_at(row, "sha256")?,
        // The database's check: exactly the last page of a generation
        // (terminal or stopped) carries an exit status.
        exit: (code.is_some() || signal.is_some()).then_some(ExitStatus { code, signal }),
    })
}

/// The acknowledged pages of (exec, attempt) with seq `> after_seq`,
/// ascending, at most `limit`, none at or after the first pending page;
/// bytes only where the store holds them.
pub(crate) async fn read_pages(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    after_seq: i64,
    limit: usize,
) -> Result<Vec<StoredPage>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {PAGE_COLUMNS} FROM lc_output_pages \
          WHERE exec_id = $1 AND attempt = $2 AND seq > $3 AND state = 'acked' \
            AND seq < coalesce((SELECT min(p.seq) FROM lc_output_pages p \
                                 WHERE p.exec_id = $1 AND p.attempt = $2 \
                                   AND p.state = 'pending'), 9223372036854775807) \
          ORDER BY seq LIMIT $4"
    ))
    .bind(exec.0)
    .bind(attempt.0)
    .bind(after_seq)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(StoredPage {
                meta: meta_from(r)?,
                bytes: r.try_get("bytes")?,
            })
        })
        .collect()
}

/// The stored sha256 of each of `seqs` that is stored.
pub(crate) async fn page_digests(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    seqs: &[i64],
) -> Result<BTreeMap<i64, Digest>, Fail> {
    let rows = sqlx::query(
        "SELECT seq, sha256 FROM lc_output_pages WHERE exec_id = $1 AND attempt = $2 AND seq = ANY($3)",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(seqs)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("seq")?, digest_at(r, "sha256")?)))
        .collect()
}

/// The highest stored seq of (exec, attempt) (0 if none) and whether the
/// terminal page is stored.
pub(crate) async fn page_tail(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
) -> Result<(i64, Option<ExitStatus>), Fail> {
    let row = sqlx::query(
        "SELECT coalesce(max(seq), 0) AS last_seq, \
                (SELECT exit_code FROM lc_output_pages t WHERE t.exec_id = $1 AND t.attempt = $2 \
                    AND t.kind = 'terminal') AS exit_code, \
                (SELECT exit_signal FROM lc_output_pages t WHERE t.exec_id = $1 AND t.attempt = $2 \
                    AND t.kind = 'terminal') AS exit_signal, \
                EXISTS (SELECT 1 FROM lc_output_pages t WHERE t.exec_id = $1 AND t.attempt = $2 \
                    AND t.kind = 'terminal') AS has_terminal \
           FROM lc_output_pages WHERE exec_id = $1 AND attempt = $2",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .fetch_one(&mut *conn)
    .await?;
    let has_terminal: bool = row.try_get("has_terminal")?;
    let exit = has_terminal
        .then(|| -> Result<ExitStatus, Fail> {
            Ok(ExitStatus {
                code: row.try_get("exit_code")?,
                signal: row.try_get("exit_signal")?,
            })
        })
        .transpose()?;
    Ok((row.try_get("last_seq")?, exit))
}

/// Inserts one page with its bytes, acknowledged (the reconciler's
/// pages: readable at once, no owner).
pub(crate) async fn insert_page(conn: &mut PgConnection, p: &OutputPage) -> Result<(), Fail> {
    let length = i32::try_from(p.bytes.len())
        .map_err(|_| corrupt(format!("page {} is {} bytes", p.seq, p.bytes.len())))?;
    sqlx::query(&format!(
        "INSERT INTO lc_output_pages ({PAGE_COLUMNS}, state) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'acked')"
    ))
    .bind(p.exec_id.0)
    .bind(p.attempt.0)
    .bind(p.seq)
    .bind(p.kind.as_str())
    .bind(&p.bytes)
    .bind(&p.sha256.0[..])
    .bind(length)
    .bind(p.exit.and_then(|e| e.code))
    .bind(p.exit.and_then(|e| e.signal))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The metadata of each of `seqs` that is stored for (exec, attempt).
pub(crate) async fn page_metas(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    seqs: &[i64],
) -> Result<BTreeMap<i64, PageMeta>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {PAGE_COLUMNS} FROM lc_output_pages \
          WHERE exec_id = $1 AND attempt = $2 AND seq = ANY($3)"
    ))
    .bind(exec.0)
    .bind(attempt.0)
    .bind(seqs)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let m = meta_from(r)?;
            Ok((m.seq, m))
        })
        .collect()
}

/// Inserts one page's metadata as `pending`, staged by owner
/// (`generation`, `fence`); its bytes go to the sink.
pub(crate) async fn insert_page_meta(
    conn: &mut PgConnection,
    m: &PageMeta,
    generation: OwnerGeneration,
    fence: OwnerFence,
) -> Result<(), Fail> {
    let length =
        i32::try_from(m.length).map_err(|_| corrupt(format!("page length {}", m.length)))?;
    let done = sqlx::query(
        "INSERT INTO lc_output_pages (exec_id, attempt, seq, kind, bytes, sha256, length, \
             exit_code, exit_signal, state, owner_generation, owner_fence) \
         VALUES ($1, $2, $3, $4, NULL, $5, $6, $7, $8, 'pending', $9, $10)",
    )
    .bind(m.exec_id.0)
    .bind(m.attempt.0)
    .bind(m.seq)
    .bind(m.kind.as_str())
    .bind(&m.sha256.0[..])
    .bind(length)
    .bind(m.exit.and_then(|e| e.code))
    .bind(m.exit.and_then(|e| e.signal))
    .bind(generation.0)
    .bind(fence.0)
    .execute(&mut *conn)
    .await?;
    one_row(done, "staging a page")
}

/// The `pending` pages of (exec, attempt), by seq, at most `limit`.
pub(crate) async fn pending_pages(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    limit: usize,
) -> Result<Vec<PageMeta>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {PAGE_COLUMNS} FROM lc_output_pages \
          WHERE exec_id = $1 AND attempt = $2 AND state = 'pending' ORDER BY seq LIMIT $3"
    ))
    .bind(exec.0)
    .bind(attempt.0)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(meta_from).collect()
}

/// Marks every pending page of (exec, attempt) with `seq <= through_seq`
/// acked; how many.
pub(crate) async fn ack_pages_through(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    through_seq: i64,
) -> Result<u64, Fail> {
    let done = sqlx::query(
        "UPDATE lc_output_pages SET state = 'acked' \
          WHERE exec_id = $1 AND attempt = $2 AND seq <= $3 AND state = 'pending'",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(through_seq)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// The seq of the acknowledged terminal page of (exec, attempt), if any.
pub(crate) async fn acked_terminal_seq(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
) -> Result<Option<i64>, Fail> {
    Ok(sqlx::query_scalar(
        "SELECT seq FROM lc_output_pages \
          WHERE exec_id = $1 AND attempt = $2 AND kind = 'terminal' AND state = 'acked'",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .fetch_optional(&mut *conn)
    .await?)
}

// ---------------------------------------------------------------------------
// Ownership and transition receipts. Rows are locked after the sandbox
// Lease and the exec (when a transaction locks those) and before the
// Reservation: Lease, exec, owner, Reservation, Tollgate.

fn basis_of(s: &str) -> Option<TakeoverBasis> {
    match s {
        "unowned" => Some(TakeoverBasis::Unowned),
        "released" => Some(TakeoverBasis::Released),
        "expired" => Some(TakeoverBasis::Expired),
        _ => None,
    }
}

/// An exec's ownership row.
#[derive(Debug, Clone)]
pub(crate) struct OwnerRow {
    pub ownership: Ownership,
    pub basis: TakeoverBasis,
}

/// Locks and reads the ownership of `exec` (`FOR UPDATE`).
pub(crate) async fn lock_owner(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Option<OwnerRow>, Fail> {
    let row = sqlx::query(
        "SELECT exec_id, token_sha256, generation, fence, heartbeat_expiry_floor_us, \
                heartbeat_expiry_submicro_ns, released, basis \
           FROM lc_exec_owners WHERE exec_id = $1 FOR UPDATE",
    )
    .bind(exec.0)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(OwnerRow {
        ownership: Ownership {
            exec_id: ExecId(row.try_get("exec_id")?),
            token_sha256: digest_at(&row, "token_sha256")?,
            generation: OwnerGeneration(row.try_get("generation")?),
            fence: OwnerFence(row.try_get("fence")?),
            heartbeat_expiry: instant_at(
                &row,
                "heartbeat_expiry_floor_us",
                "heartbeat_expiry_submicro_ns",
            )?,
            released: row.try_get("released")?,
        },
        basis: parse_enum(&row, "basis", basis_of)?,
    }))
}

/// Locks exec `exec` of `tenant` (`FOR UPDATE`, waiting) and reads its
/// state: what a takeover serializes on.
pub(crate) async fn lock_exec_state(
    conn: &mut PgConnection,
    tenant: TenantId,
    exec: ExecId,
) -> Result<Option<ExecState>, Fail> {
    let row =
        sqlx::query("SELECT state FROM lc_execs WHERE exec_id = $1 AND tenant_id = $2 FOR UPDATE")
            .bind(exec.0)
            .bind(tenant.0)
            .fetch_optional(&mut *conn)
            .await?;
    row.as_ref()
        .map(|r| parse_enum(r, "state", ExecState::parse))
        .transpose()
}

/// Up to `limit` execs a gateway may claim at certain cut `cut`: the
/// current Lease `active` (or the exec hibernated with a resume request
/// its owner acts on: see [`ACTIONABLE_INTENT`]), the exec not terminal, and no owner, a
/// released one, or one whose heartbeat expiry is at or before `cut`;
/// by exec id, each exec row locked (`SKIP LOCKED`: another claimer's or
/// a takeover's are skipped). The caller re-reads each ownership locked
/// and decides by the rule.
pub(crate) async fn claim_candidates(
    conn: &mut PgConnection,
    cut: Timestamp,
    limit: usize,
) -> Result<Vec<ExecId>, Fail> {
    let (f, s) = pair(cut);
    let rows = sqlx::query(&format!(
        "SELECT e.exec_id FROM lc_execs e \
           JOIN lc_attempts a ON a.exec_id = e.exec_id AND a.attempt = e.current_attempt \
           JOIN lc_sandbox_leases l ON l.exec_id = e.exec_id AND l.attempt = a.attempt \
                                   AND l.generation = a.generation \
           LEFT JOIN lc_exec_owners o ON o.exec_id = e.exec_id \
          WHERE e.state <> 'terminal' \
            AND (l.state = 'active' \
                 OR (e.state = 'hibernated' AND EXISTS ( \
                        SELECT 1 FROM lc_resume_intents i WHERE {ACTIONABLE_INTENT}))) \
            AND (o.exec_id IS NULL OR o.released \
                 OR (o.heartbeat_expiry_floor_us, o.heartbeat_expiry_submicro_ns) <= ($1, $2)) \
          ORDER BY e.exec_id LIMIT $3 FOR UPDATE OF e SKIP LOCKED"
    ))
    .bind(f)
    .bind(s)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| Ok(ExecId(r.try_get("exec_id")?)))
        .collect()
}

/// Writes a new ownership of `exec` (inserted, or replacing the previous
/// one) with a fence drawn from `lc_owner_fence_seq`; returns the fence.
pub(crate) async fn write_owner(
    conn: &mut PgConnection,
    exec: ExecId,
    tenant: TenantId,
    token_sha256: Digest,
    generation: OwnerGeneration,
    heartbeat_expiry: Timestamp,
    basis: TakeoverBasis,
) -> Result<OwnerFence, Fail> {
    let (f, s) = pair(heartbeat_expiry);
    let fence: i64 = sqlx::query_scalar(
        "INSERT INTO lc_exec_owners (exec_id, tenant_id, token_sha256, generation, \
             heartbeat_expiry_floor_us, heartbeat_expiry_submicro_ns, released, basis) \
         VALUES ($1, $2, $3, $4, $5, $6, false, $7) \
         ON CONFLICT (exec_id) DO UPDATE SET token_sha256 = EXCLUDED.token_sha256, \
             generation = EXCLUDED.generation, fence = EXCLUDED.fence, \
             heartbeat_expiry_floor_us = EXCLUDED.heartbeat_expiry_floor_us, \
             heartbeat_expiry_submicro_ns = EXCLUDED.heartbeat_expiry_submicro_ns, \
             released = false, basis = EXCLUDED.basis \
         RETURNING fence",
    )
    .bind(exec.0)
    .bind(tenant.0)
    .bind(&token_sha256.0[..])
    .bind(generation.0)
    .bind(f)
    .bind(s)
    .bind(basis.as_str())
    .fetch_one(&mut *conn)
    .await?;
    Ok(OwnerFence(fence))
}

/// Sets the heartbeat expiry of `exec`'s ownership.
pub(crate) async fn set_owner_heartbeat(
    conn: &mut PgConnection,
    exec: ExecId,
    expiry: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(expiry);
    let done = sqlx::query(
        "UPDATE lc_exec_owners SET heartbeat_expiry_floor_us = $2, \
                heartbeat_expiry_submicro_ns = $3 WHERE exec_id = $1",
    )
    .bind(exec.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    one_row(done, "a heartbeat")
}

/// Marks `exec`'s ownership released.
pub(crate) async fn release_owner(conn: &mut PgConnection, exec: ExecId) -> Result<(), Fail> {
    let done = sqlx::query("UPDATE lc_exec_owners SET released = true WHERE exec_id = $1")
        .bind(exec.0)
        .execute(&mut *conn)
        .await?;
    one_row(done, "releasing an ownership")
}

/// An exec as its owner sees it, without the ownership.
#[derive(Debug, Clone)]
pub(crate) struct OwnedView {
    pub tenant_id: TenantId,
    pub identity: CanonicalIdentity,
    pub exec_state: ExecState,
    pub attempt: AttemptNo,
    pub lease_id: SandboxLeaseId,
    pub lease_generation: Generation,
    pub lease_state: LeaseState,
    pub provider_url: String,
    pub staged_through: i64,
    pub acked_through: i64,
    pub terminal_acked_seq: Option<i64>,
    pub cancel_requested: bool,
    pub hibernation_step: Option<HibernationStep>,
    pub attempt_parked: bool,
    pub resume_op_key: Option<String>,
    pub lease_attached: bool,
    pub stopped_acked_seq: Option<i64>,
}

/// The resume intents an owner acts on, for `e` (exec), `a` (its current
/// attempt) and `l` (the current Lease): of the attempt, without a receipt
/// and not refused, and either not prepared yet and recorded for the
/// attempt's current generation, or prepared as the current Lease while
/// that Lease is not released (one released unattached without a refusal,
/// e.g. expired before its attachment, needs a new request).
const ACTIONABLE_INTENT: &str = "i.exec_id = e.exec_id AND i.attempt = a.attempt \
       AND i.refused_code IS NULL \
       AND ((i.prepared_lease_id IS NULL AND i.from_generation = a.generation) \
            OR (i.prepared_lease_id = l.lease_id AND l.state <> 'released')) \
       AND NOT EXISTS (SELECT 1 FROM lc_resume_receipts r \
                        WHERE r.exec_id = i.exec_id AND r.op_key = i.op_key)";

/// The operation key of the exec's actionable resume request (recorded
/// for its current generation or carrying its prepared Lease, neither
/// refused nor receipted), the earliest if several.
pub(crate) async fn actionable_intent(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Option<String>, Fail> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT i.op_key FROM lc_execs e \
           JOIN lc_attempts a ON a.exec_id = e.exec_id AND a.attempt = e.current_attempt \
           JOIN lc_sandbox_leases l ON l.exec_id = e.exec_id AND l.attempt = a.attempt \
                                   AND l.generation = a.generation \
           JOIN lc_resume_intents i ON {ACTIONABLE_INTENT} \
          WHERE e.exec_id = $1 \
          ORDER BY i.recorded_floor_us, i.recorded_submicro_ns, i.op_key LIMIT 1"
    ))
    .bind(exec.0)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Exec `exec` with its current attempt and Lease and where its output
/// stands.
pub(crate) async fn owned_view(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Option<OwnedView>, Fail> {
    // The current generation's stopped page: a stopped page ends its
    // generation, so the attempt holds one per earlier generation that
    // quiesced; one more is the current generation's.
    let row = sqlx::query(&format!(
        "SELECT e.exec_id, e.tenant_id, e.lease_id AS canonical_lease_id, e.provider_id, \
                e.runtime_digest, e.workspace_id, e.state, e.cancel_requested, \
                a.attempt, a.state = 'parked' AS attempt_parked, \
                l.lease_id, l.generation, l.state AS lease_state, \
                l.attachment IS NOT NULL AS lease_attached, p.url, \
                coalesce((SELECT max(o.seq) FROM lc_output_pages o \
                           WHERE o.exec_id = e.exec_id AND o.attempt = a.attempt), 0) AS staged_through, \
                coalesce((SELECT min(o.seq) FROM lc_output_pages o \
                           WHERE o.exec_id = e.exec_id AND o.attempt = a.attempt \
                             AND o.state = 'pending') - 1, \
                         (SELECT max(o.seq) FROM lc_output_pages o \
                           WHERE o.exec_id = e.exec_id AND o.attempt = a.attempt), 0) AS acked_through, \
                (SELECT o.seq FROM lc_output_pages o \
                  WHERE o.exec_id = e.exec_id AND o.attempt = a.attempt AND o.kind = 'terminal' \
                    AND o.state = 'acked') AS terminal_acked_seq, \
                (SELECT h.step FROM lc_hibernations h \
                  WHERE h.exec_id = e.exec_id AND h.attempt = a.attempt \
                    AND h.generation = a.generation) AS hibernation_step, \
                (SELECT i.op_key FROM lc_resume_intents i WHERE {ACTIONABLE_INTENT} \
                  ORDER BY i.recorded_floor_us, i.recorded_submicro_ns, i.op_key LIMIT 1) AS resume_op_key, \
                (SELECT o.seq FROM lc_output_pages o \
                  WHERE o.exec_id = e.exec_id AND o.attempt = a.attempt AND o.kind = 'stopped' \
                    AND o.state = 'acked' \
                  ORDER BY o.seq DESC LIMIT 1) AS last_stopped_acked_seq, \
                (SELECT max(o.seq) FROM lc_output_pages o \
                  WHERE o.exec_id = e.exec_id AND o.attempt = a.attempt \
                    AND o.kind = 'stopped') AS last_stopped_seq, \
                (SELECT count(*) FROM lc_output_pages o \
                  WHERE o.exec_id = e.exec_id AND o.attempt = a.attempt \
                    AND o.kind = 'stopped') AS stopped_pages, \
                (SELECT count(*) FROM lc_hibernations h \
                  WHERE h.exec_id = e.exec_id AND h.attempt = a.attempt \
                    AND h.generation < a.generation AND h.step IN ('quiesced', 'parked')) AS earlier_quiesced \
           FROM lc_execs e \
           JOIN lc_attempts a ON a.exec_id = e.exec_id AND a.attempt = e.current_attempt \
           JOIN lc_sandbox_leases l ON l.exec_id = e.exec_id AND l.attempt = a.attempt \
                                   AND l.generation = a.generation \
           JOIN lc_providers p ON p.provider_id = l.provider_id \
          WHERE e.exec_id = $1"
    ))
    .bind(exec.0)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let exec_id = ExecId(row.try_get("exec_id")?);
    Ok(Some(OwnedView {
        tenant_id: TenantId(row.try_get("tenant_id")?),
        identity: CanonicalIdentity {
            exec_id,
            lease_id: SandboxLeaseId(row.try_get("canonical_lease_id")?),
            provider_id: provider_id_at(&row, "provider_id")?,
            runtime: digest_at(&row, "runtime_digest")?,
            workspace_id: WorkspaceId(row.try_get("workspace_id")?),
        },
        exec_state: parse_enum(&row, "state", ExecState::parse)?,
        attempt: AttemptNo(row.try_get("attempt")?),
        lease_id: SandboxLeaseId(row.try_get("lease_id")?),
        lease_generation: Generation(row.try_get("generation")?),
        lease_state: parse_enum(&row, "lease_state", LeaseState::parse)?,
        provider_url: row.try_get("url")?,
        staged_through: row.try_get("staged_through")?,
        acked_through: row.try_get("acked_through")?,
        terminal_acked_seq: row.try_get("terminal_acked_seq")?,
        cancel_requested: row.try_get("cancel_requested")?,
        hibernation_step: row
            .try_get::<Option<String>, _>("hibernation_step")?
            .map(|v| {
                HibernationStep::parse(&v)
                    .ok_or_else(|| Fail::from(corrupt(format!("hibernation_step {v:?}"))))
            })
            .transpose()?,
        attempt_parked: row.try_get("attempt_parked")?,
        resume_op_key: row.try_get("resume_op_key")?,
        lease_attached: row.try_get("lease_attached")?,
        stopped_acked_seq: {
            let stopped: i64 = row.try_get("stopped_pages")?;
            let earlier: i64 = row.try_get("earlier_quiesced")?;
            let last: Option<i64> = row.try_get("last_stopped_seq")?;
            let last_acked: Option<i64> = row.try_get("last_stopped_acked_seq")?;
            if stopped > earlier && last.is_some() && last == last_acked {
                last_acked
            } else {
                None
            }
        },
    }))
}

const TRANSITION_COLUMNS: &str = "exec_id, transition_id, kind, token_sha256, owner_generation, \
     owner_fence, request_sha256, committed_floor_us, committed_submicro_ns, detail::text AS detail";

/// The receipt of transition `id` of `exec`, if committed.
pub(crate) async fn read_transition(
    conn: &mut PgConnection,
    exec: ExecId,
    id: &str,
) -> Result<Option<TransitionReceipt>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {TRANSITION_COLUMNS} FROM lc_transitions WHERE exec_id = $1 AND transition_id = $2"
    ))
    .bind(exec.0)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(TransitionReceipt {
        exec_id: ExecId(row.try_get("exec_id")?),
        transition_id: row.try_get("transition_id")?,
        kind: parse_enum(&row, "kind", TransitionKind::parse)?,
        token_sha256: digest_at(&row, "token_sha256")?,
        owner_generation: OwnerGeneration(row.try_get("owner_generation")?),
        owner_fence: OwnerFence(row.try_get("owner_fence")?),
        request_sha256: digest_at(&row, "request_sha256")?,
        committed_cut: instant_at(&row, "committed_floor_us", "committed_submicro_ns")?,
        detail: json_at(&row, "detail")?,
    }))
}

/// Inserts a receipt.
pub(crate) async fn insert_transition(
    conn: &mut PgConnection,
    r: &TransitionReceipt,
) -> Result<(), Fail> {
    let (f, s) = pair(r.committed_cut);
    let done = sqlx::query(
        "INSERT INTO lc_transitions (exec_id, transition_id, kind, token_sha256, \
             owner_generation, owner_fence, request_sha256, committed_floor_us, \
             committed_submicro_ns, detail) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb)",
    )
    .bind(r.exec_id.0)
    .bind(&r.transition_id)
    .bind(r.kind.as_str())
    .bind(&r.token_sha256.0[..])
    .bind(r.owner_generation.0)
    .bind(r.owner_fence.0)
    .bind(&r.request_sha256.0[..])
    .bind(f)
    .bind(s)
    .bind(r.detail.to_string())
    .execute(&mut *conn)
    .await?;
    one_row(done, "a transition receipt")
}

/// Whether `exec` has a receipt of `kind`.
pub(crate) async fn has_transition_kind(
    conn: &mut PgConnection,
    exec: ExecId,
    kind: TransitionKind,
) -> Result<bool, Fail> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM lc_transitions WHERE exec_id = $1 AND kind = $2)",
    )
    .bind(exec.0)
    .bind(kind.as_str())
    .fetch_one(&mut *conn)
    .await?)
}

// ---------------------------------------------------------------------------
// Inputs for a command's stdin.

const INPUT_COLUMNS: &str =
    "exec_id, input_seq, bytes, sha256, eof, state, send_transition_id, request_sha256";

fn input_from(row: &PgRow) -> Result<(InputRecord, Digest), Fail> {
    let rec = InputRecord {
        exec_id: ExecId(row.try_get("exec_id")?),
        input_seq: row.try_get("input_seq")?,
        bytes: row.try_get("bytes")?,
        sha256: digest_at(row, "sha256")?,
        eof: row.try_get("eof")?,
        state: parse_enum(row, "state", InputState::parse)?,
        send_transition_id: row.try_get("send_transition_id")?,
    };
    Ok((rec, digest_at(row, "request_sha256")?))
}

/// A new input's row.
pub(crate) struct NewInput<'a> {
    pub exec: ExecId,
    pub input_seq: i64,
    pub bytes: &'a [u8],
    pub sha256: Digest,
    pub eof: bool,
    pub op_key: &'a str,
    pub request_sha256: Digest,
    pub queued: Timestamp,
}

/// Inserts a queued input.
pub(crate) async fn insert_input(conn: &mut PgConnection, i: &NewInput<'_>) -> Result<(), Fail> {
    let (f, s) = pair(i.queued);
    sqlx::query(
        "INSERT INTO lc_exec_inputs (exec_id, input_seq, bytes, sha256, eof, op_key, \
             request_sha256, state, queued_floor_us, queued_submicro_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'queued', $8, $9)",
    )
    .bind(i.exec.0)
    .bind(i.input_seq)
    .bind(i.bytes)
    .bind(&i.sha256.0[..])
    .bind(i.eof)
    .bind(i.op_key)
    .bind(&i.request_sha256.0[..])
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The input `input_seq` of `exec` with its request digest, locked
/// (`FOR UPDATE`) when `lock`.
pub(crate) async fn read_input(
    conn: &mut PgConnection,
    exec: ExecId,
    input_seq: i64,
    lock: bool,
) -> Result<Option<(InputRecord, Digest)>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {INPUT_COLUMNS} FROM lc_exec_inputs WHERE exec_id = $1 AND input_seq = $2{}",
        if lock { " FOR UPDATE" } else { "" }
    ))
    .bind(exec.0)
    .bind(input_seq)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(input_from).transpose()
}

/// The exec's input queue: its last seq, its queued inputs and bytes, its
/// eof input (the exec row is locked by the caller, so it stays so).
pub(crate) async fn input_queue(conn: &mut PgConnection, exec: ExecId) -> Result<InputQueue, Fail> {
    let row = sqlx::query(
        "SELECT coalesce(max(input_seq), 0) AS last_seq, \
                count(*) FILTER (WHERE state = 'queued') AS queued_inputs, \
                coalesce(sum(octet_length(bytes)) FILTER (WHERE state = 'queued'), 0)::bigint \
                    AS queued_bytes, \
                min(input_seq) FILTER (WHERE eof) AS eof_seq \
           FROM lc_exec_inputs WHERE exec_id = $1",
    )
    .bind(exec.0)
    .fetch_one(&mut *conn)
    .await?;
    let queued_inputs: i64 = row.try_get("queued_inputs")?;
    let queued_bytes: i64 = row.try_get("queued_bytes")?;
    Ok(InputQueue {
        last_seq: row.try_get("last_seq")?,
        queued_inputs: u32::try_from(queued_inputs)
            .map_err(|_| corrupt(format!("{queued_inputs} queued inputs of exec {exec}")))?,
        queued_bytes: u64::try_from(queued_bytes)
            .map_err(|_| corrupt(format!("{queued_bytes} queued bytes of exec {exec}")))?,
        eof_seq: row.try_get("eof_seq")?,
    })
}

/// The highest sent input seq of `exec` (0 if none).
pub(crate) async fn sent_through(conn: &mut PgConnection, exec: ExecId) -> Result<i64, Fail> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(max(input_seq), 0) FROM lc_exec_inputs WHERE exec_id = $1 AND state = 'sent'",
    )
    .bind(exec.0)
    .fetch_one(&mut *conn)
    .await?)
}

/// Up to `limit` queued inputs of `exec`, by seq.
pub(crate) async fn queued_inputs(
    conn: &mut PgConnection,
    exec: ExecId,
    limit: usize,
) -> Result<Vec<InputRecord>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {INPUT_COLUMNS} FROM lc_exec_inputs WHERE exec_id = $1 AND state = 'queued' \
          ORDER BY input_seq LIMIT $2"
    ))
    .bind(exec.0)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(|r| input_from(r).map(|(i, _)| i)).collect()
}

/// Marks a queued input sent by the receipt `transition_id` (inserted
/// first); whether it was queued.
pub(crate) async fn mark_input_sent(
    conn: &mut PgConnection,
    exec: ExecId,
    input_seq: i64,
    transition_id: &str,
) -> Result<bool, Fail> {
    let done = sqlx::query(
        "UPDATE lc_exec_inputs SET state = 'sent', send_transition_id = $3 \
          WHERE exec_id = $1 AND input_seq = $2 AND state = 'queued'",
    )
    .bind(exec.0)
    .bind(input_seq)
    .bind(transition_id)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

// ---------------------------------------------------------------------------
// Workspaces, snapshots, hibernations and resumes.

/// Moves the exec's last activity to `at` unless it is later already.
pub(crate) async fn touch_activity(
    conn: &mut PgConnection,
    exec: ExecId,
    at: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(at);
    sqlx::query(
        "UPDATE lc_execs SET last_activity_floor_us = $2, last_activity_submicro_ns = $3 \
          WHERE exec_id = $1 \
            AND (coalesce(last_activity_floor_us, admitted_floor_us), \
                 coalesce(last_activity_submicro_ns, admitted_submicro_ns)) < ($2, $3)",
    )
    .bind(exec.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The exec's workspace, locked (`FOR UPDATE`) when `lock`.
pub(crate) async fn workspace_of(
    conn: &mut PgConnection,
    exec: ExecId,
    lock: bool,
) -> Result<Option<WorkspaceRecord>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT workspace_id, exec_id, head, snapshots FROM lc_workspaces WHERE exec_id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    ))
    .bind(exec.0)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(WorkspaceRecord {
        workspace_id: WorkspaceId(row.try_get("workspace_id")?),
        exec_id: ExecId(row.try_get("exec_id")?),
        head: opt_digest_at(&row, "head")?,
        snapshots: row.try_get("snapshots")?,
    }))
}

/// A new snapshot.
pub(crate) struct NewSnapshot<'a> {
    pub workspace_id: WorkspaceId,
    pub digest: Digest,
    pub parent: Option<Digest>,
    pub manifest: &'a [u8],
    pub lease_id: SandboxLeaseId,
    pub generation: Generation,
    pub committed: Timestamp,
}

/// Inserts the snapshot as the workspace's next and moves its head to it.
pub(crate) async fn insert_snapshot(
    conn: &mut PgConnection,
    n: &NewSnapshot<'_>,
) -> Result<(), Fail> {
    let (f, s) = pair(n.committed);
    let done = sqlx::query(
        "INSERT INTO lc_snapshots (workspace_id, digest, seq, parent, manifest, lease_id, generation, \
             committed_floor_us, committed_submicro_ns) \
         SELECT $1, $2, w.snapshots + 1, $3, $4, $5, $6, $7, $8 FROM lc_workspaces w \
          WHERE w.workspace_id = $1",
    )
    .bind(n.workspace_id.0)
    .bind(&n.digest.0[..])
    .bind(n.parent.map(|d| d.0.to_vec()))
    .bind(n.manifest)
    .bind(n.lease_id.0)
    .bind(n.generation.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    one_row(done, "a snapshot")?;
    let done = sqlx::query(
        "UPDATE lc_workspaces SET head = $2, snapshots = snapshots + 1 WHERE workspace_id = $1",
    )
    .bind(n.workspace_id.0)
    .bind(&n.digest.0[..])
    .execute(&mut *conn)
    .await?;
    one_row(done, "a workspace head")
}

fn snapshot_from(row: &PgRow) -> Result<SnapshotMeta, Fail> {
    Ok(SnapshotMeta {
        workspace_id: WorkspaceId(row.try_get("workspace_id")?),
        seq: row.try_get("seq")?,
        digest: digest_at(row, "digest")?,
        parent: opt_digest_at(row, "parent")?,
        manifest_bytes: row.try_get::<i32, _>("manifest_bytes")?.into(),
        lease_id: SandboxLeaseId(row.try_get("lease_id")?),
        generation: Generation(row.try_get("generation")?),
        committed_cut: instant_at(row, "committed_floor_us", "committed_submicro_ns")?,
    })
}

/// The workspace's snapshots with seq `> after_seq`, ascending, at most
/// `limit`.
pub(crate) async fn list_snapshots(
    conn: &mut PgConnection,
    workspace: WorkspaceId,
    after_seq: i64,
    limit: usize,
) -> Result<Vec<SnapshotMeta>, Fail> {
    let rows = sqlx::query(
        "SELECT workspace_id, seq, digest, parent, octet_length(manifest) AS manifest_bytes, \
                lease_id, generation, committed_floor_us, committed_submicro_ns \
           FROM lc_snapshots WHERE workspace_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(workspace.0)
    .bind(after_seq)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(snapshot_from).collect()
}

/// The manifest bytes of snapshot `digest` of `workspace`.
pub(crate) async fn snapshot_manifest(
    conn: &mut PgConnection,
    workspace: WorkspaceId,
    digest: Digest,
) -> Result<Option<Vec<u8>>, Fail> {
    Ok(sqlx::query_scalar(
        "SELECT manifest FROM lc_snapshots WHERE workspace_id = $1 AND digest = $2",
    )
    .bind(workspace.0)
    .bind(&digest.0[..])
    .fetch_optional(&mut *conn)
    .await?)
}

const HIBERNATION_COLUMNS: &str = "exec_id, attempt, generation, lease_id, reason, sealed_floor_us, \
     sealed_submicro_ns, step, head, refused_reason, refused_path, refused_message";

fn hibernation_from(row: &PgRow) -> Result<HibernationRecord, Fail> {
    Ok(HibernationRecord {
        exec_id: ExecId(row.try_get("exec_id")?),
        attempt: AttemptNo(row.try_get("attempt")?),
        generation: Generation(row.try_get("generation")?),
        lease_id: SandboxLeaseId(row.try_get("lease_id")?),
        reason: parse_enum(row, "reason", HibernationReason::parse)?,
        sealed_cut: instant_at(row, "sealed_floor_us", "sealed_submicro_ns")?,
        step: parse_enum(row, "step", HibernationStep::parse)?,
        head: opt_digest_at(row, "head")?,
        refusal: refusal_at(row, "")?,
    })
}

/// The refusal of a hibernation from its `{prefix}refused_*` columns.
fn refusal_at(row: &PgRow, prefix: &str) -> Result<Option<QuiescenceRefusal>, Fail> {
    let col = |name: &str| row.try_get::<Option<String>, _>(format!("{prefix}{name}").as_str());
    match (
        col("refused_reason")?,
        col("refused_path")?,
        col("refused_message")?,
    ) {
        (Some(reason), Some(path), Some(message)) => Ok(Some(QuiescenceRefusal {
            reason,
            path,
            message,
        })),
        (None, None, None) => Ok(None),
        _ => Err(corrupt("a hibernation with part of its refusal").into()),
    }
}

/// The hibernation of (exec, attempt, generation), locked when `lock`.
pub(crate) async fn hibernation(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
    lock: bool,
) -> Result<Option<HibernationRecord>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {HIBERNATION_COLUMNS} FROM lc_hibernations \
          WHERE exec_id = $1 AND attempt = $2 AND generation = $3{}",
        if lock { " FOR UPDATE" } else { "" }
    ))
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(hibernation_from).transpose()
}

/// Inserts a `sealed` hibernation.
pub(crate) async fn insert_hibernation(
    conn: &mut PgConnection,
    h: &HibernationRecord,
) -> Result<(), Fail> {
    let (f, s) = pair(h.sealed_cut);
    let done = sqlx::query(
        "INSERT INTO lc_hibernations (exec_id, attempt, generation, lease_id, reason, \
             sealed_floor_us, sealed_submicro_ns, step) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'sealed')",
    )
    .bind(h.exec_id.0)
    .bind(h.attempt.0)
    .bind(h.generation.0)
    .bind(h.lease_id.0)
    .bind(h.reason.as_str())
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    one_row(done, "a hibernation")
}

/// Moves a sealed hibernation to `quiesced` with its head and evidence.
pub(crate) async fn set_hibernation_quiesced(
    conn: &mut PgConnection,
    h: &HibernationRecord,
    head: Digest,
    evidence: &serde_json::Value,
) -> Result<(), Fail> {
    let done = sqlx::query(
        "UPDATE lc_hibernations SET step = 'quiesced', head = $4, quiescence = $5::jsonb \
          WHERE exec_id = $1 AND attempt = $2 AND generation = $3 AND step = 'sealed'",
    )
    .bind(h.exec_id.0)
    .bind(h.attempt.0)
    .bind(h.generation.0)
    .bind(&head.0[..])
    .bind(evidence.to_string())
    .execute(&mut *conn)
    .await?;
    one_row(done, "quiescing a hibernation")
}

/// Moves a sealed hibernation to `refused` with the provider's refusal
/// (checked and cut by the caller).
pub(crate) async fn set_hibernation_refused(
    conn: &mut PgConnection,
    h: &HibernationRecord,
    refusal: &QuiescenceRefusal,
) -> Result<(), Fail> {
    let done = sqlx::query(
        "UPDATE lc_hibernations SET step = 'refused', refused_reason = $4, refused_path = $5, \
                refused_message = $6 \
          WHERE exec_id = $1 AND attempt = $2 AND generation = $3 AND step = 'sealed'",
    )
    .bind(h.exec_id.0)
    .bind(h.attempt.0)
    .bind(h.generation.0)
    .bind(&refusal.reason)
    .bind(&refusal.path)
    .bind(&refusal.message)
    .execute(&mut *conn)
    .await?;
    one_row(done, "refusing a hibernation")
}

/// Moves a quiesced hibernation to `parked`.
pub(crate) async fn set_hibernation_parked(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
) -> Result<(), Fail> {
    let done = sqlx::query(
        "UPDATE lc_hibernations SET step = 'parked' \
          WHERE exec_id = $1 AND attempt = $2 AND generation = $3 AND step = 'quiesced'",
    )
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .execute(&mut *conn)
    .await?;
    one_row(done, "parking a hibernation")
}

/// An exec that may be due to hibernate, with what the rule decides by.
pub(crate) struct HibernationCandidate {
    pub exec_id: ExecId,
    pub attempt: AttemptNo,
    pub generation: Generation,
    pub lease_id: SandboxLeaseId,
    pub last_activity: Timestamp,
    pub idle_ttl_ms: Option<i64>,
    pub on_timeout: OnTimeout,
    pub timeout_deadline: Option<Timestamp>,
}

/// Up to `limit` execs running with an active Lease, no cancel request
/// and no hibernation of their current generation, idle at `cut` or past
/// their timeout with `on_timeout = hibernate` (exact nanoseconds,
/// numeric arithmetic), by exec id, each exec row locked (`SKIP
/// LOCKED`). The caller decides each again by the rule.
pub(crate) async fn hibernation_candidates(
    conn: &mut PgConnection,
    cut: Timestamp,
    limit: usize,
) -> Result<Vec<HibernationCandidate>, Fail> {
    let (f, s) = pair(cut);
    let rows = sqlx::query(
        "SELECT e.exec_id, a.attempt, a.generation, l.lease_id, \
                coalesce(e.last_activity_floor_us, e.admitted_floor_us) AS last_activity_floor_us, \
                coalesce(e.last_activity_submicro_ns, e.admitted_submicro_ns) AS last_activity_submicro_ns, \
                e.idle_ttl_ms, e.on_timeout, e.timeout_floor_us, \
                e.timeout_submicro_ns \
           FROM lc_execs e \
           JOIN lc_attempts a ON a.exec_id = e.exec_id AND a.attempt = e.current_attempt \
           JOIN lc_sandbox_leases l ON l.exec_id = e.exec_id AND l.attempt = a.attempt \
                                   AND l.generation = a.generation \
          WHERE e.state = 'running' AND a.state = 'running' AND l.state = 'active' \
            AND NOT e.cancel_requested \
            AND NOT EXISTS (SELECT 1 FROM lc_hibernations h WHERE h.exec_id = e.exec_id \
                               AND h.attempt = a.attempt AND h.generation = a.generation) \
            AND ((e.idle_ttl_ms IS NOT NULL \
                  AND coalesce(e.last_activity_floor_us, e.admitted_floor_us)::numeric * 1000 \
                      + coalesce(e.last_activity_submicro_ns, e.admitted_submicro_ns) \
                      + e.idle_ttl_ms::numeric * 1000000 <= $1::numeric * 1000 + $2) \
              OR (e.on_timeout = 'hibernate' AND e.timeout_floor_us IS NOT NULL \
                  AND (e.timeout_floor_us, e.timeout_submicro_ns) <= ($1, $2) \
                  AND (coalesce(e.last_activity_floor_us, e.admitted_floor_us), \
                       coalesce(e.last_activity_submicro_ns, e.admitted_submicro_ns)) \
                      < (e.timeout_floor_us, e.timeout_submicro_ns))) \
          ORDER BY e.exec_id LIMIT $3 FOR UPDATE OF e SKIP LOCKED",
    )
    .bind(f)
    .bind(s)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(HibernationCandidate {
                exec_id: ExecId(r.try_get("exec_id")?),
                attempt: AttemptNo(r.try_get("attempt")?),
                generation: Generation(r.try_get("generation")?),
                lease_id: SandboxLeaseId(r.try_get("lease_id")?),
                last_activity: instant_at(
                    r,
                    "last_activity_floor_us",
                    "last_activity_submicro_ns",
                )?,
                idle_ttl_ms: r.try_get("idle_ttl_ms")?,
                on_timeout: parse_enum(r, "on_timeout", OnTimeout::parse)?,
                timeout_deadline: opt_instant_at(r, "timeout_floor_us", "timeout_submicro_ns")?,
            })
        })
        .collect()
}

/// Up to `limit` hibernations not yet parked, by exec id. A `sealed` one
/// whose Lease is no longer `active` (its command ended before the stop,
/// a cancel ended it, or the Lease expired) is never acted on: it stays
/// `sealed` as the record of the request and is not listed.
pub(crate) async fn unfinished_hibernations(
    conn: &mut PgConnection,
    limit: usize,
) -> Result<Vec<HibernationRecord>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {HIBERNATION_COLUMNS} FROM lc_hibernations h WHERE h.step IN ('sealed', 'quiesced') \
            AND NOT (h.step = 'sealed' AND EXISTS ( \
                SELECT 1 FROM lc_sandbox_leases l \
                 WHERE l.lease_id = h.lease_id AND l.state <> 'active')) \
          ORDER BY h.exec_id, h.attempt, h.generation LIMIT $1"
    ))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(hibernation_from).collect()
}

fn intent_from(row: &PgRow) -> Result<(ResumeIntent, Option<SandboxLeaseId>), Fail> {
    Ok((
        ResumeIntent {
            exec_id: ExecId(row.try_get("exec_id")?),
            op_key: row.try_get("op_key")?,
            request_sha256: digest_at(row, "request_sha256")?,
            head: digest_at(row, "head")?,
            attempt: AttemptNo(row.try_get("attempt")?),
            from_generation: Generation(row.try_get("from_generation")?),
            recorded_cut: instant_at(row, "recorded_floor_us", "recorded_submicro_ns")?,
            refused: match (
                row.try_get::<Option<String>, _>("refused_code")?,
                row.try_get::<Option<String>, _>("refused_message")?,
            ) {
                (Some(code), Some(message)) => Some(ResumeRefusal { code, message }),
                _ => None,
            },
        },
        row.try_get::<Option<i64>, _>("prepared_lease_id")?
            .map(SandboxLeaseId),
    ))
}

/// The resume intent of (exec, op_key) and the Lease its prepare made,
/// locked when `lock`.
pub(crate) async fn resume_intent(
    conn: &mut PgConnection,
    exec: ExecId,
    op_key: &str,
    lock: bool,
) -> Result<Option<(ResumeIntent, Option<SandboxLeaseId>)>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT exec_id, op_key, request_sha256, head, attempt, from_generation, \
                recorded_floor_us, recorded_submicro_ns, prepared_lease_id, \
                refused_code, refused_message \
           FROM lc_resume_intents WHERE exec_id = $1 AND op_key = $2{}",
        if lock { " FOR UPDATE" } else { "" }
    ))
    .bind(exec.0)
    .bind(op_key)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(intent_from).transpose()
}

/// Inserts a resume intent.
pub(crate) async fn insert_resume_intent(
    conn: &mut PgConnection,
    i: &ResumeIntent,
) -> Result<(), Fail> {
    let (f, s) = pair(i.recorded_cut);
    let done = sqlx::query(
        "INSERT INTO lc_resume_intents (exec_id, op_key, request_sha256, head, attempt, \
             from_generation, recorded_floor_us, recorded_submicro_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(i.exec_id.0)
    .bind(&i.op_key)
    .bind(&i.request_sha256.0[..])
    .bind(&i.head.0[..])
    .bind(i.attempt.0)
    .bind(i.from_generation.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    one_row(done, "a resume intent")
}

/// Names the Lease the intent's prepare created.
pub(crate) async fn set_intent_prepared(
    conn: &mut PgConnection,
    exec: ExecId,
    op_key: &str,
    lease: SandboxLeaseId,
) -> Result<(), Fail> {
    let done = sqlx::query(
        "UPDATE lc_resume_intents SET prepared_lease_id = $3 \
          WHERE exec_id = $1 AND op_key = $2 AND prepared_lease_id IS NULL",
    )
    .bind(exec.0)
    .bind(op_key)
    .bind(lease.0)
    .execute(&mut *conn)
    .await?;
    one_row(done, "preparing a resume intent")
}

/// Records the provider's refusal on the intent that prepared `lease`
/// (unless one is recorded); returns whether an intent was found.
pub(crate) async fn set_intent_refused(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    refusal: &ResumeRefusal,
) -> Result<bool, Fail> {
    let done = sqlx::query(
        "UPDATE lc_resume_intents SET refused_code = $2, refused_message = $3 \
          WHERE prepared_lease_id = $1 AND refused_code IS NULL",
    )
    .bind(lease.0)
    .bind(&refusal.code)
    .bind(&refusal.message)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// The resume receipt of (exec, op_key).
pub(crate) async fn resume_receipt(
    conn: &mut PgConnection,
    exec: ExecId,
    op_key: &str,
) -> Result<Option<ResumeReceipt>, Fail> {
    let row = sqlx::query(
        "SELECT exec_id, op_key, attempt, from_generation, to_generation, lease_id, head, \
                request_sha256, token_sha256, owner_generation, owner_fence, committed_floor_us, \
                committed_submicro_ns \
           FROM lc_resume_receipts WHERE exec_id = $1 AND op_key = $2",
    )
    .bind(exec.0)
    .bind(op_key)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(ResumeReceipt {
        exec_id: ExecId(row.try_get("exec_id")?),
        op_key: row.try_get("op_key")?,
        attempt: AttemptNo(row.try_get("attempt")?),
        from_generation: Generation(row.try_get("from_generation")?),
        to_generation: Generation(row.try_get("to_generation")?),
        lease_id: SandboxLeaseId(row.try_get("lease_id")?),
        head: digest_at(&row, "head")?,
        request_sha256: digest_at(&row, "request_sha256")?,
        token_sha256: digest_at(&row, "token_sha256")?,
        owner_generation: row.try_get("owner_generation")?,
        owner_fence: row.try_get("owner_fence")?,
        committed_cut: instant_at(&row, "committed_floor_us", "committed_submicro_ns")?,
    }))
}

/// Inserts a resume receipt.
pub(crate) async fn insert_resume_receipt(
    conn: &mut PgConnection,
    r: &ResumeReceipt,
) -> Result<(), Fail> {
    let (f, s) = pair(r.committed_cut);
    let done = sqlx::query(
        "INSERT INTO lc_resume_receipts (exec_id, op_key, attempt, from_generation, to_generation, \
             lease_id, head, request_sha256, token_sha256, owner_generation, owner_fence, \
             committed_floor_us, committed_submicro_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(r.exec_id.0)
    .bind(&r.op_key)
    .bind(r.attempt.0)
    .bind(r.from_generation.0)
    .bind(r.to_generation.0)
    .bind(r.lease_id.0)
    .bind(&r.head.0[..])
    .bind(&r.request_sha256.0[..])
    .bind(&r.token_sha256.0[..])
    .bind(r.owner_generation)
    .bind(r.owner_fence)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    one_row(done, "a resume receipt")
}

/// How many Leases of `exec` other than `except` are unreleased.
pub(crate) async fn other_live_leases(
    conn: &mut PgConnection,
    exec: ExecId,
    except: Option<SandboxLeaseId>,
) -> Result<i64, Fail> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM lc_sandbox_leases \
          WHERE exec_id = $1 AND state <> 'released' AND lease_id IS DISTINCT FROM $2",
    )
    .bind(exec.0)
    .bind(except.map(|l| l.0))
    .fetch_one(&mut *conn)
    .await?)
}

/// Records the provider's attachment on a Lease.
pub(crate) async fn set_lease_attachment(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    evidence: &serde_json::Value,
) -> Result<(), Fail> {
    let done = sqlx::query(
        "UPDATE lc_sandbox_leases SET attachment = $2::jsonb WHERE lease_id = $1 AND attachment IS NULL",
    )
    .bind(lease.0)
    .bind(evidence.to_string())
    .execute(&mut *conn)
    .await?;
    one_row(done, "recording an attachment")
}

/// The measurement columns (`{prefix}cpu_time_ms`, ...) of `row` as an
/// observation; `None` when `{prefix}lease_id` is NULL (no row).
fn observation_at(row: &PgRow, prefix: &str) -> Result<Option<AttemptObservation>, Fail> {
    let col = |c: &str| format!("{prefix}{c}");
    if row
        .try_get::<Option<i64>, _>(col("lease_id").as_str())?
        .is_none()
    {
        return Ok(None);
    }
    let count = |c: &str| -> Result<Option<u64>, Fail> {
        row.try_get::<Option<i64>, _>(col(c).as_str())?
            .map(|v| u64::try_from(v).map_err(|_| Fail::from(corrupt(format!("{c} {v}")))))
            .transpose()
    };
    Ok(Some(AttemptObservation {
        cost: cost_of(count("cpu_time_ms")?, count("peak_memory_bytes")?)?,
        externality: ExternalityObservation {
            network_writes: row.try_get(col("network_writes").as_str())?,
            database_commits: row.try_get(col("database_commits").as_str())?,
            external_api_calls: row.try_get(col("external_api_calls").as_str())?,
        },
    }))
}

/// A stored cost: both numbers, or neither (unknown).
fn cost_of(
    cpu_time_ms: Option<u64>,
    peak_memory_bytes: Option<u64>,
) -> Result<Option<CostObservation>, Fail> {
    match (cpu_time_ms, peak_memory_bytes) {
        (Some(cpu_time_ms), Some(peak_memory_bytes)) => Ok(Some(CostObservation {
            cpu_time_ms,
            peak_memory_bytes,
        })),
        (None, None) => Ok(None),
        _ => Err(corrupt("a measurement with half a cost").into()),
    }
}

/// One generation's entry of [`EXEC_SELECT`]'s `m_generations`.
#[derive(serde::Deserialize)]
struct GenerationMeasurement {
    measured: bool,
    cpu_time_ms: Option<u64>,
    peak_memory_bytes: Option<u64>,
    network_writes: Option<bool>,
    database_commits: Option<bool>,
    external_api_calls: Option<bool>,
}

/// The `m_generations` column of [`EXEC_SELECT`] as the observation of
/// the whole attempt ([`AttemptObservation::of_generations`]): `None`
/// unless every generation was measured.
fn attempt_observation(row: &PgRow) -> Result<Option<AttemptObservation>, Fail> {
    observation_of_generations(row.try_get::<Option<String>, _>("m_generations")?)
}

/// A [`generation_measurements`] array (`None`: no Lease) as the
/// observation of the generations it lists.
fn observation_of_generations(text: Option<String>) -> Result<Option<AttemptObservation>, Fail> {
    let Some(text) = text else {
        return Ok(None);
    };
    let generations: Vec<GenerationMeasurement> = serde_json::from_str(&text)
        .map_err(|e| corrupt(format!("an attempt's measurements: {e}")))?;
    let mut parts = Vec::with_capacity(generations.len());
    for g in generations {
        let cost = cost_of(g.cpu_time_ms, g.peak_memory_bytes)?;
        parts.push(g.measured.then_some(AttemptObservation {
            cost,
            externality: ExternalityObservation {
                network_writes: g.network_writes,
                database_commits: g.database_commits,
                external_api_calls: g.external_api_calls,
            },
        }));
    }
    Ok(AttemptObservation::of_generations(parts))
}

/// The observation of `attempt` of `exec` through `generation`: of its
/// generations `1..=generation` combined
/// ([`AttemptObservation::of_generations`]); `None` when any is
/// unmeasured.
pub(crate) async fn observation_through(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
) -> Result<Option<AttemptObservation>, Fail> {
    let text: Option<String> = sqlx::query_scalar(concat!(
        "SELECT ",
        generation_measurements!(),
        " FROM lc_sandbox_leases ll \
           LEFT JOIN lc_measurements mm ON mm.lease_id = ll.lease_id \
          WHERE ll.exec_id = $1 AND ll.attempt = $2 AND ll.generation <= $3"
    ))
    .bind(exec.0)
    .bind(attempt.0)
    .bind(generation.0)
    .fetch_one(&mut *conn)
    .await?;
    observation_of_generations(text)
}

/// A milestone to record ([`insert_milestone`]).
pub(crate) struct NewMilestone<'a> {
    pub exec_id: ExecId,
    pub attempt: AttemptNo,
    pub generation: Generation,
    pub lease_id: SandboxLeaseId,
    pub source: MilestoneSource,
    pub milestone: &'a Milestone,
    pub recorded: Timestamp,
}

/// Records `m` as the exec's next milestone (seq one past its newest;
/// the caller holds the exec's lock) and returns it.
pub(crate) async fn insert_milestone(
    conn: &mut PgConnection,
    m: &NewMilestone<'_>,
) -> Result<MilestoneRecord, Fail> {
    let head = Digest::from_hex(&m.milestone.head)
        .map_err(|e| corrupt(format!("a milestone head: {e}")))?;
    let signed = |v: u64| i64::try_from(v).map_err(|_| corrupt(format!("a measured {v}")));
    let (cpu, peak) = match m.milestone.cost {
        Some(c) => (
            Some(signed(c.cpu_time_ms)?),
            Some(signed(c.peak_memory_bytes)?),
        ),
        None => (None, None),
    };
    let x = m
        .milestone
        .externality
        .unwrap_or(ExternalityObservation::absent());
    let (f, sub) = pair(m.recorded);
    let row = sqlx::query(&format!(
        "INSERT INTO lc_milestones (exec_id, seq, attempt, generation, lease_id, source, head, \
             cpu_time_ms, peak_memory_bytes, network_writes, database_commits, \
             external_api_calls, recorded_floor_us, recorded_submicro_ns) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13 \
           FROM lc_milestones WHERE exec_id = $1 \
         RETURNING {MILESTONE_COLUMNS}"
    ))
    .bind(m.exec_id.0)
    .bind(m.attempt.0)
    .bind(m.generation.0)
    .bind(m.lease_id.0)
    .bind(m.source.as_str())
    .bind(&head.0[..])
    .bind(cpu)
    .bind(peak)
    .bind(x.network_writes)
    .bind(x.database_commits)
    .bind(x.external_api_calls)
    .bind(f)
    .bind(sub)
    .fetch_one(&mut *conn)
    .await?;
    milestone_from(&row)
}

/// The exec's milestones with seq `> after_seq`, ascending, at most `limit`.
pub(crate) async fn list_milestones(
    conn: &mut PgConnection,
    exec: ExecId,
    after_seq: u32,
    limit: usize,
) -> Result<Vec<MilestoneRecord>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {MILESTONE_COLUMNS} FROM lc_milestones \
          WHERE exec_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
    ))
    .bind(exec.0)
    .bind(i64::from(after_seq))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(milestone_from).collect()
}

const MILESTONE_COLUMNS: &str = "exec_id, seq, attempt, generation, source, head, \
     lease_id AS ms_lease_id, cpu_time_ms AS ms_cpu_time_ms, \
     peak_memory_bytes AS ms_peak_memory_bytes, network_writes AS ms_network_writes, \
     database_commits AS ms_database_commits, external_api_calls AS ms_external_api_calls, \
     recorded_floor_us, recorded_submicro_ns";

fn milestone_from(row: &PgRow) -> Result<MilestoneRecord, Fail> {
    let seq: i32 = row.try_get("seq")?;
    let head: Vec<u8> = row.try_get("head")?;
    let head = <[u8; 32]>::try_from(head.as_slice())
        .map_err(|_| corrupt(format!("a milestone head of {} bytes", head.len())))?;
    let observation =
        observation_at(row, "ms_")?.ok_or_else(|| corrupt("a milestone without its Lease"))?;
    Ok(MilestoneRecord {
        exec_id: ExecId(row.try_get("exec_id")?),
        seq: u32::try_from(seq).map_err(|_| corrupt(format!("milestone seq {seq}")))?,
        attempt: AttemptNo(row.try_get("attempt")?),
        generation: Generation(row.try_get("generation")?),
        source: parse_enum(row, "source", MilestoneSource::parse)?,
        milestone: Milestone::at(Digest(head), Some(observation)),
        recorded_cut: instant_at(row, "recorded_floor_us", "recorded_submicro_ns")?,
    })
}

/// The stored measurement of `lease`, locked (`None`: nothing measured).
pub(crate) async fn lock_measurement(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
) -> Result<Option<AttemptObservation>, Fail> {
    let row = sqlx::query(
        "SELECT m.lease_id AS m_lease_id, m.cpu_time_ms AS m_cpu_time_ms, \
                m.peak_memory_bytes AS m_peak_memory_bytes, m.network_writes AS m_network_writes, \
                m.database_commits AS m_database_commits, \
                m.external_api_calls AS m_external_api_calls \
           FROM lc_measurements m WHERE m.lease_id = $1 FOR UPDATE",
    )
    .bind(lease.0)
    .fetch_optional(&mut *conn)
    .await?;
    match row {
        Some(r) => observation_at(&r, "m_"),
        None => Ok(None),
    }
}

/// Writes `observation` as the measurement of `lease` (of `exec`), signed
/// in `evidence`, recorded at `cut`: inserted, or replacing the stored
/// one (which the caller checked it supersedes).
pub(crate) async fn write_measurement(
    conn: &mut PgConnection,
    lease: SandboxLeaseId,
    exec: ExecId,
    observation: &AttemptObservation,
    evidence: &serde_json::Value,
    cut: Timestamp,
) -> Result<(), Fail> {
    let signed = |v: u64| i64::try_from(v).map_err(|_| corrupt(format!("a measured {v}")));
    let (cpu, peak) = match observation.cost {
        Some(c) => (
            Some(signed(c.cpu_time_ms)?),
            Some(signed(c.peak_memory_bytes)?),
        ),
        None => (None, None),
    };
    let x = observation.externality;
    let (f, s) = pair(cut);
    sqlx::query(
        "INSERT INTO lc_measurements (lease_id, exec_id, cpu_time_ms, peak_memory_bytes, \
             network_writes, database_commits, external_api_calls, evidence, \
             recorded_floor_us, recorded_submicro_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10) \
         ON CONFLICT (lease_id) DO UPDATE SET cpu_time_ms = EXCLUDED.cpu_time_ms, \
             peak_memory_bytes = EXCLUDED.peak_memory_bytes, \
             network_writes = EXCLUDED.network_writes, \
             database_commits = EXCLUDED.database_commits, \
             external_api_calls = EXCLUDED.external_api_calls, evidence = EXCLUDED.evidence, \
             recorded_floor_us = EXCLUDED.recorded_floor_us, \
             recorded_submicro_ns = EXCLUDED.recorded_submicro_ns",
    )
    .bind(lease.0)
    .bind(exec.0)
    .bind(cpu)
    .bind(peak)
    .bind(x.network_writes)
    .bind(x.database_commits)
    .bind(x.external_api_calls)
    .bind(evidence.to_string())
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Sets an attempt's current generation.
pub(crate) async fn set_attempt_generation(
    conn: &mut PgConnection,
    exec: ExecId,
    attempt: AttemptNo,
    generation: Generation,
) -> Result<(), Fail> {
    let done =
        sqlx::query("UPDATE lc_attempts SET generation = $3 WHERE exec_id = $1 AND attempt = $2")
            .bind(exec.0)
            .bind(attempt.0)
            .bind(generation.0)
            .execute(&mut *conn)
            .await?;
    one_row(done, "an attempt's generation")
}

/// The exec's current attempt with its state and generation, and the
/// exec's state, shape units and provider: what a resume decides by.
pub(crate) struct ParkedView {
    pub exec_state: ExecState,
    pub attempt: AttemptNo,
    pub attempt_state: AttemptState,
    pub generation: Generation,
    pub units: i64,
    pub provider_id: ProviderId,
}

/// Reads the exec as [`ParkedView`] (no lock; the caller holds the exec
/// row).
pub(crate) async fn parked_view(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Option<ParkedView>, Fail> {
    let row = sqlx::query(
        "SELECT e.state, a.attempt, a.state AS attempt_state, a.generation, e.units, \
                e.provider_id \
           FROM lc_execs e \
           JOIN lc_attempts a ON a.exec_id = e.exec_id AND a.attempt = e.current_attempt \
          WHERE e.exec_id = $1",
    )
    .bind(exec.0)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(ParkedView {
        exec_state: parse_enum(&row, "state", ExecState::parse)?,
        attempt: AttemptNo(row.try_get("attempt")?),
        attempt_state: parse_enum(&row, "attempt_state", AttemptState::parse)?,
        generation: Generation(row.try_get("generation")?),
        units: row.try_get("units")?,
        provider_id: provider_id_at(&row, "provider_id")?,
    }))
}

/// The exec's tenant, when it exists (no lock).
pub(crate) async fn exec_tenant(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Option<TenantId>, Fail> {
    Ok(
        sqlx::query_scalar::<_, i64>("SELECT tenant_id FROM lc_execs WHERE exec_id = $1")
            .bind(exec.0)
            .fetch_optional(&mut *conn)
            .await?
            .map(TenantId),
    )
}

/// The next sandbox Lease id.
pub(crate) async fn next_lease_id(conn: &mut PgConnection) -> Result<SandboxLeaseId, Fail> {
    Ok(SandboxLeaseId(
        sqlx::query_scalar("SELECT nextval('lc_sandbox_lease_ids')")
            .fetch_one(&mut *conn)
            .await?,
    ))
}

// ---------------------------------------------------------------------------
// Scoped tokens (0007): the secret's SHA-256 (never the secret), the
// tenant, the bound exec, the operations' names, the mint cut and the
// Scope deadline, and the cut of the revocation.

const TOKEN_COLUMNS: &str = "token_id, tenant_id, exec_id, operations, \
     minted_floor_us, minted_submicro_ns, deadline_floor_us, deadline_submicro_ns, \
     revoked_floor_us, revoked_submicro_ns";

fn token_from(row: &PgRow) -> Result<TokenRecord, Fail> {
    let exec: Option<i64> = row.try_get("exec_id")?;
    Ok(TokenRecord {
        token_id: TokenId(row.try_get("token_id")?),
        tenant_id: TenantId(row.try_get("tenant_id")?),
        exec_id: exec.map(ExecId),
        operations: row.try_get("operations")?,
        minted_cut: instant_at(row, "minted_floor_us", "minted_submicro_ns")?,
        deadline: instant_at(row, "deadline_floor_us", "deadline_submicro_ns")?,
        revoked_cut: opt_instant_at(row, "revoked_floor_us", "revoked_submicro_ns")?,
    })
}

/// A new token's row.
pub(crate) struct NewToken<'a> {
    pub tenant: TenantId,
    pub secret_sha256: Digest,
    pub exec: Option<ExecId>,
    pub operations: &'a [&'static str],
    pub minted: Timestamp,
    pub deadline: Timestamp,
}

/// Inserts a token and returns its row.
pub(crate) async fn insert_token(
    conn: &mut PgConnection,
    t: &NewToken<'_>,
) -> Result<TokenRecord, Fail> {
    let (mf, ms) = pair(t.minted);
    let (df, ds) = pair(t.deadline);
    let ops: Vec<String> = t.operations.iter().map(|o| (*o).to_owned()).collect();
    let row = sqlx::query(&format!(
        "INSERT INTO lc_tokens (tenant_id, secret_sha256, exec_id, operations, \
             minted_floor_us, minted_submicro_ns, deadline_floor_us, deadline_submicro_ns) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {TOKEN_COLUMNS}"
    ))
    .bind(t.tenant.0)
    .bind(&t.secret_sha256.0[..])
    .bind(t.exec.map(|e| e.0))
    .bind(&ops)
    .bind(mf)
    .bind(ms)
    .bind(df)
    .bind(ds)
    .fetch_one(&mut *conn)
    .await?;
    token_from(&row)
}

/// The token whose secret has this digest.
pub(crate) async fn token_by_secret(
    conn: &mut PgConnection,
    secret_sha256: Digest,
) -> Result<Option<TokenRecord>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {TOKEN_COLUMNS} FROM lc_tokens WHERE secret_sha256 = $1"
    ))
    .bind(&secret_sha256.0[..])
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(token_from).transpose()
}

/// `tenant`'s tokens after `after`, ascending, at most `limit`.
pub(crate) async fn list_tokens(
    conn: &mut PgConnection,
    tenant: TenantId,
    after: Option<TokenId>,
    limit: usize,
) -> Result<Vec<TokenRecord>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {TOKEN_COLUMNS} FROM lc_tokens WHERE tenant_id = $1 AND token_id > $2 \
          ORDER BY token_id LIMIT $3"
    ))
    .bind(tenant.0)
    .bind(after.map_or(0, |a| a.0))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(token_from).collect()
}

/// Locks `tenant`'s token `token` (`FOR UPDATE`).
pub(crate) async fn lock_token(
    conn: &mut PgConnection,
    tenant: TenantId,
    token: TokenId,
) -> Result<Option<TokenRecord>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {TOKEN_COLUMNS} FROM lc_tokens WHERE token_id = $1 AND tenant_id = $2 FOR UPDATE"
    ))
    .bind(token.0)
    .bind(tenant.0)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(token_from).transpose()
}

/// Records the revocation of an unrevoked token at `cut`.
pub(crate) async fn revoke_token(
    conn: &mut PgConnection,
    token: TokenId,
    cut: Timestamp,
) -> Result<TokenRecord, Fail> {
    let (f, s) = pair(cut);
    let row = sqlx::query(&format!(
        "UPDATE lc_tokens SET revoked_floor_us = $2, revoked_submicro_ns = $3 \
          WHERE token_id = $1 AND revoked_floor_us IS NULL RETURNING {TOKEN_COLUMNS}"
    ))
    .bind(token.0)
    .bind(f)
    .bind(s)
    .fetch_optional(&mut *conn)
    .await?;
    let row = row.ok_or_else(|| corrupt(format!("token {token} was revoked while locked")))?;
    token_from(&row)
}

// Claims (0010): a worker activation's claim on a work item. A claim row is
// locked before the item it guards (claim, then Lease, exec, owner,
// Reservation, Tollgate); a take and a fenced write of the same item
// therefore serialize on the claim row. Rows are never deleted (LCSC1):
// the generation fences every earlier holder for good.

const CLAIM_COLUMNS: &str = "item_kind, item_id, holder_sha256, generation, expiry_floor_us, \
        expiry_submicro_ns, basis";

fn claim_from(row: &PgRow) -> Result<Claim, Fail> {
    Ok(Claim {
        item: ClaimItem {
            kind: parse_enum(row, "item_kind", ClaimKind::parse)?,
            id: row.try_get("item_id")?,
        },
        holder_sha256: digest_at(row, "holder_sha256")?,
        generation: ClaimGeneration(row.try_get("generation")?),
        expiry: instant_at(row, "expiry_floor_us", "expiry_submicro_ns")?,
        basis: parse_enum(row, "basis", basis_of)?,
    })
}

/// Up to `limit` unreleased Leases the holder with `holder_sha256` may
/// claim, in [`due_leases`]' order (soonest expiry first, then by id), each
/// with its current claim: its own claims; unclaimed ones; another
/// holder's whose expiry is at or before `cutoff` (the caller's
/// `cut - grace` on a certain cut, `None` otherwise). The caller decides
/// each by the rule and writes with [`write_claims`], which re-checks the
/// claim it read.
pub(crate) async fn lease_claim_candidates(
    conn: &mut PgConnection,
    holder_sha256: Digest,
    cutoff: Option<Timestamp>,
    limit: usize,
) -> Result<Vec<(SandboxLeaseId, Option<Claim>)>, Fail> {
    let (f, s) = cutoff.map(pair).unzip();
    let rows = sqlx::query(
        "SELECT l.lease_id, c.item_kind, c.item_id, c.holder_sha256, c.generation, \
                c.expiry_floor_us, c.expiry_submicro_ns, c.basis \
           FROM lc_sandbox_leases l \
           LEFT JOIN lc_claims c ON c.item_kind = 'lease' AND c.item_id = l.lease_id \
          WHERE l.state <> 'released' \
            AND (c.item_id IS NULL \
                 OR c.holder_sha256 = $1 \
                 OR ($2::bigint IS NOT NULL \
                     AND (c.expiry_floor_us, c.expiry_submicro_ns) <= ($2::bigint, $3::integer))) \
          ORDER BY l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id LIMIT $4",
    )
    .bind(&holder_sha256.0[..])
    .bind(f)
    .bind(s)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let lease = SandboxLeaseId(r.try_get("lease_id")?);
            let has: Option<i64> = r.try_get("item_id")?;
            let claim = match has {
                Some(_) => Some(claim_from(r)?),
                None => None,
            };
            Ok((lease, claim))
        })
        .collect()
}

/// One planned claim write of [`write_claims`].
pub(crate) struct ClaimWrite {
    pub lease: SandboxLeaseId,
    pub generation: ClaimGeneration,
    pub expiry: Timestamp,
    pub basis: TakeoverBasis,
}

/// Writes `plans` for the holder with `holder_sha256` in one statement, a
/// compare-and-set on each item's claim as the caller read it: a renewal
/// only while the claim is still the holder's at the same generation; a
/// take (the next generation) only while the claim is another holder's
/// whose expiry is still at or before `cutoff`, and an insert only where
/// no claim exists. Returns the items written with their generation and
/// expiry; an item another worker claimed meanwhile is not among them.
pub(crate) async fn write_claims(
    conn: &mut PgConnection,
    holder_sha256: Digest,
    cutoff: Option<Timestamp>,
    plans: &[ClaimWrite],
) -> Result<BTreeMap<SandboxLeaseId, (ClaimGeneration, Timestamp)>, Fail> {
    if plans.is_empty() {
        return Ok(BTreeMap::new());
    }
    let ids: Vec<i64> = plans.iter().map(|p| p.lease.0).collect();
    let generations: Vec<i64> = plans.iter().map(|p| p.generation.0).collect();
    let (floors, subs): (Vec<i64>, Vec<i32>) = plans.iter().map(|p| pair(p.expiry)).unzip();
    let bases: Vec<&str> = plans.iter().map(|p| p.basis.as_str()).collect();
    let (cf, cs) = cutoff.map(pair).unzip();
    let rows = sqlx::query(
        "INSERT INTO lc_claims AS c (item_kind, item_id, holder_sha256, generation, \
                expiry_floor_us, expiry_submicro_ns, basis) \
         SELECT 'lease', t.item_id, $1, t.generation, t.floor_us, t.submicro_ns, t.basis \
           FROM unnest($2::bigint[], $3::bigint[], $4::bigint[], $5::integer[], $6::text[]) \
                AS t(item_id, generation, floor_us, submicro_ns, basis) \
         ON CONFLICT (item_kind, item_id) DO UPDATE SET holder_sha256 = EXCLUDED.holder_sha256, \
                generation = EXCLUDED.generation, expiry_floor_us = EXCLUDED.expiry_floor_us, \
                expiry_submicro_ns = EXCLUDED.expiry_submicro_ns, basis = EXCLUDED.basis \
          WHERE (c.holder_sha256 = EXCLUDED.holder_sha256 AND c.generation = EXCLUDED.generation) \
             OR (c.holder_sha256 <> EXCLUDED.holder_sha256 \
                 AND EXCLUDED.generation = c.generation + 1 \
                 AND $7::bigint IS NOT NULL \
                 AND (c.expiry_floor_us, c.expiry_submicro_ns) <= ($7::bigint, $8::integer)) \
         RETURNING item_id, generation, expiry_floor_us, expiry_submicro_ns",
    )
    .bind(&holder_sha256.0[..])
    .bind(&ids)
    .bind(&generations)
    .bind(&floors)
    .bind(&subs)
    .bind(&bases)
    .bind(cf)
    .bind(cs)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok((
                SandboxLeaseId(r.try_get("item_id")?),
                (
                    ClaimGeneration(r.try_get("generation")?),
                    instant_at(r, "expiry_floor_us", "expiry_submicro_ns")?,
                ),
            ))
        })
        .collect()
}

/// The Leases `ids` as [`due_leases`] reads them, in its order.
pub(crate) async fn due_leases_by_id(
    conn: &mut PgConnection,
    ids: &[i64],
) -> Result<Vec<DueRow>, Fail> {
    let rows = sqlx::query(&format!(
        "{DUE_SELECT} WHERE l.lease_id = ANY($1) \
          ORDER BY l.expiry_floor_us, l.expiry_submicro_ns, l.lease_id"
    ))
    .bind(ids)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(due_from).collect()
}

/// Locks and reads the claim on `item` (`FOR UPDATE`), if any.
pub(crate) async fn lock_claim(
    conn: &mut PgConnection,
    item: ClaimItem,
) -> Result<Option<Claim>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {CLAIM_COLUMNS} FROM lc_claims WHERE item_kind = $1 AND item_id = $2 FOR UPDATE"
    ))
    .bind(item.kind.as_str())
    .bind(item.id)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(claim_from).transpose()
}

/// Up to `limit` claims after `after` (all when `None`), by item.
pub(crate) async fn claims_page(
    conn: &mut PgConnection,
    after: Option<ClaimItem>,
    limit: usize,
) -> Result<Vec<Claim>, Fail> {
    let (kind, id) = after.map_or(("", 0), |a| (a.kind.as_str(), a.id));
    let rows = sqlx::query(&format!(
        "SELECT {CLAIM_COLUMNS} FROM lc_claims WHERE (item_kind, item_id) > ($1, $2) \
          ORDER BY item_kind, item_id LIMIT $3"
    ))
    .bind(kind)
    .bind(id)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(claim_from).collect()
}

// ---------------------------------------------------------------------------
// Deletion grace (migration 0009): a deletion row per (exec, item), the
// deleted rows untouched until the purge; the database checks every purge
// against the persisted cut (LCS90).

const DELETION_COLUMNS: &str = "exec_id, item, state, deleted_floor_us, deleted_submicro_ns, \
     purge_after_floor_us, purge_after_submicro_ns, purged_floor_us, purged_submicro_ns";

fn deletion_from(row: &PgRow) -> Result<DeletionRecord, Fail> {
    Ok(DeletionRecord {
        exec_id: ExecId(row.try_get("exec_id")?),
        item: parse_enum(row, "item", DeletedItem::parse)?,
        state: parse_enum(row, "state", DeletionState::parse)?,
        deleted_at: instant_at(row, "deleted_floor_us", "deleted_submicro_ns")?,
        purge_after: instant_at(row, "purge_after_floor_us", "purge_after_submicro_ns")?,
        purged_at: opt_instant_at(row, "purged_floor_us", "purged_submicro_ns")?,
    })
}

/// The deletion of `item` of `exec`, locked (`FOR UPDATE`) when `lock`.
pub(crate) async fn deletion(
    conn: &mut PgConnection,
    exec: ExecId,
    item: DeletedItem,
    lock: bool,
) -> Result<Option<DeletionRecord>, Fail> {
    let row = sqlx::query(&format!(
        "SELECT {DELETION_COLUMNS} FROM lc_deletions WHERE exec_id = $1 AND item = $2{}",
        if lock { " FOR UPDATE" } else { "" }
    ))
    .bind(exec.0)
    .bind(item.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(deletion_from).transpose()
}

/// Every deletion of `exec` (at most one per item).
pub(crate) async fn deletions_of(
    conn: &mut PgConnection,
    exec: ExecId,
) -> Result<Vec<DeletionRecord>, Fail> {
    let rows = sqlx::query(&format!(
        "SELECT {DELETION_COLUMNS} FROM lc_deletions WHERE exec_id = $1 ORDER BY item FOR UPDATE"
    ))
    .bind(exec.0)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(deletion_from).collect()
}

/// Records a deletion (state `deleted`).
pub(crate) async fn insert_deletion(
    conn: &mut PgConnection,
    d: &DeletionRecord,
) -> Result<(), Fail> {
    let (df, ds) = pair(d.deleted_at);
    let (pf, ps) = pair(d.purge_after);
    let done = sqlx::query(
        "INSERT INTO lc_deletions (exec_id, item, state, deleted_floor_us, deleted_submicro_ns, \
             purge_after_floor_us, purge_after_submicro_ns) VALUES ($1, $2, 'deleted', $3, $4, $5, $6)",
    )
    .bind(d.exec_id.0)
    .bind(d.item.as_str())
    .bind(df)
    .bind(ds)
    .bind(pf)
    .bind(ps)
    .execute(&mut *conn)
    .await?;
    one_row(done, "a deletion")
}

/// Removes a `deleted` deletion: the undelete.
pub(crate) async fn remove_deletion(
    conn: &mut PgConnection,
    exec: ExecId,
    item: DeletedItem,
) -> Result<(), Fail> {
    let done = sqlx::query(
        "DELETE FROM lc_deletions WHERE exec_id = $1 AND item = $2 AND state = 'deleted'",
    )
    .bind(exec.0)
    .bind(item.as_str())
    .execute(&mut *conn)
    .await?;
    one_row(done, "an undelete")
}

/// Up to `limit` deletions not yet purged whose purge_after is at most
/// `cut`, soonest first, locked; rows another purger holds are skipped.
pub(crate) async fn purge_candidates(
    conn: &mut PgConnection,
    cut: Timestamp,
    limit: usize,
) -> Result<Vec<DeletionRecord>, Fail> {
    let (f, s) = pair(cut);
    let rows = sqlx::query(&format!(
        "SELECT {DELETION_COLUMNS} FROM lc_deletions \
          WHERE state = 'deleted' AND (purge_after_floor_us, purge_after_submicro_ns) <= ($1, $2) \
          ORDER BY purge_after_floor_us, purge_after_submicro_ns, exec_id, item \
          LIMIT $3 FOR UPDATE SKIP LOCKED"
    ))
    .bind(f)
    .bind(s)
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(deletion_from).collect()
}

/// Deletes the rows of a deleted item (a workspace's snapshots, its head
/// cleared; an output's pages of every attempt); returns how many rows of
/// snapshots or pages went.
pub(crate) async fn purge_item_rows(
    conn: &mut PgConnection,
    exec: ExecId,
    item: DeletedItem,
) -> Result<u64, Fail> {
    match item {
        DeletedItem::Workspace => {
            let done = sqlx::query(
                "UPDATE lc_workspaces SET head = NULL, snapshots = 0 WHERE exec_id = $1",
            )
            .bind(exec.0)
            .execute(&mut *conn)
            .await?;
            one_row(done, "a purged workspace")?;
            Ok(sqlx::query(
                "DELETE FROM lc_snapshots WHERE workspace_id = \
                     (SELECT workspace_id FROM lc_workspaces WHERE exec_id = $1)",
            )
            .bind(exec.0)
            .execute(&mut *conn)
            .await?
            .rows_affected())
        }
        DeletedItem::Output => Ok(
            sqlx::query("DELETE FROM lc_output_pages WHERE exec_id = $1")
                .bind(exec.0)
                .execute(&mut *conn)
                .await?
                .rows_affected(),
        ),
    }
}

/// Marks a deletion purged at `at`.
pub(crate) async fn set_deletion_purged(
    conn: &mut PgConnection,
    d: &DeletionRecord,
    at: Timestamp,
) -> Result<(), Fail> {
    let (f, s) = pair(at);
    let done = sqlx::query(
        "UPDATE lc_deletions SET state = 'purged', purged_floor_us = $3, purged_submicro_ns = $4 \
          WHERE exec_id = $1 AND item = $2 AND state = 'deleted'",
    )
    .bind(d.exec_id.0)
    .bind(d.item.as_str())
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    one_row(done, "a purge")
}

// ---------------------------------------------------------------------------
// Retention (migration 0009): a terminal exec's retain_until, and the
// purge of its records once a certain cut passed it (the database checks
// it again, LCS91).

/// Records the retain-until of exec `exec` as it ends (`None`: kept until
/// an operator sets one).
pub(crate) async fn set_retain_until(
    conn: &mut PgConnection,
    exec: ExecId,
    until: Option<Timestamp>,
) -> Result<(), Fail> {
    let (f, s) = match until.map(pair) {
        Some((f, s)) => (Some(f), Some(s)),
        None => (None, None),
    };
    let done = sqlx::query(
        "UPDATE lc_execs SET retain_until_floor_us = $2, retain_until_submicro_ns = $3 \
          WHERE exec_id = $1",
    )
    .bind(exec.0)
    .bind(f)
    .bind(s)
    .execute(&mut *conn)
    .await?;
    one_row(done, "an exec's retention")
}

/// The terminal exec whose retain_until is soonest and at most `cut`,
/// with no deletion waiting for its purge, locked (rows another purger
/// holds skipped): its id and retain_until.
pub(crate) async fn retention_candidate(
    conn: &mut PgConnection,
    cut: Timestamp,
) -> Result<Option<(ExecId, Timestamp)>, Fail> {
    let (f, s) = pair(cut);
    let row = sqlx::query(
        "SELECT e.exec_id, e.retain_until_floor_us, e.retain_until_submicro_ns FROM lc_execs e \
          WHERE e.retain_until_floor_us IS NOT NULL AND e.state = 'terminal' \
            AND (e.retain_until_floor_us, e.retain_until_submicro_ns) <= ($1, $2) \
            AND NOT EXISTS (SELECT 1 FROM lc_deletions d \
                             WHERE d.exec_id = e.exec_id AND d.state = 'deleted') \
          ORDER BY e.retain_until_floor_us, e.retain_until_submicro_ns, e.exec_id \
          LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .bind(f)
    .bind(s)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| {
        Ok((
            ExecId(r.try_get("exec_id")?),
            instant_at(&r, "retain_until_floor_us", "retain_until_submicro_ns")?,
        ))
    })
    .transpose()
}

/// Every statement of an exec's records purge, children first (a Lease
/// after the snapshots, hibernations and resume rows naming it; the exec
/// last). Tollgate's rows stay.
const EXEC_PURGE: [&str; 19] = [
    "DELETE FROM lc_resume_receipts WHERE exec_id = $1",
    "DELETE FROM lc_resume_intents WHERE exec_id = $1",
    "DELETE FROM lc_hibernations WHERE exec_id = $1",
    "DELETE FROM lc_snapshots WHERE workspace_id IN \
         (SELECT workspace_id FROM lc_workspaces WHERE exec_id = $1)",
    "DELETE FROM lc_workspaces WHERE exec_id = $1",
    "DELETE FROM lc_output_pages WHERE exec_id = $1",
    "DELETE FROM lc_exec_inputs WHERE exec_id = $1",
    "DELETE FROM lc_transitions WHERE exec_id = $1",
    "DELETE FROM lc_exec_owners WHERE exec_id = $1",
    "DELETE FROM lc_deletions WHERE exec_id = $1",
    "DELETE FROM lc_approvals WHERE exec_id = $1",
    // Tokens bound to the exec can reach nothing once it is gone.
    "DELETE FROM lc_tokens WHERE exec_id = $1",
    // Claims on its (released) Leases, before the Leases.
    "DELETE FROM lc_claims WHERE item_kind = 'lease' AND item_id IN \
         (SELECT lease_id FROM lc_sandbox_leases WHERE exec_id = $1)",
    "DELETE FROM lc_measurements WHERE exec_id = $1",
    "DELETE FROM lc_milestones WHERE exec_id = $1",
    "DELETE FROM lc_sandbox_leases WHERE exec_id = $1",
    "DELETE FROM lc_reservations WHERE exec_id = $1",
    "DELETE FROM lc_attempts WHERE exec_id = $1",
    "DELETE FROM lc_execs WHERE exec_id = $1",
];

/// Deletes every record of exec `exec`; returns how many rows went.
pub(crate) async fn purge_exec_records(conn: &mut PgConnection, exec: ExecId) -> Result<u64, Fail> {
    let mut rows = 0;
    for sql in EXEC_PURGE {
        rows += sqlx::query(sql)
            .bind(exec.0)
            .execute(&mut *conn)
            .await?
            .rows_affected();
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_exactly_also_before_the_epoch() {
        for ns in [
            -1_i128,
            0,
            999,
            1_000,
            1_800_000_000_123_456_789,
            -1_234_567,
        ] {
            let t = Timestamp::from_nanosecond(ns).unwrap();
            let (f, s) = pair(t);
            assert!((0..=999).contains(&s));
            assert_eq!(i128::from(f) * 1000 + i128::from(s), ns);
            assert_eq!(instant(f, s).unwrap(), t);
        }
        assert_eq!(pair(Timestamp::from_nanosecond(-1).unwrap()), (-1, 999));
        assert!(instant(0, 1000).is_err());
        assert!(instant(0, -1).is_err());
        assert_eq!(scope_value(OpScope::Admin), 0);
        assert_eq!(scope_of(7), OpScope::Tenant(TenantId(7)));
    }
}
