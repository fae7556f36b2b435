-- The crm bookings table, exactly as the operator contract describes it.
-- IF NOT EXISTS: in the crm deployment the table already exists and is
-- owned by crm; a standalone deployment gets it from here.
--
-- The worker's two partial indexes on this table are NOT built here any
-- more: 2026-12-04-000001 and 2026-12-04-000002 build them with CREATE
-- INDEX CONCURRENTLY, outside a transaction, so crm's writes are never
-- blocked while they build. The first release of this migration built them
-- here, inside its transaction: that holds a SHARE lock on crm's table for
-- the whole build, and every INSERT/UPDATE/DELETE on bookings waits (655 ms
-- for a single-row update on a 1,000,000-row table).
--
-- Why editing an applied migration is safe here, and only here: diesel
-- records the versions it applied, not their text, so this edit never
-- reaches a database that already applied this migration. Such a database
-- keeps the two indexes that the first release built; the concurrent
-- migrations find them (IF NOT EXISTS) and leave them as they are. A
-- database that has not applied it gets the table (when missing) here and
-- the indexes from the concurrent migrations. Both histories end with the
-- same two valid indexes under the same names and definitions
-- (tests/it/live_migration.rs checks the upgrade path, tests/it/schema.rs
-- the definitions on a fresh database). The text
-- the first release ran is in the repository's history.
CREATE TABLE IF NOT EXISTS bookings (
    id                 uuid        PRIMARY KEY,
    tenant_id          uuid        NOT NULL,
    deal_id            uuid        NULL,
    property_object_id uuid        NULL,
    status             text        NOT NULL,
    reserve_expires_at timestamptz NULL,
    booking_expires_at timestamptz NULL,
    expired_at         timestamptz NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    version            bigint      NOT NULL DEFAULT 1
);
