package inbox_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/inbox"
)

// A consumer's handler: the processed_event row and the effect commit
// together, and a redelivered event changes nothing.
func ExampleMarkProcessedTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	eventID, orderID := "7f3a…", "42" // from the message
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		first, err := inbox.MarkProcessedTx(ctx, tx, "billing-service", eventID)
		if err != nil || !first {
			return err // already processed: skip, and let the caller commit the offset
		}
		_, err = tx.Exec(ctx, `UPDATE orders SET status = 'CHARGE_REQUESTED' WHERE id = $1`, orderID)
		return err
	})
	if err != nil {
		fmt.Println(err)
	}
}

// Retention: purge rows older than a week in batches of 1000, every minute.
func ExampleNewPurger() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	p, err := inbox.NewPurger(pool, &inbox.PurgerConfig{Retention: 7 * 24 * time.Hour})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = p.Start(ctx)
	defer p.Stop(ctx)
}
