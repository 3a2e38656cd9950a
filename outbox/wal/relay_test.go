package wal_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

var (
	_ lifecycle.Component   = (*wal.Relay)(nil)
	_ lifecycle.HardStopper = (*wal.Relay)(nil)
)

type fixedPropagator map[string]string

func (p fixedPropagator) Inject(_ context.Context, h map[string]string) { maps.Copy(h, p) }

// TestRelayDeliversInCommitOrder: events reach Kafka in the order their
// transactions committed (not the order they were written), a
// transaction's events in write order, with their headers, key and
// payload; a rolled-back transaction's events and another prefix's never.
func TestRelayDeliversInCommitOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(t, nil, nil)
	ctx := context.Background()

	txA, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	pctx := outbox.ContextWithPropagator(ctx, fixedPropagator{"traceparent": "00-abc-def-01"})
	a1 := msg("x", "a1")
	a1.Headers = map[string]string{"k": "v"}
	if _, err := b.enq.EnqueueTx(pctx, txA, a1); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, msg("y", "b1"), msg("y", "b2"), msg("z", "b3")) // commits before A
	if _, err := b.enq.EnqueueTx(ctx, txA, msg("x", "a2")); err != nil {
		t.Fatal(err)
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Rolled back: never decoded.
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := b.enq.EnqueueTx(ctx, tx, msg("x", "rolled-back")); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("BeginFunc did not roll back")
	}
	// Another prefix: another relay's.
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := wal.Enqueuer{Prefix: b.prefix + ".other"}.EnqueueTx(ctx, tx, msg("x", "other-prefix"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 20 {
		id := "c" + string(rune('a'+i))
		b.enqueue(t, msg("x", id))
		want = append(want, id)
	}
	want = append([]string{"b1", "b2", "b3", "a1", "a2"}, want...)

	recs := b.kc.ReadAll(t, b.topic, len(want), 60*time.Second)
	if got := ids(recs); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	r := recs[3] // a1
	h := map[string]string{}
	for _, kv := range r.Headers {
		h[kv.Key] = string(kv.Value)
	}
	if string(r.Key) != "x" || string(r.Value) != "p-a1" || h["k"] != "v" || h["traceparent"] != "00-abc-def-01" ||
		h[kafka.HeaderEventType] != "E" || h[kafka.HeaderAggregateType] != "order" {
		t.Fatalf("a1 record: key %q value %q headers %v", r.Key, r.Value, h)
	}
	// Nothing more came (the rolled-back and other-prefix events were
	// written before the last c event, which did arrive).
	if more, _ := b.kc.Read(b.topic, len(want)+1, time.Second); len(more) != len(want) {
		t.Fatalf("%d records on the topic, want %d: %v", len(more), len(want), ids(more))
	}
}

// TestPartialFailureHoldsTheSlot: while one event fails, the slot's
// confirmed position stays before its transaction (events after it of
// other aggregates go out, those of its aggregate wait); a relay that
// takes over after a stop delivers it and everything behind it, its
// aggregate in order, and nothing that was confirmed before it.
func TestPartialFailureHoldsTheSlot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hl := newHookLog()
	fl := &flaky{next: b.kpub}
	fl.setFail(func(e outbox.Event) bool { return e.EventID == "f" })
	r1 := b.start(t, fl, &wal.Config{Hook: hl.hook})

	b.enqueue(t, msg("a", "e1"))
	hl.waitFor(t, "e1 published", func(e outbox.RelayEvent) bool {
		return e.Kind == outbox.RelayPublished && slices.ContainsFunc(e.Events, func(i outbox.EventInfo) bool { return i.EventID == "e1" })
	})
	before := currentLSN(t, b) // after e1's commit, before f's
	b.enqueue(t, msg("x", "f"))
	b.enqueue(t, msg("x", "e3"))
	b.enqueue(t, msg("b", "e4"))
	b.kc.ReadAll(t, b.topic, 2, 60*time.Second) // e1, e4
	for range 3 {
		hl.waitFor(t, "f failed", func(e outbox.RelayEvent) bool {
			return e.Kind == outbox.RelayFailed && slices.ContainsFunc(e.Events, func(i outbox.EventInfo) bool { return i.EventID == "f" })
		})
	}
	// Several status updates have gone out since e4 was delivered.
	if c := confirmedLSN(t, b); c > before {
		t.Fatalf("confirmed %d is past f's transaction (which began after %d)", c, before)
	}
	stop, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r1.Stop(stop); err != nil {
		t.Fatal(err)
	}
	if c := confirmedLSN(t, b); c > before {
		t.Fatalf("after the stop, confirmed %d is past f's transaction (which began after %d)", c, before)
	}

	b.start(t, nil, nil)
	recs := b.kc.ReadAll(t, b.topic, 5, 60*time.Second)
	got := ids(recs)
	if want := []string{"e1", "e4", "f", "e3", "e4"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v (e1 confirmed, f and all behind it sent again)", got, want)
	}
	if more, _ := b.kc.Read(b.topic, 6, time.Second); len(more) != 5 {
		t.Fatalf("%d records, want 5: %v", len(more), ids(more))
	}
}

// TestRestartResumesFromConfirmed: a relay stopped cleanly has confirmed
// what it delivered; events enqueued while no relay runs wait in the slot
// (its lag shows them) and the next relay delivers exactly those.
func TestRestartResumesFromConfirmed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r1 := b.start(t, nil, nil)
	var want []string
	for i := range 30 {
		id := fmt.Sprintf("first-%02d", i)
		b.enqueue(t, msg(string(rune('a'+i%3)), id))
		want = append(want, id)
	}
	b.kc.ReadAll(t, b.topic, 30, 60*time.Second)
	stop, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r1.Stop(stop); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		id := fmt.Sprintf("second-%02d", i)
		b.enqueue(t, msg(string(rune('a'+i%3)), id))
		want = append(want, id)
	}
	st, err := wal.GetSlotStatus(ctx, b.db.Pool, b.slot)
	if err != nil {
		t.Fatal(err)
	}
	if st.LagBytes <= 0 || st.RetainedBytes < st.LagBytes || st.WALStatus == "" {
		t.Fatalf("stopped relay's slot: %+v, want a lag", st)
	}
	b.start(t, nil, nil)
	recs := b.kc.ReadAll(t, b.topic, 60, 60*time.Second)
	if got := ids(recs); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	if more, _ := b.kc.Read(b.topic, 61, time.Second); len(more) != 60 {
		t.Fatalf("%d records, want 60 (a clean stop confirms all it delivered)", len(more))
	}
	if _, err := wal.GetSlotStatus(ctx, b.db.Pool, "no_such_slot_"+randName()); !errors.Is(err, wal.ErrSlotNotFound) {
		t.Fatalf("unknown slot: %v, want ErrSlotNotFound", err)
	}
}

// TestBadConfig: every bad input is a named sentinel, never a panic.
func TestBadConfig(t *testing.T) {
	t.Parallel()
	pub := &flaky{}
	testCases := []struct {
		name  string
		dsn   string
		pub   outbox.Publisher
		cfg   *wal.Config
		field string
	}{
		{"nil publisher", "postgres://x@127.0.0.1/db", nil, nil, "publisher"},
		{"bad connection string", "postgres://x@127.0.0.1:notaport/db", pub, nil, "connection string"},
		{"bad slot", "postgres://x@127.0.0.1/db", pub, &wal.Config{Slot: "Bad-Slot"}, "Slot"},
		{"long slot", "postgres://x@127.0.0.1/db", pub, &wal.Config{Slot: strings.Repeat("s", 64)}, "Slot"},
		{"bad publication", "postgres://x@127.0.0.1/db", pub, &wal.Config{Publication: "p; DROP TABLE x"}, "Publication"},
		{"batch size", "postgres://x@127.0.0.1/db", pub, &wal.Config{BatchSize: wal.BatchSizeMax + 1}, "BatchSize"},
		{"backoff", "postgres://x@127.0.0.1/db", pub, &wal.Config{BackoffMin: time.Second, BackoffMax: time.Millisecond}, "BackoffMax"},
		{"prefix", "postgres://x@127.0.0.1/db", pub, &wal.Config{Prefix: strings.Repeat("p", wal.PrefixMaxLen+1)}, "Prefix"},
		{"owner", "postgres://x@127.0.0.1/db", pub, &wal.Config{Owner: strings.Repeat("o", wal.OwnerMaxLen+1)}, "Owner"},
	}
	for _, tt := range testCases {
		_, err := wal.NewRelay(tt.dsn, tt.pub, tt.cfg)
		if !errors.Is(err, wal.ErrInvalidConfig) || !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig naming %s", tt.name, err, tt.field)
		}
	}
	if _, err := wal.NewRelay("postgres://x@127.0.0.1/db", pub, nil); err != nil {
		t.Fatalf("defaults: %v", err)
	}

	b := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		for _, m := range []outbox.Message{
			{AggregateType: "a", AggregateID: "1", EventType: "E"},
			{Topic: "t", AggregateType: "a", AggregateID: "1", EventType: "E", Headers: map[string]string{"k": "\x00"}},
			{Topic: "t", AggregateType: "a", AggregateID: "\xff", EventType: "E"},
		} {
			if _, err := b.enq.EnqueueTx(ctx, tx, m); !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Errorf("%+v: err = %v, want outbox.ErrInvalidMessage", m, err)
			}
		}
		if _, err := (wal.Enqueuer{Prefix: "bad\x00"}).EnqueueTx(ctx, tx, msg("a", "1")); !errors.Is(err, wal.ErrInvalidConfig) {
			t.Errorf("bad prefix: err = %v, want ErrInvalidConfig", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A server without logical decoding: Start says so.
	cl, err := pgtemp.Start(ctx, &pgtemp.Config{Settings: []string{"wal_level=replica"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r, err := wal.NewRelay(cl.URL, pub, &wal.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); !errors.Is(err, wal.ErrNotLogical) {
		t.Fatalf("Start on wal_level=replica: %v, want ErrNotLogical", err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("Stop after a failed Start: %v", err)
	}
}

// TestLagHook: while an event cannot be published, the relay's lag
// measure reports the WAL its slot retains and the age of that event, and
// warns past the thresholds; once it goes through, the age is 0 again.
func TestLagHook(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hl := newHookLog()
	fl := &flaky{next: b.kpub}
	fl.setFail(func(e outbox.Event) bool { return e.EventID == "stuck" })
	var logBuf syncBuffer
	b.start(t, fl, &wal.Config{Hook: hl.hook, LagInterval: 20 * time.Millisecond, LagWarnBytes: 1,
		Logger: slog.New(slog.NewTextHandler(&logBuf, nil))})
	b.enqueue(t, msg("a", "stuck"))
	e := hl.waitFor(t, "a lag with an age", func(e outbox.RelayEvent) bool {
		return e.Kind == outbox.RelaySlotLag && e.Err == nil && e.LagAge > 0 && e.LagBytes > 0
	})
	if e.Slot != b.slot || e.Mode != outbox.WAL {
		t.Fatalf("lag event %+v", e)
	}
	fl.setFail(nil)
	b.kc.ReadAll(t, b.topic, 1, 60*time.Second)
	hl.waitFor(t, "a lag without an age", func(e outbox.RelayEvent) bool {
		return e.Kind == outbox.RelaySlotLag && e.Err == nil && e.LagAge == 0
	})
	if !strings.Contains(logBuf.String(), "slot lag past its threshold") {
		t.Fatalf("no lag warning logged:\n%s", logBuf.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// blockingPub holds every call until release is closed.
type blockingPub struct {
	next    outbox.Publisher
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (p *blockingPub) Publish(ctx context.Context, events []outbox.Event) error {
	p.once.Do(func() { close(p.entered) })
	select {
	case <-p.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return p.next.Publish(ctx, events)
}

// TestKeepalivesAnsweredDuringAPublish: the server drops a replication
// connection that stays silent for wal_sender_timeout (here 1s). A
// publish that takes many times that does not cost the relay its
// stream: the reader goes on reporting while the publisher waits.
func TestKeepalivesAnsweredDuringAPublish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	hl := newHookLog()
	bp := &blockingPub{next: b.kpub, entered: make(chan struct{}), release: make(chan struct{})}
	dsn := b.db.URL + "&wal_sender_timeout=1s"
	r, err := wal.NewRelay(dsn, bp, b.config(&wal.Config{Hook: hl.hook, StatusInterval: 200 * time.Millisecond,
		LagInterval: 100 * time.Millisecond, BatchTimeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.HardStop(ctx); err != nil {
			t.Error(err)
		}
	}()
	b.enqueue(t, msg("a", "slow"))
	<-bp.entered
	// Hold the publish for 40 lag measures (4s, four timeouts' worth).
	for range 40 {
		hl.waitFor(t, "a lag measure", func(e outbox.RelayEvent) bool { return e.Kind == outbox.RelaySlotLag })
	}
	close(bp.release)
	b.kc.ReadAll(t, b.topic, 1, 60*time.Second)
	hl.mu.Lock()
	defer hl.mu.Unlock()
	acquired := 0
	for _, e := range hl.events {
		switch e.Kind {
		case outbox.RelayStreamFailed:
			t.Fatalf("the stream failed during the publish: %v", e.Err)
		case outbox.RelaySlotAcquired:
			acquired++
		}
	}
	if acquired != 1 {
		t.Fatalf("slot acquired %d times, want once", acquired)
	}
}

// gatePub passes its first call through and holds every later one until
// release is closed, saying on entered that it holds one.
type gatePub struct {
	next    outbox.Publisher
	mu      sync.Mutex
	calls   int
	entered chan struct{}
	release chan struct{}
}

func (p *gatePub) Publish(ctx context.Context, events []outbox.Event) error {
	p.mu.Lock()
	p.calls++
	n := p.calls
	p.mu.Unlock()
	if n == 2 {
		close(p.entered)
	}
	if n >= 2 {
		select {
		case <-p.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return p.next.Publish(ctx, events)
}

// TestSoftStopFinishesTheTransaction: a soft Stop that comes while the
// relay is in the middle of a transaction four times BatchSize (its first
// batch delivered, the second in a publish call) lets it finish that
// transaction, so the slot confirms the transaction's end and the next
// relay publishes nothing of it again: every event once, in order.
func TestSoftStopFinishesTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const batch = 3
	gp := &gatePub{next: b.kpub, entered: make(chan struct{}), release: make(chan struct{})}
	r1 := b.start(t, gp, &wal.Config{BatchSize: batch})
	var big []outbox.Message
	var want []string
	for i := range 4 * batch {
		id := fmt.Sprintf("e%02d", i)
		big = append(big, msg("a", id))
		want = append(want, id)
	}
	b.enqueue(t, big...)
	<-gp.entered // the first batch is delivered, the second is in hand
	// A Stop whose ctx has already ended begins the soft stop and returns
	// at once: from here on the relay is stopping.
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r1.Stop(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop with an ended ctx: %v, want context.Canceled", err)
	}
	close(gp.release)
	stop, cancelStop := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStop()
	if err := r1.Stop(stop); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, msg("b", "after"))
	b.start(t, nil, &wal.Config{BatchSize: batch})
	want = append(want, "after")
	recs := b.kc.ReadAll(t, b.topic, len(want), 60*time.Second)
	if got := ids(recs); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v: each event once, in order", got, want)
	}
	if more, _ := b.kc.Read(b.topic, len(want)+1, time.Second); len(more) > len(want) {
		t.Fatalf("%d records, want %d: %v", len(more), len(want), ids(more))
	}
}
