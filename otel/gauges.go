package idemotel

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/outbox"
)

// GaugesIntervalDefault is OutboxGaugesConfig.Interval's default:
// outbox.StatusIntervalDefault.
const GaugesIntervalDefault = outbox.StatusIntervalDefault

// OutboxGaugesConfig configures OutboxGauges: it is the poller's config
// (Interval, LeaseTTL, Logger, and Hook to observe each read). A nil one
// means all defaults.
type OutboxGaugesConfig = outbox.StatusPollerConfig

// OutboxGauges reads the outbox's backlog (outbox.GetStatus: events by
// status, the oldest pending age) every Interval in the background and
// reports the last read through observable gauges, idem.outbox.events
// {status} and idem.outbox.oldest_pending_age: a collection (an export, a
// scrape) never queries the database, however often it comes. Nothing is
// reported before the first read succeeded; after a failed read the last
// values stay.
//
// The reading is an outbox.StatusPoller's, whose methods OutboxGauges
// has: Start, Stop and HardStop are the conventions' (Stop ends the read
// in hand on its own deadline, HardStop cancels it), Refresh reads once
// now, Last returns the last read (nil before the first).
type OutboxGauges struct {
	*statusPoller
}

// statusPoller names the embedded poller with an unexported name, so that
// OutboxGauges gets its methods without exposing it as a field.
type statusPoller = outbox.StatusPoller

// ErrInvalidConfig is returned for a bad OutboxGaugesConfig; the error
// names the field and wraps outbox.ErrInvalidConfig too.
var ErrInvalidConfig = errors.New("idemotel: invalid config")

// OutboxGauges registers the backlog gauges with the Instrumentation's
// meter; Start runs the reads. Make one per outbox table.
func (i *Instrumentation) OutboxGauges(db outbox.DBTX, cfg *OutboxGaugesConfig) (*OutboxGauges, error) {
	p, err := outbox.NewStatusPoller(db, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	g := &OutboxGauges{p}
	events, err := i.meter.Int64ObservableGauge(MetricOutboxEvents, metric.WithUnit("{event}"),
		metric.WithDescription("Outbox events by status (pending, publishing, published, dead), as of the last background read."))
	if err != nil {
		return nil, err
	}
	oldest, err := i.meter.Float64ObservableGauge(MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest PENDING outbox event, as of the last background read (0 when none)."))
	if err != nil {
		return nil, err
	}
	_, err = i.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := g.Last()
		if st == nil {
			return nil
		}
		for _, s := range []struct {
			name string
			n    int64
		}{{"pending", st.Pending}, {"publishing", st.Publishing}, {"published", st.Published}, {"dead", st.Dead}} {
			o.ObserveInt64(events, s.n, metric.WithAttributes(attribute.String("status", s.name)))
		}
		o.ObserveFloat64(oldest, st.OldestPending.Seconds())
		return nil
	}, events, oldest)
	if err != nil {
		return nil, err
	}
	return g, nil
}
