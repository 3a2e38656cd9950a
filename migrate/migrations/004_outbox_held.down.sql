CREATE INDEX outbox_event_unpublished_idx ON outbox_event (id) WHERE published_at IS NULL;
DROP INDEX IF EXISTS outbox_event_claim_idx;
DROP INDEX IF EXISTS outbox_event_claim_agg_idx;
DROP INDEX IF EXISTS outbox_aggregate_blocked_idx;
ALTER TABLE outbox_event DROP COLUMN IF EXISTS held;
ALTER TABLE outbox_aggregate DROP COLUMN IF EXISTS blocked;
