-- Little Compute's control-plane schema: tenants (Tollgate accounts),
-- runtimes, providers, execs with their canonical identity, attempts,
-- Reservations (Tollgate grants), sandbox Leases, output pages and
-- operation keys.
--
-- Time. Every instant is an instant pair in cut time, exactly
-- 1000 * <name>_floor_us + <name>_submicro_ns nanoseconds since the Unix
-- epoch, submicro in 0..=999, never rounded; no column here is read from a
-- host clock, and no statement compares with now().
--
-- Error codes (SQLSTATE, stable; the store maps them):
--   LCS01 deadline_beyond_horizon  a deadline (Lease or Reservation expiry,
--                                  exec timeout, operation key GC instant)
--                                  beyond cut + horizon, once a sampler has
--                                  claimed (the cut row exists); the
--                                  horizon is the smaller of the newest
--                                  sealed policy's and the current epoch's,
--                                  as for Tollgate's lease guard (0019)
--   LCS02 identity_immutable       an update of an exec's canonical
--                                  identity (exec, lease, provider,
--                                  runtime, workspace) or of its tenant

CREATE TABLE lc_tenants (
    tenant_id      BIGINT PRIMARY KEY REFERENCES tollgate_accounts (account_id),
    name           TEXT   NOT NULL UNIQUE CHECK (octet_length(name) BETWEEN 1 AND 200),
    -- SHA-256 of the tenant's API key; the key itself is never stored.
    api_key_sha256 BYTEA  NOT NULL UNIQUE CHECK (octet_length(api_key_sha256) = 32)
);

CREATE TABLE lc_runtimes (
    name     TEXT  PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    -- SHA-256 of the runtime's canonical manifest.
    digest   BYTEA NOT NULL CHECK (octet_length(digest) = 32),
    manifest JSONB NOT NULL
);
CREATE INDEX lc_runtimes_digest ON lc_runtimes (digest);

CREATE TABLE lc_providers (
    provider_id TEXT  PRIMARY KEY CHECK (provider_id ~ '^[a-z0-9-]{1,63}$'),
    url         TEXT  NOT NULL CHECK (octet_length(url) BETWEEN 1 AND 2048),
    -- Ed25519 public key: its evidence verifies with it.
    public_key  BYTEA NOT NULL CHECK (octet_length(public_key) = 32)
);

CREATE SEQUENCE lc_sandbox_lease_ids AS BIGINT;
CREATE SEQUENCE lc_workspace_ids AS BIGINT;

CREATE TABLE lc_execs (
    exec_id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id           BIGINT  NOT NULL REFERENCES lc_tenants (tenant_id),
    -- The canonical identity, fixed at admission (LCS02 below); lease_id
    -- is generation 1's sandbox Lease.
    lease_id            BIGINT  NOT NULL UNIQUE,
    provider_id         TEXT    NOT NULL REFERENCES lc_providers (provider_id),
    runtime_digest      BYTEA   NOT NULL CHECK (octet_length(runtime_digest) = 32),
    workspace_id        BIGINT  NOT NULL UNIQUE,
    shape               TEXT    NOT NULL CHECK (shape IN ('small', 'medium', 'small-net')),
    units               BIGINT  NOT NULL CHECK (units >= 1),
    command             JSONB   NOT NULL CHECK (jsonb_typeof(command) = 'array'
                                                AND jsonb_array_length(command) BETWEEN 1 AND 256),
    timeout_ms          BIGINT  CHECK (timeout_ms >= 1),
    timeout_floor_us    BIGINT,
    timeout_submicro_ns INTEGER CHECK (timeout_submicro_ns BETWEEN 0 AND 999),
    admitted_floor_us   BIGINT  NOT NULL,
    admitted_submicro_ns INTEGER NOT NULL CHECK (admitted_submicro_ns BETWEEN 0 AND 999),
    state               TEXT    NOT NULL CHECK (state IN ('admitted', 'running', 'terminal')),
    terminal_reason     TEXT    CHECK (terminal_reason IN ('exited', 'cancelled', 'expired', 'start_failed')),
    exit_code           INTEGER,
    cancel_requested    BOOLEAN NOT NULL DEFAULT false,
    current_attempt     INTEGER NOT NULL DEFAULT 1 CHECK (current_attempt >= 1),
    CONSTRAINT lc_execs_timeout_pair CHECK (
        (timeout_ms IS NULL) = (timeout_floor_us IS NULL)
        AND (timeout_floor_us IS NULL) = (timeout_submicro_ns IS NULL)),
    CONSTRAINT lc_execs_terminal_reason CHECK (state <> 'terminal' OR terminal_reason IS NOT NULL)
);
CREATE INDEX lc_execs_tenant ON lc_execs (tenant_id, exec_id);
-- A tenant's admission rate reads its newest admissions by cut.
CREATE INDEX lc_execs_tenant_admitted ON lc_execs (tenant_id, admitted_floor_us, admitted_submicro_ns);

CREATE TABLE lc_attempts (
    exec_id    BIGINT  NOT NULL REFERENCES lc_execs (exec_id),
    attempt    INTEGER NOT NULL CHECK (attempt >= 1),
    state      TEXT    NOT NULL CHECK (state IN ('runnable', 'running', 'parked', 'terminal')),
    -- The attempt's current Reservation and Lease generation.
    generation BIGINT  NOT NULL CHECK (generation >= 1),
    PRIMARY KEY (exec_id, attempt)
);

-- A Reservation: the Tollgate grant of the shape's units on the tenant's
-- account for one attempt generation. Returned exactly once, by Tollgate
-- release with consumed 0, in the transaction that commits the destroy
-- proof. The grant's capability is derived, never stored.
CREATE TABLE lc_reservations (
    exec_id              BIGINT  NOT NULL,
    attempt              INTEGER NOT NULL,
    generation           BIGINT  NOT NULL CHECK (generation >= 1),
    tollgate_lease_id    BIGINT  NOT NULL UNIQUE REFERENCES tollgate_leases (lease_id),
    units                BIGINT  NOT NULL CHECK (units >= 1),
    expiry_floor_us      BIGINT  NOT NULL,
    expiry_submicro_ns   INTEGER NOT NULL CHECK (expiry_submicro_ns BETWEEN 0 AND 999),
    state                TEXT    NOT NULL CHECK (state IN ('held', 'returned')),
    returned_floor_us    BIGINT,
    returned_submicro_ns INTEGER CHECK (returned_submicro_ns BETWEEN 0 AND 999),
    PRIMARY KEY (exec_id, attempt, generation),
    FOREIGN KEY (exec_id, attempt) REFERENCES lc_attempts (exec_id, attempt),
    CONSTRAINT lc_reservations_returned CHECK (
        (state = 'returned') = (returned_floor_us IS NOT NULL)
        AND (returned_floor_us IS NULL) = (returned_submicro_ns IS NULL))
);

-- A sandbox Lease: the right to run one provider instance of (attempt,
-- generation) until its expiry on the cut. `evidence` is the validated
-- destroy proof (a provider-signed DSSE envelope) it was released with.
CREATE TABLE lc_sandbox_leases (
    lease_id             BIGINT  PRIMARY KEY,
    exec_id              BIGINT  NOT NULL,
    attempt              INTEGER NOT NULL,
    generation           BIGINT  NOT NULL CHECK (generation >= 1),
    provider_id          TEXT    NOT NULL REFERENCES lc_providers (provider_id),
    state                TEXT    NOT NULL CHECK (state IN ('allocating', 'active', 'release_pending', 'released')),
    expiry_floor_us      BIGINT  NOT NULL,
    expiry_submicro_ns   INTEGER NOT NULL CHECK (expiry_submicro_ns BETWEEN 0 AND 999),
    evidence             JSONB,
    released_floor_us    BIGINT,
    released_submicro_ns INTEGER CHECK (released_submicro_ns BETWEEN 0 AND 999),
    UNIQUE (exec_id, attempt, generation),
    FOREIGN KEY (exec_id, attempt, generation)
        REFERENCES lc_reservations (exec_id, attempt, generation),
    CONSTRAINT lc_sandbox_leases_released CHECK (
        (state = 'released') = (evidence IS NOT NULL)
        AND (state = 'released') = (released_floor_us IS NOT NULL)
        AND (released_floor_us IS NULL) = (released_submicro_ns IS NULL))
);
-- The reconciler's work list: unreleased Leases, soonest expiry first (a
-- renewal moves a Lease to the back, so every Lease comes up in turn).
CREATE INDEX lc_sandbox_leases_due ON lc_sandbox_leases (expiry_floor_us, expiry_submicro_ns, lease_id)
    WHERE state <> 'released';
-- Admission's provider choice counts each provider's unreleased Leases:
-- proportional to the live Leases, not to every Lease ever granted.
CREATE INDEX lc_sandbox_leases_live_by_provider ON lc_sandbox_leases (provider_id)
    WHERE state <> 'released';

-- Generation 1's Lease of every exec exists (checked at commit: the exec
-- row is written before its Lease).
ALTER TABLE lc_execs ADD CONSTRAINT lc_execs_lease
    FOREIGN KEY (lease_id) REFERENCES lc_sandbox_leases (lease_id)
    DEFERRABLE INITIALLY DEFERRED;

-- Output pages: one seq space per (exec, attempt), from 1; the terminal
-- page carries the exit status and no bytes. The digest is checked here
-- as well as in Rust.
CREATE TABLE lc_output_pages (
    exec_id     BIGINT  NOT NULL,
    attempt     INTEGER NOT NULL,
    seq         BIGINT  NOT NULL CHECK (seq >= 1),
    kind        TEXT    NOT NULL CHECK (kind IN ('stdout', 'stderr', 'terminal')),
    bytes       BYTEA   NOT NULL CHECK (octet_length(bytes) <= 65536),
    sha256      BYTEA   NOT NULL CHECK (sha256 = sha256(bytes)),
    exit_code   INTEGER,
    exit_signal INTEGER,
    PRIMARY KEY (exec_id, attempt, seq),
    FOREIGN KEY (exec_id, attempt) REFERENCES lc_attempts (exec_id, attempt),
    CONSTRAINT lc_output_pages_terminal CHECK (
        CASE WHEN kind = 'terminal'
             THEN octet_length(bytes) = 0 AND ((exit_code IS NULL) <> (exit_signal IS NULL))
             ELSE exit_code IS NULL AND exit_signal IS NULL END)
);

-- Operation keys. scope 0 is the administrator's; otherwise the tenant.
-- floor: the cut captured at the terminal transition (certain or not);
-- gc: max(created + ttl, floor + ttl), the earliest cut at which GC may
-- delete the key, and only once its receipt is attached.
CREATE TABLE lc_operations (
    scope               BIGINT  NOT NULL CHECK (scope >= 0),
    op_key              TEXT    NOT NULL CHECK (op_key ~ '^[!-~]{1,255}$'),
    kind                TEXT    NOT NULL CHECK (octet_length(kind) BETWEEN 1 AND 64),
    request_sha256      BYTEA   NOT NULL CHECK (octet_length(request_sha256) = 32),
    result              JSONB   NOT NULL,
    created_floor_us    BIGINT  NOT NULL,
    created_submicro_ns INTEGER NOT NULL CHECK (created_submicro_ns BETWEEN 0 AND 999),
    floor_floor_us      BIGINT  NOT NULL,
    floor_submicro_ns   INTEGER NOT NULL CHECK (floor_submicro_ns BETWEEN 0 AND 999),
    ttl_ns              BIGINT  NOT NULL CHECK (ttl_ns > 0),
    gc_floor_us         BIGINT  NOT NULL,
    gc_submicro_ns      INTEGER NOT NULL CHECK (gc_submicro_ns BETWEEN 0 AND 999),
    receipt_attached    BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (scope, op_key),
    CONSTRAINT lc_operations_floor CHECK (
        (floor_floor_us, floor_submicro_ns) >= (created_floor_us, created_submicro_ns))
);
CREATE INDEX lc_operations_pending_receipt ON lc_operations (floor_floor_us, floor_submicro_ns)
    WHERE NOT receipt_attached;
CREATE INDEX lc_operations_gc ON lc_operations (gc_floor_us, gc_submicro_ns)
    WHERE receipt_attached;

-- LCS01: a deadline (the instant pair in columns TG_ARGV[0], TG_ARGV[1])
-- beyond cut + horizon, once a sampler has claimed. Exact: nanoseconds
-- from the pairs, numeric arithmetic; exactly cut + horizon is accepted.
-- Holds ROW SHARE on the policy table until the transaction ends, so a
-- seal (EXCLUSIVE) waits for every transaction that wrote a deadline
-- under the old horizon.
CREATE FUNCTION lc_deadline_within_horizon() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    rec        jsonb := to_jsonb(NEW);
    cut        tollgate_safetime%ROWTYPE;
    newest_ms  bigint;
    in_force_ms bigint;
    deadline_ns numeric;
    cut_ns     numeric;
    bound_ns   numeric;
BEGIN
    IF rec ->> TG_ARGV[0] IS NULL OR NOT EXISTS (SELECT 1 FROM tollgate_safetime) THEN
        RETURN NEW;
    END IF;
    LOCK TABLE tollgate_safetime_policy IN ROW SHARE MODE;
    SELECT * INTO cut FROM tollgate_safetime s;
    SELECT p.horizon_ms INTO newest_ms FROM tollgate_safetime_policy p ORDER BY p.version DESC LIMIT 1;
    SELECT p.horizon_ms INTO in_force_ms FROM tollgate_safetime_policy p WHERE p.version = cut.policy_version;
    deadline_ns := (rec ->> TG_ARGV[0])::numeric * 1000 + (rec ->> TG_ARGV[1])::numeric;
    cut_ns := cut.cut_floor_us::numeric * 1000 + cut.cut_submicro_ns;
    bound_ns := cut_ns + least(newest_ms, in_force_ms)::numeric * 1000000;
    IF deadline_ns > bound_ns THEN
        RAISE EXCEPTION 'deadline_beyond_horizon: % % % is %, beyond cut % + horizon % = % by %',
            TG_TABLE_NAME, TG_ARGV[0], CASE WHEN TG_OP = 'INSERT' THEN 'of a new row' ELSE 'of an updated row' END,
            tollgate_instant_text(deadline_ns), tollgate_instant_text(cut_ns),
            tollgate_duration_text(least(newest_ms, in_force_ms)::numeric * 1000000),
            tollgate_instant_text(bound_ns), tollgate_duration_text(deadline_ns - bound_ns)
            USING ERRCODE = 'LCS01';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_sandbox_leases_within_horizon
    BEFORE INSERT OR UPDATE OF expiry_floor_us, expiry_submicro_ns ON lc_sandbox_leases
    FOR EACH ROW WHEN (NEW.state <> 'released')
    EXECUTE FUNCTION lc_deadline_within_horizon('expiry_floor_us', 'expiry_submicro_ns');
CREATE TRIGGER lc_reservations_within_horizon
    BEFORE INSERT OR UPDATE OF expiry_floor_us, expiry_submicro_ns ON lc_reservations
    FOR EACH ROW WHEN (NEW.state = 'held')
    EXECUTE FUNCTION lc_deadline_within_horizon('expiry_floor_us', 'expiry_submicro_ns');
CREATE TRIGGER lc_execs_timeout_within_horizon
    BEFORE INSERT OR UPDATE OF timeout_floor_us, timeout_submicro_ns ON lc_execs
    FOR EACH ROW EXECUTE FUNCTION lc_deadline_within_horizon('timeout_floor_us', 'timeout_submicro_ns');
CREATE TRIGGER lc_operations_gc_within_horizon
    BEFORE INSERT OR UPDATE OF gc_floor_us, gc_submicro_ns ON lc_operations
    FOR EACH ROW EXECUTE FUNCTION lc_deadline_within_horizon('gc_floor_us', 'gc_submicro_ns');

-- LCS02: an exec's canonical identity and tenant never change.
CREATE FUNCTION lc_execs_identity_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.exec_id, NEW.tenant_id, NEW.lease_id, NEW.provider_id, NEW.runtime_digest, NEW.workspace_id)
       IS DISTINCT FROM
       (OLD.exec_id, OLD.tenant_id, OLD.lease_id, OLD.provider_id, OLD.runtime_digest, OLD.workspace_id) THEN
        RAISE EXCEPTION 'identity_immutable: exec %''s canonical identity is fixed at admission', OLD.exec_id
            USING ERRCODE = 'LCS02';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_execs_identity_immutable
    BEFORE UPDATE ON lc_execs
    FOR EACH ROW EXECUTE FUNCTION lc_execs_identity_immutable();

-- The initial cut (migration 0018's first claim) may start at database
-- time only when the installation holds no deadline-bearing or
-- idempotency authority. 0018 inventories Tollgate's (active leases,
-- idempotency records); these two triggers add Little Compute's to the
-- same decision, without redefining the claim: unfinished execs,
-- unreleased sandbox Leases, held Reservations and every operation key.
--
-- The first trigger runs when the claim inserts the cut row: it freezes
-- the inventory (SHARE locks, as the claim does for Tollgate's tables,
-- held to the end of the claim's transaction), and if anything is there
-- turns a database-time cut into the quarantined one the claim writes
-- otherwise (the Unix epoch, uncertain, `initial_quarantine`). The second
-- runs when the claim records its evidence: it adds the inventory under
-- `little_compute` and, for a quarantined cut, makes the evidence say so.
-- Both count the same frozen rows, so they agree.
CREATE FUNCTION lc_initial_inventory() RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    LOCK TABLE lc_execs, lc_sandbox_leases, lc_reservations, lc_operations IN SHARE MODE;
    RETURN jsonb_build_object(
        'unfinished_execs', (SELECT count(*) FROM lc_execs e WHERE e.state <> 'terminal'),
        'unreleased_leases', (SELECT count(*) FROM lc_sandbox_leases l WHERE l.state <> 'released'),
        'held_reservations', (SELECT count(*) FROM lc_reservations r WHERE r.state = 'held'),
        'operation_keys', (SELECT count(*) FROM lc_operations),
        'latest_lease_expiry_floor_us',
            (SELECT max(l.expiry_floor_us) FROM lc_sandbox_leases l WHERE l.state <> 'released'));
END $$;

CREATE FUNCTION lc_inventory_holds_authority(inv jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (inv ->> 'unfinished_execs')::bigint > 0
        OR (inv ->> 'unreleased_leases')::bigint > 0
        OR (inv ->> 'held_reservations')::bigint > 0
        OR (inv ->> 'operation_keys')::bigint > 0
$$;

CREATE FUNCTION lc_initial_cut_quarantine() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT NEW.quarantined AND lc_inventory_holds_authority(lc_initial_inventory()) THEN
        NEW.cut_floor_us := 0;
        NEW.cut_submicro_ns := 0;
        NEW.certain := false;
        NEW.uncertain_reason := 'initial_quarantine';
        NEW.quarantined := true;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_initial_cut_quarantine
    BEFORE INSERT ON tollgate_safetime
    FOR EACH ROW EXECUTE FUNCTION lc_initial_cut_quarantine();

CREATE FUNCTION lc_initial_cut_evidence() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    inv jsonb;
BEGIN
    IF NEW.kind NOT IN ('initial_cut', 'initial_quarantine') THEN
        RETURN NEW;
    END IF;
    inv := lc_initial_inventory();
    NEW.detail := NEW.detail || jsonb_build_object('little_compute', inv);
    IF NEW.kind = 'initial_cut' AND lc_inventory_holds_authority(inv) THEN
        NEW.kind := 'initial_quarantine';
        NEW.detail := NEW.detail || jsonb_build_object('cut', 'unix_epoch');
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER lc_initial_cut_evidence
    BEFORE INSERT ON tollgate_safetime_evidence
    FOR EACH ROW EXECUTE FUNCTION lc_initial_cut_evidence();
