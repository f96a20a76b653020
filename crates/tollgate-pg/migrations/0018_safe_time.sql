-- Safe time (docs/time-model.md): the owner-sealed
-- horizon policy, the persisted safe expiry cut with its durable epoch, the
-- immutable evidence of how the cut began and changed, and the only
-- functions through which a sampler may write.
--
-- Leadership: one session-level advisory lock, key pair
-- (1953459308, 1935763045) = ('toll', 'safe'), held on a pinned connection.
-- Every writing function below first checks, in pg_locks, that *its own
-- backend* holds exactly that lock, so a statement routed to another
-- backend (PgBouncer transaction or statement pooling) is refused.
--
-- Error codes (SQLSTATE, stable; the sampler maps them):
--   TGS01 not_leader           this backend does not hold the sampler lock
--   TGS02 stale_epoch          the caller's epoch is not the current one
--   TGS03 policy_mismatch      the caller loaded another policy version/digest
--   TGS04 sampler_running      a policy change while a sampler holds the lock
--   TGS05 invalid_proposal     a malformed instant pair
--   TGS06 quarantine_refused   clearing the quarantine before a full horizon
--                              of database time since the proof began
--   TGS07 horizon_below_policy a horizon shorter than max_ttl + reclaim_grace
--   TGS08 no_claim             publish before any epoch was claimed
--   TGS09 horizon_exceeded     a grant policy whose max_ttl + reclaim_grace
--                              does not fit the sealed horizon, once safe
--                              time is in use (a sampler has claimed, or a
--                              horizon was sealed)
--   TGS10 clock_not_safe_cut   a lease write from a session that does not
--                              run on the cut, once a sampler has claimed

-- Owner-sealed maximum-deadline horizon, one immutable row per version.
-- The digest is the hex SHA-256 of the canonical text
-- 'tollgate-safetime-policy/v1;version=<v>;horizon_ms=<h>' and is checked
-- here and again by the sampler when it loads the policy.
CREATE TABLE tollgate_safetime_policy (
    version    BIGINT PRIMARY KEY CHECK (version >= 1),
    horizon_ms BIGINT NOT NULL CHECK (horizon_ms > 0),
    digest     TEXT   NOT NULL,
    sealed_by  TEXT   NOT NULL CHECK (char_length(sealed_by) BETWEEN 1 AND 200),
    sealed_at  TIMESTAMPTZ NOT NULL DEFAULT transaction_timestamp(),
    CONSTRAINT tollgate_safetime_policy_digest CHECK (
        digest = encode(sha256(convert_to(
            'tollgate-safetime-policy/v1;version=' || version || ';horizon_ms=' || horizon_ms,
            'UTF8')), 'hex'))
);

INSERT INTO tollgate_safetime_policy (version, horizon_ms, digest, sealed_by)
VALUES (1, 315360000000,
        encode(sha256(convert_to('tollgate-safetime-policy/v1;version=1;horizon_ms=315360000000', 'UTF8')), 'hex'),
        'migration 0018 (default: 3650 days)');

-- The cut, as an instant pair (cut_floor_us, cut_submicro_ns). No row until
-- the first sampler claims epoch 1.
CREATE TABLE tollgate_safetime (
    singleton          BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch              BIGINT  NOT NULL CHECK (epoch >= 1),
    policy_version     BIGINT  NOT NULL REFERENCES tollgate_safetime_policy (version),
    cut_floor_us       BIGINT  NOT NULL,
    cut_submicro_ns    INTEGER NOT NULL CHECK (cut_submicro_ns BETWEEN 0 AND 999),
    certain            BOOLEAN NOT NULL,
    uncertain_reason   TEXT,
    quarantined        BOOLEAN NOT NULL,
    proof_started_at   TIMESTAMPTZ NOT NULL,
    leader_pid         INTEGER NOT NULL,
    system_identifier  BIGINT  NOT NULL,
    timeline_id        BIGINT  NOT NULL,
    postmaster_start   TIMESTAMPTZ NOT NULL,
    claimed_at         TIMESTAMPTZ NOT NULL,
    published_at       TIMESTAMPTZ NOT NULL,
    publish_seq        BIGINT  NOT NULL CHECK (publish_seq >= 0),
    CONSTRAINT tollgate_safetime_reason CHECK (certain = (uncertain_reason IS NULL)),
    CONSTRAINT tollgate_safetime_quarantine_uncertain CHECK (NOT (certain AND quarantined))
);

-- Immutable evidence: how the cut began (initial_cut, initial_quarantine
-- with the deadline inventory and prior guard), when a quarantine cleared,
-- and every horizon policy change.
CREATE TABLE tollgate_safetime_evidence (
    evidence_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        TEXT   NOT NULL CHECK (kind IN ('initial_cut', 'initial_quarantine',
                                                'quarantine_cleared', 'policy_change')),
    epoch       BIGINT,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    detail      JSONB  NOT NULL
);

CREATE FUNCTION tollgate_safetime_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = '42501';
END $$;

CREATE TRIGGER tollgate_safetime_policy_immutable
    BEFORE UPDATE OR DELETE ON tollgate_safetime_policy
    FOR EACH ROW EXECUTE FUNCTION tollgate_safetime_immutable();
CREATE TRIGGER tollgate_safetime_evidence_immutable
    BEFORE UPDATE OR DELETE ON tollgate_safetime_evidence
    FOR EACH ROW EXECUTE FUNCTION tollgate_safetime_immutable();
CREATE TRIGGER tollgate_safetime_policy_no_truncate
    BEFORE TRUNCATE ON tollgate_safetime_policy
    FOR EACH STATEMENT EXECUTE FUNCTION tollgate_safetime_immutable();
CREATE TRIGGER tollgate_safetime_evidence_no_truncate
    BEFORE TRUNCATE ON tollgate_safetime_evidence
    FOR EACH STATEMENT EXECUTE FUNCTION tollgate_safetime_immutable();

-- Whether *this backend* holds exactly the sampler's advisory lock.
CREATE FUNCTION tollgate_safetime_lock_held() RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT count(*) = 1
      FROM pg_catalog.pg_locks
     WHERE locktype = 'advisory'
       AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
       AND classid = 1953459308 AND objid = 1935763045 AND objsubid = 2
       AND pid = pg_catalog.pg_backend_pid()
       AND mode = 'ExclusiveLock' AND granted
$$;

-- Whether any session holds the sampler lock (a running sampler).
CREATE FUNCTION tollgate_safetime_sampler_running() RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks
         WHERE locktype = 'advisory'
           AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
           AND classid = 1953459308 AND objid = 1935763045 AND objsubid = 2
           AND granted)
$$;

-- The current WAL timeline of a primary (0 while in recovery).
CREATE FUNCTION tollgate_safetime_timeline() RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN 0::bigint
                ELSE ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
           END
$$;

-- One observation: database time, this backend, lock ownership and topology,
-- all read by one statement.
CREATE FUNCTION tollgate_safetime_observe(
    OUT db_now timestamptz, OUT backend_pid integer, OUT lock_held boolean,
    OUT system_identifier bigint, OUT timeline_id bigint, OUT in_recovery boolean,
    OUT postmaster_start timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT pg_catalog.clock_timestamp(), pg_catalog.pg_backend_pid(),
           tollgate_safetime_lock_held(),
           (SELECT s.system_identifier::bigint FROM pg_catalog.pg_control_system() s),
           tollgate_safetime_timeline(), pg_catalog.pg_is_in_recovery(),
           pg_catalog.pg_postmaster_start_time()
$$;

-- Instant pair of a timestamptz (microsecond precision: submicro 0).
CREATE FUNCTION tollgate_safetime_pair_us(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT (floor(extract(epoch FROM t) * 1000000))::bigint
$$;

-- Claims the next epoch for the caller, who must hold the sampler lock and
-- have loaded the newest sealed policy. The first claim ever decides the
-- initial cut: database time when the installation provably holds no
-- deadline-bearing or idempotency authority (no active lease, no
-- idempotency record), otherwise the Unix epoch, quarantined, with evidence
-- of the inventory. Every claim makes the cut uncertain.
CREATE FUNCTION tollgate_safetime_claim(p_policy_version bigint, p_policy_digest text)
RETURNS TABLE (epoch bigint, cut_floor_us bigint, cut_submicro_ns integer,
               quarantined boolean, horizon_ms bigint, uncertain_reason text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    pol   tollgate_safetime_policy%ROWTYPE;
    cur   tollgate_safetime%ROWTYPE;
    obs   record;
    inv   jsonb;
    n_active bigint;
    n_idem   bigint;
    reason   text;
BEGIN
    IF NOT tollgate_safetime_lock_held() THEN
        RAISE EXCEPTION 'not_leader: this backend does not hold the safe-time sampler lock'
            USING ERRCODE = 'TGS01';
    END IF;
    SELECT * INTO pol FROM tollgate_safetime_policy p ORDER BY p.version DESC LIMIT 1;
    IF pol.version IS DISTINCT FROM p_policy_version OR pol.digest IS DISTINCT FROM p_policy_digest THEN
        RAISE EXCEPTION 'policy_mismatch: the sealed policy is version % (digest %), the sampler loaded version % (digest %)',
            pol.version, pol.digest, p_policy_version, p_policy_digest
            USING ERRCODE = 'TGS03';
    END IF;
    SELECT * INTO obs FROM tollgate_safetime_observe();
    SELECT * INTO cur FROM tollgate_safetime s FOR UPDATE;
    IF NOT FOUND THEN
        -- Freeze the inventory: no lease or idempotency record may appear
        -- while it is taken.
        LOCK TABLE tollgate_leases, tollgate_idempotency IN SHARE MODE;
        SELECT count(*) INTO n_active FROM tollgate_leases l WHERE l.state = 'active';
        SELECT count(*) INTO n_idem FROM tollgate_idempotency;
        inv := jsonb_build_object(
            'prior_guard', NULL,
            'active_leases', n_active,
            'idempotency_records', n_idem,
            'latest_active_expiry_floor_us',
                (SELECT max(l.expiry_floor_us) FROM tollgate_leases l WHERE l.state = 'active'),
            'database_time', obs.db_now);
        IF n_active = 0 AND n_idem = 0 THEN
            INSERT INTO tollgate_safetime VALUES (
                true, 1, pol.version, tollgate_safetime_pair_us(obs.db_now), 0,
                false, 'new_epoch', false, obs.db_now, obs.backend_pid,
                obs.system_identifier, obs.timeline_id, obs.postmaster_start,
                obs.db_now, obs.db_now, 0);
            INSERT INTO tollgate_safetime_evidence (kind, epoch, detail)
            VALUES ('initial_cut', 1, inv || jsonb_build_object('cut', 'database_time'));
        ELSE
            INSERT INTO tollgate_safetime VALUES (
                true, 1, pol.version, 0, 0,
                false, 'initial_quarantine', true, obs.db_now, obs.backend_pid,
                obs.system_identifier, obs.timeline_id, obs.postmaster_start,
                obs.db_now, obs.db_now, 0);
            INSERT INTO tollgate_safetime_evidence (kind, epoch, detail)
            VALUES ('initial_quarantine', 1, inv || jsonb_build_object('cut', 'unix_epoch'));
        END IF;
    ELSE
        reason := CASE
            WHEN cur.quarantined THEN 'initial_quarantine'
            WHEN cur.system_identifier <> obs.system_identifier
              OR cur.timeline_id <> obs.timeline_id
              OR cur.postmaster_start <> obs.postmaster_start THEN 'primary_change'
            ELSE 'new_epoch' END;
        UPDATE tollgate_safetime s
           SET epoch = s.epoch + 1, policy_version = pol.version,
               certain = false, uncertain_reason = reason,
               proof_started_at = obs.db_now, leader_pid = obs.backend_pid,
               system_identifier = obs.system_identifier, timeline_id = obs.timeline_id,
               postmaster_start = obs.postmaster_start, claimed_at = obs.db_now;
    END IF;
    RETURN QUERY
        SELECT s.epoch, s.cut_floor_us, s.cut_submicro_ns, s.quarantined, pol.horizon_ms,
               s.uncertain_reason
          FROM tollgate_safetime s;
END $$;

-- Publishes a proposed cut for epoch p_epoch. The database applies its own
-- caps: the caller must hold the lock and the current epoch; the cut never
-- goes backward and never passes this server's clock_timestamp(); a
-- topology change seen here forces uncertainty; certainty is never
-- published while quarantined; a quarantine clears only when the caller
-- says its monotonic proof completed *and* a full horizon of database time
-- has passed since the proof began.
CREATE FUNCTION tollgate_safetime_publish(
    p_epoch bigint, p_cut_floor_us bigint, p_cut_submicro_ns integer,
    p_uncertain_reason text, p_anomaly boolean, p_clear_quarantine boolean)
RETURNS TABLE (cut_floor_us bigint, cut_submicro_ns integer, certain boolean,
               uncertain_reason text, quarantined boolean, publish_seq bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    cur  tollgate_safetime%ROWTYPE;
    pol  tollgate_safetime_policy%ROWTYPE;
    obs  record;
    db_us bigint;
    new_floor bigint;
    new_sub integer;
    reason text := p_uncertain_reason;
    anomaly boolean := coalesce(p_anomaly, true);
    still_quarantined boolean;
BEGIN
    IF NOT tollgate_safetime_lock_held() THEN
        RAISE EXCEPTION 'not_leader: this backend does not hold the safe-time sampler lock'
            USING ERRCODE = 'TGS01';
    END IF;
    SELECT * INTO cur FROM tollgate_safetime s FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no_claim: no epoch has been claimed' USING ERRCODE = 'TGS08';
    END IF;
    IF p_epoch IS DISTINCT FROM cur.epoch THEN
        RAISE EXCEPTION 'stale_epoch: epoch % is not the current epoch %', p_epoch, cur.epoch
            USING ERRCODE = 'TGS02';
    END IF;
    IF p_cut_floor_us IS NULL OR p_cut_submicro_ns IS NULL
       OR p_cut_submicro_ns NOT BETWEEN 0 AND 999 THEN
        RAISE EXCEPTION 'invalid_proposal: (%, %) is not an instant pair', p_cut_floor_us, p_cut_submicro_ns
            USING ERRCODE = 'TGS05';
    END IF;
    SELECT * INTO pol FROM tollgate_safetime_policy p WHERE p.version = cur.policy_version;
    SELECT * INTO obs FROM tollgate_safetime_observe();
    IF cur.system_identifier <> obs.system_identifier
       OR cur.timeline_id <> obs.timeline_id
       OR cur.postmaster_start <> obs.postmaster_start THEN
        reason := 'primary_change';
        anomaly := true;
    END IF;
    db_us := tollgate_safetime_pair_us(obs.db_now);
    still_quarantined := cur.quarantined;
    IF cur.quarantined AND p_clear_quarantine AND NOT anomaly THEN
        IF obs.db_now - cur.proof_started_at < make_interval(secs => pol.horizon_ms / 1000.0) THEN
            RAISE EXCEPTION 'quarantine_refused: % of database time since the proof began is less than the % ms horizon',
                obs.db_now - cur.proof_started_at, pol.horizon_ms
                USING ERRCODE = 'TGS06';
        END IF;
        still_quarantined := false;
        INSERT INTO tollgate_safetime_evidence (kind, epoch, detail)
        VALUES ('quarantine_cleared', cur.epoch, jsonb_build_object(
            'proof_started_at', cur.proof_started_at, 'database_time', obs.db_now,
            'horizon_ms', pol.horizon_ms, 'policy_version', pol.version));
    END IF;
    IF still_quarantined AND reason IS NULL THEN
        reason := 'initial_quarantine';
    END IF;
    -- Cap at database time, then never backward.
    IF (p_cut_floor_us, p_cut_submicro_ns) <= (db_us, 0) THEN
        new_floor := p_cut_floor_us; new_sub := p_cut_submicro_ns;
    ELSE
        new_floor := db_us; new_sub := 0;
    END IF;
    IF (new_floor, new_sub) < (cur.cut_floor_us, cur.cut_submicro_ns) THEN
        new_floor := cur.cut_floor_us; new_sub := cur.cut_submicro_ns;
    END IF;
    UPDATE tollgate_safetime s
       SET cut_floor_us = new_floor, cut_submicro_ns = new_sub,
           certain = (reason IS NULL), uncertain_reason = reason,
           quarantined = still_quarantined,
           proof_started_at = CASE WHEN anomaly THEN obs.db_now ELSE s.proof_started_at END,
           system_identifier = obs.system_identifier, timeline_id = obs.timeline_id,
           postmaster_start = obs.postmaster_start,
           published_at = obs.db_now, publish_seq = s.publish_seq + 1;
    RETURN QUERY
        SELECT s.cut_floor_us, s.cut_submicro_ns, s.certain, s.uncertain_reason,
               s.quarantined, s.publish_seq
          FROM tollgate_safetime s;
END $$;

-- Seals a new horizon policy version. Owner only; refused while a sampler
-- holds the lock (a change needs a stopped sampler) and when the horizon
-- would not cover the recorded grant policy (max_ttl + reclaim_grace). It
-- takes effect at the next claimed epoch.
CREATE FUNCTION tollgate_safetime_seal_policy(p_horizon_ms bigint, p_sealed_by text)
RETURNS TABLE (version bigint, horizon_ms bigint, digest text)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    old tollgate_safetime_policy%ROWTYPE;
    nv bigint;
    need_ms numeric;
BEGIN
    IF tollgate_safetime_sampler_running() THEN
        RAISE EXCEPTION 'sampler_running: stop every safe-time sampler before changing the horizon policy'
            USING ERRCODE = 'TGS04';
    END IF;
    LOCK TABLE tollgate_safetime_policy IN EXCLUSIVE MODE;
    SELECT * INTO old FROM tollgate_safetime_policy p ORDER BY p.version DESC LIMIT 1;
    SELECT (p.max_ttl_secs + p.reclaim_grace_secs) * 1000.0
           + (p.max_ttl_nanos + p.reclaim_grace_nanos) / 1000000.0
      INTO need_ms FROM tollgate_policy p;
    IF p_horizon_ms IS NULL OR p_horizon_ms <= 0 OR (need_ms IS NOT NULL AND p_horizon_ms < need_ms) THEN
        RAISE EXCEPTION 'horizon_below_policy: horizon % ms must be positive and cover max_ttl + reclaim_grace (% ms)',
            p_horizon_ms, trim_scale(need_ms) USING ERRCODE = 'TGS07';
    END IF;
    nv := old.version + 1;
    INSERT INTO tollgate_safetime_policy (version, horizon_ms, digest, sealed_by)
    VALUES (nv, p_horizon_ms,
            encode(sha256(convert_to('tollgate-safetime-policy/v1;version=' || nv || ';horizon_ms=' || p_horizon_ms, 'UTF8')), 'hex'),
            p_sealed_by);
    INSERT INTO tollgate_safetime_evidence (kind, epoch, detail)
    VALUES ('policy_change', (SELECT s.epoch FROM tollgate_safetime s), jsonb_build_object(
        'old_version', old.version, 'old_horizon_ms', old.horizon_ms,
        'new_version', nv, 'new_horizon_ms', p_horizon_ms, 'sealed_by', p_sealed_by));
    RETURN QUERY SELECT p.version, p.horizon_ms, p.digest
                   FROM tollgate_safetime_policy p WHERE p.version = nv;
END $$;

-- Once safe time is in use (a sampler has claimed an epoch, or an owner
-- has sealed a horizon of their own), no grant policy may admit a deadline
-- beyond the sealed horizon: neither the newest sealed one nor the one in
-- force for the current epoch. Enforced here, so
-- no process (a first start recording its policy, or `tollgate policy set`)
-- can weaken it.
CREATE FUNCTION tollgate_policy_within_horizon() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    need_ms numeric;
    horizon bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tollgate_safetime)
       AND (SELECT max(p.version) FROM tollgate_safetime_policy p) = 1 THEN
        RETURN NEW;
    END IF;
    SELECT least(
               (SELECT p.horizon_ms FROM tollgate_safetime_policy p ORDER BY p.version DESC LIMIT 1),
               (SELECT p.horizon_ms FROM tollgate_safetime s
                  JOIN tollgate_safetime_policy p ON p.version = s.policy_version))
      INTO horizon;
    need_ms := (NEW.max_ttl_secs::numeric + NEW.reclaim_grace_secs) * 1000
             + (NEW.max_ttl_nanos::numeric + NEW.reclaim_grace_nanos) / 1000000;
    IF need_ms > horizon THEN
        RAISE EXCEPTION 'horizon_exceeded: max_ttl + reclaim_grace (% ms) exceeds the sealed safe-time horizon (% ms)',
            trim_scale(need_ms), horizon USING ERRCODE = 'TGS09';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tollgate_policy_within_horizon
    BEFORE INSERT OR UPDATE ON tollgate_policy
    FOR EACH ROW EXECUTE FUNCTION tollgate_policy_within_horizon();

-- Once a sampler has claimed (the cut row exists), leases are timed by the
-- cut: a process on any other clock (system, test) would grant, renew and,
-- worse, reclaim by its own time, ahead of the cut. A process checks this
-- when it starts, but one already running when the first claim happens
-- would go on. So the database refuses every lease write from a session
-- that has not declared `SET tollgate.clock = 'safe-cut'` (the store does,
-- on every connection, when it runs on the cut). Statement-level, so one
-- check per statement; the write's ROW EXCLUSIVE lock conflicts with the
-- first claim's SHARE lock on tollgate_leases, so a write either commits
-- before the claim takes its inventory or runs this check after the claim
-- committed (each query of a volatile function sees a new snapshot).
CREATE FUNCTION tollgate_leases_on_cut() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
BEGIN
    IF current_setting('tollgate.clock', true) IS DISTINCT FROM 'safe-cut'
       AND EXISTS (SELECT 1 FROM tollgate_safetime) THEN
        RAISE EXCEPTION 'clock_not_safe_cut: this database''s leases are timed by the safe expiry cut (a safe-time sampler has claimed an epoch), but this process does not run on it; restart it with --clock safe-cut'
            USING ERRCODE = 'TGS10';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tollgate_leases_on_cut
    BEFORE INSERT OR UPDATE OR DELETE ON tollgate_leases
    FOR EACH STATEMENT EXECUTE FUNCTION tollgate_leases_on_cut();

-- The sampler role: it may observe, claim and publish, read the cut and the
-- policy, and nothing else that writes. Roles are cluster-wide, so it is
-- created once per cluster.
-- Two databases of one cluster migrating at once may race to create it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tollgate_sampler') THEN
        BEGIN
            CREATE ROLE tollgate_sampler NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END $$;

REVOKE ALL ON FUNCTION tollgate_safetime_claim(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION tollgate_safetime_publish(bigint, bigint, integer, text, boolean, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION tollgate_safetime_seal_policy(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION tollgate_safetime_observe() FROM PUBLIC;
REVOKE ALL ON FUNCTION tollgate_safetime_lock_held() FROM PUBLIC;
REVOKE ALL ON FUNCTION tollgate_safetime_sampler_running() FROM PUBLIC;
REVOKE ALL ON FUNCTION tollgate_safetime_timeline() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tollgate_safetime_claim(bigint, text) TO tollgate_sampler;
GRANT EXECUTE ON FUNCTION tollgate_safetime_publish(bigint, bigint, integer, text, boolean, boolean) TO tollgate_sampler;
GRANT EXECUTE ON FUNCTION tollgate_safetime_observe() TO tollgate_sampler;
GRANT EXECUTE ON FUNCTION tollgate_safetime_lock_held() TO tollgate_sampler;
GRANT SELECT ON tollgate_safetime, tollgate_safetime_policy TO tollgate_sampler;
