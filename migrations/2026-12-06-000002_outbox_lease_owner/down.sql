ALTER TABLE booking_expiration_outbox
    DROP COLUMN claimed_by;
