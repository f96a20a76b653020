-- Approvals. A tenant's approval policy (set by the administrator) says
-- which shapes need an approval: none ('off', the default), those whose
-- network is on ('network'), every shape ('all') or the named ones
-- ('shapes'). An exec that needs one is admitted 'awaiting_approval':
-- its row and attempt 1 exist (its canonical identity is drawn then), but
-- no Reservation and no Lease, so it holds no capacity; its timeout is
-- counted from its approval, so its deadline is NULL until then. An
-- approver's decision is one immutable row of lc_approvals; an approval
-- carries valid_until (decided cut + validity) on the cut, guarded by
-- LCS01 like every deadline: the exec's first Lease is allocated only
-- while a certain cut is below it, and a certain cut at or past it ends
-- the unstarted exec 'approval_expired' through the release path.

ALTER TABLE lc_tenants
    ADD COLUMN approval_require TEXT NOT NULL DEFAULT 'off'
        CHECK (approval_require IN ('off', 'network', 'all', 'shapes')),
    ADD COLUMN approval_shapes TEXT[] NOT NULL DEFAULT '{}'
        CHECK (approval_shapes <@ ARRAY['small', 'medium', 'small-net']::text[]),
    ADD CONSTRAINT lc_tenants_approval_shapes CHECK (
        (approval_require = 'shapes') = (cardinality(approval_shapes) > 0));

ALTER TABLE lc_execs DROP CONSTRAINT lc_execs_state;
ALTER TABLE lc_execs ADD CONSTRAINT lc_execs_state
    CHECK (state IN ('awaiting_approval', 'admitted', 'running', 'hibernated', 'terminal'));
ALTER TABLE lc_execs DROP CONSTRAINT lc_execs_terminal_reason_known;
ALTER TABLE lc_execs ADD CONSTRAINT lc_execs_terminal_reason_known CHECK (
    terminal_reason IN ('exited', 'cancelled', 'expired', 'start_failed', 'snapshot_refused',
                        'denied', 'approval_expired'));
-- A timeout's deadline exists once the exec holds capacity: an exec
-- awaiting approval (or ended there) has its timeout_ms but no deadline.
ALTER TABLE lc_execs DROP CONSTRAINT lc_execs_timeout_pair;
ALTER TABLE lc_execs ADD CONSTRAINT lc_execs_timeout_pair CHECK (
    (timeout_floor_us IS NULL) = (timeout_submicro_ns IS NULL)
    AND (timeout_ms IS NOT NULL OR timeout_floor_us IS NULL)
    AND (timeout_ms IS NULL OR timeout_floor_us IS NOT NULL
         OR state IN ('awaiting_approval', 'terminal')));
-- Generation 1's Lease of every exec that held capacity exists, checked
-- at commit as 0001's foreign key did; an exec awaiting approval, or
-- ended there (denied, or cancelled), has its canonical lease id drawn
-- but no Lease. The key becomes two deferred constraint triggers: the
-- exec's side and the Lease's (a Lease still named by an exec is never
-- removed).
ALTER TABLE lc_execs DROP CONSTRAINT lc_execs_lease;
CREATE FUNCTION lc_execs_lease_exists() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM lc_sandbox_leases l WHERE l.lease_id = NEW.lease_id)
       AND NOT (NEW.state = 'awaiting_approval'
                OR (NEW.state = 'terminal' AND NEW.terminal_reason IN ('denied', 'cancelled')
                    AND NEW.current_attempt = 1)) THEN
        RAISE EXCEPTION 'exec % names lease %, which does not exist', NEW.exec_id, NEW.lease_id
            USING ERRCODE = '23503';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER lc_execs_lease
    AFTER INSERT OR UPDATE ON lc_execs DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION lc_execs_lease_exists();
CREATE FUNCTION lc_sandbox_leases_named() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM lc_execs e WHERE e.lease_id = OLD.lease_id) THEN
        RAISE EXCEPTION 'lease % is still named by an exec', OLD.lease_id
            USING ERRCODE = '23503';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER lc_sandbox_leases_named
    AFTER DELETE OR UPDATE OF lease_id ON lc_sandbox_leases DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION lc_sandbox_leases_named();

-- The approvals list reads a tenant's awaiting execs.
CREATE INDEX lc_execs_awaiting ON lc_execs (tenant_id, exec_id) WHERE state = 'awaiting_approval';

CREATE TABLE lc_approvals (
    exec_id                BIGINT  PRIMARY KEY REFERENCES lc_execs (exec_id),
    tenant_id              BIGINT  NOT NULL REFERENCES lc_tenants (tenant_id),
    decision               TEXT    NOT NULL CHECK (decision IN ('approved', 'denied')),
    approver               TEXT    NOT NULL CHECK (approver IN ('admin', 'tenant')),
    decided_floor_us       BIGINT  NOT NULL,
    decided_submicro_ns    INTEGER NOT NULL CHECK (decided_submicro_ns BETWEEN 0 AND 999),
    validity_ms            BIGINT  CHECK (validity_ms BETWEEN 1 AND 3600000),
    valid_until_floor_us   BIGINT,
    valid_until_submicro_ns INTEGER CHECK (valid_until_submicro_ns BETWEEN 0 AND 999),
    reason                 TEXT    CHECK (octet_length(reason) <= 512),
    CONSTRAINT lc_approvals_approved CHECK (
        (decision = 'approved') = (validity_ms IS NOT NULL)
        AND (validity_ms IS NULL) = (valid_until_floor_us IS NULL)
        AND (valid_until_floor_us IS NULL) = (valid_until_submicro_ns IS NULL)
        AND (decision = 'denied' OR reason IS NULL))
);
-- The approvals list reads a tenant's newest decisions.
CREATE INDEX lc_approvals_tenant ON lc_approvals (tenant_id, decided_floor_us DESC, exec_id DESC);

CREATE TRIGGER lc_approvals_valid_until_within_horizon
    BEFORE INSERT OR UPDATE OF valid_until_floor_us, valid_until_submicro_ns ON lc_approvals
    FOR EACH ROW EXECUTE FUNCTION lc_deadline_within_horizon('valid_until_floor_us', 'valid_until_submicro_ns');

-- A decision is never rewritten nor removed (an approval is what a start
-- was decided under).
CREATE FUNCTION lc_approvals_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'approval_immutable: the decision on exec % is recorded and fixed', OLD.exec_id
        USING ERRCODE = 'LCS02';
END $$;
CREATE TRIGGER lc_approvals_immutable
    BEFORE UPDATE OR DELETE ON lc_approvals
    FOR EACH ROW EXECUTE FUNCTION lc_approvals_immutable();
