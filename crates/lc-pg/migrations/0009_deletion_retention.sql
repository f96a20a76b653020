-- Deletion grace: a tenant's deletion of a terminal exec's workspace or
-- output, recorded on a certain cut with the earliest cut of its purge
-- (purge_after = deleted + grace). The deleted rows stay untouched until
-- the purge, so an undelete (which removes the deletion) restores them
-- exactly; the purge deletes them and keeps the deletion as `purged`.
--
-- Time, as in 0001: every instant is an instant pair in cut time, exactly
-- 1000 * <name>_floor_us + <name>_submicro_ns nanoseconds since the Unix
-- epoch; no column here is read from a host clock, and no statement
-- compares with now(): "passed" means the persisted cut is certain and
-- (cut_floor_us, cut_submicro_ns) >= the deadline's pair.
--
-- Error codes (SQLSTATE, stable), besides 0001's to 0006's:
--   LCS01 deadline_beyond_horizon  now also a deletion's purge_after
--   LCS90 purge_not_due            a purge (a deletion moved to purged, or
--                                  a deleted workspace's snapshots or a
--                                  deleted output's pages removed) before
--                                  a certain persisted cut passed the
--                                  deletion's purge_after, or a purged
--                                  deletion moved back
--   LCS91 retention_not_passed     a deletion of a terminal exec's records
--                                  (exec, attempts, Reservations, Leases
--                                  with their evidence, ownership,
--                                  workspace, hibernations, resume
--                                  requests) before a certain persisted
--                                  cut passed its retain_until, or while a
--                                  deletion of it waits for its purge
--   LCS01 deadline_beyond_horizon  now also an exec's retain_until

CREATE TABLE lc_deletions (
    exec_id                 BIGINT  NOT NULL REFERENCES lc_execs (exec_id),
    item                    TEXT    NOT NULL CHECK (item IN ('workspace', 'output')),
    state                   TEXT    NOT NULL CHECK (state IN ('deleted', 'purged')),
    deleted_floor_us        BIGINT  NOT NULL,
    deleted_submicro_ns     INTEGER NOT NULL CHECK (deleted_submicro_ns BETWEEN 0 AND 999),
    purge_after_floor_us    BIGINT  NOT NULL,
    purge_after_submicro_ns INTEGER NOT NULL CHECK (purge_after_submicro_ns BETWEEN 0 AND 999),
    purged_floor_us         BIGINT,
    purged_submicro_ns      INTEGER CHECK (purged_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (exec_id, item),
    CONSTRAINT lc_deletions_purged CHECK (
        (state = 'purged') = (purged_floor_us IS NOT NULL)
        AND (purged_floor_us IS NULL) = (purged_submicro_ns IS NULL)),
    CONSTRAINT lc_deletions_grace CHECK (
        (purge_after_floor_us, purge_after_submicro_ns) > (deleted_floor_us, deleted_submicro_ns))
);
-- The purge step's work list: deletions not yet purged, soonest first.
CREATE INDEX lc_deletions_due ON lc_deletions (purge_after_floor_us, purge_after_submicro_ns, exec_id, item)
    WHERE state = 'deleted';

CREATE TRIGGER lc_deletions_purge_within_horizon
    BEFORE INSERT OR UPDATE OF purge_after_floor_us, purge_after_submicro_ns ON lc_deletions
    FOR EACH ROW WHEN (NEW.state = 'deleted')
    EXECUTE FUNCTION lc_deadline_within_horizon('purge_after_floor_us', 'purge_after_submicro_ns');

-- Whether the persisted cut is certain and has passed the instant pair
-- (floor_us, submicro_ns); false with no cut at all.
CREATE FUNCTION lc_cut_passed(floor_us bigint, submicro_ns integer) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT coalesce(
        (SELECT s.certain AND (s.cut_floor_us, s.cut_submicro_ns) >= (floor_us, submicro_ns)
           FROM tollgate_safetime s),
        false)
$$;

-- Whether the deletion of `item` of exec `exec` may be purged now: it is
-- recorded, not purged, and a certain persisted cut passed purge_after.
CREATE FUNCTION lc_purge_due(exec bigint, what text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT coalesce(
        (SELECT d.state = 'deleted' AND lc_cut_passed(d.purge_after_floor_us, d.purge_after_submicro_ns)
           FROM lc_deletions d WHERE d.exec_id = exec AND d.item = what),
        false)
$$;

-- Retention: a terminal exec's records are kept until retain_until
-- (its terminal cut + the store's retention), set in the transaction that
-- ends it. NULL for an exec that is not terminal, and for one that ended
-- before this migration (no terminal cut was recorded): kept until an
-- operator sets it.
ALTER TABLE lc_execs
    ADD COLUMN retain_until_floor_us BIGINT,
    ADD COLUMN retain_until_submicro_ns INTEGER CHECK (retain_until_submicro_ns BETWEEN 0 AND 999),
    ADD CONSTRAINT lc_execs_retain_until_pair CHECK (
        (retain_until_floor_us IS NULL) = (retain_until_submicro_ns IS NULL)),
    ADD CONSTRAINT lc_execs_retained_when_terminal CHECK (
        retain_until_floor_us IS NULL OR state = 'terminal');
-- The purge step's work list: terminal execs by retain_until.
CREATE INDEX lc_execs_retained ON lc_execs (retain_until_floor_us, retain_until_submicro_ns, exec_id)
    WHERE retain_until_floor_us IS NOT NULL;

CREATE TRIGGER lc_execs_retain_until_within_horizon
    BEFORE INSERT OR UPDATE OF retain_until_floor_us, retain_until_submicro_ns ON lc_execs
    FOR EACH ROW EXECUTE FUNCTION lc_deadline_within_horizon('retain_until_floor_us', 'retain_until_submicro_ns');

-- Whether exec `exec`'s records may be purged now: it is terminal with a
-- retain_until a certain persisted cut passed, and no deletion of its
-- workspace or output waits for its own purge.
CREATE FUNCTION lc_exec_purge_due(exec bigint) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT coalesce(
        (SELECT e.state = 'terminal' AND e.retain_until_floor_us IS NOT NULL
                AND lc_cut_passed(e.retain_until_floor_us, e.retain_until_submicro_ns)
                AND NOT EXISTS (SELECT 1 FROM lc_deletions d
                                 WHERE d.exec_id = e.exec_id AND d.state = 'deleted')
           FROM lc_execs e WHERE e.exec_id = exec),
        false)
$$;

-- LCS90 on the deletion itself: it moves deleted -> purged only once the
-- cut passed purge_after, keeps its instants, and a purged deletion never
-- changes or goes (only its exec's records purge, 0009's retention, takes
-- it, with the exec). A deleted one may be removed: that is an undelete.
CREATE FUNCTION lc_deletions_forward() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.state = 'purged' AND NOT lc_exec_purge_due(OLD.exec_id) THEN
            RAISE EXCEPTION 'purge_not_due: the purged % deletion of exec % is kept with its exec', OLD.item, OLD.exec_id
                USING ERRCODE = 'LCS90';
        END IF;
        RETURN OLD;
    END IF;
    IF (NEW.exec_id, NEW.item, NEW.deleted_floor_us, NEW.deleted_submicro_ns,
        NEW.purge_after_floor_us, NEW.purge_after_submicro_ns)
       IS DISTINCT FROM
       (OLD.exec_id, OLD.item, OLD.deleted_floor_us, OLD.deleted_submicro_ns,
        OLD.purge_after_floor_us, OLD.purge_after_submicro_ns)
       OR OLD.state = 'purged'
       OR (NEW.state = 'purged' AND NOT lc_cut_passed(OLD.purge_after_floor_us, OLD.purge_after_submicro_ns)) THEN
        RAISE EXCEPTION 'purge_not_due: the % deletion of exec % moves deleted -> purged only once a certain cut passed its purge_after % (and never changes otherwise)',
            OLD.item, OLD.exec_id,
            tollgate_instant_text(OLD.purge_after_floor_us::numeric * 1000 + OLD.purge_after_submicro_ns)
            USING ERRCODE = 'LCS90';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_deletions_forward
    BEFORE UPDATE OR DELETE ON lc_deletions
    FOR EACH ROW EXECUTE FUNCTION lc_deletions_forward();

-- LCS07 and LCS05 now allow exactly the purge: a deleted workspace's
-- snapshots, or a deleted output's pages, once its purge is due (or once
-- the exec's own records purge is due, 0009's retention). Every other
-- change is refused as before; a deletion of a deleted item before its
-- purge is due is LCS90.
CREATE OR REPLACE FUNCTION lc_snapshots_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    exec bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        SELECT w.exec_id INTO exec FROM lc_workspaces w WHERE w.workspace_id = OLD.workspace_id;
        IF lc_purge_due(exec, 'workspace') OR lc_exec_purge_due(exec) THEN
            RETURN OLD;
        END IF;
        IF EXISTS (SELECT 1 FROM lc_deletions d WHERE d.exec_id = exec AND d.item = 'workspace') THEN
            RAISE EXCEPTION 'purge_not_due: the snapshots of exec %''s deleted workspace are purged only once a certain cut passed its purge_after', exec
                USING ERRCODE = 'LCS90';
        END IF;
    END IF;
    RAISE EXCEPTION 'snapshot_immutable: a snapshot is never updated or deleted (%)', TG_OP
        USING ERRCODE = 'LCS07';
END $$;

CREATE OR REPLACE FUNCTION lc_output_pages_forward() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF lc_purge_due(OLD.exec_id, 'output') OR lc_exec_purge_due(OLD.exec_id) THEN
            RETURN OLD;
        END IF;
        IF EXISTS (SELECT 1 FROM lc_deletions d WHERE d.exec_id = OLD.exec_id AND d.item = 'output') THEN
            RAISE EXCEPTION 'purge_not_due: the pages of exec %''s deleted output are purged only once a certain cut passed its purge_after', OLD.exec_id
                USING ERRCODE = 'LCS90';
        END IF;
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

-- Retention's purge (0009): a terminal exec's records go, in one
-- transaction, only once lc_exec_purge_due holds for it (its retain_until
-- passed by a certain persisted cut, no deletion of it waiting). Every
-- table holding them refuses any other deletion: LCS91
-- retention_not_passed, or its own immutability code (LCS03 transition
-- receipts, LCS05 pages, LCS06 inputs, LCS07 snapshots, LCS08 resume
-- receipts) as before. Tollgate's own rows (accounts, leases, ledger)
-- are never touched.
CREATE FUNCTION lc_retained_until_purge() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    exec bigint := (to_jsonb(OLD) ->> 'exec_id')::bigint;
BEGIN
    IF lc_exec_purge_due(exec) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'retention_not_passed: % of exec % is kept until a certain cut passes the exec''s retain_until (and its deletions are purged)',
        TG_TABLE_NAME, exec
        USING ERRCODE = 'LCS91';
END $$;

CREATE TRIGGER lc_execs_retained BEFORE DELETE ON lc_execs
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
CREATE TRIGGER lc_attempts_retained BEFORE DELETE ON lc_attempts
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
CREATE TRIGGER lc_reservations_retained BEFORE DELETE ON lc_reservations
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
CREATE TRIGGER lc_sandbox_leases_retained BEFORE DELETE ON lc_sandbox_leases
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
CREATE TRIGGER lc_exec_owners_retained BEFORE DELETE ON lc_exec_owners
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
CREATE TRIGGER lc_workspaces_retained BEFORE DELETE ON lc_workspaces
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
CREATE TRIGGER lc_hibernations_retained BEFORE DELETE ON lc_hibernations
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
CREATE TRIGGER lc_resume_intents_retained BEFORE DELETE ON lc_resume_intents
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();

CREATE OR REPLACE FUNCTION lc_transitions_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND lc_exec_purge_due(OLD.exec_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'transition_immutable: a transition receipt is never updated or deleted (%)', TG_OP
        USING ERRCODE = 'LCS03';
END $$;

CREATE OR REPLACE FUNCTION lc_resume_receipts_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND lc_exec_purge_due(OLD.exec_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'resume_receipt_immutable: a resume receipt is never updated or deleted (%)', TG_OP
        USING ERRCODE = 'LCS08';
END $$;

CREATE OR REPLACE FUNCTION lc_exec_inputs_order() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF lc_exec_purge_due(OLD.exec_id) THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'input_regression: input % of exec % is never deleted', OLD.input_seq, OLD.exec_id
            USING ERRCODE = 'LCS06';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.state <> 'queued' THEN
            RAISE EXCEPTION 'input_regression: input % of exec % starts queued', NEW.input_seq, NEW.exec_id
                USING ERRCODE = 'LCS06';
        END IF;
        IF NOT (SELECT e.stdin_open FROM lc_execs e WHERE e.exec_id = NEW.exec_id) THEN
            RAISE EXCEPTION 'input_regression: exec % was admitted without stdin open', NEW.exec_id
                USING ERRCODE = 'LCS06';
        END IF;
        IF NEW.input_seq > 1 AND NOT EXISTS (
               SELECT 1 FROM lc_exec_inputs i
                WHERE i.exec_id = NEW.exec_id AND i.input_seq = NEW.input_seq - 1 AND NOT i.eof) THEN
            RAISE EXCEPTION 'input_regression: input % of exec % follows no input or the eof input',
                NEW.input_seq, NEW.exec_id
                USING ERRCODE = 'LCS06';
        END IF;
        RETURN NEW;
    END IF;
    IF (NEW.exec_id, NEW.input_seq, NEW.bytes, NEW.sha256, NEW.eof, NEW.op_key, NEW.request_sha256,
        NEW.queued_floor_us, NEW.queued_submicro_ns)
       IS DISTINCT FROM
       (OLD.exec_id, OLD.input_seq, OLD.bytes, OLD.sha256, OLD.eof, OLD.op_key, OLD.request_sha256,
        OLD.queued_floor_us, OLD.queued_submicro_ns)
       OR OLD.state <> 'queued' OR NEW.state <> 'sent' THEN
        RAISE EXCEPTION 'input_regression: input % of exec % only moves from queued to sent', OLD.input_seq, OLD.exec_id
            USING ERRCODE = 'LCS06';
    END IF;
    -- Checked here rather than by a foreign key, which would keep the
    -- receipts' own guard from answering a TRUNCATE of lc_transitions.
    IF NOT EXISTS (
           SELECT 1 FROM lc_transitions t
            WHERE t.exec_id = NEW.exec_id AND t.transition_id = NEW.send_transition_id
              AND t.kind = 'send') THEN
        RAISE EXCEPTION 'input_regression: input % of exec % is sent only by a committed send receipt, not %',
            OLD.input_seq, OLD.exec_id, NEW.send_transition_id
            USING ERRCODE = 'LCS06';
    END IF;
    IF OLD.input_seq > 1 AND NOT EXISTS (
           SELECT 1 FROM lc_exec_inputs i
            WHERE i.exec_id = OLD.exec_id AND i.input_seq = OLD.input_seq - 1 AND i.state = 'sent') THEN
        RAISE EXCEPTION 'input_regression: input % of exec % is sent only after input %',
            OLD.input_seq, OLD.exec_id, OLD.input_seq - 1
            USING ERRCODE = 'LCS06';
    END IF;
    RETURN NEW;
END $$;
