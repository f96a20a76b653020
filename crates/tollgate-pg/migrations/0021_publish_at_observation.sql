-- A publish is dated by the observation its cut came from.
--
-- The sampler observes database time, derives a proposed cut from that
-- observation, then publishes it in a second statement. 0018's publish
-- dated the row (published_at) and capped the cut at the publish's own
-- clock_timestamp(). A sampler paused between the two statements (a
-- stopped process, a frozen VM, a starved CPU) then published an old cut
-- under a fresh date: readers measure a cut's staleness from
-- published_at, so they counted deadlines from a cut that was already
-- behind real time by the whole pause, and a lease granted then could end
-- that much early in real time.
--
-- Now the caller passes the database time of the observation the proposal
-- came from (p_observed_us, microseconds since the Unix epoch, as
-- tollgate_safetime_pair_us gives it). The row is dated by it (never later
-- than the publish's own time), the cut is capped by it, and the
-- quarantine's horizon of database time is measured to it, and from it
-- when the caller reports the observation an anomaly (a topology change
-- this function sees itself starts the proof at its own time), so the
-- database's proof spans at least the sampler's own; so the pause
-- counts in every reader's staleness bound, and a pause longer than the
-- gap bound makes the cut stale at once. A proposal without it is refused
-- (TGS05 invalid_proposal). The six-argument publish is dropped: a
-- sampler too old to pass the observation cannot publish, so its cut
-- turns stale instead of fresh.

DROP FUNCTION tollgate_safetime_publish(bigint, bigint, integer, text, boolean, boolean);

CREATE FUNCTION tollgate_safetime_publish(
    p_epoch bigint, p_cut_floor_us bigint, p_cut_submicro_ns integer,
    p_uncertain_reason text, p_anomaly boolean, p_clear_quarantine boolean,
    p_observed_us bigint)
RETURNS TABLE (cut_floor_us bigint, cut_submicro_ns integer, certain boolean,
               uncertain_reason text, quarantined boolean, publish_seq bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    cur  tollgate_safetime%ROWTYPE;
    pol  tollgate_safetime_policy%ROWTYPE;
    obs  record;
    observed timestamptz;
    topology_changed boolean := false;
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
    IF p_observed_us IS NULL THEN
        RAISE EXCEPTION 'invalid_proposal: a proposal needs the database time of the observation it came from'
            USING ERRCODE = 'TGS05';
    END IF;
    -- The observation the proposal came from, never later than now.
    observed := LEAST(timestamptz 'epoch' + p_observed_us * interval '1 microsecond', obs.db_now);
    IF cur.system_identifier <> obs.system_identifier
       OR cur.timeline_id <> obs.timeline_id
       OR cur.postmaster_start <> obs.postmaster_start THEN
        reason := 'primary_change';
        anomaly := true;
        topology_changed := true;
    END IF;
    db_us := tollgate_safetime_pair_us(observed);
    still_quarantined := cur.quarantined;
    IF cur.quarantined AND p_clear_quarantine AND NOT anomaly THEN
        IF observed - cur.proof_started_at < make_interval(secs => pol.horizon_ms / 1000.0) THEN
            RAISE EXCEPTION 'quarantine_refused: % of database time since the proof began is less than the % ms horizon',
                observed - cur.proof_started_at, pol.horizon_ms
                USING ERRCODE = 'TGS06';
        END IF;
        still_quarantined := false;
        INSERT INTO tollgate_safetime_evidence (kind, epoch, detail)
        VALUES ('quarantine_cleared', cur.epoch, jsonb_build_object(
            'proof_started_at', cur.proof_started_at, 'database_time', observed,
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
           proof_started_at = CASE WHEN topology_changed THEN obs.db_now
                                   WHEN anomaly THEN observed
                                   ELSE s.proof_started_at END,
           system_identifier = obs.system_identifier, timeline_id = obs.timeline_id,
           postmaster_start = obs.postmaster_start,
           published_at = observed, publish_seq = s.publish_seq + 1;
    RETURN QUERY
        SELECT s.cut_floor_us, s.cut_submicro_ns, s.certain, s.uncertain_reason,
               s.quarantined, s.publish_seq
          FROM tollgate_safetime s;
END $$;

REVOKE ALL ON FUNCTION tollgate_safetime_publish(bigint, bigint, integer, text, boolean, boolean, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tollgate_safetime_publish(bigint, bigint, integer, text, boolean, boolean, bigint) TO tollgate_sampler;
