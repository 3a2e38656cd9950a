package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/inbox/internal/dbsqlc"
)

const (
	// RetentionDefault is how long a processed_event row is kept.
	RetentionDefault = 7 * 24 * time.Hour
	// PurgeIntervalDefault is the pause between two purge passes.
	PurgeIntervalDefault = time.Minute
	// PurgeBatchDefault is how many rows one DELETE removes at most.
	PurgeBatchDefault = 1000
)

// ErrBadBatch is returned by Purge for a batch size below 1.
var ErrBadBatch = errors.New("inbox: purge batch size must be at least 1")

// Purge deletes processed_event rows older than before, at most batch rows
// per statement, until a statement deletes fewer than batch rows or ctx ends.
// Pass a pool, not a transaction: each batch then commits on its own, so row
// locks and WAL stay small and a long purge never blocks consumers for long.
// It returns how many rows it deleted.
//
// What it does not guarantee: an event redelivered after its row was purged
// is processed again. The retention window must exceed how long a duplicate
// can arrive (Kafka retention, outbox replays, consumer lag).
func Purge(ctx context.Context, db DBTX, before time.Time, batch int) (int64, error) {
	if batch < 1 {
		return 0, ErrBadBatch
	}
	q := dbsqlc.New(db)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := q.PurgeBatch(ctx, dbsqlc.PurgeBatchParams{
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

// PurgerConfig configures a Purger. A nil *PurgerConfig means all defaults.
type PurgerConfig struct {
	// Retention is the age after which a row is deleted. Defaults to
	// RetentionDefault (7 days).
	Retention time.Duration
	// Interval is the pause between passes. Defaults to
	// PurgeIntervalDefault (1 minute).
	Interval time.Duration
	// BatchSize is the most rows one DELETE removes. Defaults to
	// PurgeBatchDefault (1000).
	BatchSize int
	// OnError receives errors of a pass; the next pass runs as usual.
	// Defaults to ignoring them.
	OnError func(error)
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

func (c *PurgerConfig) validate() error {
	switch {
	case c.Retention < 0:
		return fmt.Errorf("%w: Retention %v is negative", ErrInvalidConfig, c.Retention)
	case c.Interval < 0:
		return fmt.Errorf("%w: Interval %v is negative", ErrInvalidConfig, c.Interval)
	case c.BatchSize < 0:
		return fmt.Errorf("%w: BatchSize %d is negative", ErrInvalidConfig, c.BatchSize)
	}
	return nil
}

// Purger runs Purge every Interval until stopped.
type Purger struct {
	db  DBTX
	cfg PurgerConfig

	mu      sync.Mutex
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
	passes  chan int64 // test hook: rows deleted per pass, if non-nil
}

// NewPurger returns a Purger over db (a pool). A nil cfg means all defaults.
func NewPurger(db DBTX, cfg *PurgerConfig) (*Purger, error) {
	c := PurgerConfig{}
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if c.Retention == 0 {
		c.Retention = RetentionDefault
	}
	if c.Interval == 0 {
		c.Interval = PurgeIntervalDefault
	}
	if c.BatchSize == 0 {
		c.BatchSize = PurgeBatchDefault
	}
	if c.OnError == nil {
		c.OnError = func(error) {}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Purger{db: db, cfg: c}, nil
}

// Start runs a pass now and then every Interval, in a goroutine. ctx bounds
// the whole run: cancelling it stops the purger like Stop. A second Start,
// or a Start after Stop, does nothing.
func (p *Purger) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil || p.stopped {
		return nil
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.done = make(chan struct{})
	go p.run(ctx, p.done)
	return nil
}

func (p *Purger) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := Purge(ctx, p.db, p.cfg.Now().Add(-p.cfg.Retention), p.cfg.BatchSize)
		if err != nil && ctx.Err() == nil {
			p.cfg.OnError(err)
		}
		if p.passes != nil {
			select {
			case p.passes <- n:
			case <-ctx.Done():
				return
			}
		}
		t.Reset(p.cfg.Interval)
	}
}

// Stop cancels the current pass (a batch in flight rolls back on its own;
// batches already deleted stay deleted) and waits for the goroutine to
// exit, or for ctx. Safe before Start and twice.
func (p *Purger) Stop(ctx context.Context) error {
	p.mu.Lock()
	p.stopped = true
	cancel, done := p.cancel, p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
