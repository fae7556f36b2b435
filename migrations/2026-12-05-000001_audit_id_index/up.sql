-- `republish` pages through the audit trail in id order (its resume cursor,
-- `--after`, is an audit id). A window's pages walk this index from the
-- window's first id to its last (both found by the (at, id) index of
-- 2026-12-05-000003), so each page reads about what it returns. The
-- lean_outbox migration dropped the primary key on id, and with it the only
-- index a page could walk; this one is not unique (nothing needs that). Its
-- cost per expiry is small: an id is the largest so far, so every insert
-- goes to the right edge of the index (docs/benchmarks.md, schema cost).
--
-- CONCURRENTLY, outside a transaction (metadata.toml): the worker writes an
-- audit row with every expiry, and a plain CREATE INDEX would hold its
-- writes for the whole build (tens of seconds on a year of audit trail,
-- docs/runbooks/migrations.md). IF NOT EXISTS and the recovery of an
-- interrupted (INVALID) build as for the bookings indexes
-- (2026-12-04-000001; src/db/migrate.rs).
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_booking_expiration_audit_id
    ON booking_expiration_audit (id);
