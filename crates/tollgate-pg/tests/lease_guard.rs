//! Migration 0019's lease-write guard against a real PostgreSQL: a process
//! started before `tollgate policy set` and a shorter sealed horizon can
//! no longer write a lease (TGS11), a store with the recorded policy can;
//! no active lease's expiry plus grace may pass the cut plus the horizon,
//! exactly to the nanosecond (TGS12); sessions that declare nothing are
//! refused; a policy change waits for open lease writes. Every refusal
//! leaves accounts, leases, ledger and idempotency records as they were.

mod support;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use safetime::Verdict;
use sqlx::{Connection, PgConnection, PgPool, Row};
use tollgate::{AcquireRequest, Allocator, GrantPolicy, StorageError};
use tollgate_pg::ops::{self, TxError};
use tollgate_pg::{PostgresStore, StoreOptions};

/// Bound on every wait for another session's state in these tests.
const WAIT_MAX: Duration = Duration::from_secs(20);

fn p(max_ttl: SignedDuration, grace: SignedDuration) -> GrantPolicy {
    GrantPolicy::new(max_ttl, grace).unwrap()
}

/// The policy of the process started before the change: PT1H, PT30S.
fn old_policy() -> GrantPolicy {
    p(SignedDuration::from_hours(1), SignedDuration::from_secs(30))
}

/// The recorded policy after the change: PT20S, PT5S (25 s in all).
fn new_policy() -> GrantPolicy {
    p(SignedDuration::from_secs(20), SignedDuration::from_secs(5))
}

const NS: SignedDuration = SignedDuration::from_nanos(1);

/// The refusal of a lease write by a process configured with PT1H/PT30S
/// while PT20S/PT5S is recorded.
const OLD_PROCESS_REFUSED: &str = "lease_policy_mismatch: the database records max_ttl PT20S \
     and reclaim_grace PT5S, but this process is configured with max_ttl PT1H and \
     reclaim_grace PT30S; every process sharing these grants must apply the recorded policy: \
     restart this process with the recorded grant policy (`tollgate policy show`) (SQLSTATE \
     TGS11)";

/// The same process's reclaim, refused by the store before any write.
const OLD_RECLAIM_REFUSED: &str = "the database records max_ttl PT20S and reclaim_grace PT5S, \
     but this process is configured with max_ttl PT1H and reclaim_grace PT30S; every process \
     sharing these grants must apply the recorded policy: restart this process with the \
     recorded grant policy (`tollgate policy show`)";

const HORIZON_HINT: &str = "every deadline must fit inside cut + horizon: grant at the cut \
     (--clock safe-cut) and keep max_ttl + reclaim_grace within the sealed horizon \
     (`tollgate-safetime policy show`) (SQLSTATE TGS12)";

async fn conn(url: &str) -> PgConnection {
    PgConnection::connect(url).await.unwrap()
}

/// A store on the safe expiry cut with `policy`.
async fn store_on_cut(db: &support::Db, policy: GrantPolicy) -> PostgresStore {
    PostgresStore::connect_with(
        db.url(),
        policy,
        support::test_key(),
        StoreOptions {
            on_safe_cut: true,
            ..support::TEST_OPTIONS
        },
    )
    .await
    .unwrap()
}

/// A connection that holds the sampler lock and has claimed an epoch
/// through the real claim function.
async fn leader(url: &str) -> (PgConnection, safetime_pg::Claim) {
    let mut c = conn(url).await;
    assert!(safetime_pg::try_lock(&mut c).await.unwrap());
    let policy = safetime_pg::load_policy(&mut c).await.unwrap();
    let claim = safetime_pg::claim(&mut c, &policy).await.unwrap();
    (c, claim)
}

/// Publishes `proposal` as a certain cut through the real publish function;
/// returns the cut stored (capped at database time).
async fn publish_certain(l: &mut PgConnection, epoch: i64, proposal: Timestamp) -> Timestamp {
    let verdict = Verdict {
        proposal,
        uncertain: None,
        anomaly: false,
        clears_quarantine: false,
        publishable: true,
        // Observed at the publish: dated, and capped, at its database time.
        observed_at: Timestamp::MAX,
    };
    let p = safetime_pg::publish(l, epoch, &verdict).await.unwrap();
    assert_eq!(p.uncertain, None);
    p.cut
}

/// Ends the leader's session and waits (bounded) until no session holds
/// the sampler lock, as a seal needs.
async fn stop_sampler(l: PgConnection, owner: &mut PgConnection) {
    l.close().await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    loop {
        let running: bool = sqlx::query_scalar("SELECT tollgate_safetime_sampler_running()")
            .fetch_one(&mut *owner)
            .await
            .unwrap();
        if !running {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sampler lock was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every row of the accounts, leases, ledger and idempotency records.
async fn state(c: &mut PgConnection) -> Vec<String> {
    let mut out = Vec::new();
    for table in [
        "tollgate_accounts",
        "tollgate_leases",
        "tollgate_ledger",
        "tollgate_idempotency",
    ] {
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT '{table} ' || to_jsonb(t)::text FROM {table} t ORDER BY 1"
        ))
        .fetch_all(&mut *c)
        .await
        .unwrap();
        out.extend(rows);
    }
    out
}

fn sqlstate(e: &TxError) -> Option<String> {
    match e {
        TxError::Db(e) => e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned()),
        _ => None,
    }
}

fn sqlstate_of(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

fn request(account_id: tollgate::AccountId, units: i64, ttl: SignedDuration) -> AcquireRequest {
    AcquireRequest {
        account_id,
        units,
        ttl,
        idempotency_key: None,
    }
}

/// The scenario of a reliability tester: a service on the cut with max_ttl
/// PT1H keeps running while the operator records PT20S/PT5S and seals a
/// horizon (refused while it does not cover the 10-minute lease still
/// active, accepted at exactly 605 s); once the new epoch's cut is certain,
/// its `acquire PT50M`, renewal, release, consolidation and reclaim
/// are all refused by the database and change nothing. A store started
/// with the recorded policy acquires PT20S.
#[tokio::test]
async fn a_process_started_before_a_policy_change_writes_no_lease() {
    let db = support::migrated_db().await;
    let old = store_on_cut(&db, old_policy()).await;
    let mut owner = support::connect(&db).await;

    // Epoch 1 on an empty installation: the cut starts at database time.
    let (mut l, claim) = leader(db.url()).await;
    let c1 = publish_certain(&mut l, 1, claim.cut + SignedDuration::from_micros(1)).await;
    let a = tollgate::testkit::new_account(&old, "a", 100, c1).await;
    let long = tollgate::testkit::acquire(&old, a, 10, SignedDuration::from_mins(10), c1).await;
    let short = tollgate::testkit::acquire(&old, a, 5, SignedDuration::from_secs(1), c1).await;
    assert_eq!(long.granted_ttl, SignedDuration::from_mins(10));

    // The operator: stop the sampler, record the new policy, seal a horizon.
    stop_sampler(l, &mut owner).await;
    let pool = PgPool::connect(db.url()).await.unwrap();
    tollgate_pg::set_policy(&pool, new_policy(), "ops")
        .await
        .unwrap();
    // A horizon that does not cover the 10-minute lease still active is
    // refused, naming the lease and the shortest horizon that covers it:
    // expiry c1 + 10 min plus the recorded grace 5 s, from the cut c1, is
    // exactly 605,000 ms. Nothing is sealed.
    let before_seal = state(&mut owner).await;
    let err = safetime_pg::seal_policy(&mut owner, 604_999, "ops")
        .await
        .unwrap_err();
    let expiry = c1 + SignedDuration::from_mins(10);
    let due = expiry + SignedDuration::from_secs(5);
    let bound = c1 + SignedDuration::from_millis(604_999);
    assert_eq!(err.code(), "horizon_below_policy");
    assert_eq!(
        err.to_string(),
        format!(
            "horizon below the grant policy: horizon 604999 ms does not cover active lease {}: \
             its expiry {expiry} plus the recorded reclaim_grace PT5S is {due}, beyond cut {c1} + \
             horizon = {bound} by PT0.001S; wait until it settles, or seal a horizon of at least \
             605000 ms",
            long.lease_id.0
        )
    );
    assert_eq!(
        safetime_pg::load_policy(&mut owner)
            .await
            .unwrap()
            .version(),
        1,
        "a refused seal sealed"
    );
    assert_eq!(state(&mut owner).await, before_seal);
    // Exactly the covering horizon is accepted.
    let sealed = safetime_pg::seal_policy(&mut owner, 605_000, "ops")
        .await
        .unwrap();
    assert_eq!((sealed.version(), sealed.horizon_ms()), (2, 605_000));
    // The next epoch, under the 605 s horizon, certain.
    let (mut l2, claim2) = leader(db.url()).await;
    assert_eq!(claim2.epoch, 2);
    let c2 = publish_certain(&mut l2, 2, Timestamp::MAX).await;
    let row = safetime_pg::read_cut(&mut owner).await.unwrap().unwrap();
    assert_eq!(
        (row.epoch, row.policy.version(), row.uncertain, row.cut),
        (2, 2, None, c2)
    );

    let before = state(&mut owner).await;
    // Acquire PT50M through the old store: refused, TGS11.
    let fifty = SignedDuration::from_mins(50);
    let err = old
        .acquire(request(a, 1, fifty), c2.into())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::PolicyMismatch(OLD_PROCESS_REFUSED.into())
    );
    assert_eq!(err.code(), "policy_mismatch");
    let mut tx = old.pool().begin().await.unwrap();
    let err = ops::acquire(&mut tx, &old, &request(a, 1, fifty), c2.into())
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err).as_deref(), Some("TGS11"));
    tx.rollback().await.unwrap();
    // Renew, release, consolidate: refused the same way.
    let err = old
        .renew(long.lease_id, &long.capability, fifty, c2.into())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::PolicyMismatch(OLD_PROCESS_REFUSED.into())
    );
    let err = old
        .release(long.lease_id, &long.capability, c2, Some(1))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::PolicyMismatch(OLD_PROCESS_REFUSED.into())
    );
    let err = old
        .consolidate(
            a,
            &[
                (long.lease_id, long.capability.clone()),
                (short.lease_id, short.capability.clone()),
            ],
            fifty,
            c2.into(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::PolicyMismatch(OLD_PROCESS_REFUSED.into())
    );
    // Reclaim at an instant where the short lease is due under both
    // graces: the store refuses before it writes anything.
    let err = old
        .reclaim(c1 + SignedDuration::from_secs(40), 10)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        StorageError::PolicyMismatch(OLD_RECLAIM_REFUSED.into())
    );
    // And the database refuses the settlement itself, whoever sends it with
    // the old declaration.
    let mut raw = conn(db.url()).await;
    tollgate_pg::declare_session(&mut raw, &old_policy(), true)
        .await
        .unwrap();
    let err = sqlx::query(
        "UPDATE tollgate_leases SET state = 'reclaimed', consumed = units WHERE lease_id = $1",
    )
    .bind(short.lease_id.0)
    .execute(&mut raw)
    .await
    .unwrap_err();
    assert_eq!(sqlstate_of(&err).as_deref(), Some("TGS11"));
    assert_eq!(
        state(&mut owner).await,
        before,
        "a refused write changed a row"
    );

    // A store with the recorded policy acquires PT20S (the clamp of PT50M).
    let new = store_on_cut(&db, new_policy()).await;
    let g = new.acquire(request(a, 1, fifty), c2.into()).await.unwrap();
    assert_eq!(
        (g.granted_ttl, g.expiry),
        (
            SignedDuration::from_secs(20),
            c2 + SignedDuration::from_secs(20)
        )
    );
    new.reclaim(c2, 10).await.unwrap();
    new.release(g.lease_id, &g.capability, c2, Some(0))
        .await
        .unwrap();
    // The old store still writes nothing.
    let err = old
        .acquire(request(a, 1, fifty), c2.into())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "policy_mismatch");
    l2.close().await.unwrap();
    pool.close().await;
}

/// With the policy recorded and declared, the database admits an active
/// lease exactly up to `expiry + reclaim_grace = cut + horizon`, and
/// refuses one nanosecond more (TGS12), for an acquire through a caller's
/// transaction, the store's acquire, a renewal and a consolidation; the
/// horizon is the smaller of the current epoch's and the newest sealed
/// one, whichever that is. A cut with sub-microsecond digits is taken
/// exactly. Nothing of a refused write remains; releases need no check.
#[tokio::test]
async fn the_horizon_admits_exactly_cut_plus_horizon() {
    // (horizon in force for the epoch, newest sealed horizon, bounding version)
    for (in_force_ms, newest_ms, bounding_version) in [(25_000, 30_000, 2), (30_000, 25_000, 3)] {
        let db = support::migrated_db().await;
        let s = store_on_cut(&db, new_policy()).await;
        let mut owner = support::connect(&db).await;
        safetime_pg::seal_policy(&mut owner, in_force_ms, "ops")
            .await
            .unwrap();
        let (mut l, claim) = leader(db.url()).await;
        // Capped at database time, then 7 ns more: an exact pair.
        let capped = publish_certain(&mut l, 1, Timestamp::MAX).await;
        let c = publish_certain(&mut l, 1, capped + 7 * NS).await;
        assert_eq!(c, capped + 7 * NS);
        assert!(c > claim.cut);
        stop_sampler(l, &mut owner).await;
        safetime_pg::seal_policy(&mut owner, newest_ms, "ops")
            .await
            .unwrap();
        let row = safetime_pg::read_cut(&mut owner).await.unwrap().unwrap();
        assert_eq!((row.cut, row.policy.horizon_ms()), (c, in_force_ms));

        let a = tollgate::testkit::new_account(&s, "a", 100, c).await;
        let early =
            tollgate::testkit::acquire(&s, a, 1, SignedDuration::from_secs(20), c - 2 * NS).await;
        let twenty = SignedDuration::from_secs(20);
        let bound = c + SignedDuration::from_secs(25);
        let refusal = |what: &str, now: Timestamp| {
            let expiry = now + twenty;
            let due = expiry + SignedDuration::from_secs(5);
            StorageError::HorizonExceeded {
                message: format!(
                    "lease_beyond_horizon: {what}expiry {expiry} plus the recorded \
                     reclaim_grace PT5S is {due}, beyond cut {c} + horizon PT25S (sealed \
                     policy version {bounding_version}) = {bound} by {}; {HORIZON_HINT}",
                    due.duration_since(bound)
                ),
            }
        };

        // Exactly at the bound, in a caller's transaction: admitted.
        let mut tx = s.pool().begin().await.unwrap();
        let at_bound = ops::acquire(&mut tx, &s, &request(a, 1, twenty), c.into())
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(at_bound.expiry + SignedDuration::from_secs(5), bound, "{c}");

        let before = state(&mut owner).await;
        // One nanosecond beyond: refused, TGS12, whatever the path.
        let mut tx = s.pool().begin().await.unwrap();
        let err = ops::acquire(&mut tx, &s, &request(a, 1, twenty), (c + NS).into())
            .await
            .unwrap_err();
        assert_eq!(sqlstate(&err).as_deref(), Some("TGS12"));
        assert_eq!(
            err.into_allocator_error(),
            refusal("the new lease's ", c + NS)
        );
        tx.rollback().await.unwrap();
        let err = s
            .acquire(request(a, 1, twenty), (c + NS).into())
            .await
            .unwrap_err();
        assert_eq!(err, refusal("the new lease's ", c + NS));
        assert_eq!(err.code(), "horizon_exceeded");
        let err = s
            .consolidate(
                a,
                &[(at_bound.lease_id, at_bound.capability.clone())],
                twenty,
                (c + NS).into(),
            )
            .await
            .unwrap_err();
        assert_eq!(err, refusal("the new lease's ", c + NS));
        assert_eq!(
            state(&mut owner).await,
            before,
            "a refused write changed a row"
        );

        // A renewal to exactly the bound is admitted; one nanosecond later,
        // refused.
        let renewed = s
            .renew(early.lease_id, &early.capability, twenty, c.into())
            .await
            .unwrap();
        assert_eq!(renewed.lease.expiry, c + twenty);
        let before = state(&mut owner).await;
        let err = s
            .renew(early.lease_id, &early.capability, twenty, (c + NS).into())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            refusal(&format!("lease {}'s new ", early.lease_id), c + NS)
        );
        assert_eq!(
            state(&mut owner).await,
            before,
            "a refused write changed a row"
        );
        // A release changes no expiry: it needs no horizon.
        s.release(at_bound.lease_id, &at_bound.capability, c + NS, Some(1))
            .await
            .unwrap();
        owner.close().await.unwrap();
    }
}

/// Every lease writer declares the recorded policy: a session that declares
/// nothing, something unreadable or another policy is refused (TGS11), on
/// insert and update, and so is every write while no policy is recorded.
/// The declaration the store makes is the one the database derives from
/// the recorded policy.
#[tokio::test]
async fn sessions_must_declare_the_recorded_policy() {
    let db = support::migrated_db().await;
    let mut c = support::connect(&db).await;
    let account: i64 = sqlx::query_scalar(
        "INSERT INTO tollgate_accounts (name, deposited, available, held) \
         VALUES ('a', 10, 0, 10) RETURNING account_id",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    let insert = "INSERT INTO tollgate_leases (account_id, units, fence, expiry_floor_us, \
                  expiry_submicro_ns, expiry_is_upper_bound, state) \
                  VALUES ($1, 1, nextval('tollgate_fence_seq'), 0, 0, false, 'active')";
    let policy = p(SignedDuration::from_secs(60), SignedDuration::from_secs(5));
    let check = async |conn: &mut PgConnection, message: &str| {
        let err = sqlx::query(insert)
            .bind(account)
            .execute(&mut *conn)
            .await
            .unwrap_err();
        assert_eq!(sqlstate_of(&err).as_deref(), Some("TGS11"), "{err}");
        assert_eq!(err.as_database_error().unwrap().message(), message);
    };

    // No policy recorded: nobody may write, declared or not.
    let none = "lease_policy_mismatch: no grant policy is recorded in this database, so no \
                lease may be written; start a Tollgate store against it first (the first \
                start records its policy)";
    check(&mut c, none).await;
    tollgate_pg::declare_session(&mut c, &policy, false)
        .await
        .unwrap();
    check(&mut c, none).await;

    // Recorded by a store's first start.
    let store = support::store_on(&db, policy, support::test_key()).await;
    let declared: String = sqlx::query_scalar("SELECT tollgate_grant_policy_declaration()")
        .fetch_one(&mut c)
        .await
        .unwrap();
    assert_eq!(declared, tollgate_pg::grant_policy_declaration(&policy));
    assert_eq!(declared, "60000000000/5000000000");
    sqlx::query(insert)
        .bind(account)
        .execute(&mut c)
        .await
        .unwrap();

    let recorded = "lease_policy_mismatch: the database records max_ttl PT1M and reclaim_grace \
                    PT5S, but this process";
    let restart = "every process sharing these grants must apply the recorded policy: restart \
                   this process with the recorded grant policy (`tollgate policy show`)";
    let mut undeclared = support::connect(&db).await;
    check(
        &mut undeclared,
        &format!(
            "{recorded} declares no grant policy (tollgate.grant_policy is not set); {restart} \
             on a binary that declares it (schema 19 or later)"
        ),
    )
    .await;
    // An update is refused the same way.
    let err = sqlx::query("UPDATE tollgate_leases SET expiry_is_upper_bound = false")
        .execute(&mut undeclared)
        .await
        .unwrap_err();
    assert_eq!(sqlstate_of(&err).as_deref(), Some("TGS11"), "{err}");
    sqlx::query("SET tollgate.grant_policy = 'PT1M/PT5S'")
        .execute(&mut undeclared)
        .await
        .unwrap();
    check(
        &mut undeclared,
        &format!(
            "{recorded} declares no grant policy (tollgate.grant_policy is 'PT1M/PT5S'); \
             {restart} on a binary that declares it (schema 19 or later)"
        ),
    )
    .await;
    let other = p(SignedDuration::from_secs(60), SignedDuration::new(5, 1));
    tollgate_pg::declare_session(&mut undeclared, &other, false)
        .await
        .unwrap();
    check(
        &mut undeclared,
        &format!(
            "{recorded} is configured with max_ttl PT1M and reclaim_grace PT5.000000001S; \
             {restart}"
        ),
    )
    .await;
    tollgate_pg::declare_session(&mut undeclared, &policy, false)
        .await
        .unwrap();
    sqlx::query("UPDATE tollgate_leases SET expiry_is_upper_bound = false")
        .execute(&mut undeclared)
        .await
        .unwrap();
    store.close().await;
}

/// The database's renderings in its messages equal jiff's: durations as
/// `SignedDuration` prints them, instants as `Timestamp` does (outside the
/// years 1 to 9999, nanoseconds since the epoch).
#[tokio::test]
async fn the_database_renders_durations_and_instants_as_jiff_does() {
    let db = support::migrated_db().await;
    let mut c = support::connect(&db).await;
    let text = async |c: &mut PgConnection, f: &str, ns: i128| -> String {
        sqlx::query(&format!("SELECT {f}($1::text::numeric) AS t"))
            .bind(ns.to_string())
            .fetch_one(&mut *c)
            .await
            .unwrap()
            .get("t")
    };
    for (secs, nanos) in [
        (0, 0),
        (0, 1),
        (1, 0),
        (59, 999_999_999),
        (60, 0),
        (60, 1),
        (61, 100_000_000),
        (3_600, 0),
        (3_600, 1),
        (3_660, 0),
        (3_661, 1),
        (315_360_000, 0),
        (i64::MAX, 999_999_999),
        (-1, 0),
        (0, -1),
        (-3_661, -1),
    ] {
        let d = SignedDuration::new(secs, nanos);
        assert_eq!(
            text(&mut c, "tollgate_duration_text", d.as_nanos()).await,
            d.to_string(),
            "{secs} s {nanos} ns"
        );
    }
    for t in [
        "1970-01-01T00:00:00Z",
        "1969-12-31T23:59:59.999999999Z",
        "2026-11-29T12:00:30.12345679Z",
        "2026-11-29T12:00:30.000000001Z",
        "0001-01-01T00:00:00Z",
        "9999-12-30T22:00:00.999999999Z",
        "1900-02-28T01:02:03.4Z",
    ] {
        let ts: Timestamp = t.parse().unwrap();
        assert_eq!(
            text(&mut c, "tollgate_instant_text", ts.as_nanosecond()).await,
            ts.to_string()
        );
        assert_eq!(ts.to_string(), t);
    }
    // Beyond jiff's range yet inside the years 1 to 9999 (a deadline past
    // Timestamp::MAX): the same format.
    assert_eq!(
        text(&mut c, "tollgate_instant_text", 253_402_300_799_999_999_999).await,
        "9999-12-31T23:59:59.999999999Z"
    );
    for ns in [
        Timestamp::MIN.as_nanosecond(),
        -62_135_596_800_000_000_001,
        253_402_300_800_000_000_000,
        i128::from(i64::MAX) * 1_000_000_000,
    ] {
        assert_eq!(
            text(&mut c, "tollgate_instant_text", ns).await,
            format!("{ns} ns after the Unix epoch")
        );
    }
}

/// Waits (bounded) until a session of `db` whose query is `like` waits for
/// a lock.
async fn wait_for_lock(db: &support::Db, like: &str) {
    let mut observer = support::connect(db).await;
    let deadline = tokio::time::Instant::now() + WAIT_MAX;
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE $1)",
        )
        .bind(like)
        .fetch_one(&mut observer)
        .await
        .unwrap();
        if waiting {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no session running {like} waited for a lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `tollgate policy set` waits for every open transaction that has written
/// a lease under the old policy, so no lease of the old policy commits
/// after it returns; the next write of the old process is refused.
#[tokio::test]
async fn a_policy_change_waits_for_open_lease_writes() {
    let db = support::migrated_db().await;
    let old = support::store_on(&db, old_policy(), support::test_key()).await;
    let t0: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
    let a = tollgate::testkit::new_account(&old, "a", 100, t0).await;
    let mut tx = old.pool().begin().await.unwrap();
    let g = ops::acquire(
        &mut tx,
        &old,
        &request(a, 1, SignedDuration::from_mins(50)),
        t0.into(),
    )
    .await
    .unwrap();
    let pool = PgPool::connect(db.url()).await.unwrap();
    let change = tokio::spawn({
        let pool = pool.clone();
        async move { tollgate_pg::set_policy(&pool, new_policy(), "ops").await }
    });
    // The change waits for the open transaction's lock.
    wait_for_lock(&db, "LOCK TABLE tollgate_policy%").await;
    assert!(!change.is_finished());
    assert_eq!(
        tollgate_pg::recorded_policy(&pool).await.unwrap(),
        Some(old_policy())
    );
    tx.commit().await.unwrap();
    tokio::time::timeout(WAIT_MAX, change)
        .await
        .expect("the change did not finish after the lease committed")
        .unwrap()
        .unwrap();
    // The lease committed before the change; the next write is refused.
    assert_eq!(old.lease(g.lease_id, &g.capability).await.unwrap().units, 1);
    let err = old
        .acquire(request(a, 1, SignedDuration::from_mins(50)), t0.into())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "policy_mismatch");
    pool.close().await;
}

/// Sealing a horizon waits for every open transaction that has written an
/// active lease under the cut, so the lease was checked against the
/// horizon that was in force when it committed; the next write is checked
/// against the new one.
#[tokio::test]
async fn a_seal_waits_for_open_lease_writes() {
    let db = support::migrated_db().await;
    let s = store_on_cut(&db, new_policy()).await;
    let mut owner = support::connect(&db).await;
    let (mut l, _) = leader(db.url()).await;
    let c = publish_certain(&mut l, 1, Timestamp::MAX).await;
    stop_sampler(l, &mut owner).await;
    let a = tollgate::testkit::new_account(&s, "a", 100, c).await;
    let mut tx = s.pool().begin().await.unwrap();
    ops::acquire(
        &mut tx,
        &s,
        &request(a, 1, SignedDuration::from_secs(20)),
        c.into(),
    )
    .await
    .unwrap();
    let seal = tokio::spawn({
        let url = db.url().to_owned();
        async move {
            let mut c = conn(&url).await;
            safetime_pg::seal_policy(&mut c, 25_000, "ops").await
        }
    });
    wait_for_lock(&db, "%tollgate_safetime_seal_policy%").await;
    assert!(!seal.is_finished());
    tx.commit().await.unwrap();
    let sealed = tokio::time::timeout(WAIT_MAX, seal)
        .await
        .expect("the seal did not finish after the lease committed")
        .unwrap()
        .unwrap();
    assert_eq!(sealed.version(), 2);
    // Under the new 25 s horizon the same grant one nanosecond later is
    // refused.
    let err = s
        .acquire(
            request(a, 1, SignedDuration::from_secs(20)),
            (c + NS).into(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "horizon_exceeded");
    owner.close().await.unwrap();
}

/// Before any sampler has claimed, a seal is judged from the database's
/// time: after the grant policy was shortened, a horizon that covers the
/// new policy but not a lease granted under the old one is refused (naming
/// the lease), nothing is sealed, and once the lease has settled the same
/// seal is accepted.
#[tokio::test]
async fn before_the_first_claim_a_seal_must_cover_active_leases_from_database_time() {
    let db = support::migrated_db().await;
    let old = support::store_on(&db, old_policy(), support::test_key()).await;
    let mut owner = support::connect(&db).await;
    let now: Timestamp = sqlx::query_scalar::<_, String>(
        "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
    )
    .fetch_one(&mut owner)
    .await
    .unwrap()
    .parse()
    .unwrap();
    let a = tollgate::testkit::new_account(&old, "a", 10, now).await;
    let g = tollgate::testkit::acquire(&old, a, 1, SignedDuration::from_hours(1), now).await;
    let pool = PgPool::connect(db.url()).await.unwrap();
    tollgate_pg::set_policy(&pool, new_policy(), "ops")
        .await
        .unwrap();
    // Due: now + 1 h + the recorded 5 s, far beyond database time + 60 s,
    // which covers the recorded policy (25 s).
    let err = safetime_pg::seal_policy(&mut owner, 60_000, "ops")
        .await
        .unwrap_err();
    assert_eq!(err.code(), "horizon_below_policy");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "horizon below the grant policy: horizon 60000 ms does not cover active lease {}: \
             its expiry {} plus the recorded reclaim_grace PT5S is {}, beyond database time ",
            g.lease_id.0,
            g.expiry,
            g.expiry + SignedDuration::from_secs(5)
        )),
        "{text}"
    );
    assert_eq!(
        safetime_pg::load_policy(&mut owner)
            .await
            .unwrap()
            .version(),
        1
    );
    let new = support::store_on(&db, new_policy(), support::test_key()).await;
    new.release(g.lease_id, &g.capability, now, Some(0))
        .await
        .unwrap();
    let sealed = safetime_pg::seal_policy(&mut owner, 60_000, "ops")
        .await
        .unwrap();
    assert_eq!((sealed.version(), sealed.horizon_ms()), (2, 60_000));
    pool.close().await;
}

/// Every connection of a store's pool has the server end a transaction
/// left idle for `IDLE_IN_TRANSACTION_TIMEOUT` (10 s), so a process paused
/// mid-transaction frees its row locks within that bound.
#[tokio::test]
async fn a_store_s_sessions_end_a_transaction_left_idle() {
    let db = support::migrated_db().await;
    let store = support::store_on(&db, new_policy(), support::test_key()).await;
    let shown: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(shown, "10s");
    assert_eq!(
        tollgate_pg::IDLE_IN_TRANSACTION_TIMEOUT,
        Duration::from_secs(10)
    );
}
