-- The lease's fence and expiry after each lease change, for audit trails.
ALTER TABLE tollgate_ledger
    ADD COLUMN fence     BIGINT,
    ADD COLUMN expiry_us BIGINT;
