-- Claims: a worker activation's claim on a work item (today a sandbox
-- Lease, acted on by the reconciler), with an expiry on the cut and a
-- generation that fences the writes of a holder whose item was taken.
--
-- Time, as in 0001: the expiry is an instant pair in cut time, exactly
-- 1000 * expiry_floor_us + expiry_submicro_ns nanoseconds since the Unix
-- epoch; no column here is read from a host clock. Whether a claim may be
-- taken (a certain cut at or past expiry + grace) is decided in Rust
-- (lc_core::claim::plan_claim); no statement compares it with now().
--
-- Error codes (SQLSTATE, stable), besides 0001's:
--   LCS01 deadline_beyond_horizon  now also a claim's expiry
--   LCSC1 claim_regression         a claim update that does not move
--                                  forward: a new holder must have the
--                                  next generation; the same holder keeps
--                                  its generation and never shortens its
--                                  expiry; an item's claim is never moved
--                                  to another item, and deleted only once
--                                  its Lease is released or gone (the
--                                  retention purge of its exec: nothing is
--                                  left to act on, and Lease ids are never
--                                  reused)

-- An item's current claim. holder_sha256 is SHA-256 of the worker
-- activation's 128-bit random id (the id itself is never stored);
-- generation is 1 for the item's first holder and one more for every
-- take; basis is why this holder could take it (no claim before, or an
-- expired one).
CREATE TABLE lc_claims (
    item_kind          TEXT    NOT NULL CHECK (item_kind IN ('lease')),
    item_id            BIGINT  NOT NULL CHECK (item_id >= 1),
    holder_sha256      BYTEA   NOT NULL CHECK (octet_length(holder_sha256) = 32),
    generation         BIGINT  NOT NULL CHECK (generation >= 1),
    expiry_floor_us    BIGINT  NOT NULL,
    expiry_submicro_ns INTEGER NOT NULL CHECK (expiry_submicro_ns BETWEEN 0 AND 999),
    basis              TEXT    NOT NULL CHECK (basis IN ('unowned', 'expired')),
    PRIMARY KEY (item_kind, item_id),
    CONSTRAINT lc_claims_first_is_unowned CHECK ((generation = 1) = (basis = 'unowned'))
);
-- The operators' listing and a holder's renewals read claims by holder.
CREATE INDEX lc_claims_holder ON lc_claims (holder_sha256);

-- LCSC1: a claim only moves forward (see the header).
CREATE FUNCTION lc_claims_forward() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'claim_regression: claims are never truncated (their generations fence the writes of earlier holders)'
            USING ERRCODE = 'LCSC1';
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF OLD.item_kind = 'lease' AND NOT EXISTS (
               SELECT 1 FROM lc_sandbox_leases l
                WHERE l.lease_id = OLD.item_id AND l.state <> 'released') THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'claim_regression: the claim on % % is deleted only once its Lease is released (its generation fences the writes of earlier holders)',
            OLD.item_kind, OLD.item_id
            USING ERRCODE = 'LCSC1';
    END IF;
    IF (NEW.item_kind, NEW.item_id) IS DISTINCT FROM (OLD.item_kind, OLD.item_id) THEN
        RAISE EXCEPTION 'claim_regression: the claim on % % belongs to its item', OLD.item_kind, OLD.item_id
            USING ERRCODE = 'LCSC1';
    END IF;
    IF NEW.generation = OLD.generation THEN
        IF (NEW.holder_sha256, NEW.basis) IS DISTINCT FROM (OLD.holder_sha256, OLD.basis)
           OR (NEW.expiry_floor_us, NEW.expiry_submicro_ns)
              < (OLD.expiry_floor_us, OLD.expiry_submicro_ns) THEN
            RAISE EXCEPTION 'claim_regression: claim generation % on % % keeps its holder and never shortens its expiry',
                OLD.generation, OLD.item_kind, OLD.item_id
                USING ERRCODE = 'LCSC1';
        END IF;
    ELSIF NEW.generation <> OLD.generation + 1 OR NEW.holder_sha256 = OLD.holder_sha256 THEN
        RAISE EXCEPTION 'claim_regression: claim on % % generation % -> %: a take is by another holder at the next generation',
            OLD.item_kind, OLD.item_id, OLD.generation, NEW.generation
            USING ERRCODE = 'LCSC1';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_claims_forward
    BEFORE UPDATE OR DELETE ON lc_claims
    FOR EACH ROW EXECUTE FUNCTION lc_claims_forward();
CREATE TRIGGER lc_claims_not_truncated
    BEFORE TRUNCATE ON lc_claims
    FOR EACH STATEMENT EXECUTE FUNCTION lc_claims_forward();

-- LCS01 for a claim's expiry.
CREATE TRIGGER lc_claims_within_horizon
    BEFORE INSERT OR UPDATE OF expiry_floor_us, expiry_submicro_ns ON lc_claims
    FOR EACH ROW EXECUTE FUNCTION lc_deadline_within_horizon('expiry_floor_us', 'expiry_submicro_ns');
