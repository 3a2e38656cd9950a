package consumer_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/adapters/out/payment"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/paysim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type bundle struct {
	db   *testdb.DB
	kc   *testkafka.Cluster
	sim  *paysim.Server
	gw   *recordingGateway
	gate *gate
}

// gate sits in front of the real simulator: while closed, a charge request
// is held until its client gives up (the provider is slow), and nothing is
// charged; once opened, requests pass to the simulator.
type gate struct {
	mu     sync.Mutex
	open   bool
	held   chan struct{} // one send per request held
	closed chan struct{} // closed at test end: release everything held
	next   http.Handler
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	if !open {
		g.held <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-g.closed:
		}
		return
	}
	g.next.ServeHTTP(w, r)
}

func (g *gate) openUp() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
}

// recordingGateway is the real payment adapter (paysim over HTTP) that
// also records each call's key and signals when a call begins.
type recordingGateway struct {
	usecase.PaymentGateway
	mu   sync.Mutex
	keys []string
}

func (g *recordingGateway) Charge(ctx context.Context, c usecase.ChargeRequested) (usecase.Charge, error) {
	g.mu.Lock()
	g.keys = append(g.keys, c.IdempotencyKey)
	g.mu.Unlock()
	return g.PaymentGateway.Charge(ctx, c)
}

func (g *recordingGateway) calls() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.keys...)
}

func setup(t *testing.T, simCfg *paysim.Config, gateOpen bool) *bundle {
	t.Helper()
	db := testdb.New(t)
	if err := postgres.Migrate(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	kc := testkafka.New(t)
	kc.CreateTopic(t, usecase.TopicBillingCommands, 2)
	kc.CreateTopic(t, usecase.TopicOrderEvents, 2)
	// The consumers check their dead-letter topics at Start.
	kc.CreateTopic(t, usecase.TopicBillingCommands+kafka.DeadLetterSuffixDefault, 1)
	kc.CreateTopic(t, usecase.TopicOrderEvents+kafka.DeadLetterSuffixDefault, 1)
	sim, err := paysim.New(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{open: gateOpen, held: make(chan struct{}, 100), closed: make(chan struct{}), next: sim}
	srv := &http.Server{Handler: g}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		close(g.closed)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	gw, err := payment.New("http://"+ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return &bundle{db: db, kc: kc, sim: sim, gate: g, gw: &recordingGateway{PaymentGateway: gw}}
}

// confirmedOrder inserts a CONFIRMED order and returns the ChargeRequested
// record for it, as the outbox would publish it.
func (b *bundle) confirmedOrder(t *testing.T, id string) *kgo.Record {
	t.Helper()
	ctx := context.Background()
	if _, err := b.db.Pool.Exec(ctx, `INSERT INTO orders (id, owner, customer_id, total_kopecks, status) VALUES ($1, 'alice', 'c1', 700, 'CONFIRMED')`, id); err != nil {
		t.Fatal(err)
	}
	key := "ev-" + id + ":billing"
	v, _ := json.Marshal(usecase.ChargeRequested{Target: usecase.TargetOrder, TargetID: id, OrderID: id, CustomerID: "c1", AmountKopecks: 700, IdempotencyKey: key})
	return &kgo.Record{Topic: usecase.TopicBillingCommands, Key: []byte(id), Value: v, Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte(key)}}}
}

func (b *bundle) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	if err := b.kc.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) worker(t *testing.T, onSettled func(target, outcome string)) *consumer.ChargeWorker {
	t.Helper()
	w, err := consumer.NewChargeWorker(b.db.Pool, b.gw, &consumer.ChargeWorkerConfig{
		Brokers: b.kc.Addrs, Logger: quiet, OnSettled: onSettled,
		ClientOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.HardStop(context.Background()) })
	return w
}

func (b *bundle) status(t *testing.T, id string) string {
	t.Helper()
	var s string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT status FROM orders WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *bundle) waitStatus(t *testing.T, id, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for b.status(t, id) != want {
		if time.Now().After(deadline) {
			t.Fatalf("order %s never became %s (is %s)", id, want, b.status(t, id))
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// TestHardStopLeavesCommandForRedelivery proves the charge worker's stop
// contract: the soft stop does not interrupt a provider call in hand; the
// hard stop abandons it (no status, no processed_event, no offset); the
// next worker gets the record again and calls with the same key; the order
// is charged exactly once.
func TestHardStopLeavesCommandForRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, false)
	b.produce(t, b.confirmedOrder(t, "ord_1"))
	w1 := b.worker(t, nil)
	if err := w1.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-b.gate.held // the call is in hand, held by a slow provider
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := w1.Stop(short); err == nil {
		t.Fatal("soft stop returned while the call was in hand")
	}
	if err := w1.HardStop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := b.status(t, "ord_1"); s != "CONFIRMED" {
		t.Fatalf("after the hard stop the order is %s", s)
	}
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM processed_event`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 || b.sim.Ledger().Len() != 0 {
		t.Fatalf("hard stop left %d processed_event rows and %d charges", n, b.sim.Ledger().Len())
	}

	b.gate.openUp()
	settled := make(chan string, 10)
	w2 := b.worker(t, func(target, outcome string) { settled <- target + ":" + outcome })
	if err := w2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.waitStatus(t, "ord_1", "CHARGED")
	if got := <-settled; got != "order:charged" {
		t.Fatalf("settled %q", got)
	}
	if err := w2.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	keys := b.gw.calls()
	if len(keys) != 2 || keys[0] != keys[1] {
		t.Fatalf("calls with keys %q, want the same key twice", keys)
	}
	if rows := b.sim.Ledger().Charges(); len(rows) != 1 || rows[0].IdempotencyKey != keys[0] {
		t.Fatalf("ledger %+v", rows)
	}
}

// TestDuplicateCommandChargesOnce proves that a command delivered twice
// (the relay republished it after a crash) is charged and settled once: the
// second delivery finds the command's processed_event row before the
// provider call (kafka.Consumer's Prepare step is skipped), so the provider
// is called once and the duplicate is counted.
func TestDuplicateCommandChargesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, true)
	rec := b.confirmedOrder(t, "ord_2")
	dup := *rec
	b.produce(t, rec, &dup)
	var settled, dups atomic.Int64
	w, err := consumer.NewChargeWorker(b.db.Pool, b.gw, &consumer.ChargeWorkerConfig{
		Brokers: b.kc.Addrs, Logger: quiet,
		OnSettled:   func(string, string) { settled.Add(1) },
		OnDuplicate: func() { dups.Add(1) },
		ClientOpts:  []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.HardStop(context.Background()) })
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.waitStatus(t, "ord_2", "CHARGED")
	deadline := time.Now().Add(time.Minute)
	for dups.Load() < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the second delivery was never counted as a duplicate (calls %q)", b.gw.calls())
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(b.gw.calls()); n != 1 || settled.Load() != 1 || dups.Load() != 1 || b.sim.Ledger().Len() != 1 {
		t.Fatalf("%d provider calls, settled %d, duplicates %d, %d ledger rows; want 1, 1, 1, 1", n, settled.Load(), dups.Load(), b.sim.Ledger().Len())
	}
}

// TestOrderConsumerEmitsOneCommandPerEvent proves the inbox half of the
// flow: OrderConfirmed delivered twice gives one ChargeRequested outbox
// row, keyed by the event id + ":billing"; a malformed event goes to the
// dead-letter topic and the partition carries on.
func TestOrderConsumerEmitsOneCommandPerEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, true)
	ev := func(id, eventID string, payload string) *kgo.Record {
		return &kgo.Record{Topic: usecase.TopicOrderEvents, Key: []byte(id), Value: []byte(payload), Headers: []kgo.RecordHeader{
			{Key: kafka.HeaderEventID, Value: []byte(eventID)}, {Key: kafka.HeaderEventType, Value: []byte(usecase.EventOrderConfirmed)},
		}}
	}
	good := ev("ord_3", "e-3", `{"order_id":"ord_3","customer_id":"c1","total_kopecks":700}`)
	dup := *good
	bad := ev("ord_3", "e-bad", `{"order_id":`)
	after := ev("ord_3", "e-4", `{"order_id":"ord_3","customer_id":"c1","total_kopecks":800}`)
	b.produce(t, good, &dup, bad, after)
	var dups atomic.Int64
	c, err := consumer.NewOrderConsumer(b.db.Pool, b.kc.Addrs, quiet, consumer.OnDuplicate(func() { dups.Add(1) }), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event WHERE event_type = 'ChargeRequested'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ChargeRequested rows, want 2", n)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if dups.Load() != 1 {
		t.Fatalf("%d duplicates counted, want 1", dups.Load())
	}
	rows, err := b.db.Pool.Query(context.Background(), `SELECT event_id FROM outbox_event WHERE event_type = 'ChargeRequested' ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()
	if len(ids) != 2 || ids[0] != "e-3:billing" || ids[1] != "e-4:billing" {
		t.Fatalf("ChargeRequested event ids %q", ids)
	}
	dl := b.kc.ReadAll(t, usecase.TopicOrderEvents+kafka.DeadLetterSuffixDefault, 1, time.Minute)
	if string(dl[0].Value) != `{"order_id":` {
		t.Fatalf("dead letter %q", dl[0].Value)
	}
}
