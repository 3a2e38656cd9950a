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
    COALESCE(p.response_status, 0)::integer AS response_status,
    p.response_headers,
    p.response_body
FROM (SELECT 1) AS one
LEFT JOIN claimed AS c ON true
LEFT JOIN idempotency_key AS p ON p.key_hash = @key_hash::bytea;

-- name: ClaimTx :one
-- The transactional claim, run as the first statement of the request
-- transaction; still one round trip.
--
-- pg_try_advisory_xact_lock on the key first: a second request with the same
-- key would otherwise block on the uncommitted INSERT of the first (its row lock)
-- until that transaction ends. With the try-lock it answers in progress at
-- once. The lock CTE is referenced twice, so PostgreSQL evaluates it once,
-- and the INSERT takes its rows from it, so the lock is taken before the
-- INSERT looks for a conflict. The lock is released at commit or rollback.
-- Advisory locks are database-wide: the table oid is mixed into the lock id
-- so that the same key in two schemas (two applications) never collides.
-- A row committed by the previous holder after our snapshot gives retry,
-- as in Claim.
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(@lock_id::bigint # 'idempotency_key'::regclass::oid::bigint) AS got
), claimed AS (
    INSERT INTO idempotency_key AS k (key_hash, fingerprint, state, locked_until, expires_at)
    SELECT @key_hash::bytea, @fingerprint::bytea, 'claimed',
           now() + make_interval(secs => @lease_s::float8),
           now() + make_interval(secs => @retention_s::float8)
    FROM lock WHERE lock.got
      AND NOT EXISTS (
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
        WHEN p.key_hash IS NOT NULL AND p.expires_at > now() AND p.fingerprint <> @fingerprint::bytea THEN 'mismatch'
        WHEN p.key_hash IS NOT NULL AND p.expires_at > now() AND p.state = 'completed' THEN 'completed'
        WHEN NOT l.got THEN 'in_progress'
        WHEN p.state = 'claimed' AND p.locked_until > now() THEN 'in_progress'
        ELSE 'retry'
    END)::text AS outcome,
    COALESCE(c.fence, 0)::bigint AS fence,
    COALESCE((EXTRACT(EPOCH FROM (p.locked_until - now())) * 1000000)::bigint, 0)::bigint AS retry_after_us,
    COALESCE(p.response_status, 0)::integer AS response_status,
    p.response_headers,
    p.response_body
FROM lock AS l
LEFT JOIN claimed AS c ON true
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

-- name: Release :execrows
UPDATE idempotency_key
SET state = 'released', locked_until = NULL
WHERE key_hash = @key_hash::bytea AND fence = @fence::bigint AND state = 'claimed';

-- name: Purge :execrows
-- A small batch; SKIP LOCKED so that it never waits on a claimer.
DELETE FROM idempotency_key
WHERE key_hash IN (
    SELECT key_hash FROM idempotency_key
    WHERE expires_at <= now() AND (state <> 'claimed' OR locked_until <= now())
    ORDER BY expires_at
    LIMIT @batch::integer
    FOR UPDATE SKIP LOCKED
);
