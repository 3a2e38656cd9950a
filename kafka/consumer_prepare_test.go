package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/kafka"
)

// txCounter is the real pool, instrumented: it counts the consumer's
// transactions that are open (begun, not yet committed or rolled back).
type txCounter struct {
	consume.DB
	open atomic.Int64
}

func (c *txCounter) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := c.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	c.open.Add(1)
	return &countedTx{Tx: tx, c: c}, nil
}

type countedTx struct {
	pgx.Tx
	c    *txCounter
	once sync.Once
}

func (t *countedTx) end() { t.once.Do(func() { t.c.open.Add(-1) }) }

func (t *countedTx) Commit(ctx context.Context) error {
	defer t.end()
	return t.Tx.Commit(ctx)
}

func (t *countedTx) Rollback(ctx context.Context) error {
	defer t.end()
	return t.Tx.Rollback(ctx)
}

// prepareCalls counts Prepare calls per event id.
type prepareCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (p *prepareCalls) add(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n = map[string]int{}
	}
	p.n[id]++
	return p.n[id]
}

func (p *prepareCalls) get(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[id]
}

// TestConsumerPrepare: Prepare runs with no transaction of the consumer
// open, its result reaches the handler, and it is not called at all for a
// record whose event is already in processed_event (that record is a
// duplicate: no handler either).
func TestConsumerPrepare(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 2)
	// ev-0..ev-4 were processed before (a previous delivery, another
	// member): marked by the inbox as a handler's transaction would.
	tx, err := b.db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := inbox.MarkProcessedTx(context.Background(), tx, b.group, fmt.Sprintf("ev-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}

	db := &txCounter{DB: b.db.Pool}
	var calls prepareCalls
	var openDuringPrepare atomic.Int64
	var mu sync.Mutex
	outcomes := map[string]consume.Kind{}
	handler := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		v, _ := kafka.PreparedFromContext(ctx).(string)
		_, err := tx.Exec(ctx, `INSERT INTO cons_effect (event_id, member, value) VALUES ($1, 'A', $2)`, kafka.EventIDFromContext(ctx), v)
		return err
	}
	c, err := kafka.NewConsumer(db, handler, b.consConfig(func(cfg *kafka.ConsumerConfig) {
		cfg.Prepare = func(ctx context.Context, rec *kgo.Record) (any, error) {
			calls.add(kafka.EventIDFromContext(ctx))
			openDuringPrepare.Add(db.open.Load())
			return "prepared-" + string(rec.Value), nil
		}
		cfg.Hook = onOutcome(func(ctx context.Context, k consume.Kind) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[kafka.EventIDFromContext(ctx)] = k
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	b.consProduce(t, 0, 20)
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := len(outcomes)
		mu.Unlock()
		if n == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 20 records processed", n)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}

	if n := openDuringPrepare.Load(); n != 0 {
		t.Errorf("Prepare saw %d open transactions in total, want 0", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range 20 {
		id := fmt.Sprintf("ev-%d", i)
		wantCalls, wantOutcome := 1, consume.KindProcessed
		if i < 5 {
			wantCalls, wantOutcome = 0, consume.KindDuplicate
		}
		if got := calls.get(id); got != wantCalls {
			t.Errorf("%s: Prepare called %d times, want %d", id, got, wantCalls)
		}
		if outcomes[id] != wantOutcome {
			t.Errorf("%s: outcome %v, want %v", id, outcomes[id], wantOutcome)
		}
	}
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id || '=' || value FROM cons_effect ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range got {
		id, v, _ := strings.Cut(e, "=")
		if v != "prepared-"+strings.TrimPrefix(id, "ev-") {
			t.Errorf("effect %s: the handler did not get its record's Prepare result", e)
		}
	}
	if len(got) != 15 {
		t.Errorf("%d effects, want 15 (ev-5..ev-19): %v", len(got), got)
	}
}

// TestConsumerPrepareFailures: a Prepare error is a handler failure —
// retried, and dead-lettered at once when Permanent (the handler never
// runs); a transaction retried after a successful Prepare does not repeat
// Prepare.
func TestConsumerPrepareFailures(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 1)
	var calls prepareCalls
	var handlerFailed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if string(rec.Value) == "2" && handlerFailed.CompareAndSwap(false, true) {
			return errors.New("handler: transient")
		}
		return consEffectHandler("A")(ctx, tx, rec)
	}
	b.consStart(t, h, func(cfg *kafka.ConsumerConfig) {
		cfg.MaxAttempts = 3
		cfg.Prepare = func(ctx context.Context, rec *kgo.Record) (any, error) {
			n := calls.add(kafka.EventIDFromContext(ctx))
			switch {
			case string(rec.Value) == "0":
				return nil, kafka.Permanent(errors.New("provider: card unknown"))
			case string(rec.Value) == "1" && n == 1:
				return nil, errors.New("provider: timeout")
			}
			return nil, nil
		}
	})
	b.consProduce(t, 0, 4)
	dl := b.kc.ReadAll(t, b.topic+kafka.DeadLetterSuffixDefault, 1, 60*time.Second)
	b.consWaitEffects(t, 3, 60*time.Second)
	if string(dl[0].Value) != "0" {
		t.Errorf("dead letter %q, want record 0", dl[0].Value)
	}
	for id, want := range map[string]int{"ev-0": 1, "ev-1": 2, "ev-2": 1, "ev-3": 1} {
		if got := calls.get(id); got != want {
			t.Errorf("%s: Prepare called %d times, want %d", id, got, want)
		}
	}
	if !handlerFailed.Load() {
		t.Error("the handler failure of ev-2 was not exercised")
	}
	b.consAssertPrepared(t, "ev-1,ev-2,ev-3")
}

func (b *consBundle) consAssertPrepared(t *testing.T, want string) {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id FROM cons_effect ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ids, ",") != want {
		t.Errorf("effects %v, want %s", ids, want)
	}
}

func TestConsumerPrepareWithBatchRejected(t *testing.T) {
	t.Parallel()
	_, err := kafka.NewConsumer(&txCounter{}, func(context.Context, pgx.Tx, *kgo.Record) error { return nil }, &kafka.ConsumerConfig{
		Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Batch: true,
		Prepare: func(context.Context, *kgo.Record) (any, error) { return nil, nil },
	})
	if !errors.Is(err, kafka.ErrInvalidConfig) || !strings.Contains(err.Error(), "Prepare") {
		t.Fatalf("err %v, want ErrInvalidConfig naming Prepare", err)
	}
}
