package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox/internal/dbsqlc"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/startstop"
)

const (
	// RetentionDefault is how long a processed_event row is kept.
	RetentionDefault = 7 * 24 * time.Hour
	// PurgeIntervalDefault is the pause between two purge passes.
	PurgeIntervalDefault = time.Minute
	// PurgeBatchSizeDefault is how many rows one DELETE removes at most.
	PurgeBatchSizeDefault = 1000
)

// ErrBadBatch is returned by Purge for a batch size below 1.
var ErrBadBatch = errors.New("inbox: purge batch size must be at least 1")

// Purge deletes processed_event rows older than before, at most batch rows
// per statement, until a statement deletes fewer than batch rows or ctx ends.
// Pass a pool, not a transaction: each batch then commits on its own, so row
// locks and WAL stay small and a long purge never blocks consumers for long.
// It returns how many rows it deleted. ctx governs every statement.
//
// What it does not guarantee: an event redelivered after its row was purged
// is processed again. The retention window must exceed how long a duplicate
// can arrive (Kafka retention, outbox replays, consumer lag).
func Purge(ctx context.Context, db DBTX, before time.Time, batch int) (int64, error) {
	return purge(ctx, ctx, db, before, batch)
}

// purge is Purge with two contexts: between batches it stops once next
// ends (a soft stop); each statement runs on stmt (ended by a hard stop).
func purge(next, stmt context.Context, db DBTX, before time.Time, batch int) (int64, error) {
	if batch < 1 {
		return 0, ErrBadBatch
	}
	q := dbsqlc.New(db)
	var total int64
	for i := 0; ; i++ {
		if i > 0 {
			// A batch is committed and the next one is not: a crash here
			// leaves a partly purged table, which the next pass finishes.
			if err := failpoint.Inject(failpoint.PurgeMidBatch); err != nil {
				return total, fmt.Errorf("inbox: purge: %w", err)
			}
		}
		if err := next.Err(); err != nil {
			return total, err
		}
		n, err := q.PurgeBatch(stmt, dbsqlc.PurgeBatchParams{
			Before:    pgtype.Timestamptz{Time: before, Valid: true},
			BatchSize: int32(min(batch, 1<<30)),
		})
		total += n
		if err != nil {
			return total, fmt.Errorf("inbox: purge: %w", err)
		}
		if n < int64(batch) {
			return total, nil
		}
	}
}

// PurgeKind says what a PurgeEvent reports.
type PurgeKind string

const (
	// PurgeBegin: a pass begins. The ctx the hook returns is the pass's
	// ctx (a tracer's span).
	PurgeBegin PurgeKind = "purge-begin"
	// PurgeDone: a pass ended: it deleted every row past retention, or a
	// stop ended it early. Deleted and Duration are set.
	PurgeDone PurgeKind = "purge-done"
	// PurgeFailed: a pass ended on an error (Err); Deleted rows were
	// deleted before it. The next pass runs as usual.
	PurgeFailed PurgeKind = "purge-failed"
)

// PurgeEvent is what a Purger's hook receives.
type PurgeEvent struct {
	Kind PurgeKind
	// Deleted is how many rows the pass deleted (PurgeDone, PurgeFailed).
	Deleted int64
	// Before is the pass's cut-off: rows processed before it are deleted.
	Before time.Time
	// Duration is the pass's wall time (PurgeDone, PurgeFailed).
	Duration time.Duration
	// Err is the error that ended the pass (PurgeFailed).
	Err error
}

// PurgerConfig configures a Purger. A nil *PurgerConfig means all defaults.
type PurgerConfig struct {
	// Retention is the age after which a row is deleted. Defaults to
	// RetentionDefault (7 days).
	Retention time.Duration
	// PurgeInterval is the pause between passes. Defaults to
	// PurgeIntervalDefault (1 minute).
	PurgeInterval time.Duration
	// PurgeBatchSize is the most rows one DELETE removes. Defaults to
	// PurgeBatchSizeDefault (1000).
	PurgeBatchSize int
	// Hook observes every pass (see PurgeKind): the place for metrics and
	// traces. It runs on the purger's goroutine and must be fast. Defaults
	// to nil.
	Hook func(ctx context.Context, e PurgeEvent) context.Context
	// Logger receives a line per failed pass. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

func (c *PurgerConfig) setDefaults() {
	if c.Retention == 0 {
		c.Retention = RetentionDefault
	}
	if c.PurgeInterval == 0 {
		c.PurgeInterval = PurgeIntervalDefault
	}
	if c.PurgeBatchSize == 0 {
		c.PurgeBatchSize = PurgeBatchSizeDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

func (c *PurgerConfig) validate() error {
	switch {
	case c.Retention < 0:
		return fmt.Errorf("%w: Retention %v is negative", ErrInvalidConfig, c.Retention)
	case c.PurgeInterval < 0:
		return fmt.Errorf("%w: PurgeInterval %v is negative", ErrInvalidConfig, c.PurgeInterval)
	case c.PurgeBatchSize < 0:
		return fmt.Errorf("%w: PurgeBatchSize %d is negative", ErrInvalidConfig, c.PurgeBatchSize)
	}
	return nil
}

// Purger runs Purge every PurgeInterval until stopped. It satisfies
// lifecycle.Component and lifecycle.HardStopper.
type Purger struct {
	db  DBTX
	cfg PurgerConfig
	ss  startstop.Service
}

// NewPurger returns a Purger over db (a pool). A nil cfg means all defaults.
func NewPurger(db DBTX, cfg *PurgerConfig) (*Purger, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	c := PurgerConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Purger{db: db, cfg: c}, nil
}

// Start runs a pass now and then every PurgeInterval, on a goroutine. ctx
// lends its values to the run; cancelling it after Start returned changes
// nothing (Stop and HardStop end the run). Start on a running purger does
// nothing; Start after a stop starts a fresh run.
func (p *Purger) Start(ctx context.Context) error {
	return p.ss.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, p.run)
		return nil
	})
}

// Stop is the soft stop: the batch in flight finishes and commits, no
// further batch or pass starts. It waits for the goroutine, or returns
// ctx.Err() when ctx ends first. Safe before Start, twice and concurrently.
func (p *Purger) Stop(ctx context.Context) error { return p.ss.Stop(ctx) }

// HardStop is Stop that also cancels the batch in flight (it rolls back;
// batches already deleted stay deleted).
func (p *Purger) HardStop(ctx context.Context) error { return p.ss.HardStop(ctx) }

func (p *Purger) run(ctx context.Context) {
	work, cancel := startstop.WorkContext(ctx)
	defer cancel()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		before := p.cfg.Now().Add(-p.cfg.Retention)
		pctx := idem.CallHook(p.cfg.Hook, work, PurgeEvent{Kind: PurgeBegin, Before: before})
		start := time.Now()
		n, err := purge(ctx, pctx, p.db, before, p.cfg.PurgeBatchSize)
		e := PurgeEvent{Kind: PurgeDone, Deleted: n, Before: before, Duration: time.Since(start)}
		// A stop that ended the pass (between batches, or by cancelling the
		// batch in flight) is not a failure: the next run goes on.
		if err != nil && ctx.Err() == nil {
			e.Kind, e.Err = PurgeFailed, err
			p.cfg.Logger.Warn("inbox purge", "deleted", n, "error", err)
		}
		idem.CallHook(p.cfg.Hook, pctx, e)
		t.Reset(p.cfg.PurgeInterval)
	}
}
