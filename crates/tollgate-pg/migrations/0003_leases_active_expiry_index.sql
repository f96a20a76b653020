-- Reclaim scans active leases by expiry; settled leases stay as history and
-- must not slow it down, hence a partial index.
CREATE INDEX tollgate_leases_active_expires_at
    ON tollgate_leases (expires_at_us)
    WHERE state = 'active';
