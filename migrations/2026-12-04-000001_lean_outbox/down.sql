-- Back to jsonb headers, the UNIQUE (event_id) and the audit's primary key.
-- The unique constraint cannot come back over two rows of one event id
-- (a republish enqueues the id again): extra copies already published are
-- removed first (the oldest row of each id stays); an unpublished copy
-- makes this fail and roll back, so drain the outbox and run it again.
DELETE FROM booking_expiration_outbox o
 WHERE o.published_at IS NOT NULL
   AND EXISTS (SELECT 1 FROM booking_expiration_outbox p
                WHERE p.event_id = o.event_id AND p.id < o.id);
ALTER TABLE booking_expiration_outbox ALTER COLUMN headers TYPE jsonb USING headers::jsonb;
ALTER TABLE booking_expiration_outbox
    ADD CONSTRAINT booking_expiration_outbox_event_id_key UNIQUE (event_id);
ALTER TABLE booking_expiration_audit
    ADD CONSTRAINT booking_expiration_audit_pkey PRIMARY KEY (id);
