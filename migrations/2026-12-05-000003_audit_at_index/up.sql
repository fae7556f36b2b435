-- `republish --expired-from/--expired-to`: the window's records, read once
-- per replay to find the first and last audit id of the window; the pages
-- then walk the id index between the two.
--
-- CONCURRENTLY, outside a transaction (metadata.toml): the worker writes an
-- audit row with every expiry, and a plain CREATE INDEX would hold its
-- writes for the whole build (tens of seconds on a year of audit trail,
-- docs/runbooks/migrations.md). IF NOT EXISTS and the recovery of an
-- interrupted (INVALID) build as for the bookings indexes
-- (2026-12-04-000001; src/db/migrate.rs).
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_booking_expiration_audit_at_id
    ON booking_expiration_audit (at, id);
