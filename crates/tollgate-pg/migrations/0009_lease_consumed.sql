-- Units charged at settlement; NULL while the lease is active.
ALTER TABLE tollgate_leases ADD COLUMN consumed BIGINT;
UPDATE tollgate_leases
   SET consumed = CASE state WHEN 'reclaimed' THEN units WHEN 'active' THEN NULL ELSE 0 END;
