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

	"github.com/idemkit/idem/internal/testdb"
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
// behind it. The publisher's Check refuses it before the call, so the
// relay holds back the later events of the same aggregate, while other
// aggregates go out.
func TestRelayHoldsBackAggregateAfterPoisonRecord(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 1)
			db := testdb.New(t)
			pub, err := kafka.NewPublisher(c.Client(t, kgo.ProducerBatchMaxBytes(4096)), nil)
			if err != nil {
				t.Fatal(err)
			}
			big := pubMsg("orders", "a", 1)
			big.Payload = []byte(strings.Repeat("x", 10_000))
			pubEnqueue(t, db, big, pubMsg("orders", "a", 2), pubMsg("orders", "b", 1))
			r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: mode, DisableNotify: true,
				BackoffMin: time.Hour, BackoffMax: time.Hour, Logger: pubQuiet})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := r.RunBatch(context.Background()); n != 3 || !errors.Is(err, kerr.MessageTooLarge) {
				t.Fatalf("RunBatch = %d, %v; want 3 and MESSAGE_TOO_LARGE", n, err)
			}
			rows := pubRows(t, db)
			if a1 := rows["a-1"]; a1.status != "PENDING" || a1.attempts != 1 || !strings.Contains(a1.lastErr, "MESSAGE_TOO_LARGE") {
				t.Fatalf("a-1: %+v", a1)
			}
			if a2 := rows["a-2"]; a2.status != "PENDING" || a2.attempts != 0 {
				t.Fatalf("a-2: %+v, want PENDING and not tried", a2)
			}
			if rows["b-1"].status != "PUBLISHED" {
				t.Fatalf("b-1: %+v", rows["b-1"])
			}
			recs := c.ReadAll(t, "orders", 1, 10*time.Second)
			if pubHeader(recs[0], kafka.HeaderEventID) != "b-1" {
				t.Fatalf("got %s", pubHeader(recs[0], kafka.HeaderEventID))
			}
			// Nothing else is there: a read for 2 records times out with 1.
			if more, _ := c.Read("orders", 2, 2*time.Second); len(more) != 1 {
				t.Fatalf("%d records in the topic, want 1", len(more))
			}
		})
	}
}

// Check is the refusal before sending: no topic, or over the client's
// batch limit (with MESSAGE_TOO_LARGE); anything else passes.
func TestPublisherCheck(t *testing.T) {
	t.Parallel()
	c := testkafka.New(t)
	pub, err := kafka.NewPublisher(c.Client(t, kgo.ProducerBatchMaxBytes(4096)), nil)
	if err != nil {
		t.Fatal(err)
	}
	big := pubEvent("orders", "a", 1, strings.Repeat("x", 4096))
	if err := pub.Check(big); !errors.Is(err, kerr.MessageTooLarge) {
		t.Errorf("oversize: %v", err)
	}
	if err := pub.Check(pubEvent("", "a", 1, "x")); err == nil || !strings.Contains(err.Error(), "no topic") {
		t.Errorf("no topic: %v", err)
	}
	if err := pub.Check(pubEvent("orders", "a", 1, strings.Repeat("x", 3000))); err != nil {
		t.Errorf("within the limit: %v", err)
	}
}
