-- Incoming Idempotency-Key records (package idempotency).
--
-- key_hash is SHA-256 over (scope, method, route, key): the key itself is
-- never stored in clear. A row is either claimed (locked_until set, no
-- response yet) or completed (response_* set). The fence token increases on
-- every takeover so that a late original cannot overwrite the new owner.
CREATE TABLE idempotency_key (
    key_hash         bytea       PRIMARY KEY,
    fingerprint      bytea       NOT NULL,
    state            text        NOT NULL DEFAULT 'claimed'
                                 CHECK (state IN ('claimed', 'completed')),
    fence            bigint      NOT NULL DEFAULT 1,
    locked_until     timestamptz,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL
);

CREATE INDEX idempotency_key_expires_at_idx ON idempotency_key (expires_at);
