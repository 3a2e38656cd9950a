package kafkago_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkafka"
	kfranz "github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/kafkago"
	"github.com/idemkit/idem/outbox"
)

func event(topic, agg string, seq int64, payload string) outbox.Event {
	return outbox.Event{Seq: seq, Message: outbox.Message{
		Topic: topic, AggregateType: "order", AggregateID: agg,
		EventID: fmt.Sprintf("%s-%d", agg, seq), EventType: "E" + strconv.FormatInt(seq, 10),
		Payload: []byte(payload), Headers: map[string]string{"trace": "t1"},
	}}
}

// readKafkaGo reads n messages of topic from the start with a kafka-go
// Reader (no group).
func readKafkaGo(t *testing.T, brokers []string, topic string, partition, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []kafka.Message
	for len(out) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("kafka-go read %s[%d]: %d of %d: %v", topic, partition, len(out), n, err)
		}
		out = append(out, m)
	}
	return out
}

// TestFranzRecordsReadByKafkaGo cross-checks the franz-go publisher's
// records with a second, independent Kafka client: what kafka-go reads
// must be the key, value and headers the outbox contract promises.
func TestFranzRecordsReadByKafkaGo(t *testing.T) {
	t.Parallel()
	c := testkafka.New(t)
	c.CreateTopic(t, "orders.events", 1)
	pub, err := kfranz.NewPublisher(c.Client(t, kfranz.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events := []outbox.Event{
		event("orders.events", "order-7", 1, `{"status":"CONFIRMED"}`),
		event("orders.events", "order-7", 2, `{"status":"CHARGED"}`),
	}
	if err := pub.Publish(ctx, events); err != nil {
		t.Fatal(err)
	}
	got := readKafkaGo(t, c.Addrs, "orders.events", 0, len(events))
	for i, m := range got {
		e := events[i]
		if string(m.Key) != e.AggregateID || string(m.Value) != string(e.Payload) {
			t.Errorf("record %d: key %q value %q, want %q %q", i, m.Key, m.Value, e.AggregateID, e.Payload)
		}
		// The event's own headers first, idem's last (a reader that takes
		// the last of a repeated name still sees idem's).
		want := []kafka.Header{
			{Key: "trace", Value: []byte("t1")},
			{Key: idem.HeaderEventID, Value: []byte(e.EventID)},
			{Key: idem.HeaderEventType, Value: []byte(e.EventType)},
			{Key: idem.HeaderAggregateType, Value: []byte(e.AggregateType)},
			{Key: idem.HeaderAggregateSeq, Value: []byte(strconv.FormatInt(e.Seq, 10))},
		}
		if fmt.Sprint(m.Headers) != fmt.Sprint(want) {
			t.Errorf("record %d: headers %s, want %s", i, m.Headers, want)
		}
		if kafkago.MessageEventID(&m) != e.EventID {
			t.Errorf("record %d: MessageEventID %q, want %q", i, kafkago.MessageEventID(&m), e.EventID)
		}
	}
}

// TestSamePartitionAsFranz: the two publishers put an aggregate in the
// same partition (murmur2 of the key, as the Java client), so a service can
// move from one client to the other without scattering an aggregate.
func TestSamePartitionAsFranz(t *testing.T) {
	t.Parallel()
	c := testkafka.New(t)
	c.CreateTopic(t, "t", 7)
	franzPub, err := kfranz.NewPublisher(c.Client(t, kfranz.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	goPub, err := kafkago.NewPublisher(newWriter(t, c.Addrs...))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const aggs = 40
	var a, b []outbox.Event
	for i := range aggs {
		a = append(a, event("t", "agg-"+strconv.Itoa(i), 1, "franz"))
		b = append(b, event("t", "agg-"+strconv.Itoa(i), 2, "kafka-go"))
	}
	if err := franzPub.Publish(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := goPub.Publish(ctx, b); err != nil {
		t.Fatal(err)
	}
	recs := c.ReadAll(t, "t", 2*aggs, 30*time.Second)
	part := map[string]map[string]int32{} // aggregate → client → partition
	for _, r := range recs {
		if part[string(r.Key)] == nil {
			part[string(r.Key)] = map[string]int32{}
		}
		part[string(r.Key)][string(r.Value)] = r.Partition
	}
	used := map[int32]bool{}
	for agg, p := range part {
		if p["franz"] != p["kafka-go"] {
			t.Errorf("%s: franz-go wrote partition %d, kafka-go %d", agg, p["franz"], p["kafka-go"])
		}
		used[p["franz"]] = true
	}
	if len(used) < 3 {
		t.Errorf("40 aggregates landed in %d of 7 partitions: the keys are not hashed", len(used))
	}
}
