-- Scoped tokens: a tenant's credential limited to a set of operations,
-- optionally bound to one exec, until its Scope deadline on the cut.
--
-- Only the SHA-256 of a token's secret is stored; the secret is shown
-- once, when it is minted. The deadline is minted_cut + ttl of a certain
-- cut and lies within cut + horizon (LCS01, the trigger below). A token is
-- honoured only while a certain cut is below its deadline and it is not
-- revoked; the store judges that in Rust (lc_core::token::check_accepted),
-- no statement compares with now(). A revocation only ever sets
-- revoked_* once (LCS70): a revoked token never comes back, and its
-- identity, scope and deadline never change.
--
-- Error codes (SQLSTATE, stable):
--   LCS70 token_immutable  an update of a token other than its first
--                          revocation

CREATE TABLE lc_tokens (
    token_id             BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id            BIGINT  NOT NULL REFERENCES lc_tenants (tenant_id),
    -- SHA-256 of the secret (`lct_` + 43 base64url characters).
    secret_sha256        BYTEA   NOT NULL UNIQUE CHECK (octet_length(secret_sha256) = 32),
    -- The exec the token is bound to, if any: one of its tenant's.
    exec_id              BIGINT  REFERENCES lc_execs (exec_id),
    -- The operations' stable names, in the vocabulary's order.
    operations           TEXT[]  NOT NULL CHECK (
        cardinality(operations) BETWEEN 1 AND 8
        AND operations <@ ARRAY['exec.create', 'exec.read', 'exec.input', 'exec.cancel',
                                'exec.hibernate', 'exec.resume', 'workspace.read',
                                'approval.decide']::text[]
        AND NOT (exec_id IS NOT NULL AND 'exec.create' = ANY (operations))),
    minted_floor_us      BIGINT  NOT NULL,
    minted_submicro_ns   INTEGER NOT NULL CHECK (minted_submicro_ns BETWEEN 0 AND 999),
    deadline_floor_us    BIGINT  NOT NULL,
    deadline_submicro_ns INTEGER NOT NULL CHECK (deadline_submicro_ns BETWEEN 0 AND 999),
    revoked_floor_us     BIGINT,
    revoked_submicro_ns  INTEGER CHECK (revoked_submicro_ns BETWEEN 0 AND 999),
    CONSTRAINT lc_tokens_deadline_after_mint CHECK (
        (deadline_floor_us, deadline_submicro_ns) > (minted_floor_us, minted_submicro_ns)),
    CONSTRAINT lc_tokens_revoked_pair CHECK ((revoked_floor_us IS NULL) = (revoked_submicro_ns IS NULL))
);
-- A tenant's tokens, listed by id.
CREATE INDEX lc_tokens_tenant ON lc_tokens (tenant_id, token_id);

-- LCS01 for the Scope deadline.
CREATE TRIGGER lc_tokens_deadline_within_horizon
    BEFORE INSERT OR UPDATE OF deadline_floor_us, deadline_submicro_ns ON lc_tokens
    FOR EACH ROW EXECUTE FUNCTION lc_deadline_within_horizon('deadline_floor_us', 'deadline_submicro_ns');

-- LCS70: the only update of a token is its first revocation.
CREATE FUNCTION lc_tokens_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.token_id, NEW.tenant_id, NEW.secret_sha256, NEW.exec_id, NEW.operations,
        NEW.minted_floor_us, NEW.minted_submicro_ns, NEW.deadline_floor_us, NEW.deadline_submicro_ns)
       IS DISTINCT FROM
       (OLD.token_id, OLD.tenant_id, OLD.secret_sha256, OLD.exec_id, OLD.operations,
        OLD.minted_floor_us, OLD.minted_submicro_ns, OLD.deadline_floor_us, OLD.deadline_submicro_ns)
       OR OLD.revoked_floor_us IS NOT NULL OR NEW.revoked_floor_us IS NULL THEN
        RAISE EXCEPTION 'token_immutable: token % is only ever revoked, once', OLD.token_id
            USING ERRCODE = 'LCS70';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_tokens_immutable
    BEFORE UPDATE ON lc_tokens
    FOR EACH ROW EXECUTE FUNCTION lc_tokens_immutable();

