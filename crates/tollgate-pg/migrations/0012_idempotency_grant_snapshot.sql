-- An idempotent retry must return the original grant unchanged even after
-- the lease was renewed, so the record keeps a snapshot of the grant.
-- Records written before this version take the lease's current values.
ALTER TABLE tollgate_idempotency
    ADD COLUMN fence          BIGINT,
    ADD COLUMN expires_at_us  BIGINT,
    ADD COLUMN granted_ttl_us BIGINT;
UPDATE tollgate_idempotency i
   SET fence = l.fence, expires_at_us = l.expires_at_us, granted_ttl_us = i.request_ttl_us
  FROM tollgate_leases l
 WHERE l.lease_id = i.lease_id;
ALTER TABLE tollgate_idempotency
    ALTER COLUMN fence SET NOT NULL,
    ALTER COLUMN expires_at_us SET NOT NULL,
    ALTER COLUMN granted_ttl_us SET NOT NULL;
