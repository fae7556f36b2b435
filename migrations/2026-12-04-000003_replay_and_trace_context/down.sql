-- Fails while replay rows share an event id with another row; delete the
-- published replay rows first.
ALTER TABLE booking_expiration_outbox
    ADD CONSTRAINT booking_expiration_outbox_event_id_key UNIQUE (event_id);
DROP INDEX ux_booking_expiration_outbox_event_id_replay_id;
ALTER TABLE booking_expiration_outbox DROP COLUMN replay_id;

ALTER TABLE booking_expiration_audit
    DROP COLUMN ce_source,
    DROP COLUMN property_object_id,
    DROP COLUMN deal_id,
    DROP COLUMN version;
