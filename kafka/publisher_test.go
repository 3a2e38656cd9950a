package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

func pubEvent(topic, agg string, seq int64, payload string) outbox.Event {
	return outbox.Event{
		Message: outbox.Message{Topic: topic, AggregateType: "order", AggregateID: agg,
			EventID: fmt.Sprintf("%s-%d", agg, seq), EventType: "OrderConfirmed", Payload: []byte(payload),
			Headers: map[string]string{"trace": "t1"}},
		ID: seq, Seq: seq,
	}
}

func pubHeader(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func TestPublisherRejectsWeakProducer(t *testing.T) {
	t.Parallel()
	c := testkafka.New(t)
	testCases := []struct {
		name string
		opts []kgo.Opt
	}{
		{"no idempotence", []kgo.Opt{kgo.DisableIdempotentWrite()}},
		{"leader ack", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}},
		{"cancellable idempotence", []kgo.Opt{kgo.AllowIdempotentProduceCancellation()}},
	}
	for _, tt := range testCases {
		if _, err := kafka.NewPublisher(c.Client(t, tt.opts...), nil); !errors.Is(err, kafka.ErrWeakProducer) {
			t.Errorf("%s: err = %v, want ErrWeakProducer", tt.name, err)
		}
	}
	if _, err := kafka.NewPublisher(nil, nil); !errors.Is(err, kafka.ErrNilClient) {
		t.Errorf("nil client: %v", err)
	}
	if _, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil); err != nil {
		t.Errorf("default client: %v", err)
	}
}

func TestPublisherRecordShape(t *testing.T) {
	t.Parallel()
	c := testkafka.New(t)
	c.CreateTopic(t, "orders", 3)
	pub, err := kafka.NewPublisher(c.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), []outbox.Event{
		pubEvent("orders", "o1", 1, "first"), pubEvent("orders", "o1", 2, "second"),
	}); err != nil {
		t.Fatal(err)
	}
	recs := c.ReadAll(t, "orders", 2, 10*time.Second)
	for i, r := range recs {
		seq := strconv.Itoa(i + 1)
		if string(r.Key) != "o1" || pubHeader(r, kafka.HeaderEventID) != "o1-"+seq ||
			pubHeader(r, kafka.HeaderEventType) != "OrderConfirmed" || pubHeader(r, kafka.HeaderAggregateSeq) != seq ||
			pubHeader(r, kafka.HeaderAggregateType) != "order" || pubHeader(r, "trace") != "t1" {
			t.Errorf("record %d: key %q headers %v", i, r.Key, r.Headers)
		}
	}
	if string(recs[0].Value) != "first" || string(recs[1].Value) != "second" || recs[0].Partition != recs[1].Partition {
		t.Errorf("values/partitions: %q@%d %q@%d", recs[0].Value, recs[0].Partition, recs[1].Value, recs[1].Partition)
	}
}

// franz-go fails an oversized record on its own and produces the records
// behind it; the publisher must not let a later event of the same
// aggregate through, while other aggregates go out.
func TestPublisherHoldsBackAggregateAfterPoisonRecord(t *testing.T) {
	t.Parallel()
	c := testkafka.New(t)
	c.CreateTopic(t, "orders", 1)
	pub, err := kafka.NewPublisher(c.Client(t, kgo.ProducerBatchMaxBytes(4096)), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = pub.Publish(context.Background(), []outbox.Event{
		pubEvent("orders", "a", 1, strings.Repeat("x", 10_000)),
		pubEvent("orders", "a", 2, "small"),
		pubEvent("orders", "b", 1, "small"),
	})
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 3 {
		t.Fatalf("err = %v, want a BatchError of 3", err)
	}
	if !errors.Is(be.Errs[0], kerr.MessageTooLarge) || !errors.Is(be.Errs[1], kafka.ErrHeldBack) || be.Errs[2] != nil {
		t.Fatalf("errs = %v", be.Errs)
	}
	recs := c.ReadAll(t, "orders", 1, 10*time.Second)
	if pubHeader(recs[0], kafka.HeaderEventID) != "b-1" {
		t.Fatalf("got %s", pubHeader(recs[0], kafka.HeaderEventID))
	}
	// Nothing else is there: a read for 2 records times out with 1.
	if more, _ := c.Read("orders", 2, 2*time.Second); len(more) != 1 {
		t.Fatalf("%d records in the topic, want 1", len(more))
	}
}
