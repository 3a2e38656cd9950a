// Command bun is idem on bun: POST /orders creates an order and its
// OrderPlaced event in one bun transaction, once per Idempotency-Key.
// bun.Tx embeds the *sql.Tx (tx.Tx) for the enqueue; a transaction that
// idem began (consumer, middleware) is a bun.IConn as it is: pass it to
// a query's Conn. See docs/databasesql.md.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/examples/orm/internal/ormtest"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/outbox"
)

// Order is the orders row.
type Order struct {
	bun.BaseModel `bun:"table:orders"`
	ID            string `bun:"id,pk" json:"id"`
	Total         int64  `bun:"total" json:"total"`
}

// Shipment is the shipments row the consumer writes.
type Shipment struct {
	bun.BaseModel `bun:"table:shipments"`
	OrderID       string `bun:"order_id"`
	EventID       string `bun:"event_id"`
}

func createOrder(ctx context.Context, db *bun.DB, tx *sql.Tx, o Order) error {
	if o.Total < 0 {
		return errors.New("negative total")
	}
	if _, err := db.NewInsert().Conn(tx).Model(&o).Exec(ctx); err != nil {
		return err
	}
	topic, typ, payload := ormtest.Event(o.ID, o.Total)
	_, err := outbox.EnqueueSQLTx(ctx, tx, outbox.Message{Topic: topic, AggregateType: "order", AggregateID: o.ID, EventType: typ, Payload: payload})
	return err
}

func place(ctx context.Context, db *bun.DB, o Order, fail bool) error {
	return db.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := createOrder(ctx, db, tx.Tx, o); err != nil {
			return err
		}
		if fail {
			return errors.New("failed after the enqueue")
		}
		return nil
	})
}

func ship(db *bun.DB) consume.SQLHandler {
	return func(ctx context.Context, tx *sql.Tx, m *consume.Message) error {
		var ev struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return consume.Permanent(err)
		}
		_, err := db.NewInsert().Conn(tx).Model(&Shipment{OrderID: ev.OrderID, EventID: m.EventID}).Exec(ctx)
		return err
	}
}

func orders(db *bun.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var o Order
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.ID == "" {
			http.Error(w, "bad order", http.StatusBadRequest)
			return
		}
		stx, ok := idempotency.SQLTxFromContext(r.Context())
		if !ok {
			http.Error(w, "not in transactional mode", http.StatusInternalServerError)
			return
		}
		if err := createOrder(r.Context(), db, stx, o); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(o)
	})
}

func main() {
	ormtest.Serve(func(sdb *sql.DB) (http.Handler, error) { return orders(bun.NewDB(sdb, pgdialect.New())), nil })
}
