package idemprom

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/internal/startstop"
	"github.com/idemkit/idem/outbox"
)

// GaugesIntervalDefault is OutboxGaugesConfig.Interval's default.
const GaugesIntervalDefault = 15 * time.Second

// ErrInvalidConfig is returned for a bad OutboxGaugesConfig; the error
// names the field.
var ErrInvalidConfig = errors.New("idemprom: invalid config")

// OutboxGaugesConfig configures OutboxGauges. A nil one means all
// defaults.
type OutboxGaugesConfig struct {
	// Interval is the time between two reads of outbox.GetStatus; each
	// read is bounded by it too. Defaults to GaugesIntervalDefault (15s).
	Interval time.Duration
	// LeaseTTL is given to outbox.GetStatus. Defaults to
	// outbox.LeaseTTLDefault.
	LeaseTTL time.Duration
	// Logger receives failed reads. Defaults to slog.Default().
	Logger *slog.Logger
}

// OutboxGauges reads the outbox's backlog (outbox.GetStatus) every
// Interval in the background and serves the last read to every scrape as
// idem_outbox_events{status} and idem_outbox_oldest_pending_age_seconds:
// scrapes, however many, never query the database. Nothing is served
// before the first read succeeded; after a failed read the last values
// stay. Start, Stop and HardStop are the conventions'.
type OutboxGauges struct {
	db  outbox.DBTX
	cfg OutboxGaugesConfig
	log *slog.Logger
	svc startstop.Service

	events, oldest *prometheus.Desc

	mu sync.Mutex
	st *outbox.Status
}

// OutboxGauges registers the backlog gauges with m's registry; Start runs
// the reads. Make one per registry.
func (m *Metrics) OutboxGauges(db outbox.DBTX, cfg *OutboxGaugesConfig) (*OutboxGauges, error) {
	var c OutboxGaugesConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Interval == 0 {
		c.Interval = GaugesIntervalDefault
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = outbox.LeaseTTLDefault
	}
	switch {
	case db == nil:
		return nil, fmt.Errorf("%w: the db is nil", ErrInvalidConfig)
	case c.Interval < 0:
		return nil, fmt.Errorf("%w: Interval %v is negative", ErrInvalidConfig, c.Interval)
	case c.LeaseTTL < 0:
		return nil, fmt.Errorf("%w: LeaseTTL %v is negative", ErrInvalidConfig, c.LeaseTTL)
	}
	g := &OutboxGauges{db: db, cfg: c, log: c.Logger,
		events: prometheus.NewDesc(MetricOutboxEvents, "Outbox events by status (pending, publishing, published, dead), as of the last background read.", []string{"status"}, nil),
		oldest: prometheus.NewDesc(MetricOutboxOldestAge, "Age of the oldest PENDING outbox event, as of the last background read (0 when none).", nil, nil),
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if err := m.reg.Register(g); err != nil {
		return nil, err
	}
	return g, nil
}

// Describe implements prometheus.Collector.
func (g *OutboxGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.events
	ch <- g.oldest
}

// Collect implements prometheus.Collector: the last read, no I/O.
func (g *OutboxGauges) Collect(ch chan<- prometheus.Metric) {
	st := g.Last()
	if st == nil {
		return
	}
	for _, s := range []struct {
		name string
		n    int64
	}{{"pending", st.Pending}, {"publishing", st.Publishing}, {"published", st.Published}, {"dead", st.Dead}} {
		ch <- prometheus.MustNewConstMetric(g.events, prometheus.GaugeValue, float64(s.n), s.name)
	}
	ch <- prometheus.MustNewConstMetric(g.oldest, prometheus.GaugeValue, st.OldestPending.Seconds())
}

// Last returns the last status read, or nil before the first.
func (g *OutboxGauges) Last() *outbox.Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st
}

// Refresh reads the status once, now, bounded by ctx and Interval.
func (g *OutboxGauges) Refresh(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Interval)
	defer cancel()
	st, err := outbox.GetStatus(ctx, g.db, g.cfg.LeaseTTL, 0)
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.st = st
	g.mu.Unlock()
	return nil
}

// Start reads at once, then every Interval, until a stop.
func (g *OutboxGauges) Start(ctx context.Context) error {
	return g.svc.Start(ctx, func(ctx context.Context, grp *startstop.Group) error {
		grp.Go(ctx, g.loop)
		return nil
	})
}

// Stop ends the loop; a read in hand finishes (it is bounded by
// Interval).
func (g *OutboxGauges) Stop(ctx context.Context) error { return g.svc.Stop(ctx) }

// HardStop ends the loop and cancels a read in hand.
func (g *OutboxGauges) HardStop(ctx context.Context) error { return g.svc.HardStop(ctx) }

func (g *OutboxGauges) loop(ctx context.Context) {
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
		if err := g.Refresh(work); err != nil && work.Err() == nil {
			g.log.Warn("idemprom: outbox status", "error", err)
		}
		t.Reset(g.cfg.Interval)
	}
}
