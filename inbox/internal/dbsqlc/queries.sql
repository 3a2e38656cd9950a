-- name: MarkDoNothing :execrows
-- One row affected on the first delivery, zero on a repeat. A repeat writes
-- nothing and takes no row lock.
INSERT INTO processed_event (consumer_id, event_id)
VALUES (@consumer_id, @event_id)
ON CONFLICT (consumer_id, event_id) DO NOTHING;

-- name: MarkDoUpdate :one
-- Always returns a row: xmax = 0 only for a freshly inserted tuple. A repeat
-- rewrites the row (a new tuple version, a dead one left behind) and holds
-- its row lock until the transaction ends. processed_at keeps its first value
-- so that retention counts from the first delivery.
INSERT INTO processed_event (consumer_id, event_id)
VALUES (@consumer_id, @event_id)
ON CONFLICT (consumer_id, event_id) DO UPDATE
    SET processed_at = processed_event.processed_at
RETURNING (xmax = 0)::boolean AS inserted;

-- name: MarkBatchDoNothing :many
-- The event ids that were inserted, i.e. seen for the first time. A repeat
-- of an id inside the same batch conflicts with the first and is not returned.
INSERT INTO processed_event (consumer_id, event_id)
SELECT @consumer_id::text, e FROM unnest(@event_ids::text[]) AS e
ON CONFLICT (consumer_id, event_id) DO NOTHING
RETURNING event_id;

-- name: MarkBatchDoUpdate :many
-- DO UPDATE cannot touch one row twice in a command, so ids arrive distinct.
INSERT INTO processed_event (consumer_id, event_id)
SELECT @consumer_id::text, e FROM unnest(@event_ids::text[]) AS e
ON CONFLICT (consumer_id, event_id) DO UPDATE
    SET processed_at = processed_event.processed_at
RETURNING event_id, (xmax = 0)::boolean AS inserted;

-- name: PurgeBatch :execrows
-- At most @batch_size rows older than @before. SKIP LOCKED keeps two purgers
-- (two instances) from queueing behind each other's batches. ORDER BY makes
-- the processed_at index the plan: without it the planner, assuming the old
-- rows spread evenly, picks a sequential scan, which reads the whole table
-- per batch when they are not (3 M kept rows ahead of them: 1.5 s a batch).
-- The rows are deleted by their ctid, locked and so unmoved, rather than
-- looked up again through the primary key (a descent per row over random
-- event ids).
DELETE FROM processed_event
WHERE ctid = ANY (ARRAY(
    SELECT o.ctid FROM processed_event o
    WHERE o.processed_at < @before
    ORDER BY o.processed_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
))
  AND processed_at < @before;

-- name: Seen :one
-- A plain read: no row lock, no write. A concurrent transaction that has
-- inserted the row and not committed yet is not seen.
SELECT EXISTS (
    SELECT 1 FROM processed_event
    WHERE consumer_id = @consumer_id AND event_id = @event_id
) AS seen;
