-- Measurements: what a sandbox Lease's provider measured of that Lease
-- generation from the instance's own accounting, verified against the
-- provider's registered key (the operator's trusted capture) before it is
-- written. `evidence` is the signed measurement itself (a DSSE envelope).
--
-- Absence is kept as absence: no row means nothing was measured (the
-- provider died or never answered before the instance was destroyed); a
-- NULL cost means the accounting was not readable; a NULL flag means that
-- side effect was not observed. None of them is ever read as 0 or false,
-- and a measured 0 or false is stored as such.
--
-- Error codes (SQLSTATE, stable), besides 0001's:
--   LCSM1 measurement_regression  an update that loses a measured value
--                                 (a cost or a flag replaced by NULL, a
--                                 cost made smaller, a side effect
--                                 observed true made false) or moves the
--                                 row to another Lease;
--                                 the store keeps the stored row instead
--                                 (lc_core::observation::AttemptObservation::supersedes)
CREATE TABLE lc_measurements (
    lease_id            BIGINT  PRIMARY KEY REFERENCES lc_sandbox_leases (lease_id),
    exec_id             BIGINT  NOT NULL,
    -- Whole milliseconds of CPU time and bytes, both or neither, each an
    -- integer canonical JSON represents exactly.
    cpu_time_ms         BIGINT  CHECK (cpu_time_ms BETWEEN 0 AND 9007199254740991),
    peak_memory_bytes   BIGINT  CHECK (peak_memory_bytes BETWEEN 0 AND 9007199254740991),
    network_writes      BOOLEAN,
    database_commits    BOOLEAN,
    external_api_calls  BOOLEAN,
    evidence            JSONB   NOT NULL,
    -- The cut of the reading the measurement was recorded at (an instant
    -- pair, as in 0001).
    recorded_floor_us    BIGINT  NOT NULL,
    recorded_submicro_ns INTEGER NOT NULL CHECK (recorded_submicro_ns BETWEEN 0 AND 999),
    CONSTRAINT lc_measurements_cost CHECK ((cpu_time_ms IS NULL) = (peak_memory_bytes IS NULL))
);

-- LCSM1: a measured value is never lost (see the header).
CREATE FUNCTION lc_measurements_keep() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lease_id <> OLD.lease_id OR NEW.exec_id <> OLD.exec_id
       OR (OLD.cpu_time_ms IS NOT NULL AND NEW.cpu_time_ms IS NULL)
       OR (OLD.network_writes IS NOT NULL AND NEW.network_writes IS NULL)
       OR (OLD.database_commits IS NOT NULL AND NEW.database_commits IS NULL)
       OR (OLD.external_api_calls IS NOT NULL AND NEW.external_api_calls IS NULL)
       OR NEW.cpu_time_ms < OLD.cpu_time_ms OR NEW.peak_memory_bytes < OLD.peak_memory_bytes
       OR (OLD.network_writes AND NEW.network_writes IS NOT TRUE)
       OR (OLD.database_commits AND NEW.database_commits IS NOT TRUE)
       OR (OLD.external_api_calls AND NEW.external_api_calls IS NOT TRUE) THEN
        RAISE EXCEPTION 'measurement_regression: the measurement of lease % would lose a measured value', OLD.lease_id
            USING ERRCODE = 'LCSM1';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_measurements_keep BEFORE UPDATE ON lc_measurements
    FOR EACH ROW EXECUTE FUNCTION lc_measurements_keep();

-- Retention (0009): a measurement is evidence, kept with its exec's
-- records until their purge.
CREATE TRIGGER lc_measurements_retained BEFORE DELETE ON lc_measurements
    FOR EACH ROW EXECUTE FUNCTION lc_retained_until_purge();
