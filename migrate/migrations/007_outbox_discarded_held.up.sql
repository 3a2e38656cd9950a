-- DISCARDED events are held (package outbox, Admin.Discard): out of the
-- claim's indexes, where an event that will never be published would sit
-- as its aggregate's first unpublished row and keep every later event from
-- being a head. Until this version a release of the aggregate from before
-- the discarded event (the blocked sweep's, which releases from sequence
-- 0, or a requeue of an earlier DEAD event) cleared the flag, and the
-- aggregate then waited for ever; ReleaseAggregates now leaves DISCARDED
-- events held, and this holds again those it released.
UPDATE outbox_event SET held = true
WHERE status = 'DISCARDED' AND NOT held AND published_at IS NULL;
