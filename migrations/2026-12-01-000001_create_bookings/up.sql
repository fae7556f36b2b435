-- The crm bookings table, exactly as the operator contract describes it.
-- IF NOT EXISTS: in the crm deployment the table already exists and is
-- owned by crm; a standalone deployment gets it from here.
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

-- The worker's candidate scans: each index holds only active rows, so
-- its size follows the active bookings, not the table. The predicates are
-- the domain's phases (src/domain/status.rs) as the repository writes
-- them (src/db/bookings.rs); tests/schema.rs compares the two.
CREATE INDEX IF NOT EXISTS ix_bookings_reserve_expires_at
    ON bookings (reserve_expires_at)
    WHERE status IN ('Reserved', 'AwaitingPayment');

CREATE INDEX IF NOT EXISTS ix_bookings_booking_expires_at
    ON bookings (booking_expires_at)
    WHERE status = 'Booked';
