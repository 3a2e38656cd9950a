DROP TABLE IF EXISTS outbox_event;
DROP FUNCTION IF EXISTS outbox_event_notify();
DROP TABLE IF EXISTS outbox_aggregate;
