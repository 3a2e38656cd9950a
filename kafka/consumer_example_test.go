package kafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
)

// The billing consumer of the reference service. The handler makes no HTTP
// call: inside the consumer's transaction it records two facts, "this
// OrderConfirmed was processed" (done by the Consumer: processed_event) and
// "a charge is ordered" (an outbox row whose idempotency key is the event
// id + ":billing"). A separate worker makes the payment call with that key,
// so a repeated call is recognised by the provider, and the transaction
// never waits on the network. The event is published twice here, as a
// relay that crashed before marking it published would: the second copy
// is a duplicate and orders nothing.
func ExampleNewConsumer() {
	ctx := context.Background()
	// In a service: a pgxpool.Pool on DATABASE_URL (migrated with package
	// migrate) and your brokers. Here: a scratch schema of the test
	// database and an in-process kfake broker.
	pool, done := consumerExampleDB(ctx)
	defer done()
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.events", "orders.events.dlq"))
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	type orderConfirmed struct {
		OrderID    string `json:"order_id"`
		CustomerID string `json:"customer_id"`
		Total      int64  `json:"total_kopecks"`
	}
	handle := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		var ev orderConfirmed
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			// Retrying cannot fix a malformed payload: dead-letter it now.
			return kafka.Permanent(fmt.Errorf("unmarshal: %w", err))
		}
		key := kafka.EventIDFromContext(ctx) + ":billing"
		payload, _ := json.Marshal(map[string]any{
			"order_id": ev.OrderID, "customer_id": ev.CustomerID,
			"amount_kopecks": ev.Total, "idempotency_key": key,
		})
		_, err := outbox.EnqueueTx(ctx, tx, outbox.Message{
			Topic:         "billing.commands",
			AggregateType: "order",
			AggregateID:   ev.OrderID,
			EventID:       key,
			EventType:     "ChargeRequested",
			Payload:       payload,
			Headers:       map[string]string{"idempotency-key": key},
		})
		return err
	}

	settled := make(chan struct{}, 10)
	c, err := kafka.NewConsumer(pool, handle, &kafka.ConsumerConfig{
		Brokers: brokers,
		Group:   "billing-service",
		Topics:  []string{"orders.events"},
		Hook: func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
			switch e.Kind {
			case consume.KindProcessed, consume.KindDuplicate:
				fmt.Println(e.EventID, e.Kind)
				settled <- struct{}{}
			}
			return ctx
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}

	prod, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders.events"))
	defer prod.Close()
	rec := func() *kgo.Record {
		return &kgo.Record{
			Key:     []byte("order-42"),
			Value:   []byte(`{"order_id":"42","customer_id":"c1","total_kopecks":1000}`),
			Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte("ev-7f3a")}},
		}
	}
	if err := prod.ProduceSync(ctx, rec(), rec()).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		<-settled
	}

	// SIGTERM in a service (package lifecycle): finish the record in hand,
	// commit the offsets, leave the group.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		fmt.Println("stop:", err)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE event_type = 'ChargeRequested'`).Scan(&n)
	fmt.Println("charges ordered:", n)
	// Output:
	// ev-7f3a processed
	// ev-7f3a duplicate
	// charges ordered: 1
}

// consumerExampleDB is a migrated scratch schema of the test database,
// dropped by the returned func.
func consumerExampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "example_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, exampleDatabaseURL())
	if err != nil {
		panic(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	url, _ := withSearchPath(exampleDatabaseURL(), schema)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		panic(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		_ = admin.Close(ctx)
	}
}
