-- Republish (`booking-expiration republish`) rebuilds an expired booking's
-- event from the booking and its audit record, byte for byte. The audit
-- record gains what the event was built from and that the booking may not
-- keep: the version after the transition (the event id is derived from it),
-- the deal and property object, and the `ce_source` in force. NULL in
-- records written before this migration: republish then falls back to the
-- booking row and the configured `ce_source`.
ALTER TABLE booking_expiration_audit
    ADD COLUMN version            bigint NULL,
    ADD COLUMN deal_id            uuid   NULL,
    ADD COLUMN property_object_id uuid   NULL,
    ADD COLUMN ce_source          text   NULL;

-- A replayed event keeps its event id (ce_id) so consumers deduplicate it,
-- while the original row may still be retained: replay rows are told apart
-- by the replay that wrote them. Originals (replay_id NULL) stay unique per
-- event id, exactly as before; each replay adds at most one row per event
-- (so re-running a stopped replay with the same replay id is idempotent).
-- The index leads with event_id, so lookups by event id stay index scans.
ALTER TABLE booking_expiration_outbox
    ADD COLUMN replay_id uuid NULL;

CREATE UNIQUE INDEX ux_booking_expiration_outbox_event_id_replay_id
    ON booking_expiration_outbox (event_id, replay_id) NULLS NOT DISTINCT;

ALTER TABLE booking_expiration_outbox
    DROP CONSTRAINT booking_expiration_outbox_event_id_key;
