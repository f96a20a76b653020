-- Milestones: saved points of an exec's attempt that recovery can restart
-- from. Each names the file snapshot head it saved (a committed snapshot
-- of the exec's workspace), the Lease generation it saved, what recorded
-- it, and what the trusted provider had observed of the attempt up to it.
--
-- As in 0012, absence is kept as absence: a NULL cost means the cost up to
-- the milestone is unknown, a NULL flag that the side effect was not
-- observed; none is ever read as 0 or false. A milestone never changes.
--
-- Error codes (SQLSTATE, stable), besides 0001's:
--   LCSM2 milestone_immutable  an update or truncation of a milestone
--                              (a purge deletes them with their exec's
--                              records, under 0009's retention)
CREATE TABLE lc_milestones (
    exec_id              BIGINT  NOT NULL,
    -- From 1 in recording order, unique within the exec across attempts.
    seq                  INTEGER NOT NULL CHECK (seq >= 1),
    attempt              INTEGER NOT NULL,
    generation           BIGINT  NOT NULL CHECK (generation >= 1),
    lease_id             BIGINT  NOT NULL REFERENCES lc_sandbox_leases (lease_id),
    source               TEXT    NOT NULL CHECK (source IN ('hibernation')),
    head                 BYTEA   NOT NULL CHECK (octet_length(head) = 32),
    cpu_time_ms          BIGINT  CHECK (cpu_time_ms BETWEEN 0 AND 9007199254740991),
    peak_memory_bytes    BIGINT  CHECK (peak_memory_bytes BETWEEN 0 AND 9007199254740991),
    network_writes       BOOLEAN,
    database_commits     BOOLEAN,
    external_api_calls   BOOLEAN,
    recorded_floor_us    BIGINT  NOT NULL,
    recorded_submicro_ns INTEGER NOT NULL CHECK (recorded_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (exec_id, seq),
    -- A hibernation records one milestone for its generation.
    UNIQUE (lease_id, source),
    FOREIGN KEY (exec_id, attempt) REFERENCES lc_attempts (exec_id, attempt),
    CONSTRAINT lc_milestones_cost CHECK ((cpu_time_ms IS NULL) = (peak_memory_bytes IS NULL))
);

-- LCSM2: a milestone never changes.
CREATE FUNCTION lc_milestones_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'milestone_immutable: a milestone is never changed (%)', TG_OP
        USING ERRCODE = 'LCSM2';
END $$;

CREATE TRIGGER lc_milestones_immutable BEFORE UPDATE ON lc_milestones
    FOR EACH ROW EXECUTE FUNCTION lc_milestones_immutable();
CREATE TRIGGER lc_milestones_not_truncated BEFORE TRUNCATE ON lc_milestones
    FOR EACH STATEMENT EXECUTE FUNCTION lc_milestones_immutable();

-- Retention (0009): kept with its exec's records until their purge.
CREATE TRIGGER lc_milestones_retained BEFORE DELETE ON lc_milestones
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
