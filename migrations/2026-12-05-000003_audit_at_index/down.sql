-- Drops only this index, CONCURRENTLY (no expiry waits for it).
DROP INDEX CONCURRENTLY IF EXISTS ix_booking_expiration_audit_at_id;
