-- One row per status transition made by the worker.
CREATE TABLE booking_expiration_audit (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    booking_id     uuid        NOT NULL,
    tenant_id      uuid        NOT NULL,
    from_status    text        NOT NULL,
    to_status      text        NOT NULL,
    actor          text        NOT NULL,
    correlation_id uuid        NOT NULL,
    at             timestamptz NOT NULL
);

CREATE INDEX ix_booking_expiration_audit_booking_id
    ON booking_expiration_audit (booking_id);

-- Transactional outbox: written in the expiring transaction, drained by
-- the publisher. The payload and headers are final bytes, so a republish
-- sends exactly what was committed.
CREATE TABLE booking_expiration_outbox (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       uuid        NOT NULL UNIQUE,
    topic          text        NOT NULL,
    message_key    text        NOT NULL,
    payload        bytea       NOT NULL,
    headers        jsonb       NOT NULL,
    correlation_id uuid        NOT NULL,
    tenant_id      uuid        NOT NULL,
    created_at     timestamptz NOT NULL,
    published_at   timestamptz NULL
);

-- The publisher's claim scan: unpublished rows only, oldest first.
CREATE INDEX ix_booking_expiration_outbox_unpublished
    ON booking_expiration_outbox (id)
    WHERE published_at IS NULL;

-- The retention sweep over published rows.
CREATE INDEX ix_booking_expiration_outbox_published_at
    ON booking_expiration_outbox (published_at)
    WHERE published_at IS NOT NULL;

-- Wake publishers when outbox rows commit (NOTIFY is delivered at commit,
-- never on rollback). Polling remains the fallback.
CREATE FUNCTION booking_expiration_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('booking_expiration_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER booking_expiration_outbox_notify
    AFTER INSERT ON booking_expiration_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION booking_expiration_outbox_notify();
