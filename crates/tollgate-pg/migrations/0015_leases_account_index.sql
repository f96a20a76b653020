-- Leases by account: foreign-key checks and per-account lookups.
CREATE INDEX tollgate_leases_account ON tollgate_leases (account_id, lease_id);
CREATE INDEX tollgate_ledger_lease ON tollgate_ledger (lease_id) WHERE lease_id IS NOT NULL;
