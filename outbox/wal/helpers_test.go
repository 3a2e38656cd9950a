package wal_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// bundle is one test's world: a database, a Kafka cluster with a
// one-partition topic (so that the records' offsets are the total order of
// delivery), and slot, publication and prefix names of its own (slots are
// cluster-wide and every slot of a database sees every test's messages).
type bundle struct {
	db     *testdb.DB
	kc     *testkafka.Cluster
	topic  string
	slot   string
	pub    string
	prefix string
	enq    wal.Enqueuer
	kpub   outbox.Publisher
}

func randName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func setup(t testing.TB) *bundle {
	t.Helper()
	n := randName()
	b := &bundle{db: testdb.New(t), kc: testkafka.New(t), topic: "events", slot: "t_" + n, pub: "t_" + n, prefix: "idem.test." + n}
	b.enq = wal.Enqueuer{Prefix: b.prefix}
	b.kc.CreateTopic(t, b.topic, 1)
	p, err := kafka.NewPublisher(b.kc.Client(t, kafka.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	b.kpub = p
	// Registered first, so it runs after every relay of the test stopped.
	t.Cleanup(func() { dropSlot(t, b) })
	return b
}

// dropSlot drops the test's slot and publication. A slot stays active
// for a moment after its reader's connection closed: retry until the
// server lets it go.
func dropSlot(t testing.TB, b *bundle) {
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := b.db.Pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", b.slot)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("drop slot %s: %v", b.slot, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := b.db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+b.pub); err != nil {
		t.Errorf("drop publication: %v", err)
	}
}

func (b *bundle) config(c *wal.Config) *wal.Config {
	var out wal.Config
	if c != nil {
		out = *c
	}
	out.Slot, out.Publication, out.Prefix = b.slot, b.pub, b.prefix
	if out.StatusInterval == 0 {
		out.StatusInterval = 50 * time.Millisecond
	}
	if out.AcquireInterval == 0 {
		out.AcquireInterval = 50 * time.Millisecond
	}
	if out.BackoffMax == 0 {
		out.BackoffMin, out.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	}
	if out.Logger == nil {
		out.Logger = quiet
	}
	return &out
}

// start starts a relay over pub (the bundle's Kafka publisher when nil);
// the test's end hard-stops it.
func (b *bundle) start(t *testing.T, pub outbox.Publisher, c *wal.Config) *wal.Relay {
	t.Helper()
	if pub == nil {
		pub = b.kpub
	}
	r, err := wal.NewRelay(b.db.URL, pub, b.config(c))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := r.HardStop(ctx); err != nil {
			t.Errorf("hard stop: %v", err)
		}
	})
	return r
}

func msg(agg, id string) outbox.Message {
	return outbox.Message{Topic: "events", AggregateType: "order", AggregateID: agg, EventID: id, EventType: "E", Payload: []byte("p-" + id)}
}

// enqueue commits msgs in one transaction.
func (b *bundle) enqueue(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := b.enq.EnqueueTx(ctx, tx, msgs...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func ids(recs []*kgo.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = kafka.RecordEventID(r)
	}
	return out
}

// flaky is the real Kafka publisher except for the events fail picks:
// those fail, and so do the later events of their aggregate in the call
// (what a broker's ordered stream does; the outbox.Publisher contract).
type flaky struct {
	next outbox.Publisher
	mu   sync.Mutex
	fail func(e outbox.Event) bool
}

func (f *flaky) Publish(ctx context.Context, events []outbox.Event) error {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	errs := make([]error, len(events))
	blocked := map[string]bool{}
	var pass []outbox.Event
	var passIdx []int
	for i, e := range events {
		if blocked[e.AggregateID] || (fail != nil && fail(e)) {
			blocked[e.AggregateID] = true
			errs[i] = fmt.Errorf("flaky: %s refused", e.EventID)
			continue
		}
		pass, passIdx = append(pass, e), append(passIdx, i)
	}
	if len(pass) > 0 {
		err := f.next.Publish(ctx, pass)
		var be *outbox.BatchError
		for j, i := range passIdx {
			switch {
			case err == nil:
			case errors.As(err, &be):
				errs[i] = be.Errs[j]
			default:
				errs[i] = err
			}
		}
	}
	for _, err := range errs {
		if err != nil {
			return &outbox.BatchError{Errs: errs}
		}
	}
	return nil
}

func (f *flaky) setFail(fn func(e outbox.Event) bool) {
	f.mu.Lock()
	f.fail = fn
	f.mu.Unlock()
}

// hookLog records the relay's hook events.
type hookLog struct {
	mu     sync.Mutex
	events []outbox.RelayEvent
	ch     chan outbox.RelayEvent
}

func newHookLog() *hookLog { return &hookLog{ch: make(chan outbox.RelayEvent, 1024)} }

func (h *hookLog) hook(ctx context.Context, e outbox.RelayEvent) context.Context {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
	select {
	case h.ch <- e:
	default:
	}
	return ctx
}

// waitFor waits (up to a generous bound, not a timed assertion) for an
// event that ok accepts.
func (h *hookLog) waitFor(t *testing.T, what string, ok func(e outbox.RelayEvent) bool) outbox.RelayEvent {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case e := <-h.ch:
			if ok(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("no hook event: %s", what)
		}
	}
}

func confirmedLSN(t *testing.T, b *bundle) uint64 {
	t.Helper()
	var lsn uint64
	err := b.db.Pool.QueryRow(context.Background(),
		"SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1", b.slot).Scan(&lsn)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

func currentLSN(t *testing.T, b *bundle) uint64 {
	t.Helper()
	var lsn uint64
	if err := b.db.Pool.QueryRow(context.Background(), "SELECT (pg_current_wal_lsn() - '0/0')::bigint").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}
