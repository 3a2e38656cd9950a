// Package scheduler holds billing's background loops: the outbox relay
// (with its stuck-lease reaper and its retention purge) and the inbox
// retention purge, as lifecycle components. The idempotency records'
// purge belongs to the HTTP adapter's middleware (Middleware.Start/Stop).
package scheduler

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/outbox"
)

// DB is what the loops need: a pool.
type DB interface {
	outbox.DB
}

// Relay is the outbox relay in two-phase mode (PENDING → PUBLISHING →
// PUBLISHED under a lease, publish outside any transaction) with the
// lifecycle hard stop.
type Relay struct{ *outbox.Relay }

// HardStop cancels the batch in hand: its rows stay PUBLISHING until the
// reaper returns them after the lease TTL, and are published again (the
// consumers deduplicate by event id).
func (r *Relay) HardStop(ctx context.Context) error { return r.StopAndCancel(ctx) }

// New returns the relay publishing through pub, each batch bounded by
// batchTimeout (keep it below the relay's shutdown budget, so that the
// batch in hand finishes inside it), and the inbox purger. leaseTTL is how
// long the rows of a relay that died mid-batch stay PUBLISHING before the
// reaper returns them (0: outbox.LeaseTTLDefault); it must exceed twice
// batchTimeout.
func New(db DB, pub outbox.Publisher, batchTimeout, leaseTTL time.Duration, log *slog.Logger) ([]lifecycle.Component, error) {
	relay, err := outbox.NewRelay(db, pub, &outbox.RelayConfig{Mode: outbox.TwoPhase, BatchTimeout: batchTimeout, LeaseTTL: leaseTTL, Logger: log})
	if err != nil {
		return nil, err
	}
	purger, err := inbox.NewPurger(db, &inbox.PurgerConfig{Logger: log})
	if err != nil {
		return nil, err
	}
	return []lifecycle.Component{&Relay{relay}, purger}, nil
}
