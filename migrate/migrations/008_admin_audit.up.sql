-- The audit trail of operator actions that can make work run twice:
-- releasing or forgetting an idempotency key (`idem keys release`, the
-- console's release button) and redriving a dead-letter topic (`idem dlq
-- redrive`, the console's redrive button). One row per action, written
-- in the same statement as the action for keys, so an action without its
-- row cannot commit. subject names what was acted on: a key's hash in hex
-- (never the key or its principal), or a topic. detail is the action's
-- outcome as JSON (the fence released, the records moved).
CREATE TABLE idem_admin_audit (
    id      bigserial   PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    action  text        NOT NULL,
    subject text        NOT NULL,
    actor   text        NOT NULL,
    reason  text        NOT NULL,
    detail  jsonb
);

CREATE INDEX idem_admin_audit_at_idx ON idem_admin_audit (at);
