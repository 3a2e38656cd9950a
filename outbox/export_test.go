package outbox

import "github.com/idemkit/idem/outbox/internal/dbsqlc"

// ClaimLockedSQL is the at-least-once claim ($1, $2: the cursor aggregate type and id; $3: the batch size).
const ClaimLockedSQL = dbsqlc.ClaimLockedSQL
