-- Exec gateways: one owner per exec with a fence on the cut, immutable
-- transition receipts, and output pages whose bytes live in the sink.
--
-- Time, as in 0001: every instant is an instant pair in cut time, exactly
-- 1000 * <name>_floor_us + <name>_submicro_ns nanoseconds since the Unix
-- epoch; no column here is read from a host clock.
--
-- Error codes (SQLSTATE, stable), besides 0001's:
--   LCS01 deadline_beyond_horizon  now also an unreleased owner's
--                                  heartbeat expiry
--   LCS03 transition_immutable     an update or deletion of a transition
--                                  receipt
--   LCS04 owner_regression         an ownership update that does not move
--                                  forward: a new owner must have the next
--                                  generation and a higher fence; the same
--                                  owner keeps its token, generation and
--                                  fence, never shortens its heartbeat and
--                                  never takes back a release
--   LCS05 page_regression          a page update other than pending ->
--                                  acked with everything else unchanged,
--                                  or a page deletion

-- Fences: one sequence for every ownership of the store, so a fence is
-- higher than every fence issued before it, whatever the exec.
CREATE SEQUENCE lc_owner_fence_seq AS BIGINT MINVALUE 1;

-- An exec's current ownership. token_sha256 is SHA-256 of the gateway
-- activation's token (the token is never stored); generation is 1 for
-- the first owner and one more for each takeover; basis is why this
-- ownership began (no owner before, a released one, an expired one).
CREATE TABLE lc_exec_owners (
    exec_id                      BIGINT  PRIMARY KEY REFERENCES lc_execs (exec_id),
    tenant_id                    BIGINT  NOT NULL REFERENCES lc_tenants (tenant_id),
    token_sha256                 BYTEA   NOT NULL CHECK (octet_length(token_sha256) = 32),
    generation                   BIGINT  NOT NULL CHECK (generation >= 1),
    fence                        BIGINT  NOT NULL UNIQUE CHECK (fence >= 1)
                                         DEFAULT nextval('lc_owner_fence_seq'),
    heartbeat_expiry_floor_us    BIGINT  NOT NULL,
    heartbeat_expiry_submicro_ns INTEGER NOT NULL CHECK (heartbeat_expiry_submicro_ns BETWEEN 0 AND 999),
    released                     BOOLEAN NOT NULL DEFAULT false,
    basis                        TEXT    NOT NULL CHECK (basis IN ('unowned', 'released', 'expired')),
    CONSTRAINT lc_exec_owners_first_is_unowned CHECK ((generation = 1) = (basis = 'unowned'))
);
ALTER SEQUENCE lc_owner_fence_seq OWNED BY lc_exec_owners.fence;

-- LCS04: an ownership only moves forward (see the header).
CREATE FUNCTION lc_exec_owners_forward() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.exec_id, NEW.tenant_id) IS DISTINCT FROM (OLD.exec_id, OLD.tenant_id) THEN
        RAISE EXCEPTION 'owner_regression: the ownership of exec % belongs to its exec and tenant', OLD.exec_id
            USING ERRCODE = 'LCS04';
    END IF;
    IF NEW.generation = OLD.generation THEN
        IF (NEW.token_sha256, NEW.fence, NEW.basis) IS DISTINCT FROM (OLD.token_sha256, OLD.fence, OLD.basis)
           OR (NEW.heartbeat_expiry_floor_us, NEW.heartbeat_expiry_submicro_ns)
              < (OLD.heartbeat_expiry_floor_us, OLD.heartbeat_expiry_submicro_ns)
           OR (OLD.released AND NOT NEW.released) THEN
            RAISE EXCEPTION 'owner_regression: owner generation % of exec % keeps its token and fence, never shortens its heartbeat and never takes back its release',
                OLD.generation, OLD.exec_id
                USING ERRCODE = 'LCS04';
        END IF;
    ELSIF NEW.generation <> OLD.generation + 1 OR NEW.fence <= OLD.fence OR NEW.released THEN
        RAISE EXCEPTION 'owner_regression: exec % owner generation % -> % with fence % -> %: a new owner has the next generation, a higher fence and is not released',
            OLD.exec_id, OLD.generation, NEW.generation, OLD.fence, NEW.fence
            USING ERRCODE = 'LCS04';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_exec_owners_forward
    BEFORE UPDATE ON lc_exec_owners
    FOR EACH ROW EXECUTE FUNCTION lc_exec_owners_forward();

-- LCS01 for the heartbeat expiry of an owner that still serves.
CREATE TRIGGER lc_exec_owners_within_horizon
    BEFORE INSERT OR UPDATE OF heartbeat_expiry_floor_us, heartbeat_expiry_submicro_ns ON lc_exec_owners
    FOR EACH ROW WHEN (NOT NEW.released)
    EXECUTE FUNCTION lc_deadline_within_horizon('heartbeat_expiry_floor_us', 'heartbeat_expiry_submicro_ns');

-- Transition receipts: what an owner did (send, ack, cancel, release)
-- under a transition id, bound to the ownership (token digest,
-- generation, fence) that committed it, with the digest of the request so
-- the same id with other arguments is refused. Immutable (LCS03): a
-- replay returns the stored receipt, never a rewritten one.
CREATE TABLE lc_transitions (
    exec_id               BIGINT  NOT NULL REFERENCES lc_execs (exec_id),
    transition_id         TEXT    NOT NULL CHECK (transition_id ~ '^[!-~]{1,128}$'),
    kind                  TEXT    NOT NULL CHECK (kind IN ('send', 'ack', 'cancel', 'release')),
    token_sha256          BYTEA   NOT NULL CHECK (octet_length(token_sha256) = 32),
    owner_generation      BIGINT  NOT NULL CHECK (owner_generation >= 1),
    owner_fence           BIGINT  NOT NULL CHECK (owner_fence >= 1),
    request_sha256        BYTEA   NOT NULL CHECK (octet_length(request_sha256) = 32),
    committed_floor_us    BIGINT  NOT NULL,
    committed_submicro_ns INTEGER NOT NULL CHECK (committed_submicro_ns BETWEEN 0 AND 999),
    detail                JSONB   NOT NULL CHECK (jsonb_typeof(detail) = 'object'),
    PRIMARY KEY (exec_id, transition_id)
);
-- Release finds an exec's cancel receipt by kind.
CREATE INDEX lc_transitions_kind ON lc_transitions (exec_id, kind);

CREATE FUNCTION lc_transitions_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'transition_immutable: a transition receipt is never updated or deleted (%)', TG_OP
        USING ERRCODE = 'LCS03';
END $$;

CREATE TRIGGER lc_transitions_immutable
    BEFORE UPDATE OR DELETE ON lc_transitions
    FOR EACH ROW EXECUTE FUNCTION lc_transitions_immutable();
CREATE TRIGGER lc_transitions_not_truncated
    BEFORE TRUNCATE ON lc_transitions
    FOR EACH STATEMENT EXECUTE FUNCTION lc_transitions_immutable();

-- Output pages now carry their metadata and their place in the protocol:
-- `pending` (metadata and ACK intent committed by owner generation/fence;
-- the bytes may not be in the sink yet) or `acked` (the bytes are durable
-- in the sink and the ACK result committed; readers see only these).
-- New pages keep their bytes in the sink, so `bytes` is NULL for them;
-- pages written before this migration keep theirs and are `acked`. The
-- digest is checked wherever the bytes are here; a page of length 0 has
-- the digest of no bytes whether or not they are here.
ALTER TABLE lc_output_pages ALTER COLUMN bytes DROP NOT NULL;
-- 0001's digest check was declared on the column and named by the
-- server: find it by its definition (exactly one) and drop it.
DO $$
DECLARE
    names text[];
BEGIN
    SELECT array_agg(c.conname) INTO names FROM pg_constraint c
     WHERE c.conrelid = 'lc_output_pages'::regclass AND c.contype = 'c'
       AND pg_get_constraintdef(c.oid) LIKE '%sha256(bytes)%';
    IF coalesce(array_length(names, 1), 0) <> 1 THEN
        RAISE EXCEPTION 'expected one digest check on lc_output_pages, found %', names;
    END IF;
    EXECUTE format('ALTER TABLE lc_output_pages DROP CONSTRAINT %I', names[1]);
END $$;
ALTER TABLE lc_output_pages DROP CONSTRAINT lc_output_pages_terminal;
ALTER TABLE lc_output_pages
    ADD COLUMN length INTEGER CHECK (length BETWEEN 0 AND 65536),
    ADD COLUMN state TEXT NOT NULL DEFAULT 'acked' CHECK (state IN ('pending', 'acked')),
    ADD COLUMN owner_generation BIGINT CHECK (owner_generation >= 1),
    ADD COLUMN owner_fence BIGINT CHECK (owner_fence >= 1);
UPDATE lc_output_pages SET length = octet_length(bytes);
ALTER TABLE lc_output_pages ALTER COLUMN length SET NOT NULL;
-- Every new page states its state.
ALTER TABLE lc_output_pages ALTER COLUMN state DROP DEFAULT;
ALTER TABLE lc_output_pages
    ADD CONSTRAINT lc_output_pages_sha256 CHECK (
        octet_length(sha256) = 32 AND (bytes IS NULL OR sha256 = sha256(bytes))),
    ADD CONSTRAINT lc_output_pages_length CHECK (
        (bytes IS NULL OR length = octet_length(bytes))
        AND (length <> 0 OR sha256 = sha256(''::bytea))),
    -- A page without its bytes here was staged by an owner.
    ADD CONSTRAINT lc_output_pages_owner CHECK (
        (owner_generation IS NULL) = (owner_fence IS NULL)
        AND (bytes IS NOT NULL OR owner_generation IS NOT NULL)),
    ADD CONSTRAINT lc_output_pages_terminal CHECK (
        CASE WHEN kind = 'terminal'
             THEN length = 0 AND ((exit_code IS NULL) <> (exit_signal IS NULL))
             ELSE exit_code IS NULL AND exit_signal IS NULL END);
-- A successor finds the pending pages by seq.
CREATE INDEX lc_output_pages_pending ON lc_output_pages (exec_id, attempt, seq)
    WHERE state = 'pending';

-- LCS05: a page's metadata and bytes never change; its state only moves
-- from pending to acked; no page is deleted.
CREATE FUNCTION lc_output_pages_forward() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'page_regression: page % of exec % attempt % is never deleted', OLD.seq, OLD.exec_id, OLD.attempt
            USING ERRCODE = 'LCS05';
    END IF;
    IF (NEW.exec_id, NEW.attempt, NEW.seq, NEW.kind, NEW.bytes, NEW.sha256, NEW.length, NEW.exit_code,
        NEW.exit_signal, NEW.owner_generation, NEW.owner_fence)
       IS DISTINCT FROM
       (OLD.exec_id, OLD.attempt, OLD.seq, OLD.kind, OLD.bytes, OLD.sha256, OLD.length, OLD.exit_code,
        OLD.exit_signal, OLD.owner_generation, OLD.owner_fence)
       OR (OLD.state = 'acked' AND NEW.state <> 'acked') THEN
        RAISE EXCEPTION 'page_regression: page % of exec % attempt % only moves from pending to acked', OLD.seq, OLD.exec_id, OLD.attempt
            USING ERRCODE = 'LCS05';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_output_pages_forward
    BEFORE UPDATE OR DELETE ON lc_output_pages
    FOR EACH ROW EXECUTE FUNCTION lc_output_pages_forward();

-- The initial-cut inventory (0001) also counts the gateways' authority:
-- an unreleased ownership carries a heartbeat deadline, and a transition
-- receipt is replay authority. Same keys as before plus these two, so
-- the evidence of an earlier claim still reads the same way.
CREATE OR REPLACE FUNCTION lc_initial_inventory() RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    LOCK TABLE lc_execs, lc_sandbox_leases, lc_reservations, lc_operations, lc_exec_owners, lc_transitions
        IN SHARE MODE;
    RETURN jsonb_build_object(
        'unfinished_execs', (SELECT count(*) FROM lc_execs e WHERE e.state <> 'terminal'),
        'unreleased_leases', (SELECT count(*) FROM lc_sandbox_leases l WHERE l.state <> 'released'),
        'held_reservations', (SELECT count(*) FROM lc_reservations r WHERE r.state = 'held'),
        'operation_keys', (SELECT count(*) FROM lc_operations),
        'unreleased_owners', (SELECT count(*) FROM lc_exec_owners o WHERE NOT o.released),
        'transition_receipts', (SELECT count(*) FROM lc_transitions),
        'latest_lease_expiry_floor_us',
            (SELECT max(l.expiry_floor_us) FROM lc_sandbox_leases l WHERE l.state <> 'released'),
        'latest_heartbeat_expiry_floor_us',
            (SELECT max(o.heartbeat_expiry_floor_us) FROM lc_exec_owners o WHERE NOT o.released));
END $$;

CREATE OR REPLACE FUNCTION lc_inventory_holds_authority(inv jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (inv ->> 'unfinished_execs')::bigint > 0
        OR (inv ->> 'unreleased_leases')::bigint > 0
        OR (inv ->> 'held_reservations')::bigint > 0
        OR (inv ->> 'operation_keys')::bigint > 0
        OR coalesce((inv ->> 'unreleased_owners')::bigint, 0) > 0
        OR coalesce((inv ->> 'transition_receipts')::bigint, 0) > 0
$$;
