DROP INDEX outbox_event_held_idx;
CREATE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_outbox', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
