package kafka_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
)

func TestEnsureTopics(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "old", 1)
	cl := kc.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Twice, the second time with everything there: idempotent.
	for range 2 {
		if err := kafka.EnsureTopics(ctx, cl, 3, "old", "new", "new.dlq", "new"); err != nil {
			t.Fatal(err)
		}
	}
	details, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string]int{"old": 1, "new": 3, "new.dlq": 3} {
		d, ok := details[topic]
		if !ok {
			t.Errorf("topic %s missing after EnsureTopics", topic)
			continue
		}
		if n := len(d.Partitions); n != want {
			t.Errorf("topic %s: %d partitions, want %d", topic, n, want)
		}
	}
	if err := kafka.EnsureTopics(ctx, cl, 1, "ok", ""); err == nil {
		t.Error("an empty topic name: nil error")
	}
	if err := kafka.EnsureTopics(ctx, nil, 1, "x"); err == nil {
		t.Error("a nil client: nil error")
	}
}

// A consumer whose dead-letter topic is missing fails at Start, naming the
// topic, instead of finding out when its first poison record arrives; with
// the topic there (EnsureTopics) it starts; the check can be turned off.
func TestConsumerStartChecksDeadLetterTopic(t *testing.T) {
	t.Parallel()
	kc := testkafka.New(t)
	db := testdb.New(t)
	kc.CreateTopic(t, "orders", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := func(context.Context, pgx.Tx, *kgo.Record) error { return nil }
	newCons := func(mod func(*kafka.ConsumerConfig)) *kafka.Consumer {
		cfg := &kafka.ConsumerConfig{Brokers: kc.Addrs, Group: "g", Topics: []string{"orders"}}
		if mod != nil {
			mod(cfg)
		}
		c, err := kafka.NewConsumer(db.Pool, h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	c := newCons(nil)
	err := c.Start(ctx)
	if !errors.Is(err, kafka.ErrDeadLetterTopicMissing) || !strings.Contains(err.Error(), "orders.dlq") {
		t.Fatalf("Start without orders.dlq: %v, want ErrDeadLetterTopicMissing naming orders.dlq", err)
	}
	_ = c.Stop(ctx)

	named := newCons(func(cfg *kafka.ConsumerConfig) { cfg.DeadLetterTopic = "poison" })
	if err := named.Start(ctx); !errors.Is(err, kafka.ErrDeadLetterTopicMissing) || !strings.Contains(err.Error(), "poison") {
		t.Fatalf("Start without the configured dead-letter topic: %v, want ErrDeadLetterTopicMissing naming poison", err)
	}

	skip := newCons(func(cfg *kafka.ConsumerConfig) { cfg.SkipDeadLetterTopicCheck = true })
	if err := skip.Start(ctx); err != nil {
		t.Fatalf("Start with SkipDeadLetterTopicCheck: %v", err)
	}
	if err := skip.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	if err := kafka.EnsureTopics(ctx, kc.Client(t), 1, "orders.dlq"); err != nil {
		t.Fatal(err)
	}
	c = newCons(nil)
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start with orders.dlq there: %v", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// The consumer purges processed_event rows past its Retention while it
// runs, as the idempotency middleware purges its records, with no
// inbox.Purger of the caller's; DisablePurge keeps them.
func TestConsumerPurgesProcessedEvents(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		disable bool
	}{{"default", false}, {"disabled", true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := consSetup(t, 1)
			ctx := context.Background()
			if _, err := b.db.Pool.Exec(ctx, `INSERT INTO processed_event (consumer_id, event_id, processed_at)
				VALUES ('billing', 'old', now() - interval '2 hours'), ('billing', 'recent', now())`); err != nil {
				t.Fatal(err)
			}
			c := b.consStart(t, consEffectHandler("A"), func(cfg *kafka.ConsumerConfig) {
				cfg.Retention, cfg.PurgeInterval, cfg.DisablePurge = time.Hour, 20*time.Millisecond, tt.disable
			})
			// One record through the consumer: it runs (and so would its
			// purger, whose first pass is at Start).
			b.consProduce(t, 0, 1)
			b.consWaitEffects(t, 1, 30*time.Second)
			count := func(id string) int {
				var n int
				if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE event_id = $1`, id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if tt.disable {
				sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				if err := c.Stop(sctx); err != nil {
					t.Fatal(err)
				}
				if count("old") != 1 {
					t.Fatal("DisablePurge: the old row was purged")
				}
			} else {
				deadline := time.Now().Add(30 * time.Second)
				for count("old") != 0 {
					if time.Now().After(deadline) {
						t.Fatal("the row older than Retention is still there after 30s")
					}
					time.Sleep(10 * time.Millisecond) // polling interval
				}
			}
			if count("recent") != 1 || count("ev-0") != 1 {
				t.Fatal("a row within Retention was purged")
			}
		})
	}
}

func TestRecordEventType(t *testing.T) {
	t.Parallel()
	rec := &kgo.Record{Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte("e1")}, {Key: kafka.HeaderEventType, Value: []byte("OrderConfirmed")}}}
	if got := kafka.RecordEventType(rec); got != "OrderConfirmed" {
		t.Fatalf("RecordEventType = %q, want OrderConfirmed", got)
	}
	if got := kafka.RecordEventType(&kgo.Record{}); got != "" {
		t.Fatalf("RecordEventType without the header = %q, want empty", got)
	}
}
