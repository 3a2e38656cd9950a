package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// TestTransactionalHandlerFailedStatement: a handler whose statement fails
// inside the request transaction (a real unique violation) and that maps
// the failure to a definitive 409 gets that 409 stored and replayed. Before,
// the failed statement aborted the transaction, the completion could not
// commit, and every retry was 503 IDEMPOTENCY_STORE_UNAVAILABLE forever.
func TestTransactionalHandlerFailedStatement(t *testing.T) {
	t.Parallel()
	for _, d := range txDBs {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := context.Background()
			if _, err := db.Pool.Exec(ctx, "CREATE TABLE coupons (code text PRIMARY KEY, order_id text NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			mw := newMW(t, idempotency.NewPostgresStore(d.db(t, db)), idempotency.Config{Mode: idempotency.ModeTransactional})
			h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				tx, _ := idempotency.TxFromContext(r.Context())
				if _, err := tx.Exec(r.Context(), "INSERT INTO coupons VALUES ('SPRING', $1)", r.URL.Query().Get("order")); err != nil {
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == "23505" {
						w.WriteHeader(http.StatusConflict)
						fmt.Fprint(w, `{"error":"coupon already redeemed"}`)
						return
					}
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, `{"redeemed":true}`)
			}))
			if w := do(h, post("/redeem?order=o-1", "alice", "k1", `{}`)); w.Code != http.StatusCreated {
				t.Fatalf("first redemption: %d %s", w.Code, w.Body)
			}
			w1 := do(h, post("/redeem?order=o-2", "alice", "k2", `{}`))
			w2 := do(h, post("/redeem?order=o-2", "alice", "k2", `{}`))
			if w1.Code != http.StatusConflict || w1.Body.String() != `{"error":"coupon already redeemed"}` {
				t.Fatalf("redemption after a unique violation: %d %s, want the handler's 409", w1.Code, w1.Body)
			}
			if w2.Code != http.StatusConflict || w2.Header().Get(idem.HeaderReplayed) != "true" || w2.Body.String() != w1.Body.String() {
				t.Fatalf("retry: %d %s replayed=%q, want the stored 409 replayed", w2.Code, w2.Body, w2.Header().Get(idem.HeaderReplayed))
			}
			if runs.Load() != 2 {
				t.Fatalf("handler ran %d times, want 2 (the retry is a replay)", runs.Load())
			}
			var owner string
			if err := db.Pool.QueryRow(ctx, "SELECT order_id FROM coupons").Scan(&owner); err != nil || owner != "o-1" {
				t.Fatalf("coupon owner %q, %v; want o-1", owner, err)
			}
		})
	}
}
