-- Enqueue writes a batch of events in the caller transaction. The
-- upsert on outbox_aggregate takes each aggregate sequence numbers and
-- keeps that aggregate counter row locked until the caller
-- transaction ends: a second transaction enqueueing for the same aggregate
-- waits there, then numbers its events after the first ones (or reuses
-- the numbers if the first rolled back). Sequence order is therefore
-- commit order, with no gaps. Aggregates are locked in sorted order so that
-- two multi-aggregate enqueues cannot deadlock each other. The counter row
-- also says whether the aggregate is blocked (a failed event waits): the
-- upsert returns its latest version, read under the lock, so a new event
-- of a blocked aggregate is written held, and one written after the
-- release is not (see BlockAggregates). The bell CTE is the doorbell (see
-- EnqueueOne).
-- name: Enqueue :many
WITH bell AS (
    SELECT CASE WHEN pg_try_advisory_xact_lock_shared(1768189184, 'outbox_event'::regclass::oid::int) THEN false
                ELSE EXISTS (SELECT FROM pg_notify('idem_outbox', 'outbox_event'::regclass::oid::text)) END AS rang
),
input AS (
    SELECT t.*, row_number() OVER () AS ord
    FROM (
        SELECT unnest(sqlc.arg(topics)::text[]) AS topic,
               unnest(sqlc.arg(aggregate_types)::text[]) AS aggregate_type,
               unnest(sqlc.arg(aggregate_ids)::text[]) AS aggregate_id,
               unnest(sqlc.arg(event_ids)::text[]) AS event_id,
               unnest(sqlc.arg(event_types)::text[]) AS event_type,
               unnest(sqlc.arg(payloads)::bytea[]) AS payload,
               unnest(sqlc.arg(headers)::text[]) AS headers
    ) t
),
counts AS (
    SELECT i.aggregate_type, i.aggregate_id, count(*)::bigint AS n
    FROM input i
    GROUP BY i.aggregate_type, i.aggregate_id
),
bumped AS (
    INSERT INTO outbox_aggregate AS a (aggregate_type, aggregate_id, last_seq)
    SELECT c.aggregate_type, c.aggregate_id, c.n FROM counts c
    ORDER BY c.aggregate_type, c.aggregate_id
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = a.last_seq + EXCLUDED.last_seq
    RETURNING a.aggregate_type, a.aggregate_id, a.last_seq, a.blocked
)
INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload, headers, held)
SELECT i.topic, i.aggregate_type, i.aggregate_id,
       b.last_seq - c.n + row_number() OVER (PARTITION BY i.aggregate_type, i.aggregate_id ORDER BY i.ord),
       i.event_id, i.event_type, i.payload, i.headers::jsonb, b.blocked
FROM input i
JOIN counts c ON c.aggregate_type = i.aggregate_type AND c.aggregate_id = i.aggregate_id
JOIN bumped b ON b.aggregate_type = i.aggregate_type AND b.aggregate_id = i.aggregate_id
CROSS JOIN bell
ORDER BY i.ord
RETURNING id, aggregate_seq;

-- EnqueueOne is Enqueue of one message, without the arrays: the statement
-- every business transaction that writes one event pays for.
--
-- The doorbell (bell): a relay about to sleep holds the session advisory
-- lock (1768189184, this table's oid) exclusively and waits for a NOTIFY on
-- idem_outbox (see the relay's doorbell). An enqueue tries the same lock
-- shared, for the rest of its transaction:
--  - it fails while a relay sleeps: the enqueue sends the NOTIFY, which
--    PostgreSQL delivers at commit (and not at all on rollback); its
--    payload is the table's oid, since the channel is the database's and
--    relays of other schemas listen on it too;
--  - it succeeds while every relay is awake, and the enqueue sends nothing:
--    a NOTIFY serializes the commits of all notifying transactions of the
--    server (PostgreSQL holds a database-wide lock from the notification's
--    queueing to the end of the commit), which is most of what a notifying
--    enqueue costs under load. The shared lock, held until commit, keeps
--    relays from going to sleep (their exclusive try fails) until this
--    transaction's events are visible to their last claim.
-- So every committed event either rang or was committed before a relay's
-- last claim before sleeping began; none waits for the poll interval.
-- name: EnqueueOne :one
WITH bell AS (
    SELECT CASE WHEN pg_try_advisory_xact_lock_shared(1768189184, 'outbox_event'::regclass::oid::int) THEN false
                ELSE EXISTS (SELECT FROM pg_notify('idem_outbox', 'outbox_event'::regclass::oid::text)) END AS rang
),
bumped AS (
    INSERT INTO outbox_aggregate AS a (aggregate_type, aggregate_id, last_seq)
    VALUES (sqlc.arg(aggregate_type)::text, sqlc.arg(aggregate_id)::text, 1)
    ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_seq = a.last_seq + 1
    RETURNING a.last_seq, a.blocked
)
INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload, headers, held)
SELECT sqlc.arg(topic)::text, sqlc.arg(aggregate_type)::text, sqlc.arg(aggregate_id)::text, b.last_seq,
       sqlc.arg(event_id)::text, sqlc.arg(event_type)::text, sqlc.arg(payload)::bytea, sqlc.arg(headers)::text::jsonb, b.blocked
FROM bumped b
CROSS JOIN bell
RETURNING id, aggregate_seq;

-- The relay's side of the doorbell, on a session of its own. ArmDoorbell
-- first takes the relays' lock (1768189185): one armed relay is enough,
-- since the NOTIFY wakes every listener, so a relay that finds another one
-- armed ('other') may sleep. Then the enqueuers' lock, exclusively: it
-- fails while an enqueue that rang no bell is uncommitted ('busy': the
-- relay lets the first go and polls again soon). CASE tries its branches in
-- order and stops at the first that holds, so each lock is tried only
-- after the one before it was granted.
-- name: ArmDoorbell :one
SELECT (CASE
    WHEN NOT pg_try_advisory_lock(1768189185, 'outbox_event'::regclass::oid::int) THEN 'other'
    WHEN pg_try_advisory_lock(1768189184, 'outbox_event'::regclass::oid::int) THEN 'armed'
    WHEN pg_advisory_unlock(1768189185, 'outbox_event'::regclass::oid::int) THEN 'busy'
    ELSE 'busy'
END)::text AS state;

-- RingDoorbell wakes the other relays: an armed relay that stops sends it,
-- since relays asleep behind its arm would otherwise wait for their poll.
-- name: RingDoorbell :exec
SELECT pg_notify('idem_outbox', 'outbox_event'::regclass::oid::text);

-- DisarmDoorbell lets both locks go; only an armed relay runs it.
-- name: DisarmDoorbell :exec
SELECT pg_advisory_unlock(1768189184, 'outbox_event'::regclass::oid::int),
       pg_advisory_unlock(1768189185, 'outbox_event'::regclass::oid::int);

-- ClaimLocked is the at-least-once claim: it marks the batch PUBLISHED
-- inside the caller's transaction, which holds the rows until it ends
-- (nobody sees the mark before the commit); the relay undoes the mark of
-- whatever it could not deliver before it commits (MarkFailedLocked). The
-- relay runs it after ClaimFast, for the rest of a batch that the window's
-- heads did not fill.
--
-- Per-aggregate order (all four claims): "heads" are PENDING, available
-- events with no unpublished (PENDING, PUBLISHING or DEAD) event of the
-- same aggregate before them; a DISCARDED event (an operator's decision,
-- see outbox.Admin.Discard) counts as done, like a PUBLISHED one. A
-- PUBLISHED or purged predecessor (seq - 1) would be enough, as an event
-- is published only after its predecessor, but a DISCARDED one is not:
-- an aggregate can hold two DEAD events (a two-phase batch of both, reaped
-- at the attempt limit), and discarding the second says nothing of the
-- first. So the check looks at every earlier event, cheaply (below).
-- Locking a head (FOR UPDATE SKIP
-- LOCKED) gives this relay the whole aggregate: every later event of it
-- has the head as an unpublished predecessor, so no other relay sees it as
-- a head. The claim then extends each head with the contiguous run of
-- PENDING, available events behind it, heads first, so a batch can carry
-- many events of one aggregate without ever skipping one. The head test
-- reads a snapshot that may be stale, but staleness only makes it
-- stricter: an event never goes from PUBLISHED back to unpublished.
--
-- The predecessor check without a lookup per candidate: ids follow
-- sequences within an aggregate (EnqueueTx takes both under the
-- aggregate's counter row lock), so an unpublished predecessor that is not
-- held has a smaller id than its successor and is in the window (the
-- oldest window_size unpublished rows that are not held, by id) whenever
-- the successor is. A candidate from the window is therefore a head when
-- it is its aggregate's first row in the window (hashed: the minimum
-- sequence per aggregate) and no earlier event of its aggregate is a held
-- row (DISCARDED ones excepted), the one case the window cannot see,
-- probed in outbox_event_held_idx (unpublished held rows: small, and
-- empty while nothing fails; a range of one aggregate's entries before the
-- candidate, which is empty unless a flag is stale or events were
-- discarded). The check does not
-- trust held: a wrong flag either takes a row out of the window (it is
-- then probed as held) or leaves it in (it is then seen in the window), so
-- a stale held flag can delay an event, never reorder one.
--
-- Finding the heads, in two ways, the second only when the first falls
-- short of the batch; both read only unpublished rows that are not held
-- (events held behind a DEAD or failing event cost nothing):
--  1. by_id: the window's heads, as above. Cheapest when the oldest events
--     are of different aggregates (each is its aggregate's head); the
--     window bounds what it reads when they are not (one aggregate's
--     100,000 events, other relays' batches, heads in backoff). The relay
--     adapts the window's size (Relay.adaptWindow).
--  2. by_aggregate: a skip scan of outbox_event_claim_agg_idx, by
--     (aggregate_type, aggregate_id, aggregate_seq): a recursive CTE takes
--     each aggregate's first such row with one index descent, so its cost
--     follows the aggregates it passes, never the events behind their
--     heads; being its aggregate's first such row, a candidate needs only
--     the held probe. It starts after the relay's cursor (the aggregate its
--     previous claim ended at) and wraps around, so that every aggregate
--     gets its turn, and stops as soon as the batch has its heads.
-- name: ClaimLocked :many
WITH RECURSIVE after_cursor AS (
    (SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
     FROM outbox_event o
     WHERE o.published_at IS NULL AND NOT o.held
       AND (o.aggregate_type, o.aggregate_id) > (sqlc.arg(cursor_type)::text, sqlc.arg(cursor_id)::text)
     ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
     LIMIT 1)
    UNION ALL
    SELECT n.* FROM after_cursor a CROSS JOIN LATERAL (
        SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
        FROM outbox_event o
        WHERE o.published_at IS NULL AND NOT o.held
          AND (o.aggregate_type, o.aggregate_id) > (a.aggregate_type, a.aggregate_id)
        ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
        LIMIT 1) n
),
up_to_cursor AS (
    (SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
     FROM outbox_event o
     WHERE o.published_at IS NULL AND NOT o.held
       AND (o.aggregate_type, o.aggregate_id) <= (sqlc.arg(cursor_type)::text, sqlc.arg(cursor_id)::text)
     ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
     LIMIT 1)
    UNION ALL
    SELECT n.* FROM up_to_cursor a CROSS JOIN LATERAL (
        SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
        FROM outbox_event o
        WHERE o.published_at IS NULL AND NOT o.held
          AND (o.aggregate_type, o.aggregate_id) > (a.aggregate_type, a.aggregate_id)
          AND (o.aggregate_type, o.aggregate_id) <= (sqlc.arg(cursor_type)::text, sqlc.arg(cursor_id)::text)
        ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
        LIMIT 1) n
),
firsts AS (
    SELECT * FROM after_cursor
    UNION ALL
    SELECT * FROM up_to_cursor
),
win AS MATERIALIZED (
    SELECT w.id, w.aggregate_type, w.aggregate_id
    FROM outbox_event w
    WHERE w.published_at IS NULL AND NOT w.held
    ORDER BY w.id
    LIMIT sqlc.arg(window_size)::int
),
by_id AS (
    SELECT o.id, o.aggregate_type, o.aggregate_id, o.aggregate_seq, false AS rotated
    FROM outbox_event o
    WHERE o.id IN (
        SELECT min(m.id) FROM win m GROUP BY m.aggregate_type, m.aggregate_id)
      AND o.published_at IS NULL AND NOT o.held AND o.status = 'PENDING' AND o.available_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM outbox_event p
          WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
            AND p.aggregate_seq < o.aggregate_seq
            AND p.held AND p.published_at IS NULL AND p.status <> 'DISCARDED')
    ORDER BY o.id
    LIMIT sqlc.arg(batch_size)::int
    FOR UPDATE OF o SKIP LOCKED
),
by_aggregate AS (
    -- LATERAL keeps it a loop over the candidates in scan order, which
    -- stops at the batch's size (a join could hash them all first).
    SELECT h.id, h.aggregate_type, h.aggregate_id, h.aggregate_seq, true AS rotated
    FROM firsts f
    CROSS JOIN LATERAL (
        SELECT o.id, o.aggregate_type, o.aggregate_id, o.aggregate_seq
        FROM outbox_event o
        WHERE o.id = f.id
          AND o.published_at IS NULL AND NOT o.held AND o.status = 'PENDING' AND o.available_at <= now()
          AND NOT EXISTS (
              SELECT 1 FROM outbox_event p
              WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
                AND p.aggregate_seq < o.aggregate_seq
                AND p.held AND p.published_at IS NULL AND p.status <> 'DISCARDED')
        FOR UPDATE OF o SKIP LOCKED
    ) h
    WHERE f.status = 'PENDING' AND f.available_at <= now()
      AND f.id NOT IN (SELECT by_id.id FROM by_id)
),
heads AS (
    -- by_aggregate runs only when by_id falls short of the batch.
    SELECT * FROM by_id
    UNION ALL
    SELECT * FROM by_aggregate
    LIMIT sqlc.arg(batch_size)::int
),
per_head AS (
    SELECT ((sqlc.arg(batch_size)::int - count(*) + greatest(count(*), 1) - 1) / greatest(count(*), 1))::int AS n FROM heads
),
run AS (
    SELECT r.id,
           row_number() OVER w AS pos,
           bool_and(r.status = 'PENDING' AND r.available_at <= now()) OVER w AS ok
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id, e.aggregate_seq, e.status, e.available_at
        FROM outbox_event e
        WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
          AND e.aggregate_seq > h.aggregate_seq
        ORDER BY e.aggregate_seq
        LIMIT (SELECT n FROM per_head)
    ) r
    WINDOW w AS (PARTITION BY h.id ORDER BY r.aggregate_seq)
),
claim AS (
    SELECT c.id FROM (
        SELECT heads.id, 0::bigint AS pos FROM heads
        UNION ALL
        SELECT run.id, run.pos FROM run WHERE run.ok
    ) c
    ORDER BY c.pos, c.id
    LIMIT sqlc.arg(batch_size)::int
)
UPDATE outbox_event e
SET status = 'PUBLISHED', published_at = now(), attempts = e.attempts + 1, held = false
WHERE e.id IN (SELECT claim.id FROM claim)
RETURNING e.id, e.topic, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.event_id, e.event_type,
          e.payload, e.headers, e.attempts, e.created_at,
          (e.id IN (SELECT heads.id FROM heads WHERE heads.rotated))::bool AS rotated;

-- The selection below repeats ClaimLocked's on purpose: sqlc cannot share a
-- CTE between queries, and moving it into a SQL function would change its
-- meaning (a volatile function takes a snapshot of its own, newer than the
-- UPDATE's, so the two could disagree on which rows exist). Change both.
--
-- ClaimLease is the two-phase claim: the same selection as ClaimLocked,
-- moved to PUBLISHING under a lease (owner, token, locked_at) and committed
-- at once. attempts counts claims, so a relay that dies mid-publish has
-- used an attempt.
-- name: ClaimLease :many
WITH RECURSIVE after_cursor AS (
    (SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
     FROM outbox_event o
     WHERE o.published_at IS NULL AND NOT o.held
       AND (o.aggregate_type, o.aggregate_id) > (sqlc.arg(cursor_type)::text, sqlc.arg(cursor_id)::text)
     ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
     LIMIT 1)
    UNION ALL
    SELECT n.* FROM after_cursor a CROSS JOIN LATERAL (
        SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
        FROM outbox_event o
        WHERE o.published_at IS NULL AND NOT o.held
          AND (o.aggregate_type, o.aggregate_id) > (a.aggregate_type, a.aggregate_id)
        ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
        LIMIT 1) n
),
up_to_cursor AS (
    (SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
     FROM outbox_event o
     WHERE o.published_at IS NULL AND NOT o.held
       AND (o.aggregate_type, o.aggregate_id) <= (sqlc.arg(cursor_type)::text, sqlc.arg(cursor_id)::text)
     ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
     LIMIT 1)
    UNION ALL
    SELECT n.* FROM up_to_cursor a CROSS JOIN LATERAL (
        SELECT o.id, o.aggregate_type, o.aggregate_id, o.status, o.available_at
        FROM outbox_event o
        WHERE o.published_at IS NULL AND NOT o.held
          AND (o.aggregate_type, o.aggregate_id) > (a.aggregate_type, a.aggregate_id)
          AND (o.aggregate_type, o.aggregate_id) <= (sqlc.arg(cursor_type)::text, sqlc.arg(cursor_id)::text)
        ORDER BY o.aggregate_type, o.aggregate_id, o.aggregate_seq
        LIMIT 1) n
),
firsts AS (
    SELECT * FROM after_cursor
    UNION ALL
    SELECT * FROM up_to_cursor
),
win AS MATERIALIZED (
    SELECT w.id, w.aggregate_type, w.aggregate_id
    FROM outbox_event w
    WHERE w.published_at IS NULL AND NOT w.held
      -- This claim's own rows (ClaimLeaseFast's, in this transaction) are
      -- in this batch: the events behind them may join it.
      AND w.lease_token IS DISTINCT FROM sqlc.arg(token)::bigint
    ORDER BY w.id
    LIMIT sqlc.arg(window_size)::int
),
by_id AS (
    SELECT o.id, o.aggregate_type, o.aggregate_id, o.aggregate_seq, false AS rotated
    FROM outbox_event o
    WHERE o.id IN (
        SELECT min(m.id) FROM win m GROUP BY m.aggregate_type, m.aggregate_id)
      AND o.published_at IS NULL AND NOT o.held AND o.status = 'PENDING' AND o.available_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM outbox_event p
          WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
            AND p.aggregate_seq < o.aggregate_seq
            AND p.held AND p.published_at IS NULL AND p.status <> 'DISCARDED')
    ORDER BY o.id
    LIMIT sqlc.arg(batch_size)::int
    FOR UPDATE OF o SKIP LOCKED
),
by_aggregate AS (
    -- LATERAL keeps it a loop over the candidates in scan order, which
    -- stops at the batch's size (a join could hash them all first).
    SELECT h.id, h.aggregate_type, h.aggregate_id, h.aggregate_seq, true AS rotated
    FROM firsts f
    CROSS JOIN LATERAL (
        SELECT o.id, o.aggregate_type, o.aggregate_id, o.aggregate_seq
        FROM outbox_event o
        WHERE o.id = f.id
          AND o.published_at IS NULL AND NOT o.held AND o.status = 'PENDING' AND o.available_at <= now()
          AND NOT EXISTS (
              SELECT 1 FROM outbox_event p
              WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
                AND p.aggregate_seq < o.aggregate_seq
                AND p.held AND p.published_at IS NULL AND p.status <> 'DISCARDED')
        FOR UPDATE OF o SKIP LOCKED
    ) h
    WHERE f.status = 'PENDING' AND f.available_at <= now()
      AND f.id NOT IN (SELECT by_id.id FROM by_id)
),
heads AS (
    -- by_aggregate runs only when by_id falls short of the batch.
    SELECT * FROM by_id
    UNION ALL
    SELECT * FROM by_aggregate
    LIMIT sqlc.arg(batch_size)::int
),
per_head AS (
    SELECT ((sqlc.arg(batch_size)::int - count(*) + greatest(count(*), 1) - 1) / greatest(count(*), 1))::int AS n FROM heads
),
run AS (
    SELECT r.id,
           row_number() OVER w AS pos,
           bool_and(r.status = 'PENDING' AND r.available_at <= now()) OVER w AS ok
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id, e.aggregate_seq, e.status, e.available_at
        FROM outbox_event e
        WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
          AND e.aggregate_seq > h.aggregate_seq
        ORDER BY e.aggregate_seq
        LIMIT (SELECT n FROM per_head)
    ) r
    WINDOW w AS (PARTITION BY h.id ORDER BY r.aggregate_seq)
),
claim AS (
    SELECT c.id FROM (
        SELECT heads.id, 0::bigint AS pos FROM heads
        UNION ALL
        SELECT run.id, run.pos FROM run WHERE run.ok
    ) c
    ORDER BY c.pos, c.id
    LIMIT sqlc.arg(batch_size)::int
)
UPDATE outbox_event e
SET status = 'PUBLISHING', lease_owner = sqlc.arg(owner)::text, lease_token = sqlc.arg(token)::bigint,
    locked_at = now(), attempts = e.attempts + 1, held = false
WHERE e.id IN (SELECT claim.id FROM claim)
RETURNING e.id, e.topic, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.event_id, e.event_type,
          e.payload, e.headers, e.attempts, e.created_at,
          (e.id IN (SELECT heads.id FROM heads WHERE heads.rotated))::bool AS rotated;

-- ClaimFast and ClaimLeaseFast are the claims' first statement: the
-- window's heads (see ClaimLocked, by_id) and nothing else, no run behind
-- a head and no walk over the aggregates, written at once like
-- ClaimLocked's and ClaimLease's. When the oldest events are of different
-- aggregates, the common case, that is the whole batch, and the claim
-- costs little more than the cheapest unordered one. When it falls short,
-- the relay runs the full claim in the same transaction for the rest: the
-- heads just taken are no longer unpublished in the transaction's view,
-- so the full claim sees the events behind them as heads, and the batch
-- keeps each aggregate's order.
-- name: ClaimFast :many
WITH heads AS (
    SELECT o.id
    FROM outbox_event o
    WHERE o.id IN (
        -- Each aggregate's first row in the window: its lowest id is its
        -- lowest sequence.
        SELECT min(w.id) FROM (
            SELECT w.id, w.aggregate_type, w.aggregate_id
            FROM outbox_event w
            WHERE w.published_at IS NULL AND NOT w.held
            ORDER BY w.id
            LIMIT sqlc.arg(window_size)::int) w
        GROUP BY w.aggregate_type, w.aggregate_id)
      AND o.published_at IS NULL AND NOT o.held AND o.status = 'PENDING' AND o.available_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM outbox_event p
          WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
            AND p.aggregate_seq < o.aggregate_seq
            AND p.held AND p.published_at IS NULL AND p.status <> 'DISCARDED')
    ORDER BY o.id
    LIMIT sqlc.arg(batch_size)::int
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE outbox_event e
SET status = 'PUBLISHED', published_at = now(), attempts = e.attempts + 1, held = false
FROM heads h
WHERE e.id = h.id
RETURNING e.id, e.topic, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.event_id, e.event_type,
          e.payload, e.headers, e.attempts, e.created_at;

-- name: ClaimLeaseFast :many
WITH heads AS (
    SELECT o.id
    FROM outbox_event o
    WHERE o.id IN (
        -- Each aggregate's first row in the window: its lowest id is its
        -- lowest sequence.
        SELECT min(w.id) FROM (
            SELECT w.id, w.aggregate_type, w.aggregate_id
            FROM outbox_event w
            WHERE w.published_at IS NULL AND NOT w.held
            ORDER BY w.id
            LIMIT sqlc.arg(window_size)::int) w
        GROUP BY w.aggregate_type, w.aggregate_id)
      AND o.published_at IS NULL AND NOT o.held AND o.status = 'PENDING' AND o.available_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM outbox_event p
          WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
            AND p.aggregate_seq < o.aggregate_seq
            AND p.held AND p.published_at IS NULL AND p.status <> 'DISCARDED')
    ORDER BY o.id
    LIMIT sqlc.arg(batch_size)::int
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE outbox_event e
SET status = 'PUBLISHING', lease_owner = sqlc.arg(owner)::text, lease_token = sqlc.arg(token)::bigint,
    locked_at = now(), attempts = e.attempts + 1, held = false
FROM heads h
WHERE e.id = h.id
RETURNING e.id, e.topic, e.aggregate_type, e.aggregate_id, e.aggregate_seq, e.event_id, e.event_type,
          e.payload, e.headers, e.attempts, e.created_at;

-- MarkFailedLocked undoes, for the events of an at-least-once batch that
-- were not delivered, what ClaimLocked wrote in the same transaction: a
-- failed event (counted) goes back to PENDING with its error and backoff,
-- or DEAD at the attempt limit; an event held back behind a failure of its
-- aggregate (not counted) goes back to PENDING as it was. It returns the
-- rows it changed, saying which became DEAD.
-- name: MarkFailedLocked :many
UPDATE outbox_event e
SET attempts = CASE WHEN u.counted THEN e.attempts ELSE e.attempts - 1 END,
    last_error = CASE WHEN u.counted THEN u.err ELSE e.last_error END,
    available_at = CASE WHEN u.counted THEN now() + u.delay_ms * interval '1 millisecond' ELSE e.available_at END,
    status = CASE WHEN u.counted AND e.attempts >= sqlc.arg(max_attempts)::int THEN 'DEAD' ELSE 'PENDING' END,
    published_at = NULL
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id, unnest(sqlc.arg(errs)::text[]) AS err,
             unnest(sqlc.arg(delays_ms)::bigint[]) AS delay_ms, unnest(sqlc.arg(counted)::bool[]) AS counted) u
WHERE e.id = u.id AND e.status = 'PUBLISHED'
RETURNING e.id, (e.status = 'DEAD')::bool AS dead;

-- MarkPublishedLease completes a two-phase batch. The token guard makes a
-- relay whose lease was reaped (and perhaps re-claimed by another relay)
-- change nothing.
-- name: MarkPublishedLease :execrows
UPDATE outbox_event
SET status = 'PUBLISHED', published_at = now(), lease_owner = NULL, lease_token = NULL, locked_at = NULL
WHERE id = ANY(sqlc.arg(ids)::bigint[]) AND status = 'PUBLISHING' AND lease_token = sqlc.arg(token)::bigint;

-- MarkFailedLease returns failed (counted) and held-back (not counted)
-- events of a two-phase batch to PENDING, or DEAD at the attempt limit,
-- and returns the rows it changed (fewer than given: the lease was lost).
-- name: MarkFailedLease :many
UPDATE outbox_event e
SET attempts = CASE WHEN u.counted THEN e.attempts ELSE e.attempts - 1 END,
    last_error = CASE WHEN u.counted THEN u.err ELSE e.last_error END,
    available_at = now() + u.delay_ms * interval '1 millisecond',
    status = CASE WHEN u.counted AND e.attempts >= sqlc.arg(max_attempts)::int THEN 'DEAD' ELSE 'PENDING' END,
    lease_owner = NULL, lease_token = NULL, locked_at = NULL
FROM (SELECT unnest(sqlc.arg(ids)::bigint[]) AS id, unnest(sqlc.arg(errs)::text[]) AS err,
             unnest(sqlc.arg(delays_ms)::bigint[]) AS delay_ms, unnest(sqlc.arg(counted)::bool[]) AS counted) u
WHERE e.id = u.id AND e.status = 'PUBLISHING' AND e.lease_token = sqlc.arg(token)::bigint
RETURNING e.id, (e.status = 'DEAD')::bool AS dead;

-- ReapLeases returns expired leases to PENDING with attempts preserved, or
-- to DEAD when the attempts are used up, and returns the rows it changed.
-- A PUBLISHING row is never held (ClaimLease clears it), so the claim's
-- index has them all.
-- name: ReapLeases :many
UPDATE outbox_event
SET status = CASE WHEN attempts >= sqlc.arg(max_attempts)::int THEN 'DEAD' ELSE 'PENDING' END,
    last_error = 'outbox: lease of ' || coalesce(lease_owner, '?') || ' expired',
    lease_owner = NULL, lease_token = NULL, locked_at = NULL
WHERE published_at IS NULL AND NOT held AND status = 'PUBLISHING'
  AND locked_at < now() - sqlc.arg(ttl_ms)::bigint * interval '1 millisecond'
RETURNING id, event_id, event_type, topic, aggregate_type, aggregate_id, aggregate_seq, attempts,
          (status = 'DEAD')::bool AS dead;

-- name: PurgePublished :execrows
-- The rows are found through the published_at index and deleted by their
-- ctid, not looked up again through the primary key (a descent per row).
-- Without a row lock a row can get a new version between the scan and the
-- DELETE; the repeated condition deletes it only if it is still PUBLISHED
-- and old.
DELETE FROM outbox_event
WHERE ctid = ANY (ARRAY(
    SELECT o.ctid FROM outbox_event o
    WHERE o.published_at IS NOT NULL AND o.status = 'PUBLISHED' AND o.published_at < now() - sqlc.arg(retention_ms)::bigint * interval '1 millisecond'
    ORDER BY o.published_at
    LIMIT sqlc.arg(batch_size)::int
))
  AND published_at IS NOT NULL AND status = 'PUBLISHED' AND published_at < now() - sqlc.arg(retention_ms)::bigint * interval '1 millisecond';

-- name: Status :one
SELECT
    count(*) FILTER (WHERE status = 'PENDING')::bigint AS pending,
    count(*) FILTER (WHERE status = 'PUBLISHING')::bigint AS publishing,
    count(*) FILTER (WHERE status = 'PUBLISHED')::bigint AS published,
    count(*) FILTER (WHERE status = 'DEAD')::bigint AS dead,
    count(*) FILTER (WHERE status = 'DISCARDED')::bigint AS discarded,
    count(*) FILTER (WHERE status = 'PUBLISHING'
                     AND locked_at < now() - sqlc.arg(ttl_ms)::bigint * interval '1 millisecond')::bigint AS expired_leases,
    coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'PENDING')), 0)::float8 AS oldest_pending_seconds
FROM outbox_event;

-- name: DeadEvents :many
SELECT event_id, topic, aggregate_type, aggregate_id, aggregate_seq, event_type, attempts,
       coalesce(last_error, '')::text AS last_error, created_at
FROM outbox_event
WHERE status = 'DEAD'
ORDER BY id
LIMIT sqlc.arg(max_rows)::int;

-- Requeue returns DEAD events to PENDING, attempts reset, and appends
-- the action to each row's audit trail. Like RequeueDead and Discard it
-- returns each changed event's aggregate and sequence: what must be
-- released behind it. The status guard makes two
-- concurrent requeues of one event safe: the second waits for the first's
-- row lock, re-reads the row (READ COMMITTED), finds it PENDING and
-- changes nothing. DEAD rows are never touched by a relay (its claims,
-- marks and reaper all require PENDING or PUBLISHING), so an operator
-- action cannot race with a batch.
-- name: Requeue :many
UPDATE outbox_event
SET status = 'PENDING', attempts = 0, available_at = now(), held = false,
    audit = coalesce(audit, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
        'action', 'requeue', 'actor', sqlc.arg(actor)::text, 'reason', sqlc.arg(reason)::text,
        'from', status, 'at', now()))
WHERE event_id = ANY(sqlc.arg(event_ids)::text[]) AND status = 'DEAD'
RETURNING event_id, aggregate_type, aggregate_id, aggregate_seq;

-- RequeueDead is Requeue of every DEAD event of an optional aggregate and
-- topic.
-- name: RequeueDead :many
UPDATE outbox_event
SET status = 'PENDING', attempts = 0, available_at = now(), held = false,
    audit = coalesce(audit, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
        'action', 'requeue', 'actor', sqlc.arg(actor)::text, 'reason', sqlc.arg(reason)::text,
        'from', status, 'at', now()))
WHERE status = 'DEAD'
  AND (sqlc.narg(aggregate_type)::text IS NULL OR aggregate_type = sqlc.narg(aggregate_type)::text)
  AND (sqlc.narg(aggregate_id)::text IS NULL OR aggregate_id = sqlc.narg(aggregate_id)::text)
  AND (sqlc.narg(topic)::text IS NULL OR topic = sqlc.narg(topic)::text)
RETURNING event_id, aggregate_type, aggregate_id, aggregate_seq;

-- Discard moves a DEAD event to the terminal DISCARDED state, which
-- releases the later events of its aggregate (see the claims' head check).
-- Only DEAD: a PENDING or PUBLISHING event may be in a relay's hands at
-- this moment, and discarding it could not stop a publish under way.
-- name: Discard :many
UPDATE outbox_event
SET status = 'DISCARDED', held = true,
    audit = coalesce(audit, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
        'action', 'discard', 'actor', sqlc.arg(actor)::text, 'reason', sqlc.arg(reason)::text,
        'from', status, 'at', now()))
WHERE event_id = sqlc.arg(event_id)::text AND status = 'DEAD'
RETURNING event_id, aggregate_type, aggregate_id, aggregate_seq;

-- name: EventStatus :one
SELECT status FROM outbox_event WHERE event_id = sqlc.arg(event_id)::text;

-- name: ShowEvent :one
SELECT id, event_id, topic, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers,
       status, attempts, available_at, lease_owner, locked_at, created_at, published_at,
       coalesce(last_error, '')::text AS last_error, audit
FROM outbox_event
WHERE event_id = sqlc.arg(event_id)::text;

-- ListEvents lists events matching every given filter, in id order
-- (enqueue order), after the id given (for paging).
-- name: ListEvents :many
SELECT id, event_id, topic, aggregate_type, aggregate_id, aggregate_seq, event_type, payload, headers,
       status, attempts, available_at, lease_owner, locked_at, created_at, published_at,
       coalesce(last_error, '')::text AS last_error, audit
FROM outbox_event
WHERE id > sqlc.arg(after_id)::bigint
  AND (sqlc.narg(status)::text IS NULL OR status = sqlc.narg(status)::text)
  AND (sqlc.narg(aggregate_type)::text IS NULL OR aggregate_type = sqlc.narg(aggregate_type)::text)
  AND (sqlc.narg(aggregate_id)::text IS NULL OR aggregate_id = sqlc.narg(aggregate_id)::text)
  AND (sqlc.narg(topic)::text IS NULL OR topic = sqlc.narg(topic)::text)
ORDER BY id
LIMIT sqlc.arg(max_rows)::int;

-- Blocked aggregates. An aggregate is blocked while its first unpublished
-- event has failed (DEAD, or PENDING in its backoff): its later events are
-- held, out of the claim's index, and so is a DEAD event. The truth is
-- outbox_aggregate.blocked, changed only under the counter row's lock,
-- which EnqueueTx takes too; every change is two statements in one
-- transaction, LockAggregates first, so that the second statement's
-- snapshot, taken after the lock was granted, sees every event committed
-- by an enqueue that read the old flag, and every later enqueue waits for
-- the commit and reads the new one:
--  1. BlockAggregates (a relay, in the transaction that records the
--     failure): blocked, and the events after the failed one held;
--  2. ReleaseAggregates (a relay, when an event that had failed before is
--     delivered; Requeue; the sweep): not blocked, the events after the
--     given sequence released, DEAD ones excepted.
-- name: LockAggregates :exec
SELECT 1 FROM outbox_aggregate a
JOIN (SELECT unnest(sqlc.arg(aggregate_types)::text[]) AS t, unnest(sqlc.arg(aggregate_ids)::text[]) AS i) u
  ON a.aggregate_type = u.t AND a.aggregate_id = u.i
ORDER BY a.aggregate_type, a.aggregate_id
FOR UPDATE OF a;

-- BlockAggregates holds, of each aggregate, the events after seq (and the
-- event at seq if DEAD), unless that event was published meanwhile. It
-- never holds a PUBLISHING row: that row is under some relay's lease
-- (one whose claim came after the failure, when a lease was reaped), and
-- a held row is out of the reaper's reach and, once its owner returns it
-- to PENDING as failed, out of every claim's (a head is not held): the
-- aggregate would wait for ever. The owner records that row's own outcome.
-- name: BlockAggregates :exec
WITH u AS (
    SELECT unnest(sqlc.arg(aggregate_types)::text[]) AS t, unnest(sqlc.arg(aggregate_ids)::text[]) AS i,
           unnest(sqlc.arg(seqs)::bigint[]) AS s
),
live AS (
    SELECT u.* FROM u
    WHERE EXISTS (SELECT 1 FROM outbox_event b
                  WHERE b.aggregate_type = u.t AND b.aggregate_id = u.i AND b.aggregate_seq = u.s
                    AND b.published_at IS NULL)
),
agg AS (
    UPDATE outbox_aggregate a SET blocked = true
    FROM live
    WHERE a.aggregate_type = live.t AND a.aggregate_id = live.i AND NOT a.blocked
    RETURNING a.aggregate_type
)
UPDATE outbox_event e SET held = true
FROM live
WHERE e.aggregate_type = live.t AND e.aggregate_id = live.i AND e.aggregate_seq >= live.s
  AND e.published_at IS NULL AND NOT e.held AND e.status <> 'PUBLISHING'
  AND (e.aggregate_seq > live.s OR e.status = 'DEAD');

-- name: ReleaseAggregates :exec
WITH u AS (
    SELECT unnest(sqlc.arg(aggregate_types)::text[]) AS t, unnest(sqlc.arg(aggregate_ids)::text[]) AS i,
           unnest(sqlc.arg(seqs)::bigint[]) AS s
),
agg AS (
    UPDATE outbox_aggregate a SET blocked = false
    FROM u
    WHERE a.aggregate_type = u.t AND a.aggregate_id = u.i AND a.blocked
    RETURNING a.aggregate_type
)
UPDATE outbox_event e SET held = false
FROM u
WHERE e.aggregate_type = u.t AND e.aggregate_id = u.i AND e.aggregate_seq > u.s
  AND e.held AND e.published_at IS NULL AND e.status NOT IN ('DEAD', 'DISCARDED');

-- OrphanBlocked locks blocked aggregates that have no failed event left
-- (whatever removed it: a publish whose release was lost in a crash, a
-- row deleted by hand), for the sweep to release. Locked ones are skipped:
-- a relay or an enqueue is at them.
--
-- An aggregate's published events are a prefix of its sequence (each is
-- published after its predecessor), so its unpublished ones are the
-- suffix after the last published one, found by reading the sequence
-- backwards: the check reads that suffix, not the retained history.
-- name: OrphanBlocked :many
SELECT a.aggregate_type, a.aggregate_id FROM outbox_aggregate a
WHERE a.blocked
  AND NOT EXISTS (SELECT 1 FROM outbox_event e
                  WHERE e.aggregate_type = a.aggregate_type AND e.aggregate_id = a.aggregate_id
                    AND e.aggregate_seq > coalesce((
                        SELECT p.aggregate_seq FROM outbox_event p
                        WHERE p.aggregate_type = a.aggregate_type AND p.aggregate_id = a.aggregate_id
                          AND p.published_at IS NOT NULL
                        ORDER BY p.aggregate_seq DESC LIMIT 1), 0)
                    AND e.published_at IS NULL AND e.status <> 'DISCARDED' AND (e.status = 'DEAD' OR e.attempts > 0))
ORDER BY a.aggregate_type, a.aggregate_id
LIMIT sqlc.arg(max_rows)::int
FOR UPDATE OF a SKIP LOCKED;

-- name: OutboxTableOID :one
SELECT 'outbox_event'::regclass::oid::text AS oid;
