package inbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/migrate"
)

// A consumer's handler: the processed_event row and the effect commit
// together, and a redelivered event changes nothing.
func ExampleMarkProcessedTx() {
	ctx := context.Background()
	// In a service: pgxpool.New(ctx, os.Getenv("DATABASE_URL")), migrated
	// with package migrate. Here: a scratch schema of the test database.
	pool, done := exampleDB(ctx)
	defer done()
	_, _ = pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
		INSERT INTO orders VALUES ('42', 'CONFIRMED')`)

	handle := func(eventID, orderID string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			first, err := inbox.MarkProcessedTx(ctx, tx, "billing-service", eventID)
			if err != nil {
				return err
			}
			if !first {
				fmt.Println(eventID, "already processed: skipped")
				return nil // commit, then acknowledge the message as usual
			}
			_, err = tx.Exec(ctx, `UPDATE orders SET status = 'CHARGE_REQUESTED' WHERE id = $1`, orderID)
			fmt.Println(eventID, "processed")
			return err
		})
	}
	for range 2 { // a delivery, then a redelivery of the same event
		if err := handle("ev-7f3a", "42"); err != nil {
			fmt.Println(err)
		}
	}
	var status string
	_ = pool.QueryRow(ctx, `SELECT status FROM orders WHERE id = '42'`).Scan(&status)
	fmt.Println("order 42:", status)
	// Output:
	// ev-7f3a processed
	// ev-7f3a already processed: skipped
	// order 42: CHARGE_REQUESTED
}

// Retention: a Purger deletes processed_event rows older than Retention,
// PurgeBatchSize rows per statement, every PurgeInterval. Its hook is where
// a metric counts the rows.
func ExampleNewPurger() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	_, _ = pool.Exec(ctx, `INSERT INTO processed_event (consumer_id, event_id, processed_at)
		SELECT 'billing-service', 'old-' || g, now() - interval '8 days' FROM generate_series(1, 3) g
		UNION ALL SELECT 'billing-service', 'recent', now()`)

	passed := make(chan inbox.PurgeEvent, 1)
	p, err := inbox.NewPurger(pool, &inbox.PurgerConfig{
		Retention: 7 * 24 * time.Hour,
		Hook: func(ctx context.Context, e inbox.PurgeEvent) context.Context {
			if e.Kind != inbox.PurgeBegin {
				select {
				case passed <- e:
				default:
				}
			}
			return ctx
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := p.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	e := <-passed // the first pass runs at once
	if err := p.Stop(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Printf("%s: %d rows deleted\n", e.Kind, e.Deleted)
	// Output:
	// purge-done: 3 rows deleted
}

// exampleDB is a migrated scratch schema of the test database, dropped by
// the returned func.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
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
