DROP TRIGGER IF EXISTS booking_expiration_outbox_notify ON booking_expiration_outbox;
DROP FUNCTION IF EXISTS booking_expiration_outbox_notify();
DROP TABLE IF EXISTS booking_expiration_outbox;
DROP TABLE IF EXISTS booking_expiration_audit;
