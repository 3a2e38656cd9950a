-- The ledger of dead-letter redrives (package kafka, DLQ.Redrive with a
-- database; `idem dlq redrive`, the console's redrive button): one row per
-- dead-letter record ever redriven, keyed by its topic/partition/offset,
-- pointing at the idem_admin_audit row of the redrive that last moved it.
-- A redrive takes a transaction-scoped advisory lock on its dead-letter
-- topic, skips the records this table holds (unless forced), produces the
-- rest and inserts their rows and its audit row before it commits: two
-- redrives of one record at the same time publish it once.
CREATE TABLE idem_dlq_redrive (
    dlq_topic     text        NOT NULL,
    dlq_partition integer     NOT NULL,
    dlq_offset    bigint      NOT NULL,
    target        text        NOT NULL,
    audit_id      bigint      NOT NULL REFERENCES idem_admin_audit (id),
    redrives      integer     NOT NULL DEFAULT 1,
    first_at      timestamptz NOT NULL DEFAULT now(),
    last_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dlq_topic, dlq_partition, dlq_offset)
);
