DROP TRIGGER booking_expiration_outbox_notify ON booking_expiration_outbox;
CREATE TRIGGER booking_expiration_outbox_notify
    AFTER INSERT ON booking_expiration_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION booking_expiration_outbox_notify();

CREATE INDEX ix_booking_expiration_outbox_unpublished
    ON booking_expiration_outbox (id)
    WHERE published_at IS NULL AND parked_at IS NULL;
DROP INDEX ix_booking_expiration_outbox_claim;
ALTER TABLE booking_expiration_outbox
    DROP COLUMN kafka_partition,
    DROP COLUMN partition_count;
DROP TABLE booking_expiration_topic_layout;
