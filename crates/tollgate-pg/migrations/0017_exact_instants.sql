-- Migration 0017: exact lease instants.
--
-- Lease instants become instant pairs: expiry_floor_us (floor of the
-- nanoseconds since the Unix epoch divided by 1000) and expiry_submicro_ns
-- (0..=999), together exactly 1000 * floor_us + submicro_ns nanoseconds.
-- Tuple order on the pair equals instant order, also before the epoch, so
-- reclaim compares (expiry_floor_us, expiry_submicro_ns) with the exact
-- cutoff computed by the application and the partial index covers both.
--
-- Rows written before this migration hold microseconds truncated toward
-- zero; the true expiry cannot be reconstructed. Each gets the latest
-- instant consistent with its stored value, marked expiry_is_upper_bound:
-- +999 ns for nonnegative microseconds (the stored instant is kept for
-- negative ones, whose truncation rounded up). That never makes an
-- advertised expiry earlier.
--
-- Compatibility fence: the rename makes every lease statement of an older
-- binary fail with undefined_column (42703), also on connections opened
-- before the migration, so their transactions roll back instead of writing
-- a truncated expiry or reclaiming early. Do not add a compatibility column
-- or view named expires_at_us.
--
-- Runs in one transaction (sqlx wraps it, together with its bookkeeping
-- row): a failure anywhere, such as a legacy instant outside the timestamp
-- domain, rolls everything back and leaves version 16 authoritative. Nothing
-- is clamped. No unit, fence, state or accounting column changes.

-- Wait for every running transaction that touched these tables, in the
-- order older writers lock them (leases, then ledger, then idempotency), and
-- keep all other sessions out until commit.
LOCK TABLE tollgate_leases, tollgate_ledger, tollgate_idempotency IN ACCESS EXCLUSIVE MODE;

-- Leases.
ALTER TABLE tollgate_leases RENAME COLUMN expires_at_us TO expiry_floor_us;
ALTER TABLE tollgate_leases
    ADD COLUMN expiry_submicro_ns SMALLINT,
    ADD COLUMN expiry_is_upper_bound BOOLEAN;
UPDATE tollgate_leases
   SET expiry_submicro_ns = CASE WHEN expiry_floor_us >= 0 THEN 999 ELSE 0 END,
       expiry_is_upper_bound = true;

-- Ledger: the lease expiry and the operation's supplied time, both as
-- pairs; legacy values get the same conservative bound and flag.
ALTER TABLE tollgate_ledger RENAME COLUMN expiry_us TO expiry_floor_us;
ALTER TABLE tollgate_ledger RENAME COLUMN at_us TO at_floor_us;
ALTER TABLE tollgate_ledger
    ADD COLUMN expiry_submicro_ns SMALLINT,
    ADD COLUMN expiry_is_upper_bound BOOLEAN,
    ADD COLUMN at_submicro_ns SMALLINT,
    ADD COLUMN at_is_upper_bound BOOLEAN;
UPDATE tollgate_ledger
   SET expiry_submicro_ns = CASE WHEN expiry_floor_us IS NULL THEN NULL
                                 WHEN expiry_floor_us >= 0 THEN 999 ELSE 0 END,
       expiry_is_upper_bound = CASE WHEN expiry_floor_us IS NULL THEN NULL ELSE true END,
       at_submicro_ns = CASE WHEN at_floor_us >= 0 THEN 999 ELSE 0 END,
       at_is_upper_bound = true;

-- Idempotency records: the grant snapshot's expiry as a pair, and TTLs as
-- exact (seconds, nanoseconds). A legacy record's TTLs were microseconds;
-- they convert exactly, and request_ttl_is_truncated says the original
-- request may have had sub-microsecond digits.
ALTER TABLE tollgate_idempotency RENAME COLUMN expires_at_us TO expiry_floor_us;
ALTER TABLE tollgate_idempotency
    ADD COLUMN expiry_submicro_ns SMALLINT,
    ADD COLUMN expiry_is_upper_bound BOOLEAN,
    ADD COLUMN request_ttl_secs BIGINT,
    ADD COLUMN request_ttl_nanos INTEGER,
    ADD COLUMN request_ttl_is_truncated BOOLEAN,
    ADD COLUMN granted_ttl_secs BIGINT,
    ADD COLUMN granted_ttl_nanos INTEGER;
UPDATE tollgate_idempotency
   SET expiry_submicro_ns = CASE WHEN expiry_floor_us >= 0 THEN 999 ELSE 0 END,
       expiry_is_upper_bound = true,
       request_ttl_secs = request_ttl_us / 1000000,
       request_ttl_nanos = (request_ttl_us % 1000000) * 1000,
       request_ttl_is_truncated = true,
       granted_ttl_secs = granted_ttl_us / 1000000,
       granted_ttl_nanos = (granted_ttl_us % 1000000) * 1000;
ALTER TABLE tollgate_idempotency
    DROP COLUMN request_ttl_us,
    DROP COLUMN granted_ttl_us;

-- Validate every row against the timestamp domain
-- [(-377705023201000000, 0), (253402207200999999, 999)], the encodings of
-- jiff's Timestamp::MIN and Timestamp::MAX, before adding the constraints,
-- so that a failure names the offending rows (at most 20 per table).
DO $$
DECLARE
    bad_leases bigint;
    bad_ledger bigint;
    bad_idempotency bigint;
    lease_list text;
    ledger_list text;
    idempotency_list text;
BEGIN
    SELECT count(*) INTO bad_leases FROM tollgate_leases
     WHERE (expiry_floor_us, expiry_submicro_ns) < (-377705023201000000, 0)
        OR (expiry_floor_us, expiry_submicro_ns) > (253402207200999999, 999);
    SELECT count(*) INTO bad_ledger FROM tollgate_ledger
     WHERE (expiry_floor_us, expiry_submicro_ns) < (-377705023201000000, 0)
        OR (expiry_floor_us, expiry_submicro_ns) > (253402207200999999, 999)
        OR (at_floor_us, at_submicro_ns) < (-377705023201000000, 0)
        OR (at_floor_us, at_submicro_ns) > (253402207200999999, 999);
    SELECT count(*) INTO bad_idempotency FROM tollgate_idempotency
     WHERE (expiry_floor_us, expiry_submicro_ns) < (-377705023201000000, 0)
        OR (expiry_floor_us, expiry_submicro_ns) > (253402207200999999, 999);
    IF bad_leases + bad_ledger + bad_idempotency > 0 THEN
        SELECT string_agg(lease_id::text, ', ' ORDER BY lease_id) INTO lease_list
          FROM (SELECT lease_id FROM tollgate_leases
                 WHERE (expiry_floor_us, expiry_submicro_ns) < (-377705023201000000, 0)
                    OR (expiry_floor_us, expiry_submicro_ns) > (253402207200999999, 999)
                 ORDER BY lease_id LIMIT 20) bad;
        SELECT string_agg(seq::text, ', ' ORDER BY seq) INTO ledger_list
          FROM (SELECT seq FROM tollgate_ledger
                 WHERE (expiry_floor_us, expiry_submicro_ns) < (-377705023201000000, 0)
                    OR (expiry_floor_us, expiry_submicro_ns) > (253402207200999999, 999)
                    OR (at_floor_us, at_submicro_ns) < (-377705023201000000, 0)
                    OR (at_floor_us, at_submicro_ns) > (253402207200999999, 999)
                 ORDER BY seq LIMIT 20) bad;
        SELECT string_agg(account_id::text || '/' || idem_key, ', ' ORDER BY account_id, idem_key)
          INTO idempotency_list
          FROM (SELECT account_id, idem_key FROM tollgate_idempotency
                 WHERE (expiry_floor_us, expiry_submicro_ns) < (-377705023201000000, 0)
                    OR (expiry_floor_us, expiry_submicro_ns) > (253402207200999999, 999)
                 ORDER BY account_id, idem_key LIMIT 20) bad;
        RAISE EXCEPTION 'migration 0017 refused: legacy instants outside the timestamp domain: % lease row(s) [lease_id: %], % ledger row(s) [seq: %], % idempotency record(s) [account_id/key: %]; nothing was changed, version 16 remains; inspect these rows and repair them only from authoritative evidence, then retry',
            bad_leases, coalesce(lease_list, '-'),
            bad_ledger, coalesce(ledger_list, '-'),
            bad_idempotency, coalesce(idempotency_list, '-')
            USING ERRCODE = 'check_violation';
    END IF;
END
$$;

-- The constraints that keep every future row inside the domain.
ALTER TABLE tollgate_leases
    ALTER COLUMN expiry_submicro_ns SET NOT NULL,
    ALTER COLUMN expiry_is_upper_bound SET NOT NULL,
    ADD CONSTRAINT tollgate_leases_expiry_submicro_range
        CHECK (expiry_submicro_ns BETWEEN 0 AND 999),
    ADD CONSTRAINT tollgate_leases_expiry_domain
        CHECK ((expiry_floor_us, expiry_submicro_ns) >= (-377705023201000000, 0)
           AND (expiry_floor_us, expiry_submicro_ns) <= (253402207200999999, 999));

ALTER TABLE tollgate_ledger
    ALTER COLUMN at_submicro_ns SET NOT NULL,
    ALTER COLUMN at_is_upper_bound SET NOT NULL,
    ADD CONSTRAINT tollgate_ledger_expiry_pair_complete
        CHECK ((expiry_floor_us IS NULL) = (expiry_submicro_ns IS NULL)
           AND (expiry_floor_us IS NULL) = (expiry_is_upper_bound IS NULL)),
    ADD CONSTRAINT tollgate_ledger_expiry_submicro_range
        CHECK (expiry_submicro_ns BETWEEN 0 AND 999),
    ADD CONSTRAINT tollgate_ledger_expiry_domain
        CHECK ((expiry_floor_us, expiry_submicro_ns) >= (-377705023201000000, 0)
           AND (expiry_floor_us, expiry_submicro_ns) <= (253402207200999999, 999)),
    ADD CONSTRAINT tollgate_ledger_at_submicro_range
        CHECK (at_submicro_ns BETWEEN 0 AND 999),
    ADD CONSTRAINT tollgate_ledger_at_domain
        CHECK ((at_floor_us, at_submicro_ns) >= (-377705023201000000, 0)
           AND (at_floor_us, at_submicro_ns) <= (253402207200999999, 999));

ALTER TABLE tollgate_idempotency
    ALTER COLUMN expiry_submicro_ns SET NOT NULL,
    ALTER COLUMN expiry_is_upper_bound SET NOT NULL,
    ALTER COLUMN request_ttl_secs SET NOT NULL,
    ALTER COLUMN request_ttl_nanos SET NOT NULL,
    ALTER COLUMN request_ttl_is_truncated SET NOT NULL,
    ALTER COLUMN granted_ttl_secs SET NOT NULL,
    ALTER COLUMN granted_ttl_nanos SET NOT NULL,
    ADD CONSTRAINT tollgate_idempotency_expiry_submicro_range
        CHECK (expiry_submicro_ns BETWEEN 0 AND 999),
    ADD CONSTRAINT tollgate_idempotency_expiry_domain
        CHECK ((expiry_floor_us, expiry_submicro_ns) >= (-377705023201000000, 0)
           AND (expiry_floor_us, expiry_submicro_ns) <= (253402207200999999, 999)),
    -- Nonnegative only: a legacy TTL below one microsecond truncated to 0.
    ADD CONSTRAINT tollgate_idempotency_ttls_exact
        CHECK (request_ttl_secs >= 0 AND request_ttl_nanos BETWEEN 0 AND 999999999
           AND granted_ttl_secs >= 0 AND granted_ttl_nanos BETWEEN 0 AND 999999999);

-- Rebuild the partial active-expiry index over both components.
DROP INDEX tollgate_leases_active_expires_at;
CREATE INDEX tollgate_leases_active_expiry
    ON tollgate_leases (expiry_floor_us, expiry_submicro_ns)
    WHERE state = 'active';
