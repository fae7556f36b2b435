-- The publisher as a pipeline (docs/design.md, "The publisher"): rows are
-- reserved with a lease instead of row locks held across the Kafka call,
-- so no transaction waits on Kafka.
--
-- key_hash: the Java partitioner's positive murmur2 of message_key, written
-- with the row, so a claim can leave out the rows of partitions that cannot
-- take more (`key_hash % partitions`) and a partition that stays unwritable
-- never fills a claim. NULL on rows written before this migration: they
-- are never left out.
--
-- claimed_until: the lease, on the database's clock. A claim takes only
-- rows whose lease is absent or over; the publisher renews the leases of
-- rows it still holds and clears them when it stops. It is the last column
-- of the row and in no index or index predicate, so setting it is a HOT
-- update where the page has room, and its WAL record carries little more
-- than the changed bytes.
--
-- Both columns are nullable without a default: adding them changes only the
-- catalog (a brief lock, no rewrite of the table).
--
-- fillfactor 70: pages filled from now on keep 30% free, so the lease's new
-- row version (claimed_until is in no index) can stay on its page, a HOT
-- update. The bench's `outbox_cost` figure measured the publisher's WAL per
-- event at 2,479 bytes at fillfactor 100 and 1,261 at 70 (1,258 before the
-- leases), for about a third more pages. It applies to new pages only: no
-- rewrite, no lock beyond the catalog's.
ALTER TABLE booking_expiration_outbox
    ADD COLUMN key_hash integer NULL,
    ADD COLUMN claimed_until timestamptz NULL;
ALTER TABLE booking_expiration_outbox SET (fillfactor = 70);
