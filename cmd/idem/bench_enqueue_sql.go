package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync/atomic"

	_ "github.com/lib/pq" // the "postgres" database/sql driver of sql-enqueue-1

	"github.com/idemkit/idem/outbox"
)

// sqlEnqueueVariant is sql-enqueue-1: enqueue-1's business transaction
// (the order row and one event of its own aggregate, one commit) through
// database/sql on lib/pq and outbox.EnqueueSQLTx, for the ratio to its pgx
// twin enqueue-1 in the same rounds. The returned func closes its pool.
func sqlEnqueueVariant(schemaURL string, clients int, run string, seq *atomic.Int64) (op func(context.Context) error, closeDB func(), err error) {
	db, err := sql.Open("postgres", schemaURL)
	if err != nil {
		return nil, nil, fmt.Errorf("sql-enqueue-1: %w", err)
	}
	db.SetMaxOpenConns(clients)
	db.SetMaxIdleConns(clients)
	op = func(ctx context.Context) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
		var id int64
		if err := tx.QueryRowContext(ctx, `INSERT INTO bench_enqueue_order (customer_id, total_kopecks) VALUES ($1, $2) RETURNING id`,
			"c1", 1000).Scan(&id); err != nil {
			return err
		}
		agg := run + "-sql-" + strconv.FormatInt(seq.Add(1), 10)
		if _, err := outbox.EnqueueSQLTx(ctx, tx, outbox.Message{Topic: "orders.events", AggregateType: "order", AggregateID: agg,
			EventType: "OrderCreated", Payload: []byte(`{"customer_id":"c1","total_kopecks":1000}`)}); err != nil {
			return err
		}
		return tx.Commit()
	}
	return op, func() { _ = db.Close() }, nil
}
