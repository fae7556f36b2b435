-- The worker's Reserve-phase candidate scan on crm's bookings table: only
-- active rows, so its size follows the active bookings, not the table. The
-- predicate is the domain's phase (src/domain/status.rs) as the repository
-- writes it (src/db/bookings.rs); tests/it/schema.rs compares the two.
--
-- CONCURRENTLY, outside a transaction (metadata.toml): the build takes a
-- SHARE UPDATE EXCLUSIVE lock, which no INSERT, UPDATE or DELETE waits for.
-- It scans the table twice and waits for transactions older than each
-- scan to end; crm keeps writing throughout.
--
-- IF NOT EXISTS: a database that applied the first release of
-- 2026-12-01-000001 already has this index (built there in a transaction);
-- it is left as it is. A build that was interrupted (cancelled, timed out,
-- connection lost) leaves an INVALID index under this name and this
-- migration unrecorded; the next `migrate` drops that index CONCURRENTLY
-- before running this migration again (src/db/migrate.rs), because IF NOT
-- EXISTS alone would keep the invalid one.
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_bookings_reserve_expires_at
    ON bookings (reserve_expires_at)
    WHERE status IN ('Reserved', 'AwaitingPayment');
