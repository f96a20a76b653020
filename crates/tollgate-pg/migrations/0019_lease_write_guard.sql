-- Lease writes under the recorded grant policy and inside the sealed
-- horizon. A process checks both when it starts; one that was already
-- running when an operator recorded another grant policy (`tollgate policy
-- set`) or sealed a shorter horizon would go on granting, renewing and
-- reclaiming by the policy it started with. So the database refuses:
--
-- 1. Any insert or update of tollgate_leases from a session whose declared
--    grant policy differs from the recorded one (tollgate_policy), or that
--    declares none. Every store declares the policy it applies on every
--    connection:
--        SET tollgate.grant_policy = '<max_ttl_ns>/<reclaim_grace_ns>'
--    both exact nanoseconds in decimal without leading zeros (what
--    tollgate_grant_policy_declaration() returns for the recorded one).
--    Every lease writer is a store that knows its policy, so a session that
--    declares nothing (an older binary, a script) is refused too. Reclaim
--    is an update: a process with a shorter grace cannot reclaim early.
--    Statement-level, so one check per statement.
-- 2. Once a sampler has claimed an epoch (the cut row exists), an active
--    lease whose expiry plus the recorded reclaim_grace lies beyond
--    cut + horizon, the horizon being the smaller of the newest sealed
--    policy's and the current epoch's (as for TGS09). Exact: nanoseconds
--    from the instant pairs (1000 * floor_us + submicro_ns), numeric
--    arithmetic, nothing rounded; exactly cut + horizon is accepted.
--    Checked on every insert of an active lease (acquire, consolidation)
--    and every update that changes an active lease's expiry (renewal) or
--    makes a lease active; settlements change no expiry.
--
-- Error codes (SQLSTATE, stable; the store maps them):
--   TGS11 lease_policy_mismatch  a lease write from a session whose declared
--                                grant policy differs from the recorded one,
--                                that declares none, or while none is
--                                recorded
--   TGS12 lease_beyond_horizon   an active lease whose expiry +
--                                reclaim_grace lies beyond cut + horizon
--
-- Concurrency. Each check holds a ROW SHARE lock until its transaction
-- ends: the policy check on tollgate_policy, the horizon check on
-- tollgate_safetime_policy. A policy change (any UPDATE or DELETE of
-- tollgate_policy, by the trigger below) and a seal (0018's function) take
-- EXCLUSIVE on those tables, so each waits for every transaction that
-- wrote a lease under the old values to end, and a lease write that comes
-- after either one waits for it and then sees the new values. A claim
-- never lowers the horizon (the newest sealed one is already in the
-- minimum) and the cut never goes backward, so reading either unlocked
-- errs only towards refusing. Readers (ACCESS SHARE) never wait.
--
-- Any later migration that writes tollgate_leases must first declare, in
-- its own transaction,
--     SELECT set_config('tollgate.grant_policy', tollgate_grant_policy_declaration(), true);
-- and, once a sampler has claimed, SET LOCAL tollgate.clock = 'safe-cut'
-- (0018's TGS10).
--
-- The declarations are a guard against misconfiguration, not against a
-- hostile client (any session may set them). The functions are SECURITY
-- DEFINER so that a writer needs no privilege on the tables they lock.

-- Take the tables in the order running writers do (a reclaim reads the
-- policy before it touches leases), so this migration waits rather than
-- deadlocks.
LOCK TABLE tollgate_policy, tollgate_leases IN SHARE ROW EXCLUSIVE MODE;

-- A nonnegative or negative duration of `ns` nanoseconds in ISO 8601 as
-- jiff prints a SignedDuration: hours, minutes, then seconds with the
-- fraction's trailing zeros trimmed, `PT0S` for zero. `ns` is an integer.
CREATE FUNCTION tollgate_duration_text(ns numeric) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    secs numeric;
    frac numeric;
    out  text := 'PT';
BEGIN
    IF ns < 0 THEN
        RETURN '-' || tollgate_duration_text(-ns);
    END IF;
    secs := div(ns, 1000000000);
    frac := ns - secs * 1000000000;
    IF secs >= 60 THEN
        IF div(secs, 3600) > 0 THEN
            out := out || trim_scale(div(secs, 3600))::text || 'H';
        END IF;
        IF div(mod(secs, 3600), 60) > 0 THEN
            out := out || trim_scale(div(mod(secs, 3600), 60))::text || 'M';
        END IF;
    END IF;
    IF secs < 60 OR mod(secs, 60) > 0 OR frac > 0 THEN
        out := out || trim_scale(mod(secs, 60))::text;
        IF frac > 0 THEN
            out := out || '.' || rtrim(lpad(trim_scale(frac)::text, 9, '0'), '0');
        END IF;
        out := out || 'S';
    END IF;
    RETURN out;
END $$;

-- The instant `ns` nanoseconds after the Unix epoch in RFC 3339, UTC, as
-- jiff prints a Timestamp (the fraction's trailing zeros trimmed); outside
-- the years 0001..9999, '<ns> ns after the Unix epoch'. `ns` is an integer.
CREATE FUNCTION tollgate_instant_text(ns numeric) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path FROM CURRENT AS $$
DECLARE
    secs numeric := div(ns, 1000000000);
    frac numeric;
    out  text;
BEGIN
    IF secs * 1000000000 > ns THEN
        secs := secs - 1; -- floor, for instants before the epoch
    END IF;
    frac := ns - secs * 1000000000;
    IF secs < -62135596800 OR secs > 253402300799 THEN
        RETURN trim_scale(ns)::text || ' ns after the Unix epoch';
    END IF;
    out := to_char(to_timestamp(secs::double precision) AT TIME ZONE 'UTC',
                   'YYYY-MM-DD"T"HH24:MI:SS');
    IF frac > 0 THEN
        out := out || '.' || rtrim(lpad(trim_scale(frac)::text, 9, '0'), '0');
    END IF;
    RETURN out || 'Z';
END $$;

-- The recorded grant policy as a store declares it:
-- '<max_ttl_ns>/<reclaim_grace_ns>'; NULL while none is recorded.
CREATE FUNCTION tollgate_grant_policy_declaration() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT (p.max_ttl_secs::numeric * 1000000000 + p.max_ttl_nanos)::text || '/'
        || (p.reclaim_grace_secs::numeric * 1000000000 + p.reclaim_grace_nanos)::text
      FROM tollgate_policy p WHERE p.singleton
$$;

-- Rule 1 (TGS11): the session's declared grant policy is the recorded one.
CREATE FUNCTION tollgate_leases_under_policy() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    declared text := nullif(current_setting('tollgate.grant_policy', true), '');
    recorded text;
    pol      tollgate_policy%ROWTYPE;
    applies  text;
    hint     text := 'restart this process with the recorded grant policy (`tollgate policy show`)';
BEGIN
    LOCK TABLE tollgate_policy IN ROW SHARE MODE;
    SELECT * INTO pol FROM tollgate_policy p WHERE p.singleton;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease_policy_mismatch: no grant policy is recorded in this database, so no lease may be written; start a Tollgate store against it first (the first start records its policy)'
            USING ERRCODE = 'TGS11';
    END IF;
    recorded := tollgate_grant_policy_declaration();
    IF declared IS NOT DISTINCT FROM recorded THEN
        RETURN NULL;
    END IF;
    IF declared ~ '^[0-9]{1,30}/[0-9]{1,30}$' THEN
        applies := format('is configured with max_ttl %s and reclaim_grace %s',
            tollgate_duration_text(split_part(declared, '/', 1)::numeric),
            tollgate_duration_text(split_part(declared, '/', 2)::numeric));
    ELSE
        applies := 'declares no grant policy (tollgate.grant_policy is '
            || coalesce(quote_literal(left(declared, 100)), 'not set') || ')';
        hint := hint || ' on a binary that declares it (schema 19 or later)';
    END IF;
    RAISE EXCEPTION 'lease_policy_mismatch: the database records max_ttl % and reclaim_grace %, but this process %; every process sharing these grants must apply the recorded policy: %',
        tollgate_duration_text(pol.max_ttl_secs::numeric * 1000000000 + pol.max_ttl_nanos),
        tollgate_duration_text(pol.reclaim_grace_secs::numeric * 1000000000 + pol.reclaim_grace_nanos),
        applies, hint
        USING ERRCODE = 'TGS11';
END $$;

-- Rule 2 (TGS12): an active lease's expiry + reclaim_grace <= cut + horizon.
CREATE FUNCTION tollgate_leases_within_horizon() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    cut        tollgate_safetime%ROWTYPE;
    pol        tollgate_policy%ROWTYPE;
    newest     tollgate_safetime_policy%ROWTYPE;
    in_force   tollgate_safetime_policy%ROWTYPE;
    expiry_ns  numeric;
    grace_ns   numeric;
    cut_ns     numeric;
    horizon_ns numeric;
    due_ns     numeric;
    bound_ns   numeric;
    version    bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tollgate_safetime) THEN
        RETURN NEW;
    END IF;
    LOCK TABLE tollgate_safetime_policy IN ROW SHARE MODE;
    SELECT * INTO cut FROM tollgate_safetime s;
    SELECT * INTO newest FROM tollgate_safetime_policy p ORDER BY p.version DESC LIMIT 1;
    SELECT * INTO in_force FROM tollgate_safetime_policy p WHERE p.version = cut.policy_version;
    IF in_force.horizon_ms < newest.horizon_ms THEN
        horizon_ns := in_force.horizon_ms::numeric * 1000000;
        version := in_force.version;
    ELSE
        horizon_ns := newest.horizon_ms::numeric * 1000000;
        version := newest.version;
    END IF;
    SELECT * INTO pol FROM tollgate_policy p WHERE p.singleton;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease_policy_mismatch: no grant policy is recorded in this database, so no lease may be written; start a Tollgate store against it first (the first start records its policy)'
            USING ERRCODE = 'TGS11';
    END IF;
    expiry_ns := NEW.expiry_floor_us::numeric * 1000 + NEW.expiry_submicro_ns;
    grace_ns := pol.reclaim_grace_secs::numeric * 1000000000 + pol.reclaim_grace_nanos;
    cut_ns := cut.cut_floor_us::numeric * 1000 + cut.cut_submicro_ns;
    due_ns := expiry_ns + grace_ns;
    bound_ns := cut_ns + horizon_ns;
    IF due_ns > bound_ns THEN
        RAISE EXCEPTION 'lease_beyond_horizon: %expiry % plus the recorded reclaim_grace % is %, beyond cut % + horizon % (sealed policy version %) = % by %; every deadline must fit inside cut + horizon: grant at the cut (--clock safe-cut) and keep max_ttl + reclaim_grace within the sealed horizon (`tollgate-safetime policy show`)',
            CASE WHEN TG_OP = 'INSERT' THEN 'the new lease''s '
                 ELSE format('lease %s''s new ', NEW.lease_id) END,
            tollgate_instant_text(expiry_ns), tollgate_duration_text(grace_ns),
            tollgate_instant_text(due_ns), tollgate_instant_text(cut_ns),
            tollgate_duration_text(horizon_ns), version, tollgate_instant_text(bound_ns),
            tollgate_duration_text(due_ns - bound_ns)
            USING ERRCODE = 'TGS12';
    END IF;
    RETURN NEW;
END $$;

-- A policy change waits for every transaction that wrote a lease under the
-- old policy, and keeps new lease writes waiting until it ends.
CREATE FUNCTION tollgate_policy_change_waits() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    LOCK TABLE tollgate_policy IN EXCLUSIVE MODE;
    RETURN NULL;
END $$;

-- Statement-level triggers fire before row-level ones, and by name, so a
-- session off the cut still meets 0018's tollgate_leases_on_cut first.
CREATE TRIGGER tollgate_leases_under_policy
    BEFORE INSERT OR UPDATE ON tollgate_leases
    FOR EACH STATEMENT EXECUTE FUNCTION tollgate_leases_under_policy();

CREATE TRIGGER tollgate_leases_within_horizon_insert
    BEFORE INSERT ON tollgate_leases
    FOR EACH ROW WHEN (NEW.state = 'active')
    EXECUTE FUNCTION tollgate_leases_within_horizon();

CREATE TRIGGER tollgate_leases_within_horizon_update
    BEFORE UPDATE ON tollgate_leases
    FOR EACH ROW WHEN (NEW.state = 'active'
        AND (OLD.state IS DISTINCT FROM 'active'
             OR (NEW.expiry_floor_us, NEW.expiry_submicro_ns)
                IS DISTINCT FROM (OLD.expiry_floor_us, OLD.expiry_submicro_ns)))
    EXECUTE FUNCTION tollgate_leases_within_horizon();

CREATE TRIGGER tollgate_policy_change_waits
    BEFORE UPDATE OR DELETE ON tollgate_policy
    FOR EACH STATEMENT EXECUTE FUNCTION tollgate_policy_change_waits();
