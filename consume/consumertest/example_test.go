package consumertest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/consume/consumertest"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/migrate"
)

// A driver's own test runs the kit from a top-level test, with a Harness
// for its broker: here an in-process Kafka (kfake) per test and idem's
// franz-go driver. kafkaBroker is the part a driver's author writes.
func ExampleRun() {
	testKafkaDriver := func(t *testing.T) { // func TestKafkaDriver(t *testing.T)
		consumertest.Run(t, consumertest.Harness{
			New: func(t testing.TB) consumertest.Broker {
				cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cluster.Close)
				return &kafkaBroker{addrs: cluster.ListenAddrs()}
			},
			// The kit's child process reaches the parent's broker.
			Attach: func(_ testing.TB, addr string) consumertest.Broker { return &kafkaBroker{addrs: []string{addr}} },
			// Under franz-go's default producer batch limit (1000012
			// bytes) with a few headers; its dead-letter copy is not.
			NearLimitValue: 1_000_012 - 300,
			ReferenceCopy:  true, // the franz-go driver dead-letters a too-large copy as a reference
		})
	}
	_ = testKafkaDriver
}

// Example_broker exercises, on its own, what the kit does through a
// Broker: it creates a topic and its dead-letter topic, produces two
// messages, runs a consume.Consumer on the Broker's driver against
// PostgreSQL, and counts what the group acknowledged after the commits.
func Example_broker() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	b := &kafkaBroker{addrs: cluster.ListenAddrs()}
	for _, topic := range []string{"orders", "orders.dlq"} {
		if err := b.createTopic(ctx, topic, 1); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := b.produce(ctx, "orders", consumertest.Msg{EventID: "ev-1", Value: []byte("a")}, consumertest.Msg{EventID: "ev-2", Value: []byte("b")}); err != nil {
		fmt.Println(err)
		return
	}
	drv, err := b.driver(consumertest.DriverConfig{Group: "shipping", Topics: []string{"orders"}, DeadLetterTopic: "orders.dlq"})
	if err != nil {
		fmt.Println(err)
		return
	}

	pool, drop, err := exampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	processed := make(chan string, 2)
	c, err := consume.New(pool, drv, func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		return nil // a handler writes through tx; its processed_event row commits with it
	}, &consume.Config{ConsumerID: "shipping", Hook: func(ctx context.Context, e consume.Event) context.Context {
		if e.Kind == consume.KindProcessed {
			processed <- e.EventID
		}
		return ctx
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		select {
		case id := <-processed:
			fmt.Println(id, "processed")
		case <-ctx.Done():
			fmt.Println(ctx.Err())
		}
	}
	stopCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := c.Stop(stopCtx); err != nil { // acknowledges what it committed
		fmt.Println("stop:", err)
	}
	n, err := b.acked(ctx, "shipping", "orders")
	fmt.Println("acked:", n, err)
	// Output:
	// ev-1 processed
	// ev-2 processed
	// acked: 2 <nil>
}

// kafkaBroker is consumertest.Broker for a Kafka reached at addrs. Each
// method of the interface is a thin testing.TB wrapper around a method
// that returns its error, so that it can also run outside a test.
type kafkaBroker struct{ addrs []string }

var _ consumertest.Broker = (*kafkaBroker)(nil)

func (b *kafkaBroker) Addr() string { return b.addrs[0] }

func (b *kafkaBroker) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.createTopic(ctx, topic, partitions); err != nil {
		t.Fatal(err)
	}
}

func (b *kafkaBroker) Produce(t testing.TB, topic string, msgs ...consumertest.Msg) {
	t.Helper()
	if err := b.produce(context.Background(), topic, msgs...); err != nil {
		t.Fatal(err)
	}
}

func (b *kafkaBroker) Driver(t testing.TB, cfg consumertest.DriverConfig) consume.Driver {
	t.Helper()
	d, err := b.driver(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (b *kafkaBroker) Read(t testing.TB, topic string, n int, timeout time.Duration) []consumertest.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	msgs, err := b.read(ctx, topic, n)
	if err != nil {
		t.Fatalf("read %s: %d of %d messages: %v", topic, len(msgs), n, err)
	}
	return msgs
}

func (b *kafkaBroker) Acked(t testing.TB, group, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := b.acked(ctx, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *kafkaBroker) createTopic(ctx context.Context, topic string, partitions int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...))
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(partitions), 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	return err
}

func (b *kafkaBroker) produce(ctx context.Context, topic string, msgs ...consumertest.Msg) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Partition: int32(m.Partition), Value: m.Value, Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte(m.EventID)}}}
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// driver is idem's franz-go driver; the kit kills and adds members, so
// the group hands partitions over quickly.
func (b *kafkaBroker) driver(cfg consumertest.DriverConfig) (consume.Driver, error) {
	return kafka.NewDriver(&kafka.ConsumerConfig{
		Brokers: b.addrs, Group: cfg.Group, Topics: cfg.Topics, DeadLetterTopic: cfg.DeadLetterTopic,
		ClientOpts: []kgo.Opt{
			kgo.SessionTimeout(6 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond),
			kgo.RebalanceTimeout(10 * time.Second), kgo.FetchMaxWait(500 * time.Millisecond),
		},
	})
}

func (b *kafkaBroker) read(ctx context.Context, topic string, n int) ([]consumertest.Msg, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []consumertest.Msg
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, err
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
	return out, nil
}

// acked sums the group's committed offsets on topic.
func (b *kafkaBroker) acked(ctx context.Context, group, topic string) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		return 0, err
	}
	sum := 0
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil && o.At > 0 {
			sum += int(o.At)
		}
	})
	return sum, nil
}

// exampleDB is a pool on a fresh schema of TEST_DATABASE_URL (else the
// local server), migrated with migrate.Up, and a func that drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func(), error) {
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	schema := "ex_" + hex.EncodeToString(r[:])
	admin := func(sql string) error {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, sql)
		return err
	}
	if err := admin("CREATE SCHEMA " + schema); err != nil {
		return nil, nil, err
	}
	drop := func() { _ = admin("DROP SCHEMA " + schema + " CASCADE") }
	u, err := url.Parse(dsn)
	if err != nil {
		drop()
		return nil, nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		drop()
		return nil, nil, err
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		pool.Close()
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}
