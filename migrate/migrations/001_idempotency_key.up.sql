-- Incoming Idempotency-Key records (package idempotency).
--
-- key_hash is SHA-256 over (scope, method, route, key): neither the key nor
-- the principal is stored in clear. A row is
--   claimed   a handler owns it until locked_until (database time);
--   released  the last run ended without a storable response (5xx, 408, 429,
--             panic, client gone): the next request with the same
--             fingerprint claims it again at once;
--   completed response_* hold the answer replayed until expires_at.
-- fence comes from a sequence, so it increases on every claim and takeover
-- of a key and is never reused, even after a purge: a late original whose
-- claim was taken over cannot overwrite the new owner's result.
CREATE SEQUENCE idempotency_key_fence_seq;

CREATE TABLE idempotency_key (
    key_hash         bytea       PRIMARY KEY,
    fingerprint      bytea       NOT NULL,
    state            text        NOT NULL DEFAULT 'claimed'
                                 CHECK (state IN ('claimed', 'released', 'completed')),
    fence            bigint      NOT NULL DEFAULT nextval('idempotency_key_fence_seq'),
    locked_until     timestamptz,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL
);

CREATE INDEX idempotency_key_expires_at_idx ON idempotency_key (expires_at);
