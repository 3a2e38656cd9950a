-- Transactional outbox (package outbox).
--
-- Rows are written in the producer's own transaction and driven to
-- PUBLISHED (or DEAD) by a relay. aggregate_seq orders the events of one
-- aggregate; the relay never publishes an event while an earlier event of
-- the same aggregate is still unpublished.
CREATE TABLE outbox_event (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic          text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    aggregate_seq  bigint      NOT NULL,
    event_id       text        NOT NULL UNIQUE,
    event_type     text        NOT NULL,
    payload        bytea       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}',
    status         text        NOT NULL DEFAULT 'PENDING'
                               CHECK (status IN ('PENDING', 'PUBLISHING', 'PUBLISHED', 'DEAD')),
    attempts       integer     NOT NULL DEFAULT 0,
    available_at   timestamptz NOT NULL DEFAULT now(),
    lease_owner    text,
    lease_token    bigint,
    locked_at      timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz,
    last_error     text,
    UNIQUE (aggregate_type, aggregate_id, aggregate_seq)
);

CREATE INDEX outbox_event_pending_idx ON outbox_event (id) WHERE status = 'PENDING';
CREATE INDEX outbox_event_publishing_idx ON outbox_event (locked_at) WHERE status = 'PUBLISHING';
CREATE INDEX outbox_event_published_idx ON outbox_event (published_at) WHERE status = 'PUBLISHED';
