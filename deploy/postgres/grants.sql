-- The grants of booking-expiration's worker role, exactly what its commands
-- need: run, once, status, republish and outbox retry (docs/security.md,
-- "Least privilege"). Run as the owner role (the one `migrate` ran as),
-- after `migrate`. The role name is `booking_expiration`: rename it here
-- if yours differs.
--
-- tests/it/privileges.rs applies this file to a role that has nothing
-- else, runs every command with it, and takes each grant away in turn;
-- src/db/privileges.rs checks the same list when a command starts.

-- crm's table: read it, and write only the four columns an expiry sets.
-- Never INSERT, DELETE, TRUNCATE, ALTER or ownership.
GRANT SELECT ON bookings TO booking_expiration;
GRANT UPDATE (status, expired_at, updated_at, version) ON bookings TO booking_expiration;

-- The worker's audit trail: written by an expiry, read by republish.
GRANT INSERT, SELECT ON booking_expiration_audit TO booking_expiration;

-- The outbox: written by an expiry and by republish; claimed, marked,
-- parked and deleted (retention) by the publisher; read by status; put
-- back by outbox retry.
GRANT INSERT, SELECT, UPDATE, DELETE ON booking_expiration_outbox TO booking_expiration;

-- The outbox rows' event records (which event, which replay): written with
-- each outbox row by an expiry and by republish, read by republish (is the
-- event still waiting?) and by the publisher's deletes (retention), which
-- delete them with their rows.
GRANT INSERT, SELECT, DELETE ON booking_expiration_outbox_event TO booking_expiration;

-- Topics' partition counts: written by the publisher when it reads a
-- topic's metadata, read by every writer of outbox rows (each new row gets
-- its partition).
GRANT SELECT, INSERT, UPDATE ON booking_expiration_topic_layout TO booking_expiration;

-- The outbox lag gauges' shared count (one row, written by `migrate`):
-- read by every `run`, updated by the one whose turn it is to count.
GRANT SELECT, UPDATE ON booking_expiration_outbox_lag TO booking_expiration;

-- The deadline waker's lease (one row): taken, renewed and given up by the
-- expiry of `run`.
GRANT SELECT, INSERT, UPDATE, DELETE ON booking_expiration_waker TO booking_expiration;
