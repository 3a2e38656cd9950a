package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemkit/idem/idempotency"
)

// The middleware over the in-memory store (two-step mode): the second POST
// with the same key is a replay.
func Example() {
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{
		Scope: func(r *http.Request) (string, error) { return "alice", nil }, // the authenticated principal
	})
	if err != nil {
		log.Fatal(err)
	}
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /charges", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge_id":%d}`, charges)
	})))

	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		body, _ := io.ReadAll(w.Body)
		fmt.Printf("%d %s replayed=%q\n", w.Code, body, w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge_id":1} replayed=""
	// 201 {"charge_id":1} replayed="true"
	// charges: 1
}

// Transactional mode over PostgreSQL: the handler writes through the
// request's transaction, which commits with the claim and the stored
// response, or not at all. A definitive 4xx is stored too, with whatever
// the handler wrote before it.
func ExampleTxFromContext() {
	ctx := context.Background()
	db, done := newExampleDB() // a *pgxpool.Pool on a migrated schema
	defer done()
	pool := db.Pool
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
		INSERT INTO orders VALUES ('o-1', 'NEW')`); err != nil {
		log.Fatal(err)
	}

	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
		Mode:  idempotency.ModeTransactional,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Principal"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.Start(ctx); err != nil { // the retention purge
		log.Fatal(err)
	}
	defer mw.Stop(ctx)

	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/confirm", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		tag, err := tx.Exec(r.Context(), `UPDATE orders SET status = 'CONFIRMED' WHERE id = $1 AND status = 'NEW'`, r.PathValue("id"))
		switch {
		case err != nil:
			http.Error(w, "database error", http.StatusInternalServerError) // 5xx: rolled back, key released
		case tag.RowsAffected() == 0:
			http.Error(w, "no such new order", http.StatusNotFound) // definitive 4xx: stored and replayed
		default:
			fmt.Fprintln(w, "confirmed")
		}
	})))

	for _, id := range []string{"o-1", "o-1", "o-2"} {
		r := httptest.NewRequest(http.MethodPost, "/orders/"+id+"/confirm", nil)
		r.Header.Set("X-Principal", "alice")
		r.Header.Set("Idempotency-Key", "confirm-"+id)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Printf("%s: %d %s replayed=%q\n", id, w.Code, strings.TrimSpace(w.Body.String()), w.Header().Get("Idempotent-Replayed"))
	}
	var status string
	_ = pool.QueryRow(ctx, `SELECT status FROM orders WHERE id = 'o-1'`).Scan(&status)
	fmt.Println("o-1 is", status)
	// Output:
	// o-1: 200 confirmed replayed=""
	// o-1: 200 confirmed replayed="true"
	// o-2: 404 no such new order replayed=""
	// o-1 is CONFIRMED
}

// A hook sees every request from its EventBegin to the one event that ends
// it; the context it returns for EventBegin is the handler's, which is
// where a tracer puts its span.
func ExampleConfig_hook() {
	type spanKey struct{}
	cfg := &idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			if u := r.Header.Get("X-Principal"); u != "" {
				return u, nil
			}
			return "", errors.New("anonymous")
		},
		Hook: func(ctx context.Context, e idempotency.Event) context.Context {
			fmt.Printf("%s %s %s status=%d\n", e.Kind, e.Method, e.Route, e.Status)
			if e.Kind == idempotency.EventBegin {
				return context.WithValue(ctx, spanKey{}, "span-1") // e.g. tracer.Start(ctx, ...)
			}
			return ctx
		},
	}
	mw, err := idempotency.New(idempotency.NewMemoryStore(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("handler in", r.Context().Value(spanKey{}))
		w.WriteHeader(http.StatusCreated)
	}))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`))
		r.Header.Set("X-Principal", "alice")
		r.Header.Set("Idempotency-Key", "k-1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	// Output:
	// begin POST /charges status=0
	// claim POST /charges status=0
	// handler in span-1
	// complete POST /charges status=201
	// begin POST /charges status=0
	// replay POST /charges status=201
}
