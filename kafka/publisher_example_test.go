package kafka_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
)

// A relay publishes through the franz-go publisher: one record per event,
// keyed by the aggregate id, with the event's id, type, aggregate type and
// sequence number in headers. The client is built with ProducerOpts
// (acks=all, idempotent writes); NewPublisher refuses a client configured
// for less.
func ExampleNewPublisher() {
	ctx := context.Background()
	// A local broker stands in for Kafka here; a program passes its seed
	// brokers instead.
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders.events"))
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()
	client, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(broker.ListenAddrs()...))...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	pub, err := kafka.NewPublisher(client, nil)
	if err != nil {
		log.Fatal(err)
	}

	pool, drop := pubExampleDB(ctx)
	defer drop()
	if _, err := outbox.Enqueue(ctx, pool, outbox.Message{
		Topic: "orders.events", AggregateType: "order", AggregateID: "42",
		EventID: "order-42-confirmed", EventType: "OrderConfirmed", Payload: []byte(`{"id":"42"}`),
	}); err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{DisableNotify: true})
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.RunBatch(ctx) // what the relay's loop does after Start
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", n)

	consumer, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...), kgo.ConsumeTopics("orders.events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	rec := consumer.PollFetches(ctx).Records()[0]
	fmt.Printf("%s key=%s value=%s\n", rec.Topic, rec.Key, rec.Value)
	for _, h := range rec.Headers {
		fmt.Printf("  %s: %s\n", h.Key, h.Value)
	}
	// Output:
	// published 1
	// orders.events key=42 value={"id":"42"}
	//   event-id: order-42-confirmed
	//   event-type: OrderConfirmed
	//   aggregate-type: order
	//   aggregate-seq: 1
}

// pubExampleDB gives an example a pool on a fresh, migrated schema of the test
// database (TEST_DATABASE_URL, else the local server) and a func that drops
// it. A real program connects to its own database and runs migrate.Up (or
// `idem migrate`) once.
func pubExampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "ex_" + hex.EncodeToString(b[:])
	admin := func(sql string) {
		c, err := pgx.Connect(ctx, exampleDatabaseURL())
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql); err != nil {
			log.Fatal(err)
		}
	}
	admin("CREATE SCHEMA " + schema)
	url, err := withSearchPath(exampleDatabaseURL(), schema)
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrate.Up(ctx, pool); err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		admin("DROP SCHEMA " + schema + " CASCADE")
	}
}
