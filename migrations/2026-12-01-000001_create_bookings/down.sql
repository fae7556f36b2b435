-- Removes only what this worker owns: its two partial indexes. The
-- bookings table belongs to crm (the up migration creates it only when it
-- is missing) and stays, with its rows, whatever this revert does.
DROP INDEX IF EXISTS ix_bookings_booking_expires_at;
DROP INDEX IF EXISTS ix_bookings_reserve_expires_at;
