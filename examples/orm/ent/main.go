// Command ent is idem on ent: POST /orders creates an order and its
// OrderPlaced event in one ent transaction, once per Idempotency-Key.
//
//	DATABASE_URL=postgres://… go run ./ent
//	curl -X POST -H 'Idempotency-Key: k1' -d '{"id":"o1","total":100}' localhost:8080/orders
//
// ent keeps its *sql.Tx inside its driver; two small adapters reach it:
// (*ent.Tx).SQLTx, generated from ent/template/sqltx.tmpl, for a
// transaction of Client.Tx, and OnTx for a transaction idem began (the
// consumer's, the middleware's). See docs/databasesql.md.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/examples/orm/ent/ent"
	"github.com/idemkit/idem/examples/orm/internal/ormtest"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/outbox"
)

// open is ent on sdb, through ent's database/sql driver: its
// transactions (Client.Tx) are *sql.Tx, which (*ent.Tx).SQLTx returns.
func open(sdb *sql.DB) *ent.Client {
	return ent.NewClient(ent.Driver(entsql.OpenDB(dialect.Postgres, sdb)))
}

// OnTx is an ent client whose statements run in tx, a transaction that
// idem began and ends (a consumer's, the idempotency middleware's). Like
// the client of an ent.Tx, it never commits or rolls back: a builder's
// inner transaction, and Client.Tx on it, are tx itself, their Commit
// and Rollback no-ops.
func OnTx(tx *sql.Tx) *ent.Client {
	return ent.NewClient(ent.Driver(onTx{entsql.Conn{ExecQuerier: tx}}))
}

// onTx is the dialect.Driver (and dialect.Tx) of OnTx.
type onTx struct{ entsql.Conn }

func (d onTx) Tx(context.Context) (dialect.Tx, error) { return d, nil }
func (onTx) Dialect() string                          { return dialect.Postgres }
func (onTx) Close() error                             { return nil }
func (onTx) Commit() error                            { return nil }
func (onTx) Rollback() error                          { return nil }

// createOrder writes the order through client and its event through tx,
// the transaction client's statements run in.
func createOrder(ctx context.Context, client *ent.Client, tx *sql.Tx, id string, total int64) error {
	if total < 0 {
		return errors.New("negative total")
	}
	if err := client.Order.Create().SetID(id).SetTotal(total).Exec(ctx); err != nil {
		return err
	}
	topic, typ, payload := ormtest.Event(id, total)
	_, err := outbox.EnqueueSQLTx(ctx, tx, outbox.Message{Topic: topic, AggregateType: "order", AggregateID: id, EventType: typ, Payload: payload})
	return err
}

// place is the plain flow: ent's own transaction API (Client.Tx, then
// Commit or Rollback).
func place(ctx context.Context, client *ent.Client, id string, total int64, fail bool) (err error) {
	tx, err := client.Tx(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, tx.Rollback())
		}
	}()
	stx, err := tx.SQLTx()
	if err != nil {
		return err
	}
	if err := createOrder(ctx, tx.Client(), stx, id, total); err != nil {
		return err
	}
	if fail {
		return errors.New("failed after the enqueue")
	}
	return tx.Commit()
}

// ship is a consumer handler writing through ent in the inbox's
// transaction.
func ship(ctx context.Context, tx *sql.Tx, m *consume.Message) error {
	var ev struct {
		OrderID string `json:"order_id"`
	}
	if err := json.Unmarshal(m.Value, &ev); err != nil {
		return consume.Permanent(err)
	}
	return OnTx(tx).Shipment.Create().SetID(m.EventID).SetOrderID(ev.OrderID).Exec(ctx)
}

// orders is POST /orders for the transactional idempotency middleware.
func orders(w http.ResponseWriter, r *http.Request) {
	var o struct {
		ID    string `json:"id"`
		Total int64  `json:"total"`
	}
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.ID == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	stx, ok := idempotency.SQLTxFromContext(r.Context())
	if !ok {
		http.Error(w, "not in transactional mode", http.StatusInternalServerError)
		return
	}
	if err := createOrder(r.Context(), OnTx(stx), stx, o.ID, o.Total); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(o)
}

func main() {
	ormtest.Serve(func(*sql.DB) (http.Handler, error) { return http.HandlerFunc(orders), nil })
}
