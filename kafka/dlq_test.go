package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
)

// dlqSetup writes four dead-letter records as the consumer writes them
// (original key, value and headers plus the dlq-* headers): three that
// failed with "boom" and one with "other".
func dlqSetup(t *testing.T) *testkafka.Cluster {
	t.Helper()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "orders.events", 1)
	kc.CreateTopic(t, "orders.events.dlq", 1)
	cl := kc.Client(t)
	for i := range 4 {
		errText := "boom: cannot charge"
		if i == 2 {
			errText = "other failure"
		}
		rec := &kgo.Record{Topic: "orders.events.dlq", Key: []byte(fmt.Sprintf("order-%d", i)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: []kgo.RecordHeader{
				{Key: kafka.HeaderEventID, Value: []byte(fmt.Sprintf("ev-%d", i))},
				{Key: "trace", Value: []byte("t")},
				{Key: kafka.HeaderDeadLetterError, Value: []byte(errText)},
				{Key: kafka.HeaderDeadLetterSource, Value: []byte(fmt.Sprintf("orders.events/0/%d", 10+i))},
				{Key: kafka.HeaderDeadLetterAttempts, Value: []byte("5")},
				{Key: kafka.HeaderDeadLetterConsumer, Value: []byte("billing-1")},
			}}
		if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return kc
}

func TestDLQListShow(t *testing.T) {
	t.Parallel()
	kc := dlqSetup(t)
	ctx := context.Background()
	d := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...))
	recs, err := d.List(ctx, "orders.events.dlq", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 {
		t.Fatalf("%d records", len(recs))
	}
	r := recs[1]
	if r.ID() != "orders.events.dlq/0/1" || r.Error != "boom: cannot charge" || r.Source != "orders.events/0/11" ||
		r.Attempts != 5 || r.Consumer != "billing-1" || r.EventID != "ev-1" || string(r.Key) != "order-1" || r.HeaderMap()["trace"] != "t" {
		t.Errorf("record %+v", r)
	}
	if recs, err := d.List(ctx, "orders.events.dlq", 2); err != nil || len(recs) != 2 {
		t.Errorf("limit 2: %d, %v", len(recs), err)
	}
	got, err := d.Show(ctx, "orders.events.dlq", 0, 2)
	if err != nil || got.Error != "other failure" || string(got.Value) != `{"n":2}` {
		t.Errorf("show: %+v, %v", got, err)
	}
	for _, off := range []int64{-1, 4, 100} {
		if _, err := d.Show(ctx, "orders.events.dlq", 0, off); !errors.Is(err, kafka.ErrRecordNotFound) {
			t.Errorf("offset %d: %v", off, err)
		}
	}
	if _, err := d.Show(ctx, "orders.events.dlq", 7, 0); !errors.Is(err, kafka.ErrRecordNotFound) {
		t.Errorf("partition 7: %v", err)
	}
	if _, err := d.List(ctx, "nope.dlq", 0); !errors.Is(err, kafka.ErrTopicNotFound) {
		t.Errorf("unknown topic: %v", err)
	}
}

// A redrive interrupted after its first produce and run again republishes
// every selected record exactly once, with its key, value and original
// headers; a third run moves nothing.
func TestDLQRedriveInterruptedRestarted(t *testing.T) {
	t.Parallel()
	kc := dlqSetup(t)
	base := []kgo.Opt{kgo.SeedBrokers(kc.Addrs...)}
	opts := kafka.RedriveOptions{From: "orders.events.dlq", FilterError: "boom"}

	dry, err := kafka.NewDLQ(base...).Redrive(context.Background(), kafka.RedriveOptions{From: opts.From, FilterError: "boom", DryRun: true})
	if err != nil || len(dry.Moved) != 3 || dry.Filtered != 1 || !dry.DryRun {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if recs, err := kafka.NewDLQ(base...).List(context.Background(), "orders.events", 0); err != nil || len(recs) != 0 {
		t.Fatalf("dry run produced: %d, %v", len(recs), err)
	}

	// Interrupt: cancel the redrive's context once the first record is
	// acknowledged.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var acked atomic.Int32
	hook := kgo.WithHooks(unbufferedHook(func(r *kgo.Record, err error) {
		if err == nil && r.Topic == "orders.events" && acked.Add(1) == 1 {
			cancel()
		}
	}))
	first, err := kafka.NewDLQ(append(base, hook)...).Redrive(ctx, opts)
	if err == nil {
		t.Fatalf("interrupted redrive returned no error: %+v", first)
	}
	if first == nil || len(first.Moved) != 1 {
		t.Fatalf("interrupted redrive moved %+v", first)
	}

	second, err := kafka.NewDLQ(base...).Redrive(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.AlreadyRedriven) < 1 || len(second.Moved)+len(second.AlreadyRedriven) != 3 {
		t.Fatalf("second run: %+v", second)
	}
	third, err := kafka.NewDLQ(base...).Redrive(context.Background(), opts)
	if err != nil || len(third.Moved) != 0 || len(third.AlreadyRedriven) != 3 {
		t.Fatalf("third run: %+v, %v", third, err)
	}

	out := kc.ReadAll(t, "orders.events", 3, 20*time.Second)
	var ids, events []string
	for _, rec := range out {
		h := map[string]string{}
		for _, x := range rec.Headers {
			h[x.Key] = string(x.Value)
		}
		ids = append(ids, h[kafka.HeaderDeadLetterRedriveID])
		events = append(events, h[kafka.HeaderEventID])
		if h["trace"] != "t" || h[kafka.HeaderDeadLetterError] != "" || h[kafka.HeaderDeadLetterSource] != "" {
			t.Errorf("headers of the copy: %v", h)
		}
		if want := "order-" + h[kafka.HeaderEventID][len("ev-"):]; string(rec.Key) != want {
			t.Errorf("key %q, want %q", rec.Key, want)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"orders.events.dlq/0/0", "orders.events.dlq/0/1", "orders.events.dlq/0/3"}) {
		t.Errorf("redrive ids %v", ids)
	}
	slices.Sort(events)
	if !slices.Equal(events, []string{"ev-0", "ev-1", "ev-3"}) {
		t.Errorf("events %v", events)
	}
	if recs, err := kafka.NewDLQ(base...).List(context.Background(), "orders.events", 0); err != nil || len(recs) != 3 {
		t.Errorf("destination holds %d records, want 3 (no duplicate): %v", len(recs), err)
	}
}

type unbufferedHook func(*kgo.Record, error)

func (h unbufferedHook) OnProduceRecordUnbuffered(r *kgo.Record, err error) { h(r, err) }

func TestDLQRedriveNoDestination(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "parking", 1)
	cl := kc.Client(t)
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "parking", Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	_, err := kafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)).Redrive(context.Background(), kafka.RedriveOptions{From: "parking"})
	if !errors.Is(err, kafka.ErrNoDestination) {
		t.Errorf("%v, want ErrNoDestination", err)
	}
}
