-- A row the broker will never accept as it is (MESSAGE_TOO_LARGE on its
-- own, INVALID_RECORD, CORRUPT_MESSAGE) is parked: set aside with the
-- broker's answer and the time, so the rows behind it keep flowing.
-- `booking-expiration outbox retry` clears both columns to send it again.
-- Retention deletes published rows only, so a parked row stays until an
-- operator deals with it.
ALTER TABLE booking_expiration_outbox
    ADD COLUMN parked_at   timestamptz NULL,
    ADD COLUMN park_reason text        NULL;

-- The claim scan must skip parked rows. Its predicate is part of the
-- partial index, not a filter on top of it: otherwise every claim (and the
-- lag count) would walk past each parked row again, and a planner may give
-- up the index once parked rows pile up. The index stays as small as the
-- backlog it serves. Rebuilt in this migration's transaction (a brief
-- lock on the outbox; the index holds unpublished rows only, so few rows).
DROP INDEX ix_booking_expiration_outbox_unpublished;
CREATE INDEX ix_booking_expiration_outbox_unpublished
    ON booking_expiration_outbox (id)
    WHERE published_at IS NULL AND parked_at IS NULL;

-- Parked rows, for `status`, the parked gauge and `outbox retry --all-parked`.
CREATE INDEX ix_booking_expiration_outbox_parked
    ON booking_expiration_outbox (id)
    WHERE parked_at IS NOT NULL;
