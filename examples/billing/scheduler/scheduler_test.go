package scheduler_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/scheduler"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/outbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRelayPublishesAndStops proves the wiring of the background loops: an
// event enqueued in a transaction reaches Kafka with its event-id header,
// and the components honour the lifecycle contract (stop twice, hard stop
// after stop).
func TestRelayPublishesAndStops(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	kc := testkafka.New(t)
	kc.CreateTopic(t, "orders.events", 2)
	cl := kc.Client(t, kafka.ProducerOpts()...)
	pub, err := kafka.NewPublisher(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	comps, err := scheduler.New(db.Pool, pub, 2*time.Second, 0, slog.New(slog.NewTextHandler(io.Discard, nil)), scheduler.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range comps {
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := outbox.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders.events", AggregateType: "order", AggregateID: "o1", EventID: "e1", EventType: "OrderConfirmed", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	recs := kc.ReadAll(t, "orders.events", 1, time.Minute)
	if kafka.RecordEventID(recs[0]) != "e1" || string(recs[0].Key) != "o1" {
		t.Fatalf("record %+v", recs[0])
	}
	for _, c := range comps {
		for range 2 {
			if err := c.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if hs, ok := c.(lifecycle.HardStopper); ok {
			if err := hs.HardStop(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}
