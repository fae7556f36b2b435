-- A claim whose cost is proportional to what it takes, not to the backlog
-- (docs/scaling.md, "The claim's cost").
--
-- booking_expiration_topic_layout: each topic's partition count as the
-- publishers last read it from the brokers' metadata (written when it
-- changes). A writer of outbox rows (the expiry, republish) reads it in the
-- same statement, so every row is born with its Kafka partition.
--
-- partition_count, kafka_partition: the layout the row was written for
-- (NULL: the writer knew none) and the row's partition in it, the Java
-- partitioner's (key_hash % partition_count). A claim asks each partition
-- for its own rows through ix_booking_expiration_outbox_claim, which starts
-- at that partition's oldest row: the rows of other partitions, of a
-- partition that cannot be written, and of a backlog of any size are never
-- walked. Rows written for another count (the topic grew, or was created
-- again) or for none are claimed apart, in the index's order, and routed
-- again by the publisher.
--
-- The columns are nullable without a default (the catalog only); the index
-- holds unpublished, unparked rows, as the claim's old index did.
CREATE TABLE booking_expiration_topic_layout (
    topic      text        PRIMARY KEY,
    partitions integer     NOT NULL CHECK (partitions > 0),
    read_at    timestamptz NOT NULL
);

ALTER TABLE booking_expiration_outbox
    ADD COLUMN partition_count integer NULL,
    ADD COLUMN kafka_partition integer NULL;

CREATE INDEX ix_booking_expiration_outbox_claim
    ON booking_expiration_outbox (topic, partition_count, kafka_partition, id)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- It replaces the claim's old index (on id alone, same predicate): the lag
-- count reads the new one, and an insert still maintains one index of
-- unpublished rows.
DROP INDEX ix_booking_expiration_outbox_unpublished;

-- NOTIFY wakes publishers for rows no publisher holds: rows the expiry
-- writes leased to its own publisher are handed to it in process, and a
-- notification would wake every instance for nothing. A row trigger whose
-- WHEN the server checks without calling the function: leased rows cost
-- nothing; PostgreSQL sends one notification per transaction for equal
-- ones, however many rows fire it.
DROP TRIGGER booking_expiration_outbox_notify ON booking_expiration_outbox;
CREATE TRIGGER booking_expiration_outbox_notify
    AFTER INSERT ON booking_expiration_outbox
    FOR EACH ROW WHEN (NEW.claimed_until IS NULL)
    EXECUTE FUNCTION booking_expiration_outbox_notify();
