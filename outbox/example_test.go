package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/outbox"
)

// The event is written in the same transaction as the state change it
// describes: both commit or neither does.
func ExampleEnqueueTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "UPDATE orders SET status = 'CONFIRMED' WHERE id = $1", "42"); err != nil {
		log.Fatal(err)
	}
	ids, err := outbox.EnqueueTx(ctx, tx, outbox.Message{
		Topic: "orders.events", AggregateType: "order", AggregateID: "42",
		EventType: "OrderConfirmed", Payload: []byte(`{"id":"42"}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueued", ids[0])
}

// A relay runs until SIGTERM, then stops between batches: the batch in
// hand is published and marked first.
func ExampleNewRelay() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var pub outbox.Publisher // e.g. kafka.NewPublisher(client, nil)
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{
		Mode:     outbox.TwoPhase,
		LeaseTTL: time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := relay.Stop(stopCtx); err != nil {
		_ = relay.StopAndCancel(context.Background()) // hard stop at the deadline
	}
}
