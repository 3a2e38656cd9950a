package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/startstop"
)

// StatusIntervalDefault is StatusPollerConfig.Interval's default.
const StatusIntervalDefault = 15 * time.Second

// StatusPollerConfig configures a StatusPoller. A nil *StatusPollerConfig,
// like the zero value, means all defaults. NewStatusPoller fills in the
// defaults first and then checks the result.
type StatusPollerConfig struct {
	// Interval is the time between two reads of GetStatus; each read is
	// bounded by it too, so that a slow database never stacks reads up.
	// Defaults to StatusIntervalDefault (15s).
	Interval time.Duration
	// LeaseTTL is given to GetStatus, for Status.ExpiredLeases; use the
	// relays' RelayConfig.LeaseTTL. Defaults to LeaseTTLDefault (60s).
	LeaseTTL time.Duration
	// Logger receives a warning per failed read of the background loop
	// (each is a StatusReadFailed hook event too). Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Hook observes every read (see StatusEventKind), the loop's and
	// Refresh's. It runs synchronously on the reading goroutine and must
	// be fast. Defaults to nil (none).
	Hook func(ctx context.Context, e StatusEvent) context.Context
}

// StatusEventKind says what a StatusEvent reports.
type StatusEventKind string

// The kinds of StatusEvent. Every StatusReadBegin is followed by exactly
// one StatusReadDone or StatusReadFailed, on the ctx the hook returned.
const (
	// StatusReadBegin: a read starts. The ctx the hook returns becomes the
	// read's context (a tracer's span); it must be derived from the ctx
	// the hook was given, which carries the read's deadline.
	StatusReadBegin StatusEventKind = "status_read_begin"
	// StatusReadDone: the read succeeded, taking Duration; Status is the
	// snapshot, which Last now returns.
	StatusReadDone StatusEventKind = "status_read_done"
	// StatusReadFailed: the read failed with Err after Duration (the
	// database's error, or the read's deadline or a hard stop); Last still
	// returns the snapshot before it.
	StatusReadFailed StatusEventKind = "status_read_failed"
)

// StatusEvent is what a StatusPoller reports to StatusPollerConfig.Hook.
type StatusEvent struct {
	Kind StatusEventKind
	// Status is the snapshot read (StatusReadDone); the hook must not
	// modify it.
	Status *Status
	// Duration is the read's wall time (StatusReadDone, StatusReadFailed).
	Duration time.Duration
	// Err is the read's error (StatusReadFailed).
	Err error
}

// StatusPoller reads GetStatus (events by status, the oldest pending age,
// the expired leases; no DEAD events listed) every Interval in the
// background and keeps the last snapshot, so that a caller who needs the
// backlog often (a metrics collection, a health page) reads memory and
// never the database, however often it comes. Package otel's and package
// prom's backlog gauges are built on it.
//
// Start, Stop and HardStop are the conventions' (docs/conventions.md):
// Stop lets a read in hand finish (it is bounded by Interval), HardStop
// cancels it. A StatusPoller satisfies lifecycle.Component and
// lifecycle.HardStopper.
type StatusPoller struct {
	db  DBTX
	cfg StatusPollerConfig
	svc startstop.Service

	mu   sync.Mutex
	last *Status
}

// NewStatusPoller returns a StatusPoller over db (a pool; any DBTX does).
// A nil cfg means all defaults. A nil db or a negative Interval or
// LeaseTTL is an error wrapping ErrInvalidConfig that names it.
func NewStatusPoller(db DBTX, cfg *StatusPollerConfig) (*StatusPoller, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &StatusPoller{db: db, cfg: c}, nil
}

// withDefaults returns a copy of c with every zero field filled in.
func (c *StatusPollerConfig) withDefaults() StatusPollerConfig {
	var out StatusPollerConfig
	if c != nil {
		out = *c
	}
	if out.Interval == 0 {
		out.Interval = StatusIntervalDefault
	}
	if out.LeaseTTL == 0 {
		out.LeaseTTL = LeaseTTLDefault
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// validate checks a filled-in config and names the first bad field.
func (c *StatusPollerConfig) validate() error {
	switch {
	case c.Interval < 0:
		return fmt.Errorf("%w: Interval %v is negative", ErrInvalidConfig, c.Interval)
	case c.LeaseTTL < 0:
		return fmt.Errorf("%w: LeaseTTL %v is negative", ErrInvalidConfig, c.LeaseTTL)
	}
	return nil
}

// Last returns the snapshot of the last read that succeeded, or nil
// before the first. After a failed read it is still the one before: a
// collector reports stale values rather than none. The snapshot is shared
// by every caller and must not be modified.
func (p *StatusPoller) Last() *Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// Refresh reads the status once, now, bounded by ctx and Interval, and on
// success makes it Last. Its error is GetStatus's ("outbox: status: …",
// wrapping the database's error) or the context's. It is safe to call
// concurrently, with the background loop running or not; of concurrent
// reads, the one that ends last is kept.
func (p *StatusPoller) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Interval)
	defer cancel()
	ctx = idem.CallHook(p.cfg.Hook, ctx, StatusEvent{Kind: StatusReadBegin})
	start := time.Now()
	st, err := GetStatus(ctx, p.db, p.cfg.LeaseTTL, 0)
	if err != nil {
		idem.CallHook(p.cfg.Hook, ctx, StatusEvent{Kind: StatusReadFailed, Duration: time.Since(start), Err: err})
		return err
	}
	p.mu.Lock()
	p.last = st
	p.mu.Unlock()
	idem.CallHook(p.cfg.Hook, ctx, StatusEvent{Kind: StatusReadDone, Status: st, Duration: time.Since(start)})
	return nil
}

// Start reads at once, then every Interval, on a goroutine, until a stop.
// A failed read is logged (Logger) and reported (Hook), and the next one
// comes an Interval later as usual.
func (p *StatusPoller) Start(ctx context.Context) error {
	return p.svc.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, p.loop)
		return nil
	})
}

// Stop ends the loop; a read in hand finishes (it is bounded by
// Interval). It waits for the goroutine, or returns ctx.Err() when ctx
// ends first. Safe before Start, twice and concurrently.
func (p *StatusPoller) Stop(ctx context.Context) error { return p.svc.Stop(ctx) }

// HardStop ends the loop and cancels a read in hand.
func (p *StatusPoller) HardStop(ctx context.Context) error { return p.svc.HardStop(ctx) }

func (p *StatusPoller) loop(ctx context.Context) {
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
		// A read that a hard stop cancelled is no failure to warn about:
		// the operator asked for it.
		if err := p.Refresh(work); err != nil && work.Err() == nil {
			p.cfg.Logger.WarnContext(work, "outbox status poller: read failed", "error", err)
		}
		t.Reset(p.cfg.Interval)
	}
}
