-- A sealed horizon covers every active lease.
--
-- Every active lease's expiry + reclaim_grace lies within cut + horizon
-- (0019's TGS12 holds each lease write to it). Sealing a horizon shorter
-- than an active lease still needs would break that invariant for the
-- leases granted before the seal: after a restore or a failover, the
-- quarantine runs for the new, shorter horizon, and a lease lost with the
-- old primary could still be held when fresh authority over the same units
-- is issued. So the database refuses such a seal (TGS07, the same code as
-- a horizon below the grant policy): it names the lease, its due instant
-- and the shortest horizon that would cover it. Wait for the lease to
-- settle, or seal at least that horizon.
--
-- The base is the persisted cut once a sampler has claimed, else the
-- database's time (the first claim starts the cut there). Instants are
-- compared as exact integer nanoseconds, nothing rounded; a due instant
-- exactly at base + horizon is covered.
--
-- The seal already holds tollgate_safetime_policy in EXCLUSIVE mode, and
-- every lease write takes ROW SHARE on it first (0019), so no lease write
-- runs between this check and the seal's commit.
CREATE FUNCTION tollgate_seal_covers_active_leases() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    base_ns   numeric;
    grace_ns  numeric;
    expiry_ns numeric;
    due_ns    numeric;
    bound_ns  numeric;
    lid       bigint;
BEGIN
    SELECT s.cut_floor_us::numeric * 1000 + s.cut_submicro_ns INTO base_ns
      FROM tollgate_safetime s;
    IF NOT FOUND THEN
        base_ns := floor(extract(epoch FROM clock_timestamp()) * 1000000)::numeric * 1000;
    END IF;
    SELECT l.lease_id, l.expiry_floor_us::numeric * 1000 + l.expiry_submicro_ns
      INTO lid, expiry_ns
      FROM tollgate_leases l
     WHERE l.state = 'active'
     ORDER BY l.expiry_floor_us DESC, l.expiry_submicro_ns DESC
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    SELECT p.reclaim_grace_secs::numeric * 1000000000 + p.reclaim_grace_nanos INTO grace_ns
      FROM tollgate_policy p WHERE p.singleton;
    IF NOT FOUND THEN
        grace_ns := 0;
    END IF;
    due_ns := expiry_ns + grace_ns;
    bound_ns := base_ns + NEW.horizon_ms::numeric * 1000000;
    IF due_ns > bound_ns THEN
        RAISE EXCEPTION 'horizon_below_policy: horizon % ms does not cover active lease %: its expiry % plus the recorded reclaim_grace % is %, beyond % % + horizon = % by %; wait until it settles, or seal a horizon of at least % ms',
            NEW.horizon_ms, lid, tollgate_instant_text(expiry_ns), tollgate_duration_text(grace_ns),
            tollgate_instant_text(due_ns),
            CASE WHEN EXISTS (SELECT 1 FROM tollgate_safetime) THEN 'cut' ELSE 'database time' END,
            tollgate_instant_text(base_ns), tollgate_instant_text(bound_ns),
            tollgate_duration_text(due_ns - bound_ns),
            ceil((due_ns - base_ns) / 1000000)
            USING ERRCODE = 'TGS07';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tollgate_seal_covers_active_leases
    BEFORE INSERT ON tollgate_safetime_policy
    FOR EACH ROW EXECUTE FUNCTION tollgate_seal_covers_active_leases();
