-- One instance at a time wakes at each deadline (docs/scaling.md,
-- "Instances share the wake-ups"): the waker. The others run their
-- interval tick only, and cycles right after the waker's when it says it
-- has due rows left (`backlog`), so N instances cost the database what one
-- does, and the rows stay divided by SKIP LOCKED (this is no lock on them).
--
-- One row: the waker's token and how long its lease lasts (database
-- clock). The waker renews it a few times a second; an instance takes it
-- when it ran out (the waker stopped, crashed or froze), so a waker that
-- stops is replaced within a second.
CREATE TABLE booking_expiration_waker (
    id      smallint    PRIMARY KEY CHECK (id = 1),
    owner   uuid        NOT NULL,
    until   timestamptz NOT NULL,
    backlog boolean     NOT NULL
);
