ALTER TABLE booking_expiration_outbox RESET (fillfactor);
ALTER TABLE booking_expiration_outbox
    DROP COLUMN claimed_until,
    DROP COLUMN key_hash;
