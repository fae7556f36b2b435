-- The worker's Booking-phase candidate scan on crm's bookings table (see
-- 2026-12-04-000001 for why CONCURRENTLY, IF NOT EXISTS, and how an
-- interrupted build is recovered).
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_bookings_booking_expires_at
    ON bookings (booking_expires_at)
    WHERE status = 'Booked';
