package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/kafka"
)

// Charge worker defaults.
const (
	ChargeGroupDefault       = "billing-charger"
	CallTimeoutDefault       = 20 * time.Second
	RetryBackoffDefault      = 200 * time.Millisecond
	RetryBackoffMaxDefault   = 5 * time.Second
	ChargeMaxPollDefault     = 100
	chargeCommitTimeout      = 5 * time.Second
	chargeLeaveGroupDeadline = 5 * time.Second
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
	// RetryBackoff is the first pause after an unknown outcome or a
	// database error; it doubles up to RetryBackoffMax. Defaults to
	// RetryBackoffDefault (200ms) and RetryBackoffMaxDefault (5s).
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
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
	// ClientOpts are extra franz-go options. Defaults to none.
	ClientOpts []kgo.Opt
	// UnsafeNoInbox switches the worker's dedup off (BILLING_UNSAFE=inbox):
	// no processed_event row is read or written, and each delivery charges
	// under its own key (the command's key plus a per-delivery suffix), so
	// a redelivered command is charged again. Both are needed for the
	// repeat to show: with the command's key, the provider would answer
	// the repeat from its idempotency store. For proving that the chaos
	// audit can fail; never in production. Defaults to false.
	UnsafeNoInbox bool
}

// ChargeWorker executes ChargeRequested commands from billing.commands.
//
// It does not use kafka.Consumer, whose handler runs inside the inbox
// transaction: the provider call must happen outside any transaction (it
// can take seconds; a transaction held open that long pins a connection and
// the processed_event row). Per record, step by step:
//
//  1. call the provider with the command's key (idemclient retries inside
//     the call with the same key); no transaction is open;
//  2. one transaction: processed_event(event id) + the target's status
//     (CHARGED or FAILED); a duplicate (first == false) changes nothing;
//  3. mark the offset; offsets are committed after each poll.
//
// A crash after 1 repeats the call on redelivery with the same key: the
// provider answers from its idempotency store, nothing is charged twice. A
// crash after 2 redelivers a record whose processed_event row exists: the
// call is repeated (a stored answer) and the transaction changes nothing.
//
// TODO(kafka): kafka.Consumer could grow a "before the transaction" step
// (an effect run outside the tx, its result handed to the handler); this
// loop would then be a Handler like NewOrderConsumer.
type ChargeWorker struct {
	db  kafka.Beginner
	gw  usecase.PaymentGateway
	cfg ChargeWorkerConfig
	log *slog.Logger

	mu      sync.Mutex
	started bool
	cl      *kgo.Client
	softCtx context.Context
	soft    context.CancelFunc
	hardCtx context.Context
	hard    context.CancelFunc
	done    chan struct{}
}

// NewChargeWorker validates cfg; nothing connects until Start.
func NewChargeWorker(db kafka.Beginner, gw usecase.PaymentGateway, cfg *ChargeWorkerConfig) (*ChargeWorker, error) {
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
	case c.CallTimeout < 0 || c.RetryBackoff < 0 || c.RetryBackoffMax < 0:
		return nil, errors.New("billing: charge worker: negative duration in config")
	}
	if c.Group == "" {
		c.Group = ChargeGroupDefault
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = CallTimeoutDefault
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = RetryBackoffDefault
	}
	if c.RetryBackoffMax == 0 {
		c.RetryBackoffMax = RetryBackoffMaxDefault
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	return &ChargeWorker{db: db, gw: gw, cfg: c, log: log.With("worker", c.Group)}, nil
}

// Start joins the group and runs the worker until Stop. ctx's values reach
// every call; its cancellation is not used (Stop and HardStop are).
func (w *ChargeWorker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return nil
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(w.cfg.Brokers...),
		kgo.ConsumerGroup(w.cfg.Group),
		kgo.ConsumeTopics(usecase.TopicBillingCommands),
		kgo.AutoCommitMarks(),
		// No revoke while a poll is in hand: an offset is never committed
		// for a partition lost mid-record.
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}, w.cfg.ClientOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("billing: charge worker client: %w", err)
	}
	w.cl = cl
	base := context.WithoutCancel(ctx)
	w.hardCtx, w.hard = context.WithCancel(base)
	w.softCtx, w.soft = context.WithCancel(w.hardCtx)
	w.done = make(chan struct{})
	w.started = true
	go w.run()
	return nil
}

// Stop is the soft stop: no new record is taken; the records in hand
// finish (call and transaction); offsets are committed; the group is left.
// When ctx ends first it returns ctx.Err() and the records in hand go on
// until HardStop. Safe before Start and twice.
func (w *ChargeWorker) Stop(ctx context.Context) error {
	w.mu.Lock()
	started := w.started
	w.mu.Unlock()
	if !started {
		return nil
	}
	w.soft()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// HardStop cancels the calls and transactions in hand: their records stay
// uncommitted and are redelivered, later, with the same key. Safe before
// Start and twice.
func (w *ChargeWorker) HardStop(ctx context.Context) error {
	w.mu.Lock()
	started := w.started
	w.mu.Unlock()
	if !started {
		return nil
	}
	w.hard()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *ChargeWorker) stopping() bool { return w.softCtx.Err() != nil }

func (w *ChargeWorker) run() {
	defer close(w.done)
	for !w.stopping() {
		fs := w.cl.PollRecords(w.softCtx, ChargeMaxPollDefault)
		if fs.IsClientClosed() {
			break
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				w.log.Warn("fetch", "topic", topic, "partition", p, "error", err)
			}
		})
		// Partitions are independent: run them concurrently, each in
		// order, so one slow charge does not hold the others.
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, rec := range p.Records {
					if w.stopping() || !w.process(rec) {
						return // the rest stays uncommitted: redelivered
					}
					w.cl.MarkCommitRecords(rec)
				}
			}()
		})
		wg.Wait()
		w.commit()
		w.cl.AllowRebalance()
	}
	// Exit, step by step: commit what is done (bounded, even after a hard
	// stop), allow the rebalance that leaving triggers (with
	// BlockRebalanceOnPoll a leave waits for it: the classic Close hang),
	// leave the group so another member takes over at once, close.
	w.commit()
	w.cl.AllowRebalance()
	lctx, cancel := context.WithTimeout(context.Background(), chargeLeaveGroupDeadline)
	if err := w.cl.LeaveGroupContext(lctx); err != nil {
		w.log.Warn("leave group", "error", err)
	}
	cancel()
	w.cl.Close()
}

func (w *ChargeWorker) commit() {
	ctx, cancel := context.WithTimeout(context.Background(), chargeCommitTimeout)
	defer cancel()
	if err := w.cl.CommitMarkedOffsets(ctx); err != nil {
		w.log.Warn("offset commit", "error", err)
	}
}

// process drives one record to a committed outcome; false when a stop
// interrupted it (the record is then not done).
func (w *ChargeWorker) process(rec *kgo.Record) bool {
	id := kafka.RecordEventID(rec)
	cmd, err := usecase.ParseChargeRequested(rec.Value)
	if err != nil {
		// Nothing can ever charge this command: say so loudly and move on.
		w.log.Error("unprocessable command skipped", "event_id", id, "error", err)
		return true
	}
	if w.cfg.UnsafeNoInbox {
		// One key per delivery: the retries of this delivery share it; a
		// redelivery draws a new one.
		cmd.IdempotencyKey += deliverySuffix()
	}
	outcome, ok := w.charge(cmd, id)
	if !ok {
		return false
	}
	for attempt := 1; ; attempt++ {
		first, err := w.record(id, cmd, outcome)
		if err == nil {
			if !first && w.cfg.OnDuplicate != nil {
				w.cfg.OnDuplicate()
			}
			if first && w.cfg.OnSettled != nil {
				name := "charged"
				if !outcome.Charged {
					name = "failed"
				}
				w.cfg.OnSettled(cmd.Target, name)
			}
			return true
		}
		if w.hardCtx.Err() != nil {
			return false
		}
		w.log.Warn("recording charge failed; retrying", "event_id", id, "error", err)
		if !w.backoff(attempt, w.hardCtx) {
			return false
		}
	}
}

// charge calls the provider until it gives a final answer; false on a
// stop. A soft stop does not interrupt a call in hand (the call has a key
// and a deadline); it does end the waits between calls.
func (w *ChargeWorker) charge(cmd usecase.ChargeRequested, id string) (usecase.ChargeOutcome, bool) {
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(w.hardCtx, w.cfg.CallTimeout)
		res, err := w.gw.Charge(ctx, cmd)
		cancel()
		switch {
		case err == nil:
			if res.Replayed && w.cfg.OnProviderReplay != nil {
				w.cfg.OnProviderReplay()
			}
			return usecase.ChargeOutcome{Charged: true, ChargeID: res.ID}, true
		case errors.Is(err, usecase.ErrChargeDeclined):
			return usecase.ChargeOutcome{Failure: truncate(err.Error(), 500)}, true
		case w.hardCtx.Err() != nil:
			return usecase.ChargeOutcome{}, false
		}
		w.log.Warn("charge outcome unknown; retrying with the same key", "event_id", id, "target", cmd.TargetID, "attempt", attempt, "error", err)
		if !w.backoff(attempt, w.softCtx) {
			return usecase.ChargeOutcome{}, false
		}
	}
}

// record is step 2: processed_event and the target's status in one
// transaction.
func (w *ChargeWorker) record(id string, cmd usecase.ChargeRequested, o usecase.ChargeOutcome) (first bool, err error) {
	ctx := w.hardCtx
	err = pgx.BeginFunc(ctx, w.db, func(tx pgx.Tx) error {
		if w.cfg.UnsafeNoInbox {
			first = true
		} else if first, err = inbox.MarkProcessedTx(ctx, tx, w.cfg.Group, id); err != nil || !first {
			return err
		}
		return usecase.RecordCharge(ctx, postgres.New(tx), cmd, o)
	})
	return first, err
}

// backoff waits before attempt+1; false when stop ends first.
func (w *ChargeWorker) backoff(attempt int, stop context.Context) bool {
	d := w.cfg.RetryBackoff
	for i := 1; i < attempt && d < w.cfg.RetryBackoffMax; i++ {
		d *= 2
	}
	d = min(d, w.cfg.RetryBackoffMax)
	d = time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop.Done():
		return false
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
