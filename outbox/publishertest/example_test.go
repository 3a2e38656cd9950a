package publishertest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/publishertest"
)

// A publisher's own test runs the suite; each subtest gets a broker of its
// own with the topics it asks for. Here the broker is an in-process Kafka
// (kfake) and the publisher idem's franz-go one; newKafkaBroker is the part
// a publisher's author writes.
func ExampleRun() {
	testKafkaPublisher := func(t *testing.T) {
		publishertest.Run(t, func(t *testing.T, topics []string) *publishertest.Broker {
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			b, closeClient, err := newKafkaBroker(cluster, topics)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(closeClient)
			return b
		})
	}
	_ = testKafkaPublisher // func TestKafkaPublisher(t *testing.T) { ... }
}

// Example_broker exercises the Broker that the suite drives, on its own:
// an event published reads back decoded, and after Reject the topic
// refuses the next one, which fails alone (a BatchError) as the suite's
// PartialFailure subtest expects.
func Example_broker() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the suite gives Read a deadline too
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	b, closeClient, err := newKafkaBroker(cluster, []string{"orders"})
	if err != nil {
		log.Fatal(err)
	}
	defer closeClient()

	event := func(id string) outbox.Event {
		return outbox.Event{Seq: 1, Message: outbox.Message{Topic: "orders", EventID: "order-" + id + "-placed",
			EventType: "OrderPlaced", AggregateType: "order", AggregateID: id, Payload: []byte(`{"id":"` + id + `"}`),
			Headers: map[string]string{"trace": "t-" + id}}}
	}
	if err := b.Publisher.Publish(ctx, []outbox.Event{event("42")}); err != nil {
		fmt.Println(err)
		return
	}
	msgs, err := b.Read(ctx, "orders")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range msgs {
		fmt.Printf("%s %s %s %s/%s seq=%d %s %v\n", m.Topic, m.EventID, m.EventType, m.AggregateType, m.AggregateID, m.Seq, m.Payload, m.Headers)
	}

	b.Reject("orders")
	err = b.Publisher.Publish(ctx, []outbox.Event{event("43")})
	var be *outbox.BatchError
	fmt.Println("rejected alone:", errors.As(err, &be) && len(be.Errs) == 1 && be.Errs[0] != nil)
	// Output:
	// orders order-42-placed OrderPlaced order/42 seq=1 {"id":"42"} map[trace:t-42]
	// rejected alone: true
}

// newKafkaBroker creates topics on cluster (two partitions each) and
// returns the suite's Broker for it: idem's franz-go publisher, a Read
// that decodes every record of a topic back into the event it carries,
// and Reject and Stall as kfake faults on the topic's produce requests.
// The func closes the publisher's client.
func newKafkaBroker(cluster *kfake.Cluster, topics []string) (*publishertest.Broker, func(), error) {
	ctx := context.Background()
	addrs := cluster.ListenAddrs()
	client, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(addrs...), kgo.ProducerBatchMaxBytes(64<<10))...)
	if err != nil {
		return nil, nil, err
	}
	if len(topics) > 0 {
		resp, err := kadm.NewClient(client).CreateTopics(ctx, 2, 1, nil, topics...)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			client.Close()
			return nil, nil, err
		}
	}
	pub, err := kafka.NewPublisher(client, nil)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	fail := func(topic string, code *kerr.Error) {
		cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: code, Count: -1})
	}
	return &publishertest.Broker{
		Publisher: pub,
		Read: func(ctx context.Context, topic string) ([]publishertest.Message, error) {
			return readTopic(ctx, addrs, topic)
		},
		Reject:   func(topic string) { fail(topic, kerr.InvalidRecord) },
		Stall:    func(topic string) { fail(topic, kerr.NotEnoughReplicas) },
		TooLarge: 128 << 10, // over the client's 64 KiB batch limit, which the publisher's Check enforces
	}, client.Close, nil
}

// readTopic reads every record of topic up to its end offsets and decodes
// each back into the event it carries.
func readTopic(ctx context.Context, addrs []string, topic string) ([]publishertest.Message, error) {
	admin, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	ends, err := kadm.NewClient(admin).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, err
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
	if n == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []publishertest.Message
	for len(out) < n {
		fetches := cl.PollFetches(ctx) // ctx bounds the wait
		if err := fetches.Err0(); err != nil {
			return out, err
		}
		fetches.EachRecord(func(r *kgo.Record) {
			m := publishertest.Message{Topic: r.Topic, AggregateID: string(r.Key), Payload: r.Value, Headers: map[string]string{}}
			for _, h := range r.Headers {
				switch v := string(h.Value); h.Key {
				case kafka.HeaderEventID:
					m.EventID = v
				case kafka.HeaderEventType:
					m.EventType = v
				case kafka.HeaderAggregateType:
					m.AggregateType = v
				case kafka.HeaderAggregateSeq:
					m.Seq, _ = strconv.ParseInt(v, 10, 64)
				default:
					m.Headers[h.Key] = v
				}
			}
			out = append(out, m)
		})
	}
	return out, nil
}
