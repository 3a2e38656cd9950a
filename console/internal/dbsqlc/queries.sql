-- Read-only views of the console. Changes go through outbox.Admin and
-- idempotency.PostgresStore, never through SQL of the console's own.

-- name: KeyCounts :one
SELECT
    count(*) FILTER (WHERE state = 'claimed' AND locked_until > now() AND expires_at > now())::bigint AS in_progress,
    count(*) FILTER (WHERE state = 'claimed' AND locked_until <= now() AND expires_at > now())::bigint AS lease_expired,
    count(*) FILTER (WHERE state = 'released' AND expires_at > now())::bigint AS released,
    count(*) FILTER (WHERE state = 'completed' AND expires_at > now())::bigint AS completed,
    count(*) FILTER (WHERE expires_at <= now())::bigint AS expired,
    coalesce(min(expires_at) FILTER (WHERE expires_at > now()), now())::timestamptz AS next_expiry
FROM idempotency_key;

-- name: KeysInProgress :many
-- Claimed keys, oldest first. Only the hash is stored: the page shows
-- its prefix.
SELECT key_hash, locked_until, created_at, expires_at, (locked_until > now())::bool AS lease_live
FROM idempotency_key
WHERE state = 'claimed' AND expires_at > now()
ORDER BY created_at
LIMIT sqlc.arg(max_rows)::int;

-- name: InboxByConsumer :many
SELECT consumer_id, count(*)::bigint AS processed, max(processed_at)::timestamptz AS last_processed,
       count(*) FILTER (WHERE processed_at > now() - interval '1 hour')::bigint AS last_hour
FROM processed_event
GROUP BY consumer_id
ORDER BY consumer_id;
