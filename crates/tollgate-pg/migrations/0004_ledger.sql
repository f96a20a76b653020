-- Every balance change, with the balances before and after, so the ledger
-- alone suffices to recompute every account.
CREATE TABLE tollgate_ledger (
    seq               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id        BIGINT NOT NULL REFERENCES tollgate_accounts (account_id),
    lease_id          BIGINT REFERENCES tollgate_leases (lease_id),
    kind              TEXT   NOT NULL CHECK (kind IN ('deposit', 'acquire', 'renew', 'release',
                                                      'reclaim', 'consolidate', 'consolidated_grant')),
    units             BIGINT NOT NULL,
    consumed          BIGINT NOT NULL DEFAULT 0,
    before_deposited  BIGINT NOT NULL,
    before_available  BIGINT NOT NULL,
    before_held       BIGINT NOT NULL,
    before_consumed   BIGINT NOT NULL,
    after_deposited   BIGINT NOT NULL,
    after_available   BIGINT NOT NULL,
    after_held        BIGINT NOT NULL,
    after_consumed    BIGINT NOT NULL,
    at_us             BIGINT NOT NULL
);
