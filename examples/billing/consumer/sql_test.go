package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/kafka"
)

// TestSQLLayerConsumers runs both consumers on the database/sql data layer
// (BILLING_DATA_LAYER=sql: consume.NewSQL on franz-go's kafka.NewDriver,
// pgx's stdlib driver): an OrderConfirmed delivered twice gives one
// ChargeRequested, and a command delivered twice is charged and settled
// once, each mark committed in the *sql.Tx of the handler's writes.
func TestSQLLayerConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, true)
	data := postgres.SQL(b.db.SQL(t, "pgx", 4))
	driver := func(group, topic string) *kafka.ConsumerConfig {
		return &kafka.ConsumerConfig{Brokers: b.kc.Addrs, Group: group, Topics: []string{topic}, Logger: quiet,
			ClientOpts: []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}}
	}
	count := func(sql string) (n int) {
		t.Helper()
		if err := b.db.Pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond) // polling interval
		}
	}

	ev := &kgo.Record{Topic: usecase.TopicOrderEvents, Key: []byte("ord_s"), Value: []byte(`{"order_id":"ord_s","customer_id":"c1","total_kopecks":700}`), Headers: []kgo.RecordHeader{
		{Key: kafka.HeaderEventID, Value: []byte("e-s")}, {Key: kafka.HeaderEventType, Value: []byte(usecase.EventOrderConfirmed)},
	}}
	dupEv := *ev
	b.produce(t, ev, &dupEv)
	var orderDups atomic.Int64
	drv, err := kafka.NewDriver(driver(consumer.OrderGroup, usecase.TopicOrderEvents))
	if err != nil {
		t.Fatal(err)
	}
	oc, err := consumer.NewOrderConsumerOn(data, drv, quiet, consumer.OnDuplicate(func() { orderDups.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = oc.HardStop(context.Background()) })
	if err := oc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor("the duplicate OrderConfirmed", func() bool { return orderDups.Load() == 1 })
	if err := oc.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(`SELECT count(*) FROM outbox_event WHERE event_type = 'ChargeRequested' AND event_id = 'e-s:billing'`); n != 1 {
		t.Fatalf("%d ChargeRequested for e-s, want 1", n)
	}

	rec := b.confirmedOrder(t, "ord_t")
	dup := *rec
	b.produce(t, rec, &dup)
	var settled, dups atomic.Int64
	drv, err = kafka.NewDriver(driver(consumer.ChargeGroupDefault, usecase.TopicBillingCommands))
	if err != nil {
		t.Fatal(err)
	}
	w, err := consumer.NewChargeWorkerOn(data, b.gw, drv, &consumer.ChargeWorkerConfig{
		Logger: quiet, OnSettled: func(string, string) { settled.Add(1) }, OnDuplicate: func() { dups.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.HardStop(context.Background()) })
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.waitStatus(t, "ord_t", "CHARGED")
	waitFor("the duplicate command", func() bool { return dups.Load() == 1 })
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(b.gw.calls()); n != 1 || settled.Load() != 1 || b.sim.Ledger().Len() != 1 {
		t.Fatalf("%d provider calls, settled %d, %d ledger rows; want 1, 1, 1", n, settled.Load(), b.sim.Ledger().Len())
	}
	if n := count(`SELECT count(*) FROM processed_event`); n != 2 {
		t.Fatalf("%d processed_event rows, want 2 (one per event)", n)
	}
}
