-- Fencing tokens: issued by the database, strictly increasing across every
-- grant and renewal of the store.
CREATE SEQUENCE tollgate_fence_seq AS BIGINT MINVALUE 1 START WITH 1;
ALTER TABLE tollgate_leases ADD COLUMN fence BIGINT;
UPDATE tollgate_leases
   SET fence = numbered.fence
  FROM (SELECT lease_id, nextval('tollgate_fence_seq') AS fence
          FROM (SELECT lease_id FROM tollgate_leases ORDER BY lease_id) ordered) numbered
 WHERE tollgate_leases.lease_id = numbered.lease_id;
ALTER TABLE tollgate_leases ALTER COLUMN fence SET NOT NULL;
