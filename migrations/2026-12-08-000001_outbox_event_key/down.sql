-- The outbox's own unique index again, built inside the transaction (a
-- SHARE lock on the outbox for the build: inserts wait), then the table
-- that replaced it.
CREATE UNIQUE INDEX ux_booking_expiration_outbox_event_id_replay_id
    ON booking_expiration_outbox (event_id, replay_id) NULLS NOT DISTINCT;

DROP TABLE booking_expiration_outbox_event;
