//! Migration 0018's safe-time functions against a real PostgreSQL: the
//! initial cut, epoch fencing, database caps, the sampler role's rights,
//! the sealed horizon policy, and the leadership checks that detect a
//! statement answered by another backend.

mod support;

use jiff::{SignedDuration, Timestamp};
use safetime::{DEFAULT_HORIZON_MS, HorizonPolicy, UncertainReason, Verdict};
use safetime_pg::SafeTimeError;
use sqlx::{Connection, PgConnection, Row};
use tollgate::GrantPolicy;

async fn conn(url: &str) -> PgConnection {
    PgConnection::connect(url).await.unwrap()
}

async fn db_now(c: &mut PgConnection) -> Timestamp {
    let us: i64 = sqlx::query_scalar("SELECT tollgate_safetime_pair_us(clock_timestamp())")
        .fetch_one(c)
        .await
        .unwrap();
    Timestamp::from_microsecond(us).unwrap()
}

/// How many times [`leader`] asks for the sampler lock, 10 ms apart: a
/// previous leader's dropped connection releases the lock only when its
/// backend has exited, which the server does shortly after the client
/// closes the socket (2 s in all, far above that delay).
const LOCK_ATTEMPTS_MAX: u32 = 200;

/// A connection that holds the sampler lock and has claimed an epoch.
async fn leader(url: &str) -> (PgConnection, safetime_pg::Claim) {
    let mut c = conn(url).await;
    let mut attempts = 1;
    while !safetime_pg::try_lock(&mut c).await.unwrap() {
        assert!(
            attempts < LOCK_ATTEMPTS_MAX,
            "the sampler lock was still held after {attempts} attempts"
        );
        attempts += 1;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let policy = safetime_pg::load_policy(&mut c).await.unwrap();
    let claim = safetime_pg::claim(&mut c, &policy).await.unwrap();
    (c, claim)
}

fn verdict(proposal: Timestamp, uncertain: Option<UncertainReason>) -> Verdict {
    Verdict {
        proposal,
        uncertain,
        anomaly: false,
        clears_quarantine: false,
        publishable: true,
        observed_at: proposal,
    }
}

async fn evidence_kinds(url: &str) -> Vec<String> {
    let mut c = conn(url).await;
    safetime_pg::evidence(&mut c, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

#[tokio::test]
async fn empty_installation_starts_at_database_time_uncertain() {
    let db = support::migrated_db().await;
    let mut c = conn(db.url()).await;
    assert_eq!(safetime_pg::read_cut(&mut c).await.unwrap(), None);
    let policy = safetime_pg::load_policy(&mut c).await.unwrap();
    assert_eq!(
        (policy.version(), policy.horizon_ms()),
        (1, DEFAULT_HORIZON_MS)
    );
    assert_eq!(
        policy.digest(),
        HorizonPolicy::digest_of(1, 315_360_000_000)
    );

    let before = db_now(&mut c).await;
    let (mut l, claim) = leader(db.url()).await;
    let after = db_now(&mut c).await;
    assert_eq!(claim.epoch, 1);
    assert!(!claim.quarantined);
    assert_eq!(claim.uncertain, Some(UncertainReason::NewEpoch));
    assert!(
        before <= claim.cut && claim.cut <= after,
        "{before} <= {} <= {after}",
        claim.cut
    );
    assert_eq!(evidence_kinds(db.url()).await, vec!["initial_cut"]);

    let row = safetime_pg::read_cut(&mut c).await.unwrap().unwrap();
    assert_eq!(
        (
            row.epoch,
            row.cut,
            row.uncertain,
            row.quarantined,
            row.publish_seq
        ),
        (1, claim.cut, Some(UncertainReason::NewEpoch), false, 0)
    );

    // A certain publish one microsecond later is taken as is.
    let p = safetime_pg::publish(
        &mut l,
        1,
        &verdict(claim.cut + SignedDuration::from_micros(1), None),
    )
    .await
    .unwrap();
    assert_eq!(
        (p.cut, p.uncertain, p.quarantined, p.publish_seq),
        (claim.cut + SignedDuration::from_micros(1), None, false, 1)
    );
}

#[tokio::test]
async fn claim_and_publish_need_the_lock_on_the_calling_backend() {
    let db = support::migrated_db().await;
    let mut outsider = conn(db.url()).await;
    let policy = safetime_pg::load_policy(&mut outsider).await.unwrap();
    let err = safetime_pg::claim(&mut outsider, &policy)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_leader");

    let (mut l, claim) = leader(db.url()).await;
    // Another backend of the same client (what a transaction-pooling proxy
    // would route a statement to) sees neither the PID nor the lock.
    let leader_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut l)
        .await
        .unwrap();
    let on_leader = safetime_pg::observe(&mut l).await.unwrap();
    assert_eq!(
        (on_leader.backend_pid, on_leader.lock_held),
        (leader_pid, true)
    );
    let elsewhere = safetime_pg::observe(&mut outsider).await.unwrap();
    assert_ne!(elsewhere.backend_pid, leader_pid);
    assert!(!elsewhere.lock_held);
    let err = safetime_pg::publish(&mut outsider, claim.epoch, &verdict(claim.cut, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_leader");
    // The standby cannot take the lock while the leader lives.
    assert!(!safetime_pg::try_lock(&mut outsider).await.unwrap());
}

#[tokio::test]
async fn publish_is_capped_by_database_time_never_backward_and_epoch_fenced() {
    let db = support::migrated_db().await;
    let (mut l, claim) = leader(db.url()).await;
    let far = claim.cut + SignedDuration::from_hours(24);
    let p = safetime_pg::publish(&mut l, 1, &verdict(far, None))
        .await
        .unwrap();
    let now = db_now(&mut l).await;
    assert!(
        p.cut > claim.cut && p.cut <= now,
        "capped: {} <= {now}",
        p.cut
    );
    let capped = p.cut;
    let back = safetime_pg::publish(
        &mut l,
        1,
        &verdict(claim.cut, Some(UncertainReason::ClockStepBackward)),
    )
    .await
    .unwrap();
    assert_eq!(
        (back.cut, back.uncertain),
        (capped, Some(UncertainReason::ClockStepBackward))
    );
    // Sub-microsecond precision survives.
    let exact = capped + SignedDuration::from_nanos(7);
    let mut v = verdict(exact, None);
    v.observed_at = db_now(&mut l).await;
    let p = safetime_pg::publish(&mut l, 1, &v).await.unwrap();
    assert_eq!(p.cut, exact);

    // The leader's session ends; a successor claims epoch 2; the stale
    // epoch is refused even on a connection that holds the lock.
    drop(l);
    let (mut l2, claim2) = leader(db.url()).await;
    assert_eq!(claim2.epoch, 2);
    assert_eq!(claim2.cut, exact);
    assert_eq!(claim2.uncertain, Some(UncertainReason::NewEpoch));
    let err = safetime_pg::publish(&mut l2, 1, &verdict(exact, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "stale_epoch");
    assert!(
        matches!(err, SafeTimeError::StaleEpoch(ref m) if m.contains("epoch 1 is not the current epoch 2")),
        "{err}"
    );
    // A malformed pair straight at the function.
    let err =
        sqlx::query("SELECT * FROM tollgate_safetime_publish(2, 0, 1000, NULL, false, false, 0)")
            .fetch_one(&mut l2)
            .await
            .unwrap_err();
    assert_eq!(SafeTimeError::from(err).code(), "invalid_proposal");
}

/// `published_at` of the cut row, in microseconds since the Unix epoch.
async fn published_us(c: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT tollgate_safetime_pair_us(published_at) FROM tollgate_safetime")
        .fetch_one(c)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_publish_is_dated_by_the_observation_its_cut_came_from() {
    let db = support::migrated_db().await;
    let (mut l, _claim) = leader(db.url()).await;
    let obs = safetime_pg::observe(&mut l).await.unwrap();
    // The sampler pauses between its observation and its publish: the row
    // is dated by the observation, so readers count the pause as staleness.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let p = safetime_pg::publish(&mut l, 1, &verdict(obs.db_now, None))
        .await
        .unwrap();
    assert_eq!(p.cut, obs.db_now);
    assert_eq!(published_us(&mut l).await, obs.db_now.as_microsecond());
    let age_us: i64 = sqlx::query_scalar(
        "SELECT tollgate_safetime_pair_us(clock_timestamp()) - tollgate_safetime_pair_us(published_at) \
           FROM tollgate_safetime",
    )
    .fetch_one(&mut l)
    .await
    .unwrap();
    assert!(
        age_us >= 300_000,
        "the pause is in the row's age: {age_us} us"
    );

    // An observation dated in the future dates the row, and caps the cut,
    // at the publish's own database time.
    let mut ahead = verdict(obs.db_now + SignedDuration::from_hours(1), None);
    ahead.observed_at = ahead.proposal;
    let before = db_now(&mut l).await;
    let p = safetime_pg::publish(&mut l, 1, &ahead).await.unwrap();
    let after = db_now(&mut l).await;
    let dated = Timestamp::from_microsecond(published_us(&mut l).await).unwrap();
    assert!(
        before <= dated && dated <= after,
        "{before} <= {dated} <= {after}"
    );
    assert_eq!(p.cut, dated);

    // A proposal without its observation is refused; the undated publish
    // of migration 0018 is gone.
    let err =
        sqlx::query("SELECT * FROM tollgate_safetime_publish(1, 0, 0, NULL, false, false, NULL)")
            .fetch_one(&mut l)
            .await
            .unwrap_err();
    assert_eq!(SafeTimeError::from(err).code(), "invalid_proposal");
    let err = sqlx::query("SELECT * FROM tollgate_safetime_publish(1, 0, 0, NULL, false, false)")
        .fetch_one(&mut l)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("42883"),
        "{err}"
    );
}

#[tokio::test]
async fn populated_installation_starts_quarantined_at_the_unix_epoch() {
    let db = support::migrated_db().await;
    let store = support::store_on(
        &db,
        GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(1)).unwrap(),
        support::test_key(),
    )
    .await;
    let t0: Timestamp = "2026-11-30T00:00:00Z".parse().unwrap();
    let a = tollgate::testkit::new_account(&store, "a", 10, t0).await;
    tollgate::testkit::acquire(&store, a, 3, SignedDuration::from_secs(30), t0).await;

    let (mut l, claim) = leader(db.url()).await;
    assert_eq!(
        (claim.epoch, claim.cut, claim.quarantined, claim.uncertain),
        (
            1,
            Timestamp::UNIX_EPOCH,
            true,
            Some(UncertainReason::InitialQuarantine)
        )
    );
    let mut c = conn(db.url()).await;
    let detail = sqlx::query(
        "SELECT kind, detail->>'active_leases' AS n, detail->>'idempotency_records' AS i, \
                detail->>'latest_active_expiry_floor_us' AS e, detail->>'cut' AS cut \
           FROM tollgate_safetime_evidence",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    let got: (String, String, String, String, String) = (
        detail.get("kind"),
        detail.get("n"),
        detail.get("i"),
        detail.get("e"),
        detail.get("cut"),
    );
    assert_eq!(
        got,
        (
            "initial_quarantine".into(),
            "1".into(),
            "0".into(),
            (t0 + SignedDuration::from_secs(30))
                .as_microsecond()
                .to_string(),
            "unix_epoch".into()
        )
    );
    // A "certain" publish is stored uncertain while quarantined, and the
    // database refuses to clear the quarantine before a full horizon.
    let p = safetime_pg::publish(
        &mut l,
        1,
        &verdict(Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1), None),
    )
    .await
    .unwrap();
    assert_eq!(
        (p.cut, p.uncertain, p.quarantined),
        (
            Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1),
            Some(UncertainReason::InitialQuarantine),
            true
        )
    );
    let mut clear = verdict(db_now(&mut c).await, None);
    clear.clears_quarantine = true;
    let err = safetime_pg::publish(&mut l, 1, &clear).await.unwrap_err();
    assert_eq!(err.code(), "quarantine_refused");
}

#[tokio::test]
async fn the_sampler_role_can_only_observe_claim_and_publish() {
    let db = support::migrated_db().await;
    let role = format!("tg_sampler_{}", db.name);
    let mut owner = conn(db.url()).await;
    sqlx::query(&format!(
        "CREATE ROLE \"{role}\" LOGIN IN ROLE tollgate_sampler"
    ))
    .execute(&mut owner)
    .await
    .unwrap();
    let url = db.url().replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(url, db.url(), "the test URL names the postgres user");
    let (mut l, claim) = leader(&url).await;
    assert_eq!(claim.epoch, 1);
    let p = safetime_pg::publish(&mut l, 1, &verdict(claim.cut, None))
        .await
        .unwrap();
    assert_eq!(p.uncertain, None);
    assert!(safetime_pg::read_cut(&mut l).await.unwrap().is_some());
    for stmt in [
        "UPDATE tollgate_safetime SET epoch = 99",
        "DELETE FROM tollgate_safetime",
        "INSERT INTO tollgate_safetime_evidence (kind, detail) VALUES ('initial_cut', '{}')",
        "INSERT INTO tollgate_accounts (name) VALUES ('x')",
        "SELECT * FROM tollgate_safetime_seal_policy(1000, 'x')",
    ] {
        let err = sqlx::query(stmt).execute(&mut l).await.unwrap_err();
        let code = err
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{stmt}: {err}");
    }
    drop(l);
    sqlx::query(&format!("DROP OWNED BY \"{role}\""))
        .execute(&mut owner)
        .await
        .unwrap();
    sqlx::query(&format!("DROP ROLE \"{role}\""))
        .execute(&mut owner)
        .await
        .unwrap();
}

/// A standby's sighting: the row's epoch, publish sequence number and cut,
/// with database time and topology from the same statement, read without
/// the lock by a role with only `tollgate_sampler`'s grants.
#[tokio::test]
async fn a_sighting_reads_the_cut_with_database_time_and_topology_without_the_lock() {
    let db = support::migrated_db().await;
    let role = format!("tg_standby_{}", db.name);
    let mut owner = conn(db.url()).await;
    sqlx::query(&format!(
        "CREATE ROLE \"{role}\" LOGIN IN ROLE tollgate_sampler"
    ))
    .execute(&mut owner)
    .await
    .unwrap();
    let url = db.url().replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(url, db.url(), "the test URL names the postgres user");
    let mut standby = conn(&url).await;
    assert_eq!(
        safetime_pg::read_sighting(&mut standby).await.unwrap(),
        None
    );

    let (mut l, claim) = leader(&url).await;
    let p = safetime_pg::publish(&mut l, claim.epoch, &verdict(claim.cut, None))
        .await
        .unwrap();
    let before = db_now(&mut owner).await;
    let s = safetime_pg::read_sighting(&mut standby)
        .await
        .unwrap()
        .unwrap();
    let after = db_now(&mut owner).await;
    let topology = safetime_pg::observe(&mut l).await.unwrap().topology;
    assert_eq!(
        (s.epoch, s.publish_seq, s.cut, s.topology),
        (claim.epoch, p.publish_seq, p.cut, topology)
    );
    assert!(
        before <= s.db_now && s.db_now <= after,
        "{before} <= {} <= {after}",
        s.db_now
    );
    assert!(!safetime_pg::try_lock(&mut standby).await.unwrap());
    drop((l, standby));
    sqlx::query(&format!("DROP OWNED BY \"{role}\""))
        .execute(&mut owner)
        .await
        .unwrap();
    sqlx::query(&format!("DROP ROLE \"{role}\""))
        .execute(&mut owner)
        .await
        .unwrap();
}

#[tokio::test]
async fn horizon_changes_need_a_stopped_sampler_evidence_and_a_successor_epoch() {
    let db = support::migrated_db().await;
    support::store_on(
        &db,
        GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap(),
        support::test_key(),
    )
    .await;
    let (l, claim) = leader(db.url()).await;
    let mut owner = conn(db.url()).await;
    let err = safetime_pg::seal_policy(&mut owner, 86_400_000, "ops")
        .await
        .unwrap_err();
    assert_eq!(err.code(), "sampler_running");
    // The code is said once (the database's message starts with it).
    assert_eq!(
        err.to_string(),
        "a safe-time sampler is running: stop every safe-time sampler before changing the \
         horizon policy"
    );
    drop(l);
    // Wait (bounded) for the server to end the dropped session.
    for _ in 0..100 {
        let running: bool = sqlx::query_scalar("SELECT tollgate_safetime_sampler_running()")
            .fetch_one(&mut owner)
            .await
            .unwrap();
        if !running {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let err = safetime_pg::seal_policy(&mut owner, 64_999, "ops")
        .await
        .unwrap_err();
    assert_eq!(err.code(), "horizon_below_policy");
    // The database's numeric (65000.0000...) reads as the number it is.
    assert_eq!(
        err.to_string(),
        "horizon below the grant policy: horizon 64999 ms must be positive and cover max_ttl + \
         reclaim_grace (65000 ms)"
    );
    let p2 = safetime_pg::seal_policy(&mut owner, 65_000, "ops")
        .await
        .unwrap();
    assert_eq!((p2.version(), p2.horizon_ms()), (2, 65_000));
    assert_eq!(
        evidence_kinds(db.url()).await,
        vec!["initial_cut", "policy_change"]
    );
    let immut = sqlx::query("UPDATE tollgate_safetime_policy SET horizon_ms = 1")
        .execute(&mut owner)
        .await
        .unwrap_err();
    assert!(immut.to_string().contains("immutable"), "{immut}");

    // A process's deadlines must fit both binding policies: version 1 in
    // force for the running epoch, version 2 the next epoch's. 65 s fits
    // both exactly; one nanosecond more is short of version 2.
    let kind = safetime::DeadlineKind::named("test.job");
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let at = |d| [safetime::DeadlineBound::new(kind, d)];
    let (in_force, next) = safetime_pg::binding_policies(&pool).await.unwrap();
    assert_eq!(
        (
            in_force.policy.version(),
            in_force.which,
            next.map(|n| (n.policy.version(), n.which))
        ),
        (
            1,
            "in force for the current epoch",
            Some((2, "the newest sealed"))
        )
    );
    let fits = safetime_pg::check_bounds(&pool, &at(SignedDuration::from_secs(65)))
        .await
        .unwrap();
    assert_eq!(fits.version(), 1);
    let over = safetime_pg::check_bounds(&pool, &at(SignedDuration::new(65, 1)))
        .await
        .unwrap_err();
    assert_eq!(
        over.to_string(),
        "the longest test.job deadline (PT1M5.000000001S) is beyond the horizon of policy \
         version 2 (PT1M5S) (the newest sealed); seal a longer horizon (tollgate-safetime policy) or lower \
         the setting"
    );

    // Still version 1 for the running epoch; a sampler that loaded version 1
    // cannot claim; one that loads version 2 claims epoch 2 under it.
    let row = safetime_pg::read_cut(&mut owner).await.unwrap().unwrap();
    assert_eq!((row.epoch, row.policy.version()), (claim.epoch, 1));
    let mut c = conn(db.url()).await;
    assert!(safetime_pg::try_lock(&mut c).await.unwrap());
    let v1 = HorizonPolicy::verified(
        1,
        DEFAULT_HORIZON_MS,
        &HorizonPolicy::digest_of(1, DEFAULT_HORIZON_MS),
    )
    .unwrap();
    let err = safetime_pg::claim(&mut c, &v1).await.unwrap_err();
    assert_eq!(err.code(), "horizon_policy_mismatch");
    let loaded = safetime_pg::load_policy(&mut c).await.unwrap();
    let claim2 = safetime_pg::claim(&mut c, &loaded).await.unwrap();
    assert_eq!(claim2.epoch, 2);
    let row = safetime_pg::read_cut(&mut owner).await.unwrap().unwrap();
    assert_eq!(
        (row.epoch, row.policy.version(), row.policy.horizon_ms()),
        (2, 2, 65_000)
    );
    // Now version 2 is in force and the only binding policy.
    let (in_force, next) = safetime_pg::binding_policies(&pool).await.unwrap();
    assert_eq!((in_force.policy.version(), next), (2, None));
    match safetime_pg::check_bounds(&pool, &at(SignedDuration::new(65, 1))).await {
        Err(safetime_pg::HorizonCheckError::TooShort { shortfall, which }) => assert_eq!(
            (shortfall.version, shortfall.longest, which),
            (
                2,
                Some(SignedDuration::new(65, 1)),
                "in force for the current epoch"
            )
        ),
        other => panic!("expected too short, got {other:?}"),
    }

    // With safe time in use, no grant policy may outgrow the horizon: one
    // nanosecond more than 65 s of max_ttl + grace is refused by the
    // database, whoever writes it; exactly 65 s is accepted.
    let over = GrantPolicy::new(SignedDuration::new(60, 1), SignedDuration::from_secs(5)).unwrap();
    let err = tollgate_pg::set_policy(&pool, over, "ops")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(
            "horizon_exceeded: max_ttl + reclaim_grace (65000.000001 ms) exceeds the sealed \
             safe-time horizon (65000 ms)"
        ),
        "{err}"
    );
    assert_eq!(
        tollgate_pg::recorded_policy(&pool).await.unwrap(),
        Some(
            GrantPolicy::new(SignedDuration::from_secs(60), SignedDuration::from_secs(5)).unwrap()
        )
    );
    let fits =
        GrantPolicy::new(SignedDuration::from_secs(50), SignedDuration::from_secs(15)).unwrap();
    tollgate_pg::set_policy(&pool, fits, "ops").await.unwrap();
    assert_eq!(
        tollgate_pg::recorded_policy(&pool).await.unwrap(),
        Some(fits)
    );
}

/// Sealing a horizon of one's own puts the policy under it at once, before
/// any sampler has claimed: a longer grant policy is refused.
#[tokio::test]
async fn a_sealed_horizon_binds_the_grant_policy_before_any_claim() {
    let db = support::migrated_db().await;
    let mut owner = conn(db.url()).await;
    safetime_pg::seal_policy(&mut owner, 1_000, "ops")
        .await
        .unwrap();
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let long =
        GrantPolicy::new(SignedDuration::from_hours(2), SignedDuration::from_mins(1)).unwrap();
    let err = tollgate_pg::set_policy(&pool, long, "ops")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(
            "horizon_exceeded: max_ttl + reclaim_grace (7260000 ms) exceeds the sealed \
             safe-time horizon (1000 ms)"
        ),
        "{err}"
    );
    assert_eq!(tollgate_pg::recorded_policy(&pool).await.unwrap(), None);
    let short = GrantPolicy::new(
        SignedDuration::from_millis(500),
        SignedDuration::from_millis(500),
    )
    .unwrap();
    tollgate_pg::set_policy(&pool, short, "ops").await.unwrap();
    assert_eq!(
        tollgate_pg::recorded_policy(&pool).await.unwrap(),
        Some(short)
    );
}
