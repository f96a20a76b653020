-- Conservation, enforced by the database as a last line of defence:
-- deposited = available + held + consumed, every balance nonnegative.
-- Summed as NUMERIC so the check itself cannot overflow.
ALTER TABLE tollgate_accounts
    ADD CONSTRAINT tollgate_accounts_nonnegative
        CHECK (deposited >= 0 AND available >= 0 AND held >= 0 AND consumed >= 0),
    ADD CONSTRAINT tollgate_accounts_conservation
        CHECK (deposited::numeric = available::numeric + held::numeric + consumed::numeric);
