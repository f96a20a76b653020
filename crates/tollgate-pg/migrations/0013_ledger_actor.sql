-- Who caused each ledger entry.
ALTER TABLE tollgate_ledger ADD COLUMN actor TEXT;
UPDATE tollgate_ledger
   SET actor = CASE kind WHEN 'deposit' THEN 'operator' WHEN 'reclaim' THEN 'reclaimer' ELSE 'holder' END;
ALTER TABLE tollgate_ledger
    ALTER COLUMN actor SET NOT NULL,
    ADD CONSTRAINT tollgate_ledger_actor CHECK (actor IN ('operator', 'holder', 'reclaimer'));
