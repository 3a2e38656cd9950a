-- Transactional outbox (package outbox).
--
-- Rows are written in the producer's own transaction (outbox.EnqueueTx) and
-- driven to PUBLISHED (or DEAD) by a relay. aggregate_seq orders the events
-- of one aggregate: it is taken from outbox_aggregate, whose row for the
-- aggregate stays locked until the enqueuing transaction ends, so two
-- transactions enqueueing for one aggregate get their numbers in commit
-- order and without gaps. The relay never publishes an event while an
-- earlier event of the same aggregate is unpublished (PENDING, PUBLISHING
-- or DEAD).
CREATE TABLE outbox_aggregate (
    aggregate_type text   NOT NULL,
    aggregate_id   text   NOT NULL,
    last_seq       bigint NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
);

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

-- No index refers to status, lease or attempt columns: the two-phase
-- claim (PENDING → PUBLISHING) and a failure mark then change no indexed
-- column and can be HOT updates (fillfactor leaves room on the page for the
-- new row version). Only the final mark (published_at set) moves a row
-- between indexes.
ALTER TABLE outbox_event SET (fillfactor = 50);
-- The claim scans unpublished rows (PENDING, PUBLISHING, DEAD) in id
-- order; the reaper scans them for expired leases.
CREATE INDEX outbox_event_unpublished_idx ON outbox_event (id) WHERE published_at IS NULL;
-- Retention purge.
CREATE INDEX outbox_event_published_idx ON outbox_event (published_at) WHERE published_at IS NOT NULL;
-- The head-of-line check and run extension use the UNIQUE (aggregate_type,
-- aggregate_id, aggregate_seq) index: sequences have no gaps and an event
-- is only published after its predecessor, so "the event at seq-1 is
-- PUBLISHED or purged" means "every earlier event is".

-- Wake idle relays when events commit: NOTIFY is delivered at commit (and
-- not at all on rollback), and one statement-level trigger firing per
-- INSERT keeps the cost independent of the batch size; PostgreSQL folds
-- identical notifications of one transaction into one.
CREATE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
