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

	"github.com/jackc/pgx/v5/pgxpool"

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
// response, or not at all.
func ExampleTxFromContext() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/postgres")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
		Mode:  idempotency.ModeTransactional,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Principal"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.Start(ctx); err != nil { // the retention purge loop
		log.Fatal(err)
	}
	defer mw.Stop(ctx)

	http.Handle("POST /orders/{id}/confirm", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		tag, err := tx.Exec(r.Context(), `UPDATE orders SET status = 'CONFIRMED' WHERE id = $1`, r.PathValue("id"))
		if err != nil {
			http.Error(w, "database error", http.StatusInternalServerError) // 5xx: rolled back, key released
			return
		}
		if tag.RowsAffected() == 0 {
			http.Error(w, "no such order", http.StatusNotFound) // definitive 4xx: stored and replayed
			return
		}
		w.WriteHeader(http.StatusOK)
	})))
}

// Hooks feed metrics and logs without the package importing either.
func ExampleConfig_hook() {
	cfg := &idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			if u := r.Header.Get("X-Principal"); u != "" {
				return u, nil
			}
			return "", errors.New("anonymous")
		},
		Hook: func(ctx context.Context, e idempotency.Event) {
			// e.g. a Prometheus counter vec by e.Kind and e.Route
			if e.Kind == idempotency.EventStoreError {
				log.Printf("idempotency %s %s: %v", e.Method, e.Route, e.Err)
			}
		},
	}
	_, err := idempotency.New(idempotency.NewMemoryStore(), cfg)
	fmt.Println(err)
	// Output: <nil>
}
