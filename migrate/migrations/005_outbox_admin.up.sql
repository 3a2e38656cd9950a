-- Operator actions on outbox events (outbox.Admin, `idem outbox requeue |
-- discard`, the console).
--
-- DISCARDED is a terminal state set by an operator on a DEAD event that
-- must never be delivered. It counts as done for the order of its
-- aggregate (the relay's head check treats it like PUBLISHED), so the
-- events it held back flow again; the row stays, with its payload, for the
-- record. published_at stays NULL: it was never published.
--
-- audit is the trail of operator actions on the row, oldest first: a JSON
-- array of {"action", "actor", "reason", "from", "at"}. NULL until the
-- first action.
ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_status_check;
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_status_check
    CHECK (status IN ('PENDING', 'PUBLISHING', 'PUBLISHED', 'DEAD', 'DISCARDED'));
ALTER TABLE outbox_event ADD COLUMN audit jsonb;
