-- A DISCARDED row has no state to go back to: turning it DEAD would block
-- its aggregate again after later events were published, and deleting it
-- would lose it silently. Refuse instead; the operator decides.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM outbox_event WHERE status = 'DISCARDED') THEN
        RAISE EXCEPTION 'outbox_event has DISCARDED rows: delete or archive them before reverting 005';
    END IF;
END
$$;
ALTER TABLE outbox_event DROP COLUMN audit;
ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_status_check;
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_status_check
    CHECK (status IN ('PENDING', 'PUBLISHING', 'PUBLISHED', 'DEAD'));
