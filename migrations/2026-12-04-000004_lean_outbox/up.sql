-- Cheaper writes: each expiry inserts one audit row and one outbox row, and
-- every index, constraint and column type on them is paid on each insert.
-- What each item costs was measured one at a time on a scratch copy (the
-- bench's `schema_cost` figure, docs/benchmarks.md): kept is only what a
-- query or a guarantee needs, with the reason beside it. Only constraints,
-- indexes and a column type change here; no column is dropped (the audit
-- row and the booking are what an event is rebuilt from).

-- booking_expiration_audit ----------------------------------------------
-- Dropped: the primary key on `id`. No statement looks a row up by `id`
-- and nothing references it; its index was paid on every insert (about
-- -1.5% server CPU and -66 bytes of WAL per expiry without it). The
-- column and its identity stay (insertion order, for readers).
ALTER TABLE booking_expiration_audit DROP CONSTRAINT booking_expiration_audit_pkey;
-- Kept: ix_booking_expiration_audit_booking_id, the one index of the
-- table: an event is rebuilt from the booking and its audit rows, found
-- by booking id.
-- Kept: NOT NULL on every column (the measurement found no cost in them).

-- booking_expiration_outbox ---------------------------------------------
-- Kept: ux_booking_expiration_outbox_event_id_replay_id (the replay
-- migration's unique index on (event_id, replay_id), which replaced
-- UNIQUE (event_id)). It is the largest single cost among the indexes (a
-- random uuid index: about 4% server CPU per expiry in the measurement)
-- and it earns it: originals stay unique per event id whatever a bug or a
-- manual insert does, a replay adds at most one row per event (a stopped
-- replay re-run with its id is idempotent through it), and republish's
-- "is this event still waiting?" lookup by event id is an index scan.

-- Changed: headers jsonb -> json. The headers were the costliest item
-- measured (four keys instead of eight: -6% server CPU per expiry). The
-- worker sends them as text: jsonb parses and re-encodes every object on
-- insert, json only checks the syntax and stores the text the worker
-- wrote, so the row keeps exactly the bytes that were committed. With this
-- migration the worker's server CPU per expiry fell 11%, its WAL 8%. The publisher reads the object as before (its
-- header order is the name order either way). Rewrites the table under a
-- brief exclusive lock; the outbox holds the backlog and retained rows only.
ALTER TABLE booking_expiration_outbox ALTER COLUMN headers TYPE json USING headers::json;

-- Kept: the primary key on `id` (a sequential bigint, cheap to insert):
-- the publisher marks, parks and deletes claimed rows by id, and the
-- retention sweep deletes by id.
-- Kept: ix_booking_expiration_outbox_unpublished (id) WHERE unpublished
-- and not parked: the claim's index, `ORDER BY id`, oldest first.
-- Kept: ix_booking_expiration_outbox_published_at and
-- ix_booking_expiration_outbox_parked: a new row matches neither
-- predicate, so an insert only tests them; they serve retention and the
-- parked rows (`status`, the gauge, `outbox retry`).
-- Kept: the NOTIFY trigger, once per statement (once per batch, not per
-- row; no cost measurable): publishers wake on commit instead of polling.
