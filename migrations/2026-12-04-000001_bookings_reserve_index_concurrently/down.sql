-- Drops only the worker's own index, CONCURRENTLY (no write on crm's table
-- waits for it). The bookings table and its rows stay.
DROP INDEX CONCURRENTLY IF EXISTS ix_bookings_reserve_expires_at;
