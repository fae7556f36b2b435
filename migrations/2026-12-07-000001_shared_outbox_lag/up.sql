-- One count of the outbox lag per database, not one per instance
-- (docs/scaling.md, "One count of the lag per database"). Counting the
-- unpublished rows reads every one of them (and the dead index entries of
-- those published since the last VACUUM); every `run` keeps the lag
-- gauges, so N instances counted it N times. Now the instance whose turn
-- it is (the row's `next_at` passed, and no other holds the row locked)
-- counts, in the transaction that holds the row, and leaves the result
-- here with the time of the next count (database clock); the others read
-- it. A count that dies with its instance leaves the row unlocked and
-- due, so the next instance to look counts.
CREATE TABLE booking_expiration_outbox_lag (
    id                    smallint    PRIMARY KEY CHECK (id = 1),
    unpublished           bigint      NOT NULL,
    oldest_unpublished_at timestamptz,
    parked                bigint      NOT NULL,
    counted_at            timestamptz NOT NULL,
    next_at               timestamptz NOT NULL
);

-- Due at once: the first instance to look counts.
INSERT INTO booking_expiration_outbox_lag
    (id, unpublished, oldest_unpublished_at, parked, counted_at, next_at)
VALUES (1, 0, NULL, 0, '-infinity', '-infinity');
