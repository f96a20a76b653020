-- Input for a command's stdin: an exec admitted with stdin open takes
-- inputs from its tenant (queued, in seq order, bounded by the store's
-- rules), which its owner delivers to the supervisor and then records
-- with a `send` receipt (sent).
--
-- Time, as in 0001: every instant is an instant pair in cut time, exactly
-- 1000 * <name>_floor_us + <name>_submicro_ns nanoseconds since the Unix
-- epoch; no column here is read from a host clock.
--
-- Error codes (SQLSTATE, stable), besides 0001's and 0002's:
--   LCS06 input_regression  an input that breaks the input order: not
--                           queued when inserted, a gap in the seqs, an
--                           input after the eof input or for an exec
--                           without stdin open, an update other than
--                           queued -> sent (in seq order, naming a
--                           committed `send` receipt of the exec) with
--                           everything else unchanged, a deletion, or a
--                           change of an exec's stdin_open

-- Whether the command's stdin stays open for input, fixed at admission.
ALTER TABLE lc_execs ADD COLUMN stdin_open BOOLEAN NOT NULL DEFAULT false;

-- An exec's inputs. bytes are at most one page (64 KiB); an input of no
-- bytes closes stdin. op_key is the client's operation key (tenant
-- scope) and request_sha256 the digest of its request (bytes' digest and
-- eof), so the same key with other bytes is refused (op_key is not
-- unique here: once its operation key is collected, a tenant may use the
-- key again, as for every operation). Once sent,
-- send_transition_id names the `send` receipt that recorded it.
CREATE TABLE lc_exec_inputs (
    exec_id            BIGINT  NOT NULL REFERENCES lc_execs (exec_id),
    input_seq          BIGINT  NOT NULL CHECK (input_seq >= 1),
    bytes              BYTEA   NOT NULL CHECK (octet_length(bytes) <= 65536),
    sha256             BYTEA   NOT NULL CHECK (octet_length(sha256) = 32 AND sha256 = sha256(bytes)),
    eof                BOOLEAN NOT NULL,
    op_key             TEXT    NOT NULL CHECK (octet_length(op_key) BETWEEN 1 AND 255),
    request_sha256     BYTEA   NOT NULL CHECK (octet_length(request_sha256) = 32),
    state              TEXT    NOT NULL CHECK (state IN ('queued', 'sent')),
    send_transition_id TEXT,
    queued_floor_us    BIGINT  NOT NULL,
    queued_submicro_ns INTEGER NOT NULL CHECK (queued_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (exec_id, input_seq),
    CONSTRAINT lc_exec_inputs_carries CHECK (eof OR octet_length(bytes) > 0),
    CONSTRAINT lc_exec_inputs_sent CHECK ((state = 'sent') = (send_transition_id IS NOT NULL))
);
-- The owner reads the queued inputs by seq.
CREATE INDEX lc_exec_inputs_queued ON lc_exec_inputs (exec_id, input_seq)
    WHERE state = 'queued';

-- LCS06 (see the header).
CREATE FUNCTION lc_exec_inputs_order() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
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

CREATE TRIGGER lc_exec_inputs_order
    BEFORE INSERT OR UPDATE OR DELETE ON lc_exec_inputs
    FOR EACH ROW EXECUTE FUNCTION lc_exec_inputs_order();

CREATE FUNCTION lc_execs_stdin_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'input_regression: exec % keeps the stdin_open it was admitted with', OLD.exec_id
        USING ERRCODE = 'LCS06';
END $$;

CREATE TRIGGER lc_execs_stdin_fixed
    BEFORE UPDATE OF stdin_open ON lc_execs
    FOR EACH ROW WHEN (NEW.stdin_open IS DISTINCT FROM OLD.stdin_open)
    EXECUTE FUNCTION lc_execs_stdin_fixed();

-- The initial-cut inventory (0001, 0002) also counts queued inputs: each
-- is an instruction a gateway may still carry out (write to a command's
-- stdin), so a database holding one is never given a fresh cut. Same
-- keys as before plus this one, so the evidence of an earlier claim still
-- reads the same way.
CREATE OR REPLACE FUNCTION lc_initial_inventory() RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    LOCK TABLE lc_execs, lc_sandbox_leases, lc_reservations, lc_operations, lc_exec_owners, lc_transitions,
        lc_exec_inputs
        IN SHARE MODE;
    RETURN jsonb_build_object(
        'unfinished_execs', (SELECT count(*) FROM lc_execs e WHERE e.state <> 'terminal'),
        'unreleased_leases', (SELECT count(*) FROM lc_sandbox_leases l WHERE l.state <> 'released'),
        'held_reservations', (SELECT count(*) FROM lc_reservations r WHERE r.state = 'held'),
        'operation_keys', (SELECT count(*) FROM lc_operations),
        'unreleased_owners', (SELECT count(*) FROM lc_exec_owners o WHERE NOT o.released),
        'transition_receipts', (SELECT count(*) FROM lc_transitions),
        'queued_inputs', (SELECT count(*) FROM lc_exec_inputs i WHERE i.state = 'queued'),
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
$$;
