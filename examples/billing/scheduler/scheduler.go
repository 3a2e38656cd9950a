// Package scheduler holds billing's background loops: the outbox relay
// (with its stuck-lease reaper and its retention purge) and the inbox
// retention purge, as lifecycle components. The idempotency records'
// purge belongs to the HTTP adapter's middleware (Middleware.Start/Stop).
package scheduler

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// Hooks are the loops' hooks; a nil one is none.
type Hooks struct {
	// Relay is outbox.RelayConfig.Hook.
	Relay func(context.Context, outbox.RelayEvent) context.Context
	// InboxPurge is inbox.PurgerConfig.Hook.
	InboxPurge func(context.Context, inbox.PurgeEvent) context.Context
}

// New returns the outbox relay in two-phase mode (PENDING → PUBLISHING →
// PUBLISHED under a lease, publish outside any transaction; its HardStop
// abandons the batch in hand, whose rows the reaper returns after the
// lease TTL) publishing through pub, each batch bounded by batchTimeout
// (keep it below the relay's shutdown budget, so that the batch in hand
// finishes inside it), and the inbox purger. leaseTTL is how
// long the rows of a relay that died mid-batch stay PUBLISHING before the
// reaper returns them (0: outbox.LeaseTTLDefault); it must exceed twice
// batchTimeout. h's hooks (tracing, metrics) go to the relay and the
// purger.
func New(db *pgxpool.Pool, pub outbox.Publisher, batchTimeout, leaseTTL time.Duration, log *slog.Logger, h Hooks) ([]lifecycle.Component, error) {
	relay, err := outbox.NewRelay(db, pub, &outbox.RelayConfig{Mode: outbox.TwoPhase, BatchTimeout: batchTimeout, LeaseTTL: leaseTTL, Logger: log, Hook: h.Relay})
	if err != nil {
		return nil, err
	}
	purger, err := inbox.NewPurger(db, &inbox.PurgerConfig{Logger: log, Hook: h.InboxPurge})
	if err != nil {
		return nil, err
	}
	return []lifecycle.Component{relay, purger}, nil
}

// WAL is the relay of OUTBOX_MODE=wal in place of New's table relay: a
// WAL outbox relay (package outbox/wal) on slot, reading the events of
// prefix, through a replication connection to the database of
// connString; every instance runs one, one reads the slot, the others
// wait as standbys. It comes with the inbox purger, like New. The table
// relay's reaper and purge have nothing to do in this mode.
func WAL(db *pgxpool.Pool, connString string, pub outbox.Publisher, batchTimeout time.Duration, slot, prefix string, log *slog.Logger, h Hooks) ([]lifecycle.Component, error) {
	relay, err := wal.NewRelay(connString, pub, &wal.Config{Slot: slot, Publication: slot, Prefix: prefix, BatchTimeout: batchTimeout, Logger: log, Hook: h.Relay})
	if err != nil {
		return nil, err
	}
	purger, err := inbox.NewPurger(db, &inbox.PurgerConfig{Logger: log, Hook: h.InboxPurge})
	if err != nil {
		return nil, err
	}
	return []lifecycle.Component{relay, purger}, nil
}
