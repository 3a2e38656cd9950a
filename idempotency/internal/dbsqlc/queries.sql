-- name: Claim :one
-- The two-step claim: ONE statement, one round trip, decides the outcome.
--
-- The INSERT claims a new key, or (ON CONFLICT DO UPDATE ... WHERE) a key
-- whose record expired, was released, or whose lease ran out (same
-- fingerprint only: a different request never takes over). prev reads the
-- row as it was before this statement, because every part of a WITH
-- statement sees the same snapshot: it tells a takeover from a fresh claim
-- and, when nothing was claimed, why (replay, mismatch, in progress).
--
-- The INSERT takes its row from a SELECT that is empty when the snapshot
-- already shows a live record that cannot be claimed (a replay, a mismatch,
-- an in-progress claim): the common replay is then a pure read, with no row
-- lock, no transaction id, no WAL and no commit flush.
--
-- Race: a concurrent claimer may insert the row after our snapshot. Our
-- INSERT then waits for it, finds the conflict and (its lease being live)
-- claims nothing, while prev, from the older snapshot, sees no row (or the
-- older version). The outcome is then retry: the caller runs the
-- statement again with a fresh snapshot.
WITH claimed AS (
    INSERT INTO idempotency_key AS k (key_hash, fingerprint, state, locked_until, expires_at)
    SELECT @key_hash::bytea, @fingerprint::bytea, 'claimed',
           now() + make_interval(secs => @lease_s::float8),
           now() + make_interval(secs => @retention_s::float8)
    WHERE NOT EXISTS (
        SELECT 1 FROM idempotency_key AS live
        WHERE live.key_hash = @key_hash::bytea
          AND live.expires_at > now()
          AND NOT (live.fingerprint = @fingerprint::bytea
                   AND (live.state = 'released' OR (live.state = 'claimed' AND live.locked_until <= now()))))
    ON CONFLICT (key_hash) DO UPDATE
        SET fingerprint = excluded.fingerprint,
            state = 'claimed',
            fence = excluded.fence,
            locked_until = excluded.locked_until,
            response_status = NULL,
            response_headers = NULL,
            response_body = NULL,
            created_at = now(),
            completed_at = NULL,
            expires_at = excluded.expires_at
        WHERE k.expires_at <= now()
           OR (k.fingerprint = excluded.fingerprint
               AND (k.state = 'released' OR (k.state = 'claimed' AND k.locked_until <= now())))
    RETURNING k.fence
)
SELECT
    (CASE
        WHEN c.fence IS NOT NULL THEN
            CASE WHEN p.state = 'claimed' AND p.expires_at > now() THEN 'took_over' ELSE 'claimed' END
        WHEN p.key_hash IS NULL OR p.expires_at <= now() THEN 'retry'
        WHEN p.fingerprint <> @fingerprint::bytea THEN 'mismatch'
        WHEN p.state = 'completed' THEN 'completed'
        WHEN p.state = 'claimed' AND p.locked_until > now() THEN 'in_progress'
        ELSE 'retry'
    END)::text AS outcome,
    COALESCE(c.fence, 0)::bigint AS fence,
    COALESCE((EXTRACT(EPOCH FROM (p.locked_until - now())) * 1000000)::bigint, 0)::bigint AS retry_after_us,
    COALESCE((EXTRACT(EPOCH FROM (p.expires_at - now())) * 1000000)::bigint, 0)::bigint AS expires_in_us,
    COALESCE(p.response_status, 0)::integer AS response_status,
    p.response_headers,
    p.response_body
FROM (SELECT 1) AS one
LEFT JOIN claimed AS c ON true
LEFT JOIN idempotency_key AS p ON p.key_hash = @key_hash::bytea;

-- name: TxLock :one
-- The transactional claim, part 1 of 2, pipelined in one round trip after
-- BEGIN: try to take the key for this transaction.
--
-- A transaction-scoped advisory lock, not a row: a second request with the
-- same key would otherwise block on the uncommitted INSERT of the first
-- until that transaction ends; with the try-lock it answers in progress at
-- once. Nothing is written at claim time: the record is inserted, complete,
-- by TxComplete just before COMMIT, so a rollback leaves nothing. Advisory
-- locks are database-wide, so the table oid is mixed into the id: the same
-- key in two schemas (two applications) never collides.
SELECT pg_try_advisory_xact_lock(@lock_id::bigint # 'idempotency_key'::regclass::oid::bigint) AS got;

-- name: TxRead :one
-- The transactional claim, part 2 of 2: the record as it stands. This is a
-- separate statement, after TxLock, because in READ COMMITTED each statement
-- takes its snapshot when it starts: one taken after the lock was granted
-- sees the previous holder committed (PostgreSQL makes a commit visible
-- before it releases the locks), so a completed record is replayed, never
-- missed. The caller combines it with TxLock: without the lock, claimed and
-- took_over mean in progress.
SELECT
    (CASE
        WHEN p.key_hash IS NULL OR p.expires_at <= now() THEN 'claimed'
        WHEN p.fingerprint <> @fingerprint::bytea THEN 'mismatch'
        WHEN p.state = 'completed' THEN 'completed'
        WHEN p.state = 'released' THEN 'claimed'
        WHEN p.locked_until <= now() THEN 'took_over'
        ELSE 'in_progress'
    END)::text AS outcome,
    COALESCE((EXTRACT(EPOCH FROM (p.locked_until - now())) * 1000000)::bigint, 0)::bigint AS retry_after_us,
    COALESCE((EXTRACT(EPOCH FROM (p.expires_at - now())) * 1000000)::bigint, 0)::bigint AS expires_in_us,
    COALESCE(p.response_status, 0)::integer AS response_status,
    p.response_headers,
    p.response_body
FROM (SELECT 1) AS one
LEFT JOIN idempotency_key AS p ON p.key_hash = @key_hash::bytea;

-- name: Complete :execrows
-- Stores the response if fence still owns the claim (the fencing check).
UPDATE idempotency_key
SET state = 'completed',
    locked_until = NULL,
    response_status = @status::integer,
    response_headers = @headers::jsonb,
    response_body = @body::bytea,
    completed_at = now(),
    expires_at = now() + make_interval(secs => @retention_s::float8)
WHERE key_hash = @key_hash::bytea AND fence = @fence::bigint AND state = 'claimed';

-- name: Renew :execrows
-- The heartbeat of a two-step claim: extends a live lease of the fence's
-- owner to lease_s from now (database time), and the record's retention to
-- at least the same end, so that the record cannot expire under a claim
-- that is still renewed. A lease that has run out is not renewed, even if
-- nobody took the key over yet: its owner's context has ended by then.
UPDATE idempotency_key
SET locked_until = now() + make_interval(secs => @lease_s::float8),
    expires_at = GREATEST(expires_at, now() + make_interval(secs => @lease_s::float8))
WHERE key_hash = @key_hash::bytea AND fence = @fence::bigint
  AND state = 'claimed' AND locked_until > now();

-- name: Release :execrows
UPDATE idempotency_key
SET state = 'released', locked_until = NULL
WHERE key_hash = @key_hash::bytea AND fence = @fence::bigint AND state = 'claimed';

-- name: Purge :execrows
-- A small batch; SKIP LOCKED so that it never waits on a claimer. The rows
-- are found through the expires_at index and deleted by their ctid: going
-- back through the primary key instead costs a descent of it per row, and
-- with random SHA-256 keys those descents miss the buffer cache once the
-- table outgrows it (the purge ran at 0.60 of its empty-table rate with 3 M
-- records kept). The locked rows cannot move before the DELETE, and the
-- repeated condition makes a row that did (a concurrent update between the
-- snapshot and the lock) deleted only if it is still purgeable.
DELETE FROM idempotency_key
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_key
    WHERE expires_at <= now() AND (state <> 'claimed' OR locked_until <= now())
    ORDER BY expires_at
    LIMIT @batch::integer
    FOR UPDATE SKIP LOCKED
))
  AND expires_at <= now() AND (state <> 'claimed' OR locked_until <= now());

-- name: TxComplete :one
-- The record of a transactional request, written complete in the request
-- transaction and pipelined with its COMMIT: the claim, the handler writes
-- and the response commit together. The upsert takes over only what the
-- claim saw as claimable (new, expired, released, lease run out). Should it
-- find anything else (a two-step claimer on the same key slipped in), it
-- must abort the transaction so that the COMMIT queued behind it rolls
-- back: the division by zero raises exactly then.
WITH done AS (
    INSERT INTO idempotency_key AS k (key_hash, fingerprint, state, locked_until,
        response_status, response_headers, response_body, completed_at, expires_at)
    VALUES (@key_hash::bytea, @fingerprint::bytea, 'completed', NULL,
        @status::integer, @headers::jsonb, @body::bytea, now(),
        now() + make_interval(secs => @retention_s::float8))
    ON CONFLICT (key_hash) DO UPDATE
        SET fingerprint = excluded.fingerprint,
            state = 'completed',
            fence = excluded.fence,
            locked_until = NULL,
            response_status = excluded.response_status,
            response_headers = excluded.response_headers,
            response_body = excluded.response_body,
            created_at = now(),
            completed_at = now(),
            expires_at = excluded.expires_at
        WHERE k.expires_at <= now()
           OR (k.fingerprint = excluded.fingerprint
               AND (k.state = 'released' OR (k.state = 'claimed' AND k.locked_until <= now())))
    RETURNING k.fence
)
SELECT (1 / (SELECT count(*) FROM done))::integer AS completed;

-- name: InspectKey :one
-- An operator's look at one record (idempotency.PostgresStore.Inspect).
-- in_progress is computed in database time.
SELECT state, fingerprint, fence,
       (state = 'claimed' AND locked_until > now())::bool AS lease_live,
       locked_until, coalesce(response_status, 0)::integer AS response_status,
       created_at, completed_at, expires_at, (expires_at <= now())::bool AS expired
FROM idempotency_key
WHERE key_hash = @key_hash::bytea;

-- name: TxLockHolder :one
-- The backend holding a key's transactional claim (the advisory lock of
-- TxLock), 0 if none. A bigint advisory lock appears in pg_locks as
-- classid = high 32 bits, objid = low 32 bits, objsubid = 1.
WITH k AS (SELECT (@lock_id::bigint # 'idempotency_key'::regclass::oid::bigint) AS id)
SELECT coalesce(min(l.pid), 0)::integer AS pid
FROM pg_catalog.pg_locks l, k
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE datname = current_database())
  AND l.classid = ((k.id >> 32) & 4294967295)::bigint::oid
  AND l.objid = (k.id & 4294967295)::bigint::oid;

-- name: ReleaseClaim :one
-- An operator frees the claim it was shown (its fence), and only that one:
-- a retry that took the key over since has another fence and is left
-- alone. A live lease is released only with force. The claim's own
-- handler, if it still runs, is fenced out (its Complete and Release
-- require state = 'claimed' and its fence), and the next request with the
-- same fingerprint runs the handler again. The audit row is written by the
-- same statement: no release commits without it.
WITH r AS (
    UPDATE idempotency_key AS k
    SET state = 'released', locked_until = NULL
    WHERE k.key_hash = @key_hash::bytea AND k.state = 'claimed' AND k.fence = @fence::bigint
      AND (k.locked_until <= now() OR @force::bool)
    RETURNING k.fence
), a AS (
    INSERT INTO idem_admin_audit (action, subject, actor, reason, detail)
    SELECT 'keys.release', @subject::text, @actor::text, @reason::text,
           jsonb_build_object('fence', r.fence, 'force', @force::bool)
    FROM r
    RETURNING id
)
SELECT count(*)::bigint AS released FROM a;

-- name: ForgetRecord :one
-- An operator deletes the record it was shown (its fence): a claim or a
-- completed answer of another fence is left alone, and a live lease is
-- deleted only with force. The audit row is written by the same statement.
WITH d AS (
    DELETE FROM idempotency_key AS k
    WHERE k.key_hash = @key_hash::bytea AND k.fence = @fence::bigint
      AND (NOT (k.state = 'claimed' AND k.locked_until > now()) OR @force::bool)
    RETURNING k.fence, k.state
), a AS (
    INSERT INTO idem_admin_audit (action, subject, actor, reason, detail)
    SELECT 'keys.forget', @subject::text, @actor::text, @reason::text,
           jsonb_build_object('fence', d.fence, 'state', d.state, 'force', @force::bool)
    FROM d
    RETURNING id
)
SELECT count(*)::bigint AS forgotten FROM a;
