-- Back to jsonb headers and the audit's primary key. (The unique index on
-- (event_id, replay_id) is the replay migration's and stays.)
ALTER TABLE booking_expiration_outbox ALTER COLUMN headers TYPE jsonb USING headers::jsonb;
ALTER TABLE booking_expiration_audit
    ADD CONSTRAINT booking_expiration_audit_pkey PRIMARY KEY (id);
