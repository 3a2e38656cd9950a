// Command sqlx is idem on sqlx: POST /orders creates an order and its
// OrderPlaced event in one sqlx transaction, once per Idempotency-Key.
// sqlx.Tx embeds the *sql.Tx: no adapter is needed to enqueue; OnTx wraps
// a transaction that idem began (consumer, middleware) as a *sqlx.Tx.
// See docs/databasesql.md.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/jmoiron/sqlx"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/examples/orm/internal/ormtest"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/outbox"
)

// Order is the orders row.
type Order struct {
	ID    string `db:"id" json:"id"`
	Total int64  `db:"total" json:"total"`
}

// OnTx wraps tx, begun by idem, as a *sqlx.Tx with db's mapper. Its
// driver name is sqlx's secret, so bind named queries with db.BindNamed
// (db knows the placeholder style), then run them on the *sqlx.Tx.
func OnTx(db *sqlx.DB, tx *sql.Tx) *sqlx.Tx { return &sqlx.Tx{Tx: tx, Mapper: db.Mapper} }

func createOrder(ctx context.Context, db *sqlx.DB, tx *sqlx.Tx, o Order) error {
	if o.Total < 0 {
		return errors.New("negative total")
	}
	q, args, err := db.BindNamed(`INSERT INTO orders (id, total) VALUES (:id, :total)`, o)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return err
	}
	topic, typ, payload := ormtest.Event(o.ID, o.Total)
	_, err = outbox.EnqueueSQLTx(ctx, tx.Tx, outbox.Message{Topic: topic, AggregateType: "order", AggregateID: o.ID, EventType: typ, Payload: payload})
	return err
}

func place(ctx context.Context, db *sqlx.DB, o Order, fail bool) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	if err := createOrder(ctx, db, tx, o); err != nil {
		return err
	}
	if fail {
		return errors.New("failed after the enqueue")
	}
	return tx.Commit()
}

func ship(db *sqlx.DB) consume.SQLHandler {
	return func(ctx context.Context, tx *sql.Tx, m *consume.Message) error {
		var ev struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return consume.Permanent(err)
		}
		_, err := OnTx(db, tx).ExecContext(ctx, `INSERT INTO shipments (order_id, event_id) VALUES ($1, $2)`, ev.OrderID, m.EventID)
		return err
	}
}

func orders(db *sqlx.DB) http.Handler {
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
		if err := createOrder(r.Context(), db, OnTx(db, stx), o); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(o)
	})
}

func main() {
	ormtest.Serve(func(sdb *sql.DB) (http.Handler, error) { return orders(sqlx.NewDb(sdb, "pgx")), nil })
}
