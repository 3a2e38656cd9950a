// Package consumer holds billing's Kafka consumers: the orders.events
// consumer that turns OrderConfirmed into a ChargeRequested command (inbox +
// outbox in one transaction), and the charge worker that executes the
// commands against the payment provider.
package consumer

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
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
// hook, if not nil, is the consumer's hook (kafka.ConsumerConfig.Hook):
// tracing, metrics, the count of redelivered events the inbox skipped
// (OnDuplicate).
func NewOrderConsumer(db consume.DB, brokers []string, log *slog.Logger, hook func(context.Context, kafka.ConsumerEvent) context.Context, opts ...kgo.Opt) (*kafka.Consumer, error) {
	return newOrderConsumer(db, brokers, log, hook, false, opts)
}

// OnDuplicate returns a consumer hook calling f for each record skipped as
// already processed (consume.KindDuplicate).
func OnDuplicate(f func()) func(context.Context, kafka.ConsumerEvent) context.Context {
	return func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
		if e.Kind == consume.KindDuplicate {
			f()
		}
		return ctx
	}
}

// NewUnsafeOrderConsumer is NewOrderConsumer without the inbox
// (BILLING_UNSAFE=inbox), for proving that the chaos audit catches what the
// inbox prevents; never in production. See DeliveryEventID.
func NewUnsafeOrderConsumer(db consume.DB, brokers []string, log *slog.Logger, hook func(context.Context, kafka.ConsumerEvent) context.Context, opts ...kgo.Opt) (*kafka.Consumer, error) {
	return newOrderConsumer(db, brokers, log, hook, true, opts)
}

// DeliveryEventID is the event id of the unsafe consumers: the record's
// event id plus a random suffix drawn for each delivery. It switches two
// protections off at once, and the chaos audit needs both off to see a
// double charge:
//
//   - the inbox: processed_event never sees the same id twice, so every
//     redelivery (an offset not yet committed when an instance died, an
//     event the relay published again) runs the handler again;
//   - the provider key: the charge key is derived from the event id
//     (event id + ":billing"), so the repeated ChargeRequested carries a
//     new key and the provider charges again.
//
// With the inbox alone switched off, the repeat would emit a
// ChargeRequested with the same key, and paysim would answer it from its
// idempotency store: the provider key would mask the missing inbox.
func DeliveryEventID(rec *kgo.Record) string {
	return kafka.RecordEventID(rec) + deliverySuffix()
}

// deliverySuffix is a random "~delivery-…" tag, new on every call.
func deliverySuffix() string {
	var b [6]byte
	_, _ = crand.Read(b[:])
	return "~delivery-" + hex.EncodeToString(b[:])
}

func newOrderConsumer(db consume.DB, brokers []string, log *slog.Logger, hook func(context.Context, kafka.ConsumerEvent) context.Context, unsafeNoInbox bool, opts []kgo.Opt) (*kafka.Consumer, error) {
	handler := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if t := kafka.RecordEventType(rec); t != "" && t != usecase.EventOrderConfirmed {
			return nil // another event type on the topic: not ours, marked done
		}
		err := usecase.HandleOrderConfirmed(ctx, postgres.New(tx), kafka.EventIDFromContext(ctx), rec.Value)
		if errors.Is(err, usecase.ErrBadEvent) {
			return kafka.Permanent(err)
		}
		return err
	}
	cfg := &kafka.ConsumerConfig{
		Brokers:    brokers,
		Group:      OrderGroup,
		Topics:     []string{usecase.TopicOrderEvents},
		Logger:     log,
		Hook:       hook,
		ClientOpts: opts,
	}
	if unsafeNoInbox {
		cfg.EventID = DeliveryEventID
	}
	return kafka.NewConsumer(db, handler, cfg)
}
