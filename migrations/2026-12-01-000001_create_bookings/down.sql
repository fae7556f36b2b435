DROP INDEX IF EXISTS ix_bookings_booking_expires_at;
DROP INDEX IF EXISTS ix_bookings_reserve_expires_at;
DROP TABLE IF EXISTS bookings;
