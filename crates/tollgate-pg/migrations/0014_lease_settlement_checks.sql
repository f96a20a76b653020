-- A lease is active exactly while nothing has been charged for it, and a
-- settlement never charges more than the lease held.
ALTER TABLE tollgate_leases
    ADD CONSTRAINT tollgate_leases_consumed_iff_settled
        CHECK ((state = 'active') = (consumed IS NULL)),
    ADD CONSTRAINT tollgate_leases_consumed_range
        CHECK (consumed IS NULL OR (consumed >= 0 AND consumed <= units));
