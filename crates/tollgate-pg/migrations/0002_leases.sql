-- Leases hold units of one account until their expiry. Writers of this era
-- store the expiry as microseconds since the Unix epoch, truncated toward
-- zero (the precision of their clock type).
CREATE TABLE tollgate_leases (
    lease_id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id    BIGINT NOT NULL REFERENCES tollgate_accounts (account_id),
    units         BIGINT NOT NULL CHECK (units > 0),
    expires_at_us BIGINT NOT NULL,
    state         TEXT   NOT NULL DEFAULT 'active'
        CHECK (state IN ('active', 'released', 'reclaimed', 'consolidated'))
);
