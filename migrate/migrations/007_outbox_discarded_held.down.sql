-- Nothing to undo: DISCARDED events were meant to be held under version 6
-- too (see the up script).
SELECT 1;
