// Package consumer holds billing's Kafka consumers: the orders.events
// consumer that turns OrderConfirmed into a ChargeRequested command (inbox +
// outbox in one transaction), and the charge worker that executes the
// commands against the payment provider.
package consumer

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/kafka"
)

// OrderGroup is the consumer group (and processed_event consumer id) of the
// orders.events consumer.
const OrderGroup = "billing-service"

// NewOrderConsumer returns the orders.events consumer: for each
// OrderConfirmed, in one transaction, the event's processed_event row and
// the ChargeRequested outbox row (key = event id + ":billing"); the offset
// is committed after that transaction (package kafka). Several instances
// share the partitions through the group.
//
// onDuplicate, if not nil, is called for each redelivered event the inbox
// skipped.
func NewOrderConsumer(db kafka.Beginner, brokers []string, log *slog.Logger, onDuplicate func(), opts ...kgo.Opt) (*kafka.Consumer, error) {
	handler := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if t := header(rec, kafka.HeaderEventType); t != "" && t != usecase.EventOrderConfirmed {
			return nil // another event type on the topic: not ours, marked done
		}
		err := usecase.HandleOrderConfirmed(ctx, postgres.New(tx), kafka.EventIDFromContext(ctx), rec.Value)
		if errors.Is(err, usecase.ErrBadEvent) {
			return kafka.Permanent(err)
		}
		return err
	}
	var onProcessed func(context.Context, *kgo.Record, kafka.Outcome)
	if onDuplicate != nil {
		onProcessed = func(_ context.Context, _ *kgo.Record, o kafka.Outcome) {
			if o == kafka.OutcomeDuplicate {
				onDuplicate()
			}
		}
	}
	return kafka.NewConsumer(db, handler, &kafka.ConsumerConfig{
		Brokers:     brokers,
		Group:       OrderGroup,
		Topics:      []string{usecase.TopicOrderEvents},
		Logger:      log,
		OnProcessed: onProcessed,
		ClientOpts:  opts,
	})
}

func header(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
