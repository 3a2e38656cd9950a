package idemprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/outbox"
)

// GaugesIntervalDefault is OutboxGaugesConfig.Interval's default:
// outbox.StatusIntervalDefault.
const GaugesIntervalDefault = outbox.StatusIntervalDefault

// ErrInvalidConfig is returned for a bad OutboxGaugesConfig; the error
// names the field and wraps outbox.ErrInvalidConfig too.
var ErrInvalidConfig = errors.New("idemprom: invalid config")

// OutboxGaugesConfig configures OutboxGauges: it is the poller's config
// (Interval, LeaseTTL, Logger, and Hook to observe each read). A nil one
// means all defaults.
type OutboxGaugesConfig = outbox.StatusPollerConfig

// OutboxGauges reads the outbox's backlog (outbox.GetStatus) every
// Interval in the background and serves the last read to every scrape as
// idem_outbox_events{status} and idem_outbox_oldest_pending_age_seconds:
// scrapes, however many, never query the database. Nothing is served
// before the first read succeeded; after a failed read the last values
// stay.
//
// The reading is an outbox.StatusPoller's, whose methods OutboxGauges
// has: Start, Stop and HardStop are the conventions', Refresh reads once
// now, Last returns the last read (nil before the first).
type OutboxGauges struct {
	*statusPoller

	events, oldest *prometheus.Desc
}

// statusPoller names the embedded poller with an unexported name, so that
// OutboxGauges gets its methods without exposing it as a field.
type statusPoller = outbox.StatusPoller

// OutboxGauges registers the backlog gauges with m's registry; Start runs
// the reads. Make one per registry.
func (m *Metrics) OutboxGauges(db outbox.DBTX, cfg *OutboxGaugesConfig) (*OutboxGauges, error) {
	p, err := outbox.NewStatusPoller(db, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	g := &OutboxGauges{statusPoller: p,
		events: prometheus.NewDesc(MetricOutboxEvents, "Outbox events by status (pending, publishing, published, dead), as of the last background read.", []string{"status"}, nil),
		oldest: prometheus.NewDesc(MetricOutboxOldestAge, "Age of the oldest PENDING outbox event, as of the last background read (0 when none).", nil, nil),
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
