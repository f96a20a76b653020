-- Accounts hold integer units. Balances are written by the store after the
-- core's accounting rules computed them; constraints come in 0010.
CREATE TABLE tollgate_accounts (
    account_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       TEXT   NOT NULL,
    deposited  BIGINT NOT NULL DEFAULT 0,
    available  BIGINT NOT NULL DEFAULT 0,
    held       BIGINT NOT NULL DEFAULT 0,
    consumed   BIGINT NOT NULL DEFAULT 0
);
