package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/kafka"
)

// Charge worker defaults.
const (
	ChargeGroupDefault   = "billing-charger"
	CallTimeoutDefault   = 20 * time.Second
	BackoffMinDefault    = 200 * time.Millisecond
	BackoffMaxDefault    = 5 * time.Second
	ChargeMaxPollDefault = 100
)

// ChargeWorkerConfig configures a ChargeWorker.
type ChargeWorkerConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Group is the consumer group and the processed_event consumer id.
	// Defaults to ChargeGroupDefault ("billing-charger").
	Group string
	// CallTimeout bounds one charge call, its retries included. Defaults
	// to CallTimeoutDefault (20s).
	CallTimeout time.Duration
	// BackoffMin is the ceiling of the first pause after an unknown
	// outcome or a database error; it doubles up to BackoffMax, with full
	// jitter (kafka.Consumer's backoff, which a soft stop ends). Defaults
	// to BackoffMinDefault (200ms).
	BackoffMin time.Duration
	// BackoffMax caps the pause. Defaults to BackoffMaxDefault (5s).
	BackoffMax time.Duration
	// OnSettled is called once per command whose outcome committed, with
	// the target ("order", "payment") and "charged" or "failed". Defaults
	// to nil.
	OnSettled func(target, outcome string)
	// OnDuplicate is called for a command already processed (redelivered):
	// its transaction changed nothing. Defaults to nil.
	OnDuplicate func()
	// OnProviderReplay is called when the provider answered from its
	// idempotency store (the key had been charged before). Defaults to nil.
	OnProviderReplay func()
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Hook is added to the worker's consumer hook, after its own
	// (kafka.ConsumerConfig.Hook): tracing, metrics. Defaults to nil.
	Hook func(ctx context.Context, e kafka.ConsumerEvent) context.Context
	// ClientOpts are extra franz-go options. Defaults to none.
	ClientOpts []kgo.Opt
	// UnsafeNoInbox switches the worker's dedup off (BILLING_UNSAFE=inbox):
	// each delivery gets its own event id (DeliveryEventID), so
	// processed_event never recognises a repeat, and charges under its own
	// key (the command's key plus the same per-delivery suffix), so a
	// redelivered command is charged again. Both are needed for the
	// repeat to show: with the command's key, the provider would answer
	// the repeat from its idempotency store. For proving that the chaos
	// audit can fail; never in production. Defaults to false.
	UnsafeNoInbox bool
}

// ChargeWorker executes ChargeRequested commands from billing.commands, as
// a kafka.Consumer whose Prepare step calls the provider outside any
// transaction (the call can take seconds; a transaction held open that long
// pins a connection and the processed_event row). Per record, step by step:
//
//  1. kafka.Consumer checks processed_event (read-only): a command already
//     settled is a duplicate, the provider is not called again;
//  2. Prepare: the provider call with the command's key (idemclient retries
//     inside the call with the same key); no transaction is open. An
//     unknown outcome is an error: retried with backoff, with the same key,
//     for as long as it takes (MaxAttempts is unbounded: a charge is never
//     dead-lettered for a provider outage);
//  3. one transaction: processed_event(event id) + the target's status
//     (CHARGED or FAILED); then the offset.
//
// A crash after 2 repeats the call on redelivery with the same key: the
// provider answers from its idempotency store, nothing is charged twice. A
// crash after 3 redelivers a record whose processed_event row exists: step
// 1 skips it.
//
// ChargeWorker is a kafka.Consumer: Start, Stop (the record in hand
// finishes: call and transaction, unless it waits between attempts) and
// HardStop (the call in hand is cancelled; the record stays uncommitted
// and is redelivered later with the same key) are the consumer's.
type ChargeWorker struct {
	*kafka.Consumer
}

// chargeAttemptsUnbounded is the worker's kafka.ConsumerConfig.MaxAttempts:
// an unknown outcome is retried until the provider answers.
const chargeAttemptsUnbounded = math.MaxInt32

// skipped is Prepare's result for a command that can never be charged.
type skipped struct{}

// NewChargeWorker validates cfg; nothing connects until Start.
func NewChargeWorker(db consume.DB, gw usecase.PaymentGateway, cfg *ChargeWorkerConfig) (*ChargeWorker, error) {
	c := ChargeWorkerConfig{}
	if cfg != nil {
		c = *cfg
	}
	switch {
	case db == nil:
		return nil, errors.New("billing: charge worker: db is nil")
	case gw == nil:
		return nil, errors.New("billing: charge worker: gateway is nil")
	case len(c.Brokers) == 0:
		return nil, errors.New("billing: charge worker: Brokers is empty")
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

	prepare := func(ctx context.Context, rec *kgo.Record) (any, error) {
		cmd, err := usecase.ParseChargeRequested(rec.Value)
		if err != nil {
			// Nothing can ever charge this command: say so loudly and
			// move on (the transaction records it as processed).
			log.Error("unprocessable command skipped", "event_id", kafka.EventIDFromContext(ctx), "error", err)
			return skipped{}, nil
		}
		if c.UnsafeNoInbox {
			// One key per delivery: DeliveryEventID's suffix. The retries
			// of this delivery share it; a redelivery draws a new one.
			cmd.IdempotencyKey += strings.TrimPrefix(kafka.EventIDFromContext(ctx), kafka.RecordEventID(rec))
		}
		cctx, cancel := context.WithTimeout(ctx, c.CallTimeout)
		res, err := gw.Charge(cctx, cmd)
		cancel()
		// Crash window (failpoint.ChargerProviderAnswered): the provider
		// has answered (charged, or declined for good) and nothing is
		// committed. A crash here leaves the record uncommitted: it is
		// redelivered, the call is repeated with the same key, the provider
		// replays its answer, and the outcome commits once.
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
	handler := func(ctx context.Context, tx pgx.Tx, _ *kgo.Record) error {
		r, ok := kafka.PreparedFromContext(ctx).(chargeResult)
		if !ok {
			return nil // skipped
		}
		return usecase.RecordCharge(ctx, postgres.New(tx), r.cmd, r.outcome)
	}
	hook := func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
		switch e.Kind {
		case consume.KindDuplicate:
			if c.OnDuplicate != nil {
				c.OnDuplicate()
			}
		case consume.KindProcessed:
			r, ok := kafka.PreparedFromContext(ctx).(chargeResult)
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
	kcfg := &kafka.ConsumerConfig{
		Brokers:        c.Brokers,
		Group:          c.Group,
		Topics:         []string{usecase.TopicBillingCommands},
		MaxPollRecords: ChargeMaxPollDefault,
		MaxAttempts:    chargeAttemptsUnbounded,
		BackoffMin:     c.BackoffMin,
		BackoffMax:     c.BackoffMax,
		Prepare:        prepare,
		Hook:           idem.JoinHooks(hook, c.Hook),
		Logger:         log,
		ClientOpts:     c.ClientOpts,
	}
	if c.UnsafeNoInbox {
		kcfg.EventID = DeliveryEventID
	}
	kc, err := kafka.NewConsumer(db, handler, kcfg)
	if err != nil {
		return nil, fmt.Errorf("billing: charge worker: %w", err)
	}
	return &ChargeWorker{Consumer: kc}, nil
}

// chargeResult is Prepare's result: the command and the provider's final
// answer, recorded by the handler.
type chargeResult struct {
	cmd     usecase.ChargeRequested
	outcome usecase.ChargeOutcome
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
