-- The grant policy in force for every process sharing this database.
-- Reclaim grace must be the same in all of them (a process with a smaller
-- grace would reclaim early), so a process whose configuration differs
-- refuses to start, and changes are explicit operator commands recorded in
-- tollgate_policy_changes. Durations are exact: whole seconds plus
-- nanoseconds of the same sign, as jiff's SignedDuration holds them; grace
-- may be as large as SignedDuration::MAX.
CREATE TABLE tollgate_policy (
    singleton           BOOLEAN PRIMARY KEY DEFAULT true CHECK (singleton),
    max_ttl_secs        BIGINT  NOT NULL,
    max_ttl_nanos       INTEGER NOT NULL,
    reclaim_grace_secs  BIGINT  NOT NULL,
    reclaim_grace_nanos INTEGER NOT NULL,
    CONSTRAINT tollgate_policy_max_ttl_positive
        CHECK (max_ttl_nanos BETWEEN 0 AND 999999999 AND (max_ttl_secs > 0 OR (max_ttl_secs = 0 AND max_ttl_nanos > 0))),
    CONSTRAINT tollgate_policy_grace_nonnegative
        CHECK (reclaim_grace_secs >= 0 AND reclaim_grace_nanos BETWEEN 0 AND 999999999)
);

-- One row per recorded policy: the first start that recorded it (old
-- values NULL) and every operator change. recorded_at is the database's
-- transaction time, kept for operators only; no rule ever reads it.
CREATE TABLE tollgate_policy_changes (
    change_id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    changed_by              TEXT        NOT NULL CHECK (char_length(changed_by) BETWEEN 1 AND 200),
    recorded_at             TIMESTAMPTZ NOT NULL DEFAULT transaction_timestamp(),
    old_max_ttl_secs        BIGINT,
    old_max_ttl_nanos       INTEGER,
    old_reclaim_grace_secs  BIGINT,
    old_reclaim_grace_nanos INTEGER,
    new_max_ttl_secs        BIGINT      NOT NULL,
    new_max_ttl_nanos       INTEGER     NOT NULL,
    new_reclaim_grace_secs  BIGINT      NOT NULL,
    new_reclaim_grace_nanos INTEGER     NOT NULL
);
