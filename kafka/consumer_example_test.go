package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// The article's billing consumer. The handler makes no HTTP call: inside
// the consumer's transaction it records two facts, "OrderConfirmed was
// processed" (done by the Consumer: processed_event) and "a charge is
// ordered" (an outbox row whose idempotency key is the event id +
// ":billing"). A separate worker makes the payment call with that key, so a
// repeated call is recognised by the provider, and the transaction never
// waits on the network.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

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
			EventID:       key, // a redelivery could not enqueue twice anyway
			EventType:     "ChargeRequested",
			Payload:       payload,
			Headers:       map[string]string{"idempotency-key": key},
		})
		return err
	}

	c, err := kafka.NewConsumer(pool, handle, &kafka.ConsumerConfig{
		Brokers: []string{"127.0.0.1:9092"},
		Group:   "billing-service",
		Topics:  []string{"orders.events"},
		Batch:   true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	// Finish the record in hand, commit, leave the group.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		fmt.Println("stop:", err)
	}
}
