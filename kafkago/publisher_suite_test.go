package kafkago_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafkago"
	"github.com/idemkit/idem/outbox/publishertest"
)

// newWriter is NewWriter for a test: closed, with its transport, when the
// test ends.
func newWriter(t testing.TB, brokers ...string) *kafka.Writer {
	t.Helper()
	w := kafkago.NewWriter(brokers...)
	t.Cleanup(func() {
		_ = w.Close()
		w.Transport.(*kafka.Transport).CloseIdleConnections()
	})
	return w
}

// The kafka-go publisher passes the outbox.Publisher suite against kfake
// over TCP: two partitions per topic, faults injected per topic with
// kfake's Fault (a non-retriable INVALID_RECORD to reject,
// NOT_ENOUGH_REPLICAS forever to stall), and a BatchMaxBytes of 64 KiB,
// which the publisher's Check enforces.
func TestPublisherSuite(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, func(t *testing.T, topics []string) *publishertest.Broker {
		c := testkafka.New(t)
		for _, topic := range topics {
			c.CreateTopic(t, topic, 2)
		}
		w := newWriter(t, c.Addrs...)
		w.BatchBytes = 64 << 10
		pub, err := kafkago.NewPublisher(w)
		if err != nil {
			t.Fatal(err)
		}
		fail := func(topic string, code *kerr.Error) {
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: code, Count: -1})
		}
		return &publishertest.Broker{
			Publisher: pub,
			Read: func(ctx context.Context, topic string) ([]publishertest.Message, error) {
				return suiteRead(ctx, c, topic)
			},
			Reject:   func(topic string) { fail(topic, kerr.InvalidRecord) },
			Stall:    func(topic string) { fail(topic, kerr.NotEnoughReplicas) },
			TooLarge: 128 << 10,
		}
	})
}

// suiteRead reads every record of topic up to its end offsets and decodes
// them back into events.
func suiteRead(ctx context.Context, c *testkafka.Cluster, topic string) ([]publishertest.Message, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	if err := ends.Error(); err != nil {
		return nil, err
	}
	n := 0
	ends.Each(func(o kadm.ListedOffset) { n += int(o.Offset) })
	if n == 0 {
		return nil, nil
	}
	dl, _ := ctx.Deadline()
	recs, err := c.Read(topic, n, time.Until(dl))
	if err != nil {
		return nil, err
	}
	out := make([]publishertest.Message, len(recs))
	for i, r := range recs {
		out[i] = decode(r)
	}
	return out, nil
}

func decode(r *kgo.Record) publishertest.Message {
	m := publishertest.Message{Topic: r.Topic, AggregateID: string(r.Key), Payload: r.Value, Headers: map[string]string{}}
	for _, h := range r.Headers {
		switch v := string(h.Value); h.Key {
		case idem.HeaderEventID:
			m.EventID = v
		case idem.HeaderEventType:
			m.EventType = v
		case idem.HeaderAggregateType:
			m.AggregateType = v
		case idem.HeaderAggregateSeq:
			m.Seq, _ = strconv.ParseInt(v, 10, 64)
		default:
			m.Headers[h.Key] = v
		}
	}
	return m
}
