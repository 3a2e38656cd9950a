package outbox

import (
	"context"

	"github.com/idemkit/idem/outbox/internal/dbsqlc"
)

// ClaimLockedSQL is the at-least-once claim ($1, $2: the cursor aggregate type and id; $3: the window; $4: the batch size). It writes: run it in a transaction that rolls back.
const ClaimLockedSQL = dbsqlc.ClaimLockedSQL

// ArmDoorbell and DisarmDoorbell run the relay's doorbell statements on db.
func ArmDoorbell(ctx context.Context, db dbsqlc.DBTX) (string, error) {
	return dbsqlc.New(db).ArmDoorbell(ctx)
}
func DisarmDoorbell(ctx context.Context, db dbsqlc.DBTX) error {
	return dbsqlc.New(db).DisarmDoorbell(ctx)
}

// BeginClaim is the statement that opens a claim's transaction.
const BeginClaim = beginClaim

// OnSleep makes r call f as its loop goes to sleep (armed: holding the
// doorbell). Set it before Start.
func OnSleep(r *Relay, f func(armed bool)) { r.onSleep = f }

// Listening reports whether r's LISTEN connection is up.
func Listening(r *Relay) bool { return r.listening.Load() }
