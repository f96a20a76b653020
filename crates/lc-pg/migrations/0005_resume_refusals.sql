-- A resume whose restore the provider refused: the refusal (the
-- provider's stable code and its message, naming the path and blob
-- digest) is recorded on the intent that prepared the Lease, in the
-- transaction that releases that Lease unattached. A refused intent is
-- never prepared again and does not make its exec claimable; the exec
-- stays parked and a new request (another operation key) may retry.
ALTER TABLE lc_resume_intents
    ADD COLUMN refused_code    TEXT CHECK (refused_code ~ '^[a-z][a-z0-9_]{0,63}$'),
    ADD COLUMN refused_message TEXT CHECK (octet_length(refused_message) <= 2048),
    ADD CONSTRAINT lc_resume_intents_refusal_pair CHECK (
        (refused_code IS NULL) = (refused_message IS NULL)),
    ADD CONSTRAINT lc_resume_intents_refused_prepared CHECK (
        refused_code IS NULL OR prepared_lease_id IS NOT NULL);
