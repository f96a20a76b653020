-- Why an exec ended `expired`: `timeout` when its own timeout passed on a
-- certain cut, `lease` when its sandbox Lease's expiry passed unrenewed
-- (the instance was lost or stopped answering, or no worker renewed it).
-- The timeout is named when both passed. Written once, in the transaction
-- that moves the Lease to release_pending and records the reason; NULL
-- for every other reason and for execs that ended before this column.
ALTER TABLE lc_execs ADD COLUMN expired_by TEXT
    CHECK (expired_by IN ('timeout', 'lease'));
ALTER TABLE lc_execs ADD CONSTRAINT lc_execs_expired_by_reason
    CHECK (expired_by IS NULL OR terminal_reason = 'expired');
