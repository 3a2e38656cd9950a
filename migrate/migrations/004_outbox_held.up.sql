-- Blocked aggregates kept out of the relay's claim (package outbox).
--
-- An aggregate is blocked when its first unpublished event has failed
-- (DEAD, or PENDING in its retry backoff): none of its later events can be
-- published before that one. Such events are "held": held rows are left out
-- of the claim's index, so a claim's cost does not grow with the number of
-- events waiting behind DEAD or failing heads. held is only ever a hint
-- for the claim's index; the claim still checks each candidate's
-- predecessor, so a wrong held flag can delay an event but never reorder
-- one.
--
-- outbox_aggregate.blocked is where the truth lives, under the aggregate's
-- counter row lock: the relay sets it (and holds the later events) when an
-- event fails, and clears it (releasing them) when that event is published
-- or requeued; EnqueueTx reads it under the same lock and writes new events
-- of a blocked aggregate already held. A periodic sweep (with the lease
-- reaper) releases a blocked aggregate that no longer has a failed event,
-- whatever removed it.
ALTER TABLE outbox_aggregate ADD COLUMN blocked boolean NOT NULL DEFAULT false;
ALTER TABLE outbox_event ADD COLUMN held boolean NOT NULL DEFAULT false;

-- The sweep reads blocked aggregates only.
CREATE INDEX outbox_aggregate_blocked_idx ON outbox_aggregate (aggregate_type, aggregate_id) WHERE blocked;

-- Existing failed events: their aggregates are blocked, the DEAD events
-- and everything behind the first failed one held.
WITH blocker AS (
    SELECT aggregate_type, aggregate_id, min(aggregate_seq) AS seq
    FROM outbox_event
    WHERE published_at IS NULL AND (status = 'DEAD' OR (status = 'PENDING' AND attempts > 0))
    GROUP BY aggregate_type, aggregate_id
),
agg AS (
    UPDATE outbox_aggregate a SET blocked = true
    FROM blocker b
    WHERE a.aggregate_type = b.aggregate_type AND a.aggregate_id = b.aggregate_id
    RETURNING a.aggregate_type
)
UPDATE outbox_event e SET held = true
FROM blocker b
WHERE e.aggregate_type = b.aggregate_type AND e.aggregate_id = b.aggregate_id AND e.published_at IS NULL
  AND (e.aggregate_seq > b.seq OR e.status = 'DEAD');

-- The claim's indexes, both on unpublished rows that are not held: by id
-- (the oldest events first) and by aggregate and sequence (each
-- aggregate's first such event in one index descent, a skip scan, so that
-- the claim's cost does not follow the events behind a head). They
-- replace outbox_event_unpublished_idx (every unpublished row, by id),
-- which let DEAD and held rows into every claim's scan. The lease reaper
-- reads PUBLISHING rows, never held (the two-phase claim clears held),
-- through the first. For a row that is not held clearing held changes
-- nothing, so the two-phase claim stays a HOT update.
CREATE INDEX outbox_event_claim_idx ON outbox_event (id) WHERE published_at IS NULL AND NOT held;
CREATE INDEX outbox_event_claim_agg_idx ON outbox_event (aggregate_type, aggregate_id, aggregate_seq)
    WHERE published_at IS NULL AND NOT held;
DROP INDEX outbox_event_unpublished_idx;
