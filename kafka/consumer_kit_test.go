package kafka_test

import (
	"context"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/consume/consumertest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
)

// TestConsumerKit runs the broker-neutral consumer kit on the franz-go
// driver against kfake over TCP (no topic auto-creation, as the kit needs).
func TestConsumerKit(t *testing.T) {
	consumertest.Run(t, consumertest.Harness{
		New: func(t testing.TB) consumertest.Broker {
			kc := testkafka.New(t)
			return &kitBroker{addrs: kc.Addrs}
		},
		Attach: func(_ testing.TB, addr string) consumertest.Broker { return &kitBroker{addrs: []string{addr}} },
		// franz-go refuses, locally, a record larger than its producer's
		// batch limit (kgo.ProducerBatchMaxBytes, 1000012 bytes by
		// default): this value fits with its few headers; its dead-letter
		// copy, with the dead-letter headers, does not.
		NearLimitValue: 1_000_012 - 300,
		// A copy too large is dead-lettered as a reference (no value).
		ReferenceCopy: true,
		SQLDrivers:    testdb.SQLDrivers,
	})
}

type kitBroker struct{ addrs []string }

func (b *kitBroker) Addr() string { return b.addrs[0] }

// client returns a client that the caller closes.
func (b *kitBroker) client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.addrs...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func (b *kitBroker) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := b.client(t)
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

func (b *kitBroker) Produce(t testing.TB, topic string, msgs ...consumertest.Msg) {
	t.Helper()
	cl := b.client(t, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer cl.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Partition: int32(m.Partition), Value: m.Value, Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte(m.EventID)}}}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func (b *kitBroker) Driver(t testing.TB, cfg consumertest.DriverConfig) consume.Driver {
	t.Helper()
	d, err := kafka.NewDriverForTest(&kafka.ConsumerConfig{
		Brokers: b.addrs, Group: cfg.Group, Topics: cfg.Topics, DeadLetterTopic: cfg.DeadLetterTopic,
		SkipDeadLetterTopicCheck: cfg.SkipDeadLetterCheck,
		CommitTimeout:            5 * time.Second,
		// The kit kills and adds members: hand partitions over quickly.
		ClientOpts: []kgo.Opt{
			kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.RebalanceTimeout(10 * time.Second), kgo.FetchMaxWait(500 * time.Millisecond),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (b *kitBroker) Read(t testing.TB, topic string, n int, timeout time.Duration) []consumertest.Msg {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []consumertest.Msg
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: %d of %d messages in %v", topic, len(out), n, timeout)
		}
		fs.EachRecord(func(r *kgo.Record) {
			m := consumertest.Msg{Partition: int(r.Partition), Value: r.Value, Headers: map[string]string{}}
			for _, h := range r.Headers {
				m.Headers[h.Key] = string(h.Value)
			}
			m.EventID = m.Headers[kafka.HeaderEventID]
			out = append(out, m)
		})
	}
	return out
}

func (b *kitBroker) Acked(t testing.TB, group, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := b.client(t)
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	sum := 0
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil && o.At > 0 {
			sum += int(o.At)
		}
	})
	return sum
}
