-- Every lease has an owner (docs/reliability.md, "Every row has one
-- owner"): claimed_by is the token of the publisher instance that holds the
-- row's lease, written with the lease (by a claim, or by the expiry that
-- writes its rows leased to its own publisher). Renewing, releasing,
-- marking published and parking touch only the holder's rows, so an
-- instance that was paused past its lease (a frozen VM, SIGSTOP, a long
-- stall) and comes back never renews, clears or marks rows another
-- instance has claimed since.
--
-- Nullable without a default: only the catalog changes (no rewrite). It is
-- in no index, so setting it with the lease keeps the update HOT.
ALTER TABLE booking_expiration_outbox
    ADD COLUMN claimed_by uuid NULL;
