//! The SQL an old writer (a binary that knows migrations 1 to 16) runs: the
//! statements its acquire, release, consolidation and reclaim issue against
//! the version-16 schema, with expiries as microseconds truncated toward
//! zero. Tests fill version-16 databases with it and replay it on
//! connections retained across migration 0017.
//!
//! Each function runs its statements on the caller's connection (inside
//! the caller's transaction when one is open) and returns the raw
//! `sqlx::Error` so tests can check SQLSTATEs.

use sqlx::{PgConnection, Row};
use tollgate::Balances;

/// Microseconds truncated toward zero, as old writers stored instants.
pub fn truncated_us(t: jiff::Timestamp) -> i64 {
    i64::try_from(t.as_nanosecond() / 1000).expect("in range")
}

/// An old first start: records the policy (v16 already had the record).
pub async fn record_policy(
    conn: &mut PgConnection,
    policy: tollgate::GrantPolicy,
) -> Result<(), sqlx::Error> {
    let (ts, tn) = (policy.max_ttl().as_secs(), policy.max_ttl().subsec_nanos());
    let (gs, gn) = (
        policy.reclaim_grace().as_secs(),
        policy.reclaim_grace().subsec_nanos(),
    );
    sqlx::query(
        "INSERT INTO tollgate_policy (singleton, max_ttl_secs, max_ttl_nanos, \
         reclaim_grace_secs, reclaim_grace_nanos) VALUES (true, $1, $2, $3, $4)",
    )
    .bind(ts)
    .bind(tn)
    .bind(gs)
    .bind(gn)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO tollgate_policy_changes (changed_by, new_max_ttl_secs, new_max_ttl_nanos, \
         new_reclaim_grace_secs, new_reclaim_grace_nanos) VALUES ('first start', $1, $2, $3, $4)",
    )
    .bind(ts)
    .bind(tn)
    .bind(gs)
    .bind(gn)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The store identity an old binary derived capabilities with.
pub async fn store_id(conn: &mut PgConnection) -> tollgate::StoreId {
    let id: Vec<u8> = sqlx::query_scalar("SELECT store_id FROM tollgate_store")
        .fetch_one(&mut *conn)
        .await
        .expect("store id");
    tollgate::StoreId(id.try_into().expect("16 bytes"))
}

pub async fn create_account(conn: &mut PgConnection, name: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("INSERT INTO tollgate_accounts (name) VALUES ($1) RETURNING account_id")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
}

fn balances(row: &sqlx::postgres::PgRow, prefix: &str) -> Balances {
    Balances {
        deposited: row.get(format!("{prefix}deposited").as_str()),
        available: row.get(format!("{prefix}available").as_str()),
        held: row.get(format!("{prefix}held").as_str()),
        consumed: row.get(format!("{prefix}consumed").as_str()),
    }
}

/// Old ledger insert (columns of version 16).
#[allow(clippy::too_many_arguments)]
pub async fn ledger(
    conn: &mut PgConnection,
    account_id: i64,
    lease_id: Option<i64>,
    kind: &str,
    actor: &str,
    units: i64,
    consumed: i64,
    before: Balances,
    after: Balances,
    fence: Option<i64>,
    expiry_us: Option<i64>,
    at_us: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO tollgate_ledger (account_id, lease_id, kind, actor, units, consumed, \
         before_deposited, before_available, before_held, before_consumed, \
         after_deposited, after_available, after_held, after_consumed, fence, expiry_us, at_us) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
    )
    .bind(account_id)
    .bind(lease_id)
    .bind(kind)
    .bind(actor)
    .bind(units)
    .bind(consumed)
    .bind(before.deposited)
    .bind(before.available)
    .bind(before.held)
    .bind(before.consumed)
    .bind(after.deposited)
    .bind(after.available)
    .bind(after.held)
    .bind(after.consumed)
    .bind(fence)
    .bind(expiry_us)
    .bind(at_us)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Old deposit.
pub async fn deposit(
    conn: &mut PgConnection,
    account_id: i64,
    units: i64,
    at_us: i64,
) -> Result<(), sqlx::Error> {
    let row = sqlx::query(
        "UPDATE tollgate_accounts SET deposited = deposited + $2, available = available + $2 \
         WHERE account_id = $1 RETURNING deposited, available, held, consumed",
    )
    .bind(account_id)
    .bind(units)
    .fetch_one(&mut *conn)
    .await?;
    let after = balances(&row, "");
    let before = Balances {
        deposited: after.deposited - units,
        available: after.available - units,
        ..after
    };
    ledger(
        conn, account_id, None, "deposit", "operator", units, 0, before, after, None, None, at_us,
    )
    .await
}

/// The first statement of an old acquire: the account debit.
pub async fn debit(
    conn: &mut PgConnection,
    account_id: i64,
    units: i64,
) -> Result<(Balances, Balances), sqlx::Error> {
    let row = sqlx::query(
        "UPDATE tollgate_accounts SET available = available - $2, held = held + $2 \
         WHERE account_id = $1 AND available >= $2 \
         RETURNING deposited, available, held, consumed",
    )
    .bind(account_id)
    .bind(units)
    .fetch_one(&mut *conn)
    .await?;
    let after = balances(&row, "");
    let before = Balances {
        available: after.available + units,
        held: after.held - units,
        ..after
    };
    Ok((before, after))
}

/// The second statement of an old acquire: the lease insert with its
/// truncated expiry. Returns `(lease_id, fence)`.
pub async fn insert_lease(
    conn: &mut PgConnection,
    account_id: i64,
    units: i64,
    expires_at_us: i64,
) -> Result<(i64, i64), sqlx::Error> {
    let row = sqlx::query(
        "INSERT INTO tollgate_leases (account_id, units, expires_at_us, state, fence) \
         VALUES ($1, $2, $3, 'active', nextval('tollgate_fence_seq')) RETURNING lease_id, fence",
    )
    .bind(account_id)
    .bind(units)
    .bind(expires_at_us)
    .fetch_one(&mut *conn)
    .await?;
    Ok((row.get("lease_id"), row.get("fence")))
}

/// An old acquire: debit, lease insert, ledger. Returns `(lease_id, fence)`.
pub async fn acquire(
    conn: &mut PgConnection,
    account_id: i64,
    units: i64,
    expires_at_us: i64,
    at_us: i64,
) -> Result<(i64, i64), sqlx::Error> {
    let (before, after) = debit(conn, account_id, units).await?;
    let (lease_id, fence) = insert_lease(conn, account_id, units, expires_at_us).await?;
    ledger(
        conn,
        account_id,
        Some(lease_id),
        "acquire",
        "holder",
        units,
        0,
        before,
        after,
        Some(fence),
        Some(expires_at_us),
        at_us,
    )
    .await?;
    Ok((lease_id, fence))
}

/// An old idempotency record for a grant.
#[allow(clippy::too_many_arguments)]
pub async fn idempotency(
    conn: &mut PgConnection,
    account_id: i64,
    key: &str,
    units: i64,
    request_ttl_us: i64,
    lease_id: i64,
    fence: i64,
    expires_at_us: i64,
    granted_ttl_us: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO tollgate_idempotency (account_id, idem_key, units, request_ttl_us, \
         lease_id, fence, expires_at_us, granted_ttl_us) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(account_id)
    .bind(key)
    .bind(units)
    .bind(request_ttl_us)
    .bind(lease_id)
    .bind(fence)
    .bind(expires_at_us)
    .bind(granted_ttl_us)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The first statement of an old release: settle the lease if it is still
/// releasable at `now_us` under the old microsecond arithmetic.
pub async fn release_lease(
    conn: &mut PgConnection,
    lease_id: i64,
    consumed: i64,
    grace_us: i64,
    now_us: i64,
) -> Result<Option<SettledRow>, sqlx::Error> {
    let row = sqlx::query(
        "UPDATE tollgate_leases SET state = 'released', consumed = $2 \
         WHERE lease_id = $1 AND state = 'active' AND expires_at_us + $3 > $4 \
         RETURNING account_id, units, fence, expires_at_us",
    )
    .bind(lease_id)
    .bind(consumed)
    .bind(grace_us)
    .bind(now_us)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|r| SettledRow {
        lease_id,
        account_id: r.get("account_id"),
        units: r.get("units"),
        fence: r.get("fence"),
        expires_at_us: r.get("expires_at_us"),
    }))
}

/// A lease row an old settlement statement returned.
#[derive(Debug, Clone, Copy)]
pub struct SettledRow {
    pub lease_id: i64,
    pub account_id: i64,
    pub units: i64,
    pub fence: i64,
    pub expires_at_us: i64,
}

/// The account update and ledger entry of an old settlement.
async fn settle_account(
    conn: &mut PgConnection,
    row: SettledRow,
    consumed: i64,
    kind: &str,
    actor: &str,
    now_us: i64,
) -> Result<(), sqlx::Error> {
    let acct = sqlx::query(
        "UPDATE tollgate_accounts SET held = held - $2, consumed = consumed + $3, \
         available = available + $2 - $3 WHERE account_id = $1 \
         RETURNING deposited, available, held, consumed",
    )
    .bind(row.account_id)
    .bind(row.units)
    .bind(consumed)
    .fetch_one(&mut *conn)
    .await?;
    let after = balances(&acct, "");
    let before = Balances {
        held: after.held + row.units,
        consumed: after.consumed - consumed,
        available: after.available - (row.units - consumed),
        ..after
    };
    ledger(
        conn,
        row.account_id,
        Some(row.lease_id),
        kind,
        actor,
        row.units,
        consumed,
        before,
        after,
        Some(row.fence),
        Some(row.expires_at_us),
        now_us,
    )
    .await
}

/// An old release. Returns whether the lease was settled.
pub async fn release(
    conn: &mut PgConnection,
    lease_id: i64,
    consumed: i64,
    grace_us: i64,
    now_us: i64,
) -> Result<bool, sqlx::Error> {
    let Some(row) = release_lease(conn, lease_id, consumed, grace_us, now_us).await? else {
        return Ok(false);
    };
    settle_account(conn, row, consumed, "release", "holder", now_us).await?;
    Ok(true)
}

/// An old reclaim batch (cutoff in truncated microseconds). Returns the
/// reclaimed lease ids.
pub async fn reclaim(
    conn: &mut PgConnection,
    cutoff_us: i64,
    limit: i64,
    now_us: i64,
) -> Result<Vec<i64>, sqlx::Error> {
    let due = reclaim_select(conn, cutoff_us, limit).await?;
    let mut done = Vec::new();
    for (lease_id, _, _) in due {
        let r = sqlx::query(
            "UPDATE tollgate_leases SET state = 'reclaimed', consumed = units \
             WHERE lease_id = $1 AND state = 'active' \
             RETURNING account_id, units, fence, expires_at_us",
        )
        .bind(lease_id)
        .fetch_one(&mut *conn)
        .await?;
        let row = SettledRow {
            lease_id,
            account_id: r.get("account_id"),
            units: r.get("units"),
            fence: r.get("fence"),
            expires_at_us: r.get("expires_at_us"),
        };
        settle_account(conn, row, row.units, "reclaim", "reclaimer", now_us).await?;
        done.push(lease_id);
    }
    Ok(done)
}

/// An old consolidation into one new lease expiring at `new_expires_at_us`.
/// Returns the new lease's `(lease_id, fence)`.
pub async fn consolidate(
    conn: &mut PgConnection,
    account_id: i64,
    lease_ids: &[i64],
    new_expires_at_us: i64,
    now_us: i64,
) -> Result<(i64, i64), sqlx::Error> {
    let old = consolidate_select(conn, account_id, lease_ids).await?;
    let acct = sqlx::query(
        "SELECT deposited, available, held, consumed FROM tollgate_accounts \
         WHERE account_id = $1 FOR UPDATE",
    )
    .bind(account_id)
    .fetch_one(&mut *conn)
    .await?;
    let b = balances(&acct, "");
    let mut units = 0;
    for (lease_id, u, exp) in &old {
        let fence: i64 = sqlx::query_scalar(
            "UPDATE tollgate_leases SET state = 'consolidated', consumed = 0 \
             WHERE lease_id = $1 RETURNING fence",
        )
        .bind(lease_id)
        .fetch_one(&mut *conn)
        .await?;
        ledger(
            conn,
            account_id,
            Some(*lease_id),
            "consolidate",
            "holder",
            *u,
            0,
            b,
            b,
            Some(fence),
            Some(*exp),
            now_us,
        )
        .await?;
        units += u;
    }
    let (lease_id, fence) = insert_lease(conn, account_id, units, new_expires_at_us).await?;
    ledger(
        conn,
        account_id,
        Some(lease_id),
        "consolidated_grant",
        "holder",
        units,
        0,
        b,
        b,
        Some(fence),
        Some(new_expires_at_us),
        now_us,
    )
    .await?;
    Ok((lease_id, fence))
}

/// The first statement of an old consolidation: lock the account's active
/// leases to merge, reading their expiries.
pub async fn consolidate_select(
    conn: &mut PgConnection,
    account_id: i64,
    lease_ids: &[i64],
) -> Result<Vec<(i64, i64, i64)>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT lease_id, units, expires_at_us FROM tollgate_leases \
         WHERE account_id = $1 AND lease_id = ANY($2) AND state = 'active' \
         ORDER BY lease_id FOR UPDATE",
    )
    .bind(account_id)
    .bind(lease_ids)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get("lease_id"), r.get("units"), r.get("expires_at_us")))
        .collect())
}

/// The first statement of an old reclaim batch.
pub async fn reclaim_select(
    conn: &mut PgConnection,
    cutoff_us: i64,
    limit: i64,
) -> Result<Vec<(i64, i64, i64)>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT lease_id, account_id, units FROM tollgate_leases \
         WHERE state = 'active' AND expires_at_us <= $1 \
         ORDER BY lease_id LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(cutoff_us)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get("lease_id"), r.get("account_id"), r.get("units")))
        .collect())
}

/// The SQLSTATE of a database error.
pub fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}
