// Command gorm is idem on GORM: POST /orders creates an order and its
// OrderPlaced event in one GORM transaction, once per Idempotency-Key.
//
//	DATABASE_URL=postgres://… go run ./gorm
//	curl -X POST -H 'Idempotency-Key: k1' -d '{"id":"o1","total":100}' localhost:8080/orders
//
// See docs/databasesql.md.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/examples/orm/internal/ormtest"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/outbox"
)

// Order is the orders row.
type Order struct {
	ID    string `gorm:"primaryKey"`
	Total int64
}

// Shipment is the shipments row the consumer writes.
type Shipment struct {
	OrderID string
	EventID string
}

// SQLTx is the adapter GORM needs: the *sql.Tx under a *gorm.DB that is
// inside a transaction (db.Transaction's callback argument, or db.Begin's
// result), for outbox.EnqueueSQLTx and inbox.MarkProcessedSQLTx. GORM
// keeps it in Statement.ConnPool.
func SQLTx(tx *gorm.DB) (*sql.Tx, error) {
	if t, ok := tx.Statement.ConnPool.(*sql.Tx); ok {
		return t, nil
	}
	return nil, errors.New("gorm: not inside a transaction (Statement.ConnPool is not a *sql.Tx)")
}

// OnTx is the other direction: a GORM session whose statements run in tx
// (a consumer's or the idempotency middleware's transaction). GORM does
// not begin a transaction of its own on it.
func OnTx(db *gorm.DB, tx *sql.Tx) *gorm.DB {
	s := db.Session(&gorm.Session{NewDB: true, SkipDefaultTransaction: true, Context: db.Statement.Context})
	s.Statement.ConnPool = tx
	return s
}

// createOrder writes the order and its event through tx (a GORM
// transaction).
func createOrder(ctx context.Context, tx *gorm.DB, o Order) error {
	if o.Total < 0 {
		return errors.New("negative total")
	}
	if err := tx.WithContext(ctx).Create(&o).Error; err != nil {
		return err
	}
	stx, err := SQLTx(tx)
	if err != nil {
		return err
	}
	topic, typ, payload := ormtest.Event(o.ID, o.Total)
	_, err = outbox.EnqueueSQLTx(ctx, stx, outbox.Message{Topic: topic, AggregateType: "order", AggregateID: o.ID, EventType: typ, Payload: payload})
	return err
}

// place is the plain flow: GORM's own transaction API.
func place(ctx context.Context, db *gorm.DB, o Order, fail bool) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := createOrder(ctx, tx, o); err != nil {
			return err
		}
		if fail {
			return errors.New("failed after the enqueue")
		}
		return nil
	})
}

// ship is a consumer handler writing through GORM in the inbox's
// transaction.
func ship(db *gorm.DB) consume.SQLHandler {
	return func(ctx context.Context, tx *sql.Tx, m *consume.Message) error {
		var ev struct {
			OrderID string `json:"order_id"`
		}
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return consume.Permanent(err)
		}
		return OnTx(db, tx).WithContext(ctx).Create(&Shipment{OrderID: ev.OrderID, EventID: m.EventID}).Error
	}
}

// orders is POST /orders for the transactional idempotency middleware.
func orders(db *gorm.DB) http.Handler {
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
		if err := createOrder(r.Context(), OnTx(db, stx), o); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(o)
	})
}

// open opens GORM on sdb.
func open(sdb *sql.DB) (*gorm.DB, error) {
	return gorm.Open(postgres.New(postgres.Config{Conn: sdb}), &gorm.Config{})
}

func main() {
	ormtest.Serve(func(sdb *sql.DB) (http.Handler, error) {
		db, err := open(sdb)
		if err != nil {
			return nil, err
		}
		return orders(db), nil
	})
}
