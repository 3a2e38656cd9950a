package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/internal/failpoint"
)

// This file holds billing's two consumers on any consume.Driver: the
// kafka-go driver (KAFKA_CLIENT=kafkago), the JetStream driver
// (BROKER=nats), and franz-go's (kafka.NewDriver) on the database/sql data
// layer (BILLING_DATA_LAYER=sql). They run the same steps as
// NewOrderConsumer and NewChargeWorker, which stay on package kafka's
// franz-go Consumer (the default client, on pgx); the handlers read the
// broker-neutral consume.Message, and write through the postgres.Repo
// bound to the message's transaction, a pgx.Tx or a *sql.Tx as the
// postgres.DB decides.

// UnsafeEventID is the event id of the unsafe consumers on any driver
// (BILLING_UNSAFE=inbox): base, the message's own event id, plus a random
// suffix drawn for each delivery. See DeliveryEventID for why both the
// inbox and the provider key must change.
func UnsafeEventID(base string) string { return base + deliverySuffix() }

// messageHeader is the first value of header key ("" when absent).
func messageHeader(m *consume.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// OrderHandler is the orders.events handler on a consume.Message: for an
// OrderConfirmed, the ChargeRequested outbox row keyed by the event id
// (usecase.HandleOrderConfirmed) in the message's transaction.
func OrderHandler(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
	return orderStep(ctx, postgres.New(tx), m)
}

// orderStep is OrderHandler on the Repo of the message's transaction, on
// either data layer.
func orderStep(ctx context.Context, repo *postgres.Repo, m *consume.Message) error {
	if t := messageHeader(m, idem.HeaderEventType); t != "" && t != usecase.EventOrderConfirmed {
		return nil // another event type on the topic: not ours, marked done
	}
	err := usecase.HandleOrderConfirmed(ctx, repo, consume.EventIDFromContext(ctx), m.Value)
	if errors.Is(err, usecase.ErrBadEvent) {
		return consume.Permanent(err)
	}
	return err
}

// NewOrderConsumerOn is NewOrderConsumer on drv (which consumes
// orders.events for the group OrderGroup), in transactions of db's data
// layer (postgres.PGX or postgres.SQL). hook, if not nil, is the
// consumer's hook: tracing, metrics, OnDuplicate. For the unsafe consumer,
// drv's event ids come from UnsafeEventID (or DeliveryEventID).
func NewOrderConsumerOn(db postgres.DB, drv consume.Driver, log *slog.Logger, hook func(context.Context, consume.Event) context.Context) (*consume.Consumer, error) {
	return db.Consumer(drv, orderStep, &consume.Config{ConsumerID: OrderGroup, Hook: hook, Logger: log})
}

// NewChargeWorkerOn is NewChargeWorker on drv (which consumes
// billing.commands for cfg.Group), in transactions of db's data layer
// (postgres.PGX or postgres.SQL): the same three steps per command
// (dedup read, provider call outside any transaction, then processed_event
// and the outcome in one transaction, then the ack). cfg.Brokers and
// cfg.ClientOpts are not used: drv holds the connection settings. With
// cfg.UnsafeNoInbox, drv's event ids must come from UnsafeEventID: the
// provider key takes the same per-delivery suffix.
func NewChargeWorkerOn(db postgres.DB, gw usecase.PaymentGateway, drv consume.Driver, cfg *ChargeWorkerConfig) (*consume.Consumer, error) {
	c := ChargeWorkerConfig{}
	if cfg != nil {
		c = *cfg
	}
	switch {
	case db == nil:
		return nil, errors.New("billing: charge worker: db is nil")
	case gw == nil:
		return nil, errors.New("billing: charge worker: gateway is nil")
	case drv == nil:
		return nil, errors.New("billing: charge worker: driver is nil")
	case c.CallTimeout < 0 || c.BackoffMin < 0 || c.BackoffMax < 0:
		return nil, errors.New("billing: charge worker: negative duration in config")
	}
	if c.Group == "" {
		c.Group = ChargeGroupDefault
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = CallTimeoutDefault
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = BackoffMinDefault
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = BackoffMaxDefault
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("worker", c.Group)

	prepare := func(ctx context.Context, m *consume.Message) (any, error) {
		cmd, err := usecase.ParseChargeRequested(m.Value)
		if err != nil {
			log.Error("unprocessable command skipped", "event_id", consume.EventIDFromContext(ctx), "error", err)
			return skipped{}, nil
		}
		if c.UnsafeNoInbox {
			// One key per delivery: UnsafeEventID's suffix.
			cmd.IdempotencyKey += strings.TrimPrefix(consume.EventIDFromContext(ctx), messageHeader(m, idem.HeaderEventID))
		}
		cctx, cancel := context.WithTimeout(ctx, c.CallTimeout)
		res, err := gw.Charge(cctx, cmd)
		cancel()
		// Crash window (failpoint.ChargerProviderAnswered): see
		// NewChargeWorker.
		if ferr := failpoint.Inject(failpoint.ChargerProviderAnswered); ferr != nil {
			return nil, ferr
		}
		switch {
		case err == nil:
			if res.Replayed && c.OnProviderReplay != nil {
				c.OnProviderReplay()
			}
			return chargeResult{cmd: cmd, outcome: usecase.ChargeOutcome{Charged: true, ChargeID: res.ID}}, nil
		case errors.Is(err, usecase.ErrChargeDeclined):
			return chargeResult{cmd: cmd, outcome: usecase.ChargeOutcome{Failure: truncate(err.Error(), 500)}}, nil
		}
		return nil, fmt.Errorf("charge outcome unknown for %s (retried with the same key): %w", cmd.TargetID, err)
	}
	handler := func(ctx context.Context, repo *postgres.Repo, _ *consume.Message) error {
		r, ok := consume.PreparedFromContext(ctx).(chargeResult)
		if !ok {
			return nil // skipped
		}
		return usecase.RecordCharge(ctx, repo, r.cmd, r.outcome)
	}
	hook := func(ctx context.Context, e consume.Event) context.Context {
		switch e.Kind {
		case consume.KindDuplicate:
			if c.OnDuplicate != nil {
				c.OnDuplicate()
			}
		case consume.KindProcessed:
			r, ok := consume.PreparedFromContext(ctx).(chargeResult)
			if ok && c.OnSettled != nil {
				name := "charged"
				if !r.outcome.Charged {
					name = "failed"
				}
				c.OnSettled(r.cmd.Target, name)
			}
		}
		return ctx
	}
	cc, err := db.Consumer(drv, handler, &consume.Config{
		ConsumerID:  c.Group,
		MaxAttempts: chargeAttemptsUnbounded,
		BackoffMin:  c.BackoffMin,
		BackoffMax:  c.BackoffMax,
		Prepare:     prepare,
		Hook:        idem.JoinHooks(hook, c.Hook),
		Logger:      log,
	})
	if err != nil {
		return nil, fmt.Errorf("billing: charge worker: %w", err)
	}
	return cc, nil
}
