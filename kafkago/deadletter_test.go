package kafkago_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	idemkafka "github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/kafkago"
)

// A consumer whose dead-letter topic is missing fails at Start, naming the
// topic; SkipDeadLetterTopicCheck starts it anyway; with the topic there
// it starts.
func TestConsumerStartChecksDeadLetterTopic(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	db := testdb.New(t)
	kc.CreateTopic(t, "orders", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newCons := func(mod func(*kafkago.ConsumerConfig)) *consume.Consumer {
		cfg := &kafkago.ConsumerConfig{Brokers: kc.Addrs, Group: "g", Topics: []string{"orders"}, Logger: quiet()}
		if mod != nil {
			mod(cfg)
		}
		c, err := kafkago.NewConsumer(db.Pool, func(context.Context, pgx.Tx, *kafka.Message) error { return nil }, cfg, &consume.Config{Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	stop := func(c *consume.Consumer) {
		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}

	c := newCons(nil)
	err := c.Start(ctx)
	if !errors.Is(err, kafkago.ErrDeadLetterTopicMissing) || !strings.Contains(err.Error(), "orders.dlq") {
		t.Fatalf("Start without orders.dlq: %v, want ErrDeadLetterTopicMissing naming orders.dlq", err)
	}
	stop(c)
	named := newCons(func(cfg *kafkago.ConsumerConfig) { cfg.DeadLetterTopic = "poison" })
	if err := named.Start(ctx); !errors.Is(err, kafkago.ErrDeadLetterTopicMissing) || !strings.Contains(err.Error(), "poison") {
		t.Fatalf("Start without the configured dead-letter topic: %v, want ErrDeadLetterTopicMissing naming poison", err)
	}
	skip := newCons(func(cfg *kafkago.ConsumerConfig) { cfg.SkipDeadLetterTopicCheck = true })
	if err := skip.Start(ctx); err != nil {
		t.Fatalf("Start with SkipDeadLetterTopicCheck: %v", err)
	}
	stop(skip)
	kc.CreateTopic(t, "orders.dlq", 1)
	c = newCons(nil)
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start with orders.dlq there: %v", err)
	}
	stop(c)
}

// TestDeadLetterTooLargeReferenceCopy: the dead-letter topic accepts at
// most 4 KiB (max.message.bytes) and a 20 KB message fails its handler for
// good. The broker refuses its full copy (MESSAGE_TOO_LARGE), so the
// consumer dead-letters a reference copy (no value; key, event id,
// dlq-source, dlq-size, the error, dlq-truncated), the message behind it
// is processed, the partition's offset moves past both, and nothing is
// reported stuck. The dead-letter tools (package kafka's DLQ, behind idem
// dlq show and redrive) read the original from its source.
func TestDeadLetterTooLargeReferenceCopy(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kc.CreateTopic(t, "orders", 1)
	adm := kadm.NewClient(kc.Client(t))
	maxBytes := "4096"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, "orders.small.dlq"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE effect (event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 20_000)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(big)
	var (
		mu    sync.Mutex
		kinds []consume.Kind
	)
	c, err := kafkago.NewConsumer(db.Pool, func(ctx context.Context, tx pgx.Tx, m *kafka.Message) error {
		if len(m.Value) > 10_000 {
			return consume.Permanent(errors.New("payload too large to charge"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect VALUES ($1)`, kafkago.MessageEventID(m))
		return err
	}, &kafkago.ConsumerConfig{Brokers: kc.Addrs, Group: "g", Topics: []string{"orders"}, DeadLetterTopic: "orders.small.dlq", Logger: quiet()},
		&consume.Config{Logger: quiet(), BackoffMin: time.Millisecond, DeadLetterAttempts: 2, Hook: func(ctx context.Context, e consume.Event) context.Context {
			mu.Lock()
			kinds = append(kinds, e.Kind)
			mu.Unlock()
			return ctx
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	prod := kc.Client(t, kgo.DefaultProduceTopic("orders"))
	for i, v := range [][]byte{[]byte("0"), big, []byte("2")} {
		rec := &kgo.Record{Key: []byte("order-1"), Value: v, Headers: []kgo.RecordHeader{
			{Key: idem.HeaderEventID, Value: []byte("ev-" + strconv.Itoa(i))},
			{Key: "trace", Value: []byte("t-" + strconv.Itoa(i))},
		}}
		if err := prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	dl := kc.ReadAll(t, "orders.small.dlq", 1, 30*time.Second)[0]
	h := map[string]string{}
	for _, x := range dl.Headers {
		h[x.Key] = string(x.Value)
	}
	if len(dl.Value) != 0 || h[idem.HeaderDeadLetterTruncated] != "true" || h[idem.HeaderDeadLetterSource] != "orders/0/1" ||
		h[idem.HeaderEventID] != "ev-1" || !strings.Contains(h[idem.HeaderDeadLetterError], "payload too large to charge") ||
		string(dl.Key) != "order-1" || h["trace"] != "" {
		t.Fatalf("reference copy: value %d bytes, key %q, headers %v", len(dl.Value), dl.Key, h)
	}
	if size, _ := strconv.Atoi(h[idem.HeaderDeadLetterSize]); size < len(big) {
		t.Errorf("dlq-size %q, want at least %d", h[idem.HeaderDeadLetterSize], len(big))
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM effect WHERE event_id = 'ev-2'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ev-2, behind the too-large message, not processed in 30s")
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, k := range kinds {
		if k == consume.KindStuck {
			t.Error("the too-large message was reported stuck")
		}
	}
	mu.Unlock()
	offs, err := adm.FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := offs.Lookup("orders", 0); o.At != 3 {
		t.Errorf("committed offset %d (%v), want 3: the partition did not move past the message", o.At, o.Err)
	}
	got, err := idemkafka.NewDLQ(kgo.SeedBrokers(kc.Addrs...)).Show(ctx, "orders.small.dlq", 0, 0)
	if err != nil || !got.Truncated || !got.FromSource || !bytes.Equal(got.Value, big) {
		t.Fatalf("dlq show: truncated %v, from source %v, value %d bytes, %v", got.Truncated, got.FromSource, len(got.Value), err)
	}
}
