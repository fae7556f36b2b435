-- An event's uniqueness is written once, beside the outbox, instead of in
-- an index of the outbox (docs/scaling.md, "Where the large drain spends
-- it"). The unique index on the outbox's (event_id, replay_id) is keyed by
-- a random uuid, and PostgreSQL adds an entry to every index of a table on
-- each update that cannot stay on its page (HOT): every mark of a published
-- row (published_at is indexed, so a mark is never HOT) and most leases
-- added an entry there, at a random place in a tree that grows with the
-- backlog. A drain of 200,000 rows paid for it with 1.34x the CPU per
-- event of a drain of 20,000; without that index, 1.11x.
--
-- booking_expiration_outbox_event holds one row per outbox row: which
-- event it carries and which replay wrote it (NULL: the original). Rows
-- are inserted with their outbox row, by the same statement, and deleted
-- with it; never updated, so the unique index gets one entry per event.
-- Originals stay unique per event id and a replay adds at most one row per
-- event, as before; republish's "is this event still waiting?" goes from
-- here to the outbox row by `outbox_id`.
CREATE TABLE booking_expiration_outbox_event (
    event_id  uuid   NOT NULL,
    replay_id uuid   NULL,
    outbox_id bigint NOT NULL
);

-- The rows already in the outbox. Rows an instance of the earlier release
-- writes after this (it does not know this table) get none: until they do,
-- the uniqueness of their events rests on the expiring statement alone
-- (one transition per booking version), and republish may enqueue such an
-- event while its row still waits (a duplicate with the same ce_id). The
-- runbook (docs/runbooks/migrations.md) gives the clean-up to run once the
-- rollout is done, which records them.
INSERT INTO booking_expiration_outbox_event (event_id, replay_id, outbox_id)
SELECT event_id, replay_id, id FROM booking_expiration_outbox;

CREATE UNIQUE INDEX ux_booking_expiration_outbox_event
    ON booking_expiration_outbox_event (event_id, replay_id) NULLS NOT DISTINCT;

-- Last: an ACCESS EXCLUSIVE lock on the outbox, held from here to the
-- commit, an instant.
DROP INDEX ux_booking_expiration_outbox_event_id_replay_id;
