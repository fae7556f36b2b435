DROP INDEX ix_booking_expiration_outbox_parked;
DROP INDEX ix_booking_expiration_outbox_unpublished;
CREATE INDEX ix_booking_expiration_outbox_unpublished
    ON booking_expiration_outbox (id)
    WHERE published_at IS NULL;
ALTER TABLE booking_expiration_outbox
    DROP COLUMN park_reason,
    DROP COLUMN parked_at;
