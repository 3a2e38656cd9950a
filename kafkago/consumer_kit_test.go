package kafkago_test

import (
	"context"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/consume/consumertest"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafkago"
)

// kitLimit is the dead-letter copy limit the kit's drivers get
// (DeadLetterMaxBytes): NearLimitValue fits under it, its copy with the
// dead-letter headers does not.
const kitLimit = 1_000_012

// TestConsumerKit runs the broker-neutral consumer kit on the kafka-go
// driver against kfake over TCP. The kit's own produces, reads and offset
// checks go through franz-go; only the consumer is kafka-go.
func TestConsumerKit(t *testing.T) {
	consumertest.Run(t, consumertest.Harness{
		New: func(t testing.TB) consumertest.Broker {
			kc := testkafka.New(t)
			return &kitBroker{addrs: kc.Addrs}
		},
		Attach:         func(_ testing.TB, addr string) consumertest.Broker { return &kitBroker{addrs: []string{addr}} },
		NearLimitValue: kitLimit - 300,
		// A copy too large is dead-lettered as a reference (no value).
		ReferenceCopy: true,
		SQLDrivers:    testdb.SQLDrivers,
	})
}

type kitBroker struct{ addrs []string }

func (b *kitBroker) Addr() string { return b.addrs[0] }

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
	// franz-go refuses a record over its batch limit; the kit's near-limit
	// value is within it.
	cl := b.client(t, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(kitLimit+1000))
	defer cl.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Partition: int32(m.Partition), Value: m.Value, Headers: []kgo.RecordHeader{{Key: idem.HeaderEventID, Value: []byte(m.EventID)}}}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func (b *kitBroker) Driver(t testing.TB, cfg consumertest.DriverConfig) consume.Driver {
	t.Helper()
	d, err := kafkago.NewDriver(&kafkago.ConsumerConfig{
		Brokers: b.addrs, Group: cfg.Group, Topics: cfg.Topics, DeadLetterTopic: cfg.DeadLetterTopic,
		SkipDeadLetterTopicCheck: cfg.SkipDeadLetterCheck,
		DeadLetterMaxBytes:       kitLimit, Logger: quiet(),
		// The kit kills and adds members: hand partitions over quickly.
		Reader: func(rc *kafka.ReaderConfig) {
			rc.SessionTimeout, rc.HeartbeatInterval, rc.RebalanceTimeout = 6*time.Second, 200*time.Millisecond, 10*time.Second
			rc.MaxBytes = 2 << 20
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (b *kitBroker) Read(t testing.TB, topic string, n int, timeout time.Duration) []consumertest.Msg {
	t.Helper()
	cl := b.client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
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
			m.EventID = m.Headers[idem.HeaderEventID]
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
