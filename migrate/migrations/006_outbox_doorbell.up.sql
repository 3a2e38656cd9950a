-- Relays are woken by a doorbell instead of a NOTIFY from every insert
-- (package outbox: EnqueueOne's comment in its queries).
--
-- The trigger of 002 sent a NOTIFY at the commit of every transaction
-- that inserted an event. PostgreSQL serializes the commits of notifying
-- transactions (a database-wide lock from the queueing of the
-- notification to the end of the commit, WAL flush included), so under
-- load every enqueuing transaction waited for the others' flushes: an
-- enqueue of one event cost 0.30 of a plain business transaction with it,
-- 0.53 without. Now outbox.EnqueueTx sends the NOTIFY itself, and only
-- while a relay sleeps (holds the doorbell advisory lock); a busy relay's
-- enqueuers send none.
--
-- Events inserted by other means than outbox.EnqueueTx (which the package
-- does not support: it assigns the sequence numbers) wake no relay; relays
-- find them at their next poll. A relay older than this migration is never
-- woken by a NOTIFY and polls (PollInterval).
DROP TRIGGER outbox_event_notify ON outbox_event;
DROP FUNCTION outbox_event_notify();

-- The claim's predecessor check (package outbox, ClaimLocked's comment):
-- an unpublished predecessor that is not held is in the claim's window
-- (ids follow sequences within an aggregate), so the check compares the
-- window's rows with each other and probes the table only for held ones,
-- through this index of unpublished held rows: the events waiting behind
-- a failed one, DEAD and DISCARDED events. It is empty while nothing
-- fails, so the enqueue path never writes to it, and a probe costs one
-- descent into a small index instead of one into every event's (aggregate,
-- sequence) entry and a heap visit. Its predicate names no status: a
-- column in an index predicate counts as indexed, and an update of status
-- (the two-phase claim, a mark) would no longer be a HOT update.
CREATE INDEX outbox_event_held_idx ON outbox_event (aggregate_type, aggregate_id, aggregate_seq)
    WHERE held AND published_at IS NULL;
