-- Consumer-side deduplication (package inbox): one row per event a consumer
-- has handled, written in the same transaction as the handler's effects.
CREATE TABLE processed_event (
    consumer_id  text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_id, event_id)
);

CREATE INDEX processed_event_processed_at_idx ON processed_event (processed_at);
