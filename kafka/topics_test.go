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
