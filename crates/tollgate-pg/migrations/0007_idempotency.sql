-- Idempotency keys of acquire requests, per account: a retry with the same
-- key and request returns the original grant.
CREATE TABLE tollgate_idempotency (
    account_id     BIGINT NOT NULL REFERENCES tollgate_accounts (account_id),
    idem_key       TEXT   NOT NULL,
    units          BIGINT NOT NULL,
    request_ttl_us BIGINT NOT NULL,
    lease_id       BIGINT NOT NULL REFERENCES tollgate_leases (lease_id),
    PRIMARY KEY (account_id, idem_key)
);
