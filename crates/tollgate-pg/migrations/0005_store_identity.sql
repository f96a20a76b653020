-- The store's random 128-bit identity, mixed into every lease capability so
-- that a capability of one store never verifies in another that shares the
-- key. Generated once, here, so every process sharing the database derives
-- the same capabilities and they survive restarts and upgrades.
CREATE TABLE tollgate_store (
    singleton BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    store_id  BYTEA   NOT NULL CHECK (octet_length(store_id) = 16)
);
INSERT INTO tollgate_store (singleton, store_id) VALUES (true, uuid_send(gen_random_uuid()));
