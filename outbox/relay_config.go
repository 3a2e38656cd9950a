package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem/internal/owner"
)

// Mode selects how the relay publishes.
type Mode int

const (
	// AtLeastOnce claims a batch with FOR UPDATE SKIP LOCKED inside a
	// transaction, publishes, marks the batch and commits, all in that one
	// transaction. A crash after the publish and before the commit
	// republishes the batch; consumers deduplicate by event id. The
	// transaction (and a pooled connection) is held for the publish.
	AtLeastOnce Mode = iota
	// TwoPhase moves the batch PENDING → PUBLISHING under a lease (owner,
	// token, locked_at) in its own short transaction, publishes with no
	// transaction open, then marks PUBLISHED guarded by the token. A crash
	// leaves PUBLISHING rows that the reaper returns to PENDING after
	// LeaseTTL. Still at-least-once on the wire (the crash may follow the
	// produce), but no transaction spans the publish.
	TwoPhase
	// WAL is the mode of package outbox/wal's relay, which reads events
	// from a logical replication slot instead of this table; it appears in
	// that relay's RelayEvents. NewRelay refuses it.
	WAL
)

func (m Mode) String() string {
	switch m {
	case AtLeastOnce:
		return "at-least-once"
	case TwoPhase:
		return "two-phase"
	case WAL:
		return "wal"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// NotifyChannel is the channel relays LISTEN on, and EnqueueTx notifies on
// while a relay sleeps (the doorbell; see the package doc), with the
// outbox table's oid as the payload: the channel is the database's, and
// relays of other schemas' tables ignore it.
const NotifyChannel = "idem_outbox"

// Defaults of RelayConfig.
const (
	BatchSizeDefault      = 500
	BatchTimeoutDefault   = 10 * time.Second
	PollIntervalDefault   = time.Second
	LeaseTTLDefault       = 60 * time.Second
	ReapIntervalDefault   = 5 * time.Second
	MaxAttemptsDefault    = 10
	BackoffMinDefault     = time.Second
	BackoffMaxDefault     = 5 * time.Minute
	RetentionDefault      = 7 * 24 * time.Hour
	PurgeIntervalDefault  = time.Minute
	PurgeBatchSizeDefault = 1000
)

// Limits checked by NewRelay.
const (
	// BatchSizeMax bounds RelayConfig.BatchSize.
	BatchSizeMax = 100_000
	// OwnerMaxLen bounds RelayConfig.Owner, in bytes.
	OwnerMaxLen = 40
)

// RelayConfig configures a Relay. A nil *RelayConfig, like the zero value,
// means all defaults. NewRelay fills in the defaults first and then checks
// the result, so a field left zero is never what fails the check.
type RelayConfig struct {
	// Mode is AtLeastOnce or TwoPhase. Defaults to AtLeastOnce.
	Mode Mode
	// BatchSize is the most events claimed per batch, 1 to BatchSizeMax.
	// Defaults to BatchSizeDefault (500).
	BatchSize int
	// BatchTimeout bounds one batch: claim, publish and mark share one
	// context, context.WithTimeout(context.WithoutCancel(ctx), BatchTimeout),
	// which the hard stop also ends. The publish gets a child of it that
	// ends a quarter of BatchTimeout early, kept for recording the outcome.
	// Defaults to BatchTimeoutDefault (10s).
	BatchTimeout time.Duration
	// PollInterval is how long an idle relay waits when no NOTIFY comes.
	// Defaults to PollIntervalDefault (1s).
	PollInterval time.Duration
	// LeaseTTL is how old a PUBLISHING lease must be before the reaper
	// returns it to PENDING. It must exceed 2 × BatchTimeout: a live
	// relay's batch, publish included, ends by its BatchTimeout, long
	// before its lease can be reaped. Defaults to LeaseTTLDefault (60s).
	LeaseTTL time.Duration
	// ReapInterval is how often the reaper runs (in both modes: an
	// at-least-once relay may share a table with two-phase ones).
	// Defaults to ReapIntervalDefault (5s).
	ReapInterval time.Duration
	// MaxAttempts is how many publish attempts an event gets before it is
	// DEAD. Defaults to MaxAttemptsDefault (10).
	MaxAttempts int
	// BackoffMin is the backoff ceiling after an event's first failed
	// attempt; the ceiling doubles with each further one, up to
	// BackoffMax, and the delay before the retry is drawn uniformly below
	// it (full jitter, package internal/backoff). Defaults to
	// BackoffMinDefault (1s).
	BackoffMin time.Duration
	// BackoffMax caps the retry delay. Defaults to BackoffMaxDefault (5m).
	BackoffMax time.Duration
	// Retention is how long PUBLISHED rows are kept before the purge
	// deletes them; a negative value disables the purge. Defaults to
	// RetentionDefault (7 days).
	Retention time.Duration
	// PurgeInterval is how often the purge runs. Defaults to
	// PurgeIntervalDefault (1m).
	PurgeInterval time.Duration
	// PurgeBatchSize is how many rows one purge statement deletes.
	// Defaults to PurgeBatchSizeDefault (1000).
	PurgeBatchSize int
	// DisableNotify turns off the LISTEN and doorbell connections; the
	// relay then only polls, and enqueues wake nobody. Defaults to false.
	DisableNotify bool
	// Owner names this relay in leases, hook events and the listener's
	// application_name; at most OwnerMaxLen bytes. Defaults to
	// hostname-pid-random.
	Owner string
	// Logger receives warnings (a failed batch, a lost lease, a listener
	// reconnecting); every one of them is also a Hook event. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Hook observes the relay: batches, their outcome, the reaper, the
	// purge and the listener (see RelayEvent). It runs synchronously on
	// the relay's goroutines and must be fast. Defaults to nil (none).
	Hook func(ctx context.Context, e RelayEvent) context.Context
}

// withDefaults returns a copy of c with every zero field filled in.
func (c *RelayConfig) withDefaults() RelayConfig {
	var out RelayConfig
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if out.BatchSize == 0 {
		out.BatchSize = BatchSizeDefault
	}
	def(&out.BatchTimeout, BatchTimeoutDefault)
	def(&out.PollInterval, PollIntervalDefault)
	def(&out.LeaseTTL, LeaseTTLDefault)
	def(&out.ReapInterval, ReapIntervalDefault)
	def(&out.BackoffMin, BackoffMinDefault)
	def(&out.BackoffMax, BackoffMaxDefault)
	def(&out.Retention, RetentionDefault)
	def(&out.PurgeInterval, PurgeIntervalDefault)
	if out.MaxAttempts == 0 {
		out.MaxAttempts = MaxAttemptsDefault
	}
	if out.PurgeBatchSize == 0 {
		out.PurgeBatchSize = PurgeBatchSizeDefault
	}
	if out.Owner == "" {
		out.Owner = owner.Default(OwnerMaxLen)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// validate checks a filled-in config and names the first bad field.
func (c *RelayConfig) validate() error {
	bad := func(field, why string) error { return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, why) }
	switch {
	case c.Mode != AtLeastOnce && c.Mode != TwoPhase:
		return bad("Mode", "is neither AtLeastOnce nor TwoPhase")
	case c.BatchSize < 1 || c.BatchSize > BatchSizeMax:
		return bad("BatchSize", fmt.Sprintf("must be in 1..%d", BatchSizeMax))
	case c.BatchTimeout < 0:
		return bad("BatchTimeout", "must be positive")
	case c.PollInterval < 0:
		return bad("PollInterval", "must be positive")
	case c.LeaseTTL <= 2*c.BatchTimeout:
		return bad("LeaseTTL", fmt.Sprintf("(%v) must exceed 2 × BatchTimeout (%v)", c.LeaseTTL, c.BatchTimeout))
	case c.ReapInterval < 0:
		return bad("ReapInterval", "must be positive")
	case c.MaxAttempts < 1:
		return bad("MaxAttempts", "must be at least 1")
	case c.BackoffMin < 0:
		return bad("BackoffMin", "must be positive")
	case c.BackoffMax < c.BackoffMin:
		return bad("BackoffMax", fmt.Sprintf("(%v) must be at least BackoffMin (%v)", c.BackoffMax, c.BackoffMin))
	case c.PurgeInterval < 0:
		return bad("PurgeInterval", "must be positive")
	case c.PurgeBatchSize < 1:
		return bad("PurgeBatchSize", "must be at least 1")
	case len(c.Owner) > OwnerMaxLen:
		return bad("Owner", fmt.Sprintf("must be at most %d bytes", OwnerMaxLen))
	}
	return nil
}
