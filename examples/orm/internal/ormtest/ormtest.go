// Package ormtest is the test every ORM example of examples/orm passes:
// the same three flows, written in each ORM's own API, against a real
// PostgreSQL (database/sql on pgx's stdlib driver) and a kfake broker.
package ormtest

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
)

// Schema is the examples' tables.
const Schema = `
CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE IF NOT EXISTS shipments (order_id text NOT NULL, event_id text NOT NULL);`

// Impl is one ORM's version of the three flows.
type Impl struct {
	// Place creates order id and enqueues its OrderPlaced event in one
	// transaction of the ORM's own API; with fail, it returns an error
	// after both, so that the ORM rolls back.
	Place func(ctx context.Context, id string, total int64, fail bool) error
	// Ship is a consumer handler that writes a shipments row through the
	// ORM in the inbox's transaction.
	Ship consume.SQLHandler
	// Orders is POST /orders {"id":…,"total":…} behind the transactional
	// idempotency middleware: it writes the order and its event through
	// the ORM in the request's transaction.
	Orders http.Handler
}

// Run runs the flows on the Impl that newImpl builds over sdb.
func Run(t *testing.T, newImpl func(t *testing.T, sdb *sql.DB) Impl) {
	db := testdb.New(t, testdb.MaxConns(2))
	if _, err := db.Pool.Exec(t.Context(), Schema); err != nil {
		t.Fatal(err)
	}
	sdb := db.SQL(t, "pgx", 12)
	impl := newImpl(t, sdb)
	ctx := t.Context()
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("CreateAndEnqueue", func(t *testing.T) {
		if err := impl.Place(ctx, "o1", 100, false); err != nil {
			t.Fatal(err)
		}
		if err := impl.Place(ctx, "o2", 100, true); err == nil {
			t.Fatal("a failing Place returned no error")
		}
		if n, e := count(`SELECT count(*) FROM orders WHERE id = 'o1'`), count(`SELECT count(*) FROM outbox_event WHERE aggregate_id = 'o1'`); n != 1 || e != 1 {
			t.Fatalf("o1: %d orders, %d events; want one of each", n, e)
		}
		if n, e := count(`SELECT count(*) FROM orders WHERE id = 'o2'`), count(`SELECT count(*) FROM outbox_event WHERE aggregate_id = 'o2'`); n != 0 || e != 0 {
			t.Fatalf("o2 rolled back: %d orders, %d events left; want none", n, e)
		}
	})

	t.Run("IdempotencyKey", func(t *testing.T) {
		mw, err := idempotency.New(idempotency.NewSQLStore(sdb), &idempotency.Config{
			Mode:  idempotency.ModeTransactional,
			Scope: func(*http.Request) (string, error) { return "alice", nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Wrap(impl.Orders)
		var wg sync.WaitGroup
		codes := make(chan int, 10)
		for range 10 {
			wg.Go(func() {
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"id":"o3","total":5}`))
				r.Header.Set(idem.HeaderKey, "key-o3")
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				codes <- w.Code
			})
		}
		wg.Wait()
		close(codes)
		for c := range codes {
			if c != http.StatusCreated && c != http.StatusConflict {
				t.Fatalf("a request with key-o3 got %d", c)
			}
		}
		if n, e := count(`SELECT count(*) FROM orders WHERE id = 'o3'`), count(`SELECT count(*) FROM outbox_event WHERE aggregate_id = 'o3'`); n != 1 || e != 1 {
			t.Fatalf("10 requests with one key: %d orders, %d events; want one of each", n, e)
		}
		// A handler failure rolls its order and its event back.
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"id":"o4","total":-1}`))
		r.Header.Set(idem.HeaderKey, "key-o4")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code < 500 {
			t.Fatalf("negative total: %d, want a 5xx", w.Code)
		}
		if n, e := count(`SELECT count(*) FROM orders WHERE id = 'o4'`), count(`SELECT count(*) FROM outbox_event WHERE aggregate_id = 'o4'`); n != 0 || e != 0 {
			t.Fatalf("failed request: %d orders, %d events left; want none", n, e)
		}
	})

	t.Run("Consumer", func(t *testing.T) {
		kc := testkafka.New(t)
		kc.CreateTopic(t, "orders.events", 1)
		kc.CreateTopic(t, "orders.events.dlq", 1) // the consumer checks it at Start
		cl := kc.Client(t, kgo.DefaultProduceTopic("orders.events"))
		var recs []*kgo.Record
		for _, id := range []string{"e1", "e2", "e1"} { // e1 delivered twice
			recs = append(recs, &kgo.Record{Value: []byte(`{"order_id":"o-` + id + `"}`), Headers: []kgo.RecordHeader{{Key: kafka.HeaderEventID, Value: []byte(id)}}})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		d, err := kafka.NewDriver(&kafka.ConsumerConfig{Brokers: kc.Addrs, Group: "shipping", Topics: []string{"orders.events"}})
		if err != nil {
			t.Fatal(err)
		}
		var processed, dups atomic.Int64
		c, err := consume.NewSQL(sdb, d, impl.Ship, &consume.Config{ConsumerID: "shipping",
			Hook: func(ctx context.Context, e consume.Event) context.Context {
				switch e.Kind {
				case consume.KindProcessed:
					processed.Add(1)
				case consume.KindDuplicate:
					dups.Add(1)
				}
				return ctx
			}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := c.Stop(sctx); err != nil {
				t.Error(err)
			}
		}()
		deadline := time.Now().Add(30 * time.Second)
		for processed.Load() < 2 || dups.Load() < 1 {
			if time.Now().After(deadline) {
				t.Fatal("the consumer did not ship both events within 30s")
			}
			time.Sleep(20 * time.Millisecond) // polling interval
		}
		if n := count(`SELECT count(*) FROM shipments`); n != 2 {
			t.Fatalf("%d shipments, want 2 (e1 once: its second delivery a duplicate)", n)
		}
	})
}

// Event is the OrderPlaced event every example enqueues.
func Event(id string, total int64) (topic, eventType string, payload []byte) {
	return "orders.events", "OrderPlaced", fmt.Appendf(nil, `{"id":%q,"total":%d}`, id, total)
}
