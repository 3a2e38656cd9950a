package outbox

import "github.com/idemkit/idem/outbox/internal/dbsqlc"

// ClaimLockedSQL is the at-least-once claim ($1: the batch size).
const ClaimLockedSQL = dbsqlc.ClaimLockedSQL
