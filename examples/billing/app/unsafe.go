package app

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/outbox"
)

// dropOnePublisher is BILLING_UNSAFE=publish: a relay publisher that loses
// one event. The first OrderConfirmed it is given is left out of the
// produce and reported delivered, so the relay marks it PUBLISHED although
// no record of it exists: the lost event the chaos harness's Kafka audit
// must name (its order is also never charged). Every other event goes
// through the real publisher.
type dropOnePublisher struct {
	next    outbox.Publisher
	log     *slog.Logger
	dropped atomic.Bool
}

func (p *dropOnePublisher) Publish(ctx context.Context, events []outbox.Event) error {
	drop := -1
	for i, e := range events {
		if e.EventType == usecase.EventOrderConfirmed && p.dropped.CompareAndSwap(false, true) {
			drop = i
			break
		}
	}
	if drop < 0 {
		return p.next.Publish(ctx, events)
	}
	p.log.Error("UNSAFE MODE: BILLING_UNSAFE=publish: dropping an event and reporting it published",
		"event_id", events[drop].EventID, "aggregate_id", events[drop].AggregateID, "seq", events[drop].Seq)
	rest := make([]outbox.Event, 0, len(events)-1)
	rest = append(append(rest, events[:drop]...), events[drop+1:]...)
	errs := make([]error, len(events))
	if len(rest) > 0 {
		err := p.next.Publish(ctx, rest)
		var be *outbox.BatchError
		switch {
		case err == nil:
		case errors.As(err, &be) && len(be.Errs) == len(rest):
			copy(errs, be.Errs[:drop])
			copy(errs[drop+1:], be.Errs[drop:])
		default:
			for i := range errs {
				errs[i] = err
			}
		}
	}
	errs[drop] = nil
	for _, err := range errs {
		if err != nil {
			return &outbox.BatchError{Errs: errs}
		}
	}
	return nil
}
