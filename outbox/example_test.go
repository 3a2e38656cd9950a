package outbox_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/idemkit/idem/outbox"
)

// The event is written in the same transaction as the state change it
// describes: both commit or neither does.
func ExampleEnqueueTx() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
		INSERT INTO orders VALUES ('42', 'NEW')`); err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, "UPDATE orders SET status = 'CONFIRMED' WHERE id = $1", "42"); err != nil {
		log.Fatal(err)
	}
	ids, err := outbox.EnqueueTx(ctx, tx, outbox.Message{
		Topic: "orders.events", AggregateType: "order", AggregateID: "42",
		EventID: "order-42-confirmed", EventType: "OrderConfirmed", Payload: []byte(`{"id":"42"}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	st, err := outbox.GetStatus(ctx, pool, outbox.LeaseTTLDefault, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("enqueued", ids[0], "- pending:", st.Pending)
	// Output: enqueued order-42-confirmed - pending: 1
}

// printPublisher is a Publisher for the example: it prints what it is
// given and reports every event delivered.
type printPublisher struct {
	mu   sync.Mutex
	seen int
	all  chan struct{} // closed after want events
	want int
}

func (p *printPublisher) Publish(ctx context.Context, events []outbox.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range events {
		fmt.Printf("%s %s/%s #%d %s\n", e.Topic, e.AggregateType, e.AggregateID, e.Seq, e.EventType)
	}
	if p.seen += len(events); p.seen == p.want {
		close(p.all)
	}
	return nil
}

// A relay publishes the committed events in batches, each aggregate's in
// sequence order, then marks them PUBLISHED. Stop is the soft stop: the
// batch in hand finishes first.
func ExampleNewRelay() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()
	for _, m := range []outbox.Message{
		{Topic: "orders.events", AggregateType: "order", AggregateID: "42", EventType: "OrderConfirmed"},
		{Topic: "orders.events", AggregateType: "order", AggregateID: "42", EventType: "OrderCharged"},
		{Topic: "billing.commands", AggregateType: "order", AggregateID: "42", EventType: "ChargeRequested"},
	} {
		if _, err := outbox.Enqueue(ctx, pool, m); err != nil {
			log.Fatal(err)
		}
	}

	pub := &printPublisher{all: make(chan struct{}), want: 3} // e.g. kafka.NewPublisher(client, nil)
	relay, err := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Mode: outbox.TwoPhase})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-pub.all
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := relay.Stop(stopCtx); err != nil {
		_ = relay.HardStop(ctx) // the soft stop overran its budget
	}

	st, err := outbox.GetStatus(ctx, pool, outbox.LeaseTTLDefault, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published:", st.Published)
	// Output:
	// orders.events order/42 #1 OrderConfirmed
	// orders.events order/42 #2 OrderCharged
	// billing.commands order/42 #3 ChargeRequested
	// published: 3
}
