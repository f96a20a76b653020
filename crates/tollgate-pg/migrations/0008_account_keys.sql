-- SHA-256 digests of account API keys; the key itself is never stored.
CREATE TABLE tollgate_account_keys (
    account_id BIGINT PRIMARY KEY REFERENCES tollgate_accounts (account_id),
    key_sha256 BYTEA  NOT NULL CHECK (octet_length(key_sha256) = 32)
);
