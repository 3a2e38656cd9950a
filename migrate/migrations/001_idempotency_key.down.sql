DROP TABLE IF EXISTS idempotency_key;
DROP SEQUENCE IF EXISTS idempotency_key_fence_seq;
