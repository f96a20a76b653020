-- A hibernation whose snapshot the provider refused: the stopped
-- generation's workspace breaks a snapshot rule (a device, fifo or socket
-- in it, a name that is not UTF-8, a tree over the bounds), which no
-- retry can mend. The hibernation moves sealed -> refused with the
-- provider's reason code, the entry's path and its message, in the
-- transaction that ends the exec (terminal reason snapshot_refused, or
-- cancelled after a cancel request) and moves its Lease to
-- release_pending; the head stays where it was.

-- 0001's terminal-reason check was declared on its column and named by
-- the server: find it by its definition (exactly one) and replace it.
DO $$
DECLARE
    names text[];
BEGIN
    SELECT array_agg(c.conname) INTO names FROM pg_constraint c
     WHERE c.conrelid = 'lc_execs'::regclass AND c.contype = 'c'
       AND pg_get_constraintdef(c.oid) LIKE '%''exited''%''cancelled''%''expired''%''start_failed''%';
    IF coalesce(array_length(names, 1), 0) <> 1 THEN
        RAISE EXCEPTION 'expected one terminal-reason check on lc_execs, found %', names;
    END IF;
    EXECUTE format('ALTER TABLE lc_execs DROP CONSTRAINT %I', names[1]);
    SELECT array_agg(c.conname) INTO names FROM pg_constraint c
     WHERE c.conrelid = 'lc_hibernations'::regclass AND c.contype = 'c'
       AND pg_get_constraintdef(c.oid) LIKE '%''sealed''%''quiesced''%''parked''%';
    IF coalesce(array_length(names, 1), 0) <> 1 THEN
        RAISE EXCEPTION 'expected one step check on lc_hibernations, found %', names;
    END IF;
    EXECUTE format('ALTER TABLE lc_hibernations DROP CONSTRAINT %I', names[1]);
END $$;
ALTER TABLE lc_execs ADD CONSTRAINT lc_execs_terminal_reason_known CHECK (
    terminal_reason IN ('exited', 'cancelled', 'expired', 'start_failed', 'snapshot_refused'));
-- A refused hibernation, like a sealed one, has no head.
ALTER TABLE lc_hibernations DROP CONSTRAINT lc_hibernations_quiesced;
ALTER TABLE lc_hibernations
    ADD CONSTRAINT lc_hibernations_quiesced CHECK (
        (step IN ('sealed', 'refused')) = (head IS NULL) AND (head IS NULL) = (quiescence IS NULL)),
    ADD CONSTRAINT lc_hibernations_step CHECK (step IN ('sealed', 'quiesced', 'parked', 'refused')),
    ADD COLUMN refused_reason  TEXT CHECK (refused_reason ~ '^[a-z][a-z0-9_]{0,63}$'),
    ADD COLUMN refused_path    TEXT CHECK (octet_length(refused_path) <= 1024),
    ADD COLUMN refused_message TEXT CHECK (octet_length(refused_message) <= 2048),
    ADD CONSTRAINT lc_hibernations_refusal CHECK (
        (step = 'refused') = (refused_reason IS NOT NULL)
        AND (refused_reason IS NULL) = (refused_path IS NULL)
        AND (refused_reason IS NULL) = (refused_message IS NULL));

-- The reconciler's unfinished hibernations: a refused one is finished.
DROP INDEX lc_hibernations_unfinished;
CREATE INDEX lc_hibernations_unfinished ON lc_hibernations (exec_id)
    WHERE step IN ('sealed', 'quiesced');
