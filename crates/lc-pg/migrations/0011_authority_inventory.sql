-- The other deadline-bearing authorities (0007 scoped tokens, 0008
-- approvals, 0009 deletion grace and retention, 0010 claims) in the
-- initial-cut inventory, and an approval decision removed with its exec's
-- records by the retention purge only.
--
-- The initial cut may start at database time only when the installation
-- holds no deadline-bearing or idempotency authority: an unrevoked scoped
-- token, an approval decision, a deletion waiting for its purge, a
-- terminal exec retained until a deadline, or a worker's claim is one, so
-- any of them quarantines the first claim at the Unix epoch, and the
-- quarantine evidence records their counts and latest deadlines with the
-- rest of the inventory.

CREATE OR REPLACE FUNCTION lc_initial_inventory() RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    LOCK TABLE lc_execs, lc_sandbox_leases, lc_reservations, lc_operations, lc_exec_owners, lc_transitions,
        lc_exec_inputs, lc_resume_intents, lc_resume_receipts, lc_tokens, lc_approvals, lc_deletions,
        lc_claims
        IN SHARE MODE;
    RETURN jsonb_build_object(
        'unfinished_execs', (SELECT count(*) FROM lc_execs e WHERE e.state <> 'terminal'),
        'unreleased_leases', (SELECT count(*) FROM lc_sandbox_leases l WHERE l.state <> 'released'),
        'held_reservations', (SELECT count(*) FROM lc_reservations r WHERE r.state = 'held'),
        'operation_keys', (SELECT count(*) FROM lc_operations),
        'unreleased_owners', (SELECT count(*) FROM lc_exec_owners o WHERE NOT o.released),
        'transition_receipts', (SELECT count(*) FROM lc_transitions),
        'queued_inputs', (SELECT count(*) FROM lc_exec_inputs i WHERE i.state = 'queued'),
        'pending_resumes', (SELECT count(*) FROM lc_resume_intents i
                             WHERE NOT EXISTS (SELECT 1 FROM lc_resume_receipts r
                                                WHERE r.exec_id = i.exec_id AND r.op_key = i.op_key)),
        'unrevoked_tokens', (SELECT count(*) FROM lc_tokens t WHERE t.revoked_floor_us IS NULL),
        'approvals', (SELECT count(*) FROM lc_approvals),
        'pending_deletions', (SELECT count(*) FROM lc_deletions d WHERE d.state = 'deleted'),
        'retained_execs', (SELECT count(*) FROM lc_execs e WHERE e.retain_until_floor_us IS NOT NULL),
        'claims', (SELECT count(*) FROM lc_claims),
        'latest_lease_expiry_floor_us',
            (SELECT max(l.expiry_floor_us) FROM lc_sandbox_leases l WHERE l.state <> 'released'),
        'latest_heartbeat_expiry_floor_us',
            (SELECT max(o.heartbeat_expiry_floor_us) FROM lc_exec_owners o WHERE NOT o.released),
        'latest_token_deadline_floor_us',
            (SELECT max(t.deadline_floor_us) FROM lc_tokens t WHERE t.revoked_floor_us IS NULL),
        'latest_approval_valid_until_floor_us',
            (SELECT max(a.valid_until_floor_us) FROM lc_approvals a),
        'latest_purge_after_floor_us',
            (SELECT max(d.purge_after_floor_us) FROM lc_deletions d WHERE d.state = 'deleted'),
        'latest_retain_until_floor_us',
            (SELECT max(e.retain_until_floor_us) FROM lc_execs e),
        'latest_claim_expiry_floor_us',
            (SELECT max(c.expiry_floor_us) FROM lc_claims c));
END $$;

CREATE OR REPLACE FUNCTION lc_inventory_holds_authority(inv jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (inv ->> 'unfinished_execs')::bigint > 0
        OR (inv ->> 'unreleased_leases')::bigint > 0
        OR (inv ->> 'held_reservations')::bigint > 0
        OR (inv ->> 'operation_keys')::bigint > 0
        OR coalesce((inv ->> 'unreleased_owners')::bigint, 0) > 0
        OR coalesce((inv ->> 'transition_receipts')::bigint, 0) > 0
        OR coalesce((inv ->> 'queued_inputs')::bigint, 0) > 0
        OR coalesce((inv ->> 'pending_resumes')::bigint, 0) > 0
        OR coalesce((inv ->> 'unrevoked_tokens')::bigint, 0) > 0
        OR coalesce((inv ->> 'approvals')::bigint, 0) > 0
        OR coalesce((inv ->> 'pending_deletions')::bigint, 0) > 0
        OR coalesce((inv ->> 'retained_execs')::bigint, 0) > 0
        OR coalesce((inv ->> 'claims')::bigint, 0) > 0
$$;

-- An approval decision stays fixed (LCS02) until the retention purge of
-- its exec removes it with the rest of the exec's records.
CREATE OR REPLACE FUNCTION lc_approvals_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND lc_exec_purge_due(OLD.exec_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'approval_immutable: the decision on exec % is recorded and fixed', OLD.exec_id
        USING ERRCODE = 'LCS02';
END $$;
