package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// recorder is a Publisher that records what it was asked to deliver. It
// stands in for the broker in tests of the table's state machine; the
// Kafka tests in package kafka use the real publisher over kfake.
type recorder struct {
	mu        sync.Mutex
	delivered []outbox.Event // successful deliveries, in order
	calls     int
	callSizes []int // events per call, in call order
	// fail decides an event's fate; nil error = delivered. Like a broker's
	// ordered stream per key and topic (the outbox.Publisher contract), a
	// failure also fails the later events of its aggregate to the same
	// topic in the same call, and nothing else; unless ignoreOrderContract
	// is set (a publisher that breaks the contract, against which the
	// relay still keeps the table in order).
	fail                func(e outbox.Event) error
	ignoreOrderContract bool
	// entered receives one value per Publish call (if non-nil), before
	// release is awaited.
	entered chan []outbox.Event
	release chan struct{}
	// notify gets a value after each call.
	notify chan struct{}
	// ctxs are the calls' contexts, in call order.
	ctxs []context.Context
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1)} }

func (r *recorder) Publish(ctx context.Context, events []outbox.Event) error {
	if r.entered != nil {
		r.entered <- events
	}
	if r.release != nil {
		select {
		case <-r.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		select {
		case r.notify <- struct{}{}:
		default:
		}
	}()
	r.calls++
	r.ctxs = append(r.ctxs, ctx)
	r.callSizes = append(r.callSizes, len(events))
	errs := make([]error, len(events))
	failed := false
	type stream struct{ topic, aggType, aggID string }
	blocked := map[stream]bool{}
	for i, e := range events {
		if r.fail != nil {
			errs[i] = r.fail(e)
		}
		s := stream{e.Topic, e.AggregateType, e.AggregateID}
		if errs[i] == nil && blocked[s] && !r.ignoreOrderContract {
			errs[i] = fmt.Errorf("failed with an earlier event of %s on %s", e.AggregateID, e.Topic)
		}
		if errs[i] != nil {
			blocked[s] = true
		}
		if errs[i] != nil {
			failed = true
			continue
		}
		r.delivered = append(r.delivered, e)
	}
	if failed {
		return &outbox.BatchError{Errs: errs}
	}
	return nil
}

func (r *recorder) deliveredIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.delivered))
	for i, e := range r.delivered {
		out[i] = e.EventID
	}
	return out
}

func (r *recorder) snapshot() []outbox.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.Event(nil), r.delivered...)
}

// msgTo is msg to topic.
func msgTo(topic, agg string, n int) outbox.Message {
	m := msg(agg, n)
	m.Topic = topic
	return m
}

func msg(agg string, n int) outbox.Message {
	return outbox.Message{
		Topic: "t", AggregateType: "order", AggregateID: agg,
		EventID: fmt.Sprintf("%s-%d", agg, n), EventType: "E", Payload: []byte(fmt.Sprintf("%s/%d", agg, n)),
	}
}

func enqueue(t *testing.T, pool *pgxpool.Pool, msgs ...outbox.Message) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	ids, err := outbox.EnqueueTx(ctx, tx, msgs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

func newRelay(t *testing.T, db *testdb.DB, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	r, err := outbox.NewRelay(db.Pool, pub, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.HardStop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return r
}

// statuses returns event_id → status.
func statuses(t *testing.T, db *testdb.DB) map[string]string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), "SELECT event_id, status FROM outbox_event")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			t.Fatal(err)
		}
		out[id] = st
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// eventually polls cond every 10ms until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for an event
	}
}

// drain runs batches until a batch claims nothing.
func drain(t *testing.T, r *outbox.Relay) {
	t.Helper()
	for i := 0; ; i++ {
		n, err := r.RunBatch(context.Background())
		if err != nil {
			t.Logf("batch: %v", err)
		}
		if n == 0 {
			return
		}
		if i > 10000 {
			t.Fatal("drain does not end")
		}
	}
}

var modes = []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase}
