-- Workspaces, hibernation and resume: every exec's workspace with its
-- chain of immutable snapshots (canonical manifest bytes, digest checked
-- here), the hibernations of attempt generations, the tenants' resume
-- requests and the immutable receipts of committed resumes.
--
-- Time, as in 0001: every instant is an instant pair in cut time, exactly
-- 1000 * <name>_floor_us + <name>_submicro_ns nanoseconds since the Unix
-- epoch; no column here is read from a host clock.
--
-- Error codes (SQLSTATE, stable), besides 0001's to 0003's:
--   LCS07 snapshot_immutable       an update or deletion of a snapshot
--   LCS08 resume_receipt_immutable an update or deletion of a resume
--                                  receipt
--   LCS09 resume_not_committed     an attempt moved parked -> runnable in
--                                  a transaction that did not insert the
--                                  resume receipt of its generation

-- Exec columns: an idle TTL, what the timeout does, and the last
-- activity (each staged page and each sent input), on the cut; NULL
-- means the admission cut (the store writes it at admission; existing
-- execs keep NULL).
ALTER TABLE lc_execs
    ADD COLUMN idle_ttl_ms BIGINT CHECK (idle_ttl_ms >= 1),
    ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'terminate' CHECK (on_timeout IN ('terminate', 'hibernate')),
    ADD COLUMN last_activity_floor_us BIGINT,
    ADD COLUMN last_activity_submicro_ns INTEGER CHECK (last_activity_submicro_ns BETWEEN 0 AND 999),
    ADD CONSTRAINT lc_execs_last_activity_pair CHECK (
        (last_activity_floor_us IS NULL) = (last_activity_submicro_ns IS NULL));

-- The reconciler's search for execs due to hibernate reads only the
-- running execs that can hibernate by time.
CREATE INDEX lc_execs_hibernatable ON lc_execs (exec_id)
    WHERE state = 'running' AND (idle_ttl_ms IS NOT NULL OR on_timeout = 'hibernate');

-- 0001's state checks were declared on their columns and named by the
-- server: find each by its definition (exactly one) and replace it.
DO $$
DECLARE
    names text[];
BEGIN
    SELECT array_agg(c.conname) INTO names FROM pg_constraint c
     WHERE c.conrelid = 'lc_execs'::regclass AND c.contype = 'c'
       AND pg_get_constraintdef(c.oid) LIKE '%''admitted''%''running''%''terminal''%';
    IF coalesce(array_length(names, 1), 0) <> 1 THEN
        RAISE EXCEPTION 'expected one state check on lc_execs, found %', names;
    END IF;
    EXECUTE format('ALTER TABLE lc_execs DROP CONSTRAINT %I', names[1]);
    SELECT array_agg(c.conname) INTO names FROM pg_constraint c
     WHERE c.conrelid = 'lc_output_pages'::regclass AND c.contype = 'c'
       AND pg_get_constraintdef(c.oid) LIKE '%''stdout''%''stderr''%''terminal''%';
    IF coalesce(array_length(names, 1), 0) <> 1 THEN
        RAISE EXCEPTION 'expected one kind check on lc_output_pages, found %', names;
    END IF;
    EXECUTE format('ALTER TABLE lc_output_pages DROP CONSTRAINT %I', names[1]);
END $$;
ALTER TABLE lc_execs ADD CONSTRAINT lc_execs_state
    CHECK (state IN ('admitted', 'running', 'hibernated', 'terminal'));
-- A stopped page ends a generation without ending the exec: like the
-- terminal page, no bytes and the exit status (the signal that stopped
-- the command).
ALTER TABLE lc_output_pages ADD CONSTRAINT lc_output_pages_kind
    CHECK (kind IN ('stdout', 'stderr', 'terminal', 'stopped'));
ALTER TABLE lc_output_pages DROP CONSTRAINT lc_output_pages_terminal;
ALTER TABLE lc_output_pages ADD CONSTRAINT lc_output_pages_terminal CHECK (
    CASE WHEN kind IN ('terminal', 'stopped')
         THEN length = 0 AND ((exit_code IS NULL) <> (exit_signal IS NULL))
         ELSE exit_code IS NULL AND exit_signal IS NULL END);

-- A Lease that restores a workspace names the head it restores, and the
-- provider's signed attachment once recorded.
ALTER TABLE lc_sandbox_leases
    ADD COLUMN restore_head BYTEA CHECK (octet_length(restore_head) = 32),
    ADD COLUMN attachment JSONB CHECK (attachment IS NULL OR restore_head IS NOT NULL);

-- Workspaces: one per exec (its canonical workspace id), head = the
-- newest snapshot's digest.
CREATE TABLE lc_workspaces (
    workspace_id BIGINT PRIMARY KEY,
    exec_id      BIGINT NOT NULL UNIQUE REFERENCES lc_execs (exec_id),
    head         BYTEA  CHECK (octet_length(head) = 32),
    snapshots    BIGINT NOT NULL DEFAULT 0 CHECK (snapshots >= 0),
    CONSTRAINT lc_workspaces_head CHECK ((head IS NULL) = (snapshots = 0))
);
INSERT INTO lc_workspaces (workspace_id, exec_id) SELECT workspace_id, exec_id FROM lc_execs;

-- Snapshots: the canonical manifest bytes (at most 64 MiB), their
-- SHA-256, the previous head, and the Lease generation whose quiescence
-- committed them. seq is the place in the chain, from 1.
CREATE TABLE lc_snapshots (
    workspace_id          BIGINT  NOT NULL REFERENCES lc_workspaces (workspace_id),
    digest                BYTEA   NOT NULL CHECK (octet_length(digest) = 32),
    seq                   BIGINT  NOT NULL CHECK (seq >= 1),
    parent                BYTEA   CHECK (octet_length(parent) = 32),
    manifest              BYTEA   NOT NULL CHECK (octet_length(manifest) <= 67108864),
    lease_id              BIGINT  NOT NULL REFERENCES lc_sandbox_leases (lease_id),
    generation            BIGINT  NOT NULL CHECK (generation >= 1),
    committed_floor_us    BIGINT  NOT NULL,
    committed_submicro_ns INTEGER NOT NULL CHECK (committed_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (workspace_id, digest),
    UNIQUE (workspace_id, seq),
    CONSTRAINT lc_snapshots_digest CHECK (digest = sha256(manifest)),
    CONSTRAINT lc_snapshots_chain CHECK ((seq = 1) = (parent IS NULL)),
    FOREIGN KEY (workspace_id, parent) REFERENCES lc_snapshots (workspace_id, digest)
);
ALTER TABLE lc_workspaces ADD CONSTRAINT lc_workspaces_head_snapshot
    FOREIGN KEY (workspace_id, head) REFERENCES lc_snapshots (workspace_id, digest)
    DEFERRABLE INITIALLY DEFERRED;

CREATE FUNCTION lc_snapshots_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'snapshot_immutable: a snapshot is never updated or deleted (%)', TG_OP
        USING ERRCODE = 'LCS07';
END $$;

CREATE TRIGGER lc_snapshots_immutable
    BEFORE UPDATE OR DELETE ON lc_snapshots
    FOR EACH ROW EXECUTE FUNCTION lc_snapshots_immutable();
CREATE TRIGGER lc_snapshots_not_truncated
    BEFORE TRUNCATE ON lc_snapshots
    FOR EACH STATEMENT EXECUTE FUNCTION lc_snapshots_immutable();

-- Hibernations: one per attempt generation, sealed on a certain cut, its
-- step sealed -> quiesced (snapshot committed, head, the provider's
-- quiescence) -> parked (destroy proven, Reservation returned).
CREATE TABLE lc_hibernations (
    exec_id            BIGINT  NOT NULL,
    attempt            INTEGER NOT NULL,
    generation         BIGINT  NOT NULL CHECK (generation >= 1),
    lease_id           BIGINT  NOT NULL UNIQUE REFERENCES lc_sandbox_leases (lease_id),
    reason             TEXT    NOT NULL CHECK (reason IN ('requested', 'idle', 'deadline')),
    sealed_floor_us    BIGINT  NOT NULL,
    sealed_submicro_ns INTEGER NOT NULL CHECK (sealed_submicro_ns BETWEEN 0 AND 999),
    step               TEXT    NOT NULL CHECK (step IN ('sealed', 'quiesced', 'parked')),
    head               BYTEA   CHECK (octet_length(head) = 32),
    quiescence         JSONB,
    PRIMARY KEY (exec_id, attempt, generation),
    FOREIGN KEY (exec_id, attempt) REFERENCES lc_attempts (exec_id, attempt),
    CONSTRAINT lc_hibernations_quiesced CHECK (
        (step = 'sealed') = (head IS NULL) AND (head IS NULL) = (quiescence IS NULL))
);
CREATE INDEX lc_hibernations_unfinished ON lc_hibernations (exec_id) WHERE step <> 'parked';

-- Resume requests: the tenant's operation key, the digest of the
-- request (JCS of {exec_id, head}), the parked head and generation.
-- prepared_lease_id names the Lease its prepare created.
CREATE TABLE lc_resume_intents (
    exec_id              BIGINT  NOT NULL REFERENCES lc_execs (exec_id),
    op_key               TEXT    NOT NULL CHECK (op_key ~ '^[!-~]{1,255}$'),
    request_sha256       BYTEA   NOT NULL CHECK (octet_length(request_sha256) = 32),
    head                 BYTEA   NOT NULL CHECK (octet_length(head) = 32),
    attempt              INTEGER NOT NULL,
    from_generation      BIGINT  NOT NULL CHECK (from_generation >= 1),
    recorded_floor_us    BIGINT  NOT NULL,
    recorded_submicro_ns INTEGER NOT NULL CHECK (recorded_submicro_ns BETWEEN 0 AND 999),
    prepared_lease_id    BIGINT  REFERENCES lc_sandbox_leases (lease_id),
    PRIMARY KEY (exec_id, op_key)
);

-- Resume receipts: immutable, one per (exec, operation key) and one per
-- (exec, attempt, to_generation).
CREATE TABLE lc_resume_receipts (
    exec_id               BIGINT  NOT NULL,
    op_key                TEXT    NOT NULL,
    attempt               INTEGER NOT NULL,
    from_generation       BIGINT  NOT NULL CHECK (from_generation >= 1),
    to_generation         BIGINT  NOT NULL CHECK (to_generation = from_generation + 1),
    lease_id              BIGINT  NOT NULL UNIQUE REFERENCES lc_sandbox_leases (lease_id),
    head                  BYTEA   NOT NULL CHECK (octet_length(head) = 32),
    request_sha256        BYTEA   NOT NULL CHECK (octet_length(request_sha256) = 32),
    token_sha256          BYTEA   NOT NULL CHECK (octet_length(token_sha256) = 32),
    owner_generation      BIGINT  NOT NULL CHECK (owner_generation >= 1),
    owner_fence           BIGINT  NOT NULL CHECK (owner_fence >= 1),
    committed_floor_us    BIGINT  NOT NULL,
    committed_submicro_ns INTEGER NOT NULL CHECK (committed_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (exec_id, op_key),
    UNIQUE (exec_id, attempt, to_generation),
    FOREIGN KEY (exec_id, op_key) REFERENCES lc_resume_intents (exec_id, op_key)
);

CREATE FUNCTION lc_resume_receipts_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'resume_receipt_immutable: a resume receipt is never updated or deleted (%)', TG_OP
        USING ERRCODE = 'LCS08';
END $$;

CREATE TRIGGER lc_resume_receipts_immutable
    BEFORE UPDATE OR DELETE ON lc_resume_receipts
    FOR EACH ROW EXECUTE FUNCTION lc_resume_receipts_immutable();
CREATE TRIGGER lc_resume_receipts_not_truncated
    BEFORE TRUNCATE ON lc_resume_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION lc_resume_receipts_immutable();

-- LCS09: an attempt leaves `parked` for `runnable` only in the
-- transaction that inserted the resume receipt of its generation (the
-- receipt row's xmin is this transaction's id).
CREATE FUNCTION lc_attempts_resume_committed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
           SELECT 1 FROM lc_resume_receipts r
            WHERE r.exec_id = NEW.exec_id AND r.attempt = NEW.attempt
              AND r.to_generation = NEW.generation
              AND r.xmin::text::bigint = (txid_current() & 4294967295)) THEN
        RAISE EXCEPTION 'resume_not_committed: attempt % of exec % moves parked -> runnable (generation %) only with the resume receipt committed in the same transaction',
            NEW.attempt, NEW.exec_id, NEW.generation
            USING ERRCODE = 'LCS09';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_attempts_resume_committed
    BEFORE UPDATE OF state ON lc_attempts
    FOR EACH ROW WHEN (OLD.state = 'parked' AND NEW.state = 'runnable')
    EXECUTE FUNCTION lc_attempts_resume_committed();

-- The initial-cut inventory (0001 to 0003) also counts resume requests
-- not yet committed: each is an instruction a gateway may still carry
-- out. Same keys as before plus this one.
CREATE OR REPLACE FUNCTION lc_initial_inventory() RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    LOCK TABLE lc_execs, lc_sandbox_leases, lc_reservations, lc_operations, lc_exec_owners, lc_transitions,
        lc_exec_inputs, lc_resume_intents, lc_resume_receipts
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
        OR coalesce((inv ->> 'queued_inputs')::bigint, 0) > 0
        OR coalesce((inv ->> 'pending_resumes')::bigint, 0) > 0
$$;
