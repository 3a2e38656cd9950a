package wal_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// Example writes events into the business transactions' WAL and lets a
// Relay publish them to Kafka from a logical replication slot: the event
// of the transaction that rolled back is never published, the committed
// one is, with idem's headers. No outbox table is involved; the server
// needs wal_level=logical.
//
// The slot, publication and prefix names are the example's own, since
// slots are cluster-wide and every slot of a database sees every message;
// a service keeps one name of each (the defaults) and does not drop them.
func Example() {
	ctx := context.Background()
	dsn := os.Getenv("TEST_DATABASE_URL") // a service: its DATABASE_URL
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	// A local broker stands in for Kafka; a program passes its brokers.
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

	name := exampleName()
	cfg := &wal.Config{Slot: name, Publication: name, Prefix: "example." + name,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	enq := wal.Enqueuer{Prefix: cfg.Prefix} // the zero Enqueuer (and wal.EnqueueTx) use the default prefix
	relay, err := wal.NewRelay(dsn, pub, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil { // creates the slot and publication if missing
		fmt.Println(err)
		dropExampleSlot(ctx, dsn, cfg)
		return
	}
	defer func() {
		// Stop confirms to the slot what was delivered; HardStop cuts a
		// stop that overran its budget.
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := relay.Stop(stopCtx); err != nil {
			fmt.Println("stop:", err)
			_ = relay.HardStop(ctx)
		}
		dropExampleSlot(ctx, dsn, cfg)
	}()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	for _, m := range []struct {
		id     string
		commit bool
	}{{"41", false}, {"42", true}} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		// The business change goes in tx; the event goes in the same tx.
		if _, err := enq.EnqueueTx(ctx, tx, outbox.Message{
			Topic: "orders.events", EventType: "OrderPlaced", AggregateType: "order", AggregateID: m.id,
			EventID: "order-" + m.id + "-placed", Payload: []byte(`{"id":"` + m.id + `"}`),
		}); err != nil {
			_ = tx.Rollback(ctx)
			fmt.Println(err)
			return
		}
		if m.commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			fmt.Println(err)
			return
		}
	}

	consumer, err := kgo.NewClient(kgo.SeedBrokers(broker.ListenAddrs()...), kgo.ConsumeTopics("orders.events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer consumer.Close()
	pollCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	fetches := consumer.PollFetches(pollCtx)
	if err := fetches.Err0(); err != nil {
		fmt.Println(err)
		return
	}
	rec := fetches.Records()[0]
	fmt.Printf("%s key=%s value=%s\n", rec.Topic, rec.Key, rec.Value)
	fmt.Println("event-id:", kafka.RecordEventID(rec))
	fmt.Println("event-type:", kafka.RecordEventType(rec))
	// Output:
	// orders.events key=42 value={"id":"42"}
	// event-id: order-42-placed
	// event-type: OrderPlaced
}

func exampleName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "ex_" + hex.EncodeToString(b[:])
}

// dropExampleSlot drops the example's slot and publication. The slot stays
// active for a moment after the relay's replication connection closed:
// it retries until the server lets it go.
func dropExampleSlot(ctx context.Context, dsn string, cfg *wal.Config) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", cfg.Slot)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Println(err)
			break
		}
	}
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+cfg.Publication); err != nil {
		fmt.Println(err)
	}
}
