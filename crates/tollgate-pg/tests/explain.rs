//! The reclaim candidate query uses the partial active-expiry index, and a
//! batch's cost does not grow with settled history.

mod support;

use jiff::{SignedDuration, Timestamp};
use sqlx::PgConnection;
use tollgate::{Allocator, GrantPolicy, InstantPair};
use tollgate_pg::RECLAIM_CANDIDATES_SQL;

/// Settled leases kept as history: enough that a scan of the table would be
/// visibly more expensive than the partial index.
const SETTLED_HISTORY: i64 = 50_000;
/// The smaller history the batch's cost is compared with.
const SMALL_HISTORY: i64 = 2_000;
/// Active leases (half of them due).
const ACTIVE: usize = 40;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

async fn explain(c: &mut PgConnection, analyze: bool, cutoff: Timestamp, limit: i64) -> String {
    let pair = InstantPair::encode(cutoff);
    let options = if analyze {
        "(ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF)"
    } else {
        "(COSTS OFF)"
    };
    let lines: Vec<String> =
        sqlx::query_scalar(&format!("EXPLAIN {options} {RECLAIM_CANDIDATES_SQL}"))
            .bind(pair.floor_us)
            .bind(pair.submicro_ns)
            .bind(limit)
            .fetch_all(c)
            .await
            .unwrap();
    lines.join("\n")
}

/// Shared buffers the plan touched (hit + read), from EXPLAIN ANALYZE.
fn buffers(plan: &str) -> u64 {
    plan.lines()
        .filter_map(|l| l.trim().strip_prefix("Buffers: shared "))
        .take(1)
        .flat_map(|rest| rest.split(' '))
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "hit" || *k == "read")
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum()
}

#[tokio::test]
async fn reclaim_query_uses_the_partial_index_whatever_the_history() {
    let db = support::migrated_db().await;
    let policy =
        GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::new(0, 1)).unwrap();
    let s = support::store_on(&db, policy, support::test_key()).await;
    let t0 = ts("2026-11-29T12:00:00Z");
    let a = tollgate::testkit::new_account(&s, "a", 1_000_000, t0).await;
    let mut due = Vec::new();
    for i in 0..ACTIVE {
        // Even leases expire after 1 s, odd ones after 30 s.
        let ttl = if i % 2 == 0 {
            SignedDuration::new(1, i32::try_from(i).unwrap())
        } else {
            SignedDuration::from_secs(30)
        };
        let g = tollgate::testkit::acquire(&s, a, 1, ttl, t0).await;
        if i % 2 == 0 {
            due.push(g.lease_id);
        }
    }
    let mut c = support::connect(&db).await;
    // Lease writers declare the recorded grant policy (migration 0019).
    tollgate_pg::declare_session(&mut c, &policy, false)
        .await
        .unwrap();
    let now = ts("2026-11-29T12:00:10Z");
    let cutoff = s.policy().reclaim_cutoff(now).unwrap();

    // Settled history, as released leases of the same account (the
    // accounting of this filler is irrelevant to the plan): first a little,
    // then a lot; the batch is measured after each.
    let mut measured = Vec::new();
    for (from, to) in [(1, SMALL_HISTORY), (SMALL_HISTORY + 1, SETTLED_HISTORY)] {
        sqlx::query(
            "INSERT INTO tollgate_leases (account_id, units, fence, expiry_floor_us, \
             expiry_submicro_ns, expiry_is_upper_bound, state, consumed) \
             SELECT $1, 1, nextval('tollgate_fence_seq'), 1795953600000000 - g, 0, false, \
                    'released', 1 FROM generate_series($2::bigint, $3::bigint) g",
        )
        .bind(a.0)
        .bind(from)
        .bind(to)
        .execute(&mut c)
        .await
        .unwrap();
        sqlx::query("ANALYZE tollgate_leases")
            .execute(&mut c)
            .await
            .unwrap();
        measured.push(explain(&mut c, true, cutoff, 500).await);
    }
    let (small, large) = (&measured[0], &measured[1]);

    // The exact cutoff pair computed in Rust (10 s minus the 1 ns grace).
    assert_eq!(cutoff, ts("2026-11-29T12:00:09.999999999Z"));
    let plan = explain(&mut c, false, cutoff, 500).await;
    assert_eq!(
        plan,
        "Limit\n  \
           ->  Sort\n        \
                 Sort Key: account_id, lease_id\n        \
                 ->  Index Scan using tollgate_leases_active_expiry on tollgate_leases\n              \
                       Index Cond: (ROW(expiry_floor_us, expiry_submicro_ns) <= \
                       ROW('1795953609999999'::bigint, '999'::smallint))",
        "plan:\n{plan}"
    );
    // The same due rows cost the same pages with 50,000 settled rows as
    // with 2,000: the partial index holds only active leases.
    for m in &measured {
        let index_scan = [
            "Index Scan using tollgate_leases_active_expiry on tollgate_leases (actual rows=20 loops=1)",
            "Bitmap Index Scan on tollgate_leases_active_expiry (actual rows=20 loops=1)",
        ];
        assert!(index_scan.iter().any(|l| m.contains(l)), "plan:\n{m}");
        assert!(!m.contains("Seq Scan"), "plan:\n{m}");
    }
    assert_eq!(buffers(large), buffers(small), "\n{small}\n---\n{large}");
    assert!(buffers(large) <= 10, "{large}");

    let r = s.reclaim(now, 500).await.unwrap();
    assert_eq!(r.reclaimed, due);
    assert_eq!(r.units_charged, 20);
}
